//! The domain model: who exists, where, and what was said about them.
//!
//! Names are validated newtypes over `Arc<str>` so they clone cheaply through every queue.
//! An [`InstanceId`] is never reused: a restart is a new instance, and the evaluator keeps
//! tombstones so a retired id cannot come back. A [`Sample`] always names its [`Reporter`];
//! evidence that cannot be attributed never reaches the core.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::units::Weight;

/// The longest name we accept (a DNS name's limit).
pub const NAME_LEN_MAX: usize = 253;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name was empty. Nothing was created; supply a name.
    #[error("{kind} is empty")]
    Empty {
        /// What kind of name it was meant to be.
        kind: &'static str,
    },
    /// The name was longer than [`NAME_LEN_MAX`]. Nothing was created.
    #[error("{kind} is {len} bytes long, more than {NAME_LEN_MAX}")]
    TooLong {
        /// What kind of name it was meant to be.
        kind: &'static str,
        /// Its length.
        len: usize,
    },
    /// The name held a character outside `[A-Za-z0-9._:-]`. Nothing was created.
    #[error("{kind} contains {found:?}; only letters, digits, '.', '_', ':' and '-' are allowed")]
    BadChar {
        /// What kind of name it was meant to be.
        kind: &'static str,
        /// The first character refused.
        found: char,
    },
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Eq, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(Arc<str>);

        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.0.hash(state);
            }
        }

        // Names are compared by content, but most comparisons are between clones of one
        // allocation (a view's keys, a member's zone): those are settled by the pointer.
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                if Arc::ptr_eq(&self.0, &other.0) {
                    std::cmp::Ordering::Equal
                } else {
                    self.0.cmp(&other.0)
                }
            }
        }

        impl $name {
            /// Validate and wrap a name.
            pub fn try_new(value: impl AsRef<str>) -> Result<Self, NameError> {
                validate_name($kind, value.as_ref())?;
                Ok(Self(Arc::from(value.as_ref())))
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": "string",
                    "description": concat!("A ", $kind, ": letters, digits, `.`, `_`, `:` and `-`."),
                    "minLength": 1,
                    "maxLength": NAME_LEN_MAX,
                    "pattern": "^[A-Za-z0-9._:-]+$",
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(value: String) -> Result<Self, NameError> {
                Self::try_new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0.to_string()
            }
        }

        impl std::str::FromStr for $name {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::try_new(s)
            }
        }
    };
}

name_type!(
    /// A service's name, unique in the estate.
    ServiceName,
    "service name"
);
name_type!(
    /// An instance id: unique, never reused (a restart is a new instance).
    InstanceId,
    "instance id"
);
name_type!(
    /// A region: an independent authority.
    RegionName,
    "region name"
);
name_type!(
    /// A zone: a failure domain inside a region.
    ZoneName,
    "zone name"
);
name_type!(
    /// A node: a host running one node agent.
    NodeName,
    "node name"
);

fn validate_name(kind: &'static str, value: &str) -> Result<(), NameError> {
    if value.is_empty() {
        return Err(NameError::Empty { kind });
    }
    if value.len() > NAME_LEN_MAX {
        return Err(NameError::TooLong {
            kind,
            len: value.len(),
        });
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    match value.chars().find(|c| !allowed(*c)) {
        Some(found) => Err(NameError::BadChar { kind, found }),
        None => Ok(()),
    }
}

/// Where an instance runs.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Locality {
    /// The region whose authority owns it.
    pub region: RegionName,
    /// Its failure domain inside the region.
    pub zone: ZoneName,
    /// The host it runs on.
    pub node: NodeName,
}

/// An instance's address as callers dial it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub struct Address {
    /// IPv4 or IPv6.
    pub ip: IpAddr,
    /// TCP port.
    pub port: u16,
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::net::SocketAddr::new(self.ip, self.port).fmt(f)
    }
}

/// How an instance came to exist; it decides which paths may remove it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Reconciled from an orchestrator (Kubernetes EndpointSlices): removed when it says so.
    Orchestrator,
    /// Registered through the API with a lease: removed on expiry or deregistration.
    Registered,
    /// Declared by policy (a third party): governed by passive outcomes alone.
    External,
}

/// One registered endpoint of a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Instance {
    /// Unique and never reused.
    pub id: InstanceId,
    /// The service it belongs to.
    pub service: ServiceName,
    /// Where it runs.
    pub locality: Locality,
    /// Where callers reach it.
    pub address: Address,
    /// How it came to exist.
    pub origin: Origin,
    /// Its weight when nothing reduces it.
    pub weight: Weight,
    /// Free-form labels, filterable in the API, DNS and views (subsets).
    pub tags: BTreeSet<String>,
    /// Key/value metadata carried into views.
    pub metadata: BTreeMap<String, String>,
}

/// The three evidence classes, each wrong in its own way (ADR-04).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceClass {
    /// Active checks from outside, by an assigned prober.
    Probe,
    /// What the instance says about itself.
    SelfReport,
    /// What callers observed (Envoy's load reports).
    Passive,
}

