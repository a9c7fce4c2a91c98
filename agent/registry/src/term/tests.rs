//! Scenario tests: a term built from a fixture state, fed inputs at explicit instants,
//! its commands asserted exactly.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use waymark_core::contract::HealthContract;
use waymark_core::delta::DeltaConfig;
use waymark_core::evaluator::EvaluatorConfig;
use waymark_core::model::{
    Address, Health, Instance, Locality, Observation, Origin, Reporter, Sample,
};
use waymark_core::units::Weight;
use waymark_core::view::Version;

use super::*;
use crate::machine::TERM_VERSIONS_MAX_TERM;
use crate::state::Registration;

#[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
pub(super) fn t0() -> Instant {
    Instant::now()
}

pub(super) fn zone(z: &str) -> ZoneName {
    ZoneName::try_new(z).unwrap()
}

pub(super) fn region(r: &str) -> RegionName {
    RegionName::try_new(r).unwrap()
}

fn pay() -> ServiceName {
    ServiceName::try_new("pay").unwrap()
}

pub(super) fn node(n: &str) -> NodeName {
    NodeName::try_new(n).unwrap()
}

fn locality(z: &str) -> Locality {
    Locality {
        region: region("eu"),
        zone: zone(z),
        node: node("n1"),
    }
}

pub(super) fn pod(i: u8, z: &str) -> Instance {
    Instance {
        id: InstanceId::try_new(format!("pay-{z}-{i}")).unwrap(),
        service: pay(),
        locality: locality(z),
        address: Address {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, i, 1)),
            port: 8080,
        },
        origin: Origin::Orchestrator,
        weight: Weight::DEFAULT,
        tags: BTreeSet::new(),
        metadata: BTreeMap::new(),
    }
}

/// Unix ms of the fixture's "now" at `t0`.
pub(super) const T0_MS: u64 = 1_000_000;

pub(super) fn apply(state: &mut AuthorityState, command: Command) -> Applied {
    apply_at(state, T0_MS, command)
}

fn apply_at(state: &mut AuthorityState, at_ms: u64, command: Command) -> Applied {
    match state.apply(Request::Registry(Stamped { at_ms, command })) {
        crate::machine::Response::Registry { outcome } => outcome.expect("fixture command"),
        other => panic!("unexpected response {other:?}"),
    }
}

/// The region `eu` with zones a and b and four orchestrated instances of `pay`.
pub(super) fn region_state() -> AuthorityState {
    region_state_at(T0_MS)
}

fn region_state_at(at_ms: u64) -> AuthorityState {
    let mut s = AuthorityState::default();
    apply_at(
        &mut s,
        at_ms,
        Command::PutService {
            service: pay(),
            owner: "team-pay".into(),
            contract: HealthContract::default(),
        },
    );
    for (i, z) in [(1, "a"), (2, "a"), (3, "b"), (4, "b")] {
        apply_at(
            &mut s,
            at_ms,
            Command::Observe {
                instance: pod(i, z),
                draining: false,
            },
        );
    }
    s
}

pub(super) fn config(term: u64) -> TermConfig {
    TermConfig {
        term,
        pipeline: PipelineConfig {
            region: region("eu"),
            zones: [zone("a"), zone("b")].into_iter().collect(),
            evaluator: EvaluatorConfig::default(),
            delta: DeltaConfig::default(),
            fraction_guard: true,
        },
        breaks: TermBreaks::default(),
    }
}

/// The term's surroundings, as plain data the test changes between inputs.
#[derive(Default)]
pub(super) struct World {
    pub(super) state: AuthorityState,
    pub(super) now_ms: Cell<u64>,
    pub(super) probers: Vec<(NodeName, ZoneName)>,
    pub(super) digest: BTreeMap<(RegionName, ServiceName), u64>,
    pub(super) endpoints: BTreeMap<(RegionName, ServiceName), Vec<RemoteEndpoint>>,
    pub(super) stale: BTreeSet<RegionName>,
    pub(super) doors: Vec<(RegionName, bool)>,
    /// Every `peer_endpoints` read, in order.
    pub(super) endpoint_reads: RefCell<Vec<(RegionName, ServiceName)>>,
}

impl World {
    pub(super) fn new(state: AuthorityState) -> Self {
        Self {
            state,
            now_ms: Cell::new(T0_MS),
            ..Self::default()
        }
    }
}

impl Surroundings for World {
    fn now_ms(&self) -> u64 {
        self.now_ms.get()
    }

    fn read_state<T>(&self, read: impl FnOnce(&AuthorityState) -> T) -> T {
        read(&self.state)
    }

    fn probers(&self) -> Vec<(NodeName, ZoneName)> {
        self.probers.clone()
    }

    fn peer_digest(&self) -> Vec<((RegionName, ServiceName), u64)> {
        self.digest.clone().into_iter().collect()
    }

    fn peer_endpoints(&self, region: &RegionName, service: &ServiceName) -> Vec<RemoteEndpoint> {
        self.endpoint_reads
            .borrow_mut()
            .push((region.clone(), service.clone()));
        self.endpoints
            .get(&(region.clone(), service.clone()))
            .cloned()
            .unwrap_or_default()
    }

    fn stale_peers(&self) -> BTreeSet<RegionName> {
        self.stale.clone()
    }

    fn front_doors(&self) -> Vec<(RegionName, bool)> {
        self.doors.clone()
    }
}

/// A term and its clock.
pub(super) struct Fx {
    pub(super) term: LeaderTerm,
    pub(super) start: Instant,
    pub(super) now: Instant,
}

