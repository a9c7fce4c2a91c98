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
//!
//! Layout, by resource; each file says which routes it serves: `access` (who is asking and
//! what they may do, before every route), `services` (services, contracts, policies),
//! `instances` (registrations, leases, externals, overrides, explain), `routing` (zone
//! evacuation and region failover), `acl` (grants and tokens), `audit` (the audit log and
//! alarms), `status` (probes, status, Raft membership, federation, proxy status,
//! metrics), `proxy` (the sidecars behind the node agents) and `discovery` (Prometheus
//! HTTP service discovery); `blocking` and `query` are the read routes' blocking queries,
//! filters and pages. `routes` is the table of operations that both the router and the
//! OpenAPI document (`openapi`) are built from; `params` describes the query strings as
//! types. This file holds the state, the router, the error shape and the helpers every
//! handler shares.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::registry::Registry;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use waymark_core::model::RegionName;
use waymark_federation_quic::FederationNode;
use waymark_registry::batch::GroupCommitConfig;
use waymark_registry::machine::{AuditEntry, Refusal, Request};
use waymark_registry::overrides::OverrideLimiter;
use waymark_registry::state::{Applied, Command, Stamped};
use waymark_xds::server::XdsServer;

use super::clock::now_ms;
use super::commit::{CommitError, Committer};
use super::fields;
use super::kube::ReconcileStatus;
use super::leader::LeaderHandle;
use super::metrics::{AuthorityMetrics, ReasonLabels};
use super::principal::Denials;
use super::raft::RaftNode;
use super::regions::RegionsHandle;

mod access;
mod access_log;
mod acl;
mod audit;
mod blocking;
mod discovery;
mod instances;
mod keyring;
mod openapi;
mod operator;
mod overrides;
mod params;
mod proxy;
mod query;
mod routes;
mod routing;
mod services;
mod status;

pub use acl::new_secret;
pub use audit::REDACTED;
pub use blocking::{INDEX_HEADER, JITTER_DIVISOR, WAIT_DEFAULT, WAIT_MAX};
pub use discovery::LABEL_PREFIX;
pub use openapi::{
    Body as OperationBody, Method, Operation, Permission, Reply, document, document_text,
};
pub use query::{FILTER_VALUES_MAX, LIMIT_MAX, NEXT_CURSOR_HEADER};
pub use routes::{NON_API, ROUTES, Route};

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

/// Shared state of the API handlers. Every extractor and layer of a request takes its own
/// clone, so it is one allocation behind one reference count: cloning it field by field
/// (the metrics alone hold dozens of `Arc`s) cost a fifth of the member's CPU at 8,000
/// requests a second.
#[derive(Clone)]
pub struct ApiState(Arc<ApiInner>);

/// What [`ApiState`] shares; read through its `Deref`.
#[derive(Clone)]
pub struct ApiInner {
    raft: RaftNode,
    /// Registry commands go through group commit.
    commits: Committer,
    leader: LeaderHandle,
    metrics: AuthorityMetrics,
    xds: XdsServer,
    registry: Arc<Registry>,
    region: RegionName,
    overrides: Arc<Mutex<OverrideLimiter>>,
    reconciliation: Arc<Mutex<Option<ReconcileStatus>>>,
    federation: Option<Arc<FederationNode>>,
    regions: Option<RegionsHandle>,
    denials: Arc<Mutex<Denials>>,
    /// `https` when the API listener is mutual TLS (redirects name the same scheme).
    scheme: &'static str,
    /// The sidecars behind the node agents (`proxy`).
    sidecars: super::sidecars::SidecarsHandle,
    /// Pool-wide gossip keyring operations (`keyring`).
    keyring: Option<Arc<super::keyring::KeyringPool>>,
    /// What the blocking queries wait on.
    indices: tokio::sync::watch::Receiver<blocking::Indices>,
}

impl std::ops::Deref for ApiState {
    type Target = ApiInner;

