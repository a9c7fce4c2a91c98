//! Translation from waymark views to Envoy resources. Pure: no I/O, no clocks.
//!
//! - One `Cluster` per service: EDS over ADS, round robin, and two guards set *explicitly*
//!   so they never compound silently with ours:
//!   - `healthy_panic_threshold` is **0 % (disabled)**. waymark's fraction guard has already
//!     decided, per zone, whether health is disregarded; a view under the guard carries the
//!     full set as routable hosts. Leaving Envoy's default 50 % on would add a second,
//!     different guard (it counts outlier-ejected and `DRAINING` hosts) that could route to
//!     hosts we deliberately drained.
//!   - outlier detection with `max_ejection_percent` = [`EJECTION_PERCENT_MAX`]: the
//!     client-side ejection cap (ADR-01's bound on how much one caller may eject locally).
//!     Every other outlier-detection field is set too, to Envoy's documented default
//!     ([`outlier`]): gRPC clients read an unset field their own way, and grpc-js-xds 1.14
//!     crashed on the unset success-rate fields.
//!   - `update_merge_window` is 0 s so a withdrawal is applied as it arrives, not up to a
//!     second later (Envoy's default), which would eat a fifth of the 5 s budget.
//! - One `ClusterLoadAssignment` per service and caller zone (the same resource name, the
//!   view for the client's zone): priorities from the view, one `LocalityLbEndpoints` per
//!   (priority, region, zone), `load_balancing_weight` from eligibility and slow start.
//!   Status: eligible, degraded and disregarded → `HEALTHY`; unknown → `UNKNOWN` (Envoy
//!   routes to it, on purpose); draining → `DRAINING`; withdrawn instances are absent.
//! - waymark's markers ride in `filter_metadata["waymark"]`: per endpoint the instance id,
//!   verdict, status, tags (a list of strings) and `capability` (`classes` its service's
//!   profile supplies, whether its health is `verified` now, and which `evidence` is
//!   primary — ADR-16: an unprobed endpoint is told apart from a probed healthy one); per
//!   locality the view version and `health_disregarded`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, CommonLbConfig, DiscoveryType, EdsClusterConfig, LbPolicy,
};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Address as EnvoyAddress;
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, HealthStatus, Locality, Metadata,
    SocketAddress, address, config_source::ConfigSourceSpecifier, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::route::Action as RouteActionKind;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{
    Route as EnvoyRoute, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds,
};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{
    Any, Duration as PbDuration, ListValue, Struct, UInt32Value, Value, value::Kind,
};
use waymark_core::model::{InstanceId, ServiceName};
use waymark_core::view::{Capability, EndpointStatus, ReleasedView, ViewEndpoint};

pub mod outlier;

/// Type URL of CDS resources.
pub const TYPE_CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of EDS resources.
pub const TYPE_ENDPOINT: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// Type URL of LDS resources (served for proxyless gRPC clients only).
pub const TYPE_LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// Type URL of RDS resources (served for proxyless gRPC clients only).
pub const TYPE_ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const TYPE_HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const TYPE_ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
/// The metadata namespace waymark writes under.
pub const METADATA_NAMESPACE: &str = "waymark";
/// Client-side ejection cap: Envoy's outlier detection may eject at most this share of a
/// cluster's hosts on its own.
pub const EJECTION_PERCENT_MAX: u32 = 30;
/// Connect timeout for upstream hosts.
pub const CONNECT_TIMEOUT_MS: u32 = 1_000;

/// Encode a message as an `Any` of `type_url`.
pub fn to_any<M: prost::Message>(type_url: &str, message: &M) -> Any {
    Any {
        type_url: type_url.to_owned(),
        value: message.encode_to_vec(),
    }
}

