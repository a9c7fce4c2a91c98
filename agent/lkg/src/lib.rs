//! The node agent's last-known-good cache (ADR-01): every applied xDS resource, on disk.
//!
//! A caller routes from the view it last received; the node agent persists each applied
//! resource *before* serving it, so a sidecar restarted during a control-plane outage gets
//! its view from here without waiting for anyone. [`ViewStore`] is the seam: [`SledViewStore`]
//! for the agent (sled, as the user asked; the data can always be re-fetched, which is the
//! job sled's own README says it suits), [`MemViewStore`] for tests. Both pass the same
//! conformance suite.
//!
//! Every record carries a checksum over its key, version and payload. A record that fails
//! it (torn write, bit rot, a bug) is never served: `load` skips it, names it, and the
//! caller logs and counts it.

#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use waymark_core::hash::Fnv1a;

/// One persisted resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Its xDS type URL.
    pub type_url: String,
    /// Its name.
    pub name: String,
    /// The version the server gave it.
    pub version: String,
    /// The encoded resource (`Any.value`).
    pub payload: Vec<u8>,
}

/// What `load` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Every intact record, in key order.
    pub records: Vec<Record>,
    /// Keys of records that failed their checksum or could not be decoded; never served.
    pub corrupt: Vec<String>,
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend failed (disk full, I/O error). The record may or may not be durable:
    /// treat it as not acknowledged and keep serving what was served before.
    #[error("store backend failed")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// A durable map of resources.
///
/// ### To ensure correctness
/// - `put` returns `Ok` only once the record is durable: a crash (even `kill -9`) after it
///   returns leaves this record or a newer one, never an older one or a torn one;
/// - a crash during `put` leaves the previous record or the new one, intact;
/// - `load` never returns a record that fails its checksum.
pub trait ViewStore: Send + Sync {
    /// Persist a record, replacing any with the same type and name; durable on `Ok`.
    fn put(&self, record: &Record) -> Result<(), StoreError>;
    /// Remove a record; durable on `Ok`. Removing what is absent is not an error.
    fn remove(&self, type_url: &str, name: &str) -> Result<(), StoreError>;
    /// Every intact record, and the keys of those that are not.
    fn load(&self) -> Result<Loaded, StoreError>;
    /// Persist `puts` and `removes` (type URL, name) as one unit, durable on `Ok`: a crash
    /// leaves all of them or none. The default applies them one by one (for backends
    /// without batches; not atomic across records).
    fn write_batch(&self, puts: &[Record], removes: &[(String, String)]) -> Result<(), StoreError> {
        for r in puts {
            self.put(r)?;
        }
        for (t, n) in removes {
            self.remove(t, n)?;
        }
        Ok(())
    }
}

const MAGIC: u32 = 0x574d_4c31; // "WML1"

fn key(type_url: &str, name: &str) -> String {
    format!("{type_url}\u{0}{name}")
}

/// Encode a record's value: magic, checksum, version length, version, payload.
pub fn encode(record: &Record) -> Vec<u8> {
    let k = key(&record.type_url, &record.name);
    let sum = checksum(&k, &record.version, &record.payload);
    let mut out = Vec::with_capacity(16 + record.version.len() + record.payload.len());
    out.extend_from_slice(&MAGIC.to_be_bytes());
    out.extend_from_slice(&sum.to_be_bytes());
    out.extend_from_slice(&(record.version.len() as u32).to_be_bytes());
    out.extend_from_slice(record.version.as_bytes());
    out.extend_from_slice(&record.payload);
    out
}

/// Decode a stored value for `key`; `None` if it is torn, altered or foreign.
pub fn decode(stored_key: &str, value: &[u8]) -> Option<Record> {
    let (type_url, name) = stored_key.split_once('\u{0}')?;
    let magic = u32::from_be_bytes(value.get(0..4)?.try_into().ok()?);
    let sum = u64::from_be_bytes(value.get(4..12)?.try_into().ok()?);
    let vlen = u32::from_be_bytes(value.get(12..16)?.try_into().ok()?) as usize;
    let version = std::str::from_utf8(value.get(16..16usize.checked_add(vlen)?)?).ok()?;
    let payload = value.get(16 + vlen..)?;
    if magic != MAGIC || checksum(stored_key, version, payload) != sum {
        return None;
    }
    Some(Record {
        type_url: type_url.to_owned(),
        name: name.to_owned(),
        version: version.to_owned(),
        payload: payload.to_vec(),
    })
}

/// FNV-1a over key, version and payload, separated: detects torn and altered records.
fn checksum(key: &str, version: &str, payload: &[u8]) -> u64 {
    Fnv1a::new()
        .chain(key.as_bytes())
        .chain(&[0xff])
        .chain(version.as_bytes())
        .chain(&[0xfe])
        .chain(payload)
        .finish()
}

// === SledViewStore ===

/// The agent's store: one sled tree, flushed before every acknowledgement.
#[derive(Debug, Clone)]
pub struct SledViewStore {
    db: sled::Db,
}

impl SledViewStore {
    /// Open (or create) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let db = sled::open(dir).map_err(backend)?;
        Ok(Self { db })
    }

    /// Write raw bytes under a record's key, bypassing encoding: tests use it to plant a
    /// corrupted record and check it is never served.
    pub fn put_raw_for_test(
        &self,
        type_url: &str,
        name: &str,
        value: &[u8],
    ) -> Result<(), StoreError> {
        self.db
            .insert(key(type_url, name), value)
            .map_err(backend)?;
        self.db.flush().map_err(backend)?;
        Ok(())
    }
}

