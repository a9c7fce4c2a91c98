//! Load reports from the host's Envoys, aggregated and forwarded as passive evidence.
//!
//! The host's sidecars report per-endpoint request and error counts to the node agent over
//! LRS, on the agent's xDS gRPC server. [`LrsForwarder`] sums them per address over a flush
//! window ([`LoadAggregator`], pure), maps addresses to instances through the assignments
//! the agent serves ([`WindowBook`], pure), and hands one passive sample per instance to the
//! evidence session. The session attributes every sample to this node by its mutual-TLS
//! identity, and the authority counts it as one caller's vote.
//!
//! Within the host, each sidecar is capped (ADR-15: an LRS reporter's influence is capped
//! per reporter). A report is keyed by the identity its stream's client certificate proved
//! (the agent's listener admits only workloads), or by `node:<node_id>` on the plaintext
//! loopback listener; at most [`REPORTER_ENDPOINT_REQUESTS_MAX`] of one reporter's requests
//! per endpoint count in a window, so one sidecar claiming 10⁹ errors weighs no more than
//! one busy honest sidecar (`waymark_lrs_requests_dropped_total{reason="reporter_cap"}`).
//!
//! ```text
//! Envoy ─LRS─► LrsServer ─► ChannelSink ─► driver ─► LoadAggregator ──flush──► WindowBook
//!          set_assignments ──► AddressBook ─────────────────────────────────────┘  │
//!                         evidence session ◄── try_send ── Vec<WireSample> ◄────────┘
//! ```
//!
//! Passive evidence is a rate: an interval lost is replaced by the next one, so nothing is
//! buffered beyond the open window. A full or closed session channel drops the flush's
//! samples (`waymark_lrs_samples_dropped_total`); a full report queue drops reports
//! (`waymark_lrs_reports_dropped_total`); dropping the forwarder loses its open window.

mod aggregate;
mod attribute;
mod metrics;

use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::load_stats::v3::load_reporting_service_server::LoadReportingServiceServer;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{Instrument as _, debug, info, trace, warn};
use waymark_core::defaults::PASSIVE_INTERVAL;
use waymark_xds::lrs::{ChannelSink, LoadReport, LrsConfig, LrsServer};

pub use aggregate::{
    AggregatorConfig, DropReason, DroppedRequests, EndpointTotal, FLUSH_INTERVAL_MAX,
    FLUSH_INTERVAL_MIN, Flush, Handled, LoadAggregator, REPORTER_ENDPOINT_RATE_MAX,
    REPORTER_ENDPOINT_REQUESTS_MAX, reporter_requests_for,
};
pub use attribute::{Attributed, WindowBook, addresses_from_assignments, attribute};
pub use metrics::{DropLabels, LrsForwardMetrics};

use crate::evidence::{BATCH_MAX, WireSample};
use attribute::book_of;
use metrics::ServerCollector;

/// The shortest reporting interval asked of Envoy; shorter configured values are raised.
pub const REPORT_INTERVAL_MIN: Duration = Duration::from_secs(1);
/// The longest reporting interval asked of Envoy; longer configured values are lowered.
pub const REPORT_INTERVAL_MAX: Duration = Duration::from_secs(3600);
/// The most flush windows attribution looks back over (see [`WindowBook`]).
pub const LOOKBACK_MAX: usize = 64;

/// How the forwarder runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LrsForwardConfig {
    /// How often the aggregated window is forwarded. Clamped to
    /// [`FLUSH_INTERVAL_MIN`]..=[`FLUSH_INTERVAL_MAX`].
    pub flush_interval: Duration,
    /// How often Envoy is asked to report. Clamped to
    /// [`REPORT_INTERVAL_MIN`]..=[`REPORT_INTERVAL_MAX`].
    pub report_interval: Duration,
    /// Reports queued between the LRS streams and the forwarder; more are dropped and
    /// counted.
    pub report_queue: NonZeroUsize,
    /// Distinct endpoint addresses held in one window; loads for more are dropped and
    /// counted.
    pub endpoints_max: NonZeroUsize,
    /// Requests of one reporter counted for one endpoint in one flush window; the excess is
    /// dropped and counted. Size it to the window with [`reporter_requests_for`].
    pub reporter_endpoint_requests_max: NonZeroU64,
}

