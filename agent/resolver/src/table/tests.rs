//! Translation and table-update rules, from hand-built assignments and from waymark's own
//! translation of a released view.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    Address, HealthStatus, Locality, Metadata, SocketAddress, address, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as PbEndpoint, LbEndpoint, LocalityLbEndpoints,
    lb_endpoint::HostIdentifier,
};
use envoy_types::pb::google::protobuf::{Any, Struct, UInt32Value, Value, value::Kind};
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address as WmAddress, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::{
    EndpointStatus, Markers, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey,
};
use waymark_xds::client::{Applied, AppliedType};
use waymark_xds::translate::{self, TYPE_ENDPOINT};

use super::*;

// === fixtures ===

fn lb(port: u16, health: HealthStatus, weight: Option<u32>) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(PbEndpoint {
            address: Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: "10.0.0.1".into(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        })),
        health_status: health as i32,
        load_balancing_weight: weight.map(|value| UInt32Value { value }),
        ..Default::default()
    }
}

fn waymark_meta(fields: &[(&str, Kind)]) -> Metadata {
    let fields = fields
        .iter()
        .map(|(k, v)| {
            let value = Value {
                kind: Some(v.clone()),
            };
            ((*k).to_owned(), value)
        })
        .collect();
    Metadata {
        filter_metadata: [("waymark".to_owned(), Struct { fields })]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

fn locality(
    zone: &str,
    priority: u32,
    disregarded: bool,
    eps: Vec<LbEndpoint>,
) -> LocalityLbEndpoints {
    LocalityLbEndpoints {
        locality: Some(Locality {
            region: "eu".into(),
            zone: zone.into(),
            ..Default::default()
        }),
        metadata: Some(waymark_meta(&[(
            "health_disregarded",
            Kind::BoolValue(disregarded),
        )])),
        lb_endpoints: eps,
        priority,
        ..Default::default()
    }
}

fn cla(name: &str, localities: Vec<LocalityLbEndpoints>) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: name.into(),
        endpoints: localities,
        ..Default::default()
    }
}

