//! The leader's pipeline: desired state and evidence in, released views out. Pure.
//!
//! Wires the core's three machines the way the authority leader runs them:
//!
//! ```text
//! DesiredState ─┐
//! samples ──────┼─► Evaluator ─► ViewAssembler ─► DeltaQueues ─► Output::Release
//! timeouts ─────┘        │              │               └─────► Output::Shed
//!                        └─► Output::Transition / Quarantine    └─► Output::Alarm
//! ```
//!
//! [`RegionPipeline::rebuild`] is how a new leader recomputes computed state (ADR-02): every
//! instance enters as `Established` — routed at full weight until evidence speaks — so a
//! failover alone moves no traffic. (Holding each view exactly as last published, until
//! fresh evidence has had a contract interval, needs the observed-state snapshot the
//! followers will carry; until then an instance withdrawn before the failover returns as
//! `unknown`.)
//!
//! Peer regions' aggregates arrive through [`RegionPipeline::handle_remote`] as tier 2.
//! Zone evacuations and region failovers are desired state: the registry records the intent
//! and the leader's periodic progress records, and `rebuild` resumes both where they stood.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use waymark_core::assembler::{
    self, AssemblerConfig, Direction, EvacuationCommand, EvacuationError, FailoverOrder,
    RemoteEndpoint, ServicePolicy, ViewAssembler,
};
use waymark_core::audit::TransitionRecord;
use waymark_core::delta::{self, DeltaConfig, DeltaQueues};
use waymark_core::evaluator::{
    self, Admission, Evaluator, EvaluatorConfig, EvaluatorError, ObservedInstance, QuarantineEvent,
};
use waymark_core::model::{
    Instance, InstanceId, Lifecycle, RegionName, Sample, ServiceName, ZoneName,
};
use waymark_core::view::{ReleasedView, VersionSource};

use crate::state::{
    Applied, DesiredState, EvacuationIntent, EvacuationRecord, RegionFailoverIntent,
    RegionFailoverRecord, RetireCause, ServicePolicyRecord,
};

/// What the pipeline needs to know about its region.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// This region.
    pub region: RegionName,
    /// Its zones (views are assembled for callers in each).
    pub zones: BTreeSet<ZoneName>,
    /// Evaluator limits.
    pub evaluator: EvaluatorConfig,
    /// Delta queue pacing.
    pub delta: DeltaConfig,
    /// Whether the fraction guard runs; see [`AssemblerConfig::fraction_guard`].
    pub fraction_guard: bool,
}

/// What the pipeline asks its driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Serve this view (to the xDS snapshot builder).
    Release(Box<ReleasedView>),
    /// Append to the audit log.
    Transition(Box<TransitionRecord>),
    /// Tell the owning team.
    Quarantine(Box<QuarantineEvent>),
    /// An alarm or reported signal from the assembler (guard, incident, evacuation).
    Alarm(assembler::Effect),
    /// A shed episode started or ended.
    Shed(delta::Effect),
    /// An instance's probe cadence changed: the prober assignment follows it (probes at
    /// the contract's confirmation cadence while its callers' outcomes are primary and
    /// clean).
    ProbeCadence {
        /// Which instance.
        instance: InstanceId,
        /// At the confirmation cadence.
        confirming: bool,
    },
    /// A committed evacuation intent could not be carried out (checked before commit, so
    /// only a race with another intent gets here).
    EvacuationRefused {
        /// The zone.
        zone: ZoneName,
        /// Why.
        error: EvacuationError,
    },
    /// A committed region failover intent could not be carried out (checked before commit,
    /// so only a race with another intent gets here).
    RegionFailoverRefused {
        /// The peer region.
        region: RegionName,
        /// Why.
        error: EvacuationError,
    },
}

fn region_failover_command(intent: RegionFailoverIntent) -> EvacuationCommand {
    match intent {
        RegionFailoverIntent::Failover { manual } => EvacuationCommand::Evacuate { manual },
        RegionFailoverIntent::ShiftBack => EvacuationCommand::ShiftBack,
        RegionFailoverIntent::CompleteShiftBack => EvacuationCommand::CompleteShiftBack,
    }
}

