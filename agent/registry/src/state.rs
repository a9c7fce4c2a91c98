//! The region's desired state, as the Raft state machine applies it.
//!
//! Every change is a [`Command`] stamped by the leader with the wall-clock time as *data*
//! ([`Stamped::at_ms`]), so every replica applying the same log reaches the same state.
//! That time is used for one thing only — lease expiry, which is local to the region — and
//! is clamped so it never runs backwards across leader changes. Refused commands return a
//! [`RegistryError`] and change nothing; the driver still acknowledges the log entry.
//!
//! Ids of registered instances are issued here from a sequence that is part of the state,
//! so an id is never reused, even after a restart or a leader change. Orchestrated
//! instances bring their own ids (the pod UID) and are tombstoned when deleted.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};
use waymark_core::contract::{CapabilityProfile, ContractError, HealthContract};
use waymark_core::model::{
    Address, Instance, InstanceId, Locality, NodeName, Origin, RegionName, ServiceName, ZoneName,
};
use waymark_core::units::Permille;
use waymark_core::units::Weight;

use crate::acl::{Acl, AclApplied, AclCommand, AclError};

/// Shortest lease a registration may ask for.
pub const LEASE_MS_MIN: u64 = 5_000;
/// Longest lease a registration may ask for.
pub const LEASE_MS_MAX: u64 = 600_000;
/// Tombstones kept for orchestrator ids; the oldest are forgotten beyond this.
pub const TOMBSTONES_MAX: usize = 100_000;
/// Longest actor or reason a region failover command may carry, in bytes.
pub const JUSTIFICATION_LEN_MAX: usize = 1_024;
/// Longest maintenance reason, in bytes.
pub const REASON_LEN_MAX: usize = JUSTIFICATION_LEN_MAX;
/// Longest owner of a service, in bytes.
pub const OWNER_LEN_MAX: usize = 256;
/// Most tags one instance may carry.
pub const TAGS_MAX: usize = 64;
/// Longest tag, in bytes.
pub const TAG_LEN_MAX: usize = 128;
/// Most metadata entries one instance may carry.
pub const METADATA_ENTRIES_MAX: usize = 64;
/// Ceiling on a policy's `max_manual_withdrawals`.
pub const MANUAL_WITHDRAWALS_MAX: u32 = 100_000;
/// Longest metadata key, in bytes.
pub const METADATA_KEY_LEN_MAX: usize = 128;
/// Longest metadata value, in bytes.
pub const METADATA_VALUE_LEN_MAX: usize = 1_024;
/// Longest service name: registered ids are `<service>-r<seq>`, and the room for the
/// largest sequence (`-r` and twenty digits) is kept inside the name limit, so an id can
/// always be formed for a service that could be declared.
pub const SERVICE_NAME_LEN_MAX: usize = waymark_core::model::NAME_LEN_MAX - 22;
/// Most services a region holds.
pub const SERVICES_MAX: usize = 100_000;
/// Most live instances a region holds.
pub const INSTANCES_MAX: usize = 1_000_000;
/// Most probers assigned to one target.
pub const PROBERS_PER_TARGET_MAX: usize = 16;
/// Most zones or regions a failover order may list.
pub const FAILOVER_ORDER_MAX: usize = 64;
/// Most services a policy may allow to resolve one service.
pub const ALLOWED_CALLERS_MAX: usize = 4_096;

/// Most instances one [`Command::ExpireInstances`] retires; the leader proposes more in
/// several.
pub const EXPIRE_BATCH_MAX: usize = 4_096;

/// A command and the leader's clock when it was proposed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamped {
    /// Unix milliseconds, as data; used for leases only.
    pub at_ms: u64,
    /// The change.
    pub command: Command,
}

