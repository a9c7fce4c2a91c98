//! Assembler scenarios: tiers, the fraction guard, incidents, evacuation, failover order.

use super::*;
use crate::eligibility::{DrainCause, IneligibleReason};
use crate::testkit::*;

const E: Eligibility = Eligibility::Eligible {
    weight: Weight::DEFAULT,
};
const SOFT: Eligibility = Eligibility::Ineligible {
    reason: IneligibleReason::SoftFailure,
};
const HARD: Eligibility = Eligibility::Ineligible {
    reason: IneligibleReason::HardFailure,
};

pub(super) struct Fx {
    pub(super) asm: ViewAssembler,
    pub(super) now: Instant,
}

impl Fx {
    /// `layout` is (zone, instances) pairs; instance ids are `pay-<zone>-<n>`.
    pub(super) fn new(layout: &[(&str, usize)]) -> Self {
        let zones = layout.iter().map(|(z, _)| zone(z));
        let mut asm = ViewAssembler::new(AssemblerConfig::new(region(), zones));
        let mut n = 0u8;
        for (z, count) in layout {
            for i in 0..*count {
                n += 1;
                let inst = instance("pay", &format!("pay-{z}-{i}"), z, n);
                asm.handle_instance(&inst);
                asm.handle_eligibility(&svc("pay"), &inst.id, E);
            }
        }
        asm.assemble();
        asm.take_effects();
        Self { asm, now: t0() }
    }

    pub(super) fn set(&mut self, id: &str, e: Eligibility) {
        self.asm.handle_eligibility(&svc("pay"), &iid(id), e);
    }

    pub(super) fn view(&self, caller: &str) -> View {
        self.asm
            .target(&ViewKey {
                service: svc("pay"),
                zone: zone(caller),
            })
            .unwrap()
            .clone()
    }

    pub(super) fn assemble(&mut self) -> Vec<Effect> {
        self.asm.assemble();
        self.asm
            .take_effects()
            .into_iter()
            .filter(|e| !matches!(e, Effect::Target(_)))
            .collect()
    }
}

#[test]
fn tiers_follow_the_callers_zone() {
    let fx = Fx::new(&[("a", 2), ("b", 2)]);
    let v = fx.view("a");
    for e in v.endpoints.values() {
        let expected = if e.zone == zone("a") {
            (Tier::Local, 0)
        } else {
            (Tier::Region, 1)
        };
        assert_eq!((e.tier, e.priority), expected, "{}", e.instance);
    }
    let v = fx.view("b");
    assert_eq!(v.endpoints[&iid("pay-b-0")].tier, Tier::Local);
}

#[test]
fn a_withdrawal_above_the_floor_just_withdraws() {
    let mut fx = Fx::new(&[("a", 4)]);
    fx.set("pay-a-0", SOFT);
    assert_eq!(fx.assemble(), vec![]);
    let v = fx.view("a");
    assert!(!v.endpoints.contains_key(&iid("pay-a-0")));
    assert_eq!(v.routed_in(&zone("a")), 3);
    assert!(v.markers.health_disregarded.is_empty());
}

#[test]
fn a_health_check_failing_every_replica_degrades_instead_of_draining() {
    // Goal: claim 3 — full set published, declared, alarmed, and the incident raised.
    let mut fx = Fx::new(&[("a", 3), ("b", 3)]);
    for z in ["a", "b"] {
        for i in 0..3 {
            fx.set(&format!("pay-{z}-{i}"), SOFT);
        }
    }
    let effects = fx.assemble();
    let floor = crate::defaults::MIN_HEALTHY;
    assert_eq!(
        effects,
        vec![
            Effect::GuardEngaged {
                service: svc("pay"),
                zone: zone("a"),
                routed: 0,
                total: 3,
                floor
            },
            Effect::GuardEngaged {
                service: svc("pay"),
                zone: zone("b"),
                routed: 0,
                total: 3,
                floor
            },
            Effect::LastEligibleWithdrawn {
                service: svc("pay"),
                region: region()
            },
        ]
    );
    let v = fx.view("a");
    assert_eq!(v.endpoints.len(), 6);
    assert!(
        v.endpoints
            .values()
            .all(|e| e.status == EndpointStatus::Disregarded && e.verdict == Verdict::Ineligible)
    );
    assert_eq!(
        v.markers.health_disregarded,
        [zone("a"), zone("b")].into_iter().collect()
    );
    assert!(v.markers.no_eligible_in_region);
    // Recovery releases the guard and clears the incident.
    for z in ["a", "b"] {
        for i in 0..3 {
            fx.set(&format!("pay-{z}-{i}"), E);
        }
    }
    let effects = fx.assemble();
    assert!(effects.contains(&Effect::EligibleRestored {
        service: svc("pay")
    }));
    assert!(effects.contains(&Effect::GuardReleased {
        service: svc("pay"),
        zone: zone("a")
    }));
    assert!(fx.view("a").markers.health_disregarded.is_empty());
}

