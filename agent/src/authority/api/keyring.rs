//! Online gossip key rotation: `GET /v1/operator/keyring` (every pool member's key ids)
//! and `POST /v1/operator/keyring` (`{"op": "install"|"use"|"remove", "key": …}`), led by
//! the leader across every authority member and every connected node agent
//! (`authority/keyring/`). Both need the `raft` grant, as the other operator routes do,
//! and are answered by the leader (a follower redirects): the node agents' sessions are
//! there. A change is audited with its actor and the key's id; key material is never
//! answered, logged or audited.
//!
//! Bad input (an unknown op, a key that is not 32 bytes of hex or base64, a key id where
//! install needs the key) is refused with `400` before anyone is asked. A `use` or `remove`
//! that would strand a pool member (the key not installed everywhere, still primary
//! somewhere, or a member that did not say) is refused with `409`, nothing changed;
//! `"force": true` leaves members that did not answer behind.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse as _, Response};
use serde::Deserialize;
use serde_json::json;
use waymark_registry::acl::Action;
use waymark_registry::machine::{AuditEntry, AuditKind};

use super::{ApiError, ApiResult, ApiState, Body};
use crate::authority::clock::now_ms;
use crate::authority::keyring::{KeyringPool, PoolReport};
use crate::authority::principal::Caller;
use crate::gossip::rotation::KeyringOp;
use crate::gossip::{Key, KeyId};

impl ApiState {
    /// Serve the keyring routes from `pool`.
    pub fn with_keyring(mut self, pool: Arc<KeyringPool>) -> Self {
        self.setup().keyring = Some(pool);
        self
    }
}

/// The body of `POST /v1/operator/keyring`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct KeyringBody {
    /// `install`, `use` or `remove`.
    #[schemars(extend("enum" = ["install", "use", "remove"]))]
    op: String,
    /// The key (64 hex digits or base64 of 32 bytes); `use` and `remove` also take its id.
    #[serde(default)]
    key: Option<String>,
    /// The key's id (16 hex digits), for `use` and `remove`.
    #[serde(default)]
    key_id: Option<String>,
    /// Go on when some pool members did not answer the check before `use` or `remove`.
    #[serde(default)]
    force: bool,
}

/// `GET /v1/operator/keyring`: the key ids every pool member holds.
pub(super) async fn list(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> ApiResult<Response> {
    s.allow(&caller, Action::Raft, "GET /v1/operator/keyring", None)?;
    s.leader_only(&uri)?;
    let pool = s.keyring_pool()?;
    Ok(axum::Json(pool.list().await.to_json()).into_response())
}

/// `POST /v1/operator/keyring`: install, use or remove a key across the pool.
pub(super) async fn operate(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    s.allow(&caller, Action::Raft, "POST /v1/operator/keyring", None)?;
    s.leader_only(&uri)?;
    let pool = s.keyring_pool()?;
    let ask: KeyringBody = s.body(&body)?;
    let op = parse_op(&ask).map_err(|e| s.refuse(e))?;
    let label = op.label();
    let key_id = op.key_id().map(|k| k.to_string());
    match pool.apply(op, ask.force).await {
        Ok(report) => {
            let detail = audit_detail(&report, ask.force);
            let outcome = if report.complete() {
                "applied"
            } else {
                "partial"
            };
            s.audit_write(record(&caller, outcome, detail)).await?;
            tracing::info!(actor = %caller.actor(), op = label, key_id = key_id.as_deref(), answered = report.answered(), total = report.targets.len(), "gossip keyring operation led");
            Ok(axum::Json(report.to_json()).into_response())
        }
        Err(refusal) => {
            let detail = json!({
                "operation": format!("keyring_{label}"),
                "key_id": key_id,
                "reason": refusal.reason(),
            });
            s.audit_write(record(&caller, "refused", detail)).await?;
            Err(s.refuse(ApiError::new(
                StatusCode::CONFLICT,
                refusal.reason(),
                Some("key"),
                refusal.to_string(),
            )))
        }
    }
}

impl ApiState {
    fn keyring_pool(&self) -> ApiResult<Arc<KeyringPool>> {
        self.keyring.clone().ok_or_else(|| {
            self.refuse(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_keyring_pool",
                None,
                "this member leads no gossip keyring operations",
            ))
        })
    }
}

