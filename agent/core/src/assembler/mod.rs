//! View assembler: eligibility → per-service, per-caller-zone target views.
//!
//! Pure state machine; no I/O. Inputs are existence ([`ViewAssembler::handle_instance`]),
//! verdicts ([`ViewAssembler::handle_eligibility`]), peer-region aggregates
//! ([`ViewAssembler::handle_remote`]), policy, zone evacuation and region failover commands;
//! [`ViewAssembler::assemble`] rebuilds only the services touched since
//! the last call and emits a [`Effect::Target`] for each view whose content changed. Versions
//! are not assigned here: the delta queues stamp them when they release (see `delta`).
//!
//! A service whose only changes since its last assembly are to some of its instances (a
//! verdict, a registration, a retirement — nearly every change in a busy region) has its
//! views patched rather than rebuilt: each changed instance's endpoint is recomputed and put
//! in (or taken out of) a copy of the previous view. Anything that can move every endpoint —
//! the guard engaging or releasing in a zone, a policy, an evacuation or failover step, a
//! peer region's endpoints, a failover priority appearing or vanishing — rebuilds the service
//! from scratch. A property test holds the two paths to the same views.
//!
//! The fraction guard sits here, downstream of evaluation, so it survives bugs in evaluation
//! (ADR-08): per service per zone, if fewer than the minimum healthy fraction of the zone's
//! instances would be routed, the zone's full set is published as `Disregarded`, the view
//! declares `health_disregarded`, and [`Effect::GuardEngaged`] raises the alarm. Two kinds of
//! instance are never put back by the guard: deliberate exits (draining, maintenance) and
//! hard failures (a refused connection is not a health check's opinion — there is nothing
//! listening to route to). Hard failures still count toward the zone's total, so the alarm
//! fires.
//!
//! Zone evacuation (tiers 0 and 1) and region failover (tier 2) are preference shifts driven
//! by one rate-capped step machine (`evacuation`); steps fire in
//! [`ViewAssembler::handle_timeout`]. Neither ever removes an endpoint from a view.
//!
//! Invariants (property tests in `assembler/props.rs`): in every target view, each zone either
//! routes at least its floor of candidates or is declared `health_disregarded`; region
//! failover never removes a peer region's endpoint, and its share moves by at most one step
//! per interval unless an operator completes a shift-back.

mod evacuation;
mod region_failover;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::contract::CapabilityProfile;
use crate::defaults as d;
use crate::eligibility::{Eligibility, EvidenceMode, IneligibleReason, Verdict};
use crate::model::{Address, Instance, InstanceId, RegionName, ServiceName, ZoneName};
use crate::units::{Permille, Weight};
use crate::view::{Capability, EndpointStatus, Markers, Tier, View, ViewEndpoint, ViewKey};
pub use evacuation::{Direction, Evacuation, EvacuationCommand, EvacuationError};
use evacuation::{ShiftRefusal, Shifts};

/// The region the assembler works for, and its pacing.
#[derive(Debug, Clone)]
pub struct AssemblerConfig {
    /// This region.
    pub region: RegionName,
    /// The region's zones; views are assembled for callers in each (plus any zone an
    /// instance reports).
    pub zones: BTreeSet<ZoneName>,
    /// Share of traffic an evacuation moves per step.
    pub evacuation_step: Permille,
    /// Time between evacuation steps.
    pub evacuation_step_interval: Duration,
    /// Share of a peer region's tier-2 traffic a region failover moves per step.
    pub region_failover_step: Permille,
    /// Time between region failover steps.
    pub region_failover_step_interval: Duration,
    /// Whether the fraction guard runs (ADR-08). Always on in production: switching it off
    /// exists only so a drill can show what a broken health check does without it (the
    /// service drains). `waymark authority` turns it off only when
    /// `WAYMARK_UNSAFE_DISABLE_FRACTION_GUARD=1` is set, and says so in its log.
    pub fraction_guard: bool,
}

impl AssemblerConfig {
    /// Defaults for `region` with `zones`.
    pub fn new(region: RegionName, zones: impl IntoIterator<Item = ZoneName>) -> Self {
        Self {
            region,
            zones: zones.into_iter().collect(),
            evacuation_step: d::EVACUATION_STEP,
            evacuation_step_interval: d::EVACUATION_STEP_INTERVAL,
            region_failover_step: d::REGION_FAILOVER_STEP,
            region_failover_step_interval: d::REGION_FAILOVER_STEP_INTERVAL,
            fraction_guard: true,
        }
    }
}

