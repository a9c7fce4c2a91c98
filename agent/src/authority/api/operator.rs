//! Raft operations for operators: `GET`/`PUT /v1/operator/snapshot` (backup and restore
//! of the replicated state, [`crate::authority::raft::backup`]) and
//! `POST /v1/operator/raft/transfer-leader`. All need the `raft` grant and are answered
//! by the leader (a follower redirects); each is audited with its actor.
//!
//! A backup is taken on the leader after a read barrier, so it holds everything committed
//! before the request. A restore is verified whole before anything is proposed, then
//! committed as one log entry that every member applies, so all end with the same state.
//! The entry restarts every lease's clock; every follower of the state (the leader's
//! [`LeaderTerm`], the xDS tier, blocking queries) resyncs as after an installed snapshot,
//! so the leader rebuilds its computed state from the restored one and releases views at
//! versions above everything published before the restore (the version floor is kept).
//! openraft 0.9 ignores an election a leader triggers, so the term goes on; see
//! docs/operations.md.
//!
//! [`LeaderTerm`]: waymark_registry::term::LeaderTerm

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use waymark_registry::acl::Action;
use waymark_registry::machine::{AuditEntry, AuditKind, Request, Response as Applied};

use super::{ApiError, ApiResult, ApiState, Body, ok};
use crate::authority::clock::now_ms;
use crate::authority::principal::Caller;
use crate::authority::raft::backup::{
    SNAPSHOT_CONTENT_TYPE, SNAPSHOT_INDEX_HEADER, SNAPSHOT_SHA256_HEADER, SNAPSHOT_TERM_HEADER,
};
use crate::authority::raft::{TransferError, Transferred, backup, codec};

/// `PUT /v1/operator/snapshot`'s answer: the backup now in force.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Restored {
    restored: RestoredBackup,
}

/// A restored backup, as its audit record names it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct RestoredBackup {
    /// Always `snapshot_restore`.
    operation: String,
    /// The index of the last log entry the backup reflects.
    index: Option<u64>,
    /// The term of that entry.
    term: Option<u64>,
    /// The backup's size.
    bytes: usize,
    /// SHA-256 of the backup's data, lower-case hex.
    sha256: String,
}

/// `POST /v1/operator/raft/transfer-leader`'s answer.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct TransferredBody {
    transferred: Transferred,
}

/// `GET /v1/operator/snapshot`: a consistent backup of the replicated state.
pub(super) async fn save(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> ApiResult<Response> {
    s.allow(&caller, Action::Raft, "GET /v1/operator/snapshot", None)?;
    s.leader_only(&uri)?;
    s.raft.ensure_linearizable().await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_linearizable",
            None,
            format!("the leader could not confirm it leads: {e}; retry"),
        )
    })?;
    let (state, applied) = s.raft.state_copy();
    // Encoding a whole region is CPU work: off the async workers.
    let data = tokio::task::spawn_blocking(move || codec::encode(&state))
        .await
        .map_err(|e| internal("encode_failed", e.to_string()))?
        .map_err(|e| internal("encode_failed", e.to_string()))?;
    let (index, term) = (applied.map(|a| a.0), applied.map(|a| a.1));
    let body = backup::encode(s.region.as_str(), index, term, &data);
    let sha256 = backup::sha256_hex(&body);
    s.audit_write(record(
        &caller,
        "saved",
        json!({"operation": "snapshot_save", "index": index, "term": term, "bytes": body.len(), "sha256": sha256}),
    ))
    .await?;
    let mut response = Bytes::from(body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(SNAPSHOT_CONTENT_TYPE),
    );
    for (name, value) in [
        (SNAPSHOT_INDEX_HEADER, index.map(|i| i.to_string())),
        (SNAPSHOT_TERM_HEADER, term.map(|t| t.to_string())),
        (SNAPSHOT_SHA256_HEADER, Some(sha256)),
    ] {
        if let Some(v) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
            headers.insert(name, v);
        }
    }
    Ok(response)
}

