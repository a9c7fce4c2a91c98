//! The disruption budget (ADR-15): what taking instances out of rotation by hand may do to
//! a service, checked before anything is applied.
//!
//! A manual withdrawal (an override's `maintenance_on`, for one instance or every instance
//! of a node) is refused when it would
//!
//! - leave a zone of a service with fewer routed instances than the zone's floor — the
//!   fewest the fraction guard lets it publish without disregarding health (ADR-08), as
//!   the latest published view of the service declares it — or touch a zone whose guard is
//!   already engaged;
//! - or put more of a service's instances in maintenance at once than its budget of
//!   concurrent manual withdrawals (the policy's `max_manual_withdrawals`; by default a
//!   quarter of its instances, at least one).
//!
//! Break-glass: a refusal is recorded in the replicated audit log; a *different* principal
//! authorised for the same service may approve that exact request within
//! [`BREAK_GLASS_WINDOW`], once ([`approvable`]). The budget can be overridden by two
//! people, never removed.
//!
//! Pure: reads the replicated state it is handed; time arrives as `now_ms`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use waymark_core::model::{InstanceId, RegionName, ServiceName, ZoneName};
use waymark_core::units::Permille;
use waymark_core::view::EndpointStatus;

use crate::machine::{AuditEntry, AuditKind, AuthorityState};

/// A service's default budget of concurrent manual withdrawals, as a share of its
/// instances (at least one).
pub const MANUAL_WITHDRAWALS_SHARE: Permille = Permille::saturating(250);
/// How long a refused override may be approved by a second principal.
pub const BREAK_GLASS_WINDOW: Duration = Duration::from_secs(10 * 60);
/// The audit outcome of an override refused by the budget, awaiting a second principal.
pub const OUTCOME_AWAITING_APPROVAL: &str = "awaiting_approval";
/// The audit outcome of an override a second principal approved.
pub const OUTCOME_APPROVED: &str = "approved";

/// Why a manual withdrawal is refused. Nothing was applied; a second authorised principal
/// may approve it within [`BREAK_GLASS_WINDOW`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetRefusal {
    /// The zone would be left below its floor.
    #[error(
        "zone {zone} of {service} has {routed} routed instances and a floor of {floor}; \
         taking {taking} out would leave {}",
        routed.saturating_sub(*taking)
    )]
    ZoneFloor {
        /// The service.
        service: ServiceName,
        /// The zone.
        zone: ZoneName,
        /// Routed instances of the service in the zone now (not counting disregarded ones).
        routed: u32,
        /// How many this request takes out there.
        taking: u32,
        /// The fewest the zone may keep.
        floor: u32,
    },
    /// The zone's fraction guard is engaged: it is already below its floor.
    #[error("zone {zone} of {service} is already below its floor (health disregarded)")]
    GuardEngaged {
        /// The service.
        service: ServiceName,
        /// The zone.
        zone: ZoneName,
    },
    /// Too many of the service's instances would be in maintenance at once.
    #[error(
        "{service} has {in_maintenance} instances withdrawn by hand and a budget of {limit}; \
         taking {taking} more would exceed it"
    )]
    ManualLimit {
        /// The service.
        service: ServiceName,
        /// Its instances in maintenance now.
        in_maintenance: u32,
        /// How many this request adds.
        taking: u32,
        /// The budget.
        limit: u32,
    },
}

impl BudgetRefusal {
    /// Which budget refused, for the API and the audit record.
    pub fn budget(&self) -> &'static str {
        match self {
            Self::ZoneFloor { .. } | Self::GuardEngaged { .. } => "zone_floor",
            Self::ManualLimit { .. } => "manual_withdrawals",
        }
    }
}

/// Check taking `instances` out of rotation by hand (into maintenance) against the budget
/// of every service they belong to. Instances already in maintenance, or unknown, count
/// for nothing.
pub fn check(
    state: &AuthorityState,
    region: &RegionName,
    instances: &[InstanceId],
) -> Result<(), BudgetRefusal> {
    let registry = state.registry();
    let mut taking: BTreeMap<&ServiceName, BTreeSet<&InstanceId>> = BTreeMap::new();
    for id in instances {
        if let Some(r) = registry.instance(id)
            && r.maintenance.is_none()
        {
            taking.entry(&r.instance.service).or_default().insert(id);
        }
    }
    for (service, ids) in taking {
        let members: Vec<_> = registry
            .instances()
            .filter(|r| &r.instance.service == service)
            .collect();
        let in_maintenance = count(members.iter().filter(|r| r.maintenance.is_some()));
        let limit = registry
            .policy(service)
            .and_then(|p| p.max_manual_withdrawals)
            .unwrap_or_else(|| default_limit(count(members.iter())));
        // The zones first: a request that would break a floor says so, whatever else.
        check_zones(state, region, service, &ids)?;
        let adding = count(ids.iter());
        if in_maintenance.saturating_add(adding) > limit {
            return Err(BudgetRefusal::ManualLimit {
                service: service.clone(),
                in_maintenance,
                taking: adding,
                limit,
            });
        }
    }
    Ok(())
}