#[test]
fn with_the_guard_switched_off_a_failing_health_check_drains_the_service() {
    // What the drills' broken configuration does: no guard, no marker, no alarm, an
    // empty view — the outcome the guard exists to prevent.
    let mut fx = Fx::new(&[("a", 3)]);
    fx.asm.config.fraction_guard = false;
    for i in 0..3 {
        fx.set(&format!("pay-a-{i}"), SOFT);
    }
    let effects = fx.assemble();
    assert_eq!(
        effects,
        vec![Effect::LastEligibleWithdrawn {
            service: svc("pay"),
            region: region()
        }]
    );
    let v = fx.view("a");
    assert!(v.endpoints.is_empty(), "{v:?}");
    assert!(v.markers.health_disregarded.is_empty());
}

#[test]
fn the_guard_is_per_zone() {
    let mut fx = Fx::new(&[("a", 4), ("b", 4)]);
    for i in 0..3 {
        fx.set(&format!("pay-a-{i}"), SOFT);
    }
    fx.assemble();
    let v = fx.view("b");
    assert_eq!(
        v.markers.health_disregarded,
        [zone("a")].into_iter().collect()
    );
    assert_eq!(v.routed_in(&zone("a")), 4, "zone a published whole");
    assert!(
        v.endpoints
            .values()
            .filter(|e| e.zone == zone("b"))
            .all(|e| e.status == EndpointStatus::Eligible)
    );
}

#[test]
fn exactly_half_healthy_is_at_the_floor_not_below_it() {
    let mut fx = Fx::new(&[("a", 4)]);
    fx.set("pay-a-0", SOFT);
    fx.set("pay-a-1", SOFT);
    assert_eq!(fx.assemble(), vec![]);
    assert_eq!(fx.view("a").routed_in(&zone("a")), 2);
}

#[test]
fn hard_failures_count_toward_the_floor_but_are_not_put_back() {
    let mut fx = Fx::new(&[("a", 4)]);
    for i in 0..3 {
        fx.set(&format!("pay-a-{i}"), HARD);
    }
    let effects = fx.assemble();
    assert!(matches!(
        effects[0],
        Effect::GuardEngaged {
            routed: 1,
            total: 4,
            ..
        }
    ));
    let v = fx.view("a");
    assert_eq!(v.endpoints.len(), 1, "nothing listens on a refused port");
    assert!(v.markers.health_disregarded.contains(&zone("a")));
}

#[test]
fn quarantine_cannot_drain_a_service() {
    let mut fx = Fx::new(&[("a", 2)]);
    let until = fx.now + crate::defaults::QUARANTINE_FIRST;
    fx.set("pay-a-0", Eligibility::Quarantined { until });
    fx.set("pay-a-1", Eligibility::Quarantined { until });
    fx.assemble();
    assert_eq!(fx.view("a").routed_in(&zone("a")), 2);
}

#[test]
fn draining_instances_are_published_as_draining_and_never_restored() {
    let mut fx = Fx::new(&[("a", 2)]);
    fx.set(
        "pay-a-0",
        Eligibility::Draining {
            cause: DrainCause::Terminating,
        },
    );
    fx.set(
        "pay-a-1",
        Eligibility::Draining {
            cause: DrainCause::Terminating,
        },
    );
    let effects = fx.assemble();
    assert_eq!(
        effects,
        vec![Effect::LastEligibleWithdrawn {
            service: svc("pay"),
            region: region()
        }]
    );
    let v = fx.view("a");
    assert!(
        v.endpoints
            .values()
            .all(|e| e.status == EndpointStatus::Draining)
    );
    assert!(v.markers.health_disregarded.is_empty());
}

