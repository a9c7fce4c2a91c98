//! [`Resolver`]: the lock-free read side and the task that keeps it current.
//!
//! ```text
//! agent ──Delta xDS──► XdsClient ──watch<Applied>──────► Follower ──Shared::apply──► cache file
//!                          └─────watch<StreamStatus>──►     │                          │
//!                            connected / lost since ◄───────┘                          ▼
//! resolve ──load──► ArcSwap<Table> ◄──────────────────────────────store (once on disk)─┘
//! ```
//!
//! The stream is `waymark_xds`'s [`XdsClient`]: it subscribes (CDS wildcard, EDS for the
//! services asked for), NACKs an assignment the table could not translate (its validator
//! is the table's), ACKs the rest and reconnects with jittered backoff. The resolver's own
//! task, the `Follower`, follows what the client publishes: each applied state is built
//! into the next table, persisted, and only then served; each stream change moves
//! `connected` and the time the stream was lost, from which [`Resolver::age`] reports
//! staleness while the last view keeps answering. Readers never take a lock: a read is
//! `ArcSwap::load` plus a hash lookup. Writers (the task, or [`Resolver::apply`]) are
//! serialised by a mutex readers never touch.
//!
//! The stream is mutual TLS when [`ResolverConfig::tls`] is set (see `tls.rs`), and plain
//! text otherwise, which [`Resolver::connect`] allows only towards a loopback address:
//! the agent serves plain text on loopback only (`[agent.listen] local_plaintext`), and
//! views from an unauthenticated peer elsewhere could come from anyone.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tracing::Instrument as _;
use waymark_certs::CertError;
use waymark_certs::reload::{ReloadEvent, Reloader, WatchHandle};
use waymark_xds::client::{
    Applied, ClientConfig, StreamState, StreamStatus, Subscription, Validator, XdsClient,
};
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT};

use crate::cache;
use crate::error::ResolverError;
use crate::table::{Resolution, Table, TableError};
use crate::tls::ResolverTls;

/// How to reach the agent and where to keep the last-known-good view.
#[derive(Debug, Clone)]
pub struct ResolverConfig {
    /// The local agent's xDS address, e.g. `http://127.0.0.1:18000`. Always `http://`:
    /// with [`tls`](Self::tls) set the connection is mutual TLS all the same (the TLS is
    /// done beneath HTTP/2, not by the URI scheme). Without it, a loopback address only.
    pub agent: String,
    /// This caller's node id (shown in the agent's sync state).
    pub node_id: String,
    /// This caller's zone: the agent serves the view for it (tier 0 = this zone).
    pub zone: String,
    /// Services to subscribe to from the start; more with [`Resolver::subscribe`].
    pub services: Vec<String>,
    /// Where to persist every applied view; `None` keeps nothing across restarts.
    pub cache_file: Option<PathBuf>,
    /// Backoff, keepalive, buffer and size settings of the xDS stream, as given to its
    /// [`XdsClient`]. Its `validator` is replaced by the resolver's own (which NACKs
    /// assignments it cannot translate), its `tls` by [`tls`](Self::tls), and its `seed` is
    /// mixed with the node id so callers sharing a config do not reconnect in step.
    pub xds: ClientConfig,
    /// Mutual TLS towards the agent: this caller's workload certificate, checked against
    /// the agent's node certificate of the same region. `None` is plain text, allowed
    /// towards a loopback address only.
    pub tls: Option<ResolverTls>,
}

impl ResolverConfig {
    /// A config with no services, no cache file and default stream settings.
    pub fn new(
        agent: impl Into<String>,
        node_id: impl Into<String>,
        zone: impl Into<String>,
    ) -> Self {
        Self {
            agent: agent.into(),
            node_id: node_id.into(),
            zone: zone.into(),
            services: Vec::new(),
            cache_file: None,
            xds: ClientConfig::default(),
            tls: None,
        }
    }

    /// The same config, over mutual TLS with `tls`.
    pub fn with_tls(self, tls: ResolverTls) -> Self {
        Self {
            tls: Some(tls),
            ..self
        }
    }
}

