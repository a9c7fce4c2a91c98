//! Instances: registration (`POST /v1/instances`, `GET /v1/instances`), lease renewal
//! (`PUT /v1/instances/{id}/renew`), deregistration (`DELETE /v1/instances/{id}`),
//! external endpoints (`POST /v1/external`, `DELETE /v1/external/{id}`) and the
//! evaluator's explanation (`GET /v1/instances/{id}/explain`, answered by the leader).
//! Registration proves ownership (see `access`). Overrides are in `overrides`. The list is
//! a blocking query ([`super::blocking`]), filtered and paged ([`super::query`]).

use std::collections::BTreeMap;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use waymark_core::audit::Explanation as Explained;
use waymark_core::eligibility::{EligibilityRecord, EvidenceMode, Rule, Verdict};
use waymark_core::model::{
    DependencyStatus, EvidenceClass, Instance, InstanceId, RegionName, ServiceName,
};
use waymark_core::view::ViewEndpoint;
use waymark_registry::acl::Action;
use waymark_registry::machine::{AuthorityState, Refusal};
use waymark_registry::state::{Applied, Command, InstanceRecord, Registration};

use super::blocking::{self, Reads};
use super::params::{InstancesParams, QueryParams};
use super::query::{self, Walk};
use super::{ApiError, ApiResult, ApiState, Body, ok, parse_name, reply};
use crate::authority::fields;
use crate::authority::leader::RenewError;
use crate::authority::principal::Caller;
use crate::listener::RequestDeadline;

/// `201` to a registration: the id issued (never reused) and when its lease ends.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Registered {
    /// The instance's id, issued here.
    pub(super) instance: InstanceId,
    /// When the lease ends unless renewed (`PUT /v1/instances/{id}/renew`), Unix ms.
    pub(super) expires_at_ms: u64,
}

/// What a committed write did, as the registry applied it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct AppliedBody {
    pub(super) applied: Applied,
}

/// `201` to a declared external endpoint: its id, as declared.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Declared {
    pub(super) instance: InstanceId,
}

pub(super) async fn register(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    let mut registration: Registration = s.body(&body)?;
    s.fields(fields::registration(&registration))?;
    let what = "POST /v1/instances";
    let node = &registration.locality.node;
    s.allow(
        &caller,
        Action::Register { node },
        what,
        Some(&registration.service),
    )?;
    s.owns_registration(&caller, &registration, what)?;
    s.leader_only(&uri)?;
    if registration.lease_ms == 0 {
        registration.lease_ms = waymark_core::defaults::LEASE.as_millis() as u64;
    }
    match s.command(&uri, Command::Register(registration)).await? {
        Applied::Registered {
            instance,
            expires_at_ms,
        } => Ok(reply(
            StatusCode::CREATED,
            &Registered {
                instance,
                expires_at_ms,
            },
        )),
        other => Ok(ok(&AppliedBody { applied: other })),
    }
}

/// `GET /v1/instances`: blocking, filtered, and paged by instance id. A filter on verdicts
/// or capabilities reads this region's views (an instance in none is `withdrawn`), and the
/// route's index then follows the views too.
pub(super) async fn instances(
    State(s): State<ApiState>,
    uri: Uri,
    deadline: Option<Extension<RequestDeadline>>,
) -> ApiResult<Response> {
    let walk = Walk::Instances;
    let q = s.list_query(&uri, InstancesParams::NAMES, Some(walk))?;
    let reads = if q.filter.reads_views() {
        Reads::InstancesAndViews
    } else {
        Reads::Instances
    };
    let index = blocking::wait(&s.indices, reads, q.blocking, deadline.as_deref()).await;
    let (list, next) = s.raft.with_state(|state, _| {
        let endpoints = if q.filter.reads_views() {
            local_endpoints(state, &s.region)
        } else {
            BTreeMap::new()
        };
        let matching = state
            .registry()
            .instances()
            .filter(|r| {
                q.service
                    .as_ref()
                    .is_none_or(|svc| &r.instance.service == svc)
            })
            .filter(|r| {
                q.filter
                    .matches_instance(r, endpoints.get(&r.instance.id).copied())
            })
            .map(|r| (r.instance.id.as_str(), r));
        let (page, next) = query::paginate(matching, q.page.as_ref(), walk);
        let list: Vec<InstanceRecord> = page.into_iter().cloned().collect();
        (list, next)
    });
    let response = blocking::with_index(ok(&list), index);
    Ok(query::with_next(response, next))
}

