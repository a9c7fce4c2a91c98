//! The query strings of the routes, as types: what the OpenAPI document lists for each
//! route (one parameter per property, its doc the parameter's description) and the only
//! names [`super::query::ListQuery::parse`] accepts for it ([`QueryParams::NAMES`]; a test
//! checks the names against the properties, so the parser and the document agree).
//!
//! The parser stays [`super::query`]'s own: repeated filters, `?passing` without a value
//! and refusals naming the parameter are more than a derived decoder says. So the types'
//! fields are read by the document alone.
#![allow(dead_code)]

use schemars::JsonSchema;
use waymark_core::model::{InstanceId, NodeName, RegionName, ServiceName, ZoneName};

/// A route's query string, described by its type.
pub(super) trait QueryParams: JsonSchema {
    /// The parameters the route takes, in the order refusals list them.
    const NAMES: &'static [&'static str];
}

/// Blocking queries ([`super::blocking`]).
#[derive(Debug, Default, JsonSchema)]
pub(super) struct BlockingParams {
    /// Blocking query: hold the request while this route's X-Waymark-Index equals this
    /// value, until it changes or `wait` passes. 0 or absent: answer at once. An index the
    /// member does not hold (from another member, or from before a restart) is answered at
    /// once.
    pub(super) index: Option<u64>,
    /// Blocking query: the longest hold, as a duration (`30s`, `5m`). Default 5m; above
    /// 10m it is clamped to 10m; up to a sixteenth is added as jitter. Without `index` it
    /// changes nothing but is still checked.
    pub(super) wait: Option<String>,
}

/// Pages, walking the route's sort key ([`super::query::paginate`]).
#[derive(Debug, Default, JsonSchema)]
pub(super) struct PageParams {
    /// One page of at most this many items (1 to 1000), in sort-key order;
    /// X-Waymark-Next-Cursor names the next page. Absent: every item, no cursor.
    #[schemars(range(min = 1, max = 1000))]
    pub(super) limit: Option<usize>,
    /// The X-Waymark-Next-Cursor of the previous page, as it came (opaque). Pages continue
    /// after the last key the previous one held, so items inserted or removed between pages
    /// never show an item twice or hide one present throughout. Needs `limit`.
    pub(super) cursor: Option<String>,
}

/// The filters on instances and endpoints ([`super::query::Filter`]).
#[derive(Debug, Default, JsonSchema)]
pub(super) struct FilterParams {
    /// Only instances or endpoints carrying this tag; repeated, every tag must be carried.
    #[schemars(default)]
    pub(super) tag: Vec<String>,
    /// Only instances or endpoints in this zone; repeated, any of them.
    #[schemars(default)]
    pub(super) zone: Vec<String>,
    /// Only instances or endpoints with this verdict; repeated, any of them. `withdrawn`
    /// is a registered instance in no view of this region.
    #[schemars(default)]
    pub(super) verdict: Vec<VerdictParam>,
    /// Only endpoints with this capability (ViewEndpoint.capability); repeated, any of
    /// them: `verified`/`unverified` (some evidence class speaks for it now, or none), the
    /// evidence mode its verdict rests on, or a class its profile supplies. An endpoint
    /// that states none (a peer region's) matches none.
    #[schemars(default)]
    pub(super) capability: Vec<CapabilityParam>,
    /// Consul's shorthand for verdict=eligible: `?passing`, `passing=true` or `1`; `false`
    /// or `0` turns it off.
    pub(super) passing: Option<PassingParam>,
}

/// A verdict to filter on.
#[derive(Debug, Clone, Copy, JsonSchema)]
#[schemars(rename_all = "snake_case")]
pub(super) enum VerdictParam {
    Eligible,
    Degraded,
    Unknown,
    Ineligible,
    Quarantined,
    Draining,
    /// Registered, in no view of this region.
    Withdrawn,
}

/// A capability to filter on.
#[derive(Debug, Clone, Copy, JsonSchema)]
#[schemars(rename_all = "snake_case")]
pub(super) enum CapabilityParam {
    Verified,
    Unverified,
    PassivePrimary,
    ProbePrimary,
    SingleClass,
    Probe,
    SelfReport,
    Passive,
}

/// `passing`'s values: none (`?passing`) or a boolean.
#[derive(Debug, Clone, Copy, JsonSchema)]
pub(super) enum PassingParam {
    #[schemars(rename = "")]
    Present,
    #[schemars(rename = "true")]
    True,
    #[schemars(rename = "false")]
    False,
    #[schemars(rename = "1")]
    One,
    #[schemars(rename = "0")]
    Zero,
}

/// `GET /v1/services/{service}`.
#[derive(Debug, Default, JsonSchema)]
pub(super) struct ServiceParams {
    #[schemars(flatten)]
    pub(super) blocking: BlockingParams,
}

impl QueryParams for ServiceParams {
    const NAMES: &'static [&'static str] = &["index", "wait"];
}

/// `GET /v1/services`.
#[derive(Debug, Default, JsonSchema)]
pub(super) struct ServicesParams {
    #[schemars(flatten)]
    pub(super) blocking: BlockingParams,
    #[schemars(flatten)]
    pub(super) page: PageParams,
}

impl QueryParams for ServicesParams {
    const NAMES: &'static [&'static str] = &["index", "wait", "limit", "cursor"];
}

