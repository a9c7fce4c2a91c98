//! One leadership term's decisions, as a pure state machine.
//!
//! A member that wins an election builds a [`LeaderTerm`] and feeds it until it loses
//! leadership. The term owns the region pipeline (evaluator → assembler → delta queues)
//! and decides everything the leader does around it: the **hold** (for one contract
//! interval nothing computed is published, so a failover alone moves no traffic; at its
//! end only views whose content differs from what is published go out), the **lease
//! restart** that must commit before any lease may expire, **prober reassignment**, peer
//! regions' aggregates fed into **tier 2**, the **out-of-band region signal** followed, and
//! every pipeline output turned into a release, an audit record or a metric change.
//!
//! No I/O, no clock: the shell (`agent/src/authority/leader.rs`) passes `now`, answers
//! reads through [`Surroundings`], executes [`LeaderTerm::take_commands`] and reports each
//! proposal's outcome back with [`LeaderTerm::handle_written`].
//!
//! ```text
//! samples, denials, pressure ──► ┌────────────┐ ──► Publish, Audit, Propose, Metric
//! committed log entries      ──► │ LeaderTerm │ ──► RefreshTargets, HandOver
//! timeouts (poll_timeout)    ──► └────────────┘
//! hand-over outcomes         ──►
//! ```
//!
//! Invariants (checked by `term/tests.rs` and `term/props.rs`):
//! - no view is published while the hold lasts, and the hold's end publishes only views
//!   that differ from the published ones
//! - no lease expiry is proposed before this term's lease restart committed, and at most
//!   one lease proposal is in flight
//! - a lease renewed within its length is never proposed for expiry (renewals are the
//!   term's own memory, [`LeaderTerm::handle_renewals`], and cost no log entry)
//! - at most one signal-driven failover per region is in flight; an operator's is never
//!   touched
//! - a term whose version space ran out publishes nothing more (it never wraps) and asks
//!   for one hand-over at a time until another voter leads

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};
use waymark_core::assembler::{self, RemoteEndpoint};
use waymark_core::audit::TransitionRecord;
use waymark_core::delta;
use waymark_core::eligibility::{EvidenceMode, Verdict};
use waymark_core::evaluator::{EvaluatorError, ObservedInstance, QuarantineEvent};
use waymark_core::model::{
    EvidenceClass, InstanceId, NodeName, RegionName, Sample, ServiceName, ZoneName,
};
use waymark_core::units::Permille;
use waymark_core::view::{ReleasedView, Tier, ViewKey};

use crate::assignment::assign;
use crate::fold::Fold;
use crate::ingest::Denial;
use crate::machine::{
    AuditEntry, AuditKind, AuthorityState, OBSERVED_PARTS_MAX, Request, TermVersions,
};
use crate::pipeline::{Output, PipelineConfig, RegionPipeline};
use crate::state::{
    Applied, Command, DesiredState, EXPIRE_BATCH_MAX, RegionFailoverIntent, RegionFailoverRecord,
    RegistryError, Stamped,
};

/// The longest a new leader holds the published views.
pub const HOLD_MAX: Duration = Duration::from_secs(30);
/// Probers assigned to each target.
pub const PROBERS_PER_TARGET: usize = 2;
/// How often verdict counts are refreshed and folded denials written.
pub const COUNTS_EVERY: Duration = Duration::from_secs(2);
/// How often the observed-state snapshot is replicated (the design asks for at least
/// every 60 s).
pub const OBSERVED_EVERY: Duration = Duration::from_secs(30);
/// Instances one observed-state entry carries at most (a few hundred kB encoded); a larger
/// region's snapshot goes in parts.
pub const OBSERVED_PER_ENTRY: usize = 2_048;
/// Prober assignment is recomputed at most this often (it walks every target).
pub const REASSIGN_EVERY: Duration = Duration::from_millis(500);
/// How often lease expiry is checked.
pub const LEASE_CHECK_EVERY: Duration = Duration::from_millis(500);
/// How often peer regions' aggregates and the front-door signal are read.
pub const REMOTE_EVERY: Duration = Duration::from_millis(250);
/// The actor named on commands the out-of-band region signal proposes.
pub const SIGNAL_ACTOR: &str = "waymark:region-signal";
/// The actor named on the records the leader writes for itself.
pub const ACTOR: &str = "waymark";
/// Longest example instance kept in a folded denial record, in bytes.
pub const DENIAL_EXAMPLE_LEN_MAX: usize = 253;
/// The version recorded for a stale region's entries dropped under `drop_stale_peers`.
const DROPPED_STALE: u64 = u64::MAX;

/// What the term reads from around it. Each method is a read of the shell's current
/// knowledge, called only while the term handles an input; none may call back into it.
pub trait Surroundings {
    /// Wall-clock time, unix milliseconds, as data: it stamps records and commands and is
    /// compared with lease deadlines, never used to order events.
    fn now_ms(&self) -> u64;
    /// Read the replicated state as of the last applied entry. The shell may hold the lock
    /// the state machine applies under for as long as `read` runs: keep it to reading.
    fn read_state<T>(&self, read: impl FnOnce(&AuthorityState) -> T) -> T;
    /// Connected probers, each with its zone.
    fn probers(&self) -> Vec<(NodeName, ZoneName)>;
    /// Each peer region's aggregate per service, and its version (empty when this member
    /// does not federate).
    fn peer_digest(&self) -> Vec<((RegionName, ServiceName), u64)>;
    /// A peer region's endpoints of a service, from its aggregate.
    fn peer_endpoints(&self, region: &RegionName, service: &ServiceName) -> Vec<RemoteEndpoint>;
    /// Peer regions to feed as empty because they are stale. Empty unless the drills'
    /// `drop_stale_peers` break is on: a silent peer keeps its last endpoints.
    fn stale_peers(&self) -> BTreeSet<RegionName>;
    /// Each peer region's front door as the out-of-band check sees it (`true` = answers).
    fn front_doors(&self) -> Vec<(RegionName, bool)>;
}

