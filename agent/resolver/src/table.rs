//! The resolution table: an immutable map from service to its routable endpoints, built
//! from what the xDS client applied. Pure: no I/O, no clocks (time comes in as `now_unix_ms`).
//!
//! Translation follows what Envoy does with the same `ClusterLoadAssignment`, so a caller
//! linking this library routes like a sidecar would:
//!
//! - `HEALTHY`, `DEGRADED` and `UNKNOWN` endpoints are routable (Envoy routes to `UNKNOWN`;
//!   waymark maps "no evidence" there on purpose); `DRAINING` never is;
//! - `UNHEALTHY`/`TIMEOUT` endpoints are routable only in a locality that declares
//!   `health_disregarded` (the fraction guard keeps the full set; ADR-08);
//! - waymark's labels (`status`, `instance`, `health_disregarded`, `capability`) come from
//!   `filter_metadata["waymark"]`, and refine but never override Envoy's health status
//!   (a capability this build cannot read is reported as not stated).
//!
//! A table is rebuilt whole on every update ([`Table::update`]). The rules that keep an error
//! from ever producing an empty set live here:
//!
//! - a malformed resource rejects the whole update (`Err`; the caller keeps the old table);
//! - a service that disappears from the update (its resource removed, or not yet resent
//!   after a restart) keeps its previous set: only an explicit, valid assignment with no
//!   routable endpoint makes a service [`Resolution::Empty`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Metadata};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::protobuf::value::Kind;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use waymark_core::view::{Capability, EndpointStatus};
use waymark_xds::client::Applied;
use waymark_xds::translate::{TYPE_ENDPOINT, endpoint_capability, endpoint_socket, metadata_field};

/// The answer to "where do I send a request for this service?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// At least one routable endpoint.
    Endpoints(Arc<ServiceEndpoints>),
    /// Resolved to empty: the authority's latest valid view of the service has no routable
    /// endpoint. Never the result of an error.
    Empty,
    /// Could not resolve: no view of the service has been received (never subscribed, not
    /// yet answered, or unknown to the authority). Callers fall back to their default.
    Unknown,
}

/// A service's routable endpoints, as of one resource version from the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceEndpoints {
    /// The service (the EDS resource name).
    pub service: String,
    /// The resource version the agent gave the assignment.
    pub version: String,
    /// Routable endpoints, ordered by (priority, zone, address, port).
    pub endpoints: Vec<Endpoint>,
    /// Endpoints the assignment listed but that take no new traffic (draining, unhealthy).
    pub withheld: u32,
    /// Some locality of the view declared `health_disregarded`: its endpoints are routed
    /// because the fraction guard engaged, not because they are verified (ADR-08).
    pub health_disregarded: bool,
}

/// One routable endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// IP address.
    pub address: IpAddr,
    /// Port.
    pub port: u16,
    /// Relative weight (Envoy `load_balancing_weight`, 1 when absent); never zero.
    pub weight: u32,
    /// Region of its locality.
    pub region: String,
    /// Zone of its locality.
    pub zone: String,
    /// Topology priority: 0 = caller's zone, 1 = other zones of the region, 2 = peer regions.
    pub priority: u32,
    /// What the caller should do with it (never `Draining` here).
    pub status: EndpointStatus,
    /// Routed only because its zone's health is disregarded.
    pub health_disregarded: bool,
    /// waymark's instance id, when the agent sent it.
    pub instance: Option<String>,
    /// What its health rests on (ADR-16): the evidence classes its service can supply,
    /// whether any speaks for it now, and which is primary. `None` when the view does not
    /// state it (an endpoint of a peer region). An unverified endpoint is routed with its
    /// health unknown — route to it as such, not as a probed healthy one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<Capability>,
}

/// Why an update was rejected. Every variant has the same effect: nothing of the update is
/// applied and the previous table keeps being served; the rejection is counted. The caller
/// should do nothing but wait for the next update (the xDS layer NACKs the response).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TableError {
    /// The payload is not a `ClusterLoadAssignment`.
    #[error("resource {service} is not a cluster load assignment")]
    Decode {
        /// The resource name.
        service: String,
        /// The protobuf error.
        #[source]
        source: prost::DecodeError,
    },
    /// The payload is of another type.
    #[error("resource {service} has type {type_url}")]
    WrongType {
        /// The resource name.
        service: String,
        /// The payload's type URL.
        type_url: String,
    },
    /// The assignment names another cluster than its resource name.
    #[error("resource {service} carries the assignment of {cluster_name}")]
    NameMismatch {
        /// The resource name.
        service: String,
        /// The assignment's `cluster_name`.
        cluster_name: String,
    },
    /// An endpoint cannot be routed to as sent.
    #[error("endpoint #{index} of {service} is invalid: {reason}")]
    InvalidEndpoint {
        /// The resource name.
        service: String,
        /// Its position among the assignment's endpoints (all localities, in order).
        index: usize,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Everything resolvable, immutable once built. See the module documentation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    services: HashMap<String, Entry>,
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    endpoints: Arc<ServiceEndpoints>,
    /// Wall-clock time (data, not ordering) the entry was last known current upstream.
    confirmed_unix_ms: u64,
    /// Present in the latest update (false: carried over, or loaded from the cache).
    upstream: bool,
}

