//! Test PKIs (feature `testing`): an estate CA in memory or as files, leaves for SPIFFE
//! IDs, and certificates a peer must refuse. For tests and drills, never for production.
//!
//! ```text
//! TestPki      RootCa + one RegionCa per region, in memory, at a fixed `now`
//! TestPkiDir   an estate made by `layout::PkiDir` (what `waymark certs init` writes), in
//!              a temporary or given directory; leaves issued into it, handed out as paths
//! server, client
//!              `who`'s side of a gRPC connection over mutual TLS, as the roles build it
//! bad_clients  one certificate per refusal a handshake can produce, with its RejectReason
//! forged, certified, mismatched_key, raw_client_config
//!              the parts: out-of-scope leaves, any chain + key as rustls presents it, and
//!              a TLS client that presents whatever it is given
//! ```
//!
//! An identity is named by its SPIFFE ID or by its path under the PKI's trust domain
//! (`region/eu/node/n1`). Leaves live [`LEAF_TTL`]. Everything panics on failure, which is
//! how a test reports; `TestPkiDir::try_init`/`try_issue` return errors instead, for drills
//! that report failures rather than panic. Users enable the feature in their
//! dev-dependency: `waymark-certs = { workspace = true, features = ["testing"] }`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;

use crate::ca::{CaError, HostSan, IssuedLeaf, LeafSan, LeafSpec, RegionCa, RootCa};
use crate::error::PemPart;
use crate::layout::{LayoutError, PkiDir};
use crate::live::LiveMaterial;
use crate::material::{MaterialPem, parse_certs, parse_key, root_store, validate_material};
use crate::reload::MaterialPaths;
use crate::tls::{ALPN_H2, client_config, server_config};
use crate::verify::PeerVerifier;
use crate::{
    CertMetrics, Identity, KindSet, Material, Name, PeerPolicy, RejectReason, TrustDomain,
};

/// How long the leaves issued here live: longer than any test or drill.
pub const LEAF_TTL: Duration = Duration::from_secs(24 * 3600);

/// An estate in memory: its root and one intermediate per region, all valid at `now`.
pub struct TestPki {
    /// The estate root; its certificate is the trust bundle.
    pub root: RootCa,
    /// The time every leaf is issued at and every check is made at.
    pub now: SystemTime,
    regions: BTreeMap<String, RegionCa>,
}

/// The same kind of estate as files: a [`PkiDir`] made by `init`, in a temporary directory
/// (removed on drop) or in one the caller owns.
pub struct TestPkiDir {
    pki: PkiDir,
    trust_domain: TrustDomain,
    _temp: Option<tempfile::TempDir>,
}

/// One client certificate a peer must refuse, and the reason it must give.
pub struct BadCase {
    /// What is wrong with it, for assertion messages.
    pub name: &'static str,
    /// The chain and key, as rustls presents them.
    pub key: Arc<CertifiedKey>,
    /// The refusal the peer must count.
    pub reason: RejectReason,
}

// === impl TestPki ===

impl TestPki {
    /// A root for `trust_domain` and an intermediate for each of `regions`, at the current
    /// time. Installs the crypto provider.
    pub fn new(trust_domain: &str, regions: &[&str]) -> Self {
        crate::install_crypto_provider();
        let now = SystemTime::now();
        let td = TrustDomain::new(trust_domain).expect("a valid trust domain");
        let root = RootCa::generate(td, now).expect("a root");
        let regions = regions
            .iter()
            .map(|r| {
                let ca = root
                    .issue_region(Name::new(r).expect("a valid region name"), now)
                    .expect("a region intermediate");
                ((*r).to_owned(), ca)
            })
            .collect();
        Self { root, now, regions }
    }

    /// The estate's trust domain.
    pub fn trust_domain(&self) -> &TrustDomain {
        self.root.trust_domain()
    }

    /// The intermediate of `region`.
    ///
    /// # Panics
    ///
    /// If the PKI was made without it.
    pub fn region(&self, region: &str) -> &RegionCa {
        self.regions
            .get(region)
            .unwrap_or_else(|| panic!("no intermediate for region {region}"))
    }

