//! Deterministic simulation (tier B) of a whole region: authority members and node agents
//! on virtual time, over a seeded network, through crashes, restarts and partitions.
//!
//! What runs is the product's own code: every member holds the replicated
//! [`AuthorityState`] and applies the committed log with its `apply`; the leader runs a
//! real [`LeaderTerm`] (registry, evaluator, assembler, delta queues) and its commands
//! are what gets proposed; every member's xDS tier is the real [`SnapshotBuilder`] and
//! each subscription the real Delta protocol state ([`DeltaState`]); evidence passes the
//! real ingest check; a restarted member answers only through the real [`ReplayGate`].
//! What is modelled: consensus (an entry commits when the leader reaches a majority; a
//! new leader is an up-to-date member that reaches one, after an election timeout —
//! openraft itself is exercised by the real-process tests and drills), the network
//! (per-link delay, sample loss, stream breaks, isolation) and the instances' truth.
//!
//! Invariants, checked as the run goes:
//! - no acknowledged write is lost: at the end every caught-up member's state equals a
//!   replay of the committed log, and every acknowledged registration is in it;
//! - no subscriber sees a view's version go backwards, or is told a view it holds was
//!   removed;
//! - a dead instance leaves every up-to-date subscriber's view within the hard-failure
//!   budget (10 s) of the region having a leader and the subscriber being current;
//! - silence never withdraws; no zone is published below its floor undeclared;
//! - a new leader publishes nothing before its hold ends;
//! - a registered instance whose node agent kept renewing is never retired;
//! - federation (`federation.rs`: the real anti-entropy sessions to one peer region, one
//!   link per member, cut off for a while): no member goes back to an older version of a
//!   peer's entry, no two members send different contents under one version, and a silent
//!   peer's endpoints stay in the published views (ADR-14).
//!
//! The seed and every parameter are printed first; the same seed gives the same trace.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use waymark_core::assembler::RemoteEndpoint;
use waymark_core::contract::HealthContract;
use waymark_core::defaults as d;
use waymark_core::delta::DeltaConfig;
use waymark_core::evaluator::EvaluatorConfig;
use waymark_core::model::{
    Address, Health, Instance, InstanceId, Locality, NodeName, Observation, Origin, RegionName,
    Reporter, Sample, ServiceName, ZoneName,
};
use waymark_core::units::Weight;
use waymark_core::view::{ReleasedView, ViewKey};
use waymark_registry::batch::{GroupCommit, GroupCommitConfig};
use waymark_registry::ingest::{Denial, admit};
use waymark_registry::machine::{
    AuditEntry, AuthorityState, ReplayGate, Request, Response, published_views, registry_applied,
};
use waymark_registry::pipeline::PipelineConfig;
use waymark_registry::release::{Release, ReleaseEncoder};
use waymark_registry::state::{Applied, Command, Registration, RetireCause, Stamped};
use waymark_registry::term::{
    LeaderCommand, LeaderTerm, Purpose, Surroundings, TermBreaks, TermConfig, Written, hold_for,
};
use waymark_xds::protocol::DeltaState;
use waymark_xds::snapshot::{Snapshot, SnapshotBuilder};
use waymark_xds::translate::TYPE_ENDPOINT;

use super::federation::Federation;
use crate::rng::SplitMix64;

/// One step of virtual time.
pub const TICK: Duration = Duration::from_millis(50);
/// Committed entries a member applies per tick while it catches up (a restarted member
/// re-applying its log takes its start-up time, then `log / REPLAY_PER_TICK` ticks).
pub const REPLAY_PER_TICK: usize = 40;
/// How long a restarted member waits for its log before serving what it has.
const REPLAY_WAIT: Duration = Duration::from_secs(60);
/// Lease of a registered instance, and how often its node agent renews it.
const LEASE_MS: u64 = 30_000;
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// Unix ms at the start of the run (wall time, as data).
const START_MS: u64 = 1_800_000_000_000;

/// Fixes the run reverts, to show that it catches the bugs they fixed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimBreaks {
    /// A restarted member's xDS tier answers before it has re-applied its log.
    pub serve_before_replay: bool,
    /// The leader expires leases without restarting their clocks after an election.
    pub expire_without_restart: bool,
    /// The tier compares a reconnecting client's versions with the views it holds only,
    /// not with the highest version it ever held, as before the fix: a member that has
    /// applied nothing yet tells the client that its views were removed.
    pub remove_when_behind: bool,
    /// The leader drops a stale peer region's endpoints from tier 2 (the
    /// `drop_stale_peers` break of the `region-partition` drill), which ADR-14 forbids.
    pub drop_stale_peers: bool,
}

/// The region's size and the faults' rates.
#[derive(Debug, Clone, Copy)]
pub struct RegionSimConfig {
    /// Everything derives from it.
    pub seed: u64,
    /// Authority members.
    pub members: usize,
    /// Zones.
    pub zones: usize,
    /// Node agents per zone (each probes and subscribes; the first also registers).
    pub agents_per_zone: usize,
    /// Services.
    pub services: usize,
    /// Orchestrated instances per service, spread over the zones.
    pub per_service: usize,
    /// Leased instances each zone's first agent registers (of the first service).
    pub registered_per_zone: usize,
    /// Simulated seconds.
    pub seconds: u64,
    /// Longest one-way delay of a message, ms (each is 1..=this).
    pub delay_ms_max: u64,
    /// Chance a sample is lost, permille.
    pub loss_permille: u64,
    /// Chance per second that a subscription's stream breaks, permille.
    pub break_permille: u64,
    /// Chance per member per second that it crashes (down 2–10 s, then restarts).
    pub crash_permille: u64,
    /// Chance per member per second that it is isolated from every other node (3–12 s).
    pub partition_permille: u64,
    /// Chance per instance per second that it dies (for good).
    pub death_permille: u64,
    /// Chance per instance per second that nobody observes it any more (20–60 s).
    pub silence_permille: u64,
    /// Every member down at this second, for this many seconds.
    pub outage: Option<(u64, u64)>,
    /// Members crashed one after another, from this second, each this many seconds apart.
    pub rolling_restart: Option<(u64, u64)>,
    /// At this second this member is killed and loses its disk; it comes back empty and
    /// catches up from the leader.
    pub wipe: Option<(u64, usize)>,
    /// The peer region unreachable from every member from this second, for this many
    /// seconds (a region partition: its entries go stale and must stay routed).
    pub peer_cut: Option<(u64, u64)>,
    /// Reverted fixes.
    pub breaks: SimBreaks,
}

impl RegionSimConfig {
    /// Prototype size: what the test command runs for a few seeds.
    pub fn prototype(seed: u64) -> Self {
        Self {
            seed,
            members: 3,
            zones: 3,
            agents_per_zone: 2,
            services: 4,
            per_service: 6,
            registered_per_zone: 2,
            seconds: 180,
            delay_ms_max: 40,
            loss_permille: 20,
            break_permille: 10,
            crash_permille: 4,
            partition_permille: 3,
            death_permille: 1,
            silence_permille: 1,
            outage: None,
            rolling_restart: None,
            wipe: None,
            peer_cut: Some((60, 20)),
            breaks: SimBreaks::default(),
        }
    }

