//! The member's own state and operation: probes (`/livez`, `/readyz`), `GET /v1/status`,
//! Raft membership (`GET /v1/operator/raft/peers`, `POST /v1/operator/raft/members`,
//! `DELETE /v1/operator/raft/members/{id}`), `GET /v1/federation/status`,
//! `GET /v1/reconciliation`, `GET /v1/proxy-status` and `/metrics`. Everything but
//! membership changes is member-local: each member answers from what it holds.

use std::collections::BTreeMap;
use std::sync::PoisonError;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use waymark_core::model::{RegionName, ServiceName};
use waymark_federation::signal::FrontDoor;
use waymark_federation_quic::{PeerStatus as LinkStatus, RegionStatus};
use waymark_registry::acl::Action;

use super::{ApiError, ApiResult, ApiState, Body, ok};
use crate::authority::kube::ReconcileStatus;
use crate::authority::principal::Caller;
use crate::authority::raft::PeerStatus;
use crate::authority::regions;

/// `GET /v1/status`: this member.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Status {
    /// The region this member serves.
    region: RegionName,
    /// The leader this member knows of; `null` during an election.
    leader: Option<LeaderRef>,
    /// Whether this member leads.
    is_leader: bool,
    /// The Raft term this member is in.
    term: u64,
}

/// A Raft member by id and API address.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct LeaderRef {
    id: u64,
    /// Its API listener, host:port.
    api: String,
}

/// `GET /v1/federation/status`: this member's federation links. Without federation, only
/// `region` and `enabled: false`.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct FederationStatus {
    region: RegionName,
    /// Whether this member runs a federation endpoint.
    enabled: bool,
    #[serde(flatten)]
    links: Option<FederationLinks>,
}

/// A running federation endpoint's state.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct FederationLinks {
    /// Its QUIC endpoint, host:port.
    endpoint: String,
    /// The versions of this region's own aggregates it serves, by service.
    local_versions: BTreeMap<ServiceName, u64>,
    /// Per peer region, summed over its members' links.
    regions: Vec<RegionStatus>,
    /// Per peer member's link.
    links: Vec<LinkStatus>,
    /// The front-door signal per peer region; `null` without region routing.
    front_doors: Option<BTreeMap<RegionName, FrontDoor>>,
}

/// One xDS client of this member's tier (`GET /v1/proxy-status`).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct ProxyClient {
    /// The client's xDS node id.
    node: String,
    /// The zone it declared.
    zone: String,
    /// `delta` or `sotw`.
    protocol: String,
    /// The identity its certificate proved, if any.
    identity: Option<String>,
    /// Holds nothing yet (a standby upstream of a node agent).
    standby: bool,
    /// Since its stream opened, in ms.
    connected_for_ms: u64,
    /// Per resource type (its short name): what was sent and acknowledged.
    types: BTreeMap<String, TypeSync>,
}

/// One resource type of an xDS client.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct TypeSync {
    /// The version last sent.
    sent: Option<String>,
    /// The version last acknowledged.
    acked: Option<String>,
    /// `sent == acked`.
    in_sync: bool,
    /// Rejections so far.
    nacks: u64,
    /// The last rejection: the version and Envoy's error.
    last_nack: Option<Nack>,
    /// Resources held.
    resources: usize,
}

/// A rejected version, with the client's error.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Nack {
    version: String,
    error: String,
}

/// Liveness, process-internal only: this handler runs and the Raft core is running. No
/// peer, leader or quorum is consulted, so a partition never restarts a member.
pub(super) async fn livez(State(s): State<ApiState>) -> Response {
    if s.raft.watch_metrics().has_changed().is_ok() {
        (StatusCode::OK, "alive\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the Raft core has stopped\n",
        )
            .into_response()
    }
}

/// Readiness, member-local only: the Raft core runs and this member has applied committed
/// state, so its xDS tier and reads serve it. A leader or quorum is not required — a
/// member cut off from the others still serves what it has.
pub(super) async fn readyz(State(s): State<ApiState>) -> Response {
    let metrics = s.raft.watch_metrics();
    if metrics.has_changed().is_err() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the Raft core has stopped\n",
        )
            .into_response();
    }
    if let Some(failure) = s.raft.apply_failures().first() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the committed entry at index {} failed to apply ({}); this member keeps serving; see docs/robustness.md, \"A committed entry failed to apply\"\n",
                failure.index, failure.message
            ),
        )
            .into_response();
    }
    if metrics.borrow().last_applied.is_none() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "no committed state applied yet (not initialised, or still joining)\n",
        )
            .into_response();
    }
    (StatusCode::OK, "ready\n").into_response()
}

pub(super) async fn status(State(s): State<ApiState>) -> Response {
    let leader = s.raft.leader().map(|(id, m)| LeaderRef {
        id,
        api: m.api_addr,
    });
    ok(&Status {
        region: s.region.clone(),
        leader,
        is_leader: s.raft.is_leader(),
        term: s.raft.current_term(),
    })
}

