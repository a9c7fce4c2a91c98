//! Durable Raft storage: the log's entries live in segment files ([`super::wal`], `wal/`)
//! in the member's data directory, the vote, the purge point and the committed index in a
//! redb file (`raft.redb`) beside them, and the latest snapshot in a file of its own
//! ([`super::snapshot_file`]), so that writing a snapshot never holds up a log append.
//!
//! The state machine itself ([`AuthorityState`]) is held in memory. It is rebuilt on start
//! from the persisted snapshot plus the committed log tail, which openraft re-applies
//! because [`RaftLogStorage::save_committed`] is implemented.
//!
//! Both are blocking and every write syncs to disk. Changes to the log go to one writer
//! thread, in order, which writes appends that queued together in one write and one sync;
//! reads run on tokio's blocking pool. Durability, per operation:
//! - `append`: readable when the call returns, durable when the flush callback fires;
//! - `save_vote`, `truncate`, `purge`: durable before the call returns;
//! - `save_committed`: kept in memory and written by the next `append` (a record in the
//!   same sync), or by a durable flush to the database [`COMMITTED_FLUSH_AFTER`] later when
//!   none comes; it may be behind after a crash, never ahead;
//! - `install_snapshot`, `build_snapshot`: the snapshot is durable before the call returns.

use std::fmt::{self, Debug};
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{broadcast, watch};

use super::codec;
use super::snapshot_file::{SnapshotFile, SnapshotFileError, Stored as StoredSnapshot};
use super::wal::{self, ByteBudget, Wal, WalError};
use super::{Member, TypeConfig};
use waymark_registry::machine::{AuthorityState, Request, Response};

/// The database file inside the member's data directory.
pub const DB_FILE: &str = "raft.redb";

/// Where builds before the segment log ([`super::wal`]) kept the log's entries, by index,
/// each an encoded `openraft::Entry`. Opening moves them to the segment log and removes
/// the table ([`migrate`]).
pub(super) const LOGS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("raft_logs");
/// Small records by name, JSON-encoded: see the `KEY_*` constants.
pub(super) const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("raft_meta");
/// Where older builds kept the latest snapshot (`KEY_SNAPSHOT_META`, `KEY_SNAPSHOT_DATA`);
/// older still, in `META`. It is read from there until the first snapshot is written to the
/// snapshot file, which removes it. (In the database, a snapshot's write transaction held
/// redb's one writer, so every log append waited for tens of megabytes to be copied and
/// synced.)
const SNAPSHOT: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("raft_snapshot");

pub(super) const KEY_VOTE: &str = "vote";
pub(super) const KEY_COMMITTED: &str = "committed";
pub(super) const KEY_PURGED: &str = "last_purged";
pub(super) const KEY_SNAPSHOT_META: &str = "snapshot_meta";
pub(super) const KEY_SNAPSHOT_DATA: &str = "snapshot_data";

type NodeId = u64;
type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// Something the state machine did, for modules that follow the replicated state.
///
/// Sent on a bounded broadcast channel. A subscriber that lags behind gets
/// `RecvError::Lagged` and must resync from [`super::RaftNode::with_state`], as it must
/// after [`StateEvent::SnapshotInstalled`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StateEvent {
    /// A normal log entry was applied.
    Applied(Arc<AppliedEntry>),
    /// The whole state was replaced by a snapshot whose last entry has this index.
    SnapshotInstalled {
        /// The snapshot's last log index.
        index: u64,
    },
}

/// One applied normal entry and what it produced.
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedEntry {
    /// The entry's log index.
    pub index: u64,
    /// The term of the leader that proposed it.
    pub term: u64,
    /// The request.
    pub request: Request,
    /// What applying it produced.
    pub response: Response,
}