    /// The reference estate's shape, on demand (`WAYMARK_SIM_SIZE=reference`): many
    /// services and subscribers, one region.
    pub fn reference(seed: u64) -> Self {
        Self {
            services: 450,
            per_service: 12,
            zones: 3,
            agents_per_zone: 20,
            registered_per_zone: 20,
            seconds: 300,
            ..Self::prototype(seed)
        }
    }
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Milliseconds into the run.
    pub at_ms: u64,
    /// What broke.
    pub what: String,
}

/// What a run did and saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionSimReport {
    /// Elections won.
    pub elections: usize,
    /// Member crashes.
    pub crashes: usize,
    /// Member isolations.
    pub partitions: usize,
    /// Entries committed.
    pub committed: usize,
    /// View versions delivered to subscribers.
    pub delivered: usize,
    /// Instances that died.
    pub deaths: usize,
    /// Batches of a peer region's entries the members received.
    pub peer_batches: usize,
    /// Services the published views routed to the peer region at some point.
    pub peer_routed_services: usize,
    /// Lease renewals the leading term accepted (none of them a log entry).
    pub renewals: usize,
    /// Broken invariants; empty on a good run.
    pub violations: Vec<Violation>,
    /// Every event, in order: the whole output a seed must reproduce.
    pub trace: Vec<String>,
}

/// Run one simulation; deterministic for its config.
pub fn run(config: RegionSimConfig) -> RegionSimReport {
    let mut sim = Sim::new(config);
    let ticks = config.seconds * 1000 / TICK.as_millis() as u64;
    for _ in 0..ticks {
        sim.step();
    }
    sim.finish();
    sim.report
}

// === the model ===

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Truth {
    Healthy,
    Dead,
    /// Healthy, unobserved until then.
    Unobserved {
        until: Instant,
    },
}

struct Inst {
    instance: Instance,
    truth: Truth,
    died_at: Option<Instant>,
    /// Went unobserved while every published view routed to it.
    silenced_routed: bool,
}

struct Member {
    up: bool,
    restart_at: Option<Instant>,
    isolated_until: Option<Instant>,
    /// Committed entries this member holds on disk (a prefix of the committed log).
    durable: usize,
    /// Entries applied to `state`.
    applied: usize,
    /// A restarted member starts re-applying its log only once its store is open and
    /// its Raft core runs; until then its state is empty.
    replay_from: Instant,
    state: AuthorityState,
    builder: SnapshotBuilder,
    snapshot: Snapshot,
    /// Bumped whenever `snapshot` is rebuilt, so unchanged tiers send nothing.
    epoch: u64,
    gate: ReplayGate,
    term: Option<LeaderTerm>,
    /// What this member, leading, knows the log holds per view: its releases go as
    /// patches against it, as the authority's publisher sends them.
    encoder: ReleaseEncoder,
}

struct Agent {
    name: NodeName,
    zone: ZoneName,
    /// The member whose xDS tier it subscribes to, the stream's protocol state, and the
    /// member's snapshot epoch it last answered from.
    stream: Option<(usize, DeltaState, Option<u64>)>,
    reconnect_at: Instant,
    /// Responses in flight to it, in order, with when they arrive.
    inbox: VecDeque<(Instant, Delivery)>,
    /// Versions and views it holds, by service.
    held: BTreeMap<String, (u64, ReleasedView)>,
    /// Since when it has been current: subscribed to a member that applied everything.
    current_since: Option<Instant>,
    registrar: bool,
    /// Leased instances it registered (acknowledged) and renews.
    registered: Vec<InstanceId>,
    /// When each of those registrations was acknowledged.
    acknowledged: BTreeMap<InstanceId, Instant>,
    next_renew: Instant,
    /// Registrations proposed and not yet answered.
    register_in_flight: usize,
    /// Registration attempts so far: each takes its own address.
    register_attempts: usize,
}

struct Delivery {
    from: usize,
    resources: Vec<(String, String)>,
    removed: Vec<String>,
}

/// Why a proposal is waiting, so its outcome reaches the right place.
#[derive(Debug, Clone)]
enum Waiting {
    Leader(Purpose),
    /// Releases of these views, each with whether it went as a patch.
    Publish(Vec<(ReleasedView, bool)>),
    Audit,
    Register {
        agent: usize,
    },
    /// Node agents' commands proposed together by the API's group commit, each caller's
    /// own wait in order.
    Api(Vec<Waiting>),
}

struct Pending {
    term: u64,
    commit_at: Instant,
    request: Request,
    waiting: Waiting,
}

struct Sim {
    c: RegionSimConfig,
    rng: SplitMix64,
    start: Instant,
    now: Instant,
    zones: Vec<ZoneName>,
    insts: Vec<Inst>,
    members: Vec<Member>,
    agents: Vec<Agent>,
    /// The committed log, and the state it replays to (what every member converges on).
    committed: Vec<Request>,
    truth: AuthorityState,
    raft_term: u64,
    leader: Option<usize>,
    led_since: Option<Instant>,
    /// When the current leader's hold ends.
    hold_until: Option<Instant>,
    election_at: Instant,
    pending: VecDeque<Pending>,
    /// The API's group commit: node agents' commands wait here while entries are in
    /// flight and go together, as the real API's do (`agent/src/authority/commit.rs`).
    api: GroupCommit<(Stamped, Waiting)>,
    /// Samples in flight to a member.
    samples: VecDeque<(Instant, usize, Sample)>,
    probers: Vec<(NodeName, ZoneName)>,
    fed: Federation,
    report: RegionSimReport,
}

impl Sim {
    fn new(c: RegionSimConfig) -> Self {
        #[allow(clippy::disallowed_methods)] // the only clock read: every later time is an offset
        let start = Instant::now();
        let zones: Vec<ZoneName> = (0..c.zones)
            .map(|z| ZoneName::try_new(format!("z{z}")).expect("valid"))
            .collect();
        let mut sim = Self {
            c,
            rng: SplitMix64::new(c.seed),
            start,
            now: start,
            insts: Vec::new(),
            members: (0..c.members).map(|_| Member::new(start)).collect(),
            agents: Vec::new(),
            committed: Vec::new(),
            truth: AuthorityState::default(),
            raft_term: 0,
            leader: None,
            led_since: None,
            hold_until: None,
            election_at: start,
            pending: VecDeque::new(),
            api: GroupCommit::new(GroupCommitConfig::default()),
            samples: VecDeque::new(),
            probers: Vec::new(),
            fed: Federation::new(c.members, region()),
            report: RegionSimReport::default(),
            zones,
        };
        for (z, zone) in sim.zones.clone().into_iter().enumerate() {
            for a in 0..c.agents_per_zone {
                sim.agents.push(Agent {
                    name: node(&format!("n{z}-{a}")),
                    zone: zone.clone(),
                    stream: None,
                    reconnect_at: start,
                    inbox: VecDeque::new(),
                    held: BTreeMap::new(),
                    current_since: None,
                    registrar: a == 0 && c.registered_per_zone > 0,
                    registered: Vec::new(),
                    acknowledged: BTreeMap::new(),
                    next_renew: start,
                    register_in_flight: 0,
                    register_attempts: 0,
                });
            }
        }
        sim.seed_region();
        sim.trace(format!("SEED={} {c:?}", c.seed));
        sim
    }

