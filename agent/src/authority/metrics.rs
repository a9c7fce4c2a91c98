//! The authority's Prometheus metrics (`waymark_*`): alarms, reported signals, ingest and
//! the log. Names follow Prometheus conventions (base units, counters end in `_total`) and
//! the exposition is linted with `promtool check metrics` in the tests.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use super::raft::timings::RaftTimings;
use crate::evidence::MalformedLabels;
use crate::metrics::PropagationMetrics;

/// `service` and `zone`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ZoneLabels {
    /// The service.
    pub service: String,
    /// The callers' zone.
    pub zone: String,
}

/// `peer_region`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PeerRegionLabels {
    /// The peer region.
    pub peer_region: String,
}

/// `service`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ServiceLabels {
    /// The service.
    pub service: String,
}

/// `service` and `verdict`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct VerdictLabels {
    /// The service.
    pub service: String,
    /// The coarse verdict (`eligible`, `unknown`, …).
    pub verdict: String,
}

/// `service` and evidence `mode`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ModeLabels {
    /// The service.
    pub service: String,
    /// `passive_primary`, `probe_primary` or `single_class`.
    pub mode: String,
}

/// `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabels {
    /// A stable reason label.
    pub reason: String,
}

/// `outcome`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// What happened (`granted` or `refused` for overrides; see each family).
    pub outcome: String,
}

/// An API request: `route` (the template, `unmatched` for none), `method`, `status`
/// (the number) and `principal_kind` (`operator`, `node`, `workload`, `authority`, `token`
/// or `anonymous`). Every label is one of a fixed set, so the families stay bounded.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ApiRequestLabels {
    /// The route template.
    pub route: String,
    /// The HTTP method (`other` for a non-standard one).
    pub method: String,
    /// The status code.
    pub status: u16,
    /// What kind of principal asked.
    pub principal_kind: &'static str,
}

/// `route`: an API route template.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route template.
    pub route: String,
}

/// Buckets of API request latency, in seconds (a blocking query is held up to minutes).
fn api_latency_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 300.0,
    ])
}

/// Every metric the authority reports.
#[derive(Debug, Clone)]
pub struct AuthorityMetrics {
    /// Alarm: 1 while a zone's fraction guard is engaged (health disregarded).
    pub guard_engaged: Family<ZoneLabels, Gauge>,
    /// Alarm: 1 while the last eligible instance of a service in the region is withdrawn.
    pub last_eligible_withdrawn: Family<ServiceLabels, Gauge>,
    /// Share (0–1) of a peer region's tier-2 preference moved away by a region failover.
    pub region_failover_moved: Family<PeerRegionLabels, Gauge<f64, AtomicU64>>,
    /// Alarm: releases whose withdrawal took longer than the budget to be acknowledged by
    /// the subscribed clients.
    pub withdrawal_over_budget: Counter,
    /// Alarm: clients whose acknowledged view is older than the staleness threshold.
    pub clients_stale: Gauge,
    /// Instances per service and verdict.
    pub instances: Family<VerdictLabels, Gauge>,
    /// Instances per service and evidence mode (ADR-04).
    pub evidence_modes: Family<ModeLabels, Gauge>,
    /// Quarantine events.
    pub quarantines: Family<ServiceLabels, Counter>,
    /// Shed episodes started.
    pub shed_episodes: Counter,
    /// 1 while admissions are being shed.
    pub shedding: Gauge,
    /// Samples admitted to the evaluator.
    pub samples_accepted: Counter,
    /// Samples refused at ingest, by reason.
    pub samples_refused: Family<ReasonLabels, Counter>,
    /// Evidence sessions refused because the peer could not be attributed.
    pub sessions_unattributed: Counter,
    /// Evidence messages refused as malformed (each ended its session), by fault.
    pub messages_malformed: Family<MalformedLabels, Counter>,
    /// Views committed to the log by this leader.
    pub views_published: Counter,
    /// Time from a release to its commit.
    pub publish_commit_seconds: Histogram,
    /// Log entries group commit proposed for the API's registry commands.
    pub registry_commit_entries: Counter,
    /// Registry commands those entries carried (÷ entries = commands per entry).
    pub registry_commit_commands: Counter,
    /// Time from proposing a group-commit entry to its outcome.
    pub registry_commit_seconds: Histogram,
    /// The leader's own log writes (views, audit) that failed and will be retried, by
    /// reason (`publish`, `audit`).
    pub leader_write_failures: Family<ReasonLabels, Counter>,
    /// Views not released because the term's version space was exhausted.
    pub versions_exhausted: Counter,
    /// 1 while this leader refuses to publish: its term's version space is exhausted and
    /// no other voter can take its leadership (restart the member, or add a voter).
    pub publish_refused: Gauge,
    /// Committed entries whose apply failed unexpectedly (a bug: the entry was refused
    /// on this member and every member running the same build).
    pub apply_failures: Counter,
    /// Overrides, granted or refused.
    pub overrides: Family<OutcomeLabels, Counter>,
    /// Lease renewals by outcome: `renewed` (held by the leader, no log entry), `refused`
    /// (unknown, retired or unleased instance), `not_leader`, `busy` (the queue was full).
    pub lease_renewals: Family<OutcomeLabels, Counter>,
    /// API requests refused as malformed or invalid, by reason.
    pub api_refusals: Family<ReasonLabels, Counter>,
    /// 1 on the leader.
    pub leader: Gauge,
    /// The current Raft term.
    pub term: Gauge,
    /// NACKs received by the xDS tier.
    pub xds_nacks: Counter,
    /// Release → node agent's ACK, per path; each client's view age.
    pub propagation: PropagationMetrics,
    /// The log: commit and apply latency, follower lag, snapshot sizes.
    pub raft: RaftTimings,
    /// API requests answered, by route template, method, status and principal kind
    /// (counted by the access log).
    pub api_requests: Family<ApiRequestLabels, Counter>,
    /// API request latency by route template.
    pub api_request_seconds: Family<RouteLabels, Histogram, fn() -> Histogram>,
    /// Clients subscribed to the xDS tier.
    pub xds_clients: Gauge,
    /// xDS streams the tier refused or ended, by reason: `admission` (reconnection
    /// admission), `resource_names` (over the per-stream name cap), `slow_consumer`,
    /// `bad_request` (a malformed first request, or none).
    pub xds_streams_refused: Family<ReasonLabels, Counter>,
    /// Node agents' sidecar reports not kept, by reason (`nodes_full`).
    pub sidecar_reports_refused: Family<ReasonLabels, Counter>,
}

