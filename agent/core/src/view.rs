//! Views: the versioned, per-service, per-caller-zone endpoint set callers route from.
//!
//! A [`View`] holds only what callers may route to or must drain from: withdrawn
//! instances are absent. Each endpoint carries its tier, its priority (what Envoy sees as
//! the EDS priority), its weight and its status; the view carries declared markers such as
//! `health_disregarded`. [`diff`] and [`apply`] are exact inverses
//! (`apply(old, diff(old, new)) == new`), which is what lets a subscriber that knows `old`
//! be sent only the difference.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::contract::CapabilityProfile;
use crate::eligibility::{EvidenceMode, Verdict};
use crate::model::{Address, InstanceId, RegionName, ServiceName, ZoneName};
use crate::units::{Permille, Weight};

/// A view's version, from the region-wide monotonic counter. Strictly increasing per view.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(transparent)]
pub struct Version(pub u64);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Where versions come from. The authority backs it with a counter that survives leader
/// changes; tests and the dev region use [`MonotonicCounter`].
///
/// ### To ensure correctness
/// - every `Some` returns a version strictly greater than every earlier call's, across
///   restarts and leader changes of the region;
/// - a source that cannot keep that promise (its space is exhausted) returns `None` and
///   keeps returning `None`: it never wraps.
pub trait VersionSource {
    /// The next version, or `None` when no version above the last can be issued.
    fn next_version(&mut self) -> Option<Version>;
}

/// An in-memory counter starting after a given version.
#[derive(Debug, Clone, Default)]
pub struct MonotonicCounter {
    last: u64,
}

impl MonotonicCounter {
    /// A counter whose first version is `after + 1`.
    pub fn starting_after(after: Version) -> Self {
        Self { last: after.0 }
    }
}

impl VersionSource for MonotonicCounter {
    fn next_version(&mut self) -> Option<Version> {
        self.last = self.last.checked_add(1)?;
        Some(Version(self.last))
    }
}

/// Topology priority class: 0 = caller's zone, 1 = other zones of the region, 2 = peer regions.
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
pub enum Tier {
    /// The caller's own zone.
    Local,
    /// Other zones of the caller's region.
    Region,
    /// Peer regions (from federation aggregates).
    Remote,
}

impl Tier {
    /// 0, 1 or 2.
    pub const fn number(self) -> u8 {
        match self {
            Self::Local => 0,
            Self::Region => 1,
            Self::Remote => 2,
        }
    }
}

/// What a caller should do with an endpoint.
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
pub enum EndpointStatus {
    /// Route normally.
    Eligible,
    /// Route at the reduced weight.
    Degraded,
    /// Route: no evidence either way (Envoy `UNKNOWN`, which Envoy routes to).
    Unknown,
    /// Route only because its zone's fraction guard engaged: health disregarded.
    Disregarded,
    /// No new traffic (Envoy `DRAINING`).
    Draining,
}

impl EndpointStatus {
    /// Whether callers route new requests to it.
    pub const fn is_routed(self) -> bool {
        !matches!(self, Self::Draining)
    }
}

/// One endpoint of a view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ViewEndpoint {
    /// The instance.
    pub instance: InstanceId,
    /// Where to dial it.
    pub address: Address,
    /// Its region.
    pub region: RegionName,
    /// Its zone.
    pub zone: ZoneName,
    /// Topology class relative to the caller.
    pub tier: Tier,
    /// Failover priority (EDS priority): follows the tier, or the service's failover order.
    pub priority: u32,
    /// Published weight.
    pub weight: Weight,
    /// What callers should do.
    pub status: EndpointStatus,
    /// The evaluator's verdict, unchanged by the guard (so `Disregarded` stays explainable).
    pub verdict: Verdict,
    /// Labels, for subsets and filtering.
    pub tags: Arc<BTreeSet<String>>,
    /// Metadata carried to callers.
    pub metadata: Arc<BTreeMap<String, String>>,
    /// What the endpoint's health rests on (ADR-16); `None` where it is not stated (an
    /// endpoint a peer region sent, whose aggregate does not carry it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<Capability>,
}

/// What an endpoint's health rests on, stated in the view so a caller can tell an
/// unprobed endpoint (a third party's, with no readiness signal) from a probed healthy one
/// (ADR-16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "EndpointCapability")]
pub struct Capability {
    /// The evidence classes the service's capability profile supplies.
    pub profile: CapabilityProfile,
    /// Whether any class speaks for the endpoint now: `false` is "health unknown",
    /// stated rather than implied.
    pub verified: bool,
    /// Which evidence its verdict rests on now.
    pub evidence: EvidenceMode,
}

impl Capability {
    /// The classes the profile supplies, by name, in the fixed class order.
    pub fn classes(&self) -> impl Iterator<Item = &'static str> + '_ {
        crate::model::EvidenceClass::ALL
            .into_iter()
            .filter(|c| self.profile.provides(*c))
            .map(crate::model::EvidenceClass::as_str)
    }
}

impl ViewEndpoint {
    /// A local, eligible endpoint at the default weight and priority 0, with no tags or
    /// metadata: what a probed, healthy instance of the caller's own region looks like.
    pub fn eligible(
        instance: InstanceId,
        address: Address,
        region: RegionName,
        zone: ZoneName,
    ) -> Self {
        Self {
            instance,
            address,
            region,
            zone,
            tier: Tier::Local,
            priority: 0,
            weight: Weight::DEFAULT,
            status: EndpointStatus::Eligible,
            verdict: Verdict::Eligible,
            tags: Arc::default(),
            metadata: Arc::default(),
            capability: None,
        }
    }
}

