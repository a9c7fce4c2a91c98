//! Group commit's driver: the API's registry commands go through one task that proposes
//! them to Raft in batches ([`waymark_registry::batch::GroupCommit`] decides what goes
//! together) and answers every caller with its own command's outcome, once the entry
//! holding it committed. A caller is never answered before its command committed, and a
//! batch that failed to commit fails every caller in it with the same error.

use std::sync::Arc;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument as _, debug, info_span};
use waymark_registry::batch::{Full, GroupCommit, GroupCommitConfig};
use waymark_registry::machine::{Refusal, Request, Response};
use waymark_registry::state::{Applied, Stamped};

use super::metrics::AuthorityMetrics;
use super::raft::{Member, RaftNode, WriteError};

/// Commands queued on the way to the batching task; beyond it a caller is refused at once.
const CHANNEL: usize = 1024;

/// Why a command was not committed (or its outcome is unknown).
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommitError {
    /// This member is not the leader; nothing was proposed. Redirect to `leader` if known.
    #[error("not the leader")]
    NotLeader {
        /// The leader, when known.
        leader: Option<(u64, Member)>,
    },
    /// Raft refused or failed the entry holding it; nothing is promised about it unless
    /// the error says so.
    #[error(transparent)]
    Write(Arc<WriteError>),
    /// It committed, and applying it failed (a bug the store caught).
    #[error("the write committed but failed to apply: {0}")]
    ApplyFailed(String),
    /// The entry committed with an answer that does not fit the batch (a bug).
    #[error("unexpected answer to a registry batch: {0}")]
    Unexpected(String),
    /// Too many commands are waiting already; nothing was proposed.
    #[error(transparent)]
    Full(#[from] Full),
    /// The batching task is gone (the member is stopping); nothing was proposed.
    #[error("the member is stopping")]
    Stopped,
}

type Outcome = Result<Result<Applied, Refusal>, CommitError>;

struct Submitted {
    stamped: Stamped,
    /// Its encoded size, which bounds a batch's.
    bytes: usize,
    reply: oneshot::Sender<Outcome>,
}

/// The handle the API holds; cloning it shares the one batching task.
#[derive(Debug, Clone)]
pub struct Committer {
    tx: mpsc::Sender<Submitted>,
}

impl Committer {
    /// Start the batching task over `raft` (needs a Tokio runtime). It ends when every
    /// handle is dropped and the entries in flight are answered.
    /// Each entry proposed counts in `metrics` (entries, commands, time to outcome).
    pub fn start(raft: RaftNode, config: GroupCommitConfig, metrics: AuthorityMetrics) -> Self {
        let (tx, rx) = mpsc::channel(CHANNEL);
        tokio::spawn(drive(raft, rx, config, metrics).instrument(info_span!("group_commit")));
        Self { tx }
    }

    /// Commit one registry command and wait for its own outcome.
    pub async fn commit(&self, stamped: Stamped) -> Outcome {
        let bytes = super::raft::codec::encode(&stamped).map_or(0, |v| v.len());
        let (reply, answer) = oneshot::channel();
        self.tx
            .try_send(Submitted {
                stamped,
                bytes,
                reply,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => CommitError::Full(Full { waiting: CHANNEL }),
                mpsc::error::TrySendError::Closed(_) => CommitError::Stopped,
            })?;
        answer.await.unwrap_or(Err(CommitError::Stopped))
    }
}

async fn drive(
    raft: RaftNode,
    mut rx: mpsc::Receiver<Submitted>,
    config: GroupCommitConfig,
    metrics: AuthorityMetrics,
) {
    let mut core = GroupCommit::new(config);
    let mut writes = FuturesUnordered::new();
    let mut open = true;
    loop {
        while let Some(batch) = core.next_batch() {
            writes.push(write(raft.clone(), batch, &metrics));
        }
        if !open && writes.is_empty() && core.waiting() == 0 {
            return;
        }
        tokio::select! {
            submitted = rx.recv(), if open => match submitted {
                Some(s) => {
                    let bytes = s.bytes;
                    if let Err((full, s)) = core.submit(s, bytes) {
                        let _ = s.reply.send(Err(CommitError::Full(full)));
                    }
                }
                None => open = false,
            },
            Some(()) = writes.next(), if !writes.is_empty() => core.finished(),
        }
    }
}

/// Propose one batch (a lone command as its own entry, as before batching) and answer its
/// callers.
async fn write(raft: RaftNode, batch: Vec<Submitted>, metrics: &AuthorityMetrics) {
    let (commands, replies): (Vec<Stamped>, Vec<_>) =
        batch.into_iter().map(|s| (s.stamped, s.reply)).unzip();
    let size = commands.len();
    metrics.registry_commit_entries.inc();
    metrics.registry_commit_commands.inc_by(size as u64);
    let proposed = tokio::time::Instant::now();
    let request = match <[Stamped; 1]>::try_from(commands) {
        Ok([one]) => Request::Registry(one),
        Err(commands) => Request::Batch { commands },
    };
    let outcomes: Vec<Outcome> = match raft.write(request).await {
        Ok(Response::Registry { outcome }) if size == 1 => vec![Ok(outcome)],
        Ok(Response::Batch { outcomes }) if outcomes.len() == size => {
            outcomes.into_iter().map(Ok).collect()
        }
        Ok(Response::ApplyFailed { message }) => {
            vec![Err(CommitError::ApplyFailed(message)); size]
        }
        Ok(other) => vec![Err(CommitError::Unexpected(format!("{other:?}"))); size],
        Err(WriteError::NotLeader { leader }) => vec![Err(CommitError::NotLeader { leader }); size],
        Err(e) => vec![Err(CommitError::Write(Arc::new(e))); size],
    };
    let took = proposed.elapsed();
    metrics.registry_commit_seconds.observe(took.as_secs_f64());
    debug!(
        commands = size,
        took_ms = took.as_millis() as u64,
        "registry batch answered"
    );
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        let _ = reply.send(outcome);
    }
}