impl Fx {
    pub(super) fn new(config: TermConfig, world: &World) -> Self {
        let start = t0();
        Self {
            term: LeaderTerm::new(config, start, world),
            start,
            now: start,
        }
    }

    /// Fire every timeout up to `at` after the start, the world's wall clock following;
    /// the commands, in order.
    pub(super) fn run_to(&mut self, world: &World, at: Duration) -> Vec<LeaderCommand> {
        self.run_to_timed(world, at)
            .into_iter()
            .map(|(_, c)| c)
            .collect()
    }

    /// As [`Fx::run_to`], each command with the time after the start it was taken at.
    pub(super) fn run_to_timed(
        &mut self,
        world: &World,
        at: Duration,
    ) -> Vec<(Duration, LeaderCommand)> {
        let target = self.start + at;
        let since = |now: Instant, start: Instant| now - start;
        let mut out: Vec<_> = self
            .term
            .take_commands()
            .into_iter()
            .map(|c| (since(self.now, self.start), c))
            .collect();
        while let Some(due) = self.term.poll_timeout().filter(|t| *t <= target) {
            self.now = due.max(self.now);
            world.now_ms.set(T0_MS + ms(self.now - self.start));
            self.term.handle_timeout(self.now, world);
            let taken = since(self.now, self.start);
            out.extend(self.term.take_commands().into_iter().map(|c| (taken, c)));
        }
        self.now = target;
        world.now_ms.set(T0_MS + ms(at));
        out
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap()
}

fn publishes(commands: &[LeaderCommand]) -> Vec<&Vec<ReleasedView>> {
    commands
        .iter()
        .filter_map(|c| match c {
            LeaderCommand::Publish(v) => Some(v),
            _ => None,
        })
        .collect()
}

fn proposals(commands: &[LeaderCommand]) -> Vec<(&Purpose, &Request)> {
    commands
        .iter()
        .filter_map(|c| match c {
            LeaderCommand::Propose { purpose, request } => Some((purpose, request)),
            _ => None,
        })
        .collect()
}

/// Node `n1`'s probe of `instance` found the connection refused.
fn refused_probe(instance: Instance) -> Sample {
    Sample {
        instance: instance.id,
        reporter: Reporter::Node(node("n1")),
        observation: Observation::Probe {
            health: Health::Refused,
            detail: None,
        },
    }
}

fn audits(commands: &[LeaderCommand]) -> Vec<&AuditEntry> {
    commands
        .iter()
        .filter_map(|c| match c {
            LeaderCommand::Audit(e) => Some(e),
            _ => None,
        })
        .collect()
}

fn registry(at_ms: u64, command: Command) -> Request {
    Request::Registry(Stamped { at_ms, command })
}

fn verdicts(eligible: u64, unknown: u64) -> LeaderCommand {
    LeaderCommand::Metric(MetricChange::Verdicts {
        service: pay(),
        counts: Verdict::ALL
            .into_iter()
            .map(|v| {
                let n = match v {
                    Verdict::Eligible => eligible,
                    Verdict::Unknown => unknown,
                    _ => 0,
                };
                (v, n)
            })
            .collect(),
    })
}

/// `pay`'s instances per evidence mode: all single-class (nothing has spoken yet).
fn modes(single_class: u64) -> LeaderCommand {
    LeaderCommand::Metric(MetricChange::EvidenceModes {
        service: pay(),
        counts: EvidenceMode::ALL
            .into_iter()
            .map(|m| {
                (
                    m,
                    if m == EvidenceMode::SingleClass {
                        single_class
                    } else {
                        0
                    },
                )
            })
            .collect(),
    })
}

#[test]
fn a_new_terms_first_duties_are_the_lease_restart_and_the_counts() {
    // Goal: the first tick restarts leases before anything could expire them, counts
    // verdicts, and proposes no assignment while no prober is connected.
    let world = World::new(region_state());
    let mut fx = Fx::new(config(1), &world);
    let first = fx.run_to(&world, Duration::ZERO);
    // The rebuild admits every instance without auditing it again (the records are the
    // previous terms'); the duties run at once.
    assert_eq!(
        first,
        vec![
            verdicts(0, 4),
            modes(4),
            LeaderCommand::Propose {
                purpose: Purpose::RestartLeases,
                request: registry(T0_MS, Command::RestartLeases),
            },
        ]
    );
}

/// [`region_state`] with a 5 s probe interval, so the hold outlasts the admission window
/// and a withdrawal computed during it would otherwise go out.
fn slow_probe_state() -> AuthorityState {
    with_slow_probe(region_state())
}

/// `s` with `pay`'s probe every 5 s.
pub(super) fn with_slow_probe(mut s: AuthorityState) -> AuthorityState {
    let mut contract = HealthContract::default();
    if let Some(probe) = contract.probe.as_mut() {
        probe.interval = Duration::from_secs(5);
    }
    apply(
        &mut s,
        Command::PutService {
            service: pay(),
            owner: "team-pay".into(),
            contract,
        },
    );
    s
}

#[test]
fn nothing_is_published_while_the_hold_lasts_and_everything_new_at_its_end() {
    // Goal: a new leader moves no traffic for one contract interval.
    let world = World::new(slow_probe_state());
    let hold = hold_for(world.state.registry());
    assert_eq!(hold, Duration::from_secs(5));
    let mut fx = Fx::new(config(1), &world);
    // A withdrawal computed during the hold waits for it like everything else.
    fx.run_to(&world, Duration::from_millis(100));
    let refused = refused_probe(pod(1, "a"));
    fx.term.handle_sample(fx.now, refused).unwrap();
    let during = fx.run_to(&world, hold - Duration::from_millis(1));
    assert!(publishes(&during).is_empty(), "published during the hold");
    assert!(fx.term.is_holding());
    let end = fx.run_to(&world, hold);
    let published = publishes(&end);
    assert_eq!(published.len(), 1, "one publish at the hold's end: {end:?}");
    let zones: BTreeSet<_> = published[0]
        .iter()
        .map(|v| v.view.key.zone.clone())
        .collect();
    assert_eq!(zones, [zone("a"), zone("b")].into_iter().collect());
    let gone = pod(1, "a").id;
    let withdrawn = published[0]
        .iter()
        .all(|v| !v.view.endpoints.contains_key(&gone));
    assert!(
        withdrawn,
        "the hold's end carries the withdrawal: {published:?}"
    );
    assert!(!fx.term.is_holding());
}

#[test]
fn a_failover_alone_publishes_nothing_at_the_hold_end() {
    // Goal: the next leader, computing what the last one published, sends nobody a new
    // version.
    let mut world = World::new(region_state());
    let hold = hold_for(world.state.registry());
    let mut first = Fx::new(config(1), &world);
    let views = publishes(&first.run_to(&world, hold))[0].clone();
    world.state.apply(Request::Publish { views });
    let mut second = Fx::new(config(2), &world);
    let end = second.run_to(&world, hold);
    assert!(publishes(&end).is_empty(), "{end:?}");
    // What it computes later is released at once, with the new term's versions.
    let sample = refused_probe(pod(1, "a"));
    second.term.handle_sample(second.now, sample).unwrap();
    let after = second.run_to(&world, hold + Duration::from_secs(2));
    let released = publishes(&after);
    assert!(!released.is_empty(), "the withdrawal was not released");
    assert!(released[0].iter().all(|v| v.version.0 >> 32 == 2));
}

#[test]
fn a_transition_is_audited_with_its_rule_and_eligibility_as_data() {
    let world = World::new(region_state());
    let mut fx = Fx::new(config(1), &world);
    fx.run_to(&world, Duration::from_secs(1));
    let sample = Sample {
        instance: pod(1, "a").id,
        reporter: Reporter::Node(node("n1")),
        observation: Observation::Probe {
            health: Health::Refused,
            detail: Some("connection refused".into()),
        },
    };
    fx.term.handle_sample(fx.now, sample).unwrap();
    let commands = fx.term.take_commands();
    let records = audits(&commands);
    assert_eq!(records.len(), 1, "{commands:?}");
    let r = records[0];
    assert_eq!(r.kind, AuditKind::Transition);
    assert_eq!(r.at_ms, T0_MS + 1_000);
    assert_eq!(r.outcome, "ineligible");
    assert_eq!(r.instance, Some(pod(1, "a").id));
    assert_eq!(
        r.detail["rule"],
        serde_json::json!({"rule": "hard_failure", "class": "probe"})
    );
    assert_eq!(
        r.detail["eligibility"],
        serde_json::json!({"verdict": "ineligible", "ineligible_reason": "hard_failure"})
    );
    assert_eq!(r.detail["from"], "unknown");
}

#[test]
fn a_rebuild_reconstructs_state_without_auditing_transitions_again() {
    let world = World::new(region_state());
    let mut fx = Fx::new(config(1), &world);
    let transitions = |commands: &[LeaderCommand]| {
        audits(commands)
            .iter()
            .filter(|r| r.kind == AuditKind::Transition)
            .count()
    };
    let started = fx.run_to(&world, Duration::from_secs(1));
    assert_eq!(transitions(&started), 0, "a new term audits: {started:?}");
    fx.term.handle_rebuild(fx.now, &world);
    let rebuilt = fx.term.take_commands();
    assert_eq!(transitions(&rebuilt), 0, "a rebuild audits: {rebuilt:?}");
    // What changes after the rebuild is audited as ever, from the rebuilt verdict.
    let sample = refused_probe(pod(1, "a"));
    fx.term.handle_sample(fx.now, sample).unwrap();
    let commands = fx.term.take_commands();
    let records = audits(&commands);
    assert_eq!(records.len(), 1, "{commands:?}");
    assert_eq!(records[0].detail["from"], "unknown");
}

/// A region with one registered (leased) instance whose lease ran out at `T0_MS + 1`.
pub(super) fn leased_state() -> AuthorityState {
    let registered_ms = T0_MS - 30_000 + 1;
    let mut s = region_state_at(registered_ms);
    apply_at(
        &mut s,
        registered_ms,
        Command::Register(Registration {
            service: pay(),
            locality: locality("a"),
            address: Address {
                ip: IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9)),
                port: 8080,
            },
            weight: Weight::DEFAULT,
            tags: BTreeSet::new(),
            metadata: BTreeMap::new(),
            lease_ms: 30_000,
        }),
    );
    assert!(
        s.registry()
            .next_expiry_ms()
            .is_some_and(|at| at <= T0_MS + 1)
    );
    s
}