    /// A leaf for `who` from its region's intermediate (an operator's from the root).
    pub fn leaf(&self, who: &str) -> IssuedLeaf {
        let identity = identity(self.trust_domain(), who);
        let issued = match identity.region() {
            Some(region) => self
                .region(region.as_str())
                .issue(&identity, self.now, LEAF_TTL),
            None => self.root.issue(&identity, self.now, LEAF_TTL),
        };
        issued.unwrap_or_else(|e| panic!("issuing {identity}: {e}"))
    }

    /// A leaf from `region`'s intermediate with exactly `sans` and this validity, with no
    /// policy check: expired, not yet valid, foreign or malformed on purpose.
    pub fn custom(
        &self,
        region: &str,
        sans: Vec<LeafSan>,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> IssuedLeaf {
        self.region(region)
            .issue_unchecked(LeafSpec {
                sans,
                not_before,
                not_after,
            })
            .expect("an unchecked leaf")
    }

    /// `leaf` validated as a process's own material (admitting `accepted` kinds as peers).
    pub fn material(&self, leaf: &IssuedLeaf, accepted: KindSet) -> Material {
        let fullchain = leaf.fullchain_pem();
        let pem = MaterialPem {
            cert_chain: fullchain.as_bytes(),
            key: leaf.key_pem.as_bytes(),
            bundle: self.root.cert_pem().as_bytes(),
        };
        validate_material(pem, &self.policy(accepted), self.now).expect("valid own material")
    }

    /// A fresh leaf for `who` as live material that admits every kind.
    pub fn live(&self, who: &str) -> Arc<LiveMaterial> {
        LiveMaterial::new(self.material(&self.leaf(who), KindSet::ALL))
    }

    /// A policy of this trust domain admitting `accepted`, any region.
    pub fn policy(&self, accepted: KindSet) -> PeerPolicy {
        policy(self.trust_domain(), accepted)
    }

    /// A gRPC (h2) server over mutual TLS presenting a fresh leaf for `who` and admitting
    /// clients by `peers` (e.g. `pki.policy(KindSet::only(IdentityKind::Node))`).
    pub fn server(&self, who: &str, peers: PeerPolicy) -> Arc<rustls::ServerConfig> {
        h2_server(&self.live(who), peers)
    }

    /// A gRPC (h2) client over mutual TLS presenting a fresh leaf for `who` and admitting
    /// servers by `peers`.
    pub fn client(&self, who: &str, peers: PeerPolicy) -> Arc<rustls::ClientConfig> {
        h2_client(&self.live(who), peers)
    }

    /// A verifier trusting this estate's root and admitting `accepted`.
    pub fn verifier(&self, accepted: KindSet) -> PeerVerifier {
        verifier(self.root.cert_pem().as_bytes(), self.policy(accepted))
    }

    /// Every bad client certificate that can be presented in a handshake, each instead of
    /// a good `who` (needs another region to forge from), with `wrong_kind` an identity
    /// of a kind the server does not admit.
    pub fn bad_clients(&self, who: &str, wrong_kind: &str) -> Vec<BadCase> {
        let identity = identity(self.trust_domain(), who);
        let uri = |s: &str| LeafSan::Uri(s.to_owned());
        let id = identity.to_string();
        let own = identity.region().expect("a regional identity").as_str();
        let other_region = self
            .regions
            .keys()
            .find(|r| *r != own)
            .expect("a second region to forge from");
        let (now, hour) = (self.now, Duration::from_secs(3600));
        let valid = |sans| self.custom(own, sans, now - hour, now + hour);
        let elsewhere = id.replacen(self.trust_domain().as_str(), "elsewhere.test", 1);
        let case = |name, leaf: &IssuedLeaf, reason| BadCase {
            name,
            key: certified(leaf),
            reason,
        };
        vec![
            case(
                "expired",
                &self.custom(own, vec![uri(&id)], now - 3 * hour, now - hour),
                RejectReason::Expired,
            ),
            case(
                "not yet valid",
                &self.custom(own, vec![uri(&id)], now + hour, now + 3 * hour),
                RejectReason::NotYetValid,
            ),
            case(
                "wrong trust domain",
                &valid(vec![uri(&elsewhere)]),
                RejectReason::WrongTrustDomain,
            ),
            case(
                "wrong ca",
                &TestPki::new(self.trust_domain().as_str(), &[own]).leaf(&id),
                RejectReason::WrongCa,
            ),
            case("missing san", &valid(vec![]), RejectReason::MissingSan),
            case(
                "two uri sans",
                &valid(vec![uri(&id), uri(&format!("{id}-2"))]),
                RejectReason::MultipleSans,
            ),
            case(
                "signed by another region's intermediate",
                &forged(self.region(other_region), &id, now),
                RejectReason::OutsideIssuerScope,
            ),
            case(
                "wrong kind",
                &self.leaf(wrong_kind),
                RejectReason::WrongKind,
            ),
            BadCase {
                name: "key that does not match its certificate",
                key: mismatched_key(&self.leaf(&id), &self.leaf(&id)),
                reason: RejectReason::KeyMismatch,
            },
        ]
    }
}

// === impl TestPkiDir ===

impl TestPkiDir {
    /// An estate for `trust_domain` with `regions`, in a temporary directory removed when
    /// this is dropped. Installs the crypto provider.
    pub fn new(trust_domain: &str, regions: &[&str]) -> Self {
        let temp = tempfile::tempdir().expect("a temporary directory");
        let mut pki = Self::init(&temp.path().join("pki"), trust_domain, regions);
        pki._temp = Some(temp);
        pki
    }

