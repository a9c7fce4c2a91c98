//! Eligibility evaluator: turns attributed evidence into per-instance eligibility.
//!
//! Pure state machine; no I/O. Time arrives as `now`; wake-ups are requested through
//! [`Evaluator::poll_timeout`] and delivered with [`Evaluator::handle_timeout`]. The driver
//! (the authority leader, or a simulation) executes [`Evaluator::take_effects`].
//!
//! ```text
//! Sample / Lifecycle ──► Evaluator ──► Effect::Eligibility   (to the view assembler)
//! Timeout            ──►           ──► Effect::Transition    (to the audit log)
//!                                  ──► Effect::Quarantined   (to the owning team)
//! ```
//!
//! Invariants (property tests in `evaluator/props.rs`):
//! - silence alone never takes a routed instance out of rotation;
//! - a hard failure withdraws on the sample that reports it;
//! - re-entry after a withdrawal takes longer than the withdrawal took;
//! - a shared dependency never makes an instance ineligible;
//! - a quarantined instance stays out until its `until`;
//! - slow start never publishes full weight before the ramp's end.

mod decision;
pub(crate) mod instance;
pub(crate) mod score;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use crate::audit::{Explanation, TransitionRecord, truncate_detail};
use crate::contract::ValidContract;
use crate::defaults as d;
use crate::eligibility::{Eligibility, EvidenceMode, Rule, Verdict};
use crate::model::{
    EvidenceClass, Health, Instance, InstanceId, Lifecycle, Observation, Reporter, Sample,
    SelfReport, ServiceName,
};
use crate::units::Permille;
use decision::Outputs;
use instance::{InstanceState, StepGrid};
use score::{ClassState, LastSeen, bounded};

type InstanceMap = std::collections::HashMap<
    InstanceId,
    InstanceState,
    std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>,
>;

/// Limits and bookkeeping sizes.
#[derive(Debug, Clone)]
pub struct EvaluatorConfig {
    /// Transitions kept per instance for `explain`.
    pub history_len: usize,
    /// Retired ids remembered to refuse their reuse; the oldest is forgotten beyond this.
    pub tombstones_max: usize,
    /// Distinct callers remembered per instance.
    pub callers_max: usize,
    /// The grid slow-start steps fall on ([`d::SLOW_START_STEP_GRID`]); zero steps each
    /// instance exactly on its own ramp.
    pub step_grid: std::time::Duration,
}

impl Default for EvaluatorConfig {
    fn default() -> Self {
        Self {
            history_len: 16,
            tombstones_max: 100_000,
            callers_max: d::PASSIVE_REPORTERS_MAX,
            step_grid: d::SLOW_START_STEP_GRID,
        }
    }
}

/// How an instance enters the evaluator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A new instance: routed as unknown, with the slow-start ramp.
    New,
    /// An instance that was already serving before this evaluator saw it (a new leader
    /// rebuilding): routed at full weight, no ramp, so a failover moves no traffic.
    Established,
}

/// What the evaluator asks its driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// An instance's eligibility (or weight) changed: the assembler must see it.
    Eligibility {
        /// Which instance.
        instance: InstanceId,
        /// Its service.
        service: ServiceName,
        /// The new eligibility.
        eligibility: Eligibility,
    },
    /// A transition, for the audit log.
    Transition(Box<TransitionRecord>),
    /// An instance was quarantined for flapping; tell its owner.
    Quarantined(Box<QuarantineEvent>),
    /// What an instance's verdict rests on changed: its evidence mode (callers' outcomes
    /// primary or not, one class or more) or whether any class speaks for it at all. The
    /// view carries both per endpoint; the prober assignment follows the mode (a
    /// passive-primary instance is probed at the contract's confirmation cadence).
    Evidence {
        /// Which instance.
        instance: InstanceId,
        /// Its service.
        service: ServiceName,
        /// The mode now.
        mode: EvidenceMode,
        /// Whether at least one class is speaking (the endpoint's health is verified, not
        /// unknown).
        verified: bool,
    },
    /// How often the instance's probers should probe it changed (ADR-04): at the
    /// contract's confirmation cadence (`confirming`) while its callers' outcomes are
    /// primary and clean, at the contract's own interval otherwise — so once callers start
    /// failing, probes speed up to confirm or refute them (a dead process is refused at
    /// the next probe, not 30 s later).
    ProbeCadence {
        /// Which instance.
        instance: InstanceId,
        /// Its service.
        service: ServiceName,
        /// Probe at the confirmation cadence.
        confirming: bool,
    },
    /// A retired instance left the evaluator; its id is tombstoned.
    Retired {
        /// Which instance.
        instance: InstanceId,
        /// Its service.
        service: ServiceName,
    },
}

