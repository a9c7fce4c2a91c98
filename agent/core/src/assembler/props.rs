//! Properties: after every step, no zone publishes below its floor without declaring it;
//! region failover never removes an endpoint and moves one step per interval; and a view
//! patched for the instances that changed is the view a rebuild would give.

use proptest::prelude::*;

use super::*;
use crate::eligibility::{DrainCause, IneligibleReason};
use crate::testkit::*;
use crate::view::Tier;

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
        let policy = ServicePolicy { min_healthy: Permille::new(floor).unwrap(), failover: None, ..ServicePolicy::default() };
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
                        declared || Permille::ratio(routed as u64, candidates as u64) >= policy_floor(floor) || candidates == 0,
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

/// One input to the region failover property: wait `wait_ms`, then act.
#[derive(Debug, Clone)]
enum FailoverOp {
    /// A command on region `which` (index 3 is this region).
    Command(usize, EvacuationCommand),
    /// Only let time pass.
    Tick,
}

fn failover_op() -> impl Strategy<Value = (u64, FailoverOp)> {
    let command = prop_oneof![
        any::<bool>().prop_map(|manual| EvacuationCommand::Evacuate { manual }),
        Just(EvacuationCommand::ShiftBack),
        Just(EvacuationCommand::CompleteShiftBack),
    ];
    let op = prop_oneof![
        2 => (0usize..4, command).prop_map(|(r, c)| FailoverOp::Command(r, c)),
        3 => Just(FailoverOp::Tick),
    ];
    (0u64..45_000, op)
}

fn remote_status() -> impl Strategy<Value = EndpointStatus> {
    prop_oneof![
        3 => Just(EndpointStatus::Eligible),
        1 => Just(EndpointStatus::Unknown),
        1 => Just(EndpointStatus::Draining),
    ]
}

proptest! {
    #[test]
    fn region_failover_never_removes_an_endpoint_and_moves_one_step_per_interval(
        statuses in prop::collection::vec(remote_status(), 3..9),
        ops in prop::collection::vec(failover_op(), 1..40),
    ) {
        let peers: Vec<RegionName> = ["r0", "r1", "r2"].iter().map(|r| RegionName::try_new(*r).unwrap()).collect();
        let zones = ["a", "b"];
        let config = AssemblerConfig::new(region(), zones.iter().map(|z| zone(z)));
        let (step, interval) = (config.region_failover_step, config.region_failover_step_interval);
        let mut asm = ViewAssembler::new(config);
        for (n, z) in zones.iter().enumerate() {
            let i = instance("pay", &format!("pay-{z}"), z, n as u8);
            asm.handle_instance(&i);
            asm.handle_eligibility(&svc("pay"), &i.id, Eligibility::Eligible { weight: Weight::DEFAULT });
        }
        let mut remote_ids: Vec<(usize, InstanceId)> = Vec::new();
        let mut lists: Vec<Vec<RemoteEndpoint>> = vec![Vec::new(); peers.len()];
        for (n, status) in statuses.iter().enumerate() {
            let id = iid(&format!("pay-remote-{n}"));
            lists[n % peers.len()].push(RemoteEndpoint {
                instance: id.clone(),
                address: instance("pay", "x", "z", 100 + n as u8).address,
                zone: zone("z"),
                weight: Weight::DEFAULT,
                status: *status,
                verdict: Verdict::Eligible,
            });
            remote_ids.push((n % peers.len(), id));
        }
        for (r, list) in peers.iter().zip(lists) {
            asm.handle_remote(&svc("pay"), r.clone(), list);
        }
        let start = crate::testkit::t0();
        let mut now = start;
        // Per peer: (time, moved) since the last explicit completion.
        let mut history: Vec<Vec<(Instant, u16)>> = vec![Vec::new(); peers.len()];
        for (wait_ms, op) in ops {
            now += ms(wait_ms);
            asm.handle_timeout(now);
            if let FailoverOp::Command(which, command) = op {
                if which == peers.len() {
                    prop_assert!(asm.handle_region_failover(now, &region(), command).is_err());
                } else {
                    let accepted = asm.handle_region_failover(now, &peers[which], command).is_ok();
                    if accepted && command == EvacuationCommand::CompleteShiftBack {
                        history[which].clear();
                    }
                }
            }
            asm.assemble();
            for (which, r) in peers.iter().enumerate() {
                let moved = asm.region_failover(r).map_or(0, |e| e.moved.get());
                for (then, before) in &history[which] {
                    let intervals = (now - *then).as_nanos() / interval.as_nanos();
                    let cap = u128::from(step.get()) * (intervals + 1);
                    prop_assert!(
                        u128::from(moved.abs_diff(*before)) <= cap,
                        "region {} moved {} -> {} in {:?}", r, before, moved, now - *then
                    );
                }
                history[which].push((now, moved));
            }
            for caller in zones {
                let view = asm.target(&ViewKey { service: svc("pay"), zone: zone(caller) }).unwrap();
                for (which, id) in &remote_ids {
                    let e = view.endpoints.get(id);
                    prop_assert!(e.is_some(), "{} of {} left the view", id, peers[*which]);
                }
                // A fully moved region ranks after every region still taking its share.
                let full = |r: &RegionName| asm.region_failover(r).is_some_and(|e| e.moved == Permille::ONE);
                let remote: Vec<_> = view.endpoints.values().filter(|e| e.tier == Tier::Remote).collect();
                let last_kept = remote.iter().filter(|e| !full(&e.region)).map(|e| e.priority).max();
                let first_moved = remote.iter().filter(|e| full(&e.region)).map(|e| e.priority).min();
                if let (Some(kept), Some(moved)) = (last_kept, first_moved) {
                    prop_assert!(moved > kept, "moved region at {} not after {}", moved, kept);
                }
            }
        }
    }
}

