//! The prober's Prometheus metrics (`waymark_probe*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `kind` and `health`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProbeLabels {
    /// `http`, `tcp` or `grpc`.
    pub kind: &'static str,
    /// `pass`, `fail`, `timeout` or `refused`.
    pub health: &'static str,
}

/// `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct KindLabels {
    /// `http`, `tcp` or `grpc`.
    pub kind: &'static str,
}

/// `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct SkipLabels {
    /// Skips: `concurrency` (no slot within an interval) or `overlap` (previous run in
    /// flight). Refusals: the address class (`loopback`, `cloud_metadata`, …).
    pub reason: &'static str,
}

type HistogramFamily = Family<KindLabels, Histogram, fn() -> Histogram>;

/// Every metric the prober reports. Clones share the same series.
#[derive(Debug, Clone)]
pub struct ProberMetrics {
    /// Completed probes by kind and health.
    pub probes: Family<ProbeLabels, Counter>,
    /// Probe durations by kind, connect to verdict.
    pub duration_seconds: HistogramFamily,
    /// Due probes that did not run, by reason.
    pub skipped: Family<SkipLabels, Counter>,
    /// Samples dropped because the sample channel was full.
    pub samples_dropped: Counter,
    /// Targets currently assigned.
    pub targets: Gauge,
    /// Assigned targets refused by the address policy (counted once per refused target
    /// and address), by the class of address.
    pub refused: Family<SkipLabels, Counter>,
}

impl Default for ProberMetrics {
    fn default() -> Self {
        fn histogram() -> Histogram {
            // 0.5 ms … ~4 s: local answers to a hung target at the largest timeout.
            Histogram::new(exponential_buckets(0.0005, 2.0, 14))
        }
        Self {
            probes: Family::default(),
            duration_seconds: Family::new_with_constructor(histogram),
            skipped: Family::default(),
            samples_dropped: Counter::default(),
            targets: Gauge::default(),
            refused: Family::default(),
        }
    }
}

impl ProberMetrics {
    /// Register everything under `waymark_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("waymark");
        r.register(
            "probes",
            "Completed probes by kind and health",
            self.probes.clone(),
        );
        r.register(
            "probe_duration_seconds",
            "Probe duration from connect to verdict, by kind",
            self.duration_seconds.clone(),
        );
        r.register(
            "probes_skipped",
            "Due probes that did not run: no concurrency slot within an interval, or the previous run still in flight",
            self.skipped.clone(),
        );
        r.register(
            "probe_samples_dropped",
            "Probe samples dropped because the sample channel was full",
            self.samples_dropped.clone(),
        );
        r.register(
            "probe_targets_refused",
            "Assigned probe targets refused by the address policy, by address class",
            self.refused.clone(),
        );
        r.register(
            "probe_targets",
            "Probe targets currently assigned to this node",
            self.targets.clone(),
        );
    }
}
