//! Shared fixtures for the certs integration tests: an in-memory PKI, good and bad leaves,
//! and rustls client configs that present arbitrary (even invalid) certificates.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use waymark_certs::ca::{IssuedLeaf, LeafSan, LeafSpec, RegionCa, RootCa};
use waymark_certs::material::{MaterialPem, parse_certs, parse_key, validate_material};
use waymark_certs::tls::LiveMaterial;
use waymark_certs::verify::PeerVerifier;
use waymark_certs::{
    CertMetrics, IdentityKind, KindSet, Material, Name, PeerPolicy, RejectReason, TrustDomain,
};

pub const TD: &str = "mesh.test";
pub const NODE: &str = "spiffe://mesh.test/region/eu/node/n1";
pub const AUTHORITY: &str = "spiffe://mesh.test/region/eu/authority/a1";
pub const WORKLOAD: &str = "spiffe://mesh.test/region/eu/service/cart/instance/i1";

/// An estate root with two regions, `eu` (whose identities the tests use) and `us`.
pub struct Pki {
    pub root: RootCa,
    pub eu: RegionCa,
    pub us: RegionCa,
    pub now: SystemTime,
}

/// One bad client certificate and the reason it must be refused with.
pub struct BadCase {
    pub name: &'static str,
    pub key: Arc<CertifiedKey>,
    pub reason: RejectReason,
}

impl Pki {
    pub fn new(trust_domain: &str) -> Self {
        waymark_certs::install_crypto_provider();
        let now = SystemTime::now();
        let root = RootCa::generate(TrustDomain::new(trust_domain).unwrap(), now).unwrap();
        let eu = root.issue_region(Name::new("eu").unwrap(), now).unwrap();
        let us = root.issue_region(Name::new("us").unwrap(), now).unwrap();
        Self { root, eu, us, now }
    }

    pub fn leaf(&self, identity: &str) -> IssuedLeaf {
        self.eu
            .issue(
                &identity.parse().unwrap(),
                self.now,
                Duration::from_secs(24 * 3600),
            )
            .unwrap()
    }