#[test]
fn no_lease_expires_before_the_terms_restart_commits() {
    // Goal: an outage of the authority never retires instances for its own silence.
    let mut world = World::new(leased_state());
    let mut fx = Fx::new(config(1), &world);
    let lease_proposals = |commands: &[LeaderCommand]| -> Vec<Purpose> {
        proposals(commands)
            .into_iter()
            .map(|(p, _)| p.clone())
            .filter(|p| matches!(p, Purpose::RestartLeases | Purpose::ExpireLeases))
            .collect()
    };
    // Uncommitted for 10 s: one restart in flight, never an expiry.
    let waiting = fx.run_to(&world, Duration::from_secs(10));
    assert_eq!(lease_proposals(&waiting), vec![Purpose::RestartLeases]);
    // It failed: the restart is proposed again, still before any expiry.
    fx.term
        .handle_written(fx.now, Purpose::RestartLeases, Written::Failed);
    let again = fx.run_to(&world, Duration::from_secs(11));
    assert_eq!(lease_proposals(&again), vec![Purpose::RestartLeases]);
    // It commits: every lease restarts from now, so none is due yet.
    apply(&mut world.state, Command::RestartLeases);
    fx.term
        .handle_written(fx.now, Purpose::RestartLeases, Written::Applied);
    let restarted = fx.run_to(&world, Duration::from_secs(20));
    assert_eq!(lease_proposals(&restarted), vec![]);
    // A lease that runs out afterwards is expired.
    let expiry = world.state.registry().next_expiry_ms().unwrap();
    let at = Duration::from_millis(expiry - T0_MS);
    let expired = fx.run_to(&world, at + LEASE_CHECK_EVERY);
    assert_eq!(lease_proposals(&expired), vec![Purpose::ExpireLeases]);
}

