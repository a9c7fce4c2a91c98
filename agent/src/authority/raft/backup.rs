//! An operator's backup of the replicated state (`GET`/`PUT /v1/operator/snapshot`): the
//! state a Raft snapshot holds, in the snapshot's own encoding ([`super::codec`]), behind a
//! header that says which region it is of, which log entry it reflects, and its SHA-256.
//!
//! Layout:
//!
//! | bytes | field                                                    |
//! |-------|----------------------------------------------------------|
//! | 8     | magic, `WMBACKUP`                                        |
//! | 4     | length of the header, little-endian                      |
//! | …     | header: [`BackupHeader`], JSON                           |
//! | …     | data: the encoded `AuthorityState`, exactly `data_len`   |
//!
//! [`verify`] checks everything before anything is proposed: the magic, the lengths, the
//! format version, the checksum, the region, and that the data decodes. Each refusal is a
//! [`BackupError`] whose [`BackupError::reason`] the API answers with.

use serde::{Deserialize, Serialize};
use waymark_registry::machine::AuthorityState;

use super::codec;

/// The first bytes of a backup.
pub const MAGIC: [u8; 8] = *b"WMBACKUP";
/// The header layout this build writes and reads.
pub const FORMAT: u32 = 1;
/// Longest header accepted (a region name and a few numbers).
pub const HEADER_LEN_MAX: usize = 4 * 1024;
/// Largest backup a restore accepts. The restore travels to every member as one log entry,
/// so it must fit a Raft append body (`BODY_LIMIT_BYTES`, 64 MiB) with room to spare; the
/// reference estate's state encodes to tens of MB.
pub const BODY_MAX: usize = 48 * 1024 * 1024;

/// The media type of a backup.
pub const SNAPSHOT_CONTENT_TYPE: &str = "application/vnd.waymark.snapshot";
/// The index of the last log entry a backup reflects.
pub const SNAPSHOT_INDEX_HEADER: &str = "x-waymark-snapshot-index";
/// The term of that entry.
pub const SNAPSHOT_TERM_HEADER: &str = "x-waymark-snapshot-term";
/// SHA-256 of the whole body, lower-case hex (the body's own header holds its data's).
pub const SNAPSHOT_SHA256_HEADER: &str = "x-waymark-snapshot-sha256";

/// What a backup says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupHeader {
    /// The layout's version ([`FORMAT`]).
    pub format: u32,
    /// The region whose state it is.
    pub region: String,
    /// The index of the last log entry the state reflects (`None`: nothing applied).
    pub index: Option<u64>,
    /// The term of that entry.
    pub term: Option<u64>,
    /// Length of the data.
    pub data_len: u64,
    /// SHA-256 of the data, lower-case hex.
    pub sha256: String,
}

/// Why a backup is refused. Nothing was proposed or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// It does not start with [`MAGIC`].
    #[error("not a waymark backup")]
    NotABackup,
    /// It is shorter or longer than its header says, or the header is over its limit.
    #[error("backup is {len} bytes; its header promises {needed}")]
    Length {
        /// Its length.
        len: u64,
        /// What its header promises.
        needed: u64,
    },
    /// The header does not decode.
    #[error("backup header does not decode")]
    Header(#[source] serde_json::Error),
    /// A layout this build does not know.
    #[error("backup format {0} is unknown (this build reads {FORMAT})")]
    Format(u32),
    /// The data's SHA-256 is not the one in the header: damaged after it was taken.
    #[error("backup checksum mismatch: header says {stated}, data hashes to {computed}")]
    Checksum {
        /// In the header.
        stated: String,
        /// Computed.
        computed: String,
    },
    /// Taken of another region.
    #[error("backup is of region {found}, this is region {expected}")]
    Region {
        /// This region.
        expected: String,
        /// The backup's.
        found: String,
    },
    /// The checksum matches but the state does not decode (written by an incompatible build).
    #[error("backup state does not decode")]
    State(#[source] codec::CodecError),
}

impl BackupError {
    /// The API's machine-readable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotABackup => "not_a_snapshot",
            Self::Length { .. } => "truncated",
            Self::Header(_) => "bad_header",
            Self::Format(_) => "unknown_format",
            Self::Checksum { .. } => "checksum_mismatch",
            Self::Region { .. } => "wrong_region",
            Self::State(_) => "undecodable_state",
        }
    }
}