/// What the shell is asked to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaderCommand {
    /// Commit these releases (the publisher coalesces and retries).
    Publish(Vec<ReleasedView>),
    /// Append this record to the audit log (batched).
    Audit(AuditEntry),
    /// Commit this request, then report with [`LeaderTerm::handle_written`].
    Propose {
        /// Why, so the outcome can be routed back.
        purpose: Purpose,
        /// What to commit.
        request: Request,
    },
    /// Change a metric.
    Metric(MetricChange),
    /// Hand the probers the registry's current targets (a contract or assignment changed).
    RefreshTargets,
    /// An instance's probe cadence changed (ADR-04): while its callers' outcomes are
    /// primary and clean it is probed at its contract's confirmation cadence, otherwise at
    /// the contract's interval.
    ProbeCadence {
        /// Which instance.
        instance: InstanceId,
        /// Probe at the confirmation cadence.
        confirming: bool,
    },
    /// This term can issue no more view versions: move leadership to another up-to-date
    /// voter (a leadership transfer), whose new term has a fresh version space and
    /// rebuilds and republishes every view. openraft ignores an election its own leader
    /// triggers, so asking for one would change nothing. Report the outcome with
    /// [`LeaderTerm::handle_hand_over`].
    HandOver,
}

/// How a [`LeaderCommand::HandOver`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOver {
    /// Another voter leads, or was elected to: this term is over.
    Moved,
    /// This member is the group's only voter: nobody can take over. The term refuses to
    /// publish (and says so) and asks again every [`HAND_OVER_ALONE_RETRY`], in case a
    /// voter was added; restarting the member starts a new term too.
    NoOtherVoter,
    /// The transfer did not happen (target not caught up, unreachable, not elected, or
    /// another transfer running); asked again after [`HAND_OVER_RETRY`].
    Failed,
}

/// How long after a failed hand-over the term asks for another.
pub const HAND_OVER_RETRY: Duration = Duration::from_secs(5);
/// How long after a hand-over found no other voter the term asks again.
pub const HAND_OVER_ALONE_RETRY: Duration = Duration::from_secs(30);

/// Why a request was proposed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purpose {
    /// This term's lease restart.
    RestartLeases,
    /// Lease expiry (one is due).
    ExpireLeases,
    /// A changed prober assignment.
    Assignment,
    /// The observed-state snapshot.
    Observed,
    /// An evacuation's or region failover's progress.
    Progress,
    /// A failover or shift-back the front-door signal asks for.
    Failover {
        /// The peer region.
        region: RegionName,
        /// What is asked.
        intent: RegionFailoverIntent,
        /// Why, for the audit record.
        reason: &'static str,
    },
}

/// How a proposal ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Committed, and the registry applied it.
    Applied,
    /// Committed, and the registry refused it (nothing changed).
    Refused,
    /// Not committed (leadership lost, timeout, storage error).
    Failed,
}

impl Written {
    /// Whether the request reached the log.
    pub const fn committed(self) -> bool {
        matches!(self, Self::Applied | Self::Refused)
    }
}

/// A metric change, as data; the shell owns the registry of series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricChange {
    /// A service's instance was quarantined for flapping (a counter).
    Quarantined {
        /// The service.
        service: ServiceName,
    },
    /// The fraction guard engaged or released for a service's zone.
    Guard {
        /// The service.
        service: ServiceName,
        /// The zone.
        zone: ZoneName,
        /// Whether it is engaged now.
        engaged: bool,
    },
    /// A service lost or regained its last eligible instance in the region.
    LastEligibleWithdrawn {
        /// The service.
        service: ServiceName,
        /// Whether it has none now.
        withdrawn: bool,
    },
    /// How far a region failover has moved traffic away from a peer region.
    RegionFailoverMoved {
        /// The peer region.
        region: RegionName,
        /// The share moved.
        moved: Permille,
    },
    /// Admissions are shed; withdrawals still leave at once.
    ShedStarted {
        /// The admission window while shedding.
        window: Duration,
    },
    /// Shedding ended.
    ShedEnded {
        /// How long it lasted.
        lasted: Duration,
        /// Admissions deferred meanwhile.
        deferred: u64,
    },
    /// A view was not released: this term's version space ran out (a counter).
    VersionsExhausted,
    /// Whether this leader refuses to publish because its version space ran out and no
    /// other voter can take over (a gauge; the shell clears it when the term ends).
    PublishRefused {
        /// Refusing now.
        refused: bool,
    },
    /// A service's instances per evidence mode, every mode present.
    EvidenceModes {
        /// The service.
        service: ServiceName,
        /// Instances per mode, in [`EvidenceMode::ALL`] order.
        counts: Vec<(EvidenceMode, u64)>,
    },
    /// A service's instances per verdict, every verdict present.
    Verdicts {
        /// The service.
        service: ServiceName,
        /// Instances per verdict, in [`Verdict::ALL`] order.
        counts: Vec<(Verdict, u64)>,
    },
}

/// What a term needs besides its surroundings.
#[derive(Debug, Clone)]
pub struct TermConfig {
    /// The Raft term this member leads.
    pub term: u64,
    /// The region's pipeline.
    pub pipeline: PipelineConfig,
    /// Fixes reverted on purpose; all off outside the simulation.
    pub breaks: TermBreaks,
}

/// Fixes the simulation reverts to show that it catches the bugs they fixed. Off in
/// production: no configuration file or flag reaches them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TermBreaks {
    /// Expire leases without first restarting their clocks, as the leader did before
    /// the fix: an outage of the authority retires registered instances for the silence
    /// the outage itself caused.
    pub expire_without_restart: bool,
}

/// One term's decisions. See the module documentation.
#[derive(Debug)]
pub struct LeaderTerm {
    term: u64,
    config: PipelineConfig,
    breaks: TermBreaks,
    pipeline: RegionPipeline,
    versions: TermVersions,
    hold: Hold,
    due: Due,
    /// The wall clock as of the last input that read it, to stamp records between reads.
    wall: (Instant, u64),
    /// What changed since the prober assignment was last computed.
    reassign: Reassign,
    /// The probers the assignment was last computed over.
    probers: Vec<(NodeName, ZoneName)>,
    denials: DenialDigest,
    leases: Leases,
    /// The version of each peer region's aggregate the pipeline holds as tier 2.
    remote_fed: BTreeMap<(RegionName, ServiceName), u64>,
    /// Tier-2 entries taken from the published views when the pipeline was rebuilt, not yet
    /// replaced by this member's own replica of the peer's aggregate (see [`seed_tier2`]).
    tier2_seeded: BTreeSet<(RegionName, ServiceName)>,
    /// Regions with a signal-driven failover being committed.
    failover_in_flight: BTreeSet<RegionName>,
    /// Set once a view could not be numbered: the term hands its leadership over.
    exhausted: Option<Exhausted>,
    commands: Vec<LeaderCommand>,
}

/// A term out of versions, handing its leadership over.
#[derive(Debug)]
struct Exhausted {
    /// A hand-over was asked for and has not reported back.
    in_flight: bool,
    /// When to ask again, after one that did not move the leadership.
    retry_at: Option<Instant>,
    /// The last hand-over found no other voter.
    alone: bool,
}

