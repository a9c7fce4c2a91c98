//! The authority's Raft group: openraft over redb storage and HTTP/JSON RPCs on each
//! member's own Raft listener (mutual TLS between the region's members, see [`tls`] and
//! [`admission`]; plaintext on loopback only).
//!
//! ```text
//! write(Request) ──► openraft leader ──► /raft/append ──► followers (redb log, fsync)
//!                         │ commit
//!                         ▼
//!              StateMachineStore::apply ──► AuthorityState (memory) ──► StateEvent (broadcast)
//! ```
//!
//! [`RaftNode`] is the handle the rest of the member uses. A write is acknowledged only
//! after it is committed on a quorum and applied locally (RPO 0, ADR-02). Every member's
//! state machine applies the same log, so [`RaftNode::state`] converges; modules that
//! follow the state subscribe to [`StateEvent`]s.
//!
//! On restart a member reloads its vote, log, committed index and last snapshot from the
//! redb file in its data directory and replays the committed tail.

pub mod admission;
pub mod backup;
pub mod codec;
mod elections;
mod network;
pub mod prevote;
pub mod recover;
pub mod snapshot_file;
mod store;
pub mod timings;
pub mod tls;
mod transfer;
pub mod wal;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Debug, Display};
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use openraft::error::{
    CheckIsLeaderError, ClientWriteError, ForwardToLeader, InitializeError,
    RaftError as OpenraftError,
};
use openraft::{ChangeMembers, Raft, RaftMetrics, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};

pub use self::admission::{RaftRpcMetrics, Senders};
pub use self::elections::ElectionMetrics;
pub use self::network::{
    APPEND_PATH, BODY_LIMIT_BYTES, CONNECT_TIMEOUT, HttpNetworkFactory, HttpPeer,
    LARGE_RPCS_IN_FLIGHT_MAX, RESPONSE_LIMIT_BYTES, SNAPSHOT_PATH, VOTE_BODY_LIMIT_BYTES,
    VOTE_PATH,
};
use self::store::Shared;
pub use self::store::{
    APPEND_BYTES_MAX, AppliedEntry, ApplyFailure, DB_FILE, LogStore, StateEvent, StateMachineStore,
    StoreError,
};
pub use self::transfer::{TRANSFER_CATCH_UP, TRANSFER_WAIT, TransferError, Transferred};
use waymark_registry::machine::{AuditEntry, AuthorityState, ReplayGate, Request, Response};

/// Capacity of the [`StateEvent`] channel; a subscriber further behind resyncs.
pub const EVENTS_CAPACITY: usize = 4096;
/// How long [`RaftNode::add_member`] waits for a new learner to catch up.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`RaftNode::shutdown`] waits for openraft's tasks to release the store.
pub const SHUTDOWN_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// Size of one snapshot chunk on the wire.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 4 * 1024 * 1024;
/// How long forwarding one batch of audit records to the leader may take.
pub const AUDIT_FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

openraft::declare_raft_types!(
    /// openraft's type configuration for the authority.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = u64,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Where to reach a member of the Raft group.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Member {
    /// `host:port` of the member's Raft listener, serving the `/raft/*` routes.
    pub raft_addr: String,
    /// `host:port` of the member's HTTP API (where writes are redirected to).
    pub api_addr: String,
}

impl Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raft={} api={}", self.raft_addr, self.api_addr)
    }
}