    /// An estate in `dir`, which the caller keeps (a drill's run folder).
    pub fn init(dir: &Path, trust_domain: &str, regions: &[&str]) -> Self {
        Self::try_init(dir, trust_domain, regions)
            .unwrap_or_else(|e| panic!("creating a PKI in {}: {e}", dir.display()))
    }

    /// [`Self::init`], returning why it failed.
    pub fn try_init(dir: &Path, trust_domain: &str, regions: &[&str]) -> Result<Self, LayoutError> {
        crate::install_crypto_provider();
        let td = TrustDomain::new(trust_domain).map_err(CaError::from)?;
        let regions = regions
            .iter()
            .map(|r| Name::new(r))
            .collect::<Result<Vec<_>, _>>()
            .map_err(CaError::from)?;
        let pki = PkiDir::new(dir);
        pki.init(&td, &regions, SystemTime::now())?;
        Ok(Self {
            pki,
            trust_domain: td,
            _temp: None,
        })
    }

    /// The directory and its layout.
    pub fn dir(&self) -> &PkiDir {
        &self.pki
    }

    /// The estate's trust domain.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// `bundle.pem`, what every peer trusts.
    pub fn bundle(&self) -> PathBuf {
        self.pki.bundle()
    }

    /// Issues `who` (from its region's intermediate; operators from the root) into the
    /// directory: the paths a process is configured with (the chain is `fullchain.pem`).
    pub fn issue(&self, who: &str) -> MaterialPaths {
        self.issue_with_hosts(who, &[])
    }

    /// [`Self::issue`], returning why it failed.
    pub fn try_issue(&self, who: &str) -> Result<MaterialPaths, LayoutError> {
        self.try_issue_leaf(who, &[]).map(|(_, paths)| paths)
    }

    /// [`Self::issue`], with names a server answers to beside the identity.
    pub fn issue_with_hosts(&self, who: &str, hosts: &[HostSan]) -> MaterialPaths {
        self.issue_leaf(who, hosts).1
    }

    /// [`Self::issue`], handing back the leaf itself.
    pub fn leaf(&self, who: &str) -> IssuedLeaf {
        self.issue_leaf(who, &[]).0
    }

    /// A fresh leaf for `who` as live material that admits every kind.
    pub fn live(&self, who: &str) -> Arc<LiveMaterial> {
        let leaf = self.leaf(who);
        let bundle = std::fs::read(self.bundle()).expect("the bundle");
        let fullchain = leaf.fullchain_pem();
        let pem = MaterialPem {
            cert_chain: fullchain.as_bytes(),
            key: leaf.key_pem.as_bytes(),
            bundle: &bundle,
        };
        let material = validate_material(pem, &self.policy(KindSet::ALL), SystemTime::now());
        LiveMaterial::new(material.expect("valid own material"))
    }

    /// A gRPC (h2) server over mutual TLS presenting a fresh leaf for `who` and admitting
    /// clients by `peers` (e.g. `pki.policy(KindSet::only(IdentityKind::Node))`).
    pub fn server(&self, who: &str, peers: PeerPolicy) -> Arc<rustls::ServerConfig> {
        h2_server(&self.live(who), peers)
    }