/// A change to the desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum Command {
    /// Create or update a service and its health contract (validated here).
    PutService {
        /// The service.
        service: ServiceName,
        /// The owning team, told about quarantines.
        owner: String,
        /// Its health contract.
        contract: HealthContract,
    },
    /// Remove a service with no instances left.
    RemoveService {
        /// The service.
        service: ServiceName,
    },
    /// Register an instance of a runtime nothing watches; the id is issued here.
    Register(Registration),
    /// Renew a registered instance's lease.
    Renew {
        /// The instance.
        instance: InstanceId,
    },
    /// Deregister (graceful shutdown): retired for good.
    Deregister {
        /// The instance.
        instance: InstanceId,
    },
    /// Retire every registered instance whose committed lease end has passed. Kept so that
    /// logs written before [`Command::ExpireInstances`] still apply; a leader no longer
    /// proposes it.
    ExpireLeases,
    /// Retire these registered instances: their leases ended on the leader's clocks.
    /// Renewals never reach the log — the leader keeps them in memory (as Consul keeps
    /// session TTLs), each term restarting every lease first ([`Command::RestartLeases`])
    /// — so only the leader can tell a lease ended. An instance no longer live, or not
    /// leased, is skipped: a deregistration may have come first.
    ExpireInstances {
        /// The instances, at most [`EXPIRE_BATCH_MAX`].
        instances: Vec<InstanceId>,
    },
    /// A new leader restarts every lease's clock: while no leader was there, nobody could
    /// hear a renewal, so no instance is retired for silence the region itself caused.
    /// Each lease ends no earlier than a whole lease length from now (never shortened).
    RestartLeases,
    /// The orchestrator reports an instance (created or changed).
    Observe {
        /// The instance, with its orchestrator-given id.
        instance: Instance,
        /// The orchestrator marks it terminating: it drains.
        #[serde(default)]
        draining: bool,
    },
    /// Policy declares an external endpoint (a third party, governed by passive evidence).
    DeclareExternal {
        /// The endpoint; its id is chosen by the operator and never reused.
        instance: Instance,
    },
    /// Policy stops declaring an external endpoint: retired for good.
    RemoveExternal {
        /// The endpoint.
        instance: InstanceId,
    },
    /// An operator puts an instance in maintenance (with a reason) or takes it out.
    Maintenance {
        /// The instance.
        instance: InstanceId,
        /// `Some(reason)` to start, `None` to end.
        reason: Option<String>,
    },
    /// The orchestrator deleted an instance: retired for good.
    Forget {
        /// The instance.
        instance: InstanceId,
    },
    /// Set a service's routing policy (fraction override, failover order, who may resolve it).
    SetPolicy {
        /// The service.
        service: ServiceName,
        /// The policy.
        policy: ServicePolicyRecord,
    },
    /// An operator evacuates a zone, shifts it back, or completes a manual shift-back.
    Evacuation {
        /// The zone.
        zone: ZoneName,
        /// What to do.
        intent: EvacuationIntent,
    },
    /// The leader records an evacuation's progress, so a new leader resumes it where it was.
    EvacuationProgress {
        /// The zone.
        zone: ZoneName,
        /// Where it stands; `None` once it is over.
        progress: Option<EvacuationRecord>,
    },
    /// Shift this region's tier-2 preference away from a peer region, shift it back, or
    /// complete a manual shift-back (ADR-14). Proposed by an operator's routing control or
    /// by the out-of-band failover signal; either way it names who asked and why.
    RegionFailover {
        /// The peer region.
        region: RegionName,
        /// What to do.
        intent: RegionFailoverIntent,
        /// Who asked: an operator's identity, or the failover signal's. Not empty.
        actor: String,
        /// Why: kept with the failover so whoever finds it still in place can ask. Not
        /// empty.
        reason: String,
    },
    /// The leader records a region failover's progress, so a new leader resumes it.
    RegionFailoverProgress {
        /// The peer region.
        region: RegionName,
        /// Where it stands; `None` once it is over.
        progress: Option<RegionFailoverRecord>,
    },
    /// Replace the prober assignment (computed by the leader from gossip membership).
    SetAssignment {
        /// Targets and their probers.
        assignment: BTreeMap<InstanceId, Vec<NodeName>>,
    },
    /// Change the prober assignment of some targets only (the leader's answer to instances
    /// that came or changed while the probers stayed the same), so an entry's size follows
    /// what changed, not the region. Targets no longer registered are skipped.
    PatchAssignment {
        /// Targets and their new probers.
        set: BTreeMap<InstanceId, Vec<NodeName>>,
        /// Targets that no longer have a prober.
        remove: BTreeSet<InstanceId>,
    },
    /// Change the region's grants or tokens (authorised by the API before proposing).
    Acl {
        /// The change.
        change: AclCommand,
    },
}

/// A registration request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Registration {
    /// The service.
    pub service: ServiceName,
    /// Where it runs.
    pub locality: Locality,
    /// Where callers reach it.
    pub address: Address,
    /// Its weight.
    #[serde(default)]
    pub weight: Weight,
    /// Labels.
    #[serde(default)]
    pub tags: BTreeSet<String>,
    /// Metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Requested lease; 0 (or absent) asks for the platform default.
    #[serde(default)]
    pub lease_ms: u64,
}

/// A service's routing policy, beside its health contract.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServicePolicyRecord {
    /// Overrides the contract's minimum healthy fraction per zone (ADR-08), e.g. during an
    /// incident. Permille, 1..=1000.
    #[serde(default)]
    pub min_healthy_override: Option<Permille>,
    /// Zones of this region, most preferred first (the priorities follow).
    #[serde(default)]
    pub failover_zones: Vec<ZoneName>,
    /// Peer regions, most preferred first.
    #[serde(default)]
    pub failover_regions: Vec<RegionName>,
    /// Services whose workloads may resolve this one; absent means everyone (ADR-15).
    #[serde(default)]
    pub allowed_callers: Option<BTreeSet<ServiceName>>,
    /// How many of its instances may be withdrawn by hand at once (the disruption budget
    /// overrides are checked against); absent means a quarter of its instances, at least
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MANUAL_WITHDRAWALS_MAX))]
    pub max_manual_withdrawals: Option<u32>,
}

/// The JSON Schema of a policy (`PUT /v1/services/{service}/policy`'s body), as a
/// standalone document.
pub fn policy_schema() -> schemars::Schema {
    let mut schema = schemars::schema_for!(ServicePolicyRecord);
    waymark_core::schema::stamp(&mut schema, "waymark service policy");
    schema
}

/// What an operator asks of a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum EvacuationIntent {
    /// Move traffic away, in steps. `manual` marks an operator's failover: its shift-back
    /// waits for explicit completion.
    Evacuate {
        /// Whether shift-back needs explicit completion.
        #[serde(default)]
        manual: bool,
    },
    /// Bring traffic back, in steps.
    ShiftBack,
    /// Finish a manual shift-back holding at its last step.
    CompleteShiftBack,
}

/// An evacuation's progress, as the leader last recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EvacuationRecord {
    /// Share of the zone's traffic moved away.
    pub moved: Permille,
    /// Moving traffic back (`true`) or away.
    pub back: bool,
    /// Started by a manual failover.
    pub manual: bool,
    /// Holding at its last step for an operator's completion.
    pub awaiting_completion: bool,
}

