//! The leader's side of a pool-wide keyring operation: every authority member's own gossip
//! keyring (this one directly, the others over their Raft listeners) and every node agent
//! holding an evidence session (over that session), asked at once, each bounded by a
//! timeout.
//!
//! ```text
//! API ──apply(op)──► KeyringPool ── use/remove: list everyone first ──► precheck ──refused──► nothing changed
//!                        │ (one operation at a time)
//!                        ├──► this member's GossipKeyring
//!                        ├──► POST /raft/keyring {from, op} ──► each other member (mutual TLS,
//!                        │                                       the sender must lead it)
//!                        └──► KeyringBroker ──keyring_request──► each connected node agent
//!                        ◄── PoolReport: per target held / refused / failed, counts per key
//! ```
//!
//! Node agents that gossip holds alive but that hold no session here are reported as
//! failed (`no_session`): they cannot be reached, and the operator should know. A target
//! that runs no gossip (`no_gossip`) is not part of the pool and is left out.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use waymark_certs::grpc::PeerInfo;

use super::broker::KeyringBroker;
use super::report::{PoolRefusal, PoolReport, TargetKind, TargetOutcome, TargetResult, precheck};
use crate::authority::raft::{Member, RaftNode, RaftRpcMetrics, Senders};
use crate::evidence::KeyringOutcome;
use crate::gossip::codec::Key;
use crate::gossip::rotation::{KeyringOp, KeyringStatus};
use crate::gossip::{GossipKeyring, KeyId, Liveness, MemberState, Role};

/// The Raft listener's route for a member's own keyring.
pub const MEMBER_KEYRING_PATH: &str = "/raft/keyring";
/// How long the leader waits for another member's answer.
pub const MEMBER_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest body the member route reads (an operation and a key).
pub const MEMBER_BODY_MAX: usize = 4 * 1024;
/// The refusal of a target that runs no gossip: it is not in the pool.
pub const NO_GOSSIP: &str = "no_gossip";

/// See the module documentation. Shared by the API handlers.
#[derive(Debug)]
pub struct KeyringPool {
    id: u64,
    raft: RaftNode,
    broker: Arc<KeyringBroker>,
    local: Option<GossipKeyring>,
    members: Option<watch::Receiver<Vec<MemberState>>>,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// One pool operation at a time, so two never interleave their steps.
    running: tokio::sync::Mutex<()>,
}

impl KeyringPool {
    /// The pool as member `id` sees it: its Raft group, the nodes' sessions in `broker`,
    /// its own gossip (keyring and membership) if it gossips, and the client TLS its Raft
    /// RPCs present (`None` in plaintext).
    pub fn new(
        id: u64,
        raft: RaftNode,
        broker: Arc<KeyringBroker>,
        gossip: Option<&crate::gossip::Gossip>,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Self {
        Self {
            id,
            raft,
            broker,
            local: gossip.map(crate::gossip::Gossip::keyring),
            members: gossip.map(crate::gossip::Gossip::subscribe),
            tls,
            running: tokio::sync::Mutex::new(()),
        }
    }

    /// Every target's keys.
    pub async fn list(&self) -> PoolReport {
        let _one = self.running.lock().await;
        self.fan_out(&KeyringOp::List).await
    }

    /// Applies `op` to every target, after checking (for `use` and `remove`) that it
    /// strands none; `force` leaves targets that did not answer the check behind.
    pub async fn apply(&self, op: KeyringOp, force: bool) -> Result<PoolReport, PoolRefusal> {
        let _one = self.running.lock().await;
        if matches!(op, KeyringOp::Use(_) | KeyringOp::Remove(_)) {
            let listed = self.fan_out(&KeyringOp::List).await;
            precheck(&op, &listed.targets, force)?;
        }
        Ok(self.fan_out(&op).await)
    }

    async fn fan_out(&self, op: &KeyringOp) -> PoolReport {
        let local = async {
            match &self.local {
                Some(k) => Some(outcome_of(KeyringOutcome::of(k.apply(op.clone()).await))),
                None => None,
            }
        };
        let others = futures::future::join_all(
            self.other_members()
                .into_iter()
                .map(|(id, member)| async move { (id, self.ask_member(&member, op).await) }),
        );
        let connected = self.broker.connected();
        let nodes = futures::future::join_all(connected.iter().map(|node| async move {
            let outcome = match self.broker.ask(node, op.clone()).await {
                Ok(answer) => outcome_of(answer),
                Err(e) => failed(e.reason(), e.to_string()),
            };
            (node.to_string(), outcome)
        }));
        let (local, others, nodes) = tokio::join!(local, others, nodes);

        let mut targets = Vec::new();
        let mut push = |name: String, kind, outcome: TargetOutcome| {
            let outside =
                matches!(&outcome, TargetOutcome::Refused { reason, .. } if reason == NO_GOSSIP);
            if !outside {
                targets.push(TargetResult {
                    name,
                    kind,
                    outcome,
                });
            }
        };
        if let Some(outcome) = local {
            push(member_name(self.id), TargetKind::Authority, outcome);
        }
        for (id, outcome) in others {
            push(member_name(id), TargetKind::Authority, outcome);
        }
        for (name, outcome) in nodes {
            push(name, TargetKind::Agent, outcome);
        }
        for name in self.alive_agents_without_session(&connected) {
            let message =
                format!("gossip holds {name} alive, but it holds no evidence session here");
            push(name, TargetKind::Agent, failed("no_session", message));
        }
        PoolReport::new(op, targets)
    }

    fn other_members(&self) -> Vec<(u64, Member)> {
        let metrics = self.raft.watch_metrics();
        let m = metrics.borrow();
        m.membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != self.id)
            .map(|(id, member)| (*id, member.clone()))
            .collect()
    }