/// How to run this member's Raft.
#[derive(Debug, Clone)]
pub struct RaftConfig {
    /// This member's id, unique and stable for the life of the group.
    pub id: u64,
    /// Data directory holding the redb file.
    pub dir: PathBuf,
    /// Where peers reach this member.
    pub member: Member,
    /// Leader heartbeat interval.
    pub heartbeat: Duration,
    /// Shortest election timeout.
    pub election_min: Duration,
    /// Longest election timeout.
    pub election_max: Duration,
    /// Build a snapshot after this many log entries since the last one. Each snapshot
    /// encodes the whole state (tens of MB at the reference estate), so under a steady
    /// write load its cost is proportional to how often it comes; etcd's default is
    /// 100,000 entries. A member restarting replays at most this many entries.
    pub snapshot_every: u64,
    /// Build a snapshot, too, once this many encoded bytes were appended since the last
    /// one. Entries differ in size by four orders of magnitude (a renewal batch against
    /// the leader's observed state of a whole region), and a log file that grew by
    /// hundreds of MB made every durable append slower (at the reference estate, write
    /// throughput halved before 50,000 entries came); bounded by bytes, the file stays
    /// small.
    pub snapshot_log_bytes: u64,
    /// Log entries kept below a snapshot, so slightly lagging followers catch up from the
    /// log instead of a full snapshot.
    pub logs_kept_after_snapshot: u64,
    /// Log entries sent in one AppendEntries at most. openraft gives every AppendEntries
    /// one heartbeat interval to complete, however many entries it carries, and a
    /// `Release` entry can carry whole views (tens of kB for a service of a few hundred
    /// instances): a batch of openraft's default 300 such entries cannot be encoded, sent,
    /// decoded and made durable within 250 ms, so a follower that fell that far behind
    /// would never catch up, and a group that needs it for its quorum would never commit
    /// again. Small batches keep each round trip within the heartbeat; the log reader
    /// also bounds each batch by bytes ([`APPEND_BYTES_MAX`]), and a batch that times out
    /// is sent again at half its entries.
    pub append_batch_max: u64,
    /// Mutual TLS to the peers' Raft listeners (a config from
    /// `waymark_certs::tls::client_config` with [`tls::peer_policy`] and ALPN `http/1.1`);
    /// `None` speaks plain HTTP (loopback development).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// The default of [`RaftConfig::snapshot_log_bytes`].
pub const SNAPSHOT_LOG_BYTES: u64 = 128 << 20;

/// How often a member looks at the bytes appended since its last snapshot.
const SNAPSHOT_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Call for a snapshot whenever more than `limit` bytes were appended since the last one,
/// until the member shuts down.
async fn snapshot_by_bytes(raft: Raft<TypeConfig>, shared: Shared, limit: u64) {
    let mut tick = tokio::time::interval(SNAPSHOT_CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let metrics = raft.metrics();
        // The core gone (its metrics sender dropped) or stopped: nothing left to call.
        if metrics.has_changed().is_err() || metrics.borrow().running_state.is_err() {
            return;
        }
        let appended = shared.log_bytes.load(std::sync::atomic::Ordering::Relaxed);
        if appended <= limit {
            continue;
        }
        tracing::info!(
            appended,
            limit,
            "log bytes since the last snapshot over the limit; building one"
        );
        if raft.trigger().snapshot().await.is_err() {
            return; // shut down
        }
        // openraft builds it in the background; look again only after it had the chance.
        shared
            .log_bytes
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The default of [`RaftConfig::append_batch_max`].
pub const APPEND_BATCH_MAX: u64 = 16;

impl RaftConfig {
    /// Defaults for member `id` in `dir`, reachable at `member`.
    pub fn new(id: u64, dir: PathBuf, member: Member) -> Self {
        Self {
            id,
            dir,
            member,
            heartbeat: Duration::from_millis(250),
            election_min: Duration::from_secs(1),
            election_max: Duration::from_secs(2),
            snapshot_every: 50_000,
            snapshot_log_bytes: SNAPSHOT_LOG_BYTES,
            logs_kept_after_snapshot: 1_000,
            append_batch_max: APPEND_BATCH_MAX,
            tls: None,
        }
    }

    fn to_openraft(&self) -> Result<openraft::Config, RaftError> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        openraft::Config {
            cluster_name: "waymark-authority".to_owned(),
            heartbeat_interval: ms(self.heartbeat),
            election_timeout_min: ms(self.election_min),
            election_timeout_max: ms(self.election_max),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.logs_kept_after_snapshot,
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
            max_payload_entries: self.append_batch_max,
            // The election timer is waymark's, with pre-vote ([`prevote`]): openraft's own
            // would bump the term of a member cut off from the others at every timeout.
            enable_elect: false,
            ..Default::default()
        }
        .validate()
        .map_err(|e| RaftError::Config(Box::new(e)))
    }
}

/// Errors of group operations (open, membership).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RaftError {
    /// The configuration is invalid. Nothing was started; fix the configuration.
    #[error("invalid raft configuration")]
    Config(#[source] Box<openraft::ConfigError>),
    /// The store could not be opened. Nothing was started.
    #[error("raft store")]
    Store(#[from] StoreError),
    /// This member is not the leader; retry on `leader` if known. Nothing changed.
    #[error("not the leader")]
    NotLeader {
        /// The leader, when known.
        leader: Option<(u64, Member)>,
    },
    /// The membership change was refused (another in progress, unknown learner, empty
    /// membership). Nothing changed; retry later or fix the request.
    #[error("membership change refused")]
    Membership(#[source] Box<openraft::error::ChangeMembershipError<u64>>),
    /// `initialize` named a membership without this member. Nothing changed.
    #[error("this member is not in the initial membership")]
    NotInMembers(#[source] Box<openraft::error::NotInMembers<u64, Member>>),
    /// A new learner did not catch up in time. It stays a learner; retry `add_member`
    /// once it is reachable, or `remove_member` it.
    #[error("member {id} did not catch up")]
    CatchUp {
        /// The learner.
        id: u64,
    },
    /// Raft stopped (storage failure, panic, shutdown). The member must restart.
    #[error("raft stopped")]
    Fatal(#[source] Box<openraft::error::Fatal<u64>>),
}

/// Errors of [`RaftNode::write`] and [`RaftNode::ensure_linearizable`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// This member is not the leader; nothing was proposed. Redirect or forward to
    /// `leader` if known, else retry after an election.
    #[error("not the leader")]
    NotLeader {
        /// The leader, when known.
        leader: Option<(u64, Member)>,
    },
    /// The leader could not confirm its leadership with a quorum (read barrier only).
    /// Retry later.
    #[error("no quorum")]
    NoQuorum(#[source] Box<openraft::error::QuorumNotEnough<u64>>),
    /// Raft stopped; the outcome of an in-flight write is unknown. The member must restart.
    #[error("raft stopped")]
    Fatal(#[source] Box<openraft::error::Fatal<u64>>),
    /// openraft refused the write for another reason; nothing was applied.
    #[error("write refused")]
    Refused(#[source] Box<openraft::error::ChangeMembershipError<u64>>),
}

impl From<openraft::error::Fatal<u64>> for RaftError {
    fn from(e: openraft::error::Fatal<u64>) -> Self {
        Self::Fatal(Box::new(e))
    }
}

impl From<openraft::error::Fatal<u64>> for WriteError {
    fn from(e: openraft::error::Fatal<u64>) -> Self {
        Self::Fatal(Box::new(e))
    }
}

/// A member's role in the group, as this member sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PeerRole {
    /// The current leader.
    Leader,
    /// A voter that is not the leader.
    Follower,
    /// A non-voting member receiving the log.
    Learner,
}

/// One member, for `waymark operator raft list-peers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PeerStatus {
    /// Member id.
    pub id: u64,
    /// Where it is reached.
    pub member: Member,
    /// Its role.
    pub role: PeerRole,
    /// The highest log index known to match the leader's log; on a follower, known only
    /// for itself (its last log index).
    pub matched_index: Option<u64>,
    /// How many entries it is behind the leader's last log; `None` when unknown (asked on
    /// a follower, or not yet replicated).
    pub lag: Option<u64>,
}

/// Handle to this member's Raft. Cheap to clone.
#[derive(Clone)]
pub struct RaftNode {
    id: u64,
    raft: Raft<TypeConfig>,
    shared: Shared,
    events: broadcast::Sender<StateEvent>,
    /// How this member calls its peers' Raft listeners (for [`RaftNode::forward_audit`]).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `true` while this member moves its leadership away: writes wait ([`transfer`]).
    transfer: Arc<watch::Sender<bool>>,
    /// The election timer with pre-vote ([`elections`]).
    elections: elections::Elections,
    /// Held shared by every write while it is proposed, and exclusively by a transfer for
    /// its whole run: a write that passed the transfer check just before it began cannot
    /// append behind the target's back once the target was found caught up.
    proposals: Arc<tokio::sync::RwLock<()>>,
}

impl Debug for RaftNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RaftNode")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

// === impl RaftNode ===

/// Wait until `gate` opens: the committed log re-applied, or its wait over.
async fn wait_for_replay(raft: &Raft<TypeConfig>, gate: &ReplayGate) {
    let Some(index) = gate.target() else {
        return;
    };
    let mut metrics = raft.metrics();
    loop {
        let applied = metrics.borrow_and_update().last_applied.map(|l| l.index);
        if gate.is_replayed(applied) {
            tracing::info!(index, "committed log re-applied");
            return;
        }
        if gate.is_open(tokio::time::Instant::now().into_std(), applied) {
            tracing::warn!(
                index,
                ?applied,
                "committed log not re-applied in time; serving what is applied"
            );
            return;
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            () = tokio::time::sleep_until(gate.deadline().into()) => {}
        }
    }
}

/// How long a starting member waits for the log it knew committed to be re-applied.
const REPLAY_WAIT: Duration = Duration::from_secs(60);

impl RaftNode {
    /// Open the store in `config.dir` (creating it) and start Raft. A member restarted on
    /// the same directory resumes with its vote, log and snapshot.
    pub async fn open(config: RaftConfig) -> Result<Self, RaftError> {
        let raft_config = Arc::new(config.to_openraft()?);
        let (events, _) = broadcast::channel(EVENTS_CAPACITY);
        let dir = config.dir.clone();
        let sender = events.clone();
        let (mut log, sm, shared) = tokio::task::spawn_blocking(move || store::open(&dir, sender))
            .await
            .map_err(StoreError::from)??;
        // What this member knew to be committed when it stopped: openraft re-applies it
        // at start. Until it has, the state machine is the last snapshot (or empty), and
        // an xDS tier serving from it would tell a reconnecting client that views it holds
        // were removed.
        let committed = openraft::storage::RaftLogStorage::read_committed(&mut log)
            .await
            .ok()
            .flatten()
            .map(|l| l.index);
        let elections = elections::Elections::new(prevote::PreVote::new(
            prevote::PreVoteConfig {
                id: config.id,
                election_min: config.election_min,
                election_max: config.election_max,
                seed: jitter_seed(config.id),
            },
            tokio::time::Instant::now().into_std(),
        ));
        let raft = match &config.tls {
            None => {
                let network = HttpNetworkFactory::new(config.id);
                Raft::new(config.id, raft_config, network, log, sm).await?
            }
            Some(tls) => {
                let connector = tls::TlsConnector::new(Arc::clone(tls), CONNECT_TIMEOUT);
                let network = HttpNetworkFactory::with_connector(
                    config.id,
                    connector,
                    http::uri::Scheme::HTTPS,
                );
                Raft::new(config.id, raft_config, network, log, sm).await?
            }
        };
        let gate = ReplayGate::new(
            committed,
            tokio::time::Instant::now().into_std(),
            REPLAY_WAIT,
        );
        // Before the replay wait: a member replaying a long log may be the one a region
        // needs to stand.
        tokio::spawn(elections::run(
            config.id,
            raft.clone(),
            elections.clone(),
            config.tls.clone(),
        ));
        wait_for_replay(&raft, &gate).await;
        tokio::spawn(snapshot_by_bytes(
            raft.clone(),
            shared.clone(),
            config.snapshot_log_bytes,
        ));
        tracing::info!(node_id = config.id, member = %config.member, tls = config.tls.is_some(), "raft member started");
        Ok(Self {
            id: config.id,
            raft,
            shared,
            events,
            tls: config.tls.clone(),
            transfer: Arc::new(watch::Sender::new(false)),
            elections,
            proposals: Arc::default(),
        })
    }

    /// The `/raft/*` routes, for the member's Raft listener (never the API's). `senders`
    /// is [`Senders::Certified`] behind mutual TLS; refusals are counted in `metrics`.
    pub fn router(&self, senders: Senders, metrics: RaftRpcMetrics) -> axum::Router {
        network::router(self.raft.clone(), self.elections.clone(), senders, metrics)
    }

    /// Form the group with `members` as its voters. Call on one member of a new group;
    /// a group that is already initialized returns `Ok` unchanged.
    pub async fn initialize(&self, members: BTreeMap<u64, Member>) -> Result<(), RaftError> {
        match self.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(OpenraftError::APIError(InitializeError::NotAllowed(_))) => {
                tracing::debug!(node_id = self.id, "raft already initialized");
                Ok(())
            }
            Err(OpenraftError::APIError(InitializeError::NotInMembers(e))) => {
                Err(RaftError::NotInMembers(Box::new(e)))
            }
            Err(OpenraftError::Fatal(e)) => Err(e.into()),
        }
    }

    /// Add `id` as a learner, wait (up to [`CATCH_UP_TIMEOUT`]) until it has the log up to
    /// its own admission, then promote it to voter. Leader only.
    pub async fn add_member(&self, id: u64, member: Member) -> Result<(), RaftError> {
        let added = self
            .raft
            .add_learner(id, member, false)
            .await
            .map_err(|e| self.membership_error(e))?;
        let want = added.log_id.index;
        let caught_up = self
            .raft
            .wait(Some(CATCH_UP_TIMEOUT))
            .metrics(
                |m| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(&id).copied().flatten())
                        .is_some_and(|matched| matched.index >= want)
                },
                "learner caught up",
            )
            .await;
        if caught_up.is_err() {
            return Err(RaftError::CatchUp { id });
        }
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(|e| self.membership_error(e))?;
        tracing::info!(node_id = self.id, peer = id, "raft member added");
        Ok(())
    }

    /// Remove `id` from the group (voter or learner). Leader only.
    pub async fn remove_member(&self, id: u64) -> Result<(), RaftError> {
        let is_voter = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == id);
        let ids = BTreeSet::from([id]);
        let change = if is_voter {
            ChangeMembers::RemoveVoters(ids)
        } else {
            ChangeMembers::RemoveNodes(ids)
        };
        // `retain = false`: a removed voter leaves the group entirely, not as a learner.
        self.raft
            .change_membership(change, false)
            .await
            .map_err(|e| self.membership_error(e))?;
        tracing::info!(node_id = self.id, peer = id, "raft member removed");
        Ok(())
    }

    /// Propose `request`; returns its response once committed and applied here.
    /// While this member moves its leadership away, the write waits for the transfer to
    /// end (bounded, see [`transfer`]), then goes to whoever leads.
    pub async fn write(&self, request: Request) -> Result<Response, WriteError> {
        if self.transferring() {
            self.transfer_settled().await;
        }
        let _proposing = self.proposals.read().await;
        let proposed = tokio::time::Instant::now();
        match self.raft.client_write(request).await {
            Ok(written) => {
                let took = proposed.elapsed().as_secs_f64();
                self.shared.timings.commit_seconds.observe(took);
                Ok(written.data)
            }
            Err(OpenraftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(WriteError::NotLeader {
                    leader: leader_of(f),
                })
            }
            Err(OpenraftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(WriteError::Refused(Box::new(e)))
            }
            Err(OpenraftError::Fatal(e)) => Err(e.into()),
        }
    }

    /// Audit records this member decided but cannot commit: written here when it leads,
    /// otherwise sent to the leader's Raft listener (as this member, over the Raft TLS) for
    /// it to commit. A refusal decided by a follower is audited like one by the leader.
    pub async fn forward_audit(&self, entries: Vec<AuditEntry>) -> anyhow::Result<()> {
        let leader = match self
            .write(Request::Audit {
                entries: entries.clone(),
            })
            .await
        {
            Ok(_) => return Ok(()),
            Err(WriteError::NotLeader {
                leader: Some((_, leader)),
            }) => leader,
            Err(WriteError::NotLeader { leader: None }) => {
                anyhow::bail!("no leader to forward the audit records to")
            }
            Err(e) => return Err(e.into()),
        };
        for batch in entries.chunks(network::AUDIT_FORWARD_RECORDS_MAX) {
            let mut client = crate::api_client::ApiClient::new(&leader.raft_addr, None)
                .with_timeout(AUDIT_FORWARD_TIMEOUT);
            if let Some(tls) = &self.tls {
                client = client.with_tls(Arc::clone(tls));
            }
            let body = serde_json::to_value(network::AuditForward {
                from: self.id,
                entries: batch.to_vec(),
            })?;
            let answer = client
                .send(http::Method::POST, network::AUDIT_PATH, Some(&body))
                .await?;
            anyhow::ensure!(
                answer.status.is_success(),
                "the leader refused the audit records: {}",
                String::from_utf8_lossy(&answer.body)
            );
        }
        Ok(())
    }

    /// The replicated state, as applied on this member. Hold the lock briefly: the
    /// applier waits for it.
    pub fn state(&self) -> Arc<RwLock<AuthorityState>> {
        self.shared.state.clone()
    }

    /// Run `f` on the state and the index of the last entry it reflects, consistently.
    /// Subscribers resync with this: events at or below that index are already included.
    pub fn with_state<T>(&self, f: impl FnOnce(&AuthorityState, Option<u64>) -> T) -> T {
        let state = self
            .shared
            .state
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let applied = self.shared.applied_meta().last_applied.map(|l| l.index);
        f(&state, applied)
    }

    /// A copy of the state and the id (index, term) of the last entry it reflects, taken
    /// consistently, for a backup. The copy shares the state's persistent parts, so the
    /// lock is held briefly (as for a snapshot).
    pub fn state_copy(&self) -> (AuthorityState, Option<(u64, u64)>) {
        let state = self
            .shared
            .state
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let applied = self
            .shared
            .applied_meta()
            .last_applied
            .map(|l| (l.index, l.leader_id.term));
        (state.clone(), applied)
    }

    /// Follow the state machine. Subscribe before reading [`RaftNode::with_state`] so no
    /// entry falls between the two.
    pub fn subscribe(&self) -> broadcast::Receiver<StateEvent> {
        self.events.subscribe()
    }

    /// Whether this member currently believes it is the leader.
    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// The leader this member knows of.
    pub fn leader(&self) -> Option<(u64, Member)> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let id = m.current_leader?;
        let member = m.membership_config.membership().get_node(&id)?.clone();
        Some((id, member))
    }

    /// The current term.
    pub fn current_term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// Committed entries whose apply failed unexpectedly since this process started
    /// (see [`store::ApplyFailure`]); a member with any is not ready.
    pub fn apply_failures(&self) -> Vec<store::ApplyFailure> {
        self.shared
            .apply_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The counter of failed applies, for the member's metrics.
    pub fn apply_failures_total(&self) -> prometheus_client::metrics::counter::Counter {
        self.shared.apply_failures_total.clone()
    }

    /// The log's own metrics (commit and apply latency, snapshot sizes, follower lag),
    /// for the member's registry; [`timings::follow_lag`] keeps the lag current.
    pub fn timings(&self) -> timings::RaftTimings {
        self.shared.timings.clone()
    }

    /// The election timer's metrics (`waymark_raft_pre_votes_total`,
    /// `waymark_raft_elections_started_total`), for the member's registry.
    pub fn election_metrics(&self) -> ElectionMetrics {
        self.elections.metrics().clone()
    }

    /// openraft's metrics; `changed()` wakes on every change.
    pub fn watch_metrics(&self) -> watch::Receiver<RaftMetrics<u64, Member>> {
        self.raft.metrics()
    }

    /// Every member with its role and replication progress, as far as this member knows.
    pub fn peers(&self) -> Vec<PeerStatus> {
        let m = self.raft.metrics();
        let m = m.borrow();
        peers_from(&m)
    }

    /// Read barrier: returns once this leader has confirmed leadership with a quorum and
    /// applied everything committed before the call. A read of [`RaftNode::state`] after
    /// it is linearizable.
    pub async fn ensure_linearizable(&self) -> Result<(), WriteError> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(OpenraftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(WriteError::NotLeader {
                    leader: leader_of(f),
                })
            }
            Err(OpenraftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                Err(WriteError::NoQuorum(Box::new(e)))
            }
            Err(OpenraftError::Fatal(e)) => Err(e.into()),
        }
    }