/// The event an owning team receives when one of its instances is quarantined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineEvent {
    /// Which instance.
    pub instance: InstanceId,
    /// Its service.
    pub service: ServiceName,
    /// The service's owner.
    pub owner: String,
    /// When the quarantine began.
    pub at: Instant,
    /// When the quarantine ends.
    pub until: Instant,
    /// How many quarantines in a row (the backoff level, from 1).
    pub level: u32,
    /// The transitions that produced it.
    pub history: Vec<TransitionRecord>,
}

/// Why an input was refused. A refused input changes nothing; the driver counts it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EvaluatorError {
    /// The instance's service has no contract yet. Register the service first.
    #[error("service {service} is not known")]
    UnknownService {
        /// The service.
        service: ServiceName,
    },
    /// No such instance. Drop the sample (the registry may not have caught up).
    #[error("instance {instance} is not known")]
    UnknownInstance {
        /// The instance.
        instance: InstanceId,
    },
    /// The id belongs to a retired instance; ids are never reused.
    #[error("instance {instance} is retired and its id cannot be reused")]
    Retired {
        /// The instance.
        instance: InstanceId,
    },
    /// The instance exists under another service; an id names one instance of one service.
    #[error("instance {instance} belongs to {existing}, not {requested}")]
    ServiceMismatch {
        /// The instance.
        instance: InstanceId,
        /// The service it has.
        existing: ServiceName,
        /// The service asked for.
        requested: ServiceName,
    },
    /// The reporter may not report this class about this instance (a self-report about
    /// another instance, a probe from a workload). Audit it as a forgery attempt.
    #[error("{reporter} may not report {class} evidence about {instance}")]
    NotAttributable {
        /// Who reported.
        reporter: Reporter,
        /// The class.
        class: EvidenceClass,
        /// About whom.
        instance: InstanceId,
    },
    /// The service's capability profile does not provide this class.
    #[error("service {service} does not provide {class} evidence")]
    ClassNotProvided {
        /// The service.
        service: ServiceName,
        /// The class.
        class: EvidenceClass,
    },
    /// A dependency report names a dependency the contract does not declare.
    #[error("dependency {name:?} is not declared by {service}")]
    UndeclaredDependency {
        /// The service.
        service: ServiceName,
        /// The name reported.
        name: String,
    },
}

impl EvaluatorError {
    /// A short, stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::UnknownService { .. } => "unknown_service",
            Self::UnknownInstance { .. } => "unknown_instance",
            Self::Retired { .. } => "retired",
            Self::ServiceMismatch { .. } => "service_mismatch",
            Self::NotAttributable { .. } => "not_attributable",
            Self::ClassNotProvided { .. } => "class_not_provided",
            Self::UndeclaredDependency { .. } => "undeclared_dependency",
        }
    }
}

#[derive(Debug, Clone)]
struct ServiceEntry {
    owner: String,
    contract: ValidContract,
    instances: BTreeSet<InstanceId>,
}

/// Counts a driver exports as metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvaluatorStats {
    /// Samples applied.
    pub samples_applied: u64,
    /// Inputs refused, by [`EvaluatorError::label`].
    pub rejected: BTreeMap<&'static str, u64>,
    /// Transitions recorded.
    pub transitions: u64,
    /// Quarantines started.
    pub quarantines: u64,
}

