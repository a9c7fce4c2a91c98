//! Scenario tests: each walks the decision path to one verdict from its evidence.

use super::*;
use crate::contract::{CapabilityProfile, DependencyAuthority, DependencyDecl, HealthContract};
use crate::defaults as d;
use crate::eligibility::{DegradeCause, DrainCause, IneligibleReason};
use crate::model::DependencyStatus;
use crate::testkit::*;
use crate::units::Weight;
use std::time::Duration;

/// A one-instance evaluator with a clock the test moves.
pub(super) struct Fx {
    pub(super) ev: Evaluator,
    pub(super) start: Instant,
    pub(super) now: Instant,
    pub(super) id: InstanceId,
}

impl Fx {
    pub(super) fn new(contract: ValidContract, admission: Admission) -> Self {
        let start = t0();
        let mut ev = Evaluator::new(EvaluatorConfig::default());
        ev.handle_service(start, svc("pay"), "team-pay".into(), contract);
        let inst = instance("pay", "pay-1", "a", 1);
        ev.handle_instance(start, &inst, admission).unwrap();
        Self {
            ev,
            start,
            now: start,
            id: inst.id,
        }
    }

    pub(super) fn default() -> Self {
        Self::new(ValidContract::default(), Admission::Established)
    }

    /// Move the clock to `at` (from the start), firing every timer due on the way.
    pub(super) fn at(&mut self, at: Duration) {
        let target = self.start + at;
        assert!(target >= self.now, "tests move forward");
        while let Some(due) = self.ev.poll_timeout().filter(|t| *t <= target) {
            self.now = due.max(self.now);
            self.ev.handle_timeout(self.now);
        }
        self.now = target;
        self.ev.handle_timeout(self.now);
    }

    pub(super) fn feed(&mut self, at: Duration, sample: Sample) {
        self.at(at);
        self.ev.handle_sample(self.now, sample).unwrap();
    }

    pub(super) fn probe(&mut self, at: Duration, health: Health) {
        let s = probe(&self.id, health);
        self.feed(at, s);
    }

    pub(super) fn passive(&mut self, at: Duration, from: u32, errors: u64) {
        let s = passive(&self.id, from, 100, errors);
        self.feed(at, s);
    }

    pub(super) fn eligibility(&self) -> Eligibility {
        self.ev.eligibility(&self.id).unwrap()
    }

    pub(super) fn verdict(&self) -> Verdict {
        self.eligibility().verdict()
    }

    pub(super) fn rule(&self) -> Rule {
        self.ev.explain(self.now, &self.id).unwrap().rule
    }

    /// Probes and callers both passing, once a second, from `from` to `to` seconds.
    pub(super) fn healthy(&mut self, from: u64, to: u64) {
        for s in from..to {
            self.probe(secs(s), Health::Pass);
            self.passive(secs(s), 1, 0);
        }
    }
}

#[test]
fn a_new_instance_is_routed_as_unknown_at_the_first_slow_start_step() {
    // Goal: admission with no evidence is the Unknown verdict, in rotation, ramping.
    let fx = Fx::new(ValidContract::default(), Admission::New);
    let weight = Weight::DEFAULT.scale(d::SLOW_START_FIRST);
    assert_eq!(fx.eligibility(), Eligibility::Unknown { weight });
    assert_eq!(fx.rule(), Rule::Admitted);
    assert!(fx.eligibility().is_routed());
}

#[test]
fn an_established_instance_enters_at_full_weight() {
    // Goal: a new leader rebuilding its view moves no traffic.
    let fx = Fx::default();
    assert_eq!(
        fx.eligibility(),
        Eligibility::Unknown {
            weight: Weight::DEFAULT
        }
    );
}

#[test]
fn passing_evidence_makes_an_instance_eligible() {
    let mut fx = Fx::default();
    fx.healthy(0, 3);
    assert_eq!(
        fx.eligibility(),
        Eligibility::Eligible {
            weight: Weight::DEFAULT
        }
    );
    assert_eq!(fx.rule(), Rule::Passing);
}

#[test]
fn a_refused_connection_withdraws_on_the_sample_that_reports_it() {
    // Goal: the hard-failure fast path skips the decay entirely.
    let mut fx = Fx::default();
    fx.healthy(0, 10);
    fx.ev.take_effects();
    fx.probe(secs(10), Health::Refused);
    let reason = IneligibleReason::HardFailure;
    assert_eq!(fx.eligibility(), Eligibility::Ineligible { reason });
    assert_eq!(
        fx.rule(),
        Rule::HardFailure {
            class: Some(EvidenceClass::Probe)
        }
    );
    let effects = fx.ev.take_effects();
    assert!(
        matches!(&effects[0], Effect::Transition(r) if r.from == Some(Verdict::Eligible) && r.to == Verdict::Ineligible)
    );
    assert_eq!(
        effects[1],
        Effect::Eligibility {
            instance: fx.id.clone(),
            service: svc("pay"),
            eligibility: Eligibility::Ineligible { reason }
        }
    );
    assert_eq!(effects.len(), 2);
}