    /// A gRPC (h2) client over mutual TLS presenting a fresh leaf for `who` and admitting
    /// servers by `peers`.
    pub fn client(&self, who: &str, peers: PeerPolicy) -> Arc<rustls::ClientConfig> {
        h2_client(&self.live(who), peers)
    }

    /// A fresh leaf for `who` as rustls presents it.
    pub fn certified(&self, who: &str) -> Arc<CertifiedKey> {
        certified(&self.leaf(who))
    }

    /// A leaf naming `uri` exactly, signed by `region`'s intermediate with no policy check
    /// (another trust domain, another region): a certificate peers refuse.
    pub fn forge(&self, region: &str, uri: &str) -> IssuedLeaf {
        let region = Name::new(region).expect("a valid region name");
        let ca = self
            .pki
            .load_region(&region)
            .expect("the region's intermediate");
        forged(&ca, uri, SystemTime::now())
    }

    /// A policy of this trust domain admitting `accepted`, any region.
    pub fn policy(&self, accepted: KindSet) -> PeerPolicy {
        policy(&self.trust_domain, accepted)
    }

    /// A verifier trusting this estate's bundle and admitting `accepted`.
    pub fn verifier(&self, accepted: KindSet) -> PeerVerifier {
        let bundle = std::fs::read(self.bundle()).expect("the bundle");
        verifier(&bundle, self.policy(accepted))
    }

    fn issue_leaf(&self, who: &str, hosts: &[HostSan]) -> (IssuedLeaf, MaterialPaths) {
        self.try_issue_leaf(who, hosts)
            .unwrap_or_else(|e| panic!("issuing {who}: {e}"))
    }

    fn try_issue_leaf(
        &self,
        who: &str,
        hosts: &[HostSan],
    ) -> Result<(IssuedLeaf, MaterialPaths), LayoutError> {
        let identity = try_identity(&self.trust_domain, who).map_err(CaError::from)?;
        let (leaf, paths) =
            self.pki
                .issue_with_hosts(&identity, None, LEAF_TTL, None, SystemTime::now(), hosts)?;
        let paths = MaterialPaths {
            cert_chain: paths.fullchain,
            key: paths.key,
            bundle: self.pki.bundle(),
        };
        Ok((leaf, paths))
    }
}

impl std::fmt::Debug for TestPkiDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPkiDir")
            .field("dir", &self.pki)
            .field("trust_domain", &self.trust_domain)
            .finish_non_exhaustive()
    }
}

// === bad certificates and raw clients ===

/// A leaf for `uri` signed by `ca` whatever it names, valid around `now`: what a
/// compromised or misused region intermediate could produce.
pub fn forged(ca: &RegionCa, uri: &str, now: SystemTime) -> IssuedLeaf {
    ca.issue_unchecked(LeafSpec {
        sans: vec![LeafSan::Uri(uri.to_owned())],
        not_before: now - Duration::from_secs(60),
        not_after: now + Duration::from_secs(3600),
    })
    .expect("an unchecked leaf")
}

/// The leaf's chain with its own key, as rustls presents it, with no checks at all.
pub fn certified(leaf: &IssuedLeaf) -> Arc<CertifiedKey> {
    certified_pem(leaf.fullchain_pem().as_bytes(), leaf.key_pem.as_bytes())
}

/// A chain and key (PEM) as rustls presents them, with no checks at all.
pub fn certified_pem(chain: &[u8], key: &[u8]) -> Arc<CertifiedKey> {
    let chain = parse_certs(chain, PemPart::Certificate).expect("a certificate chain");
    let key = parse_key(key).expect("a private key");
    let signer = crate::provider()
        .key_provider
        .load_private_key(key)
        .expect("a key rustls can sign with");
    Arc::new(CertifiedKey::new(chain, signer))
}

/// `cert`'s chain paired with `key`'s private key: a certificate its holder cannot prove.
pub fn mismatched_key(cert: &IssuedLeaf, key: &IssuedLeaf) -> Arc<CertifiedKey> {
    let chain = certified(cert).cert.clone();
    Arc::new(CertifiedKey::new(chain, Arc::clone(&certified(key).key)))
}

