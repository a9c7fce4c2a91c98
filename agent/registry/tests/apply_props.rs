//! `DesiredState::apply` over arbitrary command sequences, hostile values included: it never
//! panics, a refusal changes nothing but the registry clock, two replicas applying the same
//! log agree (one of them restarted from a snapshot half way), and ids are never reused.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use proptest::prelude::*;
use waymark_core::contract::{CapabilityProfile, HealthContract, ProbeKind};
use waymark_core::model::{
    Address, Instance, InstanceId, Locality, NAME_LEN_MAX, NodeName, Origin, RegionName,
    ServiceName, ZoneName,
};
use waymark_core::units::{Permille, Weight};
use waymark_registry::acl::AclCommand;
use waymark_registry::state::{
    Applied, Command, DesiredState, EvacuationIntent, RegionFailoverIntent, RegionFailoverRecord,
    Registration, ServicePolicyRecord, Stamped,
};

/// Names near every edge: ordinary, the longest a service may have, and the longest a
/// name may have at all (which leaves no room for a registered id).
fn service_name() -> impl Strategy<Value = ServiceName> {
    prop_oneof![
        6 => Just("pay".to_owned()),
        2 => Just("web".to_owned()),
        1 => Just("a".repeat(NAME_LEN_MAX - 22)),
        1 => Just("b".repeat(NAME_LEN_MAX - 2)),
        1 => Just("c".repeat(NAME_LEN_MAX)),
    ]
    .prop_map(|n| ServiceName::try_new(n).unwrap())
}

fn instance_id() -> impl Strategy<Value = InstanceId> {
    prop_oneof![
        (1u64..6).prop_map(|n| format!("pay-r{n}")),
        (1u64..6).prop_map(|n| format!("web-r{n}")),
        Just("pod-1".to_owned()),
        Just("pod-2".to_owned()),
        Just("ext-1".to_owned()),
    ]
    .prop_map(|n| InstanceId::try_new(n).unwrap())
}

fn address() -> impl Strategy<Value = Address> {
    let ip = prop_oneof![
        6 => (1u8..4).prop_map(|l| IpAddr::V4(Ipv4Addr::new(10, 0, 0, l))),
        1 => Just(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        1 => Just(IpAddr::V4(Ipv4Addr::new(224, 0, 0, 1))),
        1 => Just(IpAddr::V6(Ipv6Addr::LOCALHOST)),
    ];
    (
        ip,
        prop_oneof![1 => Just(0u16), 3 => Just(80), 3 => Just(8080), 1 => any::<u16>()],
    )
        .prop_map(|(ip, port)| Address { ip, port })
}

fn locality() -> Locality {
    Locality {
        region: RegionName::try_new("eu").unwrap(),
        zone: ZoneName::try_new("a").unwrap(),
        node: NodeName::try_new("n1").unwrap(),
    }
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(String::new()),
        4 => Just("team".to_owned()),
        1 => (0usize..3000).prop_map(|n| "x".repeat(n)),
    ]
}

fn labels() -> impl Strategy<Value = (BTreeSet<String>, BTreeMap<String, String>)> {
    (
        prop::collection::btree_set(text(), 0..3),
        prop_oneof![3 => 0usize..3, 1 => 0usize..80]
            .prop_map(|n| (0..n).map(|i| (format!("k{i}"), "v".into())).collect()),
    )
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_millis(250)),
        Just(Duration::from_secs(1)),
        Just(Duration::from_secs(10)),
        Just(Duration::from_secs(3600)),
        Just(Duration::from_millis(u64::MAX)),
        any::<u64>().prop_map(Duration::from_millis),
    ]
}

/// Contracts from the default, with any field pushed anywhere — the overflow cases
/// (`u64::MAX` ms intervals, huge silence factors) included.
fn contract() -> impl Strategy<Value = HealthContract> {
    prop_oneof![3 => Just(HealthContract::default()), 2 => hostile_contract()]
}