/// Why the store could not be opened or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The data directory could not be created. Nothing was opened; fix the path or its
    /// permissions.
    #[error("cannot create raft data directory {path}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// redb failed (open, transaction, table or commit). The database may be locked by
    /// another process or damaged.
    #[error("raft database error")]
    Db(#[from] redb::Error),
    /// A stored metadata record (vote, committed index, purge point) did not decode. The
    /// file is damaged or from an incompatible version.
    #[error("raft record does not decode")]
    Codec(#[from] serde_json::Error),
    /// A log entry or a snapshot's state did not decode (or, never expected, encode). The
    /// file is damaged or from an incompatible version.
    #[error("raft log entry or snapshot does not decode")]
    Record(#[from] codec::CodecError),
    /// The snapshot file could not be read or written.
    #[error("raft snapshot file")]
    Snapshot(#[from] SnapshotFileError),
    /// The log's segment files could not be read or written, or are damaged.
    #[error("raft log")]
    Wal(#[from] WalError),
    /// The blocking task running the operation panicked or was cancelled.
    #[error("raft storage task failed")]
    Task(#[from] tokio::task::JoinError),
    /// The log's writer thread is gone (the store is closing, or it panicked); nothing
    /// more is written.
    #[error("the raft log writer stopped")]
    WriterGone,
    /// The thread building a snapshot could not start, or panicked; no snapshot was
    /// saved.
    #[error("the raft snapshot thread failed")]
    SnapshotThread,
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                Self::Db(e.into())
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// The replicated state as the rest of the member sees it, plus what was last applied.
///
/// Lock order: `state` before `applied`. The applier changes both while holding the
/// `state` write lock, so anyone holding a `state` lock sees a matching `applied`.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) state: Arc<RwLock<AuthorityState>>,
    pub(crate) applied: Arc<Mutex<AppliedMeta>>,
    /// Committed entries whose apply failed unexpectedly since this process started.
    pub(crate) apply_failures: Arc<Mutex<Vec<ApplyFailure>>>,
    /// Every failed apply since this process started (`waymark_raft_apply_failures_total`).
    pub(crate) apply_failures_total: prometheus_client::metrics::counter::Counter,
    /// Changes (closes) once the database is closed, i.e. once openraft's tasks have all
    /// let go of it.
    pub(crate) closed: watch::Receiver<()>,
    /// Encoded bytes appended to the log since the last snapshot was built: what the
    /// member calls for a snapshot by (see [`super::RaftConfig::snapshot_log_bytes`]).
    pub(crate) log_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Commit and apply latency, snapshot sizes (`waymark_raft_*`).
    pub(crate) timings: super::timings::RaftTimings,
}

/// A committed entry whose apply panicked: a bug, contained.
///
/// Every member running the same build fails the same entry the same way (apply is
/// deterministic, the panic included), so members stay identical; the entry is answered
/// with [`Response::ApplyFailed`] and the member goes on applying the entries after it.
/// The member stays up and serving, and reports itself not ready (`/readyz`) for as long
/// as the process runs, so an operator looks. A restart on the same build replays the
/// entry and reports it again, unless a snapshot taken since already covers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyFailure {
    /// The entry's log index.
    pub index: u64,
    /// The panic's message.
    pub message: String,
}

/// Longest panic message kept per failure.
const APPLY_FAILURE_MESSAGE_MAX: usize = 512;
/// Failures remembered per process (the count keeps growing in the metric).
const APPLY_FAILURES_KEPT: usize = 64;

/// The last applied log id and membership.
#[derive(Debug, Clone, Default)]
pub(crate) struct AppliedMeta {
    pub(crate) last_applied: Option<LogId<NodeId>>,
    pub(crate) membership: StoredMembership<NodeId, Member>,
}

/// Open (or create) the store in `dir`, loading the persisted snapshot into memory.
pub(crate) fn open(
    dir: &Path,
    events: broadcast::Sender<StateEvent>,
) -> Result<(LogStore, StateMachineStore, Shared), StoreError> {
    std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
        path: dir.to_owned(),
        source,
    })?;
    let (closed_tx, closed) = watch::channel(());
    let (snapshots, snapshot) = SnapshotFile::open(dir)?;
    let database = Database::create(dir.join(DB_FILE))?;
    let txn = database.begin_write()?;
    txn.open_table(META)?;
    txn.commit()?;
    let wal = open_wal(&database, dir)?;
    let (snapshot, legacy) = match snapshot {
        Some(snapshot) => (Some(snapshot), false),
        None => {
            let legacy = load_legacy_snapshot(&database)?;
            let found = legacy.is_some();
            (legacy, found)
        }
    };
    let db = Arc::new(Db {
        legacy_snapshot: AtomicBool::new(legacy),
        wal,
        db: database,
        snapshots,
        _closed: closed_tx,
    });

    let (state, applied) = match snapshot {
        Some((meta, data)) => {
            let state: AuthorityState = codec::decode(&data)?;
            let applied = AppliedMeta {
                last_applied: meta.last_log_id,
                membership: meta.last_membership,
            };
            (state, applied)
        }
        None => (AuthorityState::default(), AppliedMeta::default()),
    };
    tracing::info!(
        dir = %dir.display(),
        snapshot_index = ?applied.last_applied.map(|l| l.index),
        "raft store opened"
    );
    let shared = Shared {
        state: Arc::new(RwLock::new(state)),
        applied: Arc::new(Mutex::new(applied)),
        apply_failures: Arc::default(),
        apply_failures_total: Default::default(),
        closed,
        log_bytes: Arc::default(),
        timings: Default::default(),
    };
    let hint = CommittedHint::open(&dir.join(HINT_FILE)).map_err(|source| StoreError::Dir {
        path: dir.join(HINT_FILE),
        source,
    })?;
    let recent = Arc::default();
    let writer = LogWriter::start(&db, Arc::clone(&recent)).map_err(|source| StoreError::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    let log = LogStore {
        db: db.clone(),
        committed: Arc::default(),
        recent,
        writer,
        hint: Arc::new(hint),
        log_bytes: Arc::clone(&shared.log_bytes),
    };
    let sm = StateMachineStore {
        db,
        shared: shared.clone(),
        events,
    };
    Ok((log, sm, shared))
}

/// Open the segment log in `dir`, first moving into it the entries a build before it
/// kept in the database, and forget what was purged.
pub(super) fn open_wal(db: &Database, dir: &Path) -> Result<Wal, StoreError> {
    migrate(db, dir)?;
    let purged = get_meta::<Option<LogId<NodeId>>>(db, KEY_PURGED)?.flatten();
    let (wal, opened) = Wal::open(&dir.join(wal::WAL_DIR), purged.map(|p| p.index))?;
    tracing::debug!(
        last = ?opened.last.map(|l| l.index),
        committed = ?opened.committed.map(|c| c.index),
        torn_bytes = opened.torn_bytes,
        "raft log opened"
    );
    Ok(wal)
}

/// Entries moved from the database per write while migrating.
const MIGRATE_RUN: usize = 1_024;

/// Move the log's entries from the database ([`LOGS`], where builds before the segment log
/// kept them) into a new segment log, once. The segments are written under
/// [`wal::WAL_MIGRATING_DIR`] and synced, the directory is renamed to [`wal::WAL_DIR`], and
/// only then is the table removed, so a crash at any point leaves either the old layout
/// (migrated again at the next open) or the new one with a table left to remove.
fn migrate(db: &Database, dir: &Path) -> Result<(), StoreError> {
    let wal_dir = dir.join(wal::WAL_DIR);
    if wal_dir.is_dir() {
        drop_old_log(db)?;
        return Ok(());
    }
    let staging = dir.join(wal::WAL_MIGRATING_DIR);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(wal::io(&staging))?;
    }
    let mut moved = 0usize;
    {
        let (wal, _) = Wal::open(&staging, None)?;
        let txn = db.begin_read()?;
        match txn.open_table(LOGS) {
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(e.into()),
            Ok(table) => {
                let mut run: Vec<(LogId<NodeId>, Vec<u8>)> = Vec::new();
                let write = |run: &mut Vec<(LogId<NodeId>, Vec<u8>)>| {
                    let entries: Vec<(LogId<NodeId>, &[u8])> =
                        run.iter().map(|(id, b)| (*id, b.as_slice())).collect();
                    let result = wal.append(&entries, None);
                    run.clear();
                    result
                };
                for item in table.iter()? {
                    let (_, raw) = item?;
                    let raw = raw.value();
                    let entry: Entry<TypeConfig> = codec::decode(raw)?;
                    run.push((entry.log_id, raw.to_vec()));
                    moved += 1;
                    if run.len() == MIGRATE_RUN {
                        write(&mut run)?;
                    }
                }
                write(&mut run)?;
            }
        }
    }
    std::fs::rename(&staging, &wal_dir).map_err(wal::io(&wal_dir))?;
    wal::sync_dir(dir)?;
    drop_old_log(db)?;
    if moved > 0 {
        tracing::info!(
            entries = moved,
            dir = %wal_dir.display(),
            "raft log moved from the database to segment files"
        );
    }
    Ok(())
}

/// Remove the table older builds kept the log in, if it is still there (looked for first,
/// so that a start with nothing to remove writes nothing).
fn drop_old_log(db: &Database) -> Result<(), StoreError> {
    let present = match db.begin_read()?.open_table(LOGS) {
        Ok(_) => true,
        Err(redb::TableError::TableDoesNotExist(_)) => false,
        Err(e) => return Err(e.into()),
    };
    if present {
        let txn = db.begin_write()?;
        txn.delete_table(LOGS)?;
        txn.commit()?;
        tracing::debug!("the log table an older build kept in the database was removed");
    }
    Ok(())
}

/// The open database, log and snapshot file. Fields drop in order: the log's files and
/// the database close (releasing the database's lock, which also guards the log) before
/// `_closed` drops and wakes whoever waits for the close.
pub(crate) struct Db {
    wal: Wal,
    db: Database,
    snapshots: SnapshotFile,
    /// The database still holds the snapshot a build before the snapshot file wrote there;
    /// it is read from there until a snapshot is written to the file, then removed.
    legacy_snapshot: AtomicBool,
    _closed: watch::Sender<()>,
}

/// Run a redb operation on the blocking pool.
async fn blocking<T, F>(db: &Arc<Db>, f: F) -> Result<T, StoreError>
where
    F: FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    on_store(db, move |db| f(&db.db)).await
}

/// Run an operation on the database or the snapshot file on the blocking pool.
async fn on_store<T, F>(db: &Arc<Db>, f: F) -> Result<T, StoreError>
where
    F: FnOnce(&Db) -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    let db = Arc::clone(db);
    tokio::task::spawn_blocking(move || f(&db)).await?
}

