#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;
use waymark_core::contract::{ProbeKind, ProbeSpec};
use waymark_core::model::{Address, ServiceName};

use super::*;

const SEC: Duration = Duration::from_secs(1);

/// One real instant to offset from; the pure parts under test read no clock.
#[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
fn t0() -> Instant {
    Instant::now()
}

fn target(name: &str, interval: Duration) -> ProbeTarget {
    ProbeTarget {
        instance: InstanceId::try_new(name).unwrap(),
        service: ServiceName::try_new("checkout").unwrap(),
        address: Address {
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 8080,
        },
        probe: ProbeSpec {
            kind: ProbeKind::Tcp,
            interval,
            timeout: interval / 2,
        },
        confirmation: false,
    }
}

fn schedule(concurrency: usize) -> ProbeSchedule {
    ProbeSchedule::new(ScheduleConfig {
        concurrency: NonZeroUsize::new(concurrency).unwrap(),
        seed: 7,
    })
}

fn started(effects: &[Effect]) -> Vec<(RunId, String)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Start { run, target } => Some((*run, target.instance.to_string())),
            _ => None,
        })
        .collect()
}

fn id(name: &str) -> InstanceId {
    InstanceId::try_new(name).unwrap()
}

#[test]
fn new_targets_start_at_spread_offsets_within_one_interval() {
    // Goal: a fresh assignment is spread over the interval, and every target runs once in it.
    let t0 = t0();
    let mut s = schedule(64);
    let targets: Vec<_> = (0..20).map(|i| target(&format!("i-{i}"), SEC)).collect();
    s.handle_targets(t0, targets);
    assert!(s.take_effects().is_empty());
    let first = s.poll_timeout().unwrap();
    assert!(first >= t0 && first < t0 + SEC);
    let dues: BTreeSet<Instant> = s.timers.iter().map(|(due, _)| *due).collect();
    assert!(dues.len() > 10, "offsets not spread: {dues:?}");
    s.handle_timeout(t0 + SEC);
    assert_eq!(started(&s.take_effects()).len(), 20);
    assert_eq!(s.running(), 20);
}

#[test]
fn the_same_seed_gives_the_same_schedule() {
    // Goal: offsets come from the injected seed only.
    let t0 = t0();
    let timers = || {
        let mut s = schedule(4);
        s.handle_targets(t0, (0..5).map(|i| target(&format!("i-{i}"), SEC)).collect());
        s.timers.clone()
    };
    assert_eq!(timers(), timers());
}

#[test]
fn removed_target_stops_its_run_at_once_and_its_result_is_dropped() {
    // Goal: removal stops the in-flight run in the same step; a late result is not current.
    let t0 = t0();
    let mut s = schedule(4);
    s.handle_targets(t0, vec![target("a", SEC), target("b", SEC)]);
    s.handle_timeout(t0 + SEC);
    let runs = started(&s.take_effects());
    let (run_a, _) = runs.iter().find(|(_, name)| name == "a").cloned().unwrap();
    s.handle_targets(t0 + SEC, vec![target("b", SEC)]);
    assert_eq!(vec![Effect::Stop { run: run_a }], s.take_effects());
    assert_eq!(s.len(), 1);
    assert_eq!(s.running(), 1);
    assert!(!s.handle_done(t0 + SEC, run_a));
    s.handle_timeout(t0 + 5 * SEC);
    assert!(
        started(&s.take_effects())
            .iter()
            .all(|(_, name)| name == "b")
    );
}

#[test]
fn unchanged_target_keeps_its_phase() {
    // Goal: re-sending the same assignment changes nothing.
    let t0 = t0();
    let mut s = schedule(4);
    s.handle_targets(t0, vec![target("a", SEC)]);
    let due = s.poll_timeout();
    s.handle_targets(t0 + SEC / 10, vec![target("a", SEC)]);
    assert!(s.take_effects().is_empty());
    assert_eq!(due, s.poll_timeout());
}

#[test]
fn changed_spec_restarts_the_target() {
    // Goal: a new spec stops the old run and schedules the target afresh.
    let t0 = t0();
    let mut s = schedule(4);
    s.handle_targets(t0, vec![target("a", SEC)]);
    s.handle_timeout(t0 + SEC);
    let [(run, _)] = started(&s.take_effects())[..] else {
        panic!("one start expected");
    };
    let now = t0 + SEC + SEC / 10;
    s.handle_targets(now, vec![target("a", 2 * SEC)]);
    assert_eq!(vec![Effect::Stop { run }], s.take_effects());
    let due = s.poll_timeout().unwrap();
    assert!(due >= now && due < now + 2 * SEC);
    s.handle_timeout(due);
    let [(again, _)] = started(&s.take_effects())[..] else {
        panic!("one start expected");
    };
    assert_ne!(run, again);
}

