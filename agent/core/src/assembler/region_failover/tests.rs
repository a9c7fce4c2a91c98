//! Region failover scenarios: capped steps, ranking last, the manual hold, restore, refusals.

use super::*;
use crate::assembler::tests::Fx;
use crate::assembler::{FailoverOrder, RemoteEndpoint, ServicePolicy};
use crate::defaults::REGION_FAILOVER_STEP_INTERVAL as STEP;
use crate::eligibility::Verdict;
use crate::testkit::*;
use crate::view::{EndpointStatus, Tier, View};

fn peer(name: &str) -> RegionName {
    RegionName::try_new(name).unwrap()
}

fn remote(id: &str, n: u8) -> RemoteEndpoint {
    RemoteEndpoint {
        instance: iid(id),
        address: instance("pay", id, "z", n).address,
        zone: zone("z"),
        weight: Weight::DEFAULT,
        status: EndpointStatus::Eligible,
        verdict: Verdict::Eligible,
    }
}

/// Zone `a` of this region, plus one endpoint in each of `us-east` and `ap-south`.
fn two_peers() -> Fx {
    let mut fx = Fx::new(&[("a", 1)]);
    let pay = svc("pay");
    fx.asm
        .handle_remote(&pay, peer("us-east"), vec![remote("pay-us", 90)]);
    fx.asm
        .handle_remote(&pay, peer("ap-south"), vec![remote("pay-ap", 91)]);
    fx.asm.assemble();
    fx.asm.take_effects();
    fx
}

/// (priority, weight) of an endpoint in the view for callers in zone `a`.
fn placed(v: &View, id: &str) -> (u32, u32) {
    let e = &v.endpoints[&iid(id)];
    (e.priority, e.weight.get())
}

fn progress(region: &str, moved: u16, awaiting_completion: bool) -> Effect {
    Effect::RegionFailoverProgress {
        region: peer(region),
        moved: Permille::new(moved).unwrap(),
        awaiting_completion,
    }
}

#[test]
fn a_region_failover_scales_weights_down_in_capped_steps_then_ranks_the_region_last() {
    // Goal: ADR-13/14 — the peer's share moves a step per interval, never all at once.
    let mut fx = two_peers();
    let us = peer("us-east");
    let out = EvacuationCommand::Evacuate { manual: true };
    fx.asm.handle_region_failover(fx.now, &us, out).unwrap();
    assert_eq!(fx.assemble(), vec![progress("us-east", 250, false)]);
    let v = fx.view("a");
    assert_eq!(placed(&v, "pay-a-0"), (0, 100));
    assert_eq!(
        placed(&v, "pay-us"),
        (1, 75),
        "same priority, smaller share"
    );
    assert_eq!(placed(&v, "pay-ap"), (1, 100));
    assert_eq!(fx.asm.poll_timeout(), Some(fx.now + STEP));
    // Nothing moves before the interval.
    fx.asm.handle_timeout(fx.now + STEP / 2);
    assert_eq!(fx.assemble(), vec![]);
    for (k, weight) in [(1, 50), (2, 25)] {
        fx.asm.handle_timeout(fx.now + STEP * k);
        assert_eq!(
            fx.assemble(),
            vec![progress("us-east", 1000 - weight * 10, false)]
        );
        assert_eq!(placed(&fx.view("a"), "pay-us"), (1, u32::from(weight)));
    }
    fx.asm.handle_timeout(fx.now + STEP * 3);
    assert_eq!(fx.assemble(), vec![progress("us-east", 1000, false)]);
    let v = fx.view("a");
    assert_eq!(placed(&v, "pay-ap"), (1, 100));
    assert_eq!(
        placed(&v, "pay-us"),
        (2, 100),
        "failover only, never removed"
    );
    assert_eq!(v.endpoints[&iid("pay-us")].tier, Tier::Remote);
    assert_eq!(
        fx.asm.poll_timeout(),
        None,
        "fully moved: nothing more to do"
    );
}

