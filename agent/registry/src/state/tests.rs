//! The registry's commands: each refusal changes nothing; ids are never reused.

use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;
use waymark_core::model::{RegionName, ZoneName};

use super::*;

fn svc() -> ServiceName {
    ServiceName::try_new("pay").unwrap()
}

fn locality() -> Locality {
    Locality {
        region: RegionName::try_new("eu").unwrap(),
        zone: ZoneName::try_new("a").unwrap(),
        node: NodeName::try_new("n1").unwrap(),
    }
}

fn addr(last: u8) -> Address {
    Address {
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)),
        port: 8080,
    }
}

fn at(at_ms: u64, command: Command) -> Stamped {
    Stamped { at_ms, command }
}

fn registration(last: u8) -> Command {
    Command::Register(Registration {
        service: svc(),
        locality: locality(),
        address: addr(last),
        weight: Weight::DEFAULT,
        tags: BTreeSet::new(),
        metadata: BTreeMap::new(),
        lease_ms: 30_000,
    })
}

fn with_service() -> DesiredState {
    let mut s = DesiredState::new();
    let put = Command::PutService {
        service: svc(),
        owner: "team-pay".into(),
        contract: HealthContract::default(),
    };
    s.apply(at(1_000, put)).unwrap();
    s
}

fn registered(s: &mut DesiredState, at_ms: u64, last: u8) -> InstanceId {
    match s.apply(at(at_ms, registration(last))).unwrap() {
        Applied::Registered { instance, .. } => instance,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_new_leader_gives_every_lease_a_whole_length_before_expiring_any() {
    let mut s = with_service();
    // Leased 30 s at t=10 s: ends at 40 s.
    let old = registered(&mut s, 10_000, 1);
    // Registered at t=55 s: ends at 85 s.
    let young = registered(&mut s, 55_000, 2);
    // No leader from 12 s to 60 s: `old` could not renew, and is not retired for it.
    assert_eq!(
        s.apply(at(60_000, Command::RestartLeases)),
        Ok(Applied::LeasesRestarted { extended: 2 })
    );
    // A second restart at the same time finds every lease a whole length ahead.
    assert_eq!(
        s.apply(at(60_000, Command::RestartLeases)),
        Ok(Applied::LeasesRestarted { extended: 0 })
    );
    assert_eq!(s.next_expiry_ms(), Some(90_000));
    assert_eq!(
        s.apply(at(89_999, Command::ExpireLeases)),
        Ok(Applied::Retired { instances: vec![] })
    );
    assert_eq!(
        s.apply(at(90_000, Command::ExpireLeases)),
        Ok(Applied::Retired {
            instances: vec![
                (old, RetireCause::LeaseExpired),
                (young, RetireCause::LeaseExpired)
            ]
        })
    );
}

#[test]
fn named_expiry_retires_only_live_leased_instances_and_is_bounded() {
    // Goal: the leader's named expiry is total: what is gone or not leased is skipped,
    // duplicates retire once, and an oversized list changes nothing.
    let mut s = with_service();
    let leased = registered(&mut s, 10_000, 1);
    let kept = registered(&mut s, 10_000, 2);
    let orchestrated = InstanceId::try_new("pod-1").unwrap();
    s.apply(at(
        10_000,
        Command::Observe {
            instance: pod("pod-1", 9),
            draining: false,
        },
    ))
    .unwrap();
    let unknown = InstanceId::try_new("nobody").unwrap();
    let too_many = vec![leased.clone(); EXPIRE_BATCH_MAX + 1];
    assert_eq!(
        s.apply(at(
            11_000,
            Command::ExpireInstances {
                instances: too_many
            }
        )),
        Err(RegistryError::TooMany {
            field: "instances",
            count: EXPIRE_BATCH_MAX + 1,
            max: EXPIRE_BATCH_MAX
        })
    );
    assert!(!s.is_retired(&leased));
    // Named before its committed end: the leader saw it end (renewals are its own).
    assert_eq!(
        s.apply(at(
            11_000,
            Command::ExpireInstances {
                instances: vec![
                    leased.clone(),
                    leased.clone(),
                    orchestrated.clone(),
                    unknown
                ]
            }
        )),
        Ok(Applied::Retired {
            instances: vec![(leased.clone(), RetireCause::LeaseExpired)]
        })
    );
    assert!(s.is_retired(&leased));
    assert!(!s.is_retired(&kept) && s.instance(&orchestrated).is_some());
}

#[test]
fn leases_due_takes_the_later_of_the_committed_and_the_renewed_end() {
    let mut s = with_service();
    let a = registered(&mut s, 10_000, 1);
    let b = registered(&mut s, 10_000, 2);
    let renewed: std::collections::HashMap<_, _> = [(a.clone(), 70_000)].into();
    assert_eq!(s.leases_due(39_999, &renewed), Vec::<InstanceId>::new());
    assert_eq!(s.leases_due(40_000, &renewed), vec![b.clone()]);
    assert_eq!(s.leases_due(70_000, &renewed).len(), 2);
    // A renewal never shortens the committed end.
    let early: std::collections::HashMap<_, _> = [(b.clone(), 20_000)].into();
    assert_eq!(s.leases_due(39_999, &early), Vec::<InstanceId>::new());
    assert_eq!(s.renewable(&a), Ok(30_000));
    assert!(matches!(
        s.renewable(&InstanceId::try_new("nobody").unwrap()),
        Err(RegistryError::UnknownInstance { .. })
    ));
}

#[test]
fn a_registration_is_leased_renewed_and_expires() {
    let mut s = with_service();
    let id = registered(&mut s, 10_000, 1);
    assert_eq!(s.next_expiry_ms(), Some(40_000));
    assert_eq!(
        s.apply(at(
            20_000,
            Command::Renew {
                instance: id.clone()
            }
        )),
        Ok(Applied::Renewed {
            expires_at_ms: 50_000
        })
    );
    assert_eq!(
        s.apply(at(49_999, Command::ExpireLeases)),
        Ok(Applied::Retired { instances: vec![] })
    );
    let expired = s.apply(at(50_000, Command::ExpireLeases)).unwrap();
    assert_eq!(
        expired,
        Applied::Retired {
            instances: vec![(id.clone(), RetireCause::LeaseExpired)]
        }
    );
    assert!(s.is_retired(&id));
    assert_eq!(
        s.apply(at(
            50_001,
            Command::Renew {
                instance: id.clone()
            }
        )),
        Err(RegistryError::Retired { instance: id })
    );
}

#[test]
fn ids_are_issued_here_and_never_reused() {
    let mut s = with_service();
    let first = registered(&mut s, 10_000, 1);
    s.apply(at(
        11_000,
        Command::Deregister {
            instance: first.clone(),
        },
    ))
    .unwrap();
    let second = registered(&mut s, 12_000, 1);
    assert_ne!(first, second, "the same address gets a new id");
}

#[test]
fn a_registration_never_takes_an_id_an_orchestrated_instance_holds_or_held() {
    // Goal: a pod named `pay-r1` was replaced by the first registration, and a retired
    // `pay-r2` came back to life under the second — live and retired at once.
    let mut s = with_service();
    s.apply(at(
        2_000,
        Command::Observe {
            instance: pod("pay-r1", 1),
            draining: false,
        },
    ))
    .unwrap();
    for (name, last) in [("pay-r2", 2), ("pay-r3", 3)] {
        s.apply(at(
            2_000,
            Command::Observe {
                instance: pod(name, last),
                draining: false,
            },
        ))
        .unwrap();
        s.apply(at(
            2_000,
            Command::Forget {
                instance: InstanceId::try_new(name).unwrap(),
            },
        ))
        .unwrap();
    }
    let id = registered(&mut s, 3_000, 9);
    assert_eq!(id.as_str(), "pay-r4");
    let pod = s.instance(&InstanceId::try_new("pay-r1").unwrap()).unwrap();
    assert_eq!(
        pod.instance.origin,
        Origin::Orchestrator,
        "the pod is untouched"
    );
    for r in s.instances() {
        assert!(
            !s.is_retired(&r.instance.id),
            "{} is live and retired",
            r.instance.id
        );
    }
    assert_eq!(registered(&mut s, 3_000, 10).as_str(), "pay-r5");
}

#[test]
fn bad_registrations_are_refused_and_change_nothing() {
    let mut s = with_service();
    registered(&mut s, 10_000, 1);
    let before = s.clone();
    let mut zero_port = registration(2);
    if let Command::Register(r) = &mut zero_port {
        r.address.port = 0;
    }
    assert!(matches!(
        s.apply(at(11_000, zero_port)),
        Err(RegistryError::BadAddress { .. })
    ));
    assert!(matches!(
        s.apply(at(11_000, registration(1))),
        Err(RegistryError::DuplicateAddress { .. })
    ));
    let mut short = registration(3);
    if let Command::Register(r) = &mut short {
        r.lease_ms = 10;
    }
    assert_eq!(
        s.apply(at(11_000, short)),
        Err(RegistryError::BadLease { lease_ms: 10 })
    );
    let unknown = InstanceId::try_new("nope").unwrap();
    assert!(matches!(
        s.apply(at(11_000, Command::Renew { instance: unknown })),
        Err(RegistryError::UnknownInstance { .. })
    ));
    let mut s_cmp = s.clone();
    s_cmp.clock_ms = before.clock_ms;
    assert_eq!(s_cmp, before, "only the clock moved");
}

#[test]
fn a_contract_that_breaks_a_rule_is_refused_with_the_field() {
    let mut s = DesiredState::new();
    let mut contract = HealthContract::default();
    contract.scoring.readmit = contract.scoring.remove;
    let err = s
        .apply(at(
            1,
            Command::PutService {
                service: svc(),
                owner: "t".into(),
                contract,
            },
        ))
        .unwrap_err();
    assert!(err.to_string().contains("scoring.readmit"), "{err}");
    assert!(s.service(&svc()).is_none());
}

#[test]
fn a_service_with_instances_cannot_be_removed() {
    let mut s = with_service();
    registered(&mut s, 10_000, 1);
    assert!(matches!(
        s.apply(at(11_000, Command::RemoveService { service: svc() })),
        Err(RegistryError::ServiceInUse { count: 1, .. })
    ));
}

#[test]
fn orchestrated_instances_are_observed_forgotten_and_not_leased() {
    let mut s = with_service();
    let pod = Instance {
        id: InstanceId::try_new("pod-7f3a").unwrap(),
        service: svc(),
        locality: locality(),
        address: addr(9),
        origin: Origin::Orchestrator,
        weight: Weight::DEFAULT,
        tags: BTreeSet::new(),
        metadata: BTreeMap::new(),
    };
    s.apply(at(
        2_000,
        Command::Observe {
            instance: pod.clone(),
            draining: false,
        },
    ))
    .unwrap();
    assert!(matches!(
        s.apply(at(
            3_000,
            Command::Renew {
                instance: pod.id.clone()
            }
        )),
        Err(RegistryError::NotLeased { .. })
    ));
    s.apply(at(
        4_000,
        Command::Forget {
            instance: pod.id.clone(),
        },
    ))
    .unwrap();
    assert_eq!(
        s.apply(at(
            5_000,
            Command::Observe {
                instance: pod.clone(),
                draining: false,
            }
        )),
        Err(RegistryError::Retired { instance: pod.id })
    );
}

#[test]
fn the_clock_never_runs_backwards_across_leaders() {
    let mut s = with_service();
    registered(&mut s, 100_000, 1);
    // A new leader whose clock is behind stamps an earlier time: leases still expire on
    // the registry's clock, which did not go back.
    s.apply(at(50_000, Command::ExpireLeases)).unwrap();
    assert_eq!(s.clock_ms(), 100_000);
    assert_eq!(s.next_expiry_ms(), Some(130_000));
}

#[test]
fn commands_survive_the_wire() {
    let cmd = at(7, registration(4));
    let back: Stamped = serde_json::from_str(&serde_json::to_string(&cmd).unwrap()).unwrap();
    assert_eq!(back, cmd);
}

fn command() -> impl Strategy<Value = (u64, u8, u8)> {
    (0u64..20_000, 0u8..5, 1u8..6)
}

proptest! {
    #[test]
    fn replicas_applying_the_same_log_agree_and_ids_never_repeat(log in prop::collection::vec(command(), 1..80)) {
        let mut a = with_service();
        let mut b = with_service();
        let mut issued: Vec<InstanceId> = Vec::new();
        let mut clock = 1_000u64;
        for (dt, op, last) in log {
            clock += dt;
            let live: Vec<InstanceId> = a.instances().map(|r| r.instance.id.clone()).collect();
            let pick = live.get(usize::from(last) % live.len().max(1)).cloned();
            let cmd = match (op, pick) {
                (0, _) | (_, None) => registration(last),
                (1, Some(id)) => Command::Renew { instance: id },
                (2, Some(id)) => Command::Deregister { instance: id },
                _ => Command::ExpireLeases,
            };
            let (ra, rb) = (a.apply(at(clock, cmd.clone())), b.apply(at(clock, cmd)));
            prop_assert_eq!(&ra, &rb);
            if let Ok(Applied::Registered { instance, .. }) = ra {
                prop_assert!(!issued.contains(&instance), "id {} reused", instance);
                issued.push(instance);
            }
        }
        prop_assert_eq!(a, b);
    }
}

#[test]
fn external_endpoints_need_a_service_without_readiness_signals() {
    let external = |id: &str, last: u8| Instance {
        id: InstanceId::try_new(id).unwrap(),
        service: svc(),
        locality: locality(),
        address: addr(last),
        origin: Origin::Orchestrator, // the registry sets the origin
        weight: Weight::DEFAULT,
        tags: BTreeSet::new(),
        metadata: BTreeMap::new(),
    };
    let mut s = with_service();
    let before = s.clone();
    let refused = s.apply(at(
        10,
        Command::DeclareExternal {
            instance: external("acme-1", 9),
        },
    ));
    assert!(matches!(
        refused,
        Err(RegistryError::BadPolicy {
            field: "contract.profile",
            ..
        })
    ));
    assert_eq!(s.instances().count(), before.instances().count());
    s.apply(at(
        11,
        Command::PutService {
            service: svc(),
            owner: "partners".into(),
            contract: HealthContract {
                profile: CapabilityProfile::NO_READINESS,
                probe: None,
                ..HealthContract::default()
            },
        },
    ))
    .unwrap();
    s.apply(at(
        12,
        Command::DeclareExternal {
            instance: external("acme-1", 9),
        },
    ))
    .unwrap();
    let record = s.instance(&InstanceId::try_new("acme-1").unwrap()).unwrap();
    assert_eq!(record.instance.origin, Origin::External);
    assert_eq!(record.lease_expires_at_ms, None);
}

#[test]
fn a_decoded_state_still_refuses_duplicate_addresses_and_frees_retired_ones() {
    let mut s = with_service();
    let id = registered(&mut s, 10, 1);
    let text = serde_json::to_string(&s).unwrap();
    let mut back: DesiredState = serde_json::from_str(&text).unwrap();
    assert_eq!(back, s);
    assert!(matches!(
        back.apply(at(11, registration(1))),
        Err(RegistryError::DuplicateAddress { existing, .. }) if existing == id
    ));
    back.apply(at(12, Command::Deregister { instance: id }))
        .unwrap();
    back.apply(at(13, registration(1))).unwrap();
}

fn peer() -> RegionName {
    RegionName::try_new("us-east").unwrap()
}

fn failover(actor: &str, reason: &str) -> Command {
    Command::RegionFailover {
        region: peer(),
        intent: RegionFailoverIntent::Failover { manual: true },
        actor: actor.into(),
        reason: reason.into(),
    }
}

#[test]
fn a_region_failover_must_say_who_asked_and_why() {
    // Goal: ADR-15 — moving a region's traffic is privileged: named and justified, bounded.
    let mut s = DesiredState::new();
    let long = "x".repeat(JUSTIFICATION_LEN_MAX + 1);
    for (actor, reason, field) in [
        ("", "front door down", "actor"),
        ("ops", "  ", "reason"),
        ("ops", long.as_str(), "reason"),
    ] {
        let before = s.clone();
        let err = s.apply(at(5, failover(actor, reason))).unwrap_err();
        assert!(
            matches!(err, RegistryError::BadJustification { field: f, .. } if f == field),
            "{err:?}"
        );
        assert_eq!(s.region_failovers(), before.region_failovers());
    }
    let applied = s.apply(at(6, failover("ops", "front door down"))).unwrap();
    assert_eq!(
        applied,
        Applied::RegionFailover {
            region: peer(),
            intent: RegionFailoverIntent::Failover { manual: true },
            actor: "ops".into(),
            reason: "front door down".into(),
        }
    );
    // The intent alone records no progress: the leader's assembler decides what happened.
    assert!(s.region_failovers().is_empty());
}

#[test]
fn region_failover_progress_is_recorded_and_cleared() {
    let mut s = DesiredState::new();
    let record = RegionFailoverRecord {
        moved: Permille::new(500).unwrap(),
        back: false,
        manual: true,
        awaiting_completion: false,
        actor: "ops".into(),
        reason: "front door down".into(),
    };
    let progress = |progress| Command::RegionFailoverProgress {
        region: peer(),
        progress,
    };
    s.apply(at(5, progress(Some(record.clone())))).unwrap();
    assert_eq!(s.region_failovers()[&peer()], record);
    let text = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<DesiredState>(&text).unwrap(), s);
    s.apply(at(6, progress(None))).unwrap();
    assert!(s.region_failovers().is_empty());
}

#[test]
fn a_snapshot_from_before_region_failover_still_loads() {
    // Goal: snapshots and log entries already written decode without the new fields.
    let s = with_service();
    let mut value = serde_json::to_value(&s).unwrap();
    value.as_object_mut().unwrap().remove("region_failovers");
    let back: DesiredState = serde_json::from_value(value).unwrap();
    assert_eq!(back, s);
    let record: RegionFailoverRecord = serde_json::from_str(
        r#"{"moved":250,"back":true,"manual":true,"awaiting_completion":true}"#,
    )
    .unwrap();
    assert_eq!((record.actor.as_str(), record.reason.as_str()), ("", ""));
    let cmd = at(7, failover("signal", "front door probe failed 3 of 3"));
    let back: Stamped = serde_json::from_str(&serde_json::to_string(&cmd).unwrap()).unwrap();
    assert_eq!(back, cmd);
}

fn pod(name: &str, last: u8) -> Instance {
    Instance {
        id: InstanceId::try_new(name).unwrap(),
        service: svc(),
        locality: locality(),
        address: addr(last),
        origin: Origin::Orchestrator,
        weight: Weight::DEFAULT,
        tags: BTreeSet::new(),
        metadata: BTreeMap::new(),
    }
}

#[test]
fn a_service_name_that_leaves_no_room_for_ids_is_refused_when_declared() {
    // Goal: the one-request outage — a 251-byte service, then a registration — is a
    // refusal at the first step.
    let mut s = DesiredState::new();
    let long = ServiceName::try_new("s".repeat(251)).unwrap();
    let err = s
        .apply(at(
            1_000,
            Command::PutService {
                service: long.clone(),
                owner: "team".into(),
                contract: HealthContract::default(),
            },
        ))
        .unwrap_err();
    assert_eq!(
        err,
        RegistryError::TooLong {
            field: "service",
            len: 251,
            max: SERVICE_NAME_LEN_MAX,
        }
    );
    assert!(s.service(&long).is_none());
}

#[test]
fn a_service_from_an_older_log_with_no_room_for_ids_refuses_registration_unchanged() {
    // Goal: a state written before names were bounded (here, a snapshot holding such a
    // service) still applies: the registration is refused and the sequence is untouched.
    let long = "s".repeat(251);
    let mut s = with_service();
    let mut json = serde_json::to_value(&s).unwrap();
    json["services"][&long] = json["services"]["pay"].clone();
    s = serde_json::from_value(json).unwrap();
    let before = s.clone();
    let mut r = match registration(1) {
        Command::Register(r) => r,
        _ => unreachable!(),
    };
    r.service = ServiceName::try_new(&long).unwrap();
    let err = s.apply(at(1_000, Command::Register(r))).unwrap_err();
    assert!(
        matches!(err, RegistryError::IdUnavailable { .. }),
        "{err:?}"
    );
    assert_eq!(s, before);
    // The next good registration gets the next id, as if nothing had happened.
    assert_eq!(registered(&mut s, 1_000, 2).as_str(), "pay-r1");
}

#[test]
fn a_contract_whose_silence_overflows_is_refused_not_applied() {
    let mut s = with_service();
    let before = s.clone();
    let mut contract = HealthContract {
        profile: CapabilityProfile::FULL,
        ..HealthContract::default()
    };
    contract.self_report_interval = std::time::Duration::from_millis(u64::MAX);
    contract.scoring.silence_factor = 1_000_000;
    let err = s
        .apply(at(
            1_000,
            Command::PutService {
                service: svc(),
                owner: "team".into(),
                contract,
            },
        ))
        .unwrap_err();
    assert!(matches!(err, RegistryError::Contract { .. }), "{err:?}");
    assert_eq!(s, before);
}

#[test]
fn removing_an_external_endpoint_never_touches_an_orchestrated_one() {
    // Goal: `DELETE /v1/external/{id}` could retire (and tombstone for ever) any instance.
    let mut s = with_service();
    let p = pod("pod-1", 3);
    s.apply(at(
        2_000,
        Command::Observe {
            instance: p.clone(),
            draining: false,
        },
    ))
    .unwrap();
    let id = registered(&mut s, 2_000, 4);
    let before = s.clone();
    for instance in [p.id.clone(), id] {
        let err = s
            .apply(at(2_000, Command::RemoveExternal { instance }))
            .unwrap_err();
        assert!(
            matches!(err, RegistryError::OriginMismatch { .. }),
            "{err:?}"
        );
    }
    assert_eq!(s, before);
    assert!(!s.is_retired(&p.id));
}

#[test]
fn free_text_and_label_ceilings_are_enforced_in_apply() {
    let mut s = with_service();
    let before = s.clone();
    let mut many = pod("pod-2", 5);
    many.tags = (0..=TAGS_MAX).map(|i| format!("t{i}")).collect();
    let mut long_value = pod("pod-3", 6);
    long_value
        .metadata
        .insert("k".into(), "v".repeat(METADATA_VALUE_LEN_MAX + 1));
    let cases = [
        (
            Command::PutService {
                service: svc(),
                owner: "o".repeat(OWNER_LEN_MAX + 1),
                contract: HealthContract::default(),
            },
            "owner",
        ),
        (
            Command::Observe {
                instance: many,
                draining: false,
            },
            "tags",
        ),
        (
            Command::Observe {
                instance: long_value,
                draining: false,
            },
            "metadata.value",
        ),
        (
            Command::Maintenance {
                instance: InstanceId::try_new("pay-r1").unwrap(),
                reason: Some("r".repeat(REASON_LEN_MAX + 1)),
            },
            "reason",
        ),
        (
            Command::SetAssignment {
                assignment: BTreeMap::from([(
                    InstanceId::try_new("pay-r1").unwrap(),
                    (0..=PROBERS_PER_TARGET_MAX)
                        .map(|i| NodeName::try_new(format!("n{i}")).unwrap())
                        .collect(),
                )]),
            },
            "assignment.probers",
        ),
    ];
    for (command, field) in cases {
        let err = s.apply(at(1_000, command)).unwrap_err();
        let named = match &err {
            RegistryError::TooLong { field, .. }
            | RegistryError::TooMany { field, .. }
            | RegistryError::BadJustification { field, .. } => *field,
            other => panic!("{other:?}"),
        };
        assert_eq!(named, field);
    }
    assert_eq!(s, before);
}

#[test]
fn lease_arithmetic_saturates_at_the_end_of_time() {
    let mut s = with_service();
    let id = registered(&mut s, u64::MAX - 1, 7);
    assert_eq!(s.instance(&id).unwrap().lease_expires_at_ms, Some(u64::MAX));
    s.apply(at(u64::MAX, Command::RestartLeases)).unwrap();
    s.apply(at(u64::MAX, Command::Renew { instance: id }))
        .unwrap();
}