/// The leased instance [`leased_state`] registered.
fn leased_id(world: &World) -> InstanceId {
    world
        .state
        .registry()
        .instances()
        .find(|r| r.lease_ms.is_some())
        .map(|r| r.instance.id.clone())
        .unwrap()
}

/// Registers a second leased instance (of the same service, zone b) into `world`.
fn register_second(world: &mut World) -> InstanceId {
    let applied = apply(
        &mut world.state,
        Command::Register(Registration {
            service: pay(),
            locality: locality("b"),
            address: Address {
                ip: IpAddr::V4(Ipv4Addr::new(10, 9, 9, 10)),
                port: 8080,
            },
            weight: Weight::DEFAULT,
            tags: BTreeSet::new(),
            metadata: BTreeMap::new(),
            lease_ms: 30_000,
        }),
    );
    let Applied::Registered { instance, .. } = applied else {
        panic!("registered: {applied:?}");
    };
    instance
}

#[test]
fn renewals_cost_no_entry_and_only_unrenewed_leases_expire_by_name() {
    // Goal: a renewal is the term's own memory (no log entry); expiry names exactly the
    // leases nobody renewed, and refusals match the registry's.
    let mut world = World::new(leased_state());
    let renewed = leased_id(&world);
    let unrenewed = register_second(&mut world);
    let mut fx = Fx::new(config(1), &world);
    fx.run_to(&world, Duration::ZERO);
    apply(&mut world.state, Command::RestartLeases);
    fx.term
        .handle_written(fx.now, Purpose::RestartLeases, Written::Applied);
    // Both leases now end 30 s after T0. At 20 s one of them is renewed, until 50 s.
    fx.run_to(&world, Duration::from_secs(20));
    let answers = fx
        .term
        .handle_renewals(fx.now, std::slice::from_ref(&renewed), &world);
    assert_eq!(answers, vec![Ok(T0_MS + 50_000)]);
    assert_eq!(
        fx.term.take_commands(),
        vec![],
        "a renewal proposes nothing"
    );
    // Refused as the registry refuses a renewal: unknown, and orchestrated (not leased).
    let unknown = InstanceId::try_new("nobody").unwrap();
    let refused = fx
        .term
        .handle_renewals(fx.now, &[unknown.clone(), pod(1, "a").id], &world);
    assert!(
        matches!(
            refused.as_slice(),
            [
                Err(RegistryError::UnknownInstance { .. }),
                Err(RegistryError::NotLeased { .. })
            ]
        ),
        "{refused:?}"
    );
    // Past 30 s only the unrenewed lease is proposed for expiry, by name.
    let at_30 = fx.run_to(&world, Duration::from_secs(30) + LEASE_CHECK_EVERY);
    let expiry: Vec<_> = proposals(&at_30)
        .into_iter()
        .filter(|(p, _)| **p == Purpose::ExpireLeases)
        .map(|(_, r)| r.clone())
        .collect();
    let expected = Request::Registry(Stamped {
        at_ms: T0_MS + 30_000,
        command: Command::ExpireInstances {
            instances: vec![unrenewed.clone()],
        },
    });
    assert_eq!(expiry, vec![expected], "{at_30:?}");
    apply(
        &mut world.state,
        Command::ExpireInstances {
            instances: vec![unrenewed.clone()],
        },
    );
    fx.term
        .handle_written(fx.now, Purpose::ExpireLeases, Written::Applied);
    assert!(matches!(
        fx.term.handle_renewals(fx.now, &[unrenewed], &world)[..],
        [Err(RegistryError::Retired { .. })]
    ));
    // The renewed one lasts to 50 s, and then goes too.
    let at_45 = fx.run_to(&world, Duration::from_secs(45));
    assert_eq!(proposals(&at_45), vec![], "{at_45:?}");
    let at_50 = fx.run_to(&world, Duration::from_secs(50) + LEASE_CHECK_EVERY);
    let names: Vec<_> = proposals(&at_50)
        .into_iter()
        .filter_map(|(_, r)| match r {
            Request::Registry(Stamped {
                command: Command::ExpireInstances { instances },
                ..
            }) => Some(instances.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(names, vec![vec![renewed]]);
}

#[test]
fn a_new_term_forgets_renewals_and_restarts_every_lease_first() {
    // Goal: renewals lost with a term never retire an instance: the next term's first
    // lease proposal is the restart, and the leases then run a whole length from it.
    let world = World::new(leased_state());
    let mut old = Fx::new(config(1), &world);
    old.run_to(&world, Duration::ZERO);
    let id = leased_id(&world);
    assert!(old.term.handle_renewals(old.now, &[id], &world)[0].is_ok());
    let mut new = Fx::new(config(2), &world);
    let first = new.run_to(&world, Duration::from_secs(5));
    let leases: Vec<_> = proposals(&first)
        .into_iter()
        .filter(|(p, _)| matches!(p, Purpose::RestartLeases | Purpose::ExpireLeases))
        .map(|(p, _)| p.clone())
        .collect();
    assert_eq!(leases, vec![Purpose::RestartLeases]);
}

#[test]
fn a_connected_prober_is_assigned_its_zones_targets_once() {
    let mut world = World::new(region_state());
    let mut fx = Fx::new(config(1), &world);
    fx.run_to(&world, Duration::ZERO);
    world.probers = vec![(node("pa"), zone("a")), (node("pb"), zone("b"))];
    fx.term.handle_membership_changed();
    let commands = fx.run_to(&world, REASSIGN_EVERY);
    let expected = {
        let targets: Vec<_> = [(1, "a"), (2, "a"), (3, "b"), (4, "b")]
            .into_iter()
            .map(|(i, z)| (pod(i, z).id, zone(z)))
            .collect();
        assign(&targets, &world.probers, PROBERS_PER_TARGET)
    };
    assert_eq!(expected.len(), 4);
    let assigned: Vec<_> = proposals(&commands)
        .into_iter()
        .filter(|(p, _)| **p == Purpose::Assignment)
        .collect();
    assert_eq!(
        assigned,
        vec![(
            &Purpose::Assignment,
            &registry(
                T0_MS + ms(REASSIGN_EVERY),
                Command::SetAssignment {
                    assignment: expected.clone()
                }
            )
        )]
    );
    // Committed: nothing more to propose, even when membership changes again.
    let applied = apply(
        &mut world.state,
        Command::SetAssignment {
            assignment: expected,
        },
    );
    fx.term.handle_applied(fx.now, &applied, &world);
    assert_eq!(fx.term.take_commands(), vec![LeaderCommand::RefreshTargets]);
    fx.term.handle_membership_changed();
    let later = fx.run_to(&world, REASSIGN_EVERY * 3);
    assert!(
        !proposals(&later)
            .iter()
            .any(|(p, _)| **p == Purpose::Assignment)
    );
}

#[test]
fn an_instance_that_comes_while_the_probers_stay_is_assigned_alone() {
    // Goal: with the probers unchanged, a new instance costs a patch for itself, not the
    // region's whole assignment; a prober joining still reassigns everything.
    let mut world = World::new(region_state());
    world.probers = vec![(node("pa"), zone("a")), (node("pb"), zone("b"))];
    let mut fx = Fx::new(config(1), &world);
    let first = fx.run_to(&world, REASSIGN_EVERY);
    let Some((_, Request::Registry(Stamped { command: full, .. }))) = proposals(&first)
        .into_iter()
        .find(|(p, _)| **p == Purpose::Assignment)
    else {
        panic!("no assignment proposed: {first:?}");
    };
    assert!(matches!(full, Command::SetAssignment { .. }), "{full:?}");
    let applied = apply(&mut world.state, full.clone());
    fx.term.handle_applied(fx.now, &applied, &world);
    fx.term
        .handle_written(fx.now, Purpose::Assignment, Written::Applied);
    fx.term.take_commands();

    let newcomer = pod(9, "b");
    let applied = apply(
        &mut world.state,
        Command::Observe {
            instance: newcomer.clone(),
            draining: false,
        },
    );
    fx.term.handle_applied(fx.now, &applied, &world);
    let commands = fx.run_to(&world, REASSIGN_EVERY * 2);
    let assigned: Vec<_> = proposals(&commands)
        .into_iter()
        .filter(|(p, _)| **p == Purpose::Assignment)
        .map(|(_, r)| r.clone())
        .collect();
    let wanted = assign(
        &[(newcomer.id.clone(), zone("b"))],
        &world.probers,
        PROBERS_PER_TARGET,
    );
    assert_eq!(
        assigned,
        vec![registry(
            T0_MS + ms(REASSIGN_EVERY * 2),
            Command::PatchAssignment {
                set: wanted.clone(),
                remove: BTreeSet::new(),
            }
        )]
    );
    apply(
        &mut world.state,
        Command::PatchAssignment {
            set: wanted.clone(),
            remove: BTreeSet::new(),
        },
    );
    assert_eq!(
        world.state.registry().probers(&newcomer.id),
        wanted[&newcomer.id].as_slice()
    );

    // A prober joins: the whole assignment is computed again.
    world.probers.push((node("pc"), zone("a")));
    fx.term.handle_membership_changed();
    let joined = fx.run_to(&world, REASSIGN_EVERY * 3);
    let kinds: Vec<_> = proposals(&joined)
        .into_iter()
        .filter(|(p, _)| **p == Purpose::Assignment)
        .map(|(_, r)| match r {
            Request::Registry(Stamped { command, .. }) => std::mem::discriminant(command),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        vec![std::mem::discriminant(&Command::SetAssignment {
            assignment: BTreeMap::new()
        })]
    );
}

fn remote(id: &str) -> RemoteEndpoint {
    RemoteEndpoint {
        instance: InstanceId::try_new(id).unwrap(),
        address: Address {
            ip: IpAddr::V4(Ipv4Addr::new(10, 1, 0, 1)),
            port: 8080,
        },
        zone: zone("a"),
        weight: Weight::DEFAULT,
        status: waymark_core::view::EndpointStatus::Eligible,
        verdict: Verdict::Eligible,
    }
}

#[test]
fn a_peer_regions_aggregate_is_read_once_per_version_and_never_this_regions() {
    let mut world = World::new(region_state());
    let us = region("us");
    world.digest.insert((us.clone(), pay()), 1);
    world.digest.insert((region("eu"), pay()), 7);
    world
        .endpoints
        .insert((us.clone(), pay()), vec![remote("us:pay-1")]);
    let mut fx = Fx::new(config(1), &world);
    fx.run_to(&world, REMOTE_EVERY * 4);
    assert_eq!(*world.endpoint_reads.borrow(), vec![(us.clone(), pay())]);
    world.digest.insert((us.clone(), pay()), 2);
    fx.run_to(&world, REMOTE_EVERY * 5);
    assert_eq!(
        world.endpoint_reads.borrow().len(),
        2,
        "a new version is read"
    );
    // Stale under the drills' break: fed as empty, without reading it.
    world.stale.insert(us.clone());
    fx.run_to(&world, REMOTE_EVERY * 6);
    assert_eq!(world.endpoint_reads.borrow().len(), 2);
    // Fresh again: read again.
    world.stale.clear();
    fx.run_to(&world, REMOTE_EVERY * 7);
    assert_eq!(world.endpoint_reads.borrow().len(), 3);
}

#[test]
fn the_signal_fails_over_an_unreachable_region_once_and_audits_the_outcome() {
    let mut world = World::new(region_state());
    let us = region("us");
    world.doors = vec![(us.clone(), false)];
    let mut fx = Fx::new(config(1), &world);
    let commands = fx.run_to(&world, REMOTE_EVERY * 4);
    let purpose = Purpose::Failover {
        region: us.clone(),
        intent: RegionFailoverIntent::Failover { manual: false },
        reason: "front door unreachable",
    };
    let failovers: Vec<_> = proposals(&commands)
        .into_iter()
        .filter(|(p, _)| matches!(p, Purpose::Failover { .. }))
        .collect();
    assert_eq!(
        failovers,
        vec![(
            &purpose,
            &registry(
                T0_MS,
                Command::RegionFailover {
                    region: us.clone(),
                    intent: RegionFailoverIntent::Failover { manual: false },
                    actor: SIGNAL_ACTOR.into(),
                    reason: "front door unreachable".into(),
                }
            )
        )],
        "one command in flight, however many ticks pass"
    );
    fx.term.handle_written(fx.now, purpose, Written::Applied);
    let commands = fx.term.take_commands();
    let records = audits(&commands);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].actor, SIGNAL_ACTOR);
    assert_eq!(records[0].outcome, "granted");
    assert_eq!(records[0].detail["peer_region"], "us");
}

#[test]
fn the_signal_reverses_only_its_own_failovers() {
    let record = |manual: bool, actor: &str, back: bool| RegionFailoverRecord {
        moved: Permille::ONE,
        back,
        manual,
        awaiting_completion: false,
        actor: actor.into(),
        reason: String::new(),
    };
    let shift_back = Some(RegionFailoverIntent::ShiftBack);
    let failover = Some(RegionFailoverIntent::Failover { manual: false });
    assert_eq!(signal_intent(None, false), failover);
    assert_eq!(signal_intent(None, true), None);
    assert_eq!(
        signal_intent(Some(record(false, SIGNAL_ACTOR, false)), true),
        shift_back
    );
    assert_eq!(
        signal_intent(Some(record(false, SIGNAL_ACTOR, true)), false),
        failover
    );
    // An operator's failover is theirs, whatever the front door does.
    assert_eq!(
        signal_intent(Some(record(true, "operator/ana", false)), true),
        None
    );
    assert_eq!(
        signal_intent(Some(record(false, "operator/ana", true)), false),
        None
    );
}

fn hand_overs(commands: &[LeaderCommand]) -> usize {
    commands
        .iter()
        .filter(|c| **c == LeaderCommand::HandOver)
        .count()
}

/// A term with no version space, run past its hold: it has asked for its hand-over.
fn exhausted_term(world: &World) -> (Fx, Vec<LeaderCommand>) {
    let mut fx = Fx::new(config(TERM_VERSIONS_MAX_TERM + 1), world);
    let commands = fx.run_to(world, Duration::from_secs(35));
    (fx, commands)
}

#[test]
fn a_term_without_version_space_asks_for_one_hand_over_and_publishes_nothing() {
    // Goal: a term that cannot number a release hands its leadership over (once, however
    // many views it could not number) rather than wrap its versions.
    let world = World::new(region_state());
    let (_, commands) = exhausted_term(&world);
    let unnumbered = commands
        .iter()
        .filter(|c| **c == LeaderCommand::Metric(MetricChange::VersionsExhausted))
        .count();
    assert!(unnumbered >= 2, "every view not released is counted");
    assert_eq!(hand_overs(&commands), 1, "{commands:?}");
    assert!(publishes(&commands).is_empty());
}

#[test]
fn an_only_voter_out_of_versions_refuses_to_publish_and_asks_again_later() {
    // Goal: with nobody to hand over to, the refusal is an alarm and a gauge, and the
    // term asks again (a voter may have been added) at its retry interval, not before.
    let world = World::new(region_state());
    let (mut fx, _) = exhausted_term(&world);
    let at = fx.now - fx.start;
    fx.term.handle_hand_over(fx.now, HandOver::NoOtherVoter);
    let commands = fx.term.take_commands();
    assert_eq!(
        commands[0],
        LeaderCommand::Metric(MetricChange::PublishRefused { refused: true })
    );
    let alarms = audits(&commands);
    assert_eq!(alarms.len(), 1);
    assert_eq!(
        (alarms[0].kind, alarms[0].outcome.as_str()),
        (AuditKind::Alarm, "publish_refused")
    );
    let early = at + HAND_OVER_ALONE_RETRY - Duration::from_secs(1);
    let waited = fx.run_to(&world, early);
    assert_eq!(hand_overs(&waited), 0, "not before the retry");
    let asked = fx.run_to(&world, at + HAND_OVER_ALONE_RETRY + Duration::from_secs(1));
    assert_eq!(hand_overs(&asked), 1);
    // Still alone: no second alarm.
    fx.term.handle_hand_over(fx.now, HandOver::NoOtherVoter);
    assert!(audits(&fx.term.take_commands()).is_empty());
}

#[test]
fn a_failed_hand_over_is_retried_and_a_moved_one_ends_the_asking() {
    let world = World::new(region_state());
    let (mut fx, _) = exhausted_term(&world);
    let at = fx.now - fx.start;
    fx.term.handle_hand_over(fx.now, HandOver::Failed);
    assert!(fx.term.take_commands().is_empty(), "a failure is no alarm");
    let asked = fx.run_to(&world, at + HAND_OVER_RETRY + Duration::from_secs(1));
    assert_eq!(hand_overs(&asked), 1);
    fx.term.handle_hand_over(fx.now, HandOver::Moved);
    let later = fx.run_to(&world, at + Duration::from_secs(120));
    assert_eq!(hand_overs(&later), 0, "{later:?}");
    // An outcome nobody asked for changes nothing.
    fx.term.handle_hand_over(fx.now, HandOver::NoOtherVoter);
    assert!(fx.term.take_commands().is_empty());
}

#[test]
fn versions_start_above_everything_published() {
    let mut world = World::new(region_state());
    let hold = hold_for(world.state.registry());
    let mut first = Fx::new(config(3), &world);
    let views = publishes(&first.run_to(&world, hold))[0].clone();
    let top = views.iter().map(|v| v.version).max().unwrap();
    world.state.apply(Request::Publish { views });
    // The same term again (a rebuild): new versions continue above the floor.
    let mut again = Fx::new(config(3), &world);
    let sample = refused_probe(pod(3, "b"));
    again.run_to(&world, hold);
    again.term.handle_sample(again.now, sample).unwrap();
    let released = again.run_to(&world, hold + Duration::from_secs(2));
    let min = publishes(&released)
        .into_iter()
        .flatten()
        .map(|v| v.version)
        .min()
        .unwrap();
    assert!(min > top, "{min:?} <= {top:?}");
    assert!(top > Version(3 << 32));
}

#[test]
fn a_flood_of_refused_samples_costs_one_audit_record_per_reporter_and_reason() {
    // Goal: forged evidence at any rate must not grow every member's log at that rate.
    let mut digest = DenialDigest::default();
    let reporter = |n: &str| Reporter::Node(n.parse().unwrap());
    for i in 0..10_000 {
        digest.handle_denial(Denial {
            reporter: reporter("n1"),
            reason: "unassigned".into(),
            instance: format!("pay-r{i}"),
        });
    }
    digest.handle_denial(Denial {
        reporter: reporter("n2"),
        reason: "unassigned".into(),
        instance: "x".repeat(10_000),
    });
    let records = digest.take_records(7);
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].detail["count"], 10_000);
    assert_eq!(records[0].detail["example"], "pay-r0");
    assert!(records[1].detail["example"].as_str().unwrap().len() <= DENIAL_EXAMPLE_LEN_MAX);
    assert!(
        digest.take_records(8).is_empty(),
        "a flush empties the digest"
    );
}