/// A service's routing policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePolicy {
    /// Minimum healthy fraction per zone.
    pub min_healthy: Permille,
    /// Optional failover order the priorities follow.
    pub failover: Option<FailoverOrder>,
    /// The classes the service's contract says it can supply, stated per endpoint.
    pub profile: CapabilityProfile,
}

impl Default for ServicePolicy {
    fn default() -> Self {
        Self {
            min_healthy: d::MIN_HEALTHY,
            failover: None,
            profile: CapabilityProfile::default(),
        }
    }
}

/// Which zones, then which regions, take traffic when the caller's zone cannot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailoverOrder {
    /// Zones of this region, most preferred first; unlisted zones come after.
    pub zones: Vec<ZoneName>,
    /// Peer regions, most preferred first; unlisted regions come after.
    pub regions: Vec<RegionName>,
}

/// An endpoint of a peer region, from its read-only aggregate (tier 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteEndpoint {
    /// The instance.
    pub instance: InstanceId,
    /// Where to dial it.
    pub address: Address,
    /// Its zone in its region.
    pub zone: ZoneName,
    /// Weight as its region published it.
    pub weight: Weight,
    /// Status as its region published it.
    pub status: EndpointStatus,
    /// Verdict as its region published it.
    pub verdict: Verdict,
}

/// What the assembler asks its driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// A view's content changed: hand it to the delta queues.
    Target(View),
    /// Alarm: a zone fell below its floor and its health is being disregarded.
    GuardEngaged {
        /// The service.
        service: ServiceName,
        /// The zone.
        zone: ZoneName,
        /// Instances the evaluator would route.
        routed: usize,
        /// Instances counted toward the floor.
        total: usize,
        /// The floor.
        floor: Permille,
    },
    /// The zone is back above its floor.
    GuardReleased {
        /// The service.
        service: ServiceName,
        /// The zone.
        zone: ZoneName,
    },
    /// Incident: the last eligible instance of the service in the region was withdrawn.
    LastEligibleWithdrawn {
        /// The service.
        service: ServiceName,
        /// This region.
        region: RegionName,
    },
    /// The service has an eligible instance in the region again.
    EligibleRestored {
        /// The service.
        service: ServiceName,
    },
    /// An evacuation moved a step.
    EvacuationProgress {
        /// The zone.
        zone: ZoneName,
        /// Share of its traffic moved away.
        moved: Permille,
        /// Holding for an operator's completion.
        awaiting_completion: bool,
    },
    /// A region failover moved a step (or ended: `moved` zero and not awaiting).
    RegionFailoverProgress {
        /// The peer region.
        region: RegionName,
        /// Share of its tier-2 traffic moved away.
        moved: Permille,
        /// Holding for an operator's completion.
        awaiting_completion: bool,
    },
}

#[derive(Debug, Clone)]
struct Member {
    instance: Arc<Instance>,
    /// Shared into every view built from this member, so a rebuild copies pointers only.
    tags: Arc<BTreeSet<String>>,
    metadata: Arc<BTreeMap<String, String>>,
    eligibility: Option<Eligibility>,
    /// The evaluator's evidence mode and whether a class speaks for it.
    evidence: Option<(EvidenceMode, bool)>,
}

#[derive(Debug, Clone, Default)]
struct ServiceSlot {
    policy: ServicePolicy,
    members: BTreeMap<InstanceId, Member>,
    remote: BTreeMap<RegionName, Vec<RemoteEndpoint>>,
    guarded: BTreeSet<ZoneName>,
    had_eligible: Option<bool>,
    targets: BTreeMap<ZoneName, View>,
    /// Per caller zone, how many endpoints of its target hold each failover rank before
    /// ranks are made contiguous: a patch that leaves the set of ranks alone leaves every
    /// other endpoint's priority alone.
    ranks: BTreeMap<ZoneName, BTreeMap<u32, usize>>,
}

/// What changed in a service since its views were last assembled.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Touched {
    /// Only these instances (their verdict, record or existence).
    Members(BTreeSet<InstanceId>),
    /// Something that can move every endpoint: rebuild.
    All,
}