/// A TLS 1.3 client offering `alpn` that checks the server with `verifier` and presents
/// `presenting` whatever it is (rustls checks nothing of it), or no certificate at all.
pub fn raw_client_config(
    presenting: Option<Arc<CertifiedKey>>,
    verifier: PeerVerifier,
    alpn: &[u8],
) -> rustls::ClientConfig {
    let builder = rustls::ClientConfig::builder_with_provider(crate::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring supports TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match presenting {
        Some(key) => builder.with_client_cert_resolver(Arc::new(Present(key))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    config
}

/// A policy of `trust_domain` admitting `accepted`, any region.
pub fn policy(trust_domain: &TrustDomain, accepted: KindSet) -> PeerPolicy {
    PeerPolicy {
        trust_domain: trust_domain.clone(),
        accepted,
        region: None,
    }
}

/// Always presents its one certificate, asked or not.
#[derive(Debug)]
struct Present(Arc<CertifiedKey>);

impl ResolvesClientCert for Present {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The server config a role builds for a gRPC listener, with metrics nobody reads.
fn h2_server(live: &Arc<LiveMaterial>, peers: PeerPolicy) -> Arc<rustls::ServerConfig> {
    let config = server_config(live, peers, CertMetrics::new(), &[ALPN_H2]);
    Arc::new(config.expect("a server config"))
}

/// The client config a role builds towards a gRPC listener, with metrics nobody reads.
fn h2_client(live: &Arc<LiveMaterial>, peers: PeerPolicy) -> Arc<rustls::ClientConfig> {
    let config = client_config(live, peers, CertMetrics::new(), &[ALPN_H2]);
    Arc::new(config.expect("a client config"))
}

fn verifier(bundle_pem: &[u8], policy: PeerPolicy) -> PeerVerifier {
    let bundle = parse_certs(bundle_pem, PemPart::Bundle).expect("a trust bundle");
    let roots = root_store(&bundle).expect("a root store");
    PeerVerifier::fixed(Arc::new(roots), policy, CertMetrics::new())
}

fn identity(trust_domain: &TrustDomain, who: &str) -> Identity {
    try_identity(trust_domain, who).unwrap_or_else(|e| panic!("identity {who}: {e}"))
}

/// `who` as a SPIFFE ID, or as a path under `trust_domain`.
fn try_identity(
    trust_domain: &TrustDomain,
    who: &str,
) -> Result<Identity, crate::identity::IdentityError> {
    if who.starts_with("spiffe://") {
        Identity::parse(who)
    } else {
        Identity::parse(&format!("spiffe://{}/{who}", trust_domain.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IdentityKind;

    #[tokio::test]
    async fn a_server_and_a_client_of_one_estate_speak_h2_admitting_each_others_kind() {
        // Goal: `server` and `client` build what the roles build: mutual TLS with h2, each
        // side admitting only the kind its policy names.
        let pki = TestPki::new("mesh.test", &["eu"]);
        let nodes = pki.policy(KindSet::only(IdentityKind::Node));
        let authorities = pki.policy(KindSet::only(IdentityKind::Authority));
        let server = pki.server("region/eu/authority/a1", nodes.clone());
        let handshake = async |client: Arc<rustls::ClientConfig>| {
            let (near, far) = tokio::io::duplex(64 * 1024);
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let accept = tokio_rustls::TlsAcceptor::from(Arc::clone(&server)).accept(far);
            let connect = tokio_rustls::TlsConnector::from(client).connect(name, near);
            let (accepted, connected) = tokio::join!(accept, connect);
            let alpn = accepted
                .ok()
                .map(|s| s.get_ref().1.alpn_protocol().map(<[u8]>::to_vec));
            (alpn, connected.is_ok())
        };
        let node = pki.client("region/eu/node/n1", authorities.clone());
        assert_eq!(handshake(node).await, (Some(Some(ALPN_H2.to_vec())), true));
        let workload = pki.client("region/eu/service/web/instance/w1", authorities);
        assert_eq!(
            handshake(workload).await.0,
            None,
            "the server admits nodes only"
        );
        let picky = pki.client("region/eu/node/n2", nodes);
        assert!(
            !handshake(picky).await.1,
            "the client admits authorities only"
        );
    }
}
