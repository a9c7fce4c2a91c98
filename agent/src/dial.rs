//! Dialling a TLS server for hyper's client: TCP with a connect timeout, then a TLS
//! handshake with a bound, over a `rustls::ClientConfig` whose verifier decides who is
//! admitted (waymark's admit servers by identity, not by the dialled name; the name only
//! fills SNI). Raft between members and the API client both use it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util_client::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util_client::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tower::ServiceExt as _;

/// How long the TLS handshake with a server may take, after its TCP connect.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// Dials a server and completes TLS with `config` (for Raft: built with
/// `waymark_certs::tls::client_config`, `authority::raft::tls::peer_policy` and ALPN
/// `http/1.1`). Whatever the URI's scheme, the connection is TLS.
#[derive(Clone)]
pub struct TlsConnector {
    tcp: HttpConnector,
    tls: tokio_rustls::TlsConnector,
}

/// A client TLS stream to a peer, as hyper's client wants it.
#[derive(Debug)]
pub struct TlsConnection(tokio_rustls::client::TlsStream<TcpStream>);

// === impl TlsConnector ===

impl TlsConnector {
    /// TCP connects bounded by `connect_timeout`, then a TLS handshake with `config`.
    pub fn new(config: Arc<rustls::ClientConfig>, connect_timeout: Duration) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(connect_timeout));
        // The URI is `https://…`; TLS is done here, over the plain TCP stream.
        tcp.enforce_http(false);
        Self {
            tcp,
            tls: tokio_rustls::TlsConnector::from(config),
        }
    }
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector").finish_non_exhaustive()
    }
}

type ConnectFuture = Pin<
    Box<
        dyn Future<
                Output = Result<TokioIo<TlsConnection>, Box<dyn std::error::Error + Send + Sync>>,
            > + Send,
    >,
>;

impl tower::Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsConnection>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (tcp, tls) = (self.tcp.clone(), self.tls.clone());
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "uri has no host"))?
                .trim_matches(['[', ']'])
                .to_owned();
            let stream = tcp.oneshot(uri).await?.into_inner();
            // The name only fills SNI; the verifier admits the server by identity.
            let name = ServerName::try_from(host)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connect(name, stream))
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "tls handshake timed out")
                })??;
            Ok(TokioIo::new(TlsConnection(stream)))
        })
    }
}

// === impl TlsConnection ===

impl Connection for TlsConnection {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    // Forwarded, so that HTTP/2 writes a frame's header and body (and every frame queued
    // behind it) with one gathering call instead of one call per buffer.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
