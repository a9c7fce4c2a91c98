//! The listener tests' estate (regions eu and us, from `waymark_certs::testing`) and raw
//! TLS requests: what they connect with.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::sign::CertifiedKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use waymark_certs::KindSet;
use waymark_certs::testing::{TestPkiDir, raw_client_config};

/// How long a raw request may take.
const WAIT: Duration = Duration::from_secs(60);

/// An estate of trust domain `td` with regions eu and us, as files.
pub fn estate(td: &str) -> TestPkiDir {
    TestPkiDir::new(td, &["eu", "us"])
}

/// A TLS client that checks the server against `pki`'s bundle and presents `cert`, or
/// nothing.
pub fn tls_client(pki: &TestPkiDir, cert: Option<Arc<CertifiedKey>>) -> Arc<rustls::ClientConfig> {
    tls_client_alpn(pki, cert, b"http/1.1")
}

/// [`tls_client`] offering `alpn` (`h2` for the gRPC listeners).
pub fn tls_client_alpn(
    pki: &TestPkiDir,
    cert: Option<Arc<CertifiedKey>>,
    alpn: &[u8],
) -> Arc<rustls::ClientConfig> {
    Arc::new(raw_client_config(cert, pki.verifier(KindSet::ALL), alpn))
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