#[test]
fn a_probe_without_a_slot_waits_then_starts_when_one_frees() {
    // Goal: concurrency is bounded; a waiting probe takes the next free slot.
    let t0 = t0();
    let mut s = schedule(1);
    s.handle_targets(t0, vec![target("a", SEC), target("b", SEC)]);
    s.handle_timeout(t0 + SEC);
    let runs = started(&s.take_effects());
    assert_eq!(runs.len(), 1);
    assert_eq!((s.running(), s.waiting()), (1, 1));
    assert!(s.handle_done(t0 + SEC, runs[0].0));
    let next = started(&s.take_effects());
    assert_eq!(next.len(), 1);
    assert_ne!(next[0].1, runs[0].1);
    assert_eq!((s.running(), s.waiting()), (1, 0));
}

#[test]
fn a_probe_that_waits_a_whole_interval_is_skipped() {
    // Goal: a probe that cannot start within its interval is counted, not queued forever.
    let t0 = t0();
    let mut s = schedule(1);
    s.handle_targets(t0, vec![target("a", SEC), target("b", SEC)]);
    s.handle_timeout(t0 + SEC);
    let runs = started(&s.take_effects());
    let waiting = if runs[0].1 == "a" { "b" } else { "a" };
    // Nothing finishes for two more intervals.
    s.handle_timeout(t0 + 2 * SEC);
    let effects = s.take_effects();
    assert!(effects.contains(&Effect::Skip {
        instance: id(waiting),
        reason: SkipReason::Concurrency,
    }));
    assert!(effects.contains(&Effect::Skip {
        instance: id(&runs[0].1),
        reason: SkipReason::Overlap,
    }));
    assert!(started(&effects).is_empty());
    assert_eq!((s.running(), s.waiting()), (1, 1));
}

#[test]
fn a_late_wakeup_does_not_make_up_missed_rounds() {
    // Goal: after a stall, each target runs once, not once per missed interval.
    let t0 = t0();
    let mut s = schedule(4);
    s.handle_targets(t0, vec![target("a", SEC)]);
    s.handle_timeout(t0 + 10 * SEC);
    assert_eq!(started(&s.take_effects()).len(), 1);
    assert!(s.poll_timeout().unwrap() > t0 + 10 * SEC);
}

#[derive(Debug, Clone)]
enum Op {
    Assign { mask: u8, slow: bool },
    Advance { ms: u16 },
    Finish { pick: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u8>(), any::<bool>()).prop_map(|(mask, slow)| Op::Assign { mask, slow }),
        (1u16..1500).prop_map(|ms| Op::Advance { ms }),
        any::<usize>().prop_map(|pick| Op::Finish { pick }),
    ]
}

proptest! {
    #[test]
    fn runs_stay_bounded_and_one_per_target(
        concurrency in 1usize..4,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        // Goal: the module invariants hold after every step of any sequence.
        let t0 = t0();
        let mut now = t0;
        let mut s = schedule(concurrency);
        let mut live: BTreeMap<RunId, InstanceId> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Assign { mask, slow } => {
                    let interval = if slow { 2 * SEC } else { SEC };
                    let targets = (0..6)
                        .filter(|i| mask & (1 << i) != 0)
                        .map(|i| target(&format!("i-{i}"), if i % 2 == 0 { interval } else { SEC }))
                        .collect();
                    s.handle_targets(now, targets);
                }
                Op::Advance { ms } => {
                    now += Duration::from_millis(u64::from(ms));
                    s.handle_timeout(now);
                }
                Op::Finish { pick } => {
                    if let Some(run) = live.keys().nth(pick % live.len().max(1)).copied() {
                        prop_assert!(s.handle_done(now, run));
                        live.remove(&run);
                    }
                }
            }
            for effect in s.take_effects() {
                match effect {
                    Effect::Start { run, target } => {
                        prop_assert!(!live.values().any(|i| *i == target.instance));
                        live.insert(run, target.instance);
                    }
                    Effect::Stop { run } => prop_assert!(live.remove(&run).is_some()),
                    Effect::Skip { .. } => {}
                }
            }
            prop_assert!(live.len() <= concurrency);
            prop_assert_eq!(live.len(), s.running());
            if let Some(due) = s.poll_timeout() {
                // Nothing is ever scheduled further out than one (longest) interval.
                prop_assert!(due <= now + 2 * SEC);
            }
        }
    }
}
