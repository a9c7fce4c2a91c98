//! Every HTTP listener the binary runs — the authority's API, the authority's Raft RPC, the
//! node agent's API, the dev region's backends API — is served by [`serve`] (plain) or
//! [`serve_tls`] (mutual TLS), bounded the same way.
//!
//! `axum::serve` leaves hyper's timer unset, so a client that opens a connection and never
//! finishes its headers holds it (and its task) forever. Here each connection is an
//! HTTP/1.1 connection from hyper's own builder with a timer, so:
//!
//! ```text
//! accept ─► connection cap ──full──► 503 written, closed, counted (…_connections_refused_total)
//!              │ permit held for the connection's life
//!              ▼
//!          [serve_tls] handshake within handshake_timeout ──fails──► closed, counted
//!              │ (…_tls_handshakes_failed_total{reason}); the verifier decides who is admitted
//!              ▼ every request carries the client's verified `PeerInfo` as an extension
//!          hyper http1 (header read timeout, which also ends idle keep-alive; header caps)
//!              ▼
//!          request timeout (408, counted in …_requests_timed_out_total) ─► the router
//! ```
//!
//! A handler that holds a request on purpose (the API's blocking queries) says until when
//! through the request's [`RequestDeadline`]; the request timeout then runs from there.
//!
//! Body limits are per route, in the routers (`DefaultBodyLimit`), because only the router
//! knows which route needs more than the small default.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util_client::rt::{TokioIo, TokioTimer};
use hyper_util_client::service::TowerToHyperService;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{Instrument as _, debug, info, warn};
use waymark_certs::grpc::{PeerInfo, handshake_reason};
use waymark_certs::material::cert_info;

/// Pause after an accept error that is not about one connection (out of descriptors, say),
/// so a persistent error cannot spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// ALPN protocol id of HTTP/1.1, what [`serve_tls`] listeners and their clients speak.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The bounds of one HTTP listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections open at once; one more is answered `503` and closed.
    pub connections_max: usize,
    /// Time a client has to complete the TLS handshake ([`serve_tls`] only); then the
    /// connection is closed.
    pub handshake_timeout: Duration,
    /// Time a client has to send a request's headers, from when the connection is ready
    /// for one. It also closes a keep-alive connection that sits idle this long.
    pub header_read_timeout: Duration,
    /// Time from a request's headers to its response, body read included; then `408`.
    pub request_timeout: Duration,
    /// Headers in one request, at most (hyper answers `431` beyond).
    pub headers_max: usize,
    /// Bytes of request line plus headers, at most (hyper answers `431` beyond).
    pub head_bytes_max: usize,
}

impl HttpLimits {
    /// The authority's API listener: the region's operators, node agents and tooling share
    /// it.
    pub const AUTHORITY: Self = Self {
        connections_max: 1_024,
        handshake_timeout: Duration::from_secs(10),
        header_read_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(30),
        headers_max: 64,
        head_bytes_max: 16 * 1024,
    };

    /// The authority's Raft listener: only the region's other members call it, each over a
    /// few pooled connections, so the cap is small. The header read timeout stays above the
    /// Raft client's pool idle time (see `authority::raft`), so a member never sends on a
    /// connection this side is closing.
    pub const RAFT: Self = Self {
        connections_max: 64,
        handshake_timeout: Duration::from_secs(10),
        header_read_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(30),
        headers_max: 32,
        head_bytes_max: 16 * 1024,
    };

    /// A host-local listener (the node agent's API, the dev backends' control API): only
    /// the host's own tooling and scrapers call it.
    pub const LOCAL: Self = Self {
        connections_max: 128,
        handshake_timeout: Duration::from_secs(10),
        header_read_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(10),
        headers_max: 64,
        head_bytes_max: 16 * 1024,
    };
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self::AUTHORITY
    }
}

/// `listener`: which HTTP listener.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ListenerLabels {
    /// `authority`, `raft`, `agent`, `dev_backends`.
    pub listener: &'static str,
}

