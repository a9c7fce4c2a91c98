//! The slice → command mapping: existence, draining, locality, scope and ordering.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use waymark_core::contract::HealthContract;
use waymark_registry::state::{Applied, Registration, Stamped};

use super::*;

fn config() -> DiffConfig {
    DiffConfig {
        region: "eu".parse().unwrap(),
        cluster: "c1".into(),
        namespace: None,
        default_zone: "unknown-zone".parse().unwrap(),
        unknown_node: "unknown-node".parse().unwrap(),
        address_family: AddressFamily::IPv4,
    }
}

fn slice(
    ns: &str,
    name: &str,
    svc: &str,
    ports: &[u16],
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        endpoints,
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([(SERVICE_NAME_LABEL.into(), svc.into())])),
            ..ObjectMeta::default()
        },
        ports: Some(
            ports
                .iter()
                .map(|p| EndpointPort {
                    port: Some(i32::from(*p)),
                    protocol: Some("TCP".into()),
                    name: Some(format!("p{p}")),
                    ..EndpointPort::default()
                })
                .collect(),
        ),
    }
}

fn ep(uid: &str, ip: &str, zone: Option<&str>, node: Option<&str>) -> Endpoint {
    Endpoint {
        addresses: vec![ip.into()],
        conditions: Some(EndpointConditions {
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false),
        }),
        node_name: node.map(Into::into),
        zone: zone.map(Into::into),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            name: Some(format!("pod-{uid}")),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    }
}

fn conditions(mut e: Endpoint, ready: bool, serving: bool, terminating: bool) -> Endpoint {
    e.conditions = Some(EndpointConditions {
        ready: Some(ready),
        serving: Some(serving),
        terminating: Some(terminating),
    });
    e
}

fn registry_with(services: &[&str]) -> DesiredState {
    let mut r = DesiredState::new();
    for s in services {
        let put = Command::PutService {
            service: s.parse().unwrap(),
            owner: "team".into(),
            contract: HealthContract::default(),
        };
        r.apply(Stamped {
            at_ms: 1,
            command: put,
        })
        .unwrap();
    }
    r
}

/// Applies every command; returns the refusals.
fn apply_all(r: &mut DesiredState, commands: &[Command]) -> Vec<String> {
    commands
        .iter()
        .filter_map(|c| {
            r.apply(Stamped {
                at_ms: 2,
                command: c.clone(),
            })
            .err()
            .map(|e| e.to_string())
        })
        .collect()
}

fn id(s: &str) -> InstanceId {
    s.parse().unwrap()
}

#[test]
fn three_endpoints_become_three_instances_with_locality_and_pod_uid_ids() {
    // Goal: the basic mapping — service name, id, address, zone/node locality, metadata.
    let s = slice(
        "shop",
        "pay-abc",
        "pay",
        &[8080],
        vec![
            ep("u1", "10.0.0.1", Some("eu-a"), Some("n1")),
            ep("u2", "10.0.0.2", Some("eu-b"), Some("n2")),
            ep("u3", "10.0.0.3", None, None),
        ],
    );
    let registry = registry_with(&["pay.shop"]);
    let plan = plan([&s], &registry, &config());
    assert_eq!(plan.commands.len(), 3);
    let Command::Observe { instance, draining } = &plan.commands[0] else {
        panic!("expected an observe, got {:?}", plan.commands[0]);
    };
    assert!(!draining);
    assert_eq!(instance.id, id("u1:8080"));
    assert_eq!(instance.service.as_str(), "pay.shop");
    assert_eq!(instance.address.to_string(), "10.0.0.1:8080");
    assert_eq!(instance.locality.zone.as_str(), "eu-a");
    assert_eq!(instance.locality.node.as_str(), "n1");
    assert_eq!(instance.locality.region.as_str(), "eu");
    assert_eq!(
        instance.metadata.get(META_POD).map(String::as_str),
        Some("pod-u1")
    );
    assert_eq!(
        instance.metadata.get(META_PORT_NAME).map(String::as_str),
        Some("p8080")
    );
    let Command::Observe { instance, .. } = &plan.commands[2] else {
        panic!("expected an observe");
    };
    assert_eq!(instance.locality.zone.as_str(), "unknown-zone");
    assert_eq!(instance.locality.node.as_str(), "unknown-node");
    assert_eq!(plan.report.totals.only_in_orchestrator, 3);
    assert_eq!(
        plan.report.services[&"pay.shop".parse().unwrap()]
            .only_in_orchestrator
            .ids
            .len(),
        3
    );
}

