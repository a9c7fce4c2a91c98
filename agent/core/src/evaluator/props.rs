//! Property tests: the evaluator's invariants over random evidence streams.

use proptest::prelude::*;

use super::*;
use crate::contract::{CapabilityProfile, DependencyAuthority, DependencyDecl, HealthContract};
use crate::eligibility::IneligibleReason;
use crate::model::DependencyStatus;
use crate::testkit::*;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Step {
    Probe(Health),
    Passive { caller: u32, errors: u64 },
    Ready,
    NotReady,
    Dependency(DependencyStatus),
    Tick,
}

fn step() -> impl Strategy<Value = (u64, Step)> {
    let health = prop_oneof![
        Just(Health::Pass),
        Just(Health::Fail),
        Just(Health::Timeout),
        Just(Health::Refused)
    ];
    let status = prop_oneof![
        Just(DependencyStatus::Ok),
        Just(DependencyStatus::Degraded),
        Just(DependencyStatus::Down)
    ];
    let action = prop_oneof![
        4 => health.prop_map(Step::Probe),
        3 => (0u32..4, prop_oneof![Just(0u64), Just(10), Just(60), Just(100)]).prop_map(|(caller, errors)| Step::Passive { caller, errors }),
        1 => Just(Step::Ready),
        1 => Just(Step::NotReady),
        1 => status.prop_map(Step::Dependency),
        2 => Just(Step::Tick),
    ];
    // Mostly sub-second gaps, sometimes long silences.
    let gap = prop_oneof![8 => 0u64..1_500, 1 => 1_500u64..30_000];
    (gap, action)
}

fn shared_db_contract() -> ValidContract {
    HealthContract {
        profile: CapabilityProfile::FULL,
        dependencies: vec![DependencyDecl {
            name: "db".into(),
            shared: true,
            authority: DependencyAuthority::WeightReduction,
        }],
        ..HealthContract::default()
    }
    .validate()
    .unwrap()
}

/// Runs a stream and records every (time, eligibility) after each step.
struct Run {
    ev: Evaluator,
    id: InstanceId,
    now: Instant,
    trace: Vec<(Instant, Eligibility, bool)>,
}

impl Run {
    fn new(admission: Admission) -> Self {
        let now = t0();
        let mut ev = Evaluator::new(EvaluatorConfig::default());
        ev.handle_service(now, svc("pay"), "team".into(), shared_db_contract());
        let inst = instance("pay", "pay-1", "a", 1);
        ev.handle_instance(now, &inst, admission).unwrap();
        let e = ev.eligibility(&inst.id).unwrap();
        Self {
            ev,
            id: inst.id,
            now,
            trace: vec![(now, e, false)],
        }
    }

    /// Advance by `gap_ms`, firing timers on the way (each recorded as timer-only).
    fn advance(&mut self, gap_ms: u64) {
        let target = self.now + ms(gap_ms);
        while let Some(due) = self.ev.poll_timeout().filter(|t| *t <= target) {
            self.now = due.max(self.now);
            self.ev.handle_timeout(self.now);
            self.record(true);
        }
        self.now = target;
    }

    fn apply(&mut self, step: &Step) {
        let id = self.id.clone();
        let sample = match step {
            Step::Probe(h) => probe(&id, *h),
            Step::Passive { caller, errors } => passive(&id, *caller, 100, *errors),
            Step::Ready => self_report(&id, SelfReport::Ready),
            Step::NotReady => self_report(
                &id,
                SelfReport::NotReady {
                    detail: "pool exhausted".into(),
                },
            ),
            Step::Dependency(status) => self_report(
                &id,
                SelfReport::Dependency {
                    name: "db".into(),
                    status: *status,
                },
            ),
            Step::Tick => {
                self.ev.handle_timeout(self.now);
                self.record(true);
                return;
            }
        };
        self.ev.handle_sample(self.now, sample).unwrap();
        self.record(false);
    }

    fn record(&mut self, timer_only: bool) {
        let e = self.ev.eligibility(&self.id).unwrap();
        self.trace.push((self.now, e, timer_only));
    }

