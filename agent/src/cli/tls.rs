//! TLS for the API's clients, from files: the estate's trust bundle, and optionally a
//! certificate and key to present (an operator's, say).
//!
//! The server must be an authority of the bundle's trust domain (of the certificate's,
//! when one is presented): it is admitted by its verified identity, whatever name or
//! address was dialled. Without a certificate the client authenticates with a bearer
//! token instead; with one, the certificate is the principal.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::Context as _;
use waymark_certs::error::PemPart;
use waymark_certs::material::{
    MaterialPem, bundle_trust_domain, cert_info, parse_certs, root_store, validate_material,
};
use waymark_certs::tls::{LiveMaterial, anonymous_client_config, client_config};
use waymark_certs::{CertMetrics, IdentityKind, KindSet, PeerPolicy, TrustDomain};

use crate::listener::ALPN_HTTP1;

/// Where a client's TLS material is.
#[derive(Debug, Clone, Default)]
pub struct ClientFiles {
    /// The estate's trust bundle (PEM).
    pub bundle: PathBuf,
    /// Certificate chain and key to present, if the client authenticates by certificate.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// A client config for the authority API from `files`, checked at `now`.
pub fn api_client_config(
    files: &ClientFiles,
    now: SystemTime,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    waymark_certs::install_crypto_provider();
    let bundle_pem = read(&files.bundle, "--ca-bundle")?;
    let bundle = parse_certs(&bundle_pem, PemPart::Bundle)
        .with_context(|| format!("--ca-bundle {}", files.bundle.display()))?;
    let metrics = CertMetrics::new();
    let config = match &files.identity {
        None => {
            let trust_domain = bundle_trust_domain(&bundle).with_context(|| {
                format!(
                    "--ca-bundle {}: no waymark estate root in it",
                    files.bundle.display()
                )
            })?;
            let roots = Arc::new(root_store(&bundle)?);
            anonymous_client_config(roots, servers(trust_domain), metrics, &[ALPN_HTTP1])?
        }
        Some((cert, key)) => {
            let chain = read(cert, "--cert")?;
            let key_pem = read(key, "--key")?;
            let leaf = parse_certs(&chain, PemPart::Certificate)
                .with_context(|| format!("--cert {}", cert.display()))?;
            let identity = cert_info(&leaf[0])
                .and_then(|info| info.identity())
                .with_context(|| format!("--cert {}", cert.display()))?;
            let own = PeerPolicy {
                trust_domain: identity.trust_domain().clone(),
                accepted: KindSet::ALL,
                region: None,
            };
            let pem = MaterialPem {
                cert_chain: &chain,
                key: &key_pem,
                bundle: &bundle_pem,
            };
            let material = validate_material(pem, &own, now).with_context(|| {
                format!("--cert {} with --key {}", cert.display(), key.display())
            })?;
            let live = LiveMaterial::new(material);
            let servers = servers(identity.trust_domain().clone());
            client_config(&live, servers, metrics, &[ALPN_HTTP1])?
        }
    };
    Ok(Arc::new(config))
}

/// A client config for a node agent's local HTTP API served over TLS (off loopback): the
/// server must be a node agent of the trust domain of `bundle`; no client certificate
/// (the API admits readers by bearer token).
pub fn agent_api_client_config(bundle: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    waymark_certs::install_crypto_provider();
    let bundle_pem = read(bundle, "--ca-bundle")?;
    let certs = parse_certs(&bundle_pem, PemPart::Bundle)
        .with_context(|| format!("--ca-bundle {}", bundle.display()))?;
    let trust_domain = bundle_trust_domain(&certs).with_context(|| {
        format!(
            "--ca-bundle {}: no waymark estate root in it",
            bundle.display()
        )
    })?;
    let roots = Arc::new(root_store(&certs)?);
    let agents = PeerPolicy {
        trust_domain,
        accepted: KindSet::only(IdentityKind::Node),
        region: None,
    };
    Ok(Arc::new(anonymous_client_config(
        roots,
        agents,
        CertMetrics::new(),
        &[ALPN_HTTP1],
    )?))
}

/// Who may answer: an authority of `trust_domain`, of any region (an operator's CLI talks
/// to every region's API; each region's certificates are scoped to it by their issuer).
fn servers(trust_domain: TrustDomain) -> PeerPolicy {
    PeerPolicy {
        trust_domain,
        accepted: KindSet::only(IdentityKind::Authority),
        region: None,
    }
}

fn read(path: &Path, flag: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{flag}: reading {}", path.display()))
}