#[test]
fn a_process_gone_fact_withdraws_at_once() {
    let mut fx = Fx::default();
    fx.healthy(0, 3);
    fx.ev
        .handle_lifecycle(fx.now, &fx.id.clone(), Lifecycle::ProcessGone)
        .unwrap();
    assert_eq!(
        fx.eligibility(),
        Eligibility::Ineligible {
            reason: IneligibleReason::HardFailure
        }
    );
    assert_eq!(fx.rule(), Rule::HardFailure { class: None });
}

#[test]
fn a_corroborated_soft_failure_is_withdrawn_inside_the_damping_budget() {
    // Goal: at the default cadence a steady failure seen by probes and callers is
    // withdrawn within DAMPING_BUDGET of its first failed sample.
    let mut fx = Fx::default();
    fx.healthy(0, 10);
    let first_failure = secs(10);
    let mut withdrawn_at = None;
    for s in 10..20 {
        fx.probe(secs(s), Health::Fail);
        fx.passive(secs(s), 1, 90);
        if fx.verdict() == Verdict::Ineligible {
            withdrawn_at = Some(secs(s));
            break;
        }
    }
    let withdrawn_at = withdrawn_at.expect("withdrawn");
    assert!(
        withdrawn_at - first_failure <= d::DAMPING_BUDGET,
        "took {:?}",
        withdrawn_at - first_failure
    );
    assert!(matches!(fx.rule(), Rule::Corroborated { .. }));
}

#[test]
fn a_lone_failure_among_passes_is_absorbed() {
    // Goal: damping exists to absorb noise.
    let mut fx = Fx::default();
    for s in 0..30 {
        let health = if s % 3 == 0 {
            Health::Fail
        } else {
            Health::Pass
        };
        fx.probe(secs(s), health);
        fx.passive(secs(s), 1, 0);
        assert!(
            fx.eligibility().is_routed(),
            "noise withdrew the instance at {s}s"
        );
    }
}

#[test]
fn an_uncorroborated_failure_only_degrades() {
    // Goal: a probe failing while callers are fine lowers weight; it does not withdraw.
    let mut fx = Fx::default();
    fx.healthy(0, 5);
    for s in 5..15 {
        fx.probe(secs(s), Health::Fail);
        fx.passive(secs(s), 1, 0);
    }
    let weight = Weight::DEFAULT.scale(d::UNCORROBORATED_WEIGHT);
    assert_eq!(
        fx.eligibility(),
        Eligibility::Degraded {
            weight,
            cause: DegradeCause::Uncorroborated
        }
    );
    assert_eq!(
        fx.rule(),
        Rule::Uncorroborated {
            failing: EvidenceClass::Probe
        }
    );
}

#[test]
fn a_failure_with_a_silent_second_class_is_not_corroborated() {
    // Goal: silence never corroborates; the absence of one class is not a negative result.
    let mut fx = Fx::default();
    for s in 0..10 {
        fx.probe(secs(s), Health::Fail);
    }
    assert_eq!(fx.verdict(), Verdict::Degraded);
}

#[test]
fn the_only_class_of_a_profile_withdraws_on_its_own() {
    let mut fx = Fx::new(
        contract_with(CapabilityProfile::PROBE_ONLY),
        Admission::Established,
    );
    for s in 0..5 {
        fx.probe(secs(s), Health::Fail);
    }
    assert_eq!(
        fx.eligibility(),
        Eligibility::Ineligible {
            reason: IneligibleReason::SoftFailure
        }
    );
    assert_eq!(
        fx.rule(),
        Rule::SingleClassProfile {
            failing: EvidenceClass::Probe
        }
    );
}

#[test]
fn silence_turns_an_eligible_instance_unknown_and_keeps_it_routed() {
    // Goal: the single most important edge: silence is Unknown, not Ineligible.
    let mut fx = Fx::default();
    fx.healthy(0, 5);
    assert_eq!(fx.verdict(), Verdict::Eligible);
    fx.at(secs(60));
    assert_eq!(
        fx.eligibility(),
        Eligibility::Unknown {
            weight: Weight::DEFAULT
        }
    );
    assert_eq!(fx.rule(), Rule::Silence);
    // The timer fired exactly when the last class fell silent, not at the next input.
    let last = fx
        .ev
        .explain(fx.now, &fx.id)
        .unwrap()
        .history
        .last()
        .cloned()
        .unwrap();
    let silent_at = secs(4) + ValidContract::default().silence_after(EvidenceClass::Probe);
    assert!(last.at - fx.start > silent_at && last.at - fx.start <= silent_at + ms(1));
}

#[test]
fn a_contract_that_opts_in_reads_silence_as_failure_and_evidence_brings_it_back() {
    // Goal: `silence_withdraws` (off by default) is the only way silence removes, and it
    // removes exactly when the last class falls silent.
    let contract = HealthContract {
        silence_withdraws: true,
        ..HealthContract::default()
    }
    .validate()
    .unwrap();
    let mut fx = Fx::new(contract, Admission::Established);
    fx.healthy(0, 5);
    assert_eq!(fx.verdict(), Verdict::Eligible);
    fx.at(secs(60));
    assert_eq!(
        fx.eligibility(),
        Eligibility::Ineligible {
            reason: IneligibleReason::SoftFailure
        }
    );
    assert_eq!(fx.rule(), Rule::Silence);
    fx.healthy(61, 62);
    assert_eq!(fx.verdict(), Verdict::Eligible);
}