    fn replay(admission: Admission, steps: &[(u64, Step)]) -> Self {
        let mut run = Self::new(admission);
        for (gap, step) in steps {
            run.advance(*gap);
            run.apply(step);
        }
        run
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_same_inputs_give_the_same_outputs(steps in prop::collection::vec(step(), 1..120)) {
        let a = Run::replay(Admission::New, &steps);
        let b = Run::replay(Admission::New, &steps);
        let strip = |r: &Run| r.trace.iter().map(|(t, e, x)| (*t - r.trace[0].0, *e, *x)).collect::<Vec<_>>();
        // Instants differ between runs only by their anchor; compare offsets and verdicts.
        let (ta, tb) = (strip(&a), strip(&b));
        prop_assert_eq!(ta.len(), tb.len());
        for (x, y) in ta.iter().zip(tb.iter()) {
            prop_assert_eq!(x.0, y.0);
            prop_assert_eq!(x.1.verdict(), y.1.verdict());
            prop_assert_eq!(x.1.weight(), y.1.weight());
        }
    }

    #[test]
    fn silence_alone_never_takes_an_instance_out(steps in prop::collection::vec(step(), 1..120)) {
        let run = Run::replay(Admission::New, &steps);
        for pair in run.trace.windows(2) {
            let ((_, before, _), (_, after, timer_only)) = (&pair[0], &pair[1]);
            if *timer_only && before.is_routed() {
                prop_assert!(after.is_routed(), "a timer withdrew {:?} -> {:?}", before, after);
            }
        }
    }

    #[test]
    fn a_hard_failure_withdraws_in_one_step(steps in prop::collection::vec(step(), 0..80)) {
        let mut run = Run::replay(Admission::New, &steps);
        run.advance(10);
        run.apply(&Step::Probe(Health::Refused));
        let (_, e, _) = run.trace.last().unwrap();
        prop_assert!(!e.is_routed(), "still routed after a refused connection: {:?}", e);
    }

    #[test]
    fn reentry_is_never_faster_than_the_hold(steps in prop::collection::vec(step(), 1..150)) {
        let run = Run::replay(Admission::New, &steps);
        let hold = shared_db_contract().scoring.readmit_hold;
        let mut out_since: Option<Instant> = None;
        for (i, (t, e, _)) in run.trace.iter().enumerate() {
            match (out_since, e.is_routed()) {
                (None, false) => out_since = Some(*t),
                (Some(since), true) => {
                    prop_assert!(*t - since >= hold, "back in after {:?}: {:?}", *t - since, &run.trace[i.saturating_sub(3)..=i]);
                    out_since = None;
                }
                _ => {}
            }
        }
    }

    #[test]
    fn a_shared_dependency_never_makes_an_instance_ineligible(
        statuses in prop::collection::vec((0u64..2_000, prop_oneof![Just(DependencyStatus::Ok), Just(DependencyStatus::Degraded), Just(DependencyStatus::Down)]), 1..60)
    ) {
        // Probes and callers pass throughout; only the shared dependency wobbles.
        let steps: Vec<(u64, Step)> = statuses
            .into_iter()
            .flat_map(|(gap, s)| [(gap, Step::Probe(Health::Pass)), (0, Step::Passive { caller: 1, errors: 0 }), (0, Step::Dependency(s))])
            .collect();
        let run = Run::replay(Admission::Established, &steps);
        for (_, e, _) in &run.trace {
            prop_assert!(e.is_routed(), "shared dependency withdrew the instance: {:?}", e);
            let dependency_withdrawal = matches!(e, Eligibility::Ineligible { reason: IneligibleReason::Dependency });
            prop_assert!(!dependency_withdrawal);
        }
    }

    #[test]
    fn quarantine_holds_until_its_time(steps in prop::collection::vec(step(), 1..200)) {
        // Held out until `until`: quarantined, or out for a harder reason (a refused
        // connection outranks it), never back in rotation early.
        let run = Run::replay(Admission::New, &steps);
        let mut held: Option<Instant> = None;
        for (t, e, _) in &run.trace {
            if let Some(until) = held {
                if *t < until {
                    prop_assert!(!e.is_routed(), "back in rotation {:?} before the quarantine ended", until - *t);
                } else {
                    held = None;
                }
            }
            if let Eligibility::Quarantined { until } = e {
                held = Some(*until);
            }
        }
    }

    #[test]
    fn slow_start_never_reaches_full_weight_before_its_interval(steps in prop::collection::vec(step(), 1..150)) {
        let run = Run::replay(Admission::New, &steps);
        let ramp = shared_db_contract().slow_start;
        let mut entered = Some(run.trace[0].0);
        let mut was_routed = true;
        for (t, e, _) in &run.trace {
            if e.is_routed() && !was_routed {
                entered = Some(*t);
            }
            was_routed = e.is_routed();
            if let (Eligibility::Eligible { weight } | Eligibility::Unknown { weight }, Some(since)) = (e, entered)
                && *t - since < ramp
            {
                prop_assert!(*weight < Weight::DEFAULT, "full weight {:?} after entry", *t - since);
            }
        }
    }

    #[test]
    fn unknown_is_never_reported_while_a_class_is_speaking(steps in prop::collection::vec(step(), 1..120)) {
        let mut run = Run::new(Admission::New);
        for (gap, step) in &steps {
            run.advance(*gap);
            run.apply(step);
            let e = run.ev.eligibility(&run.id).unwrap();
            let why = run.ev.explain(run.now, &run.id).unwrap();
            let speaking = why.classes.iter().any(|c| c.provided && !c.silent);
            if e.verdict() == Verdict::Eligible {
                prop_assert!(speaking, "eligible with every class silent");
            }
            if e.verdict() == Verdict::Unknown {
                prop_assert!(!speaking, "unknown while {:?} speak", why.classes);
            }
        }
    }
}

use crate::units::Weight;

// --- callers' outcomes as primary evidence (ADR-04, ADR-15) ---

/// One instance under a passive-primary contract with `profile`.
fn primary_evaluator(profile: CapabilityProfile) -> (Evaluator, Instant, InstanceId) {
    let start = t0();
    let mut ev = Evaluator::new(EvaluatorConfig::default());
    ev.handle_service(start, svc("pay"), "team".into(), passive_primary(profile));
    let inst = instance("pay", "pay-1", "a", 1);
    ev.handle_instance(start, &inst, Admission::Established)
        .unwrap();
    (ev, start, inst.id)
}

fn primary_profile() -> impl Strategy<Value = CapabilityProfile> {
    prop_oneof![
        Just(CapabilityProfile::NO_SELF_REPORT),
        Just(CapabilityProfile::NO_READINESS),
        Just(CapabilityProfile::FULL),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// One caller is one vote at any volume: with every other signal healthy, nothing it
    /// reports takes the instance out of rotation.
    #[test]
    fn one_caller_at_any_volume_never_withdraws(
        profile in primary_profile(),
        healthy_callers in 0u32..6,
        rounds in prop::collection::vec((0u64..3_000, 1u64..u64::MAX / 2, 0u64..=100), 1..60),
    ) {
        let (mut ev, start, id) = primary_evaluator(profile);
        let mut now = start;
        for (gap_ms, requests, error_pct) in rounds {
            now += Duration::from_millis(gap_ms);
            ev.handle_timeout(now);
            if profile.probe {
                ev.handle_sample(now, probe(&id, Health::Pass)).unwrap();
            }
            if profile.self_report {
                ev.handle_sample(now, self_report(&id, SelfReport::Ready)).unwrap();
            }
            let errors = requests / 100 * error_pct;
            ev.handle_sample(now, passive(&id, 0, requests, errors)).unwrap();
            for n in 1..=healthy_callers {
                ev.handle_sample(now, passive(&id, n, 50, 0)).unwrap();
            }
            let e = ev.eligibility(&id).unwrap();
            prop_assert!(e.is_routed(), "one caller withdrew it: {:?}", e);
        }
    }

    /// A replica failing most of every caller's requests, with enough callers and traffic
    /// to be passive-primary, is withdrawn within the damping budget of the first failing
    /// round — whatever its probe says.
    #[test]
    fn a_replica_failing_most_callers_requests_is_withdrawn_within_the_budget(
        profile in primary_profile(),
        callers in 3u32..24,
        per_caller in 0u64..2_000,
        error_share in 500u64..=1_000,
        jitter_ms in prop::collection::vec(0u64..200, 12),
    ) {
        let (mut ev, start, id) = primary_evaluator(profile);
        let requests = per_caller.max(100u64.div_ceil(u64::from(callers))).max(5);
        let errors = requests * error_share / 1_000;
        let first = start + Duration::from_secs(1);
        let mut withdrawn = None;
        for (round, jitter) in jitter_ms.iter().enumerate() {
            let now = first + Duration::from_secs(round as u64) + Duration::from_millis(*jitter);
            ev.handle_timeout(now);
            if profile.probe {
                ev.handle_sample(now, probe(&id, Health::Pass)).unwrap();
            }
            for n in 0..callers {
                ev.handle_sample(now, passive(&id, n, requests, errors)).unwrap();
            }
            if withdrawn.is_none() && !ev.eligibility(&id).unwrap().is_routed() {
                withdrawn = Some(now);
            }
        }
        let at = withdrawn.expect("withdrawn");
        prop_assert!(at - first <= d::DAMPING_BUDGET, "withdrawn after {:?}", at - first);
        prop_assert_eq!(ev.evidence_mode(at, &id).map(|m| m.0), Some(EvidenceMode::PassivePrimary));
    }

    /// However the callers come and go, once they are all quiet a passive-primary
    /// instance that was routed is unknown or eligible, never ineligible.
    #[test]
    fn quiet_callers_never_make_a_routed_instance_ineligible(
        rounds in prop::collection::vec((1u32..8, 5u64..500), 1..20),
    ) {
        let (mut ev, start, id) = primary_evaluator(CapabilityProfile::NO_READINESS);
        let mut now = start;
        for (callers, requests) in rounds {
            now += Duration::from_secs(1);
            // Healthy callers only: the instance stays routed while they speak.
            for n in 0..callers {
                ev.handle_sample(now, passive(&id, n, requests, 0)).unwrap();
            }
        }
        prop_assert!(ev.eligibility(&id).unwrap().is_routed());
        for _ in 0..120 {
            now += Duration::from_secs(1);
            ev.handle_timeout(now);
            prop_assert!(ev.eligibility(&id).unwrap().is_routed());
        }
        prop_assert_eq!(ev.eligibility(&id).unwrap().verdict(), Verdict::Unknown);
    }
}