/// The zone floors of the service's latest published view (every view of a service
/// declares the same markers and lists every zone of the region).
fn check_zones(
    state: &AuthorityState,
    region: &RegionName,
    service: &ServiceName,
    ids: &BTreeSet<&InstanceId>,
) -> Result<(), BudgetRefusal> {
    let Some(view) = state
        .published()
        .values()
        .filter(|v| &v.view.key.service == service)
        .max_by_key(|v| v.version)
    else {
        // Nothing routes to the service: taking an instance out disrupts no caller.
        return Ok(());
    };
    let mut routed: BTreeMap<&ZoneName, u32> = BTreeMap::new();
    let mut taking: BTreeMap<&ZoneName, u32> = BTreeMap::new();
    for e in view.view.endpoints.values() {
        if &e.region != region {
            continue;
        }
        let counted = matches!(
            e.status,
            EndpointStatus::Eligible | EndpointStatus::Degraded | EndpointStatus::Unknown
        );
        if counted {
            *routed.entry(&e.zone).or_default() += 1;
            if ids.contains(&e.instance) {
                *taking.entry(&e.zone).or_default() += 1;
            }
        }
    }
    let markers = &view.view.markers;
    for (zone, n) in taking {
        if markers.health_disregarded.contains(zone) {
            return Err(BudgetRefusal::GuardEngaged {
                service: service.clone(),
                zone: zone.clone(),
            });
        }
        let have = routed.get(zone).copied().unwrap_or(0);
        let floor = markers.zone_floor.get(zone).copied().unwrap_or(0);
        if have.saturating_sub(n) < floor {
            return Err(BudgetRefusal::ZoneFloor {
                service: service.clone(),
                zone: zone.clone(),
                routed: have,
                taking: n,
                floor,
            });
        }
    }
    Ok(())
}

/// A quarter of `instances`, at least one.
fn default_limit(instances: u32) -> u32 {
    let share = u64::from(MANUAL_WITHDRAWALS_SHARE.get());
    u32::try_from(u64::from(instances) * share / 1000)
        .unwrap_or(u32::MAX)
        .max(1)
}

fn count<T>(items: impl Iterator<Item = T>) -> u32 {
    u32::try_from(items.count()).unwrap_or(u32::MAX)
}

/// Why a break-glass approval is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalRefusal {
    /// No override awaiting approval has that sequence number.
    #[error("no override awaiting approval has sequence number {seq}")]
    NotAwaiting {
        /// The number asked for.
        seq: u64,
    },
    /// The request is older than the window.
    #[error("the override {seq} was refused more than {} s ago", BREAK_GLASS_WINDOW.as_secs())]
    Expired {
        /// The number asked for.
        seq: u64,
    },
    /// The approver is the principal who asked.
    #[error("the override {seq} must be approved by a principal other than {actor}")]
    SamePrincipal {
        /// The number asked for.
        seq: u64,
        /// Who asked (and tried to approve).
        actor: String,
    },
    /// Someone already approved it.
    #[error("the override {seq} was already approved")]
    AlreadyApproved {
        /// The number asked for.
        seq: u64,
    },
}

impl ApprovalRefusal {
    /// A stable label for the API.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotAwaiting { .. } => "not_awaiting_approval",
            Self::Expired { .. } => "approval_expired",
            Self::SamePrincipal { .. } => "same_principal",
            Self::AlreadyApproved { .. } => "already_approved",
        }
    }
}

/// The override refused by the budget at audit sequence `seq`, if `approver` may approve it
/// at `now_ms`: it awaits approval, is within [`BREAK_GLASS_WINDOW`], was asked by someone
/// else, and nobody approved it yet. (Whether `approver` is authorised for the service is
/// the API's check, as for any override.)
pub fn approvable<'a>(
    state: &'a AuthorityState,
    seq: u64,
    approver: &str,
    now_ms: u64,
) -> Result<&'a AuditEntry, ApprovalRefusal> {
    let audit = state.audit();
    let request = audit
        .iter()
        .rev()
        .find(|e| e.seq == seq)
        .filter(|e| e.kind == AuditKind::Override && e.outcome == OUTCOME_AWAITING_APPROVAL)
        .ok_or(ApprovalRefusal::NotAwaiting { seq })?;
    let window = u64::try_from(BREAK_GLASS_WINDOW.as_millis()).unwrap_or(u64::MAX);
    if now_ms.saturating_sub(request.at_ms) > window {
        return Err(ApprovalRefusal::Expired { seq });
    }
    if request.actor == approver {
        return Err(ApprovalRefusal::SamePrincipal {
            seq,
            actor: approver.to_owned(),
        });
    }
    let approved = audit.iter().rev().take_while(|e| e.seq > seq).any(|e| {
        e.kind == AuditKind::Override
            && e.outcome == OUTCOME_APPROVED
            && e.detail.get("approves").and_then(serde_json::Value::as_u64) == Some(seq)
    });
    if approved {
        return Err(ApprovalRefusal::AlreadyApproved { seq });
    }
    Ok(request)
}

#[cfg(test)]
mod tests;
