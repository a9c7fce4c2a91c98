//! The Raft log's entries as a write-ahead log: append-only segment files in `wal/` inside
//! the member's Raft directory, as etcd keeps its log.
//!
//! ```text
//! wal/0000000000000001.wal   magic │ record │ record │ … │ zeros (preallocated)
//! wal/0000000000004e21.wal   magic │ record │ …            (named by its first entry)
//!
//! record: len u32 │ crc32 u32 (of len and body) │ body = kind u8 │ index, term, node u64 │ payload
//! ```
//!
//! Why not the B-tree database the vote lives in: there every append was a copy-on-write
//! transaction (pages copied, freed pages tracked, two syncs), 550–640 µs per entry on this
//! project's machine, and the one writer's queue was what every acknowledged write waited
//! behind. Here an append is one positioned write into space allocated ahead and one
//! `fdatasync`, which has no file size or block map to update: about 130 µs on the same
//! disk.
//!
//! What a crash can leave, and what opening does with it:
//! - a torn tail in the last segment (a write that never finished its sync, so nobody was
//!   told it was durable): the first record that does not check out ends the log; the
//!   bytes from there on are zeroed, so nothing beyond is ever read as a record;
//! - a bad record anywhere else, or a gap between segments: the log is damaged, and the
//!   store refuses to open ([`WalError::Corrupt`], [`WalError::Gap`]) rather than serve a
//!   log with a hole in it; wipe the member and let it rejoin;
//! - a half-made segment (`*.wal.tmp`): removed;
//! - a truncation or purge stopped midway: segments are removed from the end (truncate) or
//!   the start (purge) one at a time, so the files left always hold a contiguous run.
//!
//! Records of kind [`Kind::Committed`] carry the committed index: it rides the append it
//! was saved before, in the same sync, at no extra cost.
//!
//! Everything that reads bytes from a segment goes through [`scan_segment`] and
//! [`decode_record`], which are total over any input (the `raft_wal` fuzz target checks it).

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use openraft::{CommittedLeaderId, LogId};

type NodeId = u64;

/// The directory of segments inside the member's Raft directory.
pub const WAL_DIR: &str = "wal";
/// Where a log moved out of the database is written before it is renamed to [`WAL_DIR`].
pub(super) const WAL_MIGRATING_DIR: &str = "wal.new";
/// What every segment starts with (the last byte is the format's version).
pub const SEGMENT_MAGIC: [u8; 8] = *b"wmk-wal\x01";
/// Bytes of space a segment is created with (a record larger than that gets a segment
/// sized to hold it).
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// `len` and `crc`.
const RECORD_HEAD: usize = 8;
/// `kind`, `index`, `term`, `node`.
const RECORD_FIXED: usize = 1 + 3 * 8;
const SEGMENT_SUFFIX: &str = ".wal";
const TMP_SUFFIX: &str = ".wal.tmp";

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A log entry: `log_id` is the entry's, the payload its encoding (`codec`).
    Entry,
    /// The committed index, `log_id`; no payload.
    Committed,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Self::Entry => 1,
            Self::Committed => 2,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Entry),
            2 => Some(Self::Committed),
            _ => None,
        }
    }
}

/// One decoded record, borrowing its payload from the segment's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// What it holds.
    pub kind: Kind,
    /// The entry's log id, or the committed index.
    pub log_id: LogId<NodeId>,
    /// The encoded entry (empty for [`Kind::Committed`]).
    pub payload: &'a [u8],
}

/// Append `record`'s encoding to `out`.
pub fn encode_record(record: &Record<'_>, out: &mut Vec<u8>) {
    let len = RECORD_FIXED + record.payload.len();
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    let start = out.len();
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(record.kind.byte());
    out.extend_from_slice(&record.log_id.index.to_le_bytes());
    out.extend_from_slice(&record.log_id.leader_id.term.to_le_bytes());
    out.extend_from_slice(&record.log_id.leader_id.node_id.to_le_bytes());
    out.extend_from_slice(record.payload);
    let crc = checksum(&out[start..start + 4], &out[start + RECORD_HEAD..]);
    out[start + 4..start + RECORD_HEAD].copy_from_slice(&crc.to_le_bytes());
}

/// The bytes [`encode_record`] writes for a payload of `payload` bytes.
pub fn record_len(payload: usize) -> usize {
    RECORD_HEAD + RECORD_FIXED + payload
}

fn checksum(len: &[u8], body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(len);
    h.update(body);
    h.finalize()
}

