use crate::state::{Command, Stamped};
use waymark_core::model::{ServiceName, ZoneName};
use waymark_core::view::{ReleasedView, Version, VersionSource, View, ViewKey};

use super::*;

fn view(service: &str, version: Version) -> ReleasedView {
    let key = ViewKey {
        service: service.parse::<ServiceName>().unwrap(),
        zone: "a".parse::<ZoneName>().unwrap(),
    };
    ReleasedView {
        version,
        view: View::empty(key),
    }
}

#[test]
fn a_later_term_always_versions_above_an_earlier_one() {
    let mut old = TermVersions::new(3, Version(0));
    let mut last = Version(0);
    for _ in 0..1000 {
        last = old.next_version().unwrap();
    }
    // The new leader has not even seen the old leader's last versions.
    let mut new = TermVersions::new(4, Version(3 << 32 | 10));
    assert!(new.next_version().unwrap() > last);
    // Restarting a source within the same term continues above the floor.
    let mut same = TermVersions::new(3, last);
    assert!(same.next_version().unwrap() > last);
}

#[test]
fn a_term_never_spills_into_the_next_terms_versions() {
    // Goal: `term << 32 | seq` is refused, never wrapped, at either edge.
    let mut full = TermVersions::new(7, Version(7 << 32 | (u64::from(u32::MAX) - 1)));
    assert_eq!(
        full.next_version(),
        Some(Version(7 << 32 | u64::from(u32::MAX)))
    );
    assert!(full.is_exhausted());
    assert_eq!(full.next_version(), None);
    assert_eq!(full.next_version(), None, "stays exhausted");

    let mut huge = TermVersions::new(TERM_VERSIONS_MAX_TERM + 1, Version(0));
    assert!(huge.is_exhausted());
    assert_eq!(huge.next_version(), None);
    let mut top = TermVersions::new(TERM_VERSIONS_MAX_TERM, Version(0));
    assert_eq!(top.next_version(), Some(Version(u64::MAX << 32 | 1)));
}

#[test]
fn a_stale_publish_never_replaces_a_newer_view() {
    let mut s = AuthorityState::default();
    let r = s.apply(Request::Publish {
        views: vec![view("pay", Version(5))],
    });
    assert_eq!(r, Response::Published { accepted: 1 });
    let r = s.apply(Request::Publish {
        views: vec![view("pay", Version(4)), view("pay", Version(5))],
    });
    assert_eq!(r, Response::Published { accepted: 0 });
    assert_eq!(s.max_version(), Version(5));
    let r = s.apply(Request::Publish {
        views: vec![view("pay", Version(6))],
    });
    assert_eq!(r, Response::Published { accepted: 1 });
    assert_eq!(s.published().len(), 1);
}