/// Markers a view declares about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Markers {
    /// Zones whose fraction guard engaged: their full set is published, health disregarded.
    pub health_disregarded: BTreeSet<ZoneName>,
    /// Zones being evacuated, with the share of traffic already moved away.
    pub evacuating: BTreeMap<ZoneName, Permille>,
    /// No instance of the service is eligible anywhere in the region.
    pub no_eligible_in_region: bool,
    /// The fewest routed endpoints each zone may publish without declaring
    /// `health_disregarded` (its minimum healthy fraction of its candidates, rounded up).
    /// The delta queues keep every partial release at or above it.
    pub zone_floor: BTreeMap<ZoneName, u32>,
}

/// Which view: a service as seen from one caller zone.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct ViewKey {
    /// The service.
    pub service: ServiceName,
    /// The callers' zone.
    pub zone: ZoneName,
}

impl std::fmt::Display for ViewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.service, self.zone)
    }
}

/// A view's endpoints by instance, as a persistent B-tree shared by every holder of the
/// view (the assembler's target, the delta queues' target and release, the replicated
/// state, the publisher, the xDS tier): cloning a view copies a pointer, changing one
/// endpoint copies only the path to it, and two versions of a view share every node the
/// change did not touch — so comparing them skips what they share. A service of 133
/// instances in three zones used to copy and free all three maps on every registration.
pub type Endpoints = imbl::OrdMap<InstanceId, ViewEndpoint>;

/// A view's content (unversioned).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct View {
    /// Which view.
    pub key: ViewKey,
    /// Endpoints by instance.
    #[schemars(with = "BTreeMap<InstanceId, ViewEndpoint>")]
    pub endpoints: Endpoints,
    /// Declared markers.
    pub markers: Markers,
}

/// A view as released to subscribers, at a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReleasedView {
    /// Its version.
    pub version: Version,
    /// Its content.
    pub view: View,
}

/// The difference between two contents of one view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewDelta {
    /// Which view.
    pub key: ViewKey,
    /// Endpoints added or changed.
    pub upserted: Vec<ViewEndpoint>,
    /// Endpoints removed.
    pub removed: Vec<InstanceId>,
    /// The markers after the change (always sent whole: they are small).
    pub markers: Markers,
}

impl ViewDelta {
    /// Whether the delta changes nothing.
    pub fn is_empty(&self, old_markers: &Markers) -> bool {
        self.upserted.is_empty() && self.removed.is_empty() && &self.markers == old_markers
    }
}

// === impl View ===

impl View {
    /// An empty view.
    pub fn empty(key: ViewKey) -> Self {
        Self {
            key,
            endpoints: Endpoints::default(),
            markers: Markers::default(),
        }
    }

    /// Routed endpoints in `zone`.
    pub fn routed_in(&self, zone: &ZoneName) -> usize {
        self.endpoints
            .values()
            .filter(|e| &e.zone == zone && e.status.is_routed())
            .count()
    }

    /// Whether an endpoint is present and routed.
    pub fn routes_to(&self, id: &InstanceId) -> bool {
        self.endpoints.get(id).is_some_and(|e| e.status.is_routed())
    }
}

/// What changed from `old` to `new` (same key).
pub fn diff(old: &View, new: &View) -> ViewDelta {
    debug_assert_eq!(old.key, new.key, "diff across different views");
    let mut upserted = Vec::new();
    let mut removed = Vec::new();
    // Two versions of a view share every node the change did not touch; the walk skips them.
    for item in old.endpoints.diff(&new.endpoints) {
        match item {
            imbl::ordmap::DiffItem::Add(_, is)
            | imbl::ordmap::DiffItem::Update { new: (_, is), .. } => {
                upserted.push(is.clone());
            }
            imbl::ordmap::DiffItem::Remove(id, _) => removed.push(id.clone()),
        }
    }
    ViewDelta {
        key: new.key.clone(),
        upserted,
        removed,
        markers: new.markers.clone(),
    }
}

/// The endpoints that differ between two versions of a view, in instance order: each
/// such instance once, with what each version holds of it (`None`: absent). Subtrees the
/// two versions share are skipped without a comparison, so the cost follows the change,
/// not the view (views are compared on every change of a service, on the leader's hot
/// path).
pub fn changed<'a>(
    old: &'a Endpoints,
    new: &'a Endpoints,
) -> impl Iterator<Item = (Option<&'a ViewEndpoint>, Option<&'a ViewEndpoint>)> + 'a {
    old.diff(new).map(|item| match item {
        imbl::ordmap::DiffItem::Add(_, is) => (None, Some(is)),
        imbl::ordmap::DiffItem::Update {
            old: (_, was),
            new: (_, is),
        } => (Some(was), Some(is)),
        imbl::ordmap::DiffItem::Remove(_, was) => (Some(was), None),
    })
}

/// `old` with `delta` applied.
pub fn apply(old: &View, delta: &ViewDelta) -> View {
    let mut view = old.clone();
    for id in &delta.removed {
        view.endpoints.remove(id);
    }
    for e in &delta.upserted {
        view.endpoints.insert(e.instance.clone(), e.clone());
    }
    view.markers = delta.markers.clone();
    view
}

#[cfg(test)]
pub(crate) mod tests;
