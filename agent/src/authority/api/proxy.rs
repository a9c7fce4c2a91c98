//! The sidecars behind the node agents: `GET /v1/proxy-status/sidecars` (every node's
//! latest report of its own xDS clients) and `GET /v1/proxy-config/{node}/{client}` (what
//! one client holds, asked of its node agent over the node's evidence session).
//!
//! Both are leader-only (a follower redirects): node agents hold their evidence session
//! with the leader, so the reports and the sessions to ask are there (see
//! `authority/sidecars.rs`). `GET /v1/proxy-status` stays member-local: it lists the
//! agents this member's xDS tier serves.

use std::borrow::Cow;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use waymark_core::model::NodeName;

use super::{ApiError, ApiResult, ApiState, ok, parse_name};
use crate::authority::sidecars::{AskError, SidecarsHandle};
use crate::evidence::{CLIENT_ID_BYTES_MAX, ClientConfigBody, SidecarReportBody};

impl ApiState {
    /// Serve the sidecar routes from the evidence hub's reports and broker.
    pub fn with_sidecars(mut self, sidecars: SidecarsHandle) -> Self {
        self.setup().sidecars = sidecars;
        self
    }
}

/// `GET /v1/proxy-status/sidecars`: every node's latest report.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct SidecarNodes {
    /// In node name order.
    nodes: Vec<SidecarNode>,
}

/// One node's latest report of its own xDS clients.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct SidecarNode {
    node: NodeName,
    /// Whether the node's evidence session is open now (`proxy-config` can ask it).
    session_open: bool,
    /// How long ago the report arrived.
    reported_ms_ago: u64,
    /// The report, as the node agent's own `GET /v1/clients` shows it.
    #[serde(flatten)]
    report: SidecarReportBody,
}

/// What one xDS client holds, as its node agent answers (`GET /v1/clients/{client}/config`
/// on the node): relayed as the node sent it, never read here, so its schema is the
/// document's the node builds ([`ClientConfigBody`]).
#[derive(Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub(super) struct ProxyConfig(Map<String, Value>);

impl JsonSchema for ProxyConfig {
    fn schema_name() -> Cow<'static, str> {
        ClientConfigBody::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        ClientConfigBody::schema_id()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        ClientConfigBody::json_schema(generator)
    }
}

/// Every node's latest report, in node name order, with its durations brought up to
/// now; reports not refreshed within their TTL are gone.
pub(super) async fn sidecars(State(s): State<ApiState>, uri: Uri) -> ApiResult<Response> {
    s.leader_only(&uri)?;
    let nodes: Vec<SidecarNode> = {
        let mut reports = s.sidecars.reports();
        // The hub stamps reports on tokio's clock, under this lock; read the same one, under
        // it too, so that the core sees time in order.
        let now = tokio::time::Instant::now().into_std();
        reports.handle_timeout(now);
        reports
            .reports()
            .map(|(node, held)| {
                let since = now.saturating_duration_since(held.received);
                SidecarNode {
                    node: node.clone(),
                    session_open: held.session_open,
                    reported_ms_ago: millis(since),
                    report: held.report.body(since),
                }
            })
            .collect()
    };
    Ok(ok(&SidecarNodes { nodes }))
}

/// What `client` of `node` holds, as its node agent answers (the document its own
/// `GET /v1/clients/{client}/config` serves).
pub(super) async fn proxy_config(
    State(s): State<ApiState>,
    uri: Uri,
    Path((node, client)): Path<(String, String)>,
) -> ApiResult<Response> {
    s.leader_only(&uri)?;
    let node: NodeName = parse_name(&node, "node").map_err(|e| s.refuse(e))?;
    if client.is_empty() || client.len() > CLIENT_ID_BYTES_MAX {
        return Err(s.refuse(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_name",
            Some("client"),
            format!("client: an xDS node id of 1 to {CLIENT_ID_BYTES_MAX} bytes"),
        )));
    }
    let refusal = |status, reason, message: String| ApiError::new(status, reason, None, message);
    match s.sidecars.broker.ask(&node, &client).await {
        Ok(Some(Value::Object(document))) => Ok(ok(&ProxyConfig(document))),
        Ok(Some(other)) => Ok(ok(&other)),
        Ok(None) => Err(refusal(
            StatusCode::NOT_FOUND,
            "unknown_client",
            format!("node {node} has no xDS client {client} connected"),
        )),
        Err(e @ AskError::NotConnected(_)) => Err(refusal(
            StatusCode::NOT_FOUND,
            "unknown_node",
            format!("{e}: it is not running, or is reconnecting"),
        )),
        Err(e @ AskError::Timeout(_)) => Err(refusal(
            StatusCode::GATEWAY_TIMEOUT,
            "node_timeout",
            e.to_string(),
        )),
        Err(e) => Err(refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "node_unavailable",
            e.to_string(),
        )),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
