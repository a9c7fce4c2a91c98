//! Prometheus HTTP service discovery: `GET /v1/prometheus/sd` answers in the
//! `http_sd_configs` format, one target group per endpoint, so each carries its own labels:
//!
//! ```text
//! [{"targets": ["10.0.0.12:8080"],
//!   "labels": {"__meta_waymark_service": "web", "__meta_waymark_zone": "az1", …}}]
//! ```
//!
//! It lists the endpoints of this region in the published views — what callers route to,
//! not the registry — of every service or of one (`?service=`), eligible ones only unless
//! the query names verdicts; the other filters of [`super::query`] apply. It is a blocking
//! query like the view routes (Prometheus itself polls at its `refresh_interval`), and is
//! authorised as every route is: a bearer token or a client certificate with `read`, which
//! `http_sd_configs` sends with `authorization` and `tls_config`.
//!
//! Labels: `service`, `instance`, `region`, `zone`, `verdict`, `status`, `weight`, `tags`
//! (comma-joined with a comma at each end, as Prometheus's Consul discovery does, so
//! `.*,canary,.*` matches a tag), `evidence` and `verified` where the endpoint states its
//! capability, and `metadata_<key>` for each metadata entry (characters a label name cannot
//! hold become `_`), each under `__meta_waymark_`.

use std::collections::BTreeMap;

use axum::Extension;
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use waymark_core::model::{InstanceId, ServiceName};
use waymark_core::view::ViewEndpoint;

use super::blocking::{self, Reads};
use super::params::{DiscoveryParams, QueryParams};
use super::{ApiResult, ApiState};
use crate::listener::RequestDeadline;

/// The prefix of every label this discovery sets.
pub const LABEL_PREFIX: &str = "__meta_waymark_";

/// One `http_sd_configs` target group: one endpoint and its labels.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct TargetGroup {
    /// The endpoint's address, `host:port`.
    targets: Vec<String>,
    /// `__meta_waymark_*` labels.
    labels: BTreeMap<String, String>,
}

/// `GET /v1/prometheus/sd`.
pub(super) async fn prometheus_sd(
    State(s): State<ApiState>,
    uri: Uri,
    deadline: Option<Extension<RequestDeadline>>,
) -> ApiResult<Response> {
    let q = s.list_query(&uri, DiscoveryParams::NAMES, None)?;
    let filter = q.filter.or_passing();
    let reads = q.service.as_ref().map_or(Reads::AllViews, Reads::Views);
    let index = blocking::wait(&s.indices, reads, q.blocking, deadline.as_deref()).await;
    let groups: Vec<TargetGroup> = s.raft.with_state(|state, _| {
        // Each service's views (one per caller zone) hold the same endpoints: one each.
        let mut endpoints: BTreeMap<(&ServiceName, &InstanceId), &ViewEndpoint> = BTreeMap::new();
        for (key, view) in state.published() {
            if q.service.as_ref().is_some_and(|svc| svc != &key.service) {
                continue;
            }
            for (id, e) in view.view.endpoints.iter() {
                if e.region == s.region && filter.matches_endpoint(e) {
                    endpoints.entry((&key.service, id)).or_insert(e);
                }
            }
        }
        endpoints
            .into_iter()
            .map(|((service, _), e)| target_group(service, e))
            .collect()
    });
    Ok(blocking::with_index(
        axum::Json(groups).into_response(),
        index,
    ))
}

/// One endpoint as a target group.
fn target_group(service: &ServiceName, e: &ViewEndpoint) -> TargetGroup {
    let mut labels = BTreeMap::new();
    let mut label = |name: &str, value: String| {
        labels.insert(format!("{LABEL_PREFIX}{name}"), value);
    };
    label("service", service.to_string());
    label("instance", e.instance.to_string());
    label("region", e.region.to_string());
    label("zone", e.zone.to_string());
    label("verdict", e.verdict.as_str().to_owned());
    let status = serde_json::to_value(e.status).ok();
    label(
        "status",
        status
            .as_ref()
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned(),
    );
    label("weight", e.weight.get().to_string());
    let tags: Vec<&str> = e.tags.iter().map(String::as_str).collect();
    label(
        "tags",
        if tags.is_empty() {
            String::new()
        } else {
            format!(",{},", tags.join(","))
        },
    );
    if let Some(c) = e.capability {
        label("evidence", c.evidence.label().to_owned());
        label("verified", c.verified.to_string());
    }
    for (key, value) in e.metadata.iter() {
        label(&format!("metadata_{}", label_name(key)), value.clone());
    }
    TargetGroup {
        targets: vec![e.address.to_string()],
        labels,
    }
}

/// `key` as the tail of a label name: `[a-zA-Z0-9_]`, anything else `_`.
fn label_name(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_keys_become_label_names() {
        assert_eq!(label_name("team.name-x/y"), "team_name_x_y");
        assert_eq!(label_name("ok_1"), "ok_1");
    }
}
