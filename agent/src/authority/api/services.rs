//! Services, their health contracts and policies: `GET /v1/services`,
//! `GET|PUT|DELETE /v1/services/{service}`, `GET /v1/services/{service}/view`,
//! `GET|PUT /v1/services/{service}/policy` and `POST /v1/contracts/validate`. Writes need
//! `own:<service>`; a policy change is audited whether applied or refused. The three reads
//! of services and views are blocking queries ([`super::blocking`]); the list is paged and
//! the view filtered ([`super::query`]).

use std::collections::BTreeMap;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use waymark_core::contract::HealthContract;
use waymark_core::eligibility::EvidenceMode;
use waymark_core::model::{RegionName, ServiceName};
use waymark_registry::acl::Action;
use waymark_registry::machine::{AuditEntry, AuditKind, AuthorityState};
use waymark_registry::state::{Command, ServicePolicyRecord};

use super::blocking::{self, Reads};
use super::params::{QueryParams, ServiceParams, ServicesParams, ViewParams};
use super::query::{self, Filter, Walk};
use super::{ApiError, ApiResult, ApiState, Body, ok, parse_name};
use crate::authority::clock::now_ms;
use crate::authority::fields;
use crate::authority::principal::Caller;
use crate::listener::RequestDeadline;

/// One service's line in `GET /v1/services`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct ServiceSummary {
    service: ServiceName,
    /// The team told about quarantines.
    owner: String,
    /// Instances in the registry.
    instances: usize,
    /// This region's routed endpoints per verdict, and `withdrawn`: registered instances
    /// in no view.
    verdicts: BTreeMap<String, usize>,
    /// What the routed instances' verdicts rest on (ADR-04): the mode most of them are in
    /// (ties go to the weaker), `None` while no routed endpoint states it.
    evidence_mode: Option<EvidenceMode>,
    /// Routed instances per evidence mode.
    evidence: BTreeMap<EvidenceMode, usize>,
    /// Zones whose fraction guard is engaged (their full set is published).
    health_disregarded: Vec<String>,
    /// No instance of the service is eligible anywhere in the region.
    no_eligible_in_region: bool,
    /// The newest published view's version.
    version: Option<String>,
}

/// `GET /v1/services/{service}`: a service's owner and health contract.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct ServiceBody {
    service: ServiceName,
    /// The team told about quarantines.
    owner: String,
    contract: HealthContract,
}

/// What a write to a service names: the service written.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct ServiceWritten {
    service: ServiceName,
}

/// `POST /v1/contracts/validate`'s answer to a valid contract (an invalid one is refused).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Validity {
    /// Always `true`: a contract that does not validate is refused `422 contract`.
    valid: bool,
}

/// `GET /v1/services`: blocking, and paged by service name.
pub(super) async fn services(
    State(s): State<ApiState>,
    uri: Uri,
    deadline: Option<Extension<RequestDeadline>>,
) -> ApiResult<Response> {
    let walk = Walk::Services;
    let q = s.list_query(&uri, ServicesParams::NAMES, Some(walk))?;
    let index = blocking::wait(&s.indices, Reads::Services, q.blocking, deadline.as_deref()).await;
    let (list, next) = s.raft.with_state(|state, _| {
        let services = state
            .registry()
            .services()
            .map(|(name, record)| (name.as_str(), (name, record)));
        let (page, next) = query::paginate(services, q.page.as_ref(), walk);
        let list: Vec<ServiceSummary> = page
            .into_iter()
            .map(|(name, record)| summary(state, &s.region, name, &record.owner))
            .collect();
        (list, next)
    });
    let response = blocking::with_index(axum::Json(list).into_response(), index);
    Ok(query::with_next(response, next))
}

