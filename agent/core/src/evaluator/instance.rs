//! One instance's evidence and the decision path over it.
//!
//! `InstanceState` owns everything the evaluator knows about an instance. Its two halves
//! are kept apart on purpose: `update_hysteresis` is the only place the withdrawn/re-entry
//! state moves, and `decide` is a read-only walk of the decision path in its fixed order:
//! retired → maintenance → draining → hard failure → quarantine → dependency unreadiness →
//! withdrawn (soft) → silence → uncorroborated → dependency weight → passing.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::audit::{ClassEvidence, TransitionRecord};
use crate::contract::{DependencyAuthority, ValidContract};
use crate::eligibility::{
    DegradeCause, DrainCause, Eligibility, EvidenceMode, IneligibleReason, Rule,
};
use crate::evaluator::score::{CallerPanel, ClassState, Population};
use crate::model::{DependencyStatus, EvidenceClass, InstanceId, ServiceName};
use crate::units::{Permille, Weight};

/// What the decision path concluded, and when it must be walked again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision {
    pub(crate) eligibility: Eligibility,
    pub(crate) rule: Rule,
    pub(crate) deadline: Option<Instant>,
}

/// The grid slow-start steps fall on: every `quantum` from the evaluator's first instant,
/// each service at its own phase inside the quantum (from a stable hash of its name). The
/// steps of one service land together and are assembled once; different services step at
/// different moments, so a region-wide ramp (an estate loaded at once) is not released as
/// one burst of every view each quantum.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepGrid {
    pub(crate) epoch: Option<Instant>,
    pub(crate) quantum: Duration,
}

impl StepGrid {
    /// The first point of `service`'s grid at or after `at` (`at` itself without a grid).
    pub(crate) fn ceil(self, at: Instant, service: &ServiceName) -> Instant {
        let Some(epoch) = self.epoch else { return at };
        let q = self.quantum.as_nanos();
        if q == 0 {
            return at;
        }
        let phase = u128::from(crate::hash::fnv1a(service.as_str().as_bytes())) % q;
        let origin = epoch + Duration::from_nanos(u64::try_from(phase).unwrap_or(0));
        if at <= origin {
            return origin;
        }
        let since = at.duration_since(origin).as_nanos();
        let up = since.div_ceil(q).saturating_mul(q);
        origin + Duration::from_nanos(u64::try_from(up).unwrap_or(u64::MAX))
    }
}

/// What an instance's verdict rests on, as [`InstanceState::standing`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Standing {
    /// Which evidence is primary.
    pub(crate) mode: EvidenceMode,
    /// At least one class speaks (health verified, not unknown).
    pub(crate) verified: bool,
    /// Probes may run at the contract's confirmation cadence.
    pub(crate) confirming: bool,
}

impl Standing {
    /// An instance nothing has spoken about yet.
    pub(crate) const UNHEARD: Self = Self {
        mode: EvidenceMode::SingleClass,
        verified: false,
        confirming: false,
    };
}

/// Deliberate and existential facts that bypass scoring.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lifecycle {
    pub(crate) retired: bool,
    pub(crate) maintenance: Option<String>,
    pub(crate) terminating: bool,
    pub(crate) self_draining: bool,
}

/// Transition counting and quarantine backoff (ADR-09).
#[derive(Debug, Clone, Default)]
pub(crate) struct Flap {
    /// Times of recent in/out transitions, oldest first; never longer than max + 1.
    pub(crate) transitions: VecDeque<Instant>,
    pub(crate) until: Option<Instant>,
    pub(crate) level: u32,
    pub(crate) last_release: Option<Instant>,
}

/// Everything known about one instance.
#[derive(Debug, Clone)]
pub(crate) struct InstanceState {
    pub(crate) id: InstanceId,
    pub(crate) service: ServiceName,
    pub(crate) base_weight: Weight,
    pub(crate) contract: ValidContract,
    pub(crate) classes: [ClassState; 3],
    pub(crate) callers: CallerPanel,
    /// A hard failure latched until positive evidence clears it: (when, which class saw it).
    pub(crate) hard: Option<(Instant, Option<EvidenceClass>)>,
    pub(crate) lifecycle: Lifecycle,
    pub(crate) dependencies: BTreeMap<String, DependencyStatus>,
    /// Withdrawn by the soft path (or held after a hard failure / quarantine).
    pub(crate) withdrawn: Option<Rule>,
    /// Since when every speaking class has been at or below the re-entry score.
    pub(crate) readmit_since: Option<Instant>,
    /// Start of the slow-start ramp for the current routed period; `None` = full weight.
    pub(crate) ramp_from: Option<Instant>,
    pub(crate) flap: Flap,
    pub(crate) eligibility: Eligibility,
    /// The standing last published ([`Effect::Evidence`](super::Effect::Evidence),
    /// [`Effect::ProbeCadence`](super::Effect::ProbeCadence)).
    pub(crate) standing: Standing,
    pub(crate) rule: Rule,
    pub(crate) since: Instant,
    pub(crate) history: VecDeque<TransitionRecord>,
    /// The deadline this instance currently has in the evaluator's timer index.
    pub(crate) timer: Option<Instant>,
}