fn hostile_contract() -> impl Strategy<Value = HealthContract> {
    (
        prop_oneof![
            Just(CapabilityProfile::NO_SELF_REPORT),
            Just(CapabilityProfile::FULL),
            Just(CapabilityProfile::NO_READINESS),
        ],
        duration(),
        duration(),
        duration(),
        prop_oneof![Just(3u32), Just(2), Just(0), any::<u32>()],
        prop_oneof![Just(5u64), Just(0), any::<u64>()],
        any::<bool>(),
        duration(),
    )
        .prop_map(
            |(
                profile,
                probe_interval,
                self_report,
                half_life,
                silence,
                min_requests,
                probed,
                slow_start,
            )| {
                let mut c = HealthContract {
                    profile,
                    ..HealthContract::default()
                };
                if !profile.probe {
                    c.probe = None;
                } else if let Some(p) = c.probe.as_mut()
                    && probed
                {
                    p.interval = probe_interval;
                    p.kind = ProbeKind::Tcp;
                }
                c.self_report_interval = self_report;
                c.scoring.half_life = half_life;
                c.scoring.silence_factor = silence;
                c.passive.min_requests = min_requests;
                c.slow_start = slow_start;
                c
            },
        )
}

fn instance() -> impl Strategy<Value = Instance> {
    (
        instance_id(),
        service_name(),
        address(),
        any::<u32>(),
        labels(),
    )
        .prop_map(
            |(id, service, address, weight, (tags, metadata))| Instance {
                id,
                service,
                locality: locality(),
                address,
                origin: Origin::Orchestrator,
                weight: Weight::new(weight),
                tags,
                metadata,
            },
        )
}

fn policy() -> impl Strategy<Value = ServicePolicyRecord> {
    (
        prop::option::of(0u16..=1000),
        0usize..70,
        prop::option::of(prop::collection::btree_set(service_name(), 0..3)),
    )
        .prop_map(|(min, zones, callers)| ServicePolicyRecord {
            min_healthy_override: min.and_then(Permille::new),
            failover_zones: (0..zones)
                .map(|i| ZoneName::try_new(format!("z{i}")).unwrap())
                .collect(),
            failover_regions: Vec::new(),
            allowed_callers: callers,
            max_manual_withdrawals: None,
        })
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        4 => (service_name(), text(), contract()).prop_map(|(service, owner, contract)| {
            Command::PutService {
                service,
                owner,
                contract,
            }
        }),
        1 => service_name().prop_map(|service| Command::RemoveService { service }),
        6 => (service_name(), address(), labels(), any::<u64>(), any::<u32>()).prop_map(
            |(service, address, (tags, metadata), lease, weight)| {
                Command::Register(Registration {
                    service,
                    locality: locality(),
                    address,
                    weight: Weight::new(weight),
                    tags,
                    metadata,
                    lease_ms: [0, 5_000, 30_000, 30_000, 30_000, u64::MAX, lease][(lease % 7) as usize],
                })
            }
        ),
        1 => instance_id().prop_map(|instance| Command::Renew { instance }),
        1 => instance_id().prop_map(|instance| Command::Deregister { instance }),
        1 => Just(Command::ExpireLeases),
        1 => prop::collection::vec(instance_id(), 0..4)
            .prop_map(|instances| Command::ExpireInstances { instances }),
        1 => Just(Command::RestartLeases),
        3 => (instance(), any::<bool>())
            .prop_map(|(instance, draining)| Command::Observe { instance, draining }),
        1 => instance().prop_map(|mut instance| {
            instance.origin = Origin::External;
            Command::DeclareExternal { instance }
        }),
        1 => instance_id().prop_map(|instance| Command::RemoveExternal { instance }),
        1 => instance_id().prop_map(|instance| Command::Forget { instance }),
        1 => (instance_id(), prop::option::of(text()))
            .prop_map(|(instance, reason)| Command::Maintenance { instance, reason }),
        1 => (service_name(), policy()).prop_map(|(service, policy)| Command::SetPolicy { service, policy }),
        1 => prop_oneof![
            Just(EvacuationIntent::Evacuate { manual: true }),
            Just(EvacuationIntent::ShiftBack),
        ]
        .prop_map(|intent| Command::Evacuation {
            zone: ZoneName::try_new("a").unwrap(),
            intent,
        }),
        1 => (text(), text()).prop_map(|(actor, reason)| Command::RegionFailover {
            region: RegionName::try_new("us").unwrap(),
            intent: RegionFailoverIntent::Failover { manual: false },
            actor,
            reason,
        }),
        1 => (text(), text()).prop_map(|(actor, reason)| Command::RegionFailoverProgress {
            region: RegionName::try_new("us").unwrap(),
            progress: Some(RegionFailoverRecord {
                moved: Permille::ONE,
                back: false,
                manual: false,
                awaiting_completion: false,
                actor,
                reason,
            }),
        }),
        1 => prop_oneof![
            Just(AclCommand::Bootstrap { operator: "alice".into(), token: None }),
            Just(AclCommand::Bootstrap { operator: String::new(), token: None }),
            Just(AclCommand::RemoveToken { name: "ci".into() }),
        ]
        .prop_map(|change| Command::Acl { change }),
        1 => (instance_id(), 0usize..20).prop_map(|(target, n)| Command::SetAssignment {
            assignment: BTreeMap::from([(
                target,
                (0..n)
                    .map(|i| NodeName::try_new(format!("n{i}")).unwrap())
                    .collect(),
            )]),
        }),
        1 => (instance_id(), 0usize..20, instance_id()).prop_map(|(target, n, gone)| {
            Command::PatchAssignment {
                set: BTreeMap::from([(
                    target,
                    (0..n)
                        .map(|i| NodeName::try_new(format!("n{i}")).unwrap())
                        .collect(),
                )]),
                remove: BTreeSet::from([gone]),
            }
        }),
    ]
}

