//! Overrides: taking instances out of rotation by hand (`POST /v1/overrides`), one instance
//! or every instance of a node, and the break-glass approval of one the disruption budget
//! refused (`POST /v1/overrides/{seq}/approve`).
//!
//! An override is a denial of service with a badge (ADR-15), so each one is, in order:
//! well formed and justified; authorised for every service it touches; within the actor's
//! rate per service; and, when it takes instances out, within the disruption budget
//! ([`waymark_registry::budget`]): no zone of a service below its floor, no more than the
//! service's budget of manual withdrawals at once. Every attempt past authorisation is
//! audited, granted or refused. A budget refusal is recorded as awaiting approval and
//! answered `409 disruption_budget` with its audit sequence number; a *different*
//! principal authorised for the same services may approve that request within
//! [`BREAK_GLASS_WINDOW`], once, which applies it and is audited naming both.

use std::collections::BTreeSet;
use std::sync::PoisonError;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use waymark_core::model::{InstanceId, NodeName, ServiceName};
use waymark_registry::acl::Action;
use waymark_registry::budget::{
    self, BREAK_GLASS_WINDOW, OUTCOME_APPROVED, OUTCOME_AWAITING_APPROVAL,
};
use waymark_registry::machine::{AuditEntry, AuditKind, Request, Response as Committed};
use waymark_registry::overrides::{OVERRIDE_WINDOW, OVERRIDES_PER_WINDOW, overrides_granted};
use waymark_registry::state::Command;

use super::{ApiError, ApiResult, ApiState, Body, RefusalBody, ok, reply};
use crate::authority::clock::now_ms;
use crate::authority::fields;
use crate::authority::metrics::OutcomeLabels;
use crate::authority::principal::Caller;

/// `POST /v1/overrides`: take one instance, or every instance of a node, out of rotation
/// by hand, or put it back. Name exactly one of `instance` and `node`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct OverrideBody {
    /// One instance; or
    #[serde(default)]
    instance: Option<InstanceId>,
    /// every instance of one node (node maintenance).
    #[serde(default)]
    node: Option<NodeName>,
    /// `maintenance_on` (take it out of rotation by hand) or `maintenance_off`.
    #[schemars(extend("enum" = ["maintenance_on", "maintenance_off"]))]
    action: String,
    /// Why; required, and audited.
    justification: Option<String>,
}

/// What an override did: how many instances changed.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct OverrideApplied {
    /// Instances put in or taken out of maintenance.
    applied: usize,
}

/// What an approval did: how many instances changed, and the request it approved.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct ApprovalApplied {
    /// Instances put in maintenance.
    applied: usize,
    /// The audit sequence number of the request approved.
    approved: u64,
}

/// `409 disruption_budget`: the refusal, the budget it would break, and how a second
/// principal approves it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct BudgetRefused {
    error: RefusalBody,
    /// `zone_floor` or `manual_withdrawals`.
    budget: String,
    approval: Approval,
}

/// How to approve an override the budget refused.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Approval {
    /// The refused request's audit sequence number.
    seq: u64,
    /// The route that approves it.
    approve: String,
    /// How long it may be approved, in seconds.
    window_s: u64,
    /// Who may approve it.
    by: String,
}

impl OverrideBody {
    fn taking_out(&self) -> bool {
        self.action == "maintenance_on"
    }
}

/// What an override acts on: the instances (with their services) it names now.
#[derive(Debug)]
struct Targets {
    instances: Vec<InstanceId>,
    services: BTreeSet<ServiceName>,
}