impl InstanceState {
    /// Walk the hysteresis: withdraw on a corroborated failure, re-admit after the hold.
    pub(crate) fn update_hysteresis(&mut self, now: Instant) {
        let (readmit, hold) = (
            self.contract.scoring.readmit,
            self.contract.scoring.readmit_hold,
        );
        match self.withdrawn {
            None => {
                if let Some(rule) = self.corroborated_failure(now) {
                    self.withdrawn = Some(rule);
                    self.readmit_since = None;
                }
            }
            Some(_) => {
                let clean = {
                    let mut speaking = self.speaking(now).peekable();
                    let any = speaking.peek().is_some();
                    any && speaking.all(|cl| self.score(cl) <= readmit) && self.hard.is_none()
                };
                if !clean {
                    self.readmit_since = None;
                    return;
                }
                let since = *self.readmit_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= hold {
                    self.withdrawn = None;
                    self.readmit_since = None;
                }
            }
        }
    }

    /// The decision path, in order. Pure: reads state, changes nothing.
    pub(crate) fn decide(&self, now: Instant, grid: StepGrid) -> Decision {
        let timers = self.timers(now);
        let out = |eligibility, rule| Decision {
            eligibility,
            rule,
            deadline: timers,
        };
        let l = &self.lifecycle;
        if l.retired {
            let reason = IneligibleReason::Retired;
            return out(Eligibility::Ineligible { reason }, Rule::Retired);
        }
        if l.maintenance.is_some() {
            let cause = DrainCause::Maintenance;
            return out(Eligibility::Draining { cause }, Rule::Maintenance);
        }
        if l.terminating || l.self_draining {
            let cause = if l.terminating {
                DrainCause::Terminating
            } else {
                DrainCause::SelfReported
            };
            return out(Eligibility::Draining { cause }, Rule::Draining);
        }
        // A hard failure outranks quarantine: both keep the instance out, but only a hard
        // failure tells the fraction guard there is nothing listening to put back.
        if let Some((_, class)) = self.hard {
            let reason = IneligibleReason::HardFailure;
            return out(
                Eligibility::Ineligible { reason },
                Rule::HardFailure { class },
            );
        }
        if let Some(until) = self.flap.until.filter(|u| *u > now) {
            return out(Eligibility::Quarantined { until }, Rule::FlapQuarantine);
        }
        if self.dependency_unready() {
            let reason = IneligibleReason::Dependency;
            return out(
                Eligibility::Ineligible { reason },
                Rule::DependencyUnreadiness,
            );
        }
        if let Some(rule) = self.withdrawn {
            let rule = if self.readmit_since.is_some() {
                Rule::AwaitingReentry
            } else {
                rule
            };
            let reason = IneligibleReason::SoftFailure;
            return out(Eligibility::Ineligible { reason }, rule);
        }
        self.decide_routed(now, timers, grid)
    }

