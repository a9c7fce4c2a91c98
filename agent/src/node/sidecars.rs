//! The node agent's own xDS clients (its host's sidecars), for `proxy-status` and
//! `proxy-config`: what each was sent, acknowledged and rejected, and what it holds.
//!
//! ```text
//! local xDS server ──sync state──► report_loop ──watch──► evidence session ──► authority
//!                  └─held versions + snapshot──► config(client) ◄── config_request
//!                                                              └──► GET /v1/clients/{c}/config
//! ```
//!
//! The report is made every [`REPORT_CHECK`] and handed to the evidence session only when
//! it changed (a client came or went, a version was sent, acknowledged or rejected, or the
//! view's age moved away from what the last report implies) or [`REPORT_REFRESH`] passed,
//! so the authority hears of a change within a second and never once per xDS message.
//! Bounds: at most [`SIDECAR_CLIENTS_MAX`] clients and [`SIDECAR_REPORT_BYTES_MAX`] per
//! report (unsynced clients first, so a problem is never the one left out; the rest are
//! counted in `clients_left_out` and `waymark_agent_sidecar_clients_left_out`), every
//! string cut to its wire bound, and at most [`CONFIG_ENDPOINTS_MAX`] endpoints and
//! [`CLIENT_CONFIG_BYTES_MAX`] bytes in one client's configuration.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::google::protobuf::value::Kind;
use prost::Message as _;
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;
use waymark_core::model::ZoneName;
use waymark_xds::snapshot::Resources;
use waymark_xds::sync::ClientSync;
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT, endpoint_socket, metadata_field};

use super::shared::Shared;
use crate::evidence::{
    CLIENT_CONFIG_BYTES_MAX, CLIENT_ID_BYTES_MAX, ClientConfigBody, HeldAssignment, HeldCluster,
    HeldEndpoint, IDENTITY_BYTES_MAX, LABEL_BYTES_MAX, Marker, NACK_ERROR_BYTES_MAX, Nack,
    SIDECAR_CLIENTS_MAX, SIDECAR_REPORT_BYTES_MAX, SIDECAR_TYPES_MAX, SidecarClient, SidecarReport,
    TYPE_URL_BYTES_MAX, TypeSync, VERSION_BYTES_MAX, XdsProtocol, clipped,
};

/// How often the report is made and compared with the last one sent.
pub(crate) const REPORT_CHECK: Duration = Duration::from_secs(1);
/// A report is sent at least this often, changed or not: the authority forgets a node
/// that has not reported for three of these.
pub(crate) const REPORT_REFRESH: Duration = Duration::from_secs(30);
/// The view's age may drift this far from what the last report implies before it counts
/// as a change (it grows by itself; the authority adds the time since the report).
const AGE_DRIFT_MAX: Duration = Duration::from_secs(5);
/// Endpoints listed in one client's configuration, at most; the clusters past them are
/// listed without their endpoints, and the endpoints left out are counted.
pub(crate) const CONFIG_ENDPOINTS_MAX: usize = 2_048;
/// Shown for a client that declared no node id (the wire needs one).
const UNNAMED: &str = "(unnamed)";

/// The report and the configurations, as the evidence session reads them.
#[derive(Clone)]
pub(crate) struct SidecarFeed {
    /// The latest report; changes when it should be sent.
    pub(crate) reports: watch::Receiver<SidecarReport>,
    pub(crate) shared: Arc<Shared>,
}