fn applied(resources: &[(&str, &str, Any)]) -> Applied {
    let resources: BTreeMap<String, (String, Any)> = resources
        .iter()
        .map(|(name, version, any)| ((*name).to_owned(), ((*version).to_owned(), any.clone())))
        .collect();
    let eds = AppliedType {
        resources,
        system_version: "v".into(),
        ..Default::default()
    };
    Applied {
        types: [(TYPE_ENDPOINT.to_owned(), Arc::new(eds))]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

fn any(c: &ClusterLoadAssignment) -> Any {
    translate::to_any(TYPE_ENDPOINT, c)
}

fn ports(r: &Resolution) -> Vec<u16> {
    match r {
        Resolution::Endpoints(s) => s.endpoints.iter().map(|e| e.port).collect(),
        _ => vec![],
    }
}

fn view_endpoint(
    n: u8,
    zone: &str,
    priority: u32,
    weight: u32,
    status: EndpointStatus,
) -> ViewEndpoint {
    let addr = SocketAddr::from(([10, 0, 0, n], 8000 + u16::from(n)));
    ViewEndpoint {
        instance: InstanceId::try_new(format!("pay-{n}")).unwrap(),
        address: WmAddress {
            ip: addr.ip(),
            port: addr.port(),
        },
        region: RegionName::try_new("eu").unwrap(),
        zone: ZoneName::try_new(zone).unwrap(),
        tier: if priority == 0 {
            Tier::Local
        } else {
            Tier::Region
        },
        priority,
        weight: Weight::new(weight),
        status,
        verdict: Verdict::Eligible,
        tags: Arc::default(),
        metadata: Arc::default(),
        capability: None,
    }
}

fn released(eps: Vec<ViewEndpoint>, markers: Markers) -> ReleasedView {
    ReleasedView {
        version: Version(4),
        view: View {
            key: ViewKey {
                service: ServiceName::try_new("pay").unwrap(),
                zone: ZoneName::try_new("a").unwrap(),
            },
            endpoints: eps
                .into_iter()
                .map(|e| (e.instance.clone(), e))
                .collect::<std::collections::BTreeMap<_, _>>()
                .into(),
            markers,
        },
    }
}

// === translation ===

#[test]
fn waymarks_own_assignment_translates_to_its_routable_endpoints_with_weights_and_tiers() {
    // Goal: what xds-edge encodes for a view comes back as the view's routable endpoints.
    let view = released(
        vec![
            view_endpoint(1, "a", 0, 100, EndpointStatus::Eligible),
            view_endpoint(2, "a", 0, 40, EndpointStatus::Degraded),
            view_endpoint(3, "b", 1, 100, EndpointStatus::Unknown),
            view_endpoint(4, "b", 1, 100, EndpointStatus::Draining),
        ],
        Markers::default(),
    );
    let a = any(&translate::load_assignment(&view));
    let got = service_endpoints("pay", "4", &a).unwrap();
    let summary: Vec<_> = got
        .endpoints
        .iter()
        .map(|e| (e.port, e.weight, e.zone.as_str(), e.priority, e.status))
        .collect();
    assert_eq!(
        summary,
        [
            (8001, 100, "a", 0, EndpointStatus::Eligible),
            (8002, 40, "a", 0, EndpointStatus::Degraded),
            (8003, 100, "b", 1, EndpointStatus::Unknown),
        ]
    );
    assert_eq!(
        got.withheld, 1,
        "the draining endpoint is listed but not routable"
    );
    assert_eq!(got.endpoints[0].instance.as_deref(), Some("pay-1"));
    assert_eq!(got.version, "4");
    assert!(!got.health_disregarded);
}

#[test]
fn the_resolver_reports_what_each_endpoints_health_rests_on() {
    // Goal (ADR-16): a caller linking the library can tell an unprobed endpoint (health
    // unknown, stated) from a probed healthy one; a capability it cannot read is unstated.
    use waymark_core::contract::CapabilityProfile;
    use waymark_core::eligibility::EvidenceMode;
    let mut third_party = view_endpoint(1, "a", 0, 100, EndpointStatus::Unknown);
    third_party.capability = Some(Capability {
        profile: CapabilityProfile::NO_READINESS,
        verified: false,
        evidence: EvidenceMode::SingleClass,
    });
    let mut probed = view_endpoint(2, "a", 0, 100, EndpointStatus::Eligible);
    probed.capability = Some(Capability {
        profile: CapabilityProfile::NO_SELF_REPORT,
        verified: true,
        evidence: EvidenceMode::ProbePrimary,
    });
    let view = released(vec![third_party, probed], Markers::default());
    let got = service_endpoints("pay", "4", &any(&translate::load_assignment(&view))).unwrap();
    let caps: Vec<_> = got.endpoints.iter().map(|e| e.capability).collect();
    assert_eq!(
        caps[0].map(|c| (c.profile, c.verified)),
        Some((CapabilityProfile::NO_READINESS, false))
    );
    assert_eq!(
        caps[1].map(|c| (c.verified, c.evidence)),
        Some((true, EvidenceMode::ProbePrimary))
    );

    // A shape this build does not read: unstated, and the endpoint is still routed.
    let mut odd = lb(9000, HealthStatus::Healthy, None);
    odd.metadata = Some(waymark_meta(&[(
        "capability",
        Kind::StringValue("full".into()),
    )]));
    let c = cla("pay", vec![locality("a", 0, false, vec![odd])]);
    let got = translate_cla(&c);
    assert_eq!(got.endpoints.len(), 1);
    assert_eq!(got.endpoints[0].capability, None);
}

#[test]
fn a_health_disregarded_zone_keeps_its_full_set() {
    // Goal: under the fraction guard, failing endpoints stay routable and are labelled so.
    let view = released(
        vec![
            view_endpoint(1, "a", 0, 100, EndpointStatus::Disregarded),
            view_endpoint(2, "a", 0, 100, EndpointStatus::Disregarded),
        ],
        Markers {
            health_disregarded: [ZoneName::try_new("a").unwrap()].into_iter().collect(),
            ..Markers::default()
        },
    );
    let got = service_endpoints("pay", "1", &any(&translate::load_assignment(&view))).unwrap();
    assert_eq!(got.endpoints.len(), 2);
    assert!(got.health_disregarded);
    assert!(
        got.endpoints
            .iter()
            .all(|e| e.health_disregarded && e.status == EndpointStatus::Disregarded)
    );

    // A foreign server marking endpoints UNHEALTHY in a disregarded locality: still routed;
    // DRAINING stays out even there.
    let c = cla(
        "pay",
        vec![locality(
            "a",
            0,
            true,
            vec![
                lb(1, HealthStatus::Unhealthy, None),
                lb(2, HealthStatus::Timeout, None),
                lb(3, HealthStatus::Draining, None),
            ],
        )],
    );
    let got = translate_cla(&c);
    assert_eq!(
        got.endpoints.iter().map(|e| e.port).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(got.withheld, 1);
}

fn translate_cla(c: &ClusterLoadAssignment) -> ServiceEndpoints {
    service_endpoints("pay", "1", &any(c)).unwrap()
}

#[test]
fn unhealthy_and_draining_endpoints_are_withheld_outside_a_disregarded_zone() {
    // Goal: Envoy's routing rules: HEALTHY, DEGRADED and UNKNOWN route; the rest do not.
    let c = cla(
        "pay",
        vec![locality(
            "a",
            0,
            false,
            vec![
                lb(1, HealthStatus::Healthy, Some(7)),
                lb(2, HealthStatus::Degraded, None),
                lb(3, HealthStatus::Unknown, None),
                lb(4, HealthStatus::Unhealthy, None),
                lb(5, HealthStatus::Draining, None),
                lb(6, HealthStatus::Timeout, None),
            ],
        )],
    );
    let got = translate_cla(&c);
    let summary: Vec<_> = got
        .endpoints
        .iter()
        .map(|e| (e.port, e.weight, e.status))
        .collect();
    assert_eq!(
        summary,
        [
            (1, 7, EndpointStatus::Eligible),
            (2, 1, EndpointStatus::Degraded),
            (3, 1, EndpointStatus::Unknown),
        ]
    );
    assert_eq!(got.withheld, 3);
}

#[test]
fn malformed_assignments_are_errors_not_empty_sets() {
    // Goal: each way an assignment can be unusable is an error naming the service.
    let zero_weight = cla(
        "pay",
        vec![locality(
            "a",
            0,
            false,
            vec![lb(1, HealthStatus::Healthy, Some(0))],
        )],
    );
    let zero_port = cla(
        "pay",
        vec![locality(
            "a",
            0,
            false,
            vec![lb(0, HealthStatus::Healthy, None)],
        )],
    );
    let mut bad_ip = lb(1, HealthStatus::Healthy, None);
    if let Some(HostIdentifier::Endpoint(e)) = &mut bad_ip.host_identifier
        && let Some(address::Address::SocketAddress(sa)) =
            e.address.as_mut().and_then(|a| a.address.as_mut())
    {
        sa.address = "pay.example".into();
    }
    let hostname = cla("pay", vec![locality("a", 0, false, vec![bad_ip])]);
    let mut weird = lb(1, HealthStatus::Healthy, None);
    weird.health_status = 42;
    let unknown_health = cla("pay", vec![locality("a", 0, false, vec![weird])]);
    for c in [zero_weight, zero_port, hostname, unknown_health] {
        let err = service_endpoints("pay", "1", &any(&c)).unwrap_err();
        assert!(
            matches!(err, TableError::InvalidEndpoint { index: 0, .. }),
            "{err}"
        );
    }
    let garbage = Any {
        type_url: TYPE_ENDPOINT.into(),
        value: vec![0xff, 0xff, 0xff],
    };
    assert!(matches!(
        service_endpoints("pay", "1", &garbage),
        Err(TableError::Decode { .. })
    ));
    assert!(matches!(
        service_endpoints("pay", "1", &any(&cla("cart", vec![]))),
        Err(TableError::NameMismatch { .. })
    ));
    assert!(
        validate(TYPE_ENDPOINT, &garbage).is_err(),
        "the NACK validator agrees"
    );
}

// === the table ===

#[test]
fn an_assignment_without_routable_endpoints_is_empty_and_an_unheard_service_is_unknown() {
    // Goal: "resolved to empty" and "could not resolve" are different answers.
    let drained = cla(
        "pay",
        vec![locality(
            "a",
            0,
            false,
            vec![lb(1, HealthStatus::Draining, None)],
        )],
    );
    let t = Table::from_applied(&applied(&[("pay", "1", any(&drained))])).unwrap();
    assert_eq!(t.resolve("pay"), Resolution::Empty);
    assert_eq!(t.resolve("cart"), Resolution::Unknown);
    assert_eq!(Table::default().resolve("pay"), Resolution::Unknown);
}

#[test]
fn a_malformed_update_is_rejected_whole_and_the_previous_table_stays() {
    // Goal: one bad resource rejects the update, including its good resources.
    let good = |port| {
        cla(
            "pay",
            vec![locality(
                "a",
                0,
                false,
                vec![lb(port, HealthStatus::Healthy, None)],
            )],
        )
    };
    let t1 = Table::from_applied(&applied(&[("pay", "1", any(&good(1)))])).unwrap();
    let bad = cla(
        "cart",
        vec![locality(
            "a",
            0,
            false,
            vec![lb(1, HealthStatus::Healthy, Some(0))],
        )],
    );
    let update = applied(&[("pay", "2", any(&good(2))), ("cart", "1", any(&bad))]);
    assert!(t1.update(&update, 10).is_err());
    // Through the resolver: the error is counted and the old answer stays.
    let r = crate::Resolver::from_table(t1);
    assert!(r.apply(&update).is_err());
    assert_eq!(ports(&r.resolve("pay")), [1]);
    assert_eq!(r.resolve("cart"), Resolution::Unknown);
    assert_eq!(r.stats().rejected, 1);
}

#[test]
fn a_removed_resource_keeps_its_previous_set_and_is_no_longer_upstream() {
    // Goal: losing a resource (removal, restart) never empties a service.
    let good = cla(
        "pay",
        vec![locality(
            "a",
            0,
            false,
            vec![lb(1, HealthStatus::Healthy, None)],
        )],
    );
    let t1 = Table::default()
        .update(&applied(&[("pay", "1", any(&good))]), 100)
        .unwrap();
    assert_eq!(t1.confirmed("pay"), Some((100, true)));
    let t2 = t1.update(&applied(&[]), 200).unwrap();
    assert_eq!(ports(&t2.resolve("pay")), [1]);
    assert_eq!(
        t2.confirmed("pay"),
        Some((100, false)),
        "carried, not re-confirmed"
    );
}

#[test]
fn an_unchanged_assignment_keeps_its_allocation_and_is_re_stamped() {
    // Goal: re-confirming a view refreshes its stamp without a new allocation.
    let good = cla(
        "pay",
        vec![locality(
            "a",
            0,
            false,
            vec![lb(1, HealthStatus::Healthy, None)],
        )],
    );
    let update = applied(&[("pay", "1", any(&good))]);
    let t1 = Table::default().update(&update, 100).unwrap();
    let t2 = t1.update(&update, 200).unwrap();
    let (Resolution::Endpoints(a), Resolution::Endpoints(b)) =
        (t1.resolve("pay"), t2.resolve("pay"))
    else {
        panic!("both resolve");
    };
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(t2.confirmed("pay"), Some((200, true)));
}

#[test]
fn a_corrupt_cache_file_is_not_served_by_the_resolver() {
    // Goal: at start, a file that fails its checksum is discarded and counted.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lkg.json");
    std::fs::write(
        &path,
        b"{\"format\":1,\"checksum\":\"0000000000000000\",\"body\":\"{}\"}",
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut config = crate::ResolverConfig::new("http://127.0.0.1:9", "n", "a");
        config.cache_file = Some(path.clone());
        config.services = vec!["pay".into()];
        let r = crate::Resolver::connect(config).unwrap();
        assert_eq!(r.resolve("pay"), Resolution::Unknown);
        assert_eq!(r.stats().cache_corrupt, 1);
        assert!(r.table().is_empty());
    });
}