    fn deref(&self) -> &ApiInner {
        &self.0
    }
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
        Self(Arc::new(ApiInner {
            commits: Committer::start(raft.clone(), GroupCommitConfig::default(), metrics.clone()),
            indices: blocking::follow(raft.clone()),
            raft,
            leader,
            metrics,
            xds,
            registry,
            region,
            overrides: Arc::default(),
            reconciliation: Arc::default(),
            federation: None,
            regions: None,
            denials: Arc::default(),
            scheme: "http",
            sidecars: Default::default(),
            keyring: None,
        }))
    }

    /// The shared state to set up, before the state is shared (copied if it already is).
    fn setup(&mut self) -> &mut ApiInner {
        Arc::make_mut(&mut self.0)
    }

    /// The API is served over TLS: redirects to the leader say `https`.
    pub fn with_tls(mut self, tls: bool) -> Self {
        self.setup().scheme = if tls { "https" } else { "http" };
        self
    }

    /// Serve `/v1/federation/*` from this member's federation node.
    pub fn with_federation(
        mut self,
        node: Option<Arc<FederationNode>>,
        regions: Option<RegionsHandle>,
    ) -> Self {
        let inner = self.setup();
        inner.federation = node;
        inner.regions = regions;
        self
    }

    /// Where the reconciler publishes its latest status for `/v1/reconciliation`.
    pub fn reconciliation(&self) -> Arc<Mutex<Option<ReconcileStatus>>> {
        Arc::clone(&self.reconciliation)
    }
}

/// The API routes, each with its body limit: the operations of [`ROUTES`] (which the
/// OpenAPI document describes too) behind authentication, and the probes of [`NON_API`].
pub fn router(state: ApiState) -> Router {
    let authenticated = routes::mount(Router::new(), &state)
        // A path the API does not serve is answered after authentication, like any
        // other: an anonymous caller learns nothing, not even which paths exist. Set
        // here, it stays the router's fallback when the UI's routes are merged.
        .fallback(not_found)
        // Every route above needs a verified principal; each operation's permission is
        // checked by the layer its table entry mounts, or by its handler.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            access::authenticate,
        ));
    // Probes answer without credentials: they say nothing but alive and ready.
    routes::mount_probes(authenticated)
        // The web UI's static pages: no data in them, so no credentials (see `ui`).
        .merge(super::ui::router())
        // Routes without their own limit: the small default. An inner (per-route) limit
        // is applied after this one, so it wins.
        .layer(DefaultBodyLimit::max(BODY_MAX))
        // Outermost, so that every answer the router gives is logged with its request id.
        .layer(axum::middleware::from_fn(access_log::record))
        // Outside the access log, which counts every answer in these families.
        .layer(axum::Extension(access_log::ApiRequestMetrics::of(
            &state.metrics,
        )))
        .with_state(state)
}

/// The API's answer for a path it does not serve (`404 not_found`, the error shape).
async fn not_found(
    axum::extract::State(s): axum::extract::State<ApiState>,
    uri: axum::http::Uri,
) -> ApiError {
    s.refuse(ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        None,
        format!("no route {}", uri.path()),
    ))
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

/// The body of every refusal: `{"error": {"reason", "field", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Error")]
pub struct ErrorBody {
    /// What was refused, and why.
    pub error: RefusalBody,
}

/// One refusal, as every route answers it.
///
/// `waymark_registry::machine::Refusal` is the registry's own; this is its wire form,
/// which the API's other refusals (authentication, bounds, parsing) share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Refusal")]
pub struct RefusalBody {
    /// A stable, machine-readable reason (`unknown_service`, `forbidden`, `too_long`, …).
    pub reason: String,
    /// The request field or parameter at fault, where there is one.
    pub field: Option<String>,
    /// What went wrong, for people.
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let logged = access_log::LoggedRefusal(self.reason.clone());
        let body = ErrorBody {
            error: RefusalBody {
                reason: self.reason,
                field: self.field,
                message: self.message,
            },
        };
        let mut response = reply(self.status, &body);
        response.extensions_mut().insert(logged);
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

/// A registry refusal as the API answers it: the status its reason calls for
/// ([`refusal_status`]), with its reason, field and message as the registry gave them.
impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        // A reason without a status is a gap in the table, which its test catches; until
        // then it is answered as the request's own fault, as most refusals are.
        let status = refusal_status(&refusal.reason).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
        Self::new(
            status,
            &refusal.reason,
            refusal.field.as_deref(),
            refusal.message,
        )
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// A JSON answer with `status`. The body goes through [`serde_json::Value`] first, so its
/// objects' keys are written in the order the API has always written them (sorted: the
/// bodies were built as `Value`s before they had types), whatever the field order of its
/// type.
fn reply<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_value(body) {
        Ok(value) => (status, axum::Json(value)).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the answer did not encode: {e}"),
        )
            .into_response(),
    }
}