/// Run `f` on a thread of its own, at a lower scheduling priority than the member's other
/// threads, and wait for it.
///
/// A snapshot encodes the whole state (tens of megabytes at the reference estate, about a
/// second of a core) and writes it out. At the default priority it took a core from the
/// threads every acknowledgement waits on — the API, the Raft core, the log writer — and
/// on a small machine each snapshot showed as a dip in acknowledged writes. At a lower
/// priority it uses what they leave; nothing waits for a snapshot except the purge of the
/// log it covers. A new thread each time, because a thread that lowered its priority may
/// not raise it again without privileges: it must not go back to a shared pool.
async fn in_background<T, F>(f: F) -> Result<T, StoreError>
where
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("raft-snapshot".into())
        .spawn(move || {
            lower_priority();
            let _ = done.send(f());
        })
        .map_err(|error| {
            tracing::error!(%error, "cannot start the raft snapshot thread");
            StoreError::SnapshotThread
        })?;
    result.await.map_err(|_| StoreError::SnapshotThread)?
}

/// The niceness [`in_background`] runs at: the threads at the default (0) get about ten
/// times its share of a busy core.
pub(super) const BACKGROUND_NICE: i32 = 10;

/// Lower the calling thread's priority to [`BACKGROUND_NICE`] (on Linux, `setpriority`
/// on a thread id changes that thread only). A failure is logged and changes nothing else:
/// the work still runs, at the default priority. A thread already below it (the whole
/// member started with `nice`) is left as it is: raising a priority needs privileges.
fn lower_priority() {
    let tid = rustix::thread::gettid();
    let lowered = rustix::process::getpriority_process(Some(tid)).and_then(|now| {
        if now >= BACKGROUND_NICE {
            return Ok(());
        }
        rustix::process::setpriority_process(Some(tid), BACKGROUND_NICE)
    });
    if let Err(error) = lowered {
        tracing::warn!(
            %error,
            "cannot lower the raft snapshot thread's priority; it runs at the default"
        );
    }
}

pub(super) fn get_meta<T: serde::de::DeserializeOwned>(
    db: &Database,
    key: &str,
) -> Result<Option<T>, StoreError> {
    let txn = db.begin_read()?;
    let table = txn.open_table(META)?;
    let Some(raw) = table.get(key)? else {
        return Ok(None);
    };
    Ok(Some(serde_json::from_slice(raw.value())?))
}

fn put_meta<T: serde::Serialize>(db: &Database, key: &str, value: &T) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec(value)?;
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(META)?;
        table.insert(key, bytes.as_slice())?;
    }
    txn.commit()?;
    Ok(())
}

/// The snapshot a build before the snapshot file kept in the database: in its own table,
/// or, older still, beside the small records.
pub(super) fn load_legacy_snapshot(db: &Database) -> Result<Option<StoredSnapshot>, StoreError> {
    let txn = db.begin_read()?;
    let table = match txn.open_table(SNAPSHOT) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => txn.open_table(META)?,
        Err(e) => return Err(e.into()),
    };
    let (Some(meta), Some(data)) = (table.get(KEY_SNAPSHOT_META)?, table.get(KEY_SNAPSHOT_DATA)?)
    else {
        return Ok(None);
    };
    let meta = serde_json::from_slice(meta.value())?;
    Ok(Some((meta, data.value().to_vec())))
}

/// The latest snapshot: the file's, or the database's until the first file is written.
pub(super) fn load_snapshot(db: &Db) -> Result<Option<StoredSnapshot>, StoreError> {
    if let Some(stored) = db.snapshots.load()? {
        return Ok(Some(stored));
    }
    if db.legacy_snapshot.load(Ordering::Acquire) {
        return load_legacy_snapshot(&db.db);
    }
    Ok(None)
}

/// Make this the latest snapshot, durably (unless a newer one is already held). The first
/// snapshot written to the file removes the one an older build kept in the database.
pub(super) fn save_snapshot(
    db: &Db,
    meta: &SnapshotMeta<NodeId, Member>,
    data: &[u8],
) -> Result<(), StoreError> {
    if db.snapshots.save(meta, data)? && db.legacy_snapshot.swap(false, Ordering::AcqRel) {
        let txn = db.db.begin_write()?;
        for table in [SNAPSHOT, META] {
            let mut table = txn.open_table(table)?;
            table.remove(KEY_SNAPSHOT_META)?;
            table.remove(KEY_SNAPSHOT_DATA)?;
        }
        txn.commit()?;
        tracing::info!("the snapshot an older build kept in the log's database was removed");
    }
    Ok(())
}

// === impl LogStore ===

/// The Raft log, vote and committed index. Cheap to clone; clones share the database.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Db>,
    committed: Arc<CommittedFlush>,
    recent: Arc<Mutex<Recent>>,
    writer: LogWriter,
    hint: Arc<CommittedHint>,
    log_bytes: Arc<std::sync::atomic::AtomicU64>,
}

/// The file beside the database holding [`CommittedHint`].
const HINT_FILE: &str = "committed.hint";

