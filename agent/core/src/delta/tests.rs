//! Delta queue scenarios and properties: withdrawals first, monotonic versions, shedding.

use proptest::prelude::*;

use super::*;
use crate::testkit::*;
use crate::view::tests::endpoint;
use crate::view::{EndpointStatus, MonotonicCounter, ViewEndpoint, apply};

fn key() -> ViewKey {
    ViewKey {
        service: svc("pay"),
        zone: zone("a"),
    }
}

fn view_of(eps: &[ViewEndpoint]) -> View {
    let mut v = View::empty(key());
    for e in eps {
        v.endpoints.insert(e.instance.clone(), e.clone());
    }
    v
}

fn up(n: u8) -> ViewEndpoint {
    endpoint(n, "a", 100, EndpointStatus::Eligible)
}

struct Fx {
    q: DeltaQueues,
    versions: MonotonicCounter,
    start: Instant,
    now: Instant,
}

impl Fx {
    fn new(config: DeltaConfig) -> Self {
        let now = t0();
        Self {
            q: DeltaQueues::new(config),
            versions: MonotonicCounter::default(),
            start: now,
            now,
        }
    }

    /// Run timers up to `at` (from the start) and return the releases, with their times.
    fn run_to(&mut self, at: Duration) -> Vec<(Duration, Effect)> {
        let target = self.start + at;
        let mut out = Vec::new();
        while let Some(due) = self.q.poll_timeout().filter(|t| *t <= target) {
            self.now = due.max(self.now);
            self.q.handle_timeout(self.now, &mut self.versions);
            out.extend(
                self.q
                    .take_effects()
                    .into_iter()
                    .map(|e| (self.now - self.start, e)),
            );
        }
        self.now = target;
        out
    }

    fn target(&mut self, view: View) {
        self.q.handle_target(self.now, view);
    }

    fn released(&self) -> View {
        self.q.released(&key()).unwrap().view.clone()
    }
}

fn path_of(e: &Effect) -> Option<Path> {
    match e {
        Effect::Release { path, .. } => Some(*path),
        _ => None,
    }
}

#[test]
fn a_first_view_is_an_admission_released_after_the_batch_window() {
    let mut fx = Fx::new(DeltaConfig::default());
    fx.target(view_of(&[up(1), up(2)]));
    let out = fx.run_to(secs(5));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, d::ADMIT_WINDOW);
    assert_eq!(path_of(&out[0].1), Some(Path::Admission));
    assert_eq!(fx.q.released(&key()).unwrap().version, Version(1));
}

#[test]
fn withdrawals_are_never_delayed_behind_admissions() {
    // Goal: ADR-11 — a withdrawal leaves within its window even with an admission pending.
    let mut fx = Fx::new(DeltaConfig::default());
    fx.target(view_of(&[up(1), up(2), up(3)]));
    fx.run_to(secs(2));
    // One endpoint withdrawn and one admitted in the same target.
    fx.target(view_of(&[up(2), up(3), up(4)]));
    let out = fx.run_to(secs(5));
    assert_eq!(out[0].0, secs(2) + d::WITHDRAW_WINDOW);
    assert_eq!(path_of(&out[0].1), Some(Path::Withdrawal));
    let Effect::Release {
        view,
        previous,
        delta,
        ..
    } = &out[0].1
    else {
        panic!()
    };
    assert_eq!(delta.removed, vec![iid("pay-1")]);
    assert!(delta.upserted.is_empty(), "the admission waited: {delta:?}");
    assert_eq!((*previous, view.version), (Some(Version(1)), Version(2)));
    assert_eq!(out[1].0, secs(2) + d::ADMIT_WINDOW);
    assert_eq!(path_of(&out[1].1), Some(Path::Admission));
    assert_eq!(fx.released(), view_of(&[up(2), up(3), up(4)]));
}

