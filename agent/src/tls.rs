//! The TLS section both roles' configuration files share (`[authority.tls]`,
//! `[agent.tls]`): the estate's trust domain and this process's certificate, key and trust
//! bundle, as paths. Each role loads and watches the files itself.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use waymark_certs::reload::MaterialPaths;

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

impl TlsSection {
    /// The section naming `paths`' files under `trust_domain`.
    pub fn new(trust_domain: &str, paths: &MaterialPaths) -> Self {
        Self {
            trust_domain: trust_domain.to_owned(),
            cert_chain: paths.cert_chain.clone(),
            key: paths.key.clone(),
            bundle: paths.bundle.clone(),
        }
    }
}
