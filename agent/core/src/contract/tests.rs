//! Contract validation: each rule refuses what it should, with an error naming the field.

use super::*;

fn with(f: impl FnOnce(&mut HealthContract)) -> Result<ValidContract, ContractError> {
    let mut c = HealthContract::default();
    f(&mut c);
    c.validate()
}

#[test]
fn the_default_contract_is_valid_and_fits_the_damping_budget() {
    let c = HealthContract::default();
    let detection = c.detection_time(EvidenceClass::Probe, c.scoring.remove);
    assert!(detection <= d::DAMPING_BUDGET, "{detection:?}");
    // Three failed samples at 1 s: withdrawn 2 s after the first.
    assert_eq!(detection, Duration::from_secs(2));
    assert!(c.validate().is_ok());
}

#[test]
fn unreadiness_on_a_shared_dependency_is_refused() {
    let err = with(|c| {
        c.profile = CapabilityProfile::FULL;
        c.dependencies.push(DependencyDecl {
            name: "db".into(),
            shared: true,
            authority: DependencyAuthority::Unreadiness,
        });
    })
    .unwrap_err();
    assert_eq!(
        err,
        ContractError::SharedDependencyUnreadiness { name: "db".into() }
    );
    assert_eq!(
        err.to_string(),
        "dependencies.db: unreadiness authority is refused on a shared dependency"
    );
}

#[test]
fn unreadiness_on_a_private_dependency_is_allowed() {
    let ok = with(|c| {
        c.profile = CapabilityProfile::FULL;
        c.dependencies.push(DependencyDecl {
            name: "local-cache".into(),
            shared: false,
            authority: DependencyAuthority::Unreadiness,
        });
    });
    assert!(ok.is_ok());
}

#[test]
fn a_contract_may_not_demand_a_signal_its_profile_cannot_supply() {
    // A probe described for a service that cannot be probed.
    let err = with(|c| c.profile = CapabilityProfile::NO_READINESS).unwrap_err();
    assert_eq!(
        err,
        ContractError::SignalNotProvided {
            field: "probe",
            class: EvidenceClass::Probe
        }
    );
    // Dependency authority needs self-reports.
    let err = with(|c| {
        c.dependencies.push(DependencyDecl {
            name: "db".into(),
            shared: true,
            authority: DependencyAuthority::WeightReduction,
        });
    })
    .unwrap_err();
    assert_eq!(
        err,
        ContractError::SignalNotProvided {
            field: "dependencies",
            class: EvidenceClass::SelfReport
        }
    );
    // A profile that provides probes needs a probe.
    assert_eq!(
        with(|c| c.probe = None).unwrap_err(),
        ContractError::ProbeMissing
    );
    let none = CapabilityProfile {
        probe: false,
        self_report: false,
        passive: false,
    };
    assert_eq!(
        with(|c| {
            c.profile = none;
            c.probe = None;
        })
        .unwrap_err(),
        ContractError::NoEvidence
    );
}

#[test]
fn thresholds_below_platform_floors_are_refused() {
    type Mutation = Box<dyn Fn(&mut HealthContract)>;
    let cases: Vec<(&str, Mutation)> = vec![
        (
            "probe.interval",
            Box::new(|c| c.probe.as_mut().unwrap().interval = Duration::from_millis(100)),
        ),
        (
            "scoring.half_life",
            Box::new(|c| c.scoring.half_life = Duration::from_millis(10)),
        ),
        (
            "scoring.readmit_hold",
            Box::new(|c| c.scoring.readmit_hold = Duration::from_secs(1)),
        ),
        (
            "scoring.remove",
            Box::new(|c| c.scoring.remove = Permille::new(300).unwrap()),
        ),
        (
            "min_healthy",
            Box::new(|c| c.min_healthy = Permille::new(50).unwrap()),
        ),
        (
            "scoring.silence_factor",
            Box::new(|c| c.scoring.silence_factor = 1),
        ),
        (
            "slow_start",
            Box::new(|c| c.slow_start = Duration::from_secs(10)),
        ),
        (
            "passive.min_requests",
            Box::new(|c| c.passive.min_requests = 0),
        ),
        (
            "passive.primary.min_callers",
            Box::new(|c| {
                c.passive.primary = Some(PassivePrimary {
                    min_callers: 2,
                    ..PassivePrimary::default()
                })
            }),
        ),
        (
            "passive.primary.min_requests",
            Box::new(|c| {
                c.passive.primary = Some(PassivePrimary {
                    min_requests: 0,
                    ..PassivePrimary::default()
                })
            }),
        ),
        (
            "passive.primary.confirm_interval",
            Box::new(|c| {
                c.passive.primary = Some(PassivePrimary {
                    confirm_interval: Duration::from_millis(500),
                    ..PassivePrimary::default()
                })
            }),
        ),
    ];
    for (field, mutate) in cases {
        let err = with(|c| mutate(c)).unwrap_err();
        match err {
            ContractError::BelowFloor { field: f, .. } => assert_eq!(f, field),
            other => panic!("{field}: unexpected {other:?}"),
        }
    }
}