    /// The desired state every member starts from: services and orchestrated instances,
    /// committed as the log's first entries.
    fn seed_region(&mut self) {
        let mut commands = Vec::new();
        for s in 0..self.c.services {
            let service = service(s);
            commands.push(Command::PutService {
                service: service.clone(),
                owner: "team".into(),
                contract: HealthContract::default(),
            });
            for i in 0..self.c.per_service {
                let zone = self.zones[i % self.zones.len()].clone();
                let instance = Instance {
                    id: InstanceId::try_new(format!("{service}-{i}")).expect("valid"),
                    service: service.clone(),
                    locality: Locality {
                        region: region(),
                        zone,
                        node: node("host"),
                    },
                    address: address(s, i),
                    origin: Origin::Orchestrator,
                    weight: Weight::DEFAULT,
                    tags: BTreeSet::new(),
                    metadata: BTreeMap::new(),
                };
                commands.push(Command::Observe {
                    instance: instance.clone(),
                    draining: false,
                });
                self.insts.push(Inst {
                    instance,
                    truth: Truth::Healthy,
                    died_at: None,
                    silenced_routed: false,
                });
            }
        }
        for command in commands {
            self.commit(Request::Registry(Stamped {
                at_ms: START_MS,
                command,
            }));
        }
        for m in &mut self.members {
            m.durable = self.committed.len();
        }
    }

    fn at_ms(&self) -> u64 {
        u64::try_from((self.now - self.start).as_millis()).unwrap_or(u64::MAX)
    }

    fn now_ms(&self) -> u64 {
        START_MS + self.at_ms()
    }

    fn trace(&mut self, line: String) {
        let at = self.at_ms();
        self.report.trace.push(format!("{at:>8} {line}"));
    }

    fn violate(&mut self, what: String) {
        let at_ms = self.at_ms();
        self.trace(format!("VIOLATION {what}"));
        self.report.violations.push(Violation { at_ms, what });
    }

    fn delay(&mut self) -> Duration {
        Duration::from_millis(1 + self.rng.below(self.c.delay_ms_max.max(1)))
    }

    fn connected(&self, a: usize, b: usize) -> bool {
        self.member_reachable(a) && self.member_reachable(b)
    }

    fn member_reachable(&self, m: usize) -> bool {
        let m = &self.members[m];
        m.up && m.isolated_until.is_none()
    }

    fn majority(&self) -> usize {
        self.members.len() / 2 + 1
    }

    fn reachable_members(&self) -> usize {
        (0..self.members.len())
            .filter(|m| self.member_reachable(*m))
            .count()
    }

    // === one tick ===

    fn step(&mut self) {
        self.now += TICK;
        let second_boundary = self.at_ms().is_multiple_of(1000);
        if second_boundary {
            self.faults();
            self.instances();
        }
        self.membership();
        self.consensus();
        self.replicate();
        self.deliver_samples();
        self.federate(second_boundary);
        self.lead();
        self.serve();
        self.agents_step(second_boundary);
        self.check();
    }