/// `GET /v1/services/{service}/view`.
#[derive(Debug, Default, JsonSchema)]
pub(super) struct ViewParams {
    #[schemars(flatten)]
    pub(super) blocking: BlockingParams,
    #[schemars(flatten)]
    pub(super) filter: FilterParams,
}

impl QueryParams for ViewParams {
    const NAMES: &'static [&'static str] = &[
        "index",
        "wait",
        "tag",
        "zone",
        "verdict",
        "capability",
        "passing",
    ];
}

/// `GET /v1/prometheus/sd`.
#[derive(Debug, Default, JsonSchema)]
pub(super) struct DiscoveryParams {
    /// Only this service's endpoints.
    pub(super) service: Option<String>,
    #[schemars(flatten)]
    pub(super) blocking: BlockingParams,
    #[schemars(flatten)]
    pub(super) filter: FilterParams,
}

impl QueryParams for DiscoveryParams {
    const NAMES: &'static [&'static str] = &[
        "index",
        "wait",
        "service",
        "tag",
        "zone",
        "verdict",
        "capability",
        "passing",
    ];
}

/// `GET /v1/instances`.
#[derive(Debug, Default, JsonSchema)]
pub(super) struct InstancesParams {
    /// Only this service's instances.
    pub(super) service: Option<String>,
    #[schemars(flatten)]
    pub(super) blocking: BlockingParams,
    #[schemars(flatten)]
    pub(super) filter: FilterParams,
    #[schemars(flatten)]
    pub(super) page: PageParams,
}

impl QueryParams for InstancesParams {
    const NAMES: &'static [&'static str] = &[
        "index",
        "wait",
        "service",
        "tag",
        "zone",
        "verdict",
        "capability",
        "passing",
        "limit",
        "cursor",
    ];
}

// === path parameters ===

/// `{service}`.
#[derive(Debug, JsonSchema)]
pub(super) struct ServicePath {
    service: ServiceName,
}

/// `{id}` of an instance or external endpoint.
#[derive(Debug, JsonSchema)]
pub(super) struct InstancePath {
    id: InstanceId,
}

/// `{zone}`.
#[derive(Debug, JsonSchema)]
pub(super) struct ZonePath {
    zone: ZoneName,
}

/// `{region}`: a peer region.
#[derive(Debug, JsonSchema)]
pub(super) struct RegionPath {
    region: RegionName,
}

/// `{id}` of a Raft member.
#[derive(Debug, JsonSchema)]
pub(super) struct MemberPath {
    /// The member's id.
    id: u64,
}

/// `{seq}`: an override the disruption budget refused.
#[derive(Debug, JsonSchema)]
pub(super) struct SeqPath {
    /// The refusal's audit sequence number (`approval.seq` of the `409`).
    seq: u64,
}

/// `{name}` of a token.
#[derive(Debug, JsonSchema)]
pub(super) struct TokenPath {
    /// The token's name.
    name: String,
}

/// `{node}/{client}`: one xDS client of a node agent.
#[derive(Debug, JsonSchema)]
pub(super) struct ClientPath {
    node: NodeName,
    /// The client's xDS node id (1 to 256 bytes).
    client: String,
}

#[cfg(test)]
mod tests {
    use axum::http::Uri;
    use serde_json::Value;

    use super::*;
    use crate::authority::api::query::{ListQuery, Walk};

    fn properties<T: JsonSchema>() -> (Vec<String>, Value) {
        let schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default();
        let mut names: Vec<String> = schema["properties"]
            .as_object()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        names.sort();
        (names, schema)
    }

    fn names<T: QueryParams>() -> Vec<String> {
        let mut names: Vec<String> = T::NAMES.iter().map(|n| (*n).to_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn each_route_parses_exactly_the_parameters_its_type_documents() {
        assert_eq!(properties::<ServiceParams>().0, names::<ServiceParams>());
        assert_eq!(properties::<ServicesParams>().0, names::<ServicesParams>());
        assert_eq!(properties::<ViewParams>().0, names::<ViewParams>());
        assert_eq!(
            properties::<DiscoveryParams>().0,
            names::<DiscoveryParams>()
        );
        assert_eq!(
            properties::<InstancesParams>().0,
            names::<InstancesParams>()
        );
    }

    #[test]
    fn every_documented_filter_value_parses() {
        let (_, schema) = properties::<InstancesParams>();
        let defs = &schema["$defs"];
        let mut checked = 0;
        for (param, def) in [
            ("verdict", "VerdictParam"),
            ("capability", "CapabilityParam"),
            ("passing", "PassingParam"),
        ] {
            let values: Vec<String> = defs[def]["oneOf"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(defs[def]["anyOf"].as_array().into_iter().flatten())
                .flat_map(|v| {
                    let mut values = v["enum"].as_array().cloned().unwrap_or_default();
                    values.extend(v.get("const").cloned());
                    values
                })
                .chain(defs[def]["enum"].as_array().cloned().unwrap_or_default())
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            assert!(!values.is_empty(), "{def}: {schema:#}");
            for value in values {
                let uri: Uri = format!("/x?{param}={value}").parse().unwrap_or_default();
                let parsed = ListQuery::parse(&uri, InstancesParams::NAMES, Some(Walk::Instances));
                assert!(parsed.is_ok(), "{param}={value}: {parsed:?}");
                checked += 1;
            }
        }
        assert_eq!(checked, 7 + 8 + 5);
    }
}