/// One input to the incremental-assembly property.
#[derive(Debug, Clone)]
enum AsmOp {
    /// Instance `n` of service `s` gets a verdict.
    Verdict(usize, usize, Eligibility),
    /// Instance `n` of service `s` is (re)registered in zone `z` with a weight.
    Register(usize, usize, usize, u32),
    /// Instance `n` of service `s` is retired.
    Remove(usize, usize),
    /// A peer region sends endpoints for service `s`; the first may share a member's id.
    Remote(usize, Vec<EndpointStatus>, bool),
    /// Service `s` gets a failover order over the zones, or loses it.
    Failover(usize, bool),
    /// Zone `z` starts evacuating, or shifts back.
    Evacuate(usize, bool),
    /// Time passes (evacuation steps fall due).
    Tick(u64),
}

fn asm_op() -> impl Strategy<Value = AsmOp> {
    let (s, n, z) = (0usize..2, 0usize..9, 0usize..3);
    prop_oneof![
        8 => (s.clone(), n.clone(), eligibility()).prop_map(|(s, n, e)| AsmOp::Verdict(s, n, e)),
        3 => (s.clone(), n.clone(), z.clone(), 1u32..200).prop_map(|(s, n, z, w)| AsmOp::Register(s, n, z, w)),
        2 => (s.clone(), n).prop_map(|(s, n)| AsmOp::Remove(s, n)),
        1 => (s.clone(), prop::collection::vec(remote_status(), 0..3), any::<bool>())
            .prop_map(|(s, st, shadow)| AsmOp::Remote(s, st, shadow)),
        1 => (s, any::<bool>()).prop_map(|(s, on)| AsmOp::Failover(s, on)),
        1 => (z, any::<bool>()).prop_map(|(z, on)| AsmOp::Evacuate(z, on)),
        1 => (0u64..40_000).prop_map(AsmOp::Tick),
    ]
}

proptest! {
    #[test]
    fn patched_views_are_the_views_a_rebuild_gives(
        floor in 100u16..=900,
        batch in 1usize..4,
        ops in prop::collection::vec(asm_op(), 1..80),
    ) {
        let zones = ["a", "b", "c"];
        let services = ["pay", "cart"];
        let mut asm = ViewAssembler::new(AssemblerConfig::new(region(), zones.iter().map(|z| zone(z))));
        for s in services {
            asm.handle_policy(&svc(s), ServicePolicy { min_healthy: Permille::new(floor).unwrap(), failover: None, ..ServicePolicy::default() });
            for n in 0..9u8 {
                let i = instance(s, &format!("{s}-{n}"), zones[n as usize % 3], n);
                asm.handle_instance(&i);
                asm.handle_eligibility(&svc(s), &i.id, Eligibility::Eligible { weight: Weight::DEFAULT });
            }
        }
        asm.assemble();
        let mut now = crate::testkit::t0();
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                AsmOp::Verdict(s, n, e) => {
                    asm.handle_eligibility(&svc(services[s]), &iid(&format!("{}-{n}", services[s])), e);
                }
                AsmOp::Register(s, n, z, w) => {
                    let mut i = instance(services[s], &format!("{}-{n}", services[s]), zones[z], n as u8);
                    i.weight = Weight::new(w);
                    asm.handle_instance(&i);
                }
                AsmOp::Remove(s, n) => asm.handle_removed(&svc(services[s]), &iid(&format!("{}-{n}", services[s]))),
                AsmOp::Remote(s, statuses, shadow) => {
                    let list = statuses.iter().enumerate().map(|(k, status)| RemoteEndpoint {
                        instance: if shadow && k == 0 { iid(&format!("{}-0", services[s])) } else { iid(&format!("far-{k}")) },
                        address: instance("x", "x", "z", 200 + k as u8).address,
                        zone: zone("z"),
                        weight: Weight::DEFAULT,
                        status: *status,
                        verdict: Verdict::Eligible,
                    }).collect();
                    asm.handle_remote(&svc(services[s]), RegionName::try_new("far").unwrap(), list);
                }
                AsmOp::Failover(s, on) => {
                    let failover = on.then(|| FailoverOrder { zones: vec![zone("c"), zone("a")], regions: Vec::new() });
                    asm.handle_policy(&svc(services[s]), ServicePolicy { min_healthy: Permille::new(floor).unwrap(), failover, ..ServicePolicy::default() });
                }
                AsmOp::Evacuate(z, on) => {
                    let command = if on { EvacuationCommand::Evacuate { manual: false } } else { EvacuationCommand::ShiftBack };
                    let _ = asm.handle_evacuation(now, &zone(zones[z]), command);
                }
                AsmOp::Tick(wait) => {
                    now += ms(wait);
                    asm.handle_timeout(now);
                }
            }
            // Several changes may land between two assemblies, as they do under load.
            if step % batch != 0 {
                continue;
            }
            asm.assemble();
            for s in services {
                for z in zones {
                    let key = ViewKey { service: svc(s), zone: zone(z) };
                    let held = asm.target(&key).unwrap();
                    let rebuilt = asm.rebuilt(&key).unwrap();
                    prop_assert_eq!(held, &rebuilt, "{} after step {}", key, step);
                }
            }
        }
    }
}