/// `state`'s encoded `data`, behind a header naming `region` and the log entry it reflects.
pub fn encode(region: &str, index: Option<u64>, term: Option<u64>, data: &[u8]) -> Vec<u8> {
    let header = BackupHeader {
        format: FORMAT,
        region: region.to_owned(),
        index,
        term,
        data_len: data.len() as u64,
        sha256: sha256_hex(data),
    };
    let head = serde_json::to_vec(&header).expect("a struct of strings and numbers encodes");
    let mut out = Vec::with_capacity(12 + head.len() + data.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&u32::try_from(head.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(data);
    out
}

/// Check a backup of `region` whole and decode its state.
pub fn verify(bytes: &[u8], region: &str) -> Result<(BackupHeader, AuthorityState), BackupError> {
    if bytes.get(..8) != Some(&MAGIC[..]) {
        return Err(BackupError::NotABackup);
    }
    let len = bytes.len() as u64;
    let head_len = bytes
        .get(8..12)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .ok_or(BackupError::Length { len, needed: 12 })? as usize;
    if head_len > HEADER_LEN_MAX {
        return Err(BackupError::Length {
            len,
            needed: 12 + head_len as u64,
        });
    }
    let head_end = 12 + head_len;
    let head = bytes.get(12..head_end).ok_or(BackupError::Length {
        len,
        needed: head_end as u64,
    })?;
    let header: BackupHeader = serde_json::from_slice(head).map_err(BackupError::Header)?;
    if header.format != FORMAT {
        return Err(BackupError::Format(header.format));
    }
    let needed = (head_end as u64).saturating_add(header.data_len);
    if len != needed {
        return Err(BackupError::Length { len, needed });
    }
    let data = &bytes[head_end..];
    let computed = sha256_hex(data);
    if computed != header.sha256 {
        return Err(BackupError::Checksum {
            stated: header.sha256,
            computed,
        });
    }
    if header.region != region {
        return Err(BackupError::Region {
            expected: region.to_owned(),
            found: header.region,
        });
    }
    let state = codec::decode(data).map_err(BackupError::State)?;
    Ok((header, state))
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn backup() -> Vec<u8> {
        let data = codec::encode(&AuthorityState::default()).unwrap();
        encode("eu", Some(7), Some(2), &data)
    }

    #[test]
    fn a_backup_verifies_and_says_what_it_reflects() {
        // Goal: what is encoded verifies, and the header round-trips.
        let (header, state) = verify(&backup(), "eu").unwrap();
        assert_eq!((header.index, header.term), (Some(7), Some(2)));
        assert_eq!(state, AuthorityState::default());
    }

    #[test]
    fn every_damage_is_refused_with_its_reason() {
        // Goal: a flipped data byte, a cut, extra bytes, another region, a foreign file.
        let good = backup();
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 0x01;
        let reason = |b: &[u8], region: &str| verify(b, region).unwrap_err().reason();
        assert_eq!(reason(&flipped, "eu"), "checksum_mismatch");
        assert_eq!(reason(&good[..good.len() - 1], "eu"), "truncated");
        assert_eq!(reason(&[&good[..], b"x"].concat(), "eu"), "truncated");
        assert_eq!(reason(&good, "us"), "wrong_region");
        assert_eq!(reason(b"{\"not\": 1}", "eu"), "not_a_snapshot");
        assert_eq!(reason(&good[..10], "eu"), "truncated");
    }
}
