//! Recovery from quorum loss (`waymark operator raft recover`): on a stopped member whose
//! peers are lost for good, rewrite its Raft storage so that its effective membership is
//! itself alone, keeping every entry it holds. Consul's `peers.json` does the same job.
//!
//! ```text
//! before:  wal/ … entries (T, L) …                                │ raft.redb: vote (T, L)
//! after:   wal/ … entries (T, L) … membership {self} at last+1,   │ raft.redb: vote (T+1, self),
//!               leader id (T+1, self)                              │            not committed
//! ```
//!
//! Why a membership entry, and why in a new term. Raft takes a membership into effect as
//! soon as it is in the log, committed or not, so one entry after the last makes this member
//! the only voter at its next start: it elects itself (term T+2), appends a blank entry and
//! commits it alone, which commits the old tail too (entries the old group never committed
//! may be committed now: Raft allows it, as a new leader would). Nothing is removed or
//! rewritten: the snapshot, the applied prefix, the committed index and the tail stay as
//! they are, and every view version and audit sequence number issued afterwards is above
//! the old ones (versions are numbered by term, audit numbers by the replayed state).
//! The entry needs a leader id above every entry before it, or openraft's index of leader
//! changes (which assumes non-decreasing leader ids) breaks; a new term T+1 with this member
//! as its candidate gives that, and the vote records it as a vote for itself in T+1 (not
//! committed: it never led T+1), which is what a member that voted for itself holds.
//! Editing the snapshot's membership instead would lose the tail after the snapshot, and
//! forging a committed vote would restart the member as a leader that never won an election.
//!
//! Everything is checked before anything is written; each refusal is a [`RecoverError`]
//! and changes nothing. (Opening a data directory an older build wrote moves its log into
//! segment files first, as the member itself does at start.) The vote is written first,
//! then the entry: a crash between them leaves a member that voted for itself in T+1 and
//! did nothing else, and running the recovery again goes on from there. The other members must never come
//! back on their old data: wipe their data directories and `join` them as new members.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, Membership, SnapshotMeta, StoredMembership, Vote,
};
use redb::Database;

use super::snapshot_file::{self, SNAPSHOT_FILE};
use super::store::{self, DB_FILE, KEY_PURGED, KEY_VOTE, META, StoreError};
use super::wal::Wal;
use super::{Member, TypeConfig, codec};

/// Where a member keeps its Raft files inside its data directory (`authority.data_dir`).
pub const RAFT_DIR: &str = "raft";

type NodeId = u64;

/// Why nothing was recovered. Every refusal leaves the store exactly as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoverError {
    /// No Raft database where one was looked for. Nothing changed; check `--data-dir` or
    /// the configuration's `data_dir`.
    #[error("no raft store at {path} (is it the member's data_dir?)")]
    Missing {
        /// The database file looked for.
        path: PathBuf,
    },
    /// Another process (the member itself, most likely) holds the database. Nothing
    /// changed; stop the member, then run the recovery again.
    #[error("the raft store at {path} is in use by a running process; stop the member first")]
    Locked {
        /// The database file.
        path: PathBuf,
    },
    /// The store holds no log, vote or snapshot: this member never joined a group.
    /// Nothing changed; there is nothing to recover here (start a new group instead).
    #[error("the raft store at {path} was never initialised: there is nothing to recover")]
    NotInitialised {
        /// The database file.
        path: PathBuf,
    },
    /// This member is not a voter of the last membership the store holds: it was removed,
    /// was only a learner, or the id is wrong. Nothing changed; run the recovery on a
    /// member that was a voter.
    #[error(
        "member {id} is not a voter of the last membership (voters {voters:?}, learners {learners:?})"
    )]
    NotInMembership {
        /// The id asked for.
        id: NodeId,
        /// The last membership's voters.
        voters: BTreeSet<NodeId>,
        /// Its learners.
        learners: BTreeSet<NodeId>,
    },
    /// This member is already the group's only member. Nothing changed; start it.
    #[error("member {id} is already the only member of its group: nothing to recover")]
    AlreadyAlone {
        /// The member.
        id: NodeId,
    },
    /// The store could not be read or written (damaged, unreadable, an unknown encoding).
    /// A failure while reading changed nothing; one while writing left at most the vote
    /// written (see the module's notes). Look at the cause.
    #[error("raft store")]
    Store(#[from] StoreError),
}

