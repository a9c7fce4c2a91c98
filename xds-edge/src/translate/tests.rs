//! Translation: Envoy sees exactly the view, with our guards set explicitly.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use prost::Message as _;
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::{
    EndpointStatus, Markers, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey,
};

use super::*;

pub(crate) fn ep(
    n: u8,
    zone: &str,
    priority: u32,
    weight: u32,
    status: EndpointStatus,
) -> ViewEndpoint {
    ViewEndpoint {
        instance: InstanceId::try_new(format!("pay-{n}")).unwrap(),
        address: Address {
            ip: IpAddr::V4(Ipv4Addr::new(127, 0, 0, n)),
            port: 8000 + u16::from(n),
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

pub(crate) fn released(
    version: u64,
    zone: &str,
    eps: Vec<ViewEndpoint>,
    markers: Markers,
) -> ReleasedView {
    let key = ViewKey {
        service: ServiceName::try_new("pay").unwrap(),
        zone: ZoneName::try_new(zone).unwrap(),
    };
    let endpoints: BTreeMap<_, _> = eps.into_iter().map(|e| (e.instance.clone(), e)).collect();
    ReleasedView {
        version: Version(version),
        view: View {
            key,
            endpoints: endpoints.into(),
            markers,
        },
    }
}

fn meta(m: &Option<envoy_types::pb::envoy::config::core::v3::Metadata>, key: &str) -> Option<Kind> {
    m.as_ref()?
        .filter_metadata
        .get(METADATA_NAMESPACE)?
        .fields
        .get(key)?
        .kind
        .clone()
}

#[test]
fn a_cluster_is_eds_over_ads_with_envoys_guards_set_explicitly() {
    let c = cluster(&ServiceName::try_new("pay").unwrap());
    assert_eq!(c.name, "pay");
    assert_eq!(
        c.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
    );
    let eds = c.eds_cluster_config.unwrap();
    assert_eq!(eds.service_name, "pay");
    assert!(matches!(
        eds.eds_config.unwrap().config_source_specifier,
        Some(ConfigSourceSpecifier::Ads(_))
    ));
    assert_eq!(
        c.connect_timeout,
        Some(PbDuration {
            seconds: 1,
            nanos: 0
        })
    );
    let lb = c.common_lb_config.unwrap();
    assert_eq!(
        lb.healthy_panic_threshold,
        Some(Percent { value: 0.0 }),
        "our guard is the only guard"
    );
    assert_eq!(
        lb.update_merge_window,
        Some(PbDuration {
            seconds: 0,
            nanos: 0
        })
    );
    assert_eq!(
        c.outlier_detection.unwrap().max_ejection_percent,
        Some(UInt32Value {
            value: EJECTION_PERCENT_MAX
        })
    );
}

#[test]
fn outlier_detection_sets_every_field_to_envoys_default_but_the_cap() {
    // Goal: no outlier-detection field is left for a client to default. grpc-js-xds 1.14
    // turns an unset one into `undefined` over its own default and crashed on that (see
    // `outlier`'s module doc). The values are spelled out here, not taken from the
    // constants, and the literal has no `..Default::default()`: unsetting a field, changing
    // a value, or a new field in envoy-types each fails this test.
    use envoy_types::pb::envoy::config::cluster::v3::OutlierDetection;
    use envoy_types::pb::google::protobuf::BoolValue;
    let count = |value| Some(UInt32Value { value });
    let secs = |seconds| Some(PbDuration { seconds, nanos: 0 });
    let flag = |value| Some(BoolValue { value });
    let expected = OutlierDetection {
        consecutive_5xx: count(5),
        interval: secs(10),
        base_ejection_time: secs(30),
        max_ejection_percent: count(30),
        enforcing_consecutive_5xx: count(100),
        enforcing_success_rate: count(100),
        success_rate_minimum_hosts: count(5),
        success_rate_request_volume: count(100),
        success_rate_stdev_factor: count(1_900),
        consecutive_gateway_failure: count(5),
        enforcing_consecutive_gateway_failure: count(0),
        split_external_local_origin_errors: false,
        consecutive_local_origin_failure: count(5),
        enforcing_consecutive_local_origin_failure: count(100),
        enforcing_local_origin_success_rate: count(100),
        failure_percentage_threshold: count(85),
        enforcing_failure_percentage: count(0),
        enforcing_failure_percentage_local_origin: count(0),
        failure_percentage_minimum_hosts: count(5),
        failure_percentage_request_volume: count(50),
        max_ejection_time: secs(300),
        max_ejection_time_jitter: secs(0),
        successful_active_health_check_uneject_host: flag(true),
        monitors: Vec::new(),
        always_eject_one_host: flag(false),
        detect_degraded_hosts: flag(false),
    };
    let c = cluster(&ServiceName::try_new("pay").unwrap());
    assert_eq!(c.outlier_detection.as_ref(), Some(&expected));

    // A wrapper holding 0 is still *set* on the wire (an empty message, not an absent
    // field): the explicit zeros reach the client as zeros, not as "unset".
    let decoded = Cluster::decode(to_any(TYPE_CLUSTER, &c).value.as_slice()).unwrap();
    assert_eq!(decoded.outlier_detection, Some(expected));
}

#[test]
fn success_rate_ejection_cannot_reach_grpc_js_empty_reduce() {
    // Goal: the one value that keeps grpc-js 1.14's success-rate check from averaging an
    // empty list, even with every field set: it returns early only while fewer than
    // `minimum_hosts` hosts have the request volume, so `minimum_hosts` = 0 would crash it
    // in any interval where no host had the volume.
    let od = cluster(&ServiceName::try_new("pay").unwrap())
        .outlier_detection
        .unwrap();
    assert!(
        od.enforcing_success_rate.is_some_and(|p| p.value > 0),
        "success-rate ejection is on (as in Envoy), so the check runs"
    );
    assert!(od.success_rate_minimum_hosts.is_some_and(|n| n.value >= 1));
}

#[test]
fn endpoints_keep_their_status_weight_priority_and_identity() {
    let mut markers = Markers::default();
    markers
        .health_disregarded
        .insert(ZoneName::try_new("b").unwrap());
    let view = released(
        7,
        "a",
        vec![
            ep(1, "a", 0, 100, EndpointStatus::Eligible),
            ep(2, "a", 0, 25, EndpointStatus::Unknown),
            ep(3, "a", 0, 100, EndpointStatus::Draining),
            ep(4, "b", 1, 100, EndpointStatus::Disregarded),
        ],
        markers,
    );
    let cla = load_assignment(&view);
    assert_eq!(cla.cluster_name, "pay");
    assert_eq!(
        cla.endpoints.len(),
        2,
        "one locality per (priority, region, zone)"
    );
    let (a, b) = (&cla.endpoints[0], &cla.endpoints[1]);
    assert_eq!(
        (a.priority, a.locality.as_ref().unwrap().zone.as_str()),
        (0, "a")
    );
    assert_eq!(
        (b.priority, b.locality.as_ref().unwrap().zone.as_str()),
        (1, "b")
    );
    let statuses: Vec<i32> = a.lb_endpoints.iter().map(|e| e.health_status).collect();
    assert_eq!(
        statuses,
        vec![
            HealthStatus::Healthy as i32,
            HealthStatus::Unknown as i32,
            HealthStatus::Draining as i32
        ]
    );
    assert_eq!(
        a.lb_endpoints[1].load_balancing_weight,
        Some(UInt32Value { value: 25 })
    );
    assert_eq!(
        b.lb_endpoints[0].health_status,
        HealthStatus::Healthy as i32,
        "disregarded hosts are routed"
    );
    assert_eq!(
        meta(&b.metadata, "health_disregarded"),
        Some(Kind::BoolValue(true))
    );
    assert_eq!(
        meta(&a.metadata, "health_disregarded"),
        Some(Kind::BoolValue(false))
    );
    assert_eq!(
        meta(&a.metadata, "view_version"),
        Some(Kind::StringValue("7".into()))
    );
    assert_eq!(
        meta(&a.lb_endpoints[0].metadata, "instance"),
        Some(Kind::StringValue("pay-1".into()))
    );
    // And it survives the wire.
    let any = to_any(TYPE_ENDPOINT, &cla);
    assert_eq!(
        ClusterLoadAssignment::decode(any.value.as_slice()).unwrap(),
        cla
    );
}

mod eds_encoder {
    use proptest::prelude::*;

    use super::*;

    /// One endpoint's changeable fields: present, zone, priority, weight, status, tag.
    type Change = (u8, bool, bool, u8, u8, u8, bool);

    fn change() -> impl Strategy<Value = Change> {
        (
            0u8..12,
            any::<bool>(),
            any::<bool>(),
            0u8..3,
            0u8..4,
            0u8..5,
            any::<bool>(),
        )
    }

    fn status(n: u8) -> EndpointStatus {
        [
            EndpointStatus::Eligible,
            EndpointStatus::Degraded,
            EndpointStatus::Unknown,
            EndpointStatus::Disregarded,
            EndpointStatus::Draining,
        ][usize::from(n % 5)]
    }

    proptest! {
        /// Goal: the encoder's bytes decode to exactly what translating the whole view
        /// gives, release after release, whatever changed in between (endpoints
        /// added, removed, moved between localities, reweighted, re-statused, re-tagged,
        /// and zones' `health_disregarded` flipping).
        #[test]
        fn reused_encodings_equal_a_fresh_translation(
            steps in prop::collection::vec(
                (prop::collection::vec(change(), 1..6), any::<bool>(), any::<bool>()),
                1..12,
            ),
        ) {
            let mut encoder = EdsEncoder::new();
            let mut eps: BTreeMap<u8, ViewEndpoint> = BTreeMap::new();
            for (version, (changes, disregard_a, disregard_b)) in steps.into_iter().enumerate() {
                for (n, present, in_b, priority, weight, st, tagged) in changes {
                    if !present {
                        eps.remove(&n);
                        continue;
                    }
                    let zone = if in_b { "b" } else { "a" };
                    let mut e = ep(n + 1, zone, u32::from(priority), u32::from(weight) * 50, status(st));
                    if tagged {
                        e.tags = Arc::new(["canary".to_owned()].into_iter().collect());
                    }
                    eps.insert(n, e);
                }
                let mut markers = Markers::default();
                for (flag, zone) in [(disregard_a, "a"), (disregard_b, "b")] {
                    if flag {
                        markers
                            .health_disregarded
                            .insert(ZoneName::try_new(zone).unwrap());
                    }
                }
                let view = released(version as u64 + 1, "a", eps.values().cloned().collect(), markers);
                // Compared decoded: `Struct` fields are a hash map, so even two encodings of
                // one message may order them differently.
                let bytes = encoder.encode(&view);
                let decoded = ClusterLoadAssignment::decode(bytes.as_slice());
                prop_assert_eq!(decoded, Ok(load_assignment(&view)));
            }
        }
    }

    #[test]
    fn an_unchanged_endpoint_is_not_encoded_again() {
        // Goal: the reuse is real — an endpoint that did not change keeps the very bytes
        // (the same allocation) from one release to the next; a changed one gets new ones.
        let mut encoder = EdsEncoder::new();
        let one = ep(1, "a", 0, 100, EndpointStatus::Eligible);
        let two = ep(2, "a", 0, 100, EndpointStatus::Eligible);
        encoder.encode(&released(
            1,
            "a",
            vec![one.clone(), two.clone()],
            Markers::default(),
        ));
        let before =
            |e: &EdsEncoder, id: &ViewEndpoint| Arc::clone(&e.endpoints[&id.instance].bytes);
        let (kept, changed) = (before(&encoder, &one), before(&encoder, &two));
        let two = ViewEndpoint {
            weight: Weight::new(50),
            ..two
        };
        encoder.encode(&released(
            2,
            "a",
            vec![one.clone(), two.clone()],
            Markers::default(),
        ));
        assert!(Arc::ptr_eq(&kept, &encoder.endpoints[&one.instance].bytes));
        assert!(!Arc::ptr_eq(
            &changed,
            &encoder.endpoints[&two.instance].bytes
        ));
        // An endpoint gone from the view is forgotten.
        encoder.encode(&released(3, "a", vec![one.clone()], Markers::default()));
        assert_eq!(encoder.endpoints.len(), 1);
    }
}

#[test]
fn every_endpoint_carries_its_capability_in_waymark_metadata() {
    // Goal (ADR-16): an Envoy (or any xDS client) can tell an unprobed endpoint from a
    // probed healthy one from the resource alone.
    use waymark_core::contract::CapabilityProfile;
    use waymark_core::eligibility::EvidenceMode;
    let mut unprobed = ep(1, "a", 0, 100, EndpointStatus::Unknown);
    unprobed.capability = Some(Capability {
        profile: CapabilityProfile::NO_READINESS,
        verified: false,
        evidence: EvidenceMode::SingleClass,
    });
    let mut probed = ep(2, "a", 0, 100, EndpointStatus::Eligible);
    probed.capability = Some(Capability {
        profile: CapabilityProfile::NO_SELF_REPORT,
        verified: true,
        evidence: EvidenceMode::PassivePrimary,
    });
    let unstated = ep(3, "a", 0, 100, EndpointStatus::Eligible);
    let cla = load_assignment(&released(
        1,
        "a",
        vec![unprobed, probed, unstated],
        Markers::default(),
    ));
    let lb = &cla.endpoints[0].lb_endpoints;
    let capability = |i: usize| -> Option<serde_json::Value> {
        let Kind::StructValue(s) = meta(&lb[i].metadata, "capability")? else {
            panic!("capability is a struct");
        };
        let mut out = serde_json::Map::new();
        for (k, v) in s.fields {
            let v = match v.kind.unwrap() {
                Kind::BoolValue(b) => serde_json::json!(b),
                Kind::StringValue(s) => serde_json::json!(s),
                Kind::ListValue(l) => serde_json::json!(
                    l.values
                        .into_iter()
                        .map(|v| match v.kind.unwrap() {
                            Kind::StringValue(s) => s,
                            other => panic!("{other:?}"),
                        })
                        .collect::<Vec<_>>()
                ),
                other => panic!("{other:?}"),
            };
            out.insert(k, v);
        }
        Some(serde_json::Value::Object(out))
    };
    assert_eq!(
        capability(0),
        Some(
            serde_json::json!({"classes": ["passive"], "verified": false, "evidence": "single_class"})
        )
    );
    assert_eq!(
        capability(1),
        Some(
            serde_json::json!({"classes": ["probe", "passive"], "verified": true, "evidence": "passive_primary"})
        )
    );
    assert_eq!(
        capability(2),
        None,
        "a peer region's endpoint states nothing"
    );
    // The reader is the writer's inverse.
    let read: Vec<_> = lb.iter().map(endpoint_capability).collect();
    assert_eq!(
        read[0].map(|c| c.profile),
        Some(CapabilityProfile::NO_READINESS)
    );
    assert_eq!(
        read[1].map(|c| (c.verified, c.evidence)),
        Some((true, EvidenceMode::PassivePrimary))
    );
    assert_eq!(read[2], None);
}