#[test]
fn silence_after_a_withdrawal_does_not_readmit() {
    let mut fx = Fx::default();
    for s in 0..5 {
        fx.probe(secs(s), Health::Fail);
        fx.passive(secs(s), 1, 100);
    }
    assert_eq!(fx.verdict(), Verdict::Ineligible);
    fx.at(secs(600));
    assert_eq!(fx.verdict(), Verdict::Ineligible);
    assert!(
        matches!(fx.rule(), Rule::Corroborated { .. }),
        "{:?}",
        fx.rule()
    );
}

#[test]
fn reentry_waits_for_the_hold_and_is_slower_than_removal() {
    let mut fx = Fx::default();
    fx.healthy(0, 5);
    let mut removed = None;
    for s in 5..15 {
        fx.probe(secs(s), Health::Fail);
        fx.passive(secs(s), 1, 100);
        if removed.is_none() && fx.verdict() == Verdict::Ineligible {
            removed = Some(secs(s) - secs(5));
        }
    }
    let removal = removed.unwrap();
    let mut readmitted = None;
    for s in 15..60 {
        fx.probe(secs(s), Health::Pass);
        fx.passive(secs(s), 1, 0);
        if fx.eligibility().is_routed() {
            readmitted = Some(secs(s) - secs(15));
            break;
        }
    }
    let reentry = readmitted.expect("readmitted");
    assert!(reentry >= d::READMIT_HOLD, "re-entry took {reentry:?}");
    assert!(
        reentry > removal,
        "re-entry {reentry:?} not slower than removal {removal:?}"
    );
    // Re-entry starts a new slow-start ramp.
    assert!(fx.eligibility().weight().unwrap() < Weight::DEFAULT);
}

fn dependency_contract(shared: bool, authority: DependencyAuthority) -> ValidContract {
    HealthContract {
        profile: CapabilityProfile::FULL,
        dependencies: vec![DependencyDecl {
            name: "db".into(),
            shared,
            authority,
        }],
        ..HealthContract::default()
    }
    .validate()
    .unwrap()
}

#[test]
fn a_shared_dependency_down_only_lowers_weight() {
    // Goal: ADR-06 — a database wobble degrades, it never withdraws.
    let mut fx = Fx::new(
        dependency_contract(true, DependencyAuthority::WeightReduction),
        Admission::Established,
    );
    fx.healthy(0, 3);
    let report = SelfReport::Dependency {
        name: "db".into(),
        status: DependencyStatus::Down,
    };
    let s = self_report(&fx.id, report);
    fx.feed(secs(3), s);
    let weight = Weight::DEFAULT.scale(d::DEPENDENCY_WEIGHT);
    assert_eq!(
        fx.eligibility(),
        Eligibility::Degraded {
            weight,
            cause: DegradeCause::Dependency
        }
    );
    assert_eq!(fx.rule(), Rule::DependencyWeight);
}

#[test]
fn a_private_dependency_with_unreadiness_authority_withdraws() {
    let mut fx = Fx::new(
        dependency_contract(false, DependencyAuthority::Unreadiness),
        Admission::Established,
    );
    fx.healthy(0, 3);
    let s = self_report(
        &fx.id,
        SelfReport::Dependency {
            name: "db".into(),
            status: DependencyStatus::Down,
        },
    );
    fx.feed(secs(3), s);
    assert_eq!(
        fx.eligibility(),
        Eligibility::Ineligible {
            reason: IneligibleReason::Dependency
        }
    );
    let s = self_report(
        &fx.id,
        SelfReport::Dependency {
            name: "db".into(),
            status: DependencyStatus::Ok,
        },
    );
    fx.feed(secs(4), s);
    assert_eq!(fx.verdict(), Verdict::Eligible);
}

#[test]
fn an_undeclared_dependency_is_refused_and_counted() {
    let mut fx = Fx::new(
        dependency_contract(true, DependencyAuthority::WeightReduction),
        Admission::Established,
    );
    let s = self_report(
        &fx.id,
        SelfReport::Dependency {
            name: "cache".into(),
            status: DependencyStatus::Down,
        },
    );
    let err = fx.ev.handle_sample(fx.now, s).unwrap_err();
    assert!(matches!(err, EvaluatorError::UndeclaredDependency { .. }));
    assert_eq!(
        fx.ev.stats().rejected.get("undeclared_dependency"),
        Some(&1)
    );
}

/// Drive one full out-and-back cycle starting at `t` seconds; returns the end time.
fn flap_once(fx: &mut Fx, t: u64) -> u64 {
    fx.probe(secs(t), Health::Refused);
    let mut s = t + 1;
    while !fx.eligibility().is_routed() && s < t + 100 {
        fx.probe(secs(s), Health::Pass);
        fx.passive(secs(s), 1, 0);
        if matches!(fx.eligibility(), Eligibility::Quarantined { .. }) {
            return s;
        }
        s += 1;
    }
    s
}

