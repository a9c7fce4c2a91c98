//! The member's evidence hub: admits attributed samples to the leader's pipeline, tracks
//! the connected probers, and hands each prober its targets.
//!
//! Samples are checked against the registry (assignment, self-only, live target) before
//! they are queued; refusals are counted by reason and queued for the audit log. On a
//! follower the hub refuses sessions and names the leader, so agents go there.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use opentelemetry::KeyValue;
use opentelemetry::trace::SpanContext;
use tokio::sync::{mpsc, watch};
use tonic::Status;
use waymark_core::model::{EvidenceClass, InstanceId, NodeName, Reporter, Sample, ZoneName};
use waymark_registry::ingest::admit;
use waymark_registry::state::DesiredState;

use super::keyring::KeyringBroker;
use super::metrics::{AuthorityMetrics, ReasonLabels};
use super::raft::RaftNode;
use super::sidecars::SidecarsHandle;
use crate::evidence::{
    Ack, ClientConfig, ConfigRequest, EvidenceSink, KeyringAnswer, KeyringRequest, ProbeTarget,
    RefusedSample, SidecarReport, WireSample,
};
use crate::gossip::{Liveness, MemberState, Role};
use crate::otel::Telemetry;

/// Samples queued between ingest and the leader's pipeline before new ones are refused.
pub const QUEUE_LEN: usize = 65_536;

pub use waymark_registry::ingest::Denial;

/// What the leader reads: admitted samples and denials.
#[derive(Debug)]
pub struct LeaderFeed {
    /// Admitted samples.
    pub samples: mpsc::Receiver<Sample>,
    /// Refusals, for the audit log.
    pub denials: mpsc::Receiver<Denial>,
}

#[derive(Debug, Default)]
struct Inner {
    feed: Option<(mpsc::Sender<Sample>, mpsc::Sender<Denial>)>,
    /// Connected probers: zone and session count.
    probers: BTreeMap<NodeName, (ZoneName, usize)>,
    targets: BTreeMap<NodeName, watch::Sender<Vec<ProbeTarget>>>,
    /// Instances whose callers' outcomes are primary (the leader's evaluator says so):
    /// probed at their contract's confirmation cadence. Leader-observed, like the
    /// verdicts; a new leader starts empty and its evaluator refills it.
    confirming: BTreeSet<InstanceId>,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct EvidenceHub {
    raft: RaftNode,
    metrics: AuthorityMetrics,
    inner: Arc<Mutex<Inner>>,
    membership: watch::Sender<u64>,
    /// Live agents per gossip, when this member gossips: only they are assigned targets.
    gossip: Option<watch::Receiver<Vec<MemberState>>>,
    /// Admitted samples the leader's queue holds before new ones are shed.
    queue_len: usize,
    /// Each node's report of its sidecars, and config requests to nodes: leader-observed,
    /// like the assignments (see `sidecars.rs`).
    sidecars: SidecarsHandle,
    /// Keyring requests to nodes (online gossip key rotation): leader-observed too.
    keyring: Arc<KeyringBroker>,
    /// Trace export: a span per admitted batch (see `crate::otel`).
    telemetry: Telemetry,
    /// The latest admission spans, which the leader's next release links to.
    admissions: Arc<Mutex<Vec<SpanContext>>>,
}

impl EvidenceHub {
    /// A hub for this member.
    pub fn new(raft: RaftNode, metrics: AuthorityMetrics) -> Self {
        Self {
            raft,
            metrics,
            inner: Arc::default(),
            membership: watch::Sender::new(0),
            gossip: None,
            queue_len: QUEUE_LEN,
            sidecars: SidecarsHandle::default(),
            keyring: Arc::default(),
            telemetry: Telemetry::off(),
            admissions: Arc::default(),
        }
    }

    /// Export a span per evidence batch admitted, and lend `telemetry` to the leader.
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }

