//! A small CA you can run: an estate root, one intermediate per region, short-lived leaves.
//!
//! ```text
//! RootCa (spiffe://<td>, 10 y) ──► RegionCa (spiffe://<td>/region/<r>, 1 y) ──► leaf (24 h)
//!                              └─► operator leaf (8 h)
//! ```
//!
//! CA certificates carry their scope as a URI SAN so loading one back tells us which trust
//! domain and region it serves, and so every chain check can refuse a leaf its issuer does
//! not speak for (`material`: a region's intermediate signs only its own region's nodes,
//! authorities and workloads; operators, who act estate-wide, only the root). Leaves get
//! exactly one URI SAN (the identity), both the serverAuth and clientAuth purposes (agents
//! serve and dial), and ECDSA P-256 keys. `issue` enforces policy (trust domain, scope, TTL
//! bounds from `lifetime`); `issue_unchecked` signs whatever it is given, for tests and
//! tooling that must produce certificates peers will refuse. Time is passed in; nothing
//! here reads the clock or touches files (`layout` does).

use std::fmt;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::pki_types::CertificateDer;

use crate::error::{CertError, PemPart};
use crate::identity::{CaScope, Identity, IdentityError, Name, TrustDomain};
use crate::lifetime::{
    CLOCK_SKEW_ALLOWANCE, INTERMEDIATE_TTL, LifetimeError, ROOT_TTL, check_leaf_ttl,
    format_unix_seconds, unix_seconds,
};
use crate::material::{CertInfo, cert_info, parse_certs};