/// Why a record's bytes were not a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// Fewer bytes left than a record's header.
    Short,
    /// The length is below a record's fixed fields, or runs past the bytes there are.
    Length,
    /// The checksum does not match.
    Checksum,
    /// The kind is not one this build knows.
    Kind,
    /// A committed-index record with a payload.
    Payload,
}

impl Bad {
    fn as_str(self) -> &'static str {
        match self {
            Self::Short => "short record header",
            Self::Length => "record length out of bounds",
            Self::Checksum => "checksum mismatch",
            Self::Kind => "unknown record kind",
            Self::Payload => "committed-index record with a payload",
        }
    }
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`decode_record`] found at the start of its bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A record, and the bytes it took.
    Record(Record<'a>, usize),
    /// The end of what was written: no bytes left, or a zero length (space allocated and
    /// never written).
    End,
    /// Bytes that are not a record.
    Bad(Bad),
}

/// Decode the record at the start of `bytes`.
pub fn decode_record(bytes: &[u8]) -> Decoded<'_> {
    if bytes.is_empty() {
        return Decoded::End;
    }
    let Some((head, rest)) = bytes.split_first_chunk::<RECORD_HEAD>() else {
        return if bytes.iter().all(|b| *b == 0) {
            Decoded::End
        } else {
            Decoded::Bad(Bad::Short)
        };
    };
    let (len_bytes, crc_bytes) = head.split_at(4);
    let len = u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]);
    if len == 0 {
        return Decoded::End;
    }
    let Some(body) = usize::try_from(len)
        .ok()
        .filter(|len| *len >= RECORD_FIXED)
        .and_then(|len| rest.get(..len))
    else {
        return Decoded::Bad(Bad::Length);
    };
    let crc = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
    if checksum(len_bytes, body) != crc {
        return Decoded::Bad(Bad::Checksum);
    }
    let (fixed, payload) = body.split_at(RECORD_FIXED);
    let Some(kind) = Kind::from_byte(fixed[0]) else {
        return Decoded::Bad(Bad::Kind);
    };
    if kind == Kind::Committed && !payload.is_empty() {
        return Decoded::Bad(Bad::Payload);
    }
    let word = |i: usize| {
        let mut w = [0; 8];
        w.copy_from_slice(&fixed[1 + 8 * i..1 + 8 * (i + 1)]);
        u64::from_le_bytes(w)
    };
    let log_id = LogId::new(CommittedLeaderId::new(word(1), word(2)), word(0));
    Decoded::Record(
        Record {
            kind,
            log_id,
            payload,
        },
        RECORD_HEAD + body.len(),
    )
}

/// A segment's records, read from its whole bytes.
#[derive(Debug)]
pub struct Scan<'a> {
    /// Each record and its offset in the segment.
    pub records: Vec<(u64, Record<'a>)>,
    /// Where the last good record ends: the next record goes here.
    pub end: u64,
    /// Whether the bytes after `end` are a bad record (else unwritten space).
    pub bad: Option<Bad>,
}

/// The records of a segment's bytes, up to the first that does not decode. `None` if the
/// bytes do not start with [`SEGMENT_MAGIC`].
pub fn scan_segment(bytes: &[u8]) -> Option<Scan<'_>> {
    let mut at = bytes.strip_prefix(&SEGMENT_MAGIC)?;
    let mut offset = SEGMENT_MAGIC.len();
    let mut records = Vec::new();
    let bad = loop {
        match decode_record(at) {
            Decoded::Record(record, used) => {
                records.push((offset as u64, record));
                offset += used;
                at = &at[used..];
            }
            Decoded::End => break None,
            Decoded::Bad(bad) => break Some(bad),
        }
    };
    Some(Scan {
        records,
        end: offset as u64,
        bad,
    })
}

/// Why the log could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// A file operation failed.
    #[error("raft log file {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A segment that is not the last holds a bad record, or does not start as a segment
    /// does: the log is damaged. Nothing was changed; the member's data must be wiped and
    /// the member rejoined.
    #[error("raft log segment {path} is damaged at byte {offset}: {reason}")]
    Corrupt {
        /// The segment.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// What was found.
        reason: &'static str,
    },
    /// Consecutive entries whose indexes do not follow each other: the log is damaged (or
    /// a segment was removed by hand). Nothing was changed.
    #[error("raft log segment {path} holds entry {found} where {expected} was due")]
    Gap {
        /// The segment.
        path: PathBuf,
        /// The index that should come next.
        expected: u64,
        /// The index found.
        found: u64,
    },
    /// An append whose first entry does not follow the last one held. Nothing was written.
    #[error("raft log append of entry {found} where {expected} is due")]
    NotNext {
        /// The index due.
        expected: u64,
        /// The index offered.
        found: u64,
    },
    /// A write or sync failed earlier, so what the files hold is not known; nothing more
    /// is written until the member restarts and reads them again.
    #[error("raft log is failed after an earlier write error; restart the member")]
    Failed,
}