#[test]
fn more_than_four_transitions_in_ten_minutes_quarantines_with_doubling_backoff() {
    // Goal: ADR-09 — a flapping instance is held out, escalating, and its owner is told.
    let mut fx = Fx::default();
    fx.healthy(0, 2);
    let mut t = 2;
    for _ in 0..2 {
        t = flap_once(&mut fx, t);
    }
    assert!(
        fx.eligibility().is_routed(),
        "four transitions are tolerated"
    );
    fx.ev.take_effects();
    fx.probe(secs(t), Health::Refused); // the fifth transition
    let event = quarantine_event(&mut fx).expect("owner notified");
    assert_eq!((event.owner.as_str(), event.level), ("team-pay", 1));
    assert_eq!(event.until - event.at, d::QUARANTINE_FIRST);
    assert!(event.history.len() >= 4);
    // While the port is closed the hard failure shows (it outranks quarantine: the guard
    // must know nothing listens); once it answers, the quarantine shows, until `until`.
    assert_eq!(
        fx.eligibility(),
        Eligibility::Ineligible {
            reason: IneligibleReason::HardFailure
        }
    );
    for s in t + 1..t + 59 {
        fx.probe(secs(s), Health::Pass);
        fx.passive(secs(s), 1, 0);
        assert_eq!(
            fx.eligibility(),
            Eligibility::Quarantined { until: event.until }
        );
    }
    fx.probe(secs(t + 61), Health::Pass);
    fx.passive(secs(t + 61), 1, 0);
    assert!(
        fx.eligibility().is_routed(),
        "released after until: {:?}",
        fx.eligibility()
    );
    // Flapping again: the next quarantine is twice as long.
    let mut t = t + 62;
    let second = loop {
        t = flap_once(&mut fx, t);
        if let Some(q) = quarantine_event(&mut fx) {
            break q;
        }
        if fx.eligibility().is_routed() {
            fx.probe(secs(t), Health::Refused);
        }
    };
    assert_eq!(second.level, 2);
    assert_eq!(second.until - second.at, d::QUARANTINE_FIRST * 2);
}

fn quarantine_event(fx: &mut Fx) -> Option<Box<QuarantineEvent>> {
    fx.ev.take_effects().into_iter().find_map(|e| match e {
        Effect::Quarantined(q) => Some(q),
        _ => None,
    })
}

#[test]
fn slow_start_publishes_rising_steps_and_full_weight_only_at_the_end() {
    let mut fx = Fx::new(ValidContract::default(), Admission::New);
    let mut weights = vec![fx.eligibility().weight().unwrap().get()];
    for s in 1..=61 {
        fx.healthy(s, s + 1);
        weights.push(fx.eligibility().weight().unwrap().get());
    }
    assert!(
        weights.windows(2).all(|w| w[0] <= w[1]),
        "ramp went down: {weights:?}"
    );
    let full_at = weights
        .iter()
        .position(|w| *w == Weight::DEFAULT.get())
        .unwrap();
    assert_eq!(full_at, 60, "full weight at {full_at}s: {weights:?}");
    let steps: std::collections::BTreeSet<_> = weights.iter().collect();
    assert_eq!(steps.len(), d::SLOW_START_STEPS as usize + 1, "{weights:?}");
}

#[test]
fn draining_and_maintenance_are_states_of_their_own() {
    let mut fx = Fx::default();
    fx.healthy(0, 2);
    let id = fx.id.clone();
    fx.ev
        .handle_lifecycle(fx.now, &id, Lifecycle::Terminating)
        .unwrap();
    assert_eq!(
        fx.eligibility(),
        Eligibility::Draining {
            cause: DrainCause::Terminating
        }
    );
    fx.ev
        .handle_lifecycle(fx.now, &id, Lifecycle::Serving)
        .unwrap();
    assert_eq!(fx.verdict(), Verdict::Eligible);
    let reason = "disk swap".to_string();
    fx.ev
        .handle_lifecycle(fx.now, &id, Lifecycle::MaintenanceOn { reason })
        .unwrap();
    assert_eq!(
        fx.eligibility(),
        Eligibility::Draining {
            cause: DrainCause::Maintenance
        }
    );
    fx.ev
        .handle_lifecycle(fx.now, &id, Lifecycle::MaintenanceOff)
        .unwrap();
    assert_eq!(fx.verdict(), Verdict::Eligible);
}

#[test]
fn a_retired_id_is_never_reused() {
    let mut fx = Fx::default();
    let id = fx.id.clone();
    fx.ev.take_effects();
    fx.ev
        .handle_lifecycle(fx.now, &id, Lifecycle::LeaseExpired)
        .unwrap();
    let effects = fx.ev.take_effects();
    assert!(matches!(effects.last(), Some(Effect::Retired { .. })));
    assert!(fx.ev.eligibility(&id).is_none());
    let again = instance("pay", "pay-1", "a", 1);
    assert_eq!(
        fx.ev.handle_instance(fx.now, &again, Admission::New),
        Err(EvaluatorError::Retired {
            instance: id.clone()
        })
    );
    assert!(
        fx.ev
            .handle_sample(fx.now, probe(&id, Health::Pass))
            .is_err()
    );
}