/// Why the CA refused to issue or load. Nothing was issued or written; fix the input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaError {
    /// The requested TTL is outside the bounds. Nothing was issued; choose another TTL.
    #[error("requested lifetime refused")]
    Lifetime(#[from] LifetimeError),
    /// The identity is in another trust domain than the CA. Nothing was issued.
    #[error("identity {identity} is not in this ca's trust domain {trust_domain}")]
    WrongTrustDomain {
        /// Requested identity.
        identity: Box<Identity>,
        /// The CA's trust domain.
        trust_domain: TrustDomain,
    },
    /// The identity belongs to another region than this intermediate. Nothing was issued;
    /// use that region's intermediate.
    #[error("identity {identity} is not in this intermediate's region {region}")]
    WrongRegion {
        /// Requested identity.
        identity: Box<Identity>,
        /// The intermediate's region.
        region: Name,
    },
    /// A region intermediate was asked for an operator. Nothing was issued; operators act
    /// across the estate, so only the estate root issues them (`RootCa::issue`).
    #[error("operator identity {identity} is issued by the estate root, not a region intermediate")]
    OperatorNeedsRoot {
        /// Requested identity.
        identity: Box<Identity>,
    },
    /// The leaf would outlive its issuer. Nothing was issued; rotate the intermediate or
    /// ask for a shorter TTL.
    #[error("certificate would outlive its issuer, which expires at {}", format_unix_seconds(*issuer_not_after))]
    OutlivesIssuer {
        /// Issuer expiry, unix seconds.
        issuer_not_after: i64,
    },
    /// A loaded certificate has no CA scope URI of the expected shape. Nothing was loaded;
    /// point at a root or intermediate made by `waymark certs init`.
    #[error("certificate is not a waymark {expected} ca")]
    NotOurCa {
        /// "root" or "region".
        expected: &'static str,
    },
    /// A CA certificate or key could not be read. Nothing was loaded.
    #[error("ca certificate refused")]
    Cert(#[from] CertError),
    /// A scope or identity was malformed. Nothing was issued.
    #[error("bad name")]
    Identity(#[from] IdentityError),
    /// rcgen could not build, sign or parse. Nothing was issued.
    #[error("certificate generation failed")]
    Generate(#[from] rcgen::Error),
}

/// The estate root: signs region intermediates and operator leaves (and, for tests, any
/// leaf; production tooling keeps it to operators so the root key stays offline).
pub struct RootCa {
    ca: CaCert,
    trust_domain: TrustDomain,
}

/// A region intermediate: signs leaves for node, authority and workload identities of its
/// own region, nothing else.
pub struct RegionCa {
    ca: CaCert,
    trust_domain: TrustDomain,
    region: Name,
}

/// What `issue_unchecked` puts into a certificate.
#[derive(Debug, Clone)]
pub struct LeafSpec {
    /// SAN entries, in order.
    pub sans: Vec<LeafSan>,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
}

/// One SAN for [`LeafSpec`].
#[derive(Debug, Clone)]
pub enum LeafSan {
    /// A URI SAN.
    Uri(String),
    /// A DNS SAN.
    Dns(String),
    /// An IP address SAN.
    Ip(std::net::IpAddr),
}

/// A name a server answers to, put into its certificate beside the identity so that
/// clients checking the dialled name (curl, browsers, Prometheus) accept it. Peers inside
/// waymark ignore it: they admit by the identity alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSan {
    /// A DNS name, e.g. `localhost` or `authority.waymark.svc`.
    Dns(String),
    /// An IP address, e.g. `127.0.0.1`.
    Ip(std::net::IpAddr),
}

impl HostSan {
    /// `localhost`, `127.0.0.1` and `::1`: what a loopback listener is dialled as.
    pub fn loopback() -> Vec<Self> {
        vec![
            Self::Dns("localhost".into()),
            Self::Ip(std::net::Ipv4Addr::LOCALHOST.into()),
            Self::Ip(std::net::Ipv6Addr::LOCALHOST.into()),
        ]
    }

    /// An IP address if `text` is one, a DNS name otherwise.
    pub fn parse(text: &str) -> Self {
        text.parse()
            .map_or_else(|_| Self::Dns(text.to_owned()), Self::Ip)
    }

    fn to_leaf(&self) -> LeafSan {
        match self {
            Self::Dns(d) => LeafSan::Dns(d.clone()),
            Self::Ip(ip) => LeafSan::Ip(*ip),
        }
    }
}

/// A freshly issued leaf. `Debug` omits the key.
pub struct IssuedLeaf {
    /// Leaf certificate, PEM.
    pub cert_pem: String,
    /// The intermediate(s) between leaf and root, PEM; empty when the root signed it.
    pub chain_pem: String,
    /// PKCS#8 private key, PEM. Secret: write with 0600, never log.
    pub key_pem: String,
    /// Loggable facts about the leaf.
    pub info: CertInfo,
}

struct CaCert {
    cert_pem: String,
    info: CertInfo,
    issuer: Issuer<'static, KeyPair>,
}

// === impl RootCa ===

impl RootCa {
    /// Generates a new root for `trust_domain`, valid from `now` for [`ROOT_TTL`].
    pub fn generate(trust_domain: TrustDomain, now: SystemTime) -> Result<Self, CaError> {
        let scope = CaScope::Estate(trust_domain.clone());
        let mut params = ca_params(&scope, "waymark estate root", now, now + ROOT_TTL)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(1));
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let cert = params.self_signed(&key)?;
        let ca = CaCert::new(cert.pem(), cert.der(), Issuer::new(params, key))?;
        Ok(Self { ca, trust_domain })
    }

    /// Loads a root written by `waymark certs init`.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CaError> {
        let ca = CaCert::from_pem(cert_pem, key_pem)?;
        match ca.scope()? {
            CaScope::Estate(trust_domain) => Ok(Self { ca, trust_domain }),
            CaScope::Region(..) => Err(CaError::NotOurCa { expected: "root" }),
        }
    }

    /// Issues the intermediate for `region`, valid from `now` for [`INTERMEDIATE_TTL`]
    /// (capped at the root's own expiry).
    pub fn issue_region(&self, region: Name, now: SystemTime) -> Result<RegionCa, CaError> {
        let scope = CaScope::Region(self.trust_domain.clone(), region.clone());
        let label = format!("waymark region {region} intermediate");
        let not_after = (now + INTERMEDIATE_TTL).min(self.ca.info.not_after_time());
        let mut params = ca_params(&scope, &label, now, not_after)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let cert = params.signed_by(&key, &self.ca.issuer)?;
        let ca = CaCert::new(cert.pem(), cert.der(), Issuer::new(params, key))?;
        Ok(RegionCa {
            ca,
            trust_domain: self.trust_domain.clone(),
            region,
        })
    }

    /// The estate's trust domain.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// Issues a leaf for `identity` directly from the root, valid from `now` (back-dated by
    /// [`CLOCK_SKEW_ALLOWANCE`]) for `ttl`. Refuses other trust domains, TTLs outside the
    /// `lifetime` bounds and leaves that would outlive the root. Its `chain_pem` is empty.
    pub fn issue(
        &self,
        identity: &Identity,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<IssuedLeaf, CaError> {
        self.issue_with_hosts(identity, now, ttl, &[])
    }

    /// [`Self::issue`], with DNS and IP SANs beside the identity (see [`HostSan`]).
    pub fn issue_with_hosts(
        &self,
        identity: &Identity,
        now: SystemTime,
        ttl: Duration,
        hosts: &[HostSan],
    ) -> Result<IssuedLeaf, CaError> {
        let spec = self
            .ca
            .leaf_spec(&self.trust_domain, identity, now, ttl, hosts)?;
        self.issue_unchecked(spec)
    }

    /// Signs a leaf exactly as described, with no policy checks; see
    /// [`RegionCa::issue_unchecked`].
    pub fn issue_unchecked(&self, spec: LeafSpec) -> Result<IssuedLeaf, CaError> {
        self.ca.sign_leaf(spec, String::new())
    }

    /// Root certificate, PEM (this is the trust bundle).
    pub fn cert_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// Root private key, PEM. Secret.
    pub fn key_pem(&self) -> String {
        self.ca.issuer.key().serialize_pem()
    }

    /// Facts about the root certificate.
    pub fn info(&self) -> &CertInfo {
        &self.ca.info
    }
}

// === impl RegionCa ===

impl RegionCa {
    /// Loads an intermediate written by `waymark certs init`.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CaError> {
        let ca = CaCert::from_pem(cert_pem, key_pem)?;
        match ca.scope()? {
            CaScope::Region(trust_domain, region) => Ok(Self {
                ca,
                trust_domain,
                region,
            }),
            CaScope::Estate(_) => Err(CaError::NotOurCa { expected: "region" }),
        }
    }

    /// Issues a leaf for `identity`, valid from `now` (back-dated by
    /// [`CLOCK_SKEW_ALLOWANCE`]) for `ttl`. Refuses other trust domains, other regions,
    /// operators, TTLs outside the `lifetime` bounds and leaves that would outlive this
    /// intermediate.
    pub fn issue(
        &self,
        identity: &Identity,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<IssuedLeaf, CaError> {
        self.issue_with_hosts(identity, now, ttl, &[])
    }

    /// [`Self::issue`], with DNS and IP SANs beside the identity (see [`HostSan`]).
    pub fn issue_with_hosts(
        &self,
        identity: &Identity,
        now: SystemTime,
        ttl: Duration,
        hosts: &[HostSan],
    ) -> Result<IssuedLeaf, CaError> {
        let spec = self
            .ca
            .leaf_spec(&self.trust_domain, identity, now, ttl, hosts)?;
        match identity.region() {
            // Peers refuse both (`material::check_issuer_scope`); refusing here says why.
            None => Err(CaError::OperatorNeedsRoot {
                identity: Box::new(identity.clone()),
            }),
            Some(r) if r != &self.region => Err(CaError::WrongRegion {
                identity: Box::new(identity.clone()),
                region: self.region.clone(),
            }),
            Some(_) => self.issue_unchecked(spec),
        }
    }

    /// Signs a leaf exactly as described, with no policy checks. For tests and tooling
    /// that need certificates peers must refuse; production issuing uses [`Self::issue`].
    pub fn issue_unchecked(&self, spec: LeafSpec) -> Result<IssuedLeaf, CaError> {
        self.ca.sign_leaf(spec, self.ca.cert_pem.clone())
    }

    /// The region this intermediate serves.
    pub fn region(&self) -> &Name {
        &self.region
    }

    /// The estate's trust domain.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// Intermediate certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// Intermediate private key, PEM. Secret.
    pub fn key_pem(&self) -> String {
        self.ca.issuer.key().serialize_pem()
    }

    /// Facts about the intermediate certificate.
    pub fn info(&self) -> &CertInfo {
        &self.ca.info
    }
}

// === impl IssuedLeaf ===

impl IssuedLeaf {
    /// Leaf followed by its chain: what a TLS endpoint presents.
    pub fn fullchain_pem(&self) -> String {
        format!("{}{}", self.cert_pem, self.chain_pem)
    }
}

impl fmt::Debug for IssuedLeaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedLeaf")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for RootCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RootCa")
            .field("trust_domain", &self.trust_domain)
            .field("info", &self.ca.info)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for RegionCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionCa")
            .field("region", &self.region)
            .field("info", &self.ca.info)
            .finish_non_exhaustive()
    }
}