    /// Member crashes, restarts and isolations, from the rates and the schedule.
    fn faults(&mut self) {
        let second = self.at_ms() / 1000;
        for m in 0..self.members.len() {
            if let Some(at) = self.members[m].restart_at
                && self.now >= at
            {
                self.restart(m);
            }
            if let Some(until) = self.members[m].isolated_until
                && self.now >= until
            {
                self.members[m].isolated_until = None;
                self.trace(format!("heal m{m}"));
            }
        }
        let scheduled: Vec<(usize, u64)> = match (self.c.outage, self.c.rolling_restart) {
            (Some((at, len)), _) if at == second => {
                (0..self.members.len()).map(|m| (m, len)).collect()
            }
            (_, Some((from, apart))) if second >= from && (second - from).is_multiple_of(apart) => {
                let m = usize::try_from((second - from) / apart).unwrap_or(usize::MAX);
                if m < self.members.len() {
                    vec![(m, 3)]
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        };
        for (m, len) in scheduled {
            self.crash(m, Duration::from_secs(len));
        }
        if let Some((at, m)) = self.c.wipe
            && at == second
            && m < self.members.len()
        {
            self.crash(m, Duration::from_secs(2));
            self.members[m].durable = 0;
            self.trace(format!("wipe m{m}"));
        }
        for m in 0..self.members.len() {
            if !self.members[m].up {
                continue;
            }
            if self.rng.chance(self.c.crash_permille) {
                let down = Duration::from_secs(2 + self.rng.below(9));
                self.crash(m, down);
            } else if self.members[m].isolated_until.is_none()
                && self.rng.chance(self.c.partition_permille)
            {
                let len = Duration::from_secs(3 + self.rng.below(10));
                self.members[m].isolated_until = Some(self.now + len);
                self.report.partitions += 1;
                self.trace(format!("isolate m{m} for {}s", len.as_secs()));
            }
        }
    }

    fn crash(&mut self, m: usize, down: Duration) {
        let member = &mut self.members[m];
        if !member.up {
            return;
        }
        member.up = false;
        member.term = None;
        self.fed.crashed(m);
        member.restart_at = Some(self.now + down);
        self.report.crashes += 1;
        self.trace(format!("crash m{m} for {}s", down.as_secs()));
    }

    /// Back with its disk: its log, not its applied state (the state machine's last
    /// snapshot is empty here), behind the replay gate.
    fn restart(&mut self, m: usize) {
        let now = self.now;
        let startup = Duration::from_millis(500 + self.rng.below(2500));
        let member = &mut self.members[m];
        member.up = true;
        member.restart_at = None;
        member.isolated_until = None;
        member.state = AuthorityState::default();
        member.applied = 0;
        member.replay_from = now + startup;
        member.builder = SnapshotBuilder::new();
        member.snapshot = Snapshot::default();
        member.epoch += 1;
        let known = u64::try_from(member.durable).ok().filter(|d| *d > 0);
        member.gate = ReplayGate::new(known, now, REPLAY_WAIT);
        self.trace(format!(
            "restart m{m} replaying {}",
            self.members[m].durable
        ));
    }

    fn instances(&mut self) {
        for i in 0..self.insts.len() {
            match self.insts[i].truth {
                Truth::Dead => {}
                Truth::Unobserved { until } if self.now >= until => {
                    self.insts[i].truth = Truth::Healthy;
                    self.insts[i].silenced_routed = false;
                }
                Truth::Unobserved { .. } => {}
                Truth::Healthy => {
                    if self.rng.chance(self.c.death_permille) {
                        self.insts[i].truth = Truth::Dead;
                        self.insts[i].died_at = Some(self.now);
                        self.report.deaths += 1;
                        let id = self.insts[i].instance.id.clone();
                        self.trace(format!("death {id}"));
                    } else if self.rng.chance(self.c.silence_permille) {
                        let len = Duration::from_secs(20 + self.rng.below(41));
                        let routed = self.routed_everywhere(&self.insts[i].instance);
                        self.insts[i].truth = Truth::Unobserved {
                            until: self.now + len,
                        };
                        self.insts[i].silenced_routed = routed;
                    }
                }
            }
        }
    }

    fn routed_everywhere(&self, instance: &Instance) -> bool {
        let views: Vec<_> = self
            .truth
            .published()
            .values()
            .filter(|v| v.view.key.service == instance.service)
            .collect();
        !views.is_empty() && views.iter().all(|v| v.view.routes_to(&instance.id))
    }

    /// Probers are the agents the leader can reach.
    fn membership(&mut self) {
        let probers: Vec<(NodeName, ZoneName)> = match self.leader {
            Some(l) if self.member_reachable(l) => self
                .agents
                .iter()
                .map(|a| (a.name.clone(), a.zone.clone()))
                .collect(),
            _ => Vec::new(),
        };
        if probers != self.probers {
            self.probers = probers;
            if let Some(term) = self.leader.and_then(|l| self.members[l].term.as_mut()) {
                term.handle_membership_changed();
            }
        }
    }

    // === consensus, modelled ===

    fn consensus(&mut self) {
        if let Some(l) = self.leader {
            let keeps = self.member_reachable(l) && self.reachable_members() >= self.majority();
            if !keeps {
                self.step_down(l, "lost its majority");
            }
        }
        if self.leader.is_none() && self.now >= self.election_at {
            self.elect();
        }
        self.commit_pending();
    }

    fn step_down(&mut self, l: usize, why: &str) {
        self.members[l].term = None;
        self.leader = None;
        self.led_since = None;
        self.hold_until = None;
        self.election_at = self.now + Duration::from_millis(1000 + self.rng.below(1000));
        self.trace(format!("leader m{l} steps down: {why}"));
        let failed: Vec<Pending> = self.pending.drain(..).collect();
        for p in failed {
            self.resolve(p, None);
        }
    }

    fn elect(&mut self) {
        let candidates: Vec<usize> = (0..self.members.len())
            .filter(|m| {
                self.member_reachable(*m) && self.members[*m].durable == self.committed.len()
            })
            .collect();
        if candidates.is_empty() || self.reachable_members() < self.majority() {
            self.election_at = self.now + Duration::from_millis(500 + self.rng.below(500));
            return;
        }
        let pick = usize::try_from(self.rng.below(candidates.len() as u64)).unwrap_or(0);
        let l = candidates[pick];
        self.raft_term += 1;
        // A leader has applied everything committed before it leads.
        while self.members[l].applied < self.committed.len() {
            self.apply_next(l);
        }
        let config = TermConfig {
            term: self.raft_term,
            pipeline: PipelineConfig {
                region: region(),
                zones: self.zones.iter().cloned().collect(),
                evaluator: EvaluatorConfig::default(),
                delta: DeltaConfig::default(),
                fraction_guard: true,
            },
            breaks: TermBreaks {
                expire_without_restart: self.c.breaks.expire_without_restart,
            },
        };
        let now_ms = self.now_ms();
        let hold = hold_for(self.members[l].state.registry());
        let peers = Peers::new(&self.fed, l, self.now, &self.c.breaks);
        let env = Env::new(&self.members[l].state, &self.probers, now_ms, peers);
        let term = LeaderTerm::new(config, self.now, &env);
        self.members[l].term = Some(term);
        self.members[l].encoder = ReleaseEncoder::new();
        self.leader = Some(l);
        self.led_since = Some(self.now);
        self.hold_until = Some(self.now + hold);
        self.report.elections += 1;
        self.trace(format!("elect m{l} term {}", self.raft_term));
    }

    fn propose(&mut self, request: Request, waiting: Waiting) {
        let commit_at = self.now + self.delay();
        self.pending.push_back(Pending {
            term: self.raft_term,
            commit_at,
            request,
            waiting,
        });
    }

    /// A node agent's command through the API: queued for group commit, proposed when the
    /// entries in flight leave room.
    fn submit(&mut self, stamped: Stamped, waiting: Waiting) {
        // The sim does not size commands; the count bound is what batches here.
        if let Err((_, (_, waiting))) = self.api.submit((stamped, waiting), 0) {
            self.resolve_waiting(waiting, self.raft_term, None);
        }
        self.flush_api();
    }

    fn flush_api(&mut self) {
        while let Some(batch) = self.api.next_batch() {
            let (mut commands, waits): (Vec<Stamped>, Vec<Waiting>) = batch.into_iter().unzip();
            let request = match commands.len() {
                1 => Request::Registry(commands.remove(0)),
                _ => Request::Batch { commands },
            };
            self.propose(request, Waiting::Api(waits));
        }
    }

    fn commit_pending(&mut self) {
        while self
            .pending
            .front()
            .is_some_and(|p| p.commit_at <= self.now)
        {
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            let ok = self.leader.is_some() && p.term == self.raft_term;
            if !ok {
                self.resolve(p, None);
                continue;
            }
            let response = self.commit(p.request.clone());
            self.resolve(p, Some(response));
        }
    }

    /// Append to the committed log; the leader applies it at once.
    fn commit(&mut self, request: Request) -> Response {
        self.report.committed += 1;
        let line = summarise(&request);
        self.committed.push(request.clone());
        let response = self.truth.apply(request);
        self.trace(format!(
            "commit {} {line} -> {}",
            self.committed.len(),
            outcome(&response)
        ));
        self.check_commit(&response);
        if let Some(l) = self.leader {
            self.members[l].durable = self.committed.len();
            while self.members[l].applied < self.committed.len() {
                self.apply_next(l);
            }
        }
        response
    }

    /// A proposal's outcome, to whoever waits for it (`None`: not committed).
    fn resolve(&mut self, p: Pending, response: Option<Response>) {
        self.resolve_waiting(p.waiting, p.term, response);
    }

    fn resolve_waiting(&mut self, waiting: Waiting, proposed: u64, response: Option<Response>) {
        let written = match &response {
            None => Written::Failed,
            Some(Response::Registry { outcome: Err(_) }) => Written::Refused,
            Some(_) => Written::Applied,
        };
        match waiting {
            Waiting::Api(waits) => {
                self.api.finished();
                // Each caller gets its own command's outcome, as if it had been alone.
                let mut outcomes = match response {
                    Some(Response::Batch { outcomes }) if outcomes.len() == waits.len() => {
                        outcomes.into_iter().map(Some).collect()
                    }
                    Some(Response::Registry { outcome }) if waits.len() == 1 => vec![Some(outcome)],
                    _ => vec![None; waits.len()],
                }
                .into_iter();
                for w in waits {
                    let outcome = outcomes.next().flatten();
                    self.resolve_waiting(
                        w,
                        proposed,
                        outcome.map(|outcome| Response::Registry { outcome }),
                    );
                }
                self.flush_api();
            }
            Waiting::Leader(purpose) => {
                let now = self.now;
                if let Some(term) = self.leader.and_then(|l| self.members[l].term.as_mut())
                    && proposed == self.raft_term
                {
                    term.handle_written(now, purpose, written);
                }
            }
            Waiting::Register { agent } => {
                self.agents[agent].register_in_flight =
                    self.agents[agent].register_in_flight.saturating_sub(1);
                if let Some(Response::Registry {
                    outcome: Ok(Applied::Registered { instance, .. }),
                }) = response
                {
                    self.agents[agent]
                        .acknowledged
                        .insert(instance.clone(), self.now);
                    self.agents[agent].registered.push(instance);
                }
            }
            Waiting::Publish(sent) => self.released(proposed, sent, response),
            Waiting::Audit => {}
        }
    }

    /// Propose `views` from leader `l`, each a patch where its encoder knows the base.
    fn propose_releases(&mut self, l: usize, views: Vec<ReleasedView>) {
        let encoder = &self.members[l].encoder;
        let releases: Vec<Release> = views.iter().map(|v| encoder.encode(v)).collect();
        let sent = views
            .into_iter()
            .zip(&releases)
            .map(|(v, r)| (v, matches!(r, Release::Patch(_))))
            .collect();
        self.propose(Request::Release { releases }, Waiting::Publish(sent));
    }

    /// A release's outcome reaches the leader's encoder; a patch the log skipped goes
    /// again whole, as the authority's publisher does.
    fn released(
        &mut self,
        proposed: u64,
        sent: Vec<(ReleasedView, bool)>,
        response: Option<Response>,
    ) {
        let Some(l) = self.leader.filter(|_| proposed == self.raft_term) else {
            return;
        };
        let encoder = &mut self.members[l].encoder;
        let Some(Response::Released { views, .. }) = response else {
            encoder.handle_failed(sent.iter().map(|(v, _)| &v.view.key));
            return;
        };
        let skipped =
            encoder.handle_committed(sent.iter().map(|(v, patch)| (&v.view.key, *patch)), &views);
        let again: Vec<ReleasedView> = sent
            .into_iter()
            .filter(|(v, _)| skipped.contains(&v.view.key))
            .map(|(v, _)| v)
            .collect();
        if !again.is_empty() {
            self.trace(format!("{} skipped patches go again whole", again.len()));
            self.propose_releases(l, again);
        }
    }

    /// Followers that reach the leader receive the log.
    fn replicate(&mut self) {
        let Some(l) = self.leader else {
            return;
        };
        for m in 0..self.members.len() {
            if m != l && self.connected(m, l) {
                self.members[m].durable = self.committed.len();
            }
            if self.members[m].up && self.now >= self.members[m].replay_from {
                for _ in 0..REPLAY_PER_TICK {
                    if self.members[m].applied >= self.members[m].durable {
                        break;
                    }
                    self.apply_next(m);
                }
            }
        }
    }

    fn apply_next(&mut self, m: usize) {
        let index = self.members[m].applied;
        let request = self.committed[index].clone();
        let member = &mut self.members[m];
        let response = member.state.apply(request.clone());
        member.applied += 1;
        let views = published_views(&request, &response);
        if !views.is_empty() {
            let mut changed = false;
            for v in views {
                changed |= member.builder.handle_release(v);
            }
            if changed {
                member.snapshot = member.builder.build();
                member.epoch += 1;
            }
        }
        // The leader's term follows the registry's committed changes.
        if self.leader == Some(m) {
            let now_ms = START_MS + u64::try_from((self.now - self.start).as_millis()).unwrap_or(0);
            let member = &mut self.members[m];
            if let Some(term) = member.term.as_mut() {
                let peers = Peers::new(&self.fed, m, self.now, &self.c.breaks);
                let env = Env::new(&member.state, &self.probers, now_ms, peers);
                term.handle_applied_all(self.now, registry_applied(&request, &response), &env);
            }
        }
    }

    // === evidence ===

    fn deliver_samples(&mut self) {
        while self
            .samples
            .front()
            .is_some_and(|(at, _, _)| *at <= self.now)
        {
            let Some((_, to, sample)) = self.samples.pop_front() else {
                break;
            };
            if self.leader != Some(to) {
                continue;
            }
            let now = self.now;
            let member = &mut self.members[to];
            let Some(term) = member.term.as_mut() else {
                continue;
            };
            match admit(member.state.registry(), &sample) {
                Ok(()) => {
                    let _ = term.handle_sample(now, sample);
                }
                Err(error) => term.handle_denial(Denial {
                    reporter: sample.reporter.clone(),
                    reason: error.label().into(),
                    instance: sample.instance.to_string(),
                }),
            }
        }
    }

    /// Each agent probes what the committed assignment gives it, once a second.
    fn probe(&mut self, a: usize) {
        let Some(l) = self.leader else {
            return;
        };
        if !self.member_reachable(l) {
            return;
        }
        let name = self.agents[a].name.clone();
        let assigned = |id: &InstanceId| self.truth.registry().probers(id).contains(&name);
        let mut out: Vec<(InstanceId, Health)> = self
            .insts
            .iter()
            .filter(|i| assigned(&i.instance.id))
            .filter_map(|i| match i.truth {
                Truth::Healthy => Some((i.instance.id.clone(), Health::Pass)),
                Truth::Dead => Some((i.instance.id.clone(), Health::Refused)),
                Truth::Unobserved { .. } => None,
            })
            .collect();
        // Registered instances are always healthy here.
        out.extend(
            self.truth
                .registry()
                .instances()
                .filter(|r| r.instance.origin == Origin::Registered && assigned(&r.instance.id))
                .map(|r| (r.instance.id.clone(), Health::Pass)),
        );
        for (id, health) in out {
            if self.rng.chance(self.c.loss_permille) {
                continue;
            }
            let at = self.now + self.delay();
            let sample = Sample {
                instance: id,
                reporter: Reporter::Node(name.clone()),
                observation: Observation::Probe {
                    health,
                    detail: None,
                },
            };
            self.samples.push_back((at, l, sample));
        }
    }

    // === federation ===

    /// The peer region publishes, members publish this region's aggregates, and every
    /// member's link runs a tick; the published views keep the peer's endpoints.
    fn federate(&mut self, second_boundary: bool) {
        if second_boundary {
            let services: Vec<ServiceName> = (0..self.c.services).map(service).collect();
            if self.at_ms() <= 1000 {
                for s in &services {
                    self.fed
                        .peer_publishes(&mut self.rng, std::slice::from_ref(s));
                }
            } else if self.rng.chance(300) {
                self.fed.peer_publishes(&mut self.rng, &services);
            }
            for m in 0..self.members.len() {
                if self.members[m].up {
                    self.fed
                        .publish_local(m, self.members[m].state.published().values());
                }
            }
            let broke = self
                .fed
                .check_published(self.now, self.truth.published().values());
            for what in broke {
                self.violate(what);
            }
        }
        let max = self.c.delay_ms_max.max(1);
        let second = self.at_ms() / 1000;
        let cut = self
            .c
            .peer_cut
            .is_some_and(|(from, len)| (from..from + len).contains(&second));
        for m in 0..self.members.len() {
            let up = self.member_reachable(m) && !cut;
            let rng = &mut self.rng;
            let broke = self.fed.step(m, self.now, up, || {
                Duration::from_millis(1 + rng.below(max))
            });
            for what in broke {
                self.violate(what);
            }
        }
        self.report.peer_batches = self.fed.merged;
        self.report.peer_routed_services = self.fed.routed_ever.len();
    }

    // === the leader ===

    fn lead(&mut self) {
        let Some(l) = self.leader else {
            return;
        };
        let now_ms = self.now_ms();
        let end = self.now;
        let commands = {
            let member = &mut self.members[l];
            let Some(term) = member.term.as_mut() else {
                return;
            };
            let peers = Peers::new(&self.fed, l, end, &self.c.breaks);
            let env = Env::new(&member.state, &self.probers, now_ms, peers);
            let mut commands = term.take_commands();
            while let Some(due) = term.poll_timeout().filter(|t| *t <= end) {
                term.handle_timeout(due, &env);
                commands.extend(term.take_commands());
            }
            commands
        };
        let mut audit: Vec<AuditEntry> = Vec::new();
        for command in commands {
            match command {
                LeaderCommand::Publish(views) => {
                    if self.hold_until.is_some_and(|h| self.now < h) {
                        self.violate(format!(
                            "term {} published {} views inside its hold",
                            self.raft_term,
                            views.len()
                        ));
                    }
                    self.propose_releases(l, views);
                }
                LeaderCommand::Audit(entry) => audit.push(entry),
                LeaderCommand::Propose { purpose, request } => {
                    self.propose(request, Waiting::Leader(purpose));
                }
                // The simulated probers report at a fixed cadence; the prober schedule
                // is exercised by the hub's and the agent's own tests.
                LeaderCommand::Metric(_)
                | LeaderCommand::RefreshTargets
                | LeaderCommand::ProbeCadence { .. } => {}
                LeaderCommand::HandOver => {
                    self.step_down(l, "versions exhausted: leadership handed over")
                }
            }
        }
        if !audit.is_empty() {
            self.propose(Request::Audit { entries: audit }, Waiting::Audit);
        }
    }

    // === the xDS tier and the subscribers ===

    /// Each member's tier sends its subscribers what changed, behind the replay gate.
    fn serve(&mut self) {
        for a in 0..self.agents.len() {
            let Some((m, _, _)) = &self.agents[a].stream else {
                continue;
            };
            let m = *m;
            if !self.member_reachable(m) {
                self.agents[a].stream = None;
                self.agents[a].current_since = None;
                self.agents[a].reconnect_at =
                    self.now + Duration::from_millis(200 + self.rng.below(800));
                continue;
            }
            let member = &self.members[m];
            let applied = u64::try_from(member.applied).ok().filter(|a| *a > 0);
            let open = self.c.breaks.serve_before_replay || member.gate.is_open(self.now, applied);
            if !open {
                continue;
            }
            let agent = &mut self.agents[a];
            let Some((_, state, sent)) = agent.stream.as_mut() else {
                continue;
            };
            if *sent == Some(member.epoch) {
                continue;
            }
            *sent = Some(member.epoch);
            let Some(resources) = member.snapshot.resources(TYPE_ENDPOINT, Some(&agent.zone))
            else {
                continue;
            };
            let nonce = member.epoch.to_string();
            // As the real tier does: the snapshot's version rides as the system version.
            let version = if self.c.breaks.remove_when_behind {
                String::new()
            } else {
                member.snapshot.version.to_string()
            };
            let Some(response) = state.next_response(TYPE_ENDPOINT, resources, &version, nonce)
            else {
                continue;
            };
            // What the agent receives is what the wire carries.
            let response = response
                .message()
                .expect("a response the protocol built decodes");
            let delivery = Delivery {
                from: m,
                resources: response
                    .resources
                    .iter()
                    .map(|r| (r.name.clone(), r.version.clone()))
                    .collect(),
                removed: response.removed_resources.clone(),
            };
            let after = self.agents[a].inbox.back().map_or(self.now, |(t, _)| *t);
            let at = (self.now + self.delay()).max(after);
            self.agents[a].inbox.push_back((at, delivery));
        }
    }

    fn agents_step(&mut self, second_boundary: bool) {
        for a in 0..self.agents.len() {
            self.receive(a);
            if self.agents[a].stream.is_none() && self.now >= self.agents[a].reconnect_at {
                self.subscribe(a);
            }
            if second_boundary {
                if self.agents[a].stream.is_some() && self.rng.chance(self.c.break_permille) {
                    self.agents[a].stream = None;
                    self.agents[a].inbox.clear();
                    self.agents[a].current_since = None;
                    self.agents[a].reconnect_at =
                        self.now + Duration::from_millis(100 + self.rng.below(900));
                }
                self.probe(a);
            }
            self.register(a);
            self.track_current(a);
        }
    }

    /// Open a stream to a random reachable member, telling it what this agent holds.
    fn subscribe(&mut self, a: usize) {
        let up: Vec<usize> = (0..self.members.len())
            .filter(|m| self.member_reachable(*m))
            .collect();
        if up.is_empty() {
            self.agents[a].reconnect_at = self.now + Duration::from_secs(1);
            return;
        }
        let m = up[usize::try_from(self.rng.below(up.len() as u64)).unwrap_or(0)];
        let agent = &mut self.agents[a];
        let mut state = DeltaState::default();
        let request = DeltaDiscoveryRequest {
            type_url: TYPE_ENDPOINT.into(),
            initial_resource_versions: agent
                .held
                .iter()
                .map(|(name, (v, _))| (name.clone(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        state.handle_request(&request);
        agent.stream = Some((m, state, None));
        agent.inbox.clear();
    }

    fn receive(&mut self, a: usize) {
        while self.agents[a]
            .inbox
            .front()
            .is_some_and(|(t, _)| *t <= self.now)
        {
            let Some((_, d)) = self.agents[a].inbox.pop_front() else {
                break;
            };
            let zone = self.agents[a].zone.clone();
            for name in &d.removed {
                if self.agents[a].held.contains_key(name) {
                    let who = self.agents[a].name.clone();
                    self.violate(format!(
                        "{who} told by m{} that view {name} it holds was removed",
                        d.from
                    ));
                    self.agents[a].held.remove(name);
                }
            }
            for (name, version) in &d.resources {
                let Ok(version) = version.parse::<u64>() else {
                    continue;
                };
                let held = self.agents[a].held.get(name).map(|(v, _)| *v);
                if held.is_some_and(|h| version < h) {
                    let who = self.agents[a].name.clone();
                    self.violate(format!(
                        "{who} sent {name} version {version} after {}",
                        held.unwrap_or(0)
                    ));
                    continue;
                }
                let Ok(service) = ServiceName::try_new(name.as_str()) else {
                    continue;
                };
                let key = ViewKey {
                    service,
                    zone: zone.clone(),
                };
                // The content that version carries, as the sender's state holds it.
                let Some(view) = self.members[d.from].state.published().get(&key).cloned() else {
                    continue;
                };
                if view.version.0 == version {
                    self.report.delivered += 1;
                    self.agents[a].held.insert(name.clone(), (version, view));
                }
            }
        }
    }

    /// A registrar registers its instances until acknowledged, and renews them.
    fn register(&mut self, a: usize) {
        if !self.agents[a].registrar {
            return;
        }
        let Some(l) = self.leader else {
            return;
        };
        if !self.member_reachable(l) {
            return;
        }
        let missing = self
            .c
            .registered_per_zone
            .saturating_sub(self.agents[a].registered.len());
        // Every missing registration at once, as a node agent with several definitions
        // registers them: they meet in group commit.
        for _ in 0..missing.saturating_sub(self.agents[a].register_in_flight) {
            self.agents[a].register_in_flight += 1;
            // Each attempt its own address: an attempt whose answer was lost may still
            // have committed.
            let i = self.agents[a].register_attempts % 250;
            self.agents[a].register_attempts += 1;
            let z = self
                .zones
                .iter()
                .position(|z| *z == self.agents[a].zone)
                .unwrap_or(0);
            let registration = Registration {
                service: service(0),
                locality: Locality {
                    region: region(),
                    zone: self.agents[a].zone.clone(),
                    node: self.agents[a].name.clone(),
                },
                address: Address {
                    ip: IpAddr::V4(Ipv4Addr::new(
                        10,
                        200,
                        u8::try_from(z).unwrap_or(0),
                        u8::try_from(i + 1).unwrap_or(0),
                    )),
                    port: 9000,
                },
                weight: Weight::DEFAULT,
                tags: BTreeSet::new(),
                metadata: BTreeMap::new(),
                lease_ms: LEASE_MS,
            };
            let stamped = Stamped {
                at_ms: self.now_ms(),
                command: Command::Register(registration),
            };
            self.submit(stamped, Waiting::Register { agent: a });
        }
        if self.now >= self.agents[a].next_renew {
            self.agents[a].next_renew = self.now + RENEW_EVERY;
            // Renewals go to the leader's term and never to the log, as the API sends them.
            let ids: Vec<InstanceId> = self.agents[a].registered.clone();
            let now_ms = self.now_ms();
            let now = self.now;
            let member = &mut self.members[l];
            if let Some(term) = member.term.as_mut() {
                let peers = Peers::new(&self.fed, l, now, &self.c.breaks);
                let env = Env::new(&member.state, &self.probers, now_ms, peers);
                let answers = term.handle_renewals(now, &ids, &env);
                self.report.renewals += answers.iter().filter(|a| a.is_ok()).count();
            }
        }
    }

    fn track_current(&mut self, a: usize) {
        let current = self.agents[a].stream.as_ref().is_some_and(|(m, _, _)| {
            self.leader.is_some_and(|l| self.connected(*m, l))
                && self.members[*m].applied == self.committed.len()
        });
        let agent = &mut self.agents[a];
        match (current, agent.current_since) {
            (true, None) => agent.current_since = Some(self.now),
            (false, Some(_)) => agent.current_since = None,
            _ => {}
        }
    }

    // === invariants ===

    fn check_commit(&mut self, response: &Response) {
        if let Response::Registry {
            outcome: Ok(Applied::Retired { instances }),
        } = response
        {
            for (id, cause) in instances {
                let renewed = self.agents.iter().any(|a| a.registered.contains(id));
                if *cause == RetireCause::LeaseExpired && renewed {
                    self.violate(format!("{id} retired though its node agent kept renewing (the authority's own silence)"));
                }
            }
        }
        if let Some(request) = self.committed.last() {
            let views = published_views(request, response).to_vec();
            for r in views {
                for (z, floor) in &r.view.markers.zone_floor {
                    let declared = r.view.markers.health_disregarded.contains(z);
                    if !declared && r.view.routed_in(z) < *floor as usize {
                        self.violate(format!(
                            "{}: zone {z} routes {} < floor {floor}, undeclared",
                            r.view.key,
                            r.view.routed_in(z)
                        ));
                    }
                }
            }
        }
    }

    fn check(&mut self) {
        let budget = d::HARD_FAILURE_BUDGET_P99;
        let mut late = Vec::new();
        let dead: Vec<(&Inst, Instant)> = self
            .insts
            .iter()
            .filter_map(|i| i.died_at.map(|d| (i, d)))
            .collect();
        for agent in &self.agents {
            let Some(current) = agent.current_since else {
                continue;
            };
            for &(inst, died) in &dead {
                let since = [Some(died), Some(current), self.led_since]
                    .into_iter()
                    .flatten()
                    .max()
                    .unwrap_or(died);
                if self.led_since.is_none() || self.now.saturating_duration_since(since) <= budget {
                    continue;
                }
                let name = inst.instance.service.to_string();
                if agent
                    .held
                    .get(&name)
                    .is_some_and(|(_, v)| v.view.endpoints.contains_key(&inst.instance.id))
                {
                    late.push(format!(
                        "{} still routes to {} dead since {} ms",
                        agent.name,
                        inst.instance.id,
                        (died - self.start).as_millis()
                    ));
                }
            }
        }
        // An acknowledged registration reaches every current subscriber within the
        // admission budget of the region having a leader and the subscriber being current
        // (the leader follows every committed command, batched or alone).
        let admission = d::ADMISSION_BUDGET_P99;
        let mut unseen = Vec::new();
        let acknowledged: Vec<(&InstanceId, Instant)> = self
            .agents
            .iter()
            .flat_map(|a| a.acknowledged.iter().map(|(id, at)| (id, *at)))
            .collect();
        for agent in &self.agents {
            let (Some(current), Some(led)) = (agent.current_since, self.led_since) else {
                continue;
            };
            for &(id, at) in &acknowledged {
                let Some(record) = self.truth.registry().instance(id) else {
                    continue;
                };
                let since = at.max(current).max(led);
                if self.now.saturating_duration_since(since) <= admission {
                    continue;
                }
                let name = record.instance.service.to_string();
                if agent
                    .held
                    .get(&name)
                    .is_some_and(|(_, v)| !v.view.endpoints.contains_key(id))
                {
                    late.push(format!(
                        "{} has not seen {id}, registered at {} ms",
                        agent.name,
                        (at - self.start).as_millis()
                    ));
                    unseen.push(id.clone());
                }
            }
        }
        for inst in &self.insts {
            if inst.silenced_routed && matches!(inst.truth, Truth::Unobserved { .. }) {
                let out = self.truth.published().values().any(|v| {
                    v.view.key.service == inst.instance.service
                        && !v.view.routes_to(&inst.instance.id)
                });
                if out {
                    late.push(format!(
                        "{} withdrawn while merely silent",
                        inst.instance.id
                    ));
                }
            }
        }
        for what in late {
            self.violate(what);
        }
        // Report each unseen registration once.
        for a in &mut self.agents {
            for id in &unseen {
                a.acknowledged.remove(id);
            }
        }
        // Report each dead instance once.
        for inst in &mut self.insts {
            if let Some(died) = inst.died_at
                && self.now.saturating_duration_since(died) > budget * 6
            {
                inst.died_at = None;
            }
        }
    }

    /// At the end: every caught-up member's state is the committed log's replay.
    fn finish(&mut self) {
        for m in 0..self.members.len() {
            if self.members[m].up
                && self.members[m].applied == self.committed.len()
                && self.members[m].state != self.truth
            {
                self.violate(format!(
                    "m{m} applied the whole log and differs from its replay"
                ));
            }
        }
        for a in 0..self.agents.len() {
            for id in self.agents[a].registered.clone() {
                let gone = self.truth.registry().instance(&id).is_none();
                if gone {
                    self.violate(format!(
                        "acknowledged registration {id} is not in the committed state"
                    ));
                }
            }
        }
        let r = &self.report;
        let line = format!(
            "end elections={} crashes={} partitions={} committed={} delivered={} deaths={} violations={}",
            r.elections,
            r.crashes,
            r.partitions,
            r.committed,
            r.delivered,
            r.deaths,
            r.violations.len()
        );
        self.trace(line);
    }
}

impl Member {
    fn new(now: Instant) -> Self {
        Self {
            up: true,
            restart_at: None,
            isolated_until: None,
            durable: 0,
            applied: 0,
            replay_from: now,
            state: AuthorityState::default(),
            builder: SnapshotBuilder::new(),
            snapshot: Snapshot::default(),
            epoch: 0,
            gate: ReplayGate::new(None, now, REPLAY_WAIT),
            term: None,
            encoder: ReleaseEncoder::new(),
        }
    }
}

/// A leader's surroundings: its own state and the connected probers. The simulation has
/// one region, so no peer aggregates and no front doors.
struct Env<'a> {
    state: &'a AuthorityState,
    probers: &'a [(NodeName, ZoneName)],
    now_ms: u64,
    peers: Peers<'a>,
}

/// What the leader's member knows of peer regions.
struct Peers<'a> {
    fed: &'a Federation,
    member: usize,
    now: Instant,
    /// Report stale peers to the core, which then drops their endpoints (a break).
    drop_stale: bool,
}

impl<'a> Peers<'a> {
    fn new(fed: &'a Federation, member: usize, now: Instant, breaks: &SimBreaks) -> Self {
        Self {
            fed,
            member,
            now,
            drop_stale: breaks.drop_stale_peers,
        }
    }
}

impl<'a> Env<'a> {
    fn new(
        state: &'a AuthorityState,
        probers: &'a [(NodeName, ZoneName)],
        now_ms: u64,
        peers: Peers<'a>,
    ) -> Self {
        Self {
            state,
            probers,
            now_ms,
            peers,
        }
    }
}

impl Surroundings for Env<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn read_state<T>(&self, read: impl FnOnce(&AuthorityState) -> T) -> T {
        read(self.state)
    }

    fn probers(&self) -> Vec<(NodeName, ZoneName)> {
        self.probers.to_vec()
    }

    fn peer_digest(&self) -> Vec<((RegionName, ServiceName), u64)> {
        self.peers.fed.digest(self.peers.member)
    }

    fn peer_endpoints(&self, region: &RegionName, service: &ServiceName) -> Vec<RemoteEndpoint> {
        self.peers.fed.endpoints(self.peers.member, region, service)
    }

    fn stale_peers(&self) -> BTreeSet<RegionName> {
        if self.peers.drop_stale {
            self.peers.fed.stale(self.peers.member, self.peers.now)
        } else {
            BTreeSet::new()
        }
    }

    fn front_doors(&self) -> Vec<(RegionName, bool)> {
        Vec::new()
    }
}

fn node(name: &str) -> NodeName {
    NodeName::try_new(name).expect("valid")
}

fn region() -> RegionName {
    RegionName::try_new("sim").expect("valid")
}

fn service(s: usize) -> ServiceName {
    ServiceName::try_new(format!("svc{s}")).expect("valid")
}

fn address(s: usize, i: usize) -> Address {
    let [_, _, hi, lo] = u32::try_from(s * 256 + i).unwrap_or(0).to_be_bytes();
    Address {
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, hi, lo)),
        port: 8080,
    }
}

fn summarise(request: &Request) -> String {
    match request {
        Request::Registry(s) => format!("registry {}", command_name(&s.command)),
        Request::Batch { commands } => {
            let names: Vec<String> = commands.iter().map(|s| command_name(&s.command)).collect();
            format!("batch [{}]", names.join(" "))
        }
        Request::Publish { views } => {
            let versions: Vec<String> = views
                .iter()
                .map(|v| format!("{}@{}", v.view.key, v.version.0 & 0xFFFF_FFFF))
                .collect();
            format!("publish [{}]", versions.join(" "))
        }
        Request::Release { releases } => {
            let versions: Vec<String> = releases
                .iter()
                .map(|r| {
                    let kind = if matches!(r, Release::Patch(_)) {
                        "~"
                    } else {
                        ""
                    };
                    format!("{}@{}{kind}", r.key(), r.version().0 & 0xFFFF_FFFF)
                })
                .collect();
            format!("release [{}]", versions.join(" "))
        }
        Request::Observed { instances, .. } => format!("observed {}", instances.len()),
        Request::ObservedPart {
            part,
            parts,
            instances,
            ..
        } => format!("observed part {part}/{parts} {}", instances.len()),
        Request::Audit { entries } => format!("audit {}", entries.len()),
        Request::Restore { at_ms, .. } => format!("restore at {at_ms}"),
    }
}

fn command_name(c: &Command) -> String {
    let json = serde_json::to_value(c).unwrap_or_default();
    json["op"].as_str().unwrap_or("?").to_owned()
}

fn outcome(r: &Response) -> String {
    match r {
        Response::Registry { outcome: Ok(_) } => "ok".into(),
        Response::Registry { outcome: Err(e) } => format!("refused {}", e.reason),
        Response::Published { accepted } => format!("accepted {accepted}"),
        Response::Released { views, skipped } => {
            format!("in force {}, skipped {skipped}", views.len())
        }
        Response::Audited { last_seq } => format!("seq {last_seq}"),
        other => format!("{other:?}"),
    }
}