/// The CDS resource for a service.
pub fn cluster(service: &ServiceName) -> Cluster {
    Cluster {
        name: service.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(ConfigSource {
                resource_api_version: ApiVersion::V3 as i32,
                config_source_specifier: Some(ConfigSourceSpecifier::Ads(
                    AggregatedConfigSource {},
                )),
                ..Default::default()
            }),
            service_name: service.to_string(),
        }),
        connect_timeout: Some(pb_duration(std::time::Duration::from_millis(u64::from(
            CONNECT_TIMEOUT_MS,
        )))),
        lb_policy: LbPolicy::RoundRobin as i32,
        common_lb_config: Some(CommonLbConfig {
            healthy_panic_threshold: Some(Percent { value: 0.0 }),
            update_merge_window: Some(PbDuration {
                seconds: 0,
                nanos: 0,
            }),
            ..Default::default()
        }),
        outlier_detection: Some(outlier::detection()),
        metadata: Some(metadata([("service", string(service.as_str()))])),
        ..Default::default()
    }
}

/// The minimal LDS resource a proxyless gRPC client needs to dial `xds:///<service>`: an
/// API listener named after the service whose connection manager takes its routes from RDS
/// over ADS. Envoy sidecars never ask for it (their listeners are their own static config).
pub fn api_listener(service: &ServiceName) -> Listener {
    let hcm = HttpConnectionManager {
        stat_prefix: service.to_string(),
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads_source()),
            route_config_name: service.to_string(),
        })),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(HttpFilterConfig::TypedConfig(to_any(
                TYPE_ROUTER,
                &Router::default(),
            ))),
            ..Default::default()
        }],
        ..Default::default()
    };
    Listener {
        name: service.to_string(),
        api_listener: Some(ApiListener {
            api_listener: Some(to_any(TYPE_HCM, &hcm)),
        }),
        ..Default::default()
    }
}