#[test]
fn evidence_must_be_attributable_to_the_right_reporter() {
    // Goal: ADR-15 — an instance reports only about itself; a workload cannot probe.
    let mut fx = Fx::new(
        contract_with(CapabilityProfile::FULL),
        Admission::Established,
    );
    let other = instance("pay", "pay-2", "a", 2);
    fx.ev
        .handle_instance(fx.now, &other, Admission::Established)
        .unwrap();
    let forged = Sample {
        instance: fx.id.clone(),
        reporter: Reporter::Instance(other.id.clone()),
        observation: Observation::SelfReport(SelfReport::NotReady {
            detail: "lies".into(),
        }),
    };
    let before = fx.eligibility();
    assert!(matches!(
        fx.ev.handle_sample(fx.now, forged),
        Err(EvaluatorError::NotAttributable { .. })
    ));
    let workload_probe = Sample {
        instance: fx.id.clone(),
        reporter: Reporter::Instance(fx.id.clone()),
        observation: Observation::Probe {
            health: Health::Refused,
            detail: None,
        },
    };
    assert!(fx.ev.handle_sample(fx.now, workload_probe).is_err());
    assert_eq!(fx.eligibility(), before, "refused evidence changed nothing");
    assert_eq!(fx.ev.stats().rejected.get("not_attributable"), Some(&2));
}

#[test]
fn a_class_the_profile_does_not_provide_is_refused() {
    let mut fx = Fx::new(
        contract_with(CapabilityProfile::NO_READINESS),
        Admission::Established,
    );
    let err = fx
        .ev
        .handle_sample(fx.now, probe(&fx.id, Health::Refused))
        .unwrap_err();
    assert!(matches!(
        err,
        EvaluatorError::ClassNotProvided {
            class: EvidenceClass::Probe,
            ..
        }
    ));
    assert!(fx.eligibility().is_routed());
}

#[test]
fn low_traffic_reports_are_neither_evidence_nor_silence_breakers() {
    let mut fx = Fx::new(
        contract_with(CapabilityProfile::NO_READINESS),
        Admission::Established,
    );
    for s in 0..10 {
        let sample = passive(
            &fx.id,
            1,
            d::PASSIVE_MIN_REQUESTS - 1,
            d::PASSIVE_MIN_REQUESTS - 1,
        );
        fx.feed(secs(s), sample);
    }
    assert_eq!(fx.verdict(), Verdict::Unknown);
}

#[test]
fn explain_names_the_rule_the_evidence_and_the_history() {
    let mut fx = Fx::default();
    fx.healthy(0, 3);
    let s = Sample {
        instance: fx.id.clone(),
        reporter: prober(),
        observation: Observation::Probe {
            health: Health::Refused,
            detail: Some("connect: refused".into()),
        },
    };
    fx.feed(secs(3), s);
    let why = fx.ev.explain(fx.now, &fx.id).unwrap();
    assert_eq!(
        why.rule,
        Rule::HardFailure {
            class: Some(EvidenceClass::Probe)
        }
    );
    let probe_ev = &why.classes[EvidenceClass::Probe.index()];
    assert_eq!(probe_ev.last.as_deref(), Some("Refused: connect: refused"));
    assert_eq!(probe_ev.reporter, Some(prober()));
    let path: Vec<_> = why.history.iter().map(|t| (t.from, t.to)).collect();
    assert_eq!(
        path,
        vec![
            (None, Verdict::Unknown),
            (Some(Verdict::Unknown), Verdict::Eligible),
            (Some(Verdict::Eligible), Verdict::Ineligible)
        ]
    );
    let text = why.to_string();
    assert!(
        text.contains("rule hard_failure (probe)")
            && !text.contains("HardFailure")
            && text.contains("connect: refused"),
        "{text}"
    );
}

#[test]
fn a_contract_change_reevaluates_the_service() {
    let mut fx = Fx::default();
    for s in 0..5 {
        fx.probe(secs(s), Health::Fail);
    }
    assert_eq!(fx.verdict(), Verdict::Degraded);
    fx.ev.handle_service(
        fx.now,
        svc("pay"),
        "team-pay".into(),
        contract_with(CapabilityProfile::PROBE_ONLY),
    );
    assert_eq!(fx.verdict(), Verdict::Ineligible);
}

/// A second evaluator, as a new leader builds it: every instance established, then the
/// observed-state snapshot restored `age` after it was taken.
fn successor(fx: &Fx, age: Duration) -> Evaluator {
    let snapshot = fx.ev.observed(fx.now);
    let now = fx.now + age;
    let mut ev = Evaluator::new(EvaluatorConfig::default());
    ev.handle_service(now, svc("pay"), "team-pay".into(), ValidContract::default());
    let inst = instance("pay", "pay-1", "a", 1);
    ev.handle_instance(now, &inst, Admission::Established)
        .unwrap();
    for (id, o) in &snapshot {
        ev.restore_observed(now, id, o, age).unwrap();
    }
    ev
}