/// One service's line in `GET /v1/services`.
fn summary(
    state: &AuthorityState,
    region: &RegionName,
    name: &ServiceName,
    owner: &str,
) -> ServiceSummary {
    let instances = state
        .registry()
        .instances()
        .filter(|i| &i.instance.service == name)
        .count();
    let views: Vec<_> = state
        .published()
        .iter()
        .filter(|(k, _)| &k.service == name)
        .map(|(_, v)| v)
        .collect();
    let mut verdicts: BTreeMap<String, usize> = BTreeMap::new();
    let mut evidence: BTreeMap<EvidenceMode, usize> = BTreeMap::new();
    if let Some(v) = views.first() {
        for e in v.view.endpoints.values() {
            if &e.region == region {
                *verdicts.entry(e.verdict.as_str().to_owned()).or_default() += 1;
                if let Some(c) = e.capability {
                    *evidence.entry(c.evidence).or_default() += 1;
                }
            }
        }
    }
    let routed: usize = verdicts.values().sum();
    if instances > routed {
        verdicts.insert("withdrawn".into(), instances - routed);
    }
    let mut disregarded: Vec<String> = views
        .iter()
        .flat_map(|v| {
            v.view
                .markers
                .health_disregarded
                .iter()
                .map(ToString::to_string)
        })
        .collect();
    disregarded.sort();
    disregarded.dedup();
    ServiceSummary {
        service: name.clone(),
        owner: owner.to_owned(),
        instances,
        verdicts,
        evidence_mode: headline(&evidence),
        evidence,
        health_disregarded: disregarded,
        no_eligible_in_region: views.iter().any(|v| v.view.markers.no_eligible_in_region),
        version: views.iter().map(|v| v.version).max().map(|v| v.to_string()),
    }
}

/// The mode most routed instances are in; a tie goes to the weaker mode, so a service is
/// never reported as better evidenced than half of it is.
fn headline(counts: &BTreeMap<EvidenceMode, usize>) -> Option<EvidenceMode> {
    // `EvidenceMode` orders strongest first, so the last maximum is the weakest of a tie.
    counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .max_by_key(|(_, n)| **n)
        .map(|(m, _)| *m)
}

/// `GET /v1/services/{service}`: blocking.
pub(super) async fn get_service(
    State(s): State<ApiState>,
    uri: Uri,
    deadline: Option<Extension<RequestDeadline>>,
    Path(service): Path<String>,
) -> ApiResult<Response> {
    let name: ServiceName = parse_name(&service, "service")?;
    let q = s.list_query(&uri, ServiceParams::NAMES, None)?;
    let index = blocking::wait(&s.indices, Reads::Service, q.blocking, deadline.as_deref()).await;
    let response = s.raft.with_state(|state, _| -> ApiResult<Response> {
        let record = state.registry().service(&name).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_service",
                Some("service"),
                format!("service {name} is not registered"),
            )
        })?;
        Ok(ok(&ServiceBody {
            service: name.clone(),
            owner: record.owner.clone(),
            contract: record.contract.clone(),
        }))
    })?;
    Ok(blocking::with_index(response, index))
}

/// `PUT /v1/services/{service}`: a service's owner and health contract.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PutService {
    /// The team to tell about quarantines; required, not blank.
    owner: String,
    contract: HealthContract,
}

pub(super) async fn put_service(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(service): Path<String>,
    Body(body): Body,
) -> ApiResult<Response> {
    let service: ServiceName = parse_name(&service, "service").map_err(|e| s.refuse(e))?;
    let what = "PUT /v1/services";
    s.allow(
        &caller,
        Action::WriteService { service: &service },
        what,
        Some(&service),
    )?;
    s.leader_only(&uri)?;
    let put: PutService = s.body(&body)?;
    s.fields(fields::text("owner", &put.owner, fields::OWNER_LEN_MAX))?;
    if put.owner.trim().is_empty() {
        return Err(s.refuse(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "missing_owner",
            Some("owner"),
            "owner: a team to tell about quarantines is required",
        )));
    }
    s.command(
        &uri,
        Command::PutService {
            service: service.clone(),
            owner: put.owner,
            contract: put.contract,
        },
    )
    .await?;
    Ok(ok(&ServiceWritten { service }))
}