#[derive(Debug)]
struct Hold {
    until: Instant,
    /// Until the timeout that ends it, computed views are kept here, newest per view.
    pending: bool,
    held: BTreeMap<ViewKey, ReleasedView>,
}

/// Those of `instances` whose service's contract probes them, with their zones: what the
/// prober assignment is computed over.
fn probe_targets<'a>(
    r: &DesiredState,
    instances: impl Iterator<Item = &'a crate::state::InstanceRecord>,
) -> Vec<(InstanceId, ZoneName)> {
    instances
        .filter(|i| {
            r.service(&i.instance.service)
                .is_some_and(|s| s.contract.probe.is_some())
        })
        .map(|i| (i.instance.id.clone(), i.instance.locality.zone.clone()))
        .collect()
}

/// What the prober assignment must take in at its next computation.
#[derive(Debug, Default)]
enum Reassign {
    /// Nothing changed.
    #[default]
    Nothing,
    /// These instances came or changed (and nothing else did).
    Instances(BTreeSet<InstanceId>),
    /// The probers, a contract, or the whole state may have: compute it all.
    All,
}

impl Reassign {
    /// Instances beyond which one pass over the region costs no more than the patch.
    const INSTANCES_MAX: usize = 4_096;

    fn instance(&mut self, id: &InstanceId) {
        match self {
            Self::Nothing => *self = Self::Instances(BTreeSet::from([id.clone()])),
            Self::Instances(ids) if ids.len() < Self::INSTANCES_MAX => {
                ids.insert(id.clone());
            }
            Self::Instances(_) => *self = Self::All,
            Self::All => {}
        }
    }
}

/// When each periodic duty is next due.
#[derive(Debug)]
struct Due {
    counts: Instant,
    leases: Instant,
    reassign: Instant,
    observed: Instant,
    remote: Instant,
}

#[derive(Debug, Default)]
struct Leases {
    /// This term's restart committed: leases may expire from now on.
    restarted: bool,
    /// A restart or expiry is being committed.
    in_flight: bool,
    /// Where each renewal heard this term moved a lease's end (unix ms). Renewals are
    /// never committed: losing these with the term is what the next term's restart is for.
    renewed: HashMap<InstanceId, u64>,
}

// === impl LeaderTerm ===

impl LeaderTerm {
    /// A new term: computed state rebuilt from the desired state (ADR-02), resumed from
    /// the observed-state snapshot, versions above everything published, and the hold
    /// started.
    pub fn new(config: TermConfig, now: Instant, env: &impl Surroundings) -> Self {
        let now_ms = env.now_ms();
        let ((pipeline, tier2_seeded), floor, hold) = env.read_state(|s| {
            (
                rebuild(&config.pipeline, s, now, now_ms),
                s.max_version(),
                hold_for(s.registry()),
            )
        });
        let versions = TermVersions::new(config.term, floor);
        if versions.is_exhausted() {
            error!(
                term = config.term,
                "this term has no view version space left; views will not be published"
            );
        }
        info!(
            term = config.term,
            hold_ms = hold.as_millis() as u64,
            "holding published views for fresh evidence"
        );
        let mut t = Self {
            term: config.term,
            config: config.pipeline,
            breaks: config.breaks,
            pipeline,
            versions,
            hold: Hold {
                until: now + hold,
                pending: true,
                held: BTreeMap::new(),
            },
            due: Due {
                counts: now,
                leases: now,
                reassign: now,
                observed: now + OBSERVED_EVERY,
                remote: now,
            },
            wall: (now, now_ms),
            reassign: Reassign::All,
            probers: Vec::new(),
            denials: DenialDigest::default(),
            leases: Leases::default(),
            remote_fed: BTreeMap::new(),
            tier2_seeded,
            failover_in_flight: BTreeSet::new(),
            exhausted: None,
            commands: Vec::new(),
        };
        t.drain(now);
        t
    }

    /// An admitted sample (the shell checked identity and assignment). A refusal by the
    /// evaluator changed nothing.
    pub fn handle_sample(&mut self, now: Instant, sample: Sample) -> Result<(), EvaluatorError> {
        self.handle_samples(now, [sample]).pop().map_or(Ok(()), Err)
    }

    /// Admitted samples that arrived together, assembled once (see
    /// [`RegionPipeline::handle_samples`]); returns the evaluator's refusals.
    pub fn handle_samples(
        &mut self,
        now: Instant,
        samples: impl IntoIterator<Item = Sample>,
    ) -> Vec<EvaluatorError> {
        let refused = self.pipeline.handle_samples(now, samples);
        self.drain(now);
        refused
    }

    /// A sample refused at ingest: folded into one audit record per reporter and reason
    /// per [`COUNTS_EVERY`].
    pub fn handle_denial(&mut self, denial: Denial) {
        self.denials.handle_denial(denial);
    }

    /// The publisher's report of delivery pressure.
    pub fn handle_pressure(&mut self, now: Instant, saturated: bool) {
        self.pipeline.handle_pressure(now, saturated);
        self.drain(now);
    }

    /// A registry command committed and applied (`state` already includes it).
    pub fn handle_applied(&mut self, now: Instant, applied: &Applied, env: &impl Surroundings) {
        self.handle_applied_all(now, std::iter::once(applied), env);
    }

