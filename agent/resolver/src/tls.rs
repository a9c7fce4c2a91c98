//! Mutual TLS towards the node agent: this caller's workload certificate out, the agent's
//! node certificate checked in.
//!
//! ```text
//! cert_chain, key, bundle ──validate_material (workload, trust domain)──► LiveMaterial
//!                                     └── Reloader (file watch) swaps it on rotation
//! LiveMaterial ──client_config(PeerPolicy: node, region = this workload's)──► TlsConnector
//! ```
//!
//! The caller presents `spiffe://<td>/region/<r>/service/<s>/instance/<i>` and admits only
//! a node identity of the same trust domain and region `<r>`, chaining to the bundle
//! (ADR-15: the host's agent serves the host's workloads). Anything else ends the
//! handshake, is counted in `waymark_certs_rejected_total{reason, source="peer"}` on the
//! [`ResolverTls::metrics`] given, and the resolver keeps serving its last view while it
//! retries with backoff.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use waymark_certs::error::PemPart;
use waymark_certs::material::{MaterialPem, validate_material};
use waymark_certs::reload::{MaterialPaths, Reloader};
use waymark_certs::tls::{ALPN_H2, LiveMaterial, client_config};
use waymark_certs::{CertError, CertMetrics, IdentityKind, KindSet, PeerPolicy, TrustDomain};

use crate::error::ResolverError;

/// Mutual TLS towards the agent: this caller's workload material and the trust bundle.
///
/// The files are watched and re-read when they change (`waymark certs issue` replaces them
/// atomically), so a rotated certificate is presented on the next connection; files that
/// fail validation are refused, counted and logged, and the old material stays in use.
#[derive(Debug, Clone)]
pub struct ResolverTls {
    /// The estate's trust domain (the agent's `agent.tls.trust_domain`).
    pub trust_domain: String,
    /// This caller's workload certificate followed by its region's intermediate
    /// (`fullchain.pem`).
    pub cert_chain: PathBuf,
    /// Its private key (`key.pem`).
    pub key: PathBuf,
    /// The trust bundle: the estate root (`bundle.pem`).
    pub bundle: PathBuf,
    /// Where certificate refusals and reloads are counted; register it in the embedding
    /// process's registry with `CertMetrics::register` to export `waymark_certs_*`.
    pub metrics: CertMetrics,
}

/// A validated client config and what keeps its material current.
pub(crate) struct Prepared {
    pub(crate) client: Arc<rustls::ClientConfig>,
    pub(crate) reloader: Arc<Reloader>,
}

// === impl ResolverTls ===

impl ResolverTls {
    /// Material from `cert_chain`, `key` and `bundle`, in `trust_domain`, counting into a
    /// fresh [`CertMetrics`].
    pub fn new(
        trust_domain: impl Into<String>,
        cert_chain: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
        bundle: impl Into<PathBuf>,
    ) -> Self {
        Self {
            trust_domain: trust_domain.into(),
            cert_chain: cert_chain.into(),
            key: key.into(),
            bundle: bundle.into(),
            metrics: CertMetrics::new(),
        }
    }

    /// Load and check the files now (synchronously: three small files), then build the
    /// client config. Our own certificate must be a workload identity of the trust domain;
    /// the agent is then admitted only as a node of that workload's region.
    pub(crate) fn prepare(&self) -> Result<Prepared, ResolverError> {
        let trust_domain =
            TrustDomain::new(&self.trust_domain).map_err(|source| ResolverError::TrustDomain {
                trust_domain: self.trust_domain.clone(),
                source,
            })?;
        let own = PeerPolicy {
            trust_domain: trust_domain.clone(),
            accepted: KindSet::only(IdentityKind::Workload),
            region: None,
        };
        let material = self.load(&own).map_err(ResolverError::Tls)?;
        let agents = PeerPolicy {
            trust_domain,
            accepted: KindSet::only(IdentityKind::Node),
            region: material.identity.region().cloned(),
        };
        tracing::info!(
            identity = %material.identity,
            serial = %material.leaf.serial,
            not_after = material.leaf.not_after,
            "resolver presents its workload certificate to the agent"
        );
        let live = LiveMaterial::new(material);
        let client = client_config(&live, agents, self.metrics.clone(), &[ALPN_H2])
            .map_err(ResolverError::TlsConfig)?;
        let reloader = Reloader::new(self.paths(), live, own, self.metrics.clone());
        Ok(Prepared {
            client: Arc::new(client),
            reloader,
        })
    }

    fn load(&self, own: &PeerPolicy) -> Result<waymark_certs::Material, CertError> {
        let cert_chain = read(&self.cert_chain, PemPart::Certificate)?;
        let key = read(&self.key, PemPart::Key)?;
        let bundle = read(&self.bundle, PemPart::Bundle)?;
        let pem = MaterialPem {
            cert_chain: &cert_chain,
            key: &key,
            bundle: &bundle,
        };
        validate_material(pem, own, SystemTime::now())
    }

    fn paths(&self) -> MaterialPaths {
        MaterialPaths {
            cert_chain: self.cert_chain.clone(),
            key: self.key.clone(),
            bundle: self.bundle.clone(),
        }
    }
}

fn read(path: &Path, part: PemPart) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|source| CertError::Unreadable { part, source })
}
