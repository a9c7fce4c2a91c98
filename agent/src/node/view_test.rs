use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{
    Address as EnvoyAddress, Locality, SocketAddress, address, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::Endpoint;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use waymark_core::units::Permille;

use super::*;

const SVC: &str = "pay";

/// One real instant to offset from; the pure parts under test read no clock.
#[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
fn t0() -> Instant {
    Instant::now()
}

fn zone() -> ZoneName {
    ZoneName::try_new("az1").unwrap()
}

fn lb(port: u16) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(EnvoyAddress {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: "10.0.0.1".into(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        })),
        load_balancing_weight: Some(UInt32Value { value: 100 }),
        ..Default::default()
    }
}

fn cla(ports: impl IntoIterator<Item = u16>) -> Any {
    let cla = ClusterLoadAssignment {
        cluster_name: SVC.into(),
        endpoints: vec![LocalityLbEndpoints {
            locality: Some(Locality {
                zone: "az1".into(),
                ..Default::default()
            }),
            lb_endpoints: ports.into_iter().map(lb).collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    to_any(TYPE_ENDPOINT, &cla)
}

fn cluster_any() -> Any {
    let c =
        waymark_xds::translate::cluster(&waymark_core::model::ServiceName::try_new(SVC).unwrap());
    to_any(TYPE_CLUSTER, &c)
}

/// An upstream state holding the cluster and, if given, its assignment at `version`.
fn upstream(version: u64, assignment: Option<Any>) -> Upstream {
    let mut out = Upstream::new();
    let mut clusters = AppliedType::default();
    clusters
        .resources
        .insert(SVC.into(), ("1".into(), cluster_any()));
    out.insert(TYPE_CLUSTER.into(), Arc::new(clusters));
    let mut eds = AppliedType::default();
    if let Some(a) = assignment {
        eds.resources.insert(SVC.into(), (version.to_string(), a));
    }
    out.insert(TYPE_ENDPOINT.into(), Arc::new(eds));
    out
}

fn view() -> LocalView {
    let bounds = BoundsConfig {
        shrink_max: Permille::saturating(300),
        shrink_window: Duration::from_secs(10),
    };
    LocalView::new(zone(), bounds, 20)
}

fn served_ports(v: &LocalView) -> BTreeSet<String> {
    v.assignments()
        .flat_map(|c| c.endpoints.iter().flat_map(|g| g.lb_endpoints.iter()))
        .filter_map(endpoint_key)
        .collect()
}

fn keys(ports: impl IntoIterator<Item = u16>) -> BTreeSet<String> {
    ports.into_iter().map(|p| format!("10.0.0.1:{p}")).collect()
}

fn state(v: &LocalView) -> ServiceState {
    v.states().next().unwrap().1.clone()
}

#[test]
fn a_new_service_is_served_as_sent_with_capped_clusters() {
    let mut v = view();
    let changes = v.apply(&upstream(7, Some(cla(1..=3))), t0());
    assert!(changes.services.contains(SVC));
    assert_eq!(served_ports(&v), keys(1..=3));
    assert_eq!(state(&v).served_version, 7);
    let snap = v.snapshot();
    assert_eq!(snap.version, 7);
    assert!(snap.is_consistent());
    let c = Cluster::decode(snap.clusters[SVC].resource.value.as_slice()).unwrap();
    let cap = c
        .outlier_detection
        .unwrap()
        .max_ejection_percent
        .unwrap()
        .value;
    assert_eq!(cap, 20, "the upstream's 30% is capped at the agent's 20%");
    assert!(c.lrs_server.is_some(), "sidecars report load to this agent");
    assert!(snap.endpoints[&zone()].contains_key(SVC));
}

#[test]
fn a_cluster_without_outlier_detection_is_served_with_every_field_set() {
    // Goal: an authority from before the explicit fields must not reach grpc-js callers
    // with a half-filled outlier detection (it crashes on unset fields).
    let mut bare =
        waymark_xds::translate::cluster(&waymark_core::model::ServiceName::try_new(SVC).unwrap());
    bare.outlier_detection = None;
    let mut up = upstream(7, Some(cla(1..=3)));
    let mut clusters = AppliedType::default();
    clusters
        .resources
        .insert(SVC.into(), ("1".into(), to_any(TYPE_CLUSTER, &bare)));
    up.insert(TYPE_CLUSTER.into(), Arc::new(clusters));
    let mut v = view();
    v.apply(&up, t0());
    let snap = v.snapshot();
    let c = Cluster::decode(snap.clusters[SVC].resource.value.as_slice()).unwrap();
    let od = c.outlier_detection.unwrap();
    let mut expected = waymark_xds::translate::outlier::detection();
    expected.max_ejection_percent = Some(UInt32Value { value: 20 });
    assert_eq!(od, expected);
}

#[test]
fn a_single_withdrawal_passes_at_once() {
    let mut v = view();
    let t0 = t0();
    v.apply(&upstream(1, Some(cla(1..=3))), t0);
    v.apply(&upstream(2, Some(cla(1..=2))), t0);
    assert_eq!(served_ports(&v), keys(1..=2));
    assert_eq!(state(&v).held_back, 0);
}

#[test]
fn a_mass_withdrawal_is_slowed_and_released_by_the_window() {
    let mut v = view();
    let t0 = t0();
    v.apply(&upstream(1, Some(cla(1..=10))), t0);
    let changes = v.apply(&upstream(2, Some(cla(1..=2))), t0);
    assert!(changes.services.contains(SVC));
    let first = served_ports(&v);
    assert_eq!(first.len(), 7, "30% of 10 may go at once");
    assert!(
        keys(1..=2).is_subset(&first),
        "what is wanted is always served"
    );
    assert_eq!(state(&v).held_back, 5);
    let v1 = state(&v).served_version;
    assert_eq!(v1, 2);

    let due = v.poll_timeout().expect("held-back removals are scheduled");
    assert!(v.handle_timeout(due - Duration::from_millis(1)).is_empty());
    let released = v.handle_timeout(due);
    assert!(released.services.contains(SVC));
    assert!(served_ports(&v).len() < 7);
    let v2 = state(&v).served_version;
    assert!(v2 > v1, "a changed set is a newer version ({v2} > {v1})");

    let mut now = due;
    while let Some(due) = v.poll_timeout() {
        now = due.max(now);
        v.handle_timeout(now);
    }
    assert_eq!(served_ports(&v), keys(1..=2));
    assert_eq!(state(&v).held_back, 0);
}

#[test]
fn an_empty_upstream_set_is_refused_and_declared() {
    let mut v = view();
    let t0 = t0();
    v.apply(&upstream(1, Some(cla(1..=3))), t0);
    let changes = v.apply(&upstream(2, Some(cla([]))), t0);
    assert!(changes.services.is_empty());
    assert!(changes.refused.contains(SVC));
    assert_eq!(served_ports(&v), keys(1..=3));
    assert!(state(&v).refused_empty);
    // A later good view clears the declaration.
    v.apply(&upstream(3, Some(cla(1..=3))), t0);
    assert!(!state(&v).refused_empty);
}

#[test]
fn an_assignment_removed_under_a_live_cluster_is_kept() {
    let mut v = view();
    let t0 = t0();
    v.apply(&upstream(1, Some(cla(1..=3))), t0);
    let changes = v.apply(&upstream(2, None), t0);
    assert!(changes.refused.contains(SVC));
    assert_eq!(served_ports(&v), keys(1..=3));
    // With its cluster gone, the service is gone.
    let changes = v.apply(&Upstream::new(), t0);
    assert!(changes.services.contains(SVC));
    assert_eq!(v.assignments().count(), 0);
    assert!(v.snapshot().clusters.is_empty());
}

#[test]
fn an_undecodable_assignment_keeps_the_previous_one() {
    let mut v = view();
    let t0 = t0();
    v.apply(&upstream(1, Some(cla(1..=3))), t0);
    let garbage = Any {
        type_url: TYPE_ENDPOINT.into(),
        value: vec![0xff, 0xff, 0xff],
    };
    let changes = v.apply(&upstream(2, Some(garbage)), t0);
    assert!(changes.refused.contains(SVC));
    assert_eq!(served_ports(&v), keys(1..=3));
    assert!(state(&v).undecodable);
}

#[test]
fn restoring_serves_the_cache_and_the_same_upstream_changes_nothing() {
    let mut v = view();
    let t0 = t0();
    let cached = upstream(5, Some(cla(1..=4)));
    v.restore(cached.clone(), 0, t0);
    assert_eq!(served_ports(&v), keys(1..=4));
    assert_eq!(v.snapshot().version, 5);
    assert!(v.apply(&cached, t0).is_empty());
}

#[test]
fn restored_versions_rise_above_what_was_served_before() {
    let mut v = view();
    v.restore(upstream(5, Some(cla(1..=4))), 9, t0());
    assert_eq!(state(&v).served_version, 10);
    assert_eq!(v.max_served_version(), 10);
}

#[test]
fn served_versions_never_go_backwards_even_when_upstream_versions_are_close() {
    let mut v = view();
    let t0 = t0();
    v.apply(&upstream(10, Some(cla(1..=10))), t0);
    v.apply(&upstream(11, Some(cla(1..=1))), t0); // held back: served as 11
    let due = v.poll_timeout().unwrap();
    v.handle_timeout(due); // a step: 12
    let step = state(&v).served_version;
    v.apply(&upstream(12, Some(cla(1..=1))), due); // upstream 12 is older than the step
    assert!(state(&v).served_version >= step);
    let mut last = state(&v).served_version;
    let mut now = due;
    while let Some(d) = v.poll_timeout() {
        now = d.max(now);
        v.handle_timeout(now);
        let s = state(&v).served_version;
        assert!(s > last);
        last = s;
    }
}

#[test]
fn a_served_version_carries_its_upstream_release_age_plus_the_agents_own_wait() {
    // Goal: the whole path is timed on the agent's clock alone — the age the authority
    // carried, plus the time from the response's arrival to the version being served (a
    // shrink cap's hold included); a version without one, or an age past the bound,
    // carries nothing.
    use waymark_xds::client::Arrival;
    let t0 = t0();
    let ms = Duration::from_millis;
    let with_age = |version: u64, ports: std::ops::RangeInclusive<u16>, arrival: Arrival| {
        let mut up = upstream(version, Some(cla(ports)));
        let mut eds = (*up[TYPE_ENDPOINT]).clone();
        eds.carried.insert(SVC.into(), arrival);
        up.insert(TYPE_ENDPOINT.into(), Arc::new(eds));
        up
    };
    let carried =
        |v: &LocalView, version: u64| v.snapshot().released[SVC][&version.to_string()].carried;
    let mut v = view();
    let arrival = |version: &str, at, age| Arrival {
        version: version.into(),
        at,
        age,
    };
    v.apply(&with_age(7, 1..=10, arrival("7", t0, ms(300))), t0 + ms(20));
    assert_eq!(carried(&v, 7), Some(ms(320)));
    // An arrival describing another version says nothing about this one.
    v.apply(&with_age(8, 1..=11, arrival("7", t0, ms(300))), t0 + ms(40));
    assert_eq!(carried(&v, 8), None);
    // A withdrawal held back by the shrink cap counts its hold when released.
    let at = t0 + Duration::from_secs(1);
    v.apply(&with_age(9, 1..=4, arrival("9", at, ms(100))), at);
    let held = state(&v);
    assert!(held.held_back > 0, "{held:?}");
    let due = v.poll_timeout().unwrap();
    v.handle_timeout(due);
    let version = state(&v).served_version;
    assert_eq!(
        carried(&v, version),
        Some(ms(100) + due.duration_since(at)),
        "the hold is part of the path"
    );
    // Past the bound: not trusted.
    let mut v = view();
    let old = waymark_xds::release_age::AGE_MAX;
    v.apply(&with_age(7, 1..=3, arrival("7", t0, old)), t0 + ms(1));
    assert_eq!(carried(&v, 7), None);
}