    /// Every command a run of entries applied (a `batch` carries many), followed in order
    /// under one read of the state; the pipeline pumps and the outputs drain once, after
    /// the last, rather than once per command. None is nothing to do.
    pub fn handle_applied_all<'a>(
        &mut self,
        now: Instant,
        applied: impl IntoIterator<Item = &'a Applied>,
        env: &impl Surroundings,
    ) {
        let applied: Vec<&Applied> = applied.into_iter().collect();
        if applied.is_empty() {
            return;
        }
        // Only the commands are read under the state's lock; assembling what they changed
        // happens after it is released, so the state machine is never held up by it.
        let pipeline = &mut self.pipeline;
        env.read_state(|s| pipeline.follow_applied(now, applied.iter().copied(), s.registry()));
        self.pipeline.settle(now);
        for applied in applied {
            self.follow(applied);
        }
        self.drain(now);
    }

    /// What a command means for the probers.
    fn follow(&mut self, applied: &Applied) {
        // A contract change is a change of what the probers check (kind, path,
        // interval): hand them the new targets at once, not at the next reassignment.
        if matches!(
            applied,
            Applied::AssignmentSet | Applied::ServicePut | Applied::ServiceRemoved { .. }
        ) {
            self.commands.push(LeaderCommand::RefreshTargets);
        }
        // A contract that gains or loses its probe changes which instances are targets; a
        // new or changed instance changes only its own. A retired one takes its entry with
        // it when applied.
        match applied {
            Applied::Registered { instance, .. } | Applied::Observed { instance, .. } => {
                self.reassign.instance(instance);
            }
            Applied::ServicePut | Applied::ServiceRemoved { .. } => self.reassign = Reassign::All,
            _ => {}
        }
    }

    /// The leader fell behind the log or a snapshot was installed: rebuild computed state
    /// from the replicated state, and feed every peer region again.
    pub fn handle_rebuild(&mut self, now: Instant, env: &impl Surroundings) {
        warn!(
            term = self.term,
            "rebuilding computed state from the replicated state"
        );
        let now_ms = env.now_ms();
        self.wall = (now, now_ms);
        let config = &self.config;
        (self.pipeline, self.tier2_seeded) = env.read_state(|s| rebuild(config, s, now, now_ms));
        self.reassign = Reassign::All;
        self.remote_fed.clear();
        self.due.remote = now;
        self.drain(now);
    }

    /// Renewals of registered instances' leases, answered at once with each lease's new
    /// end (unix ms): a lease length from `now` on this term's clock.
    ///
    /// A renewal is kept here and never committed, as Consul's leader keeps session TTLs:
    /// at 60,000 leased instances renewing every third of a 30 s lease, a log entry each
    /// would be 6,000 commands a second that change nothing any member needs. Only the
    /// leader judges expiry, so only the leader needs them; a new term restarts every
    /// lease's clock before it expires any ([`Command::RestartLeases`]), so renewals lost
    /// with a term never retire an instance.
    ///
    /// Refused as [`Command::Renew`] would be: an unknown, retired or unleased instance.
    /// A renewal that comes after its lease ended, while that expiry is being committed,
    /// is answered and the instance still retires: the lease had already ended.
    pub fn handle_renewals(
        &mut self,
        now: Instant,
        instances: &[InstanceId],
        env: &impl Surroundings,
    ) -> Vec<Result<u64, RegistryError>> {
        let now_ms = self.unix_ms(now);
        let lengths: Vec<Result<u64, RegistryError>> = env.read_state(|s| {
            let r = s.registry();
            instances.iter().map(|id| r.renewable(id)).collect()
        });
        instances
            .iter()
            .zip(lengths)
            .map(|(id, length)| {
                let end = now_ms.saturating_add(length?);
                self.leases.renewed.insert(id.clone(), end);
                Ok(end)
            })
            .collect()
    }

    /// Gossip membership changed: probers may have come or gone.
    pub fn handle_membership_changed(&mut self) {
        self.reassign = Reassign::All;
    }

    /// How a [`LeaderCommand::Propose`] ended.
    pub fn handle_written(&mut self, now: Instant, purpose: Purpose, written: Written) {
        match purpose {
            Purpose::RestartLeases => {
                self.leases.in_flight = false;
                if written.committed() {
                    info!(term = self.term, "lease clocks restarted for the new term");
                    self.leases.restarted = true;
                }
            }
            Purpose::ExpireLeases => self.leases.in_flight = false,
            Purpose::Failover {
                region,
                intent,
                reason,
            } => {
                self.failover_in_flight.remove(&region);
                let outcome = if written == Written::Applied {
                    "granted"
                } else {
                    "refused"
                };
                let at_ms = self.unix_ms(now);
                self.audit(AuditEntry {
                    seq: 0,
                    at_ms,
                    kind: AuditKind::Policy,
                    actor: SIGNAL_ACTOR.into(),
                    service: None,
                    instance: None,
                    outcome: outcome.into(),
                    detail: serde_json::json!({"peer_region": region, "intent": intent, "reason": reason}),
                });
            }
            Purpose::Assignment => {
                if !written.committed() {
                    // What it carried is lost: compute the whole assignment again.
                    debug!(?purpose, "leader proposal not committed");
                    self.reassign = Reassign::All;
                }
            }
            Purpose::Observed | Purpose::Progress => {
                if !written.committed() {
                    debug!(?purpose, "leader proposal not committed");
                }
            }
        }
    }

    /// How the hand-over asked for last ended. Ignored unless one is in flight.
    pub fn handle_hand_over(&mut self, now: Instant, outcome: HandOver) {
        let term = self.term;
        let Some(exhausted) = self.exhausted.as_mut().filter(|e| e.in_flight) else {
            return;
        };
        exhausted.in_flight = false;
        let retry = match outcome {
            HandOver::Moved => {
                info!(
                    term,
                    "leadership handed over: the next term numbers views afresh"
                );
                return;
            }
            HandOver::Failed => HAND_OVER_RETRY,
            HandOver::NoOtherVoter => HAND_OVER_ALONE_RETRY,
        };
        exhausted.retry_at = Some(now + retry);
        let alone = outcome == HandOver::NoOtherVoter;
        if alone == exhausted.alone {
            return;
        }
        exhausted.alone = alone;
        self.metric(MetricChange::PublishRefused { refused: alone });
        if alone {
            error!(
                term,
                "no view version left and no other voter to hand leadership to: publishing refused; add a voter or restart this member"
            );
            let at_ms = self.unix_ms(now);
            self.audit(AuditEntry {
                seq: 0,
                at_ms,
                kind: AuditKind::Alarm,
                actor: ACTOR.into(),
                service: None,
                instance: None,
                outcome: "publish_refused".into(),
                detail: serde_json::json!({"term": term, "reason": "versions_exhausted", "hand_over": "no_other_voter"}),
            });
        }
    }

    /// Fire whatever is due at `now`.
    pub fn handle_timeout(&mut self, now: Instant, env: &impl Surroundings) {
        self.wall = (now, env.now_ms());
        self.retry_hand_over(now);
        if self.pipeline.poll_timeout().is_some_and(|t| t <= now) {
            self.pipeline.handle_timeout(now, &mut self.versions);
        }
        self.drain(now);
        if self.due.counts <= now {
            self.due.counts = now + COUNTS_EVERY;
            self.refresh_counts(now, env);
            self.flush_denials(now);
        }
        if self.due.leases <= now {
            self.due.leases = now + LEASE_CHECK_EVERY;
            self.expire_leases(now, env);
        }
        if self.due.reassign <= now {
            self.due.reassign = now + REASSIGN_EVERY;
            match std::mem::take(&mut self.reassign) {
                Reassign::Nothing => {}
                Reassign::All => self.reassign(now, env),
                Reassign::Instances(ids) => self.reassign_instances(now, env, &ids),
            }
        }
        if self.due.observed <= now {
            self.due.observed = now + OBSERVED_EVERY;
            self.snapshot_observed(now);
        }
        if self.due.remote <= now {
            self.due.remote = now + REMOTE_EVERY;
            self.feed_remote(now, env);
            self.follow_signal(now, env);
        }
        self.drain(now);
        if self.hold.pending && now >= self.hold.until {
            self.end_hold(env);
        }
    }

    /// The next instant [`LeaderTerm::handle_timeout`] wants to run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let d = &self.due;
        let hold = self.hold.pending.then_some(self.hold.until);
        let hand_over = self.exhausted.as_ref().and_then(|e| e.retry_at);
        [d.counts, d.leases, d.reassign, d.observed, d.remote]
            .into_iter()
            .chain(self.pipeline.poll_timeout())
            .chain(hold)
            .chain(hand_over)
            .min()
    }

    /// What the shell must do, in order.
    pub fn take_commands(&mut self) -> Vec<LeaderCommand> {
        std::mem::take(&mut self.commands)
    }

    /// The region pipeline, for `explain` and the checks routing controls make before
    /// they are committed.
    pub fn pipeline(&self) -> &RegionPipeline {
        &self.pipeline
    }

    /// The Raft term.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// Whether computed views are still being held.
    pub fn is_holding(&self) -> bool {
        self.hold.pending
    }

    /// Wall time at `now`, from the last reading.
    fn unix_ms(&self, now: Instant) -> u64 {
        let (at, ms) = self.wall;
        let since = u64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(0);
        ms.saturating_add(since)
    }

    fn audit(&mut self, entry: AuditEntry) {
        self.commands.push(LeaderCommand::Audit(entry));
    }

    fn metric(&mut self, change: MetricChange) {
        self.commands.push(LeaderCommand::Metric(change));
    }

    fn propose(&mut self, purpose: Purpose, request: Request) {
        self.commands
            .push(LeaderCommand::Propose { purpose, request });
    }

    fn propose_command(&mut self, now: Instant, purpose: Purpose, command: Command) {
        let at_ms = self.unix_ms(now);
        self.propose(purpose, Request::Registry(Stamped { at_ms, command }));
    }

    /// Turn the pipeline's outputs into commands.
    fn drain(&mut self, now: Instant) {
        let mut releases = Vec::new();
        for output in self.pipeline.take_outputs() {
            match output {
                Output::Release(view) if self.hold.pending => {
                    self.hold.held.insert(view.view.key.clone(), *view);
                }
                Output::Release(view) => releases.push(*view),
                Output::Transition(t) => {
                    let at_ms = self.unix_ms(now);
                    self.audit(transition_record(&t, at_ms));
                }
                Output::Quarantine(q) => {
                    self.metric(MetricChange::Quarantined {
                        service: q.service.clone(),
                    });
                    let at_ms = self.unix_ms(now);
                    self.audit(quarantine_record(&q, at_ms));
                }
                Output::Alarm(effect) => self.alarm(now, effect),
                Output::EvacuationRefused { zone, error } => {
                    warn!(%zone, %error, "committed evacuation intent refused by the assembler");
                    let detail = serde_json::json!({"zone": zone, "error": error.to_string()});
                    self.refused_intent(now, detail);
                }
                Output::RegionFailoverRefused { region, error } => {
                    warn!(peer_region = %region, %error, "committed region failover intent refused by the assembler");
                    let detail =
                        serde_json::json!({"peer_region": region, "error": error.to_string()});
                    self.refused_intent(now, detail);
                }
                Output::Shed(effect) => self.shed(effect),
                Output::ProbeCadence {
                    instance,
                    confirming,
                } => {
                    self.commands.push(LeaderCommand::ProbeCadence {
                        instance,
                        confirming,
                    });
                }
            }
        }
        if !releases.is_empty() {
            self.commands.push(LeaderCommand::Publish(releases));
        }
    }

    fn refused_intent(&mut self, now: Instant, detail: serde_json::Value) {
        let at_ms = self.unix_ms(now);
        self.audit(AuditEntry {
            seq: 0,
            at_ms,
            kind: AuditKind::Policy,
            actor: ACTOR.into(),
            service: None,
            instance: None,
            outcome: "refused".into(),
            detail,
        });
    }

    fn shed(&mut self, effect: delta::Effect) {
        match effect {
            delta::Effect::ShedStarted { window } => {
                self.metric(MetricChange::ShedStarted { window });
            }
            delta::Effect::ShedEnded { lasted, deferred } => {
                self.metric(MetricChange::ShedEnded { lasted, deferred });
            }
            delta::Effect::VersionsExhausted { view } => {
                self.metric(MetricChange::VersionsExhausted);
                if self.exhausted.is_none() {
                    error!(term = self.term, view = %view, "this term's version space is exhausted; handing leadership over");
                    self.exhausted = Some(Exhausted {
                        in_flight: true,
                        retry_at: None,
                        alone: false,
                    });
                    self.commands.push(LeaderCommand::HandOver);
                }
            }
            delta::Effect::Release { .. } => {}
        }
    }

    fn alarm(&mut self, now: Instant, effect: assembler::Effect) {
        match effect {
            assembler::Effect::EvacuationProgress {
                zone,
                moved,
                awaiting_completion,
            } => {
                info!(%zone, moved = moved.get(), awaiting_completion, "evacuation step");
                // Committed so that a new leader resumes from where it stands, not from
                // zero; lost only with the leadership.
                let progress = self.pipeline.evacuation_record(&zone);
                let command = Command::EvacuationProgress { zone, progress };
                self.propose_command(now, Purpose::Progress, command);
            }
            assembler::Effect::RegionFailoverProgress {
                region,
                moved,
                awaiting_completion,
            } => {
                info!(peer_region = %region, moved = moved.get(), awaiting_completion, "region failover step");
                self.metric(MetricChange::RegionFailoverMoved {
                    region: region.clone(),
                    moved,
                });
                let progress = self.pipeline.region_failover_record(&region);
                let command = Command::RegionFailoverProgress { region, progress };
                self.propose_command(now, Purpose::Progress, command);
            }
            assembler::Effect::Target(_) => {}
            alarm => self.alarm_record(now, alarm),
        }
    }

    /// An alarm raised or cleared: its metric change and its audit record.
    fn alarm_record(&mut self, now: Instant, effect: assembler::Effect) {
        let (service, outcome, detail) = match effect {
            assembler::Effect::GuardEngaged {
                service,
                zone,
                routed,
                total,
                floor,
            } => {
                self.metric(MetricChange::Guard {
                    service: service.clone(),
                    zone: zone.clone(),
                    engaged: true,
                });
                let detail = serde_json::json!({"zone": zone, "routed": routed, "total": total, "floor_permille": floor.get()});
                (service, "guard_engaged", detail)
            }
            assembler::Effect::GuardReleased { service, zone } => {
                self.metric(MetricChange::Guard {
                    service: service.clone(),
                    zone: zone.clone(),
                    engaged: false,
                });
                (service, "guard_released", serde_json::json!({"zone": zone}))
            }
            assembler::Effect::LastEligibleWithdrawn { service, region } => {
                self.metric(MetricChange::LastEligibleWithdrawn {
                    service: service.clone(),
                    withdrawn: true,
                });
                let detail = serde_json::json!({"region": region});
                (service, "last_eligible_withdrawn", detail)
            }
            assembler::Effect::EligibleRestored { service } => {
                self.metric(MetricChange::LastEligibleWithdrawn {
                    service: service.clone(),
                    withdrawn: false,
                });
                (service, "eligible_restored", serde_json::Value::Null)
            }
            // Progress and targets are handled by `alarm`.
            _ => return,
        };
        let at_ms = self.unix_ms(now);
        self.audit(AuditEntry {
            seq: 0,
            at_ms,
            kind: AuditKind::Alarm,
            actor: ACTOR.into(),
            service: Some(service),
            instance: None,
            outcome: outcome.into(),
            detail,
        });
    }

    /// Ask for another hand-over once the last one's retry is due.
    fn retry_hand_over(&mut self, now: Instant) {
        let Some(e) = self.exhausted.as_mut() else {
            return;
        };
        if e.in_flight || e.retry_at.is_none_or(|at| at > now) {
            return;
        }
        e.retry_at = None;
        e.in_flight = true;
        self.commands.push(LeaderCommand::HandOver);
    }

    /// The hold is over: publish what was computed meanwhile, where it differs from what
    /// clients already hold.
    fn end_hold(&mut self, env: &impl Surroundings) {
        self.hold.pending = false;
        let held = std::mem::take(&mut self.hold.held);
        let changed: Vec<ReleasedView> = env.read_state(|s| {
            held.into_values()
                .filter(|v| {
                    s.published()
                        .get(&v.view.key)
                        .is_none_or(|p| p.view != v.view)
                })
                .collect()
        });
        info!(
            term = self.term,
            changed = changed.len(),
            "hold over: publishing computed views"
        );
        if !changed.is_empty() {
            self.commands.push(LeaderCommand::Publish(changed));
        }
    }

    /// Every service's instances per verdict and per evidence mode, for the metrics.
    fn refresh_counts(&mut self, now: Instant, env: &impl Surroundings) {
        let services: Vec<ServiceName> =
            env.read_state(|s| s.registry().services().map(|(n, _)| n.clone()).collect());
        for service in services {
            let evaluator = self.pipeline.evaluator();
            let counts = every(Verdict::ALL, &evaluator.verdict_counts(&service));
            let modes = every(EvidenceMode::ALL, &evaluator.mode_counts(now, &service));
            self.metric(MetricChange::Verdicts {
                service: service.clone(),
                counts,
            });
            self.metric(MetricChange::EvidenceModes {
                service,
                counts: modes,
            });
        }
    }

    fn flush_denials(&mut self, now: Instant) {
        let at_ms = self.unix_ms(now);
        for entry in self.denials.take_records(at_ms) {
            self.audit(entry);
        }
    }

    /// Proposes lease expiry when one is due — but first, once per term, restarts every
    /// lease's clock: instances could not renew while the region had no leader (Consul
    /// resets session TTLs on failover for the same reason), so an outage of the
    /// authority never retires instances for its own silence. A lease is due when both
    /// its committed end and the end this term's renewals set have passed; the instances
    /// due are named in the proposal, at most [`EXPIRE_BATCH_MAX`] at a time.
    fn expire_leases(&mut self, now: Instant, env: &impl Surroundings) {
        if self.leases.in_flight {
            return;
        }
        let restart = !self.leases.restarted && !self.breaks.expire_without_restart;
        let (purpose, command) = if restart {
            (Purpose::RestartLeases, Command::RestartLeases)
        } else {
            let now_ms = self.unix_ms(now);
            let renewed = &mut self.leases.renewed;
            let mut due = env.read_state(|s| {
                let r = s.registry();
                // What retired since (deregistered, expired) needs no clock any more.
                renewed.retain(|id, _| r.instance(id).is_some());
                r.leases_due(now_ms, renewed)
            });
            if due.is_empty() {
                return;
            }
            due.sort_unstable();
            due.truncate(EXPIRE_BATCH_MAX);
            (
                Purpose::ExpireLeases,
                Command::ExpireInstances { instances: due },
            )
        };
        self.leases.in_flight = true;
        self.propose_command(now, purpose, command);
    }

    /// Recompute prober assignment from connected probers; propose it if it changed.
    fn reassign(&mut self, now: Instant, env: &impl Surroundings) {
        let probers = env.probers();
        let wanted = env.read_state(|s| {
            let r = s.registry();
            let targets = probe_targets(r, r.instances());
            let mut wanted = assign(&targets, &probers, PROBERS_PER_TARGET);
            wanted.retain(|_, p| !p.is_empty());
            let same = targets
                .iter()
                .all(|(id, _)| r.probers(id) == wanted.get(id).map_or(&[][..], Vec::as_slice))
                && r.assignment_len() == wanted.len();
            (!same).then_some(wanted)
        });
        self.probers = probers;
        if let Some(assignment) = wanted {
            self.propose_command(
                now,
                Purpose::Assignment,
                Command::SetAssignment { assignment },
            );
        }
    }

    /// Only these instances came or changed since the last assignment, and the probers
    /// did not: assign them alone, and propose only where that differs from what is held.
    /// A region taking thousands of registrations a second reassigns in proportion to
    /// them, without a scan of every instance under the state lock.
    fn reassign_instances(
        &mut self,
        now: Instant,
        env: &impl Surroundings,
        ids: &BTreeSet<InstanceId>,
    ) {
        let probers = env.probers();
        if probers != self.probers {
            return self.reassign(now, env);
        }
        let patch = env.read_state(|s| {
            let r = s.registry();
            let targets = probe_targets(r, ids.iter().filter_map(|id| r.instance(id)));
            let mut wanted = assign(&targets, &probers, PROBERS_PER_TARGET);
            let mut set = BTreeMap::new();
            let mut remove = BTreeSet::new();
            for id in ids {
                let want = wanted.remove(id).unwrap_or_default();
                if r.probers(id) == want.as_slice() {
                    continue;
                }
                if want.is_empty() {
                    remove.insert(id.clone());
                } else {
                    set.insert(id.clone(), want);
                }
            }
            (!set.is_empty() || !remove.is_empty()).then_some((set, remove))
        });
        if let Some((set, remove)) = patch {
            self.propose_command(
                now,
                Purpose::Assignment,
                Command::PatchAssignment { set, remove },
            );
        }
    }

    /// Commit the observed state: in one entry, or in parts of at most
    /// [`OBSERVED_PER_ENTRY`] instances so no entry grows with the region (a follower is
    /// given one heartbeat interval to take an AppendEntries, however large).
    fn snapshot_observed(&mut self, now: Instant) {
        let instances = self.pipeline.observed(now);
        let at_ms = self.unix_ms(now);
        for request in observed_requests(at_ms, instances, OBSERVED_PER_ENTRY) {
            self.propose(Purpose::Observed, request);
        }
    }

    /// Hand the pipeline every peer-region aggregate that changed since it last saw it
    /// (tier 2). Entries are only ever replaced by newer ones, never dropped: a silent peer
    /// keeps its last endpoints.
    fn feed_remote(&mut self, now: Instant, env: &impl Surroundings) {
        let stale = env.stale_peers();
        let local = &self.config.region;
        let changed: Vec<((RegionName, ServiceName), u64)> = env
            .peer_digest()
            .into_iter()
            .map(|(key, version)| {
                let version = if stale.contains(&key.0) {
                    DROPPED_STALE
                } else {
                    version
                };
                (key, version)
            })
            .filter(|(key, version)| &key.0 != local && self.remote_fed.get(key) != Some(version))
            .collect();
        for ((region, service), version) in changed {
            let endpoints = if version == DROPPED_STALE {
                Vec::new()
            } else {
                env.peer_endpoints(&region, &service)
            };
            debug!(peer_region = %region, %service, version, endpoints = endpoints.len(), "tier 2 updated from a peer region");
            self.pipeline
                .handle_remote(now, &service, region.clone(), endpoints);
            let key = (region, service);
            self.tier2_seeded.remove(&key);
            self.remote_fed.insert(key, version);
        }
        // A seeded entry the replica has not replaced is dropped like the replica's own
        // would be: only when its region is stale and stale regions are dropped.
        let (dropped, kept): (BTreeSet<_>, BTreeSet<_>) = std::mem::take(&mut self.tier2_seeded)
            .into_iter()
            .partition(|(region, _)| stale.contains(region));
        self.tier2_seeded = kept;
        for (region, service) in dropped {
            debug!(peer_region = %region, %service, "tier 2 taken from the published views dropped: the region is stale");
            self.pipeline
                .handle_remote(now, &service, region.clone(), Vec::new());
            self.remote_fed.insert((region, service), DROPPED_STALE);
        }
    }

    /// Level-triggered: make the committed region failovers agree with the front-door
    /// signal. A region whose front door is down and that is not failed over gets an
    /// automatic failover; a region whose front door answers again and whose failover was
    /// automatic gets a shift-back (rate-capped by the assembler). A manual failover is an
    /// operator's and is never touched. One command per region in flight at a time.
    fn follow_signal(&mut self, now: Instant, env: &impl Surroundings) {
        for (region, up) in env.front_doors() {
            if self.failover_in_flight.contains(&region) {
                continue;
            }
            let Some(intent) = signal_intent(self.pipeline.region_failover_record(&region), up)
            else {
                continue;
            };
            if self
                .pipeline
                .check_region_failover(&region, intent)
                .is_err()
            {
                continue;
            }
            let reason = if up {
                "front door answers again"
            } else {
                "front door unreachable"
            };
            info!(peer_region = %region, ?intent, reason, "following the out-of-band region signal");
            self.failover_in_flight.insert(region.clone());
            let command = Command::RegionFailover {
                region: region.clone(),
                intent,
                actor: SIGNAL_ACTOR.into(),
                reason: reason.into(),
            };
            let purpose = Purpose::Failover {
                region,
                intent,
                reason,
            };
            self.propose_command(now, purpose, command);
        }
    }
}

