//! Access control: `GET /v1/acl/whoami` (any authenticated principal),
//! `POST /v1/acl/bootstrap` (once, by an operator's certificate), grants
//! (`GET|POST /v1/acl/grants`, `POST /v1/acl/grants/revoke`) and tokens
//! (`GET|POST /v1/acl/tokens`, `DELETE /v1/acl/tokens/{name}`). Every change needs `acl`
//! and is audited whether applied or refused; a token's secret is returned once and only
//! its digest is committed.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use waymark_registry::acl::{
    AclApplied, AclCommand, Action, Capability, Grant, Grantee, Principal, TokenRecord,
};
use waymark_registry::machine::{AuditEntry, AuditKind};
use waymark_registry::state::{Applied, Command};

use super::{ApiError, ApiResult, ApiState, Body, TOKEN_TTL_S_MAX, ok, reply};
use crate::authority::clock::now_ms;
use crate::authority::fields;
use crate::authority::principal::{Caller, Credential};

/// A grant to add or revoke (`POST /v1/acl/grants`, `POST /v1/acl/grants/revoke`).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct GrantBody {
    to: Grantee,
    can: Capability,
}

/// `POST /v1/acl/tokens`: a token to mint.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MintToken {
    /// The token's name (`token/<name>` in grants).
    name: String,
    /// Lifetime in seconds, at most a year.
    #[schemars(range(min = 1, max = TOKEN_TTL_S_MAX))]
    ttl_s: u64,
    /// What the token is for, for people.
    #[serde(default)]
    description: String,
    /// Capabilities granted to the token at once.
    #[serde(default)]
    grants: Vec<Capability>,
}

/// `201` to a minted token: its bearer form, shown this once (only its digest is kept).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct MintedToken {
    name: String,
    /// `wmt.<name>.<secret>`: send it as `Authorization: Bearer …`.
    token: String,
    /// When it stops working, Unix ms.
    expires_at_ms: u64,
    /// The capabilities granted to it.
    grants: Vec<Capability>,
}

/// What an access-control change did.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct AclAppliedBody {
    applied: AclApplied,
}

/// `GET /v1/acl/whoami`: the caller as the API sees it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Whoami {
    /// The verified principal (`operator/alice`, `node/n1`, `token/ci`, …).
    principal: String,
    /// How it proved it.
    credential: CredentialKind,
    /// The grants that apply to it in this region.
    grants: Vec<Grant>,
}

/// How a principal proved who it is.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum CredentialKind {
    /// A client certificate the listener verified.
    Certificate,
    /// A bearer token.
    Token,
}

/// `GET /v1/acl/grants`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Grants {
    /// Whether `POST /v1/acl/bootstrap` has run.
    bootstrapped: bool,
    grants: Vec<Grant>,
}

/// One token of `GET /v1/acl/tokens` (never its secret).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct TokenSummary {
    name: String,
    /// The principal that minted it.
    created_by: String,
    /// Unix ms.
    created_at_ms: u64,
    /// Unix ms.
    expires_at_ms: u64,
    /// Past `expires_at_ms` (it no longer authenticates).
    expired: bool,
    description: String,
}

impl ApiState {
    /// Commit an access-control change and audit it, granted or refused.
    pub(super) async fn acl_change(
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
pub(super) async fn whoami(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let grants: Vec<Grant> = s.raft.with_state(|state, _| {
        state
            .registry()
            .acl()
            .grants_of(&caller.principal, &s.region)
            .cloned()
            .collect()
    });
    ok(&Whoami {
        principal: caller.actor(),
        credential: match caller.credential {
            Credential::Certificate => CredentialKind::Certificate,
            Credential::Token => CredentialKind::Token,
        },
        grants,
    })
}

/// The first grants of a region, once: an operator presenting its certificate gets every
/// capability, and the region's node agents read and own-node registration.
pub(super) async fn acl_bootstrap(
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
    Ok(ok(&AclAppliedBody { applied }))
}

pub(super) async fn list_grants(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Response> {
    s.allow(&caller, Action::Acl, "GET /v1/acl/grants", None)?;
    let (bootstrapped, grants): (bool, Vec<Grant>) = s.raft.with_state(|state, _| {
        let acl = state.registry().acl();
        (acl.is_bootstrapped(), acl.grants().cloned().collect())
    });
    Ok(ok(&Grants {
        bootstrapped,
        grants,
    }))
}

pub(super) async fn add_grant(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    change_grant(&s, &caller, &uri, &body, true).await
}

pub(super) async fn revoke_grant(
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
    Ok(ok(&AclAppliedBody { applied }))
}

pub(super) async fn list_tokens(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Response> {
    s.allow(&caller, Action::Acl, "GET /v1/acl/tokens", None)?;
    let now = now_ms();
    let tokens: Vec<TokenSummary> = s.raft.with_state(|state, _| {
        state
            .registry()
            .acl()
            .tokens()
            .map(|t| TokenSummary {
                name: t.name.clone(),
                created_by: t.created_by.clone(),
                created_at_ms: t.created_at_ms,
                expires_at_ms: t.expires_at_ms,
                expired: t.expires_at_ms <= now,
                description: t.description.clone(),
            })
            .collect()
    });
    Ok(ok(&tokens))
}

/// Mint a token: the secret is generated here, returned once in the bearer form, and
/// only its digest is committed.
pub(super) async fn mint_token(
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
    Ok(reply(
        StatusCode::CREATED,
        &MintedToken {
            token: waymark_registry::acl::bearer(&m.name, &secret),
            name: m.name,
            expires_at_ms,
            grants: m.grants,
        },
    ))
}

pub(super) async fn remove_token(
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
    Ok(ok(&AclAppliedBody { applied }))
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
