//! Reading and checking certificates, keys and trust bundles: the pure half of TLS.
//!
//! Everything here works on bytes and takes `now` as data, so the same checks serve the
//! TLS verifiers (peer certificates), the reloader (our own files) and `certs inspect`.
//!
//! ```text
//! PEM bytes ──► parse_certs / parse_key ──► validate_material ──► Material
//! peer DER  ──► check_peer(policy, roots, now) ──► Identity
//! ```
//!
//! Check order for a presented chain: validity and chain (expired, not yet valid, wrong CA)
//! first, then the SAN shape (missing, several, not a URI, not an identity), then trust
//! domain, then issuer scope, then kind, then the policy's region. Only authenticated data
//! gets as far as the identity checks.
//!
//! **Issuer scope** (ADR-15: a region's intermediate speaks only for its region). Every
//! chain check, of a peer's chain and of our own material alike, reads the scope URI SAN
//! of each intermediate on the *verified* path (not merely what was presented): a leaf that
//! names region `r` must be signed by the estate root directly or by an intermediate whose
//! scope is `spiffe://<td>/region/<r>`; an operator (no region) only by the estate root, so
//! a compromised region cannot mint a principal that acts estate-wide. An intermediate
//! without a waymark scope, or with the estate's, is out of scope for every leaf. The
//! trust bundle must hold the estate root, never a region intermediate: as an anchor it
//! would end every path it signs, leaving no intermediate to check, so a bundle entry with
//! a region scope is refused ([`check_anchors`]). We check the scope URI rather than X.509
//! name constraints because URI name constraints cannot say this: RFC 5280 matches them
//! against the URI's host only (`<td>`, the same for every region), and webpki refuses
//! every URI under a permitted URI subtree outright.

use std::sync::Arc;
use std::time::SystemTime;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::error::{CertError, PemPart};
use crate::identity::{CaScope, Identity, IdentityKind, KindSet, Name, TrustDomain};
use crate::lifetime::{from_unix_seconds, unix_seconds};

/// What a port or a holder of material accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPolicy {
    /// The estate's trust domain; identities elsewhere are refused.
    pub trust_domain: TrustDomain,
    /// Identity kinds accepted (e.g. only `Node` on the node-agent port).
    pub accepted: KindSet,
    /// When set, only identities of this region are admitted (e.g. a node agent dials only
    /// its own region's authorities). Operators name no region and are not affected: only
    /// the estate root issues them (see the module doc), so no region can mint one, and
    /// `accepted` is what keeps them off a port.
    pub region: Option<Name>,
}

/// Which key purpose a chain is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// The certificate authenticates a TLS client.
    Client,
    /// The certificate authenticates a TLS server.
    Server,
}

/// One subject alternative name entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SanEntry {
    /// A URI, e.g. a `spiffe://` identity.
    Uri(String),
    /// A DNS name.
    Dns(String),
    /// An IP address.
    Ip(std::net::IpAddr),
    /// Any other kind, described.
    Other(String),
}

/// The loggable facts about one certificate. Holds no key material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Subject distinguished name.
    pub subject: String,
    /// Serial number, lower-case hex.
    pub serial: String,
    /// `sha256:<hex>` of the DER.
    pub fingerprint: String,
    /// Start of validity, unix seconds.
    pub not_before: i64,
    /// End of validity, unix seconds.
    pub not_after: i64,
    /// Whether basic constraints mark it as a CA.
    pub is_ca: bool,
    /// Subject alternative names, in certificate order.
    pub sans: Vec<SanEntry>,
}

/// A validated certificate, key and trust bundle, ready to hand to rustls.
#[derive(Debug)]
pub struct Material {
    /// Our identity, from the leaf's URI SAN.
    pub identity: Identity,
    /// Facts about our leaf.
    pub leaf: CertInfo,
    /// Leaf, chain and signing key for rustls.
    pub certified_key: Arc<CertifiedKey>,
    /// Roots peers must chain to.
    pub roots: Arc<RootCertStore>,
    /// `sha256:<hex>` over the bundle's certificates, to notice bundle changes.
    pub bundle_digest: String,
}