// === impl CaCert ===

impl CaCert {
    fn new(
        cert_pem: String,
        der: &CertificateDer<'_>,
        issuer: Issuer<'static, KeyPair>,
    ) -> Result<Self, CaError> {
        Ok(Self {
            cert_pem,
            info: cert_info(der)?,
            issuer,
        })
    }

    fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CaError> {
        let der = parse_certs(cert_pem.as_bytes(), PemPart::Certificate)?
            .into_iter()
            .next()
            .expect("parse_certs returns at least one certificate");
        // Validate the PEM framing with the same reader we use elsewhere, for the error.
        crate::material::parse_key(key_pem.as_bytes())?;
        let key = KeyPair::from_pem(key_pem)?;
        let issuer = Issuer::from_ca_cert_der(&der, key)?;
        let ca = Self::new(cert_pem.to_owned(), &der, issuer)?;
        if ca.issuer.key().subject_public_key_info() != spki_of(&der)? {
            return Err(CertError::KeyMismatch.into());
        }
        Ok(ca)
    }

    /// The checked spec for a leaf naming `identity` (and `hosts` beside it): TTL within
    /// bounds, `identity` in `trust_domain`, and not outliving this CA.
    fn leaf_spec(
        &self,
        trust_domain: &TrustDomain,
        identity: &Identity,
        now: SystemTime,
        ttl: Duration,
        hosts: &[HostSan],
    ) -> Result<LeafSpec, CaError> {
        check_leaf_ttl(ttl)?;
        if identity.trust_domain() != trust_domain {
            return Err(CaError::WrongTrustDomain {
                identity: Box::new(identity.clone()),
                trust_domain: trust_domain.clone(),
            });
        }
        let not_after = now + ttl;
        if unix_seconds(not_after) > self.info.not_after {
            return Err(CaError::OutlivesIssuer {
                issuer_not_after: self.info.not_after,
            });
        }
        let identity_san = LeafSan::Uri(identity.to_string());
        Ok(LeafSpec {
            sans: std::iter::once(identity_san)
                .chain(hosts.iter().map(HostSan::to_leaf))
                .collect(),
            not_before: now - CLOCK_SKEW_ALLOWANCE,
            not_after,
        })
    }