/// Map a file operation's error on `path`.
pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Where an entry sits.
#[derive(Debug, Clone, Copy)]
struct Span {
    log_id: LogId<NodeId>,
    /// The record's offset in its segment.
    offset: u64,
    /// The payload's length.
    len: u32,
}

/// One segment file.
#[derive(Debug)]
struct Segment {
    path: PathBuf,
    file: Arc<File>,
    /// The index it is named by: its first entry's, or the one due when it was made.
    name: u64,
    /// The entries it holds that are not purged, in order.
    spans: VecDeque<Span>,
    /// Where the next record goes.
    end: u64,
    /// The file's allocated size.
    capacity: u64,
}

/// What the log holds, and the segment being written.
#[derive(Debug, Default)]
struct Index {
    segments: VecDeque<Segment>,
    committed: Option<LogId<NodeId>>,
    failed: bool,
}

impl Index {
    fn first(&self) -> Option<LogId<NodeId>> {
        self.segments
            .iter()
            .find_map(|s| s.spans.front())
            .map(|s| s.log_id)
    }

    fn last(&self) -> Option<LogId<NodeId>> {
        self.segments
            .iter()
            .rev()
            .find_map(|s| s.spans.back())
            .map(|s| s.log_id)
    }

    /// The span of entry `index`, with its segment.
    fn find(&self, index: u64) -> Option<(&Segment, Span)> {
        self.segments.iter().rev().find_map(|seg| {
            let first = seg.spans.front()?.log_id.index;
            let i = usize::try_from(index.checked_sub(first)?).ok()?;
            seg.spans.get(i).map(|span| (seg, *span))
        })
    }
}

/// The log's segment files: appended to by one writer (the store's writer thread), read by
/// anyone. Every change is durable when its call returns.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    segment_bytes: u64,
    index: Mutex<Index>,
}

/// What [`Wal::open`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The last entry held (above the purge point).
    pub last: Option<LogId<NodeId>>,
    /// The latest committed index recorded.
    pub committed: Option<LogId<NodeId>>,
    /// Bytes of a torn tail that were zeroed.
    pub torn_bytes: u64,
}

impl Wal {
    /// Open the log in `dir` (creating it), forgetting entries up to `purged` and removing
    /// the segments that hold nothing else. Blocking.
    pub fn open(dir: &Path, purged: Option<u64>) -> Result<(Self, Opened), WalError> {
        Self::open_with(dir, purged, SEGMENT_BYTES)
    }

