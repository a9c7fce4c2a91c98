//! Prometheus metrics of the Kubernetes reconciler.
//!
//! ```text
//! waymark_kube_reconcile_diff_instances{kind}   the last diff: only_in_orchestrator,
//!                                               only_in_registry, differing, in_sync, unmanaged
//! waymark_kube_refusals_total{reason}           proposals the registry refused, by reason
//! waymark_kube_watch_errors_total               list/watch failures (each one backs off)
//! ```
//!
//! Clones share state: register once with [`KubeMetrics::register`], hand clones around.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::diff::DiffTotals;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// The reconciler's gauges and counters; clones share state.
#[derive(Debug, Clone, Default)]
pub struct KubeMetrics {
    diff_instances: Family<KindLabels, Gauge>,
    refusals: Family<ReasonLabels, Counter>,
    watch_errors: Counter,
}

// === impl KubeMetrics ===

impl KubeMetrics {
    /// New, zeroed metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers every metric under the `waymark_kube_` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("waymark_kube");
        sub.register(
            "reconcile_diff_instances",
            "Instances in the last reconciliation diff, by kind",
            self.diff_instances.clone(),
        );
        sub.register(
            "refusals",
            "Reconciler proposals the registry refused, by reason",
            self.refusals.clone(),
        );
        sub.register(
            "watch_errors",
            "EndpointSlice list/watch failures",
            self.watch_errors.clone(),
        );
    }

    /// Sets the diff gauges from a report's totals.
    pub fn set_diff(&self, totals: &DiffTotals) {
        let kinds = [
            ("only_in_orchestrator", totals.only_in_orchestrator),
            ("only_in_registry", totals.only_in_registry),
            ("differing", totals.differing),
            ("in_sync", totals.in_sync),
            ("unmanaged", totals.unmanaged),
        ];
        for (kind, n) in kinds {
            let value = i64::try_from(n).unwrap_or(i64::MAX);
            self.diff_instances
                .get_or_create(&KindLabels { kind })
                .set(value);
        }
    }

    /// Counts one refusal.
    pub fn record_refusal(&self, reason: &str) {
        self.refusals
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts one watch failure.
    pub fn record_watch_error(&self) {
        self.watch_errors.inc();
    }

    /// Refusals counted for `reason`.
    pub fn refusals(&self, reason: &str) -> u64 {
        self.refusals
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .get()
    }

    /// Watch failures counted.
    pub fn watch_errors(&self) -> u64 {
        self.watch_errors.get()
    }
}
