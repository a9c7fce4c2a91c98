//! The node agent's own metrics (`waymark_agent_*`): staleness, the cache, the bounds;
//! and, under the names the authority uses for its own hop, the propagation to the host's
//! sidecars (`waymark_xds_propagation_seconds{hop="agent_sidecar"}`,
//! `waymark_xds_client_view_age_seconds{hop="agent_sidecar"}`) and `waymark_build_info`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::evidence::MalformedLabels;
use crate::metrics::PropagationMetrics;

/// A service label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ServiceLabels {
    /// The service.
    pub service: String,
}

/// A service and a reason.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefusalLabels {
    /// The service.
    pub service: String,
    /// `empty` (the upstream would empty it) or `undecodable`.
    pub reason: String,
}

/// The agent's metrics; clones share state.
#[derive(Debug, Clone, Default)]
pub struct AgentMetrics {
    /// 1 while the upstream xDS stream is open.
    pub upstream_connected: Gauge,
    /// 1 while a standby upstream stream is open at a second authority member.
    pub upstream_standby: Gauge,
    /// Upstream streams opened over the standby's connection after the active one ended.
    pub upstream_standby_promotions: Counter,
    /// Seconds since the upstream last confirmed the view (0 while connected).
    pub view_age_seconds: Family<ServiceLabels, Gauge<f64, AtomicU64>>,
    /// Seconds since the upstream last confirmed anything (the cache's age).
    pub lkg_age_seconds: Gauge<f64, AtomicU64>,
    /// Resources loaded from the cache at start.
    pub lkg_loaded_records: Gauge,
    /// Cache records discarded because they failed their checksum.
    pub lkg_corrupt_records: Counter,
    /// Upstream responses rejected (invalid, or not persisted), and so NACKed.
    pub upstream_nacks: Counter,
    /// NACKs the host's sidecars sent this agent's xDS server.
    pub sidecar_nacks: Counter,
    /// Release ages the authority carried that were malformed or past the bound.
    pub release_ages_ignored: Counter,
    /// Arrival → sidecar ACK, per path; each sidecar's view age.
    pub propagation: PropagationMetrics,
    /// Endpoints withdrawn upstream but still served (shrink cap), per service.
    pub held_back_endpoints: Family<ServiceLabels, Gauge>,
    /// Upstream views refused whole, per service and reason.
    pub views_refused: Family<RefusalLabels, Counter>,
    /// Views published to the host's sidecars.
    pub views_published: Counter,
    /// Evidence messages dropped because the ingest session was down or full.
    pub evidence_dropped: Counter,
    /// Evidence samples the authority accepted.
    pub evidence_accepted: Counter,
    /// Evidence samples the authority refused.
    pub evidence_refused: Counter,
    /// 1 while the evidence session is open.
    pub evidence_connected: Gauge,
    /// Workload self-reports relayed upstream.
    pub self_reports_relayed: Counter,
    /// Workload self-reports refused here (not about itself, not a self-report).
    pub self_reports_refused: Counter,
    /// Messages from workloads refused as malformed (each ended its session), by fault.
    pub self_report_messages_malformed: Family<MalformedLabels, Counter>,
    /// The local xDS clients left out of the last sidecar report (over its bound).
    pub sidecar_clients_left_out: Gauge,
}

impl AgentMetrics {
    /// Register every metric.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("waymark_agent");
        r.register(
            "upstream_connected",
            "1 while the upstream xDS stream is open",
            self.upstream_connected.clone(),
        );
        r.register(
            "upstream_standby",
            "1 while a standby upstream stream is open at a second authority member",
            self.upstream_standby.clone(),
        );
        r.register(
            "upstream_standby_promotions",
            "Upstream streams opened over the standby's connection after the active stream ended",
            self.upstream_standby_promotions.clone(),
        );
        r.register(
            "view_age_seconds",
            "Seconds since the upstream last confirmed this service's view (0 while connected)",
            self.view_age_seconds.clone(),
        );
        r.register(
            "lkg_age_seconds",
            "Seconds since the upstream last confirmed the last-known-good cache",
            self.lkg_age_seconds.clone(),
        );
        r.register(
            "lkg_loaded_records",
            "Resources loaded from the last-known-good cache at start",
            self.lkg_loaded_records.clone(),
        );
        r.register(
            "lkg_corrupt_records",
            "Cache records discarded because they failed their checksum",
            self.lkg_corrupt_records.clone(),
        );
        r.register(
            "upstream_nacks",
            "Upstream responses this agent rejected (invalid, or not persisted)",
            self.upstream_nacks.clone(),
        );
        r.register(
            "release_ages_ignored",
            "Release ages carried with upstream resources that were malformed or past the bound (1 h), and so not timed on the whole path",
            self.release_ages_ignored.clone(),
        );
        r.register(
            "sidecar_nacks",
            "Responses of this agent's xDS server its sidecars rejected",
            self.sidecar_nacks.clone(),
        );
        r.register(
            "held_back_endpoints",
            "Endpoints withdrawn upstream but still served under the shrink cap",
            self.held_back_endpoints.clone(),
        );
        r.register(
            "views_refused",
            "Upstream views refused whole (would empty the service, or undecodable)",
            self.views_refused.clone(),
        );
        r.register(
            "views_published",
            "Views published to the host's sidecars",
            self.views_published.clone(),
        );
        r.register(
            "evidence_dropped",
            "Evidence messages dropped because the ingest session was down or full",
            self.evidence_dropped.clone(),
        );
        r.register(
            "evidence_accepted",
            "Evidence samples the authority accepted",
            self.evidence_accepted.clone(),
        );
        r.register(
            "evidence_refused",
            "Evidence samples the authority refused",
            self.evidence_refused.clone(),
        );
        r.register(
            "self_reports_relayed",
            "Workload self-reports relayed upstream",
            self.self_reports_relayed.clone(),
        );
        r.register(
            "self_reports_refused",
            "Workload self-reports refused by the agent (not about itself, not a self-report)",
            self.self_reports_refused.clone(),
        );
        r.register(
            "self_report_messages_malformed",
            "Evidence messages from workloads refused as malformed, ending their session, by fault",
            self.self_report_messages_malformed.clone(),
        );
        r.register(
            "sidecar_clients_left_out",
            "Local xDS clients left out of the last sidecar report sent upstream (over its bound)",
            self.sidecar_clients_left_out.clone(),
        );
        r.register(
            "evidence_connected",
            "1 while the evidence session to the authority is open",
            self.evidence_connected.clone(),
        );
        self.propagation.register(registry);
        crate::metrics::register_build_info(registry);
    }
}