fn log() -> impl Strategy<Value = Vec<Stamped>> {
    let entry = (
        prop_oneof![8 => 0u64..100_000, 1 => Just(u64::MAX - 1), 1 => Just(u64::MAX)],
        command(),
    )
        .prop_map(|(at_ms, command)| Stamped { at_ms, command });
    // Every log starts by declaring `pay` well, so the paths behind a known service
    // (registration, leases, retirement) are reached, not only the refusals in front.
    prop::collection::vec(entry, 1..60).prop_map(|mut log| {
        log.insert(
            0,
            Stamped {
                at_ms: 0,
                command: Command::PutService {
                    service: ServiceName::try_new("pay").unwrap(),
                    owner: "team".into(),
                    contract: HealthContract::default(),
                },
            },
        );
        log
    })
}

/// The state with its clock removed: a refusal may move the clock and nothing else.
fn without_clock(s: &DesiredState) -> serde_json::Value {
    let mut v = serde_json::to_value(s).unwrap();
    v.as_object_mut().unwrap().remove("clock_ms");
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn apply_is_total_deterministic_and_refusals_change_nothing(log in log()) {
        let mut a = DesiredState::new();
        let mut issued = BTreeSet::new();
        for (i, entry) in log.iter().enumerate() {
            let before = without_clock(&a);
            match a.apply(entry.clone()) {
                Ok(Applied::Registered { instance, .. }) => {
                    prop_assert!(issued.insert(instance.clone()), "id {instance} issued twice");
                }
                Ok(_) => {}
                Err(_) => prop_assert_eq!(&before, &without_clock(&a), "refused entry {} changed the state", i),
            }
            for r in a.instances() {
                prop_assert!(!a.is_retired(&r.instance.id), "{} is live and retired", r.instance.id);
            }
        }
        // A replica that applies the first half, restarts from a snapshot and applies the
        // rest reaches the same state.
        let half = log.len() / 2;
        let mut b = DesiredState::new();
        for entry in &log[..half] {
            let _ = b.apply(entry.clone());
        }
        let snapshot = serde_json::to_vec(&b).unwrap();
        let mut b: DesiredState = serde_json::from_slice(&snapshot).unwrap();
        for entry in &log[half..] {
            let _ = b.apply(entry.clone());
        }
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(serde_json::to_value(&a).unwrap(), serde_json::to_value(&b).unwrap());
    }

    #[test]
    fn a_command_its_precheck_refuses_is_refused_the_same_way_by_apply(command in command()) {
        // The API refuses with `check` before proposing; apply repeats it. They agree.
        let checked = command.check();
        let mut s = DesiredState::new();
        let applied = s.apply(Stamped { at_ms: 1, command });
        if let Err(e) = checked {
            prop_assert_eq!(applied, Err(e));
        }
    }
}

#[test]
fn the_longest_service_name_still_forms_registered_ids() {
    // Goal: the room for the sequence is reserved when the service is declared.
    let name = "a".repeat(NAME_LEN_MAX - 22);
    let mut s = DesiredState::new();
    let service = ServiceName::try_new(&name).unwrap();
    s.apply(Stamped {
        at_ms: 1,
        command: Command::PutService {
            service: service.clone(),
            owner: "team".into(),
            contract: HealthContract::default(),
        },
    })
    .unwrap();
    let applied = s
        .apply(Stamped {
            at_ms: 2,
            command: Command::Register(Registration {
                service,
                locality: locality(),
                address: Address {
                    ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                    port: 80,
                },
                weight: Weight::DEFAULT,
                tags: BTreeSet::new(),
                metadata: BTreeMap::new(),
                lease_ms: 30_000,
            }),
        })
        .unwrap();
    assert!(matches!(applied, Applied::Registered { .. }), "{applied:?}");
}