fn backend(e: sled::Error) -> StoreError {
    StoreError::Backend(Box::new(e))
}

impl ViewStore for SledViewStore {
    fn put(&self, record: &Record) -> Result<(), StoreError> {
        self.db
            .insert(key(&record.type_url, &record.name), encode(record))
            .map_err(backend)?;
        // Acknowledge only what is on disk: an unflushed write can be lost to a crash.
        self.db.flush().map_err(backend)?;
        Ok(())
    }

    fn remove(&self, type_url: &str, name: &str) -> Result<(), StoreError> {
        self.db.remove(key(type_url, name)).map_err(backend)?;
        self.db.flush().map_err(backend)?;
        Ok(())
    }

    fn write_batch(&self, puts: &[Record], removes: &[(String, String)]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for r in puts {
            batch.insert(key(&r.type_url, &r.name).as_bytes(), encode(r));
        }
        for (t, n) in removes {
            batch.remove(key(t, n).as_bytes());
        }
        self.db.apply_batch(batch).map_err(backend)?;
        self.db.flush().map_err(backend)?;
        Ok(())
    }

    fn load(&self) -> Result<Loaded, StoreError> {
        let mut loaded = Loaded::default();
        for item in self.db.iter() {
            let (k, v) = item.map_err(backend)?;
            let k = String::from_utf8_lossy(&k).into_owned();
            match decode(&k, &v) {
                Some(r) => loaded.records.push(r),
                None => {
                    tracing::error!(key = %k.replace('\u{0}', "/"), "corrupted last-known-good record discarded");
                    loaded.corrupt.push(k);
                }
            }
        }
        Ok(loaded)
    }
}

// === MemViewStore ===

/// An in-memory store for tests and simulations (durable for the process's life only).
#[derive(Debug, Default)]
pub struct MemViewStore {
    map: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl ViewStore for MemViewStore {
    fn put(&self, record: &Record) -> Result<(), StoreError> {
        let mut map = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.insert(key(&record.type_url, &record.name), encode(record));
        Ok(())
    }

    fn remove(&self, type_url: &str, name: &str) -> Result<(), StoreError> {
        let mut map = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.remove(&key(type_url, name));
        Ok(())
    }

    fn load(&self) -> Result<Loaded, StoreError> {
        let map = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut loaded = Loaded::default();
        for (k, v) in map.iter() {
            match decode(k, v) {
                Some(r) => loaded.records.push(r),
                None => loaded.corrupt.push(k.clone()),
            }
        }
        Ok(loaded)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn record(name: &str, version: &str, payload: &[u8]) -> Record {
        Record {
            type_url: "type.googleapis.com/x.Y".into(),
            name: name.into(),
            version: version.into(),
            payload: payload.to_vec(),
        }
    }

    /// The conformance suite every backend passes.
    fn conformance(store: &dyn ViewStore) {
        assert_eq!(store.load().unwrap(), Loaded::default());
        store.put(&record("pay", "1", b"one")).unwrap();
        store.put(&record("cart", "4", b"four")).unwrap();
        store.put(&record("pay", "2", b"two")).unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(
            loaded.records,
            vec![record("cart", "4", b"four"), record("pay", "2", b"two")]
        );
        store.remove("type.googleapis.com/x.Y", "cart").unwrap();
        store
            .remove("type.googleapis.com/x.Y", "never-there")
            .unwrap();
        assert_eq!(
            store.load().unwrap().records,
            vec![record("pay", "2", b"two")]
        );
        let removes = [("type.googleapis.com/x.Y".to_owned(), "pay".to_owned())];
        store
            .write_batch(&[record("cart", "5", b"five")], &removes)
            .unwrap();
        assert_eq!(
            store.load().unwrap().records,
            vec![record("cart", "5", b"five")]
        );
    }

    #[test]
    fn the_memory_store_conforms() {
        conformance(&MemViewStore::default());
    }

    #[test]
    fn the_sled_store_conforms_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = SledViewStore::open(dir.path()).unwrap();
            conformance(&store);
        }
        let reopened = SledViewStore::open(dir.path()).unwrap();
        assert_eq!(
            reopened.load().unwrap().records,
            vec![record("cart", "5", b"five")]
        );
    }

    #[test]
    fn a_corrupted_record_is_never_served() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledViewStore::open(dir.path()).unwrap();
        store.put(&record("pay", "2", b"good")).unwrap();
        let mut bad = encode(&record("cart", "3", b"payload"));
        let last = bad.len() - 1;
        bad[last] ^= 0x01; // one flipped bit
        store
            .put_raw_for_test("type.googleapis.com/x.Y", "cart", &bad)
            .unwrap();
        store
            .put_raw_for_test("type.googleapis.com/x.Y", "torn", &bad[..7])
            .unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.records, vec![record("pay", "2", b"good")]);
        assert_eq!(loaded.corrupt.len(), 2);
    }

    proptest! {
        #[test]
        fn encoding_round_trips_and_any_flip_is_caught(
            name in "[a-z]{1,12}", version in "[0-9]{1,8}", payload in prop::collection::vec(any::<u8>(), 0..64), flip in any::<usize>()
        ) {
            let r = record(&name, &version, &payload);
            let k = key(&r.type_url, &r.name);
            let bytes = encode(&r);
            prop_assert_eq!(decode(&k, &bytes), Some(r));
            let mut bad = bytes.clone();
            let i = flip % bad.len();
            bad[i] ^= 0x80;
            prop_assert_eq!(decode(&k, &bad), None);
        }
    }
}
