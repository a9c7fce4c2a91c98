//! What the node agent's tasks and its local HTTP API share: the served view and where it
//! is published, the upstream's state, the gossip pool and the loop's heartbeat.
//!
//! A leaf below both: `agent` builds one [`Shared`] and hands it to its tasks and to
//! `api::router`; `api` only reads it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use waymark_core::model::NodeName;
use waymark_lkg::ViewStore;
use waymark_xds::{Publisher, XdsServer};

use super::cache;
use super::dns::DnsTable;
use super::lrs::LrsForwarder;
use super::metrics::{AgentMetrics, RefusalLabels, ServiceLabels};
use super::probe::ProbeRefusal;
use super::view::{Changes, LocalView, ServiceState};
use crate::evidence::AgentMessage;
use crate::gossip::MemberState;

/// What the HTTP API and tests read about the served view.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ViewStatus {
    /// The upstream xDS stream is open.
    pub upstream_connected: bool,
    /// Where the view came from at start: `cache` or `empty`.
    pub started_from: &'static str,
    /// Seconds since the upstream last confirmed the view.
    pub age_seconds: f64,
    /// Per service.
    pub services: Vec<ServiceStatus>,
}

/// One service's served view.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServiceStatus {
    /// The service.
    pub service: String,
    /// The upstream's version of its assignment.
    pub upstream_version: String,
    /// The version served to sidecars.
    pub served_version: u64,
    /// Endpoints served.
    pub endpoints: usize,
    /// Withdrawn upstream but still served (shrink cap).
    pub held_back: usize,
    /// The upstream asked for an empty set; the previous one is kept.
    pub refused_empty: bool,
    /// The upstream's assignment could not be decoded; the previous one is kept.
    pub undecodable: bool,
}

/// Shared between the tasks and the API.
pub(crate) struct Shared {
    pub(crate) view: Mutex<LocalView>,
    pub(crate) store: Arc<dyn ViewStore>,
    pub(crate) high_water: std::sync::atomic::AtomicU64,
    pub(crate) publisher: Publisher,
    /// The local xDS server: its clients' sync state and what each was sent.
    pub(crate) xds: XdsServer,
    pub(crate) dns: Arc<ArcSwap<DnsTable>>,
    pub(crate) lrs: LrsForwarder,
    pub(crate) metrics: AgentMetrics,
    pub(crate) registry: Mutex<Registry>,
    pub(crate) connected: watch::Receiver<bool>,
    pub(crate) confirmed_at: Mutex<SystemTime>,
    pub(crate) started_from: &'static str,
    pub(crate) gossip: Option<watch::Receiver<Vec<MemberState>>>,
    pub(crate) outbound: mpsc::Sender<AgentMessage>,
    pub(crate) heartbeat: Mutex<Instant>,
    pub(crate) name: NodeName,
    /// The prober's refused targets, once the prober runs.
    pub(crate) probe_refusals: std::sync::OnceLock<watch::Receiver<Vec<ProbeRefusal>>>,
    /// Services whose view age is exported, so a service that is no longer served stops
    /// being reported instead of ageing for ever.
    pub(crate) aged: Mutex<BTreeSet<String>>,
    /// Trace export (see `crate::otel`).
    pub(crate) telemetry: crate::otel::Telemetry,
    /// The sidecars' acknowledgements of each traced release (`waymark.xds.ack`).
    pub(crate) acks: Arc<crate::otel::AckSpans>,
}