/// Every endpoint of this region in the published views, by instance: each service's views
/// (one per caller zone) hold the same endpoints and verdicts, so the first seen stands.
pub(super) fn local_endpoints<'a>(
    state: &'a AuthorityState,
    region: &RegionName,
) -> BTreeMap<&'a InstanceId, &'a ViewEndpoint> {
    let mut endpoints = BTreeMap::new();
    for view in state.published().values() {
        for (id, e) in view.view.endpoints.iter() {
            if &e.region == region {
                endpoints.entry(id).or_insert(e);
            }
        }
    }
    endpoints
}

pub(super) async fn renew(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let instance: InstanceId = parse_name(&id, "instance").map_err(|e| s.refuse(e))?;
    s.owns_instance(&caller, &instance, "PUT /v1/instances/{id}/renew")?;
    s.leader_only(&uri)?;
    // The leader's term holds renewals in memory: no log entry (see `LeaderTerm::handle_renewals`).
    match s.leader.renew(instance).await {
        Ok(expires_at_ms) => {
            let applied = Applied::Renewed { expires_at_ms };
            Ok(ok(&AppliedBody { applied }))
        }
        Err(RenewError::Refused(error)) => Err(s.refuse(Refusal::from(&error).into())),
        Err(RenewError::NotLeader) => Err(s.redirect(&uri, None)),
        Err(e @ RenewError::Busy) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "renewals_busy",
            None,
            format!("{e}; retry"),
        )),
    }
}

pub(super) async fn deregister(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let instance: InstanceId = parse_name(&id, "instance").map_err(|e| s.refuse(e))?;
    s.owns_instance(&caller, &instance, "DELETE /v1/instances/{id}")?;
    s.leader_only(&uri)?;
    s.command(&uri, Command::Deregister { instance }).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn declare_external(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    let instance: Instance = s.body(&body)?;
    s.fields(fields::external(&instance))?;
    let what = "POST /v1/external";
    s.declares_externals(&caller, what)?;
    let node = &instance.locality.node;
    s.allow(
        &caller,
        Action::Register { node },
        what,
        Some(&instance.service),
    )?;
    s.leader_only(&uri)?;
    let id = instance.id.clone();
    s.command(&uri, Command::DeclareExternal { instance })
        .await?;
    Ok(reply(StatusCode::CREATED, &Declared { instance: id }))
}

pub(super) async fn remove_external(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let instance: InstanceId = parse_name(&id, "instance").map_err(|e| s.refuse(e))?;
    let what = "DELETE /v1/external/{id}";
    s.declares_externals(&caller, what)?;
    s.owns_instance(&caller, &instance, what)?;
    s.leader_only(&uri)?;
    s.command(&uri, Command::RemoveExternal { instance })
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn explain(
    State(s): State<ApiState>,
    uri: Uri,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    s.leader_only(&uri)?;
    let instance: InstanceId = parse_name(&id, "instance")?;
    let asked = instance.clone();
    let explanation = s
        .leader
        .ask(move |p, now| p.evaluator().explain(now, &asked).map(|e| (e, now)))
        .await
        .flatten();
    let Some((e, now)) = explanation else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_instance",
            Some("instance"),
            format!("the evaluator holds no instance {instance}"),
        ));
    };
    Ok(ok(&Explanation::new(&e, now)))
}