impl Default for AuthorityMetrics {
    fn default() -> Self {
        Self {
            guard_engaged: Family::default(),
            last_eligible_withdrawn: Family::default(),
            region_failover_moved: Family::default(),
            withdrawal_over_budget: Counter::default(),
            clients_stale: Gauge::default(),
            instances: Family::default(),
            evidence_modes: Family::default(),
            quarantines: Family::default(),
            shed_episodes: Counter::default(),
            shedding: Gauge::default(),
            samples_accepted: Counter::default(),
            samples_refused: Family::default(),
            sessions_unattributed: Counter::default(),
            messages_malformed: Family::default(),
            views_published: Counter::default(),
            publish_commit_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            registry_commit_entries: Counter::default(),
            registry_commit_commands: Counter::default(),
            registry_commit_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            leader_write_failures: Family::default(),
            versions_exhausted: Counter::default(),
            publish_refused: Gauge::default(),
            apply_failures: Counter::default(),
            overrides: Family::default(),
            lease_renewals: Family::default(),
            api_refusals: Family::default(),
            leader: Gauge::default(),
            term: Gauge::default(),
            xds_nacks: Counter::default(),
            propagation: PropagationMetrics::default(),
            raft: RaftTimings::default(),
            api_requests: Family::default(),
            api_request_seconds: Family::new_with_constructor(api_latency_histogram),
            xds_clients: Gauge::default(),
            xds_streams_refused: Family::default(),
            sidecar_reports_refused: Family::default(),
        }
    }
}