/// [`reply`] with `200 OK`.
fn ok<T: Serialize>(body: &T) -> Response {
    reply(StatusCode::OK, body)
}

/// The status of a registry refusal, by its reason: every reason in [`Refusal::REASONS`]
/// has one (checked by `api/tests.rs`); `None` for any other.
fn refusal_status(reason: &str) -> Option<StatusCode> {
    let status = match reason {
        // The request names something the registry does not hold.
        "unknown_service" | "unknown_instance" => StatusCode::NOT_FOUND,
        // The request is well formed but clashes with what the registry holds.
        "duplicate_address" | "retired" | "service_in_use" | "origin_mismatch"
        | "service_mismatch" => StatusCode::CONFLICT,
        // The request itself is refused: a value out of range, too long, too many, or a
        // ceiling of the region reached.
        "contract" | "not_leased" | "bad_address" | "bad_lease" | "bad_policy"
        | "bad_justification" | "too_long" | "too_many" | "region_full" | "id_unavailable" => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        // Access-control changes.
        "already_bootstrapped"
        | "bad_name"
        | "malformed"
        | "unknown_grant"
        | "unknown_token"
        | "token_exists"
        | "bad_expiry"
        | "bad_digest"
        | "acl_full" => StatusCode::UNPROCESSABLE_ENTITY,
        _ => return None,
    };
    Some(status)
}

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

    /// Parse a read route's query string ([`query`]); a refusal is counted and logged.
    fn list_query(
        &self,
        uri: &Uri,
        allowed: &[&str],
        walk: Option<query::Walk>,
    ) -> ApiResult<query::ListQuery> {
        query::ListQuery::parse(uri, allowed, walk).map_err(|e| self.refuse(e))
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
    fn leader_only(&self, uri: &Uri) -> ApiResult<()> {
        // A leader moving its leadership away takes the request in: its write waits for
        // the transfer, then goes on here or is redirected to the new leader.
        if self.raft.is_leader() || self.raft.transferring() {
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
            return Err(self.refuse(Refusal::from(&error).into()));
        }
        let stamped = Stamped {
            at_ms: now_ms(),
            command,
        };
        match self.commits.commit(stamped).await {
            Ok(Ok(applied)) => Ok(applied),
            Ok(Err(refusal)) => Err(self.refuse(refusal.into())),
            Err(CommitError::ApplyFailed(message)) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "apply_failed",
                None,
                format!("the write committed but failed to apply: {message}"),
            )),
            Err(CommitError::Unexpected(what)) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "unexpected_response",
                None,
                what,
            )),
            Err(CommitError::NotLeader { leader }) => Err(self.redirect(uri, leader)),
            Err(e @ CommitError::Full(_)) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "commit_queue_full",
                None,
                format!("{e}"),
            )),
            Err(e) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_committed",
                None,
                format!("the write was not committed: {e}; retry"),
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

/// `GET /v1/openapi.json`: the document generated from [`ROUTES`].
async fn openapi_json() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        document_text(),
    )
}

/// The checked-in copy of the OpenAPI document (`scripts/update-schemas` writes it from
/// [`document`]; `agent/tests/contract_guide.rs` fails while they differ).
pub const OPENAPI: &str = include_str!("../openapi.json");

#[cfg(test)]
mod tests;
