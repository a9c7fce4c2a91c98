//! tonic over mutual TLS, with the peer's identity handed to every handler.
//!
//! tonic's own `ServerTlsConfig` cannot take a custom client-certificate verifier, so the
//! server side is a tokio-rustls acceptor feeding `Server::serve_with_incoming`:
//!
//! ```text
//! TcpListener ─► accept loop ─► handshake task (bounded, timed) ─► AuthenticatedStream
//!                                                   │ Connected::ConnectInfo = PeerInfo
//! handler: grpc::peer_identity(&request) ◄──────────┘ (tonic puts it in request extensions)
//! ```
//!
//! The client side is a [`TlsConnector`] for `Endpoint::connect_with_connector`. The
//! endpoint URI must use `http://`: tonic refuses an `https://` URI unless its own TLS
//! layer is configured, and here TLS is done by the connector.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tracing::{debug, warn};

use crate::identity::Identity;
use crate::material::cert_info;

/// Who is on the other end of an accepted connection. Available to handlers as a request
/// extension; see [`peer_identity`].
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The peer's verified identity.
    pub identity: Identity,
    /// The peer's certificate serial, hex.
    pub serial: String,
    /// The peer's socket address.
    pub remote_addr: Option<SocketAddr>,
}

/// A TLS stream whose peer passed verification.
#[derive(Debug)]
pub struct AuthenticatedStream {
    inner: TlsStream<TcpStream>,
    info: PeerInfo,
}

/// Limits of the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct IncomingConfig {
    /// A handshake taking longer than this is dropped.
    pub handshake_timeout: Duration,
    /// Handshakes in flight at once; further connections wait in the kernel backlog.
    pub handshakes_max: usize,
    /// Authenticated connections waiting for tonic to pick them up.
    pub queue_len: usize,
}

/// A `tower::Service<Uri>` that dials TCP and runs a TLS handshake with a given config.
#[derive(Debug, Clone)]
pub struct TlsConnector {
    config: Arc<rustls::ClientConfig>,
}

/// The identity of the peer that sent `request`, if it arrived over [`incoming`].
pub fn peer_identity<T>(request: &tonic::Request<T>) -> Option<&Identity> {
    request.extensions().get::<PeerInfo>().map(|p| &p.identity)
}

/// Accepts TCP connections on `listener`, completes mutual TLS on each and yields those
/// that pass, for `Server::serve_with_incoming`. Handshake failures are logged (the
/// verifier has already counted the reason) and never reach tonic. The loop stops when
/// the returned stream is dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    limits: IncomingConfig,
) -> ReceiverStream<Result<AuthenticatedStream, io::Error>> {
    let (tx, rx) = mpsc::channel(limits.queue_len.max(1));
    let acceptor = TlsAcceptor::from(config);
    let permits = Arc::new(Semaphore::new(limits.handshakes_max.max(1)));
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                () = tx.closed() => break,
                permit = Arc::clone(&permits).acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let (tcp, remote) = tokio::select! {
                () = tx.closed() => break,
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        warn!(%error, "tcp accept failed");
                        continue;
                    }
                },
            };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let _permit = permit;
                if let Some(stream) = handshake(acceptor, tcp, remote, limits).await {
                    // A closed receiver means the server is gone; dropping is right.
                    let _ = tx.send(Ok(stream)).await;
                }
            });
        }
        debug!("tls accept loop stopped");
    });
    ReceiverStream::new(rx)
}

impl Default for IncomingConfig {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            handshakes_max: 256,
            queue_len: 64,
        }
    }
}

async fn handshake(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    remote: SocketAddr,
    limits: IncomingConfig,
) -> Option<AuthenticatedStream> {
    let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            debug!(%remote, %error, "tls handshake failed");
            return None;
        }
        Err(_) => {
            debug!(%remote, "tls handshake timed out");
            return None;
        }
    };
    let leaf = tls.get_ref().1.peer_certificates()?.first()?;
    // The verifier admitted this certificate moments ago, so this cannot fail; if it
    // somehow does, the connection is refused rather than admitted without an identity.
    let info = cert_info(leaf).ok()?;
    let identity = info.identity().ok()?;
    debug!(%remote, peer = %identity, "tls connection admitted");
    Some(AuthenticatedStream {
        inner: tls,
        info: PeerInfo {
            identity,
            serial: info.serial,
            remote_addr: Some(remote),
        },
    })
}

// === impl AuthenticatedStream ===

impl AuthenticatedStream {
    /// Who is on the other end.
    pub fn peer(&self) -> &PeerInfo {
        &self.info
    }
}

impl Connected for AuthenticatedStream {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for AuthenticatedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for AuthenticatedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// === impl TlsConnector ===

impl TlsConnector {
    /// A connector using `config` (build it with `tls::client_config`).
    pub fn new(config: Arc<rustls::ClientConfig>) -> Self {
        Self { config }
    }
}

type ConnectFuture = Pin<
    Box<
        dyn Future<Output = io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>> + Send,
    >,
>;

impl tower::Service<tonic::codegen::http::Uri> for TlsConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: tonic::codegen::http::Uri) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.config));
        Box::pin(async move {
            let bad = || io::Error::new(io::ErrorKind::InvalidInput, "uri has no host");
            let host = uri
                .host()
                .ok_or_else(bad)?
                .trim_matches(['[', ']'])
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            // The name only fills SNI; the verifier admits the server by identity.
            let name = ServerName::try_from(host)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let tls = connector.connect(name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}