/// The latest committed index, rewritten in place (no fsync) every time it is saved.
///
/// The durable record rides the next log append or the idle flush, so a process killed in
/// between would restart knowing an older committed index, re-apply less than it had
/// served, and open its replay gate on a state behind what its clients saw. The write
/// survives a process kill (it sits in the page cache); what an OS crash loses is caught
/// up from the leader, as with any committed index not yet known. At open the later of the
/// two records wins; a hint that does not decode is ignored and logged.
struct CommittedHint {
    file: Mutex<std::fs::File>,
}

/// Longest encoded hint: a JSON `LogId` is well under this.
const HINT_LEN_MAX: usize = 256;

impl CommittedHint {
    fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(Self {
            file: Mutex::new(file),
        })
    }

    /// Record `committed`: one small positioned write, a length then the JSON.
    fn write(&self, committed: &Option<LogId<NodeId>>) {
        use std::os::unix::fs::FileExt as _;
        let Ok(json) = serde_json::to_vec(committed) else {
            return;
        };
        let Ok(len) = u16::try_from(json.len()) else {
            return;
        };
        let mut record = len.to_le_bytes().to_vec();
        record.extend_from_slice(&json);
        let file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(error) = file.write_all_at(&record, 0) {
            tracing::warn!(%error, "writing the committed-index hint failed");
        }
    }

    /// The recorded index, if the file holds one that decodes.
    fn read(&self) -> Option<LogId<NodeId>> {
        use std::os::unix::fs::FileExt as _;
        let file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let mut buf = [0u8; HINT_LEN_MAX];
        let n = file.read_at(&mut buf, 0).ok()?;
        if n < 2 {
            return None;
        }
        let len = usize::from(u16::from_le_bytes([buf[0], buf[1]]));
        let Some(json) = buf.get(2..2 + len).filter(|_| 2 + len <= n) else {
            tracing::warn!(bytes = n, "the committed-index hint is truncated; ignored");
            return None;
        };
        match serde_json::from_slice::<Option<LogId<NodeId>>>(json) {
            Ok(committed) => committed,
            Err(error) => {
                tracing::warn!(%error, "the committed-index hint does not decode; ignored");
                None
            }
        }
    }
}

/// Bytes of encoded entries [`Recent`] keeps at most.
const RECENT_BYTES_MAX: usize = 64 << 20;

/// The entries appended last, decoded, so the state machine applies what was just written
/// without reading it back and decoding it again (at reference size that decode was a
/// tenth of the authority's CPU). Contiguous by index; what it lacks is read from the
/// log, so it changes what a read costs, never what it returns.
///
/// An entry is held here from the moment it is appended, before the writer made it
/// durable (openraft reads what it appended at once), and is never let go before it is
/// durable: until then the log's files do not have it.
#[derive(Default)]
struct Recent {
    entries: std::collections::VecDeque<Held>,
    bytes: usize,
}

/// One entry [`Recent`] holds: decoded, its encoded size, and whether the log file has it.
struct Held {
    entry: Entry<TypeConfig>,
    size: usize,
    durable: bool,
}

impl Recent {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|h| h.entry.log_id.index)
    }

    /// Entries were appended (not yet durable): keep them, after whatever they follow.
    fn appended(&mut self, entries: Vec<(Entry<TypeConfig>, usize)>) {
        let Some((first, _)) = entries.first() else {
            return;
        };
        let follows = self
            .entries
            .back()
            .is_none_or(|last| last.entry.log_id.index.checked_add(1) == Some(first.log_id.index));
        if !follows {
            self.clear();
        }
        for (entry, size) in entries {
            self.bytes += size;
            self.entries.push_back(Held {
                entry,
                size,
                durable: false,
            });
        }
        self.evict();
    }

    /// The writer made `written` durable: those still held (same index, same log id: not
    /// truncated and replaced since) may be let go when space is needed.
    fn made_durable(&mut self, written: &[LogId<NodeId>]) {
        let Some(first) = self.first_index() else {
            return;
        };
        for id in written {
            let at = id
                .index
                .checked_sub(first)
                .and_then(|i| usize::try_from(i).ok());
            if let Some(held) = at.and_then(|i| self.entries.get_mut(i))
                && held.entry.log_id == *id
            {
                held.durable = true;
            }
        }
        self.evict();
    }

    /// Let the oldest durable entries go while more than [`RECENT_BYTES_MAX`] is held.
    fn evict(&mut self) {
        while self.bytes > RECENT_BYTES_MAX && self.entries.front().is_some_and(|h| h.durable) {
            if let Some(held) = self.entries.pop_front() {
                self.bytes -= held.size;
            }
        }
    }

    /// Forget entries from `index` on (a truncated, conflicting suffix).
    fn truncated(&mut self, index: u64) {
        while self
            .entries
            .back()
            .is_some_and(|h| h.entry.log_id.index >= index)
        {
            if let Some(held) = self.entries.pop_back() {
                self.bytes -= held.size;
            }
        }
    }

    /// Forget entries up to `index` (purged).
    fn purged(&mut self, index: u64) {
        while self.first_index().is_some_and(|first| first <= index) {
            if let Some(held) = self.entries.pop_front() {
                self.bytes -= held.size;
            }
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Every entry of `[start, end]` if all are held.
    fn get(&self, start: u64, end: u64) -> Option<Vec<Entry<TypeConfig>>> {
        self.get_within(start, end, usize::MAX)
    }

    /// The entries of `[start, end]` from `start` on, as long as they add up to at most
    /// `bytes` encoded (the first always comes, whatever its size); `None` unless `start`
    /// is held and every entry up to where the bound stops is.
    fn get_within(&self, start: u64, end: u64, bytes: usize) -> Option<Vec<Entry<TypeConfig>>> {
        let first = self.first_index()?;
        let last = self.entries.back()?.entry.log_id.index;
        if start < first || start > end || start > last {
            return None;
        }
        let from = usize::try_from(start - first).ok()?;
        let to = usize::try_from(end - first).ok()?;
        let mut out = Vec::new();
        let mut budget = ByteBudget::new(bytes);
        for held in self
            .entries
            .range(from..)
            .take((to - from).saturating_add(1))
        {
            if !budget.take(held.size) {
                return Some(out);
            }
            out.push(held.entry.clone());
        }
        // Every entry asked for must be here unless the bound stopped the walk.
        (end <= last).then_some(out)
    }
}

// === the log's writer ===

/// One change to the log file, made durable by the writer in the order it was asked for.
enum LogWrite {
    /// Encoded entries (index, bytes), with the committed index saved since the last
    /// write; `flushed` is told once they are durable.
    Append {
        entries: Vec<(LogId<NodeId>, Vec<u8>)>,
        committed: Option<LogId<NodeId>>,
        flushed: LogFlushed<TypeConfig>,
    },
    /// Delete entries from `from` on.
    Truncate { from: u64, done: Done },
    /// Delete entries up to `log_id` and record it as the purge point.
    Purge { log_id: LogId<NodeId>, done: Done },
    /// Record the vote.
    Vote { vote: Vote<NodeId>, done: Done },
    /// Nothing: answered once everything asked before it is durable.
    Barrier { done: Done },
}

type Done = tokio::sync::oneshot::Sender<Result<(), StoreError>>;

/// Appends queued together are written in one write (one sync) of at most this many
/// changes.
const WRITE_RUN_MAX: usize = 256;

/// The handle to the thread that makes the log durable.
///
/// openraft's `append` is meant to return once the entries are readable and report
/// durability through its callback; awaiting the fsync inside it held openraft's core —
/// every proposal, commit and apply of the member — for each write, so a leader wrote one
/// batch at a time however idle the machine was. The writer takes every change in order
/// on one thread, writes the appends that queued up meanwhile in one transaction, and
/// tells openraft when they are durable. Truncations, purges and votes go the same way, so
/// nothing overtakes an append asked for before it.
///
/// (Writing the entries into a B-tree database, redb, each append cost a copy-on-write
/// transaction: 550–640 µs per entry, and acknowledged writes queued behind it. The
/// segment log's append is one write and one sync into space allocated ahead.)
#[derive(Clone)]
struct LogWriter {
    tx: std::sync::mpsc::Sender<LogWrite>,
}

impl LogWriter {
    /// Start the thread; it ends when every handle is dropped and the queue is written.
    /// It holds the database only while writing, so the file closes (and its lock is
    /// released) when the store's handles are dropped, as it did without a writer.
    fn start(db: &Arc<Db>, recent: Arc<Mutex<Recent>>) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel();
        let db = Arc::downgrade(db);
        std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || write_log(&db, &recent, &rx))?;
        Ok(Self { tx })
    }

    /// Queue `write`; an error if the writer is gone (it only stops when the store does).
    fn send(&self, write: LogWrite) -> Result<(), StoreError> {
        self.tx.send(write).map_err(|_| StoreError::WriterGone)
    }

    /// Queue the change `make` builds and wait until it (and all before it) is durable.
    async fn run(&self, make: impl FnOnce(Done) -> LogWrite) -> Result<(), StoreError> {
        let (done, answer) = tokio::sync::oneshot::channel();
        self.send(make(done))?;
        answer.await.map_err(|_| StoreError::WriterGone)?
    }
}