#[test]
fn distinct_denial_keys_are_bounded_and_the_rest_counted() {
    let mut digest = DenialDigest::default();
    for i in 0..(crate::fold::KEYS_MAX + 5) {
        digest.handle_denial(Denial {
            reporter: Reporter::Node(format!("n{i}").parse().unwrap()),
            reason: "unassigned".into(),
            instance: "pay-r1".into(),
        });
    }
    let records = digest.take_records(1);
    assert_eq!(records.len(), crate::fold::KEYS_MAX + 1);
    assert_eq!(records.last().unwrap().detail["count"], 5);
}

#[test]
fn denials_reach_the_log_folded_at_the_next_count() {
    let world = World::new(region_state());
    let mut fx = Fx::new(config(1), &world);
    fx.run_to(&world, Duration::ZERO);
    for _ in 0..3 {
        fx.term.handle_denial(Denial {
            reporter: Reporter::Node(node("rogue")),
            reason: "unassigned".into(),
            instance: "pay-a-1".into(),
        });
    }
    let commands = fx.run_to(&world, COUNTS_EVERY);
    let records = audits(&commands);
    let denials: Vec<_> = records
        .iter()
        .filter(|e| e.kind == AuditKind::Denial)
        .collect();
    assert_eq!(denials.len(), 1);
    assert_eq!(denials[0].detail["count"], 3);
    assert_eq!(denials[0].at_ms, T0_MS + ms(COUNTS_EVERY));
}

