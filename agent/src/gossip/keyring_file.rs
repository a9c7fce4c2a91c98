//! The keyring a member persists in its data directory (`gossip.keyring`), so that a
//! restart keeps what an online rotation installed.
//!
//! ```text
//! +--------+---------+-------+-----------------------------+--------------+
//! | "WMKR" | version | count | count × 32-byte key         | CRC-32 (LE)  |
//! +--------+---------+-------+-----------------------------+--------------+
//!   4 bytes  1 (= 1)   1       primary first, no duplicates  over all before
//! ```
//!
//! [`decode`] is a disk decoder: total (every input ends in a keyring or a typed error)
//! and bounded (at most [`FILE_BYTES_MAX`] are read; a count above [`KEYS_MAX`] is
//! refused). [`save`] writes a temporary file readable by this user only (`0600`),
//! syncs it, renames it over the old one and syncs the directory, so a crash leaves the
//! old keyring or the new one, never a mix. At start, [`load_or`] prefers the file to
//! the configured keys when it exists.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use super::codec::{KEY_LEN, Key, Keyring};
use super::rotation::KEYS_MAX;

/// The file's name in a data directory.
pub const FILE_NAME: &str = "gossip.keyring";
/// What every file starts with.
pub const MAGIC: &[u8; 4] = b"WMKR";
/// The format this build writes and reads.
pub const FORMAT_VERSION: u8 = 1;
/// The largest valid file: a full ring.
pub const FILE_BYTES_MAX: usize = HEADER_LEN + KEYS_MAX * KEY_LEN + CRC_LEN;

const HEADER_LEN: usize = MAGIC.len() + 2;
const CRC_LEN: usize = 4;

/// Why a keyring file was not read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyringFileError {
    /// The file is not a keyring this build reads (wrong magic or version, a count out of
    /// range, a length that does not match it, a key twice). Nothing was loaded: restore
    /// the file, or remove it to start from the configured keys.
    #[error("not a waymark gossip keyring: {0}")]
    Malformed(&'static str),
    /// The checksum does not match: the file is damaged. Nothing was loaded: as above.
    #[error("the keyring file's checksum does not match: it is damaged")]
    Checksum,
    /// Reading or writing failed. Nothing changed (a failed write leaves the old file).
    #[error("{op} {path}")]
    Io {
        /// `reading` or `writing`.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Where the keyring a member started with came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyringSource {
    /// The file a rotation persisted.
    File,
    /// The configured `keys`.
    Config,
}

impl KeyringSource {
    /// `file` or `config`, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Config => "config",
        }
    }
}

/// The file's bytes for `keyring`.
pub fn encode(keyring: &Keyring) -> Vec<u8> {
    let keys: Vec<&Key> = keyring.keys().take(KEYS_MAX).collect();
    let mut out = Vec::with_capacity(HEADER_LEN + keys.len() * KEY_LEN + CRC_LEN);
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION);
    // At most KEYS_MAX (8), so it fits a byte.
    out.push(u8::try_from(keys.len()).unwrap_or(u8::MAX));
    for key in keys {
        out.extend_from_slice(key.secret_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The keyring in a file's bytes. Total and bounded; see the module documentation.
pub fn decode(bytes: &[u8]) -> Result<Keyring, KeyringFileError> {
    use KeyringFileError::Malformed;
    if bytes.len() > FILE_BYTES_MAX {
        return Err(Malformed("longer than any keyring"));
    }
    if bytes.len() < HEADER_LEN + CRC_LEN {
        return Err(Malformed("shorter than its header"));
    }
    if &bytes[..MAGIC.len()] != MAGIC {
        return Err(Malformed("no WMKR magic"));
    }
    if bytes[4] != FORMAT_VERSION {
        return Err(Malformed("unknown format version"));
    }
    let count = usize::from(bytes[5]);
    if count == 0 || count > KEYS_MAX {
        return Err(Malformed("key count out of range"));
    }
    let body_len = HEADER_LEN + count * KEY_LEN;
    if bytes.len() != body_len + CRC_LEN {
        return Err(Malformed("length does not match the key count"));
    }
    let (body, crc) = bytes.split_at(body_len);
    let stated = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32fast::hash(body) != stated {
        return Err(KeyringFileError::Checksum);
    }
    let mut keys: Vec<Key> = Vec::with_capacity(count);
    for chunk in body[HEADER_LEN..].chunks_exact(KEY_LEN) {
        let key = Key::try_from_slice(chunk).map_err(|_| Malformed("a key of the wrong length"))?;
        if keys.contains(&key) {
            return Err(Malformed("a key twice"));
        }
        keys.push(key);
    }
    let mut keys = keys.into_iter();
    let primary = keys.next().ok_or(Malformed("no key"))?;
    Ok(Keyring::new(primary, keys.collect()))
}

/// Writes `keyring` to `path` atomically, readable by this user only. Blocking.
pub fn save(path: &Path, keyring: &Keyring) -> Result<(), KeyringFileError> {
    let io = |source| KeyringFileError::Io {
        op: "writing",
        path: path.to_path_buf(),
        source,
    };
    let temp = temp_path(path);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(&temp).map_err(io)?;
    // A temporary file left by an older build may carry wider permissions.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io)?;
    }
    file.write_all(&encode(keyring)).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&temp, path).map_err(io)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // The rename is durable once the directory is.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
    }
    Ok(())
}