/// The view assembler. See the module documentation.
#[derive(Debug)]
pub struct ViewAssembler {
    config: AssemblerConfig,
    services: BTreeMap<ServiceName, ServiceSlot>,
    zones: BTreeSet<ZoneName>,
    evacuations: Shifts<ZoneName>,
    region_failovers: Shifts<RegionName>,
    dirty: BTreeMap<ServiceName, Touched>,
    effects: Vec<Effect>,
}

/// Per-zone tallies for the guard.
#[derive(Debug, Default, Clone, Copy)]
struct ZoneTally {
    routed: usize,
    total: usize,
}

// === impl ViewAssembler ===

impl ViewAssembler {
    /// An assembler with no services.
    pub fn new(config: AssemblerConfig) -> Self {
        let zones = config.zones.clone();
        Self {
            config,
            services: BTreeMap::new(),
            zones,
            evacuations: Shifts::new(),
            region_failovers: Shifts::new(),
            dirty: BTreeMap::new(),
            effects: Vec::new(),
        }
    }

    /// Set a service's policy (creating the service if new).
    pub fn handle_policy(&mut self, service: &ServiceName, policy: ServicePolicy) {
        self.slot(service).policy = policy;
    }

    /// An instance exists (or its address, weight, tags changed).
    pub fn handle_instance(&mut self, instance: &Instance) {
        let new_zone = self.zones.insert(instance.locality.zone.clone());
        let new_service = !self.services.contains_key(&instance.service);
        if new_zone || new_service {
            self.touch_all(&instance.service);
        } else {
            self.touch_member(&instance.service, &instance.id);
        }
        let slot = self.services.entry(instance.service.clone()).or_default();
        let tags = Arc::new(instance.tags.clone());
        let metadata = Arc::new(instance.metadata.clone());
        let mut instance = instance.clone();
        // Every member of a zone holds the zone's one name, so the tallies and groupings
        // that compare zones per member compare pointers, not text.
        if let Some(zone) = self.zones.get(&instance.locality.zone) {
            instance.locality.zone = zone.clone();
        }
        let instance = Arc::new(instance);
        let known = slot.members.get(&instance.id);
        let (eligibility, evidence) = (
            known.and_then(|m| m.eligibility),
            known.and_then(|m| m.evidence),
        );
        let member = Member {
            instance: instance.clone(),
            tags,
            metadata,
            eligibility,
            evidence,
        };
        slot.members.insert(instance.id.clone(), member);
    }

    /// The evaluator's verdict for an instance. Unknown instances are ignored (the
    /// registry feeds existence first).
    pub fn handle_eligibility(
        &mut self,
        service: &ServiceName,
        id: &InstanceId,
        eligibility: Eligibility,
    ) {
        let Some(slot) = self.services.get_mut(service) else {
            return;
        };
        if let Some(m) = slot.members.get_mut(id)
            && m.eligibility != Some(eligibility)
        {
            m.eligibility = Some(eligibility);
            self.touch_member(service, id);
        }
    }

    /// What the evaluator's verdict for an instance rests on (ADR-04, ADR-16), carried
    /// into its endpoint's [`Capability`](crate::view::Capability).
    pub fn handle_evidence(
        &mut self,
        service: &ServiceName,
        id: &InstanceId,
        mode: EvidenceMode,
        verified: bool,
    ) {
        let Some(slot) = self.services.get_mut(service) else {
            return;
        };
        if let Some(m) = slot.members.get_mut(id)
            && m.evidence != Some((mode, verified))
        {
            m.evidence = Some((mode, verified));
            self.touch_member(service, id);
        }
    }

    /// An instance is gone for good (retired).
    pub fn handle_removed(&mut self, service: &ServiceName, id: &InstanceId) {
        if let Some(slot) = self.services.get_mut(service)
            && slot.members.remove(id).is_some()
        {
            self.touch_member(service, id);
        }
    }

    /// A service left the registry: forget it and its views. A peer region that still
    /// sends endpoints for it brings it back as a tier-2-only service.
    pub fn handle_service_removed(&mut self, service: &ServiceName) {
        self.services.remove(service);
        self.dirty.remove(service);
    }

    /// A peer region's endpoints for a service (replaces what that region sent before);
    /// the service's views are rebuilt on the next [`ViewAssembler::assemble`].
    pub fn handle_remote(
        &mut self,
        service: &ServiceName,
        region: RegionName,
        endpoints: Vec<RemoteEndpoint>,
    ) {
        let slot = self.slot(service);
        if endpoints.is_empty() {
            slot.remote.remove(&region);
        } else {
            slot.remote.insert(region, endpoints);
        }
    }