#[test]
fn a_new_leader_resumes_a_quarantine_from_the_observed_snapshot() {
    // Goal: ADR-02 — a failover does not release a quarantined instance early.
    let mut fx = Fx::default();
    fx.healthy(0, 2);
    let mut t = 2;
    for _ in 0..2 {
        t = flap_once(&mut fx, t);
    }
    fx.ev.take_effects();
    fx.probe(secs(t), Health::Refused);
    let event = quarantine_event(&mut fx).expect("quarantined");
    fx.probe(secs(t + 1), Health::Pass);
    fx.passive(secs(t + 1), 1, 0);
    assert!(matches!(fx.eligibility(), Eligibility::Quarantined { .. }));
    let age = Duration::from_secs(5);
    let mut ev = successor(&fx, age);
    let restored = ev.eligibility(&fx.id).unwrap();
    assert!(
        matches!(restored, Eligibility::Quarantined { .. }),
        "restored as {restored:?}"
    );
    // It is released when the original quarantine ends (less the snapshot's age), not
    // a whole quarantine later, nor at once.
    let left = event.until - (fx.now);
    let now = fx.now + age;
    let release = now + left.saturating_sub(age);
    ev.handle_timeout(release - Duration::from_millis(1));
    assert!(!ev.eligibility(&fx.id).unwrap().is_routed());
    while let Some(due) = ev.poll_timeout().filter(|d| *d <= release + secs(1)) {
        ev.handle_timeout(due);
    }
    let _ = ev.handle_sample(release + secs(1), probe(&fx.id, Health::Pass));
    assert!(
        !matches!(
            ev.eligibility(&fx.id).unwrap(),
            Eligibility::Quarantined { .. }
        ),
        "still quarantined after it should have ended"
    );
}

#[test]
fn a_new_leader_keeps_a_hard_failure_out_until_evidence_clears_it() {
    let mut fx = Fx::default();
    fx.healthy(0, 2);
    fx.probe(secs(2), Health::Refused);
    assert!(!fx.eligibility().is_routed());
    let mut ev = successor(&fx, Duration::from_secs(1));
    assert_eq!(
        ev.eligibility(&fx.id).unwrap(),
        Eligibility::Ineligible {
            reason: IneligibleReason::HardFailure
        }
    );
    // An instance with nothing observed stays established (routed at full weight).
    let fresh = Fx::default();
    let ev2 = successor(&fresh, Duration::from_secs(1));
    assert!(ev2.eligibility(&fresh.id).unwrap().is_routed());
    let _ = &mut ev;
}

#[test]
fn passive_counts_near_the_end_of_u64_are_judged_not_overflowed() {
    // Found by the `evidence` fuzz target: a caller's report of ~u64::MAX requests made
    // the failing-share arithmetic overflow inside the leader's evaluator.
    let mut fx = Fx::default();
    let huge = crate::testkit::passive(&fx.id, 1, u64::MAX, u64::MAX);
    fx.feed(Duration::from_secs(1), huge);
    let small = crate::testkit::passive(&fx.id, 2, u64::MAX, 0);
    fx.feed(Duration::from_secs(2), small);
    assert_ne!(fx.verdict(), Verdict::Ineligible);
}

#[test]
fn ramps_admitted_apart_step_together_on_the_grid_and_never_early() {
    // Goal: the slow-start steps of instances admitted at different moments land on one
    // shared instant (one assembly per service), each no earlier than its own ramp allows.
    let mut fx = Fx::new(ValidContract::default(), Admission::New);
    let late = instance("pay", "pay-2", "a", 2);
    let admitted_late = fx.start + Duration::from_millis(300);
    fx.ev
        .handle_instance(admitted_late, &late, Admission::New)
        .unwrap();
    fx.ev.take_effects();
    let step = d::SLOW_START / d::SLOW_START_STEPS;
    let first_boundary_of_late = admitted_late + step;
    let mut stepped: BTreeMap<InstanceId, Instant> = BTreeMap::new();
    while stepped.len() < 2 {
        let due = fx
            .ev
            .poll_timeout()
            .expect("ramping instances keep a timer");
        fx.ev.handle_timeout(due);
        for effect in fx.ev.take_effects() {
            if let Effect::Eligibility { instance, .. } = effect {
                stepped.entry(instance).or_insert(due);
            }
        }
    }
    let (first, second) = (stepped[&fx.id], stepped[&late.id]);
    assert!(
        second >= first_boundary_of_late,
        "the late instance stepped {:?} before its ramp allows",
        first_boundary_of_late - second
    );
    assert!(
        second < first_boundary_of_late + d::SLOW_START_STEP_GRID,
        "a step is delayed by less than one grid"
    );
    // Both fall on pay's grid: one quantum apart at most, a whole number of quanta apart.
    let q = d::SLOW_START_STEP_GRID;
    assert!(second - first <= q, "{:?} apart", second - first);
    assert!((second - first).as_nanos().is_multiple_of(q.as_nanos()));
    assert!(first >= fx.start + step && first < fx.start + step + q);
}