#[test]
fn a_fast_release_never_leaves_a_zone_below_the_targets_count() {
    // Released routes 1 and 3; the target routes 2 and 4. Withdrawing alone would empty
    // the zone, so the zone's admissions ride the fast path with its withdrawals.
    let mut fx = Fx::new(DeltaConfig::default());
    let floored = |eps: &[ViewEndpoint]| {
        let mut v = view_of(eps);
        v.markers.zone_floor.insert(zone("a"), 2); // half of four candidates
        v
    };
    fx.target(floored(&[up(1), up(3)]));
    fx.run_to(secs(2));
    fx.target(floored(&[up(2), up(4)]));
    let out = fx.run_to(secs(2) + d::WITHDRAW_WINDOW);
    assert_eq!(out.len(), 1);
    assert_eq!(fx.released(), floored(&[up(2), up(4)]));
}

#[test]
fn an_engaging_guard_is_urgent() {
    let mut fx = Fx::new(DeltaConfig::default());
    fx.target(view_of(&[up(1)]));
    fx.run_to(secs(2));
    let mut guarded = view_of(&[up(1), endpoint(2, "a", 100, EndpointStatus::Disregarded)]);
    guarded.markers.health_disregarded.insert(zone("a"));
    fx.target(guarded.clone());
    let out = fx.run_to(secs(2) + d::WITHDRAW_WINDOW);
    assert_eq!(path_of(&out[0].1), Some(Path::Withdrawal));
    assert_eq!(fx.released(), guarded);
}

#[test]
fn a_target_that_undoes_itself_releases_nothing() {
    let mut fx = Fx::new(DeltaConfig::default());
    fx.target(view_of(&[up(1)]));
    fx.run_to(secs(2));
    fx.target(view_of(&[up(1), up(2)]));
    fx.target(view_of(&[up(1)]));
    assert!(fx.run_to(secs(5)).is_empty());
}

#[test]
fn saturation_lengthens_admissions_declares_shedding_and_spares_withdrawals() {
    let config = DeltaConfig {
        admit_releases_per_sec: 2,
        ..DeltaConfig::default()
    };
    let mut fx = Fx::new(config);
    let lanes: Vec<ViewKey> = (0..6)
        .map(|i| ViewKey {
            service: svc(&format!("s{i}")),
            zone: zone("a"),
        })
        .collect();
    let view_for = |k: &ViewKey, eps: &[ViewEndpoint]| {
        let mut v = view_of(eps);
        v.key = k.clone();
        v
    };
    for k in &lanes {
        fx.q.handle_target(fx.now, view_for(k, &[up(1), up(2)]));
    }
    let out = fx.run_to(ms(1500));
    let shed = out
        .iter()
        .find(|(_, e)| matches!(e, Effect::ShedStarted { .. }));
    assert!(shed.is_some(), "{out:?}");
    assert!(fx.q.is_shedding());
    assert_eq!(fx.q.admit_window(), d::ADMIT_WINDOW * 2);
    // A withdrawal during the episode still leaves at once.
    let released =
        fx.q.released(&lanes[0])
            .map(|r| r.view.clone())
            .expect("first lanes released");
    assert!(released.routes_to(&iid("pay-1")));
    fx.q.handle_target(fx.now, view_for(&lanes[0], &[up(2)]));
    let t = fx.now - fx.start;
    let out = fx.run_to(t + d::WITHDRAW_WINDOW);
    assert!(
        out.iter()
            .any(|(_, e)| path_of(e) == Some(Path::Withdrawal))
    );
    // Everything is admitted inside the admission budget, and the episode ends.
    let out = fx.run_to(d::ADMISSION_BUDGET_P99);
    assert!(lanes.iter().all(|k| fx.q.released(k).is_some()));
    assert!(
        out.iter()
            .any(|(_, e)| matches!(e, Effect::ShedEnded { deferred, .. } if *deferred > 0)),
        "{out:?}"
    );
    assert_eq!(fx.q.admit_window(), d::ADMIT_WINDOW);
}

#[test]
fn reported_pressure_sheds_admissions() {
    let mut fx = Fx::new(DeltaConfig::default());
    fx.q.handle_pressure(fx.now, true);
    fx.target(view_of(&[up(1)]));
    let out = fx.run_to(secs(1));
    assert!(matches!(out[0].1, Effect::ShedStarted { .. }));
    assert!(fx.q.released(&key()).is_none());
    fx.q.handle_pressure(fx.now, false);
    fx.run_to(secs(10));
    assert!(fx.q.released(&key()).is_some());
}

