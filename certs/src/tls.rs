//! rustls server and client configurations over swappable material.
//!
//! [`LiveMaterial`] holds the current [`Material`](crate::material::Material) (our certificate, key and trust bundle)
//! behind an `RwLock<Arc<_>>`; readers clone the `Arc` and never hold the lock across a
//! handshake. The configs built here never embed a certificate or a root store: a
//! certificate resolver and [`PeerVerifier`] read `LiveMaterial` on every handshake, so
//! after [`LiveMaterial::swap`] the next connection presents the new certificate and
//! checks against the new bundle, while open connections carry on.
//!
//! Both sides speak TLS 1.3 only (quinn needs it anyway) and never resume sessions: a
//! resumed session would skip the client-certificate check, and every connection must be
//! re-admitted against the current bundle and port policy.

use std::sync::Arc;

use rustls::client::{ResolvesClientCert, Resumption};
use rustls::server::{ClientHello, NoServerSessionStorage, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ServerConfig, SignatureScheme};

pub use crate::live::LiveMaterial;
use crate::material::PeerPolicy;
use crate::metrics::CertMetrics;
use crate::verify::PeerVerifier;

/// ALPN for gRPC over TLS.
pub const ALPN_H2: &[u8] = b"h2";

/// Resolves our certificate from [`LiveMaterial`] on each handshake.
#[derive(Debug)]
struct LiveCert(Arc<LiveMaterial>);

/// A server config that requires a client certificate admitted by `policy`, and presents
/// the live certificate.
pub fn server_config(
    live: &Arc<LiveMaterial>,
    policy: PeerPolicy,
    metrics: CertMetrics,
    alpn: &[&[u8]],
) -> Result<ServerConfig, rustls::Error> {
    let verifier = PeerVerifier::new(Arc::clone(live), policy, metrics);
    server_with(live, verifier, alpn)
}

/// A server config that checks a client certificate against `policy` when one is
/// presented, and also admits clients that present none — for a listener whose requests
/// can authenticate otherwise (the authority API's bearer tokens). A presented certificate
/// that `policy` refuses fails the handshake, as with [`server_config`].
pub fn server_config_client_optional(
    live: &Arc<LiveMaterial>,
    policy: PeerPolicy,
    metrics: CertMetrics,
    alpn: &[&[u8]],
) -> Result<ServerConfig, rustls::Error> {
    let verifier = PeerVerifier::new(Arc::clone(live), policy, metrics).client_optional();
    server_with(live, verifier, alpn)
}

/// TLS 1.3 only, no resumption (every connection is verified against the current bundle),
/// the live certificate, and `verifier` for clients.
fn server_with(
    live: &Arc<LiveMaterial>,
    verifier: PeerVerifier,
    alpn: &[&[u8]],
) -> Result<ServerConfig, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(crate::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_cert_resolver(Arc::new(LiveCert(Arc::clone(live))));
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A client config that presents the live certificate and admits servers by `policy`
/// (e.g. only authority identities), ignoring the dialled DNS name.
pub fn client_config(
    live: &Arc<LiveMaterial>,
    policy: PeerPolicy,
    metrics: CertMetrics,
    alpn: &[&[u8]],
) -> Result<ClientConfig, rustls::Error> {
    let verifier = PeerVerifier::new(Arc::clone(live), policy, metrics);
    let mut config = ClientConfig::builder_with_provider(crate::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(LiveCert(Arc::clone(live))));
    config.resumption = Resumption::disabled();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A client config with no certificate of its own (the caller authenticates some other
/// way, e.g. a bearer token) that admits servers by `policy` against the fixed `roots`,
/// ignoring the dialled DNS name.
pub fn anonymous_client_config(
    roots: Arc<rustls::RootCertStore>,
    policy: PeerPolicy,
    metrics: CertMetrics,
    alpn: &[&[u8]],
) -> Result<ClientConfig, rustls::Error> {
    let verifier = PeerVerifier::fixed(roots, policy, metrics);
    let mut config = ClientConfig::builder_with_provider(crate::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.resumption = Resumption::disabled();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

// === impl LiveCert ===

impl ResolvesServerCert for LiveCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0.current().certified_key))
    }
}

impl ResolvesClientCert for LiveCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0.current().certified_key))
    }

    fn has_certs(&self) -> bool {
        true
    }
}
