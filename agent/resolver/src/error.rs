//! What the resolver handle refuses, and why: one leaf both the handle (`resolver`) and its
//! TLS material (`tls`) report through.

use waymark_certs::CertError;

/// Errors from the resolver handle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolverError {
    /// `agent` is not a valid URI. Nothing was started; fix the configuration.
    #[error("agent address {agent} is invalid")]
    InvalidAgent {
        /// The address given.
        agent: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// No `tls` is configured and `agent` is not a loopback address. Nothing was started:
    /// the agent serves plain text on loopback only; configure `tls` to reach it elsewhere.
    #[error("agent address {agent} is not loopback; plain text is allowed on loopback only")]
    PlaintextNotLoopback {
        /// The address given.
        agent: String,
    },
    /// `tls.trust_domain` is not a valid trust domain. Nothing was started; fix it.
    #[error("trust domain {trust_domain} is invalid")]
    TrustDomain {
        /// The trust domain given.
        trust_domain: String,
        /// Why.
        #[source]
        source: waymark_certs::identity::IdentityError,
    },
    /// The TLS files were refused: unreadable, expired, not a workload identity of the
    /// trust domain, not chaining to the bundle, a region intermediate as the bundle, ….
    /// Nothing was started; [`CertError::reason`] says what to fix.
    #[error("tls material refused")]
    Tls(#[source] CertError),
    /// rustls refused the configuration built from valid material. Nothing was started; a
    /// bug to report.
    #[error("tls configuration failed")]
    TlsConfig(#[source] rustls::Error),
    /// The resolver has no stream task (built with `from_table`) or the task is gone.
    /// Resolution keeps answering from the current table.
    #[error("resolver has no running subscription")]
    NotConnected,
}