/// What is asked of a peer region's share of this region's tier-2 traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum RegionFailoverIntent {
    /// Move the peer region's share away, in steps. `manual` marks an operator's failover:
    /// its shift-back waits for explicit completion.
    Failover {
        /// Whether shift-back needs explicit completion.
        #[serde(default)]
        manual: bool,
    },
    /// Bring the share back, in steps.
    ShiftBack,
    /// Finish a manual shift-back holding at its last step.
    CompleteShiftBack,
}

/// A region failover's progress, as the leader last recorded it, and who last moved it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionFailoverRecord {
    /// Share of the peer region's tier-2 traffic moved away.
    pub moved: Permille,
    /// Moving traffic back (`true`) or away.
    pub back: bool,
    /// Started by a manual failover.
    pub manual: bool,
    /// Holding at its last step for an operator's completion.
    pub awaiting_completion: bool,
    /// Who asked for the last accepted command.
    #[serde(default)]
    pub actor: String,
    /// Why they asked.
    #[serde(default)]
    pub reason: String,
}

/// Why an instance left the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RetireCause {
    /// Its lease expired.
    LeaseExpired,
    /// It deregistered.
    Deregistered,
    /// The orchestrator deleted it.
    Deleted,
}

/// What an applied command did, for the driver to feed the evaluator and answer clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum Applied {
    /// A service was created or updated.
    ServicePut,
    /// A service was removed.
    ServiceRemoved {
        /// The service.
        service: ServiceName,
    },
    /// An instance was registered with this id, leased until this time.
    Registered {
        /// The issued id.
        instance: InstanceId,
        /// Lease end, unix ms.
        expires_at_ms: u64,
    },
    /// A lease was renewed.
    Renewed {
        /// New lease end, unix ms.
        expires_at_ms: u64,
    },
    /// An orchestrated or declared instance was created or updated.
    Observed {
        /// The instance.
        instance: InstanceId,
        /// Whether it is draining (terminating) now.
        draining: bool,
    },
    /// An instance's maintenance changed.
    Maintenance {
        /// The instance.
        instance: InstanceId,
        /// The reason, while in maintenance.
        reason: Option<String>,
    },
    /// Instances were retired.
    Retired {
        /// Which, and why.
        instances: Vec<(InstanceId, RetireCause)>,
    },
    /// The prober assignment was replaced.
    AssignmentSet,
    /// Every lease was given at least a whole length from now.
    LeasesRestarted {
        /// How many leases were extended.
        extended: usize,
    },
    /// A service's policy was set.
    PolicySet {
        /// The service.
        service: ServiceName,
    },
    /// An operator's evacuation intent was recorded (the leader's assembler acts on it).
    Evacuation {
        /// The zone.
        zone: ZoneName,
        /// What was asked.
        intent: EvacuationIntent,
    },
    /// An evacuation's progress was recorded.
    EvacuationProgress,
    /// A region failover intent was recorded (the leader's assembler acts on it).
    RegionFailover {
        /// The peer region.
        region: RegionName,
        /// What was asked.
        intent: RegionFailoverIntent,
        /// Who asked.
        actor: String,
        /// Why.
        reason: String,
    },
    /// A region failover's progress was recorded.
    RegionFailoverProgress,
    /// Grants or tokens changed.
    Acl {
        /// What changed.
        applied: AclApplied,
    },
}

/// Why a command was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// A change to grants or tokens was refused.
    #[error("access control: {0}")]
    Acl(#[from] AclError),
    /// The contract broke a rule; the error names the field.
    #[error("contract for {service}: {source}")]
    Contract {
        /// The service.
        service: ServiceName,
        /// What is wrong.
        #[source]
        source: ContractError,
    },
    /// No such service.
    #[error("service {service} is not registered")]
    UnknownService {
        /// The service.
        service: ServiceName,
    },
    /// The service still has instances.
    #[error("service {service} still has {count} instances")]
    ServiceInUse {
        /// The service.
        service: ServiceName,
        /// How many.
        count: usize,
    },
    /// No such live instance.
    #[error("instance {instance} is not registered")]
    UnknownInstance {
        /// The instance.
        instance: InstanceId,
    },
    /// The id was retired; ids are never reused.
    #[error("instance {instance} was retired and its id cannot be reused")]
    Retired {
        /// The instance.
        instance: InstanceId,
    },
    /// Only registered instances have leases.
    #[error("instance {instance} is not leased (it comes from {origin:?})")]
    NotLeased {
        /// The instance.
        instance: InstanceId,
        /// Where it came from.
        origin: Origin,
    },
    /// The address cannot be dialled (port 0, an unspecified or multicast IP).
    #[error("address {address} cannot be dialled")]
    BadAddress {
        /// The address.
        address: Address,
    },
    /// Another live instance of the service already has this address.
    #[error("{address} is already registered as {existing}")]
    DuplicateAddress {
        /// The address.
        address: Address,
        /// The instance holding it.
        existing: InstanceId,
    },
    /// The requested lease is outside the allowed range.
    #[error("lease of {lease_ms} ms is outside {LEASE_MS_MIN}..={LEASE_MS_MAX} ms")]
    BadLease {
        /// What was asked.
        lease_ms: u64,
    },
    /// A policy value is out of range.
    #[error("policy.{field}: {reason}")]
    BadPolicy {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// An instance cannot change where it came from (orchestrator, registration, policy).
    #[error("instance {instance} comes from {origin:?}")]
    OriginMismatch {
        /// The instance.
        instance: InstanceId,
        /// Where it came from.
        origin: Origin,
    },
    /// A command that must say who asked and why does not, or says it at unbounded length.
    #[error("{field}: {reason}")]
    BadJustification {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// A text field is longer than its ceiling. Nothing changed; shorten it.
    #[error("{field}: {len} bytes, more than {max}")]
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The ceiling.
        max: usize,
    },
    /// A list or map carries more entries than its ceiling. Nothing changed.
    #[error("{field}: {count} entries, more than {max}")]
    TooMany {
        /// The field.
        field: &'static str,
        /// How many were given.
        count: usize,
        /// The ceiling.
        max: usize,
    },
    /// The region holds as many services or instances as it may. Nothing changed; remove
    /// some first, or raise the ceiling in a new release.
    #[error("the region already holds {max} {what}")]
    Full {
        /// `services` or `instances`.
        what: &'static str,
        /// The ceiling.
        max: usize,
    },
    /// No instance id can be formed for the service (its name leaves no room for the
    /// sequence, or the sequence is exhausted). Nothing changed, the sequence included.
    #[error("no instance id can be formed for service {service}")]
    IdUnavailable {
        /// The service.
        service: ServiceName,
    },
    /// An instance cannot move to another service.
    #[error("instance {instance} belongs to {existing}")]
    ServiceMismatch {
        /// The instance.
        instance: InstanceId,
        /// Its service.
        existing: ServiceName,
    },
}

/// A service as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRecord {
    /// The owning team.
    pub owner: String,
    /// Its validated contract (stored as written).
    pub contract: HealthContract,
}