#[test]
fn a_new_leader_keeps_the_published_tier_2_until_its_own_replica_replaces_it() {
    // Goal: a leader elected before its in-memory replica of the peer's aggregate has
    // learned it again (after a restart) keeps the peer endpoints the region published;
    // they go only the way the replica's own would, when the peer is dropped as stale.
    let mut world = World::new(region_state());
    let us = region("us");
    world.digest.insert((us.clone(), pay()), 1);
    world
        .endpoints
        .insert((us.clone(), pay()), vec![remote("us:pay-1")]);
    let hold = hold_for(world.state.registry());
    let mut first = Fx::new(config(1), &world);
    let views = publishes(&first.run_to(&world, hold))[0].clone();
    let routes_us = |v: &ReleasedView| v.view.endpoints.values().any(|e| e.region == us);
    assert!(
        views
            .iter()
            .filter(|v| v.view.key.service == pay())
            .all(routes_us)
    );
    world.state.apply(Request::Publish { views });

    // The next leader's replica is empty.
    world.digest.clear();
    world.endpoints.clear();
    let mut next = Fx::new(config(2), &world);
    next.run_to(&world, hold);
    next.term
        .handle_sample(next.now, refused_probe(pod(1, "a")))
        .unwrap();
    let released = next.run_to(&world, hold + Duration::from_secs(2));
    let pay_views: Vec<_> = publishes(&released)
        .into_iter()
        .flatten()
        .filter(|v| v.view.key.service == pay())
        .collect();
    assert!(
        !pay_views.is_empty(),
        "the withdrawal publishes pay's views"
    );
    assert!(
        pay_views.iter().all(|v| routes_us(v)),
        "a leader change dropped the peer region's endpoints"
    );

    // Stale peers dropped: the seeded entry goes as the replica's would.
    world.stale.insert(us.clone());
    let later = next.run_to(&world, hold + Duration::from_secs(2) + REMOTE_EVERY * 2);
    let last = publishes(&later)
        .into_iter()
        .flatten()
        .rfind(|v| v.view.key.service == pay())
        .expect("dropping tier 2 changes pay's views");
    assert!(!routes_us(last));
    assert_eq!(
        world.endpoint_reads.borrow().len(),
        1,
        "the seed reads no replica"
    );
}