/// The writer's loop: take what is queued, write runs of appends as one write, the rest
/// one by one, in order.
fn write_log(
    db: &std::sync::Weak<Db>,
    recent: &Mutex<Recent>,
    rx: &std::sync::mpsc::Receiver<LogWrite>,
) {
    let mut queued = std::collections::VecDeque::new();
    while let Ok(first) = rx.recv() {
        queued.push_back(first);
        while queued.len() < WRITE_RUN_MAX {
            match rx.try_recv() {
                Ok(more) => queued.push_back(more),
                Err(_) => break,
            }
        }
        let Some(db) = db.upgrade() else {
            // The store is closed: nobody is left to read what would be written.
            for write in queued.drain(..) {
                refuse(write);
            }
            continue;
        };
        while let Some(write) = queued.pop_front() {
            match write {
                LogWrite::Append {
                    entries,
                    committed,
                    flushed,
                } => {
                    let mut run = vec![(entries, committed, flushed)];
                    while let Some(LogWrite::Append { .. }) = queued.front() {
                        if let Some(LogWrite::Append {
                            entries,
                            committed,
                            flushed,
                        }) = queued.pop_front()
                        {
                            run.push((entries, committed, flushed));
                        }
                    }
                    write_appends(&db.wal, recent, run);
                }
                LogWrite::Truncate { from, done } => {
                    let _ = done.send(db.wal.truncate(from).map_err(StoreError::from));
                }
                LogWrite::Purge { log_id, done } => {
                    let _ = done.send(purge_log(&db, log_id));
                }
                LogWrite::Vote { vote, done } => {
                    let _ = done.send(put_meta(&db.db, KEY_VOTE, &vote));
                }
                LogWrite::Barrier { done } => {
                    let _ = done.send(Ok(()));
                }
            }
        }
    }
}

/// Answer a change that cannot be written any more.
fn refuse(write: LogWrite) {
    match write {
        LogWrite::Append { flushed, .. } => flushed.log_io_completed(Err(std::io::Error::other(
            StoreError::WriterGone.to_string(),
        ))),
        LogWrite::Truncate { done, .. }
        | LogWrite::Purge { done, .. }
        | LogWrite::Vote { done, .. }
        | LogWrite::Barrier { done } => {
            let _ = done.send(Err(StoreError::WriterGone));
        }
    }
}

type AppendRun = Vec<(
    Vec<(LogId<NodeId>, Vec<u8>)>,
    Option<LogId<NodeId>>,
    LogFlushed<TypeConfig>,
)>;

/// Write a run of appends in one durable write, then tell each its outcome.
fn write_appends(wal: &Wal, recent: &Mutex<Recent>, run: AppendRun) {
    let written = || -> Result<(), StoreError> {
        let entries: Vec<(LogId<NodeId>, &[u8])> = run
            .iter()
            .flat_map(|(entries, _, _)| entries.iter().map(|(id, b)| (*id, b.as_slice())))
            .collect();
        // The latest committed index saved before these appends rides their write.
        let committed = run.iter().rev().find_map(|(_, c, _)| *c);
        wal.append(&entries, committed)?;
        Ok(())
    };
    match written() {
        Ok(()) => {
            let ids: Vec<LogId<NodeId>> = run
                .iter()
                .flat_map(|(entries, _, _)| entries.iter().map(|(id, _)| *id))
                .collect();
            recent
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .made_durable(&ids);
            for (_, _, flushed) in run {
                flushed.log_io_completed(Ok(()));
            }
        }
        Err(error) => {
            tracing::error!(%error, appends = run.len(), "writing raft log entries failed");
            for (_, _, flushed) in run {
                flushed.log_io_completed(Err(std::io::Error::other(error.to_string())));
            }
        }
    }
}