#[test]
fn readmission_must_be_stricter_than_removal() {
    let err = with(|c| c.scoring.readmit = c.scoring.remove).unwrap_err();
    assert!(matches!(
        err,
        ContractError::Invalid {
            field: "scoring.readmit",
            ..
        }
    ));
}

#[test]
fn a_probe_timeout_must_fit_inside_its_interval() {
    let err = with(|c| c.probe.as_mut().unwrap().timeout = Duration::from_secs(2)).unwrap_err();
    assert!(matches!(
        err,
        ContractError::Invalid {
            field: "probe.timeout",
            ..
        }
    ));
}

#[test]
fn scoring_too_slow_for_the_damping_budget_is_refused() {
    // A 10 s half-life at a 1 s probe interval needs many failures to cross removal.
    let err = with(|c| c.scoring.half_life = Duration::from_secs(10)).unwrap_err();
    assert!(
        matches!(
            err,
            ContractError::DampingOverBudget {
                class: EvidenceClass::Probe,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn zero_slow_start_declares_a_stateless_service() {
    assert!(with(|c| c.slow_start = Duration::ZERO).is_ok());
}

#[test]
fn contracts_read_from_json_with_human_durations() {
    let text = r#"{
        "profile": {"probe": true, "self_report": true, "passive": true},
        "probe": {"kind": "grpc", "service": "pay", "interval": "500ms", "timeout": "250ms"},
        "dependencies": [{"name": "db", "shared": true}],
        "slow_start": "2m"
    }"#;
    let c: HealthContract = serde_json::from_str(text).unwrap();
    assert_eq!(
        c.probe.as_ref().unwrap().interval,
        Duration::from_millis(500)
    );
    assert_eq!(
        c.dependencies[0].authority,
        DependencyAuthority::WeightReduction
    );
    assert_eq!(c.slow_start, Duration::from_secs(120));
    assert!(c.clone().validate().is_ok());
    let back: HealthContract = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    let bad = r#"{"slow_start": "soon"}"#;
    let err = serde_json::from_str::<HealthContract>(bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a duration"), "{err}");
}

#[test]
fn a_huge_interval_with_a_large_silence_factor_is_refused_not_overflowed() {
    // Goal: the values that once overflowed `Duration * u32` inside apply get a refusal.
    let err = with(|c| {
        c.profile = CapabilityProfile::FULL;
        c.self_report_interval = Duration::from_millis(u64::MAX);
        c.scoring.silence_factor = u32::MAX;
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            ContractError::AboveCeiling {
                field: "self_report_interval",
                ..
            }
        ),
        "{err:?}"
    );
    let err = with(|c| c.scoring.silence_factor = u32::MAX).unwrap_err();
    assert_eq!(err.field(), "scoring.silence_factor");
}

#[test]
fn every_duration_and_count_has_a_ceiling() {
    let huge = Duration::from_secs(u64::MAX / 4);
    type Change = Box<dyn Fn(&mut HealthContract)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "probe.interval",
            Box::new(move |c| c.probe.as_mut().unwrap().interval = huge),
        ),
        (
            "probe.timeout",
            Box::new(move |c| c.probe.as_mut().unwrap().timeout = huge),
        ),
        (
            "passive.interval",
            Box::new(move |c| c.passive.interval = huge),
        ),
        (
            "scoring.half_life",
            Box::new(move |c| c.scoring.half_life = huge),
        ),
        (
            "scoring.readmit_hold",
            Box::new(move |c| c.scoring.readmit_hold = huge),
        ),
        ("slow_start", Box::new(move |c| c.slow_start = huge)),
        (
            "passive.min_requests",
            Box::new(|c| c.passive.min_requests = u64::MAX),
        ),
        (
            "passive.primary.min_callers",
            Box::new(|c| {
                c.passive.primary = Some(PassivePrimary {
                    min_callers: d::PASSIVE_REPORTERS_MAX as u32 + 1,
                    ..PassivePrimary::default()
                })
            }),
        ),
        (
            "passive.primary.confirm_interval",
            Box::new(move |c| {
                c.passive.primary = Some(PassivePrimary {
                    confirm_interval: huge,
                    ..PassivePrimary::default()
                })
            }),
        ),
        (
            "dependencies",
            Box::new(|c| {
                c.dependencies = (0..=d::DEPENDENCIES_MAX)
                    .map(|i| DependencyDecl {
                        name: format!("d{i}"),
                        shared: true,
                        authority: DependencyAuthority::Informational,
                    })
                    .collect();
            }),
        ),
        (
            "probe.path",
            Box::new(|c| {
                c.probe.as_mut().unwrap().kind = ProbeKind::Http {
                    path: format!("/{}", "a".repeat(d::CONTRACT_TEXT_LEN_MAX)),
                }
            }),
        ),
    ];
    for (field, f) in cases {
        let mut c = HealthContract::default();
        f(&mut c);
        let err = c.validate().unwrap_err();
        assert_eq!(err.field(), field, "{err}");
    }
}

#[test]
fn a_probe_path_must_be_absolute_and_printable() {
    for path in ["readyz", "/ready\r\nHost: evil"] {
        let err = with(|c| {
            c.probe.as_mut().unwrap().kind = ProbeKind::Http { path: path.into() };
        })
        .unwrap_err();
        assert_eq!(err.field(), "probe.path", "{path:?}");
    }
}

#[test]
fn an_unvalidated_contract_cannot_make_silence_arithmetic_panic() {
    let mut c = HealthContract {
        self_report_interval: Duration::from_millis(u64::MAX),
        ..HealthContract::default()
    };
    c.scoring.silence_factor = u32::MAX;
    assert_eq!(c.silence_after(EvidenceClass::SelfReport), Duration::MAX);
}

#[test]
fn callers_cannot_be_primary_for_a_service_without_callers_outcomes() {
    let err = with(|c| {
        c.profile = CapabilityProfile::PROBE_ONLY;
        c.passive.primary = Some(PassivePrimary::default());
    })
    .unwrap_err();
    assert_eq!(
        err,
        ContractError::SignalNotProvided {
            field: "passive.primary",
            class: EvidenceClass::Passive
        }
    );
}

#[test]
fn a_passive_primary_contract_reads_with_defaults_and_slows_the_probe_silence() {
    let c: HealthContract = serde_json::from_value(
        serde_json::json!({"passive": {"interval": "1s", "min_requests": 5,
            "error_rate": 250, "primary": {"min_callers": 4}}}),
    )
    .unwrap();
    let p = c.passive.primary.unwrap();
    assert_eq!(
        (p.min_callers, p.min_requests),
        (4, d::PASSIVE_PRIMARY_MIN_REQUESTS)
    );
    assert_eq!(p.confirm_interval, d::PASSIVE_PRIMARY_CONFIRM_INTERVAL);
    let v = c.validate().unwrap();
    assert_eq!(
        v.silence_of(EvidenceClass::Probe),
        d::PASSIVE_PRIMARY_CONFIRM_INTERVAL * d::SILENCE_FACTOR
    );
    // Without it, the contract serialises exactly as before (old logs, old clients).
    let plain = serde_json::to_value(HealthContract::default()).unwrap();
    assert!(plain["passive"].get("primary").is_none());
}

#[test]
fn contract_durations_are_whole_milliseconds_as_the_evidence_protocol_carries_them() {
    // Goal: the grammar reads `1.5s` and `500us`; a contract takes the first and refuses the
    // second, which would reach the prober as a zero timeout.
    let c: HealthContract = serde_json::from_value(serde_json::json!({
        "probe": {"kind": "tcp", "interval": "1.5s", "timeout": "1s250ms"}
    }))
    .unwrap();
    assert!(c.validate().is_ok());
    let err = with(|c| c.probe.as_mut().unwrap().timeout = Duration::from_micros(500)).unwrap_err();
    assert_eq!(err.field(), "probe.timeout", "{err}");
    assert!(err.to_string().contains("500us"), "{err}");
}
