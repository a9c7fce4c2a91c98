//! The query and policy API (HTTP + JSON), described by the OpenAPI document it serves at
//! `/v1/openapi.json`.
//!
//! Every member answers reads from its replicated state. Writes and `explain` (which needs
//! the leader's evaluator) are answered by the leader; a follower replies
//! `307 Temporary Redirect` to the leader's same path, which clients follow with the same
//! method and body. Every refusal is a JSON body `{"error": {"reason", "field", "message"}}`
//! with a fitting status, a metric, and — for denials — an audit record; it changes nothing.
//!
//! Authentication and authorisation (ADR-15): every route but `/livez` and `/readyz` needs
//! a verified principal — the identity of a client certificate the listener verified
//! (its `PeerInfo`), or a bearer token (`Authorization: Bearer wmt.<name>.<secret>`) checked
//! against the replicated tokens. Without one: `401 unauthenticated`, counted and logged,
//! never audited. Reads need the `read` grant; each write names the capability it needs
//! (`own:<service>`, `register:<node>`, `override:<service>`, `evacuate`, `raft`, `acl`).
//! Without it: `403 forbidden` naming the capability, counted, logged, and audited folded
//! per principal ([`super::principal::Denials`]). The actor recorded everywhere is the
//! verified principal. Registration also proves ownership: a node agent registers only on
//! its own node, in this region, at the address its connection comes from; a workload
//! only itself. Grants and tokens are managed under `/v1/acl/`.
//!
//! Bounds: every route has an explicit body limit (`413 body_too_large` beyond it, before
//! the body is parsed); free text and counts that would reach Raft or the audit log are
//! checked against [`super::fields`] (`422 too_long`/`too_many` naming the field) before
//! anything is proposed or audited. Requests refused as anonymous or malformed are counted
//! and logged, never written to the log. Check output (probe response text) appears in
//! `explain` only; the audit read path redacts it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request as HttpRequest, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Router};
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use waymark_core::contract::HealthContract;
use waymark_core::model::{Instance, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_federation_quic::FederationNode;
use waymark_registry::state::{
    Applied, Command, EvacuationIntent, RegionFailoverIntent, Registration, ServicePolicyRecord,
    Stamped,
};
use waymark_xds::server::XdsServer;

use super::clock::now_ms;
use super::fields;
use super::leader::LeaderHandle;
use super::metrics::{AuthorityMetrics, OutcomeLabels, ReasonLabels};
use super::principal::{Caller, Credential, Denials, principal_of};
use super::raft::{RaftNode, WriteError};
use super::regions::{self, RegionsHandle};
use crate::node::probe::TARGET_TEXT_MARKER;
use waymark_certs::grpc::PeerInfo;
use waymark_registry::acl::{
    AclApplied, AclCommand, Action, Capability, Grant, Grantee, Principal, TokenRecord,
};
use waymark_registry::machine::{
    AuditEntry, AuditKind, Refusal, Request, Response as RaftResponse,
};
use waymark_registry::pipeline::RegionPipeline;

/// Overrides one actor may make on one service per window.
pub const OVERRIDES_PER_WINDOW: usize = 5;
/// The override rate window.
pub const OVERRIDE_WINDOW: Duration = Duration::from_secs(600);
/// Audit records returned by one request at most.
pub const AUDIT_PAGE_MAX: usize = 10_000;
/// How long authorisation refusals fold before they are written to the audit log.
pub const DENIAL_FLUSH_EVERY: Duration = Duration::from_secs(2);
/// The longest token lifetime one request may ask for, in seconds (the registry's ceiling).
pub const TOKEN_TTL_S_MAX: u64 = waymark_registry::acl::TOKEN_TTL_MS_MAX / 1000;

/// Body limit of every route not listed below (reads, deletes, overrides, membership,
/// evacuations, failovers: small JSON objects).
pub const BODY_MAX: usize = 16 * 1024;
/// Body limit of a service declaration and of contract validation (a health contract).
pub const CONTRACT_BODY_MAX: usize = 64 * 1024;
/// Body limit of a registration or a declared external endpoint: tags and metadata at
/// their ceilings fit, with room for JSON.
pub const INSTANCE_BODY_MAX: usize = 128 * 1024;
/// Body limit of a service policy: `allowed_callers` at its ceiling of names fits.
pub const POLICY_BODY_MAX: usize = 2 * 1024 * 1024;

/// Shared state of the API handlers.
#[derive(Clone)]
pub struct ApiState {
    raft: RaftNode,
    leader: LeaderHandle,
    metrics: AuthorityMetrics,
    xds: XdsServer,
    registry: Arc<Registry>,
    region: RegionName,
    overrides: Arc<Mutex<OverrideLimiter>>,
    reconciliation: Arc<Mutex<Value>>,
    federation: Option<Arc<FederationNode>>,
    regions: Option<RegionsHandle>,
    denials: Arc<Mutex<Denials>>,
    /// `https` when the API listener is mutual TLS (redirects name the same scheme).
    scheme: &'static str,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl ApiState {
    /// State for the handlers.
    pub fn new(
        raft: RaftNode,
        leader: LeaderHandle,
        metrics: AuthorityMetrics,
        xds: XdsServer,
        registry: Arc<Registry>,
        region: RegionName,
    ) -> Self {
        Self {
            raft,
            leader,
            metrics,
            xds,
            registry,
            region,
            overrides: Arc::default(),
            reconciliation: Arc::new(Mutex::new(Value::Null)),
            federation: None,
            regions: None,
            denials: Arc::default(),
            scheme: "http",
        }
    }

    /// The API is served over TLS: redirects to the leader say `https`.
    pub fn with_tls(mut self, tls: bool) -> Self {
        self.scheme = if tls { "https" } else { "http" };
        self
    }

    /// Serve `/v1/federation/*` from this member's federation node.
    pub fn with_federation(
        mut self,
        node: Option<Arc<FederationNode>>,
        regions: Option<RegionsHandle>,
    ) -> Self {
        self.federation = node;
        self.regions = regions;
        self
    }

    /// Where the reconciler publishes its latest diff (JSON) for `/v1/reconciliation`.
    pub fn reconciliation(&self) -> Arc<Mutex<Value>> {
        Arc::clone(&self.reconciliation)
    }
}

/// The API routes, each with its body limit.
pub fn router(state: ApiState) -> Router {
    let limit = DefaultBodyLimit::max;
    Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/status", get(status))
        .route("/v1/operator/raft/peers", get(peers))
        .route("/v1/operator/raft/members", post(add_member))
        .route(
            "/v1/operator/raft/members/{id}",
            axum::routing::delete(remove_member),
        )
        .route("/v1/services", get(services))
        .route(
            "/v1/services/{service}",
            put(put_service)
                .get(get_service)
                .delete(remove_service)
                .layer(limit(CONTRACT_BODY_MAX)),
        )
        .route("/v1/services/{service}/view", get(service_view))
        .route(
            "/v1/services/{service}/policy",
            put(put_policy)
                .get(get_policy)
                .layer(limit(POLICY_BODY_MAX)),
        )
        .route("/v1/zones", get(zones))
        .route("/v1/zones/{zone}/evacuation", post(evacuation))
        .route(
            "/v1/contracts/validate",
            post(validate_contract).layer(limit(CONTRACT_BODY_MAX)),
        )
        .route(
            "/v1/instances",
            post(register)
                .get(instances)
                .layer(limit(INSTANCE_BODY_MAX)),
        )
        .route("/v1/instances/{id}", axum::routing::delete(deregister))
        .route("/v1/instances/{id}/renew", put(renew))
        .route("/v1/instances/{id}/explain", get(explain))
        .route(
            "/v1/external",
            post(declare_external).layer(limit(INSTANCE_BODY_MAX)),
        )
        .route("/v1/external/{id}", axum::routing::delete(remove_external))
        .route("/v1/overrides", post(override_instance))
        .route("/v1/audit", get(audit))
        .route("/v1/alarms", get(alarms))
        .route("/v1/reconciliation", get(reconciliation))
        .route("/v1/proxy-status", get(proxy_status))
        .route("/v1/federation/status", get(federation_status))
        .route("/v1/federation/failovers", get(region_failovers))
        .route(
            "/v1/federation/regions/{region}/failover",
            post(region_failover),
        )
        .route("/v1/acl/whoami", get(whoami))
        .route("/v1/acl/bootstrap", post(acl_bootstrap))
        .route("/v1/acl/grants", get(list_grants).post(add_grant))
        .route("/v1/acl/grants/revoke", post(revoke_grant))
        .route("/v1/acl/tokens", get(list_tokens).post(mint_token))
        .route("/v1/acl/tokens/{name}", axum::routing::delete(remove_token))
        .route("/metrics", get(metrics))
        // Every route above needs a verified principal; reads need `read`.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        // Probes answer without credentials: they say nothing but alive and ready.
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        // Routes without their own limit: the small default. An inner (per-route) limit
        // is applied after this one, so it wins.
        .layer(limit(BODY_MAX))
        .with_state(state)
}

/// Reads that any authenticated principal may make without the `read` grant.
const OPEN_TO_ANY_PRINCIPAL: &[&str] = &["/v1/acl/whoami"];
/// Writes that are reads: nothing is proposed.
const READS_BY_POST: &[&str] = &["/v1/contracts/validate"];

/// Authenticates every request that reaches it; requests that only read are authorised
/// for `read` here, writes by their handlers (which know the capability they need).
async fn authenticate(State(s): State<ApiState>, mut request: HttpRequest, next: Next) -> Response {
    let peer = request.extensions().get::<PeerInfo>().cloned();
    let caller = match s.caller(peer.as_ref(), request.headers()) {
        Ok(caller) => caller,
        Err(e) => return e.into_response(),
    };
    let path = request.uri().path();
    let reads =
        matches!(*request.method(), Method::GET | Method::HEAD) || READS_BY_POST.contains(&path);
    if reads && !OPEN_TO_ANY_PRINCIPAL.contains(&path) {
        let what = format!("{} {path}", request.method());
        if let Err(e) = s.allow(&caller, Action::Read, &what, None) {
            return e.into_response();
        }
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// A request body within its route's limit. Over the limit, or unreadable, the request
/// is refused with the API's error shape (`413 body_too_large`), counted and logged.
struct Body(Bytes);

impl FromRequest<ApiState> for Body {
    type Rejection = ApiError;

    async fn from_request(
        request: axum::extract::Request,
        state: &ApiState,
    ) -> Result<Self, ApiError> {
        match Bytes::from_request(request, state).await {
            Ok(bytes) => Ok(Self(bytes)),
            Err(rejection) => {
                let status = rejection.status();
                let reason = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    "body_too_large"
                } else {
                    "unreadable_body"
                };
                Err(state.refuse(ApiError::new(status, reason, None, rejection.body_text())))
            }
        }
    }
}

/// A refusal: status and body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    reason: String,
    field: Option<String>,
    message: String,
    location: Option<String>,
    /// A 401: answer with `WWW-Authenticate: Bearer`.
    authenticate: bool,
}

impl ApiError {
    fn new(
        status: StatusCode,
        reason: &str,
        field: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            reason: reason.to_owned(),
            field: field.map(str::to_owned),
            message: message.into(),
            location: None,
            authenticate: false,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            json!({"error": {"reason": self.reason, "field": self.field, "message": self.message}});
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(location) = self.location
            && let Ok(v) = header::HeaderValue::from_str(&location)
        {
            response.headers_mut().insert(header::LOCATION, v);
        }
        if self.authenticate {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"waymark\""),
            );
        }
        response
    }
}