/// Record the purge point durably, then remove what it covers: the log state must never
/// claim entries that are gone, and entries the point covers are ignored at open.
fn purge_log(db: &Db, log_id: LogId<NodeId>) -> Result<(), StoreError> {
    put_meta(&db.db, KEY_PURGED, &Some(log_id))?;
    db.wal.purge(log_id.index)?;
    Ok(())
}

impl LogStore {
    /// Wait until every change asked for so far is in the log file, before reading it.
    async fn written(&self) -> Result<(), StoreError> {
        self.writer.run(|done| LogWrite::Barrier { done }).await
    }

    /// The committed index recorded durably, in the log or the database (without the
    /// hint).
    pub(crate) async fn durable_committed(&self) -> StorageResult<Option<LogId<NodeId>>> {
        on_store(&self.db, |db| {
            let flushed = get_meta::<Option<LogId<NodeId>>>(&db.db, KEY_COMMITTED)?.flatten();
            Ok(flushed.max(db.wal.committed()))
        })
        .await
        .map_err(|e| StorageIOError::read(&e).into())
    }

    /// The committed index the hint file holds.
    #[cfg(test)]
    pub(crate) fn hinted_committed(&self) -> Option<LogId<NodeId>> {
        self.hint.read()
    }

    /// The same store with the idle flush of the committed index put off by `after`, so a
    /// test can tell what an append persisted from what the flush did.
    #[cfg(test)]
    pub(crate) fn with_committed_flush_after(mut self, after: std::time::Duration) -> Self {
        self.committed = Arc::new(CommittedFlush {
            after,
            ..CommittedFlush::default()
        });
        self
    }
}

/// How long a committed index saved without an fsync waits for one of its own, if no log
/// append (each of which is durable, and persists it) came first.
const COMMITTED_FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// The committed index saved last, not yet known durable, and whether a flush of it is
/// scheduled (see [`LogStore::save_committed`]).
struct CommittedFlush {
    latest: Mutex<Option<Option<LogId<NodeId>>>>,
    scheduled: AtomicBool,
    after: std::time::Duration,
}

impl Default for CommittedFlush {
    fn default() -> Self {
        Self {
            latest: Mutex::default(),
            scheduled: AtomicBool::default(),
            after: COMMITTED_FLUSH_AFTER,
        }
    }
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

fn read_entries(
    wal: &Wal,
    range: (Bound<u64>, Bound<u64>),
) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
    read_entries_within(wal, range, usize::MAX)
}

/// The entries of `range` the log holds, in order, as long as they add up to at most
/// `bytes` encoded (the first always comes, whatever its size).
fn read_entries_within(
    wal: &Wal,
    range: (Bound<u64>, Bound<u64>),
    bytes: usize,
) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
    let start = match range.0 {
        Bound::Included(s) => s,
        Bound::Excluded(s) => match s.checked_add(1) {
            Some(s) => s,
            None => return Ok(Vec::new()),
        },
        Bound::Unbounded => 0,
    };
    let end = match range.1 {
        Bound::Included(e) => e,
        Bound::Excluded(e) => match e.checked_sub(1) {
            Some(e) => e,
            None => return Ok(Vec::new()),
        },
        Bound::Unbounded => u64::MAX,
    };
    wal.read(start, end, bytes)?
        .iter()
        .map(|raw| Ok(codec::decode(raw)?))
        .collect()
}

fn is_empty_range(range: &(Bound<u64>, Bound<u64>)) -> bool {
    let start = match range.0 {
        Bound::Included(s) => s,
        Bound::Excluded(s) => match s.checked_add(1) {
            Some(s) => s,
            None => return true,
        },
        Bound::Unbounded => 0,
    };
    match range.1 {
        Bound::Included(e) => start > e,
        Bound::Excluded(e) => start >= e,
        Bound::Unbounded => false,
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        if is_empty_range(&range) {
            return Ok(Vec::new());
        }
        let bounds = match range {
            (Bound::Included(s), Bound::Included(e)) => Some((s, e)),
            (Bound::Included(s), Bound::Excluded(e)) => e.checked_sub(1).map(|e| (s, e)),
            _ => None,
        };
        if let Some((start, end)) = bounds {
            let held = self
                .recent
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(start, end);
            if let Some(entries) = held {
                return Ok(entries);
            }
        }
        self.written()
            .await
            .map_err(|e| StorageIOError::read_logs(&e))?;
        on_store(&self.db, move |db| read_entries(&db.wal, range))
            .await
            .map_err(|e| StorageIOError::read_logs(&e).into())
    }

    /// What one AppendEntries to a follower carries: the entries from `start` on, up to
    /// [`APPEND_BYTES_MAX`] encoded (at least one). openraft gives each AppendEntries one
    /// heartbeat interval however much it carries; a follower that fell behind by a few
    /// large entries (views released whole, an estate's slow start) was sent more than it
    /// could decode and make durable in that time, timed out, and was sent the same again —
    /// for ever. Bounded by bytes, each round trip fits and the follower catches up.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let Some(last) = end.checked_sub(1).filter(|last| start <= *last) else {
            return Ok(Vec::new());
        };
        let held = self
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_within(start, last, APPEND_BYTES_MAX);
        if let Some(entries) = held {
            return Ok(entries);
        }
        let range = (Bound::Included(start), Bound::Included(last));
        self.written()
            .await
            .map_err(|e| StorageIOError::read_logs(&e))?;
        on_store(&self.db, move |db| {
            read_entries_within(&db.wal, range, APPEND_BYTES_MAX)
        })
        .await
        .map_err(|e| StorageIOError::read_logs(&e).into())
    }
}

