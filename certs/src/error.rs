//! Why a certificate, key or bundle is refused, as one typed error per reason.
//!
//! The same [`CertError`] comes out of loading files (reload, `waymark certs inspect`)
//! and out of the TLS verifiers when a peer presents something bad, so an operator sees
//! one vocabulary everywhere. Each variant maps to a stable [`RejectReason`], which is the
//! `reason` label of `waymark_certs_rejected_total` (see `metrics`). Refusing never
//! changes state: the old configuration keeps serving and the peer is not admitted.
//!
//! Inside a TLS handshake the error travels as `rustls::Error::InvalidCertificate(
//! CertificateError::Other(..))`; [`CertError::from_tls`] digs it back out.

use std::fmt;

use crate::identity::{CaScope, Identity, IdentityError, KindSet, Name, TrustDomain};
use crate::lifetime::format_unix_seconds;

/// Which input a PEM problem was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemPart {
    /// The certificate (or certificate chain) file.
    Certificate,
    /// The private key file.
    Key,
    /// The trust bundle file.
    Bundle,
}

/// A certificate, key or bundle that was refused. Refusing changes nothing.
///
/// `Debug` prints the reason and the message rather than the structure: rustls formats a
/// verifier's error with `{:?}` inside its own message, which is what quinn peers and logs
/// end up showing.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// `now` is past `not_after`. Nothing changed (an old config keeps serving, a peer is
    /// not admitted); issue a fresh certificate, or check the clock.
    #[error("certificate expired at {} (serial {serial})", format_unix_seconds(*not_after))]
    Expired {
        /// Serial number, hex.
        serial: String,
        /// Expiry, unix seconds.
        not_after: i64,
    },
    /// `now` is before `not_before`. Nothing changed; wait, or fix the clock on the issuer
    /// or this host.
    #[error("certificate is not valid until {} (serial {serial})", format_unix_seconds(*not_before))]
    NotYetValid {
        /// Serial number, hex.
        serial: String,
        /// Start of validity, unix seconds.
        not_before: i64,
    },
    /// The identity is in another trust domain. Nothing changed; issue from this estate's CA.
    #[error("identity {identity} is not in trust domain {expected}")]
    WrongTrustDomain {
        /// The identity presented.
        identity: Box<Identity>,
        /// The trust domain this endpoint belongs to.
        expected: TrustDomain,
    },
    /// The chain does not lead to a root in the trust bundle. Nothing changed; issue from
    /// this estate's CA, or distribute the right bundle.
    #[error("certificate was not issued by a ca in the trust bundle")]
    WrongCa,
    /// The certificate has no subject alternative name. Nothing changed; issue it with
    /// exactly one `spiffe://` URI SAN.
    #[error("certificate has no subject alternative name; expected one spiffe uri")]
    MissingSan,
    /// The certificate has more than one URI subject alternative name. Nothing changed;
    /// issue it with exactly one `spiffe://` URI SAN (DNS and IP SANs may sit beside it).
    #[error(
        "certificate has {count} uri subject alternative names; expected exactly one spiffe uri"
    )]
    MultipleSans {
        /// How many URI SAN entries were found.
        count: usize,
    },
    /// The only SAN is not a URI (e.g. a DNS name). Nothing changed; reissue with a URI SAN.
    #[error("certificate's subject alternative name is not a uri")]
    SanNotUri,
    /// The URI SAN is not a waymark identity. Nothing changed; reissue with a valid identity.
    #[error("certificate's uri is not a waymark identity")]
    BadIdentity(#[source] IdentityError),
    /// The identity's kind is not accepted on this port (e.g. a workload on the node-agent
    /// port). Nothing changed; connect with the identity this port is for.
    #[error("{} identity {identity} is not accepted here (accepts: {accepted})", identity.kind())]
    WrongKind {
        /// The identity presented.
        identity: Box<Identity>,
        /// What this port accepts.
        accepted: KindSet,
    },
    /// A CA on the chain does not speak for the identity: a region intermediate signed a
    /// leaf of another region or an operator, or the intermediate has no region scope.
    /// Either the issuing region is compromised or misused; nothing changed (the peer is
    /// not admitted, our own material is not loaded). Issue from the identity's own region
    /// intermediate, or operators from the estate root, and investigate the issuer.
    #[error("identity {identity} is outside the scope of its issuing ca ({})", scope_text(issuer.as_deref()))]
    OutsideIssuerScope {
        /// The identity presented.
        identity: Box<Identity>,
        /// The offending CA's scope, `None` when it carries no waymark scope.
        issuer: Option<Box<CaScope>>,
    },
    /// The identity belongs to another region than the one this port or link serves (e.g.
    /// another region's authority answering a node agent). Nothing changed; connect to, or
    /// from, the region named by `expected`.
    #[error("identity {identity} is not in region {expected}")]
    WrongRegion {
        /// The identity presented.
        identity: Box<Identity>,
        /// The only region admitted here.
        expected: Name,
    },
    /// A trust-bundle entry is a region intermediate, not the estate root. As an anchor it
    /// would let its region vouch for other regions and for operators (the issuer-scope
    /// check sees no intermediate above a leaf it signed). Nothing changed (the material is
    /// not loaded; a reload keeps the old); distribute the estate root's `bundle.pem`.
    #[error("trust bundle entry (serial {serial}) is the {scope} intermediate, not the root")]
    RegionScopedAnchor {
        /// The entry's scope.
        scope: Box<CaScope>,
        /// The entry's serial number, hex.
        serial: String,
    },
    /// PEM text is cut short or damaged. Nothing changed; rewrite the file completely
    /// (write to a temporary name and rename).
    #[error("pem data in the {part} is truncated or malformed")]
    TruncatedPem {
        /// Which input.
        part: PemPart,
        /// What the PEM reader saw.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// No PEM item of the expected type was found. Nothing changed; check the file path.
    #[error("no pem item found in the {part}")]
    EmptyPem {
        /// Which input.
        part: PemPart,
    },
    /// The private key does not belong to the certificate (on load), or the peer could not
    /// prove possession of the certificate's key (in a handshake). Nothing changed; install
    /// the key issued with the certificate.
    #[error("private key does not match the certificate")]
    KeyMismatch,
    /// The key type is not supported by the ring provider. Nothing changed; reissue.
    #[error("private key type is not supported")]
    UnsupportedKey(#[source] rustls::Error),
    /// The certificate is not parseable DER. Nothing changed; reissue.
    #[error("certificate is not valid x.509 der")]
    Malformed,
    /// The peer presented no certificate at all. Nothing changed; the peer must connect
    /// with its workload certificate.
    #[error("peer presented no certificate")]
    NoCertificate,
    /// A file could not be read (missing, unreadable). Nothing changed; check the path and
    /// permissions.
    #[error("cannot read the {part}")]
    Unreadable {
        /// Which input.
        part: PemPart,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// New files name a different identity than the one being served. Nothing changed; a
    /// process keeps its identity for life, so restart it to change identity.
    #[error("new certificate names {found}, but this process serves as {serving}")]
    IdentityChanged {
        /// The identity in force.
        serving: Box<Identity>,
        /// The identity in the new files.
        found: Box<Identity>,
    },
    /// The chain failed a check other than the ones above (bad signature, wrong purpose,
    /// CA misuse). Nothing changed; reissue with `waymark certs issue`.
    #[error("certificate chain is invalid")]
    InvalidChain(#[source] webpki::Error),
}

/// Stable, low-cardinality name of a refusal: the `reason` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RejectReason {
    /// [`CertError::Expired`]
    Expired,
    /// [`CertError::NotYetValid`]
    NotYetValid,
    /// [`CertError::WrongTrustDomain`]
    WrongTrustDomain,
    /// [`CertError::WrongCa`]
    WrongCa,
    /// [`CertError::MissingSan`]
    MissingSan,
    /// [`CertError::MultipleSans`]
    MultipleSans,
    /// [`CertError::SanNotUri`] and [`CertError::BadIdentity`]
    BadIdentity,
    /// [`CertError::WrongKind`]
    WrongKind,
    /// [`CertError::OutsideIssuerScope`]
    OutsideIssuerScope,
    /// [`CertError::WrongRegion`]
    WrongRegion,
    /// [`CertError::RegionScopedAnchor`]
    RegionScopedAnchor,
    /// [`CertError::TruncatedPem`] and [`CertError::EmptyPem`]
    TruncatedPem,
    /// [`CertError::KeyMismatch`] and [`CertError::UnsupportedKey`]
    KeyMismatch,
    /// [`CertError::Malformed`] and [`CertError::InvalidChain`]
    InvalidChain,
    /// [`CertError::NoCertificate`]
    NoCertificate,
    /// [`CertError::Unreadable`]
    Unreadable,
    /// [`CertError::IdentityChanged`]
    IdentityChanged,
}

// === impl CertError ===

impl CertError {
    /// The metric label for this error.
    pub fn reason(&self) -> RejectReason {
        use RejectReason as R;
        match self {
            Self::Expired { .. } => R::Expired,
            Self::NotYetValid { .. } => R::NotYetValid,
            Self::WrongTrustDomain { .. } => R::WrongTrustDomain,
            Self::WrongCa => R::WrongCa,
            Self::MissingSan => R::MissingSan,
            Self::MultipleSans { .. } => R::MultipleSans,
            Self::SanNotUri | Self::BadIdentity(_) => R::BadIdentity,
            Self::WrongKind { .. } => R::WrongKind,
            Self::OutsideIssuerScope { .. } => R::OutsideIssuerScope,
            Self::WrongRegion { .. } => R::WrongRegion,
            Self::RegionScopedAnchor { .. } => R::RegionScopedAnchor,
            Self::TruncatedPem { .. } | Self::EmptyPem { .. } => R::TruncatedPem,
            Self::KeyMismatch | Self::UnsupportedKey(_) => R::KeyMismatch,
            Self::Malformed | Self::InvalidChain(_) => R::InvalidChain,
            Self::NoCertificate => R::NoCertificate,
            Self::Unreadable { .. } => R::Unreadable,
            Self::IdentityChanged { .. } => R::IdentityChanged,
        }
    }

    /// Wraps this error for a rustls verifier to return.
    pub fn into_tls(self) -> rustls::Error {
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(
            std::sync::Arc::new(self),
        )))
    }

    /// Finds the `CertError` a verifier of ours put inside a TLS error, looking through
    /// `io::Error` and source chains (tokio-rustls reports handshake failures as
    /// `io::Error` wrapping `rustls::Error`).
    pub fn from_tls<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a CertError> {
        let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = cur {
            if let Some(found) = e.downcast_ref::<CertError>() {
                return Some(found);
            }
            if let Some(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(o))) =
                e.downcast_ref::<rustls::Error>()
            {
                return o.0.downcast_ref::<CertError>();
            }
            if let Some(inner) = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                cur = Some(inner as &(dyn std::error::Error + 'static));
                continue;
            }
            cur = e.source();
        }
        None
    }

    /// Maps a webpki chain error to ours; `serial` and the validity bounds are for the
    /// message.
    pub(crate) fn from_webpki(err: webpki::Error, serial: &str) -> Self {
        match err {
            webpki::Error::CertExpired { not_after, .. } => Self::Expired {
                serial: serial.to_owned(),
                not_after: i64::try_from(not_after.as_secs()).unwrap_or(i64::MAX),
            },
            webpki::Error::CertNotValidYet { not_before, .. } => Self::NotYetValid {
                serial: serial.to_owned(),
                not_before: i64::try_from(not_before.as_secs()).unwrap_or(i64::MAX),
            },
            // A chain that names a trusted issuer but whose signature does not verify was
            // signed by some other CA of the same name (another estate, or a forgery).
            webpki::Error::UnknownIssuer | webpki::Error::InvalidSignatureForPublicKey => {
                Self::WrongCa
            }
            webpki::Error::BadDer | webpki::Error::BadDerTime => Self::Malformed,
            other => Self::InvalidChain(other),
        }
    }
}

fn scope_text(scope: Option<&CaScope>) -> String {
    scope.map_or_else(|| "no waymark scope".to_owned(), ToString::to_string)
}

impl fmt::Debug for CertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {self}", self.reason())
    }
}