/// An instance as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct InstanceRecord {
    /// The instance.
    pub instance: Instance,
    /// The committed lease end (unix ms), for registered instances: set at registration and
    /// moved by each term's lease restart. Renewals are held by the leader's term and never
    /// committed, so while an instance is renewed its lease ends later than this; the
    /// leader answers each renewal with that later end.
    pub lease_expires_at_ms: Option<u64>,
    /// The lease length asked for at registration.
    pub lease_ms: Option<u64>,
    /// The orchestrator marks it terminating.
    #[serde(default)]
    pub draining: bool,
    /// An operator's maintenance reason, while in maintenance.
    #[serde(default)]
    pub maintenance: Option<String>,
}

impl InstanceRecord {
    /// Its lease length, if it holds a lease (registered instances; never orchestrated or
    /// declared external ones).
    pub fn leased(&self) -> Option<u64> {
        self.lease_expires_at_ms.and(self.lease_ms)
    }
}

/// The desired state. Serializable whole, for Raft snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredState {
    services: BTreeMap<ServiceName, ServiceRecord>,
    instances: BTreeMap<InstanceId, InstanceRecord>,
    tombstones: BTreeSet<InstanceId>,
    tombstone_order: VecDeque<InstanceId>,
    next_seq: u64,
    clock_ms: u64,
    assignment: BTreeMap<InstanceId, Vec<NodeName>>,
    #[serde(default)]
    policies: BTreeMap<ServiceName, ServicePolicyRecord>,
    #[serde(default)]
    evacuations: BTreeMap<ZoneName, EvacuationRecord>,
    #[serde(default)]
    region_failovers: BTreeMap<RegionName, RegionFailoverRecord>,
    /// Derived: live instances by (service, address), for the duplicate check. Not
    /// serialized; rebuilt on first use after a snapshot is decoded.
    /// Grants and tokens. Absent from snapshots written before access control: such a
    /// region starts unbootstrapped, where nothing is allowed until bootstrap.
    #[serde(default)]
    acl: Acl,
    #[serde(skip)]
    by_address: AddressIndex,
}

/// Derived data, equal whenever the state it derives from is: ignored by `PartialEq`.
#[derive(Debug, Clone, Default)]
struct AddressIndex(Option<BTreeMap<(ServiceName, Address), InstanceId>>);

impl PartialEq for AddressIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for AddressIndex {}

// === impl DesiredState ===

