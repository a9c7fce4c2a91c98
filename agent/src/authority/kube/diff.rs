//! The pure half of the Kubernetes reconciler: EndpointSlices + registry → commands + report.
//!
//! No I/O and no clock: [`plan`] reads a complete list of slices and the registry's desired
//! state and returns the [`Command`]s that make the registry match the orchestrator, with a
//! [`ReconciliationDiff`] saying what diverged. The shell in `mod.rs` only calls it with a
//! list that came from a finished (re)list, so an absent slice really is a deleted one.
//!
//! Mapping, decided here and documented once:
//! - **Service.** A slice belongs to the Kubernetes Service named by its
//!   `kubernetes.io/service-name` label, in the slice's namespace; the waymark service is
//!   `<name>.<namespace>` (Kubernetes names are DNS labels, and `ServiceName` allows dots).
//!   Only services registered in waymark are reconciled; the rest are reported as unmanaged.
//! - **Instance.** One instance per (pod, TCP port): id `<targetRef.uid>:<port>`. A new pod
//!   is a new UID, hence a new instance; ids are never reused. Only the first address of an
//!   endpoint is used (Kubernetes calls them fungible) and only slices of the configured
//!   address family (`IPv4` by default; dual-stack pods would otherwise produce one id with
//!   two addresses). Endpoints without a `targetRef.uid` are skipped and counted.
//! - **Conditions.** Presence in a slice is existence. `terminating` (nil = false) means
//!   draining, whether or not the endpoint is still `serving`. `ready`/`serving` are never
//!   existence: an unready pod is a pod whose readiness is evidence for the evaluator
//!   (ADR-03: existence from the orchestrator; ADR-04/16: readiness is one evidence class).
//! - **Locality.** Region from config; zone from `endpoint.zone`, node from `nodeName`, each
//!   falling back to a configured name when absent or not a valid name.
//! - **Scope.** Registry instances are ours to forget only if they are `Origin::Orchestrator`
//!   and carry this cluster's `k8s.cluster` metadata (and namespace, when one is configured),
//!   so several clusters or reconcilers can feed one registry.
//!
//! Commands come out Forgets first, then Observes, each in id order: a replacement pod that
//! reuses its predecessor's IP is only accepted once the predecessor is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use waymark_core::model::{
    Address, Instance, InstanceId, Locality, NodeName, Origin, RegionName, ServiceName, ZoneName,
};
use waymark_core::units::Weight;
use waymark_registry::state::{Command, DesiredState, InstanceRecord};

/// The label joining an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Metadata key: the cluster an orchestrated instance was reconciled from.
pub const META_CLUSTER: &str = "k8s.cluster";
/// Metadata key: the pod's namespace.
pub const META_NAMESPACE: &str = "k8s.namespace";
/// Metadata key: the pod's name (`targetRef.name`), when the slice gives one.
pub const META_POD: &str = "k8s.pod";
/// Metadata key: the port's name, when the slice gives one.
pub const META_PORT_NAME: &str = "k8s.port_name";
/// Instance ids listed per service and kind in a [`ReconciliationDiff`]; counts are exact.
pub const DIFF_IDS_MAX: usize = 100;

/// Which EndpointSlice `addressType` the reconciler reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum AddressFamily {
    /// `addressType: IPv4`.
    #[default]
    IPv4,
    /// `addressType: IPv6`.
    IPv6,
}

impl AddressFamily {
    /// The `addressType` value Kubernetes uses.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::IPv4 => "IPv4",
            Self::IPv6 => "IPv6",
        }
    }

    fn admits(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (Self::IPv4, IpAddr::V4(_)) | (Self::IPv6, IpAddr::V6(_))
        )
    }
}

/// How slices map onto instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffConfig {
    /// The region every reconciled instance belongs to (the authority's own).
    pub region: RegionName,
    /// This cluster's name, stamped into [`META_CLUSTER`]; scopes what may be forgotten.
    pub cluster: String,
    /// Reconcile one namespace only (`None`: all namespaces).
    pub namespace: Option<String>,
    /// Zone for endpoints without a (valid) `zone`.
    pub default_zone: ZoneName,
    /// Node for endpoints without a (valid) `nodeName`.
    pub unknown_node: NodeName,
    /// The address family read; slices of other types are skipped.
    pub address_family: AddressFamily,
}

