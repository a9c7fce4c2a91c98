//! The TLS section both roles' configuration files share (`[authority.tls]`,
//! `[agent.tls]`): the estate's trust domain and this process's certificate, key and trust
//! bundle, as paths. Each role loads and watches the files itself.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[authority.tls]` or `[agent.tls]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The estate's trust domain.
    pub trust_domain: String,
    /// Leaf + intermediates.
    pub cert_chain: PathBuf,
    /// Private key.
    pub key: PathBuf,
    /// Trust bundle.
    pub bundle: PathBuf,
}
