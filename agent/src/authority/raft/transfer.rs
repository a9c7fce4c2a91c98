//! Leadership transfer, as etcd's `MoveLeader` does it, on openraft 0.9 (which has no
//! transfer API of its own):
//!
//! ```text
//! leader: check target is a voter ─► hold new writes ─► wait target matched == last log
//!      ─► POST /raft/elect to target ─► target: trigger().elect() (term + 1)
//!      ─► leader steps down on the target's higher vote ─► target wins ─► release writes
//! ```
//!
//! Writes are held, not refused, while a transfer runs ([`RaftNode::write`] waits for the
//! transfer to end), so the target's log stays complete and a client sees a redirect to
//! the new leader, never an error. Everything is bounded: catching up by
//! [`TRANSFER_CATCH_UP`], the election by [`TRANSFER_WAIT`]; past either, writes resume
//! and the caller is told what happened.
//!
//! The target's first election is refused by the members still inside the old leader's
//! lease; the old leader steps down when the target refuses its next heartbeat with the
//! higher term, and the target's next round (one election timeout later) wins with the
//! old leader's vote (no member holds a longer log). The old leader stands for no
//! election while the transfer runs, or it would time out as early and win the term back.
//!
//! The target stands without a pre-vote round (the members inside the old leader's lease
//! would refuse one), as etcd's `MoveLeader` campaigns: at once, and again at every
//! election timeout until it leads ([`super::prevote::PreVote::handle_stand`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Member, RaftNode};

/// How long the leader waits, writes held, for the target to match its last log entry.
pub const TRANSFER_CATCH_UP: Duration = Duration::from_secs(5);
/// How long the leader waits for the target to lead once it was asked to stand.
pub const TRANSFER_WAIT: Duration = Duration::from_secs(15);
/// How long the call asking the target to stand may take.
const ELECT_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// What a transfer did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Transferred {
    /// The member that led.
    pub from: u64,
    /// The member asked to lead.
    pub to: u64,
    /// The member leading now.
    pub leader: u64,
    /// The term it leads in.
    pub term: u64,
    /// How long the transfer took, writes held for all of it.
    pub duration_ms: u64,
}

/// Why a transfer did not happen. Writes resume either way.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// Not the leader; ask `leader`. Nothing changed.
    #[error("not the leader")]
    NotLeader {
        /// The leader, when known.
        leader: Option<(u64, Member)>,
    },
    /// The target is not a member. Nothing changed.
    #[error("member {0} is not in the group")]
    UnknownMember(u64),
    /// The target is a learner: it cannot lead. Nothing changed.
    #[error("member {0} is a learner, not a voter")]
    NotVoter(u64),
    /// No other voter to transfer to. Nothing changed.
    #[error("no other voter to lead")]
    NoTarget,
    /// Another transfer is running on this member. Nothing changed.
    #[error("a leadership transfer is already in progress")]
    InProgress,
    /// The target did not match the leader's log in time. Nothing changed; retry, or pick
    /// a member that is caught up.
    #[error("member {to} did not catch up within {TRANSFER_CATCH_UP:?}")]
    NotCaughtUp {
        /// The target.
        to: u64,
    },
    /// The target could not be asked to stand (unreachable, or refused). Nothing
    /// changed; this member still leads.
    #[error("member {to} could not be asked to stand: {message}")]
    Unreachable {
        /// The target.
        to: u64,
        /// Why.
        message: String,
    },
    /// The target stood but did not lead within [`TRANSFER_WAIT`]: an election may
    /// have gone to another member, or may still be running. Read the peers.
    #[error(
        "member {to} was asked to stand but leads no group after {TRANSFER_WAIT:?} (leader now: {leader:?})"
    )]
    NotElected {
        /// The target.
        to: u64,
        /// The leader this member knows now.
        leader: Option<u64>,
    },
}

impl TransferError {
    /// The API's machine-readable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotLeader { .. } => "not_leader",
            Self::UnknownMember(_) => "unknown_member",
            Self::NotVoter(_) => "not_voter",
            Self::NoTarget => "no_target",
            Self::InProgress => "transfer_in_progress",
            Self::NotCaughtUp { .. } => "not_caught_up",
            Self::Unreachable { .. } => "target_unreachable",
            Self::NotElected { .. } => "not_elected",
        }
    }
}

/// The body of `/raft/elect`: the leader asking.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ElectRequest {
    /// The leader; its certificate must name it, and the target must know it as leader.
    pub from: u64,
}

/// Ends the hold on writes, and lets this member stand for election again, when the
/// transfer ends, however it ends (a dropped request included).
struct Held<'a> {
    writes: &'a tokio::sync::watch::Sender<bool>,
    elections: &'a super::elections::Elections,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.elections.suppress(false);
        self.writes.send_replace(false);
    }
}