type ApiResult<T> = Result<T, ApiError>;

impl ApiState {
    fn refuse(&self, e: ApiError) -> ApiError {
        self.metrics
            .api_refusals
            .get_or_create(&ReasonLabels {
                reason: e.reason.clone(),
            })
            .inc();
        tracing::info!(reason = %e.reason, field = ?e.field, message = %e.message, "api request refused");
        e
    }

    /// Parse a JSON body; a malformed one is refused naming the field where serde can.
    fn body<T: DeserializeOwned>(&self, bytes: &Bytes) -> ApiResult<T> {
        serde_json::from_slice(bytes).map_err(|e| {
            let message = e.to_string();
            let field = field_of(&message);
            self.refuse(ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_body",
                field.as_deref(),
                message,
            ))
        })
    }

    /// On a follower: redirect to the leader's same path.
    /// A routing control checked against the leader's assembler before it is committed:
    /// the refusal, if any (`409` with the assembler's reason, or `503` while the leader
    /// is still rebuilding).
    async fn check_with_pipeline<E: std::fmt::Display>(
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

    fn leader_only(&self, uri: &Uri) -> ApiResult<()> {
        if self.raft.is_leader() {
            return Ok(());
        }
        Err(self.redirect(uri, None))
    }

    fn redirect(&self, uri: &Uri, known: Option<(u64, super::raft::Member)>) -> ApiError {
        match known.or_else(|| self.raft.leader()) {
            Some((id, member)) => {
                let path = uri.path_and_query().map_or("/", |p| p.as_str());
                ApiError {
                    location: Some(format!("{}://{}{}", self.scheme, member.api_addr, path)),
                    ..ApiError::new(
                        StatusCode::TEMPORARY_REDIRECT,
                        "not_leader",
                        None,
                        format!("member {id} leads; ask it"),
                    )
                }
            }
            None => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_leader",
                None,
                "no leader is known (election in progress); retry",
            ),
        }
    }

    /// Commit a registry command; a refusal is a 4xx naming the field. The command's
    /// stateless checks run first, so a request that could never apply is refused here
    /// and never grows the log.
    async fn command(&self, uri: &Uri, command: Command) -> ApiResult<Applied> {
        if let Err(error) = command.check() {
            let refusal = Refusal::from(&error);
            return Err(self.refuse(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                &refusal.reason,
                refusal.field.as_deref(),
                refusal.message,
            )));
        }
        let request = Request::Registry(Stamped {
            at_ms: now_ms(),
            command,
        });
        match self.raft.write(request).await {
            Ok(RaftResponse::Registry {
                outcome: Ok(applied),
            }) => Ok(applied),
            Ok(RaftResponse::Registry {
                outcome: Err(refusal),
            }) => {
                let status = match refusal.reason.as_str() {
                    "unknown_service" | "unknown_instance" => StatusCode::NOT_FOUND,
                    "duplicate_address" | "retired" | "service_in_use" | "origin_mismatch"
                    | "service_mismatch" => StatusCode::CONFLICT,
                    _ => StatusCode::UNPROCESSABLE_ENTITY,
                };
                Err(self.refuse(ApiError::new(
                    status,
                    &refusal.reason,
                    refusal.field.as_deref(),
                    refusal.message,
                )))
            }
            Ok(RaftResponse::ApplyFailed { message }) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "apply_failed",
                None,
                format!("the write committed but failed to apply: {message}"),
            )),
            Ok(other) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "unexpected_response",
                None,
                format!("{other:?}"),
            )),
            Err(WriteError::NotLeader { leader }) => Err(self.redirect(uri, leader)),
            Err(e) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_committed",
                None,
                format!("the write was not committed: {e}; retry"),
            )),
        }
    }

    /// The acting operator of a privileged request, or a refusal saying what needs one.
    /// The request's verified principal: the listener's certificate identity, else a
    /// bearer token. `401` without either; a certificate always wins over a token.
    fn caller(&self, peer: Option<&PeerInfo>, headers: &HeaderMap) -> ApiResult<Caller> {
        let addr = peer.and_then(|p| p.remote_addr);
        if let Some(identity) = peer.map(|p| &p.identity) {
            let principal = principal_of(identity).ok_or_else(|| {
                self.unauthenticated(
                    "unusable_identity",
                    format!(
                        "the certificate's identity {identity} names nothing the registry can hold"
                    ),
                )
            })?;
            return Ok(Caller {
                principal,
                credential: Credential::Certificate,
                addr,
            });
        }
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err(self.unauthenticated(
                "unauthenticated",
                "present a client certificate or an `Authorization: Bearer` token".into(),
            ));
        };
        let bearer = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .unwrap_or_default();
        let now = now_ms();
        let principal = self
            .raft
            .with_state(|state, _| state.registry().acl().authenticate(bearer, now))
            .map_err(|refusal| {
                tracing::info!(reason = refusal.reason(), addr = ?addr, "bearer token refused");
                self.unauthenticated("bad_token", "the bearer token is not valid".into())
            })?;
        Ok(Caller {
            principal,
            credential: Credential::Token,
            addr,
        })
    }

    fn unauthenticated(&self, reason: &str, message: String) -> ApiError {
        let mut e = self.refuse(ApiError::new(
            StatusCode::UNAUTHORIZED,
            reason,
            None,
            message,
        ));
        e.authenticate = true;
        e
    }

    /// Whether `caller` may do `action`; a `403` naming the capability otherwise, folded
    /// into the audit log. `what` is the request (`POST /v1/overrides`).
    fn allow(
        &self,
        caller: &Caller,
        action: Action<'_>,
        what: &str,
        service: Option<&ServiceName>,
    ) -> ApiResult<()> {
        let denied = self.raft.with_state(|state, _| {
            state
                .registry()
                .acl()
                .authorize(&caller.principal, &self.region, action)
        });
        let Err(denied) = denied else {
            return Ok(());
        };
        self.deny(caller, denied.needed.clone(), what, service);
        Err(self.refuse(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            None,
            denied.to_string(),
        )))
    }

    /// A refusal by an authenticated principal: folded, and flushed to the audit log
    /// [`DENIAL_FLUSH_EVERY`] after the first of a batch.
    fn deny(&self, caller: &Caller, needed: String, what: &str, service: Option<&ServiceName>) {
        let first = {
            let mut d = self.denials.lock().unwrap_or_else(PoisonError::into_inner);
            let first = d.is_empty();
            d.handle_denial(caller.actor(), needed, what.to_owned(), service.cloned());
            first
        };
        if !first {
            return;
        }
        let (raft, denials) = (self.raft.clone(), Arc::clone(&self.denials));
        tokio::spawn(async move {
            tokio::time::sleep(DENIAL_FLUSH_EVERY).await;
            let entries = denials
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take_records(now_ms());
            let count = entries.len();
            // A follower forwards them to the leader; if that fails too, the refusals
            // stay in this member's log and metrics.
            if let Err(error) = raft.forward_audit(entries).await {
                tracing::warn!(error = %format!("{error:#}"), records = count, "authorisation refusals not audited");
            }
        });
    }

    /// A refusal of a check beyond grants (ownership of an address, a node, an
    /// instance): `403 not_owner`, audited like a missing grant.
    fn not_owner(&self, caller: &Caller, what: &str, message: String) -> ApiError {
        self.deny(caller, "ownership".into(), what, None);
        self.refuse(ApiError::new(
            StatusCode::FORBIDDEN,
            "not_owner",
            None,
            message,
        ))
    }

    /// A registration's ownership (ADR-15), beyond the grant: a node agent registers on
    /// its own node, in this region, at the address its connection comes from; a
    /// workload registers only itself (its service, its address). Operators and tokens
    /// are bound by their grants alone; authority members register nothing.
    fn owns_registration(&self, caller: &Caller, r: &Registration, what: &str) -> ApiResult<()> {
        let own_region =
            |region: &RegionName| region == &self.region && r.locality.region == self.region;
        let from_address = || caller.ip() == Some(r.address.ip);
        let refusal = match &caller.principal {
            Principal::Operator { .. } | Principal::Token { .. } => return Ok(()),
            Principal::Authority { .. } => "authority members register no instances".to_owned(),
            Principal::Node { region, node } => {
                if !own_region(region) {
                    format!("node {node} of region {region} registers only in its own region")
                } else if &r.locality.node != node {
                    format!(
                        "node {node} registers only on its own node, not {}",
                        r.locality.node
                    )
                } else if !from_address() {
                    format!(
                        "node {node} registers only at its own address: {} is not the address \
                         its connection comes from",
                        r.address.ip
                    )
                } else {
                    return Ok(());
                }
            }
            Principal::Workload {
                region, service, ..
            } => {
                if !own_region(region) || &r.service != service || !from_address() {
                    format!(
                        "a workload of {service} registers only itself: its service, region \
                         and the address its connection comes from"
                    )
                } else {
                    return Ok(());
                }
            }
        };
        Err(self.not_owner(caller, what, refusal))
    }

    /// Renewing, deregistering or removing a live instance: the grant for its node, and
    /// for a workload, the instance must be its own (its service, its address).
    fn owns_instance(&self, caller: &Caller, id: &InstanceId, what: &str) -> ApiResult<()> {
        let found = self.raft.with_state(|state, _| {
            state.registry().instance(id).map(|r| {
                (
                    r.instance.locality.node.clone(),
                    r.instance.service.clone(),
                    r.instance.address,
                )
            })
        });
        let Some((node, service, address)) = found else {
            // Whether it exists is for principals who may read.
            return self.allow(caller, Action::Read, what, None);
        };
        self.allow(
            caller,
            Action::Register { node: &node },
            what,
            Some(&service),
        )?;
        if let Principal::Workload { service: own, .. } = &caller.principal
            && (own != &service || caller.ip() != Some(address.ip))
        {
            return Err(self.not_owner(
                caller,
                what,
                format!("a workload of {own} acts only on itself, not on {id}"),
            ));
        }
        Ok(())
    }

    /// External endpoints are declared by operators (and their tokens), never by the
    /// agents or workloads whose neighbours they would become.
    fn declares_externals(&self, caller: &Caller, what: &str) -> ApiResult<()> {
        match caller.principal {
            Principal::Operator { .. } | Principal::Token { .. } => Ok(()),
            _ => Err(self.not_owner(
                caller,
                what,
                format!(
                    "{} may not declare external endpoints; operators do",
                    caller.actor()
                ),
            )),
        }
    }

    /// A field ceiling's verdict as the API's refusal: `422` naming the field, counted and
    /// logged; nothing is proposed or audited.
    fn fields(&self, checked: Result<(), fields::FieldError>) -> ApiResult<()> {
        checked.map_err(|e| {
            self.refuse(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                e.reason(),
                Some(e.field()),
                e.to_string(),
            ))
        })
    }

    async fn audit_write(&self, entry: AuditEntry) -> ApiResult<()> {
        self.raft
            .write(Request::Audit {
                entries: vec![entry],
            })
            .await
            .map(|_| ())
            .map_err(|e| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not_committed",
                    None,
                    format!("the audit record was not committed: {e}; retry"),
                )
            })
    }
}