#[test]
fn terminating_endpoint_is_observed_draining_whether_serving_or_not() {
    // Goal: terminating means draining; serving does not change that.
    let s = slice(
        "shop",
        "pay-abc",
        "pay",
        &[8080],
        vec![
            conditions(ep("u1", "10.0.0.1", None, None), false, true, true),
            conditions(ep("u2", "10.0.0.2", None, None), false, false, true),
        ],
    );
    let plan = plan([&s], &registry_with(&["pay.shop"]), &config());
    let draining: Vec<bool> = plan
        .commands
        .iter()
        .map(|c| matches!(c, Command::Observe { draining: true, .. }))
        .collect();
    assert_eq!(draining, vec![true, true]);
}

#[test]
fn unready_endpoint_still_exists_and_is_not_draining() {
    // Goal: readiness is evidence, not existence.
    let s = slice(
        "shop",
        "pay-abc",
        "pay",
        &[8080],
        vec![conditions(
            ep("u1", "10.0.0.1", None, None),
            false,
            false,
            false,
        )],
    );
    let plan = plan([&s], &registry_with(&["pay.shop"]), &config());
    assert!(matches!(
        plan.commands.as_slice(),
        [Command::Observe {
            draining: false,
            ..
        }]
    ));
}

#[test]
fn endpoint_without_uid_is_skipped_and_counted() {
    // Goal: no pod UID, no identity, no instance — but the skip is visible.
    let mut e = ep("u1", "10.0.0.1", None, None);
    e.target_ref = None;
    let s = slice("shop", "pay-abc", "pay", &[8080], vec![e]);
    let plan = plan([&s], &registry_with(&["pay.shop"]), &config());
    assert!(plan.commands.is_empty());
    assert_eq!(plan.report.skipped.endpoints_without_uid, 1);
}

#[test]
fn unregistered_service_is_unmanaged_and_proposes_nothing() {
    // Goal: only services registered in waymark are reconciled.
    let s = slice(
        "shop",
        "cart-1",
        "cart",
        &[80, 81],
        vec![ep("u9", "10.0.0.9", None, None)],
    );
    let plan = plan([&s], &registry_with(&["pay.shop"]), &config());
    assert!(plan.commands.is_empty());
    assert_eq!(
        plan.report.unmanaged.get(&"cart.shop".parse().unwrap()),
        Some(&2)
    );
    assert_eq!(plan.report.totals.unmanaged, 2);
}