/// `PUT /v1/operator/snapshot`: verify a backup of this region and put it in force on
/// every member.
pub(super) async fn restore(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    s.allow(&caller, Action::Raft, "PUT /v1/operator/snapshot", None)?;
    s.leader_only(&uri)?;
    let region = s.region.to_string();
    let bytes = body.len();
    let verified = tokio::task::spawn_blocking(move || backup::verify(&body, &region))
        .await
        .map_err(|e| internal("verify_failed", e.to_string()))?;
    let (header, state) = verified.map_err(|e| {
        let status = match e {
            backup::BackupError::Region { .. }
            | backup::BackupError::Format(_)
            | backup::BackupError::State(_) => StatusCode::UNPROCESSABLE_ENTITY,
            _ => StatusCode::BAD_REQUEST,
        };
        s.refuse(ApiError::new(
            status,
            e.reason(),
            Some("body"),
            e.to_string(),
        ))
    })?;
    let written = s
        .raft
        .write(Request::Restore {
            at_ms: now_ms(),
            state: Box::new(state),
        })
        .await;
    match written {
        Ok(Applied::Restored) => {}
        Ok(other) => return Err(internal("unexpected_response", format!("{other:?}"))),
        Err(crate::authority::raft::WriteError::NotLeader { leader }) => {
            return Err(s.redirect(&uri, leader));
        }
        Err(e) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_committed",
                None,
                format!("the restore was not committed: {e}; retry"),
            ));
        }
    }
    let restored = RestoredBackup {
        operation: "snapshot_restore".into(),
        index: header.index,
        term: header.term,
        bytes,
        sha256: header.sha256,
    };
    let detail = serde_json::to_value(&restored).unwrap_or_default();
    s.audit_write(record(&caller, "restored", detail)).await?;
    tracing::info!(actor = %caller.actor(), index = ?restored.index, "state restored from a backup");
    Ok(ok(&Restored { restored }))
}

/// `POST /v1/operator/raft/transfer-leader`'s body (optional).
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TransferLeader {
    /// The voter to lead; absent: the most caught-up voter.
    #[serde(default)]
    to: Option<u64>,
}

/// `POST /v1/operator/raft/transfer-leader`: move leadership to a caught-up voter.
pub(super) async fn transfer_leader(
    State(s): State<ApiState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    Body(body): Body,
) -> ApiResult<Response> {
    s.allow(
        &caller,
        Action::Raft,
        "POST /v1/operator/raft/transfer-leader",
        None,
    )?;
    s.leader_only(&uri)?;
    let ask: TransferLeader = if body.is_empty() {
        TransferLeader::default()
    } else {
        s.body(&body)?
    };
    let result = s.raft.transfer_leader(ask.to).await;
    let detail = match &result {
        Ok(done) => json!({"operation": "transfer_leader", "transferred": done}),
        Err(e) => json!({"operation": "transfer_leader", "to": ask.to, "error": e.reason()}),
    };
    let outcome = if result.is_ok() { "applied" } else { "refused" };
    // This member may lead no more: the record goes to whoever does.
    if let Err(error) = s
        .raft
        .forward_audit(vec![record(&caller, outcome, detail)])
        .await
    {
        tracing::warn!(%error, "the leadership transfer's audit record was not committed");
    }
    match result {
        Ok(transferred) => Ok(ok(&TransferredBody { transferred })),
        Err(TransferError::NotLeader { leader }) => Err(s.redirect(&uri, leader)),
        Err(e) => {
            let status = match e {
                TransferError::UnknownMember(_) => StatusCode::NOT_FOUND,
                TransferError::NotVoter(_) | TransferError::NoTarget => {
                    StatusCode::UNPROCESSABLE_ENTITY
                }
                TransferError::InProgress => StatusCode::CONFLICT,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            Err(s.refuse(ApiError::new(status, e.reason(), Some("to"), e.to_string())))
        }
    }
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

fn internal(reason: &str, message: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, reason, None, message)
}