/// What the signal asks for a region, given its committed failover (if any) and whether
/// its front door answers. The signal only ever reverses its own decisions: once an
/// operator has acted on a region, it is theirs until the failover is over.
fn signal_intent(record: Option<RegionFailoverRecord>, up: bool) -> Option<RegionFailoverIntent> {
    let ours = |r: &RegionFailoverRecord| !r.manual && r.actor == SIGNAL_ACTOR;
    match (&record, up) {
        (None, false) => Some(RegionFailoverIntent::Failover { manual: false }),
        (Some(r), true) if ours(r) && !r.back => Some(RegionFailoverIntent::ShiftBack),
        (Some(r), false) if ours(r) && r.back => {
            Some(RegionFailoverIntent::Failover { manual: false })
        }
        _ => None,
    }
}

/// The entries that commit an observed-state snapshot: one `Observed` if it holds at most
/// `per` instances, else `ObservedPart`s of at most `per` each (more only past
/// [`OBSERVED_PARTS_MAX`] parts), in instance order.
pub fn observed_requests(
    at_ms: u64,
    instances: BTreeMap<InstanceId, ObservedInstance>,
    per: usize,
) -> Vec<Request> {
    let per = per.max(1);
    if instances.len() <= per {
        return vec![Request::Observed { at_ms, instances }];
    }
    let parts = instances
        .len()
        .div_ceil(per)
        .min(OBSERVED_PARTS_MAX as usize);
    let per = instances.len().div_ceil(parts);
    let mut rest = instances.into_iter();
    (0..parts)
        .map(|part| Request::ObservedPart {
            at_ms,
            // Both at most OBSERVED_PARTS_MAX, a u32.
            part: u32::try_from(part).unwrap_or(u32::MAX),
            parts: u32::try_from(parts).unwrap_or(u32::MAX),
            instances: rest.by_ref().take(per).collect(),
        })
        .collect()
}