impl DesiredState {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Apply one command. Deterministic: the same log gives the same state everywhere.
    ///
    /// Total: every command ends in `Ok` or a [`RegistryError`] that changed nothing but
    /// the registry clock. The stateless checks of [`Command::check`] run again here, so a
    /// log written by a binary that did not check (or checked less) still applies.
    pub fn apply(&mut self, stamped: Stamped) -> Result<Applied, RegistryError> {
        // The clock never runs backwards, whichever leader stamped the entry.
        self.clock_ms = self.clock_ms.max(stamped.at_ms);
        stamped.command.check()?;
        match stamped.command {
            Command::PutService {
                service,
                owner,
                contract,
            } => self.put_service(service, owner, contract),
            Command::RemoveService { service } => self.remove_service(service),
            Command::Register(r) => self.register(r),
            Command::Renew { instance } => self.renew(instance),
            Command::Deregister { instance } => {
                self.retire_one(instance, RetireCause::Deregistered, true)
            }
            Command::ExpireLeases => Ok(self.expire()),
            Command::ExpireInstances { instances } => Ok(self.expire_these(instances)),
            Command::RestartLeases => Ok(self.restart_leases()),
            Command::Observe { instance, draining } => {
                self.observe(instance, Origin::Orchestrator, draining)
            }
            Command::Forget { instance } => self.retire_one(instance, RetireCause::Deleted, false),
            Command::DeclareExternal { instance } => {
                // A third party gives no readiness signal: its service must say so, so the
                // evaluator never waits for probes or self-reports that cannot come.
                let profile = self
                    .services
                    .get(&instance.service)
                    .map(|s| s.contract.profile);
                if profile.is_some_and(|p| p != CapabilityProfile::NO_READINESS) {
                    return Err(RegistryError::BadPolicy {
                        field: "contract.profile",
                        reason: format!(
                            "external endpoints of {} need the no_readiness profile",
                            instance.service
                        ),
                    });
                }
                self.observe(instance, Origin::External, false)
            }
            Command::RemoveExternal { instance } => {
                // Only what policy declared may be removed by policy: an orchestrated or
                // registered instance named here is refused, not tombstoned.
                let origin = self.live_mut(&instance)?.instance.origin;
                if origin != Origin::External {
                    return Err(RegistryError::OriginMismatch { instance, origin });
                }
                self.retire_one(instance, RetireCause::Deleted, false)
            }
            Command::Maintenance { instance, reason } => {
                let record = self.live_mut(&instance)?;
                record.maintenance = reason.clone();
                Ok(Applied::Maintenance { instance, reason })
            }
            Command::SetPolicy { service, policy } => {
                if !self.services.contains_key(&service) {
                    return Err(RegistryError::UnknownService { service });
                }
                self.policies.insert(service.clone(), policy);
                Ok(Applied::PolicySet { service })
            }
            Command::Evacuation { zone, intent } => Ok(Applied::Evacuation { zone, intent }),
            Command::EvacuationProgress { zone, progress } => {
                match progress {
                    Some(p) => {
                        self.evacuations.insert(zone, p);
                    }
                    None => {
                        self.evacuations.remove(&zone);
                    }
                }
                Ok(Applied::EvacuationProgress)
            }
            Command::RegionFailover {
                region,
                intent,
                actor,
                reason,
            } => Ok(Applied::RegionFailover {
                region,
                intent,
                actor,
                reason,
            }),
            Command::RegionFailoverProgress { region, progress } => {
                match progress {
                    Some(p) => {
                        self.region_failovers.insert(region, p);
                    }
                    None => {
                        self.region_failovers.remove(&region);
                    }
                }
                Ok(Applied::RegionFailoverProgress)
            }
            Command::SetAssignment { assignment } => {
                self.assignment = assignment;
                Ok(Applied::AssignmentSet)
            }
            Command::PatchAssignment { set, remove } => {
                for id in &remove {
                    self.assignment.remove(id);
                }
                for (id, probers) in set {
                    if self.instances.contains_key(&id) {
                        self.assignment.insert(id, probers);
                    }
                }
                Ok(Applied::AssignmentSet)
            }
            Command::Acl { change } => Ok(Applied::Acl {
                applied: self.acl.apply(change, self.clock_ms)?,
            }),
        }
    }

    /// The region's grants and tokens.
    pub fn acl(&self) -> &Acl {
        &self.acl
    }

    /// A service's policy (the default when none was set).
    pub fn policy(&self, service: &ServiceName) -> Option<&ServicePolicyRecord> {
        self.policies.get(service)
    }

    /// Every service policy that was set.
    pub fn policies(&self) -> impl Iterator<Item = (&ServiceName, &ServicePolicyRecord)> {
        self.policies.iter()
    }

    /// Evacuations in progress, as last recorded.
    pub fn evacuations(&self) -> &BTreeMap<ZoneName, EvacuationRecord> {
        &self.evacuations
    }

    /// Region failovers in progress, as last recorded.
    pub fn region_failovers(&self) -> &BTreeMap<RegionName, RegionFailoverRecord> {
        &self.region_failovers
    }

    /// How many targets have probers assigned.
    pub fn assignment_len(&self) -> usize {
        self.assignment.len()
    }

    /// A service's record.
    pub fn service(&self, service: &ServiceName) -> Option<&ServiceRecord> {
        self.services.get(service)
    }

    /// Every service, in name order.
    pub fn services(&self) -> impl Iterator<Item = (&ServiceName, &ServiceRecord)> {
        self.services.iter()
    }

    /// A live instance's record.
    pub fn instance(&self, id: &InstanceId) -> Option<&InstanceRecord> {
        self.instances.get(id)
    }

    /// Every live instance, in id order.
    pub fn instances(&self) -> impl Iterator<Item = &InstanceRecord> {
        self.instances.values()
    }

    /// Whether an id has been retired.
    pub fn is_retired(&self, id: &InstanceId) -> bool {
        self.tombstones.contains(id)
    }

    /// The probers assigned to a target.
    pub fn probers(&self, target: &InstanceId) -> &[NodeName] {
        self.assignment.get(target).map_or(&[], Vec::as_slice)
    }

    /// The registry's clock (unix ms): the latest stamp applied.
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    /// The lease length of a live, leased instance: what a renewal needs to know. Refused
    /// as [`Command::Renew`] would be: retired, unknown, or not leased.
    pub fn renewable(&self, id: &InstanceId) -> Result<u64, RegistryError> {
        if self.tombstones.contains(id) {
            return Err(RegistryError::Retired {
                instance: id.clone(),
            });
        }
        let record = self
            .instances
            .get(id)
            .ok_or_else(|| RegistryError::UnknownInstance {
                instance: id.clone(),
            })?;
        record.leased().ok_or_else(|| RegistryError::NotLeased {
            instance: id.clone(),
            origin: record.instance.origin,
        })
    }