/// What the leader keeps of one instance's evaluation in the observed-state snapshot it
/// replicates to followers (ADR-02): enough for a new leader to resume the verdict —
/// scores, the hard latch, soft withdrawal and quarantine — instead of starting every
/// instance afresh. Times are ages relative to the snapshot, never instants.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ObservedInstance {
    /// Per class (probe, self-report, passive): the failure score and the age of its last
    /// sample in milliseconds, for classes that have spoken.
    pub classes: [Option<(Permille, u64)>; 3],
    /// A hard failure is latched.
    #[serde(default)]
    pub hard: bool,
    /// Withdrawn by the soft path, by this rule.
    #[serde(default)]
    pub withdrawn: Option<Rule>,
    /// Quarantines served without a reset (the backoff level).
    #[serde(default)]
    pub quarantine_level: u32,
    /// Time left in the current quarantine, in milliseconds.
    #[serde(default)]
    pub quarantine_left_ms: Option<u64>,
}

/// The evaluator. See the module documentation.
#[derive(Debug)]
pub struct Evaluator {
    config: EvaluatorConfig,
    services: BTreeMap<ServiceName, ServiceEntry>,
    /// Looked up on every sample, so hashed; the hasher is fixed (not `RandomState`) and
    /// nothing iterates this map into an output — order comes from `services` and `timers`.
    instances: InstanceMap,
    /// Lazy timer index: an entry may be earlier than the instance's real deadline (it is
    /// re-armed when it fires) but never later.
    timers: BTreeSet<(Instant, InstanceId)>,
    tombstones: BTreeSet<InstanceId>,
    tombstone_order: VecDeque<InstanceId>,
    effects: Vec<Effect>,
    stats: EvaluatorStats,
    last_now: Option<Instant>,
    /// The first instant this evaluator saw: the origin of the slow-start step grid.
    epoch: Option<Instant>,
}

// === impl Evaluator ===

impl Evaluator {
    /// An evaluator with no services.
    pub fn new(config: EvaluatorConfig) -> Self {
        Self {
            config,
            services: BTreeMap::new(),
            instances: InstanceMap::default(),
            timers: BTreeSet::new(),
            tombstones: BTreeSet::new(),
            tombstone_order: VecDeque::new(),
            effects: Vec::new(),
            stats: EvaluatorStats::default(),
            last_now: None,
            epoch: None,
        }
    }

    /// Add a service or replace its contract; its instances are re-evaluated.
    pub fn handle_service(
        &mut self,
        now: Instant,
        service: ServiceName,
        owner: String,
        contract: ValidContract,
    ) {
        self.advance(now);
        let entry = self
            .services
            .entry(service)
            .or_insert_with(|| ServiceEntry {
                owner: String::new(),
                contract: contract.clone(),
                instances: BTreeSet::new(),
            });
        entry.owner = owner;
        entry.contract = contract.clone();
        let ids: Vec<InstanceId> = entry.instances.iter().cloned().collect();
        for id in ids {
            if let Some(state) = self.instances.get_mut(&id) {
                state.contract = contract.clone();
            }
            self.reevaluate(now, &id);
        }
    }

    /// Add an instance, or update one (weight) that exists. Ids are never reused.
    pub fn handle_instance(
        &mut self,
        now: Instant,
        instance: &Instance,
        admission: Admission,
    ) -> Result<(), EvaluatorError> {
        self.advance(now);
        let result = self.upsert_instance(now, instance, admission);
        self.count(result)
    }

    /// Apply one attributed sample.
    pub fn handle_sample(&mut self, now: Instant, sample: Sample) -> Result<(), EvaluatorError> {
        self.advance(now);
        let result = self.apply_sample(now, sample);
        if result.is_ok() {
            self.stats.samples_applied += 1;
        }
        self.count(result)
    }

    /// Apply a lifecycle fact: these bypass scoring.
    pub fn handle_lifecycle(
        &mut self,
        now: Instant,
        id: &InstanceId,
        event: Lifecycle,
    ) -> Result<(), EvaluatorError> {
        self.advance(now);
        let result = self.apply_lifecycle(now, id, event);
        self.count(result)
    }

