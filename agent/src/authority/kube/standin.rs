//! A stand-in Kubernetes API server for EndpointSlices, for tests and drills.
//!
//! No API server can run on this machine, so this speaks the real list/watch protocol over
//! plain HTTP/1.1, enough for kube-rs's `watcher` to run unmodified against it:
//!
//! - `GET /apis/discovery.k8s.io/v1[/namespaces/{ns}]/endpointslices` lists
//!   (`EndpointSliceList` with `metadata.resourceVersion`; `limit`/`continue` paging, a
//!   continue token expiring with 410 as soon as anything changes);
//! - the same path with `watch=true|1&resourceVersion=N` streams chunked JSON watch events
//!   (`ADDED|MODIFIED|DELETED|BOOKMARK|ERROR`), one per line, from after `N` (`0` or none:
//!   synthetic `ADDED`s for everything first), honouring `allowWatchBookmarks` and
//!   `timeoutSeconds`; a `resourceVersion` older than the retained history gets an
//!   `ERROR` event with a 410 `Expired` Status, as a real server sends.
//!
//! Selectors and `sendInitialEvents` answer 400: the stand-in does not pretend to support
//! them. Every request's path and query is recorded ([`StandIn::requests`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Watch events retained for resumption; a watch from before them gets 410.
pub const HISTORY_MAX: usize = 1_000;
/// Requests recorded for [`StandIn::requests`]; older ones are dropped.
pub const REQUESTS_MAX: usize = 10_000;
/// A watch without `timeoutSeconds` ends after this long.
pub const WATCH_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1_800);
/// How often a watch that allows bookmarks gets one.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

/// Why the stand-in could not start or restart.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StandInError {
    /// The listener could not be bound; nothing is serving.
    #[error("could not bind {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A running (or stopped) stand-in. Its objects survive [`stop`](StandIn::stop) and
/// [`restart`](StandIn::restart). Dropping it stops serving.
#[derive(Debug)]
pub struct StandIn {
    inner: Arc<Inner>,
    addr: SocketAddr,
    server: Option<Server>,
}

#[derive(Debug)]
struct Server {
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<Objects>,
    /// The latest resource version; watches wait on it.
    changes: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Objects {
    rv: u64,
    slices: BTreeMap<(String, String), EndpointSlice>,
    history: VecDeque<Change>,
    /// Watches from a version below this get 410.
    oldest_rv: u64,
    requests: VecDeque<String>,
}

#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    kind: &'static str,
    object: EndpointSlice,
}

// === impl StandIn ===

impl StandIn {
    /// Starts serving on an ephemeral loopback port.
    pub async fn start() -> Result<(Self, SocketAddr), StandInError> {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let inner = Arc::new(Inner {
            state: Mutex::new(Objects::default()),
            changes: watch::Sender::new(0),
        });
        let (server, addr) = serve(inner.clone(), addr).await?;
        let standin = Self {
            inner,
            addr,
            server: Some(server),
        };
        Ok((standin, addr))
    }