/// The operation a body asks for, or a `400` naming the field at fault.
fn parse_op(ask: &KeyringBody) -> Result<KeyringOp, ApiError> {
    let bad = |field: &str, reason: &str, message: String| {
        ApiError::new(StatusCode::BAD_REQUEST, reason, Some(field), message)
    };
    let text = match (&ask.key, &ask.key_id) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "key_id",
                "key_and_key_id",
                "give key or key_id, not both".into(),
            ));
        }
        (Some(t), None) | (None, Some(t)) => Some(t.as_str()),
        (None, None) => None,
    };
    let field = if ask.key_id.is_some() {
        "key_id"
    } else {
        "key"
    };
    let Some(text) = text else {
        return Err(bad(
            "key",
            "missing_key",
            format!("{}: name the key", ask.op),
        ));
    };
    let bad_key = |e: crate::gossip::KeyError| bad(field, "bad_key", format!("{field}: {e}"));
    match ask.op.as_str() {
        "install" => {
            if ask.key_id.is_some() || looks_like_id(text) {
                return Err(bad(
                    field,
                    "key_required",
                    "install needs the key itself (64 hex digits or base64), not its id".into(),
                ));
            }
            Ok(KeyringOp::Install(Key::parse(text).map_err(bad_key)?))
        }
        "use" | "remove" => {
            let id = if looks_like_id(text) {
                KeyId::parse(text).map_err(bad_key)?
            } else if ask.key_id.is_some() {
                return Err(bad_key(crate::gossip::KeyError::BadEncoding));
            } else {
                Key::parse(text).map_err(bad_key)?.id()
            };
            Ok(if ask.op == "use" {
                KeyringOp::Use(id)
            } else {
                KeyringOp::Remove(id)
            })
        }
        other => Err(bad(
            "op",
            "unknown_op",
            format!("op: {other:?} is not install, use or remove"),
        )),
    }
}

/// 16 hex digits: a key id.
fn looks_like_id(text: &str) -> bool {
    let text = text.trim();
    text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

fn audit_detail(report: &PoolReport, force: bool) -> serde_json::Value {
    let failed: Vec<&str> = report
        .targets
        .iter()
        .filter(|t| {
            !matches!(
                t.outcome,
                crate::authority::keyring::report::TargetOutcome::Held { .. }
            )
        })
        .take(crate::authority::keyring::report::NAMES_IN_MESSAGE_MAX)
        .map(|t| t.name.as_str())
        .collect();
    json!({
        "operation": format!("keyring_{}", report.op),
        "key_id": report.key.map(|k| k.to_string()),
        "answered": report.answered(),
        "total": report.targets.len(),
        "not_applied": failed,
        "force": force,
    })
}

fn record(caller: &Caller, outcome: &str, detail: serde_json::Value) -> AuditEntry {
    AuditEntry {
        seq: 0,
        at_ms: now_ms(),
        kind: AuditKind::Reconciliation,
        actor: caller.actor(),
        service: None,
        instance: None,
        outcome: outcome.into(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn body(op: &str, key: Option<&str>, key_id: Option<&str>) -> KeyringBody {
        KeyringBody {
            op: op.into(),
            key: key.map(Into::into),
            key_id: key_id.map(Into::into),
            force: false,
        }
    }

    #[test]
    fn bad_keyring_requests_are_typed_refusals() {
        // Goal: every malformed request names its reason and field before anyone is asked.
        let hex = "11".repeat(32);
        let id = Key::parse(&hex).unwrap().id().to_string();
        for (ask, reason, field) in [
            (body("rotate", Some(&hex), None), "unknown_op", "op"),
            (body("install", None, None), "missing_key", "key"),
            (body("install", Some("abc"), None), "bad_key", "key"),
            (body("install", Some(&id), None), "key_required", "key"),
            (body("install", None, Some(&id)), "key_required", "key_id"),
            (
                body("use", Some(&hex), Some(&id)),
                "key_and_key_id",
                "key_id",
            ),
            (body("remove", None, Some("zz")), "bad_key", "key_id"),
        ] {
            let e = parse_op(&ask).unwrap_err();
            assert_eq!(
                (e.reason.as_str(), e.field.as_deref()),
                (reason, Some(field)),
                "{ask:?}"
            );
        }
    }

    #[test]
    fn use_and_remove_take_the_key_or_its_id() {
        // Goal: an operator may name a key by the id `keyring list` printed.
        let hex = "22".repeat(32);
        let id = Key::parse(&hex).unwrap().id();
        let by_key = parse_op(&body("use", Some(&hex), None)).unwrap();
        let by_id = parse_op(&body("use", None, Some(&id.to_string()))).unwrap();
        let id_in_key = parse_op(&body("remove", Some(&id.to_string()), None)).unwrap();
        assert_eq!(by_key, KeyringOp::Use(id));
        assert_eq!(by_id, KeyringOp::Use(id));
        assert_eq!(id_in_key, KeyringOp::Remove(id));
    }
}