    /// Stop Raft. The store stays durable; once this returns, the directory can be
    /// reopened with [`RaftNode::open`] (in this process too).
    pub async fn shutdown(&self) {
        if let Err(error) = self.raft.shutdown().await {
            tracing::warn!(node_id = self.id, %error, "raft core ended abnormally");
        }
        // openraft joins its core task but not the state-machine worker or replication
        // tasks, which hold the database a moment longer; redb refuses a second open
        // while they do.
        let mut closed = self.shared.closed.clone();
        let released = tokio::time::timeout(SHUTDOWN_RELEASE_TIMEOUT, async {
            while closed.changed().await.is_ok() {}
        })
        .await;
        if released.is_err() {
            tracing::warn!(node_id = self.id, "raft store still held after shutdown");
        }
        tracing::info!(node_id = self.id, "raft member stopped");
    }

    fn membership_error(&self, e: OpenraftError<u64, ClientWriteError<u64, Member>>) -> RaftError {
        match e {
            OpenraftError::APIError(ClientWriteError::ForwardToLeader(f)) => RaftError::NotLeader {
                leader: leader_of(f),
            },
            OpenraftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                RaftError::Membership(Box::new(e))
            }
            OpenraftError::Fatal(e) => e.into(),
        }
    }
}

/// A seed for member `id`'s election jitter: members started together must not draw
/// the same timeouts.
fn jitter_seed(id: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    id.rotate_left(32) ^ u64::from(nanos) ^ u64::from(std::process::id())
}

fn leader_of(f: ForwardToLeader<u64, Member>) -> Option<(u64, Member)> {
    f.leader_id.zip(f.leader_node)
}

/// The peer table from one metrics sample (pure, for tests).
fn peers_from(m: &RaftMetrics<u64, Member>) -> Vec<PeerStatus> {
    let membership = m.membership_config.membership();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let leader_last = m.last_log_index;
    membership
        .nodes()
        .map(|(&id, member)| {
            let role = if Some(id) == m.current_leader {
                PeerRole::Leader
            } else if voters.contains(&id) {
                PeerRole::Follower
            } else {
                PeerRole::Learner
            };
            let matched_index = if id == m.id {
                m.last_log_index
            } else {
                m.replication
                    .as_ref()
                    .and_then(|r| r.get(&id).copied().flatten())
                    .map(|l| l.index)
            };
            // Only the leader knows how far behind everyone is.
            let lag = match (&m.replication, matched_index, leader_last) {
                (Some(_), Some(matched), Some(last)) => Some(last.saturating_sub(matched)),
                _ => None,
            };
            PeerStatus {
                id,
                member: member.clone(),
                role,
                matched_index,
                lag,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