#[test]
fn unchanged_content_emits_no_target() {
    let mut fx = Fx::new(&[("a", 2)]);
    fx.set("pay-a-0", E);
    fx.asm.assemble();
    assert!(fx.asm.take_effects().is_empty());
}

#[test]
fn a_failover_order_sets_the_priorities() {
    let mut fx = Fx::new(&[("a", 1), ("b", 1), ("c", 1)]);
    let order = FailoverOrder {
        zones: vec![zone("c"), zone("b")],
        regions: vec![],
    };
    fx.asm.handle_policy(
        &svc("pay"),
        ServicePolicy {
            failover: Some(order),
            ..ServicePolicy::default()
        },
    );
    fx.asm.assemble();
    let v = fx.view("a");
    let prio = |id: &str| v.endpoints[&iid(id)].priority;
    assert_eq!(
        (prio("pay-a-0"), prio("pay-c-0"), prio("pay-b-0")),
        (0, 1, 2)
    );
}

#[test]
fn peer_region_endpoints_come_last_as_tier_two() {
    let mut fx = Fx::new(&[("a", 1)]);
    let remote = RemoteEndpoint {
        instance: iid("pay-x"),
        address: instance("pay", "pay-x", "z", 99).address,
        zone: zone("z"),
        weight: Weight::DEFAULT,
        status: EndpointStatus::Eligible,
        verdict: Verdict::Eligible,
    };
    let peer = crate::model::RegionName::try_new("us-east").unwrap();
    fx.asm
        .handle_remote(&svc("pay"), peer.clone(), vec![remote]);
    fx.asm.assemble();
    let v = fx.view("a");
    let e = &v.endpoints[&iid("pay-x")];
    assert_eq!((e.tier, e.priority, &e.region), (Tier::Remote, 1, &peer));
}

#[test]
fn evacuation_moves_traffic_in_capped_steps_and_shift_back_needs_completion() {
    // Goal: ADR-13 — reversible, rate-capped, and a manual failover's return is explicit.
    let mut fx = Fx::new(&[("a", 2), ("b", 2)]);
    let interval = crate::defaults::EVACUATION_STEP_INTERVAL;
    fx.asm
        .handle_evacuation(
            fx.now,
            &zone("a"),
            EvacuationCommand::Evacuate { manual: true },
        )
        .unwrap();
    fx.asm.assemble();
    let v = fx.view("a");
    assert_eq!(v.markers.evacuating[&zone("a")].get(), 250);
    // One step: callers in a now share priority 0 with zone b, at a growing share.
    assert_eq!(v.endpoints[&iid("pay-a-0")].weight.get(), 75);
    assert_eq!(
        (
            v.endpoints[&iid("pay-b-0")].priority,
            v.endpoints[&iid("pay-b-0")].weight.get()
        ),
        (0, 25)
    );
    assert_eq!(fx.asm.poll_timeout(), Some(fx.now + interval));
    // Nothing moves before the interval.
    fx.asm.handle_timeout(fx.now + interval / 2);
    assert_eq!(fx.asm.evacuation(&zone("a")).unwrap().moved.get(), 250);
    for k in 1..=3 {
        fx.asm.handle_timeout(fx.now + interval * k);
    }
    fx.asm.assemble();
    let v = fx.view("a");
    assert_eq!(fx.asm.evacuation(&zone("a")).unwrap().moved, Permille::ONE);
    let (a, b) = (&v.endpoints[&iid("pay-a-0")], &v.endpoints[&iid("pay-b-0")]);
    assert!(a.priority > b.priority, "evacuated zone is failover only");
    // Shift back: steps down and holds one step short, awaiting completion.
    let t = fx.now + interval * 4;
    fx.asm
        .handle_evacuation(t, &zone("a"), EvacuationCommand::ShiftBack)
        .unwrap();
    for k in 1..=5 {
        fx.asm.handle_timeout(t + interval * k);
    }
    let e = fx.asm.evacuation(&zone("a")).unwrap();
    assert!(e.awaiting_completion && e.moved.get() == 250, "{e:?}");
    assert_eq!(fx.asm.poll_timeout(), None);
    fx.asm
        .handle_evacuation(
            t + interval * 6,
            &zone("a"),
            EvacuationCommand::CompleteShiftBack,
        )
        .unwrap();
    fx.asm.assemble();
    assert!(fx.view("a").markers.evacuating.is_empty());
    assert_eq!(fx.view("a").endpoints[&iid("pay-b-0")].priority, 1);
}