    /// Start, reverse or complete a zone evacuation.
    pub fn handle_evacuation(
        &mut self,
        now: Instant,
        zone: &ZoneName,
        command: EvacuationCommand,
    ) -> Result<(), EvacuationError> {
        self.check_zone(zone, command)?;
        let (step, interval) = (
            self.config.evacuation_step,
            self.config.evacuation_step_interval,
        );
        self.evacuations
            .apply(now, zone, command, step, interval)
            .map_err(|r| zone_error(r, zone))?;
        self.evacuation_changed(zone);
        Ok(())
    }

    /// Whether [`ViewAssembler::handle_evacuation`] would accept `command`, without acting.
    pub fn check_evacuation(
        &self,
        zone: &ZoneName,
        command: EvacuationCommand,
    ) -> Result<(), EvacuationError> {
        self.check_zone(zone, command)?;
        self.evacuations
            .check(zone, command)
            .map_err(|r| zone_error(r, zone))
    }

    /// What a zone must be to be evacuated: one of the region's, and never the last one
    /// taking traffic.
    fn check_zone(
        &self,
        zone: &ZoneName,
        command: EvacuationCommand,
    ) -> Result<(), EvacuationError> {
        let name = || zone.to_string();
        if !self.zones.contains(zone) {
            return Err(EvacuationError::UnknownZone { zone: name() });
        }
        if let EvacuationCommand::Evacuate { .. } = command {
            let others_home = self
                .zones
                .iter()
                .any(|z| z != zone && !self.evacuations.contains(z));
            if !others_home {
                return Err(EvacuationError::LastZone { zone: name() });
            }
        }
        Ok(())
    }

    /// Resume an evacuation where a previous leader left it (from the replicated record):
    /// the share already moved stays moved, and stepping continues from there. A record
    /// naming an unknown zone, or one already home, is ignored.
    pub fn restore_evacuation(
        &mut self,
        now: Instant,
        zone: &ZoneName,
        moved: Permille,
        direction: Direction,
        manual: bool,
        awaiting_completion: bool,
    ) {
        if !self.zones.contains(zone) {
            return;
        }
        let interval = self.config.evacuation_step_interval;
        let kept = self.evacuations.restore(
            now,
            zone,
            moved,
            direction,
            manual,
            awaiting_completion,
            interval,
        );
        if kept {
            self.evacuation_changed(zone);
        }
    }