    /// Leased instances whose lease has ended at `now_ms`: the later of the committed end
    /// (registration, or the term's restart) and the end the leader's renewals set
    /// (`renewed`) has passed.
    pub fn leases_due(
        &self,
        now_ms: u64,
        renewed: &std::collections::HashMap<InstanceId, u64>,
    ) -> Vec<InstanceId> {
        self.instances
            .values()
            .filter_map(|r| {
                let committed = r.lease_expires_at_ms?;
                let end = renewed
                    .get(&r.instance.id)
                    .map_or(committed, |&renewed| renewed.max(committed));
                (end <= now_ms).then(|| r.instance.id.clone())
            })
            .collect()
    }

    /// The earliest committed lease end among live instances (renewals the leader holds
    /// may end a lease later).
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.instances
            .values()
            .filter_map(|r| r.lease_expires_at_ms)
            .min()
    }

    fn put_service(
        &mut self,
        service: ServiceName,
        owner: String,
        contract: HealthContract,
    ) -> Result<Applied, RegistryError> {
        if !self.services.contains_key(&service) && self.services.len() >= SERVICES_MAX {
            return Err(RegistryError::Full {
                what: "services",
                max: SERVICES_MAX,
            });
        }
        self.services
            .insert(service, ServiceRecord { owner, contract });
        Ok(Applied::ServicePut)
    }

    fn remove_service(&mut self, service: ServiceName) -> Result<Applied, RegistryError> {
        if !self.services.contains_key(&service) {
            return Err(RegistryError::UnknownService { service });
        }
        let count = self
            .instances
            .values()
            .filter(|r| r.instance.service == service)
            .count();
        if count > 0 {
            return Err(RegistryError::ServiceInUse { service, count });
        }
        self.services.remove(&service);
        self.policies.remove(&service);
        Ok(Applied::ServiceRemoved { service })
    }

    fn register(&mut self, r: Registration) -> Result<Applied, RegistryError> {
        // The lease range and the address's form were checked by `Command::check`.
        if !self.services.contains_key(&r.service) {
            return Err(RegistryError::UnknownService { service: r.service });
        }
        self.check_address(&r.service, &r.address, None)?;
        self.check_room()?;
        // Form the id before touching the sequence, so a refusal changes nothing. A log
        // written before service names were bounded may hold a name with no room left.
        let unavailable = || RegistryError::IdUnavailable {
            service: r.service.clone(),
        };
        // An orchestrated or external instance may carry a name of the registered form
        // (`web-r7` is a fine pod name), live or retired: skip past it, so a registration
        // never replaces another instance or revives a retired id. Each skip passes an id
        // the state holds, so the walk is bounded by the instances and tombstones.
        let mut seq = self.next_seq;
        let id = loop {
            seq = seq.checked_add(1).ok_or_else(unavailable)?;
            let id =
                InstanceId::try_new(format!("{}-r{seq}", r.service)).map_err(|_| unavailable())?;
            if !self.instances.contains_key(&id) && !self.tombstones.contains(&id) {
                break id;
            }
        };
        self.next_seq = seq;
        let expires_at_ms = self.clock_ms.saturating_add(r.lease_ms);
        let instance = Instance {
            id: id.clone(),
            service: r.service,
            locality: r.locality,
            address: r.address,
            origin: Origin::Registered,
            weight: r.weight,
            tags: r.tags,
            metadata: r.metadata,
        };
        let record = InstanceRecord {
            instance,
            lease_expires_at_ms: Some(expires_at_ms),
            lease_ms: Some(r.lease_ms),
            draining: false,
            maintenance: None,
        };
        self.insert_instance(record);
        Ok(Applied::Registered {
            instance: id,
            expires_at_ms,
        })
    }

    fn renew(&mut self, id: InstanceId) -> Result<Applied, RegistryError> {
        let expires_at_ms = self.clock_ms.saturating_add(self.renewable(&id)?);
        self.live_mut(&id)?.lease_expires_at_ms = Some(expires_at_ms);
        Ok(Applied::Renewed { expires_at_ms })
    }

    fn observe(
        &mut self,
        instance: Instance,
        origin: Origin,
        draining: bool,
    ) -> Result<Applied, RegistryError> {
        if self.tombstones.contains(&instance.id) {
            return Err(RegistryError::Retired {
                instance: instance.id,
            });
        }
        if !self.services.contains_key(&instance.service) {
            return Err(RegistryError::UnknownService {
                service: instance.service,
            });
        }
        if let Some(existing) = self.instances.get(&instance.id)
            && existing.instance.service != instance.service
        {
            let existing = existing.instance.service.clone();
            return Err(RegistryError::ServiceMismatch {
                instance: instance.id,
                existing,
            });
        }
        self.check_address(&instance.service, &instance.address, Some(&instance.id))?;
        if !self.instances.contains_key(&instance.id) {
            self.check_room()?;
        }
        if let Some(existing) = self.instances.get(&instance.id)
            && existing.instance.origin != origin
        {
            return Err(RegistryError::OriginMismatch {
                instance: instance.id,
                origin: existing.instance.origin,
            });
        }
        let instance = Instance { origin, ..instance };
        let id = instance.id.clone();
        let maintenance = self.instances.get(&id).and_then(|r| r.maintenance.clone());
        let record = InstanceRecord {
            instance,
            lease_expires_at_ms: None,
            lease_ms: None,
            draining,
            maintenance,
        };
        self.insert_instance(record);
        Ok(Applied::Observed {
            instance: id,
            draining,
        })
    }

    fn retire_one(
        &mut self,
        id: InstanceId,
        cause: RetireCause,
        leased_only: bool,
    ) -> Result<Applied, RegistryError> {
        let record = self.live_mut(&id)?;
        if leased_only && record.lease_ms.is_none() {
            return Err(RegistryError::NotLeased {
                instance: id,
                origin: record.instance.origin,
            });
        }
        self.retire(&id);
        Ok(Applied::Retired {
            instances: vec![(id, cause)],
        })
    }

    fn restart_leases(&mut self) -> Applied {
        let clock = self.clock_ms;
        let mut extended = 0;
        for r in self.instances.values_mut() {
            if let (Some(len), Some(end)) = (r.lease_ms, r.lease_expires_at_ms.as_mut())
                && *end < clock.saturating_add(len)
            {
                *end = clock.saturating_add(len);
                extended += 1;
            }
        }
        Applied::LeasesRestarted { extended }
    }

    fn expire(&mut self) -> Applied {
        let clock = self.clock_ms;
        let expired: Vec<InstanceId> = self
            .instances
            .values()
            .filter(|r| r.lease_expires_at_ms.is_some_and(|t| t <= clock))
            .map(|r| r.instance.id.clone())
            .collect();
        for id in &expired {
            self.retire(id);
        }
        Applied::Retired {
            instances: expired
                .into_iter()
                .map(|id| (id, RetireCause::LeaseExpired))
                .collect(),
        }
    }

    fn expire_these(&mut self, ids: Vec<InstanceId>) -> Applied {
        let mut expired = Vec::with_capacity(ids.len());
        for id in ids {
            if self
                .instances
                .get(&id)
                .and_then(InstanceRecord::leased)
                .is_some()
            {
                self.retire(&id);
                expired.push((id, RetireCause::LeaseExpired));
            }
        }
        Applied::Retired { instances: expired }
    }

    fn retire(&mut self, id: &InstanceId) {
        if let Some(r) = self.instances.remove(id) {
            self.index()
                .remove(&(r.instance.service, r.instance.address));
        }
        self.assignment.remove(id);
        if self.tombstone_order.len() >= TOMBSTONES_MAX
            && let Some(oldest) = self.tombstone_order.pop_front()
        {
            self.tombstones.remove(&oldest);
        }
        self.tombstones.insert(id.clone());
        self.tombstone_order.push_back(id.clone());
    }

    fn check_room(&self) -> Result<(), RegistryError> {
        if self.instances.len() >= INSTANCES_MAX {
            return Err(RegistryError::Full {
                what: "instances",
                max: INSTANCES_MAX,
            });
        }
        Ok(())
    }

    fn live_mut(&mut self, id: &InstanceId) -> Result<&mut InstanceRecord, RegistryError> {
        if self.tombstones.contains(id) {
            return Err(RegistryError::Retired {
                instance: id.clone(),
            });
        }
        self.instances
            .get_mut(id)
            .ok_or_else(|| RegistryError::UnknownInstance {
                instance: id.clone(),
            })
    }

    /// No other live instance of the service holds `address` (its form was checked by
    /// [`Command::check`] before apply got here).
    fn check_address(
        &mut self,
        service: &ServiceName,
        address: &Address,
        except: Option<&InstanceId>,
    ) -> Result<(), RegistryError> {
        let clash = self
            .index()
            .get(&(service.clone(), *address))
            .filter(|id| Some(*id) != except)
            .cloned();
        match clash {
            Some(existing) => Err(RegistryError::DuplicateAddress {
                address: *address,
                existing,
            }),
            None => Ok(()),
        }
    }

    /// The address index, rebuilt from the instances when it is missing (after decoding).
    fn index(&mut self) -> &mut BTreeMap<(ServiceName, Address), InstanceId> {
        let instances = &self.instances;
        self.by_address.0.get_or_insert_with(|| {
            instances
                .values()
                .map(|r| {
                    (
                        (r.instance.service.clone(), r.instance.address),
                        r.instance.id.clone(),
                    )
                })
                .collect()
        })
    }

    fn insert_instance(&mut self, record: InstanceRecord) {
        let id = record.instance.id.clone();
        let key = (record.instance.service.clone(), record.instance.address);
        if let Some(old) = self.instances.insert(id.clone(), record) {
            let old_key = (old.instance.service, old.instance.address);
            if self.index().get(&old_key) == Some(&id) {
                self.index().remove(&old_key);
            }
        }
        self.index().insert(key, id);
    }
}

