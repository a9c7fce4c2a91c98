//! The node agent's last-known-good records (`waymark-lkg`): the stored-value decoder, the
//! record encoding through a store, and the agent's cache load on top (`node::cache::load`,
//! which also reads the cache's own bookkeeping records).
//!
//! Input: byte 0 picks the path.
//! - even: `key_len`, key, value — a stored (key, value) pair as the disk holds it, torn or
//!   altered or not. A value that decodes re-encodes to exactly itself (so a decoded record
//!   is exactly what was written, never a near miss).
//! - odd: up to 8 records, each `type_url \0 name \0 version \0 payload_len(u16) payload`,
//!   put into a store and loaded back: every one comes back intact, and the agent's cache
//!   loads them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use waymark_agent::node::cache;
use waymark_lkg::{MemViewStore, Record, ViewStore, decode, encode};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        stored_value(rest);
    } else {
        through_a_store(rest);
    }
});

fn stored_value(data: &[u8]) {
    let Some((&key_len, rest)) = data.split_first() else {
        return;
    };
    let key_len = usize::from(key_len).min(rest.len());
    let (key, value) = rest.split_at(key_len);
    let key = String::from_utf8_lossy(key);
    if let Some(record) = decode(&key, value) {
        assert_eq!(
            encode(&record),
            value,
            "a decoded record re-encodes to what was stored"
        );
    }
}

fn through_a_store(mut data: &[u8]) {
    let store = MemViewStore::default();
    let mut written: Vec<Record> = Vec::new();
    while written.len() < 8 {
        let Some((record, tail)) = record(data) else {
            break;
        };
        data = tail;
        store.put(&record).expect("the memory store never fails");
        written.retain(|r| (&r.type_url, &r.name) != (&record.type_url, &record.name));
        written.push(record);
    }
    let loaded = store.load().expect("the memory store never fails");
    assert!(
        loaded.corrupt.is_empty(),
        "intact records loaded as corrupt: {:?}",
        loaded.corrupt
    );
    written.sort_by(|a, b| (&a.type_url, &a.name).cmp(&(&b.type_url, &b.name)));
    let mut records = loaded.records;
    records.sort_by(|a, b| (&a.type_url, &a.name).cmp(&(&b.type_url, &b.name)));
    assert_eq!(records, written, "what was put is what loads");
    let _ = cache::load(&store).expect("the memory store never fails");
}

fn record(data: &[u8]) -> Option<(Record, &[u8])> {
    let mut fields = data.splitn(4, |b| *b == 0);
    let type_url = String::from_utf8_lossy(fields.next()?).into_owned();
    let name = String::from_utf8_lossy(fields.next()?).into_owned();
    let version = String::from_utf8_lossy(fields.next()?).into_owned();
    let rest = fields.next()?;
    let len = usize::from(u16::from_be_bytes([*rest.first()?, *rest.get(1)?]));
    let rest = &rest[2..];
    let (payload, tail) = rest.split_at(len.min(rest.len()));
    let type_url = if type_url.is_empty() {
        "t".to_owned()
    } else {
        type_url
    };
    Some((
        Record {
            type_url,
            name,
            version,
            payload: payload.to_vec(),
        },
        tail,
    ))
}