// === impl RejectReason ===

impl RejectReason {
    /// Every reason, in a fixed order.
    pub const ALL: [RejectReason; 17] = [
        Self::Expired,
        Self::NotYetValid,
        Self::WrongTrustDomain,
        Self::WrongCa,
        Self::MissingSan,
        Self::MultipleSans,
        Self::BadIdentity,
        Self::WrongKind,
        Self::OutsideIssuerScope,
        Self::WrongRegion,
        Self::RegionScopedAnchor,
        Self::TruncatedPem,
        Self::KeyMismatch,
        Self::InvalidChain,
        Self::NoCertificate,
        Self::Unreadable,
        Self::IdentityChanged,
    ];

    /// The snake_case label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongTrustDomain => "wrong_trust_domain",
            Self::WrongCa => "wrong_ca",
            Self::MissingSan => "missing_san",
            Self::MultipleSans => "multiple_sans",
            Self::BadIdentity => "bad_identity",
            Self::WrongKind => "wrong_kind",
            Self::OutsideIssuerScope => "outside_issuer_scope",
            Self::WrongRegion => "wrong_region",
            Self::RegionScopedAnchor => "region_scoped_anchor",
            Self::TruncatedPem => "truncated_pem",
            Self::KeyMismatch => "key_mismatch",
            Self::InvalidChain => "invalid_chain",
            Self::NoCertificate => "no_certificate",
            Self::Unreadable => "unreadable",
            Self::IdentityChanged => "identity_changed",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl prometheus_client::encoding::EncodeLabelValue for RejectReason {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder<'_>,
    ) -> Result<(), fmt::Error> {
        prometheus_client::encoding::EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

// === impl PemPart ===

impl fmt::Display for PemPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Certificate => "certificate file",
            Self::Key => "key file",
            Self::Bundle => "trust bundle",
        })
    }
}
