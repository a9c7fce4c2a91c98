//! The node agent's local HTTP API.
//!
//! | route | what |
//! |---|---|
//! | `GET /livez` | the agent's own loop is turning (process-internal only: a dead authority never fails it) |
//! | `GET /readyz` | a view is loaded and served locally (instance-local only) |
//! | `GET /metrics` | Prometheus text exposition; OpenMetrics when `Accept` asks for `application/openmetrics-text` |
//! | `GET /v1/view` | the served view per service: versions, held-back endpoints, refusals, age |
//! | `GET /v1/members` | the gossip pool as this agent sees it |
//! | `GET /v1/probes/refused` | assigned probe targets the address policy refused, with the class of address |
//! | `GET /v1/clients` | this agent's xDS clients (the host's sidecars): versions sent and acknowledged, NACKs, the view's age |
//! | `GET /v1/clients/{client}/config` | what one client holds: clusters, endpoints with weights, health and markers |
//!
//! Served by [`crate::listener::serve`] with its local bounds (over TLS off loopback); no
//! route takes a body, so every body limit is the smallest. Who may read what:
//! [`super::api_auth`] (the probes answer anyone; the rest needs a bearer token whenever
//! `[agent.listen] http_tokens_file` is set, and it must be off loopback).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use waymark_core::model::NodeName;

use super::api_auth::LocalTokens;
use super::shared::Shared;
use crate::evidence::SidecarReportBody;

/// Body limit of every route (none reads one).
const BODY_MAX: usize = 1024;

pub(crate) fn router(shared: Arc<Shared>, tokens: Option<Arc<LocalTokens>>) -> axum::Router {
    // The probes: anyone (a kubelet, a load balancer); they tell only whether it serves.
    let probes = axum::Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz));
    let mut guarded = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/view", get(view))
        .route("/v1/members", get(members))
        .route("/v1/probes/refused", get(probes_refused))
        .route("/v1/clients", get(clients))
        .route("/v1/clients/{client}/config", get(client_config))
        // Inside the guard: an unknown path is refused to a stranger, not confirmed absent.
        .fallback(not_found);
    if let Some(tokens) = tokens {
        guarded = guarded.layer(axum::middleware::from_fn_with_state(
            tokens,
            super::api_auth::require_token,
        ));
    }
    probes
        .merge(guarded)
        // No route reads a body.
        .layer(axum::extract::DefaultBodyLimit::max(BODY_MAX))
        .with_state(shared)
}

async fn not_found() -> Response {
    let body = json!({"error": {"reason": "not_found", "message": "no such route"}});
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

async fn livez(State(s): State<Arc<Shared>>) -> Response {
    if s.alive() {
        (StatusCode::OK, "alive\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the agent's loop has stalled\n",
        )
            .into_response()
    }
}

async fn readyz(State(s): State<Arc<Shared>>) -> Response {
    // Ready as soon as something is served: the cache counts (that is the point of it).
    let status = s.status();
    if status.services.is_empty() && !status.upstream_connected {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no view yet: the cache was empty and the upstream has not answered\n",
        )
            .into_response()
    } else {
        (StatusCode::OK, "ready\n").into_response()
    }
}

async fn metrics(State(s): State<Arc<Shared>>, headers: axum::http::HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = crate::metrics::negotiate(accept, s.openmetrics());
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn view(State(s): State<Arc<Shared>>) -> Response {
    axum::Json(s.status()).into_response()
}

async fn members(State(s): State<Arc<Shared>>) -> Response {
    match s.members() {
        Some(list) => {
            let members: Vec<_> = list
                .iter()
                .map(|m| {
                    json!({
                        "name": m.id.name.as_str(),
                        "addr": m.id.addr.to_string(),
                        "zone": m.id.zone.as_str(),
                        "role": format!("{:?}", m.id.role).to_lowercase(),
                        "state": format!("{:?}", m.state).to_lowercase(),
                        "local": m.local,
                    })
                })
                .collect();
            axum::Json(json!({"node": s.name.as_str(), "members": members})).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": {"reason": "no_gossip", "message": "this agent is not in a gossip pool (no [agent.gossip])"}})),
        )
            .into_response(),
    }
}

async fn probes_refused(State(s): State<Arc<Shared>>) -> Response {
    let refused = s
        .probe_refusals
        .get()
        .map(|r| r.borrow().clone())
        .unwrap_or_default();
    axum::Json(json!({"refused": refused})).into_response()
}

/// `GET /v1/clients`: the sidecar report as it would be sent upstream now.
#[derive(Debug, serde::Serialize)]
struct Clients {
    /// This node.
    node: NodeName,
    /// The report, as the authority's `GET /v1/proxy-status/sidecars` shows it too.
    #[serde(flatten)]
    report: SidecarReportBody,
}

/// The sidecar report as it would be sent upstream now, with the node's name; keys in
/// name order, as when the body was built as a `Value`.
async fn clients(State(s): State<Arc<Shared>>) -> Response {
    let report = super::sidecars::report(&s, tokio::time::Instant::now());
    let body = Clients {
        node: s.name.clone(),
        report: report.body(std::time::Duration::ZERO),
    };
    axum::Json(serde_json::to_value(body).unwrap_or_default()).into_response()
}

async fn client_config(State(s): State<Arc<Shared>>, Path(client): Path<String>) -> Response {
    match super::sidecars::config(&s, &client, tokio::time::Instant::now()) {
        Some(doc) => axum::Json(doc).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": {"reason": "unknown_client", "message": format!("no xDS client {client} is connected to this agent")}})),
        )
            .into_response(),
    }
}