/// The commands that make the registry match, and the report of what diverged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Forgets first, then Observes; each in id order.
    pub commands: Vec<Command>,
    /// What diverged, before the commands are applied.
    pub report: ReconciliationDiff,
}

/// Divergence between the orchestrator and the registry (ADR-03), for the API and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReconciliationDiff {
    /// Per managed service with at least one instance on either side.
    pub services: BTreeMap<ServiceName, ServiceDiff>,
    /// Services with endpoints but not registered in waymark: endpoint count (per port).
    pub unmanaged: BTreeMap<ServiceName, usize>,
    /// Sums over every service.
    pub totals: DiffTotals,
    /// What the mapping could not use.
    pub skipped: SkipCounts,
}

/// One managed service's divergence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ServiceDiff {
    /// In the orchestrator, not in the registry: to be observed.
    pub only_in_orchestrator: IdList,
    /// In the registry, gone from the orchestrator: to be forgotten.
    pub only_in_registry: IdList,
    /// On both sides but different (locality, address, metadata, draining): re-observed.
    pub differing: IdList,
    /// On both sides and equal.
    pub in_sync: usize,
}

/// A counted list of ids, listing at most [`DIFF_IDS_MAX`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IdList {
    /// How many there are.
    pub count: usize,
    /// The first [`DIFF_IDS_MAX`] of them, in id order.
    pub ids: Vec<InstanceId>,
}

impl IdList {
    fn push(&mut self, id: &InstanceId) {
        self.count += 1;
        if self.ids.len() < DIFF_IDS_MAX {
            self.ids.push(id.clone());
        }
    }
}

/// Totals of a [`ReconciliationDiff`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DiffTotals {
    /// Instances only in the orchestrator.
    pub only_in_orchestrator: usize,
    /// Instances only in the registry.
    pub only_in_registry: usize,
    /// Instances on both sides that differ.
    pub differing: usize,
    /// Instances on both sides and equal.
    pub in_sync: usize,
    /// Endpoints (per port) of services not registered in waymark.
    pub unmanaged: usize,
}

impl DiffTotals {
    /// Whether the registry matches the orchestrator for every managed service.
    pub fn converged(&self) -> bool {
        self.only_in_orchestrator == 0 && self.only_in_registry == 0 && self.differing == 0
    }
}

/// What the mapping skipped, and why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SkipCounts {
    /// Slices without the `kubernetes.io/service-name` label or a namespace.
    pub slices_without_service: usize,
    /// Slices of another `addressType` (the other family, or FQDN).
    pub slices_other_address_type: usize,
    /// Slices whose service or namespace does not make a valid service name.
    pub slices_bad_name: usize,
    /// Endpoints without `targetRef.uid`.
    pub endpoints_without_uid: usize,
    /// Endpoints whose first address is missing, unparsable or of the other family.
    pub endpoints_bad_address: usize,
    /// Ports that are not TCP, or have no valid number.
    pub ports_unusable: usize,
    /// The same (pod, port) seen again in another slice (merged: terminating wins).
    pub duplicates: usize,
    /// Endpoints whose id the registry has retired (never reused, so never re-observed).
    pub retired: usize,
}

/// One desired instance, as the orchestrator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Desired {
    instance: Instance,
    draining: bool,
}

