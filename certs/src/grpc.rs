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
//!
//! Every gRPC listener is bounded the same way: [`IncomingConfig::connections_max`]
//! connections at once (one more is closed at accept and counted in
//! `waymark_grpc_connections_refused_total`), and a tonic `Server` from
//! [`GrpcLimits::server`] (HTTP/2 streams per connection, handler concurrency, a deadline
//! for each handler to answer, header-list size, keepalive). [`incoming_plain`] is the same
//! accept loop without TLS, for loopback listeners.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};
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
    /// The connection's place under [`IncomingConfig::connections_max`], freed on drop.
    _slot: OwnedSemaphorePermit,
}

/// A plain TCP stream accepted under a connection cap (see [`incoming_plain`]).
#[derive(Debug)]
pub struct PlainStream {
    inner: TcpStream,
    info: TcpConnectInfo,
    _slot: OwnedSemaphorePermit,
}

/// Limits of the accept loop.
#[derive(Debug, Clone)]
pub struct IncomingConfig {
    /// A handshake taking longer than this is dropped.
    pub handshake_timeout: Duration,
    /// Handshakes in flight at once; further connections wait in the kernel backlog.
    pub handshakes_max: usize,
    /// Authenticated connections waiting for tonic to pick them up.
    pub queue_len: usize,
    /// Connections open at once (handshaking or served); one more is closed at accept,
    /// logged and counted.
    pub connections_max: usize,
    /// The listener's name in metrics and logs (`authority_xds`, `ingest`, `agent_xds`, …).
    pub listener: &'static str,
    /// Where refusals are counted.
    pub metrics: GrpcMetrics,
}

/// `listener`: which gRPC listener.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct GrpcListenerLabels {
    /// The listener's name.
    pub listener: &'static str,
}

/// `listener` and why a TLS handshake failed (see [`handshake_reason`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct GrpcHandshakeLabels {
    /// The listener's name.
    pub listener: &'static str,
    /// Why: a certificate refusal's reason, `no_certificate`, `timeout`, `tls` or `io`.
    pub reason: &'static str,
}

/// What the gRPC listeners of one process count (`waymark_grpc_*`). Clones share series.
#[derive(Debug, Clone, Default)]
pub struct GrpcMetrics {
    /// Connections closed at accept because the listener held its connection cap.
    pub connections_refused: Family<GrpcListenerLabels, Counter>,
    /// TLS handshakes that failed, by listener and reason.
    pub tls_handshakes_failed: Family<GrpcHandshakeLabels, Counter>,
}

impl GrpcMetrics {
    /// Register under `waymark_grpc_`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("waymark_grpc");
        sub.register(
            "connections_refused",
            "gRPC connections closed at accept because the listener held its connection cap",
            self.connections_refused.clone(),
        );
        sub.register(
            "tls_handshakes_failed",
            "TLS handshakes on gRPC listeners that failed, by reason (a refused certificate \
             is also in waymark_certs_rejected_total)",
            self.tls_handshakes_failed.clone(),
        );
    }

    fn handshake_failed(&self, listener: &'static str, reason: &'static str) {
        self.tls_handshakes_failed
            .get_or_create(&GrpcHandshakeLabels { listener, reason })
            .inc();
    }
}

/// The `reason` label of a failed TLS handshake: the certificate refusal's reason
/// (`wrong_kind`, `wrong_region`, … as in `waymark_certs_rejected_total`), else
/// `no_certificate`, `tls` (another protocol failure) or `io`.
pub fn handshake_reason(error: &io::Error) -> &'static str {
    if let Some(refused) = crate::CertError::from_tls(error) {
        return refused.reason().as_str();
    }
    match error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::NoCertificatesPresented) => "no_certificate",
        Some(_) => "tls",
        None => "io",
    }
}

