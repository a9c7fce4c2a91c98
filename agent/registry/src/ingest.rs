//! Evidence admission at the authority (ADR-15): who may report what about whom.
//!
//! The shell turns each connection's verified mutual-TLS identity into a
//! [`Reporter`](waymark_core::model::Reporter) and asks [`admit`] before a sample reaches the
//! evaluator: a probe result only from a node assigned to that target, a self-report only
//! from the instance itself, caller outcomes only from a node agent, and nothing about an
//! instance the registry does not hold. A refusal is typed for the metric and the audit
//! log, and changes nothing. Pure.

use waymark_core::model::{EvidenceClass, InstanceId, NodeName, Reporter, Sample};

use crate::state::DesiredState;

/// A refusal the leader writes to the audit log (aggregated per reporter and reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// Who sent it.
    pub reporter: Reporter,
    /// Why it was refused.
    pub reason: String,
    /// An example instance it was about.
    pub instance: String,
}

/// Why a sample was refused at ingest. Nothing was applied; count it by [`IngestError::label`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    /// The sample is about an instance the registry does not hold (or has retired).
    #[error("no live instance {instance}")]
    UnknownTarget {
        /// The instance.
        instance: InstanceId,
    },
    /// A probe result from a node that is not assigned to probe this target.
    #[error("node {node} is not assigned to probe {instance}")]
    NotAssigned {
        /// The node.
        node: NodeName,
        /// The target.
        instance: InstanceId,
    },
    /// A reporter of the wrong kind for the class (e.g. a workload reporting a probe, or a
    /// self-report about another instance).
    #[error("{reporter} may not report {class} evidence about {instance}")]
    NotAttributable {
        /// Who.
        reporter: Reporter,
        /// The class.
        class: EvidenceClass,
        /// About whom.
        instance: InstanceId,
    },
}

impl IngestError {
    /// A stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::UnknownTarget { .. } => "unknown_target",
            Self::NotAssigned { .. } => "not_assigned",
            Self::NotAttributable { .. } => "not_attributable",
        }
    }
}

/// Whether `sample` may be applied, given the registry's instances and prober assignment.
pub fn admit(state: &DesiredState, sample: &Sample) -> Result<(), IngestError> {
    let target = &sample.instance;
    if state.instance(target).is_none() {
        return Err(IngestError::UnknownTarget {
            instance: target.clone(),
        });
    }
    let class = sample.observation.class();
    match (&sample.reporter, class) {
        (Reporter::Node(node), EvidenceClass::Probe) => {
            if state.probers(target).contains(node) {
                Ok(())
            } else {
                Err(IngestError::NotAssigned {
                    node: node.clone(),
                    instance: target.clone(),
                })
            }
        }
        (Reporter::Node(_), EvidenceClass::Passive) => Ok(()),
        (Reporter::Instance(who), EvidenceClass::SelfReport) if who == target => Ok(()),
        (reporter, class) => Err(IngestError::NotAttributable {
            reporter: reporter.clone(),
            class,
            instance: target.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::net::{IpAddr, Ipv4Addr};

    use waymark_core::contract::HealthContract;
    use waymark_core::model::*;
    use waymark_core::units::Weight;

    use super::*;
    use crate::state::{Command, Stamped};

    fn id(s: &str) -> InstanceId {
        InstanceId::try_new(s).unwrap()
    }

    fn node(s: &str) -> NodeName {
        NodeName::try_new(s).unwrap()
    }

    fn state() -> DesiredState {
        let mut s = DesiredState::new();
        let service = ServiceName::try_new("pay").unwrap();
        let put = Command::PutService {
            service: service.clone(),
            owner: "t".into(),
            contract: HealthContract::default(),
        };
        s.apply(Stamped {
            at_ms: 1,
            command: put,
        })
        .unwrap();
        let pod = Instance {
            id: id("pod-1"),
            service,
            locality: Locality {
                region: RegionName::try_new("eu").unwrap(),
                zone: ZoneName::try_new("a").unwrap(),
                node: node("n1"),
            },
            address: Address {
                ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                port: 80,
            },
            origin: Origin::Orchestrator,
            weight: Weight::DEFAULT,
            tags: BTreeSet::new(),
            metadata: BTreeMap::new(),
        };
        s.apply(Stamped {
            at_ms: 2,
            command: Command::Observe {
                instance: pod,
                draining: false,
            },
        })
        .unwrap();
        let assignment = [(id("pod-1"), vec![node("prober-1")])]
            .into_iter()
            .collect();
        s.apply(Stamped {
            at_ms: 3,
            command: Command::SetAssignment { assignment },
        })
        .unwrap();
        s
    }

    fn sample(reporter: Reporter, instance: &str, observation: Observation) -> Sample {
        Sample {
            instance: id(instance),
            reporter,
            observation,
        }
    }

    #[test]
    fn who_may_report_what_table() {
        let s = state();
        let probe = || Observation::Probe {
            health: Health::Fail,
            detail: None,
        };
        let ready = || Observation::SelfReport(SelfReport::Ready);
        let outcomes = || Observation::Passive {
            requests: 10,
            errors: 0,
        };
        let cases: Vec<(Sample, Result<(), &str>)> = vec![
            (
                sample(Reporter::Node(node("prober-1")), "pod-1", probe()),
                Ok(()),
            ),
            (
                sample(Reporter::Node(node("prober-2")), "pod-1", probe()),
                Err("not_assigned"),
            ),
            (
                sample(Reporter::Instance(id("pod-1")), "pod-1", probe()),
                Err("not_attributable"),
            ),
            (
                sample(Reporter::Instance(id("pod-1")), "pod-1", ready()),
                Ok(()),
            ),
            (
                sample(Reporter::Instance(id("pod-2")), "pod-1", ready()),
                Err("not_attributable"),
            ),
            (
                sample(Reporter::Node(node("any-caller")), "pod-1", outcomes()),
                Ok(()),
            ),
            (
                sample(Reporter::Instance(id("pod-1")), "pod-1", outcomes()),
                Err("not_attributable"),
            ),
            (
                sample(Reporter::Node(node("prober-1")), "ghost", probe()),
                Err("unknown_target"),
            ),
        ];
        for (i, (s_, want)) in cases.into_iter().enumerate() {
            assert_eq!(
                admit(&s, &s_).map_err(|e| e.label()),
                want,
                "case {i}: {s_:?}"
            );
        }
    }
}