/// Who asked for a region failover's last accepted command, and why: carried into its
/// progress records so the question survives a change of leader.
#[derive(Debug, Clone)]
struct Provenance {
    actor: String,
    reason: String,
}

fn evacuation_command(intent: EvacuationIntent) -> EvacuationCommand {
    match intent {
        EvacuationIntent::Evacuate { manual } => EvacuationCommand::Evacuate { manual },
        EvacuationIntent::ShiftBack => EvacuationCommand::ShiftBack,
        EvacuationIntent::CompleteShiftBack => EvacuationCommand::CompleteShiftBack,
    }
}

/// The pipeline. See the module documentation.
#[derive(Debug)]
pub struct RegionPipeline {
    evaluator: Evaluator,
    assembler: ViewAssembler,
    queues: DeltaQueues,
    /// One entry per region the assembler has a failover for.
    failover_provenance: BTreeMap<RegionName, Provenance>,
    outputs: Vec<Output>,
}

impl RegionPipeline {
    /// Recompute everything from the desired state, as a new leader does.
    pub fn rebuild(config: PipelineConfig, state: &DesiredState, now: Instant) -> Self {
        let mut p = Self {
            evaluator: Evaluator::new(config.evaluator),
            assembler: ViewAssembler::new(AssemblerConfig {
                fraction_guard: config.fraction_guard,
                ..AssemblerConfig::new(config.region, config.zones)
            }),
            queues: DeltaQueues::new(config.delta),
            failover_provenance: BTreeMap::new(),
            outputs: Vec::new(),
        };
        for (name, record) in state.services() {
            p.put_service(now, name, record, state.policy(name));
        }
        for (zone, e) in state.evacuations() {
            let direction = if e.back {
                Direction::Back
            } else {
                Direction::Out
            };
            p.assembler.restore_evacuation(
                now,
                zone,
                e.moved,
                direction,
                e.manual,
                e.awaiting_completion,
            );
        }
        p.restore_region_failovers(now, state);
        for record in state.instances() {
            p.add_instance(now, &record.instance, Admission::Established);
            if record.draining {
                let _ =
                    p.evaluator
                        .handle_lifecycle(now, &record.instance.id, Lifecycle::Terminating);
            }
            if let Some(reason) = &record.maintenance {
                let event = Lifecycle::MaintenanceOn {
                    reason: reason.clone(),
                };
                let _ = p
                    .evaluator
                    .handle_lifecycle(now, &record.instance.id, event);
            }
        }
        p.pump(now);
        p
    }

    /// Forget the transitions produced so far. A rebuild reconstructs verdicts the audit
    /// log already holds (every instance enters the evaluator anew, `from` none): at the
    /// reference estate's 60,000 instances, auditing them again would write 60,000
    /// records on every election and every catch-up. Each instance's own history keeps
    /// them for `explain`; the first real change after the rebuild is audited from the
    /// rebuilt verdict.
    pub fn forget_transitions(&mut self) {
        self.outputs
            .retain(|output| !matches!(output, Output::Transition(_)));
    }

    /// Follow a command the registry applied.
    pub fn handle_applied(&mut self, now: Instant, applied: &Applied, state: &DesiredState) {
        self.handle_applied_all(now, std::iter::once(applied), state);
    }