#[test]
fn a_manual_region_shift_back_holds_one_step_short_until_completed() {
    let mut fx = two_peers();
    let us = peer("us-east");
    let out = EvacuationCommand::Evacuate { manual: true };
    fx.asm.handle_region_failover(fx.now, &us, out).unwrap();
    for k in 1..=3 {
        fx.asm.handle_timeout(fx.now + STEP * k);
    }
    let t = fx.now + STEP * 4;
    fx.asm
        .handle_region_failover(t, &us, EvacuationCommand::ShiftBack)
        .unwrap();
    for k in 1..=5 {
        fx.asm.handle_timeout(t + STEP * k);
    }
    let e = fx.asm.region_failover(&us).unwrap();
    assert!(e.awaiting_completion && e.moved.get() == 250, "{e:?}");
    assert_eq!(fx.asm.poll_timeout(), None);
    fx.assemble();
    assert_eq!(placed(&fx.view("a"), "pay-us"), (1, 75));
    fx.asm
        .handle_region_failover(t + STEP * 6, &us, EvacuationCommand::CompleteShiftBack)
        .unwrap();
    assert_eq!(fx.assemble(), vec![progress("us-east", 0, false)]);
    assert_eq!(fx.asm.region_failover(&us), None);
    assert_eq!(placed(&fx.view("a"), "pay-us"), (1, 100));
}

#[test]
fn an_automatic_region_failover_comes_home_without_completion() {
    let mut fx = two_peers();
    let us = peer("us-east");
    let out = EvacuationCommand::Evacuate { manual: false };
    fx.asm.handle_region_failover(fx.now, &us, out).unwrap();
    fx.asm.handle_timeout(fx.now + STEP);
    let t = fx.now + STEP * 2;
    fx.asm
        .handle_region_failover(t, &us, EvacuationCommand::ShiftBack)
        .unwrap();
    assert_eq!(fx.asm.region_failover(&us).unwrap().moved.get(), 250);
    fx.asm.handle_timeout(t + STEP);
    assert_eq!(fx.asm.region_failover(&us), None);
    assert_eq!(
        fx.assemble().last(),
        Some(&progress("us-east", 0, false)),
        "the end is reported"
    );
    assert_eq!(placed(&fx.view("a"), "pay-us"), (1, 100));
}

#[test]
fn failing_over_every_peer_region_keeps_all_their_endpoints_in_order() {
    // Goal: a failover never empties a view; the service's region order still holds.
    let mut fx = two_peers();
    let order = FailoverOrder {
        zones: vec![],
        regions: vec![peer("us-east"), peer("ap-south")],
    };
    let policy = ServicePolicy {
        failover: Some(order),
        ..ServicePolicy::default()
    };
    fx.asm.handle_policy(&svc("pay"), policy);
    let out = EvacuationCommand::Evacuate { manual: false };
    for r in ["us-east", "ap-south"] {
        fx.asm
            .handle_region_failover(fx.now, &peer(r), out)
            .unwrap();
    }
    for k in 1..=3 {
        fx.asm.handle_timeout(fx.now + STEP * k);
    }
    fx.assemble();
    let v = fx.view("a");
    assert_eq!(v.endpoints.len(), 3);
    assert_eq!(placed(&v, "pay-a-0"), (0, 100));
    assert_eq!(placed(&v, "pay-us"), (1, 100));
    assert_eq!(placed(&v, "pay-ap"), (2, 100));
}

#[test]
fn a_repeated_region_failover_command_does_not_skip_the_cap() {
    let mut fx = two_peers();
    let us = peer("us-east");
    let out = EvacuationCommand::Evacuate { manual: false };
    for m in 0..5 {
        fx.asm
            .handle_region_failover(fx.now + ms(m), &us, out)
            .unwrap();
    }
    assert_eq!(fx.asm.region_failover(&us).unwrap().moved.get(), 250);
    assert_eq!(fx.asm.poll_timeout(), Some(fx.now + STEP));
}

#[test]
fn reversing_a_held_shift_back_does_not_take_a_second_step_in_one_interval() {
    // Found by the failover property: a manual failover's first step, a shift-back at
    // once (held one step short of home, so nothing moves back), then a failover again at
    // once took a second step out in the same instant: 0 → 500 with a 250 cap.
    let mut fx = two_peers();
    let us = peer("us-east");
    let manual = EvacuationCommand::Evacuate { manual: true };
    let automatic = EvacuationCommand::Evacuate { manual: false };
    fx.asm.handle_region_failover(fx.now, &us, manual).unwrap();
    fx.asm
        .handle_region_failover(fx.now, &us, EvacuationCommand::ShiftBack)
        .unwrap();
    let held = fx.asm.region_failover(&us).unwrap();
    assert!(held.awaiting_completion, "{held:?}");
    assert_eq!(held.moved.get(), 250);
    fx.asm
        .handle_region_failover(fx.now, &us, automatic)
        .unwrap();
    let e = fx.asm.region_failover(&us).unwrap();
    assert_eq!((e.moved.get(), e.direction), (250, Direction::Out));
    // The next step out comes one interval after the first, not before.
    assert_eq!(fx.asm.poll_timeout(), Some(fx.now + STEP));
    fx.asm.handle_timeout(fx.now + STEP);
    assert_eq!(fx.asm.region_failover(&us).unwrap().moved.get(), 500);
    // A reversal after a step that did move still acts at once: out 500 → back 250.
    fx.asm
        .handle_region_failover(fx.now + STEP, &us, EvacuationCommand::ShiftBack)
        .unwrap();
    assert_eq!(fx.asm.region_failover(&us).unwrap().moved.get(), 250);
}

