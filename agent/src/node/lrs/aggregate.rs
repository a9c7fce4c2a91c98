//! [`LoadAggregator`]: the host's load reports summed per endpoint address over one flush
//! window, with each reporter's influence capped. Pure: no IO, time arrives as `now`.
//!
//! Each local Envoy reports what it saw of every endpoint since its previous report; those
//! are deltas, so summing them per address over a window neither loses nor double-counts a
//! request. A load with no requests carries no evidence and is dropped (it would otherwise
//! read as "seen and fine"). The number of addresses held is bounded; loads for further
//! addresses are dropped and counted.
//!
//! **One reporter, one bounded voice** (ADR-15). Reports are keyed by the reporter their
//! stream was authenticated as (`LrsReporter`: a verified certificate identity, or a
//! declared node id on plaintext loopback). At most
//! [`reporter_endpoint_requests_max`](AggregatorConfig::reporter_endpoint_requests_max)
//! of one reporter's requests count for one address per window; the excess is dropped and
//! counted by reason ([`DroppedRequests`]). A cut load keeps its error ratio (its errors
//! are scaled with its requests), so the cap shrinks a reporter's weight against the host's
//! other callers, never what it says. A reporter the window cannot track (its tables are
//! full) could not be capped, so its loads are dropped whole and counted too.
//!
//! Invariants (checked by `tests.rs`, with proptest):
//! - a reporter's requests for an address in a window count as `min(reported, cap)`;
//!   below the cap they are summed exactly, errors included
//! - every request reported is counted in exactly one flush or dropped with a reason
//! - a flushed total has at least one request and never more errors than requests

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::net::SocketAddr;
use std::num::{NonZeroU64, NonZeroUsize};
use std::time::{Duration, Instant};

use waymark_core::defaults::PASSIVE_INTERVAL;
use waymark_xds::lrs::{EndpointLoad, LoadReport, LrsReporter};

/// The shortest flush window; shorter configured values are raised to it.
pub const FLUSH_INTERVAL_MIN: Duration = Duration::from_millis(100);
/// The longest flush window; longer configured values are lowered to it.
pub const FLUSH_INTERVAL_MAX: Duration = Duration::from_secs(3600);

/// A generous rate of requests one sidecar sends one endpoint, per second. Envoy spreads a
/// caller's traffic over every endpoint of a service, so even a caller at tens of thousands
/// of requests per second seldom sends one endpoint this many; one that does loses only
/// weight, not its error rate (a capped load keeps its ratio).
pub const REPORTER_ENDPOINT_RATE_MAX: u64 = 1_000;

/// Requests of one reporter counted for one endpoint in one default flush window
/// ([`PASSIVE_INTERVAL`]): [`REPORTER_ENDPOINT_RATE_MAX`] for that long. However many
/// requests a sidecar claims (10⁹ errors, say), its load then weighs what a busy honest
/// sidecar's does: the host's passive sample keeps its other callers' error rate whenever
/// they sent the endpoint a few times the cap (three times keeps a lone liar's 100 % below
/// the evaluator's 25 % failing rate), and the authority counts this host's sample as one
/// caller's vote among the others.
pub const REPORTER_ENDPOINT_REQUESTS_MAX: NonZeroU64 = reporter_requests_for(PASSIVE_INTERVAL);

/// [`REPORTER_ENDPOINT_RATE_MAX`] over `window`, rounded up; at least one request.
pub const fn reporter_requests_for(window: Duration) -> NonZeroU64 {
    let requests = (REPORTER_ENDPOINT_RATE_MAX as u128 * window.as_millis()).div_ceil(1_000);
    let requests = if requests > u64::MAX as u128 {
        u64::MAX
    } else {
        requests as u64
    };
    match NonZeroU64::new(requests) {
        Some(n) => n,
        None => NonZeroU64::MIN,
    }
}

