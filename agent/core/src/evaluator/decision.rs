//! The decision loop for one instance: hysteresis, flap counting, quarantine, publication.
//!
//! Free functions over one `InstanceState` and the evaluator's outputs, so a sample costs
//! one map lookup: the evaluator splits its borrows ([`Outputs`]) and hands both here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use super::{Effect, EvaluatorStats, QuarantineEvent, ServiceEntry};
use crate::audit::TransitionRecord;
use crate::defaults as d;
use crate::eligibility::{Eligibility, IneligibleReason, Rule, Verdict};
use crate::evaluator::instance::{Decision, InstanceState, StepGrid};
use crate::model::{InstanceId, ServiceName};

/// Everything a decision may write to, borrowed apart from the instance map.
pub(super) struct Outputs<'a> {
    pub(super) timers: &'a mut BTreeSet<(Instant, InstanceId)>,
    pub(super) effects: &'a mut Vec<Effect>,
    pub(super) stats: &'a mut EvaluatorStats,
    pub(super) services: &'a BTreeMap<ServiceName, ServiceEntry>,
    pub(super) history_len: usize,
    pub(super) grid: StepGrid,
}

/// Walk the decision path for one instance and publish what changed.
pub(super) fn reevaluate(state: &mut InstanceState, now: Instant, out: &mut Outputs<'_>) {
    state.update_hysteresis(now);
    let mut decision = state.decide(now, out.grid);
    if counts_as_flap(&state.eligibility, &decision.eligibility) && record_flap(state, now) {
        start_quarantine(state, now, out);
        decision = state.decide(now, out.grid);
    }
    let from = Some(state.eligibility.verdict());
    apply(state, now, from, decision, out);
}

/// Store a decision; emit the eligibility, and a transition record when the state changed.
pub(super) fn apply(
    state: &mut InstanceState,
    now: Instant,
    from: Option<Verdict>,
    decision: Decision,
    out: &mut Outputs<'_>,
) {
    let old = state.eligibility;
    let changed = from.is_none() || old != decision.eligibility;
    let transition = from.is_none() || !same_state(&old, &decision.eligibility);
    if !old.is_routed() && decision.eligibility.is_routed() && from.is_some() {
        state.ramp_from = state.next_ramp_start(now);
    }
    if transition {
        state.since = now;
    }
    state.eligibility = decision.eligibility;
    state.rule = decision.rule;
    schedule(out.timers, state, decision.deadline);
    publish_mode(state, now, out);
    if !changed {
        return;
    }
    let (id, service, eligibility) = (state.id.clone(), state.service.clone(), state.eligibility);
    if transition {
        let record = TransitionRecord {
            at: now,
            instance: id.clone(),
            service: service.clone(),
            from,
            to: eligibility.verdict(),
            eligibility,
            rule: decision.rule,
            evidence: state.evidence(now),
        };
        if state.history.len() >= out.history_len {
            state.history.pop_front();
        }
        state.history.push_back(record.clone());
        out.stats.transitions += 1;
        tracing::debug!(endpoint = %id, service = %service, from = ?from, to = %record.to, rule = ?record.rule, "eligibility changed");
        out.effects.push(Effect::Transition(Box::new(record)));
    }
    out.effects.push(Effect::Eligibility {
        instance: id,
        service,
        eligibility,
    });
}

/// Emit the instance's evidence mode when it changed. Modes move with traffic, so they
/// are re-read on every decision (each caller's report is one), and at the passive
/// class's silence deadline when the last caller goes quiet.
fn publish_mode(state: &mut InstanceState, now: Instant, out: &mut Outputs<'_>) {
    let now_standing = state.standing(now);
    let was = std::mem::replace(&mut state.standing, now_standing);
    if now_standing.confirming != was.confirming {
        out.effects.push(Effect::ProbeCadence {
            instance: state.id.clone(),
            service: state.service.clone(),
            confirming: now_standing.confirming,
        });
    }
    if (now_standing.mode, now_standing.verified) != (was.mode, was.verified) {
        out.effects.push(Effect::Evidence {
            instance: state.id.clone(),
            service: state.service.clone(),
            mode: now_standing.mode,
            verified: now_standing.verified,
        });
    }
}

