//! The latest Raft snapshot, in a file of its own beside the log's database.
//!
//! At the reference estate a snapshot is tens of megabytes. Kept inside the log's redb
//! database, its write transaction held redb's single writer for as long as it took to
//! copy and sync those megabytes, and every log append — so every acknowledgement —
//! waited behind it: the authority stalled for seconds each time a snapshot was due. In a
//! file of its own it is written beside the log, never in front of it.
//!
//! The file is replaced whole: written to a temporary file, synced, renamed over the old
//! one, and the directory synced, so a reader sees the old snapshot or the new one, never
//! a mix. A snapshot older than the one on disk is not written (a build that finishes after
//! a newer snapshot was installed must not put the older one back: the log before the
//! newer one may already be purged).
//!
//! Layout (integers little-endian):
//!
//! | bytes | field                                   |
//! |-------|-----------------------------------------|
//! | 8     | magic and version, `WMRSNAP1`           |
//! | 4     | length of the metadata                  |
//! | 8     | length of the data                      |
//! | 4     | CRC-32 of the metadata then the data    |
//! | …     | metadata: openraft's `SnapshotMeta`, JSON |
//! | …     | data: the encoded `AuthorityState`      |
//!
//! Nothing may follow the data. [`decode`] checks all of it and refuses with a
//! [`SnapshotFileError`] that says what was wrong.

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use openraft::{LogId, SnapshotMeta};

use super::Member;

/// The snapshot's file name inside the member's data directory.
pub const SNAPSHOT_FILE: &str = "snapshot.bin";
/// Where a snapshot is written before it replaces [`SNAPSHOT_FILE`].
const TEMP_FILE: &str = "snapshot.bin.tmp";
/// The file's first bytes: what it is, and the layout's version.
pub const MAGIC: [u8; 8] = *b"WMRSNAP1";
/// Bytes before the metadata.
pub const HEADER_LEN: usize = 24;
/// Longest metadata accepted: a membership of a few members is well under a kilobyte.
pub const META_LEN_MAX: usize = 1 << 20;

type NodeId = u64;

/// A snapshot as held: its metadata and its data.
pub type Stored = (SnapshotMeta<NodeId, Member>, Vec<u8>);

/// Why a snapshot file could not be read or written. Reading refuses the whole file: a
/// member with no usable snapshot starts from its log, or is sent a snapshot by the leader.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotFileError {
    /// Reading, writing, syncing or renaming failed.
    #[error("snapshot file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file is shorter than its header says.
    #[error("snapshot file is truncated: {len} bytes, the header needs {needed}")]
    Truncated {
        /// The file's length.
        len: usize,
        /// The length its header promises.
        needed: u64,
    },
    /// The file does not start with [`MAGIC`]: not a snapshot, or a layout this build
    /// does not know.
    #[error("not a waymark snapshot file (or an unknown layout version)")]
    Magic,
    /// The metadata is longer than [`META_LEN_MAX`].
    #[error("snapshot metadata of {len} bytes is over the {max}-byte limit")]
    MetaTooLong {
        /// Its stated length.
        len: u32,
        /// The limit.
        max: usize,
    },
    /// Bytes follow the data.
    #[error("{extra} bytes follow the snapshot's data")]
    Trailing {
        /// How many.
        extra: u64,
    },
    /// The checksum does not match: the file was damaged after it was written.
    #[error("snapshot checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// The checksum in the header.
        stored: u32,
        /// The checksum of what follows it.
        computed: u32,
    },
    /// The metadata does not decode.
    #[error("snapshot metadata does not decode")]
    Meta(#[source] serde_json::Error),
}

/// Encode a snapshot file's header and metadata; the data follows them unchanged.
pub fn encode_head(
    meta: &SnapshotMeta<NodeId, Member>,
    data: &[u8],
) -> Result<Vec<u8>, serde_json::Error> {
    let meta = serde_json::to_vec(meta)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&meta);
    crc.update(data);
    let mut head = Vec::with_capacity(HEADER_LEN + meta.len());
    head.extend_from_slice(&MAGIC);
    // The metadata is a few hundred bytes; `u32` holds any that encodes.
    head.extend_from_slice(&u32::try_from(meta.len()).unwrap_or(u32::MAX).to_le_bytes());
    head.extend_from_slice(&(data.len() as u64).to_le_bytes());
    head.extend_from_slice(&crc.finalize().to_le_bytes());
    head.extend_from_slice(&meta);
    Ok(head)
}