/// The three inputs of [`validate_material`], as raw PEM bytes.
#[derive(Debug, Clone, Copy)]
pub struct MaterialPem<'a> {
    /// Leaf certificate followed by its intermediates.
    pub cert_chain: &'a [u8],
    /// PKCS#8 (or SEC1/PKCS#1) private key of the leaf.
    pub key: &'a [u8],
    /// Root certificates to trust.
    pub bundle: &'a [u8],
}

/// Parses every certificate in `pem`; refuses damaged or empty input.
pub fn parse_certs(pem: &[u8], part: PemPart) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| CertError::TruncatedPem { part, source })?;
    if certs.is_empty() {
        return Err(CertError::EmptyPem { part });
    }
    Ok(certs)
}

/// Parses the first private key in `pem`; refuses damaged or empty input.
pub fn parse_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, CertError> {
    use rustls::pki_types::pem::Error as PemError;
    PrivateKeyDer::from_pem_slice(pem).map_err(|source| match source {
        PemError::NoItemsFound => CertError::EmptyPem { part: PemPart::Key },
        source => CertError::TruncatedPem {
            part: PemPart::Key,
            source,
        },
    })
}

/// `sha256:<hex>` of a DER certificate.
pub fn fingerprint(der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(der)))
}

/// Reads the loggable facts of a certificate.
pub fn cert_info(der: &[u8]) -> Result<CertInfo, CertError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|_| CertError::Malformed)?;
    let sans = match cert.subject_alternative_name() {
        Ok(Some(ext)) => ext.value.general_names.iter().map(san_entry).collect(),
        Ok(None) => Vec::new(),
        Err(_) => return Err(CertError::Malformed),
    };
    Ok(CertInfo {
        subject: cert.subject().to_string(),
        serial: hex::encode(cert.tbs_certificate.raw_serial()),
        fingerprint: fingerprint(der),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        is_ca: cert.is_ca(),
        sans,
    })
}

/// Checks a peer's chain and identity against `policy` at `now`; returns its identity.
pub fn check_peer(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    roots: &RootCertStore,
    now: UnixTime,
    usage: Usage,
    policy: &PeerPolicy,
) -> Result<(Identity, CertInfo), CertError> {
    let info = cert_info(end_entity)?;
    let issuers = verify_chain(end_entity, intermediates, roots, now, usage, &info.serial)?;
    let identity = info.identity()?;
    check_verified(&identity, &issuers, policy)?;
    Ok((identity, info))
}

/// Checks trust domain, then kind, then region of an identity whose chain and issuer scope
/// were already checked (as [`check_peer`] and [`validate_material`] do).
pub fn check_identity(identity: &Identity, policy: &PeerPolicy) -> Result<(), CertError> {
    check_trust_domain(identity, policy)?;
    check_admitted(identity, policy)
}

/// Checks that every CA between a leaf and the root may speak for the leaf's identity:
/// `issuers` are the scopes of the intermediates on the verified path (`None` for one
/// without a waymark scope URI), empty when the estate root signed the leaf itself.
pub fn check_issuer_scope(
    identity: &Identity,
    issuers: &[Option<CaScope>],
) -> Result<(), CertError> {
    let in_scope = |scope: &Option<CaScope>| match (scope, identity.region()) {
        (Some(CaScope::Region(td, r)), Some(region)) => {
            td == identity.trust_domain() && r == region
        }
        // Operators only from the root; nothing from an unscoped or estate-scoped
        // intermediate (the estate's scope belongs to the root alone).
        _ => false,
    };
    match issuers.iter().find(|scope| !in_scope(scope)) {
        None => Ok(()),
        Some(scope) => Err(CertError::OutsideIssuerScope {
            identity: Box::new(identity.clone()),
            issuer: scope.clone().map(Box::new),
        }),
    }
}

fn check_verified(
    identity: &Identity,
    issuers: &[Option<CaScope>],
    policy: &PeerPolicy,
) -> Result<(), CertError> {
    check_trust_domain(identity, policy)?;
    check_issuer_scope(identity, issuers)?;
    check_admitted(identity, policy)
}