    /// The address served on (kept across restarts).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL to give `kube::Config::new`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Creates or replaces a slice (by namespace and name); returns its new
    /// `resourceVersion`. A slice without a namespace goes to `default`.
    pub fn apply(&self, mut slice: EndpointSlice) -> u64 {
        let mut s = self.inner.lock();
        s.rv += 1;
        let rv = s.rv;
        let meta = &mut slice.metadata;
        let namespace = meta
            .namespace
            .get_or_insert_with(|| "default".into())
            .clone();
        let name = meta.name.clone().unwrap_or_default();
        meta.resource_version = Some(rv.to_string());
        if meta.uid.is_none() {
            meta.uid = Some(format!("standin-{rv}"));
        }
        let kind = match s.slices.insert((namespace, name), slice.clone()) {
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        s.record(Change {
            rv,
            kind,
            object: slice,
        });
        drop(s);
        self.inner.changes.send_replace(rv);
        rv
    }

    /// Deletes a slice; returns whether it existed.
    pub fn delete(&self, namespace: &str, name: &str) -> bool {
        let mut s = self.inner.lock();
        let Some(mut slice) = s.slices.remove(&(namespace.to_owned(), name.to_owned())) else {
            return false;
        };
        s.rv += 1;
        let rv = s.rv;
        slice.metadata.resource_version = Some(rv.to_string());
        s.record(Change {
            rv,
            kind: "DELETED",
            object: slice,
        });
        drop(s);
        self.inner.changes.send_replace(rv);
        true
    }

    /// Forgets every retained watch event, as etcd compaction does: any watch resuming
    /// from an older version is answered 410 and must re-list.
    pub fn compact(&self) {
        let mut s = self.inner.lock();
        s.history.clear();
        s.oldest_rv = s.rv + 1;
    }

    /// Every request received so far (`METHOD path?query`), oldest first.
    pub fn requests(&self) -> Vec<String> {
        self.inner.lock().requests.iter().cloned().collect()
    }

    /// Stops serving: no new connections, open watches end, clients see the server gone.
    /// Objects are kept.
    pub async fn stop(&mut self) {
        let Some(server) = self.server.take() else {
            return;
        };
        server.shutdown.send_replace(true);
        let abort = server.task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(5), server.task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }

    /// Serves again on the same address, with the same objects and history.
    pub async fn restart(&mut self) -> Result<(), StandInError> {
        if self.server.is_some() {
            return Ok(());
        }
        let (server, _) = serve(self.inner.clone(), self.addr).await?;
        self.server = Some(server);
        Ok(())
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown.send_replace(true);
            server.task.abort();
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Objects> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Objects {
    fn record(&mut self, change: Change) {
        self.history.push_back(change);
        while self.history.len() > HISTORY_MAX {
            if let Some(old) = self.history.pop_front() {
                self.oldest_rv = old.rv + 1;
            }
        }
    }

    fn log_request(&mut self, line: String) {
        self.requests.push_back(line);
        while self.requests.len() > REQUESTS_MAX {
            self.requests.pop_front();
        }
    }
}

async fn serve(inner: Arc<Inner>, addr: SocketAddr) -> Result<(Server, SocketAddr), StandInError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StandInError::Bind { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| StandInError::Bind { addr, source })?;
    let (shutdown, mut stopping) = watch::channel(false);
    let app = Router::new()
        .route(
            "/apis/discovery.k8s.io/v1/endpointslices",
            get(all_namespaces),
        )
        .route(
            "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
            get(one_namespace),
        )
        .fallback(not_found)
        .with_state(Shared {
            inner,
            stopping: shutdown.subscribe(),
        });
    let task = tokio::spawn(async move {
        let signal = async move {
            let _ = stopping.wait_for(|s| *s).await;
        };
        if let Err(error) = axum::serve(listener, app)
            .with_graceful_shutdown(signal)
            .await
        {
            tracing::warn!(error = %error, "stand-in api server stopped");
        }
    });
    Ok((Server { shutdown, task }, addr))
}

#[derive(Clone)]
struct Shared {
    inner: Arc<Inner>,
    stopping: watch::Receiver<bool>,
}

async fn all_namespaces(
    State(shared): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
    uri: Uri,
) -> Response {
    handle(shared, None, q, &uri)
}

async fn one_namespace(
    State(shared): State<Shared>,
    Path(ns): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    uri: Uri,
) -> Response {
    handle(shared, Some(ns), q, &uri)
}

async fn not_found(uri: Uri) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("the stand-in does not serve {uri}"),
    )
}

fn handle(shared: Shared, ns: Option<String>, q: HashMap<String, String>, uri: &Uri) -> Response {
    shared.inner.lock().log_request(format!(
        "GET {}",
        uri.path_and_query().map_or("", |p| p.as_str())
    ));
    for unsupported in ["labelSelector", "fieldSelector"] {
        if q.get(unsupported).is_some_and(|v| !v.is_empty()) {
            let msg = format!("{unsupported} is not supported by the stand-in");
            return status(StatusCode::BAD_REQUEST, "BadRequest", &msg);
        }
    }
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    if watching {
        if q.get("sendInitialEvents").is_some_and(|v| v == "true") {
            let msg = "sendInitialEvents is not supported by the stand-in";
            return status(StatusCode::BAD_REQUEST, "BadRequest", msg);
        }
        watch_response(shared, ns, &q)
    } else {
        list_response(&shared.inner, ns.as_deref(), &q)
    }
}

fn in_namespace(ns: Option<&str>, key: &(String, String)) -> bool {
    ns.is_none_or(|ns| ns == key.0)
}