/// Computes the commands that make the registry's orchestrated instances (in this
/// reconciler's scope) match `slices`, which must be a complete list.
pub fn plan<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    registry: &DesiredState,
    config: &DiffConfig,
) -> Plan {
    let mut report = ReconciliationDiff::default();
    let desired = desired_instances(slices, config, &mut report.skipped);

    let mut forgets = Vec::new();
    let mut observes = Vec::new();
    for (id, d) in &desired {
        let service = &d.instance.service;
        if registry.service(service).is_none() {
            *report.unmanaged.entry(service.clone()).or_default() += 1;
            continue;
        }
        let entry = report.services.entry(service.clone()).or_default();
        match registry.instance(id) {
            Some(rec) if rec.instance == d.instance && rec.draining == d.draining => {
                entry.in_sync += 1;
            }
            Some(_) => {
                entry.differing.push(id);
                observes.push(observe(d));
            }
            None if registry.is_retired(id) => report.skipped.retired += 1,
            None => {
                entry.only_in_orchestrator.push(id);
                observes.push(observe(d));
            }
        }
    }
    for rec in registry.instances().filter(|r| in_scope(r, config)) {
        let id = &rec.instance.id;
        if !desired.contains_key(id) {
            let entry = report
                .services
                .entry(rec.instance.service.clone())
                .or_default();
            entry.only_in_registry.push(id);
            forgets.push(Command::Forget {
                instance: id.clone(),
            });
        }
    }
    report.totals = totals(&report);
    forgets.extend(observes);
    Plan {
        commands: forgets,
        report,
    }
}

/// Whether a registry instance is this reconciler's to forget.
pub fn in_scope(record: &InstanceRecord, config: &DiffConfig) -> bool {
    let i = &record.instance;
    i.origin == Origin::Orchestrator
        && i.metadata.get(META_CLUSTER) == Some(&config.cluster)
        && config
            .namespace
            .as_ref()
            .is_none_or(|ns| i.metadata.get(META_NAMESPACE) == Some(ns))
}

/// The waymark service a Kubernetes Service maps to: `<name>.<namespace>`.
pub fn service_name(namespace: &str, name: &str) -> Option<ServiceName> {
    if namespace.is_empty() || name.is_empty() {
        return None;
    }
    ServiceName::try_new(format!("{name}.{namespace}")).ok()
}

/// The instance id of one (pod, port): `<pod uid>:<port>`.
pub fn instance_id(pod_uid: &str, port: u16) -> Option<InstanceId> {
    InstanceId::try_new(format!("{pod_uid}:{port}")).ok()
}

fn observe(d: &Desired) -> Command {
    Command::Observe {
        instance: d.instance.clone(),
        draining: d.draining,
    }
}

fn totals(report: &ReconciliationDiff) -> DiffTotals {
    let mut t = DiffTotals {
        unmanaged: report.unmanaged.values().sum(),
        ..DiffTotals::default()
    };
    for s in report.services.values() {
        t.only_in_orchestrator += s.only_in_orchestrator.count;
        t.only_in_registry += s.only_in_registry.count;
        t.differing += s.differing.count;
        t.in_sync += s.in_sync;
    }
    t
}

/// Every (pod, port) the slices describe, keyed by id. Slices are visited in
/// (namespace, name) order so the outcome does not depend on the store's order.
fn desired_instances<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    config: &DiffConfig,
    skipped: &mut SkipCounts,
) -> BTreeMap<InstanceId, Desired> {
    let mut slices: Vec<&EndpointSlice> = slices.into_iter().collect();
    slices.sort_by(|a, b| {
        let key =
            |s: &'a EndpointSlice| (s.metadata.namespace.as_deref(), s.metadata.name.as_deref());
        key(a).cmp(&key(b))
    });
    let mut out = BTreeMap::new();
    for slice in slices {
        let Some(service) = slice_service(slice, config, skipped) else {
            continue;
        };
        let ports = usable_ports(slice, skipped);
        for endpoint in &slice.endpoints {
            for d in endpoint_instances(endpoint, &service, &ports, slice, config, skipped) {
                merge(&mut out, d, skipped);
            }
        }
    }
    out
}

/// Terminating is monotonic for a pod, so when two slices disagree the terminating copy is
/// the newer one.
fn merge(out: &mut BTreeMap<InstanceId, Desired>, d: Desired, skipped: &mut SkipCounts) {
    match out.get_mut(&d.instance.id) {
        Some(held) => {
            skipped.duplicates += 1;
            if d.draining && !held.draining {
                *held = d;
            }
        }
        None => {
            out.insert(d.instance.id.clone(), d);
        }
    }
}