impl Default for LrsForwardConfig {
    /// Envoy reports, and the agent forwards, at the platform's passive interval
    /// ([`PASSIVE_INTERVAL`]): the evaluator judges passive evidence silent after
    /// [`SILENCE_FACTOR`](waymark_core::defaults::SILENCE_FACTOR) of those intervals, so a slower cadence here would leave a
    /// failing caller's outcomes silent most of the time and a grey failure uncaught.
    fn default() -> Self {
        Self {
            flush_interval: PASSIVE_INTERVAL,
            report_interval: PASSIVE_INTERVAL,
            report_queue: NonZeroUsize::new(1024).unwrap_or(NonZeroUsize::MIN),
            endpoints_max: AggregatorConfig::default().endpoints_max,
            reporter_endpoint_requests_max: REPORTER_ENDPOINT_REQUESTS_MAX,
        }
    }
}

impl LrsForwardConfig {
    /// The config with both intervals clamped to their bounds.
    pub fn clamped(self) -> Self {
        Self {
            flush_interval: self
                .flush_interval
                .clamp(FLUSH_INTERVAL_MIN, FLUSH_INTERVAL_MAX),
            report_interval: self
                .report_interval
                .clamp(REPORT_INTERVAL_MIN, REPORT_INTERVAL_MAX),
            ..self
        }
    }

    /// Flush windows needed to span one Envoy reporting interval (a report covers the
    /// interval before it arrives), at least one and at most [`LOOKBACK_MAX`].
    pub fn lookback(&self) -> NonZeroUsize {
        let c = self.clamped();
        let windows = c
            .report_interval
            .as_nanos()
            .div_ceil(c.flush_interval.as_nanos().max(1));
        let windows = usize::try_from(windows).unwrap_or(LOOKBACK_MAX);
        NonZeroUsize::new(windows.min(LOOKBACK_MAX)).unwrap_or(NonZeroUsize::MIN)
    }
}

/// Handle to the running forwarder: the LRS service to serve, and where assignments go.
/// Dropping it stops the driver (the open window is lost).
pub struct LrsForwarder {
    server: LrsServer,
    books: Arc<Mutex<WindowBook>>,
    metrics: LrsForwardMetrics,
    driver: JoinHandle<()>,
}

// === impl LrsForwarder ===

impl LrsForwarder {
    /// Spawn the driver on the current tokio runtime (call from within one) and register
    /// the metrics under `waymark_`. Every flush interval the window's samples go to
    /// `samples_out` with `try_send`, in batches of at most [`BATCH_MAX`]; a batch that
    /// does not fit is dropped and counted, never queued. The driver stops when the
    /// forwarder is dropped or `samples_out`'s receiver closes.
    pub fn start(
        config: LrsForwardConfig,
        samples_out: mpsc::Sender<Vec<WireSample>>,
        registry: &mut Registry,
    ) -> Self {
        let config = config.clamped();
        let (reports_tx, reports) = mpsc::channel(config.report_queue.get());
        let sink = Arc::new(ChannelSink::new(reports_tx));
        let lrs = LrsConfig {
            interval: config.report_interval,
            ..LrsConfig::default()
        };
        let server = LrsServer::new(lrs, sink.clone());
        let metrics = LrsForwardMetrics::default();
        metrics.register(registry);
        registry
            .sub_registry_with_prefix("waymark")
            .register_collector(Box::new(ServerCollector {
                server: server.clone(),
                sink,
            }));
        let books = Arc::new(Mutex::new(WindowBook::new(config.lookback())));
        let driver = LrsForwardDriver::new(
            &config,
            reports,
            books.clone(),
            samples_out,
            metrics.clone(),
        );
        let span = tracing::info_span!(
            "lrs_forward",
            flush_ms = millis(config.flush_interval),
            report_ms = millis(config.report_interval),
        );
        let driver = tokio::spawn(driver.run().instrument(span));
        Self {
            server,
            books,
            metrics,
            driver,
        }
    }