/// Encoded log bytes one AppendEntries carries at most, unless its first entry alone is
/// larger (etcd bounds its append messages the same way, at 1 MiB by default).
pub const APPEND_BYTES_MAX: usize = 1 << 20;

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        self.written()
            .await
            .map_err(|e| StorageIOError::read_logs(&e))?;
        on_store(&self.db, |db| {
            let purged: Option<LogId<NodeId>> = get_meta(&db.db, KEY_PURGED)?;
            let last = db.wal.last().or(purged);
            Ok(LogState {
                last_purged_log_id: purged,
                last_log_id: last,
            })
        })
        .await
        .map_err(|e| StorageIOError::read_logs(&e).into())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        let vote = *vote;
        self.writer
            .run(|done| LogWrite::Vote { vote, done })
            .await
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        self.written()
            .await
            .map_err(|e| StorageIOError::read_vote(&e))?;
        blocking(&self.db, |db| get_meta(db, KEY_VOTE))
            .await
            .map_err(|e| StorageIOError::read_vote(&e).into())
    }

    /// Kept in memory, not written here: openraft awaits this before every apply, so any
    /// write here (even one without an fsync: redb still copies and allocates pages for
    /// each transaction) sat on the path every write waits on. The next log append writes
    /// the latest value in its own durable transaction; after a crash the record may be
    /// behind, which only means fewer entries are re-applied at start-up before the
    /// leader's commit index arrives. It is never ahead of what was committed.
    ///
    /// When no append follows (the region went quiet), a flush scheduled
    /// [`COMMITTED_FLUSH_AFTER`] later writes the latest value durably, so an idle member's
    /// record is at most that much behind.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        self.hint.write(&committed);
        *self
            .committed
            .latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(committed);
        if !self.committed.scheduled.swap(true, Ordering::AcqRel) {
            let (db, flush) = (Arc::clone(&self.db), Arc::clone(&self.committed));
            tokio::spawn(async move {
                tokio::time::sleep(flush.after).await;
                flush.scheduled.store(false, Ordering::Release);
                let latest = flush
                    .latest
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                let Some(committed) = latest else { return };
                let durable = blocking(&db, move |db| put_meta(db, KEY_COMMITTED, &committed));
                if let Err(error) = durable.await {
                    // Not fatal: the next log append persists it.
                    tracing::warn!(%error, "flushing the committed index failed");
                }
            });
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        let durable = self.durable_committed().await?;
        Ok(durable.max(self.hint.read()))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Encoded here so the writer only writes; held decoded at once, so openraft can read
        // what it appended before the writer made it durable.
        let mut encoded = Vec::new();
        let mut decoded = Vec::new();
        for entry in entries {
            let id = entry.log_id;
            let bytes =
                codec::encode(&entry).map_err(|e| StorageIOError::write_log_entry(id, &e))?;
            decoded.push((entry, bytes.len()));
            encoded.push((id, bytes));
        }
        // The committed index saved since the last write rides this one.
        let committed = self
            .committed
            .latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .flatten();
        let bytes: usize = encoded.iter().map(|(_, b)| b.len()).sum();
        self.log_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .appended(decoded);
        // The writer calls back once these are durable: only then may openraft count them.
        self.writer
            .send(LogWrite::Append {
                entries: encoded,
                committed,
                flushed: callback,
            })
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        tracing::debug!(index = log_id.index, "raft log truncate");
        self.recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .truncated(log_id.index);
        let from = log_id.index;
        self.writer
            .run(|done| LogWrite::Truncate { from, done })
            .await
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        tracing::debug!(index = log_id.index, "raft log purge");
        self.recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .purged(log_id.index);
        self.writer
            .run(|done| LogWrite::Purge { log_id, done })
            .await
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

// === impl StateMachineStore ===

/// The state machine: [`AuthorityState`] in memory, snapshots in redb.
pub struct StateMachineStore {
    db: Arc<Db>,
    shared: Shared,
    events: broadcast::Sender<StateEvent>,
}

impl Debug for StateMachineStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateMachineStore")
            .field("applied", &self.shared.applied_meta().last_applied)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn applied_meta(&self) -> AppliedMeta {
        self.applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl StateMachineStore {
    /// Apply a batch under one write lock; returns the responses and the events to send.
    fn apply_batch(
        &self,
        entries: impl Iterator<Item = Entry<TypeConfig>>,
    ) -> (Vec<Response>, Vec<AppliedEntry>) {
        let mut responses = Vec::new();
        let mut events = Vec::new();
        let mut state = self
            .shared
            .state
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let mut applied = self
            .shared
            .applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for entry in entries {
            applied.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(Response::Empty),
                EntryPayload::Normal(request) => {
                    let index = entry.log_id.index;
                    let response = apply_contained(&mut state, index, request.clone())
                        .unwrap_or_else(|failure| {
                            let message = failure.message.clone();
                            self.shared.apply_failures_total.inc();
                            let mut failures = self
                                .shared
                                .apply_failures
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner);
                            if failures.len() < APPLY_FAILURES_KEPT {
                                failures.push(failure);
                            }
                            Response::ApplyFailed { message }
                        });
                    events.push(AppliedEntry {
                        index: entry.log_id.index,
                        term: entry.log_id.leader_id.term,
                        request,
                        response: response.clone(),
                    });
                    responses.push(response);
                }
                EntryPayload::Membership(m) => {
                    applied.membership = StoredMembership::new(Some(entry.log_id), m);
                    responses.push(Response::Empty);
                }
            }
        }
        (responses, events)
    }
}