// === impl Command ===

impl Command {
    /// The checks that need no state: every length, count and range a command carries,
    /// and the contract's validation. The API runs them before proposing, so a request
    /// that could never apply is refused without reaching the log; [`DesiredState::apply`]
    /// runs them again for entries that reached it anyway.
    pub fn check(&self) -> Result<(), RegistryError> {
        match self {
            Command::PutService {
                service,
                owner,
                contract,
            } => {
                bounded("service", service.as_str(), SERVICE_NAME_LEN_MAX)?;
                bounded("owner", owner, OWNER_LEN_MAX)?;
                contract
                    .clone()
                    .validate()
                    .map(drop)
                    .map_err(|source| RegistryError::Contract {
                        service: service.clone(),
                        source,
                    })
            }
            Command::Register(r) => {
                labels(&r.tags, &r.metadata)?;
                if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&r.lease_ms) {
                    return Err(RegistryError::BadLease {
                        lease_ms: r.lease_ms,
                    });
                }
                dialable(&r.address)
            }
            Command::Observe { instance, .. } | Command::DeclareExternal { instance } => {
                labels(&instance.tags, &instance.metadata)?;
                dialable(&instance.address)
            }
            Command::Maintenance {
                reason: Some(reason),
                ..
            } => justified("reason", reason),
            Command::SetPolicy { policy, .. } => policy.check(),
            Command::RegionFailover { actor, reason, .. } => {
                justified("actor", actor)?;
                justified("reason", reason)
            }
            Command::RegionFailoverProgress {
                progress: Some(p), ..
            } => {
                bounded("actor", &p.actor, JUSTIFICATION_LEN_MAX)?;
                bounded("reason", &p.reason, JUSTIFICATION_LEN_MAX)
            }
            Command::SetAssignment { assignment } => {
                counted("assignment", assignment.len(), INSTANCES_MAX)?;
                for probers in assignment.values() {
                    counted("assignment.probers", probers.len(), PROBERS_PER_TARGET_MAX)?;
                }
                Ok(())
            }
            Command::PatchAssignment { set, remove } => {
                counted("assignment", set.len(), INSTANCES_MAX)?;
                counted("remove", remove.len(), INSTANCES_MAX)?;
                for probers in set.values() {
                    counted("assignment.probers", probers.len(), PROBERS_PER_TARGET_MAX)?;
                }
                Ok(())
            }
            Command::Acl { change } => Acl::check(change).map_err(RegistryError::Acl),
            Command::ExpireInstances { instances } => {
                counted("instances", instances.len(), EXPIRE_BATCH_MAX)
            }
            Command::RemoveService { .. }
            | Command::Renew { .. }
            | Command::Deregister { .. }
            | Command::ExpireLeases
            | Command::RestartLeases
            | Command::RemoveExternal { .. }
            | Command::Maintenance { reason: None, .. }
            | Command::Forget { .. }
            | Command::Evacuation { .. }
            | Command::EvacuationProgress { .. }
            | Command::RegionFailoverProgress { progress: None, .. } => Ok(()),
        }
    }
}