/// The minimal RDS resource for a proxyless client: every request to the service goes to
/// its cluster.
pub fn route_configuration(service: &ServiceName) -> RouteConfiguration {
    let route = EnvoyRoute {
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix(String::new())),
            ..Default::default()
        }),
        action: Some(RouteActionKind::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(service.to_string())),
            ..Default::default()
        })),
        ..Default::default()
    };
    RouteConfiguration {
        name: service.to_string(),
        virtual_hosts: vec![VirtualHost {
            name: service.to_string(),
            domains: vec!["*".into()],
            routes: vec![route],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn ads_source() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

/// The EDS resource for a released view (named after the service).
pub fn load_assignment(released: &ReleasedView) -> ClusterLoadAssignment {
    let endpoints = groups(released)
        .into_iter()
        .map(|g| LocalityLbEndpoints {
            locality: g.locality,
            metadata: g.metadata,
            load_balancing_weight: g.load_balancing_weight,
            lb_endpoints: g
                .endpoints
                .into_iter()
                .map(|e| lb_endpoint(e, g.disregarded))
                .collect(),
            priority: g.priority,
            ..Default::default()
        })
        .collect();
    ClusterLoadAssignment {
        cluster_name: released.view.key.service.to_string(),
        endpoints,
        ..Default::default()
    }
}

/// Encodes load assignments that decode to what [`load_assignment`] builds, but keeps each
/// endpoint's encoded `LbEndpoint` and reuses it while that endpoint is unchanged.
///
/// A view is republished whenever any of its endpoints changes, and at the reference estate
/// a view holds hundreds of endpoints: translating and encoding all of them again on every
/// release was a third of an authority's CPU under registration load. Only the endpoints
/// that changed (or whose locality's `health_disregarded` changed) are translated now; the
/// locality and assignment framing around them is cheap. One encoder serves one view: it
/// remembers exactly the endpoints of the view it last encoded.
#[derive(Debug, Default)]
pub struct EdsEncoder {
    /// Each endpoint of the last encoding: what it was encoded from, its locality's
    /// `health_disregarded`, its encoded `LbEndpoint`, and the encoding that last saw it.
    endpoints: HashMap<InstanceId, Held>,
    /// Encodings so far; entries not seen by the latest are forgotten.
    generation: u64,
}

#[derive(Debug)]
struct Held {
    from: ViewEndpoint,
    disregarded: bool,
    bytes: Arc<[u8]>,
    seen: u64,
}

impl EdsEncoder {
    /// An encoder that remembers nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The encoded `ClusterLoadAssignment` of `released`: it decodes to
    /// `load_assignment(released)`.
    pub fn encode(&mut self, released: &ReleasedView) -> Vec<u8> {
        use prost::Message as _;
        use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
        const ENDPOINTS: u32 = 2; // ClusterLoadAssignment.endpoints
        const LB_ENDPOINTS: u32 = 2; // LocalityLbEndpoints.lb_endpoints

        self.generation += 1;
        let generation = self.generation;
        let view = &released.view;
        // Fields are written in tag order, as prost writes them: the assignment's name (1),
        // then each locality (2); in a locality its `locality` (1), the endpoints (2), then
        // weight (3), priority (5) and metadata (9). Each locality's length is known before
        // it is written, so the bytes are written once, into the answer.
        let mut out = ClusterLoadAssignment {
            cluster_name: view.key.service.to_string(),
            ..Default::default()
        }
        .encode_to_vec();
        for group in groups(released) {
            let head = LocalityLbEndpoints {
                locality: group.locality,
                ..Default::default()
            }
            .encode_to_vec();
            let tail = LocalityLbEndpoints {
                metadata: group.metadata,
                load_balancing_weight: group.load_balancing_weight,
                priority: group.priority,
                ..Default::default()
            }
            .encode_to_vec();
            let encoded: Vec<Arc<[u8]>> = group
                .endpoints
                .iter()
                .map(|e| self.lb_endpoint(e, group.disregarded, generation))
                .collect();
            let body_len = head.len()
                + tail.len()
                + encoded
                    .iter()
                    .map(|b| key_len(LB_ENDPOINTS) + encoded_len_varint(b.len() as u64) + b.len())
                    .sum::<usize>();
            out.reserve(key_len(ENDPOINTS) + encoded_len_varint(body_len as u64) + body_len);
            encode_key(ENDPOINTS, WireType::LengthDelimited, &mut out);
            encode_varint(body_len as u64, &mut out);
            out.extend_from_slice(&head);
            for bytes in &encoded {
                encode_key(LB_ENDPOINTS, WireType::LengthDelimited, &mut out);
                encode_varint(bytes.len() as u64, &mut out);
                out.extend_from_slice(bytes);
            }
            out.extend_from_slice(&tail);
        }
        self.endpoints.retain(|_, held| held.seen == generation);
        out
    }

    /// `e`'s encoded `LbEndpoint`: the one held while `e` is unchanged, else a new one.
    fn lb_endpoint(&mut self, e: &ViewEndpoint, disregarded: bool, generation: u64) -> Arc<[u8]> {
        use prost::Message as _;
        match self.endpoints.get_mut(&e.instance) {
            Some(held) if held.disregarded == disregarded && held.from == *e => {
                held.seen = generation;
                Arc::clone(&held.bytes)
            }
            _ => {
                let bytes: Arc<[u8]> = Arc::from(lb_endpoint(e, disregarded).encode_to_vec());
                self.endpoints.insert(
                    e.instance.clone(),
                    Held {
                        from: e.clone(),
                        disregarded,
                        bytes: Arc::clone(&bytes),
                        seen: generation,
                    },
                );
                bytes
            }
        }
    }
}

/// One `LocalityLbEndpoints` of a view, before its endpoints are translated.
struct Group<'v> {
    locality: Option<Locality>,
    metadata: Option<Metadata>,
    load_balancing_weight: Option<UInt32Value>,
    priority: u32,
    disregarded: bool,
    endpoints: Vec<&'v ViewEndpoint>,
}

/// A view's endpoints grouped by (priority, region, zone), in that order, each group with
/// its locality framing.
fn groups(released: &ReleasedView) -> Vec<Group<'_>> {
    let view = &released.view;
    let mut groups: BTreeMap<(u32, &str, &str), Vec<&ViewEndpoint>> = BTreeMap::new();
    for e in view.endpoints.values() {
        groups
            .entry((e.priority, e.region.as_str(), e.zone.as_str()))
            .or_default()
            .push(e);
    }
    groups
        .into_iter()
        .map(|((priority, region, zone), eps)| {
            let disregarded = view
                .markers
                .health_disregarded
                .iter()
                .any(|z| z.as_str() == zone);
            Group {
                locality: Some(Locality {
                    region: region.to_owned(),
                    zone: zone.to_owned(),
                    ..Default::default()
                }),
                metadata: Some(metadata([
                    ("view_version", string(&released.version.to_string())),
                    (
                        "health_disregarded",
                        Value {
                            kind: Some(Kind::BoolValue(disregarded)),
                        },
                    ),
                ])),
                // gRPC's xDS client drops a locality without a weight ("assigned no
                // load"); Envoy ignores locality weights unless the cluster asks for
                // locality-weighted balancing. The sum keeps both reading the same shares.
                load_balancing_weight: Some(UInt32Value {
                    value: locality_weight(&eps),
                }),
                priority,
                disregarded,
                endpoints: eps,
            }
        })
        .collect()
}

/// A locality's weight: its endpoints' weights summed, never zero.
fn locality_weight(eps: &[&ViewEndpoint]) -> u32 {
    eps.iter()
        .map(|e| e.weight.get())
        .fold(0u32, u32::saturating_add)
        .max(1)
}

fn lb_endpoint(e: &ViewEndpoint, disregarded: bool) -> LbEndpoint {
    let health = match e.status {
        EndpointStatus::Eligible | EndpointStatus::Degraded | EndpointStatus::Disregarded => {
            HealthStatus::Healthy
        }
        EndpointStatus::Unknown => HealthStatus::Unknown,
        EndpointStatus::Draining => HealthStatus::Draining,
    };
    let address = EnvoyAddress {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: e.address.ip.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                e.address.port,
            ))),
            ..Default::default()
        })),
    };
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(address),
            ..Default::default()
        })),
        health_status: health as i32,
        load_balancing_weight: Some(UInt32Value {
            value: e.weight.get(),
        }),
        // Envoy's config dump rebuilds localities from hosts and drops their metadata, so
        // the guard's marker is repeated on every endpoint where callers can see it.
        metadata: Some(endpoint_metadata(e, disregarded)),
    }
}