/// How the aggregator windows and bounds its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AggregatorConfig {
    /// How long a window lasts: a flush is due this long after the previous one. Clamped
    /// to [`FLUSH_INTERVAL_MIN`]..=[`FLUSH_INTERVAL_MAX`].
    pub flush_interval: Duration,
    /// Distinct addresses held in one window, at most; a load for a further address is
    /// dropped and counted (`Handled::overflow`).
    pub endpoints_max: NonZeroUsize,
    /// Distinct reporters tracked in one window, at most. A further reporter's loads are
    /// dropped and counted (`DroppedRequests::reporters_full`): untracked, it could not
    /// be capped.
    pub reporters_max: NonZeroUsize,
    /// (reporter, address) pairs tracked in one window, at most; a load that would need one
    /// more is dropped and counted (`DroppedRequests::reporter_endpoints_full`).
    pub reporter_endpoints_max: NonZeroUsize,
    /// Requests of one reporter counted for one address in one window, at most; the excess
    /// is dropped and counted (`DroppedRequests::reporter_cap`). Size it to the window:
    /// [`reporter_requests_for`]`(flush_interval)`.
    pub reporter_endpoint_requests_max: NonZeroU64,
}

impl Default for AggregatorConfig {
    fn default() -> Self {
        let flush_interval = Duration::from_secs(10);
        Self {
            flush_interval,
            endpoints_max: NonZeroUsize::new(65_536).unwrap_or(NonZeroUsize::MIN),
            reporters_max: NonZeroUsize::new(4_096).unwrap_or(NonZeroUsize::MIN),
            reporter_endpoints_max: NonZeroUsize::new(262_144).unwrap_or(NonZeroUsize::MIN),
            reporter_endpoint_requests_max: reporter_requests_for(flush_interval),
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

/// Why requests of a report were not counted: the `reason` label of
/// `waymark_lrs_requests_dropped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DropReason {
    /// Over the reporter's cap for the address in this window.
    ReporterCap,
    /// The reporter could not be tracked: `reporters_max` others were.
    ReportersFull,
    /// The (reporter, address) pair could not be tracked: `reporter_endpoints_max` were.
    ReporterEndpointsFull,
}

/// Requests not counted, by [`DropReason`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DroppedRequests {
    /// Over a reporter's cap.
    pub reporter_cap: u64,
    /// From reporters that could not be tracked.
    pub reporters_full: u64,
    /// For (reporter, address) pairs that could not be tracked.
    pub reporter_endpoints_full: u64,
}

/// What one report did to the aggregator. Every load of the report is in exactly one of
/// `folded`, `idle`, `overflow` and `untracked`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Handled {
    /// Loads added to a total (a capped one only in part, or not at all once the cap is
    /// reached).
    pub folded: usize,
    /// Loads dropped because they carried no requests.
    pub idle: usize,
    /// Loads dropped because their address was new and `endpoints_max` were held.
    pub overflow: usize,
    /// Loads dropped because their reporter, or its pair with the address, could not be
    /// tracked (see [`DroppedRequests`]).
    pub untracked: usize,
    /// Of the folded loads, those the reporter's cap cut short.
    pub capped: usize,
    /// Requests not counted, by reason.
    pub dropped: DroppedRequests,
}