/// Take instances out of rotation by hand, or put them back. See the module docs.
pub(super) async fn override_instance(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    s.leader_only(&uri)?;
    let o: OverrideBody = s.body(&body)?;
    // Anonymous requests never got here, and malformed ones are refused before the audit
    // log is written: it is replicated to every member, and nobody may grow it by asking.
    let actor = caller.actor();
    s.override_is_well_formed(&o)?;
    let targets = s.targets_of(&o)?;
    for svc in &targets.services {
        s.allow(
            &caller,
            Action::Override { service: svc },
            "POST /v1/overrides",
            Some(svc),
        )?;
    }
    // A named operator's attempt on live instances is audited whether granted or not.
    if let Some(refusal) = s.override_refusal(&o, &actor, &targets.services) {
        s.audit_override(
            &o,
            &actor,
            &targets,
            "refused",
            json!({"reason": refusal.reason}),
        )
        .await?;
        return Err(s.refuse(refusal));
    }
    if o.taking_out() {
        let verdict = s
            .raft
            .with_state(|st, _| budget::check(st, &s.region, &targets.instances));
        if let Err(over) = verdict {
            let detail = json!({"budget": over.budget(), "reason": over.to_string()});
            let seq = s
                .audit_override(&o, &actor, &targets, OUTCOME_AWAITING_APPROVAL, detail)
                .await?;
            // Counted and logged like every refusal; answered with how to approve it.
            s.refuse(ApiError::new(
                StatusCode::CONFLICT,
                "disruption_budget",
                None,
                over.to_string(),
            ));
            return Ok(budget_refusal(seq, &over));
        }
    }
    s.audit_override(&o, &actor, &targets, "granted", Value::Null)
        .await?;
    let reason = o
        .taking_out()
        .then(|| format!("{} by {actor}", o.justification.unwrap_or_default()));
    let applied = s
        .apply_maintenance(&uri, &targets.instances, reason)
        .await?;
    Ok(ok(&OverrideApplied { applied }))
}

/// `409 disruption_budget`, naming the budget and how a second principal approves it.
fn budget_refusal(seq: u64, over: &budget::BudgetRefusal) -> Response {
    let body = BudgetRefused {
        error: RefusalBody {
            reason: "disruption_budget".into(),
            field: None,
            message: over.to_string(),
        },
        budget: over.budget().into(),
        approval: Approval {
            seq,
            approve: format!("POST /v1/overrides/{seq}/approve"),
            window_s: BREAK_GLASS_WINDOW.as_secs(),
            by: "a different principal authorised to override these services".into(),
        },
    };
    reply(StatusCode::CONFLICT, &body)
}

/// `POST /v1/overrides/{seq}/approve`: a second principal's approval.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ApproveBody {
    /// Why; required, and audited naming both principals.
    justification: Option<String>,
}