// === impl Table ===

impl Table {
    /// The table one applied state describes, alone: every EDS resource translated, nothing
    /// carried over, nothing stamped (`confirmed_unix_ms` is 0). `Err` if any is malformed.
    pub fn from_applied(applied: &Applied) -> Result<Self, TableError> {
        Self::default().update(applied, 0)
    }

    /// The table after `applied`: its EDS resources replace their services' entries
    /// (stamped `now_unix_ms`); services it lacks keep their previous entries, so a removal
    /// never empties a service. `Err` (and `self` stays the one to serve) if any resource
    /// is malformed.
    pub fn update(&self, applied: &Applied, now_unix_ms: u64) -> Result<Self, TableError> {
        let mut services: HashMap<String, Entry> = self
            .services
            .iter()
            .map(|(name, e)| {
                let carried = Entry {
                    upstream: false,
                    ..e.clone()
                };
                (name.clone(), carried)
            })
            .collect();
        for (name, (version, any)) in applied.resources(TYPE_ENDPOINT).into_iter().flatten() {
            let endpoints = service_endpoints(name, version, any)?;
            let endpoints = match self.services.get(name) {
                // Unchanged content keeps its allocation, so readers holding it compare equal
                // by pointer too.
                Some(prev) if *prev.endpoints == endpoints => prev.endpoints.clone(),
                _ => Arc::new(endpoints),
            };
            let entry = Entry {
                endpoints,
                confirmed_unix_ms: now_unix_ms,
                upstream: true,
            };
            services.insert(name.clone(), entry);
        }
        Ok(Self { services })
    }

    /// A table holding exactly `services`, as loaded from a cache (not upstream).
    pub fn from_services(services: impl IntoIterator<Item = (ServiceEndpoints, u64)>) -> Self {
        let services = services
            .into_iter()
            .map(|(endpoints, confirmed_unix_ms)| {
                let entry = Entry {
                    endpoints: Arc::new(endpoints),
                    confirmed_unix_ms,
                    upstream: false,
                };
                (entry.endpoints.service.clone(), entry)
            })
            .collect();
        Self { services }
    }

    /// Resolve a service: a hash lookup and, for a routable set, one reference count.
    #[inline]
    pub fn resolve(&self, service: &str) -> Resolution {
        match self.services.get(service) {
            None => Resolution::Unknown,
            Some(e) if e.endpoints.endpoints.is_empty() => Resolution::Empty,
            Some(e) => Resolution::Endpoints(e.endpoints.clone()),
        }
    }

    /// How many services the table resolves (including those resolving to empty).
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// Whether the table resolves nothing.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// Every service with its endpoints and `confirmed_unix_ms`, sorted by name.
    pub fn services(&self) -> Vec<(Arc<ServiceEndpoints>, u64)> {
        let mut out: Vec<_> = self
            .services
            .values()
            .map(|e| (e.endpoints.clone(), e.confirmed_unix_ms))
            .collect();
        out.sort_by(|a, b| a.0.service.cmp(&b.0.service));
        out
    }

    /// When `service` was last known current upstream, and whether the latest update held
    /// it (false: carried over from an earlier update or loaded from the cache).
    pub fn confirmed(&self, service: &str) -> Option<(u64, bool)> {
        self.services
            .get(service)
            .map(|e| (e.confirmed_unix_ms, e.upstream))
    }
}

// === translation ===