/// Counters, as a snapshot (exported by the embedding process as metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ResolverStats {
    /// Updates applied to the table (including those only re-confirming it).
    pub updates: u64,
    /// Updates rejected whole, by the table or by the xDS layer (NACK).
    pub rejected: u64,
    /// Cache files discarded at start because they were corrupt.
    pub cache_corrupt: u64,
    /// Applied updates that could not be persisted (served anyway; see [`Resolver::apply`]).
    pub persist_failures: u64,
    /// xDS streams opened.
    pub streams: u64,
    /// Attempts that ended before a stream opened: connect or TLS handshake failed (a
    /// certificate refusal is also counted by reason in `ResolverTls::metrics`), or the
    /// agent refused the stream.
    pub connect_failures: u64,
}

/// In-process resolution from the local agent's views. See the crate documentation.
#[derive(Debug)]
pub struct Resolver {
    shared: Arc<Shared>,
    /// The stream to the agent (`None` from `from_table`); dropping it closes the stream.
    client: Option<XdsClient>,
    /// The `Follower` keeping the table current from the client.
    task: Option<tokio::task::JoinHandle<()>>,
    reloader: Option<Arc<Reloader>>,
    _cert_watch: Option<WatchHandle>,
}

#[derive(Debug)]
struct Shared {
    table: ArcSwap<Table>,
    /// Serialises writers; the read path never touches it.
    write: Mutex<()>,
    cache_file: Option<PathBuf>,
    connected: AtomicBool,
    /// When the last stream ended (unix ms; 0 = never).
    disconnected_unix_ms: AtomicU64,
    updates: AtomicU64,
    /// Updates the table refused (the xDS layer's NACKs are in `nacks`).
    rejected: AtomicU64,
    /// Responses the client NACKed (its validator is the table's).
    nacks: AtomicU64,
    cache_corrupt: AtomicU64,
    persist_failures: AtomicU64,
    streams: AtomicU64,
    connect_failures: AtomicU64,
}

// === impl Resolver ===

impl Resolver {
    /// Start resolving: load the cache file (served at once, before the agent answers),
    /// then subscribe to the agent on the current tokio runtime (CDS wildcard, EDS for
    /// `config.services`), reconnecting with jittered backoff until dropped. A corrupt
    /// cache file is logged at `error`, counted, and never served.
    ///
    /// With `config.tls`, the TLS files are read and checked first (a refusal starts
    /// nothing) and then watched for rotation; without it, `config.agent` must be a
    /// loopback address.
    ///
    /// Must be called within a tokio runtime. Reads the cache file (and the TLS files)
    /// synchronously (small).
    pub fn connect(config: ResolverConfig) -> Result<Self, ResolverError> {
        let endpoint = Endpoint::from_shared(config.agent.clone()).map_err(|source| {
            ResolverError::InvalidAgent {
                agent: config.agent.clone(),
                source,
            }
        })?;
        let tls = match &config.tls {
            Some(tls) => Some(tls.prepare()?),
            None if is_loopback(endpoint.uri()) => None,
            None => {
                return Err(ResolverError::PlaintextNotLoopback {
                    agent: config.agent.clone(),
                });
            }
        };
        let shared = Arc::new(Shared::new(config.cache_file.clone()));
        shared.load_cache();
        let span =
            tracing::info_span!("resolver", node_id = %config.node_id, agent = %config.agent);
        // Started inside the span, so the client's `xds_client` span is its child.
        let (client, applied) = span.in_scope(|| {
            let client_config = client_config(&config, tls.as_ref().map(|t| &t.client));
            XdsClient::connect_with(
                client_config,
                endpoint,
                node(&config),
                subscriptions(&config.services),
            )
        });
        let follower = Follower::new(Arc::clone(&shared), applied, client.stream_status());
        let task = tokio::spawn(follower.run().instrument(span));
        let reloader = tls.map(|t| t.reloader);
        let cert_watch = reloader.as_ref().and_then(|r| match r.watch() {
            Ok(watch) => Some(watch),
            Err(error) => {
                tracing::warn!(%error, "cannot watch the certificate files; reload with reload_tls only");
                None
            }
        });
        Ok(Self {
            shared,
            client: Some(client),
            task: Some(task),
            reloader,
            _cert_watch: cert_watch,
        })
    }

