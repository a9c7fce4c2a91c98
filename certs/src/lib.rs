//! waymark's trust layer: workload identities, a small CA, mutual TLS and attribution.
//!
//! In waymark the power to mark an instance ineligible is the power to deny service, so
//! every signal is attributed to an identity and every control-plane connection is
//! mutually authenticated by workload identity, not network position.
//!
//! ```text
//! identity     pure   spiffe://<td>/region/<r>/node/<n> … parsed into types
//! attribution  pure   "may X report about Y?", "may operator O override service S?"
//! lifetime     pure   TTLs and refresh points sized to survive a 60-minute outage
//! material     pure   PEM/DER parsing, chain + SAN + trust-domain + issuer-scope + kind +
//!                     region checks
//! reload       pure decision + file-watching shell; swaps material atomically
//! ca, layout          rcgen CA (root → region intermediate → leaf) and its files on disk
//! verify, tls, grpc, quic   rustls verifiers and configs for tonic (TCP) and quinn (QUIC)
//! testing             test PKIs and refused certificates (feature `testing`)
//! ```
//!
//! Call [`install_crypto_provider`] at the start of every `main` and test harness: with
//! quinn, rcgen and tonic in one graph rustls cannot pick a provider by itself.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
#![deny(missing_docs)]

pub mod attribution;
pub mod ca;
pub mod error;
pub mod grpc;
pub mod identity;
pub mod layout;
pub mod lifetime;
pub mod live;
pub mod material;
pub mod metrics;
pub mod quic;
pub mod reload;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
pub mod verify;

pub use error::{CertError, RejectReason};
pub use identity::{Identity, IdentityKind, KindSet, Name, TrustDomain};
pub use material::{Material, PeerPolicy};
pub use metrics::CertMetrics;

use std::sync::Arc;

/// Installs ring as the process-wide rustls crypto provider. Idempotent: a second call,
/// or a provider someone else installed first, is left as it is.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: some provider is then in place, and
        // our own configs name ring explicitly anyway.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The ring provider every config in this crate is built with, so that nothing depends on
/// which provider happens to be the process default.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