impl RaftNode {
    /// Move leadership to voter `to` (or, without one, to the voter with the highest
    /// matched index, the lowest id on a tie). Leader only.
    pub async fn transfer_leader(&self, to: Option<u64>) -> Result<Transferred, TransferError> {
        let started = tokio::time::Instant::now();
        if !self.is_leader() {
            return Err(TransferError::NotLeader {
                leader: self.leader(),
            });
        }
        let (to, target) = self.transfer_target(to)?;
        if self.transfer.send_replace(true) {
            // Someone else's hold: leave it in force.
            return Err(TransferError::InProgress);
        }
        let _held = Held {
            writes: &self.transfer,
            elections: &self.elections,
        };
        // Once deposed by the target's higher term, this member would otherwise time out
        // as soon as the target and win the term back (its log is as long): it stays out
        // of elections until the transfer ends.
        self.elections.suppress(true);
        // Writes already past the hold finish first, and none starts until the transfer
        // ends: the target, once caught up, stays so (its log at least as long as any).
        let _proposals = tokio::time::timeout(
            TRANSFER_CATCH_UP,
            std::sync::Arc::clone(&self.proposals).write_owned(),
        )
        .await
        .map_err(|_| TransferError::NotCaughtUp { to })?;
        tracing::info!(node_id = self.id, to, "leadership transfer: writes held");
        self.wait_caught_up(to).await?;
        self.ask_to_stand(to, &target).await?;
        let mut metrics = self.raft.metrics();
        let led = tokio::time::timeout(
            TRANSFER_WAIT,
            metrics.wait_for(|m| m.current_leader == Some(to)),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        let (leader, term) = {
            let m = metrics.borrow();
            (m.current_leader, m.current_term)
        };
        if !led {
            return Err(TransferError::NotElected { to, leader });
        }
        let done = Transferred {
            from: self.id,
            to,
            leader: to,
            term,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        tracing::info!(
            node_id = self.id,
            to,
            term,
            duration_ms = done.duration_ms,
            "leadership transferred"
        );
        Ok(done)
    }

    /// Whether this member is moving its leadership away: writes wait, and requests for
    /// the leader are taken in to wait too (see [`RaftNode::write`]).
    pub fn transferring(&self) -> bool {
        *self.transfer.borrow()
    }

    /// Returns once no transfer holds writes on this member (bounded by the transfer's
    /// own bounds).
    pub(super) async fn transfer_settled(&self) {
        let mut rx = self.transfer.subscribe();
        // The sender lives as long as `self`.
        let _ = rx.wait_for(|held| !*held).await;
    }

    fn transfer_target(&self, to: Option<u64>) -> Result<(u64, Member), TransferError> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        let voter = |id: u64| membership.voter_ids().any(|v| v == id);
        let id = match to {
            Some(id) => {
                if membership.get_node(&id).is_none() {
                    return Err(TransferError::UnknownMember(id));
                }
                if !voter(id) {
                    return Err(TransferError::NotVoter(id));
                }
                id
            }
            None => {
                let matched = |id: u64| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(&id).copied().flatten())
                        .map(|l| l.index)
                };
                membership
                    .voter_ids()
                    .filter(|&id| id != self.id)
                    .max_by_key(|&id| (matched(id), std::cmp::Reverse(id)))
                    .ok_or(TransferError::NoTarget)?
            }
        };
        if id == self.id {
            return Err(TransferError::NoTarget);
        }
        let member = membership
            .get_node(&id)
            .cloned()
            .ok_or(TransferError::UnknownMember(id))?;
        Ok((id, member))
    }

    async fn wait_caught_up(&self, to: u64) -> Result<(), TransferError> {
        let mut metrics = self.raft.metrics();
        let caught_up = tokio::time::timeout(
            TRANSFER_CATCH_UP,
            metrics.wait_for(|m| {
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&to).copied().flatten())
                    .map(|l| l.index);
                matched.is_some() && matched == m.last_log_index
            }),
        )
        .await;
        match caught_up {
            Ok(Ok(_)) => Ok(()),
            _ => Err(TransferError::NotCaughtUp { to }),
        }
    }

    async fn ask_to_stand(&self, to: u64, target: &Member) -> Result<(), TransferError> {
        let unreachable = |message: String| TransferError::Unreachable { to, message };
        let mut client = crate::api_client::ApiClient::new(&target.raft_addr, None)
            .with_timeout(ELECT_CALL_TIMEOUT);
        if let Some(tls) = &self.tls {
            client = client.with_tls(std::sync::Arc::clone(tls));
        }
        let body = serde_json::to_value(ElectRequest { from: self.id })
            .map_err(|e| unreachable(e.to_string()))?;
        let answer = client
            .send(http::Method::POST, super::network::ELECT_PATH, Some(&body))
            .await
            .map_err(|e| unreachable(format!("{e:#}")))?;
        if !answer.status.is_success() {
            return Err(unreachable(format!(
                "{}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            )));
        }
        Ok(())
    }
}