    /// A resolver serving `table` and nothing else: no stream, no cache. For tests, tools
    /// and callers that feed [`Resolver::apply`] themselves.
    pub fn from_table(table: Table) -> Self {
        let shared = Shared::new(None);
        shared.table.store(Arc::new(table));
        Self {
            shared: Arc::new(shared),
            client: None,
            task: None,
            reloader: None,
            _cert_watch: None,
        }
    }

    /// Resolve `service` from the current table. Lock-free: one `ArcSwap` load and one hash
    /// lookup; never blocks and never waits for the agent.
    #[inline]
    pub fn resolve(&self, service: &str) -> Resolution {
        self.shared.table.load().resolve(service)
    }

    /// Swap in a whole table (the bench's writer), bypassing translation and the cache.
    pub(crate) fn replace_table(&self, table: Table) {
        let _writer = self
            .shared
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.shared.table.store(Arc::new(table));
    }

    /// The current table (for listing or diagnostics).
    pub fn table(&self) -> Arc<Table> {
        self.shared.table.load_full()
    }

    /// Apply an update: build the next table, persist it (if a cache file is configured),
    /// then serve it. A malformed update is rejected whole and counted; the previous table
    /// stays. If persisting fails the table is still served (routing from the freshest view
    /// matters more than the file; a restart would then start from an older view) and the
    /// failure is logged at `error` and counted. Blocking (file write and fsync).
    pub fn apply(&self, applied: &Applied) -> Result<(), TableError> {
        self.shared.apply(applied, unix_ms_now())
    }

    /// Add `service` to the EDS subscription (sent at once on an open stream, and on every
    /// reconnect). Until the agent answers, the service resolves as before (`Unknown`, or
    /// what the cache held).
    pub async fn subscribe(&self, service: &str) -> Result<(), ResolverError> {
        let client = self.client.as_ref().ok_or(ResolverError::NotConnected)?;
        let subscription = Subscription {
            wildcard: false,
            names: [service.to_owned()].into(),
        };
        client
            .subscribe(TYPE_ENDPOINT, subscription)
            .await
            .map_err(|_| ResolverError::NotConnected)
    }

    /// How stale the answer for `service` may be: zero while the stream to the agent is up
    /// and the agent holds the service; otherwise the time since it was last known current
    /// (the stream's end, or the last update holding it, or — after a restart — the time
    /// recorded in the cache file). `None` if the service is not in the table.
    pub fn age(&self, service: &str) -> Option<Duration> {
        let (confirmed, upstream) = self.shared.table.load().confirmed(service)?;
        let since = if upstream {
            if self.is_connected() {
                return Some(Duration::ZERO);
            }
            confirmed.max(self.shared.disconnected_unix_ms.load(Ordering::Acquire))
        } else {
            confirmed
        };
        Some(Duration::from_millis(unix_ms_now().saturating_sub(since)))
    }

    /// Re-read the TLS files now (the watcher does this on every change; call it on
    /// SIGHUP, or where files cannot be watched). Refused files change nothing. `None`
    /// without TLS.
    pub async fn reload_tls(&self) -> Option<ReloadEvent> {
        Some(self.reloader.as_ref()?.reload_now().await)
    }

    /// Whether a stream to the agent is open now.
    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    /// When the stream to the agent was lost, while none is open since; `None` while a
    /// stream is open, and before the first one opened (the cache file's stamps then say
    /// how old the view is, see [`Resolver::age`]). Wall-clock time, for reporting only.
    pub fn lost_since(&self) -> Option<SystemTime> {
        if self.is_connected() {
            return None;
        }
        match self.shared.disconnected_unix_ms.load(Ordering::Acquire) {
            0 => None,
            ms => Some(UNIX_EPOCH + Duration::from_millis(ms)),
        }
    }