#[test]
fn one_report_of_pressure_sheds_what_falls_due_within_its_hold() {
    // Goal: a slow commit followed at once by a quick one still sheds: the report holds
    // for PRESSURE_HOLD, so an admission falling due meanwhile is deferred and the episode
    // is declared; after the hold admissions flow again.
    let mut fx = Fx::new(DeltaConfig::default());
    fx.q.handle_pressure(fx.now, true);
    fx.target(view_of(&[up(1)]));
    let out = fx.run_to(secs(1));
    assert!(
        out.iter()
            .any(|(_, e)| matches!(e, Effect::ShedStarted { .. })),
        "{out:?}"
    );
    assert!(fx.q.released(&key()).is_none());
    let later = fx.run_to(PRESSURE_HOLD + secs(10));
    assert!(fx.q.released(&key()).is_some(), "{later:?}");
    assert!(
        later
            .iter()
            .any(|(_, e)| matches!(e, Effect::ShedEnded { .. })),
        "{later:?}"
    );
}

#[test]
fn a_subscriber_ledger_refuses_to_go_backwards() {
    let mut ledger = SubscriberLedger::default();
    ledger.deliver(&key(), Version(5)).unwrap();
    assert_eq!(
        ledger.deliver(&key(), Version(4)),
        Err(Regression {
            key: key(),
            offered: Version(4),
            delivered: Version(5)
        })
    );
    assert!(ledger.deliver(&key(), Version(5)).is_err());
    assert_eq!(ledger.delivered(&key()), Some(Version(5)));
    ledger.deliver(&key(), Version(6)).unwrap();
}

fn target_strategy() -> impl Strategy<Value = View> {
    let status = prop_oneof![
        3 => Just(EndpointStatus::Eligible),
        1 => Just(EndpointStatus::Draining),
        1 => Just(EndpointStatus::Unknown)
    ];
    // An instance never changes zone (a move is a new instance), so the zone follows the id.
    let ep = (0u8..8, prop_oneof![Just(10u32), Just(100)], status)
        .prop_map(|(n, w, s)| endpoint(n, if n % 2 == 0 { "a" } else { "b" }, w, s));
    (prop::collection::vec(ep, 0..8), 0u32..4, 0u32..4).prop_map(|(eps, fa, fb)| {
        let mut v = view_of(&eps);
        // A consistent target meets its own floors (the assembler guarantees it).
        for (z, f) in [("a", fa), ("b", fb)] {
            let floor = f.min(v.routed_in(&zone(z)) as u32);
            v.markers.zone_floor.insert(zone(z), floor);
        }
        v
    })
}

proptest! {
    #[test]
    fn releases_are_monotonic_exact_and_withdraw_on_time(
        steps in prop::collection::vec((0u64..3_000, target_strategy()), 1..40)
    ) {
        let mut fx = Fx::new(DeltaConfig::default());
        let mut last: Option<ReleasedView> = None;
        let mut check = |out: Vec<(Duration, Effect)>| -> Result<(), TestCaseError> {
            for (_, e) in out {
                let Effect::Release { view, previous, delta, .. } = e else { continue };
                prop_assert_eq!(previous, last.as_ref().map(|l| l.version));
                if let Some(l) = &last {
                    prop_assert!(view.version > l.version, "version went backwards");
                    prop_assert_eq!(&apply(&l.view, &delta), &view.view);
                }
                last = Some(*view);
            }
            Ok(())
        };
        let mut elapsed = Duration::ZERO;
        for (gap, target) in steps {
            elapsed += ms(gap);
            check(fx.run_to(elapsed))?;
            let before = fx.q.released(&key()).map(|r| r.view.clone());
            fx.target(target.clone());
            check(fx.run_to(elapsed + d::WITHDRAW_WINDOW))?;
            elapsed += d::WITHDRAW_WINDOW;
            // Every withdrawal in the target is out within the withdrawal window, and no
            // zone routes fewer endpoints than the target does.
            if let Some(before) = before {
                let now = fx.released();
                for (id, e) in before.endpoints.iter() {
                    if e.status.is_routed() && !target.routes_to(id) {
                        prop_assert!(!now.routes_to(id), "{} still routed", id);
                    }
                }
                for z in ["a", "b"] {
                    // A withdrawal never takes a zone below its floor (a zone already below
                    // it before this target is not made worse).
                    let floor = (target.markers.zone_floor[&zone(z)] as usize).min(before.routed_in(&zone(z)));
                    prop_assert!(now.routed_in(&zone(z)) >= floor, "zone {} below its floor {}", z, floor);
                }
            }
        }
        // Quiescence: the last target is released in full.
        check(fx.run_to(elapsed + d::ADMIT_WINDOW_MAX))?;
        prop_assert!(last.is_some());
    }
}