    /// This member's trace export.
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// The admission spans since the last call (at most [`crate::otel::LINKS_MAX`], the
    /// latest), for the next release's evaluation span to link to.
    pub fn take_admissions(&self) -> Vec<SpanContext> {
        std::mem::take(
            &mut *self
                .admissions
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// The keyring broker, for the leader's pool-wide keyring operations.
    pub fn keyring_broker(&self) -> Arc<KeyringBroker> {
        Arc::clone(&self.keyring)
    }

    /// The sidecar reports and config broker, for the API.
    pub fn sidecars(&self) -> SidecarsHandle {
        self.sidecars.clone()
    }

    /// A shorter queue than [`QUEUE_LEN`], so tests can fill it.
    #[cfg(test)]
    fn with_queue_len(mut self, len: usize) -> Self {
        self.queue_len = len;
        self
    }

    /// Take prober liveness from gossip: a connected node is assigned targets only while
    /// gossip holds it alive, and every membership change triggers a reassignment.
    pub fn with_gossip(mut self, members: watch::Receiver<Vec<MemberState>>) -> Self {
        let mut changes = members.clone();
        let notify = self.membership.clone();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                notify.send_modify(|n| *n += 1);
            }
        });
        self.gossip = Some(members);
        self
    }

    /// Start feeding a leader; the previous feed (if any) is closed.
    pub fn lead(&self) -> LeaderFeed {
        let (stx, srx) = mpsc::channel(self.queue_len);
        let (dtx, drx) = mpsc::channel(1024);
        self.lock().feed = Some((stx, dtx));
        LeaderFeed {
            samples: srx,
            denials: drx,
        }
    }

    /// Stop feeding (leadership lost).
    pub fn follow(&self) {
        let mut inner = self.lock();
        inner.feed = None;
        inner.confirming.clear();
        drop(inner);
        self.sidecars.reports().clear();
        self.sidecars.broker.clear();
        self.keyring.clear();
    }

    /// Probe each instance at its contract's confirmation cadence (`true`) or at its
    /// normal interval, and hand every node that probes one whose cadence changed its new
    /// targets, once.
    pub fn set_confirming(&self, registry: &DesiredState, changes: &[(InstanceId, bool)]) {
        let changed: Vec<&InstanceId> = {
            let mut inner = self.lock();
            changes
                .iter()
                .filter(|(id, confirming)| {
                    if *confirming {
                        inner.confirming.insert(id.clone())
                    } else {
                        inner.confirming.remove(id)
                    }
                })
                .map(|(id, _)| id)
                .collect()
        };
        let nodes: BTreeSet<&NodeName> = changed
            .into_iter()
            .flat_map(|id| registry.probers(id))
            .collect();
        for node in nodes {
            self.refresh_node(registry, node);
        }
    }

    /// Probers currently connected, with their zones.
    pub fn probers(&self) -> Vec<(NodeName, ZoneName)> {
        let alive: Option<std::collections::BTreeSet<NodeName>> = self.gossip.as_ref().map(|g| {
            g.borrow()
                .iter()
                .filter(|m| m.state == Liveness::Alive && m.id.role == Role::Agent)
                .map(|m| m.id.name.clone())
                .collect()
        });
        self.lock()
            .probers
            .iter()
            .filter(|(n, _)| alive.as_ref().is_none_or(|a| a.contains(*n)))
            .map(|(n, (z, _))| (n.clone(), z.clone()))
            .collect()
    }

    /// Changes whenever a prober connects or leaves.
    pub fn membership(&self) -> watch::Receiver<u64> {
        self.membership.subscribe()
    }

    /// Hand every connected prober its targets from the registry's assignment.
    pub fn refresh_targets(&self, registry: &DesiredState) {
        let connected: std::collections::BTreeSet<NodeName> =
            self.lock().targets.keys().cloned().collect();
        let confirming = self.lock().confirming.clone();
        let mut per_node = assigned_targets(registry, &confirming, |node| connected.contains(node));
        let inner = self.lock();
        for (node, tx) in &inner.targets {
            offer(tx, per_node.remove(node).unwrap_or_default());
        }
    }

    /// Hand one prober its targets: what a connecting node needs, without recomputing
    /// every other node's (a fleet reconnecting at once would otherwise cost a scan of
    /// every node's targets per connection, under the state's lock).
    fn refresh_node(&self, registry: &DesiredState, node: &NodeName) {
        let confirming = self.lock().confirming.clone();
        let mut mine = assigned_targets(registry, &confirming, |n| n == node);
        if let Some(tx) = self.lock().targets.get(node) {
            offer(tx, mine.remove(node).unwrap_or_default());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn not_leader(&self) -> Status {
        let hint = self
            .raft
            .leader()
            .map(|(id, m)| format!("member {id} at {}", m.api_addr))
            .unwrap_or_else(|| "unknown (election in progress)".to_owned());
        Status::unavailable(format!("not the leader; the leader is {hint}"))
    }
}

/// The probe targets the registry assigns to the nodes `wanted` picks; instances in
/// `confirming` at their contract's confirmation cadence.
fn assigned_targets(
    registry: &DesiredState,
    confirming: &BTreeSet<InstanceId>,
    wanted: impl Fn(&NodeName) -> bool,
) -> BTreeMap<NodeName, Vec<ProbeTarget>> {
    let mut per_node: BTreeMap<NodeName, Vec<ProbeTarget>> = BTreeMap::new();
    for record in registry.instances() {
        let i = &record.instance;
        let mut nodes = registry
            .probers(&i.id)
            .iter()
            .filter(|n| wanted(n))
            .peekable();
        if nodes.peek().is_none() {
            continue;
        }
        let Some(contract) = registry.service(&i.service).map(|s| &s.contract) else {
            continue;
        };
        let Some(probe) = contract.probe.as_ref() else {
            continue;
        };
        let mut probe = probe.clone();
        let confirm = contract
            .passive
            .primary
            .filter(|_| confirming.contains(&i.id))
            .map(|p| p.confirm_interval);
        if let Some(interval) = confirm {
            probe.interval = probe.interval.max(interval);
        }
        for node in nodes {
            per_node.entry(node.clone()).or_default().push(ProbeTarget {
                instance: i.id.clone(),
                service: i.service.clone(),
                address: i.address,
                probe: probe.clone(),
                confirmation: confirm.is_some(),
            });
        }
    }
    per_node
}

/// Replace what a prober holds, waking it only if that changed.
fn offer(tx: &watch::Sender<Vec<ProbeTarget>>, targets: Vec<ProbeTarget>) {
    tx.send_if_modified(|held| {
        if *held == targets {
            false
        } else {
            *held = targets;
            true
        }
    });
}

impl EvidenceSink for EvidenceHub {
    fn hello(
        &self,
        node: &NodeName,
        zone: &ZoneName,
    ) -> Result<watch::Receiver<Vec<ProbeTarget>>, Status> {
        let rx = {
            let mut inner = self.lock();
            if inner.feed.is_none() {
                return Err(self.not_leader());
            }
            let entry = inner
                .probers
                .entry(node.clone())
                .or_insert_with(|| (zone.clone(), 0));
            entry.0 = zone.clone();
            entry.1 += 1;
            inner
                .targets
                .entry(node.clone())
                .or_insert_with(|| watch::Sender::new(Vec::new()))
                .subscribe()
        };
        self.membership.send_modify(|n| *n += 1);
        self.raft
            .with_state(|s, _| self.refresh_node(s.registry(), node));
        Ok(rx)
    }

    fn goodbye(&self, node: &NodeName) {
        let gone = {
            let mut inner = self.lock();
            let gone = match inner.probers.get_mut(node) {
                Some((_, n)) => {
                    *n = n.saturating_sub(1);
                    *n == 0
                }
                None => false,
            };
            if gone {
                inner.probers.remove(node);
                inner.targets.remove(node);
            }
            gone
        };
        if gone {
            self.sidecars.reports().handle_session_closed(node);
        }
        self.sidecars.broker.detach(node);
        self.keyring.detach(node);
        self.membership.send_modify(|n| *n += 1);
    }

    fn sidecars(&self, node: &NodeName, report: SidecarReport) -> Result<(), Status> {
        if self.lock().feed.is_none() {
            return Err(self.not_leader());
        }
        let outcome = {
            let mut reports = self.sidecars.reports();
            // Read under the lock: every caller's `now` then reaches the core in order.
            let now = tokio::time::Instant::now().into_std();
            reports.handle_report(now, node, report)
        };
        // A refused report must not end the session: the node's evidence matters more.
        if let Err(refused) = outcome {
            self.metrics
                .sidecar_reports_refused
                .get_or_create(&ReasonLabels {
                    reason: refused.label().to_owned(),
                })
                .inc();
            tracing::debug!(node_id = %node, error = %refused, "sidecar report refused");
        }
        Ok(())
    }

    fn config_requests(&self, node: &NodeName) -> Option<mpsc::Receiver<ConfigRequest>> {
        Some(self.sidecars.broker.attach(node))
    }

    fn client_config(&self, node: &NodeName, answer: ClientConfig) {
        self.sidecars.broker.answer(node, answer);
    }

    fn keyring_requests(&self, node: &NodeName) -> Option<mpsc::Receiver<KeyringRequest>> {
        Some(self.keyring.attach(node))
    }

    fn keyring_answer(&self, node: &NodeName, answer: KeyringAnswer) {
        self.keyring.answer(node, answer);
    }

    fn ingest(&self, reporter: &Reporter, samples: Vec<WireSample>) -> Result<Ack, Status> {
        let tagged = samples.into_iter().map(|w| (reporter.clone(), w)).collect();
        self.ingest_as(reporter, tagged, |_, _| None)
    }

    fn ingest_relayed(&self, node: &NodeName, samples: Vec<WireSample>) -> Result<Ack, Status> {
        let relay = Reporter::Node(node.clone());
        let tagged = samples
            .into_iter()
            .map(|w| (Reporter::Instance(w.instance.clone()), w))
            .collect();
        // A node relays self-reports only, and only for instances on its own host.
        self.ingest_as(&relay, tagged, |state, sample| {
            if sample.observation.class() != EvidenceClass::SelfReport {
                return Some("not_attributable");
            }
            match state.instance(&sample.instance) {
                Some(rec) if &rec.instance.locality.node == node => None,
                Some(_) => Some("not_on_relaying_node"),
                None => None, // `admit` names it
            }
        })
    }
}

impl EvidenceHub {
    /// Admit `samples`, each with its own reporter, after `precheck` (a refusal label or
    /// `None`); denials are recorded against `session`, the connection's identity.
    ///
    /// Room in the leader's queue is checked first: while it is full, a message is refused
    /// whole as `overloaded` without its attribution checks taking the state's lock, and
    /// shedding is counted, not audited sample by sample (it says nothing about who sent
    /// it). The reporter learns which samples were refused either way.
    fn ingest_as(
        &self,
        session: &Reporter,
        samples: Vec<(Reporter, WireSample)>,
        precheck: impl Fn(&DesiredState, &Sample) -> Option<&'static str>,
    ) -> Result<Ack, Status> {
        let reporter = session;
        let Some((tx, denials)) = self.lock().feed.clone() else {
            return Err(self.not_leader());
        };
        let mut span = self.telemetry.span(
            "waymark.evidence.admit",
            None,
            &[],
            vec![
                KeyValue::new("waymark.reporter", reporter.to_string()),
                KeyValue::new("waymark.samples", samples.len() as i64),
            ],
        );
        let ack = self.admit_batch(reporter, samples, tx, denials, precheck);
        span.set(KeyValue::new(
            "waymark.samples.accepted",
            ack.accepted as i64,
        ));
        span.set(KeyValue::new(
            "waymark.samples.refused",
            ack.refused.len() as i64,
        ));
        if ack.accepted > 0 {
            let context = span.context();
            if context.is_valid() {
                let mut latest = self
                    .admissions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if latest.len() == crate::otel::LINKS_MAX {
                    latest.remove(0);
                }
                latest.push(context);
            }
        }
        span.end();
        Ok(ack)
    }

    /// [`EvidenceHub::ingest_as`] once this member leads: the checks and the queue.
    fn admit_batch(
        &self,
        reporter: &Reporter,
        samples: Vec<(Reporter, WireSample)>,
        tx: mpsc::Sender<Sample>,
        denials: mpsc::Sender<Denial>,
        precheck: impl Fn(&DesiredState, &Sample) -> Option<&'static str>,
    ) -> Ack {
        let mut ack = Ack::default();
        if tx.capacity() == 0 {
            self.shed(&mut ack, samples.into_iter().map(|(_, w)| w.instance));
            return ack;
        }
        let mut refuse = |instance: &waymark_core::model::InstanceId, reason: &str| {
            self.metrics
                .samples_refused
                .get_or_create(&ReasonLabels {
                    reason: reason.to_owned(),
                })
                .inc();
            // The audit path is best effort under a flood; the metric is exact.
            let _ = denials.try_send(Denial {
                reporter: reporter.clone(),
                reason: reason.to_owned(),
                instance: instance.to_string(),
            });
            ack.refused.push(RefusedSample {
                instance: instance.clone(),
                reason: reason.to_owned(),
            });
        };
        let admitted: Vec<Sample> = self.raft.with_state(|state, _| {
            samples
                .into_iter()
                .filter_map(|(who, w)| {
                    let sample = Sample {
                        instance: w.instance,
                        reporter: who,
                        observation: w.observation,
                    };
                    if let Some(reason) = precheck(state.registry(), &sample) {
                        refuse(&sample.instance, reason);
                        return None;
                    }
                    match admit(state.registry(), &sample) {
                        Ok(()) => Some(sample),
                        Err(e) => {
                            refuse(&sample.instance, e.label());
                            None
                        }
                    }
                })
                .collect()
        });
        let mut admitted = admitted.into_iter();
        let mut accepted = 0;
        for sample in admitted.by_ref() {
            match tx.try_send(sample) {
                Ok(()) => accepted += 1,
                Err(
                    mpsc::error::TrySendError::Full(sample)
                    | mpsc::error::TrySendError::Closed(sample),
                ) => {
                    let rest = std::iter::once(sample).chain(admitted.by_ref());
                    self.shed(&mut ack, rest.map(|s| s.instance));
                    break;
                }
            }
        }
        ack.accepted = accepted;
        self.metrics.samples_accepted.inc_by(accepted);
        ack
    }

    /// Refuse these samples as `overloaded`: the leader's queue is full.
    fn shed(
        &self,
        ack: &mut Ack,
        instances: impl Iterator<Item = waymark_core::model::InstanceId>,
    ) {
        let before = ack.refused.len();
        ack.refused.extend(instances.map(|instance| RefusedSample {
            instance,
            reason: OVERLOADED.to_owned(),
        }));
        let shed = (ack.refused.len() - before) as u64;
        self.metrics
            .samples_refused
            .get_or_create(&ReasonLabels {
                reason: OVERLOADED.to_owned(),
            })
            .inc_by(shed);
    }
}

/// The refusal reason for samples shed because the leader's queue is full.
const OVERLOADED: &str = "overloaded";

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use tempfile::TempDir;
    use waymark_core::contract::HealthContract;
    use waymark_core::model::{InstanceId, Locality, Observation, SelfReport};
    use waymark_registry::machine::{Request, Response};
    use waymark_registry::state::{Applied, Command, Registration, Stamped};

    use super::*;
    use crate::authority::raft::{Member, RaftConfig};

    /// An instance of `pay` on node `n1` at 10.0.0.`n`, with a 30 s lease.
    fn registration(n: u8) -> Registration {
        Registration {
            service: "pay".parse().unwrap(),
            locality: Locality {
                region: "r1".parse().unwrap(),
                zone: "a".parse().unwrap(),
                node: "n1".parse().unwrap(),
            },
            address: waymark_core::model::Address {
                ip: std::net::Ipv4Addr::new(10, 0, 0, n).into(),
                port: 80,
            },
            weight: Default::default(),
            tags: Default::default(),
            metadata: Default::default(),
            lease_ms: 30_000,
        }
    }

    /// A single-member authority that leads, holding one registered instance.
    async fn leading() -> (TempDir, RaftNode, InstanceId) {
        let dir = TempDir::new().unwrap();
        let member = Member {
            raft_addr: "127.0.0.1:1".into(),
            api_addr: "127.0.0.1:1".into(),
        };
        let raft = RaftNode::open(RaftConfig::new(1, dir.path().join("raft"), member.clone()))
            .await
            .unwrap();
        raft.initialize(BTreeMap::from([(1, member)]))
            .await
            .unwrap();
        let mut metrics = raft.watch_metrics();
        while !metrics.borrow_and_update().state.is_leader() {
            metrics.changed().await.unwrap();
        }
        let write = |command| {
            let raft = raft.clone();
            async move {
                raft.write(Request::Registry(Stamped { at_ms: 1, command }))
                    .await
                    .unwrap()
            }
        };
        write(Command::PutService {
            service: "pay".parse().unwrap(),
            owner: "team".into(),
            contract: HealthContract::default(),
        })
        .await;
        let registered = write(Command::Register(registration(1))).await;
        let Response::Registry {
            outcome: Ok(Applied::Registered { instance, .. }),
        } = registered
        else {
            panic!("the instance registers: {registered:?}");
        };
        (dir, raft, instance)
    }

    fn ready(instance: &InstanceId, n: usize) -> Vec<WireSample> {
        (0..n)
            .map(|_| WireSample {
                instance: instance.clone(),
                observation: Observation::SelfReport(SelfReport::Ready),
            })
            .collect()
    }

    fn refused(hub: &EvidenceHub, reason: &str) -> u64 {
        hub.metrics
            .samples_refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .get()
    }

    #[test]
    fn a_passive_primary_instance_is_assigned_at_its_contracts_confirmation_cadence() {
        // Goal (ADR-04): probes drop to the confirmation cadence while callers' outcomes
        // are primary, and the assignment says so; every other instance keeps its interval.
        let mut registry = DesiredState::new();
        let mut contract = HealthContract::default();
        contract.passive.primary = Some(waymark_core::contract::PassivePrimary::default());
        let mut apply = |command| {
            registry
                .apply(Stamped { at_ms: 1, command })
                .unwrap_or_else(|e| panic!("{e}"))
        };
        apply(Command::PutService {
            service: "pay".parse().unwrap(),
            owner: "team".into(),
            contract,
        });
        let mut ids = Vec::new();
        for n in 1..=2u8 {
            let applied = apply(Command::Register(registration(n)));
            let Applied::Registered { instance, .. } = applied else {
                panic!("{applied:?}");
            };
            ids.push(instance);
        }
        let prober: NodeName = "prober-1".parse().unwrap();
        apply(Command::SetAssignment {
            assignment: ids
                .iter()
                .map(|i| (i.clone(), vec![prober.clone()]))
                .collect(),
        });
        let confirming: BTreeSet<InstanceId> = [ids[0].clone()].into();
        let targets = assigned_targets(&registry, &confirming, |_| true);
        let mine = &targets[&prober];
        let of = |id: &InstanceId| mine.iter().find(|t| &t.instance == id).unwrap();
        let primary = waymark_core::contract::PassivePrimary::default();
        assert!(of(&ids[0]).confirmation);
        assert_eq!(of(&ids[0]).probe.interval, primary.confirm_interval);
        assert!(!of(&ids[1]).confirmation);
        assert_eq!(
            of(&ids[1]).probe.interval,
            waymark_core::defaults::PROBE_INTERVAL
        );
        // With nothing confirming, every target keeps its interval.
        let plain = assigned_targets(&registry, &BTreeSet::new(), |_| true);
        assert!(plain[&prober].iter().all(|t| !t.confirmation));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_sheds_samples_as_overloaded_without_auditing_them() {
        // Goal: what does not fit is refused by name and counted, what fits is admitted,
        // and shedding never floods the audit path with denials.
        let (_dir, raft, instance) = leading().await;
        let hub = EvidenceHub::new(raft.clone(), AuthorityMetrics::default()).with_queue_len(3);
        let mut feed = hub.lead();
        let me = Reporter::Instance(instance.clone());

        let ack = hub.ingest(&me, ready(&instance, 5)).unwrap();
        assert_eq!(ack.accepted, 3);
        assert_eq!(ack.refused.len(), 2);
        assert!(
            ack.refused
                .iter()
                .all(|r| r.reason == OVERLOADED && r.instance == instance)
        );

        // The queue is full: a whole message is shed before any check.
        let ack = hub.ingest(&me, ready(&instance, 4)).unwrap();
        assert_eq!((ack.accepted, ack.refused.len()), (0, 4));
        assert_eq!(refused(&hub, OVERLOADED), 6);
        assert!(feed.denials.try_recv().is_err(), "shedding is not audited");

        // Once the leader drains, samples are admitted again, and a real denial is audited.
        for _ in 0..3 {
            feed.samples.recv().await.unwrap();
        }
        let stranger = Reporter::Instance("pay-elsewhere".parse().unwrap());
        let ack = hub.ingest(&stranger, ready(&instance, 1)).unwrap();
        assert_eq!(ack.accepted, 0);
        assert_ne!(ack.refused[0].reason, OVERLOADED);
        let denial = tokio::time::timeout(Duration::from_secs(5), feed.denials.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(denial.instance, instance.to_string());
        let ack = hub.ingest(&me, ready(&instance, 2)).unwrap();
        assert_eq!(ack.accepted, 2);
        raft.shutdown().await;
    }
}