fn start_quarantine(state: &mut InstanceState, now: Instant, out: &mut Outputs<'_>) {
    let flap = &mut state.flap;
    if flap
        .last_release
        .is_some_and(|r| now.saturating_duration_since(r) >= d::QUARANTINE_RESET_AFTER)
    {
        flap.level = 0;
    }
    let length = d::QUARANTINE_FIRST
        .saturating_mul(1 << flap.level.min(16))
        .min(d::QUARANTINE_MAX);
    let until = now + length;
    flap.level += 1;
    flap.until = Some(until);
    flap.last_release = Some(until);
    flap.transitions.clear();
    // Coming back out of quarantine still needs clean evidence held for the hold.
    state.withdrawn = Some(Rule::FlapQuarantine);
    state.readmit_since = None;
    out.stats.quarantines += 1;
    let owner = out
        .services
        .get(&state.service)
        .map(|s| s.owner.clone())
        .unwrap_or_default();
    tracing::info!(endpoint = %state.id, service = %state.service, level = state.flap.level, "instance quarantined for flapping");
    out.effects
        .push(Effect::Quarantined(Box::new(QuarantineEvent {
            instance: state.id.clone(),
            service: state.service.clone(),
            owner,
            at: now,
            until,
            level: state.flap.level,
            history: state.history.iter().cloned().collect(),
        })));
}

/// Whether a change moves the instance in or out of rotation in a way that counts toward
/// flapping. Deliberate exits (draining, retirement) and quarantine itself do not count.
fn counts_as_flap(old: &Eligibility, new: &Eligibility) -> bool {
    let deliberate = |e: &Eligibility| {
        matches!(
            e,
            Eligibility::Draining { .. }
                | Eligibility::Quarantined { .. }
                | Eligibility::Ineligible {
                    reason: IneligibleReason::Retired
                }
        )
    };
    old.is_routed() != new.is_routed() && !deliberate(old) && !deliberate(new)
}

/// Record one in/out transition; `true` when it tips the instance into quarantine.
fn record_flap(state: &mut InstanceState, now: Instant) -> bool {
    let flap = &mut state.flap;
    while flap
        .transitions
        .front()
        .is_some_and(|t| now.saturating_duration_since(*t) > d::FLAP_WINDOW)
    {
        flap.transitions.pop_front();
    }
    flap.transitions.push_back(now);
    flap.transitions.len() > d::FLAP_TRANSITIONS_MAX as usize
}

/// Two eligibilities are the same state when only weights (or quarantine end) differ.
fn same_state(a: &Eligibility, b: &Eligibility) -> bool {
    use Eligibility as E;
    match (a, b) {
        (E::Eligible { .. }, E::Eligible { .. }) | (E::Unknown { .. }, E::Unknown { .. }) => true,
        (E::Degraded { cause: x, .. }, E::Degraded { cause: y, .. }) => x == y,
        (E::Ineligible { reason: x }, E::Ineligible { reason: y }) => x == y,
        (E::Draining { cause: x }, E::Draining { cause: y }) => x == y,
        (E::Quarantined { .. }, E::Quarantined { .. }) => true,
        _ => false,
    }
}

/// Keep the lazy timer index no later than the instance's deadline.
fn schedule(
    timers: &mut BTreeSet<(Instant, InstanceId)>,
    state: &mut InstanceState,
    deadline: Option<Instant>,
) {
    let Some(deadline) = deadline else { return };
    if state.timer.is_some_and(|t| t <= deadline) {
        return;
    }
    if let Some(old) = state.timer.take() {
        timers.remove(&(old, state.id.clone()));
    }
    timers.insert((deadline, state.id.clone()));
    state.timer = Some(deadline);
}