/// One of a few lanes: services `s0`..`s2` seen from callers' zones `a` and `b`.
fn lane_key(n: u8) -> ViewKey {
    ViewKey {
        service: svc(&format!("s{}", n % 3)),
        zone: zone(if n < 3 { "a" } else { "b" }),
    }
}

#[derive(Debug, Clone)]
enum LaneStep {
    Target(u8, View),
    Removed(u8),
    Pressure,
    Wait(u64),
}

fn lane_step() -> impl Strategy<Value = LaneStep> {
    prop_oneof![
        6 => (0u8..6, target_strategy()).prop_map(|(n, v)| LaneStep::Target(n, v)),
        1 => (0u8..3).prop_map(LaneStep::Removed),
        1 => Just(LaneStep::Pressure),
        4 => (0u64..2_000).prop_map(LaneStep::Wait),
    ]
}

proptest! {
    /// Many lanes, service removals, shedding under pressure and a tight rate budget: the
    /// deadline index always holds exactly the lanes' deadlines, each lane's releases stay
    /// monotonic, and once quiet every lane still held releases its last target.
    #[test]
    fn every_lane_falls_due_through_the_deadline_index(
        steps in prop::collection::vec(lane_step(), 1..60)
    ) {
        let config = DeltaConfig { admit_releases_per_sec: 2, ..DeltaConfig::default() };
        let mut fx = Fx::new(config);
        let mut last: BTreeMap<ViewKey, Version> = BTreeMap::new();
        let mut targets: BTreeMap<ViewKey, View> = BTreeMap::new();
        let mut elapsed = Duration::ZERO;
        fn check(
            last: &mut BTreeMap<ViewKey, Version>,
            out: Vec<(Duration, Effect)>,
        ) -> Result<(), TestCaseError> {
            for (_, e) in out {
                let Effect::Release { view, previous, .. } = e else { continue };
                let key = view.view.key.clone();
                prop_assert_eq!(previous, last.get(&key).copied());
                prop_assert!(previous.is_none_or(|p| view.version > p));
                last.insert(key, view.version);
            }
            Ok(())
        }
        for step in steps {
            match step {
                LaneStep::Target(n, mut view) => {
                    view.key = lane_key(n);
                    targets.insert(view.key.clone(), view.clone());
                    fx.target(view);
                }
                LaneStep::Removed(n) => {
                    let service = lane_key(n).service;
                    fx.q.handle_service_removed(&service);
                    targets.retain(|k, _| k.service != service);
                    last.retain(|k, _| k.service != service);
                }
                LaneStep::Pressure => fx.q.handle_pressure(fx.now, true),
                LaneStep::Wait(gap) => {
                    elapsed += ms(gap);
                    check(&mut last, fx.run_to(elapsed))?;
                }
            }
            prop_assert!(fx.q.deadlines_match_lanes());
        }
        elapsed += d::ADMIT_WINDOW_MAX * 4;
        check(&mut last, fx.run_to(elapsed))?;
        prop_assert!(fx.q.deadlines_match_lanes());
        prop_assert_eq!(fx.q.poll_timeout(), None);
        for (key, target) in &targets {
            prop_assert_eq!(&fx.q.released(key).expect("released").view, target);
        }
    }
}