/// serde_json names the field in "missing field `x`" and "unknown field `x`".
fn field_of(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    let field = &message[start..start + len];
    (message.contains("field")).then(|| field.to_owned())
}

fn parse_name<T: std::str::FromStr>(s: &str, field: &str) -> ApiResult<T>
where
    T::Err: std::fmt::Display,
{
    s.parse::<T>().map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_name",
            Some(field),
            format!("{field}: {e}"),
        )
    })
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

/// Liveness, process-internal only: this handler runs and the Raft core is running. No
/// peer, leader or quorum is consulted, so a partition never restarts a member.
async fn livez(State(s): State<ApiState>) -> Response {
    if s.raft.watch_metrics().has_changed().is_ok() {
        (StatusCode::OK, "alive\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the Raft core has stopped\n",
        )
            .into_response()
    }
}

/// Readiness, member-local only: the Raft core runs and this member has applied committed
/// state, so its xDS tier and reads serve it. A leader or quorum is not required — a
/// member cut off from the others still serves what it has.
async fn readyz(State(s): State<ApiState>) -> Response {
    let metrics = s.raft.watch_metrics();
    if metrics.has_changed().is_err() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the Raft core has stopped\n",
        )
            .into_response();
    }
    if let Some(failure) = s.raft.apply_failures().first() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the committed entry at index {} failed to apply ({}); this member keeps serving; see docs/robustness.md, \"A committed entry failed to apply\"\n",
                failure.index, failure.message
            ),
        )
            .into_response();
    }
    if metrics.borrow().last_applied.is_none() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "no committed state applied yet (not initialised, or still joining)\n",
        )
            .into_response();
    }
    (StatusCode::OK, "ready\n").into_response()
}