#[test]
fn services_step_at_different_phases_of_the_grid() {
    // Goal: a region-wide ramp is not one burst: each service's grid is offset by a
    // stable hash of its name, inside the quantum.
    use crate::evaluator::instance::StepGrid;
    let epoch = t0();
    let q = Duration::from_secs(1);
    let grid = StepGrid {
        epoch: Some(epoch),
        quantum: q,
    };
    let at = epoch + Duration::from_millis(10_000);
    let points: BTreeSet<Instant> = (0..20)
        .map(|i| grid.ceil(at, &svc(&format!("svc-{i}"))))
        .collect();
    assert!(points.len() > 10, "services share phases: {points:?}");
    assert!(points.iter().all(|p| *p >= at && *p < at + q));
    // Stable: the same name always lands on the same point.
    assert_eq!(grid.ceil(at, &svc("pay")), grid.ceil(at, &svc("pay")));
    let none = StepGrid {
        epoch: Some(epoch),
        quantum: Duration::ZERO,
    };
    assert_eq!(none.ceil(at, &svc("pay")), at);
}

// --- callers' outcomes as primary evidence (ADR-04) ---

impl Fx {
    /// `callers` callers each reporting `requests` with `errors` of them failed, at `at`.
    fn callers(&mut self, at: Duration, callers: u32, requests: u64, errors: u64) {
        self.at(at);
        for n in 0..callers {
            let s = passive(&self.id, n, requests, errors);
            self.ev.handle_sample(self.now, s).unwrap();
        }
    }

    fn mode(&self) -> EvidenceMode {
        self.ev.evidence_mode(self.now, &self.id).unwrap().0
    }
}

#[test]
fn many_callers_failing_withdraw_a_replica_whose_probe_stays_green() {
    // Goal: grey failure — the probe passes, the callers fail — is a withdrawal when the
    // traffic makes callers' outcomes primary, inside the damping budget.
    let mut fx = Fx::new(
        passive_primary(CapabilityProfile::NO_SELF_REPORT),
        Admission::Established,
    );
    for s in 0..5 {
        fx.probe(secs(s), Health::Pass);
        fx.callers(secs(s), 5, 40, 0);
    }
    assert_eq!(fx.verdict(), Verdict::Eligible);
    assert_eq!(fx.mode(), EvidenceMode::PassivePrimary);
    let first_failing = secs(5);
    let mut withdrawn_at = None;
    for s in 5..15 {
        fx.probe(secs(s), Health::Pass);
        fx.callers(secs(s), 5, 40, 30);
        if withdrawn_at.is_none() && fx.verdict() == Verdict::Ineligible {
            withdrawn_at = Some(secs(s));
        }
    }
    let withdrawn_at = withdrawn_at.expect("the grey replica is withdrawn");
    assert!(withdrawn_at - first_failing <= d::DAMPING_BUDGET);
    assert_eq!(
        fx.eligibility(),
        Eligibility::Ineligible {
            reason: IneligibleReason::SoftFailure
        }
    );
    let explained = fx.ev.explain(fx.now, &fx.id).unwrap();
    let withdrawal = explained
        .history
        .iter()
        .find(|t| t.to == Verdict::Ineligible)
        .unwrap();
    assert_eq!(
        withdrawal.rule,
        Rule::CallerPopulation {
            failing: 5,
            callers: 5
        }
    );
    assert!(
        explained
            .to_string()
            .contains("caller_population (5 of 5 callers failing)")
    );
}

#[test]
fn below_the_threshold_the_same_failure_only_degrades_and_the_probe_stays_primary() {
    // Goal: two callers are not a population; the old rules hold and say so.
    let mut fx = Fx::new(
        passive_primary(CapabilityProfile::NO_SELF_REPORT),
        Admission::Established,
    );
    for s in 0..15 {
        fx.probe(secs(s), Health::Pass);
        fx.callers(secs(s), 2, 1_000, 900);
    }
    assert_eq!(fx.mode(), EvidenceMode::ProbePrimary);
    assert_eq!(
        fx.rule(),
        Rule::Uncorroborated {
            failing: EvidenceClass::Passive
        }
    );
    assert_eq!(fx.verdict(), Verdict::Degraded);
}

#[test]
fn too_little_traffic_is_not_sufficient_however_many_callers() {
    let mut fx = Fx::new(
        passive_primary(CapabilityProfile::NO_SELF_REPORT),
        Admission::Established,
    );
    // Ten callers, 9 requests each: 90 a second, below the threshold of 100.
    for s in 0..10 {
        fx.probe(secs(s), Health::Pass);
        fx.callers(secs(s), 10, 9, 9);
    }
    assert_eq!(fx.mode(), EvidenceMode::ProbePrimary);
    assert_eq!(fx.verdict(), Verdict::Degraded);
}