impl Shared {
    pub(super) fn lock_view(&self) -> std::sync::MutexGuard<'_, LocalView> {
        self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The trace of one upstream update, after it was applied and published: the
    /// authority → agent hop's arrival (`waymark.xds.apply`, begun at `received`; the
    /// client acknowledges what it applied) and, its child, the agent → sidecar send
    /// (`waymark.xds.send`). One pair per update, with counts and versions: the upstream
    /// version is the authority's, which joins these spans to its release's trace.
    pub(super) fn trace_apply(
        &self,
        view: &LocalView,
        changes: &Changes,
        received: SystemTime,
        released_at: std::time::Instant,
    ) {
        use opentelemetry::KeyValue;
        if !self.telemetry.is_on() || changes.services.is_empty() {
            return;
        }
        let changed: Vec<(&String, &super::view::ServiceState)> = view
            .states()
            .filter(|(name, _)| changes.services.contains(*name))
            .collect();
        let upstream = changed
            .iter()
            .filter_map(|(_, s)| s.upstream_version.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let served = changed
            .iter()
            .map(|(_, s)| s.served_version)
            .max()
            .unwrap_or(0);
        let endpoints: usize = changed.iter().map(|(_, s)| s.endpoints).sum();
        let named: Vec<&str> = changed.iter().take(8).map(|(n, _)| n.as_str()).collect();
        let common = [
            KeyValue::new("waymark.node", self.name.to_string()),
            KeyValue::new("waymark.services", changed.len() as i64),
            KeyValue::new("waymark.service", named.join(",")),
            KeyValue::new("waymark.endpoints", endpoints as i64),
            KeyValue::new("waymark.view.version", upstream as i64),
        ];
        let mut attributes = common.to_vec();
        attributes.push(KeyValue::new("waymark.xds.hop", "authority_agent"));
        let apply =
            self.telemetry
                .span_from("waymark.xds.apply", Some(received), None, &[], attributes);
        let sync = self.xds.sync_state();
        let clients = sync.len();
        let holders = holders(&sync, &changes.services);
        let mut attributes = common.to_vec();
        attributes.push(KeyValue::new("waymark.xds.hop", "agent_sidecar"));
        attributes.push(KeyValue::new("waymark.xds.served_version", served as i64));
        attributes.push(KeyValue::new("waymark.xds.clients", clients as i64));
        let send = self
            .telemetry
            .span("waymark.xds.send", Some(&apply.context()), &[], attributes);
        // The sidecars' acknowledgements of this release, under its send: the span ends
        // when every client holding one of the changed services has acknowledged it (or
        // at the wait's end).
        let mut attributes = common.to_vec();
        attributes.push(KeyValue::new("waymark.xds.served_version", served as i64));
        self.acks.sent(
            released_at,
            SystemTime::now(),
            &send.context(),
            holders,
            attributes,
        );
        send.end();
        apply.end();
    }

    /// Publish the view to sidecars, DNS and the LRS address book.
    pub(super) fn publish(&self, view: &LocalView, changes: &Changes) {
        for name in &changes.refused {
            let reason = view
                .states()
                .find(|(n, _)| *n == name)
                .map_or("removed", |(_, s)| {
                    if s.undecodable {
                        "undecodable"
                    } else {
                        "empty"
                    }
                });
            self.metrics
                .views_refused
                .get_or_create(&RefusalLabels {
                    service: name.clone(),
                    reason: reason.to_owned(),
                })
                .inc();
        }
        if changes.is_empty() {
            return;
        }
        let snapshot = view.snapshot();
        // Durable before served: a restarted agent must serve above any version a
        // sidecar already holds.
        let hw = self.high_water.load(std::sync::atomic::Ordering::SeqCst);
        if snapshot.version > hw {
            match cache::served_high_water(self.store.as_ref(), snapshot.version) {
                Ok(()) => self
                    .high_water
                    .store(snapshot.version, std::sync::atomic::Ordering::SeqCst),
                Err(e) => {
                    tracing::error!(error = %e, version = snapshot.version, "cannot record the served version; not serving it");
                    return;
                }
            }
        }
        self.publisher.publish(snapshot);
        self.dns
            .store(Arc::new(DnsTable::build(view.assignments())));
        self.lrs.set_assignments(view.assignments());
        for (name, s) in view.states() {
            self.metrics
                .held_back_endpoints
                .get_or_create(&ServiceLabels {
                    service: name.clone(),
                })
                .set(s.held_back as i64);
        }
        self.metrics.views_published.inc();
    }

    /// The served view, for the API.
    pub(crate) fn status(&self) -> ViewStatus {
        let view = self.lock_view();
        let age = SystemTime::now()
            .duration_since(
                *self
                    .confirmed_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            )
            .unwrap_or_default()
            .as_secs_f64();
        ViewStatus {
            upstream_connected: *self.connected.borrow(),
            started_from: self.started_from,
            age_seconds: age,
            services: view
                .states()
                .map(|(n, s): (&String, &ServiceState)| ServiceStatus {
                    service: n.clone(),
                    upstream_version: s.upstream_version.clone(),
                    served_version: s.served_version,
                    endpoints: s.endpoints,
                    held_back: s.held_back,
                    refused_empty: s.refused_empty,
                    undecodable: s.undecodable,
                })
                .collect(),
        }
    }

    /// Gossip members, if this agent gossips.
    pub(crate) fn members(&self) -> Option<Vec<MemberState>> {
        self.gossip.as_ref().map(|g| g.borrow().clone())
    }

    /// The registry as OpenMetrics (ending `# EOF`); [`crate::metrics::negotiate`] turns
    /// it into the Prometheus text format for scrapers that do not ask for it.
    pub(crate) fn openmetrics(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }

    /// The main loop ticked recently (liveness is process-internal only).
    pub(crate) fn alive(&self) -> bool {
        self.heartbeat
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
            < Duration::from_secs(10)
    }
}

/// The clients holding the endpoints of one of `services` (each service's load
/// assignment is named after it): those a release of them is sent to.
fn holders(clients: &[waymark_xds::sync::ClientSync], services: &BTreeSet<String>) -> usize {
    clients
        .iter()
        .filter(|c| {
            c.types
                .get(waymark_xds::translate::TYPE_ENDPOINT)
                .and_then(|t| t.held.as_ref())
                .is_some_and(|held| held.keys().any(|name| services.contains(name)))
        })
        .count()
}
