//! The segment log on real files: what it holds across reopens, truncations and purges,
//! what it does with a torn tail and with damage, and what it refuses.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tempfile::TempDir;

use super::*;

fn id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 7), index)
}

/// A payload that says which entry (and which term) it belongs to, of `len` bytes.
fn payload(term: u64, index: u64, len: usize) -> Vec<u8> {
    let mut p = format!("{term}/{index}/").into_bytes();
    p.resize(len.max(p.len()), b'x');
    p
}

fn append(wal: &Wal, term: u64, indexes: std::ops::RangeInclusive<u64>, len: usize) {
    let payloads: Vec<(LogId<NodeId>, Vec<u8>)> = indexes
        .map(|i| (id(term, i), payload(term, i, len)))
        .collect();
    let entries: Vec<(LogId<NodeId>, &[u8])> =
        payloads.iter().map(|(i, p)| (*i, p.as_slice())).collect();
    wal.append(&entries, None).unwrap();
}

fn all(wal: &Wal) -> Vec<Vec<u8>> {
    match (wal.first(), wal.last()) {
        (Some(first), Some(last)) => wal.read(first.index, last.index, usize::MAX).unwrap(),
        _ => Vec::new(),
    }
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn a_log_reopens_with_every_entry_it_acknowledged_across_segments() {
    // Goal: what was appended (in several appends, across segment boundaries, one record
    // larger than a whole segment) reads back byte for byte after a reopen, in order.
    let dir = TempDir::new().unwrap();
    let mut want = Vec::new();
    {
        let (wal, opened) = Wal::open_with(dir.path(), None, 4096).unwrap();
        assert_eq!(opened, Opened::default());
        for (from, to, len) in [(1, 30, 100), (31, 31, 10_000), (32, 90, 300)] {
            append(&wal, 2, from..=to, len);
            want.extend((from..=to).map(|i| payload(2, i, len)));
        }
        assert_eq!(all(&wal), want);
    }
    assert!(segments(dir.path()).len() > 5, "{:?}", segments(dir.path()));
    let (wal, opened) = Wal::open_with(dir.path(), None, 4096).unwrap();
    assert_eq!(opened.last, Some(id(2, 90)));
    assert_eq!(opened.torn_bytes, 0);
    assert_eq!(wal.first(), Some(id(2, 1)));
    assert_eq!(all(&wal), want);
    // Bounded by bytes: the first always comes, then as many as fit.
    assert_eq!(wal.read(31, 40, 1).unwrap(), vec![payload(2, 31, 10_000)]);
    assert_eq!(wal.read(32, 40, 650).unwrap().len(), 2);
}

#[test]
fn a_read_is_a_range_query_over_what_is_held() {
    // Goal: reading a range returns the entries the log holds within it, in order: none
    // of what was purged or lies beyond the end, and never an error for asking wider.
    let dir = TempDir::new().unwrap();
    let (wal, _) = Wal::open_with(dir.path(), None, 4096).unwrap();
    append(&wal, 1, 1..=30, 200);
    wal.purge(12).unwrap();
    let held: Vec<Vec<u8>> = (13..=30).map(|i| payload(1, i, 200)).collect();
    assert_eq!(wal.read(0, u64::MAX, usize::MAX).unwrap(), held);
    assert_eq!(wal.read(5, 14, usize::MAX).unwrap(), held[..2].to_vec());
    assert_eq!(wal.read(29, 99, usize::MAX).unwrap(), held[16..].to_vec());
    assert!(wal.read(31, 40, usize::MAX).unwrap().is_empty());
    assert!(wal.read(1, 12, usize::MAX).unwrap().is_empty());
    assert!(wal.read(20, 19, usize::MAX).unwrap().is_empty());
}

#[test]
fn the_committed_index_rides_an_append_and_is_read_back_at_open() {
    let dir = TempDir::new().unwrap();
    {
        let (wal, _) = Wal::open(dir.path(), None).unwrap();
        wal.append(&[(id(1, 1), b"a"), (id(1, 2), b"b")], Some(id(1, 1)))
            .unwrap();
        wal.append(&[(id(1, 3), b"c")], Some(id(1, 2))).unwrap();
        assert_eq!(wal.committed(), Some(id(1, 2)));
    }
    let (wal, opened) = Wal::open(dir.path(), None).unwrap();
    assert_eq!(opened.committed, Some(id(1, 2)));
    assert_eq!(opened.last, Some(id(1, 3)));
    assert_eq!(all(&wal), [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
}

/// The one segment file in `dir`.
fn only_segment(dir: &Path) -> PathBuf {
    let files = segments(dir);
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

/// Where the record of the `n`th entry (0-based) starts in a segment of equal-sized
/// records of `len`-byte payloads.
fn record_at(n: u64, len: usize) -> u64 {
    SEGMENT_MAGIC.len() as u64 + n * record_len(len) as u64
}

#[test]
fn a_torn_tail_ends_the_log_and_nothing_stale_is_read_after_new_appends() {
    // Goal: a record cut short by a crash (its second half never reached the disk) is
    // dropped with everything after it; the next append goes where it was, and a reopen
    // reads exactly the new entries, never a stale record from the torn write's bytes.
    for damage in ["zeroed half", "garbage half"] {
        let dir = TempDir::new().unwrap();
        {
            let (wal, _) = Wal::open(dir.path(), None).unwrap();
            append(&wal, 1, 1..=10, 200);
        }
        let path = only_segment(dir.path());
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        let at = record_at(9, 200) + 100;
        let bytes = if damage == "zeroed half" {
            vec![0; 100]
        } else {
            vec![0xa5; 100]
        };
        file.write_all_at(&bytes, at).unwrap();
        drop(file);

        let (wal, opened) = Wal::open(dir.path(), None).unwrap();
        assert_eq!(opened.last, Some(id(1, 9)), "{damage}");
        assert!(opened.torn_bytes > 0, "{damage}");
        append(&wal, 3, 10..=11, 50);
        drop(wal);
        let (wal, opened) = Wal::open(dir.path(), None).unwrap();
        assert_eq!(opened.torn_bytes, 0, "{damage}: the tail was zeroed");
        assert_eq!(opened.last, Some(id(3, 11)), "{damage}");
        let read = all(&wal);
        assert_eq!(read.len(), 11);
        assert_eq!(read[9], payload(3, 10, 50));
        assert_eq!(read[10], payload(3, 11, 50));
    }
}

#[test]
fn damage_before_the_last_segment_is_refused_and_nothing_changes() {
    // Goal: a bad record in a segment that is not the last is damage, not a torn write:
    // the log does not open, names the file and the offset, and no file is touched.
    let dir = TempDir::new().unwrap();
    {
        let (wal, _) = Wal::open_with(dir.path(), None, 4096).unwrap();
        append(&wal, 1, 1..=40, 300);
    }
    let files = segments(dir.path());
    assert!(files.len() >= 3);
    let file = OpenOptions::new().write(true).open(&files[0]).unwrap();
    let at = record_at(2, 300) + 40;
    file.write_all_at(b"rot", at).unwrap();
    drop(file);
    let before: Vec<Vec<u8>> = files.iter().map(|f| fs::read(f).unwrap()).collect();

    let err = Wal::open_with(dir.path(), None, 4096).unwrap_err();
    match &err {
        WalError::Corrupt {
            path,
            offset,
            reason,
        } => {
            assert_eq!(path, &files[0]);
            assert_eq!(*offset, record_at(2, 300));
            assert_eq!(*reason, Bad::Checksum.as_str());
        }
        other => panic!("expected damage, got {other:?}"),
    }
    let after: Vec<Vec<u8>> = files.iter().map(|f| fs::read(f).unwrap()).collect();
    assert_eq!(before, after);
}

#[test]
fn a_missing_segment_is_a_gap_and_a_foreign_file_is_not_a_segment() {
    let dir = TempDir::new().unwrap();
    {
        let (wal, _) = Wal::open_with(dir.path(), None, 4096).unwrap();
        append(&wal, 1, 1..=40, 300);
    }
    let files = segments(dir.path());
    fs::remove_file(&files[1]).unwrap();
    match Wal::open_with(dir.path(), None, 4096).unwrap_err() {
        WalError::Gap { path, .. } => assert_eq!(path, files[2]),
        other => panic!("expected a gap, got {other:?}"),
    }

    let dir = TempDir::new().unwrap();
    fs::write(dir.path().join(segment_name(1)), b"not a segment at all").unwrap();
    assert!(matches!(
        Wal::open(dir.path(), None).unwrap_err(),
        WalError::Corrupt { offset: 0, .. }
    ));
}

#[test]
fn an_append_that_does_not_follow_is_refused_and_writes_nothing() {
    let dir = TempDir::new().unwrap();
    let (wal, _) = Wal::open(dir.path(), None).unwrap();
    append(&wal, 1, 1..=3, 10);
    let refused = wal.append(&[(id(1, 5), b"e")], None).unwrap_err();
    assert!(matches!(
        refused,
        WalError::NotNext {
            expected: 4,
            found: 5
        }
    ));
    let refused = wal
        .append(&[(id(1, 4), b"d"), (id(1, 6), b"f")], None)
        .unwrap_err();
    assert!(matches!(refused, WalError::NotNext { found: 6, .. }));
    assert_eq!(wal.last(), Some(id(1, 3)));
    // Still writable: a refusal is not a failure.
    append(&wal, 1, 4..=4, 10);
    drop(wal);
    let (wal, _) = Wal::open(dir.path(), None).unwrap();
    assert_eq!(wal.last(), Some(id(1, 4)));
}

#[test]
fn a_write_that_fails_stops_the_log_until_it_is_opened_again() {
    // Goal: after an I/O error nothing more is written (what the files hold is not known),
    // and opening again reads what they hold.
    let dir = TempDir::new().unwrap();
    let wal_dir = dir.path().join("wal");
    let (wal, _) = Wal::open_with(&wal_dir, None, 4096).unwrap();
    append(&wal, 1, 1..=3, 100);
    // The directory vanishes: the next segment cannot be made.
    fs::remove_dir_all(&wal_dir).unwrap();
    let big = payload(1, 4, 8_000);
    assert!(matches!(
        wal.append(&[(id(1, 4), &big)], None).unwrap_err(),
        WalError::Io { .. }
    ));
    assert!(matches!(
        wal.append(&[(id(1, 4), b"small")], None).unwrap_err(),
        WalError::Failed
    ));
    assert!(matches!(wal.truncate(2).unwrap_err(), WalError::Failed));
    drop(wal);
    let (wal, opened) = Wal::open_with(&wal_dir, None, 4096).unwrap();
    assert_eq!(opened.last, None);
    append(&wal, 2, 9..=9, 10);
    assert_eq!(wal.last(), Some(id(2, 9)));
}

#[test]
fn half_made_segments_are_removed_at_open() {
    let dir = TempDir::new().unwrap();
    {
        let (wal, _) = Wal::open(dir.path(), None).unwrap();
        append(&wal, 1, 1..=2, 10);
    }
    let tmp = dir.path().join(format!("{:016x}{TMP_SUFFIX}", 3));
    fs::write(&tmp, b"half").unwrap();
    let (wal, _) = Wal::open(dir.path(), None).unwrap();
    assert!(!tmp.exists());
    assert_eq!(wal.last(), Some(id(1, 2)));
}

// === the log against a model ===

#[derive(Debug, Clone)]
enum Op {
    /// Append this many entries of this payload size.
    Append(u64, usize),
    /// Truncate from this far back from the end (0: the last entry).
    Truncate(u64),
    /// Purge up to this far from the start.
    Purge(u64),
    /// Close and open again.
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..12, 1usize..900).prop_map(|(n, len)| Op::Append(n, len)),
        1 => (0u64..15).prop_map(Op::Truncate),
        1 => (0u64..15).prop_map(Op::Purge),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Goal: whatever sequence of appends, truncations, purges and reopens, the log holds
    /// exactly what a map of index to entry would, reads return it, and every reopen
    /// (given the purge point, as the store records it) agrees.
    #[test]
    fn the_log_holds_what_a_map_would(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = TempDir::new().unwrap();
        let mut model: BTreeMap<u64, (u64, Vec<u8>)> = BTreeMap::new();
        let mut purged: Option<u64> = None;
        let mut term = 1;
        let (mut wal, _) = Wal::open_with(dir.path(), None, 2048).unwrap();
        for op in ops {
            match op {
                Op::Append(n, len) => {
                    let from = model
                        .keys()
                        .next_back()
                        .copied()
                        .or(purged)
                        .map_or(1, |l| l + 1);
                    append(&wal, term, from..=from + n - 1, len);
                    for i in from..from + n {
                        model.insert(i, (term, payload(term, i, len)));
                    }
                }
                Op::Truncate(back) => {
                    let Some(last) = model.keys().next_back().copied() else { continue };
                    let Some(first) = model.keys().next().copied() else { continue };
                    let from = last.saturating_sub(back).max(first);
                    wal.truncate(from).unwrap();
                    model.retain(|i, _| *i < from);
                    // A new leader writes the replaced suffix.
                    term += 1;
                }
                Op::Purge(ahead) => {
                    let Some(first) = model.keys().next().copied() else { continue };
                    let upto = first + ahead;
                    purged = purged.max(Some(upto));
                    wal.purge(upto).unwrap();
                    model.retain(|i, _| *i > upto);
                }
                Op::Reopen => {
                    drop(wal);
                    let (again, opened) = Wal::open_with(dir.path(), purged, 2048).unwrap();
                    prop_assert_eq!(opened.torn_bytes, 0);
                    wal = again;
                }
            }
            let want_last = model.iter().next_back().map(|(i, (t, _))| id(*t, *i));
            prop_assert_eq!(wal.last(), want_last);
            let want: Vec<Vec<u8>> = model.values().map(|(_, p)| p.clone()).collect();
            prop_assert_eq!(all(&wal), want);
        }
        drop(wal);
        let (wal, _) = Wal::open_with(dir.path(), purged, 2048).unwrap();
        let want: Vec<Vec<u8>> = model.values().map(|(_, p)| p.clone()).collect();
        prop_assert_eq!(all(&wal), want);
    }

    /// Goal: a record reads back as itself, and any bytes after it (or instead of it)
    /// decode to something without a panic.
    #[test]
    fn records_round_trip_and_any_bytes_decode(
        index in any::<u64>(),
        term in any::<u64>(),
        node in any::<u64>(),
        body in proptest::collection::vec(any::<u8>(), 0..300),
        noise in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let log_id = LogId::new(CommittedLeaderId::new(term, node), index);
        let record = Record { kind: Kind::Entry, log_id, payload: &body };
        let mut bytes = SEGMENT_MAGIC.to_vec();
        encode_record(&record, &mut bytes);
        let end = bytes.len() as u64;
        bytes.extend_from_slice(&noise);
        let scan = scan_segment(&bytes).unwrap();
        prop_assert!(!scan.records.is_empty());
        prop_assert_eq!(scan.records[0], (SEGMENT_MAGIC.len() as u64, record));
        prop_assert!(scan.end >= end && scan.end <= bytes.len() as u64);
        let _ = scan_segment(&noise);
        let _ = decode_record(&noise);
    }
}