#[test]
fn probes_alone_are_single_class_evidence() {
    let mut fx = Fx::new(
        passive_primary(CapabilityProfile::NO_SELF_REPORT),
        Admission::Established,
    );
    // Callers below `passive.min_requests` say nothing: only the probe speaks.
    for s in 0..5 {
        fx.probe(secs(s), Health::Pass);
        fx.callers(secs(s), 4, 2, 2);
    }
    assert_eq!(fx.mode(), EvidenceMode::SingleClass);
    assert_eq!(fx.verdict(), Verdict::Eligible);
}

#[test]
fn the_mode_is_published_when_traffic_crosses_the_threshold_and_when_it_goes_quiet() {
    let mut fx = Fx::new(
        passive_primary(CapabilityProfile::NO_SELF_REPORT),
        Admission::Established,
    );
    fx.ev.take_effects();
    let modes = |fx: &mut Fx| -> Vec<(EvidenceMode, bool)> {
        fx.ev
            .take_effects()
            .into_iter()
            .filter_map(|e| match e {
                Effect::Evidence { mode, verified, .. } => Some((mode, verified)),
                _ => None,
            })
            .collect()
    };
    fx.probe(secs(0), Health::Pass);
    assert_eq!(modes(&mut fx), [(EvidenceMode::SingleClass, true)]);
    fx.callers(secs(1), 3, 40, 0);
    assert_eq!(
        modes(&mut fx),
        [
            (EvidenceMode::ProbePrimary, true),
            (EvidenceMode::PassivePrimary, true)
        ]
    );
    // The callers go quiet and the probe keeps its confirmation cadence (30 s).
    fx.probe(secs(20), Health::Pass);
    assert_eq!(modes(&mut fx), [(EvidenceMode::SingleClass, true)]);
    assert_eq!(fx.verdict(), Verdict::Eligible);
}

#[test]
fn a_passive_primary_instance_whose_callers_go_quiet_is_unknown_not_ineligible() {
    // Goal: silence is never read as failure, primary or not (ADR-05). With no readiness
    // signal at all (a third party's endpoint), quiet callers leave the health unknown.
    let mut fx = Fx::new(
        passive_primary(CapabilityProfile::NO_READINESS),
        Admission::Established,
    );
    for s in 0..5 {
        fx.callers(secs(s), 4, 50, 0);
    }
    assert_eq!(fx.mode(), EvidenceMode::PassivePrimary);
    assert_eq!(fx.verdict(), Verdict::Eligible);
    fx.at(secs(60));
    assert_eq!(fx.verdict(), Verdict::Unknown);
    assert_eq!(fx.rule(), Rule::Silence);
    assert_eq!(
        fx.ev.evidence_mode(fx.now, &fx.id),
        Some((EvidenceMode::SingleClass, false))
    );
}

#[test]
fn one_loud_caller_never_withdraws_even_where_it_is_the_only_class() {
    // Goal: one caller is one vote (ADR-15), also for a profile with nothing but callers.
    let mut fx = Fx::new(
        contract_with(CapabilityProfile::NO_READINESS),
        Admission::Established,
    );
    for s in 0..30 {
        fx.at(secs(s));
        let s = passive(&fx.id, 7, 1_000_000, 1_000_000);
        fx.ev.handle_sample(fx.now, s).unwrap();
    }
    assert!(fx.eligibility().is_routed(), "{:?}", fx.eligibility());
    // A second caller agreeing is enough for the single-class profile, as before.
    for s in 30..35 {
        fx.callers(secs(s), 2, 10, 10);
    }
    assert_eq!(
        fx.rule(),
        Rule::SingleClassProfile {
            failing: EvidenceClass::Passive
        }
    );
}

#[test]
fn probes_slow_to_the_confirmation_cadence_while_callers_are_clean_and_speed_up_when_they_fail() {
    // Goal: the cheap cadence only while callers vouch for the instance; their first
    // failing reports bring the contract's interval back, so a dead process is refused by
    // the next probe instead of the next confirmation 30 s later.
    let mut fx = Fx::new(
        passive_primary(CapabilityProfile::NO_SELF_REPORT),
        Admission::Established,
    );
    fx.ev.take_effects();
    let cadence = |fx: &mut Fx| -> Vec<bool> {
        fx.ev
            .take_effects()
            .into_iter()
            .filter_map(|e| match e {
                Effect::ProbeCadence { confirming, .. } => Some(confirming),
                _ => None,
            })
            .collect()
    };
    fx.probe(secs(0), Health::Pass);
    fx.callers(secs(1), 2, 40, 0);
    assert_eq!(
        cadence(&mut fx),
        Vec::<bool>::new(),
        "two callers are not enough"
    );
    fx.callers(secs(1), 3, 40, 0);
    assert_eq!(cadence(&mut fx), [true]);
    fx.callers(secs(2), 3, 40, 0);
    assert_eq!(cadence(&mut fx), Vec::<bool>::new());
    // The callers start failing: probe at the contract's interval again, at once.
    fx.callers(secs(3), 3, 40, 40);
    assert_eq!(cadence(&mut fx), [false]);
    assert_eq!(
        fx.mode(),
        EvidenceMode::PassivePrimary,
        "still primary, no longer clean"
    );
}
