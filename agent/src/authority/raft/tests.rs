//! The Raft layer: storage conformance and durability, and real clusters on loopback.
//!
//! Cluster tests run on real time and real sockets (openraft's timers need it) with short
//! heartbeats and elections, and wait on metrics rather than sleeping.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, StorageError, Vote};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use waymark_core::contract::HealthContract;
use waymark_core::model::ServiceName;
use waymark_registry::state::{Command, Stamped};

use super::codec;
use super::*;

const WAIT: Duration = Duration::from_secs(10);

// === storage ===

struct DiskBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for DiskBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<u64>> {
        let dir = TempDir::new().unwrap();
        let (events, _) = broadcast::channel(16);
        let (log, sm, _) = store::open(dir.path(), events).unwrap();
        Ok((dir, log, sm))
    }
}

#[test]
fn disk_store_passes_openraft_conformance_suite() {
    Suite::test_all(DiskBuilder).unwrap();
}

fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Blank,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_store_keeps_vote_purge_and_truncate() {
    // Goal: everything the log store acknowledged is there after a reopen.
    let dir = TempDir::new().unwrap();
    let mut closed = {
        let (events, _) = broadcast::channel(16);
        let (mut log, _, shared) = store::open(dir.path(), events).unwrap();
        log.save_vote(&Vote::new(3, 2)).await.unwrap();
        log.blocking_append((1..=10).map(|i| blank(1, i)))
            .await
            .unwrap();
        log.purge(LogId::new(CommittedLeaderId::new(1, 1), 3))
            .await
            .unwrap();
        log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 8))
            .await
            .unwrap();
        // Saved without an fsync of its own and no append after it: its scheduled
        // flush makes it durable before the store closes.
        log.save_committed(Some(LogId::new(CommittedLeaderId::new(1, 1), 6)))
            .await
            .unwrap();
        shared.closed.clone()
    };
    while closed.changed().await.is_ok() {}
    let (events, _) = broadcast::channel(16);
    let (mut log, _, _) = store::open(dir.path(), events).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(3));
    assert_eq!(state.last_log_id.map(|l| l.index), Some(7));
    assert_eq!(
        log.read_committed().await.unwrap().map(|l| l.index),
        Some(6)
    );
    let indexes: Vec<u64> = log
        .try_get_log_entries(0..100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.log_id.index)
        .collect();
    assert_eq!(indexes, [4, 5, 6, 7]);
}

/// A data directory as builds before the segment log left it: the entries in the
/// database's log table (1–3 binary, 4–6 in JSON as still older builds wrote them), no
/// `wal/` beside it.
fn older_layout(dir: &Path) -> Vec<Entry<TypeConfig>> {
    let entries: Vec<Entry<TypeConfig>> = (1..=6)
        .map(|i| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
            payload: EntryPayload::Normal(put_service(i)),
        })
        .collect();
    let db = redb::Database::create(dir.join(store::DB_FILE)).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut table = txn.open_table(store::LOGS).unwrap();
        for e in &entries {
            let bytes = if e.log_id.index <= 3 {
                codec::encode(e).unwrap()
            } else {
                serde_json::to_vec(e).unwrap()
            };
            assert_eq!(codec::is_binary(&bytes), e.log_id.index <= 3);
            table.insert(e.log_id.index, bytes.as_slice()).unwrap();
        }
    }
    txn.commit().unwrap();
    entries
}