#[test]
fn audit_sequence_numbers_are_assigned_on_apply_in_order() {
    let mut s = AuthorityState::default();
    let entry = |actor: &str| AuditEntry {
        seq: 99,
        at_ms: 1,
        kind: AuditKind::Override,
        actor: actor.into(),
        service: None,
        instance: None,
        outcome: "refused".into(),
        detail: serde_json::Value::Null,
    };
    s.apply(Request::Audit {
        entries: vec![entry("a"), entry("b")],
    });
    let r = s.apply(Request::Audit {
        entries: vec![entry("c")],
    });
    assert_eq!(r, Response::Audited { last_seq: 3 });
    let seqs: Vec<_> = s
        .audit()
        .iter()
        .map(|e| (e.seq, e.actor.as_str()))
        .collect();
    assert_eq!(seqs, [(1, "a"), (2, "b"), (3, "c")]);
    // A copy shares the log; the encoding is the list snapshots have always held, and it
    // decodes to the same state.
    let copy = s.clone();
    assert!(copy.audit().ptr_eq(s.audit()));
    let json = serde_json::to_value(&s).unwrap();
    let listed: Vec<u64> = json["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, [1, 2, 3]);
    let back: AuthorityState = serde_json::from_value(json).unwrap();
    assert_eq!(back, s);
}

#[test]
fn a_refused_command_names_its_field_and_changes_nothing() {
    let mut s = AuthorityState::default();
    let before = s.clone();
    let r = s.apply(Request::Registry(Stamped {
        at_ms: 10,
        command: Command::Renew {
            instance: "pay-r1".parse().unwrap(),
        },
    }));
    let Response::Registry {
        outcome: Err(refusal),
    } = r
    else {
        panic!("expected a refusal, got {r:?}");
    };
    assert_eq!(refusal.reason, "unknown_instance");
    assert_eq!(refusal.field.as_deref(), Some("instance"));
    // Only the registry clock moved (it is data, stamped by the leader).
    assert_eq!(s.published(), before.published());
    assert_eq!(s.registry().instances().count(), 0);
}

#[test]
fn entries_survive_json_round_trip() {
    let req = Request::Publish {
        views: vec![view("pay", Version(7))],
    };
    let text = serde_json::to_string(&req).unwrap();
    let back: Request = serde_json::from_str(&text).unwrap();
    assert_eq!(back, req);
}

#[test]
fn a_state_with_published_views_survives_a_json_snapshot() {
    let mut s = AuthorityState::default();
    s.apply(Request::Publish {
        views: vec![view("pay", Version(5)), view("ledger", Version(9))],
    });
    let text = serde_json::to_vec(&s).unwrap();
    let back: AuthorityState = serde_json::from_slice(&text).unwrap();
    assert_eq!(back, s);
    assert_eq!(back.max_version(), Version(9));
}

#[test]
fn the_observed_snapshot_is_replaced_whole_and_survives_a_json_snapshot() {
    use waymark_core::evaluator::ObservedInstance;
    use waymark_core::units::Permille;
    let observed = |level| ObservedInstance {
        classes: [Some((Permille::saturating(900), 1200)), None, None],
        hard: true,
        withdrawn: None,
        quarantine_level: level,
        quarantine_left_ms: Some(30_000),
    };
    let mut s = AuthorityState::default();
    let id: waymark_core::model::InstanceId = "pay-r1".parse().unwrap();
    s.apply(Request::Observed {
        at_ms: 10,
        instances: [(id.clone(), observed(1))].into(),
    });
    let r = s.apply(Request::Observed {
        at_ms: 20,
        instances: [(id.clone(), observed(2))].into(),
    });
    assert_eq!(r, Response::ObservedSaved);
    let (at, map) = s.observed().unwrap();
    assert_eq!((*at, map[&id].quarantine_level), (20, 2));
    let back: AuthorityState = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
    assert_eq!(back, s);
}

#[test]
fn removing_a_service_drops_its_views_and_versions_never_go_back() {
    // Goal: a deleted service stopped being served; its views stayed in the state for ever.
    let mut s = AuthorityState::default();
    let put = |service: &str| {
        Request::Registry(Stamped {
            at_ms: 1,
            command: Command::PutService {
                service: service.parse().unwrap(),
                owner: "team".into(),
                contract: waymark_core::contract::HealthContract::default(),
            },
        })
    };
    s.apply(put("pay"));
    s.apply(put("web"));
    s.apply(Request::Publish {
        views: vec![view("pay", Version(9)), view("web", Version(4))],
    });
    let r = s.apply(Request::Registry(Stamped {
        at_ms: 2,
        command: Command::RemoveService {
            service: "pay".parse().unwrap(),
        },
    }));
    assert!(
        matches!(
            r,
            Response::Registry {
                outcome: Ok(Applied::ServiceRemoved { .. })
            }
        ),
        "{r:?}"
    );
    let services: Vec<_> = s
        .published()
        .keys()
        .map(|k| k.service.to_string())
        .collect();
    assert_eq!(services, ["web"]);
    assert_eq!(
        s.max_version(),
        Version(9),
        "the removed view's version is kept"
    );
    let back: AuthorityState = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
    assert_eq!(back.max_version(), Version(9));
}

#[test]
fn a_restarted_members_tier_waits_for_the_log_it_knew_committed() {
    // Goal: a member back from a restart never answers from its bare snapshot.
    #[allow(clippy::disallowed_methods)] // the one anchor instant of this test
    let t0 = std::time::Instant::now();
    let wait = std::time::Duration::from_secs(60);
    let gate = ReplayGate::new(Some(40), t0, wait);
    assert!(!gate.is_open(t0, None));
    assert!(!gate.is_open(t0, Some(39)));
    assert!(gate.is_open(t0, Some(40)));
    assert!(
        gate.is_open(t0 + wait, Some(2)),
        "a member that cannot catch up serves what it has once the wait is over"
    );
    let fresh = ReplayGate::new(None, t0, wait);
    assert!(
        fresh.is_open(t0, None),
        "nothing was committed: nothing to wait for"
    );
}

/// One registry error of every kind, the access-control ones included.
fn one_of_every_registry_error() -> Vec<RegistryError> {
    use crate::acl::AclError;
    use waymark_core::contract::ContractError;
    use waymark_core::model::{Address, Origin};

    let service: ServiceName = "pay".parse().unwrap();
    let instance: InstanceId = "pay-r1".parse().unwrap();
    let address = Address {
        ip: std::net::Ipv4Addr::LOCALHOST.into(),
        port: 0,
    };
    let errors = vec![
        RegistryError::Acl(AclError::AlreadyBootstrapped),
        RegistryError::Acl(AclError::BadName {
            field: "token",
            reason: "lowercase letters, digits and '-' only",
        }),
        RegistryError::Acl(AclError::Malformed("grant".into())),
        RegistryError::Acl(AclError::UnknownGrant("grant".into())),
        RegistryError::Acl(AclError::UnknownToken("ci".into())),
        RegistryError::Acl(AclError::TokenExists("ci".into())),
        RegistryError::Acl(AclError::BadExpiry {
            name: "ci".into(),
            expires_at_ms: 0,
        }),
        RegistryError::Acl(AclError::BadDigest("ci".into())),
        RegistryError::Acl(AclError::Full {
            what: "grants",
            max: 1,
        }),
        RegistryError::Contract {
            service: service.clone(),
            source: ContractError::ProbeMissing,
        },
        RegistryError::UnknownService {
            service: service.clone(),
        },
        RegistryError::ServiceInUse {
            service: service.clone(),
            count: 1,
        },
        RegistryError::UnknownInstance {
            instance: instance.clone(),
        },
        RegistryError::Retired {
            instance: instance.clone(),
        },
        RegistryError::NotLeased {
            instance: instance.clone(),
            origin: Origin::External,
        },
        RegistryError::BadAddress { address },
        RegistryError::DuplicateAddress {
            address,
            existing: instance.clone(),
        },
        RegistryError::BadLease { lease_ms: 0 },
        RegistryError::BadPolicy {
            field: "min_healthy_override",
            reason: "a fraction in permille, 1..=1000".into(),
        },
        RegistryError::OriginMismatch {
            instance: instance.clone(),
            origin: Origin::Orchestrator,
        },
        RegistryError::BadJustification {
            field: "reason",
            reason: "must not be empty",
        },
        RegistryError::TooLong {
            field: "owner",
            len: 2,
            max: 1,
        },
        RegistryError::TooMany {
            field: "tags",
            count: 2,
            max: 1,
        },
        RegistryError::Full {
            what: "instances",
            max: 1,
        },
        RegistryError::IdUnavailable {
            service: service.clone(),
        },
        RegistryError::ServiceMismatch {
            instance,
            existing: service,
        },
    ];
    // Exhaustive on purpose: a new kind of error stops this compiling until it has an
    // example above, so that its reason is held to `Refusal::REASONS` (and from there to
    // the API's status table).
    for e in &errors {
        match e {
            RegistryError::Acl(a) => match a {
                AclError::AlreadyBootstrapped
                | AclError::BadName { .. }
                | AclError::Malformed(_)
                | AclError::UnknownGrant(_)
                | AclError::UnknownToken(_)
                | AclError::TokenExists(_)
                | AclError::BadExpiry { .. }
                | AclError::BadDigest(_)
                | AclError::Full { .. } => {}
            },
            RegistryError::Contract { .. }
            | RegistryError::UnknownService { .. }
            | RegistryError::ServiceInUse { .. }
            | RegistryError::UnknownInstance { .. }
            | RegistryError::Retired { .. }
            | RegistryError::NotLeased { .. }
            | RegistryError::BadAddress { .. }
            | RegistryError::DuplicateAddress { .. }
            | RegistryError::BadLease { .. }
            | RegistryError::BadPolicy { .. }
            | RegistryError::OriginMismatch { .. }
            | RegistryError::BadJustification { .. }
            | RegistryError::TooLong { .. }
            | RegistryError::TooMany { .. }
            | RegistryError::Full { .. }
            | RegistryError::IdUnavailable { .. }
            | RegistryError::ServiceMismatch { .. } => {}
        }
    }
    errors
}

#[test]
fn every_refusal_reason_is_listed_and_every_listed_reason_is_given() {
    // Goal: `Refusal::REASONS` is exactly what `From<&RegistryError>` gives, so tables
    // keyed by reason (the API's statuses) can check that they cover every refusal.
    let given: std::collections::BTreeSet<String> = one_of_every_registry_error()
        .iter()
        .map(|e| Refusal::from(e).reason)
        .collect();
    let listed: std::collections::BTreeSet<String> =
        Refusal::REASONS.iter().map(ToString::to_string).collect();
    assert_eq!(given, listed);
    assert_eq!(
        listed.len(),
        Refusal::REASONS.len(),
        "a reason is listed twice"
    );
}

#[test]
fn a_refusal_names_the_field_its_error_carries() {
    // Goal: region_full and the access-control refusals used to leave `field` empty
    // though the error knew it.
    use crate::acl::AclError;
    let cases = [
        (
            RegistryError::Full {
                what: "services",
                max: 1,
            },
            Some("services"),
        ),
        (
            RegistryError::Acl(AclError::BadName {
                field: "token",
                reason: "1..=TOKEN_NAME_LEN_MAX bytes",
            }),
            Some("token"),
        ),
        (
            RegistryError::Acl(AclError::Full {
                what: "tokens",
                max: 1,
            }),
            Some("tokens"),
        ),
        (RegistryError::Acl(AclError::TokenExists("ci".into())), None),
    ];
    for (error, field) in cases {
        let refusal = Refusal::from(&error);
        assert_eq!(refusal.field.as_deref(), field, "{error}");
        assert_eq!(refusal.message, error.to_string());
    }
    // Every error that names a field keeps it.
    for error in one_of_every_registry_error() {
        let refusal = Refusal::from(&error);
        let carries = !matches!(
            error,
            RegistryError::Acl(
                AclError::AlreadyBootstrapped
                    | AclError::Malformed(_)
                    | AclError::UnknownGrant(_)
                    | AclError::UnknownToken(_)
                    | AclError::TokenExists(_)
                    | AclError::BadExpiry { .. }
                    | AclError::BadDigest(_)
            )
        );
        assert_eq!(refusal.field.is_some(), carries, "{error}");
    }
}

fn observed_map(n: usize, level: u32) -> BTreeMap<InstanceId, ObservedInstance> {
    (0..n)
        .map(|i| {
            let id: InstanceId = format!("pay-{i:04}").parse().unwrap();
            let o = ObservedInstance {
                classes: [None, None, None],
                hard: false,
                withdrawn: None,
                quarantine_level: level,
                quarantine_left_ms: None,
            };
            (id, o)
        })
        .collect()
}

#[test]
fn an_observed_snapshot_in_parts_is_in_force_once_every_part_is_held_in_any_order() {
    // Goal: a region's observed state commits as bounded parts and ends exactly as if it
    // had been one entry; until the last part arrives the previous snapshot stays whole.
    let whole = observed_map(10, 7);
    let mut parts = crate::term::observed_requests(50, whole.clone(), 3);
    assert_eq!(parts.len(), 4);
    assert!(parts.iter().all(|p| matches!(p,
        Request::ObservedPart { instances, parts: 4, .. } if instances.len() <= 3)));
    parts.reverse();
    let mut s = AuthorityState::default();
    s.apply(Request::Observed {
        at_ms: 10,
        instances: observed_map(2, 1),
    });
    let last = parts.pop().unwrap();
    for p in parts {
        let r = s.apply(p);
        assert_eq!(
            r,
            Response::ObservedPart {
                held: true,
                complete: false
            }
        );
        assert_eq!(s.observed().unwrap().0, 10, "the previous snapshot stays");
    }
    let r = s.apply(last);
    assert_eq!(
        r,
        Response::ObservedPart {
            held: true,
            complete: true
        }
    );
    assert_eq!(s.observed(), Some(&(50, whole)));
    let back: AuthorityState = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
    assert_eq!(back, s);
}

#[test]
fn an_unfinished_snapshot_in_parts_changes_nothing_in_force_and_the_next_replaces_it() {
    let mut s = AuthorityState::default();
    let first = crate::term::observed_requests(50, observed_map(9, 1), 3);
    // A leader lost after two of its three parts.
    for p in first.into_iter().take(2) {
        s.apply(p);
    }
    assert_eq!(s.observed(), None);
    // Its successor's snapshot (another time, another split) starts afresh.
    let next = observed_map(8, 2);
    for p in crate::term::observed_requests(80, next.clone(), 4) {
        s.apply(p);
    }
    assert_eq!(s.observed(), Some(&(80, next)));
    // The state a snapshot of it holds still decodes to the same.
    let back: AuthorityState = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
    assert_eq!(back, s);
}

#[test]
fn a_part_outside_its_count_is_refused_and_changes_nothing() {
    let mut s = AuthorityState::default();
    let before = s.clone();
    for (part, parts) in [(3, 3), (0, 0), (0, OBSERVED_PARTS_MAX + 1)] {
        let r = s.apply(Request::ObservedPart {
            at_ms: 1,
            part,
            parts,
            instances: observed_map(1, 0),
        });
        assert_eq!(
            r,
            Response::ObservedPart {
                held: false,
                complete: false
            }
        );
        assert_eq!(s, before);
    }
}

#[test]
fn an_audit_kind_s_name_is_the_one_records_and_queries_spell() {
    for kind in AuditKind::ALL {
        let wire = serde_json::to_value(kind).unwrap();
        assert_eq!(wire, kind.as_str(), "{kind:?}");
        let back: AuditKind = serde_json::from_value(wire).unwrap();
        assert_eq!(back, kind);
    }
}
