//! The last-known-good cache between the upstream client and the served view (ADR-01).
//!
//! Every response the upstream client accepts is written here, as one sled batch, *before*
//! it is applied and acknowledged ([`waymark_xds::client::Persist`]); so what the authority
//! believes this agent holds is always on disk. On start the cache is loaded and served at
//! once. A record that fails its checksum is discarded with an error log and counted,
//! never served. Alongside the resources, the cache keeps when the upstream last confirmed
//! them (wall clock, for the staleness metric after a restart).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::google::protobuf::Any;
use waymark_lkg::{Record, StoreError, ViewStore};
use waymark_xds::client::{AppliedType, Persist};

use super::view::Upstream;

/// The type URL of the cache's own bookkeeping records (never served).
const META_TYPE: &str = "waymark.agent.meta";
/// When the upstream last sent (and this agent persisted) anything: unix ms, decimal.
const META_CONFIRMED: &str = "confirmed_at_unix_ms";
/// The highest version served to sidecars (decimal), written before it is served.
const META_SERVED: &str = "served_high_water";

/// What was loaded.
#[derive(Debug, Default)]
pub struct LoadedCache {
    /// The resources, as an upstream state.
    pub upstream: Upstream,
    /// Resources loaded.
    pub records: usize,
    /// Records discarded (failed their checksum).
    pub corrupt: usize,
    /// When the upstream last confirmed them, if known.
    pub confirmed_at: Option<SystemTime>,
    /// The highest version served before (0 if none).
    pub served_high_water: u64,
}

/// Load the cache.
pub fn load(store: &dyn ViewStore) -> Result<LoadedCache, StoreError> {
    let loaded = store.load()?;
    let mut types: BTreeMap<String, AppliedType> = BTreeMap::new();
    let mut out = LoadedCache {
        corrupt: loaded.corrupt.len(),
        ..LoadedCache::default()
    };
    for record in loaded.records {
        if record.type_url == META_TYPE {
            let number = std::str::from_utf8(&record.payload)
                .ok()
                .and_then(|s| s.parse::<u64>().ok());
            match record.name.as_str() {
                META_CONFIRMED => {
                    out.confirmed_at = number.map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
                }
                META_SERVED => out.served_high_water = number.unwrap_or(0),
                _ => {}
            }
            continue;
        }
        out.records += 1;
        let any = Any {
            type_url: record.type_url.clone(),
            value: record.payload,
        };
        types
            .entry(record.type_url)
            .or_default()
            .resources
            .insert(record.name, (record.version, any));
    }
    out.upstream = types.into_iter().map(|(t, a)| (t, Arc::new(a))).collect();
    Ok(out)
}

/// The upstream client's durability hook over `store`: each accepted response, with the
/// confirmation time, as one batch.
pub fn persist(store: Arc<dyn ViewStore>) -> Persist {
    Arc::new(move |resp| {
        let mut puts: Vec<Record> = resp
            .resources
            .iter()
            .filter_map(|r| {
                let any = r.resource.as_ref()?;
                Some(Record {
                    type_url: resp.type_url.clone(),
                    name: r.name.clone(),
                    version: r.version.clone(),
                    payload: any.value.clone(),
                })
            })
            .collect();
        puts.push(confirmation(SystemTime::now()));
        let removes: Vec<(String, String)> = resp
            .removed_resources
            .iter()
            .map(|n| (resp.type_url.clone(), n.clone()))
            .collect();
        store.write_batch(&puts, &removes).map_err(|e| {
            format!(
                "last-known-good cache: {e}: {:?}",
                std::error::Error::source(&e)
            )
        })
    })
}

/// Record that versions up to `version` may be served (before serving them).
pub fn served_high_water(store: &dyn ViewStore, version: u64) -> Result<(), StoreError> {
    store.put(&Record {
        type_url: META_TYPE.to_owned(),
        name: META_SERVED.to_owned(),
        version: String::new(),
        payload: version.to_string().into_bytes(),
    })
}

fn confirmation(at: SystemTime) -> Record {
    let ms = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
        .to_string();
    Record {
        type_url: META_TYPE.to_owned(),
        name: META_CONFIRMED.to_owned(),
        version: String::new(),
        payload: ms.into_bytes(),
    }
}

/// The cached upstream state as the client's starting point (what it names in its first
/// requests, so the authority sends only what changed).
pub fn initial(upstream: &Upstream) -> BTreeMap<String, AppliedType> {
    upstream
        .iter()
        .map(|(t, a)| (t.clone(), (**a).clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, Resource};
    use waymark_lkg::MemViewStore;

    use super::*;

    fn response(names: &[(&str, &str)], removed: &[&str]) -> DeltaDiscoveryResponse {
        DeltaDiscoveryResponse {
            type_url: "t/x".into(),
            resources: names
                .iter()
                .map(|(n, v)| Resource {
                    name: (*n).into(),
                    version: (*v).into(),
                    resource: Some(Any {
                        type_url: "t/x".into(),
                        value: format!("{n}@{v}").into_bytes(),
                    }),
                    ..Default::default()
                })
                .collect(),
            removed_resources: removed.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn persisted_responses_load_back_as_the_upstream_state() {
        let store: Arc<dyn ViewStore> = Arc::new(MemViewStore::default());
        let hook = persist(Arc::clone(&store));
        hook(&response(&[("a", "1"), ("b", "1")], &[])).unwrap();
        hook(&response(&[("a", "2")], &["b"])).unwrap();
        let loaded = load(store.as_ref()).unwrap();
        assert_eq!(loaded.records, 1);
        assert_eq!(loaded.corrupt, 0);
        assert!(loaded.confirmed_at.is_some());
        let (v, any) = &loaded.upstream["t/x"].resources["a"];
        assert_eq!(v, "2");
        assert_eq!(any.value, b"a@2");
        assert_eq!(any.type_url, "t/x");
        assert!(!loaded.upstream.contains_key(META_TYPE));
        assert_eq!(loaded.served_high_water, 0);
        served_high_water(store.as_ref(), 42).unwrap();
        assert_eq!(load(store.as_ref()).unwrap().served_high_water, 42);
    }

    #[test]
    fn a_corrupted_record_is_counted_and_never_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let sled = waymark_lkg::SledViewStore::open(dir.path()).unwrap();
        sled.put_raw_for_test("t/x", "bad", b"not a record")
            .unwrap();
        let store: Arc<dyn ViewStore> = Arc::new(sled);
        persist(Arc::clone(&store))(&response(&[("good", "1")], &[])).unwrap();
        let loaded = load(store.as_ref()).unwrap();
        assert_eq!(loaded.corrupt, 1);
        assert_eq!(loaded.records, 1);
        assert!(loaded.upstream["t/x"].resources.contains_key("good"));
        assert!(!loaded.upstream["t/x"].resources.contains_key("bad"));
    }
}