    /// The LRS service to add to the agent's tonic server (next to its ADS service).
    pub fn service(&self) -> LoadReportingServiceServer<LrsServer> {
        self.server.service()
    }

    /// The EDS resources the agent now serves its Envoys, whole. Replaces the address book
    /// (each endpoint's instance id is read from its waymark metadata) and names their
    /// clusters to every LRS stream, so Envoy reports on exactly these.
    pub fn set_assignments<'a>(
        &self,
        assignments: impl IntoIterator<Item = &'a ClusterLoadAssignment>,
    ) {
        let assignments: Vec<&ClusterLoadAssignment> = assignments.into_iter().collect();
        let (book, skipped) = book_of(assignments.iter().copied());
        let clusters: Vec<String> = assignments
            .iter()
            .filter(|a| !a.cluster_name.is_empty())
            .map(|a| a.cluster_name.clone())
            .collect();
        let addresses = book.len();
        self.metrics.addresses.set(gauge_value(addresses));
        debug!(
            clusters = clusters.len(),
            addresses, skipped, "lrs assignments set"
        );
        // The book before the clusters: once Envoy is asked about a cluster, its
        // endpoints' addresses must already resolve.
        lock(&self.books).handle_book(book);
        self.server.set_clusters(clusters);
    }

    /// The forwarder's own metrics; clones share the series.
    pub fn metrics(&self) -> &LrsForwardMetrics {
        &self.metrics
    }

    /// Whether the driver has stopped (its sample receiver closed, or it panicked).
    pub fn is_finished(&self) -> bool {
        self.driver.is_finished()
    }
}

impl Drop for LrsForwarder {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl std::fmt::Debug for LrsForwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LrsForwarder")
            .field("metrics", &self.metrics)
            .finish_non_exhaustive()
    }
}

/// Whether the driver goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// The task that owns the aggregator.
struct LrsForwardDriver {
    aggregator: LoadAggregator,
    reports: mpsc::Receiver<LoadReport>,
    books: Arc<Mutex<WindowBook>>,
    samples_out: mpsc::Sender<Vec<WireSample>>,
    metrics: LrsForwardMetrics,
}

// === impl LrsForwardDriver ===

impl LrsForwardDriver {
    fn new(
        config: &LrsForwardConfig,
        reports: mpsc::Receiver<LoadReport>,
        books: Arc<Mutex<WindowBook>>,
        samples_out: mpsc::Sender<Vec<WireSample>>,
        metrics: LrsForwardMetrics,
    ) -> Self {
        let aggregator = LoadAggregator::new(
            AggregatorConfig {
                flush_interval: config.flush_interval,
                endpoints_max: config.endpoints_max,
                reporter_endpoint_requests_max: config.reporter_endpoint_requests_max,
                ..AggregatorConfig::default()
            },
            now(),
        );
        Self {
            aggregator,
            reports,
            books,
            samples_out,
            metrics,
        }
    }

    async fn run(mut self) {
        info!("lrs forwarder started");
        loop {
            let wake = Instant::from_std(self.aggregator.poll_timeout());
            let flow = tokio::select! {
                report = self.reports.recv() => match report {
                    Some(report) => self.handle_report(&report),
                    // Every sender is gone: the LRS server was dropped.
                    None => Flow::Stop,
                },
                () = tokio::time::sleep_until(wake) => self.flush(),
                () = self.samples_out.closed() => {
                    info!("passive sample receiver closed");
                    Flow::Stop
                }
            };
            if flow == Flow::Stop {
                break;
            }
        }
        info!("lrs forwarder stopped");
    }

