//! A backend's HTTP side: the listener that can vanish and come back, connections that close
//! when the backend fails hard, and the handlers answering by mode.

use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::instance::Backend;
use super::{HEALTH_PATH, Mode, READY_PATH};

/// Pause after an accept error that is not about one connection (say, out of descriptors).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Serves `backend` until `stop` changes, then lets open requests finish.
pub(super) async fn run(backend: Arc<Backend>, mut stop: watch::Receiver<bool>) {
    let listener = SwitchListener {
        generation: backend.subscribe_generation(),
        backend: Arc::clone(&backend),
    };
    let app = router(backend);
    let stopped = async move {
        // A dropped sender also means stop.
        let _ = stop.changed().await;
    };
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(stopped)
        .await
    {
        tracing::warn!(%error, "demo backend server failed");
    }
}

/// The backend's own routes: probes on the health paths, traffic everywhere else.
fn router(backend: Arc<Backend>) -> Router {
    Router::new()
        .route(HEALTH_PATH, get(live))
        .route(READY_PATH, get(ready))
        .fallback(traffic)
        .with_state(backend)
}

/// Liveness: process-internal only, so it stays green through every grey failure.
async fn live(State(backend): State<Arc<Backend>>) -> Response {
    backend.count_probe();
    let state = backend.mode_state();
    let up = match state.mode {
        Mode::FailHard => false,
        Mode::Flap => backend.flap_up(state),
        Mode::Healthy | Mode::Slow | Mode::NotReady | Mode::DegradedDependency => true,
    };
    probe_answer(up)
}

/// Readiness: this instance only; a shared dependency's trouble does not make it unready.
async fn ready(State(backend): State<Arc<Backend>>) -> Response {
    backend.count_probe();
    let state = backend.mode_state();
    let up = match state.mode {
        Mode::FailHard | Mode::NotReady => false,
        Mode::Flap => backend.flap_up(state),
        Mode::Healthy | Mode::Slow | Mode::DegradedDependency => true,
    };
    probe_answer(up)
}

fn probe_answer(up: bool) -> Response {
    if up {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "failing\n").into_response()
    }
}

/// Traffic: any method, any path but the health paths.
async fn traffic(State(backend): State<Arc<Backend>>, uri: Uri) -> Response {
    let state = backend.mode_state();
    let failure = match state.mode {
        Mode::Healthy | Mode::DegradedDependency => None,
        Mode::Slow => {
            tokio::time::sleep(backend.options.slow_delay).await;
            backend.next_slow_fails().then_some("slow and failing")
        }
        Mode::Flap => (!backend.flap_up(state)).then_some("flapping"),
        Mode::NotReady => Some("not ready"),
        // Only a request already in flight when the listener went away gets here.
        Mode::FailHard => Some("failing hard"),
    };
    backend.count_traffic(failure.is_none());
    let spec = &backend.spec;
    tracing::trace!(
        instance = %spec.instance,
        path = %uri.path(),
        mode = %state.mode,
        failed = failure.is_some(),
        "demo backend request"
    );
    match failure {
        None => Json(json!({
            "instance": spec.instance,
            "service": spec.service,
            "zone": spec.zone,
            "mode": state.mode,
            "path": uri.path(),
        }))
        .into_response(),
        Some(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "instance": spec.instance, "error": error })),
        )
            .into_response(),
    }
}

/// Accepts from whatever listener the backend holds now, and waits while it holds none.
struct SwitchListener {
    backend: Arc<Backend>,
    generation: watch::Receiver<u64>,
}

impl axum::serve::Listener for SwitchListener {
    type Io = BackendStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            // Connections accepted from here on belong to this generation.
            self.generation.borrow_and_update();
            let accepted = tokio::select! {
                accepted = poll_fn(|cx| self.backend.poll_accept(cx)) => accepted,
                changed = self.generation.changed() => {
                    if changed.is_err() {
                        // The backend is gone; nothing will ever be accepted again.
                        std::future::pending::<()>().await;
                    }
                    continue;
                }
            };
            match accepted {
                Ok((stream, peer)) => {
                    let stream = BackendStream::new(stream, self.generation.clone());
                    return (stream, peer);
                }
                Err(error) if is_connection_error(&error) => {
                    tracing::debug!(%error, "demo backend connection failed before accept");
                }
                Err(error) => {
                    tracing::warn!(%error, retry_ms = ACCEPT_RETRY.as_millis() as u64, "demo backend accept failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.backend.addr)
    }
}

fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// An accepted connection that fails every read and write once its generation has passed,
/// so the server drops it: open connections die with the listener, as in a crash.
pub(super) struct BackendStream {
    inner: TcpStream,
    /// Completes when the generation this connection was accepted under ends.
    ended: Pin<Box<dyn Future<Output = ()> + Send + Sync>>,
    dead: bool,
}

impl BackendStream {
    fn new(inner: TcpStream, mut generation: watch::Receiver<u64>) -> Self {
        let ended = Box::pin(async move {
            // A dropped sender (the backend gone) ends the generation too.
            let _ = generation.changed().await;
        });
        Self {
            inner,
            ended,
            dead: false,
        }
    }

    /// Whether the connection's generation has ended; registers `cx` to hear when it does.
    fn poll_dead(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.dead && self.ended.as_mut().poll(cx).is_ready() {
            self.dead = true;
        }
        self.dead
    }
}

fn failed_hard() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "demo backend failed hard")
}

impl AsyncRead for BackendStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.poll_dead(cx) {
            return Poll::Ready(Err(failed_hard()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for BackendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.poll_dead(cx) {
            return Poll::Ready(Err(failed_hard()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.poll_dead(cx) {
            return Poll::Ready(Err(failed_hard()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.poll_dead(cx) {
            return Poll::Ready(Err(failed_hard()));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Closing is allowed even when dead: it is what a dead connection should do.
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