fn list_response(inner: &Inner, ns: Option<&str>, q: &HashMap<String, String>) -> Response {
    let s = inner.lock();
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let offset = match q.get("continue").filter(|c| !c.is_empty()) {
        None => 0,
        Some(token) => match token.split_once(':') {
            Some((rv, offset)) if rv == s.rv.to_string() => offset.parse().unwrap_or(0),
            _ => {
                let msg = "the provided continue parameter is too old";
                return status(StatusCode::GONE, "Expired", msg);
            }
        },
    };
    let matching: Vec<&EndpointSlice> = s
        .slices
        .iter()
        .filter(|(k, _)| in_namespace(ns, k))
        .map(|(_, v)| v)
        .collect();
    let page: Vec<&EndpointSlice> = matching.iter().skip(offset).take(limit).copied().collect();
    let next = offset.saturating_add(page.len());
    let mut metadata = json!({ "resourceVersion": s.rv.to_string() });
    if next < matching.len() {
        metadata["continue"] = json!(format!("{}:{next}", s.rv));
    }
    let body = json!({
        "kind": "EndpointSliceList",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": metadata,
        "items": page,
    });
    json_response(StatusCode::OK, &body)
}

fn watch_response(shared: Shared, ns: Option<String>, q: &HashMap<String, String>) -> Response {
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map_or(WATCH_TIMEOUT_DEFAULT, Duration::from_secs);
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");
    let from = q
        .get("resourceVersion")
        .and_then(|rv| rv.parse::<u64>().ok())
        .unwrap_or(0);
    let now = Instant::now();
    let mut cursor = Cursor {
        inner: shared.inner.clone(),
        changes: shared.inner.changes.subscribe(),
        stopping: shared.stopping,
        ns,
        rv: from,
        pending: VecDeque::new(),
        deadline: now + timeout,
        next_bookmark: bookmarks.then(|| now + BOOKMARK_INTERVAL),
        done: false,
    };
    cursor.start();
    let stream = futures::stream::unfold(cursor, |mut c| async move {
        let line = c.next_line().await?;
        Some((Ok::<Bytes, Infallible>(line), c))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// One watch's position in the change history.
struct Cursor {
    inner: Arc<Inner>,
    changes: watch::Receiver<u64>,
    stopping: watch::Receiver<bool>,
    ns: Option<String>,
    /// Every change up to here has been sent (or filtered out).
    rv: u64,
    pending: VecDeque<Bytes>,
    deadline: Instant,
    next_bookmark: Option<Instant>,
    done: bool,
}

impl Cursor {
    /// Queues what a watch sends first: everything (from version 0), or an ERROR 410 for a
    /// version older than the history.
    fn start(&mut self) {
        self.changes.borrow_and_update();
        let s = self.inner.lock();
        if self.rv == 0 {
            for (key, slice) in &s.slices {
                if in_namespace(self.ns.as_deref(), key) {
                    self.pending.push_back(event_line("ADDED", &json!(slice)));
                }
            }
            self.rv = s.rv;
        } else if self.rv + 1 < s.oldest_rv {
            let msg = format!("too old resource version: {} ({})", self.rv, s.oldest_rv);
            self.pending
                .push_back(event_line("ERROR", &status_json(410, "Expired", &msg)));
            self.done = true;
        }
    }

    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Some(line);
            }
            if self.done {
                return None;
            }
            self.collect();
            if !self.pending.is_empty() {
                continue;
            }
            let bookmark = self.next_bookmark;
            let bookmark_due = async move {
                match bookmark {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = self.changes.changed() => self.done = changed.is_err(),
                () = tokio::time::sleep_until(self.deadline) => self.done = true,
                _ = self.stopping.wait_for(|s| *s) => self.done = true,
                () = bookmark_due => {
                    self.next_bookmark = bookmark.map(|at| at + BOOKMARK_INTERVAL);
                    let object = json!({
                        "kind": "EndpointSlice",
                        "apiVersion": "discovery.k8s.io/v1",
                        "metadata": { "resourceVersion": self.rv.to_string() },
                    });
                    self.pending.push_back(event_line("BOOKMARK", &object));
                }
            }
        }
    }

    /// Moves every retained change after `rv` into `pending`.
    fn collect(&mut self) {
        self.changes.borrow_and_update();
        let s = self.inner.lock();
        if self.rv + 1 < s.oldest_rv {
            // Compacted under a running watch: the client must re-list.
            let msg = format!("too old resource version: {} ({})", self.rv, s.oldest_rv);
            self.pending
                .push_back(event_line("ERROR", &status_json(410, "Expired", &msg)));
            self.done = true;
            return;
        }
        for change in s.history.iter().filter(|c| c.rv > self.rv) {
            let key = (
                change.object.metadata.namespace.clone().unwrap_or_default(),
                String::new(),
            );
            if in_namespace(self.ns.as_deref(), &key) {
                self.pending
                    .push_back(event_line(change.kind, &json!(change.object)));
            }
        }
        self.rv = self.rv.max(s.rv);
    }
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({ "type": kind, "object": object }).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn status_json(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    json_response(code, &status_json(code.as_u16(), reason, message))
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