/// An endpoint's `filter_metadata["waymark"]`: its instance, verdict, status and tags,
/// the guard's marker, and what its health rests on (`capability`, ADR-16) where the view
/// states it.
fn endpoint_metadata(e: &ViewEndpoint, disregarded: bool) -> Metadata {
    let mut md = metadata([
        ("health_disregarded", boolean(disregarded)),
        ("instance", string(e.instance.as_str())),
        ("verdict", string(e.verdict.as_str())),
        ("status", string(status_str(e.status))),
        ("tags", string_list(e.tags.iter())),
    ]);
    if let (Some(c), Some(ours)) = (
        &e.capability,
        md.filter_metadata.get_mut(METADATA_NAMESPACE),
    ) {
        ours.fields.insert("capability".to_owned(), capability(c));
    }
    md
}

/// `{"classes": ["probe", "passive"], "verified": true, "evidence": "passive_primary"}`.
fn capability(c: &Capability) -> Value {
    let classes = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: c.classes().map(string).collect(),
        })),
    };
    let fields = [
        ("classes", classes),
        ("verified", boolean(c.verified)),
        ("evidence", string(c.evidence.label())),
    ];
    Value {
        kind: Some(Kind::StructValue(Struct {
            fields: fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        })),
    }
}

fn boolean(b: bool) -> Value {
    Value {
        kind: Some(Kind::BoolValue(b)),
    }
}