/// Whether the database still has the log table older builds kept.
fn has_old_log_table(dir: &Path) -> bool {
    use redb::ReadableDatabase as _;
    let db = redb::Database::open(dir.join(store::DB_FILE)).unwrap();
    let txn = db.begin_read().unwrap();
    match txn.open_table(store::LOGS) {
        Ok(_) => true,
        Err(redb::TableError::TableDoesNotExist(_)) => false,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_an_older_build_kept_in_the_database_moves_to_segments_and_reads_the_same() {
    // Goal: a member upgraded in place finds the entries an older build wrote in the
    // database (binary and JSON), moves them to the segment log, drops the table, and
    // answers for every entry as it was, then and after another reopen.
    let dir = TempDir::new().unwrap();
    let older = older_layout(dir.path());
    // Entries compare by their JSON (the request types have no equality of their own).
    let as_json = |es: &[Entry<TypeConfig>]| serde_json::to_value(es).unwrap();
    for _ in 0..2 {
        let mut closed = {
            let (events, _) = broadcast::channel(16);
            let (mut log, _, shared) = store::open(dir.path(), events).unwrap();
            let state = log.get_log_state().await.unwrap();
            assert_eq!(state.last_log_id.map(|l| l.index), Some(6));
            let read = log.try_get_log_entries(1..=6).await.unwrap();
            assert_eq!(as_json(&read), as_json(&older));
            shared.closed.clone()
        };
        while closed.changed().await.is_ok() {}
        assert!(dir.path().join(wal::WAL_DIR).is_dir());
        assert!(!has_old_log_table(dir.path()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_to_segments_cut_short_is_done_again_or_finished() {
    // Goal: a crash while moving the log leaves either the old layout with a half-written
    // staging directory (moved again from the table) or the new layout with the table
    // still there (the table is dropped, the segments kept); the entries read the same.
    let as_json = |es: &[Entry<TypeConfig>]| serde_json::to_value(es).unwrap();

    // Cut short before the rename: a staging directory holding part of the log.
    let dir = TempDir::new().unwrap();
    let older = older_layout(dir.path());
    {
        let (partial, _) = wal::Wal::open(&dir.path().join(wal::WAL_MIGRATING_DIR), None).unwrap();
        partial
            .append(
                &[(older[0].log_id, &codec::encode(&older[0]).unwrap())],
                None,
            )
            .unwrap();
    }
    let (events, _) = broadcast::channel(16);
    let (mut log, _, _) = store::open(dir.path(), events).unwrap();
    let read = log.try_get_log_entries(1..=6).await.unwrap();
    assert_eq!(as_json(&read), as_json(&older));
    assert!(!dir.path().join(wal::WAL_MIGRATING_DIR).exists());
    drop(log);

    // Cut short after the rename: the segments are whole and the table is still there,
    // holding entries the segments have since been truncated past.
    let dir = TempDir::new().unwrap();
    let older = older_layout(dir.path());
    {
        let (moved, _) = wal::Wal::open(&dir.path().join(wal::WAL_DIR), None).unwrap();
        let encoded: Vec<Vec<u8>> = older[..2]
            .iter()
            .map(|e| codec::encode(e).unwrap())
            .collect();
        let entries: Vec<_> = older[..2]
            .iter()
            .zip(&encoded)
            .map(|(e, b)| (e.log_id, b.as_slice()))
            .collect();
        moved.append(&entries, None).unwrap();
    }
    let (events, _) = broadcast::channel(16);
    let (mut log, _, shared) = store::open(dir.path(), events).unwrap();
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id.map(|l| l.index), Some(2));
    let read = log.try_get_log_entries(1..=2).await.unwrap();
    assert_eq!(as_json(&read), as_json(&older[..2]));
    let mut closed = shared.closed.clone();
    drop((log, shared));
    while closed.changed().await.is_ok() {}
    assert!(!has_old_log_table(dir.path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_read_back_are_what_the_log_holds_after_truncation_and_purge() {
    // Goal: the decoded entries the store keeps from its appends never answer for a
    // suffix that was truncated and rewritten, nor for a purged prefix.
    let dir = TempDir::new().unwrap();
    let (events, _) = broadcast::channel(16);
    let (mut log, _, _) = store::open(dir.path(), events).unwrap();
    log.blocking_append((1..=10).map(|i| blank(1, i)))
        .await
        .unwrap();
    let terms = |entries: Vec<Entry<TypeConfig>>| -> Vec<(u64, u64)> {
        entries
            .iter()
            .map(|e| (e.log_id.index, e.log_id.leader_id.term))
            .collect()
    };
    log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 6))
        .await
        .unwrap();
    let kept: Vec<(u64, u64)> = (1..=5).map(|i| (i, 1)).collect();
    assert_eq!(terms(log.try_get_log_entries(1..=10).await.unwrap()), kept);
    log.blocking_append((6..=8).map(|i| blank(2, i)))
        .await
        .unwrap();
    let expected: Vec<(u64, u64)> = (1..=5)
        .map(|i| (i, 1))
        .chain((6..=8).map(|i| (i, 2)))
        .collect();
    assert_eq!(
        terms(log.try_get_log_entries(1..=8).await.unwrap()),
        expected
    );
    assert_eq!(
        terms(log.try_get_log_entries(6..9).await.unwrap()),
        expected[5..]
    );
    assert_eq!(
        terms(log.try_get_log_entries(7..).await.unwrap()),
        expected[6..]
    );
    log.purge(LogId::new(CommittedLeaderId::new(1, 1), 4))
        .await
        .unwrap();
    assert_eq!(
        terms(log.try_get_log_entries(1..=8).await.unwrap()),
        expected[4..]
    );
}

/// An entry whose encoding is about `kb` kilobytes.
fn sized(term: u64, index: u64, kb: usize) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Normal(Request::Audit {
            entries: vec![waymark_registry::machine::AuditEntry {
                seq: 0,
                at_ms: 1,
                kind: waymark_registry::machine::AuditKind::Denial,
                actor: "test".into(),
                service: None,
                instance: None,
                outcome: "x".repeat(kb * 1024),
                detail: serde_json::Value::Null,
            }],
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_append_carries_is_bounded_by_bytes_from_memory_and_from_disk() {
    // Goal: a follower is never sent more than about APPEND_BYTES_MAX in one AppendEntries,
    // whether the entries are still held decoded or must be read back, and an entry larger
    // than the bound still goes, alone.
    let dir = TempDir::new().unwrap();
    let (events, _) = broadcast::channel(16);
    let kb = APPEND_BYTES_MAX / 1024 / 4 + 1; // five do not fit, four do
    let indexes = |entries: Vec<Entry<TypeConfig>>| -> Vec<u64> {
        entries.iter().map(|e| e.log_id.index).collect()
    };
    let mut closed = {
        let (mut log, _, shared) = store::open(dir.path(), events.clone()).unwrap();
        log.blocking_append((1..=10).map(|i| sized(1, i, kb)))
            .await
            .unwrap();
        log.blocking_append([sized(1, 11, 2 * APPEND_BYTES_MAX / 1024)])
            .await
            .unwrap();
        assert_eq!(
            indexes(log.limited_get_log_entries(1, 12).await.unwrap()),
            [1, 2, 3]
        );
        assert_eq!(
            indexes(log.limited_get_log_entries(9, 12).await.unwrap()),
            [9, 10]
        );
        assert_eq!(
            indexes(log.limited_get_log_entries(11, 12).await.unwrap()),
            [11]
        );
        assert_eq!(
            indexes(log.limited_get_log_entries(2, 4).await.unwrap()),
            [2, 3]
        );
        shared.closed.clone()
    };
    // The writer may still hold the store for a moment after its last answer.
    while closed.changed().await.is_ok() {}
    // Reopened: nothing held in memory, everything read back from the log's files.
    let (mut log, _, _) = store::open(dir.path(), events).unwrap();
    assert_eq!(
        indexes(log.limited_get_log_entries(1, 12).await.unwrap()),
        [1, 2, 3]
    );
    assert_eq!(
        indexes(log.limited_get_log_entries(11, 12).await.unwrap()),
        [11]
    );
    assert!(log.limited_get_log_entries(5, 5).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_append_persists_the_committed_index() {
    // Goal: saving the committed index writes nothing itself; the next log append carries
    // it in its own transaction (the idle flush is put off past the test).
    let dir = TempDir::new().unwrap();
    let (events, _) = broadcast::channel(16);
    let (log, _, _) = store::open(dir.path(), events).unwrap();
    let mut log = log.with_committed_flush_after(Duration::from_secs(3600));
    log.blocking_append((1..=4).map(|i| blank(1, i)))
        .await
        .unwrap();
    log.save_committed(Some(LogId::new(CommittedLeaderId::new(1, 1), 3)))
        .await
        .unwrap();
    assert_eq!(
        log.durable_committed().await.unwrap(),
        None,
        "written at once"
    );
    // What a process killed now would restart from: the hint, beside the database.
    assert_eq!(log.hinted_committed().map(|l| l.index), Some(3));
    assert_eq!(
        log.read_committed().await.unwrap().map(|l| l.index),
        Some(3)
    );
    log.blocking_append([blank(1, 5)]).await.unwrap();
    assert_eq!(
        log.durable_committed().await.unwrap().map(|l| l.index),
        Some(3)
    );
}

#[test]
fn a_committed_index_hint_that_does_not_decode_is_ignored() {
    // Goal: a damaged hint never stops a member opening or names an index it never saved.
    let dir = TempDir::new().unwrap();
    for bytes in [
        &b"\xff\xff garbage"[..],
        &b"\x05\x00{\"no"[..],
        &b"\x01"[..],
    ] {
        std::fs::write(dir.path().join("committed.hint"), bytes).unwrap();
        let (events, _) = broadcast::channel(16);
        let (log, _, _) = store::open(dir.path(), events).unwrap();
        assert_eq!(log.hinted_committed(), None, "{bytes:?}");
    }
}

fn snapshot_meta(index: u64) -> openraft::SnapshotMeta<u64, Member> {
    openraft::SnapshotMeta {
        last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), index)),
        last_membership: openraft::StoredMembership::default(),
        snapshot_id: format!("s{index}"),
    }
}

/// A state that differs from the default by `index`, encoded as a snapshot holds it.
fn snapshot_data(index: u64) -> Vec<u8> {
    let mut state = AuthorityState::default();
    state.apply(put_service(index));
    serde_json::to_vec(&state).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_an_older_build_kept_in_the_database_is_read_then_moved_to_the_file() {
    // Goal: a data directory whose snapshot sits in the log's database (beside the small
    // records, as the oldest builds wrote it) opens with that snapshot's state; the next
    // snapshot goes to the snapshot file, and the database keeps none behind.
    use openraft::storage::RaftStateMachine as _;
    let dir = TempDir::new().unwrap();
    {
        let db = redb::Database::create(dir.path().join(DB_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut old = txn.open_table(store::META).unwrap();
            let encoded = serde_json::to_vec(&snapshot_meta(5)).unwrap();
            old.insert(store::KEY_SNAPSHOT_META, encoded.as_slice())
                .unwrap();
            old.insert(store::KEY_SNAPSHOT_DATA, snapshot_data(5).as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let (events, _) = broadcast::channel(16);
    let (_log, mut sm, shared) = store::open(dir.path(), events).unwrap();
    assert_eq!(shared.applied_meta().last_applied.map(|l| l.index), Some(5));
    let held = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(held.meta.snapshot_id, "s5");
    assert!(!dir.path().join(snapshot_file::SNAPSHOT_FILE).exists());

    sm.install_snapshot(
        &snapshot_meta(9),
        Box::new(std::io::Cursor::new(snapshot_data(9))),
    )
    .await
    .unwrap();
    let held = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(held.meta.snapshot_id, "s9");
    assert_eq!(held.snapshot.into_inner(), snapshot_data(9));
    let on_disk = snapshot_file::decode(
        std::fs::read(dir.path().join(snapshot_file::SNAPSHOT_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(on_disk.0.snapshot_id, "s9");
    drop((_log, sm, shared));
    let db = redb::Database::open(dir.path().join(DB_FILE)).unwrap();
    assert!(store::load_legacy_snapshot(&db).unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_snapshot_never_replaces_a_newer_one_and_both_survive_a_reopen() {
    // Goal: a snapshot built from an older state that finishes after a newer one was
    // installed is not written over it (the log before the newer one may be purged), and a
    // reopened store starts from the newest.
    use openraft::storage::RaftStateMachine as _;
    let dir = TempDir::new().unwrap();
    {
        let (events, _) = broadcast::channel(16);
        let (_log, mut sm, _) = store::open(dir.path(), events).unwrap();
        sm.install_snapshot(
            &snapshot_meta(9),
            Box::new(std::io::Cursor::new(snapshot_data(9))),
        )
        .await
        .unwrap();
        sm.install_snapshot(
            &snapshot_meta(4),
            Box::new(std::io::Cursor::new(snapshot_data(4))),
        )
        .await
        .unwrap();
        let held = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(held.meta.snapshot_id, "s9");
    }
    let (events, _) = broadcast::channel(16);
    let (_log, _sm, shared) = store::open(dir.path(), events).unwrap();
    assert_eq!(shared.applied_meta().last_applied.map(|l| l.index), Some(9));
    let want: AuthorityState = serde_json::from_slice(&snapshot_data(9)).unwrap();
    assert_eq!(*shared.state.read().unwrap(), want);
}

#[test]
fn a_damaged_snapshot_file_is_refused_with_what_is_wrong_and_the_store_does_not_open() {
    // Goal: a snapshot file that was cut short, altered, extended or is not one at all is
    // refused with a reason naming it; the member does not start from a state it cannot
    // trust, and an unfinished write's temporary file is simply removed.
    use snapshot_file::{SnapshotFileError as E, decode, encode_head};
    let data = snapshot_data(3);
    let mut whole = encode_head(&snapshot_meta(3), &data).unwrap();
    whole.extend_from_slice(&data);
    let (meta, back) = decode(whole.clone()).unwrap();
    assert_eq!((meta, back), (snapshot_meta(3), data.clone()));

    let cut = whole[..whole.len() - 1].to_vec();
    assert!(matches!(decode(cut.clone()), Err(E::Truncated { .. })));
    let mut longer = whole.clone();
    longer.push(0);
    assert!(matches!(decode(longer), Err(E::Trailing { extra: 1 })));
    let mut flipped = whole.clone();
    *flipped.last_mut().unwrap() ^= 1;
    assert!(matches!(decode(flipped), Err(E::Checksum { .. })));
    let mut other = whole.clone();
    other[7] = b'9';
    assert!(matches!(decode(other), Err(E::Magic)));
    let mut huge = whole.clone();
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(decode(huge), Err(E::MetaTooLong { .. })));
    assert!(matches!(decode(vec![0; 3]), Err(E::Truncated { .. })));

    let dir = TempDir::new().unwrap();
    std::fs::write(dir.path().join(snapshot_file::SNAPSHOT_FILE), &cut).unwrap();
    let (events, _) = broadcast::channel(16);
    let refused = store::open(dir.path(), events).err().unwrap();
    assert!(
        matches!(&refused, StoreError::Snapshot(E::Truncated { .. })),
        "{refused:?}"
    );

    std::fs::write(dir.path().join(snapshot_file::SNAPSHOT_FILE), &whole).unwrap();
    std::fs::write(dir.path().join("snapshot.bin.tmp"), b"half a snap").unwrap();
    let (events, _) = broadcast::channel(16);
    let (_log, _sm, shared) = store::open(dir.path(), events).unwrap();
    assert_eq!(shared.applied_meta().last_applied.map(|l| l.index), Some(3));
    assert!(!dir.path().join("snapshot.bin.tmp").exists());
}

#[test]
fn a_state_with_published_views_encodes_as_a_snapshot() {
    // Goal: snapshot encoding (the codec's binary form) covers every part of the state,
    // and the JSON a member wrote before it still reads.
    use waymark_core::model::ZoneName;
    use waymark_core::view::{ReleasedView, Version, View, ViewKey};
    let mut state = AuthorityState::default();
    let key = ViewKey {
        service: ServiceName::try_new("pay").unwrap(),
        zone: ZoneName::try_new("a").unwrap(),
    };
    state.apply(Request::Publish {
        views: vec![ReleasedView {
            version: Version(1),
            view: View::empty(key),
        }],
    });
    let bytes = super::codec::encode(&state).unwrap();
    let back: AuthorityState = super::codec::decode(&bytes).unwrap();
    assert_eq!(back, state);
    let json = serde_json::to_vec(&state).unwrap();
    let back: AuthorityState = super::codec::decode(&json).unwrap();
    assert_eq!(back, state);
}

// === clusters on loopback ===

/// One member: its Raft and the HTTP server serving its `/raft/*` routes.
struct TestMember {
    id: u64,
    addr: SocketAddr,
    node: RaftNode,
    stop: oneshot::Sender<()>,
    server: JoinHandle<()>,
}

async fn start(id: u64, root: &Path, addr: Option<SocketAddr>, snapshot_every: u64) -> TestMember {
    start_with(id, root, addr, snapshot_every, APPEND_BATCH_MAX).await
}

async fn start_with(
    id: u64,
    root: &Path,
    addr: Option<SocketAddr>,
    snapshot_every: u64,
    append_batch_max: u64,
) -> TestMember {
    start_tuned(id, root, addr, |config| {
        config.snapshot_every = snapshot_every;
        config.append_batch_max = append_batch_max;
    })
    .await
}

/// A member with the tests' timings and no logs kept below a snapshot, then `tune`.
async fn start_tuned(
    id: u64,
    root: &Path,
    addr: Option<SocketAddr>,
    tune: impl FnOnce(&mut RaftConfig),
) -> TestMember {
    let bind = addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap());
    let listener = TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let member = Member {
        raft_addr: addr.to_string(),
        api_addr: addr.to_string(),
    };
    let mut config = RaftConfig::new(id, root.join(format!("m{id}")), member);
    config.heartbeat = Duration::from_millis(50);
    config.election_min = Duration::from_millis(300);
    config.election_max = Duration::from_millis(600);
    config.logs_kept_after_snapshot = 0;
    tune(&mut config);
    let node = RaftNode::open(config).await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let serve = axum::serve(
        listener,
        node.router(Senders::Unchecked, RaftRpcMetrics::default()),
    )
    .with_graceful_shutdown(async {
        let _ = stopped.await;
    });
    let server = tokio::spawn(async move {
        let _ = serve.await;
    });
    TestMember {
        id,
        addr,
        node,
        stop,
        server,
    }
}

impl TestMember {
    fn member(&self) -> Member {
        let addr = self.addr.to_string();
        Member {
            raft_addr: addr.clone(),
            api_addr: addr,
        }
    }

    /// Like a process exit: Raft stops and the server closes its connections.
    async fn stop(self) {
        self.node.shutdown().await;
        let _ = self.stop.send(());
        let mut server = self.server;
        if tokio::time::timeout(Duration::from_secs(2), &mut server)
            .await
            .is_err()
        {
            server.abort();
        }
    }

    async fn applied_at_least(&self, index: u64) {
        self.node
            .raft
            .wait(Some(WAIT))
            .applied_index_at_least(Some(index), "applied")
            .await
            .unwrap();
    }

    /// What the state reflects. (openraft's metrics trail the state machine a little: a
    /// write returns once applied, before the metrics say so.)
    fn last_applied(&self) -> u64 {
        self.node.with_state(|_, applied| applied.unwrap_or(0))
    }

    fn state(&self) -> AuthorityState {
        self.node.state().read().unwrap().clone()
    }

    /// Assert this member's state equals `want`, with a short message when it does not.
    fn assert_state(&self, want: &AuthorityState) {
        let (got, applied) = self.node.with_state(|s, applied| (s.clone(), applied));
        if &got != want {
            let names = |s: &AuthorityState| -> Vec<String> {
                s.registry()
                    .services()
                    .map(|(n, _)| n.to_string())
                    .collect()
            };
            let m = self.node.watch_metrics().borrow().clone();
            panic!(
                "member {} (applied {applied:?}, metrics {m}) diverged: clock {} vs {}, services {:?} vs {:?}",
                self.id,
                got.registry().clock_ms(),
                want.registry().clock_ms(),
                names(&got),
                names(want),
            );
        }
    }
}

fn put_service(i: u64) -> Request {
    Request::Registry(Stamped {
        at_ms: 1_000 + i,
        command: Command::PutService {
            service: ServiceName::try_new(format!("svc-{i}")).unwrap(),
            owner: "team".into(),
            contract: HealthContract::default(),
        },
    })
}

async fn write_all(node: &RaftNode, range: std::ops::Range<u64>) {
    for i in range {
        let response = node.write(put_service(i)).await.unwrap();
        assert!(
            matches!(response, Response::Registry { outcome: Ok(_) }),
            "{response:?}"
        );
    }
}

/// Wait until one of `members` is the leader all of them agree on, other than `not`.
async fn agreed_leader(members: &[&TestMember], not: Option<u64>) -> u64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let leaders: Vec<_> = members.iter().map(|m| m.node.leader()).collect();
        if let Some(Some((id, _))) = leaders.first() {
            let agreed = leaders.iter().all(|l| l.as_ref().map(|l| l.0) == Some(*id));
            let leading = members.iter().any(|m| m.id == *id && m.node.is_leader());
            if agreed && leading && Some(*id) != not {
                return *id;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no leader: {leaders:?}"
        );
        // Any member's metrics change (term, leader) is what we wait for.
        let mut watch = members[0].node.watch_metrics();
        let _ = tokio::time::timeout(Duration::from_millis(100), watch.changed()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_member_restarts_with_identical_state() {
    // Goal: a restarted member comes back from its redb dir with snapshot, log and vote.
    let root = TempDir::new().unwrap();
    let one = start(1, root.path(), None, 10).await;
    one.node
        .initialize(BTreeMap::from([(1, one.member())]))
        .await
        .unwrap();
    // Initializing twice is harmless.
    one.node
        .initialize(BTreeMap::from([(1, one.member())]))
        .await
        .unwrap();
    agreed_leader(&[&one], None).await;
    write_all(&one.node, 0..25).await;
    let before = one.state();
    let applied = one.last_applied();
    let term = one.node.current_term();
    let addr = one.addr;
    one.stop().await;

    let one = start(1, root.path(), Some(addr), 10).await;
    // The committed tail is re-applied before `open` returns, so whatever starts serving
    // from the state next (the xDS tier) never sees only the older snapshot.
    assert_eq!(one.last_applied(), applied);
    one.assert_state(&before);
    assert!(one.node.current_term() >= term);
    assert!(
        one.node.watch_metrics().borrow().snapshot.is_some(),
        "a snapshot was persisted"
    );
    // And it still takes writes.
    agreed_leader(&[&one], None).await;
    write_all(&one.node, 25..30).await;
    assert_eq!(one.state().registry().services().count(), 30);
    one.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_grown_by_bytes_is_snapshotted_and_purged_before_its_entry_count_is_due() {
    // Goal: a few large entries call for a snapshot by their bytes alone (the entry count
    // is far off), and the log below it is purged; the state survives a restart from it.
    let root = TempDir::new().unwrap();
    let one = start_tuned(1, root.path(), None, |c| {
        c.snapshot_every = 1_000_000;
        c.snapshot_log_bytes = 64 * 1024;
    })
    .await;
    one.node
        .initialize(BTreeMap::from([(1, one.member())]))
        .await
        .unwrap();
    agreed_leader(&[&one], None).await;
    assert!(one.node.watch_metrics().borrow().snapshot.is_none());
    // put_large_service entries are tens of kB each: a few pass 64 KiB.
    for i in 0..8 {
        one.node.write(put_large_service(i)).await.unwrap();
    }
    let mut metrics = one.node.watch_metrics();
    let snapshotted = tokio::time::timeout(
        Duration::from_secs(20),
        metrics.wait_for(|m| m.snapshot.is_some() && m.purged.is_some()),
    )
    .await
    // Let go of the metrics guard at once: openraft's core waits for it to publish more.
    .is_ok_and(|seen| seen.is_ok());
    assert!(snapshotted, "{:?}", one.node.watch_metrics().borrow());
    let before = one.state();
    let addr = one.addr;
    one.stop().await;
    let one = start_tuned(1, root.path(), Some(addr), |c| c.snapshot_every = 1_000_000).await;
    one.assert_state(&before);
    one.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_cluster_survives_losing_its_leader() {
    // Goal: all members converge; after the leader stops a new one takes writes, and the
    // old leader restarts from its dir and catches up (by snapshot, as logs are purged).
    let root = TempDir::new().unwrap();
    let mut members = Vec::new();
    for id in 1..=3 {
        members.push(start(id, root.path(), None, 20).await);
    }
    members[0]
        .node
        .initialize(BTreeMap::from([(1, members[0].member())]))
        .await
        .unwrap();
    agreed_leader(&[&members[0]], None).await;
    for m in &members[1..] {
        members[0].node.add_member(m.id, m.member()).await.unwrap();
    }
    let mut events = members[2].node.subscribe();
    write_all(&members[0].node, 0..50).await;
    let last = members[0].last_applied();
    for m in &members {
        m.applied_at_least(last).await;
    }
    let state = members[0].state();
    assert_eq!(state.registry().services().count(), 50);
    for m in &members[1..] {
        m.assert_state(&state);
    }
    // Followers publish what they apply.
    let mut seen = 0;
    while let Ok(StateEvent::Applied(entry)) = events.try_recv() {
        assert!(matches!(entry.request, Request::Registry(_)));
        seen += 1;
    }
    assert_eq!(seen, 50);

    let peers = members[0].node.peers();
    assert_eq!(peers.len(), 3);
    assert_eq!(
        peers.iter().filter(|p| p.role == PeerRole::Leader).count(),
        1
    );
    assert!(peers.iter().all(|p| p.role != PeerRole::Learner));
    // A follower knows its own progress, not others' lag.
    let follower_view = members[1].node.peers();
    assert!(follower_view.iter().all(|p| p.lag.is_none()));

    // Stop the leader.
    let old = agreed_leader(&[&members[0], &members[1], &members[2]], None).await;
    let at = members.iter().position(|m| m.id == old).unwrap();
    let stopped = members.remove(at);
    let (old_id, old_addr) = (stopped.id, stopped.addr);
    stopped.stop().await;

    let new = agreed_leader(&[&members[0], &members[1]], Some(old_id)).await;
    let leader = members.iter().find(|m| m.id == new).unwrap();
    let follower = members.iter().find(|m| m.id != new).unwrap();
    match follower.node.write(put_service(999)).await {
        Err(WriteError::NotLeader {
            leader: Some((id, _)),
        }) => assert_eq!(id, new),
        other => panic!("{other:?}"),
    }
    write_all(&leader.node, 50..80).await;
    leader.node.ensure_linearizable().await.unwrap();
    let last = leader.last_applied();

    // The old leader restarts on its dir and catches up.
    let back = start(old_id, root.path(), Some(old_addr), 20).await;
    let mut back_events = back.node.subscribe();
    back.applied_at_least(last).await;
    let state = leader.state();
    assert_eq!(state.registry().services().count(), 80);
    for m in members.iter().chain([&back]) {
        m.applied_at_least(last).await;
        m.assert_state(&state);
    }
    let mut resynced = false;
    while let Ok(event) = back_events.try_recv() {
        resynced |= matches!(event, StateEvent::SnapshotInstalled { .. });
    }
    assert!(resynced, "the restarted member was sent a snapshot");

    // Remove the restarted member: the group is two voters, and writes still commit.
    leader.node.remove_member(old_id).await.unwrap();
    let peers = leader.node.peers();
    assert_eq!(peers.len(), 2, "{peers:?}");
    assert!(peers.iter().all(|p| p.id != old_id));
    write_all(&leader.node, 80..85).await;
    assert_eq!(leader.state().registry().services().count(), 85);

    back.stop().await;
    for m in members {
        m.stop().await;
    }
}

/// A large entry (a 20 kB owner), standing in for a `Publish` entry carrying whole views.
fn put_large_service(i: u64) -> Request {
    Request::Registry(Stamped {
        at_ms: 1_000 + i,
        command: Command::PutService {
            service: ServiceName::try_new(format!("big-{i}")).unwrap(),
            owner: "x".repeat(20_000),
            contract: HealthContract::default(),
        },
    })
}

/// Three members; one follower is stopped while 400 large entries commit, restarted, and
/// then the other follower stops, so the leader needs the lagging one for every commit.
/// Whether a write then commits within `within`.
async fn lagging_follower_rejoins_quorum(append_batch_max: u64, within: Duration) -> bool {
    let root = TempDir::new().unwrap();
    let mut members = Vec::new();
    for id in 1..=3 {
        // No snapshot: the follower catches up from the log.
        members.push(start_with(id, root.path(), None, 100_000, append_batch_max).await);
    }
    members[0]
        .node
        .initialize(BTreeMap::from([(1, members[0].member())]))
        .await
        .unwrap();
    agreed_leader(&[&members[0]], None).await;
    for m in &members[1..] {
        members[0].node.add_member(m.id, m.member()).await.unwrap();
    }
    let third = members.pop().unwrap();
    let (third_id, third_addr) = (third.id, third.addr);
    third.stop().await;
    for i in 0..400 {
        members[0].node.write(put_large_service(i)).await.unwrap();
    }
    let back = start_with(
        third_id,
        root.path(),
        Some(third_addr),
        100_000,
        append_batch_max,
    )
    .await;
    let second = members.pop().unwrap();
    second.stop().await;
    let committed = tokio::time::timeout(within, members[0].node.write(put_service(1)))
        .await
        .is_ok_and(|r| r.is_ok());
    back.stop().await;
    for m in members {
        m.stop().await;
    }
    committed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_far_behind_on_large_entries_catches_up_and_restores_the_quorum() {
    assert!(
        lagging_follower_rejoins_quorum(APPEND_BATCH_MAX, Duration::from_secs(30)).await,
        "the lagging follower never caught up: no write committed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_entry_that_panics_in_apply_is_contained_and_survives_a_restart() {
    // Goal: an apply that fails unexpectedly must not stop Raft (which crash-loops the
    // member on replay); the member keeps committing, says so, and restarts on its data.
    use crate::authority::raft::store::test_hooks::PANIC_ACTOR;
    use waymark_registry::machine::{AuditEntry, AuditKind};
    let root = TempDir::new().unwrap();
    let one = start(1, root.path(), None, 1_000).await;
    one.node
        .initialize(BTreeMap::from([(1, one.member())]))
        .await
        .unwrap();
    agreed_leader(&[&one], None).await;
    write_all(&one.node, 0..3).await;
    let poison = Request::Audit {
        entries: vec![AuditEntry {
            seq: 0,
            at_ms: 1,
            kind: AuditKind::Denial,
            actor: PANIC_ACTOR.into(),
            service: None,
            instance: None,
            outcome: "refused".into(),
            detail: serde_json::Value::Null,
        }],
    };
    let response = one.node.write(poison).await.unwrap();
    assert!(
        matches!(response, Response::ApplyFailed { .. }),
        "{response:?}"
    );
    let failures = one.node.apply_failures();
    assert_eq!(failures.len(), 1);
    assert!(failures[0].message.contains("on purpose"), "{failures:?}");
    assert_eq!(one.node.apply_failures_total().get(), 1);
    // Raft is still running: later writes commit and apply.
    write_all(&one.node, 3..6).await;
    assert_eq!(one.state().registry().services().count(), 6);
    let before = one.state();
    let addr = one.addr;
    one.stop().await;

    // Restarted on the same folder: the entry is replayed into the same contained failure,
    // the member opens, reports it, and holds the same state.
    let one = start(1, root.path(), Some(addr), 1_000).await;
    one.assert_state(&before);
    assert_eq!(one.node.apply_failures().len(), 1);
    agreed_leader(&[&one], None).await;
    write_all(&one.node, 6..7).await;
    one.stop().await;
}