impl AuthorityMetrics {
    /// Register everything under `waymark_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("waymark");
        r.register(
            "alarm_fraction_guard_engaged",
            "1 while a zone's health is disregarded because too few instances would remain",
            self.guard_engaged.clone(),
        );
        r.register(
            "alarm_last_eligible_withdrawn",
            "1 while the last eligible instance of a service in this region is withdrawn",
            self.last_eligible_withdrawn.clone(),
        );
        r.register(
            "region_failover_moved_ratio",
            "Share (0 to 1) of a peer region's tier-2 preference moved away by a failover",
            self.region_failover_moved.clone(),
        );
        r.register(
            "alarm_withdrawal_over_budget",
            "Withdrawals not acknowledged by subscribed clients within the propagation budget",
            self.withdrawal_over_budget.clone(),
        );
        r.register(
            "alarm_clients_stale",
            "Subscribed clients whose acknowledged view is older than the staleness threshold",
            self.clients_stale.clone(),
        );
        r.register(
            "instances",
            "Instances per service and verdict",
            self.instances.clone(),
        );
        r.register(
            "evidence_mode_instances",
            "Instances per service by what their verdict rests on: passive_primary (callers' outcomes), probe_primary (two classes or more) or single_class",
            self.evidence_modes.clone(),
        );
        r.register(
            "quarantine_events",
            "Instances quarantined for flapping",
            self.quarantines.clone(),
        );
        r.register(
            "shed_episodes",
            "Episodes in which admissions were shed to keep withdrawals within budget",
            self.shed_episodes.clone(),
        );
        r.register(
            "shedding",
            "1 while admissions are being shed",
            self.shedding.clone(),
        );
        r.register(
            "ingest_samples_accepted",
            "Evidence samples admitted to the evaluator",
            self.samples_accepted.clone(),
        );
        r.register(
            "ingest_samples_refused",
            "Evidence samples refused at ingest, by reason",
            self.samples_refused.clone(),
        );
        r.register(
            "ingest_sessions_unattributed",
            "Evidence sessions refused because the peer had no usable identity",
            self.sessions_unattributed.clone(),
        );
        r.register(
            "ingest_messages_malformed",
            "Evidence messages refused as malformed, ending their session, by fault",
            self.messages_malformed.clone(),
        );
        r.register(
            "views_published",
            "Views this member committed to the log as leader",
            self.views_published.clone(),
        );
        r.register(
            "publish_commit_seconds",
            "Time from a view's release to its commit in the log",
            self.publish_commit_seconds.clone(),
        );
        r.register(
            "registry_commit_entries",
            "Log entries group commit proposed for the API's registry commands",
            self.registry_commit_entries.clone(),
        );
        r.register(
            "registry_commit_commands",
            "Registry commands carried by the entries group commit proposed",
            self.registry_commit_commands.clone(),
        );
        r.register(
            "registry_commit_seconds",
            "Time from proposing a group-commit entry to its outcome",
            self.registry_commit_seconds.clone(),
        );
        r.register(
            "leader_write_failures",
            "Log writes of the leader's own (views, audit) that failed and are retried",
            self.leader_write_failures.clone(),
        );
        r.register(
            "versions_exhausted",
            "Views not released because the leadership term's version space was exhausted",
            self.versions_exhausted.clone(),
        );
        r.register(
            "publish_refused",
            "1 while this leader refuses to publish: its term has no view version left and no other voter can lead",
            self.publish_refused.clone(),
        );
        r.register(
            "raft_apply_failures",
            "Committed entries whose apply failed unexpectedly and were refused instead",
            self.apply_failures.clone(),
        );
        r.register(
            "overrides",
            "Operator overrides, granted or refused",
            self.overrides.clone(),
        );
        r.register(
            "lease_renewals",
            "Lease renewals answered, by outcome; none of them is a log entry",
            self.lease_renewals.clone(),
        );
        r.register(
            "api_refusals",
            "API requests refused, by reason",
            self.api_refusals.clone(),
        );
        r.register("leader", "1 on the Raft leader", self.leader.clone());
        r.register("raft_term", "The current Raft term", self.term.clone());
        r.register(
            "xds_nacks",
            "NACKs received by this member's xDS tier",
            self.xds_nacks.clone(),
        );
        r.register(
            "api_requests",
            "API requests answered, by route template, method, status and principal kind",
            self.api_requests.clone(),
        );
        r.register(
            "api_request_duration_seconds",
            "API request latency by route template (a blocking query counts its wait)",
            self.api_request_seconds.clone(),
        );
        r.register(
            "xds_clients",
            "Clients subscribed to this member's xDS tier",
            self.xds_clients.clone(),
        );
        r.register(
            "xds_streams_refused",
            "xDS streams refused or ended by this member's xDS tier, by reason",
            self.xds_streams_refused.clone(),
        );
        r.register(
            "sidecar_reports_refused",
            "Node agents' reports of their sidecars not kept by the leader, by reason",
            self.sidecar_reports_refused.clone(),
        );
        self.propagation.register(registry);
        self.raft.register(registry);
        crate::metrics::register_build_info(registry);
    }
}