/// `listener` and why a TLS handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct HandshakeLabels {
    /// Which HTTP listener.
    pub listener: &'static str,
    /// The certificate refusal's reason (`wrong_kind`, `wrong_region`, `wrong_ca`, … as
    /// in `waymark_certs_rejected_total`), `no_certificate`, `timeout`, `tls` (another
    /// protocol failure) or `io`.
    pub reason: &'static str,
}

/// What the HTTP listeners of one process count (`waymark_http_*`). Clones share series.
#[derive(Debug, Clone, Default)]
pub struct HttpMetrics {
    /// Connections refused at the connection cap.
    pub connections_refused: Family<ListenerLabels, Counter>,
    /// Requests answered `408` because they outlived the request timeout.
    pub requests_timed_out: Family<ListenerLabels, Counter>,
    /// TLS handshakes that failed, so the connection was closed before any request.
    pub tls_handshakes_failed: Family<HandshakeLabels, Counter>,
}

impl HttpMetrics {
    /// Register under `waymark_http_`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("waymark_http");
        sub.register(
            "connections_refused",
            "HTTP connections refused because the listener held its connection cap",
            self.connections_refused.clone(),
        );
        sub.register(
            "requests_timed_out",
            "HTTP requests answered 408 because they outlived the request timeout",
            self.requests_timed_out.clone(),
        );
        sub.register(
            "tls_handshakes_failed",
            "TLS handshakes on an HTTP listener that failed (peer refused, timed out or broken)",
            self.tls_handshakes_failed.clone(),
        );
    }

    /// How many handshakes on `listener` failed for `reason`.
    pub fn handshakes_failed(&self, listener: &'static str, reason: &'static str) -> u64 {
        self.tls_handshakes_failed
            .get_or_create(&HandshakeLabels { listener, reason })
            .get()
    }
}

/// Serve `router` on `listener` until `shutdown` resolves, then let the requests in flight
/// finish (each within the request timeout) and return. `name` labels metrics and logs.
pub async fn serve(
    listener: TcpListener,
    name: &'static str,
    router: Router,
    limits: HttpLimits,
    metrics: HttpMetrics,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, name, router, limits, metrics, None, shutdown).await;
}

/// [`serve`] over TLS with `tls` (build it with `waymark_certs::tls::server_config` and
/// [`ALPN_HTTP1`]: its verifier decides which client certificates are admitted). Each
/// request carries the client's verified [`PeerInfo`] as an extension
/// (`Option<axum::Extension<PeerInfo>>` in a handler).
pub async fn serve_tls(
    listener: TcpListener,
    name: &'static str,
    router: Router,
    limits: HttpLimits,
    metrics: HttpMetrics,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(tls);
    serve_with(
        listener,
        name,
        router,
        limits,
        metrics,
        Some(acceptor),
        shutdown,
    )
    .await;
}