impl From<redb::DatabaseError> for RecoverError {
    fn from(e: redb::DatabaseError) -> Self {
        Self::Store(StoreError::from(e))
    }
}

macro_rules! into_store {
    ($($t:ty),*) => {$(
        impl From<$t> for RecoverError {
            fn from(e: $t) -> Self {
                Self::Store(e.into())
            }
        }
    )*};
}
into_store!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    serde_json::Error,
    codec::CodecError,
    super::wal::WalError,
    snapshot_file::SnapshotFileError
);

/// What a recovery did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// The member.
    pub id: NodeId,
    /// Its Raft directory.
    pub dir: PathBuf,
    /// The last log entry before the recovery (the snapshot's last, when the log is empty).
    pub last_log: LogId<NodeId>,
    /// The committed index the store knew.
    pub committed: Option<LogId<NodeId>>,
    /// The vote before.
    pub old_vote: Option<Vote<NodeId>>,
    /// The last membership before, and the entry that carried it.
    pub old_membership: StoredMembership<NodeId, Member>,
    /// The membership appended: this member alone.
    pub new_membership: Membership<NodeId, Member>,
    /// The entry that carries it.
    pub entry: LogId<NodeId>,
    /// The vote now.
    pub vote: Vote<NodeId>,
}

impl fmt::Display for Recovered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let voters = |m: &Membership<NodeId, Member>| m.voter_ids().collect::<Vec<_>>();
        let old = self.old_membership.membership();
        writeln!(f, "recovered member {} in {}", self.id, self.dir.display())?;
        writeln!(
            f,
            "  last log entry:  index {}, term {}",
            self.last_log.index, self.last_log.leader_id.term
        )?;
        let committed = self
            .committed
            .map_or("-".to_owned(), |c| c.index.to_string());
        writeln!(f, "  committed index: {committed}")?;
        let old_at = self
            .old_membership
            .log_id()
            .map_or("-".to_owned(), |l| l.index.to_string());
        let learners: Vec<_> = old.learner_ids().collect();
        writeln!(
            f,
            "  old membership:  voters {:?}, learners {learners:?} (entry {old_at})",
            voters(old)
        )?;
        let node = self
            .new_membership
            .get_node(&self.id)
            .map_or(String::new(), |m| format!(" ({m})"));
        writeln!(
            f,
            "  new membership:  voters {:?}{node}, entry {} in term {}",
            voters(&self.new_membership),
            self.entry.index,
            self.entry.leader_id.term
        )?;
        let old_vote = self.old_vote.map_or("-".to_owned(), |v| v.to_string());
        writeln!(f, "  vote:            {old_vote} -> {}", self.vote)?;
        writeln!(
            f,
            "start the member: it leads alone; then add members from wiped data directories \
             with `waymark operator raft join`"
        )
    }
}

/// What the store holds, read before deciding anything.
struct Found {
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    purged: Option<LogId<NodeId>>,
    last_in_log: Option<LogId<NodeId>>,
    membership_in_log: Option<StoredMembership<NodeId, Member>>,
    snapshot: Option<SnapshotMeta<NodeId, Member>>,
}

