use std::time::{Duration, UNIX_EPOCH};

use super::*;

fn id(s: &str) -> Identity {
    Identity::parse(s).unwrap()
}

fn name(s: &str) -> Name {
    Name::new(s).unwrap()
}

fn td() -> TrustDomain {
    TrustDomain::new("mesh").unwrap()
}

fn inst(region: &str, service: &str, instance: &str) -> InstanceRef {
    InstanceRef {
        region: name(region),
        service: name(service),
        instance: name(instance),
    }
}

#[test]
fn who_may_report_about_an_instance() {
    let target = inst("eu", "cart", "i1");
    type Expect = Result<(), fn(&Denied) -> bool>;
    let cases: Vec<(&str, Expect)> = vec![
        ("spiffe://mesh/region/eu/service/cart/instance/i1", Ok(())),
        (
            "spiffe://mesh/region/eu/service/cart/instance/i2",
            Err(|d| matches!(d, Denied::NotSelf)),
        ),
        (
            "spiffe://mesh/region/us/service/cart/instance/i1",
            Err(|d| matches!(d, Denied::NotSelf)),
        ),
        (
            "spiffe://mesh/region/eu/service/pay/instance/i1",
            Err(|d| matches!(d, Denied::NotSelf)),
        ),
        ("spiffe://mesh/region/eu/authority/a1", Ok(())),
        (
            "spiffe://mesh/region/us/authority/a1",
            Err(|d| matches!(d, Denied::OtherRegion { .. })),
        ),
        (
            "spiffe://mesh/region/eu/node/n1",
            Err(|d| {
                matches!(
                    d,
                    Denied::WrongKind {
                        kind: IdentityKind::Node
                    }
                )
            }),
        ),
        (
            "spiffe://mesh/operator/alice",
            Err(|d| {
                matches!(
                    d,
                    Denied::WrongKind {
                        kind: IdentityKind::Operator
                    }
                )
            }),
        ),
        (
            "spiffe://other/region/eu/service/cart/instance/i1",
            Err(|d| matches!(d, Denied::WrongTrustDomain { .. })),
        ),
    ];
    for (reporter, want) in cases {
        let got = may_report_about(&id(reporter), &target, &td());
        match (want, got) {
            (Ok(()), Ok(())) => {}
            (Err(check), Err(d)) => assert!(check(&d), "{reporter}: {d:?}"),
            (want, got) => panic!("{reporter}: wanted {:?}, got {got:?}", want.is_ok()),
        }
    }
}

#[test]
fn node_reports_only_on_its_unexpired_assignment() {
    let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
    let assignment = ProbeAssignment {
        trust_domain: td(),
        region: name("eu"),
        node: name("n1"),
        targets: [inst("eu", "cart", "i1"), inst("eu", "cart", "i2")].into(),
        valid_until: at(1_000),
    };
    let n1 = id("spiffe://mesh/region/eu/node/n1");
    let cases: Vec<(Identity, InstanceRef, u64, Result<(), Denied>)> = vec![
        (n1.clone(), inst("eu", "cart", "i1"), 10, Ok(())),
        (n1.clone(), inst("eu", "cart", "i2"), 999, Ok(())),
        (
            n1.clone(),
            inst("eu", "cart", "i3"),
            10,
            Err(Denied::NotATarget),
        ),
        (
            n1.clone(),
            inst("eu", "cart", "i1"),
            1_000,
            Err(Denied::AssignmentLapsed),
        ),
        (
            id("spiffe://mesh/region/eu/node/n2"),
            inst("eu", "cart", "i1"),
            10,
            Err(Denied::NotAssignedNode {
                assigned: name("n1"),
            }),
        ),
        (
            id("spiffe://mesh/region/us/node/n1"),
            inst("eu", "cart", "i1"),
            10,
            Err(Denied::NotAssignedNode {
                assigned: name("n1"),
            }),
        ),
        (
            id("spiffe://mesh/region/eu/service/cart/instance/i1"),
            inst("eu", "cart", "i1"),
            10,
            Err(Denied::WrongKind {
                kind: IdentityKind::Workload,
            }),
        ),
        (
            id("spiffe://other/region/eu/node/n1"),
            inst("eu", "cart", "i1"),
            10,
            Err(Denied::WrongTrustDomain {
                identity: id("spiffe://other/region/eu/node/n1"),
                expected: td(),
            }),
        ),
    ];
    for (node, target, now, want) in cases {
        assert_eq!(
            may_node_report_probe(&node, &target, &assignment, at(now)),
            want,
            "{node} about {target:?} at {now}"
        );
    }
}

#[test]
fn operators_override_only_within_their_grants() {
    let svc = |r: &str, s: &str| ServiceRef {
        region: name(r),
        service: name(s),
    };
    let policy = OverridePolicy {
        trust_domain: td(),
        grants: [
            (name("root"), [OverrideScope::Estate].into()),
            (name("eu-ops"), [OverrideScope::Region(name("eu"))].into()),
            (
                name("cart-team"),
                [OverrideScope::Service(svc("eu", "cart"))].into(),
            ),
        ]
        .into(),
    };
    let cases = [
        ("spiffe://mesh/operator/root", svc("us", "pay"), true),
        ("spiffe://mesh/operator/eu-ops", svc("eu", "pay"), true),
        ("spiffe://mesh/operator/eu-ops", svc("us", "pay"), false),
        ("spiffe://mesh/operator/cart-team", svc("eu", "cart"), true),
        ("spiffe://mesh/operator/cart-team", svc("us", "cart"), false),
        ("spiffe://mesh/operator/cart-team", svc("eu", "pay"), false),
        ("spiffe://mesh/operator/nobody", svc("eu", "cart"), false),
        (
            "spiffe://mesh/region/eu/authority/a1",
            svc("eu", "cart"),
            false,
        ),
        ("spiffe://other/operator/root", svc("eu", "cart"), false),
    ];
    for (who, service, allowed) in cases {
        let got = may_operator_override(&id(who), &service, &policy);
        assert_eq!(got.is_ok(), allowed, "{who} on {service:?}: {got:?}");
    }
    let denied = may_operator_override(
        &id("spiffe://mesh/operator/eu-ops"),
        &svc("us", "pay"),
        &policy,
    )
    .unwrap_err();
    assert_eq!(
        denied.to_string(),
        "operator eu-ops has no override grant for service pay in region us"
    );
}