// === impl ServicePolicyRecord ===

impl ServicePolicyRecord {
    /// Ranges and counts, checked before proposing and again in apply.
    pub fn check(&self) -> Result<(), RegistryError> {
        if self
            .min_healthy_override
            .is_some_and(|p| p.get() == 0 || p.get() > 1000)
        {
            return Err(RegistryError::BadPolicy {
                field: "min_healthy_override",
                reason: "a fraction in permille, 1..=1000".into(),
            });
        }
        counted(
            "policy.failover_zones",
            self.failover_zones.len(),
            FAILOVER_ORDER_MAX,
        )?;
        counted(
            "policy.failover_regions",
            self.failover_regions.len(),
            FAILOVER_ORDER_MAX,
        )?;
        if let Some(callers) = &self.allowed_callers {
            counted("policy.allowed_callers", callers.len(), ALLOWED_CALLERS_MAX)?;
        }
        if self
            .max_manual_withdrawals
            .is_some_and(|n| n > MANUAL_WITHDRAWALS_MAX)
        {
            return Err(RegistryError::BadPolicy {
                field: "max_manual_withdrawals",
                reason: format!("0..={}", MANUAL_WITHDRAWALS_MAX),
            });
        }
        Ok(())
    }
}

/// An address a caller could dial: no port 0, no unspecified or multicast IP.
fn dialable(address: &Address) -> Result<(), RegistryError> {
    if address.port == 0 || address.ip.is_unspecified() || address.ip.is_multicast() {
        return Err(RegistryError::BadAddress { address: *address });
    }
    Ok(())
}

/// Tags and metadata within their counts and lengths.
fn labels(
    tags: &BTreeSet<String>,
    metadata: &BTreeMap<String, String>,
) -> Result<(), RegistryError> {
    counted("tags", tags.len(), TAGS_MAX)?;
    for tag in tags {
        bounded("tags", tag, TAG_LEN_MAX)?;
    }
    counted("metadata", metadata.len(), METADATA_ENTRIES_MAX)?;
    for (key, value) in metadata {
        bounded("metadata.key", key, METADATA_KEY_LEN_MAX)?;
        bounded("metadata.value", value, METADATA_VALUE_LEN_MAX)?;
    }
    Ok(())
}

fn bounded(field: &'static str, text: &str, max: usize) -> Result<(), RegistryError> {
    if text.len() > max {
        return Err(RegistryError::TooLong {
            field,
            len: text.len(),
            max,
        });
    }
    Ok(())
}

fn counted(field: &'static str, count: usize, max: usize) -> Result<(), RegistryError> {
    if count > max {
        return Err(RegistryError::TooMany { field, count, max });
    }
    Ok(())
}

/// A privileged command's actor or reason: present, and bounded.
fn justified(field: &'static str, text: &str) -> Result<(), RegistryError> {
    if text.trim().is_empty() {
        return Err(RegistryError::BadJustification {
            field,
            reason: "must not be empty",
        });
    }
    if text.len() > JUSTIFICATION_LEN_MAX {
        return Err(RegistryError::BadJustification {
            field,
            reason: "longer than JUSTIFICATION_LEN_MAX bytes",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