/// `GET /v1/instances/{id}/explain`: the evaluator's account of one instance's verdict.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Explanation {
    instance: InstanceId,
    service: ServiceName,
    /// The coarse verdict.
    verdict: Verdict,
    /// The verdict with the field that qualifies it.
    eligibility: EligibilityRecord,
    /// The rule of the decision path that produced it.
    rule: Rule,
    /// What the verdict rests on now (ADR-04).
    evidence: EvidenceMode,
    /// The classes the capability profile provides, and whether any speaks now.
    capability: ExplainedCapability,
    /// How long it has held this verdict, in ms.
    for_ms: u64,
    /// Evidence per class.
    classes: Vec<ExplainedClass>,
    /// Latest reported condition of each declared dependency.
    dependencies: Vec<ExplainedDependency>,
    /// Transitions in the current flap window.
    flap_transitions: usize,
    /// Quarantines served so far without a reset (the backoff level).
    quarantine_level: u32,
    /// Recent transitions, oldest first.
    history: Vec<ExplainedTransition>,
    /// All of the above, for people.
    text: String,
}

/// The classes an instance's profile provides, and whether any of them speaks now.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct ExplainedCapability {
    classes: Vec<EvidenceClass>,
    /// Some provided class has a sample within its interval.
    verified: bool,
}

/// One evidence class's state.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct ExplainedClass {
    class: EvidenceClass,
    /// Whether the capability profile provides it.
    provided: bool,
    /// The decaying failure score, in thousandths.
    score: u16,
    /// No sample within its silence interval.
    silent: bool,
    /// Time since its last sample, in ms.
    age_ms: Option<u64>,
    /// Who sent the last sample.
    reporter: Option<String>,
    /// A one-line summary of the last sample (check output truncated).
    last: Option<String>,
}

/// A declared dependency's latest reported condition.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct ExplainedDependency {
    name: String,
    status: DependencyStatus,
    /// Shared dependencies only ever reduce weight.
    shared: bool,
}

/// One change of verdict.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct ExplainedTransition {
    /// How long ago, in ms.
    ago_ms: u64,
    /// The verdict before; `null` for a new instance.
    from: Option<Verdict>,
    to: Verdict,
    /// The rule that fired.
    rule: Rule,
}

impl Explanation {
    fn new(e: &Explained, now: std::time::Instant) -> Self {
        let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self {
            instance: e.instance.clone(),
            service: e.service.clone(),
            verdict: e.eligibility.verdict(),
            eligibility: e.eligibility.record(now),
            rule: e.rule,
            evidence: e.mode,
            capability: ExplainedCapability {
                classes: e
                    .classes
                    .iter()
                    .filter(|c| c.provided)
                    .map(|c| c.class)
                    .collect(),
                verified: e.classes.iter().any(|c| c.provided && !c.silent),
            },
            for_ms: millis(e.for_duration),
            classes: e
                .classes
                .iter()
                .map(|c| ExplainedClass {
                    class: c.class,
                    provided: c.provided,
                    score: c.score.get(),
                    silent: c.silent,
                    age_ms: c.age.map(millis),
                    reporter: c.reporter.as_ref().map(ToString::to_string),
                    last: c.last.clone(),
                })
                .collect(),
            dependencies: e
                .dependencies
                .iter()
                .map(|(name, status, shared)| ExplainedDependency {
                    name: name.clone(),
                    status: *status,
                    shared: *shared,
                })
                .collect(),
            flap_transitions: e.flap_transitions,
            quarantine_level: e.quarantine_level,
            history: e
                .history
                .iter()
                .map(|t| ExplainedTransition {
                    ago_ms: millis(now.saturating_duration_since(t.at)),
                    from: t.from,
                    to: t.to,
                    rule: t.rule,
                })
                .collect(),
            text: e.to_string(),
        }
    }
}