fn slice_service(
    slice: &EndpointSlice,
    config: &DiffConfig,
    skipped: &mut SkipCounts,
) -> Option<ServiceName> {
    let meta = &slice.metadata;
    let namespace = meta.namespace.as_deref();
    if let (Some(want), Some(ns)) = (config.namespace.as_deref(), namespace)
        && want != ns
    {
        return None;
    }
    let label = meta.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL));
    let (Some(namespace), Some(name)) = (namespace, label) else {
        skipped.slices_without_service += 1;
        return None;
    };
    if slice.address_type != config.address_family.as_str() {
        skipped.slices_other_address_type += 1;
        return None;
    }
    let service = service_name(namespace, name);
    if service.is_none() {
        skipped.slices_bad_name += 1;
    }
    service
}

/// The slice's TCP ports with a number, and their names.
fn usable_ports(slice: &EndpointSlice, skipped: &mut SkipCounts) -> Vec<(u16, Option<String>)> {
    let mut ports: Vec<(u16, Option<String>)> = Vec::new();
    for p in slice.ports.iter().flatten() {
        match tcp_port(p) {
            Some(port) => ports.push((port, p.name.clone().filter(|n| !n.is_empty()))),
            None => skipped.ports_unusable += 1,
        }
    }
    ports.sort();
    ports.dedup_by_key(|(port, _)| *port);
    ports
}

fn tcp_port(p: &EndpointPort) -> Option<u16> {
    let tcp = p.protocol.as_deref().is_none_or(|proto| proto == "TCP");
    let port = p
        .port
        .and_then(|n| u16::try_from(n).ok())
        .filter(|n| *n != 0);
    port.filter(|_| tcp)
}

fn endpoint_instances(
    endpoint: &Endpoint,
    service: &ServiceName,
    ports: &[(u16, Option<String>)],
    slice: &EndpointSlice,
    config: &DiffConfig,
    skipped: &mut SkipCounts,
) -> Vec<Desired> {
    let target = endpoint.target_ref.as_ref();
    let Some(uid) = target
        .and_then(|t| t.uid.as_deref())
        .filter(|u| !u.is_empty())
    else {
        skipped.endpoints_without_uid += 1;
        return Vec::new();
    };
    let ip = endpoint
        .addresses
        .first()
        .and_then(|a| a.parse::<IpAddr>().ok())
        .filter(|ip| config.address_family.admits(ip));
    let Some(ip) = ip else {
        skipped.endpoints_bad_address += 1;
        return Vec::new();
    };
    let draining = endpoint
        .conditions
        .as_ref()
        .and_then(|c| c.terminating)
        .unwrap_or(false);
    let locality = Locality {
        region: config.region.clone(),
        zone: endpoint
            .zone
            .as_deref()
            .and_then(|z| z.parse().ok())
            .unwrap_or_else(|| config.default_zone.clone()),
        node: endpoint
            .node_name
            .as_deref()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| config.unknown_node.clone()),
    };
    let mut base = BTreeMap::new();
    base.insert(META_CLUSTER.to_owned(), config.cluster.clone());
    if let Some(ns) = slice.metadata.namespace.as_ref() {
        base.insert(META_NAMESPACE.to_owned(), ns.clone());
    }
    if let Some(pod) = target.and_then(|t| t.name.as_ref()) {
        base.insert(META_POD.to_owned(), pod.clone());
    }
    let mut out = Vec::with_capacity(ports.len());
    for (port, name) in ports {
        let Some(id) = instance_id(uid, *port) else {
            skipped.endpoints_without_uid += 1;
            continue;
        };
        let mut metadata = base.clone();
        if let Some(name) = name {
            metadata.insert(META_PORT_NAME.to_owned(), name.clone());
        }
        let instance = Instance {
            id,
            service: service.clone(),
            locality: locality.clone(),
            address: Address { ip, port: *port },
            origin: Origin::Orchestrator,
            weight: Weight::DEFAULT,
            tags: BTreeSet::new(),
            metadata,
        };
        out.push(Desired { instance, draining });
    }
    out
}

#[cfg(test)]
#[path = "diff_test.rs"]
mod tests;