/// Check an xDS resource as the client receives it (the NACK validator): EDS payloads must
/// translate; other types pass.
pub(crate) fn validate(type_url: &str, any: &Any) -> Result<(), String> {
    if type_url != TYPE_ENDPOINT {
        return Ok(());
    }
    let cla = ClusterLoadAssignment::decode(any.value.as_slice())
        .map_err(|e| format!("not a cluster load assignment: {e}"))?;
    translate(&cla.cluster_name, "", &cla)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Translate one EDS resource `name` at `version`.
pub fn service_endpoints(
    name: &str,
    version: &str,
    any: &Any,
) -> Result<ServiceEndpoints, TableError> {
    if any.type_url != TYPE_ENDPOINT {
        return Err(TableError::WrongType {
            service: name.to_owned(),
            type_url: any.type_url.clone(),
        });
    }
    let cla = ClusterLoadAssignment::decode(any.value.as_slice()).map_err(|source| {
        TableError::Decode {
            service: name.to_owned(),
            source,
        }
    })?;
    if !cla.cluster_name.is_empty() && cla.cluster_name != name {
        return Err(TableError::NameMismatch {
            service: name.to_owned(),
            cluster_name: cla.cluster_name,
        });
    }
    translate(name, version, &cla)
}

/// Translate a decoded assignment. See the module documentation for the rules.
pub fn translate(
    service: &str,
    version: &str,
    cla: &ClusterLoadAssignment,
) -> Result<ServiceEndpoints, TableError> {
    let mut out = ServiceEndpoints {
        service: service.to_owned(),
        version: version.to_owned(),
        endpoints: Vec::new(),
        withheld: 0,
        health_disregarded: false,
    };
    let mut index = 0usize;
    for locality in &cla.endpoints {
        let disregarded = flag(locality.metadata.as_ref(), "health_disregarded");
        out.health_disregarded |= disregarded;
        let (region, zone) = locality
            .locality
            .as_ref()
            .map_or((String::new(), String::new()), |l| {
                (l.region.clone(), l.zone.clone())
            });
        for lb in &locality.lb_endpoints {
            let invalid = |reason| TableError::InvalidEndpoint {
                service: service.to_owned(),
                index,
                reason,
            };
            let disregarded = disregarded || flag(lb.metadata.as_ref(), "health_disregarded");
            out.health_disregarded |= disregarded;
            let (address, port) = endpoint_socket(lb).map_err(invalid)?;
            let weight = lb.load_balancing_weight.map_or(1, |w| w.value);
            if weight == 0 {
                return Err(invalid("load_balancing_weight is zero"));
            }
            let health = HealthStatus::try_from(lb.health_status)
                .map_err(|_| invalid("unknown health status"))?;
            let label = text(lb.metadata.as_ref(), "status").and_then(parse_status);
            index += 1;
            let Some(status) = routable(health, label, disregarded) else {
                out.withheld = out.withheld.saturating_add(1);
                continue;
            };
            out.endpoints.push(Endpoint {
                address,
                port,
                weight,
                region: region.clone(),
                zone: zone.clone(),
                priority: locality.priority,
                status,
                health_disregarded: disregarded,
                instance: text(lb.metadata.as_ref(), "instance").map(str::to_owned),
                capability: endpoint_capability(lb),
            });
        }
    }
    out.endpoints.sort_by(|a, b| {
        (a.priority, &a.zone, a.address, a.port).cmp(&(b.priority, &b.zone, b.address, b.port))
    });
    Ok(out)
}

/// Envoy's health status (the contract) refined by waymark's label; `None` = not routable.
fn routable(
    health: HealthStatus,
    label: Option<EndpointStatus>,
    disregarded: bool,
) -> Option<EndpointStatus> {
    match health {
        HealthStatus::Healthy => Some(match label {
            Some(s @ (EndpointStatus::Degraded | EndpointStatus::Disregarded)) => s,
            _ => EndpointStatus::Eligible,
        }),
        HealthStatus::Degraded => Some(EndpointStatus::Degraded),
        HealthStatus::Unknown => Some(EndpointStatus::Unknown),
        HealthStatus::Draining => None,
        // The guard keeps the full set: failing health checks are disregarded, a deliberate
        // drain is not.
        HealthStatus::Unhealthy | HealthStatus::Timeout => {
            disregarded.then_some(EndpointStatus::Disregarded)
        }
    }
}

fn flag(metadata: Option<&Metadata>, key: &str) -> bool {
    matches!(metadata_field(metadata, key), Some(Kind::BoolValue(true)))
}

fn text<'a>(metadata: Option<&'a Metadata>, key: &str) -> Option<&'a str> {
    match metadata_field(metadata, key) {
        Some(Kind::StringValue(s)) => Some(s.as_str()),
        _ => None,
    }
}

fn parse_status(s: &str) -> Option<EndpointStatus> {
    Some(match s {
        "eligible" => EndpointStatus::Eligible,
        "degraded" => EndpointStatus::Degraded,
        "unknown" => EndpointStatus::Unknown,
        "disregarded" => EndpointStatus::Disregarded,
        "draining" => EndpointStatus::Draining,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
