//! Prometheus metrics for the trust layer.
//!
//! ```text
//! waymark_certs_rejected_total{reason, source}    every refusal, by reason (see error.rs)
//! waymark_certs_reloads_total{outcome}            reload attempts: swapped, unchanged, rejected
//! waymark_certs_leaf_not_after_seconds            unix expiry of the leaf currently served
//! ```
//!
//! [`CertMetrics`] is cheap to clone (every clone shares the same counters); the binary
//! registers it once into its `Registry` with [`CertMetrics::register`], and hands clones
//! to verifiers and reloaders. Tests read counters back with [`CertMetrics::rejected`].

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::error::RejectReason;

/// Where a refusal happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectSource {
    /// A peer presented it in a TLS handshake.
    Peer,
    /// Our own files, on load or reload.
    Local,
}

/// Outcome of one reload attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReloadOutcome {
    /// New material was accepted and swapped in.
    Swapped,
    /// The files still hold what is being served.
    Unchanged,
    /// The files were refused; the old material keeps serving.
    Rejected,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RejectLabels {
    reason: RejectReason,
    source: RejectSource,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReloadLabels {
    outcome: ReloadOutcome,
}

/// The trust layer's counters and gauges; clones share state.
#[derive(Debug, Clone, Default)]
pub struct CertMetrics {
    rejected: Family<RejectLabels, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    leaf_not_after: Gauge,
}

// === impl CertMetrics ===

impl CertMetrics {
    /// New, zeroed metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers every metric under the `waymark_certs_` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("waymark_certs");
        sub.register(
            "rejected",
            "Certificates, keys or bundles refused, by reason and source",
            self.rejected.clone(),
        );
        sub.register(
            "reloads",
            "Certificate reload attempts, by outcome",
            self.reloads.clone(),
        );
        sub.register(
            "leaf_not_after_seconds",
            "Unix time at which the leaf certificate being served expires",
            self.leaf_not_after.clone(),
        );
    }

    /// Counts one refusal.
    pub fn record_rejection(&self, reason: RejectReason, source: RejectSource) {
        self.rejected
            .get_or_create(&RejectLabels { reason, source })
            .inc();
    }

    /// Counts one reload attempt.
    pub fn record_reload(&self, outcome: ReloadOutcome) {
        self.reloads.get_or_create(&ReloadLabels { outcome }).inc();
    }

    /// Sets the expiry of the leaf now being served.
    pub fn set_leaf_not_after(&self, unix_seconds: i64) {
        self.leaf_not_after.set(unix_seconds);
    }

    /// How many refusals for `reason` from `source` were counted.
    pub fn rejected(&self, reason: RejectReason, source: RejectSource) -> u64 {
        self.rejected
            .get_or_create(&RejectLabels { reason, source })
            .get()
    }

    /// How many reload attempts ended in `outcome`.
    pub fn reloads(&self, outcome: ReloadOutcome) -> u64 {
        self.reloads.get_or_create(&ReloadLabels { outcome }).get()
    }
}

// === label encodings ===

impl EncodeLabelValue for RejectSource {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = match self {
            Self::Peer => "peer",
            Self::Local => "local",
        };
        EncodeLabelValue::encode(&s, encoder)
    }
}

impl EncodeLabelValue for ReloadOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = match self {
            Self::Swapped => "swapped",
            Self::Unchanged => "unchanged",
            Self::Rejected => "rejected",
        };
        EncodeLabelValue::encode(&s, encoder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_are_exposed_with_snake_case_labels() {
        let metrics = CertMetrics::new();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.record_rejection(RejectReason::Expired, RejectSource::Peer);
        metrics.record_rejection(RejectReason::Expired, RejectSource::Peer);
        metrics.record_reload(ReloadOutcome::Swapped);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"waymark_certs_rejected_total{reason="expired",source="peer"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"waymark_certs_reloads_total{outcome="swapped"} 1"#));
        assert!(text.contains("waymark_certs_leaf_not_after_seconds"));
        assert_eq!(
            metrics.rejected(RejectReason::Expired, RejectSource::Peer),
            2
        );
        assert_eq!(
            metrics.rejected(RejectReason::WrongCa, RejectSource::Peer),
            0
        );
    }
}