/// Recover member `id` from the Raft directory `dir` (`<data_dir>/raft`): make it the
/// only voter, at `member`'s addresses when given (else those the last membership names).
/// Blocking; run it on a stopped member.
pub fn recover(dir: &Path, id: NodeId, member: Option<Member>) -> Result<Recovered, RecoverError> {
    let path = dir.join(DB_FILE);
    if !path.is_file() {
        return Err(RecoverError::Missing { path });
    }
    let db = match Database::open(&path) {
        Ok(db) => db,
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
            return Err(RecoverError::Locked { path });
        }
        Err(e) => return Err(e.into()),
    };
    let wal = store::open_wal(&db, dir)?;
    let found = read(&db, &wal, dir)?;
    let snapshot_last = found.snapshot.as_ref().and_then(|s| s.last_log_id);
    let Some(last_log) = found.last_in_log.max(found.purged).max(snapshot_last) else {
        return Err(RecoverError::NotInitialised { path });
    };
    let snapshot_membership = found.snapshot.as_ref().map(|s| s.last_membership.clone());
    let old_membership = [found.membership_in_log.clone(), snapshot_membership]
        .into_iter()
        .flatten()
        .max_by_key(|m| *m.log_id())
        .ok_or(RecoverError::NotInitialised { path })?;
    let old = old_membership.membership();
    let voters: BTreeSet<NodeId> = old.voter_ids().collect();
    if !voters.contains(&id) {
        return Err(RecoverError::NotInMembership {
            id,
            voters,
            learners: old.learner_ids().collect(),
        });
    }
    if voters.len() == 1 && old.nodes().count() == 1 {
        return Err(RecoverError::AlreadyAlone { id });
    }
    let node = member
        .or_else(|| old.get_node(&id).cloned())
        .unwrap_or_default();
    let new_membership = Membership::new(vec![BTreeSet::from([id])], BTreeMap::from([(id, node)]));
    let term = found
        .vote
        .map_or(0, |v| v.leader_id().term)
        .max(last_log.leader_id.term)
        + 1;
    let entry = Entry::<TypeConfig> {
        log_id: LogId::new(CommittedLeaderId::new(term, id), last_log.index + 1),
        payload: EntryPayload::Membership(new_membership.clone()),
    };
    let vote = Vote::new(term, id);
    // A snapshot beyond the log (installed, the log not yet purged when the member
    // stopped): purge up to it, as openraft would at start, so the log has no hole below
    // the new entry.
    let purge_to = snapshot_last.filter(|s| found.last_in_log.is_none_or(|l| l < *s));
    write(&db, &wal, &entry, &vote, purge_to)?;
    tracing::warn!(
        node_id = id,
        index = entry.log_id.index,
        term,
        "raft membership rewritten to this member alone"
    );
    Ok(Recovered {
        id,
        dir: dir.to_owned(),
        last_log,
        committed: found.committed,
        old_vote: found.vote,
        old_membership,
        new_membership,
        entry: entry.log_id,
        vote,
    })
}

/// The vote, committed index, purge point, last entry, last membership in the log and the
/// snapshot's metadata.
fn read(db: &Database, wal: &Wal, dir: &Path) -> Result<Found, RecoverError> {
    let vote = store::get_meta::<Vote<NodeId>>(db, KEY_VOTE)?;
    let committed = store::get_meta::<Option<LogId<NodeId>>>(db, store::KEY_COMMITTED)?
        .flatten()
        .max(wal.committed());
    let purged = store::get_meta::<Option<LogId<NodeId>>>(db, KEY_PURGED)?.flatten();
    let last_in_log = wal.last();
    let mut membership_in_log = None;
    if let (Some(first), Some(last)) = (wal.first(), last_in_log) {
        // Newest first: the first membership entry met is the last one.
        for index in (first.index..=last.index).rev() {
            let Some(raw) = wal.read(index, index, usize::MAX)?.pop() else {
                break;
            };
            let entry: Entry<TypeConfig> = codec::decode(&raw)?;
            if let EntryPayload::Membership(m) = entry.payload {
                membership_in_log = Some(StoredMembership::new(Some(entry.log_id), m));
                break;
            }
        }
    }
    let snapshot = match std::fs::read(dir.join(SNAPSHOT_FILE)) {
        Ok(bytes) => Some(snapshot_file::decode(bytes)?.0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            store::load_legacy_snapshot(db)?.map(|(meta, _)| meta)
        }
        Err(source) => {
            return Err(snapshot_file::SnapshotFileError::Io {
                path: dir.join(SNAPSHOT_FILE),
                source,
            }
            .into());
        }
    };
    Ok(Found {
        vote,
        committed,
        purged,
        last_in_log,
        membership_in_log,
        snapshot,
    })
}

/// Record `vote` (and the purge point `purge_to`) durably, then purge the log and append
/// `entry` to it, durably.
fn write(
    db: &Database,
    wal: &Wal,
    entry: &Entry<TypeConfig>,
    vote: &Vote<NodeId>,
    purge_to: Option<LogId<NodeId>>,
) -> Result<(), RecoverError> {
    let encoded = codec::encode(entry)?;
    let vote = serde_json::to_vec(vote)?;
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        meta.insert(KEY_VOTE, vote.as_slice())?;
        if let Some(to) = purge_to {
            meta.insert(KEY_PURGED, serde_json::to_vec(&Some(to))?.as_slice())?;
        }
    }
    txn.commit()?;
    if let Some(to) = purge_to {
        wal.purge(to.index)?;
    }
    wal.append(&[(entry.log_id, encoded.as_slice())], None)?;
    Ok(())
}

#[cfg(test)]
#[path = "recover_tests.rs"]
mod tests;