async fn status(State(s): State<ApiState>) -> impl IntoResponse {
    let leader = s
        .raft
        .leader()
        .map(|(id, m)| json!({"id": id, "api": m.api_addr}));
    axum::Json(json!({
        "region": s.region,
        "leader": leader,
        "is_leader": s.raft.is_leader(),
        "term": s.raft.current_term(),
    }))
}

/// This member's federation: per peer region (links up, age, staleness, versions held),
/// per link, and the front-door signal. Member-local: each member has its own links.
async fn federation_status(State(s): State<ApiState>) -> impl IntoResponse {
    let Some(node) = &s.federation else {
        return axum::Json(json!({"region": s.region, "enabled": false}));
    };
    let front_doors = s.regions.as_ref().map(|r| regions::front_doors(&r.signal));
    let local_versions: BTreeMap<ServiceName, u64> = s
        .regions
        .as_ref()
        .map(|r| regions::versions_of(&r.aggregates, &s.region))
        .unwrap_or_default();
    axum::Json(json!({
        "region": s.region,
        "enabled": true,
        "endpoint": node.local_addr(),
        "local_versions": local_versions,
        "regions": node.regions(),
        "links": node.status(),
        "front_doors": front_doors,
    }))
}

async fn peers(State(s): State<ApiState>) -> impl IntoResponse {
    axum::Json(s.raft.peers())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddMember {
    id: u64,
    /// The member's API listener.
    addr: String,
    /// The member's Raft listener.
    raft: String,
}

async fn add_member(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    s.allow(
        &caller,
        Action::Raft,
        "POST /v1/operator/raft/members",
        None,
    )?;
    s.leader_only(&uri)?;
    let m: AddMember = s.body(&body)?;
    // An IP or a DNS name: a StatefulSet member keeps its name, not its IP, across
    // restarts, and the Raft client resolves the name at each connection.
    for (field, value, what) in [("addr", &m.addr, "API"), ("raft", &m.raft, "Raft")] {
        if let Err(e) = value.parse::<crate::net::HostPort>() {
            return Err(s.refuse(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_address",
                Some(field),
                format!("{field}: host:port of the member's {what} listener (IP or DNS name): {e}"),
            )));
        }
    }
    if m.addr == m.raft {
        return Err(s.refuse(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_address",
            Some("raft"),
            "raft: the Raft listener is not the API listener",
        )));
    }
    let member = super::raft::Member {
        raft_addr: m.raft,
        api_addr: m.addr,
    };
    s.raft.add_member(m.id, member).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "membership",
            Some("id"),
            e.to_string(),
        )
    })?;
    Ok(axum::Json(s.raft.peers()).into_response())
}