#[test]
fn a_restored_region_failover_resumes_stepping_from_where_it_was() {
    let mut fx = two_peers();
    let us = peer("us-east");
    let half = Permille::new(500).unwrap();
    fx.asm
        .restore_region_failover(fx.now, &us, half, Direction::Out, true, false);
    assert_eq!(fx.assemble(), vec![progress("us-east", 500, false)]);
    assert_eq!(placed(&fx.view("a"), "pay-us"), (1, 50));
    assert_eq!(fx.asm.poll_timeout(), Some(fx.now + STEP));
    fx.asm.handle_timeout(fx.now + STEP);
    assert_eq!(fx.asm.region_failover(&us).unwrap().moved.get(), 750);
    // A record for this region, or one already home, restores nothing.
    let ours = region();
    fx.asm
        .restore_region_failover(fx.now, &ours, half, Direction::Out, true, false);
    let ap = peer("ap-south");
    fx.asm
        .restore_region_failover(fx.now, &ap, Permille::ZERO, Direction::Back, false, false);
    assert_eq!(fx.asm.region_failovers().count(), 1);
}

#[test]
fn region_failover_refuses_this_region_and_commands_with_nothing_to_act_on() {
    let mut fx = two_peers();
    let now = fx.now;
    let out = EvacuationCommand::Evacuate { manual: true };
    let ours = region();
    let err = fx.asm.handle_region_failover(now, &ours, out);
    let name = ours.to_string();
    assert_eq!(err, Err(EvacuationError::OwnRegion { region: name }));
    let us = peer("us-east");
    let err = fx
        .asm
        .handle_region_failover(now, &us, EvacuationCommand::ShiftBack);
    let name = "us-east".to_string();
    assert_eq!(
        err,
        Err(EvacuationError::RegionNotFailedOver {
            region: name.clone()
        })
    );
    fx.asm.handle_region_failover(now, &us, out).unwrap();
    let err = fx
        .asm
        .check_region_failover(&us, EvacuationCommand::CompleteShiftBack);
    assert_eq!(
        err,
        Err(EvacuationError::RegionNotAwaitingCompletion { region: name })
    );
    assert!(
        fx.assemble().len() == 1,
        "only the accepted command reported"
    );
    // A region whose aggregate holds nothing yet may still be failed over.
    let unseen = peer("sa-east");
    fx.asm.handle_region_failover(now, &unseen, out).unwrap();
    assert_eq!(fx.asm.region_failover(&unseen).unwrap().moved.get(), 250);
}

#[test]
fn zone_evacuation_and_region_failover_step_independently() {
    let mut fx = Fx::new(&[("a", 1), ("b", 1)]);
    fx.asm
        .handle_remote(&svc("pay"), peer("us-east"), vec![remote("pay-us", 90)]);
    let out = EvacuationCommand::Evacuate { manual: false };
    fx.asm.handle_evacuation(fx.now, &zone("a"), out).unwrap();
    let later = fx.now + STEP / 2;
    fx.asm
        .handle_region_failover(later, &peer("us-east"), out)
        .unwrap();
    assert_eq!(fx.asm.poll_timeout(), Some(fx.now + STEP));
    fx.asm.handle_timeout(fx.now + STEP);
    assert_eq!(fx.asm.evacuation(&zone("a")).unwrap().moved.get(), 500);
    assert_eq!(
        fx.asm
            .region_failover(&peer("us-east"))
            .unwrap()
            .moved
            .get(),
        250
    );
    assert_eq!(fx.asm.poll_timeout(), Some(later + STEP));
}