/// The bounds of a tonic server, applied by [`GrpcLimits::server`]. Message sizes are set
/// on each service (tonic sets them per service, not per server): see
/// [`GrpcLimits::message_bytes_max`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcLimits {
    /// HTTP/2 streams one connection may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub streams_per_connection_max: u32,
    /// Handler calls in flight per connection (a call counts until its response starts).
    pub concurrency_per_connection: usize,
    /// Time a handler has to start its response (a stream's body then runs as long as the
    /// stream lives); then `DEADLINE_EXCEEDED`.
    pub request_timeout: Duration,
    /// Largest message a service decodes; larger ones end the call with `RESOURCE_EXHAUSTED`.
    pub message_bytes_max: usize,
    /// Largest HTTP/2 header list accepted.
    pub header_list_bytes_max: u32,
    /// HTTP/2 keepalive ping interval, so a black-holed connection is noticed.
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is dropped.
    pub keepalive_timeout: Duration,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        Self {
            streams_per_connection_max: 64,
            concurrency_per_connection: 64,
            request_timeout: Duration::from_secs(30),
            message_bytes_max: 4 * 1024 * 1024,
            header_list_bytes_max: 16 * 1024,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
        }
    }
}

impl GrpcLimits {
    /// A tonic server builder with these bounds.
    pub fn server(&self) -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .max_concurrent_streams(self.streams_per_connection_max)
            .concurrency_limit_per_connection(self.concurrency_per_connection)
            .timeout(self.request_timeout)
            .http2_max_header_list_size(self.header_list_bytes_max)
            .http2_keepalive_interval(Some(self.keepalive_interval))
            .http2_keepalive_timeout(Some(self.keepalive_timeout))
            .tcp_keepalive(Some(self.keepalive_interval))
    }
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
    let slots = slots(&limits);
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
            let Some(slot) = take_slot(&slots, &limits, remote) else {
                continue;
            };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            let shake = Shake {
                listener: limits.listener,
                timeout: limits.handshake_timeout,
                metrics: limits.metrics.clone(),
            };
            tokio::spawn(async move {
                let _permit = permit;
                if let Some(stream) = shake.run(acceptor, tcp, remote, slot).await {
                    // A closed receiver means the server is gone; dropping is right.
                    let _ = tx.send(Ok(stream)).await;
                }
            });
        }
        debug!("tls accept loop stopped");
    });
    ReceiverStream::new(rx)
}

/// Accepts plain TCP connections on `listener` under `limits.connections_max` (TLS settings
/// are unused), for `Server::serve_with_incoming` on loopback listeners. Handlers see the
/// peer's address as with a bare `TcpListener` (`Request::remote_addr`). The loop stops
/// when the returned stream is dropped.
pub fn incoming_plain(
    listener: TcpListener,
    limits: IncomingConfig,
) -> ReceiverStream<Result<PlainStream, io::Error>> {
    let (tx, rx) = mpsc::channel(limits.queue_len.max(1));
    let slots = slots(&limits);
    tokio::spawn(async move {
        loop {
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
            let Some(slot) = take_slot(&slots, &limits, remote) else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let info = TcpConnectInfo {
                local_addr: tcp.local_addr().ok(),
                remote_addr: Some(remote),
            };
            let stream = PlainStream {
                inner: tcp,
                info,
                _slot: slot,
            };
            if tx.send(Ok(stream)).await.is_err() {
                break;
            }
        }
        debug!("tcp accept loop stopped");
    });
    ReceiverStream::new(rx)
}

fn slots(limits: &IncomingConfig) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(
        limits.connections_max.clamp(1, Semaphore::MAX_PERMITS),
    ))
}

/// A place under the connection cap for the connection from `remote`, or `None` after
/// counting and logging its refusal (the caller drops the socket, which closes it).
fn take_slot(
    slots: &Arc<Semaphore>,
    limits: &IncomingConfig,
    remote: SocketAddr,
) -> Option<OwnedSemaphorePermit> {
    match Arc::clone(slots).try_acquire_owned() {
        Ok(slot) => Some(slot),
        Err(_) => {
            limits
                .metrics
                .connections_refused
                .get_or_create(&GrpcListenerLabels {
                    listener: limits.listener,
                })
                .inc();
            warn!(listener = limits.listener, %remote, connections_max = limits.connections_max, "grpc connection refused: connection cap reached");
            None
        }
    }
}

impl Default for IncomingConfig {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            handshakes_max: 256,
            queue_len: 64,
            connections_max: 4_096,
            listener: "grpc",
            metrics: GrpcMetrics::default(),
        }
    }
}

impl IncomingConfig {
    /// The defaults for the listener named `listener`, counting into `metrics`.
    pub fn named(listener: &'static str, metrics: &GrpcMetrics) -> Self {
        Self {
            listener,
            metrics: metrics.clone(),
            ..Self::default()
        }
    }
}