/// Make the report every [`REPORT_CHECK`]; publish it when it changed or is due.
pub(crate) async fn report_loop(shared: Arc<Shared>, reports: watch::Sender<SidecarReport>) {
    let mut tick = tokio::time::interval(REPORT_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent_at: Option<Instant> = None;
    loop {
        tick.tick().await;
        let now = Instant::now();
        let next = report(&shared, now);
        let send = match sent_at {
            None => true,
            Some(at) => {
                let since = now.saturating_duration_since(at);
                since >= REPORT_REFRESH || differs(&reports.borrow(), &next, since)
            }
        };
        if send {
            shared
                .metrics
                .sidecar_clients_left_out
                .set(i64::from(next.clients_left_out));
            reports.send_replace(next);
            sent_at = Some(now);
        }
    }
}

/// The node's clients now, within the report's bounds.
pub(crate) fn report(shared: &Shared, now: Instant) -> SidecarReport {
    let now = now.into_std();
    let clients = shared.xds.map_clients(|c| client_of(c, now));
    report_of(clients, Some(view_age(shared)), SIDECAR_CLIENTS_MAX)
}

/// `clients` within `max` of them and [`SIDECAR_REPORT_BYTES_MAX`]: the unsynced first (a
/// problem is never the one left out), then by stream; the rest counted.
pub(crate) fn report_of(
    mut clients: Vec<SidecarClient>,
    view_age: Option<Duration>,
    max: usize,
) -> SidecarReport {
    clients.sort_by_key(|c| (c.state() == "SYNCED", c.stream_id));
    // Room for the report's own fields (the age, the count), then whole clients.
    let mut room = SIDECAR_REPORT_BYTES_MAX - 32;
    let fits = clients
        .iter()
        .take(max)
        .take_while(|c| match room.checked_sub(c.encoded_len()) {
            Some(left) => {
                room = left;
                true
            }
            None => false,
        })
        .count();
    let left_out = clients.len() - fits;
    clients.truncate(fits);
    SidecarReport {
        view_age,
        clients,
        clients_left_out: u32::try_from(left_out).unwrap_or(u32::MAX),
    }
}

/// Whether `next` says something `last` (made `since` ago) did not: the clients and their
/// versions, or a view age other than the one `last` implies by now.
pub(crate) fn differs(last: &SidecarReport, next: &SidecarReport, since: Duration) -> bool {
    let steady = |r: &SidecarReport| {
        let clients: Vec<SidecarClient> = r
            .clients
            .iter()
            .map(|c| SidecarClient {
                connected_for: Duration::ZERO,
                ..c.clone()
            })
            .collect();
        (clients, r.clients_left_out)
    };
    if steady(last) != steady(next) {
        return true;
    }
    match (last.view_age, next.view_age) {
        (Some(then), Some(now)) => then.saturating_add(since).abs_diff(now) > AGE_DRIFT_MAX,
        (then, now) => then.is_some() != now.is_some(),
    }
}

/// One stream's state as the report carries it, each string cut to its bound.
pub(crate) fn client_of(c: &ClientSync, now: std::time::Instant) -> SidecarClient {
    let client = if c.node_id.is_empty() {
        UNNAMED.to_owned()
    } else {
        clipped(&c.node_id, CLIENT_ID_BYTES_MAX)
    };
    let version = |v: &Option<String>| v.as_deref().map(|v| clipped(v, VERSION_BYTES_MAX));
    let types = c
        .types
        .iter()
        .filter(|(t, _)| !t.is_empty())
        .take(SIDECAR_TYPES_MAX)
        .map(|(t, s)| TypeSync {
            type_url: clipped(t, TYPE_URL_BYTES_MAX),
            sent: version(&s.sent),
            acked: version(&s.acked),
            nacks: s.nacks,
            last_nack: s.last_nack.as_ref().map(|(v, e)| Nack {
                version: clipped(v, VERSION_BYTES_MAX),
                error: clipped(e, NACK_ERROR_BYTES_MAX),
            }),
            resources: s.resources as u64,
        })
        .collect();
    SidecarClient {
        client,
        cluster: clipped(&c.cluster, LABEL_BYTES_MAX),
        zone: clipped(&c.zone, LABEL_BYTES_MAX),
        identity: c
            .identity
            .as_deref()
            .filter(|i| !i.is_empty())
            .map(|i| clipped(i, IDENTITY_BYTES_MAX)),
        protocol: if c.protocol == "sotw" {
            XdsProtocol::Sotw
        } else {
            XdsProtocol::Delta
        },
        stream_id: c.stream_id,
        connected_for: now.saturating_duration_since(c.connected_since),
        types,
    }
}

/// Time since the authority's xDS tier last confirmed the node's view.
fn view_age(shared: &Shared) -> Duration {
    let confirmed = *shared
        .confirmed_at
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    SystemTime::now()
        .duration_since(confirmed)
        .unwrap_or_default()
}

/// What the client `client` holds, as a JSON object of at most
/// [`CLIENT_CONFIG_BYTES_MAX`]; `None` when no client of that node id is connected.
pub(crate) fn config(shared: &Shared, client: &str, now: Instant) -> Option<Value> {
    // A reconnecting client may hold two streams for a moment: its newest speaks for it.
    let sync = shared
        .xds
        .map_clients(|c| (c.node_id == client).then(|| c.clone()))
        .into_iter()
        .flatten()
        .max_by_key(|c| c.stream_id)?;
    let snapshot = shared.xds.snapshot();
    let zone = ZoneName::try_new(&sync.zone).ok();
    let held = |type_url: &str| {
        sync.types
            .get(type_url)
            .and_then(|t| t.held.clone())
            .unwrap_or_default()
    };
    let clusters = clusters_held(&held(TYPE_CLUSTER), &snapshot.clusters);
    let served = snapshot
        .resources(TYPE_ENDPOINT, zone.as_ref())
        .cloned()
        .unwrap_or_default();
    let (endpoints, left_out) = endpoints_held(&held(TYPE_ENDPOINT), &served, CONFIG_ENDPOINTS_MAX);
    let summary = client_of(&sync, now.into_std());
    let doc = ClientConfigBody {
        node: shared.name.to_string(),
        snapshot_version: snapshot.version,
        view_age_ms: u64::try_from(view_age(shared).as_millis()).unwrap_or(u64::MAX),
        clusters,
        endpoints,
        endpoints_left_out: left_out as u64,
        clusters_left_out: None,
        client: summary.body(Duration::ZERO),
    };
    // Through `Value`, as it travels: keys in name order, as when it was built as one.
    serde_json::to_value(within_bound(doc)).ok()
}

/// The clusters a client was sent, and whether each is the version served now.
fn clusters_held(held: &BTreeMap<String, String>, served: &Resources) -> Vec<HeldCluster> {
    held.iter()
        .map(|(name, version)| {
            let now = served.get(name).map(|e| e.version.clone());
            HeldCluster {
                name: name.clone(),
                version: version.clone(),
                current: now.as_ref() == Some(version),
                served_version: now,
            }
        })
        .collect()
}

/// The load assignments a client was sent, each with its endpoints where the version it
/// holds is the one served now (an older version's content is no longer here), up to
/// `max` endpoints in all; returns them and the endpoints left out.
fn endpoints_held(
    held: &BTreeMap<String, String>,
    served: &Resources,
    max: usize,
) -> (Vec<HeldAssignment>, usize) {
    let mut listed = 0usize;
    let mut left_out = 0usize;
    let out = held
        .iter()
        .map(|(name, version)| {
            let now = served.get(name);
            let current = now.is_some_and(|e| &e.version == version);
            let mut entry = HeldAssignment {
                cluster: name.clone(),
                version: version.clone(),
                served_version: now.map(|e| e.version.clone()),
                current,
                health_disregarded: None,
                endpoints: None,
                endpoints_left_out: None,
            };
            let decoded = now
                .filter(|_| current)
                .and_then(|e| ClusterLoadAssignment::decode(e.resource.value.as_slice()).ok());
            if let Some(cla) = decoded {
                let (endpoints, disregarded) = lb_endpoints(&cla);
                entry.health_disregarded = Some(disregarded);
                if listed.saturating_add(endpoints.len()) <= max {
                    listed += endpoints.len();
                    entry.endpoints = Some(endpoints);
                } else {
                    left_out = left_out.saturating_add(endpoints.len());
                    entry.endpoints_left_out = Some(endpoints.len() as u64);
                }
            }
            entry
        })
        .collect();
    (out, left_out)
}

/// A load assignment's endpoints as `proxy-config` shows them (address, priority, zone,
/// weight, Envoy health, waymark's markers), and whether its view disregards health.
fn lb_endpoints(cla: &ClusterLoadAssignment) -> (Vec<HeldEndpoint>, bool) {
    let mut disregarded = false;
    let mut out = Vec::new();
    for group in &cla.endpoints {
        let zone = group.locality.as_ref().map(|l| l.zone.as_str());
        for lb in &group.lb_endpoints {
            let field = |key| match metadata_field(lb.metadata.as_ref(), key) {
                Some(Kind::StringValue(s)) => Some(Marker::Text(s.clone())),
                Some(Kind::BoolValue(b)) => Some(Marker::Flag(*b)),
                _ => None,
            };
            let guard = field("health_disregarded");
            disregarded |= guard == Some(Marker::Flag(true));
            let verified = match metadata_field(lb.metadata.as_ref(), "capability") {
                Some(Kind::StructValue(c)) => {
                    match c.fields.get("verified").and_then(|v| v.kind.as_ref()) {
                        Some(Kind::BoolValue(b)) => Some(*b),
                        _ => None,
                    }
                }
                _ => None,
            };
            let health = HealthStatus::try_from(lb.health_status)
                .map_or("UNKNOWN_VALUE", |h| h.as_str_name());
            out.push(HeldEndpoint {
                address: endpoint_socket(lb)
                    .map(|(ip, port)| std::net::SocketAddr::new(ip, port).to_string())
                    .ok(),
                instance: field("instance"),
                zone: zone.map(str::to_owned),
                priority: group.priority,
                weight: lb.load_balancing_weight.as_ref().map(|w| w.value),
                health: health.to_owned(),
                status: field("status"),
                verdict: field("verdict"),
                verified,
                health_disregarded: guard,
            });
        }
    }
    (out, disregarded)
}

/// `doc` within [`CLIENT_CONFIG_BYTES_MAX`]: over it (very long names), every endpoint
/// list is left out and counted, which leaves the clusters and versions.
fn within_bound(mut doc: ClientConfigBody) -> ClientConfigBody {
    let over = |doc: &ClientConfigBody| {
        serde_json::to_vec(doc).map_or(usize::MAX, |b| b.len()) > CLIENT_CONFIG_BYTES_MAX
    };
    if !over(&doc) {
        return doc;
    }
    for entry in &mut doc.endpoints {
        if let Some(eps) = entry.endpoints.take() {
            doc.endpoints_left_out = doc.endpoints_left_out.saturating_add(eps.len() as u64);
            entry.endpoints_left_out = Some(eps.len() as u64);
        }
    }
    // Still over (tens of thousands of clusters with long names): say so, list nothing.
    if over(&doc) {
        doc.clusters_left_out = Some(doc.clusters.len() as u64);
        doc.clusters.clear();
        doc.endpoints.clear();
    }
    doc
}

#[cfg(test)]
#[path = "sidecars_test.rs"]
mod tests;