impl EvidenceClass {
    /// Every class, in a fixed order.
    pub const ALL: [Self; 3] = [Self::Probe, Self::SelfReport, Self::Passive];

    /// A dense index, for per-class arrays.
    pub const fn index(self) -> usize {
        match self {
            Self::Probe => 0,
            Self::SelfReport => 1,
            Self::Passive => 2,
        }
    }

    /// The name used in logs, metrics and the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Probe => "probe",
            Self::SelfReport => "self_report",
            Self::Passive => "passive",
        }
    }
}

impl std::fmt::Display for EvidenceClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who produced a sample. The shell derives it from the connection's mutual-TLS identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum Reporter {
    /// A node agent (prober, or forwarder of its sidecars' load reports).
    Node(NodeName),
    /// A workload instance speaking about itself.
    Instance(InstanceId),
}

impl std::fmt::Display for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Node(n) => write!(f, "node/{n}"),
            Self::Instance(i) => write!(f, "instance/{i}"),
        }
    }
}

/// A probe's outcome. `Refused` is the hard failure: the port is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// The check passed.
    Pass,
    /// The check ran and failed (an HTTP 503, a gRPC `NOT_SERVING`).
    Fail,
    /// The check did not answer in time: ambiguous, so soft.
    Timeout,
    /// The connection was refused: nothing listens. Hard.
    Refused,
}

/// A dependency's condition as its dependent reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DependencyStatus {
    /// Working.
    Ok,
    /// Slow or partly failing.
    Degraded,
    /// Not usable.
    Down,
}

/// What an instance says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SelfReport {
    /// Ready for traffic.
    Ready,
    /// Not ready, with the instance's own words.
    NotReady {
        /// The instance's explanation, truncated by the core.
        detail: String,
    },
    /// Shutting down gracefully: stop sending new work.
    Draining,
    /// The condition of one declared dependency.
    Dependency {
        /// The dependency's name as declared in the health contract.
        name: String,
        /// Its condition.
        status: DependencyStatus,
    },
}

/// One observation, by class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "class")]
pub enum Observation {
    /// An active check's result.
    Probe {
        /// Its outcome.
        health: Health,
        /// The check's output, if any (truncated by the core).
        detail: Option<String>,
    },
    /// The instance speaking about itself.
    SelfReport(SelfReport),
    /// Request outcomes one caller saw over its reporting interval.
    Passive {
        /// Requests completed in the interval.
        requests: u64,
        /// Of those, how many failed (5xx, resets, timeouts).
        errors: u64,
    },
}

impl Observation {
    /// The evidence class this observation belongs to.
    pub fn class(&self) -> EvidenceClass {
        match self {
            Self::Probe { .. } => EvidenceClass::Probe,
            Self::SelfReport(_) => EvidenceClass::SelfReport,
            Self::Passive { .. } => EvidenceClass::Passive,
        }
    }
}

/// One attributable piece of evidence: who said what about which instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// The instance it is about.
    pub instance: InstanceId,
    /// Who said it.
    pub reporter: Reporter,
    /// What was observed.
    pub observation: Observation,
}

/// Facts about an instance's existence that bypass scoring entirely.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Lifecycle {
    /// The node agent saw the process exit: hard failure until evidence says it is back.
    ProcessGone,
    /// The orchestrator marks it terminating (Kubernetes `serving=false, terminating=true`).
    Terminating,
    /// The orchestrator says it serves again (`ready=true`): terminating is over.
    Serving,
    /// An operator put it in maintenance, with a reason.
    MaintenanceOn {
        /// Why, for the audit log and `explain`.
        reason: String,
    },
    /// Maintenance is over.
    MaintenanceOff,
    /// Its lease expired (registered instances): retired for good.
    LeaseExpired,
    /// The orchestrator deleted it: retired for good.
    Deleted,
    /// It deregistered itself on graceful shutdown: retired for good.
    Deregistered,
}

#[cfg(test)]
mod name_order_tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};

    use proptest::prelude::*;

    use super::ZoneName;

    fn hash(z: &ZoneName) -> u64 {
        let mut h = DefaultHasher::new();
        z.hash(&mut h);
        h.finish()
    }

    proptest! {
        /// The pointer shortcut never changes an answer: names compare, order and hash by
        /// their text, whether they share an allocation or not.
        #[test]
        fn names_compare_by_their_text(a in "[a-z]{1,3}", b in "[a-z]{1,3}") {
            let (za, zb) = (ZoneName::try_new(&a).unwrap(), ZoneName::try_new(&b).unwrap());
            let again = ZoneName::try_new(&a).unwrap();
            let clone = za.clone();
            prop_assert_eq!(za == zb, a == b);
            prop_assert_eq!(za.cmp(&zb), a.cmp(&b));
            prop_assert_eq!(za.partial_cmp(&zb), Some(a.cmp(&b)));
            prop_assert!(za == again && za == clone);
            prop_assert_eq!(za.cmp(&again), std::cmp::Ordering::Equal);
            prop_assert_eq!(hash(&za), hash(&again));
        }
    }
}
