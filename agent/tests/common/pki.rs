//! A test estate's CA as files, certificates peers must refuse, and raw TLS requests:
//! what the listener tests connect with.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use waymark_certs::ca::{HostSan, LeafSan, LeafSpec};
use waymark_certs::error::PemPart;
use waymark_certs::layout::PkiDir;
use waymark_certs::material::{parse_certs, parse_key};
use waymark_certs::reload::{MaterialPaths, load_material};
use waymark_certs::tls::LiveMaterial;
use waymark_certs::verify::PeerVerifier;
use waymark_certs::{CertMetrics, Identity, KindSet, Name, PeerPolicy, TrustDomain};

/// How long a raw request may take.
const WAIT: Duration = Duration::from_secs(60);

/// The estate CA (regions eu and us) as files.
pub struct Pki {
    _dir: tempfile::TempDir,
    pub pki: PkiDir,
    pub td: TrustDomain,
}

impl Pki {
    pub fn new(td: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki = PkiDir::new(dir.path().join("pki"));
        let td = TrustDomain::new(td).unwrap();
        let regions = [Name::new("eu").unwrap(), Name::new("us").unwrap()];
        pki.init(&td, &regions, SystemTime::now()).unwrap();
        Self { _dir: dir, pki, td }
    }

    /// A leaf for `path` (under this trust domain) from its region's intermediate.
    pub fn issue(&self, path: &str) -> MaterialPaths {
        self.issue_with_hosts(path, &[])
    }

    /// [`Self::issue`], with names the server answers to beside the identity.
    pub fn issue_with_hosts(&self, path: &str, hosts: &[HostSan]) -> MaterialPaths {
        let identity = Identity::parse(&format!("spiffe://{}/{path}", self.td.as_str())).unwrap();
        let (_, paths) = self
            .pki
            .issue_with_hosts(
                &identity,
                None,
                Duration::from_secs(24 * 3600),
                None,
                SystemTime::now(),
                hosts,
            )
            .unwrap();
        MaterialPaths {
            cert_chain: paths.fullchain,
            key: paths.key,
            bundle: self.pki.bundle(),
        }
    }

    /// A leaf naming `uri` exactly, signed by region `region`'s intermediate without any
    /// policy check (e.g. an identity of another trust domain): a certificate peers refuse.
    pub fn forge(&self, region: &str, uri: &str) -> (Vec<u8>, Vec<u8>) {
        let ca = self.pki.load_region(&Name::new(region).unwrap()).unwrap();
        let now = SystemTime::now();
        let leaf = ca
            .issue_unchecked(LeafSpec {
                sans: vec![LeafSan::Uri(uri.to_owned())],
                not_before: now - Duration::from_secs(60),
                not_after: now + Duration::from_secs(24 * 3600),
            })
            .unwrap();
        (leaf.fullchain_pem().into_bytes(), leaf.key_pem.into_bytes())
    }
}

pub fn pem_of(paths: &MaterialPaths) -> (Vec<u8>, Vec<u8>) {
    (
        std::fs::read(&paths.cert_chain).unwrap(),
        std::fs::read(&paths.key).unwrap(),
    )
}

/// A TLS client that checks the server against `pki`'s bundle and presents `cert` (chain
/// and key PEM), or nothing.
pub async fn tls_client(pki: &Pki, cert: Option<(Vec<u8>, Vec<u8>)>) -> Arc<rustls::ClientConfig> {
    tls_client_alpn(pki, cert, b"http/1.1").await
}

/// [`tls_client`] offering `alpn` (`h2` for the gRPC listeners).
pub async fn tls_client_alpn(
    pki: &Pki,
    cert: Option<(Vec<u8>, Vec<u8>)>,
    alpn: &[u8],
) -> Arc<rustls::ClientConfig> {
    let any = PeerPolicy {
        trust_domain: pki.td.clone(),
        accepted: KindSet::ALL,
        region: None,
    };
    // Only the bundle of this material is used: it is what the server is checked against.
    let roots = load_material(&pki.issue("region/eu/node/roots"), &any, SystemTime::now())
        .await
        .unwrap();
    let verifier = PeerVerifier::new(LiveMaterial::new(roots), any, CertMetrics::new());
    let builder = rustls::ClientConfig::builder_with_provider(waymark_certs::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match cert {
        None => builder.with_no_client_auth(),
        Some((chain, key)) => builder
            .with_client_auth_cert(
                parse_certs(&chain, PemPart::Certificate).unwrap(),
                parse_key(&key).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// One request on a fresh connection, over TLS with `tls` or plain: the status and body,
/// or why no answer came (a refused handshake closes the connection unanswered).
pub async fn request(
    addr: SocketAddr,
    tls: Option<Arc<rustls::ClientConfig>>,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        let mut answer = Vec::new();
        match tls {
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                let mut s = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await?;
                s.write_all(head.as_bytes()).await?;
                s.read_to_end(&mut answer).await?;
            }
            None => {
                let mut s = tcp;
                s.write_all(head.as_bytes()).await?;
                s.read_to_end(&mut answer).await?;
            }
        }
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(WAIT, exchange)
        .await
        .map_err(|_| "no answer in time".to_owned())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("closed without an answer ({} bytes)", answer.len()))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
    Ok((status, body.unwrap_or_default()))
}
