//! rustls verifiers that admit peers by workload identity, not by DNS name.
//!
//! One [`PeerVerifier`] serves both directions: as a `ClientCertVerifier` on servers (a
//! client certificate is mandatory) and as a `ServerCertVerifier` on clients (the DNS name
//! the client dialled is ignored; the server's URI SAN is what counts). Each handshake
//! reads the *current* trust bundle from [`LiveMaterial`], so a rotated bundle applies to
//! the next connection without rebuilding configs.
//!
//! A refusal is a [`CertError`] wrapped into `rustls::Error` (see `CertError::from_tls`),
//! counted in `waymark_certs_rejected_total{source="peer"}` and logged at `warn` with the
//! certificate's serial, fingerprint and `not_after` (never key material). The
//! CertificateVerify signature check is ours too, so a peer that presents a certificate
//! without holding its key shows up as `key_mismatch`.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tracing::{debug, warn};

use crate::error::CertError;
use crate::identity::Identity;
use crate::live::LiveMaterial;
use crate::material::{PeerPolicy, Usage, cert_info, check_peer};
use crate::metrics::{CertMetrics, RejectSource};

/// Verifies peers against the live trust bundle and a [`PeerPolicy`].
#[derive(Debug)]
pub struct PeerVerifier {
    roots: Roots,
    policy: PeerPolicy,
    metrics: CertMetrics,
    algs: WebPkiSupportedAlgorithms,
    /// As a server: whether a client must present a certificate.
    mandatory: bool,
}

/// Where a verifier reads the roots a peer must chain to.
#[derive(Debug)]
enum Roots {
    /// The current bundle of a process's own (rotating) material.
    Live(Arc<LiveMaterial>),
    /// A bundle fixed when the verifier was made: a client with no certificate of its own
    /// (the CLI authenticating with a token) still checks who it is talking to.
    Fixed(Arc<RootCertStore>),
}

// === impl PeerVerifier ===

impl PeerVerifier {
    /// A verifier reading roots from `live` and admitting what `policy` allows.
    pub fn new(live: Arc<LiveMaterial>, policy: PeerPolicy, metrics: CertMetrics) -> Self {
        Self::with_roots(Roots::Live(live), policy, metrics)
    }

    /// A verifier over a fixed bundle (`material::root_store`), admitting what `policy`
    /// allows.
    pub fn fixed(roots: Arc<RootCertStore>, policy: PeerPolicy, metrics: CertMetrics) -> Self {
        Self::with_roots(Roots::Fixed(roots), policy, metrics)
    }

    fn with_roots(roots: Roots, policy: PeerPolicy, metrics: CertMetrics) -> Self {
        Self {
            roots,
            policy,
            metrics,
            algs: crate::provider().signature_verification_algorithms,
            mandatory: true,
        }
    }

    /// As a server, admit clients without a certificate too (they must authenticate some
    /// other way, e.g. a bearer token); a certificate that is presented is still checked
    /// against `policy` and refused as always.
    pub fn client_optional(mut self) -> Self {
        self.mandatory = false;
        self
    }

    /// What this verifier admits.
    pub fn policy(&self) -> &PeerPolicy {
        &self.policy
    }

    /// Checks a presented chain; counts and logs a refusal.
    pub fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
        usage: Usage,
    ) -> Result<Identity, CertError> {
        let roots = match &self.roots {
            Roots::Live(live) => Arc::clone(&live.current().roots),
            Roots::Fixed(roots) => Arc::clone(roots),
        };
        match check_peer(end_entity, intermediates, &roots, now, usage, &self.policy) {
            Ok((identity, info)) => {
                debug!(peer = %identity, serial = %info.serial, "peer authenticated");
                Ok(identity)
            }
            Err(err) => {
                self.refused(end_entity, &err);
                Err(err)
            }
        }
    }

    fn refused(&self, end_entity: &CertificateDer<'_>, err: &CertError) {
        let reason = err.reason();
        self.metrics.record_rejection(reason, RejectSource::Peer);
        match cert_info(end_entity) {
            Ok(info) => warn!(
                %reason,
                serial = %info.serial,
                fingerprint = %info.fingerprint,
                not_after = info.not_after,
                error = %err,
                "peer certificate refused"
            ),
            Err(_) => warn!(%reason, error = %err, "peer certificate refused"),
        }
    }

    fn signature(
        &self,
        verified: Result<HandshakeSignatureValid, rustls::Error>,
        cert: &CertificateDer<'_>,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verified.map_err(|_| {
            let err = CertError::KeyMismatch;
            self.refused(cert, &err);
            err.into_tls()
        })
    }
}

impl ClientCertVerifier for PeerVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints would have to borrow from the rotating bundle; clients hold one identity
        // each, so an empty list costs nothing.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity, intermediates, now, Usage::Client)
            .map(|_| ClientCertVerified::assertion())
            .map_err(CertError::into_tls)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let verified = rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs);
        self.signature(verified, cert)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let verified = rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs);
        self.signature(verified, cert)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

impl ServerCertVerifier for PeerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The dialled name is deliberately ignored: servers are admitted by identity.
        self.check(end_entity, intermediates, now, Usage::Server)
            .map(|_| ServerCertVerified::assertion())
            .map_err(CertError::into_tls)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let verified = rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs);
        self.signature(verified, cert)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let verified = rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs);
        self.signature(verified, cert)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}