    /// Take the evacuation and region failover steps due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.step_evacuations(now);
        self.step_region_failovers(now);
    }

    /// The next evacuation or region failover step.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.evacuations.next_step(),
            self.region_failovers.next_step(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn step_evacuations(&mut self, now: Instant) {
        let (step, interval) = (
            self.config.evacuation_step,
            self.config.evacuation_step_interval,
        );
        for zone in self.evacuations.step_due(now, step, interval) {
            self.evacuation_changed(&zone);
        }
    }

    /// Rebuild every service touched since the last call; emits effects.
    pub fn assemble(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        for (service, touched) in dirty {
            self.assemble_service(&service, &touched);
        }
    }

    /// Drain the effects produced so far, in order.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// The current target view for callers in `zone`.
    pub fn target(&self, key: &ViewKey) -> Option<&View> {
        self.services.get(&key.service)?.targets.get(&key.zone)
    }

    /// Zones whose guard is engaged for a service.
    pub fn guarded_zones(&self, service: &ServiceName) -> BTreeSet<ZoneName> {
        self.services
            .get(service)
            .map(|s| s.guarded.clone())
            .unwrap_or_default()
    }

    /// The evacuation state of a zone.
    pub fn evacuation(&self, zone: &ZoneName) -> Option<&Evacuation> {
        self.evacuations.get(zone)
    }

    // --- assembly ---

    fn slot(&mut self, service: &ServiceName) -> &mut ServiceSlot {
        self.touch_all(service);
        self.services.entry(service.clone()).or_default()
    }

    /// The service's views must be rebuilt.
    fn touch_all(&mut self, service: &ServiceName) {
        self.dirty.insert(service.clone(), Touched::All);
    }

    /// One instance of the service changed; its views may be patched.
    fn touch_member(&mut self, service: &ServiceName, id: &InstanceId) {
        match self.dirty.entry(service.clone()) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(Touched::Members(BTreeSet::from([id.clone()])));
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                if let Touched::Members(ids) = o.get_mut() {
                    ids.insert(id.clone());
                }
            }
        }
    }

    fn evacuation_changed(&mut self, zone: &ZoneName) {
        let (moved, awaiting_completion) = self
            .evacuations
            .get(zone)
            .map_or((Permille::ZERO, false), |e| {
                (e.moved, e.awaiting_completion)
            });
        self.effects.push(Effect::EvacuationProgress {
            zone: zone.clone(),
            moved,
            awaiting_completion,
        });
        let all: Vec<ServiceName> = self.services.keys().cloned().collect();
        for service in &all {
            self.touch_all(service);
        }
    }

    fn assemble_service(&mut self, service: &ServiceName, touched: &Touched) {
        let Some(mut slot) = self.services.remove(service) else {
            return;
        };
        let tallies = tally(&slot);
        let guard_moved = self.update_guard(service, &mut slot, &tallies);
        self.update_incident(service, &mut slot);
        let markers = self.markers(&slot, &tallies);
        for caller in self.zones.clone() {
            let patched = match touched {
                Touched::Members(ids) if !guard_moved => {
                    self.patch_view(&slot, &caller, ids, &markers)
                }
                _ => None,
            };
            let (view, ranks, changed) = patched.unwrap_or_else(|| {
                let (view, ranks) = self.build_view(service, &slot, &caller, &markers);
                let changed = slot.targets.get(&caller) != Some(&view);
                (view, ranks, changed)
            });
            slot.ranks.insert(caller.clone(), ranks);
            if changed {
                slot.targets.insert(caller, view.clone());
                self.effects.push(Effect::Target(view));
            }
        }
        self.services.insert(service.clone(), slot);
    }

    /// What every view of the service declares, given its guard state and tallies.
    fn markers(&self, slot: &ServiceSlot, tallies: &BTreeMap<ZoneName, ZoneTally>) -> Markers {
        Markers {
            health_disregarded: slot.guarded.clone(),
            evacuating: self
                .evacuations
                .iter()
                .map(|(z, e)| (z.clone(), e.moved))
                .collect(),
            no_eligible_in_region: slot.had_eligible == Some(false) && !slot.members.is_empty(),
            zone_floor: tallies
                .iter()
                .filter(|(z, _)| !slot.guarded.contains(*z))
                .map(|(z, t)| (z.clone(), floor_count(t.total, slot.policy.min_healthy)))
                .collect(),
        }
    }

    /// The view a rebuild from scratch would give now, whatever changed: what a patched
    /// view must equal.
    #[cfg(test)]
    fn rebuilt(&self, key: &ViewKey) -> Option<View> {
        let slot = self.services.get(&key.service)?;
        let markers = self.markers(slot, &tally(slot));
        Some(self.build_view(&key.service, slot, &key.zone, &markers).0)
    }

    /// The caller's previous target with the endpoints of `ids` recomputed, and whether
    /// that changed anything (if not, the previous view itself), or `None` when
    /// a patch cannot give what a rebuild would: no previous target, a changed instance
    /// that a peer region's endpoint shadows, or a failover rank appearing or vanishing
    /// (which renumbers the priorities of endpoints that did not change).
    fn patch_view(
        &self,
        slot: &ServiceSlot,
        caller: &ZoneName,
        ids: &BTreeSet<InstanceId>,
        markers: &Markers,
    ) -> Option<(View, BTreeMap<u32, usize>, bool)> {
        let old = slot.targets.get(caller)?;
        let old_ranks = slot.ranks.get(caller)?;
        let shadowed = |id: &InstanceId| {
            slot.remote
                .values()
                .any(|list| list.iter().any(|r| &r.instance == id))
        };
        let caller_moved = self.moved(caller);
        let mut ranks = old_ranks.clone();
        let mut fresh = Vec::with_capacity(ids.len());
        for id in ids {
            if !slot.remote.is_empty() && shadowed(id) {
                return None;
            }
            if let Some(prev) = old.endpoints.get(id) {
                let tier = tier_of(&prev.zone, caller);
                let (_, rank) = self.shift(&prev.zone, caller_moved, tier, prev.weight, slot);
                let held = ranks.get_mut(&rank)?;
                *held -= 1;
                if *held == 0 {
                    ranks.remove(&rank);
                }
            }
            let new = slot
                .members
                .get(id)
                .and_then(|m| self.member_endpoint(m, slot, caller, caller_moved));
            if let Some((_, rank)) = &new {
                *ranks.entry(*rank).or_default() += 1;
            }
            fresh.push((id, new));
        }
        if !ranks.keys().eq(old_ranks.keys()) {
            return None;
        }
        let dense: BTreeMap<u32, u32> = ranks.keys().copied().zip(0..).collect();
        let fresh: Vec<(&InstanceId, Option<ViewEndpoint>)> = fresh
            .into_iter()
            .map(|(id, new)| {
                let new = new.map(|(mut e, rank)| {
                    e.priority = dense[&rank];
                    e
                });
                (id, new)
            })
            .collect();
        // Often nothing a caller sees changed (a registration not yet judged, a verdict
        // that publishes the same): keep the previous view itself, copying nothing.
        let same = *markers == old.markers
            && fresh
                .iter()
                .all(|(id, new)| old.endpoints.get(*id) == new.as_ref());
        if same {
            return Some((old.clone(), ranks, false));
        }
        let mut endpoints = old.endpoints.clone();
        let map = &mut endpoints;
        for (id, new) in fresh {
            match new {
                Some(e) => {
                    map.insert(id.clone(), e);
                }
                None => {
                    map.remove(id);
                }
            }
        }
        let view = View {
            key: old.key.clone(),
            endpoints,
            markers: markers.clone(),
        };
        Some((view, ranks, true))
    }

    /// Engage and release the guard per zone from the tallies; whether any zone's changed.
    fn update_guard(
        &mut self,
        service: &ServiceName,
        slot: &mut ServiceSlot,
        tallies: &BTreeMap<ZoneName, ZoneTally>,
    ) -> bool {
        let floor = slot.policy.min_healthy;
        let on = self.config.fraction_guard;
        let now_guarded: BTreeSet<ZoneName> = tallies
            .iter()
            .filter(|(_, t)| {
                on && t.total > 0 && Permille::ratio(t.routed as u64, t.total as u64) < floor
            })
            .map(|(z, _)| z.clone())
            .collect();
        for zone in now_guarded.difference(&slot.guarded) {
            let t = tallies[zone];
            tracing::warn!(service = %service, zone = %zone, routed = t.routed, total = t.total, "fraction guard engaged: health disregarded");
            self.effects.push(Effect::GuardEngaged {
                service: service.clone(),
                zone: zone.clone(),
                routed: t.routed,
                total: t.total,
                floor,
            });
        }
        for zone in slot.guarded.difference(&now_guarded) {
            tracing::info!(service = %service, zone = %zone, "fraction guard released");
            self.effects.push(Effect::GuardReleased {
                service: service.clone(),
                zone: zone.clone(),
            });
        }
        let moved = slot.guarded != now_guarded;
        slot.guarded = now_guarded;
        moved
    }

    fn update_incident(&mut self, service: &ServiceName, slot: &mut ServiceSlot) {
        let any = slot
            .members
            .values()
            .any(|m| m.eligibility.is_some_and(|e| e.is_routed()));
        let known = slot.members.values().any(|m| m.eligibility.is_some());
        if !known {
            return;
        }
        match (slot.had_eligible, any) {
            (Some(true), false) => {
                tracing::error!(service = %service, region = %self.config.region, "last eligible instance in region withdrawn");
                self.effects.push(Effect::LastEligibleWithdrawn {
                    service: service.clone(),
                    region: self.config.region.clone(),
                });
            }
            (Some(false), true) => self.effects.push(Effect::EligibleRestored {
                service: service.clone(),
            }),
            _ => {}
        }
        slot.had_eligible = Some(any);
    }

    /// The caller's view of the service from scratch, and how many endpoints hold each
    /// failover rank before the ranks are made contiguous.
    fn build_view(
        &self,
        service: &ServiceName,
        slot: &ServiceSlot,
        caller: &ZoneName,
        markers: &Markers,
    ) -> (View, BTreeMap<u32, usize>) {
        let key = ViewKey {
            service: service.clone(),
            zone: caller.clone(),
        };
        let caller_moved = self.moved(caller);
        let mut raw: Vec<(ViewEndpoint, u32)> = Vec::with_capacity(slot.members.len());
        raw.extend(
            slot.members
                .values()
                .filter_map(|m| self.member_endpoint(m, slot, caller, caller_moved)),
        );
        let region_ranks = local_ranks(&self.zones, slot) + 2;
        let order = slot.policy.failover.as_ref().map(|f| f.regions.as_slice());
        for (region, list) in &slot.remote {
            for r in list
                .iter()
                .filter(|r| r.status.is_routed() || r.status == EndpointStatus::Draining)
            {
                let (weight, rank) = self.remote_shift(region, order, r.weight);
                let mut e = remote_endpoint(r, region);
                e.weight = weight;
                raw.push((e, region_ranks + rank));
            }
        }
        // Envoy wants contiguous priorities from 0: compact the ranks in order. Members come
        // in instance order and peers after them: built in one pass (the map sorts what is
        // not in order yet; for a repeated instance the last one stays, as inserting one by
        // one would keep, and only what stays is counted).
        let endpoints: BTreeMap<InstanceId, (ViewEndpoint, u32)> = raw
            .into_iter()
            .map(|(e, rank)| (e.instance.clone(), (e, rank)))
            .collect();
        let mut ranks: BTreeMap<u32, usize> = BTreeMap::new();
        for (_, rank) in endpoints.values() {
            *ranks.entry(*rank).or_default() += 1;
        }
        let dense: BTreeMap<u32, u32> = ranks.keys().copied().zip(0..).collect();
        let endpoints: BTreeMap<InstanceId, ViewEndpoint> = endpoints
            .into_iter()
            .map(|(id, (mut e, rank))| {
                e.priority = dense[&rank];
                (id, e)
            })
            .collect();
        let view = View {
            key,
            endpoints: endpoints.into(),
            markers: markers.clone(),
        };
        (view, ranks)
    }

    /// A member's endpoint in the caller's view with its failover rank (before ranks are
    /// made contiguous), or `None` if it is not published there.
    fn member_endpoint(
        &self,
        m: &Member,
        slot: &ServiceSlot,
        caller: &ZoneName,
        caller_moved: Permille,
    ) -> Option<(ViewEndpoint, u32)> {
        let eligibility = m.eligibility?;
        let zone = &m.instance.locality.zone;
        let (status, weight) =
            publish(&eligibility, m.instance.weight, slot.guarded.contains(zone))?;
        let tier = tier_of(zone, caller);
        let (weight, rank) = self.shift(zone, caller_moved, tier, weight, slot);
        let mut e = endpoint(m, tier, weight, status, eligibility.verdict());
        // Before the evaluator has said anything, nothing speaks for the instance: that
        // is stated too (health unknown), not left out.
        let (evidence, verified) = m.evidence.unwrap_or((EvidenceMode::SingleClass, false));
        e.capability = Some(Capability {
            profile: slot.policy.profile,
            verified,
            evidence,
        });
        Some((e, rank))
    }

    /// Weight and priority rank after evacuation shifts.
    fn shift(
        &self,
        zone: &ZoneName,
        caller_moved: Permille,
        tier: Tier,
        weight: Weight,
        slot: &ServiceSlot,
    ) -> (Weight, u32) {
        let failover_zones = slot.policy.failover.as_ref().map(|f| f.zones.as_slice());
        let base_rank = match tier {
            Tier::Local => 0,
            _ => 1 + rank_in(failover_zones, zone),
        };
        let zone_moved = self.moved(zone);
        if zone_moved == Permille::ONE {
            // Fully evacuated: failover only, after every other zone of the region.
            return (weight, local_ranks(&self.zones, slot) + 1);
        }
        let kept = Permille::saturating(1000 - u32::from(zone_moved.get()));
        let weight = weight.scale(kept);
        if caller_moved > Permille::ZERO && tier == Tier::Region && zone_moved == Permille::ZERO {
            // The caller's zone is evacuating: healthy zones join its first priority,
            // with a share that grows step by step.
            return (weight.scale(caller_moved), 0);
        }
        (weight, base_rank)
    }

    fn moved(&self, zone: &ZoneName) -> Permille {
        self.evacuations
            .get(zone)
            .map_or(Permille::ZERO, |e| e.moved)
    }
}