fn check_trust_domain(identity: &Identity, policy: &PeerPolicy) -> Result<(), CertError> {
    if identity.trust_domain() != &policy.trust_domain {
        return Err(CertError::WrongTrustDomain {
            identity: Box::new(identity.clone()),
            expected: policy.trust_domain.clone(),
        });
    }
    Ok(())
}

fn check_admitted(identity: &Identity, policy: &PeerPolicy) -> Result<(), CertError> {
    if !policy.accepted.contains(identity.kind()) {
        return Err(CertError::WrongKind {
            identity: Box::new(identity.clone()),
            accepted: policy.accepted,
        });
    }
    if let (Some(expected), Some(region)) = (&policy.region, identity.region())
        && region != expected
    {
        return Err(CertError::WrongRegion {
            identity: Box::new(identity.clone()),
            expected: expected.clone(),
        });
    }
    Ok(())
}

/// Parses, pairs and checks our own certificate, key and bundle at `now`. The leaf must
/// chain to the bundle through CAs whose scope covers it, its key must match, and its
/// identity must satisfy `policy`.
pub fn validate_material(
    pem: MaterialPem<'_>,
    policy: &PeerPolicy,
    now: SystemTime,
) -> Result<Material, CertError> {
    let chain = parse_certs(pem.cert_chain, PemPart::Certificate)?;
    let key = parse_key(pem.key)?;
    let bundle = parse_certs(pem.bundle, PemPart::Bundle)?;
    check_anchors(&bundle)?;
    let roots = root_store(&bundle)?;

    let provider = crate::provider();
    let certified_key = CertifiedKey::from_der(chain, key, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => CertError::KeyMismatch,
        other => CertError::UnsupportedKey(other),
    })?;
    let (leaf_der, intermediates) = certified_key
        .cert
        .split_first()
        .expect("parse_certs returns at least one certificate");
    // Operators only ever act as clients; every other kind also serves.
    let (identity, leaf) = {
        let info = cert_info(leaf_der)?;
        let identity = info.identity()?;
        let usage = match identity.kind() {
            IdentityKind::Operator => Usage::Client,
            _ => Usage::Server,
        };
        let now = unix_time(now);
        let issuers = verify_chain(leaf_der, intermediates, &roots, now, usage, &info.serial)?;
        check_verified(&identity, &issuers, policy)?;
        (identity, info)
    };
    let mut digest = Sha256::new();
    for der in &bundle {
        digest.update(der.as_ref());
    }
    Ok(Material {
        identity,
        leaf,
        certified_key: Arc::new(certified_key),
        roots: Arc::new(roots),
        bundle_digest: format!("sha256:{}", hex::encode(digest.finalize())),
    })
}

/// Refuses a trust bundle holding a region intermediate (a CA whose scope URI names a
/// region). Trusted as an anchor, it would end every path it signs, so the issuer-scope
/// check would see no intermediate and let that region's CA speak for any region and for
/// operators. Only the estate root belongs in a bundle; an entry with no waymark scope
/// (e.g. a root made elsewhere) is left to the chain checks, as before.
pub fn check_anchors(bundle: &[CertificateDer<'_>]) -> Result<(), CertError> {
    for der in bundle {
        if let Some(scope @ CaScope::Region(..)) = ca_scope(der) {
            let serial = cert_info(der).map(|info| info.serial).unwrap_or_default();
            return Err(CertError::RegionScopedAnchor {
                scope: Box::new(scope),
                serial,
            });
        }
    }
    Ok(())
}

/// Builds a root store; a bundle entry that is not a usable trust anchor is refused.
pub fn root_store(bundle: &[CertificateDer<'static>]) -> Result<RootCertStore, CertError> {
    let mut roots = RootCertStore::empty();
    for der in bundle {
        roots.add(der.clone()).map_err(|_| CertError::Malformed)?;
    }
    Ok(roots)
}

/// Converts wall-clock time to what webpki wants.
pub fn unix_time(now: SystemTime) -> UnixTime {
    UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        u64::try_from(unix_seconds(now)).unwrap_or(0),
    ))
}