/// Recompute the pipeline from the desired state and resume it from the observed-state
/// snapshot.
fn rebuild(
    config: &PipelineConfig,
    s: &AuthorityState,
    now: Instant,
    now_ms: u64,
) -> (RegionPipeline, BTreeSet<(RegionName, ServiceName)>) {
    let mut p = RegionPipeline::rebuild(config.clone(), s.registry(), now);
    let seeded = seed_tier2(&mut p, s, now);
    if let Some((at_ms, snapshot)) = s.observed() {
        let age = Duration::from_millis(now_ms.saturating_sub(*at_ms));
        info!(
            instances = snapshot.len(),
            age_ms = age.as_millis() as u64,
            "resuming from the observed-state snapshot"
        );
        p.restore_observed(now, snapshot, age);
    }
    p.forget_transitions();
    (p, seeded)
}

/// Give a rebuilt pipeline the tier 2 the region last published, per peer region and
/// service, and return which entries it seeded.
///
/// Peer aggregates live in each member's memory, not in the log: a member that restarted,
/// or was cut off from the peer, may win an election before its replica has learned them
/// again. Without a seed its first views would drop every peer endpoint the region's
/// callers hold — on a leader change alone, which ADR-14 does not allow (losing replication
/// degrades cross-region resolution, it never removes what callers had). The member's own
/// replica replaces a seeded entry as soon as it holds that entry. Weights are as
/// published: during a region failover they already carry its shift, which the seed then
/// applies once more until the replica replaces them.
fn seed_tier2(
    p: &mut RegionPipeline,
    s: &AuthorityState,
    now: Instant,
) -> BTreeSet<(RegionName, ServiceName)> {
    let mut tier2: BTreeMap<(RegionName, ServiceName), BTreeMap<InstanceId, RemoteEndpoint>> =
        BTreeMap::new();
    for (key, released) in s.published() {
        for e in released.view.endpoints.values() {
            if e.tier != Tier::Remote {
                continue;
            }
            let remote = RemoteEndpoint {
                instance: e.instance.clone(),
                address: e.address,
                zone: e.zone.clone(),
                weight: e.weight,
                status: e.status,
                verdict: e.verdict,
            };
            tier2
                .entry((e.region.clone(), key.service.clone()))
                .or_default()
                .insert(e.instance.clone(), remote);
        }
    }
    let seeded = tier2.keys().cloned().collect();
    for ((region, service), endpoints) in tier2 {
        p.handle_remote(now, &service, region, endpoints.into_values().collect());
    }
    seeded
}