/// A member's tier in a caller's view: local to the caller's zone, or elsewhere in the region.
fn tier_of(zone: &ZoneName, caller: &ZoneName) -> Tier {
    if zone == caller {
        Tier::Local
    } else {
        Tier::Region
    }
}

/// Routed and total candidates per zone, as the evaluator judged them.
fn tally(slot: &ServiceSlot) -> BTreeMap<ZoneName, ZoneTally> {
    // A region has a handful of zones: a list searched in place beats a map per member,
    // and a name is cloned once per zone, not per member.
    let mut tallies: Vec<(&ZoneName, ZoneTally)> = Vec::new();
    for m in slot.members.values() {
        let Some(e) = m.eligibility else { continue };
        if matches!(e, Eligibility::Draining { .. }) {
            continue; // deliberate exits are not capacity the guard may restore
        }
        let zone = &m.instance.locality.zone;
        let at = match tallies.iter().position(|(z, _)| *z == zone) {
            Some(at) => at,
            None => {
                tallies.push((zone, ZoneTally::default()));
                tallies.len() - 1
            }
        };
        let t = &mut tallies[at].1;
        t.total += 1;
        t.routed += usize::from(e.is_routed());
    }
    tallies.into_iter().map(|(z, t)| (z.clone(), t)).collect()
}