/// Decode a whole snapshot file; the data is returned in the same buffer, its head cut.
pub fn decode(mut bytes: Vec<u8>) -> Result<Stored, SnapshotFileError> {
    let len = bytes.len();
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return Err(SnapshotFileError::Truncated {
            len,
            needed: HEADER_LEN as u64,
        });
    };
    if header[..8] != MAGIC {
        return Err(SnapshotFileError::Magic);
    }
    let meta_len = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    let data_len = u64::from_le_bytes(header[12..20].try_into().expect("8 bytes"));
    let stored = u32::from_le_bytes(header[20..24].try_into().expect("4 bytes"));
    if meta_len as usize > META_LEN_MAX {
        return Err(SnapshotFileError::MetaTooLong {
            len: meta_len,
            max: META_LEN_MAX,
        });
    }
    let meta_end = HEADER_LEN + meta_len as usize;
    let needed = (meta_end as u64).saturating_add(data_len);
    if (len as u64) < needed {
        return Err(SnapshotFileError::Truncated { len, needed });
    }
    if len as u64 > needed {
        return Err(SnapshotFileError::Trailing {
            extra: len as u64 - needed,
        });
    }
    let computed = crc32fast::hash(&bytes[HEADER_LEN..]);
    if computed != stored {
        return Err(SnapshotFileError::Checksum { stored, computed });
    }
    let meta =
        serde_json::from_slice(&bytes[HEADER_LEN..meta_end]).map_err(SnapshotFileError::Meta)?;
    bytes.drain(..meta_end);
    Ok((meta, bytes))
}

/// The snapshot file of one data directory, and the last snapshot written to it.
#[derive(Debug)]
pub(super) struct SnapshotFile {
    dir: PathBuf,
    /// The last log id of the snapshot on disk; writes are serialised by this lock.
    saved: std::sync::Mutex<Option<LogId<NodeId>>>,
}

impl SnapshotFile {
    /// The snapshot file in `dir`, and what it holds (`None`: no file). A leftover
    /// temporary file from a write that did not finish is removed.
    pub(super) fn open(dir: &Path) -> Result<(Self, Option<Stored>), SnapshotFileError> {
        let temp = dir.join(TEMP_FILE);
        match fs::remove_file(&temp) {
            Ok(()) => {
                tracing::info!(path = %temp.display(), "removed an unfinished snapshot write")
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(SnapshotFileError::Io { path: temp, source }),
        }
        let path = dir.join(SNAPSHOT_FILE);
        let stored = match fs::read(&path) {
            Ok(bytes) => Some(decode(bytes)?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(source) => return Err(SnapshotFileError::Io { path, source }),
        };
        let file = Self {
            dir: dir.to_owned(),
            saved: std::sync::Mutex::new(stored.as_ref().and_then(|(m, _)| m.last_log_id)),
        };
        Ok((file, stored))
    }

    /// Read the snapshot on disk, if any.
    pub(super) fn load(&self) -> Result<Option<Stored>, SnapshotFileError> {
        let _writes = self.lock();
        let path = self.dir.join(SNAPSHOT_FILE);
        match fs::read(&path) {
            Ok(bytes) => decode(bytes).map(Some),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SnapshotFileError::Io { path, source }),
        }
    }

    /// Replace the snapshot on disk with this one, durably, unless the one there is newer.
    /// Returns whether it was written.
    pub(super) fn save(
        &self,
        meta: &SnapshotMeta<NodeId, Member>,
        data: &[u8],
    ) -> Result<bool, SnapshotFileError> {
        let mut saved = self.lock();
        if *saved > meta.last_log_id {
            tracing::info!(
                offered = ?meta.last_log_id,
                held = ?*saved,
                "a newer snapshot is already on disk; the older one is not written"
            );
            return Ok(false);
        }
        let temp = self.dir.join(TEMP_FILE);
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| SnapshotFileError::Io { path, source }
        };
        let head = encode_head(meta, data).map_err(SnapshotFileError::Meta)?;
        {
            let mut file = File::create(&temp).map_err(io(&temp))?;
            file.write_all(&head).map_err(io(&temp))?;
            file.write_all(data).map_err(io(&temp))?;
            file.sync_all().map_err(io(&temp))?;
        }
        let path = self.dir.join(SNAPSHOT_FILE);
        fs::rename(&temp, &path).map_err(io(&path))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.dir))?;
        *saved = meta.last_log_id;
        Ok(true)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<LogId<NodeId>>> {
        self.saved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