/// One listener's handshake: its name, bound and counters.
struct Shake {
    listener: &'static str,
    timeout: Duration,
    metrics: GrpcMetrics,
}

impl Shake {
    /// The authenticated stream, or `None` once the failure is counted and logged.
    async fn run(
        self,
        acceptor: TlsAcceptor,
        tcp: TcpStream,
        remote: SocketAddr,
        slot: OwnedSemaphorePermit,
    ) -> Option<AuthenticatedStream> {
        let listener = self.listener;
        match tokio::time::timeout(self.timeout, acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => admitted(tls, remote, slot),
            Ok(Err(error)) => {
                let reason = handshake_reason(&error);
                self.metrics.handshake_failed(listener, reason);
                // A refused certificate is logged at `warn` by the verifier already.
                match reason {
                    "no_certificate" => {
                        warn!(listener, %remote, reason, "tls handshake refused");
                    }
                    _ => debug!(listener, %remote, reason, %error, "tls handshake failed"),
                }
                None
            }
            Err(_) => {
                self.metrics.handshake_failed(listener, "timeout");
                warn!(listener, %remote, "tls handshake timed out");
                None
            }
        }
    }
}

fn admitted(
    tls: TlsStream<TcpStream>,
    remote: SocketAddr,
    slot: OwnedSemaphorePermit,
) -> Option<AuthenticatedStream> {
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
        _slot: slot,
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

/// `AsyncRead` and `AsyncWrite` for a wrapper that holds its socket in `inner`, forwarding
/// every call — gathered writes included, so that HTTP/2 writes a frame's header and body
/// (and every frame queued behind it) with one call instead of one call per buffer.
macro_rules! forward_io {
    ($wrapper:ty) => {
        impl AsyncRead for $wrapper {
            fn poll_read(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_read(cx, buf)
            }
        }

        impl AsyncWrite for $wrapper {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.inner).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }

            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_shutdown(cx)
            }
        }
    };
}

forward_io!(AuthenticatedStream);

// === impl PlainStream ===

impl Connected for PlainStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

forward_io!(PlainStream);

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::AsyncReadExt;
    use tokio_stream::StreamExt;

    use super::*;

    #[tokio::test]
    async fn a_connection_over_the_cap_is_closed_at_accept_counted_and_its_place_reused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = GrpcMetrics::default();
        let limits = IncomingConfig {
            connections_max: 1,
            ..IncomingConfig::named("test", &metrics)
        };
        let mut incoming = incoming_plain(listener, limits);

        let _one = TcpStream::connect(addr).await.unwrap();
        let served = incoming.next().await.unwrap().unwrap();
        assert!(served.connect_info().remote_addr.is_some());

        // Over the cap: closed at once, never handed to the server.
        let mut two = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(30), two.read(&mut buf))
            .await
            .expect("the refused connection is closed");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        let refused = metrics
            .connections_refused
            .get_or_create(&GrpcListenerLabels { listener: "test" })
            .get();
        assert_eq!(refused, 1);

        // The served connection ends; its place is taken by the next one.
        drop(served);
        let _three = TcpStream::connect(addr).await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(30), incoming.next())
            .await
            .expect("a freed place is reused");
        assert!(next.unwrap().is_ok());
    }

    /// HTTP/2 hands its transport a frame's header and payload (and the frames queued
    /// behind them) as separate buffers: a stream that did not forward gathered writes
    /// would cost one system call per buffer.
    #[tokio::test]
    async fn an_accepted_plain_stream_writes_gathered_buffers_whole_and_in_order() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = GrpcMetrics::default();
        let mut incoming = incoming_plain(listener, IncomingConfig::named("test", &metrics));
        let mut peer = TcpStream::connect(addr).await.unwrap();
        let mut served = incoming.next().await.unwrap().unwrap();

        assert!(served.is_write_vectored());
        let parts: [&[u8]; 3] = [b"header:", b"payload;", b"next frame"];
        let mut slices = parts.map(io::IoSlice::new);
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            let n = served.write_vectored(slices).await.unwrap();
            assert!(n > 0);
            io::IoSlice::advance_slices(&mut slices, n);
        }
        drop(served);
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, parts.concat());
    }
}
