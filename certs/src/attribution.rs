//! Attribution: may this authenticated identity say this about that instance or service?
//!
//! The checks the rest of waymark calls before a signal is allowed to move eligibility:
//!
//! - [`may_report_about`]: a workload only about itself; an authority member about
//!   instances in its own region; node agents only through a probe assignment; operators
//!   never (they override instead).
//! - [`may_node_report_probe`]: a node agent only about targets of its own, unexpired
//!   [`ProbeAssignment`].
//! - [`may_operator_override`]: an operator only within the scopes an [`OverridePolicy`]
//!   grants it.
//!
//! Pure functions over identities and policy; time arrives as data. A denial is a
//! [`Denied`] value: the caller drops the signal, counts it and answers the peer.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use crate::identity::{Identity, IdentityKind, Name, Subject, TrustDomain};

/// One workload instance, named within the estate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceRef {
    /// Region the instance runs in.
    pub region: Name,
    /// Its service.
    pub service: Name,
    /// Its instance id.
    pub instance: Name,
}

/// One service in one region.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceRef {
    /// Region.
    pub region: Name,
    /// Service name.
    pub service: Name,
}

/// The targets an authority assigned to one node agent, valid until `valid_until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeAssignment {
    /// Trust domain of the estate that made the assignment.
    pub trust_domain: TrustDomain,
    /// Region of the assigned node.
    pub region: Name,
    /// The assigned node.
    pub node: Name,
    /// Instances the node may probe and report about.
    pub targets: BTreeSet<InstanceRef>,
    /// The assignment lapses at this instant.
    pub valid_until: SystemTime,
}

/// What an operator may override.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum OverrideScope {
    /// Every service everywhere.
    Estate,
    /// Every service in one region.
    Region(Name),
    /// One service in one region.
    Service(ServiceRef),
}

/// Override grants per operator name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverridePolicy {
    /// Trust domain of the estate.
    pub trust_domain: TrustDomain,
    /// Scopes granted to each operator.
    pub grants: BTreeMap<Name, BTreeSet<OverrideScope>>,
}

/// Why a signal is not attributable to its sender. In every case the signal must be
/// dropped (it changes nothing), counted, and answered with a permission error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Denied {
    /// The sender belongs to another trust domain. Drop; the sender is misconfigured.
    #[error("identity {identity} is not in trust domain {expected}")]
    WrongTrustDomain {
        /// The sender.
        identity: Identity,
        /// This estate's trust domain.
        expected: TrustDomain,
    },
    /// The sender's kind may not send this signal at all. Drop; route it via the right role.
    #[error("{kind} identities may not send this signal")]
    WrongKind {
        /// The sender's kind.
        kind: IdentityKind,
    },
    /// A workload reported about another instance. Drop; instances report only on
    /// themselves.
    #[error("a workload may report only about itself")]
    NotSelf,
    /// The sender serves another region. Drop; the report belongs to that region's
    /// authority.
    #[error("identity {identity} does not serve region {region}")]
    OtherRegion {
        /// The sender.
        identity: Identity,
        /// The region reported on.
        region: Name,
    },
    /// The assignment belongs to another node. Drop; the node must use its own.
    #[error("assignment is for node {assigned}, not for the reporting node")]
    NotAssignedNode {
        /// Node named by the assignment.
        assigned: Name,
    },
    /// The instance is not a target of the node's assignment. Drop; the prober is stale
    /// or lying.
    #[error("instance is not among the node's assigned probe targets")]
    NotATarget,
    /// The assignment lapsed. Drop; the node must fetch a fresh assignment.
    #[error("probe assignment has lapsed")]
    AssignmentLapsed,
    /// The operator holds no grant covering the service. Drop and audit the attempt.
    #[error("operator {operator} has no override grant for service {service} in region {region}")]
    NoGrant {
        /// Operator name.
        operator: Name,
        /// Region of the service.
        region: Name,
        /// The service.
        service: Name,
    },
}

/// May `reporter` report about `instance` directly (without a probe assignment)?
pub fn may_report_about(
    reporter: &Identity,
    instance: &InstanceRef,
    trust_domain: &TrustDomain,
) -> Result<(), Denied> {
    same_trust_domain(reporter, trust_domain)?;
    match reporter.subject() {
        Subject::Workload {
            region,
            service,
            instance: id,
        } => {
            let is_self = *region == instance.region
                && *service == instance.service
                && *id == instance.instance;
            if is_self {
                Ok(())
            } else {
                Err(Denied::NotSelf)
            }
        }
        Subject::Authority { region, .. } => same_region(reporter, region, &instance.region),
        Subject::Node { .. } | Subject::Operator { .. } => Err(Denied::WrongKind {
            kind: reporter.kind(),
        }),
    }
}

/// May node agent `node` report probe results about `instance`, given `assignment`, at
/// `now`?
pub fn may_node_report_probe(
    node: &Identity,
    instance: &InstanceRef,
    assignment: &ProbeAssignment,
    now: SystemTime,
) -> Result<(), Denied> {
    same_trust_domain(node, &assignment.trust_domain)?;
    let Subject::Node {
        region,
        node: node_name,
    } = node.subject()
    else {
        return Err(Denied::WrongKind { kind: node.kind() });
    };
    if *region != assignment.region || *node_name != assignment.node {
        return Err(Denied::NotAssignedNode {
            assigned: assignment.node.clone(),
        });
    }
    if now >= assignment.valid_until {
        return Err(Denied::AssignmentLapsed);
    }
    if !assignment.targets.contains(instance) {
        return Err(Denied::NotATarget);
    }
    Ok(())
}

/// May `operator` override the eligibility of `service` under `policy`?
pub fn may_operator_override(
    operator: &Identity,
    service: &ServiceRef,
    policy: &OverridePolicy,
) -> Result<(), Denied> {
    same_trust_domain(operator, &policy.trust_domain)?;
    let Subject::Operator { name } = operator.subject() else {
        return Err(Denied::WrongKind {
            kind: operator.kind(),
        });
    };
    let covered = policy.grants.get(name).is_some_and(|scopes| {
        scopes.iter().any(|scope| match scope {
            OverrideScope::Estate => true,
            OverrideScope::Region(r) => *r == service.region,
            OverrideScope::Service(s) => s == service,
        })
    });
    if covered {
        Ok(())
    } else {
        Err(Denied::NoGrant {
            operator: name.clone(),
            region: service.region.clone(),
            service: service.service.clone(),
        })
    }
}

fn same_trust_domain(identity: &Identity, expected: &TrustDomain) -> Result<(), Denied> {
    if identity.trust_domain() == expected {
        Ok(())
    } else {
        Err(Denied::WrongTrustDomain {
            identity: identity.clone(),
            expected: expected.clone(),
        })
    }
}

fn same_region(identity: &Identity, own: &Name, target: &Name) -> Result<(), Denied> {
    if own == target {
        Ok(())
    } else {
        Err(Denied::OtherRegion {
            identity: identity.clone(),
            region: target.clone(),
        })
    }
}

#[cfg(test)]
#[path = "attribution_test.rs"]
mod tests;