fn status_str(s: EndpointStatus) -> &'static str {
    match s {
        EndpointStatus::Eligible => "eligible",
        EndpointStatus::Degraded => "degraded",
        EndpointStatus::Unknown => "unknown",
        EndpointStatus::Disregarded => "disregarded",
        EndpointStatus::Draining => "draining",
    }
}

/// A protobuf `Duration` (nanos strictly below one second, as Envoy checks).
pub fn pb_duration(d: std::time::Duration) -> PbDuration {
    PbDuration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// A `ListValue` of strings, in the iterator's order.
fn string_list<'a>(items: impl Iterator<Item = &'a String>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue {
            values: items.map(|s| string(s)).collect(),
        })),
    }
}

fn metadata<const N: usize>(fields: [(&str, Value); N]) -> Metadata {
    let fields = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    Metadata {
        filter_metadata: [(METADATA_NAMESPACE.to_owned(), Struct { fields })]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;

// === Reading what `load_assignment` wrote ===

/// An endpoint's IP and port, as [`load_assignment`] writes them; why not, for anything
/// else (a pipe, a hostname, port 0). Callers decide whether that refuses the whole
/// assignment (the resolver) or skips the endpoint (DNS).
pub fn endpoint_socket(lb: &LbEndpoint) -> Result<(std::net::IpAddr, u16), &'static str> {
    let Some(HostIdentifier::Endpoint(endpoint)) = &lb.host_identifier else {
        return Err("no endpoint");
    };
    let Some(address::Address::SocketAddress(sa)) =
        endpoint.address.as_ref().and_then(|a| a.address.as_ref())
    else {
        return Err("no socket address");
    };
    let ip: std::net::IpAddr = sa.address.parse().map_err(|_| "address is not an IP")?;
    let port = match sa.port_specifier {
        Some(socket_address::PortSpecifier::PortValue(p)) => {
            u16::try_from(p).map_err(|_| "port out of range")?
        }
        _ => return Err("no port"),
    };
    if port == 0 {
        return Err("port is zero");
    }
    Ok((ip, port))
}

/// A field of waymark's metadata namespace ([`METADATA_NAMESPACE`]), if present.
/// An endpoint's capability as [`load_assignment`] writes it, or `None` when the
/// endpoint states none (a peer region's) or states it in a shape this build does not read
/// (a newer writer): capability informs a caller and never decides routing, so an unread
/// one is reported as unknown rather than refusing the assignment.
pub fn endpoint_capability(lb: &LbEndpoint) -> Option<Capability> {
    let Some(Kind::StructValue(c)) = metadata_field(lb.metadata.as_ref(), "capability") else {
        return None;
    };
    let field = |k: &str| c.fields.get(k).and_then(|v| v.kind.as_ref());
    let Some(Kind::ListValue(classes)) = field("classes") else {
        return None;
    };
    let mut profile = waymark_core::contract::CapabilityProfile {
        probe: false,
        self_report: false,
        passive: false,
    };
    for class in &classes.values {
        match class.kind.as_ref() {
            Some(Kind::StringValue(s)) if s == "probe" => profile.probe = true,
            Some(Kind::StringValue(s)) if s == "self_report" => profile.self_report = true,
            Some(Kind::StringValue(s)) if s == "passive" => profile.passive = true,
            _ => return None,
        }
    }
    let Some(Kind::BoolValue(verified)) = field("verified") else {
        return None;
    };
    let evidence = match field("evidence") {
        Some(Kind::StringValue(s)) => waymark_core::eligibility::EvidenceMode::ALL
            .into_iter()
            .find(|m| m.label() == s)?,
        _ => return None,
    };
    Some(Capability {
        profile,
        verified: *verified,
        evidence,
    })
}

pub fn metadata_field<'m>(metadata: Option<&'m Metadata>, key: &str) -> Option<&'m Kind> {
    metadata?
        .filter_metadata
        .get(METADATA_NAMESPACE)?
        .fields
        .get(key)?
        .kind
        .as_ref()
}