#[test]
fn several_ports_make_one_instance_per_port() {
    // Goal: (pod, port) is the unit; non-TCP and numberless ports are skipped.
    let mut s = slice(
        "shop",
        "pay-abc",
        "pay",
        &[8080, 9090],
        vec![ep("u1", "10.0.0.1", None, None)],
    );
    if let Some(ports) = s.ports.as_mut() {
        ports.push(EndpointPort {
            port: Some(53),
            protocol: Some("UDP".into()),
            ..EndpointPort::default()
        });
    }
    let plan = plan([&s], &registry_with(&["pay.shop"]), &config());
    let ids: Vec<InstanceId> = plan
        .commands
        .iter()
        .filter_map(|c| match c {
            Command::Observe { instance, .. } => Some(instance.id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, vec![id("u1:8080"), id("u1:9090")]);
    assert_eq!(plan.report.skipped.ports_unusable, 1);
}

#[test]
fn replacement_pod_is_forgotten_before_its_successor_is_observed() {
    // Goal: a new pod reusing its predecessor's IP is accepted in one pass.
    let mut registry = registry_with(&["pay.shop"]);
    let before = slice(
        "shop",
        "pay-abc",
        "pay",
        &[8080],
        vec![ep("old", "10.0.0.1", None, None)],
    );
    let first = plan([&before], &registry, &config());
    assert!(apply_all(&mut registry, &first.commands).is_empty());

    let after = slice(
        "shop",
        "pay-abc",
        "pay",
        &[8080],
        vec![ep("new", "10.0.0.1", None, None)],
    );
    let second = plan([&after], &registry, &config());
    assert!(matches!(second.commands[0], Command::Forget { .. }));
    assert!(matches!(second.commands[1], Command::Observe { .. }));
    assert!(apply_all(&mut registry, &second.commands).is_empty());
    assert!(registry.is_retired(&id("old:8080")));
    assert!(registry.instance(&id("new:8080")).is_some());
    assert!(plan([&after], &registry, &config()).commands.is_empty());
}

#[test]
fn retired_pod_reappearing_is_skipped_not_reproposed() {
    // Goal: ids are never reused, so a forgotten pod's endpoint is counted, not proposed.
    let mut registry = registry_with(&["pay.shop"]);
    let s = slice(
        "shop",
        "pay-abc",
        "pay",
        &[8080],
        vec![ep("u1", "10.0.0.1", None, None)],
    );
    let first = plan([&s], &registry, &config()).commands;
    apply_all(&mut registry, &first);
    let gone = plan([], &registry, &config()).commands;
    apply_all(&mut registry, &gone);
    assert!(registry.is_retired(&id("u1:8080")));
    let again = plan([&s], &registry, &config());
    assert!(again.commands.is_empty());
    assert_eq!(again.report.skipped.retired, 1);
}

#[test]
fn other_clusters_and_registered_instances_are_never_forgotten() {
    // Goal: scope — only this cluster's orchestrated instances may be forgotten.
    let mut registry = registry_with(&["pay.shop"]);
    let register = Command::Register(Registration {
        service: "pay.shop".parse().unwrap(),
        locality: Locality {
            region: "eu".parse().unwrap(),
            zone: "a".parse().unwrap(),
            node: "n".parse().unwrap(),
        },
        address: "10.9.9.9:80"
            .parse::<std::net::SocketAddr>()
            .map(|a| Address {
                ip: a.ip(),
                port: a.port(),
            })
            .unwrap(),
        weight: Weight::DEFAULT,
        tags: BTreeSet::new(),
        metadata: BTreeMap::new(),
        lease_ms: 30_000,
    });
    assert!(matches!(
        registry.apply(Stamped {
            at_ms: 1,
            command: register
        }),
        Ok(Applied::Registered { .. })
    ));
    let other = DiffConfig {
        cluster: "c2".into(),
        ..config()
    };
    let s = slice(
        "shop",
        "pay-abc",
        "pay",
        &[8080],
        vec![ep("u1", "10.0.0.1", None, None)],
    );
    let theirs = plan([&s], &registry, &other).commands;
    assert!(apply_all(&mut registry, &theirs).is_empty());
    let mine = plan([], &registry, &config());
    assert!(mine.commands.is_empty(), "{:?}", mine.commands);
    let ns_scoped = DiffConfig {
        namespace: Some("elsewhere".into()),
        ..other
    };
    assert!(plan([], &registry, &ns_scoped).commands.is_empty());
}

#[test]
fn a_pod_in_two_slices_is_one_instance_and_terminating_wins() {
    // Goal: during slice reshuffles the same endpoint may appear twice.
    let a = slice(
        "shop",
        "pay-a",
        "pay",
        &[8080],
        vec![ep("u1", "10.0.0.1", None, None)],
    );
    let b = slice(
        "shop",
        "pay-b",
        "pay",
        &[8080],
        vec![conditions(
            ep("u1", "10.0.0.1", None, None),
            false,
            true,
            true,
        )],
    );
    for order in [[&a, &b], [&b, &a]] {
        let plan = plan(order, &registry_with(&["pay.shop"]), &config());
        assert!(matches!(
            plan.commands.as_slice(),
            [Command::Observe { draining: true, .. }]
        ));
        assert_eq!(plan.report.skipped.duplicates, 1);
    }
}

#[test]
fn slices_of_the_other_family_or_without_a_service_label_are_skipped() {
    // Goal: IPv6 and FQDN slices and orphan slices map to nothing, visibly.
    let mut v6 = slice(
        "shop",
        "pay-v6",
        "pay",
        &[8080],
        vec![ep("u1", "fd00::1", None, None)],
    );
    v6.address_type = "IPv6".into();
    let mut orphan = slice(
        "shop",
        "orphan",
        "x",
        &[80],
        vec![ep("u2", "10.0.0.2", None, None)],
    );
    orphan.metadata.labels = None;
    let plan = plan([&v6, &orphan], &registry_with(&["pay.shop"]), &config());
    assert!(plan.commands.is_empty());
    assert_eq!(plan.report.skipped.slices_other_address_type, 1);
    assert_eq!(plan.report.skipped.slices_without_service, 1);
}

#[test]
fn the_report_round_trips_through_json() {
    // Goal: the report is an API type.
    let s = slice(
        "shop",
        "pay-abc",
        "pay",
        &[8080],
        vec![ep("u1", "10.0.0.1", None, None)],
    );
    let report = plan([&s], &registry_with(&["pay.shop"]), &config()).report;
    let json = serde_json::to_string(&report).unwrap();
    let back: ReconciliationDiff = serde_json::from_str(&json).unwrap();
    assert_eq!(back, report);
}

// === properties ===

/// A pod universe: uid `n` always has IP `10.0.0.(n % 8 + 1)`, service `s(n % 8 % 3)` (s2
/// is not registered; pods that share an IP share a service, so replacements collide) and zone `z(n % 3)`; a generation holds at most one live pod per IP,
/// as a cluster does. Each generation is: per IP slot, which of its 3 pods (if any) is
/// live, and whether it is terminating.
fn generation() -> impl Strategy<Value = Vec<Option<(u8, bool)>>> {
    proptest::collection::vec(proptest::option::of((0u8..3, any::<bool>())), 8)
}

fn slices_of(generation: &[Option<(u8, bool)>], split: usize) -> Vec<EndpointSlice> {
    let mut by_service: BTreeMap<u8, Vec<Endpoint>> = BTreeMap::new();
    for (slot, pod) in generation.iter().enumerate() {
        let Some((which, terminating)) = pod else {
            continue;
        };
        let uid = slot as u8 + 8 * which;
        let e = ep(
            &format!("uid-{uid}"),
            &format!("10.0.0.{}", slot + 1),
            Some(&format!("z{}", uid % 3)),
            Some("n"),
        );
        let e = conditions(e, !terminating, true, *terminating);
        by_service.entry(slot as u8 % 3).or_default().push(e);
    }
    let mut out = Vec::new();
    for (svc, endpoints) in by_service {
        // Spread each service over several slices, as the EndpointSlice controller does.
        for (i, chunk) in endpoints.chunks(split.max(1)).enumerate() {
            out.push(slice(
                "ns",
                &format!("s{svc}-{i}"),
                &format!("s{svc}"),
                &[80],
                chunk.to_vec(),
            ));
        }
    }
    out
}

proptest! {
    #[test]
    fn every_generation_converges_in_one_pass_without_refusals(
        generations in proptest::collection::vec(generation(), 1..5),
        split in 1usize..4,
    ) {
        // Goal: Forget-before-Observe and the retired filter make every pass clean, and a
        // second pass over the same list proposes nothing.
        let mut registry = registry_with(&["s0.ns", "s1.ns"]);
        for g in &generations {
            let slices = slices_of(g, split);
            let p = plan(&slices, &registry, &config());
            let refusals = apply_all(&mut registry, &p.commands);
            prop_assert!(refusals.is_empty(), "{:?}", refusals);
            let again = plan(&slices, &registry, &config());
            prop_assert!(again.commands.is_empty(), "{:?}", again.commands);
            prop_assert!(again.report.totals.converged());
            // Every live pod of a managed service is in the registry unless retired.
            for s in &slices {
                for e in &s.endpoints {
                    let uid = e.target_ref.as_ref().and_then(|t| t.uid.clone()).unwrap();
                    let iid = id(&format!("{uid}:80"));
                    let managed = !s.metadata.name.as_deref().unwrap().starts_with("s2");
                    let present = registry.instance(&iid).is_some();
                    prop_assert_eq!(present, managed && !registry.is_retired(&iid));
                }
            }
        }
    }

    #[test]
    fn the_plan_does_not_depend_on_slice_order(
        g in generation(),
        split in 1usize..4,
        seed in any::<u64>(),
    ) {
        // Goal: the store hands slices over in hash order; the output must not care.
        let registry = registry_with(&["s0.ns", "s1.ns"]);
        let slices = slices_of(&g, split);
        let mut shuffled = slices.clone();
        // A cheap deterministic permutation from the seed.
        let n = shuffled.len();
        for i in (1..n).rev() {
            let j = (seed.wrapping_mul(6364136223846793005).wrapping_add(i as u64) % (i as u64 + 1)) as usize;
            shuffled.swap(i, j);
        }
        prop_assert_eq!(plan(&slices, &registry, &config()), plan(&shuffled, &registry, &config()));
    }
}