/// Break-glass: a second principal approves an override the budget refused.
pub(super) async fn approve_override(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(seq): Path<u64>,
    Body(body): Body,
) -> ApiResult<Response> {
    s.leader_only(&uri)?;
    let a: ApproveBody = s.body(&body)?;
    let justification = a.justification.unwrap_or_default();
    s.fields(fields::text(
        "justification",
        &justification,
        fields::OVERRIDE_JUSTIFICATION_LEN_MAX,
    ))?;
    if justification.trim().is_empty() {
        return Err(s.refuse(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "no_justification",
            Some("justification"),
            "an approval needs a justification",
        )));
    }
    let actor = caller.actor();
    let request = s.raft.with_state(|st, _| {
        budget::approvable(st, seq, &actor, now_ms()).map(|e| (e.actor.clone(), e.detail.clone()))
    });
    let (requested_by, detail) = match request {
        Ok(found) => found,
        Err(e) => {
            // Whether an audit number awaits approval, and by whom, is in the audit log:
            // for principals who may read it, as `/v1/audit` is.
            s.allow(
                &caller,
                Action::Read,
                "POST /v1/overrides/{seq}/approve",
                None,
            )?;
            let status = match e {
                budget::ApprovalRefusal::NotAwaiting { .. } => StatusCode::NOT_FOUND,
                _ => StatusCode::CONFLICT,
            };
            return Err(s.refuse(ApiError::new(status, e.reason(), None, e.to_string())));
        }
    };
    let instances: Vec<InstanceId> = detail
        .get("instances")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    // The approver must hold the same authority the request needed, on what is live now.
    let services: BTreeSet<ServiceName> = s.raft.with_state(|st, _| {
        instances
            .iter()
            .filter_map(|id| st.registry().instance(id))
            .map(|r| r.instance.service.clone())
            .collect()
    });
    for svc in &services {
        s.allow(
            &caller,
            Action::Override { service: svc },
            "POST /v1/overrides/{seq}/approve",
            Some(svc),
        )?;
    }
    if let Some(refusal) = s.rate_refusal(&actor, &services) {
        return Err(s.refuse(refusal));
    }
    let live: Vec<InstanceId> = s.raft.with_state(|st, _| {
        instances
            .into_iter()
            .filter(|id| st.registry().instance(id).is_some())
            .collect()
    });
    let targets = Targets {
        instances: live,
        services,
    };
    let record = json!({
        "approves": seq,
        "requested_by": requested_by,
        "approval_justification": justification,
    });
    let o = OverrideBody {
        instance: None,
        node: detail
            .get("node")
            .cloned()
            .and_then(|v| serde_json::from_value(v).ok()),
        action: "maintenance_on".into(),
        justification: detail
            .get("justification")
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    s.audit_override(&o, &actor, &targets, OUTCOME_APPROVED, record)
        .await?;
    let reason = Some(format!(
        "{} by {requested_by}, approved by {actor}: {justification}",
        o.justification.unwrap_or_default()
    ));
    let applied = s
        .apply_maintenance(&uri, &targets.instances, reason)
        .await?;
    Ok(ok(&ApprovalApplied {
        applied,
        approved: seq,
    }))
}