/// Apply one entry; a panic inside apply is caught, logged and returned as a failure
/// instead of stopping Raft (which would stop the member, and on restart replay the same
/// entry into the same panic, for ever).
fn apply_contained(
    state: &mut AuthorityState,
    index: u64,
    request: Request,
) -> Result<Response, ApplyFailure> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        #[cfg(test)]
        test_hooks::maybe_panic(&request);
        state.apply(request)
    }))
    .map_err(
        |payload| {
            let mut message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_owned());
            if message.len() > APPLY_FAILURE_MESSAGE_MAX {
                let mut end = APPLY_FAILURE_MESSAGE_MAX;
                while !message.is_char_boundary(end) {
                    end -= 1;
                }
                message.truncate(end);
            }
            tracing::error!(
                index,
                message = %message,
                "a committed entry failed to apply; refused on this member and every member of this build, which goes on applying the log"
            );
            ApplyFailure { index, message }
        },
    )
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, Member>)> {
        let meta = self.shared.applied_meta();
        Ok((meta.last_applied, meta.membership))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Response>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let started = tokio::time::Instant::now();
        let (responses, events) = self.apply_batch(entries.into_iter());
        let took = started.elapsed().as_secs_f64();
        self.shared.timings.apply_seconds.observe(took);
        for event in events {
            // A restore replaced the whole state: followers of the state resync, as after
            // a snapshot, instead of reading it as one more change.
            let event = match event.response {
                Response::Restored => StateEvent::SnapshotInstalled { index: event.index },
                _ => StateEvent::Applied(Arc::new(event)),
            };
            // No receiver is fine: nobody follows the state yet.
            let _ = self.events.send(event);
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            shared: self.shared.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Member>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let size = data.len() as f64;
        self.shared.timings.snapshot_installed_bytes.observe(size);
        let state: AuthorityState = codec::decode(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        let stored = meta.clone();
        on_store(&self.db, move |db| save_snapshot(db, &stored, &data))
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        {
            let mut guard = self
                .shared
                .state
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let mut applied = self
                .shared
                .applied
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *guard = state;
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership.clone();
        }
        let index = meta.last_log_id.map_or(0, |l| l.index);
        tracing::info!(index, snapshot_id = %meta.snapshot_id, "raft snapshot installed");
        let _ = self.events.send(StateEvent::SnapshotInstalled { index });
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let stored = on_store(&self.db, load_snapshot)
            .await
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(stored.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

// === impl SnapshotBuilder ===

/// Builds a snapshot of the state as of the last applied entry.
pub struct SnapshotBuilder {
    db: Arc<Db>,
    shared: Shared,
}

impl Debug for SnapshotBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotBuilder").finish_non_exhaustive()
    }
}

/// Serialize the state and its matching metadata, consistently (see [`Shared`]).
///
/// The state is copied under the read lock and encoded after it is released: encoding the
/// reference estate's state takes hundreds of milliseconds, and every apply — so every
/// acknowledgement — waited for the lock meanwhile, a stall each time a snapshot was due.
/// The copy shares names and views (`Arc`s) and takes a fraction of that.
fn encode_state(shared: &Shared) -> Result<(AppliedMeta, Vec<u8>), codec::CodecError> {
    let (state, applied) = {
        let state = shared.state.read().unwrap_or_else(PoisonError::into_inner);
        (state.clone(), shared.applied_meta())
    };
    let bytes = codec::encode(&state)?;
    Ok((applied, bytes))
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let shared = self.shared.clone();
        let started = tokio::time::Instant::now();
        // What was appended until now is covered (or about to be) by this snapshot.
        shared.log_bytes.store(0, Ordering::Relaxed);
        // Serializing the whole state is CPU work, so it runs off the async workers, on a
        // thread of its own at a lower priority (see `in_background`).
        let db = Arc::clone(&self.db);
        let (meta, data) = in_background(move || {
            let (applied, data) = encode_state(&shared)?;
            let snapshot_id = match applied.last_applied {
                Some(l) => format!("{}-{}", l.leader_id.term, l.index),
                None => "empty".to_owned(),
            };
            let meta = SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership,
                snapshot_id,
            };
            save_snapshot(&db, &meta, &data)?;
            Ok((meta, data))
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let size = i64::try_from(data.len()).unwrap_or(i64::MAX);
        self.shared.timings.snapshot_built_bytes.set(size);
        tracing::info!(
            index = ?meta.last_log_id.map(|l| l.index),
            size_bytes = data.len(),
            duration_ms = started.elapsed().as_millis() as u64,
            "raft snapshot built"
        );
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

/// A way to make apply fail on purpose, so the store's containment of a failed apply can
/// be tested; compiled into tests only.
#[cfg(test)]
pub(crate) mod test_hooks {
    use super::Request;

    /// An audit record by this actor makes apply panic.
    pub(crate) const PANIC_ACTOR: &str = "test:panic-in-apply";

    pub(super) fn maybe_panic(request: &Request) {
        if let Request::Audit { entries } = request
            && entries.iter().any(|e| e.actor == PANIC_ACTOR)
        {
            panic!("apply failed on purpose (test hook)");
        }
    }
}

#[cfg(test)]
mod recent_tests {
    #![allow(clippy::unwrap_used)]

    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn indexes(recent: &Recent) -> Vec<u64> {
        recent
            .entries
            .iter()
            .map(|h| h.entry.log_id.index)
            .collect()
    }

    #[test]
    fn an_entry_the_file_lacks_is_held_however_much_is_held() {
        // Goal: over the byte cap, only entries the writer made durable are let go: a
        // read of one the file does not have yet must still find it here.
        let mut recent = Recent::default();
        let half = RECENT_BYTES_MAX / 2 + 1;
        recent.appended((1..=4).map(|i| (entry(1, i), half)).collect());
        assert_eq!(indexes(&recent), [1, 2, 3, 4], "none durable: all held");
        recent.made_durable(&[entry(1, 1).log_id, entry(1, 2).log_id]);
        assert_eq!(
            indexes(&recent),
            [3, 4],
            "the durable oldest went, down to the cap"
        );
        recent.made_durable(&[entry(1, 3).log_id]);
        assert_eq!(indexes(&recent), [4], "under the cap again");
        assert_eq!(recent.get(4, 4).unwrap()[0].log_id, entry(1, 4).log_id);
    }

    #[test]
    fn a_write_of_a_replaced_entry_does_not_mark_its_replacement() {
        // Goal: an append written after a truncation replaced its entries must not make the
        // replacements look durable (they are queued behind the truncation).
        let mut recent = Recent::default();
        let big = RECENT_BYTES_MAX;
        recent.appended(vec![(entry(1, 1), 1), (entry(1, 2), big)]);
        recent.truncated(2);
        recent.appended(vec![(entry(2, 2), big)]);
        recent.made_durable(&[entry(1, 1).log_id, entry(1, 2).log_id]);
        // Entry 1 is durable and goes (over the cap); term 2's entry 2 is not and stays.
        assert_eq!(indexes(&recent), [2]);
        assert_eq!(recent.entries[0].entry.log_id, entry(2, 2).log_id);
        assert!(!recent.entries[0].durable);
    }
}

#[cfg(test)]
mod background_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn own_priority() -> i32 {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
    }

    #[tokio::test]
    async fn background_work_runs_below_the_callers_priority_and_leaves_the_caller_alone() {
        // Goal: a snapshot's encoding yields to the threads acknowledgements wait on, and
        // lowering its priority never touches the thread that asked for it.
        let before = own_priority();
        let (priority, name) = in_background(|| {
            Ok((
                own_priority(),
                std::thread::current().name().map(str::to_owned),
            ))
        })
        .await
        .unwrap();
        assert_eq!(priority, BACKGROUND_NICE.max(before));
        assert_eq!(name.as_deref(), Some("raft-snapshot"));
        assert_eq!(own_priority(), before, "the caller's priority changed");
    }

    #[tokio::test]
    async fn background_work_that_fails_or_panics_is_an_error_for_the_caller() {
        let failed = in_background::<(), _>(|| Err(StoreError::WriterGone)).await;
        assert!(matches!(failed, Err(StoreError::WriterGone)), "{failed:?}");
        let panicked = in_background::<(), _>(|| panic!("on purpose")).await;
        assert!(
            matches!(panicked, Err(StoreError::SnapshotThread)),
            "{panicked:?}"
        );
    }
}
