//! Routing controls: zone evacuation (`GET /v1/zones`, `POST /v1/zones/{zone}/evacuation`)
//! and region failover (`GET /v1/federation/failovers`,
//! `POST /v1/federation/regions/{region}/failover`). Each control is checked against the
//! leader's assembler before it is committed, and audited whether granted or refused.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use waymark_core::model::{RegionName, ZoneName};
use waymark_registry::acl::Action;
use waymark_registry::machine::{AuditEntry, AuditKind};
use waymark_registry::pipeline::RegionPipeline;
use waymark_registry::state::{Command, EvacuationIntent, EvacuationRecord, RegionFailoverIntent};

use super::instances::AppliedBody;
use super::{ApiError, ApiResult, ApiState, Body, ok, parse_name};
use crate::authority::clock::now_ms;
use crate::authority::fields;
use crate::authority::principal::Caller;

impl ApiState {
    /// A routing control checked against the leader's assembler before it is committed:
    /// the refusal, if any (`409` with the assembler's reason, or `503` while the leader
    /// is still rebuilding).
    pub(super) async fn check_with_pipeline<E: std::fmt::Display>(
        &self,
        reason: &'static str,
        field: &'static str,
        check: impl FnOnce(&RegionPipeline) -> Result<(), E> + Send + 'static,
    ) -> Option<ApiError> {
        let checked = self
            .leader
            .ask(move |p, _| check(p).map_err(|e| e.to_string()))
            .await;
        match checked {
            Some(Ok(())) => None,
            Some(Err(e)) => Some(ApiError::new(
                StatusCode::CONFLICT,
                reason,
                Some(field),
                e.to_string(),
            )),
            None => Some(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                None,
                "the leader is still rebuilding; retry",
            )),
        }
    }
}

/// `GET /v1/zones`: the evacuations in force.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Zones {
    /// Per zone being evacuated or shifted back, its progress.
    evacuations: BTreeMap<ZoneName, EvacuationRecord>,
}

pub(super) async fn zones(State(s): State<ApiState>) -> Response {
    let evacuations = s
        .raft
        .with_state(|state, _| state.registry().evacuations().clone());
    ok(&Zones { evacuations })
}

pub(super) async fn evacuation(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(zone): Path<String>,
    Body(body): Body,
) -> ApiResult<Response> {
    s.allow(
        &caller,
        Action::Evacuate,
        "POST /v1/zones/{zone}/evacuation",
        None,
    )?;
    s.leader_only(&uri)?;
    let zone: ZoneName = parse_name(&zone, "zone").map_err(|e| s.refuse(e))?;
    let actor = caller.actor();
    let intent: EvacuationIntent = s.body(&body)?;
    let checked = zone.clone();
    let refusal = s
        .check_with_pipeline("evacuation", "zone", move |p| {
            p.check_evacuation(&checked, intent)
        })
        .await;
    s.audit_write(AuditEntry {
        seq: 0,
        at_ms: now_ms(),
        kind: AuditKind::Policy,
        actor,
        service: None,
        instance: None,
        outcome: if refusal.is_some() { "refused" } else { "granted" }.into(),
        detail: json!({"zone": zone, "intent": intent, "reason": refusal.as_ref().map(|r| r.message.clone())}),
    })
    .await?;
    if let Some(e) = refusal {
        return Err(s.refuse(e));
    }
    let applied = s
        .command(&uri, Command::Evacuation { zone, intent })
        .await?;
    Ok(ok(&AppliedBody { applied }))
}

/// What an operator asks of a peer region's failover.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum FailoverAction {
    /// Move the peer region's share of tier-2 traffic away, in steps; its shift-back waits
    /// for completion.
    Failover,
    /// Bring it back, in steps.
    ShiftBack,
    /// Finish a shift-back holding at its last step.
    CompleteShiftBack,
}

/// `POST /v1/federation/regions/{region}/failover`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct FailoverBody {
    action: FailoverAction,
    /// Why; required, and audited.
    reason: String,
}

/// One region failover in force (`GET /v1/federation/failovers`, by peer region).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct RegionFailover {
    /// Share of the peer region's tier-2 traffic moved away, in thousandths.
    moved: u16,
    /// Moving traffic `out` (away from the peer) or `back`.
    direction: Direction,
    /// Started by an operator: its shift-back waits for completion.
    manual: bool,
    /// Holding at its last step for an operator's completion.
    awaiting_completion: bool,
    /// Who asked for the last accepted command.
    actor: String,
    /// Why they asked.
    reason: String,
}

/// Which way a failover moves traffic.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum Direction {
    /// Away from the peer region.
    Out,
    /// Back to it.
    Back,
}

/// An operator's region routing control: fail over away from a peer region (manual, so
/// its shift-back waits for completion), shift back, or complete. Checked against the
/// leader's assembler before commit; audited whether granted or refused.
pub(super) async fn region_failover(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(region): Path<String>,
    Body(body): Body,
) -> ApiResult<Response> {
    let what = "POST /v1/federation/regions/{region}/failover";
    s.allow(&caller, Action::Evacuate, what, None)?;
    s.leader_only(&uri)?;
    let region: RegionName = parse_name(&region, "region").map_err(|e| s.refuse(e))?;
    let actor = caller.actor();
    let FailoverBody { action, reason } = s.body(&body)?;
    s.fields(fields::text("reason", &reason, fields::REASON_LEN_MAX))?;
    let intent = match action {
        FailoverAction::Failover => RegionFailoverIntent::Failover { manual: true },
        FailoverAction::ShiftBack => RegionFailoverIntent::ShiftBack,
        FailoverAction::CompleteShiftBack => RegionFailoverIntent::CompleteShiftBack,
    };
    let refusal = if reason.trim().is_empty() {
        Some(ApiError::new(
            StatusCode::BAD_REQUEST,
            "no_reason",
            Some("reason"),
            "a region failover needs a reason",
        ))
    } else {
        let checked = region.clone();
        s.check_with_pipeline("region_failover", "region", move |p| {
            p.check_region_failover(&checked, intent)
        })
        .await
    };
    s.audit_write(AuditEntry {
        seq: 0,
        at_ms: now_ms(),
        kind: AuditKind::Policy,
        actor: actor.clone(),
        service: None,
        instance: None,
        outcome: if refusal.is_some() { "refused" } else { "granted" }.into(),
        detail: json!({"peer_region": region, "intent": intent, "reason": reason, "error": refusal.as_ref().map(|r| r.message.clone())}),
    })
    .await?;
    if let Some(e) = refusal {
        return Err(s.refuse(e));
    }
    let applied = s
        .command(
            &uri,
            Command::RegionFailover {
                region,
                intent,
                actor,
                reason,
            },
        )
        .await?;
    Ok(ok(&AppliedBody { applied }))
}

/// Region failovers in force, as the log last recorded them (any member answers).
pub(super) async fn region_failovers(State(s): State<ApiState>) -> Response {
    let failovers = s
        .raft
        .with_state(|state, _| state.registry().region_failovers().clone());
    let out: BTreeMap<RegionName, RegionFailover> = failovers
        .into_iter()
        .map(|(region, r)| {
            let failover = RegionFailover {
                moved: r.moved.get(),
                direction: if r.back {
                    Direction::Back
                } else {
                    Direction::Out
                },
                manual: r.manual,
                awaiting_completion: r.awaiting_completion,
                actor: r.actor,
                reason: r.reason,
            };
            (region, failover)
        })
        .collect();
    ok(&out)
}