/// How long a new leader holds: the longest evidence interval of any contract, at most
/// [`HOLD_MAX`].
pub fn hold_for(registry: &DesiredState) -> Duration {
    registry
        .services()
        .filter_map(|(_, r)| r.contract.clone().validate().ok())
        .flat_map(|c| {
            [
                EvidenceClass::Probe,
                EvidenceClass::SelfReport,
                EvidenceClass::Passive,
            ]
            .into_iter()
            .filter(|class| c.profile.provides(*class))
            .map(|class| c.interval_of(class))
            .collect::<Vec<_>>()
        })
        .max()
        .unwrap_or(Duration::ZERO)
        .min(HOLD_MAX)
}

/// A transition as an audit record: the rule and the eligibility as data.
fn transition_record(t: &TransitionRecord, at_ms: u64) -> AuditEntry {
    let evidence: Vec<serde_json::Value> = t
        .evidence
        .iter()
        .map(|e| {
            serde_json::json!({
                "class": e.class,
                "provided": e.provided,
                "score": e.score.get(),
                "silent": e.silent,
                "age_ms": e.age.map(|a| a.as_millis() as u64),
                "reporter": e.reporter.as_ref().map(ToString::to_string),
                "last": e.last,
            })
        })
        .collect();
    AuditEntry {
        seq: 0,
        at_ms,
        kind: AuditKind::Transition,
        actor: ACTOR.into(),
        service: Some(t.service.clone()),
        instance: Some(t.instance.clone()),
        outcome: t.to.as_str().to_owned(),
        detail: serde_json::json!({
            "from": t.from.map(Verdict::as_str),
            "eligibility": t.eligibility.record(t.at),
            "rule": t.rule,
            "evidence": evidence,
        }),
    }
}