/// A closed window: the totals and how they came about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flush {
    /// How long the window lasted (since the previous flush, or since the start).
    pub window: Duration,
    /// Reports handled in the window.
    pub reports: u64,
    /// Distinct reporters tracked in the window, at most `reporters_max`.
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
    /// The window's reporters, each with the index its pairs in `counted` use.
    reporters: BTreeMap<LrsReporter, usize>,
    /// Requests counted this window per (reporter index, address), against the cap.
    counted: BTreeMap<(usize, SocketAddr), u64>,
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
            reporters: BTreeMap::new(),
            counted: BTreeMap::new(),
            reports: 0,
        }
    }

    /// The configuration in force (the flush interval as clamped).
    pub fn config(&self) -> &AggregatorConfig {
        &self.config
    }

    /// Fold one report into the current window, under its reporter's cap.
    pub fn handle_report(&mut self, now: Instant, report: &LoadReport) -> Handled {
        self.advance(now);
        self.reports = self.reports.saturating_add(1);
        let reporter = self.reporter_index(&report.reporter);
        let mut handled = Handled::default();
        for load in &report.loads {
            if load.requests == 0 {
                handled.idle += 1;
                continue;
            }
            match reporter {
                Some(reporter) => self.fold(reporter, load, &mut handled),
                None => {
                    handled.untracked += 1;
                    let dropped = &mut handled.dropped.reporters_full;
                    *dropped = dropped.saturating_add(load.requests);
                }
            }
        }
        handled
    }

    /// When the current window closes: call [`flush`](Self::flush) then.
    pub fn poll_timeout(&self) -> Instant {
        self.deadline
    }

    /// Close the current window and return its totals; the next window starts at `now`
    /// and is due one flush interval later, with every reporter's cap fresh. Flushing
    /// early (before the deadline) is allowed and loses nothing.
    pub fn flush(&mut self, now: Instant) -> Flush {
        self.advance(now);
        self.counted.clear();
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

    /// The reporter's index in this window, if it is tracked or there is room to.
    fn reporter_index(&mut self, reporter: &LrsReporter) -> Option<usize> {
        if let Some(index) = self.reporters.get(reporter) {
            return Some(*index);
        }
        if self.reporters.len() >= self.config.reporters_max.get() {
            return None;
        }
        let index = self.reporters.len();
        self.reporters.insert(reporter.clone(), index);
        Some(index)
    }

    /// Add what the reporter's cap leaves of `load` (which has requests) to its address.
    fn fold(&mut self, reporter: usize, load: &EndpointLoad, handled: &mut Handled) {
        let key = (reporter, load.address);
        let used = self.counted.get(&key).copied();
        if !self.totals.contains_key(&load.address)
            && self.totals.len() >= self.config.endpoints_max.get()
        {
            handled.overflow += 1;
            return;
        }
        if used.is_none() && self.counted.len() >= self.config.reporter_endpoints_max.get() {
            handled.untracked += 1;
            let dropped = &mut handled.dropped.reporter_endpoints_full;
            *dropped = dropped.saturating_add(load.requests);
            return;
        }
        let used = used.unwrap_or(0);
        let cap = self.config.reporter_endpoint_requests_max.get();
        let requests = load.requests.min(cap.saturating_sub(used));
        let errors = scaled(load.errors.min(load.requests), requests, load.requests);
        let total = self.total_mut(load.address);
        // Saturating: counts near u64::MAX are nonsense (or an uncapped config), but must
        // not panic or wrap. Both saturate at the same bound, so `errors <= requests` holds.
        total.requests = total.requests.saturating_add(requests);
        total.errors = total.errors.saturating_add(errors);
        total.loads = total.loads.saturating_add(1);
        handled.folded += 1;
        if requests < load.requests {
            handled.capped += 1;
            let dropped = &mut handled.dropped.reporter_cap;
            *dropped = dropped.saturating_add(load.requests - requests);
        }
        self.counted.insert(key, used.saturating_add(requests));
    }

    /// The total for `address`, created if absent (the caller checked there is room).
    fn total_mut(&mut self, address: SocketAddr) -> &mut EndpointTotal {
        match self.totals.entry(address) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(EndpointTotal {
                address,
                requests: 0,
                errors: 0,
                loads: 0,
            }),
        }
    }

    fn advance(&mut self, now: Instant) {
        debug_assert!(now >= self.last_now, "time went backwards");
        self.last_now = self.last_now.max(now);
    }
}

// === impl DropReason ===

impl DropReason {
    /// Every reason, in a fixed order.
    pub const ALL: [DropReason; 3] = [
        Self::ReporterCap,
        Self::ReportersFull,
        Self::ReporterEndpointsFull,
    ];

    /// The snake_case label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReporterCap => "reporter_cap",
            Self::ReportersFull => "reporters_full",
            Self::ReporterEndpointsFull => "reporter_endpoints_full",
        }
    }
}

// === impl DroppedRequests ===

impl DroppedRequests {
    /// The requests dropped for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        match reason {
            DropReason::ReporterCap => self.reporter_cap,
            DropReason::ReportersFull => self.reporters_full,
            DropReason::ReporterEndpointsFull => self.reporter_endpoints_full,
        }
    }
}

/// `errors` of `requests`, scaled to `kept` of them (rounded down, so never above `kept`);
/// exact when nothing was cut.
fn scaled(errors: u64, kept: u64, requests: u64) -> u64 {
    if kept == requests {
        return errors;
    }
    let scaled = u128::from(errors) * u128::from(kept) / u128::from(requests.max(1));
    u64::try_from(scaled).unwrap_or(kept).min(kept)
}

/// `now + interval`; `now` itself if that is not representable (it never is, for the
/// clamped intervals and any real clock).
fn deadline(now: Instant, interval: Duration) -> Instant {
    now.checked_add(interval).unwrap_or(now)
}

#[cfg(test)]
#[path = "cap_test.rs"]
mod tests;