    fn decide_routed(&self, now: Instant, timers: Option<Instant>, grid: StepGrid) -> Decision {
        let c = &self.contract;
        // Entering rotation now starts the ramp now.
        let ramp_from = if self.eligibility.is_routed() {
            self.ramp_from
        } else {
            self.next_ramp_start(now)
        };
        let (ramp, step) = ramp(c, ramp_from, now);
        let step = step.map(|at| grid.ceil(at, &self.service));
        let deadline = earliest(timers, step);
        let weight = self.base_weight.scale(ramp);
        let done = |eligibility, rule| Decision {
            eligibility,
            rule,
            deadline,
        };
        if self.speaking(now).next().is_none() {
            let heard = self.heard_anything();
            if heard && c.silence_withdraws {
                // The contract's opt-in: silence read as failure (off by default, ADR-05).
                let reason = IneligibleReason::SoftFailure;
                return done(Eligibility::Ineligible { reason }, Rule::Silence);
            }
            let rule = if heard { Rule::Silence } else { Rule::Admitted };
            return done(Eligibility::Unknown { weight }, rule);
        }
        if let Some(failing) = self.failing(now).next() {
            let weight = weight.scale(c.uncorroborated_weight);
            let cause = DegradeCause::Uncorroborated;
            return done(
                Eligibility::Degraded { weight, cause },
                Rule::Uncorroborated { failing },
            );
        }
        if self.dependency_degraded() {
            let weight = weight.scale(c.dependency_weight);
            let cause = DegradeCause::Dependency;
            return done(
                Eligibility::Degraded { weight, cause },
                Rule::DependencyWeight,
            );
        }
        done(Eligibility::Eligible { weight }, Rule::Passing)
    }

    /// The ramp start an instance entering rotation at `now` gets.
    pub(crate) fn next_ramp_start(&self, now: Instant) -> Option<Instant> {
        if self.contract.slow_start.is_zero() {
            None
        } else {
            Some(now)
        }
    }

    /// A failing class that is corroborated, as the rule that withdraws.
    fn corroborated_failure(&self, now: Instant) -> Option<Rule> {
        let c = &self.contract;
        let mut failing = self.failing(now).peekable();
        failing.peek()?;
        // The caller panel is read once, and only when callers' outcomes are failing.
        let heard = self
            .failing(now)
            .any(|cl| cl == EvidenceClass::Passive)
            .then(|| self.heard(now));
        // Two distinct callers at the least, whatever the score says: one caller, however
        // loud, is one caller's view (ADR-15), and the score decays slowly, so the callers
        // who drove it up may have stopped failing.
        let agree = heard.is_some_and(|h| h.failing >= 2);
        if let Some(h) = heard
            && agree
            && self.sufficient(h)
        {
            return Some(Rule::CallerPopulation {
                failing: h.failing,
                callers: h.callers,
            });
        }
        for failing in failing {
            if failing == EvidenceClass::Passive && !agree {
                continue;
            }
            if c.profile.count() == 1 {
                return Some(Rule::SingleClassProfile { failing });
            }
            let by = self
                .speaking(now)
                .find(|other| *other != failing && self.score(*other) >= c.scoring.corroborate);
            if let Some(by) = by {
                return Some(Rule::Corroborated { failing, by });
            }
        }
        None
    }

    /// The callers heard within the passive silence window.
    fn heard(&self, now: Instant) -> Population {
        let window = self.contract.silence_of(EvidenceClass::Passive);
        self.callers.population(now, window)
    }

    /// Whether `heard` meets the contract's passive-primary threshold (never, without one).
    fn sufficient(&self, heard: Population) -> bool {
        self.contract
            .passive
            .primary
            .is_some_and(|p| heard.callers >= p.min_callers && heard.requests >= p.min_requests)
    }

    /// What the verdict rests on now, from one read of the caller panel (only where the
    /// contract has a passive-primary threshold) and of the speaking classes:
    /// - the mode: passive-primary while the callers heard meet the threshold, else
    ///   probe-primary with two classes or more speaking, else single-class;
    /// - whether any class speaks (verified, not unknown);
    /// - whether probes may run at the confirmation cadence: passive-primary and clean —
    ///   the passive score at or below the re-entry level, and fewer than the
    ///   corroboration share of the callers heard failing right now (the score weighs the
    ///   *rate* of evidence, so callers reporting together move it once; their share moves
    ///   at once). Suspicion from the callers brings the contract's own interval back.
    pub(crate) fn standing(&self, now: Instant) -> Standing {
        let c = &self.contract;
        let heard = c
            .passive
            .primary
            .map(|_| self.heard(now))
            .filter(|h| self.sufficient(*h));
        let speaking = self.speaking(now).take(2).count();
        let mode = match (heard, speaking) {
            (Some(_), _) => EvidenceMode::PassivePrimary,
            (None, 2) => EvidenceMode::ProbePrimary,
            (None, _) => EvidenceMode::SingleClass,
        };
        let confirming = heard.is_some_and(|h| {
            self.score(EvidenceClass::Passive) <= c.scoring.readmit
                && Permille::from_f64(h.failing_share()) < c.scoring.corroborate
        });
        Standing {
            mode,
            verified: speaking > 0,
            confirming,
        }
    }