#[test]
fn the_last_zone_cannot_be_evacuated() {
    let mut fx = Fx::new(&[("a", 1), ("b", 1)]);
    let now = fx.now;
    fx.asm
        .handle_evacuation(
            now,
            &zone("a"),
            EvacuationCommand::Evacuate { manual: false },
        )
        .unwrap();
    let err = fx.asm.handle_evacuation(
        now,
        &zone("b"),
        EvacuationCommand::Evacuate { manual: false },
    );
    assert_eq!(err, Err(EvacuationError::LastZone { zone: "b".into() }));
    let err = fx
        .asm
        .handle_evacuation(now, &zone("b"), EvacuationCommand::CompleteShiftBack);
    assert_eq!(err, Err(EvacuationError::NotEvacuated { zone: "b".into() }));
    let err = fx
        .asm
        .handle_evacuation(now, &zone("q"), EvacuationCommand::ShiftBack);
    assert_eq!(err, Err(EvacuationError::UnknownZone { zone: "q".into() }));
}

#[test]
fn a_repeated_shift_back_waits_for_its_interval() {
    // Goal: ADR-13 — asking again must not return traffic faster than one step per interval.
    let mut fx = Fx::new(&[("a", 2), ("b", 2)]);
    let interval = crate::defaults::EVACUATION_STEP_INTERVAL;
    let out = EvacuationCommand::Evacuate { manual: false };
    fx.asm.handle_evacuation(fx.now, &zone("a"), out).unwrap();
    for k in 1..=3 {
        fx.asm.handle_timeout(fx.now + interval * k);
    }
    assert_eq!(fx.asm.evacuation(&zone("a")).unwrap().moved, Permille::ONE);
    let t = fx.now + interval * 4;
    for ms_later in 0..3 {
        fx.asm
            .handle_evacuation(t + ms(ms_later), &zone("a"), EvacuationCommand::ShiftBack)
            .unwrap();
    }
    assert_eq!(fx.asm.evacuation(&zone("a")).unwrap().moved.get(), 750);
    assert_eq!(fx.asm.poll_timeout(), Some(t + interval));
    // The same holds moving away: a repeated evacuate keeps the pending step.
    fx.asm
        .handle_evacuation(t + ms(3), &zone("a"), out)
        .unwrap();
    fx.asm
        .handle_evacuation(t + ms(4), &zone("a"), out)
        .unwrap();
    assert_eq!(fx.asm.evacuation(&zone("a")).unwrap().moved, Permille::ONE);
}

#[test]
fn a_shift_back_that_reaches_home_at_once_ends_the_evacuation() {
    // Goal: an automatic evacuation one step out is over after one step back.
    let mut fx = Fx::new(&[("a", 1), ("b", 1)]);
    let now = fx.now;
    let out = EvacuationCommand::Evacuate { manual: false };
    fx.asm.handle_evacuation(now, &zone("a"), out).unwrap();
    fx.asm
        .handle_evacuation(now + ms(1), &zone("a"), EvacuationCommand::ShiftBack)
        .unwrap();
    assert_eq!(fx.asm.evacuation(&zone("a")), None);
    fx.asm.assemble();
    assert!(fx.view("a").markers.evacuating.is_empty());
    // Zone a is home, so zone b may be evacuated.
    fx.asm
        .handle_evacuation(now + ms(2), &zone("b"), out)
        .unwrap();
}