impl ApiState {
    /// An override's justification within its ceiling, a known action, exactly one of
    /// `instance` and `node`; refused before anything is audited.
    fn override_is_well_formed(&self, o: &OverrideBody) -> ApiResult<()> {
        if let Some(j) = &o.justification {
            self.fields(fields::text(
                "justification",
                j,
                fields::OVERRIDE_JUSTIFICATION_LEN_MAX,
            ))?;
        }
        if !matches!(o.action.as_str(), "maintenance_on" | "maintenance_off") {
            return Err(self.refuse(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "bad_action",
                Some("action"),
                "action: maintenance_on or maintenance_off",
            )));
        }
        if o.instance.is_some() == o.node.is_some() {
            return Err(self.refuse(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "bad_target",
                Some("instance"),
                "name exactly one of instance (one instance) or node (every instance on it)",
            )));
        }
        Ok(())
    }

    /// The live instances an override names; `404` when there are none.
    fn targets_of(&self, o: &OverrideBody) -> ApiResult<Targets> {
        let found: Vec<(InstanceId, ServiceName)> = self.raft.with_state(|st, _| {
            let registry = st.registry();
            match (&o.instance, &o.node) {
                (Some(id), _) => registry
                    .instance(id)
                    .map(|r| (id.clone(), r.instance.service.clone()))
                    .into_iter()
                    .collect(),
                (None, Some(node)) => registry
                    .instances()
                    .filter(|r| &r.instance.locality.node == node)
                    .map(|r| (r.instance.id.clone(), r.instance.service.clone()))
                    .collect(),
                (None, None) => Vec::new(),
            }
        });
        if found.is_empty() {
            let (field, what) = match (&o.instance, &o.node) {
                (Some(id), _) => ("instance", format!("no live instance {id}")),
                (None, Some(node)) => ("node", format!("no live instance on node {node}")),
                (None, None) => ("instance", "nothing named".to_owned()),
            };
            return Err(self.refuse(ApiError::new(
                StatusCode::NOT_FOUND,
                if field == "node" {
                    "unknown_node"
                } else {
                    "unknown_instance"
                },
                Some(field),
                what,
            )));
        }
        Ok(Targets {
            services: found.iter().map(|(_, s)| s.clone()).collect(),
            instances: found.into_iter().map(|(i, _)| i).collect(),
        })
    }

    /// Why an authorised override is refused before the budget is asked, if it is: no
    /// justification, or the actor's rate on one of its services spent. A grant is
    /// counted in the local limiter.
    fn override_refusal(
        &self,
        o: &OverrideBody,
        actor: &str,
        services: &BTreeSet<ServiceName>,
    ) -> Option<ApiError> {
        if o.justification
            .as_deref()
            .map(str::trim)
            .is_none_or(str::is_empty)
        {
            return Some(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "no_justification",
                Some("justification"),
                "an override needs a justification",
            ));
        }
        self.rate_refusal(actor, services)
    }

    /// The actor's override rate on one of `services` spent, if it is. An approval counts
    /// as an override of its approver.
    fn rate_refusal(&self, actor: &str, services: &BTreeSet<ServiceName>) -> Option<ApiError> {
        // The replicated audit log remembers what earlier leaders granted, so a leader
        // change does not reset anyone's budget; the local limiter covers requests still
        // in flight here.
        for svc in services {
            let granted = self
                .raft
                .with_state(|state, _| overrides_granted(state.audit(), actor, svc, now_ms()));
            let ok = granted < OVERRIDES_PER_WINDOW
                && self
                    .overrides
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .try_acquire(actor, svc.as_str(), tokio::time::Instant::now().into_std());
            if !ok {
                return Some(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    None,
                    format!(
                        "at most {OVERRIDES_PER_WINDOW} overrides per {} min per actor per service",
                        OVERRIDE_WINDOW.as_secs() / 60
                    ),
                ));
            }
        }
        None
    }

    /// Count and audit an override attempt with its outcome, one record per service it
    /// touches; returns the last record's sequence number.
    async fn audit_override(
        &self,
        o: &OverrideBody,
        actor: &str,
        targets: &Targets,
        outcome: &str,
        extra: Value,
    ) -> ApiResult<u64> {
        let counted = if outcome == "granted" || outcome == OUTCOME_APPROVED {
            "granted"
        } else {
            "refused"
        };
        self.metrics
            .overrides
            .get_or_create(&OutcomeLabels {
                outcome: counted.into(),
            })
            .inc();
        let single = (targets.instances.len() == 1).then(|| targets.instances[0].clone());
        let mut detail = json!({
            "action": o.action,
            "justification": o.justification,
            "node": o.node,
            "instances": targets.instances,
        });
        if let (Some(d), Value::Object(more)) = (detail.as_object_mut(), extra) {
            d.extend(more);
        }
        let entries: Vec<AuditEntry> = targets
            .services
            .iter()
            .map(|svc| AuditEntry {
                seq: 0,
                at_ms: now_ms(),
                kind: AuditKind::Override,
                actor: actor.to_owned(),
                service: Some(svc.clone()),
                instance: single.clone(),
                outcome: outcome.into(),
                detail: detail.clone(),
            })
            .collect();
        match self.raft.write(Request::Audit { entries }).await {
            Ok(Committed::Audited { last_seq }) => Ok(last_seq),
            Ok(other) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "unexpected_response",
                None,
                format!("{other:?}"),
            )),
            Err(e) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_committed",
                None,
                format!("the audit record was not committed: {e}; retry"),
            )),
        }
    }

    /// Put `instances` in maintenance (`reason`) or take them out (`None`), one command
    /// each; how many changed.
    async fn apply_maintenance(
        &self,
        uri: &Uri,
        instances: &[InstanceId],
        reason: Option<String>,
    ) -> ApiResult<usize> {
        let mut applied = 0;
        for id in instances {
            self.command(
                uri,
                Command::Maintenance {
                    instance: id.clone(),
                    reason: reason.clone(),
                },
            )
            .await?;
            applied += 1;
        }
        Ok(applied)
    }
}