    pub fn custom(
        &self,
        sans: Vec<LeafSan>,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> IssuedLeaf {
        self.eu
            .issue_unchecked(LeafSpec {
                sans,
                not_before,
                not_after,
            })
            .unwrap()
    }

    pub fn material(&self, leaf: &IssuedLeaf, accepted: KindSet) -> Material {
        let fullchain = leaf.fullchain_pem();
        let pem = MaterialPem {
            cert_chain: fullchain.as_bytes(),
            key: leaf.key_pem.as_bytes(),
            bundle: self.root.cert_pem().as_bytes(),
        };
        validate_material(pem, &policy(accepted), self.now).unwrap()
    }

    pub fn live(&self, identity: &str) -> Arc<LiveMaterial> {
        LiveMaterial::new(self.material(&self.leaf(identity), KindSet::ALL))
    }

    /// Every bad client certificate the issue lists that can be presented in a handshake.
    pub fn bad_clients(&self) -> Vec<BadCase> {
        let hour = Duration::from_secs(3600);
        let uri = |s: &str| LeafSan::Uri(s.to_owned());
        let other = Pki::new(TD);
        let wrong_key = {
            let a = self.leaf(NODE);
            let b = self.leaf(NODE);
            mismatched_key(&a, &b)
        };
        vec![
            BadCase {
                name: "expired",
                key: certified(&self.custom(vec![uri(NODE)], self.now - 3 * hour, self.now - hour)),
                reason: RejectReason::Expired,
            },
            BadCase {
                name: "not yet valid",
                key: certified(&self.custom(vec![uri(NODE)], self.now + hour, self.now + 3 * hour)),
                reason: RejectReason::NotYetValid,
            },
            BadCase {
                name: "wrong trust domain",
                key: certified(&self.custom(
                    vec![uri("spiffe://elsewhere.test/region/eu/node/n1")],
                    self.now - hour,
                    self.now + hour,
                )),
                reason: RejectReason::WrongTrustDomain,
            },
            BadCase {
                name: "wrong ca",
                key: certified(&other.leaf(NODE)),
                reason: RejectReason::WrongCa,
            },
            BadCase {
                name: "missing san",
                key: certified(&self.custom(vec![], self.now - hour, self.now + hour)),
                reason: RejectReason::MissingSan,
            },
            BadCase {
                name: "two uri sans",
                key: certified(&self.custom(
                    vec![uri(NODE), uri("spiffe://mesh.test/region/eu/node/n2")],
                    self.now - hour,
                    self.now + hour,
                )),
                reason: RejectReason::MultipleSans,
            },
            BadCase {
                name: "eu node signed by the us intermediate",
                key: certified(&forged(&self.us, NODE, self.now)),
                reason: RejectReason::OutsideIssuerScope,
            },
            BadCase {
                name: "workload on the node port",
                key: certified(&self.leaf(WORKLOAD)),
                reason: RejectReason::WrongKind,
            },
            BadCase {
                name: "key that does not match its certificate",
                key: wrong_key,
                reason: RejectReason::KeyMismatch,
            },
        ]
    }
}

/// A leaf for `identity` signed by `ca` whatever region it names: what a compromised or
/// misused region intermediate could produce.
pub fn forged(ca: &RegionCa, identity: &str, now: SystemTime) -> IssuedLeaf {
    ca.issue_unchecked(LeafSpec {
        sans: vec![LeafSan::Uri(identity.to_owned())],
        not_before: now - Duration::from_secs(60),
        not_after: now + Duration::from_secs(3600),
    })
    .unwrap()
}

pub fn policy(accepted: KindSet) -> PeerPolicy {
    PeerPolicy {
        trust_domain: TrustDomain::new(TD).unwrap(),
        accepted,
        region: None,
    }
}

pub fn only(kind: IdentityKind) -> KindSet {
    KindSet::only(kind)
}

/// The leaf's chain with its own key, with no checks at all.
pub fn certified(leaf: &IssuedLeaf) -> Arc<CertifiedKey> {
    let chain = parse_certs(
        leaf.fullchain_pem().as_bytes(),
        waymark_certs::error::PemPart::Certificate,
    )
    .unwrap();
    let key = parse_key(leaf.key_pem.as_bytes()).unwrap();
    let provider = waymark_certs::provider();
    let signer = provider.key_provider.load_private_key(key).unwrap();
    Arc::new(CertifiedKey::new(chain, signer))
}

/// `cert`'s chain paired with `key`'s private key: a certificate its holder cannot prove.
pub fn mismatched_key(cert: &IssuedLeaf, key: &IssuedLeaf) -> Arc<CertifiedKey> {
    let chain: Vec<CertificateDer<'static>> = certified(cert).cert.clone();
    Arc::new(CertifiedKey::new(chain, Arc::clone(&certified(key).key)))
}

#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl rustls::client::ResolvesClientCert for Fixed {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }
    fn has_certs(&self) -> bool {
        true
    }
}

/// A TLS 1.3 client that presents `key` whatever it is, and verifies the server with our
/// verifier (roots from `live`, admitting `server_kinds`).
pub fn raw_client_config(
    key: Arc<CertifiedKey>,
    live: &Arc<LiveMaterial>,
    server_kinds: KindSet,
    alpn: &[u8],
) -> rustls::ClientConfig {
    let verifier = PeerVerifier::new(Arc::clone(live), policy(server_kinds), CertMetrics::new());
    let mut config = rustls::ClientConfig::builder_with_provider(waymark_certs::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(Fixed(key)));
    config.alpn_protocols = vec![alpn.to_vec()];
    config
}

/// Waits at most this long for anything a test expects to happen.
pub const PATIENCE: Duration = Duration::from_secs(10);