async fn serve_with(
    listener: TcpListener,
    name: &'static str,
    router: Router,
    limits: HttpLimits,
    metrics: HttpMetrics,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let router = router.layer(axum::middleware::from_fn_with_state(
        Deadline {
            listener: name,
            timeout: limits.request_timeout,
            metrics: metrics.clone(),
        },
        deadline,
    ));
    let permits = Arc::new(Semaphore::new(
        limits.connections_max.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let local = listener.local_addr().ok();
    info!(listener = name, addr = ?local, tls = tls.is_some(), connections_max = limits.connections_max, "http listener serving");
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                debug!(listener = name, %error, "http accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            refuse(stream, peer, name, &limits, &metrics);
            continue;
        };
        let (router, stop) = (router.clone(), stop_rx.clone());
        let (tls, metrics) = (tls.clone(), metrics.clone());
        let span = tracing::debug_span!("http_connection", listener = name, %peer);
        connections.spawn(
            async move {
                let _ = stream.set_nodelay(true);
                match tls {
                    None => serve_connection(stream, router, None, &limits, stop).await,
                    Some(acceptor) => {
                        let shake = Handshake {
                            listener: name,
                            peer,
                            timeout: limits.handshake_timeout,
                            metrics: &metrics,
                        };
                        if let Some((stream, info)) = shake.run(acceptor, stream).await {
                            serve_connection(stream, router, info, &limits, stop).await;
                        }
                    }
                }
                drop(permit);
            }
            .instrument(span),
        );
    }
    // Idle connections close at once; a request in flight finishes (within its timeout).
    let _ = stop_tx.send(true);
    while connections.join_next().await.is_some() {}
    info!(listener = name, "http listener stopped");
}

/// One connection, until the peer closes it, a timeout ends it, or shutdown drains it.
/// `peer`, when known, is put into every request's extensions.
async fn serve_connection<I>(
    io: I,
    router: Router,
    peer: Option<PeerInfo>,
    limits: &HttpLimits,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(limits.headers_max)
        .max_header_size(limits.head_bytes_max)
        .keep_alive(true);
    let service = tower::util::MapRequest::new(
        router,
        move |mut request: http::Request<hyper::body::Incoming>| {
            if let Some(peer) = &peer {
                request.extensions_mut().insert(peer.clone());
            }
            request
        },
    );
    let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stopping(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(error) = result {
        // A header read timeout, a malformed request or a reset: the connection is gone,
        // which is the point; nothing else to do.
        debug!(%error, "http connection ended with an error");
    }
}

/// One TLS handshake on an accepted connection.
struct Handshake<'a> {
    listener: &'static str,
    peer: SocketAddr,
    timeout: Duration,
    metrics: &'a HttpMetrics,
}

impl Handshake<'_> {
    /// The TLS stream and the client's verified identity, or `None` once the failure is
    /// counted and logged (dropping the socket closes it).
    async fn run(
        &self,
        acceptor: TlsAcceptor,
        tcp: TcpStream,
    ) -> Option<(tokio_rustls::server::TlsStream<TcpStream>, Option<PeerInfo>)> {
        let tls = match tokio::time::timeout(self.timeout, acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                self.failed(handshake_reason(&error), Some(&error));
                return None;
            }
            Err(_elapsed) => {
                self.failed("timeout", None);
                return None;
            }
        };
        // No certificate at all completes a handshake only where the config makes one
        // optional (the API, whose requests may carry a token instead).
        let Some(leaf) = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
        else {
            debug!(listener = self.listener, remote = %self.peer, "tls connection admitted without a client certificate");
            return Some((tls, None));
        };
        // The verifier admitted this certificate moments ago, so these cannot fail; if
        // one somehow does, the connection is refused rather than served without an
        // identity.
        let info = cert_info(leaf).ok();
        let Some((identity, serial)) =
            info.and_then(|info| info.identity().ok().map(|id| (id, info.serial)))
        else {
            self.failed("bad_identity", None);
            return None;
        };
        debug!(listener = self.listener, peer = %identity, remote = %self.peer, "tls connection admitted");
        let info = PeerInfo {
            identity,
            serial,
            remote_addr: Some(self.peer),
        };
        Some((tls, Some(info)))
    }

    fn failed(&self, reason: &'static str, error: Option<&io::Error>) {
        self.metrics
            .tls_handshakes_failed
            .get_or_create(&HandshakeLabels {
                listener: self.listener,
                reason,
            })
            .inc();
        // A refused certificate is already logged at `warn` by the verifier, with its
        // serial and fingerprint; what the verifier never sees is logged here.
        match reason {
            "no_certificate" | "timeout" => {
                warn!(listener = self.listener, remote = %self.peer, reason, "tls handshake refused");
            }
            _ => {
                debug!(listener = self.listener, remote = %self.peer, reason, error = ?error, "tls handshake failed");
            }
        }
    }
}