#[test]
fn the_probe_cadence_follows_an_instance_in_and_out_of_passive_primary() {
    // Goal: when callers' outcomes become an instance's primary evidence the term asks
    // for the confirmation cadence, once; when the callers go quiet, for the normal one.
    let mut state = AuthorityState::default();
    let mut contract = HealthContract::default();
    contract.passive.primary = Some(waymark_core::contract::PassivePrimary::default());
    apply_at(
        &mut state,
        T0_MS,
        Command::PutService {
            service: pay(),
            owner: "team-pay".into(),
            contract,
        },
    );
    apply_at(
        &mut state,
        T0_MS,
        Command::Observe {
            instance: pod(1, "a"),
            draining: false,
        },
    );
    let world = World::new(state);
    let mut fx = Fx::new(config(1), &world);
    fx.run_to(&world, Duration::from_secs(1));
    let id = pod(1, "a").id;
    let cadence = |commands: &[LeaderCommand]| -> Vec<bool> {
        commands
            .iter()
            .filter_map(|c| match c {
                LeaderCommand::ProbeCadence {
                    instance,
                    confirming,
                } if *instance == id => Some(*confirming),
                _ => None,
            })
            .collect()
    };
    let callers = |n: u32| {
        (0..n)
            .map(|c| Sample {
                instance: pod(1, "a").id,
                reporter: Reporter::Node(node(&format!("caller-{c}"))),
                observation: Observation::Passive {
                    requests: 50,
                    errors: 0,
                },
            })
            .collect::<Vec<_>>()
    };
    // Two callers: not a population, no change of cadence.
    fx.term.handle_samples(fx.now, callers(2));
    assert_eq!(cadence(&fx.term.take_commands()), Vec::<bool>::new());
    // A third: passive-primary.
    fx.term.handle_samples(fx.now, callers(3));
    assert_eq!(cadence(&fx.term.take_commands()), [true]);
    fx.term.handle_samples(fx.now, callers(3));
    assert_eq!(cadence(&fx.term.take_commands()), Vec::<bool>::new());
    // Quiet past the passive silence window (3 × 1 s): back to the normal cadence.
    let quiet = fx.run_to(&world, Duration::from_secs(6));
    assert_eq!(cadence(&quiet), [false]);
    // Primary again, then the callers fail: the normal cadence comes back at once.
    fx.term.handle_samples(fx.now, callers(3));
    assert_eq!(cadence(&fx.term.take_commands()), [true]);
    let failing = callers(3)
        .into_iter()
        .map(|mut s| {
            s.observation = Observation::Passive {
                requests: 50,
                errors: 50,
            };
            s
        })
        .collect::<Vec<_>>();
    fx.term.handle_samples(fx.now, failing);
    assert_eq!(cadence(&fx.term.take_commands()), [false]);
}
