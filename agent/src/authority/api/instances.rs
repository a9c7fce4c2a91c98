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
use serde_json::{Value, json};
use waymark_core::model::{Instance, InstanceId, RegionName};
use waymark_core::view::ViewEndpoint;
use waymark_registry::acl::Action;
use waymark_registry::machine::{AuthorityState, Refusal};
use waymark_registry::state::{Applied, Command, Registration};

use super::blocking::{self, Reads};
use super::query::{self, Walk};
use super::{ApiError, ApiResult, ApiState, Body, parse_name};
use crate::authority::fields;
use crate::authority::leader::RenewError;
use crate::authority::principal::Caller;
use crate::listener::RequestDeadline;

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
        } => Ok((
            StatusCode::CREATED,
            axum::Json(json!({"instance": instance, "expires_at_ms": expires_at_ms})),
        )
            .into_response()),
        other => Ok(axum::Json(json!({"applied": other})).into_response()),
    }
}

/// The parameters of `GET /v1/instances`.
const INSTANCES_PARAMS: &[&str] = &[
    "index",
    "wait",
    "service",
    "tag",
    "zone",
    "verdict",
    "capability",
    "passing",
    "limit",
    "cursor",
];

/// `GET /v1/instances`: blocking, filtered, and paged by instance id. A filter on verdicts
/// or capabilities reads this region's views (an instance in none is `withdrawn`), and the
/// route's index then follows the views too.
pub(super) async fn instances(
    State(s): State<ApiState>,
    uri: Uri,
    deadline: Option<Extension<RequestDeadline>>,
) -> ApiResult<Response> {
    let walk = Walk::Instances;
    let q = s.list_query(&uri, INSTANCES_PARAMS, Some(walk))?;
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
        let list: Vec<Value> = page
            .into_iter()
            .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
            .collect();
        (list, next)
    });
    let response = blocking::with_index(axum::Json(list).into_response(), index);
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
            Ok(axum::Json(json!({"applied": applied})).into_response())
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
    Ok((StatusCode::CREATED, axum::Json(json!({"instance": id}))).into_response())
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
    let classes: Vec<Value> = e
        .classes
        .iter()
        .map(|c| {
            json!({
                "class": c.class, "provided": c.provided, "score": c.score.get(), "silent": c.silent,
                "age_ms": c.age.map(|a| a.as_millis() as u64),
                "reporter": c.reporter.as_ref().map(ToString::to_string), "last": c.last,
            })
        })
        .collect();
    let history: Vec<Value> = e
        .history
        .iter()
        .map(|t| {
            json!({
                "ago_ms": now.saturating_duration_since(t.at).as_millis() as u64,
                "from": t.from.map(|v| v.as_str()), "to": t.to.as_str(), "rule": t.rule,
            })
        })
        .collect();
    Ok(axum::Json(json!({
        "instance": e.instance,
        "service": e.service,
        "verdict": e.eligibility.verdict().as_str(),
        "eligibility": e.eligibility.record(now),
        "rule": e.rule,
        "evidence": e.mode,
        "capability": {
            "classes": e.classes.iter().filter(|c| c.provided).map(|c| c.class).collect::<Vec<_>>(),
            "verified": e.classes.iter().any(|c| c.provided && !c.silent),
        },
        "for_ms": e.for_duration.as_millis() as u64,
        "classes": classes,
        "dependencies": e.dependencies.iter().map(|(n, st, shared)| json!({"name": n, "status": st, "shared": shared})).collect::<Vec<_>>(),
        "flap_transitions": e.flap_transitions,
        "quarantine_level": e.quarantine_level,
        "history": history,
        "text": e.to_string(),
    }))
    .into_response())
}