// === impl CertInfo ===

impl CertInfo {
    /// The identity in the single URI SAN, or why there is none.
    ///
    /// As in SPIFFE's X.509-SVID rules: exactly one URI SAN; DNS and IP SANs may sit beside
    /// it (a server names where it listens, for clients such as curl that check the name),
    /// but they never identify anyone here.
    pub fn identity(&self) -> Result<Identity, CertError> {
        let mut uris = self.sans.iter().filter_map(|san| match san {
            SanEntry::Uri(uri) => Some(uri),
            _ => None,
        });
        match (uris.next(), uris.next()) {
            (Some(uri), None) => Identity::parse(uri).map_err(CertError::BadIdentity),
            (None, _) if self.sans.is_empty() => Err(CertError::MissingSan),
            (None, _) => Err(CertError::SanNotUri),
            (Some(_), Some(_)) => Err(CertError::MultipleSans {
                count: self
                    .sans
                    .iter()
                    .filter(|s| matches!(s, SanEntry::Uri(_)))
                    .count(),
            }),
        }
    }

    /// `not_before` as wall-clock time.
    pub fn not_before_time(&self) -> SystemTime {
        from_unix_seconds(self.not_before)
    }

    /// `not_after` as wall-clock time.
    pub fn not_after_time(&self) -> SystemTime {
        from_unix_seconds(self.not_after)
    }
}

// === helpers ===

/// Verifies the chain; returns the scope of each intermediate on the path webpki built
/// (empty when the root signed the leaf), for [`check_issuer_scope`].
fn verify_chain(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    roots: &RootCertStore,
    now: UnixTime,
    usage: Usage,
    serial: &str,
) -> Result<Vec<Option<CaScope>>, CertError> {
    let ee = webpki::EndEntityCert::try_from(end_entity).map_err(|_| CertError::Malformed)?;
    let algs = crate::provider().signature_verification_algorithms.all;
    let eku = match usage {
        Usage::Client => webpki::KeyUsage::client_auth(),
        Usage::Server => webpki::KeyUsage::server_auth(),
    };
    let path = ee
        .verify_for_usage(algs, &roots.roots, intermediates, now, eku, None, None)
        .map_err(|e| CertError::from_webpki(e, serial))?;
    // Only certificates webpki used count: a peer may present extra ones.
    let scopes = path
        .intermediate_certificates()
        .map(|ca| ca_scope(&ca.der()))
        .collect();
    Ok(scopes)
}

/// The trust domain a bundle's estate root serves: what a client with no identity of
/// its own (a token-authenticated CLI) expects its server to belong to.
pub fn bundle_trust_domain(bundle: &[CertificateDer<'_>]) -> Option<TrustDomain> {
    bundle.iter().find_map(|der| match ca_scope(der) {
        Some(CaScope::Estate(td)) => Some(td),
        _ => None,
    })
}

/// The scope URI of a CA certificate, if it carries exactly one of the waymark shape.
fn ca_scope(der: &CertificateDer<'_>) -> Option<CaScope> {
    let info = cert_info(der).ok()?;
    match info.sans.as_slice() {
        [SanEntry::Uri(uri)] if info.is_ca => CaScope::parse(uri).ok(),
        _ => None,
    }
}

fn san_entry(name: &GeneralName<'_>) -> SanEntry {
    match name {
        GeneralName::URI(uri) => SanEntry::Uri((*uri).to_owned()),
        GeneralName::DNSName(dns) => SanEntry::Dns((*dns).to_owned()),
        GeneralName::IPAddress(bytes) => match *bytes {
            [a, b, c, d] => SanEntry::Ip(std::net::Ipv4Addr::new(*a, *b, *c, *d).into()),
            _ => match <[u8; 16]>::try_from(*bytes) {
                Ok(v6) => SanEntry::Ip(std::net::Ipv6Addr::from(v6).into()),
                Err(_) => SanEntry::Other(format!("ip:{}", hex::encode(bytes))),
            },
        },
        other => SanEntry::Other(other.to_string()),
    }
}
