//! The member's own state and operation: probes (`/livez`, `/readyz`), `GET /v1/status`,
//! Raft membership (`GET /v1/operator/raft/peers`, `POST /v1/operator/raft/members`,
//! `DELETE /v1/operator/raft/members/{id}`), `GET /v1/federation/status`,
//! `GET /v1/reconciliation`, `GET /v1/proxy-status` and `/metrics`. Everything but
//! membership changes is member-local: each member answers from what it holds.

use std::collections::BTreeMap;
use std::sync::PoisonError;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use waymark_core::model::ServiceName;
use waymark_registry::acl::Action;

use super::{ApiError, ApiResult, ApiState, Body};
use crate::authority::principal::Caller;
use crate::authority::regions;

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

pub(super) async fn status(State(s): State<ApiState>) -> impl IntoResponse {
    let leader = s
        .raft
        .leader()
        .map(|(id, m)| json!({"id": id, "api": m.api_addr}));
    axum::Json(json!({
        "region": s.region,
        "leader": leader,
        "is_leader": s.raft.is_leader(),
        "term": s.raft.current_term(),
    }))
}

/// This member's federation: per peer region (links up, age, staleness, versions held),
/// per link, and the front-door signal. Member-local: each member has its own links.
pub(super) async fn federation_status(State(s): State<ApiState>) -> impl IntoResponse {
    let Some(node) = &s.federation else {
        return axum::Json(json!({"region": s.region, "enabled": false}));
    };
    let front_doors = s.regions.as_ref().map(|r| regions::front_doors(&r.signal));
    let local_versions: BTreeMap<ServiceName, u64> = s
        .regions
        .as_ref()
        .map(|r| regions::versions_of(&r.aggregates, &s.region))
        .unwrap_or_default();
    axum::Json(json!({
        "region": s.region,
        "enabled": true,
        "endpoint": node.local_addr(),
        "local_versions": local_versions,
        "regions": node.regions(),
        "links": node.status(),
        "front_doors": front_doors,
    }))
}

pub(super) async fn peers(State(s): State<ApiState>) -> impl IntoResponse {
    axum::Json(s.raft.peers())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddMember {
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

pub(super) async fn reconciliation(State(s): State<ApiState>) -> impl IntoResponse {
    let diff = s
        .reconciliation
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    axum::Json(diff)
}

pub(super) async fn proxy_status(State(s): State<ApiState>) -> impl IntoResponse {
    // The tier stamps `connected_since` on tokio's clock; read the same one.
    let now = tokio::time::Instant::now().into_std();
    let clients: Vec<Value> = s
        .xds
        .sync_state()
        .into_iter()
        .map(|c| {
            let types: BTreeMap<String, Value> = c
                .types
                .iter()
                .map(|(t, ty)| {
                    let short = t.rsplit('.').next().unwrap_or(t).to_owned();
                    (short, json!({"sent": ty.sent, "acked": ty.acked, "in_sync": ty.sent == ty.acked, "nacks": ty.nacks, "last_nack": ty.last_nack.as_ref().map(|(v, e)| json!({"version": v, "error": e})), "resources": ty.resources}))
                })
                .collect();
            json!({
                "node": c.node_id, "zone": c.zone, "protocol": c.protocol, "identity": c.identity,
                "standby": !crate::authority::staleness::holds_anything(&c),
                "connected_for_ms": now.saturating_duration_since(c.connected_since).as_millis() as u64,
                "types": types,
            })
        })
        .collect();
    axum::Json(clients)
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