/// The keyring persisted at `path`; `None` when there is no file. Blocking; reads at most
/// [`FILE_BYTES_MAX`] + 1 bytes.
pub fn load(path: &Path) -> Result<Option<Keyring>, KeyringFileError> {
    let io = |source| KeyringFileError::Io {
        op: "reading",
        path: path.to_path_buf(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let mut bytes = Vec::with_capacity(FILE_BYTES_MAX + 1);
    file.take(FILE_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    decode(&bytes).map(Some)
}

/// The keyring to start with: the one persisted at `path` when there is one, else
/// `configured`; and which it was. A file that cannot be read is an error, never a silent
/// fall back to keys a rotation may have retired.
pub fn load_or(
    path: &Path,
    configured: Keyring,
) -> Result<(Keyring, KeyringSource), KeyringFileError> {
    Ok(match load(path)? {
        Some(persisted) => (persisted, KeyringSource::File),
        None => (configured, KeyringSource::Config),
    })
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn ring() -> Keyring {
        let key = |b: u8| Key::from_bytes(&[b; KEY_LEN]);
        Keyring::new(key(1), vec![key(2), key(3)])
    }

    fn ids(ring: &Keyring) -> Vec<String> {
        ring.keys().map(|k| k.id().to_string()).collect()
    }

    #[test]
    fn a_saved_keyring_loads_back_with_its_order_and_mode() {
        // Goal: a restart gets exactly the ring a rotation left, primary first, in a file
        // only this user can read.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        assert!(load(&path).unwrap().is_none(), "no file yet");
        save(&path, &ring()).unwrap();
        assert_eq!(ids(&load(&path).unwrap().unwrap()), ids(&ring()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(!temp_path(&path).exists(), "the temporary file was renamed");
        let configured = Keyring::single(Key::from_bytes(&[9; KEY_LEN]));
        let (chosen, source) = load_or(&path, configured.clone()).unwrap();
        assert_eq!((ids(&chosen), source), (ids(&ring()), KeyringSource::File));
        std::fs::remove_file(&path).unwrap();
        let (chosen, source) = load_or(&path, configured.clone()).unwrap();
        assert_eq!(
            (ids(&chosen), source),
            (ids(&configured), KeyringSource::Config)
        );
    }

    #[test]
    fn every_damaged_or_foreign_file_is_refused() {
        // Goal: the decoder is total: truncation, any flipped byte, extra bytes and
        // counts out of range are typed errors, never a panic or a different ring.
        let good = encode(&ring());
        assert_eq!(ids(&decode(&good).unwrap()), ids(&ring()));
        for len in 0..good.len() {
            assert!(decode(&good[..len]).is_err(), "truncated to {len}");
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "byte {i} flipped");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(decode(&long).is_err());
        assert!(decode(&vec![0; FILE_BYTES_MAX + 1]).is_err());
        // A well-formed file naming a key twice.
        let key = [5u8; KEY_LEN];
        let mut twice = vec![b'W', b'M', b'K', b'R', FORMAT_VERSION, 2];
        twice.extend_from_slice(&key);
        twice.extend_from_slice(&key);
        let crc = crc32fast::hash(&twice);
        twice.extend_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            decode(&twice),
            Err(KeyringFileError::Malformed("a key twice"))
        ));
    }

    #[test]
    fn a_file_that_cannot_be_decoded_is_an_error_not_the_configured_keys() {
        // Goal: a damaged file never silently brings back keys a rotation retired.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, b"WMKR junk").unwrap();
        let e = load_or(&path, ring()).unwrap_err();
        assert!(matches!(e, KeyringFileError::Malformed(_)), "{e}");
    }
}
