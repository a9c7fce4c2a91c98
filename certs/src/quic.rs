//! quinn (QUIC) endpoints over the same mutual-TLS material and verifier as tonic.
//!
//! QUIC needs TLS 1.3 and an AES-128-GCM initial suite; the ring provider our configs are
//! built with has both, so `QuicServerConfig::try_from` only fails if a caller changed
//! the rustls config. After the handshake, [`peer_identity`] turns the peer's certificate
//! chain (quinn hands it out as `Box<dyn Any>`) back into an [`Identity`].
//!
//! quinn reports a refused handshake as a transport error carrying the TLS alert and our
//! error's text, not the typed error; the typed reason is in the verifier's metric and log.

use std::sync::Arc;

use quinn::crypto::rustls::{NoInitialCipherSuite, QuicClientConfig, QuicServerConfig};
use rustls::pki_types::CertificateDer;

use crate::error::CertError;
use crate::identity::Identity;
use crate::live::LiveMaterial;
use crate::material::{PeerPolicy, cert_info};
use crate::metrics::CertMetrics;
use crate::tls::{client_config, server_config};

/// ALPN for waymark's own QUIC protocols (federation, evidence streams).
pub const ALPN_WAYMARK: &[u8] = b"waymark/1";

/// Why a QUIC config could not be built. Nothing was built; this is a programming error
/// in how the rustls config was assembled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuicConfigError {
    /// rustls refused the config.
    #[error("tls config refused")]
    Tls(#[from] rustls::Error),
    /// The provider lacks the QUIC initial cipher suite.
    #[error("no quic initial cipher suite")]
    NoInitialSuite(#[from] NoInitialCipherSuite),
}

/// A quinn server config requiring client certificates admitted by `policy`.
pub fn quic_server_config(
    live: &Arc<LiveMaterial>,
    policy: PeerPolicy,
    metrics: CertMetrics,
) -> Result<quinn::ServerConfig, QuicConfigError> {
    let tls = server_config(live, policy, metrics, &[ALPN_WAYMARK])?;
    let crypto = QuicServerConfig::try_from(tls)?;
    Ok(quinn::ServerConfig::with_crypto(Arc::new(crypto)))
}

/// A quinn client config presenting the live certificate and admitting servers by
/// `policy`.
pub fn quic_client_config(
    live: &Arc<LiveMaterial>,
    policy: PeerPolicy,
    metrics: CertMetrics,
) -> Result<quinn::ClientConfig, QuicConfigError> {
    let tls = client_config(live, policy, metrics, &[ALPN_WAYMARK])?;
    let crypto = QuicClientConfig::try_from(tls)?;
    Ok(quinn::ClientConfig::new(Arc::new(crypto)))
}

/// The verified identity of the peer of an established connection.
pub fn peer_identity(connection: &quinn::Connection) -> Result<Identity, CertError> {
    let chain = connection
        .peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
        .ok_or(CertError::NoCertificate)?;
    let leaf = chain.first().ok_or(CertError::NoCertificate)?;
    cert_info(leaf)?.identity()
}
