//! Property: whatever sequence of updates arrives, valid or malformed, with resources
//! present or missing, `resolve` returns `Empty` for a service only if the latest *valid*
//! update holding it said it had no routable endpoint — and otherwise agrees with a
//! three-line reference model.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    Address, HealthStatus, SocketAddress, address, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use proptest::prelude::*;
use waymark_resolver::{Resolution, Resolver, Table};
use waymark_xds::client::{Applied, AppliedType};
use waymark_xds::translate::{TYPE_ENDPOINT, to_any};

const SERVICES: [&str; 3] = ["pay", "cart", "search"];

/// One resource in an update.
#[derive(Debug, Clone)]
enum Resource {
    /// Endpoints by Envoy health status code (0..=5).
    Valid(Vec<i32>),
    /// A zero weight: translates to an error.
    ZeroWeight,
    /// Bytes that are not a `ClusterLoadAssignment`.
    Garbage,
}

fn resource() -> impl Strategy<Value = Resource> {
    prop_oneof![
        6 => prop::collection::vec(0i32..=5, 0..4).prop_map(Resource::Valid),
        1 => Just(Resource::ZeroWeight),
        1 => Just(Resource::Garbage),
    ]
}

/// An update: for each service, its resource or nothing (removed / not resent).
fn update() -> impl Strategy<Value = Vec<Option<Resource>>> {
    prop::collection::vec(prop::option::of(resource()), SERVICES.len())
}

fn lb(port: u16, health: i32, weight: u32) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: "10.1.2.3".into(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        })),
        health_status: health,
        load_balancing_weight: Some(UInt32Value { value: weight }),
        ..Default::default()
    }
}

fn encode(service: &str, r: &Resource) -> Any {
    let lbs = match r {
        Resource::Valid(healths) => healths
            .iter()
            .enumerate()
            .map(|(i, h)| lb(1000 + i as u16, *h, 10))
            .collect(),
        Resource::ZeroWeight => vec![lb(1000, HealthStatus::Healthy as i32, 0)],
        Resource::Garbage => {
            return Any {
                type_url: TYPE_ENDPOINT.into(),
                value: vec![0x0a, 0xff, 0xff, 0xff],
            };
        }
    };
    let cla = ClusterLoadAssignment {
        cluster_name: service.into(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: lbs,
            ..Default::default()
        }],
        ..Default::default()
    };
    to_any(TYPE_ENDPOINT, &cla)
}

fn applied(step: &[Option<Resource>], n: usize) -> Applied {
    let resources: BTreeMap<String, (String, Any)> = SERVICES
        .iter()
        .zip(step)
        .filter_map(|(s, r)| Some(((*s).to_owned(), (n.to_string(), encode(s, r.as_ref()?)))))
        .collect();
    let eds = AppliedType {
        resources,
        system_version: n.to_string(),
        ..Default::default()
    };
    Applied {
        types: [(TYPE_ENDPOINT.to_owned(), Arc::new(eds))]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

/// Routable in Envoy's terms: HEALTHY (1), DEGRADED (5), UNKNOWN (0).
fn routable(health: i32) -> bool {
    matches!(health, 0 | 1 | 5)
}

proptest! {
    #[test]
    fn resolve_is_empty_only_when_the_latest_valid_update_said_so(
        steps in prop::collection::vec(update(), 1..12)
    ) {
        // Goal: errors and removals never turn a service empty; the model says the rest.
        let resolver = Resolver::from_table(Table::default());
        // Per service: None = never held; Some(has routable endpoints).
        let mut model: BTreeMap<&str, bool> = BTreeMap::new();
        for (n, step) in steps.iter().enumerate() {
            let malformed = step
                .iter()
                .flatten()
                .any(|r| !matches!(r, Resource::Valid(_)));
            let result = resolver.apply(&applied(step, n));
            prop_assert_eq!(result.is_err(), malformed);
            if !malformed {
                for (s, r) in SERVICES.iter().zip(step) {
                    if let Some(Resource::Valid(healths)) = r {
                        model.insert(s, healths.iter().any(|h| routable(*h)));
                    }
                }
            }
            for s in SERVICES {
                let got = resolver.resolve(s);
                match model.get(s) {
                    None => prop_assert_eq!(&got, &Resolution::Unknown, "{} step {}", s, n),
                    Some(false) => prop_assert_eq!(&got, &Resolution::Empty, "{} step {}", s, n),
                    Some(true) => prop_assert!(
                        matches!(got, Resolution::Endpoints(_)),
                        "{} step {}: {:?}", s, n, got
                    ),
                }
            }
        }
    }
}