    fn alive_agents_without_session(
        &self,
        connected: &[waymark_core::model::NodeName],
    ) -> Vec<String> {
        let Some(members) = &self.members else {
            return Vec::new();
        };
        members
            .borrow()
            .iter()
            .filter(|m| !m.local && m.id.role == Role::Agent && m.state == Liveness::Alive)
            .filter(|m| !connected.contains(&m.id.name))
            .map(|m| m.id.name.to_string())
            .collect()
    }

    async fn ask_member(&self, member: &Member, op: &KeyringOp) -> TargetOutcome {
        let mut client =
            crate::api_client::ApiClient::new(&member.raft_addr, None).with_timeout(MEMBER_TIMEOUT);
        if let Some(tls) = &self.tls {
            client = client.with_tls(Arc::clone(tls));
        }
        let body = MemberKeyringRequest {
            from: self.id,
            op: WireOp::from(op),
        };
        let Ok(body) = serde_json::to_value(&body) else {
            return failed("encode_failed", "the request does not encode".into());
        };
        let answer = match client
            .send(http::Method::POST, MEMBER_KEYRING_PATH, Some(&body))
            .await
        {
            Ok(a) => a,
            Err(e) => return failed("unreachable", format!("{e:#}")),
        };
        if !answer.status.is_success() {
            let text = String::from_utf8_lossy(&answer.body);
            let text = crate::evidence::clipped(&text, 1024);
            return failed("refused_rpc", format!("{}: {text}", answer.status));
        }
        match serde_json::from_slice::<MemberKeyringAnswer>(&answer.body) {
            Ok(a) => a.into_outcome(),
            Err(e) => failed("bad_answer", e.to_string()),
        }
    }
}

/// A member's gossip name.
pub fn member_name(id: u64) -> String {
    format!("authority-{id}")
}

fn failed(reason: &str, message: String) -> TargetOutcome {
    TargetOutcome::Failed {
        reason: reason.to_owned(),
        message,
    }
}

fn outcome_of(answer: KeyringOutcome) -> TargetOutcome {
    match answer {
        KeyringOutcome::Held { status, changed } => TargetOutcome::Held { status, changed },
        KeyringOutcome::Refused { reason, message } => TargetOutcome::Refused { reason, message },
    }
}

// === the member route ===

/// `POST /raft/keyring`: the leader asks this member to apply an operation to its own
/// gossip keyring.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberKeyringRequest {
    /// The leader; its certificate must name it, and this member must follow it.
    from: u64,
    op: WireOp,
}

/// An operation as the member route carries it (over mutual TLS: the key in hex).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum WireOp {
    List,
    Install { key: String },
    Use { key_id: String },
    Remove { key_id: String },
}

impl From<&KeyringOp> for WireOp {
    fn from(op: &KeyringOp) -> Self {
        match op {
            KeyringOp::List => Self::List,
            KeyringOp::Install(key) => Self::Install {
                key: hex::encode(key.secret_bytes()),
            },
            KeyringOp::Use(id) => Self::Use {
                key_id: id.to_string(),
            },
            KeyringOp::Remove(id) => Self::Remove {
                key_id: id.to_string(),
            },
        }
    }
}