    /// Provided classes that have spoken within their silence interval.
    pub(crate) fn speaking(&self, now: Instant) -> impl Iterator<Item = EvidenceClass> + '_ {
        let c = &self.contract;
        EvidenceClass::ALL.into_iter().filter(move |cl| {
            c.profile.provides(*cl) && !self.classes[cl.index()].is_silent(now, c.silence_of(*cl))
        })
    }

    /// Speaking classes whose score is at or above removal.
    fn failing(&self, now: Instant) -> impl Iterator<Item = EvidenceClass> + '_ {
        let remove = self.contract.scoring.remove;
        self.speaking(now)
            .filter(move |cl| self.score(*cl) >= remove)
    }

    pub(crate) fn score(&self, class: EvidenceClass) -> Permille {
        Permille::from_f64(self.classes[class.index()].score)
    }

    fn heard_anything(&self) -> bool {
        self.classes.iter().any(|c| c.last_at.is_some())
    }

    fn dependency_unready(&self) -> bool {
        self.declared_dependencies()
            .any(|(decl_authority, shared, status)| {
                // A shared dependency never withdraws, even if a contract slipped through.
                decl_authority == DependencyAuthority::Unreadiness
                    && !shared
                    && status == DependencyStatus::Down
            })
    }

    fn dependency_degraded(&self) -> bool {
        self.declared_dependencies().any(|(authority, _, status)| {
            authority != DependencyAuthority::Informational && status != DependencyStatus::Ok
        })
    }

    fn declared_dependencies(
        &self,
    ) -> impl Iterator<Item = (DependencyAuthority, bool, DependencyStatus)> + '_ {
        self.contract.dependencies.iter().filter_map(|decl| {
            let status = *self.dependencies.get(&decl.name)?;
            Some((decl.authority, decl.shared, status))
        })
    }

    /// The next moment the decision may change without new input.
    fn timers(&self, now: Instant) -> Option<Instant> {
        let c = &self.contract;
        let mut next = None;
        for cl in EvidenceClass::ALL {
            if c.profile.provides(cl) {
                let at = self.classes[cl.index()].silence_deadline(c.silence_of(cl));
                // Silence begins strictly after the deadline.
                next = earliest(
                    next,
                    at.map(|a| a + Duration::from_nanos(1)).filter(|a| *a > now),
                );
            }
        }
        if self.withdrawn.is_some() {
            next = earliest(next, self.readmit_since.map(|s| s + c.scoring.readmit_hold));
        }
        earliest(next, self.flap.until.filter(|u| *u > now))
    }

    /// Each class's evidence now, for audit records and `explain`.
    pub(crate) fn evidence(&self, now: Instant) -> Vec<ClassEvidence> {
        let c = &self.contract;
        EvidenceClass::ALL
            .into_iter()
            .map(|cl| {
                let s = &self.classes[cl.index()];
                ClassEvidence {
                    class: cl,
                    provided: c.profile.provides(cl),
                    score: self.score(cl),
                    silent: s.is_silent(now, c.silence_of(cl)),
                    age: s.last_at.map(|at| now.saturating_duration_since(at)),
                    reporter: s.last_reporter.clone(),
                    last: s.last_seen.as_ref().map(|l| l.summary()),
                }
            })
            .collect()
    }
}

/// The slow-start share at `now` for a ramp begun at `from`, and the next step's time
/// (before the grid; the share is always the one `now` has reached on the ramp itself).
pub(crate) fn ramp(
    c: &ValidContract,
    from: Option<Instant>,
    now: Instant,
) -> (Permille, Option<Instant>) {
    let Some(from) = from else {
        return (Permille::ONE, None);
    };
    let total = c.slow_start;
    let elapsed = now.saturating_duration_since(from);
    if total.is_zero() || elapsed >= total {
        return (Permille::ONE, None);
    }
    let steps = u128::from(crate::defaults::SLOW_START_STEPS);
    let k = elapsed.as_nanos() * steps / total.as_nanos();
    let first = u128::from(crate::defaults::SLOW_START_FIRST.get());
    let share = first + (1000 - first) * k / steps;
    let next_ns = total.as_nanos() * (k + 1) / steps;
    let next = from + Duration::from_nanos(u64::try_from(next_ns).unwrap_or(u64::MAX));
    (Permille::saturating(share as u32), Some(next))
}

pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