async fn remove_member(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(id): Path<u64>,
) -> ApiResult<Response> {
    s.allow(
        &caller,
        Action::Raft,
        "DELETE /v1/operator/raft/members",
        None,
    )?;
    s.leader_only(&uri)?;
    s.raft.remove_member(id).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "membership",
            Some("id"),
            e.to_string(),
        )
    })?;
    Ok(axum::Json(s.raft.peers()).into_response())
}

#[derive(Debug, Serialize)]
struct ServiceSummary {
    service: ServiceName,
    owner: String,
    instances: usize,
    verdicts: BTreeMap<String, usize>,
    health_disregarded: Vec<String>,
    no_eligible_in_region: bool,
    version: Option<String>,
}

async fn services(State(s): State<ApiState>) -> impl IntoResponse {
    let list: Vec<ServiceSummary> = s.raft.with_state(|state, _| {
        state
            .registry()
            .services()
            .map(|(name, record)| {
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
                if let Some(v) = views.first() {
                    for e in v.view.endpoints.values() {
                        if e.region == s.region {
                            *verdicts.entry(e.verdict.as_str().to_owned()).or_default() += 1;
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
                    owner: record.owner.clone(),
                    instances,
                    verdicts,
                    health_disregarded: disregarded,
                    no_eligible_in_region: views
                        .iter()
                        .any(|v| v.view.markers.no_eligible_in_region),
                    version: views.iter().map(|v| v.version).max().map(|v| v.to_string()),
                }
            })
            .collect()
    });
    axum::Json(list)
}

async fn get_service(
    State(s): State<ApiState>,
    Path(service): Path<String>,
) -> ApiResult<Response> {
    let name: ServiceName = parse_name(&service, "service")?;
    s.raft.with_state(|state, _| {
        let record = state.registry().service(&name).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_service",
                Some("service"),
                format!("service {name} is not registered"),
            )
        })?;
        Ok(
            axum::Json(
                json!({"service": name, "owner": record.owner, "contract": record.contract}),
            )
            .into_response(),
        )
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutService {
    owner: String,
    contract: HealthContract,
}

async fn put_service(
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
    Ok((StatusCode::OK, axum::Json(json!({"service": service}))).into_response())
}

async fn remove_service(
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

async fn service_view(
    State(s): State<ApiState>,
    Path(service): Path<String>,
) -> ApiResult<Response> {
    let name: ServiceName = parse_name(&service, "service")?;
    let views: Vec<_> = s.raft.with_state(|state, _| {
        state
            .published()
            .iter()
            .filter(|(k, _)| k.service == name)
            .map(|(_, v)| v.clone())
            .collect()
    });
    Ok(axum::Json(views).into_response())
}

async fn get_policy(State(s): State<ApiState>, Path(service): Path<String>) -> ApiResult<Response> {
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

async fn put_policy(
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
    Ok(axum::Json(json!({"service": service})).into_response())
}

async fn zones(State(s): State<ApiState>) -> impl IntoResponse {
    let evacuations = s
        .raft
        .with_state(|state, _| state.registry().evacuations().clone());
    axum::Json(json!({"evacuations": evacuations}))
}

async fn evacuation(
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
    Ok(axum::Json(json!({"applied": applied})).into_response())
}

/// What an operator asks of a peer region's failover.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FailoverAction {
    Failover,
    ShiftBack,
    CompleteShiftBack,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FailoverBody {
    action: FailoverAction,
    reason: String,
}

/// An operator's region routing control: fail over away from a peer region (manual, so
/// its shift-back waits for completion), shift back, or complete. Checked against the
/// leader's assembler before commit; audited whether granted or refused.
async fn region_failover(
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
    Ok(axum::Json(json!({"applied": applied})).into_response())
}

/// Region failovers in force, as the log last recorded them (any member answers).
async fn region_failovers(State(s): State<ApiState>) -> impl IntoResponse {
    let failovers = s
        .raft
        .with_state(|state, _| state.registry().region_failovers().clone());
    let out: serde_json::Map<String, Value> = failovers
        .into_iter()
        .map(|(region, r)| {
            (
                region.to_string(),
                json!({
                    "moved": r.moved.get(),
                    "direction": if r.back { "back" } else { "out" },
                    "manual": r.manual,
                    "awaiting_completion": r.awaiting_completion,
                    "actor": r.actor,
                    "reason": r.reason,
                }),
            )
        })
        .collect();
    axum::Json(Value::Object(out))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ValidateBody {
    contract: HealthContract,
}

async fn validate_contract(State(s): State<ApiState>, Body(body): Body) -> ApiResult<Response> {
    let v: ValidateBody = s.body(&body)?;
    match v.contract.validate() {
        Ok(_) => Ok(axum::Json(json!({"valid": true})).into_response()),
        Err(e) => Err(s.refuse(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "contract",
            Some(&format!("contract.{}", e.field())),
            e.to_string(),
        ))),
    }
}

async fn register(
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

#[derive(Debug, Deserialize)]
struct InstancesQuery {
    service: Option<String>,
}

async fn instances(
    State(s): State<ApiState>,
    Query(q): Query<InstancesQuery>,
) -> impl IntoResponse {
    let list: Vec<Value> = s.raft.with_state(|state, _| {
        state
            .registry()
            .instances()
            .filter(|r| {
                q.service
                    .as_deref()
                    .is_none_or(|svc| r.instance.service.as_str() == svc)
            })
            .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
            .collect()
    });
    axum::Json(list)
}

async fn renew(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let instance: InstanceId = parse_name(&id, "instance").map_err(|e| s.refuse(e))?;
    s.owns_instance(&caller, &instance, "PUT /v1/instances/{id}/renew")?;
    s.leader_only(&uri)?;
    let applied = s.command(&uri, Command::Renew { instance }).await?;
    Ok(axum::Json(json!({"applied": applied})).into_response())
}

async fn deregister(
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

async fn declare_external(
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

async fn remove_external(
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

async fn explain(
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

// === access control: /v1/acl ===

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantBody {
    to: Grantee,
    can: Capability,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MintToken {
    name: String,
    /// Lifetime in seconds, at most [`TOKEN_TTL_S_MAX`].
    ttl_s: u64,
    #[serde(default)]
    description: String,
    /// Capabilities granted to the token at once.
    #[serde(default)]
    grants: Vec<Capability>,
}

impl ApiState {
    /// Commit an access-control change and audit it, granted or refused.
    async fn acl_change(
        &self,
        uri: &Uri,
        caller: &Caller,
        change: AclCommand,
        detail: Value,
    ) -> ApiResult<AclApplied> {
        let result = self.command(uri, Command::Acl { change }).await;
        self.audit_write(AuditEntry {
            seq: 0,
            at_ms: now_ms(),
            kind: AuditKind::Acl,
            actor: caller.actor(),
            service: None,
            instance: None,
            outcome: if result.is_ok() { "applied" } else { "refused" }.into(),
            detail,
        })
        .await?;
        match result? {
            Applied::Acl { applied } => Ok(applied),
            other => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "unexpected_response",
                None,
                format!("{other:?}"),
            )),
        }
    }
}

/// Who the caller is, how it proved it, and the grants that apply to it. Any
/// authenticated principal may ask.
async fn whoami(State(s): State<ApiState>, Extension(caller): Extension<Caller>) -> Response {
    let grants: Vec<Grant> = s.raft.with_state(|state, _| {
        state
            .registry()
            .acl()
            .grants_of(&caller.principal, &s.region)
            .cloned()
            .collect()
    });
    axum::Json(json!({
        "principal": caller.actor(),
        "credential": match caller.credential {
            Credential::Certificate => "certificate",
            Credential::Token => "token",
        },
        "grants": grants,
    }))
    .into_response()
}

/// The first grants of a region, once: an operator presenting its certificate gets every
/// capability, and the region's node agents read and own-node registration.
async fn acl_bootstrap(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> ApiResult<Response> {
    let (Principal::Operator { name }, Credential::Certificate) =
        (&caller.principal, caller.credential)
    else {
        return Err(s.not_owner(
            &caller,
            "POST /v1/acl/bootstrap",
            "bootstrap needs an operator's client certificate".into(),
        ));
    };
    s.leader_only(&uri)?;
    let change = AclCommand::Bootstrap {
        operator: name.clone(),
        token: None,
    };
    let applied = s
        .acl_change(&uri, &caller, change, json!({"action": "bootstrap"}))
        .await?;
    Ok(axum::Json(json!({"applied": applied})).into_response())
}

async fn list_grants(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Response> {
    s.allow(&caller, Action::Acl, "GET /v1/acl/grants", None)?;
    let (bootstrapped, grants): (bool, Vec<Grant>) = s.raft.with_state(|state, _| {
        let acl = state.registry().acl();
        (acl.is_bootstrapped(), acl.grants().cloned().collect())
    });
    Ok(axum::Json(json!({"bootstrapped": bootstrapped, "grants": grants})).into_response())
}

async fn add_grant(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    change_grant(&s, &caller, &uri, &body, true).await
}

async fn revoke_grant(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    change_grant(&s, &caller, &uri, &body, false).await
}

/// Add (`add`) or remove a grant: needs `acl`, audited either way.
async fn change_grant(
    s: &ApiState,
    caller: &Caller,
    uri: &Uri,
    body: &Bytes,
    add: bool,
) -> ApiResult<Response> {
    let what = if add {
        "POST /v1/acl/grants"
    } else {
        "POST /v1/acl/grants/revoke"
    };
    s.allow(caller, Action::Acl, what, None)?;
    s.leader_only(uri)?;
    let GrantBody { to, can } = s.body(body)?;
    let grant = Grant { to, can };
    let detail = json!({"action": if add { "grant" } else { "revoke" }, "grant": grant});
    let change = if add {
        AclCommand::Grant { grant }
    } else {
        AclCommand::Revoke { grant }
    };
    let applied = s.acl_change(uri, caller, change, detail).await?;
    Ok(axum::Json(json!({"applied": applied})).into_response())
}

async fn list_tokens(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Response> {
    s.allow(&caller, Action::Acl, "GET /v1/acl/tokens", None)?;
    let now = now_ms();
    let tokens: Vec<Value> = s.raft.with_state(|state, _| {
        state
            .registry()
            .acl()
            .tokens()
            .map(|t| {
                json!({
                    "name": t.name, "created_by": t.created_by, "created_at_ms": t.created_at_ms,
                    "expires_at_ms": t.expires_at_ms, "expired": t.expires_at_ms <= now,
                    "description": t.description,
                })
            })
            .collect()
    });
    Ok(axum::Json(tokens).into_response())
}

/// Mint a token: the secret is generated here, returned once in the bearer form, and
/// only its digest is committed.
async fn mint_token(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    s.allow(&caller, Action::Acl, "POST /v1/acl/tokens", None)?;
    s.leader_only(&uri)?;
    let m: MintToken = s.body(&body)?;
    if m.ttl_s == 0 || m.ttl_s > TOKEN_TTL_S_MAX {
        return Err(s.refuse(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "bad_ttl",
            Some("ttl_s"),
            format!("ttl_s: 1..={TOKEN_TTL_S_MAX} seconds"),
        )));
    }
    s.fields(fields::count(
        "grants",
        m.grants.len(),
        fields::TOKEN_GRANTS_MAX,
    ))?;
    let secret = new_secret()
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "no_randomness", None, e))?;
    let now = now_ms();
    let token = TokenRecord {
        name: m.name.clone(),
        secret_sha256: waymark_registry::acl::secret_digest(&secret),
        created_by: caller.actor(),
        created_at_ms: now,
        expires_at_ms: now.saturating_add(m.ttl_s.saturating_mul(1000)),
        description: m.description,
    };
    let expires_at_ms = token.expires_at_ms;
    let detail = json!({"action": "mint_token", "token": m.name, "expires_at_ms": expires_at_ms, "grants": m.grants});
    s.acl_change(&uri, &caller, AclCommand::PutToken { token }, detail)
        .await?;
    for can in &m.grants {
        let grant = Grant {
            to: Grantee::Token(m.name.clone()),
            can: can.clone(),
        };
        let detail = json!({"action": "grant", "grant": grant});
        s.acl_change(&uri, &caller, AclCommand::Grant { grant }, detail)
            .await?;
    }
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({
            "name": m.name,
            "token": waymark_registry::acl::bearer(&m.name, &secret),
            "expires_at_ms": expires_at_ms,
            "grants": m.grants,
        })),
    )
        .into_response())
}

async fn remove_token(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    s.allow(&caller, Action::Acl, "DELETE /v1/acl/tokens/{name}", None)?;
    s.leader_only(&uri)?;
    let detail = json!({"action": "remove_token", "token": name});
    let applied = s
        .acl_change(&uri, &caller, AclCommand::RemoveToken { name }, detail)
        .await?;
    Ok(axum::Json(json!({"applied": applied})).into_response())
}

/// 32 random bytes, hex: a token's secret.
pub fn new_secret() -> Result<String, String> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "the system's random source failed".to_owned())?;
    Ok(hex::encode(bytes))
}

/// Overrides `actor` was granted on `service` within the window before `now_ms`, as the
/// replicated audit log records them (every leader's grants, not only this member's).
pub fn overrides_granted(
    audit: &VecDeque<AuditEntry>,
    actor: &str,
    service: &ServiceName,
    now_ms: u64,
) -> usize {
    let window = u64::try_from(OVERRIDE_WINDOW.as_millis()).unwrap_or(u64::MAX);
    let since = now_ms.saturating_sub(window);
    audit
        .iter()
        .rev()
        // Records are appended in time order, give or take the members' clock skew.
        .take_while(|e| e.at_ms >= since.saturating_sub(60_000))
        .filter(|e| {
            e.kind == AuditKind::Override
                && e.at_ms >= since
                && e.outcome == "granted"
                && e.actor == actor
                && e.service.as_ref() == Some(service)
        })
        .count()
}

/// Per actor × service sliding-window limiter for overrides. Pure; time passed in.
#[derive(Debug, Default)]
pub struct OverrideLimiter {
    recent: BTreeMap<(String, String), VecDeque<Instant>>,
}

impl OverrideLimiter {
    /// Whether `actor` may override on `service` at `now`; records it if so.
    pub fn try_acquire(&mut self, actor: &str, service: &str, now: Instant) -> bool {
        let q = self
            .recent
            .entry((actor.to_owned(), service.to_owned()))
            .or_default();
        while q
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= OVERRIDE_WINDOW)
        {
            q.pop_front();
        }
        if q.len() >= OVERRIDES_PER_WINDOW {
            return false;
        }
        q.push_back(now);
        true
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideBody {
    instance: InstanceId,
    /// `maintenance_on` (take it out of rotation by hand) or `maintenance_off`.
    action: String,
    justification: Option<String>,
}

async fn override_instance(
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
    if let Some(j) = &o.justification {
        s.fields(fields::text(
            "justification",
            j,
            fields::OVERRIDE_JUSTIFICATION_LEN_MAX,
        ))?;
    }
    if !matches!(o.action.as_str(), "maintenance_on" | "maintenance_off") {
        return Err(s.refuse(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "bad_action",
            Some("action"),
            "action: maintenance_on or maintenance_off",
        )));
    }
    let service = s.raft.with_state(|st, _| {
        st.registry()
            .instance(&o.instance)
            .map(|r| r.instance.service.clone())
    });
    let Some(svc) = service.clone() else {
        return Err(s.refuse(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_instance",
            Some("instance"),
            format!("no live instance {}", o.instance),
        )));
    };
    let what = "POST /v1/overrides";
    s.allow(
        &caller,
        Action::Override { service: &svc },
        what,
        Some(&svc),
    )?;
    // A named operator's attempt on a live instance is audited whether granted or not.
    let refusal = if o
        .justification
        .as_deref()
        .map(str::trim)
        .is_none_or(str::is_empty)
    {
        Some(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "no_justification",
            Some("justification"),
            "an override needs a justification",
        ))
    } else {
        // The replicated audit log remembers what earlier leaders granted, so a leader
        // change does not reset anyone's budget; the local limiter covers requests still
        // in flight here.
        let granted = s
            .raft
            .with_state(|state, _| overrides_granted(state.audit(), &actor, &svc, now_ms()));
        let ok = granted < OVERRIDES_PER_WINDOW
            && s.overrides
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .try_acquire(&actor, svc.as_str(), Instant::now());
        (!ok).then(|| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                None,
                format!(
                    "at most {OVERRIDES_PER_WINDOW} overrides per {} min per actor per service",
                    OVERRIDE_WINDOW.as_secs() / 60
                ),
            )
        })
    };
    let outcome = if refusal.is_some() {
        "refused"
    } else {
        "granted"
    };
    s.metrics
        .overrides
        .get_or_create(&OutcomeLabels {
            outcome: outcome.into(),
        })
        .inc();
    let audit = AuditEntry {
        seq: 0,
        at_ms: now_ms(),
        kind: AuditKind::Override,
        actor: actor.clone(),
        service: service.clone(),
        instance: Some(o.instance.clone()),
        outcome: outcome.into(),
        detail: json!({
            "action": o.action,
            "justification": o.justification,
            "reason": refusal.as_ref().map(|r| r.reason.clone()),
        }),
    };
    s.audit_write(audit).await?;
    if let Some(e) = refusal {
        return Err(s.refuse(e));
    }
    let reason = (o.action == "maintenance_on")
        .then(|| format!("{} by {actor}", o.justification.unwrap_or_default()));
    let applied = s
        .command(
            &uri,
            Command::Maintenance {
                instance: o.instance,
                reason,
            },
        )
        .await?;
    Ok(axum::Json(json!({"applied": applied})).into_response())
}