    /// Follow every command of a run of applied entries (`state` includes them all), then
    /// move the effects downstream once: a service many of them touched is assembled once.
    pub fn handle_applied_all<'a>(
        &mut self,
        now: Instant,
        applied: impl IntoIterator<Item = &'a Applied>,
        state: &DesiredState,
    ) {
        self.follow_applied(now, applied, state);
        self.settle(now);
    }

    /// The half of [`RegionPipeline::handle_applied_all`] that reads the replicated state:
    /// take in the commands, leaving their effects queued. A shell that reads the state
    /// under the lock the state machine applies under holds it only this long, and calls
    /// [`RegionPipeline::settle`] after releasing it — assembly, the expensive half, must
    /// not stall the commits behind it.
    pub fn follow_applied<'a>(
        &mut self,
        now: Instant,
        applied: impl IntoIterator<Item = &'a Applied>,
        state: &DesiredState,
    ) {
        for applied in applied {
            self.follow(now, applied, state);
        }
    }

    /// Move what [`RegionPipeline::follow_applied`] queued downstream: evaluation effects
    /// into the assembler, changed views into the delta queues.
    pub fn settle(&mut self, now: Instant) {
        self.pump(now);
    }

    fn follow(&mut self, now: Instant, applied: &Applied, state: &DesiredState) {
        match applied {
            Applied::ServicePut => {
                for (name, record) in state.services() {
                    self.put_service(now, name, record, state.policy(name));
                }
            }
            Applied::Registered { instance, .. } => {
                if let Some(r) = state.instance(instance) {
                    self.add_instance(now, &r.instance, Admission::New);
                }
            }
            Applied::Observed { instance, draining } => {
                if let Some(r) = state.instance(instance) {
                    self.add_instance(now, &r.instance, Admission::New);
                    let event = if *draining {
                        Lifecycle::Terminating
                    } else {
                        Lifecycle::Serving
                    };
                    let _ = self.evaluator.handle_lifecycle(now, instance, event);
                }
            }
            Applied::Maintenance { instance, reason } => {
                let event = match reason {
                    Some(reason) => Lifecycle::MaintenanceOn {
                        reason: reason.clone(),
                    },
                    None => Lifecycle::MaintenanceOff,
                };
                let _ = self.evaluator.handle_lifecycle(now, instance, event);
            }
            Applied::Retired { instances } => {
                for (id, cause) in instances {
                    let event = match cause {
                        RetireCause::LeaseExpired => Lifecycle::LeaseExpired,
                        RetireCause::Deregistered => Lifecycle::Deregistered,
                        RetireCause::Deleted => Lifecycle::Deleted,
                    };
                    // An instance the evaluator never saw has nothing to retire.
                    let _ = self.evaluator.handle_lifecycle(now, id, event);
                }
            }
            Applied::PolicySet { service } => {
                if let Some(record) = state.service(service) {
                    self.put_service(now, service, record, state.policy(service));
                }
            }
            Applied::Evacuation { zone, intent } => {
                let command = evacuation_command(*intent);
                if let Err(error) = self.assembler.handle_evacuation(now, zone, command) {
                    self.outputs.push(Output::EvacuationRefused {
                        zone: zone.clone(),
                        error,
                    });
                }
            }
            Applied::RegionFailover {
                region,
                intent,
                actor,
                reason,
            } => {
                let command = region_failover_command(*intent);
                match self.assembler.handle_region_failover(now, region, command) {
                    Ok(()) => {
                        let provenance = Provenance {
                            actor: actor.clone(),
                            reason: reason.clone(),
                        };
                        self.failover_provenance.insert(region.clone(), provenance);
                    }
                    Err(error) => self.outputs.push(Output::RegionFailoverRefused {
                        region: region.clone(),
                        error,
                    }),
                }
            }
            Applied::ServiceRemoved { service } => {
                // Its instances are gone already (a service with instances cannot be
                // removed); forget its views so nothing releases them again.
                self.assembler.handle_service_removed(service);
                self.queues.handle_service_removed(service);
            }
            Applied::Renewed { .. }
            | Applied::LeasesRestarted { .. }
            | Applied::AssignmentSet
            | Applied::EvacuationProgress
            | Applied::RegionFailoverProgress
            | Applied::Acl { .. } => {}
        }
    }

    /// A peer region's endpoints for a service, from its read-only aggregate (tier 2);
    /// replaces what that region sent before, and an empty list forgets the region for the
    /// service. The service's views are rebuilt at once and queued like any other change.
    pub fn handle_remote(
        &mut self,
        now: Instant,
        service: &ServiceName,
        region: RegionName,
        endpoints: Vec<RemoteEndpoint>,
    ) {
        self.assembler.handle_remote(service, region, endpoints);
        self.pump(now);
    }

    /// One attributed sample (the shell has checked identity and assignment).
    pub fn handle_sample(&mut self, now: Instant, sample: Sample) -> Result<(), EvaluatorError> {
        self.handle_samples(now, [sample]).pop().map_or(Ok(()), Err)
    }

    /// Attributed samples that arrived together, evaluated in order and assembled once:
    /// a service many of them touch is rebuilt or patched once, not once per sample.
    /// Returns each refusal by the evaluator (which changed nothing), in order.
    pub fn handle_samples(
        &mut self,
        now: Instant,
        samples: impl IntoIterator<Item = Sample>,
    ) -> Vec<EvaluatorError> {
        let refused = samples
            .into_iter()
            .filter_map(|sample| self.evaluator.handle_sample(now, sample).err())
            .collect();
        self.pump(now);
        refused
    }

    /// The driver's report of delivery pressure (releases committing or sending slowly):
    /// while it lasts the delta queues shed admissions; withdrawals are never slowed.
    pub fn handle_pressure(&mut self, now: Instant, saturated: bool) {
        self.queues.handle_pressure(now, saturated);
    }

    /// Fire every machine's timers and release what is due.
    pub fn handle_timeout(&mut self, now: Instant, versions: &mut dyn VersionSource) {
        self.evaluator.handle_timeout(now);
        self.assembler.handle_timeout(now);
        self.pump(now);
        self.queues.handle_timeout(now, versions);
        for effect in self.queues.take_effects() {
            match effect {
                delta::Effect::Release { view, .. } => self.outputs.push(Output::Release(view)),
                other => self.outputs.push(Output::Shed(other)),
            }
        }
    }

    /// The earliest time [`RegionPipeline::handle_timeout`] should be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.evaluator.poll_timeout(),
            self.assembler.poll_timeout(),
            self.queues.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Drain the outputs produced so far, in order.
    pub fn take_outputs(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.outputs)
    }

    /// Whether an evacuation intent would be accepted now (checked before it is committed).
    pub fn check_evacuation(
        &self,
        zone: &ZoneName,
        intent: EvacuationIntent,
    ) -> Result<(), EvacuationError> {
        self.assembler
            .check_evacuation(zone, evacuation_command(intent))
    }

    /// A zone's evacuation as it stands, for the leader to record.
    pub fn evacuation_record(&self, zone: &ZoneName) -> Option<EvacuationRecord> {
        self.assembler.evacuation(zone).map(|e| EvacuationRecord {
            moved: e.moved,
            back: e.direction == Direction::Back,
            manual: e.manual,
            awaiting_completion: e.awaiting_completion,
        })
    }

    /// Whether a region failover intent would be accepted now (checked before it is
    /// committed). Failing over this region itself is refused.
    pub fn check_region_failover(
        &self,
        region: &RegionName,
        intent: RegionFailoverIntent,
    ) -> Result<(), EvacuationError> {
        self.assembler
            .check_region_failover(region, region_failover_command(intent))
    }

    /// A region failover as it stands, with who last moved it and why, for the leader to
    /// record; `None` once it is over.
    pub fn region_failover_record(&self, region: &RegionName) -> Option<RegionFailoverRecord> {
        let e = self.assembler.region_failover(region)?;
        let provenance = self.failover_provenance.get(region);
        Some(RegionFailoverRecord {
            moved: e.moved,
            back: e.direction == Direction::Back,
            manual: e.manual,
            awaiting_completion: e.awaiting_completion,
            actor: provenance.map(|p| p.actor.clone()).unwrap_or_default(),
            reason: provenance.map(|p| p.reason.clone()).unwrap_or_default(),
        })
    }

    /// The evaluator's observed state, for the snapshot the leader replicates.
    pub fn observed(&self, now: Instant) -> BTreeMap<InstanceId, ObservedInstance> {
        self.evaluator.observed(now)
    }

    /// Resume from an observed-state snapshot taken `age` ago (a new leader, after
    /// [`RegionPipeline::rebuild`]). Instances the registry no longer holds are skipped.
    pub fn restore_observed(
        &mut self,
        now: Instant,
        snapshot: &BTreeMap<InstanceId, ObservedInstance>,
        age: std::time::Duration,
    ) {
        for (id, observed) in snapshot {
            let _ = self.evaluator.restore_observed(now, id, observed, age);
        }
        self.pump(now);
    }

    /// The evaluator, for `explain` and counts.
    pub fn evaluator(&self) -> &Evaluator {
        &self.evaluator
    }

    fn restore_region_failovers(&mut self, now: Instant, state: &DesiredState) {
        for (region, r) in state.region_failovers() {
            let direction = if r.back {
                Direction::Back
            } else {
                Direction::Out
            };
            self.assembler.restore_region_failover(
                now,
                region,
                r.moved,
                direction,
                r.manual,
                r.awaiting_completion,
            );
            if self.assembler.region_failover(region).is_some() {
                let provenance = Provenance {
                    actor: r.actor.clone(),
                    reason: r.reason.clone(),
                };
                self.failover_provenance.insert(region.clone(), provenance);
            }
        }
    }

    fn put_service(
        &mut self,
        now: Instant,
        name: &ServiceName,
        record: &crate::state::ServiceRecord,
        policy: Option<&ServicePolicyRecord>,
    ) {
        let Ok(contract) = record.contract.clone().validate() else {
            return; // the registry only stores contracts that validated
        };
        let failover = policy
            .filter(|p| !p.failover_zones.is_empty() || !p.failover_regions.is_empty())
            .map(|p| FailoverOrder {
                zones: p.failover_zones.clone(),
                regions: p.failover_regions.clone(),
            });
        let policy = ServicePolicy {
            min_healthy: policy
                .and_then(|p| p.min_healthy_override)
                .unwrap_or(contract.min_healthy),
            failover,
            profile: contract.profile,
        };
        self.assembler.handle_policy(name, policy);
        self.evaluator
            .handle_service(now, name.clone(), record.owner.clone(), contract);
    }

    fn add_instance(&mut self, now: Instant, instance: &Instance, admission: Admission) {
        self.assembler.handle_instance(instance);
        // Already known instances keep their state (the evaluator only updates weight).
        let _ = self.evaluator.handle_instance(now, instance, admission);
    }

    /// Move effects downstream: evaluator → assembler → delta queues.
    fn pump(&mut self, now: Instant) {
        for effect in self.evaluator.take_effects() {
            match effect {
                evaluator::Effect::Eligibility {
                    instance,
                    service,
                    eligibility,
                } => {
                    self.assembler
                        .handle_eligibility(&service, &instance, eligibility);
                }
                evaluator::Effect::Evidence {
                    instance,
                    service,
                    mode,
                    verified,
                } => {
                    self.assembler
                        .handle_evidence(&service, &instance, mode, verified);
                }
                evaluator::Effect::ProbeCadence {
                    instance,
                    confirming,
                    ..
                } => self.outputs.push(Output::ProbeCadence {
                    instance,
                    confirming,
                }),
                evaluator::Effect::Retired { instance, service } => {
                    self.assembler.handle_removed(&service, &instance)
                }
                evaluator::Effect::Transition(t) => self.outputs.push(Output::Transition(t)),
                evaluator::Effect::Quarantined(q) => self.outputs.push(Output::Quarantine(q)),
            }
        }
        self.assembler.assemble();
        for effect in self.assembler.take_effects() {
            match effect {
                assembler::Effect::Target(view) => self.queues.handle_target(now, view),
                assembler::Effect::RegionFailoverProgress { ref region, .. } => {
                    if self.assembler.region_failover(region).is_none() {
                        self.failover_provenance.remove(region);
                    }
                    self.outputs.push(Output::Alarm(effect));
                }
                other => self.outputs.push(Output::Alarm(other)),
            }
        }
    }
}

#[cfg(test)]
mod tests;