pub(super) async fn remove_service(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(service): Path<String>,
) -> ApiResult<Response> {
    let service: ServiceName = parse_name(&service, "service").map_err(|e| s.refuse(e))?;
    let what = "DELETE /v1/services";
    s.allow(
        &caller,
        Action::WriteService { service: &service },
        what,
        Some(&service),
    )?;
    s.leader_only(&uri)?;
    s.command(&uri, Command::RemoveService { service }).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1/services/{service}/view`: blocking; the filters keep the endpoints they match
/// (each view keeps its version and markers, which describe the whole view).
pub(super) async fn service_view(
    State(s): State<ApiState>,
    uri: Uri,
    deadline: Option<Extension<RequestDeadline>>,
    Path(service): Path<String>,
) -> ApiResult<Response> {
    let name: ServiceName = parse_name(&service, "service")?;
    let q = s.list_query(&uri, ViewParams::NAMES, None)?;
    let reads = Reads::Views(&name);
    let index = blocking::wait(&s.indices, reads, q.blocking, deadline.as_deref()).await;
    let views: Vec<_> = s.raft.with_state(|state, _| {
        state
            .published()
            .iter()
            .filter(|(k, _)| k.service == name)
            .map(|(_, v)| {
                let mut v = v.clone();
                if q.filter != Filter::default() {
                    v.view.endpoints = v
                        .view
                        .endpoints
                        .iter()
                        .filter(|(_, e)| q.filter.matches_endpoint(e))
                        .map(|(id, e)| (id.clone(), e.clone()))
                        .collect();
                }
                v
            })
            .collect()
    });
    Ok(blocking::with_index(
        axum::Json(views).into_response(),
        index,
    ))
}

pub(super) async fn get_policy(
    State(s): State<ApiState>,
    Path(service): Path<String>,
) -> ApiResult<Response> {
    let name: ServiceName = parse_name(&service, "service")?;
    s.raft.with_state(|state, _| {
        if state.registry().service(&name).is_none() {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_service",
                Some("service"),
                format!("service {name} is not registered"),
            ));
        }
        let policy = state.registry().policy(&name).cloned().unwrap_or_default();
        Ok(axum::Json(policy).into_response())
    })
}

pub(super) async fn put_policy(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(service): Path<String>,
    Body(body): Body,
) -> ApiResult<Response> {
    let service: ServiceName = parse_name(&service, "service").map_err(|e| s.refuse(e))?;
    let what = "PUT /v1/services/{service}/policy";
    s.allow(
        &caller,
        Action::WriteService { service: &service },
        what,
        Some(&service),
    )?;
    s.leader_only(&uri)?;
    let actor = caller.actor();
    let policy: ServicePolicyRecord = s.body(&body)?;
    s.fields(fields::policy(&policy))?;
    let detail = serde_json::to_value(&policy).unwrap_or(Value::Null);
    let result = s
        .command(
            &uri,
            Command::SetPolicy {
                service: service.clone(),
                policy,
            },
        )
        .await;
    s.audit_write(AuditEntry {
        seq: 0,
        at_ms: now_ms(),
        kind: AuditKind::Policy,
        actor,
        service: Some(service.clone()),
        instance: None,
        outcome: if result.is_ok() { "applied" } else { "refused" }.into(),
        detail,
    })
    .await?;
    result?;
    Ok(ok(&ServiceWritten { service }))
}

/// `POST /v1/contracts/validate`: a contract to check without storing it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ValidateBody {
    contract: HealthContract,
}

pub(super) async fn validate_contract(
    State(s): State<ApiState>,
    Body(body): Body,
) -> ApiResult<Response> {
    let v: ValidateBody = s.body(&body)?;
    match v.contract.validate() {
        Ok(_) => Ok(ok(&Validity { valid: true })),
        Err(e) => Err(s.refuse(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "contract",
            Some(&format!("contract.{}", e.field())),
            e.to_string(),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headline_mode_is_the_majoritys_and_a_tie_goes_to_the_weaker() {
        use EvidenceMode::*;
        let counts = |c: &[(EvidenceMode, usize)]| c.iter().copied().collect();
        assert_eq!(headline(&counts(&[])), None);
        assert_eq!(
            headline(&counts(&[(PassivePrimary, 5), (SingleClass, 1)])),
            Some(PassivePrimary)
        );
        assert_eq!(
            headline(&counts(&[(PassivePrimary, 2), (ProbePrimary, 2)])),
            Some(ProbePrimary)
        );
        assert_eq!(
            headline(&counts(&[(PassivePrimary, 0), (SingleClass, 0)])),
            None
        );
    }
}