#[derive(Debug, Deserialize)]
struct AuditQuery {
    kind: Option<AuditKind>,
    actor: Option<String>,
    service: Option<String>,
    instance: Option<String>,
    since_seq: Option<u64>,
    limit: Option<usize>,
}

async fn audit(State(s): State<ApiState>, Query(q): Query<AuditQuery>) -> impl IntoResponse {
    let limit = q.limit.unwrap_or(1000).min(AUDIT_PAGE_MAX);
    let lines: String = s.raft.with_state(|state, _| {
        let mut out = String::new();
        for e in state
            .audit()
            .iter()
            .filter(|e| q.since_seq.is_none_or(|s| e.seq > s))
            .filter(|e| q.kind.is_none_or(|k| e.kind == k))
            .filter(|e| q.actor.as_deref().is_none_or(|a| e.actor == a))
            .filter(|e| {
                q.service
                    .as_deref()
                    .is_none_or(|svc| e.service.as_ref().is_some_and(|x| x.as_str() == svc))
            })
            .filter(|e| {
                q.instance
                    .as_deref()
                    .is_none_or(|i| e.instance.as_ref().is_some_and(|x| x.as_str() == i))
            })
            .take(limit)
        {
            if let Ok(line) = serde_json::to_string(&redacted(e)) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    });
    ([(header::CONTENT_TYPE, "application/jsonl")], lines)
}

/// What the audit read path shows of a check's detail in place of the target's own words.
pub const REDACTED: &str = "[redacted: the target's answer is shown by explain]";

/// An audit record as the audit read path shows it. Transition evidence keeps the check's
/// own words (`Fail: HTTP 503`) but not what the probed target said: the target may be
/// anything the registry names, and its answer is relayed only by `explain` (truncated).
/// The record in the log is unchanged.
fn redacted(e: &AuditEntry) -> std::borrow::Cow<'_, AuditEntry> {
    if e.kind != AuditKind::Transition {
        return std::borrow::Cow::Borrowed(e);
    }
    let mut out = e.clone();
    if let Some(evidence) = out.detail.get_mut("evidence").and_then(Value::as_array_mut) {
        for class in evidence {
            if let Some(Value::String(last)) = class.get_mut("last")
                && let Some(head) = check_words(last)
            {
                *last = format!("{head}{TARGET_TEXT_MARKER}{REDACTED}");
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The check's own words of a detail that carries a target's text, if it does: up to the
/// marker, or — in records written before the marker — up to the text after an HTTP
/// status or a gRPC code.
fn check_words(last: &str) -> Option<&str> {
    if let Some((head, _)) = last.split_once(TARGET_TEXT_MARKER) {
        return Some(head);
    }
    let (_health, rest) = last.split_once(": ")?;
    let offset = last.len() - rest.len();
    let said_at = if let Some(status) = rest.strip_prefix("HTTP ") {
        let code = status
            .get(..3)
            .filter(|c| c.bytes().all(|b| b.is_ascii_digit()))?;
        status[code.len()..]
            .starts_with(": ")
            .then_some(5 + code.len())?
    } else if let Some(grpc) = rest.strip_prefix("gRPC ") {
        5 + grpc.find(": ")?
    } else {
        return None;
    };
    Some(&last[..offset + said_at])
}

/// Current alarms: the latest alarm record per (service, alarm, zone) that is still raised.
async fn alarms(State(s): State<ApiState>) -> impl IntoResponse {
    let raised: Vec<Value> = s.raft.with_state(|state, _| {
        let mut latest: BTreeMap<(String, String, String), &AuditEntry> = BTreeMap::new();
        for e in state.audit().iter().filter(|e| e.kind == AuditKind::Alarm) {
            let family = match e.outcome.as_str() {
                "guard_engaged" | "guard_released" => "fraction_guard",
                "last_eligible_withdrawn" | "eligible_restored" => "last_eligible_withdrawn",
                _ => continue,
            };
            let zone = e.detail.get("zone").and_then(Value::as_str).unwrap_or("").to_owned();
            let service = e.service.as_ref().map(ToString::to_string).unwrap_or_default();
            latest.insert((service, family.to_owned(), zone), e);
        }
        latest
            .into_iter()
            .filter(|(_, e)| matches!(e.outcome.as_str(), "guard_engaged" | "last_eligible_withdrawn"))
            .map(|((service, alarm, zone), e)| json!({"service": service, "alarm": alarm, "zone": (!zone.is_empty()).then_some(zone), "since_ms": e.at_ms, "seq": e.seq, "detail": e.detail}))
            .collect()
    });
    axum::Json(raised)
}

async fn reconciliation(State(s): State<ApiState>) -> impl IntoResponse {
    let diff = s
        .reconciliation
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    axum::Json(diff)
}

async fn proxy_status(State(s): State<ApiState>) -> impl IntoResponse {
    let now = Instant::now();
    let clients: Vec<Value> = s
        .xds
        .sync_state()
        .into_iter()
        .map(|c| {
            let types: BTreeMap<String, Value> = c
                .types
                .iter()
                .map(|(t, ty)| {
                    let short = t.rsplit('.').next().unwrap_or(t).to_owned();
                    (short, json!({"sent": ty.sent, "acked": ty.acked, "in_sync": ty.sent == ty.acked, "nacks": ty.nacks, "last_nack": ty.last_nack.as_ref().map(|(v, e)| json!({"version": v, "error": e})), "resources": ty.resources}))
                })
                .collect();
            json!({
                "node": c.node_id, "zone": c.zone, "protocol": c.protocol, "identity": c.identity,
                "connected_for_ms": now.saturating_duration_since(c.connected_since).as_millis() as u64,
                "types": types,
            })
        })
        .collect();
    axum::Json(clients)
}

async fn metrics(State(s): State<ApiState>, headers: HeaderMap) -> impl IntoResponse {
    // The xDS tier's gauges are sampled once a second by `staleness::run`, not per scrape.
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &s.registry) {
        return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response();
    }
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    if openmetrics {
        let ct = "application/openmetrics-text; version=1.0.0; charset=utf-8";
        ([(header::CONTENT_TYPE, ct)], text).into_response()
    } else {
        let ct = "text/plain; version=0.0.4; charset=utf-8";
        let body = super::metrics::to_prometheus_text(&text);
        ([(header::CONTENT_TYPE, ct)], body).into_response()
    }
}

/// The OpenAPI document for this API.
pub const OPENAPI: &str = include_str!("../openapi.json");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_override_budget_is_counted_from_the_replicated_audit_log() {
        // Goal: the budget lived in the leader's memory, so a leader change gave every
        // principal a fresh one. Whatever leader granted them, they count.
        let pay = ServiceName::try_new("pay").unwrap_or_else(|e| panic!("{e}"));
        let web = ServiceName::try_new("web").unwrap_or_else(|e| panic!("{e}"));
        let window = u64::try_from(OVERRIDE_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let now = 10 * window;
        let entry = |at_ms, actor: &str, service: &ServiceName, outcome: &str| AuditEntry {
            seq: 0,
            at_ms,
            kind: AuditKind::Override,
            actor: actor.into(),
            service: Some(service.clone()),
            instance: None,
            outcome: outcome.into(),
            detail: Value::Null,
        };
        let audit: VecDeque<AuditEntry> = [
            entry(now - window - 1, "token/bob", &pay, "granted"), // outside the window
            entry(now - window + 1, "token/bob", &pay, "granted"),
            entry(now - 10, "token/bob", &pay, "refused"),
            entry(now - 5, "token/bob", &web, "granted"),
            entry(now - 4, "token/alice", &pay, "granted"),
            entry(now - 1, "token/bob", &pay, "granted"),
        ]
        .into();
        assert_eq!(overrides_granted(&audit, "token/bob", &pay, now), 2);
        assert_eq!(overrides_granted(&audit, "token/bob", &web, now), 1);
        assert_eq!(overrides_granted(&audit, "token/carol", &pay, now), 0);
    }

    #[test]
    fn the_audit_read_path_keeps_the_checks_words_and_drops_what_the_target_said() {
        for (last, head) in [
            ("Fail: HTTP 503; said: secret-token", Some("Fail: HTTP 503")),
            (
                "Fail: gRPC Unavailable; said: x",
                Some("Fail: gRPC Unavailable"),
            ),
            // Records written before the marker existed.
            ("Fail: HTTP 500: ami-id i-0abc", Some("Fail: HTTP 500")),
            ("Fail: gRPC Internal: boom", Some("Fail: gRPC Internal")),
            ("Fail: HTTP 503", None),
            ("Refused: connection refused", None),
            ("Timeout: no answer within 500ms", None),
            ("not ready: warming up", None),
        ] {
            assert_eq!(check_words(last), head, "{last}");
        }
        let entry = AuditEntry {
            seq: 1,
            at_ms: 0,
            kind: AuditKind::Transition,
            actor: "waymark".into(),
            service: None,
            instance: None,
            outcome: "ineligible".into(),
            detail: json!({"evidence": [
                {"class": "probe", "last": "Fail: HTTP 500; said: {\"AccessKeyId\": \"AKIA\"}"},
                {"class": "self_report", "last": "ready"},
            ]}),
        };
        let shown = serde_json::to_string(&redacted(&entry)).unwrap_or_default();
        assert!(!shown.contains("AKIA"), "{shown}");
        assert!(shown.contains("Fail: HTTP 500; said: [redacted"), "{shown}");
        assert!(shown.contains("\"ready\""), "{shown}");
    }
}