/// The fewest of `total` candidates that meet `floor`, rounded up.
fn floor_count(total: usize, floor: Permille) -> u32 {
    ((total as u64 * u64::from(floor.get())).div_ceil(1000)) as u32
}

/// How an eligibility is published, if at all: (status, weight).
fn publish(e: &Eligibility, base: Weight, guarded: bool) -> Option<(EndpointStatus, Weight)> {
    match e {
        Eligibility::Eligible { weight } => Some((EndpointStatus::Eligible, *weight)),
        Eligibility::Degraded { weight, .. } => Some((EndpointStatus::Degraded, *weight)),
        Eligibility::Unknown { weight } => Some((EndpointStatus::Unknown, *weight)),
        Eligibility::Draining { .. } => Some((EndpointStatus::Draining, base)),
        Eligibility::Ineligible {
            reason: IneligibleReason::HardFailure | IneligibleReason::Retired,
        } => None,
        Eligibility::Ineligible { .. } | Eligibility::Quarantined { .. } => {
            guarded.then_some((EndpointStatus::Disregarded, base))
        }
    }
}

/// How many ranks the region's own zones may take after the caller's: one per zone, or
/// one per entry of the service's failover order if it names more (an order may name
/// zones this region does not have), so no zone of the region ever ranks with a peer.
fn local_ranks(zones: &BTreeSet<ZoneName>, slot: &ServiceSlot) -> u32 {
    let listed = slot.policy.failover.as_ref().map_or(0, |f| f.zones.len());
    zones.len().max(listed) as u32
}