#[test]
fn a_failover_order_naming_foreign_zones_never_ranks_a_zone_of_the_region_with_a_peer() {
    let mut fx = Fx::new(&[("a", 1), ("b", 1)]);
    // The order names zones this region does not have (a copied policy, say): `b` is
    // fourth in it, which must still come before every peer region.
    let order = FailoverOrder {
        zones: vec![zone("x"), zone("y"), zone("z"), zone("b")],
        regions: vec![],
    };
    fx.asm.handle_policy(
        &svc("pay"),
        ServicePolicy {
            failover: Some(order),
            ..ServicePolicy::default()
        },
    );
    let remote = RemoteEndpoint {
        instance: iid("pay-x"),
        address: instance("pay", "pay-x", "z", 99).address,
        zone: zone("z"),
        weight: Weight::DEFAULT,
        status: EndpointStatus::Eligible,
        verdict: Verdict::Eligible,
    };
    let peer = crate::model::RegionName::try_new("us-east").unwrap();
    fx.asm.handle_remote(&svc("pay"), peer, vec![remote]);
    fx.asm.assemble();
    let v = fx.view("a");
    let prio = |id: &str| v.endpoints[&iid(id)].priority;
    assert!(
        prio("pay-a-0") < prio("pay-b-0") && prio("pay-b-0") < prio("pay-x"),
        "{:?}",
        (prio("pay-a-0"), prio("pay-b-0"), prio("pay-x"))
    );
}

/// Assemble, and count the targets it emitted.
fn assembled_targets(fx: &mut Fx) -> usize {
    fx.asm.assemble();
    fx.asm
        .take_effects()
        .into_iter()
        .filter(|e| matches!(e, Effect::Target(_)))
        .count()
}

#[test]
fn a_change_no_caller_sees_keeps_the_view_itself() {
    // Goal: a registration not yet judged, or a verdict that publishes what was already
    // published, emits no target and leaves every holder sharing the same endpoints.
    let mut fx = Fx::new(&[("a", 3), ("b", 3)]);
    let before = fx.view("a");
    let newcomer = instance("pay", "pay-a-9", "a", 99);
    fx.asm.handle_instance(&newcomer);
    fx.set("pay-a-0", E);
    let targets = assembled_targets(&mut fx);
    assert_eq!(targets, 0);
    assert!(before.endpoints.ptr_eq(&fx.view("a").endpoints));
    // Once judged, it is published: one target per caller zone, the rest shared as before.
    fx.asm.handle_eligibility(&svc("pay"), &newcomer.id, E);
    let targets = assembled_targets(&mut fx);
    assert_eq!(targets, 2);
    assert!(fx.view("a").endpoints.contains_key(&newcomer.id));
}

#[test]
fn every_endpoint_states_what_its_health_rests_on() {
    // Goal (ADR-16): a caller can tell an unprobed endpoint from a probed healthy one.
    let mut fx = Fx::new(&[("a", 2)]);
    fx.asm.handle_policy(
        &svc("pay"),
        ServicePolicy {
            profile: CapabilityProfile::NO_READINESS,
            ..ServicePolicy::default()
        },
    );
    fx.asm.handle_evidence(
        &svc("pay"),
        &iid("pay-a-0"),
        EvidenceMode::PassivePrimary,
        true,
    );
    fx.asm.handle_evidence(
        &svc("pay"),
        &iid("pay-a-1"),
        EvidenceMode::SingleClass,
        false,
    );
    fx.assemble();
    let v = fx.view("a");
    let capability = |id: &str| v.endpoints[&iid(id)].capability.unwrap();
    assert_eq!(
        capability("pay-a-0"),
        Capability {
            profile: CapabilityProfile::NO_READINESS,
            verified: true,
            evidence: EvidenceMode::PassivePrimary,
        }
    );
    assert!(!capability("pay-a-1").verified);
    assert_eq!(
        capability("pay-a-1").classes().collect::<Vec<_>>(),
        ["passive"]
    );
    // A change of mode is a change of the view, released like any other.
    let before = fx.view("a");
    fx.asm.handle_evidence(
        &svc("pay"),
        &iid("pay-a-1"),
        EvidenceMode::ProbePrimary,
        true,
    );
    fx.assemble();
    assert_ne!(fx.view("a"), before);
}