/// This member's federation: per peer region (links up, age, staleness, versions held),
/// per link, and the front-door signal. Member-local: each member has its own links.
pub(super) async fn federation_status(State(s): State<ApiState>) -> Response {
    let Some(node) = &s.federation else {
        return ok(&FederationStatus {
            region: s.region.clone(),
            enabled: false,
            links: None,
        });
    };
    let front_doors = s.regions.as_ref().map(|r| regions::front_doors(&r.signal));
    let local_versions: BTreeMap<ServiceName, u64> = s
        .regions
        .as_ref()
        .map(|r| regions::versions_of(&r.aggregates, &s.region))
        .unwrap_or_default();
    ok(&FederationStatus {
        region: s.region.clone(),
        enabled: true,
        links: Some(FederationLinks {
            endpoint: node.local_addr().to_string(),
            local_versions,
            regions: node.regions(),
            links: node.status(),
            front_doors,
        }),
    })
}

pub(super) async fn peers(State(s): State<ApiState>) -> Json<Vec<PeerStatus>> {
    axum::Json(s.raft.peers())
}

/// `POST /v1/operator/raft/members`: a member to add, as a learner first, then a voter.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AddMember {
    /// Its member id, unique in the region.
    id: u64,
    /// The member's API listener.
    addr: String,
    /// The member's Raft listener.
    raft: String,
}

pub(super) async fn add_member(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    s.allow(
        &caller,
        Action::Raft,
        "POST /v1/operator/raft/members",
        None,
    )?;
    s.leader_only(&uri)?;
    let m: AddMember = s.body(&body)?;
    // An IP or a DNS name: a StatefulSet member keeps its name, not its IP, across
    // restarts, and the Raft client resolves the name at each connection.
    for (field, value, what) in [("addr", &m.addr, "API"), ("raft", &m.raft, "Raft")] {
        if let Err(e) = value.parse::<crate::net::HostPort>() {
            return Err(s.refuse(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_address",
                Some(field),
                format!("{field}: host:port of the member's {what} listener (IP or DNS name): {e}"),
            )));
        }
    }
    if m.addr == m.raft {
        return Err(s.refuse(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_address",
            Some("raft"),
            "raft: the Raft listener is not the API listener",
        )));
    }
    let member = crate::authority::raft::Member {
        raft_addr: m.raft,
        api_addr: m.addr,
    };
    s.raft.add_member(m.id, member).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "membership",
            Some("id"),
            e.to_string(),
        )
    })?;
    Ok(axum::Json(s.raft.peers()).into_response())
}

pub(super) async fn remove_member(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(id): Path<u64>,
) -> ApiResult<Response> {
    s.allow(
        &caller,
        Action::Raft,
        "DELETE /v1/operator/raft/members",
        None,
    )?;
    s.leader_only(&uri)?;
    s.raft.remove_member(id).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "membership",
            Some("id"),
            e.to_string(),
        )
    })?;
    Ok(axum::Json(s.raft.peers()).into_response())
}

/// `GET /v1/reconciliation`: the reconciler's latest status; `null` until it has run.
pub(super) type Reconciliation = Option<ReconcileStatus>;

pub(super) async fn reconciliation(State(s): State<ApiState>) -> Response {
    let diff: Reconciliation = s
        .reconciliation
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    ok(&diff)
}

pub(super) async fn proxy_status(State(s): State<ApiState>) -> Response {
    // The tier stamps `connected_since` on tokio's clock; read the same one.
    let now = tokio::time::Instant::now().into_std();
    let clients: Vec<ProxyClient> = s
        .xds
        .sync_state()
        .into_iter()
        .map(|c| {
            let types: BTreeMap<String, TypeSync> = c
                .types
                .iter()
                .map(|(t, ty)| {
                    let short = t.rsplit('.').next().unwrap_or(t).to_owned();
                    let sync = TypeSync {
                        sent: ty.sent.clone(),
                        acked: ty.acked.clone(),
                        in_sync: ty.sent == ty.acked,
                        nacks: ty.nacks,
                        last_nack: ty.last_nack.as_ref().map(|(v, e)| Nack {
                            version: v.clone(),
                            error: e.clone(),
                        }),
                        resources: ty.resources,
                    };
                    (short, sync)
                })
                .collect();
            ProxyClient {
                standby: !crate::authority::staleness::holds_anything(&c),
                connected_for_ms: u64::try_from(
                    now.saturating_duration_since(c.connected_since).as_millis(),
                )
                .unwrap_or(u64::MAX),
                node: c.node_id,
                zone: c.zone,
                protocol: c.protocol.to_owned(),
                identity: c.identity,
                types,
            }
        })
        .collect();
    ok(&clients)
}

pub(super) async fn metrics(State(s): State<ApiState>, headers: HeaderMap) -> impl IntoResponse {
    // The xDS tier's gauges are sampled once a second by `staleness::run`, not per scrape.
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &s.registry) {
        return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response();
    }
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    if openmetrics {
        let ct = "application/openmetrics-text; version=1.0.0; charset=utf-8";
        ([(header::CONTENT_TYPE, ct)], text).into_response()
    } else {
        let ct = "text/plain; version=0.0.4; charset=utf-8";
        let body = crate::metrics::to_prometheus_text(&text);
        ([(header::CONTENT_TYPE, ct)], body).into_response()
    }
}
