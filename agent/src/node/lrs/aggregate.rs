//! [`LoadAggregator`]: the host's load reports summed per endpoint address over one flush
//! window. Pure: no IO, time arrives as `now`.
//!
//! Each local Envoy reports what it saw of every endpoint since its previous report; those
//! are deltas, so summing them per address over a window neither loses nor double-counts a
//! request. A load with no requests carries no evidence and is dropped (it would otherwise
//! read as "seen and fine"). The number of addresses held is bounded; loads for further
//! addresses are dropped and counted.
//!
//! Invariants (checked by `tests.rs`, with proptest):
//! - every request reported is in exactly one flush, summed exactly (saturating at `u64::MAX`)
//! - a flushed total has at least one request and never more errors than requests

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use waymark_xds::lrs::LoadReport;

/// The shortest flush window; shorter configured values are raised to it.
pub const FLUSH_INTERVAL_MIN: Duration = Duration::from_millis(100);
/// The longest flush window; longer configured values are lowered to it.
pub const FLUSH_INTERVAL_MAX: Duration = Duration::from_secs(3600);

/// How the aggregator windows and bounds its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AggregatorConfig {
    /// How long a window lasts: a flush is due this long after the previous one. Clamped
    /// to [`FLUSH_INTERVAL_MIN`]..=[`FLUSH_INTERVAL_MAX`].
    pub flush_interval: Duration,
    /// Distinct addresses held in one window, at most; a load for a further address is
    /// dropped and counted (`Handled::overflow`).
    pub endpoints_max: NonZeroUsize,
    /// Distinct reporting Envoys remembered per window, at most (for the count in
    /// [`Flush::reporters`] only; their loads are summed regardless).
    pub reporters_max: NonZeroUsize,
}

impl Default for AggregatorConfig {
    fn default() -> Self {
        Self {
            flush_interval: Duration::from_secs(10),
            endpoints_max: NonZeroUsize::new(65_536).unwrap_or(NonZeroUsize::MIN),
            reporters_max: NonZeroUsize::new(4_096).unwrap_or(NonZeroUsize::MIN),
        }
    }
}

/// One address's request outcomes over a window, summed over every report and reporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointTotal {
    /// The endpoint, as Envoy dialled it.
    pub address: SocketAddr,
    /// Requests completed; never zero, never less than `errors`.
    pub requests: u64,
    /// Of those, how many failed.
    pub errors: u64,
    /// How many endpoint loads (report entries) were summed into this total.
    pub loads: u64,
}

/// What one report did to the aggregator. Every load of the report is in exactly one count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Handled {
    /// Loads added to a total.
    pub folded: usize,
    /// Loads dropped because they carried no requests.
    pub idle: usize,
    /// Loads dropped because their address was new and `endpoints_max` were held.
    pub overflow: usize,
}

/// A closed window: the totals and how they came about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flush {
    /// How long the window lasted (since the previous flush, or since the start).
    pub window: Duration,
    /// Reports handled in the window.
    pub reports: u64,
    /// Distinct reporting Envoys (node ids) in the window, at most `reporters_max`.
    pub reporters: usize,
    /// Per address, in address order; only addresses with at least one request.
    pub totals: Vec<EndpointTotal>,
}

/// Sums load reports per endpoint address until the next [`flush`](Self::flush).
#[derive(Debug, Clone)]
pub struct LoadAggregator {
    config: AggregatorConfig,
    window_start: Instant,
    deadline: Instant,
    last_now: Instant,
    totals: BTreeMap<SocketAddr, EndpointTotal>,
    reporters: BTreeSet<String>,
    reports: u64,
}

// === impl LoadAggregator ===

impl LoadAggregator {
    /// An empty aggregator whose first window starts at `now`.
    pub fn new(config: AggregatorConfig, now: Instant) -> Self {
        let config = AggregatorConfig {
            flush_interval: config
                .flush_interval
                .clamp(FLUSH_INTERVAL_MIN, FLUSH_INTERVAL_MAX),
            ..config
        };
        Self {
            deadline: deadline(now, config.flush_interval),
            config,
            window_start: now,
            last_now: now,
            totals: BTreeMap::new(),
            reporters: BTreeSet::new(),
            reports: 0,
        }
    }

    /// The configuration in force (the flush interval as clamped).
    pub fn config(&self) -> &AggregatorConfig {
        &self.config
    }

    /// Fold one report into the current window.
    pub fn handle_report(&mut self, now: Instant, report: &LoadReport) -> Handled {
        self.advance(now);
        self.reports = self.reports.saturating_add(1);
        if self.reporters.len() < self.config.reporters_max.get() {
            // `contains` first: the common case (a known reporter) allocates nothing.
            if !self.reporters.contains(&report.node_id) {
                self.reporters.insert(report.node_id.clone());
            }
        }
        let mut handled = Handled::default();
        for load in &report.loads {
            if load.requests == 0 {
                handled.idle += 1;
                continue;
            }
            let Some(total) = self.total_mut(load.address) else {
                handled.overflow += 1;
                continue;
            };
            // Saturating: counts near u64::MAX are nonsense, but must not panic or wrap.
            // Both saturate at the same bound, so `errors <= requests` still holds.
            total.requests = total.requests.saturating_add(load.requests);
            total.errors = total.errors.saturating_add(load.errors.min(load.requests));
            total.loads = total.loads.saturating_add(1);
            handled.folded += 1;
        }
        handled
    }

    /// When the current window closes: call [`flush`](Self::flush) then.
    pub fn poll_timeout(&self) -> Instant {
        self.deadline
    }

    /// Close the current window and return its totals; the next window starts at `now`
    /// and is due one flush interval later. Flushing early (before the deadline) is
    /// allowed and loses nothing.
    pub fn flush(&mut self, now: Instant) -> Flush {
        self.advance(now);
        let flush = Flush {
            window: now.saturating_duration_since(self.window_start),
            reports: std::mem::take(&mut self.reports),
            reporters: std::mem::take(&mut self.reporters).len(),
            totals: std::mem::take(&mut self.totals).into_values().collect(),
        };
        self.window_start = now;
        self.deadline = deadline(now, self.config.flush_interval);
        flush
    }

    /// Addresses held in the current window.
    pub fn len(&self) -> usize {
        self.totals.len()
    }

    /// Whether the current window holds nothing to forward.
    pub fn is_empty(&self) -> bool {
        self.totals.is_empty()
    }

    /// The total for `address`, created if there is room.
    fn total_mut(&mut self, address: SocketAddr) -> Option<&mut EndpointTotal> {
        let full = self.totals.len() >= self.config.endpoints_max.get();
        match self.totals.entry(address) {
            Entry::Occupied(e) => Some(e.into_mut()),
            Entry::Vacant(_) if full => None,
            Entry::Vacant(e) => Some(e.insert(EndpointTotal {
                address,
                requests: 0,
                errors: 0,
                loads: 0,
            })),
        }
    }

    fn advance(&mut self, now: Instant) {
        debug_assert!(now >= self.last_now, "time went backwards");
        self.last_now = self.last_now.max(now);
    }
}

/// `now + interval`; `now` itself if that is not representable (it never is, for the
/// clamped intervals and any real clock).
fn deadline(now: Instant, interval: Duration) -> Instant {
    now.checked_add(interval).unwrap_or(now)
}