    /// [`Wal::open`] with segments of `segment_bytes`.
    pub fn open_with(
        dir: &Path,
        purged: Option<u64>,
        segment_bytes: u64,
    ) -> Result<(Self, Opened), WalError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let mut names = Vec::new();
        for item in fs::read_dir(dir).map_err(io(dir))? {
            let item = item.map_err(io(dir))?;
            let file_name = item.file_name();
            let Some(name) = file_name.to_str() else {
                continue;
            };
            if name.ends_with(TMP_SUFFIX) {
                // A segment whose making was cut short: it was never written to.
                let path = item.path();
                fs::remove_file(&path).map_err(io(&path))?;
            } else if let Some(index) = parse_name(name) {
                names.push((index, item.path()));
            }
        }
        names.sort_unstable();
        let mut index = Index::default();
        let mut opened = Opened::default();
        let mut due: Option<u64> = None;
        let count = names.len();
        for (n, (name, path)) in names.into_iter().enumerate() {
            let last_segment = n + 1 == count;
            let bytes = fs::read(&path).map_err(io(&path))?;
            let Some(scan) = scan_segment(&bytes) else {
                return Err(WalError::Corrupt {
                    path,
                    offset: 0,
                    reason: "not a segment (bad magic)",
                });
            };
            if let Some(bad) = scan.bad {
                if !last_segment {
                    return Err(WalError::Corrupt {
                        path,
                        offset: scan.end,
                        reason: bad.as_str(),
                    });
                }
                // A torn tail: nobody was told it was durable. Zero it, so that a record
                // written after `end` later is never followed by a stale one that checks out.
                let torn = bytes.len() as u64 - scan.end;
                tracing::warn!(
                    segment = %path.display(),
                    offset = scan.end,
                    torn_bytes = torn,
                    reason = %bad,
                    "raft log ends in a torn record; the tail is dropped"
                );
                opened.torn_bytes = torn;
            }
            let mut spans = VecDeque::new();
            for (offset, record) in &scan.records {
                match record.kind {
                    Kind::Committed => index.committed = index.committed.max(Some(record.log_id)),
                    Kind::Entry => {
                        let at = record.log_id.index;
                        let expected = due.unwrap_or(name);
                        if at != expected {
                            return Err(WalError::Gap {
                                path,
                                expected,
                                found: at,
                            });
                        }
                        due = at.checked_add(1);
                        spans.push_back(Span {
                            log_id: record.log_id,
                            offset: *offset,
                            len: u32::try_from(record.payload.len()).unwrap_or(u32::MAX),
                        });
                    }
                }
            }
            let (end, torn) = (scan.end, scan.bad.is_some());
            drop(scan);
            drop(bytes);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io(&path))?;
            let capacity = file.metadata().map_err(io(&path))?.len();
            if torn {
                zero(&file, &path, end, capacity)?;
            }
            index.segments.push_back(Segment {
                path,
                file: Arc::new(file),
                name,
                spans,
                end,
                capacity,
            });
        }
        let wal = Self {
            dir: dir.to_owned(),
            segment_bytes,
            index: Mutex::new(index),
        };
        if let Some(purged) = purged {
            wal.purge(purged)?;
        }
        let held = wal.lock();
        opened.last = held.last();
        opened.committed = held.committed;
        drop(held);
        Ok((wal, opened))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The last entry held.
    pub fn last(&self) -> Option<LogId<NodeId>> {
        self.lock().last()
    }

    /// The first entry held.
    pub fn first(&self) -> Option<LogId<NodeId>> {
        self.lock().first()
    }

    /// The latest committed index written.
    pub fn committed(&self) -> Option<LogId<NodeId>> {
        self.lock().committed
    }

    /// Append `entries` (log id and encoding, in order, the first following the last held
    /// unless nothing is held), then a committed-index record if `committed` is given, and
    /// sync. Durable when it returns. On an I/O error the log is failed: nothing more is
    /// written until it is opened again.
    pub fn append(
        &self,
        entries: &[(LogId<NodeId>, &[u8])],
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), WalError> {
        let mut index = self.lock();
        if index.failed {
            return Err(WalError::Failed);
        }
        if let (Some((first, _)), Some(last)) = (entries.first(), index.last()) {
            let expected = last.index.saturating_add(1);
            if first.index != expected {
                return Err(WalError::NotNext {
                    expected,
                    found: first.index,
                });
            }
        }
        for pair in entries.windows(2) {
            if pair[0].0.index.checked_add(1) != Some(pair[1].0.index) {
                return Err(WalError::NotNext {
                    expected: pair[0].0.index.saturating_add(1),
                    found: pair[1].0.index,
                });
            }
        }
        let result = self.write(&mut index, entries, committed);
        if result.is_err() {
            index.failed = true;
        }
        result
    }

    fn write(
        &self,
        index: &mut Index,
        entries: &[(LogId<NodeId>, &[u8])],
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), WalError> {
        if let Some((first, _)) = entries.first()
            && index.last().is_none()
            && index.segments.back().map(|s| s.name) != Some(first.index)
        {
            // Nothing held, and the segments left (holding purged entries, or a committed
            // index only) are not where this entry is due: start again from it.
            self.remove_all(index)?;
        }
        let due = |index: &Index| match (index.last(), entries.first(), committed) {
            (Some(last), _, _) => last.index.saturating_add(1),
            (None, Some((first, _)), _) => first.index,
            (None, None, Some(c)) => c.index.saturating_add(1),
            (None, None, None) => 0,
        };
        let mut buf = Vec::new();
        let mut pending: Vec<Span> = Vec::new();
        let records = entries
            .iter()
            .map(|(id, bytes)| (Kind::Entry, *id, *bytes))
            .chain(committed.map(|c| (Kind::Committed, c, &[][..])));
        for (kind, log_id, payload) in records {
            let len = record_len(payload.len()) as u64;
            let room = index
                .segments
                .back()
                .map_or(0, |s| s.capacity.saturating_sub(s.end + buf.len() as u64));
            if index.segments.is_empty() || room < len {
                flush(index, &mut buf, &mut pending)?;
                let name = due(index);
                let capacity = self.segment_bytes.max(SEGMENT_MAGIC.len() as u64 + len);
                let segment = create_segment(&self.dir, name, capacity)?;
                index.segments.push_back(segment);
            }
            let Some(seg) = index.segments.back() else {
                return Err(WalError::Failed);
            };
            let offset = seg.end + buf.len() as u64;
            encode_record(
                &Record {
                    kind,
                    log_id,
                    payload,
                },
                &mut buf,
            );
            if kind == Kind::Entry {
                pending.push(Span {
                    log_id,
                    offset,
                    len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
                });
            }
        }
        flush(index, &mut buf, &mut pending)?;
        if let Some(c) = committed {
            index.committed = index.committed.max(Some(c));
        }
        Ok(())
    }

    /// Remove every entry from `from` on, durably.
    pub fn truncate(&self, from: u64) -> Result<(), WalError> {
        self.change(|index| {
            // Whole segments from the end first, so a crash leaves a contiguous prefix.
            let mut removed = false;
            while let Some(seg) = index.segments.back() {
                let first = seg.spans.front().map_or(seg.name, |s| s.log_id.index);
                if first < from {
                    break;
                }
                let path = seg.path.clone();
                fs::remove_file(&path).map_err(io(&path))?;
                index.segments.pop_back();
                removed = true;
            }
            if removed {
                sync_dir(&self.dir)?;
            }
            if let Some(seg) = index.segments.back_mut()
                && let Some(first) = seg.spans.front().map(|s| s.log_id.index)
                && let Some(cut) = usize::try_from(from.saturating_sub(first))
                    .ok()
                    .filter(|cut| *cut < seg.spans.len())
            {
                let at = seg.spans[cut].offset;
                zero(&seg.file, &seg.path, at, seg.end)?;
                seg.spans.truncate(cut);
                seg.end = at;
            }
            Ok(())
        })
    }

    /// Forget every entry up to `upto`, removing the segments that hold nothing after it
    /// (durably). The caller records the purge point first.
    pub fn purge(&self, upto: u64) -> Result<(), WalError> {
        self.change(|index| {
            let mut removed = false;
            loop {
                let next_name = index.segments.get(1).map(|s| s.name);
                let Some(seg) = index.segments.front_mut() else {
                    break;
                };
                // The last index this segment could hold.
                let top = match (seg.spans.back(), next_name) {
                    (Some(last), _) => Some(last.log_id.index),
                    (None, Some(next)) => next.checked_sub(1),
                    (None, None) => seg.name.checked_sub(1),
                };
                if top.is_some_and(|top| top <= upto) {
                    let path = seg.path.clone();
                    fs::remove_file(&path).map_err(io(&path))?;
                    index.segments.pop_front();
                    removed = true;
                    continue;
                }
                while seg.spans.front().is_some_and(|s| s.log_id.index <= upto) {
                    seg.spans.pop_front();
                }
                break;
            }
            if removed {
                sync_dir(&self.dir)?;
            }
            Ok(())
        })
    }

    /// Make a change to the files under the lock, unless the log is failed; a change that
    /// fails leaves it failed (what the files hold is no longer known).
    fn change(&self, f: impl FnOnce(&mut Index) -> Result<(), WalError>) -> Result<(), WalError> {
        let mut index = self.lock();
        if index.failed {
            return Err(WalError::Failed);
        }
        let result = f(&mut index);
        if result.is_err() {
            index.failed = true;
        }
        result
    }

    /// The encoded entries the log holds from `start` to `end` (inclusive), in order, as
    /// long as they add up to at most `bytes` (the first always comes): a range query, so
    /// what was purged or lies beyond the last entry is simply not there.
    pub fn read(&self, start: u64, end: u64, bytes: usize) -> Result<Vec<Vec<u8>>, WalError> {
        let mut wanted = Vec::new();
        {
            let index = self.lock();
            let (Some(first), Some(last)) = (index.first(), index.last()) else {
                return Ok(Vec::new());
            };
            let mut budget = ByteBudget::new(bytes);
            for at in start.max(first.index)..=end.min(last.index) {
                let Some((seg, span)) = index.find(at) else {
                    // Entries are contiguous from `first` to `last`: never reached.
                    break;
                };
                if !budget.take(span.len as usize) {
                    break;
                }
                wanted.push((Arc::clone(&seg.file), seg.path.clone(), span));
            }
        }
        let mut out = Vec::with_capacity(wanted.len());
        for (file, path, span) in wanted {
            // Read the whole record and check it again: the page cache may have been
            // dropped since it was written, and the disk may have rotted.
            let mut raw = vec![0; RECORD_HEAD + RECORD_FIXED + span.len as usize];
            file.read_exact_at(&mut raw, span.offset)
                .map_err(io(&path))?;
            match decode_record(&raw) {
                Decoded::Record(record, _)
                    if record.kind == Kind::Entry && record.log_id == span.log_id =>
                {
                    raw.drain(..RECORD_HEAD + RECORD_FIXED);
                    out.push(raw);
                }
                Decoded::Record(..) | Decoded::End => {
                    return Err(WalError::Corrupt {
                        path,
                        offset: span.offset,
                        reason: "record changed since it was written",
                    });
                }
                Decoded::Bad(bad) => {
                    return Err(WalError::Corrupt {
                        path,
                        offset: span.offset,
                        reason: bad.as_str(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Remove every segment (they hold nothing any more).
    fn remove_all(&self, index: &mut Index) -> Result<(), WalError> {
        if index.segments.is_empty() {
            return Ok(());
        }
        while let Some(seg) = index.segments.pop_front() {
            fs::remove_file(&seg.path).map_err(io(&seg.path))?;
        }
        sync_dir(&self.dir)
    }
}

/// Write what `buf` holds at the end of the last segment, sync it, and add `pending` to
/// what it holds.
fn flush(index: &mut Index, buf: &mut Vec<u8>, pending: &mut Vec<Span>) -> Result<(), WalError> {
    if buf.is_empty() {
        return Ok(());
    }
    let Some(seg) = index.segments.back_mut() else {
        return Err(WalError::Failed);
    };
    seg.file.write_all_at(buf, seg.end).map_err(io(&seg.path))?;
    seg.file.sync_data().map_err(io(&seg.path))?;
    seg.end += buf.len() as u64;
    seg.spans.extend(pending.drain(..));
    buf.clear();
    Ok(())
}

fn segment_name(index: u64) -> String {
    format!("{index:016x}{SEGMENT_SUFFIX}")
}

fn parse_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(SEGMENT_SUFFIX)?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Make a segment named by `name` with `capacity` bytes allocated: written and synced
/// under a temporary name, then renamed into place (and the directory synced), so a
/// segment file is whole or absent.
fn create_segment(dir: &Path, name: u64, capacity: u64) -> Result<Segment, WalError> {
    let path = dir.join(segment_name(name));
    let tmp = dir.join(format!("{name:016x}{TMP_SUFFIX}"));
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(io(&tmp))?;
    file.write_all(&SEGMENT_MAGIC).map_err(io(&tmp))?;
    allocate(&file, capacity).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, &path).map_err(io(&path))?;
    sync_dir(dir)?;
    Ok(Segment {
        path,
        file: Arc::new(file),
        name,
        spans: VecDeque::new(),
        end: SEGMENT_MAGIC.len() as u64,
        capacity,
    })
}

/// Give `file` `len` bytes of allocated space, so that a sync after writing into it has
/// no size or block map to update. Where the file system cannot allocate ahead, the file
/// is extended sparsely: correct, only slower to sync.
fn allocate(file: &File, len: u64) -> std::io::Result<()> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP) => file.set_len(len),
        Err(e) => Err(e.into()),
    }
}

/// Write zeros over `[from, to)`.
fn zero(file: &File, path: &Path, from: u64, to: u64) -> Result<(), WalError> {
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(CHUNK);
        file.write_all_at(&zeros[..n as usize], at)
            .map_err(io(path))?;
        at += n;
    }
    if to > from {
        file.sync_data().map_err(io(path))?;
    }
    Ok(())
}

/// Make a directory's entries (files made, renamed or removed) durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), WalError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Entries taken in order while their encoded sizes add up to at most a bound; the first
/// is always taken, whatever its size, so a batch is never empty.
pub(super) struct ByteBudget {
    bytes: usize,
    taken: Option<usize>,
}

impl ByteBudget {
    pub(super) fn new(bytes: usize) -> Self {
        Self { bytes, taken: None }
    }

    /// Whether an entry of `size` still fits; if so it is counted.
    pub(super) fn take(&mut self, size: usize) -> bool {
        let total = self.taken.map_or(size, |t| t.saturating_add(size));
        if self.taken.is_some() && total > self.bytes {
            return false;
        }
        self.taken = Some(total);
        true
    }
}

#[cfg(test)]
#[path = "wal_tests.rs"]
mod tests;