impl WireOp {
    fn into_op(self) -> Result<KeyringOp, crate::gossip::KeyError> {
        Ok(match self {
            Self::List => KeyringOp::List,
            Self::Install { key } => KeyringOp::Install(Key::from_hex(&key)?),
            Self::Use { key_id } => KeyringOp::Use(KeyId::parse(&key_id)?),
            Self::Remove { key_id } => KeyringOp::Remove(KeyId::parse(&key_id)?),
        })
    }
}

/// A member's answer: its keys now, or why not.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum MemberKeyringAnswer {
    Held {
        primary: String,
        keys: Vec<String>,
        changed: bool,
    },
    Refused {
        reason: String,
        message: String,
    },
}

impl MemberKeyringAnswer {
    fn of(outcome: KeyringOutcome) -> Self {
        match outcome {
            KeyringOutcome::Held { status, changed } => Self::Held {
                primary: status.primary.to_string(),
                keys: status.keys.iter().map(ToString::to_string).collect(),
                changed,
            },
            KeyringOutcome::Refused { reason, message } => Self::Refused { reason, message },
        }
    }

    fn into_outcome(self) -> TargetOutcome {
        match self {
            Self::Held {
                primary,
                keys,
                changed,
            } => {
                let keys: Result<Vec<KeyId>, _> = keys.iter().map(|k| KeyId::parse(k)).collect();
                match (KeyId::parse(&primary), keys) {
                    (Ok(primary), Ok(keys)) if keys.first() == Some(&primary) => {
                        TargetOutcome::Held {
                            status: KeyringStatus { primary, keys },
                            changed,
                        }
                    }
                    _ => failed(
                        "bad_answer",
                        "a member answered key ids that do not parse".into(),
                    ),
                }
            }
            Self::Refused { reason, message } => TargetOutcome::Refused { reason, message },
        }
    }
}

#[derive(Clone)]
struct RouteState {
    keyring: Option<GossipKeyring>,
    raft: RaftNode,
    senders: Senders,
    metrics: RaftRpcMetrics,
}

/// The member route, to merge into the Raft listener's router: `keyring` is this
/// member's own gossip keyring (`None` when it does not gossip); `senders` and `metrics`
/// as the Raft routes'.
pub fn member_router(
    keyring: Option<GossipKeyring>,
    raft: RaftNode,
    senders: Senders,
    metrics: RaftRpcMetrics,
) -> Router {
    Router::new()
        .route(MEMBER_KEYRING_PATH, post(member_keyring))
        .layer(axum::extract::DefaultBodyLimit::max(MEMBER_BODY_MAX))
        .with_state(RouteState {
            keyring,
            raft,
            senders,
            metrics,
        })
}

/// Applies the leader's operation to this member's keyring: only from the member its
/// certificate names, and only when that member is the leader this member follows.
async fn member_keyring(
    State(s): State<RouteState>,
    peer: Option<Extension<PeerInfo>>,
    Json(ask): Json<MemberKeyringRequest>,
) -> Response {
    let peer = peer.as_ref().map(|Extension(p)| p);
    let refuse = |status: StatusCode, reason: &str, message: String| {
        let body =
            serde_json::json!({"error": {"reason": reason, "field": "from", "message": message}});
        (status, Json(body)).into_response()
    };
    if let Err(refusal) = s.senders.check(peer, Some(ask.from)) {
        s.metrics.count(refusal.reason());
        tracing::warn!(
            claimed = ask.from,
            reason = refusal.reason(),
            "keyring rpc refused"
        );
        return refuse(StatusCode::FORBIDDEN, refusal.reason(), refusal.to_string());
    }
    let leader = s.raft.leader().map(|(id, _)| id);
    if leader != Some(ask.from) {
        let message = format!(
            "member {} is not the leader this member follows ({leader:?})",
            ask.from
        );
        return refuse(StatusCode::CONFLICT, "not_leader", message);
    }
    let outcome = match (ask.op.into_op(), &s.keyring) {
        (Err(e), _) => KeyringOutcome::refused("bad_key", &e.to_string()),
        (Ok(_), None) => KeyringOutcome::refused(NO_GOSSIP, "this member runs no gossip"),
        (Ok(op), Some(keyring)) => KeyringOutcome::of(keyring.apply(op).await),
    };
    Json(MemberKeyringAnswer::of(outcome)).into_response()
}