/// Resolves once shutdown is signalled (or its sender is gone).
async fn stopping(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The answer to a connection over the cap: a `503` written without waiting (a fresh
/// socket's send buffer is empty, so it fits), then the connection is closed. On a TLS
/// listener the bytes are not TLS, so the client sees a failed handshake: either way the
/// connection is refused without a task or a handshake spent on it.
fn refuse(
    stream: TcpStream,
    peer: SocketAddr,
    name: &'static str,
    limits: &HttpLimits,
    metrics: &HttpMetrics,
) {
    metrics
        .connections_refused
        .get_or_create(&ListenerLabels { listener: name })
        .inc();
    warn!(listener = name, %peer, connections_max = limits.connections_max, "http connection refused: connection cap reached");
    let body = r#"{"error":{"reason":"too_many_connections","field":null,"message":"the listener holds its connection cap; retry later"}}"#;
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\nretry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(response.as_bytes());
}

/// The longest a handler may hold a request on purpose ([`RequestDeadline::hold_until`]),
/// counted from the request's start: above the API's longest blocking wait with its jitter
/// (10 min and 1/16 of it).
pub const HOLD_MAX: Duration = Duration::from_secs(11 * 60);

/// When a request in flight is answered `408`, as an extension of every request a listener
/// serves (`Option<axum::Extension<RequestDeadline>>` in a handler).
///
/// It starts at the listener's request timeout. A handler that holds a request on purpose
/// — a blocking query waiting for a change — calls [`RequestDeadline::hold_until`], and the
/// request timeout then runs from the end of the hold, so building the answer after a long
/// wait has the same budget as any answer.
#[derive(Debug, Clone)]
pub struct RequestDeadline {
    at: Arc<watch::Sender<tokio::time::Instant>>,
    start: tokio::time::Instant,
    timeout: Duration,
}

impl RequestDeadline {
    /// The request may be held until `until`: its deadline becomes `until` plus the
    /// request timeout, never earlier than it was, and never past [`HOLD_MAX`] plus the
    /// request timeout from the request's start.
    pub fn hold_until(&self, until: tokio::time::Instant) {
        let ceiling = self.start + HOLD_MAX + self.timeout;
        let at = (until + self.timeout).min(ceiling);
        self.at.send_if_modified(|d| {
            let later = at > *d;
            if later {
                *d = at;
            }
            later
        });
    }
}

#[derive(Clone)]
struct Deadline {
    listener: &'static str,
    timeout: Duration,
    metrics: HttpMetrics,
}

/// The request timeout: `408` with the API's error shape once it has passed, or once the
/// hold a handler asked for ([`RequestDeadline`]) and the timeout after it have.
async fn deadline(State(d): State<Deadline>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let start = tokio::time::Instant::now();
    let (at, mut moved) = watch::channel(start + d.timeout);
    // This handle outlives the request, so `moved.changed()` never fails below.
    let at = Arc::new(at);
    request.extensions_mut().insert(RequestDeadline {
        at: Arc::clone(&at),
        start,
        timeout: d.timeout,
    });
    let mut run = std::pin::pin!(next.run(request));
    loop {
        let due = *moved.borrow_and_update();
        tokio::select! {
            response = run.as_mut() => return response,
            () = tokio::time::sleep_until(due) => if *moved.borrow() <= due { break },
            _ = moved.changed() => {}
        }
    }
    d.metrics
        .requests_timed_out
        .get_or_create(&ListenerLabels {
            listener: d.listener,
        })
        .inc();
    let timeout_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    warn!(listener = d.listener, path = %path, timeout_ms, "http request timed out");
    let body = serde_json::json!({"error": {
        "reason": "request_timeout",
        "field": null,
        "message": format!("the request took longer than {timeout_ms} ms"),
    }});
    (StatusCode::REQUEST_TIMEOUT, axum::Json(body)).into_response()
}

#[cfg(test)]
#[path = "listener_test.rs"]
mod tests;
