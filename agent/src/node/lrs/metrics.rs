//! The LRS forwarder's Prometheus metrics (`waymark_lrs_*`).

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use waymark_xds::lrs::{ChannelSink, LrsServer};

use super::aggregate::DropReason;

/// `reason`: why requests were not counted (see [`DropReason`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DropLabels {
    /// [`DropReason::as_str`].
    pub reason: &'static str,
}

/// Every metric the forwarder itself updates. Clones share the same series.
#[derive(Debug, Clone, Default)]
pub struct LrsForwardMetrics {
    /// Endpoint loads dropped at a flush: their address maps to no instance, or to an
    /// ambiguous one.
    pub loads_unmapped: Counter,
    /// Endpoint loads dropped on arrival: the window already held its maximum of addresses.
    pub loads_overflow: Counter,
    /// Requests of load reports not counted, by reason: over one reporter's cap for an
    /// endpoint in a window, or from a reporter (or pair) the window could not track.
    pub requests_dropped: Family<DropLabels, Counter>,
    /// Passive samples handed to the evidence session.
    pub samples_forwarded: Counter,
    /// Passive samples dropped: the evidence session's channel was full or closed.
    pub samples_dropped: Counter,
    /// Distinct Envoys that reported in the last flush window.
    pub reporters: Gauge,
    /// Addresses in the book in force (ambiguous ones included).
    pub addresses: Gauge,
}

impl LrsForwardMetrics {
    /// The `waymark_lrs_requests_dropped_total` series for `reason`.
    pub fn requests_dropped(&self, reason: DropReason) -> Counter {
        self.requests_dropped
            .get_or_create(&DropLabels {
                reason: reason.as_str(),
            })
            .clone()
    }

    /// Register everything under `waymark_`.
    pub fn register(&self, registry: &mut Registry) {
        // Every reason from the start, so a dashboard sees zero rather than no series.
        for reason in DropReason::ALL {
            let _ = self.requests_dropped(reason);
        }
        let r = registry.sub_registry_with_prefix("waymark");
        r.register(
            "lrs_endpoint_loads_unmapped",
            "Endpoint loads dropped because their address maps to no instance or to an ambiguous one",
            self.loads_unmapped.clone(),
        );
        r.register(
            "lrs_endpoint_loads_overflow",
            "Endpoint loads dropped because the flush window already held its maximum of addresses",
            self.loads_overflow.clone(),
        );
        r.register(
            "lrs_requests_dropped",
            "Requests of load reports not counted as passive evidence, by reason (reporter_cap: over one reporter's cap for an endpoint in a flush window)",
            self.requests_dropped.clone(),
        );
        r.register(
            "lrs_samples_forwarded",
            "Passive samples handed to the evidence session",
            self.samples_forwarded.clone(),
        );
        r.register(
            "lrs_samples_dropped",
            "Passive samples dropped because the evidence session's channel was full or closed",
            self.samples_dropped.clone(),
        );
        r.register(
            "lrs_reporters",
            "Distinct Envoys that sent load reports in the last flush window",
            self.reporters.clone(),
        );
        r.register(
            "lrs_addresses",
            "Endpoint addresses in the address book in force",
            self.addresses.clone(),
        );
    }
}

/// Exports the LRS server's own counters at scrape time (they live in `xds-edge` as
/// atomics, so they are read rather than mirrored).
pub(super) struct ServerCollector {
    pub(super) server: LrsServer,
    pub(super) sink: Arc<ChannelSink>,
}

impl std::fmt::Debug for ServerCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCollector").finish_non_exhaustive()
    }
}

impl Collector for ServerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = self.server.stats();
        let counters = [
            (
                "lrs_streams",
                "LRS streams accepted from local Envoys",
                stats.streams.load(Relaxed),
            ),
            (
                "lrs_streams_refused",
                "LRS streams refused: no first request in time, or one without a usable node id",
                stats.bad_streams.load(Relaxed),
            ),
            (
                "lrs_streams_unauthenticated",
                "LRS streams refused before their first request: plaintext from off this host",
                stats.unauthenticated.load(Relaxed),
            ),
            (
                "lrs_reports",
                "Load reports received from local Envoys",
                stats.reports.load(Relaxed),
            ),
            (
                "lrs_reports_dropped",
                "Load reports dropped because the forwarder's queue was full",
                self.sink.dropped(),
            ),
            (
                "lrs_endpoint_loads_skipped",
                "Endpoint entries of load reports skipped as malformed",
                stats.skipped.load(Relaxed),
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}
