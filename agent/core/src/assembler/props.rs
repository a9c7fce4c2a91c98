//! Property: after every step, no zone publishes below its floor without declaring it.

use proptest::prelude::*;

use super::*;
use crate::eligibility::{DrainCause, IneligibleReason};
use crate::testkit::*;

fn eligibility() -> impl Strategy<Value = Eligibility> {
    prop_oneof![
        3 => Just(Eligibility::Eligible { weight: Weight::DEFAULT }),
        1 => Just(Eligibility::Unknown { weight: Weight::DEFAULT }),
        1 => Just(Eligibility::Degraded { weight: Weight::new(50), cause: crate::eligibility::DegradeCause::Dependency }),
        3 => Just(Eligibility::Ineligible { reason: IneligibleReason::SoftFailure }),
        1 => Just(Eligibility::Ineligible { reason: IneligibleReason::HardFailure }),
        1 => Just(Eligibility::Draining { cause: DrainCause::Terminating }),
    ]
}

proptest! {
    #[test]
    fn no_zone_falls_below_its_floor_undeclared(
        floor in 100u16..=900,
        steps in prop::collection::vec((0usize..12, eligibility()), 1..60),
    ) {
        let zones = ["a", "b", "c"];
        let mut asm = ViewAssembler::new(AssemblerConfig::new(region(), zones.iter().map(|z| zone(z))));
        let policy = ServicePolicy { min_healthy: Permille::new(floor).unwrap(), failover: None };
        asm.handle_policy(&svc("pay"), policy);
        let ids: Vec<_> = (0..12u8).map(|n| instance("pay", &format!("pay-{n}"), zones[n as usize % 3], n)).collect();
        let mut truth = BTreeMap::new();
        for i in &ids {
            asm.handle_instance(i);
        }
        for (which, e) in steps {
            asm.handle_eligibility(&svc("pay"), &ids[which].id, e);
            truth.insert(which, e);
            asm.assemble();
            for caller in zones {
                let view = asm.target(&ViewKey { service: svc("pay"), zone: zone(caller) }).unwrap();
                for z in zones {
                    let candidates = truth.iter().filter(|(n, e)| zones[**n % 3] == z && !matches!(e, Eligibility::Draining { .. })).count();
                    let routed = view.routed_in(&zone(z));
                    let declared = view.markers.health_disregarded.contains(&zone(z));
                    prop_assert!(
                        declared || Permille::ratio(routed, candidates) >= policy_floor(floor) || candidates == 0,
                        "zone {} routes {}/{} under floor {} undeclared", z, routed, candidates, floor
                    );
                    // Everything routed is either eligible by verdict or declared disregarded.
                    for e in view.endpoints.values().filter(|e| e.zone == zone(z)) {
                        prop_assert!(e.status != EndpointStatus::Disregarded || declared);
                    }
                }
            }
        }
    }
}

fn policy_floor(floor: u16) -> Permille {
    Permille::new(floor).unwrap()
}
