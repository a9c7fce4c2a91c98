//! `AuthorityState::apply` over arbitrary entry sequences: it never panics, two replicas
//! applying the same log agree (one restarted from a JSON snapshot half way), no view's
//! version ever goes back, and audit sequence numbers only grow.

use crate::state::{Command, Stamped};
use proptest::prelude::*;
use waymark_core::contract::HealthContract;
use waymark_core::model::{InstanceId, ServiceName, ZoneName};
use waymark_core::view::{ReleasedView, Version, View, ViewKey};

use super::*;

fn service() -> impl Strategy<Value = ServiceName> {
    prop_oneof![Just("pay"), Just("web"), Just("ledger")].prop_map(|s| s.parse().unwrap())
}

fn released() -> impl Strategy<Value = ReleasedView> {
    (
        service(),
        prop_oneof![Just("a"), Just("b")],
        prop_oneof![0u64..20, Just(u64::MAX)],
    )
        .prop_map(|(service, zone, version)| ReleasedView {
            version: Version(version),
            view: View::empty(ViewKey {
                service,
                zone: zone.parse::<ZoneName>().unwrap(),
            }),
        })
}

/// A release of one of [`released`]'s views: whole, or a patch on an arbitrary base (most
/// of which no member holds) with a few endpoints changed.
fn release() -> impl Strategy<Value = crate::release::Release> {
    use crate::release::{Release, ViewPatch};
    prop_oneof![
        released().prop_map(Release::Whole),
        (
            released(),
            0u64..20,
            prop::collection::vec((0u8..6, 1u32..4), 0..4),
            prop::collection::vec(0u8..6, 0..3),
        )
            .prop_map(|(target, base, upserted, removed)| {
                Release::Patch(ViewPatch {
                    base: Version(base),
                    version: target.version,
                    delta: waymark_core::view::ViewDelta {
                        key: target.view.key,
                        upserted: upserted
                            .into_iter()
                            .map(|(n, w)| crate::release::tests::endpoint(n, w))
                            .collect(),
                        removed: removed
                            .into_iter()
                            .map(|n| crate::release::tests::endpoint(n, 1).instance)
                            .collect(),
                        markers: Default::default(),
                    },
                })
            }),
    ]
}

fn registry_command() -> impl Strategy<Value = Stamped> {
    prop_oneof![
        2 => service().prop_map(|service| Stamped {
            at_ms: 1,
            command: Command::PutService {
                service,
                owner: "team".into(),
                contract: HealthContract::default(),
            },
        }),
        1 => service().prop_map(|service| Stamped {
            at_ms: 2,
            command: Command::RemoveService { service },
        }),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        3 => prop::collection::vec(released(), 0..4).prop_map(|views| Request::Publish { views }),
        3 => prop::collection::vec(release(), 0..4).prop_map(|releases| Request::Release { releases }),
        3 => registry_command().prop_map(Request::Registry),
        1 => prop::collection::vec(registry_command(), 0..6)
            .prop_map(|commands| Request::Batch { commands }),
        1 => (0u64..u64::MAX, 0usize..3).prop_map(|(at_ms, n)| Request::Audit {
            entries: (0..n)
                .map(|i| AuditEntry {
                    seq: u64::MAX,
                    at_ms,
                    kind: AuditKind::Policy,
                    actor: format!("a{i}"),
                    service: None,
                    instance: None,
                    outcome: "applied".into(),
                    detail: serde_json::Value::Null,
                })
                .collect(),
        }),
        1 => any::<u64>().prop_map(|at_ms| Request::Observed {
            at_ms,
            instances: std::collections::BTreeMap::<InstanceId, _>::new(),
        }),
        1 => (0u64..3, 0u32..4, 0u32..4).prop_map(|(at_ms, part, parts)| Request::ObservedPart {
            at_ms,
            part,
            parts,
            instances: std::collections::BTreeMap::<InstanceId, _>::new(),
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Group commit changes nothing but the number of entries: a batch leaves the state a
    /// replica reaches applying its commands one entry each, with the same outcome each.
    #[test]
    fn a_batch_applies_as_its_commands_one_by_one(
        log in prop::collection::vec(request(), 0..10),
        commands in prop::collection::vec(registry_command(), 0..12),
    ) {
        let mut batched = AuthorityState::default();
        for r in &log {
            batched.apply(r.clone());
        }
        let mut single = batched.clone();
        let Response::Batch { outcomes } = batched.apply(Request::Batch {
            commands: commands.clone(),
        }) else {
            panic!("a batch is answered as a batch");
        };
        let one_by_one: Vec<_> = commands
            .into_iter()
            .map(|c| match single.apply(Request::Registry(c)) {
                Response::Registry { outcome } => outcome,
                other => panic!("a registry command is answered as one: {other:?}"),
            })
            .collect();
        prop_assert_eq!(outcomes, one_by_one);
        prop_assert_eq!(batched, single);
    }

    #[test]
    fn apply_is_total_and_replicas_agree(log in prop::collection::vec(request(), 1..40)) {
        let mut a = AuthorityState::default();
        let mut last_audit = 0;
        for request in &log {
            let floor = a.max_version();
            let held = a.published().clone();
            let response = a.apply(request.clone());
            let failed = matches!(response, Response::ApplyFailed { .. });
            prop_assert!(!failed, "apply failed: {:?}", response);
            prop_assert!(a.max_version() >= floor, "max version went back");
            for (key, view) in a.published() {
                if let Some(before) = held.get(key) {
                    prop_assert!(view.version >= before.version, "{key} went back");
                }
            }
            if let Response::Audited { last_seq } = response {
                prop_assert!(last_seq >= last_audit);
                last_audit = last_seq;
            }
        }
        let half = log.len() / 2;
        let mut b = AuthorityState::default();
        for request in &log[..half] {
            b.apply(request.clone());
        }
        let mut b: AuthorityState = serde_json::from_slice(&serde_json::to_vec(&b).unwrap()).unwrap();
        for request in &log[half..] {
            b.apply(request.clone());
        }
        prop_assert_eq!(a, b);
    }
}