    /// The counters.
    pub fn stats(&self) -> ResolverStats {
        let s = &self.shared;
        ResolverStats {
            updates: s.updates.load(Ordering::Relaxed),
            rejected: s.rejected.load(Ordering::Relaxed) + s.nacks.load(Ordering::Relaxed),
            cache_corrupt: s.cache_corrupt.load(Ordering::Relaxed),
            persist_failures: s.persist_failures.load(Ordering::Relaxed),
            streams: s.streams.load(Ordering::Relaxed),
            connect_failures: s.connect_failures.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Resolver {
    /// Stops the follower; the client closes its stream as it drops.
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

// === impl Shared ===

impl Shared {
    fn new(cache_file: Option<PathBuf>) -> Self {
        Self {
            table: ArcSwap::from_pointee(Table::default()),
            write: Mutex::new(()),
            cache_file,
            connected: AtomicBool::new(false),
            disconnected_unix_ms: AtomicU64::new(0),
            updates: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            nacks: AtomicU64::new(0),
            cache_corrupt: AtomicU64::new(0),
            persist_failures: AtomicU64::new(0),
            streams: AtomicU64::new(0),
            connect_failures: AtomicU64::new(0),
        }
    }

    fn load_cache(&self) {
        let Some(path) = &self.cache_file else { return };
        match cache::load(path) {
            Ok(Some(table)) => {
                tracing::info!(path = %path.display(), services = table.len(), "serving the cached view");
                self.table.store(Arc::new(table));
            }
            Ok(None) => tracing::info!(path = %path.display(), "no cached view yet"),
            Err(error) => {
                self.cache_corrupt.fetch_add(1, Ordering::Relaxed);
                tracing::error!(path = %path.display(), error = %error, "cached view discarded; resolving nothing until the agent answers");
            }
        }
    }

    fn apply(&self, applied: &Applied, now_unix_ms: u64) -> Result<(), TableError> {
        let _writer = self
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let next = match self.table.load().update(applied, now_unix_ms) {
            Ok(next) => next,
            Err(error) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %error, "update rejected; serving the previous view");
                return Err(error);
            }
        };
        if let Some(path) = &self.cache_file
            && let Err(error) = cache::store(path, &next)
        {
            self.persist_failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!(path = %path.display(), error = %error, "view not persisted; serving it anyway");
        }
        self.table.store(Arc::new(next));
        self.updates.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

// === the stream ===

/// The client's settings: the caller's, with the resolver's validator, TLS and seed.
fn client_config(config: &ResolverConfig, tls: Option<&Arc<rustls::ClientConfig>>) -> ClientConfig {
    let validator: Validator = Arc::new(crate::table::validate);
    ClientConfig {
        seed: config.xds.seed ^ fnv1a(config.node_id.as_bytes()),
        validator: Some(validator),
        tls: tls.cloned(),
        ..config.xds.clone()
    }
}

fn node(config: &ResolverConfig) -> Node {
    Node {
        id: config.node_id.clone(),
        locality: Some(Locality {
            zone: config.zone.clone(),
            ..Default::default()
        }),
        user_agent_name: "waymark-resolver".to_owned(),
        ..Default::default()
    }
}

/// CDS wildcard (the agent's catalogue), EDS for `services`.
fn subscriptions(services: &[String]) -> [(String, Subscription); 2] {
    let eds = Subscription {
        wildcard: false,
        names: services.iter().cloned().collect(),
    };
    let cds = Subscription {
        wildcard: true,
        names: Default::default(),
    };
    [
        (TYPE_CLUSTER.to_owned(), cds),
        (TYPE_ENDPOINT.to_owned(), eds),
    ]
}

/// The task that follows an [`XdsClient`] into the table: it rebuilds, persists and serves
/// each newly applied state, and mirrors the stream's state into [`Shared`]. One task, so
/// table writes from the stream are ordered; it ends when the client does.
struct Follower {
    shared: Arc<Shared>,
    applied: watch::Receiver<Arc<Applied>>,
    status: watch::Receiver<StreamStatus>,
    /// `Applied::updates` of the state the table was last built from.
    updates: u64,
    /// `StreamStatus::opened` last seen.
    opened: u64,
    /// The loss last reported (`StreamState::Lost::since`).
    lost: Option<Instant>,
}

// === impl Follower ===

impl Follower {
    fn new(
        shared: Arc<Shared>,
        applied: watch::Receiver<Arc<Applied>>,
        status: watch::Receiver<StreamStatus>,
    ) -> Self {
        let updates = applied.borrow().updates;
        Self {
            shared,
            applied,
            status,
            updates,
            opened: 0,
            lost: None,
        }
    }

    async fn run(mut self) {
        loop {
            tokio::select! {
                changed = self.status.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let status = self.status.borrow_and_update().clone();
                    if self.handle_status(&status) {
                        self.rebuild().await;
                    }
                }
                changed = self.applied.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let (updates, nacks) = {
                        let applied = self.applied.borrow_and_update();
                        (applied.updates, applied.nacks)
                    };
                    self.shared.nacks.store(nacks, Ordering::Relaxed);
                    if updates != self.updates {
                        self.rebuild().await;
                    }
                }
            }
        }
    }

    /// Mirror `status` into [`Shared`] and log its transitions; whether the table must be
    /// re-stamped (a stream opened: what the resolver holds was named to the agent, which
    /// resends only what changed, so the rest is current again).
    fn handle_status(&mut self, status: &StreamStatus) -> bool {
        let shared = &self.shared;
        shared.streams.store(status.opened, Ordering::Relaxed);
        shared
            .connect_failures
            .store(status.failed_attempts, Ordering::Relaxed);
        let reopened = status.opened != self.opened;
        self.opened = status.opened;
        match &status.state {
            StreamState::Connected { .. } => {
                shared.connected.store(true, Ordering::Release);
                if reopened {
                    tracing::info!(
                        stream = status.opened,
                        "agent stream open; the view is current"
                    );
                }
                reopened
            }
            StreamState::Lost { since, error } => {
                if self.lost != Some(*since) {
                    self.lost = Some(*since);
                    let ago = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
                    shared
                        .disconnected_unix_ms
                        .store(unix_ms_now().saturating_sub(ago).max(1), Ordering::Release);
                    shared.connected.store(false, Ordering::Release);
                    let cert = CertError::from_tls(&**error).map(CertError::reason);
                    tracing::warn!(
                        error = %error,
                        cert_reason = cert.map(|r| r.as_str()),
                        lost_ms = ago,
                        "agent stream lost; serving the last-known-good view"
                    );
                }
                false
            }
            // Each failed attempt is logged by the client, with its certificate reason.
            StreamState::Connecting { .. } => false,
        }
    }

    /// Build, persist and serve the table from the client's latest applied state, off the
    /// async workers (fsync).
    async fn rebuild(&mut self) {
        let applied = self.applied.borrow().clone();
        self.updates = applied.updates;
        let shared = Arc::clone(&self.shared);
        let now = unix_ms_now();
        // The table error is logged and counted inside; the task only propagates a panic.
        if let Err(join) = tokio::task::spawn_blocking(move || shared.apply(&applied, now)).await
            && join.is_panic()
        {
            std::panic::resume_unwind(join.into_panic());
        }
    }
}

/// Whether `uri` names a loopback host (`localhost`, 127.0.0.0/8, `::1`).
fn is_loopback(uri: &tonic::codegen::http::Uri) -> bool {
    match uri.host() {
        Some("localhost") => true,
        Some(host) => host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback()),
        None => false,
    }
}

/// Wall-clock now as data (ages and cache stamps only; never used to order events).
fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    waymark_core::hash::fnv1a(bytes)
}
