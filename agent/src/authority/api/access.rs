//! Who is asking and what they may do. Serves no route of its own: [`authenticate`] runs
//! before every route but `/livez` and `/readyz`; [`require_read`] runs before each
//! operation whose table entry (`routes::ROUTES`) needs `read`, so the permission the
//! OpenAPI document states is the one enforced; the handlers call the checks below for
//! the capability their write needs (`allow`), for
//! ownership beyond grants (`owns_registration`, `owns_instance`, `declares_externals`),
//! and `not_owner` to refuse. Refusals are `401` (no verified principal: counted and
//! logged, never audited) or `403` (counted, logged and audited folded per principal).
//! `authenticate` leaves the verified principal on the response for the access log
//! (`access_log`), whatever the answer.

use std::sync::{Arc, PoisonError};

use axum::extract::{Request as HttpRequest, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use waymark_certs::grpc::PeerInfo;
use waymark_core::model::{InstanceId, RegionName, ServiceName};
use waymark_registry::acl::{Action, Principal};
use waymark_registry::state::Registration;

use super::access_log::LoggedPrincipal;
use super::{ApiError, ApiResult, ApiState, DENIAL_FLUSH_EVERY};
use crate::authority::clock::now_ms;
use crate::authority::principal::{Caller, Credential, principal_of};

/// Authenticates every request that reaches it, and leaves the verified [`Caller`] for
/// what runs next; what the caller may do is decided per operation.
pub(super) async fn authenticate(
    State(s): State<ApiState>,
    mut request: HttpRequest,
    next: Next,
) -> Response {
    let peer = request.extensions().get::<PeerInfo>().cloned();
    let caller = match s.caller(peer.as_ref(), request.headers()) {
        Ok(caller) => caller,
        Err(e) => return e.into_response(),
    };
    // For the access log: who this was, whatever the answer.
    let logged = LoggedPrincipal(caller.actor());
    request.extensions_mut().insert(caller);
    with_principal(next.run(request).await, logged)
}

/// Authorises an operation that needs `read` (mounted on exactly those by
/// `routes::mount`); runs after [`authenticate`], so a caller is always there.
pub(super) async fn require_read(
    State(s): State<ApiState>,
    request: HttpRequest,
    next: Next,
) -> Response {
    let Some(caller) = request.extensions().get::<Caller>() else {
        // Mounted outside `authenticate`: refuse rather than serve unauthenticated.
        return s
            .unauthenticated("unauthenticated", "no verified principal".into())
            .into_response();
    };
    let what = format!("{} {}", request.method(), request.uri().path());
    if let Err(e) = s.allow(caller, Action::Read, &what, None) {
        return e.into_response();
    }
    next.run(request).await
}

fn with_principal(mut response: Response, logged: LoggedPrincipal) -> Response {
    response.extensions_mut().insert(logged);
    response
}

impl ApiState {
    /// The request's verified principal: the listener's certificate identity, else a
    /// bearer token. `401` without either; a certificate always wins over a token.
    pub(super) fn caller(&self, peer: Option<&PeerInfo>, headers: &HeaderMap) -> ApiResult<Caller> {
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

    pub(super) fn unauthenticated(&self, reason: &str, message: String) -> ApiError {
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
    pub(super) fn allow(
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
    pub(super) fn deny(
        &self,
        caller: &Caller,
        needed: String,
        what: &str,
        service: Option<&ServiceName>,
    ) {
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
    pub(super) fn not_owner(&self, caller: &Caller, what: &str, message: String) -> ApiError {
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
    pub(super) fn owns_registration(
        &self,
        caller: &Caller,
        r: &Registration,
        what: &str,
    ) -> ApiResult<()> {
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
    pub(super) fn owns_instance(
        &self,
        caller: &Caller,
        id: &InstanceId,
        what: &str,
    ) -> ApiResult<()> {
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
    pub(super) fn declares_externals(&self, caller: &Caller, what: &str) -> ApiResult<()> {
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
}
