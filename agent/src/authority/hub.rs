//! The member's evidence hub: admits attributed samples to the leader's pipeline, tracks
//! the connected probers, and hands each prober its targets.
//!
//! Samples are checked against the registry (assignment, self-only, live target) before
//! they are queued; refusals are counted by reason and queued for the audit log. On a
//! follower the hub refuses sessions and names the leader, so agents go there.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{mpsc, watch};
use tonic::Status;
use waymark_core::model::{EvidenceClass, NodeName, Reporter, Sample, ZoneName};
use waymark_registry::ingest::admit;
use waymark_registry::state::DesiredState;

use super::metrics::{AuthorityMetrics, ReasonLabels};
use super::raft::RaftNode;
use crate::evidence::{Ack, EvidenceSink, ProbeTarget, RefusedSample, WireSample};
use crate::gossip::{Liveness, MemberState, Role};

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
        }
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
        let (stx, srx) = mpsc::channel(QUEUE_LEN);
        let (dtx, drx) = mpsc::channel(1024);
        self.lock().feed = Some((stx, dtx));
        LeaderFeed {
            samples: srx,
            denials: drx,
        }
    }

    /// Stop feeding (leadership lost).
    pub fn follow(&self) {
        self.lock().feed = None;
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
        let mut per_node: BTreeMap<NodeName, Vec<ProbeTarget>> = BTreeMap::new();
        for record in registry.instances() {
            let i = &record.instance;
            let Some(probe) = registry
                .service(&i.service)
                .and_then(|s| s.contract.probe.clone())
            else {
                continue;
            };
            for node in registry.probers(&i.id) {
                per_node.entry(node.clone()).or_default().push(ProbeTarget {
                    instance: i.id.clone(),
                    service: i.service.clone(),
                    address: i.address,
                    probe: probe.clone(),
                });
            }
        }
        let inner = self.lock();
        for (node, tx) in &inner.targets {
            let targets = per_node.remove(node).unwrap_or_default();
            tx.send_if_modified(|held| {
                if *held == targets {
                    false
                } else {
                    *held = targets;
                    true
                }
            });
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
            .with_state(|s, _| self.refresh_targets(s.registry()));
        Ok(rx)
    }

    fn goodbye(&self, node: &NodeName) {
        {
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
        }
        self.membership.send_modify(|n| *n += 1);
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
        let mut ack = Ack::default();
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
        for sample in admitted {
            let instance = sample.instance.clone();
            match tx.try_send(sample) {
                Ok(()) => {
                    ack.accepted += 1;
                    self.metrics.samples_accepted.inc();
                }
                Err(_) => refuse(&instance, "overloaded"),
            }
        }
        Ok(ack)
    }
}