    /// Fire every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        while let Some((at, id)) = self.timers.first().cloned() {
            if at > now {
                break;
            }
            self.timers.remove(&(at, id.clone()));
            if let Some(state) = self.instances.get_mut(&id)
                && state.timer == Some(at)
            {
                state.timer = None;
            }
            self.reevaluate(now, &id);
        }
    }

    /// The earliest time [`Evaluator::handle_timeout`] should be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// Drain the effects produced so far, in order.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// The observed state of every instance with something worth keeping, at `now`.
    pub fn observed(&self, now: Instant) -> BTreeMap<InstanceId, ObservedInstance> {
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.instances
            .iter()
            .filter_map(|(id, s)| {
                let classes = std::array::from_fn(|i| {
                    let c = &s.classes[i];
                    c.last_at.map(|at| {
                        (
                            Permille::saturating((c.score.clamp(0.0, 1.0) * 1000.0).round() as u32),
                            ms(now.saturating_duration_since(at)),
                        )
                    })
                });
                let o = ObservedInstance {
                    classes,
                    hard: s.hard.is_some(),
                    withdrawn: s.withdrawn,
                    quarantine_level: s.flap.level,
                    quarantine_left_ms: s
                        .flap
                        .until
                        .filter(|u| *u > now)
                        .map(|u| ms(u.saturating_duration_since(now))),
                };
                let worth = o.classes.iter().any(Option::is_some)
                    || o.hard
                    || o.withdrawn.is_some()
                    || o.quarantine_level > 0;
                worth.then(|| (id.clone(), o))
            })
            .collect()
    }

    /// Resume an instance from an observed-state snapshot taken `age` before `now` (a new
    /// leader, after [`Evaluator::handle_instance`] with [`Admission::Established`]).
    pub fn restore_observed(
        &mut self,
        now: Instant,
        id: &InstanceId,
        observed: &ObservedInstance,
        age: std::time::Duration,
    ) -> Result<(), EvaluatorError> {
        self.advance(now);
        let Some(state) = self.instances.get_mut(id) else {
            return self.count(Err(EvaluatorError::UnknownInstance {
                instance: id.clone(),
            }));
        };
        for (class, saved) in state.classes.iter_mut().zip(&observed.classes) {
            if let Some((score, last_ms)) = saved {
                class.score = f64::from(score.get()) / 1000.0;
                let since = std::time::Duration::from_millis(*last_ms) + age;
                class.last_at = Some(now.checked_sub(since).unwrap_or(now));
            }
        }
        if observed.hard {
            state.hard = Some((now, None));
        }
        state.withdrawn = observed.withdrawn;
        state.flap.level = observed.quarantine_level;
        state.flap.until = observed
            .quarantine_left_ms
            .map(std::time::Duration::from_millis)
            .and_then(|left| left.checked_sub(age))
            .map(|left| now + left);
        self.reevaluate(now, id);
        Ok(())
    }

    /// The current eligibility of an instance.
    pub fn eligibility(&self, id: &InstanceId) -> Option<Eligibility> {
        self.instances.get(id).map(|s| s.eligibility)
    }

    /// Why an instance is where it is.
    pub fn explain(&self, now: Instant, id: &InstanceId) -> Option<Explanation> {
        let s = self.instances.get(id)?;
        let shared = |name: &str| {
            s.contract
                .dependencies
                .iter()
                .any(|d| d.name == name && d.shared)
        };
        Some(Explanation {
            instance: s.id.clone(),
            service: s.service.clone(),
            eligibility: s.eligibility,
            rule: s.rule,
            mode: s.standing(now).mode,
            for_duration: now.saturating_duration_since(s.since),
            classes: s.evidence(now),
            dependencies: s
                .dependencies
                .iter()
                .map(|(n, st)| (n.clone(), *st, shared(n)))
                .collect(),
            flap_transitions: s.flap.transitions.len(),
            quarantine_level: s.flap.level,
            history: s.history.iter().cloned().collect(),
        })
    }

    /// What an instance's verdict rests on now, and whether any class speaks for it.
    pub fn evidence_mode(&self, now: Instant, id: &InstanceId) -> Option<(EvidenceMode, bool)> {
        let s = self.instances.get(id)?;
        let standing = s.standing(now);
        Some((standing.mode, standing.verified))
    }

    /// How many of a service's instances are in each evidence mode now.
    pub fn mode_counts(
        &self,
        now: Instant,
        service: &ServiceName,
    ) -> BTreeMap<EvidenceMode, usize> {
        let mut counts = BTreeMap::new();
        if let Some(entry) = self.services.get(service) {
            for s in entry
                .instances
                .iter()
                .filter_map(|id| self.instances.get(id))
            {
                *counts.entry(s.standing(now).mode).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Instances of a service with their eligibility, in id order.
    pub fn service_instances(&self, service: &ServiceName) -> Vec<(InstanceId, Eligibility)> {
        let Some(entry) = self.services.get(service) else {
            return Vec::new();
        };
        entry
            .instances
            .iter()
            .filter_map(|id| self.instances.get(id).map(|s| (id.clone(), s.eligibility)))
            .collect()
    }

    /// Counts per verdict for a service (the unknown count is an exported signal).
    pub fn verdict_counts(&self, service: &ServiceName) -> BTreeMap<Verdict, usize> {
        let mut counts = BTreeMap::new();
        for (_, e) in self.service_instances(service) {
            *counts.entry(e.verdict()).or_insert(0) += 1;
        }
        counts
    }

    /// Counters for metrics.
    pub fn stats(&self) -> &EvaluatorStats {
        &self.stats
    }

    /// How many instances are being evaluated.
    pub fn len(&self) -> usize {
        self.instances.len()
    }

    /// Whether no instance is being evaluated.
    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }

    // --- inputs ---

    fn upsert_instance(
        &mut self,
        now: Instant,
        instance: &Instance,
        admission: Admission,
    ) -> Result<(), EvaluatorError> {
        if self.tombstones.contains(&instance.id) {
            return Err(EvaluatorError::Retired {
                instance: instance.id.clone(),
            });
        }
        let Some(entry) = self.services.get_mut(&instance.service) else {
            return Err(EvaluatorError::UnknownService {
                service: instance.service.clone(),
            });
        };
        if let Some(existing) = self.instances.get_mut(&instance.id) {
            if existing.service != instance.service {
                return Err(EvaluatorError::ServiceMismatch {
                    instance: instance.id.clone(),
                    existing: existing.service.clone(),
                    requested: instance.service.clone(),
                });
            }
            existing.base_weight = instance.weight;
            self.reevaluate(now, &instance.id);
            return Ok(());
        }
        entry.instances.insert(instance.id.clone());
        let state = new_state(now, instance, entry.contract.clone(), admission);
        self.instances.insert(instance.id.clone(), state);
        self.reevaluate_new(now, &instance.id);
        Ok(())
    }

    fn apply_sample(&mut self, now: Instant, sample: Sample) -> Result<(), EvaluatorError> {
        let Sample {
            instance: id,
            reporter,
            observation,
        } = sample;
        let class = observation.class();
        let callers_max = self.config.callers_max;
        let (instances, mut out) = self.parts();
        let Some(state) = instances.get_mut(&id) else {
            return Err(self.missing(id));
        };
        check_attribution(&reporter, class, &id)?;
        if !state.contract.profile.provides(class) {
            return Err(EvaluatorError::ClassNotProvided {
                service: state.service.clone(),
                class,
            });
        }
        match observation {
            Observation::Probe { health, detail } => {
                apply_probe(state, now, reporter, health, detail)
            }
            Observation::SelfReport(report) => apply_self_report(state, now, reporter, report)?,
            Observation::Passive { requests, errors } => {
                apply_passive(state, now, reporter, requests, errors, callers_max);
            }
        }
        decision::reevaluate(state, now, &mut out);
        Ok(())
    }

    fn apply_lifecycle(
        &mut self,
        now: Instant,
        id: &InstanceId,
        event: Lifecycle,
    ) -> Result<(), EvaluatorError> {
        let state = self.lookup_mut(id)?;
        let l = &mut state.lifecycle;
        match event {
            Lifecycle::ProcessGone => {
                state.hard = Some((now, None));
                state.withdrawn = Some(Rule::HardFailure { class: None });
                state.readmit_since = None;
            }
            Lifecycle::Terminating => l.terminating = true,
            Lifecycle::Serving => l.terminating = false,
            Lifecycle::MaintenanceOn { reason } => l.maintenance = Some(truncate_detail(&reason)),
            Lifecycle::MaintenanceOff => l.maintenance = None,
            Lifecycle::LeaseExpired | Lifecycle::Deleted | Lifecycle::Deregistered => {
                l.retired = true
            }
        }
        let retired = l.retired;
        self.reevaluate(now, id);
        if retired {
            self.retire(id);
        }
        Ok(())
    }

    fn lookup_mut(&mut self, id: &InstanceId) -> Result<&mut InstanceState, EvaluatorError> {
        // Retired instances are removed from the map, so a miss is the only case to sort.
        if !self.instances.contains_key(id) {
            return Err(self.missing(id.clone()));
        }
        Ok(self.instances.get_mut(id).expect("checked just above"))
    }

    /// The error for an id the evaluator does not hold: retired, or never seen.
    fn missing(&self, instance: InstanceId) -> EvaluatorError {
        if self.tombstones.contains(&instance) {
            EvaluatorError::Retired { instance }
        } else {
            EvaluatorError::UnknownInstance { instance }
        }
    }

    // --- the decision loop ---

    /// Split borrows: the instance map apart from everything a decision writes to.
    fn parts(&mut self) -> (&mut InstanceMap, Outputs<'_>) {
        let out = Outputs {
            timers: &mut self.timers,
            effects: &mut self.effects,
            stats: &mut self.stats,
            services: &self.services,
            history_len: self.config.history_len,
            grid: StepGrid {
                epoch: self.epoch,
                quantum: self.config.step_grid,
            },
        };
        (&mut self.instances, out)
    }

    fn reevaluate_new(&mut self, now: Instant, id: &InstanceId) {
        let (instances, mut out) = self.parts();
        let state = instances
            .get_mut(id)
            .expect("a new instance was just inserted");
        let decision = state.decide(now, out.grid);
        decision::apply(state, now, None, decision, &mut out);
    }

    /// Walk the decision path for one instance and publish what changed.
    fn reevaluate(&mut self, now: Instant, id: &InstanceId) {
        let (instances, mut out) = self.parts();
        if let Some(state) = instances.get_mut(id) {
            decision::reevaluate(state, now, &mut out);
        }
    }

    fn retire(&mut self, id: &InstanceId) {
        let Some(state) = self.instances.remove(id) else {
            return;
        };
        if let Some(at) = state.timer {
            self.timers.remove(&(at, id.clone()));
        }
        if let Some(entry) = self.services.get_mut(&state.service) {
            entry.instances.remove(id);
        }
        if self.tombstone_order.len() >= self.config.tombstones_max
            && let Some(oldest) = self.tombstone_order.pop_front()
        {
            self.tombstones.remove(&oldest);
        }
        self.tombstones.insert(id.clone());
        self.tombstone_order.push_back(id.clone());
        self.effects.push(Effect::Retired {
            instance: id.clone(),
            service: state.service,
        });
    }

    fn advance(&mut self, now: Instant) {
        debug_assert!(
            self.last_now.is_none_or(|last| now >= last),
            "time went backwards"
        );
        self.last_now = Some(now);
        self.epoch.get_or_insert(now);
    }

    fn count<T>(&mut self, result: Result<T, EvaluatorError>) -> Result<T, EvaluatorError> {
        if let Err(e) = &result {
            *self.stats.rejected.entry(e.label()).or_insert(0) += 1;
        }
        result
    }
}

fn new_state(
    now: Instant,
    instance: &Instance,
    contract: ValidContract,
    admission: Admission,
) -> InstanceState {
    let ramp_from = match admission {
        Admission::New if !contract.slow_start.is_zero() => Some(now),
        _ => None,
    };
    InstanceState {
        id: instance.id.clone(),
        service: instance.service.clone(),
        base_weight: instance.weight,
        contract,
        classes: [
            ClassState::default(),
            ClassState::default(),
            ClassState::default(),
        ],
        callers: Default::default(),
        hard: None,
        lifecycle: Default::default(),
        dependencies: BTreeMap::new(),
        withdrawn: None,
        readmit_since: None,
        ramp_from,
        flap: Default::default(),
        // Routed placeholder so the first decision keeps the ramp chosen above.
        eligibility: Eligibility::Unknown {
            weight: instance.weight,
        },
        standing: instance::Standing::UNHEARD,
        rule: Rule::Admitted,
        since: now,
        history: VecDeque::new(),
        timer: None,
    }
}

/// Who may report which class about whom (ADR-15). Probe assignment is checked by the
/// shell against the registry before a sample reaches the core.
fn check_attribution(
    reporter: &Reporter,
    class: EvidenceClass,
    id: &InstanceId,
) -> Result<(), EvaluatorError> {
    let allowed = match (reporter, class) {
        (Reporter::Instance(who), EvidenceClass::SelfReport) => who == id,
        (Reporter::Node(_), EvidenceClass::Probe | EvidenceClass::Passive) => true,
        _ => false,
    };
    if allowed {
        Ok(())
    } else {
        Err(EvaluatorError::NotAttributable {
            reporter: reporter.clone(),
            class,
            instance: id.clone(),
        })
    }
}

fn apply_probe(
    state: &mut InstanceState,
    now: Instant,
    reporter: Reporter,
    health: Health,
    detail: Option<String>,
) {
    let c = &state.contract;
    let class = EvidenceClass::Probe;
    let cs = &mut state.classes[class.index()];
    let failed = match health {
        Health::Pass => 0.0,
        Health::Fail | Health::Timeout | Health::Refused => 1.0,
    };
    cs.push(now, failed, c.interval_of(class), c.scoring.half_life);
    cs.last_reporter = Some(reporter);
    cs.last_seen = Some(LastSeen::Probe {
        health,
        detail: detail.map(bounded),
    });
    match health {
        Health::Refused => {
            // The fast path: a closed port is not ambiguous, so skip the decay.
            cs.score = 1.0;
            state.hard = Some((now, Some(class)));
            state.withdrawn = Some(Rule::HardFailure { class: Some(class) });
            state.readmit_since = None;
        }
        Health::Pass => state.hard = None,
        Health::Fail | Health::Timeout => {}
    }
}

fn apply_self_report(
    state: &mut InstanceState,
    now: Instant,
    reporter: Reporter,
    report: SelfReport,
) -> Result<(), EvaluatorError> {
    let c = &state.contract;
    let class = EvidenceClass::SelfReport;
    let (interval, half_life) = (c.interval_of(class), c.scoring.half_life);
    let cs = &mut state.classes[class.index()];
    let report = match report {
        SelfReport::Ready => {
            cs.push(now, 0.0, interval, half_life);
            state.lifecycle.self_draining = false;
            // A process that speaks again is not gone.
            if matches!(state.hard, Some((_, None))) {
                state.hard = None;
            }
            SelfReport::Ready
        }
        SelfReport::NotReady { detail } => {
            cs.push(now, 1.0, interval, half_life);
            SelfReport::NotReady {
                detail: bounded(detail),
            }
        }
        SelfReport::Draining => {
            cs.last_at = Some(now);
            state.lifecycle.self_draining = true;
            SelfReport::Draining
        }
        SelfReport::Dependency { name, status } => {
            if !c.dependencies.iter().any(|d| d.name == name) {
                let service = state.service.clone();
                return Err(EvaluatorError::UndeclaredDependency { service, name });
            }
            // A dependency report shows the channel is alive; it says nothing of readiness.
            cs.last_at = Some(now);
            state.dependencies.insert(name.clone(), status);
            SelfReport::Dependency { name, status }
        }
    };
    let cs = &mut state.classes[class.index()];
    cs.last_reporter = Some(reporter);
    cs.last_seen = Some(LastSeen::SelfReport(report));
    Ok(())
}

fn apply_passive(
    state: &mut InstanceState,
    now: Instant,
    reporter: Reporter,
    requests: u64,
    errors: u64,
    callers_max: usize,
) {
    let c = &state.contract;
    let class = EvidenceClass::Passive;
    if requests < c.passive.min_requests {
        // Too little traffic to say anything either way: neither evidence nor silence-breaker.
        return;
    }
    let failing = Permille::ratio(errors.min(requests), requests) >= c.passive.error_rate;
    state
        .callers
        .record(now, &reporter, requests, failing, callers_max);
    let heard = state.callers.population(now, c.silence_of(class));
    let (share, callers) = (heard.failing_share(), heard.callers as usize);
    let cs = &mut state.classes[class.index()];
    cs.push(now, share, c.interval_of(class), c.scoring.half_life);
    cs.last_reporter = Some(reporter);
    cs.last_seen = Some(LastSeen::Passive {
        requests,
        errors,
        share,
        callers,
    });
}

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