    fn handle_report(&mut self, report: &LoadReport) -> Flow {
        let handled = self.aggregator.handle_report(now(), report);
        if handled.overflow > 0 {
            self.metrics.loads_overflow.inc_by(count(handled.overflow));
            warn!(
                node_id = %report.node_id,
                reporter = %report.reporter,
                dropped = handled.overflow,
                "endpoint loads dropped: the window holds its maximum of addresses"
            );
        }
        for reason in DropReason::ALL {
            let requests = handled.dropped.get(reason);
            if requests > 0 {
                self.metrics.requests_dropped(reason).inc_by(requests);
            }
        }
        if handled.capped > 0 {
            debug!(
                node_id = %report.node_id,
                reporter = %report.reporter,
                reason = DropReason::ReporterCap.as_str(),
                loads = handled.capped,
                requests_dropped = handled.dropped.reporter_cap,
                requests_max = self.aggregator.config().reporter_endpoint_requests_max.get(),
                "load report requests over the reporter's cap dropped"
            );
        }
        if handled.untracked > 0 {
            warn!(
                node_id = %report.node_id,
                reporter = %report.reporter,
                loads = handled.untracked,
                requests_reporters_full = handled.dropped.reporters_full,
                requests_reporter_endpoints_full = handled.dropped.reporter_endpoints_full,
                "endpoint loads dropped: the window tracks its maximum of reporters"
            );
        }
        trace!(
            node_id = %report.node_id,
            reporter = %report.reporter,
            folded = handled.folded,
            idle = handled.idle,
            "load report aggregated"
        );
        Flow::Continue
    }

    fn flush(&mut self) -> Flow {
        let flush = self.aggregator.flush(now());
        // Always handed to the book, empty or not: it closes the book's window too.
        let attributed = lock(&self.books).handle_flush(&flush);
        self.metrics.reporters.set(gauge_value(flush.reporters));
        if attributed.unmapped_loads > 0 {
            self.metrics
                .loads_unmapped
                .inc_by(attributed.unmapped_loads);
            debug!(
                loads = attributed.unmapped_loads,
                addresses = attributed.unmapped_addresses,
                "endpoint loads unmapped: no single instance at their address"
            );
        }
        if flush.reports > 0 {
            debug!(
                window_ms = millis(flush.window),
                reports = flush.reports,
                reporters = flush.reporters,
                samples = attributed.samples.len(),
                "lrs window flushed"
            );
        }
        let sent = send_batches(&self.samples_out, attributed.samples);
        self.metrics.samples_forwarded.inc_by(sent.forwarded);
        self.metrics.samples_dropped.inc_by(sent.dropped);
        if sent.dropped > 0 {
            warn!(
                dropped = sent.dropped,
                "passive samples dropped: evidence session full or closed"
            );
        }
        if sent.closed {
            info!("passive sample receiver closed");
            return Flow::Stop;
        }
        Flow::Continue
    }
}

/// What became of one flush's samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Sent {
    forwarded: u64,
    dropped: u64,
    closed: bool,
}

/// Hand `samples` to `out` in batches the authority accepts, without waiting: a batch
/// that does not fit is dropped; once the channel is closed, so is everything left.
fn send_batches(out: &mpsc::Sender<Vec<WireSample>>, mut samples: Vec<WireSample>) -> Sent {
    let mut sent = Sent::default();
    while !samples.is_empty() {
        let rest = samples.split_off(samples.len().min(BATCH_MAX));
        let batch = std::mem::replace(&mut samples, rest);
        let n = count(batch.len());
        match out.try_send(batch) {
            Ok(()) => sent.forwarded += n,
            Err(mpsc::error::TrySendError::Full(_)) => sent.dropped += n,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                sent.dropped += n + count(samples.len());
                sent.closed = true;
                break;
            }
        }
    }
    sent
}

/// The book, even if a panicking holder poisoned the lock: every `WindowBook` method
/// leaves it consistent before it could panic, so the data is still sound.
fn lock(books: &Mutex<WindowBook>) -> MutexGuard<'_, WindowBook> {
    books.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The driver's clock, for the aggregator. tokio's, so paused-time tests work.
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