    /// Signs `spec` with this CA; `chain_pem` is what lies between the leaf and the root.
    fn sign_leaf(&self, spec: LeafSpec, chain_pem: String) -> Result<IssuedLeaf, CaError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "waymark");
        params
            .distinguished_name
            .push(DnType::CommonName, "waymark workload");
        params.subject_alt_names = spec
            .sans
            .iter()
            .map(|san| match san {
                LeafSan::Uri(u) => Ok(SanType::URI(u.as_str().try_into()?)),
                LeafSan::Dns(d) => Ok(SanType::DnsName(d.as_str().try_into()?)),
                LeafSan::Ip(ip) => Ok(SanType::IpAddress(*ip)),
            })
            .collect::<Result<_, rcgen::Error>>()?;
        params.not_before = spec.not_before.into();
        params.not_after = spec.not_after.into();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedLeaf {
            cert_pem: cert.pem(),
            chain_pem,
            key_pem: key.serialize_pem(),
            info: cert_info(cert.der())?,
        })
    }

    fn scope(&self) -> Result<CaScope, CaError> {
        match self.info.sans.as_slice() {
            [crate::material::SanEntry::Uri(uri)] if self.info.is_ca => Ok(CaScope::parse(uri)?),
            _ => Err(CaError::NotOurCa {
                expected: "waymark",
            }),
        }
    }
}

fn ca_params(
    scope: &CaScope,
    label: &str,
    now: SystemTime,
    not_after: SystemTime,
) -> Result<CertificateParams, CaError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "waymark");
    params.distinguished_name.push(
        DnType::OrganizationalUnitName,
        scope.trust_domain().as_str(),
    );
    params.distinguished_name.push(DnType::CommonName, label);
    params.subject_alt_names = vec![SanType::URI(scope.to_string().as_str().try_into()?)];
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = (now - CLOCK_SKEW_ALLOWANCE).into();
    params.not_after = not_after.into();
    params.use_authority_key_identifier_extension = true;
    Ok(params)
}

fn spki_of(der: &CertificateDer<'_>) -> Result<Vec<u8>, CaError> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).map_err(|_| CertError::Malformed)?;
    Ok(cert.tbs_certificate.subject_pki.raw.to_vec())
}

#[cfg(test)]
#[path = "ca_test.rs"]
mod tests;
