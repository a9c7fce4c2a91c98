//! The last-known-good cache file: the served table, on disk, checksummed.
//!
//! Format: one JSON envelope `{"format":1,"checksum":"<fnv-1a 64, hex>","body":"<json>"}`
//! whose `body` is the table as a JSON string, so the checksum covers exact bytes. A file
//! that fails to parse or whose checksum does not match is never served.
//!
//! [`store`] is atomic and durable: write a sibling temp file, fsync it, rename it over the
//! target, fsync the directory. A crash at any point leaves the old file or the new one,
//! whole.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::table::{ServiceEndpoints, Table};

const FORMAT: u32 = 1;

/// Why the cache could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// Reading or writing failed. On `store`: the previous file is intact; the caller keeps
    /// serving and should alert (a restart would come back with an older view). On `load`:
    /// nothing is served from the file.
    #[error("cache file i/o failed")]
    Io(#[from] std::io::Error),
    /// The file is not a cache envelope, or its body is not a table. Never served; the
    /// next successful `store` replaces it.
    #[error("cache file is malformed")]
    Malformed(#[source] serde_json::Error),
    /// The body does not match its checksum (torn or altered). Never served; the next
    /// successful `store` replaces it.
    #[error("cache file checksum mismatch")]
    Checksum,
    /// Written by an incompatible version of this library. Never served.
    #[error("cache file format {0} is not supported")]
    Format(u32),
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    format: u32,
    checksum: String,
    body: String,
}

#[derive(Serialize, Deserialize)]
struct Body {
    services: BTreeMap<String, Persisted>,
}

#[derive(Serialize, Deserialize)]
struct Persisted {
    confirmed_unix_ms: u64,
    endpoints: ServiceEndpoints,
}

/// Encode a table as the cache file's bytes (deterministic: services sorted by name).
pub fn encode(table: &Table) -> Vec<u8> {
    let services = table
        .services()
        .into_iter()
        .map(|(endpoints, confirmed_unix_ms)| {
            let persisted = Persisted {
                confirmed_unix_ms,
                endpoints: (*endpoints).clone(),
            };
            (endpoints.service.clone(), persisted)
        })
        .collect();
    let body = serde_json::to_string(&Body { services })
        .expect("a table of strings, integers and addresses always serialises");
    let envelope = Envelope {
        format: FORMAT,
        checksum: format!("{:016x}", fnv1a(body.as_bytes())),
        body,
    };
    serde_json::to_vec(&envelope).expect("an envelope of strings always serialises")
}

/// Decode the cache file's bytes; every entry comes back as "not upstream".
pub fn decode(bytes: &[u8]) -> Result<Table, CacheError> {
    let envelope: Envelope = serde_json::from_slice(bytes).map_err(CacheError::Malformed)?;
    if envelope.format != FORMAT {
        return Err(CacheError::Format(envelope.format));
    }
    if envelope.checksum != format!("{:016x}", fnv1a(envelope.body.as_bytes())) {
        return Err(CacheError::Checksum);
    }
    let body: Body = serde_json::from_str(&envelope.body).map_err(CacheError::Malformed)?;
    Ok(Table::from_services(
        body.services
            .into_values()
            .map(|p| (p.endpoints, p.confirmed_unix_ms)),
    ))
}

/// Write `table` to `path` atomically and durably (see the module documentation).
pub fn store(path: &Path, table: &Table) -> Result<(), CacheError> {
    let tmp = temp_path(path);
    let mut file = File::create(&tmp)?;
    file.write_all(&encode(table))?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, path)?;
    sync_dir(path)?;
    Ok(())
}

/// Read `path`: `Ok(None)` if there is no file yet.
pub fn load(path: &Path) -> Result<Option<Table>, CacheError> {
    match fs::read(path) {
        Ok(bytes) => decode(&bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CacheError::Io(e)),
    }
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Make the rename itself durable (POSIX: the directory entry lives in the directory).
#[cfg(unix)]
fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_path: &Path) -> std::io::Result<()> {
    Ok(())
}

/// FNV-1a, 64 bit: detects torn and altered files (not an adversary; the file is local).
fn fnv1a(bytes: &[u8]) -> u64 {
    waymark_core::hash::fnv1a(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Endpoint;
    use waymark_core::view::EndpointStatus;

    fn table() -> Table {
        let endpoints = ServiceEndpoints {
            service: "pay".into(),
            version: "7".into(),
            endpoints: vec![Endpoint {
                address: "10.0.0.1".parse().unwrap(),
                port: 8080,
                weight: 100,
                region: "eu".into(),
                zone: "a".into(),
                priority: 0,
                status: EndpointStatus::Eligible,
                health_disregarded: false,
                instance: Some("pay-1".into()),
                capability: None,
            }],
            withheld: 1,
            health_disregarded: false,
        };
        let empty = ServiceEndpoints {
            service: "cart".into(),
            version: "3".into(),
            endpoints: vec![],
            withheld: 0,
            health_disregarded: false,
        };
        Table::from_services([(endpoints, 1_000), (empty, 2_000)])
    }

    #[test]
    fn a_stored_table_loads_back_equal() {
        // Goal: the cache round-trips every field, including empty services.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resolver.json");
        assert!(load(&path).unwrap().is_none(), "no file yet");
        store(&path, &table()).unwrap();
        assert_eq!(load(&path).unwrap(), Some(table()));
        assert!(!temp_path(&path).exists(), "temp file renamed away");
    }

    #[test]
    fn an_altered_body_fails_its_checksum_and_is_not_served() {
        // Goal: a flipped byte inside the body is caught by the checksum, not served.
        let bytes = encode(&table());
        let text = String::from_utf8(bytes).unwrap();
        let altered = text.replacen("8080", "8081", 1);
        assert_ne!(text, altered);
        assert!(matches!(
            decode(altered.as_bytes()),
            Err(CacheError::Checksum)
        ));
    }

    #[test]
    fn a_truncated_or_foreign_file_is_malformed() {
        // Goal: torn writes and unrelated JSON are refused.
        let bytes = encode(&table());
        let torn = &bytes[..bytes.len() / 2];
        assert!(matches!(decode(torn), Err(CacheError::Malformed(_))));
        assert!(matches!(
            decode(br#"{"hello":1}"#),
            Err(CacheError::Malformed(_))
        ));
        let future = String::from_utf8(bytes)
            .unwrap()
            .replacen("\"format\":1", "\"format\":9", 1);
        assert!(matches!(
            decode(future.as_bytes()),
            Err(CacheError::Format(9))
        ));
    }
}