fn rank_in<T: PartialEq>(order: Option<&[T]>, item: &T) -> u32 {
    match order {
        Some(list) => list.iter().position(|x| x == item).unwrap_or(list.len()) as u32,
        None => 0,
    }
}

fn endpoint(
    m: &Member,
    tier: Tier,
    weight: Weight,
    status: EndpointStatus,
    verdict: Verdict,
) -> ViewEndpoint {
    let i = &m.instance;
    ViewEndpoint {
        instance: i.id.clone(),
        address: i.address,
        region: i.locality.region.clone(),
        zone: i.locality.zone.clone(),
        tier,
        priority: 0,
        weight,
        status,
        verdict,
        tags: m.tags.clone(),
        metadata: m.metadata.clone(),
        capability: None,
    }
}

fn remote_endpoint(r: &RemoteEndpoint, region: &RegionName) -> ViewEndpoint {
    ViewEndpoint {
        instance: r.instance.clone(),
        address: r.address,
        region: region.clone(),
        zone: r.zone.clone(),
        tier: Tier::Remote,
        priority: 0,
        weight: r.weight,
        status: r.status,
        verdict: r.verdict,
        tags: Arc::default(),
        metadata: Arc::default(),
        capability: None,
    }
}

#[cfg(test)]
mod props;
fn zone_error(refusal: ShiftRefusal, zone: &ZoneName) -> EvacuationError {
    let zone = zone.to_string();
    match refusal {
        ShiftRefusal::NotShifted => EvacuationError::NotEvacuated { zone },
        ShiftRefusal::NotAwaitingCompletion => EvacuationError::NotAwaitingCompletion { zone },
    }
}

#[cfg(test)]
mod tests;