fn quarantine_record(q: &QuarantineEvent, at_ms: u64) -> AuditEntry {
    AuditEntry {
        seq: 0,
        at_ms,
        kind: AuditKind::Transition,
        actor: ACTOR.into(),
        service: Some(q.service.clone()),
        instance: Some(q.instance.clone()),
        outcome: "quarantined".into(),
        detail: serde_json::json!({
            "owner": q.owner,
            "level": q.level,
            "for_ms": q.until.saturating_duration_since(q.at).as_millis() as u64,
        }),
    }
}

/// Refused evidence folded per (reporter, reason) between flushes: whatever rate a
/// reporter sends forged or unassigned samples at, the replicated audit log grows by one
/// record per reporter and reason per flush, carrying the count and an example. The exact
/// count per reason is the `waymark_ingest_samples_refused_total` metric.
#[derive(Debug)]
struct DenialDigest(Fold);

impl Default for DenialDigest {
    fn default() -> Self {
        Self(Fold::new(DENIAL_EXAMPLE_LEN_MAX))
    }
}

impl DenialDigest {
    fn handle_denial(&mut self, denial: Denial) {
        self.0.add(
            denial.reporter.to_string(),
            denial.reason,
            denial.instance,
            None,
        );
    }

    fn take_records(&mut self, at_ms: u64) -> Vec<AuditEntry> {
        let (folded, overflow) = self.0.drain();
        let mut records: Vec<AuditEntry> = folded
            .into_iter()
            .map(|((actor, reason), f)| AuditEntry {
                seq: 0,
                at_ms,
                kind: AuditKind::Denial,
                actor,
                service: None,
                instance: f.example.parse::<InstanceId>().ok(),
                outcome: "refused".into(),
                detail: serde_json::json!({
                    "reason": reason,
                    "what": "evidence",
                    "count": f.count,
                    "example": f.example,
                }),
            })
            .collect();
        if overflow > 0 {
            records.push(AuditEntry {
                seq: 0,
                at_ms,
                kind: AuditKind::Denial,
                actor: ACTOR.into(),
                service: None,
                instance: None,
                outcome: "refused".into(),
                detail: serde_json::json!({
                    "what": "evidence",
                    "count": overflow,
                    "reason": "more reporters and reasons than one record each",
                }),
            });
        }
        records
    }
}

#[cfg(test)]
mod props;
/// `counts` for every key of `all`, in its order, zero where absent.
fn every<K: Ord + Copy, const N: usize>(all: [K; N], counts: &BTreeMap<K, usize>) -> Vec<(K, u64)> {
    all.into_iter()
        .map(|k| {
            let n = counts.get(&k).copied().unwrap_or(0);
            (k, u64::try_from(n).unwrap_or(u64::MAX))
        })
        .collect()
}

#[cfg(test)]
mod tests;
