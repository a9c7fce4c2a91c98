//! Self-reports from workloads on this host (readiness, draining, dependency health).
//!
//! A workload opens the same evidence session it would open to the authority
//! (`waymark.evidence.v1.Evidence/Session`), to its node agent, over mutual TLS with its own
//! workload certificate. The session's identity is the reporter: a workload may report only
//! about itself and only self-reports; anything else is refused here, counted and named in
//! the acknowledgement. Accepted reports are relayed upstream as
//! [`AgentMessage::Relayed`], and the authority admits them only for instances that run on
//! this node — so a compromised agent cannot speak for workloads elsewhere either.

use tokio::sync::{mpsc, watch};
use tonic::Status;
use waymark_core::model::{EvidenceClass, NodeName, Reporter, ZoneName};

use super::metrics::AgentMetrics;
use crate::evidence::{Ack, AgentMessage, EvidenceSink, ProbeTarget, RefusedSample, WireSample};

/// The agent's local evidence sink: checks, then relays.
pub struct LocalRelay {
    outbound: mpsc::Sender<AgentMessage>,
    metrics: AgentMetrics,
}

impl LocalRelay {
    /// Relay accepted self-reports on `outbound` (the agent's evidence session).
    pub fn new(outbound: mpsc::Sender<AgentMessage>, metrics: AgentMetrics) -> Self {
        Self { outbound, metrics }
    }
}

/// Why a workload's sample is refused, if it is.
pub fn check(reporter: &Reporter, sample: &WireSample) -> Option<&'static str> {
    let Reporter::Instance(who) = reporter else {
        return Some("not_a_workload");
    };
    if &sample.instance != who {
        return Some("not_about_itself");
    }
    if sample.observation.class() != EvidenceClass::SelfReport {
        return Some("not_a_self_report");
    }
    None
}

impl EvidenceSink for LocalRelay {
    fn hello(
        &self,
        _node: &NodeName,
        _zone: &ZoneName,
    ) -> Result<watch::Receiver<Vec<ProbeTarget>>, Status> {
        Err(Status::permission_denied(
            "a node agent assigns no probe targets; connect to the authority",
        ))
    }

    fn goodbye(&self, _node: &NodeName) {}

    fn ingest(&self, reporter: &Reporter, samples: Vec<WireSample>) -> Result<Ack, Status> {
        let mut ack = Ack::default();
        let mut relayed = Vec::with_capacity(samples.len());
        for sample in samples {
            match check(reporter, &sample) {
                Some(reason) => {
                    tracing::warn!(%reporter, instance = %sample.instance, reason, "self-report refused");
                    self.metrics.self_reports_refused.inc();
                    ack.refused.push(RefusedSample {
                        instance: sample.instance,
                        reason: reason.to_owned(),
                    });
                }
                None => relayed.push(sample),
            }
        }
        if relayed.is_empty() {
            return Ok(ack);
        }
        let n = relayed.len() as u64;
        match self
            .outbound
            .try_send(AgentMessage::Relayed { samples: relayed })
        {
            Ok(()) => {
                ack.accepted = n;
                self.metrics.self_reports_relayed.inc_by(n);
            }
            Err(_) => {
                // The authority session is down or full: silence, which removes nothing.
                self.metrics.evidence_dropped.inc();
                return Err(Status::unavailable(
                    "the node agent cannot reach the authority now; report again later",
                ));
            }
        }
        Ok(ack)
    }

    fn ingest_relayed(&self, _node: &NodeName, _samples: Vec<WireSample>) -> Result<Ack, Status> {
        Err(Status::permission_denied(
            "node agents relay to the authority, not to each other",
        ))
    }
}

#[cfg(test)]
mod tests {
    use waymark_core::model::{InstanceId, Observation, SelfReport};

    use super::*;

    fn sample(instance: &str, observation: Observation) -> WireSample {
        WireSample {
            instance: InstanceId::try_new(instance).unwrap(),
            observation,
        }
    }

    #[test]
    fn a_workload_reports_only_about_itself_and_only_self_reports() {
        let me = Reporter::Instance(InstanceId::try_new("pay-1").unwrap());
        let ready = Observation::SelfReport(SelfReport::Ready);
        assert_eq!(check(&me, &sample("pay-1", ready.clone())), None);
        assert_eq!(
            check(&me, &sample("pay-2", ready.clone())),
            Some("not_about_itself")
        );
        let passive = Observation::Passive {
            requests: 1,
            errors: 1,
        };
        assert_eq!(
            check(&me, &sample("pay-1", passive)),
            Some("not_a_self_report")
        );
        let node = Reporter::Node(NodeName::try_new("n1").unwrap());
        assert_eq!(
            check(&node, &sample("pay-1", ready)),
            Some("not_a_workload")
        );
    }

    #[tokio::test]
    async fn accepted_reports_are_relayed_and_refusals_named() {
        let (tx, mut rx) = mpsc::channel(4);
        let relay = LocalRelay::new(tx, AgentMetrics::default());
        let me = Reporter::Instance(InstanceId::try_new("pay-1").unwrap());
        let ready = Observation::SelfReport(SelfReport::Ready);
        let ack = relay
            .ingest(
                &me,
                vec![
                    sample("pay-1", ready.clone()),
                    sample("pay-9", ready.clone()),
                ],
            )
            .unwrap();
        assert_eq!(ack.accepted, 1);
        assert_eq!(ack.refused.len(), 1);
        assert_eq!(ack.refused[0].reason, "not_about_itself");
        match rx.recv().await.unwrap() {
            AgentMessage::Relayed { samples } => {
                assert_eq!(samples, vec![sample("pay-1", ready)]);
            }
            other => panic!("relayed as {other:?}"),
        }
    }
}
