//! `AuthorityState::apply` over arbitrary log entries: registry commands (alone and in
//! group-committed batches), published views,
//! observed-state snapshots (whole and in parts) and audit records, as the authority's Raft log carries them.
//!
//! Input: JSON lines of `Request`, or bytes for the structured decoder. After every apply
//! the state serializes and the published version has not gone back; at the end its
//! snapshot decodes back equal, and a replica restored from a snapshot part-way agrees on
//! every response and on the final state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use waymark_agent::authority::raft::codec;
use waymark_fuzz::{Gen, Limits, capped, is_json_lines, lines};
use waymark_registry::machine::{AuthorityState, Request};

fuzz_target!(|data: &[u8]| run(capped(data)));

fn run(data: &[u8]) {
    let log = requests(data);
    if log.is_empty() {
        return;
    }
    let restore_at = data.last().map_or(0, |b| usize::from(*b) % log.len());

    let mut state = AuthorityState::default();
    let mut responses = Vec::with_capacity(log.len());
    for request in &log {
        let floor = state.max_version();
        let response = state.apply(request.clone());
        assert!(
            state.max_version() >= floor,
            "the published version went back after {request:?}"
        );
        serde_json::to_vec(&state).expect("the authority state always serializes");
        responses.push(response);
    }
    let bytes = serde_json::to_vec(&state).expect("the authority state serializes");
    let back: AuthorityState = serde_json::from_slice(&bytes).expect("its JSON decodes");
    assert_eq!(back, state, "the state round-trips as JSON (the API's form)");
    let bytes = codec::encode(&state).expect("the authority state encodes");
    let back: AuthorityState = codec::decode(&bytes).expect("its snapshot decodes");
    assert_eq!(back, state, "the snapshot round-trips");

    let mut replica = AuthorityState::default();
    for (i, (request, response)) in log.iter().zip(&responses).enumerate() {
        if i == restore_at {
            let bytes = codec::encode(&replica).expect("the authority state encodes");
            replica = codec::decode(&bytes).expect("its snapshot decodes");
        }
        let again = replica.apply(request.clone());
        assert_eq!(&again, response, "replicas disagree on {request:?}");
    }
    assert_eq!(replica, state, "replicas applying one log diverged");
}

fn requests(data: &[u8]) -> Vec<Request> {
    if is_json_lines(data) {
        return lines(data)
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
    }
    let mut g = Gen::new(data);
    let mut log = Vec::new();
    let mut version = 0u64;
    while !g.is_empty() && log.len() < Limits::STEPS_MAX {
        let Some(request) = waymark_fuzz::decode::<Request>(request(&mut g, &mut version)) else {
            continue;
        };
        log.push(request);
    }
    log
}

/// One log entry as JSON: mostly registry commands and views, like a leader's log.
fn request(g: &mut Gen<'_>, version: &mut u64) -> Value {
    match g.below(8) {
        0..=2 => {
            let mut v = g.stamped();
            v["kind"] = json!("registry");
            v
        }
        3 => {
            // A group-committed batch: several commands in one entry.
            let commands: Vec<Value> = (0..g.below(6)).map(|_| g.stamped()).collect();
            json!({"kind": "batch", "commands": commands})
        }
        4 | 5 => {
            let views: Vec<Value> = (0..g.below(4))
                .map(|_| {
                    // Versions mostly rise, as one leader's do; now and then one repeats,
                    // goes back, or comes from a new term (`term << 32 | seq`).
                    *version = match g.below(6) {
                        0 => version.saturating_sub(1),
                        1 => *version,
                        2 => (g.u32() << 32) | (*version & 0xffff_ffff),
                        3 => g.u64(),
                        _ => version.saturating_add(1),
                    };
                    let service = g.valid_name();
                    let zone = g.pick(&["eu-west-1a", "eu-west-1b"]);
                    g.released_view(&service, zone, *version)
                })
                .collect();
            if g.one_in(2) {
                return json!({"kind": "publish", "views": views});
            }
            // The same views as releases: whole, or as patches on a base that is mostly
            // the version just before (what a member holds) and now and then anything.
            let releases: Vec<Value> = views
                .into_iter()
                .map(|mut v| {
                    if g.one_in(3) {
                        v["kind"] = json!("whole");
                        return v;
                    }
                    let to = v["version"].as_u64().unwrap_or(0);
                    let base = if g.one_in(4) {
                        g.u64()
                    } else {
                        to.saturating_sub(1)
                    };
                    let upserted: Vec<Value> = v["view"]["endpoints"]
                        .as_object()
                        .map(|m| m.values().cloned().collect())
                        .unwrap_or_default();
                    let removed: Vec<Value> =
                        (0..g.below(3)).map(|_| json!(g.instance_id())).collect();
                    json!({
                        "kind": "patch",
                        "base": base,
                        "version": to,
                        "delta": {
                            "key": v["view"]["key"],
                            "upserted": upserted,
                            "removed": removed,
                            "markers": v["view"]["markers"],
                        },
                    })
                })
                .collect();
            json!({"kind": "release", "releases": releases})
        }
        6 => {
            let mut instances = serde_json::Map::new();
            for _ in 0..g.below(4) {
                let class = |g: &mut Gen<'_>| {
                    if g.one_in(3) {
                        Value::Null
                    } else {
                        json!([g.permille(), g.u64()])
                    }
                };
                let classes = [class(g), class(g), class(g)];
                instances.insert(
                    g.instance_id(),
                    json!({
                        "classes": classes,
                        "hard": g.one_in(2),
                        "quarantine_level": g.u32(),
                        "quarantine_left_ms": if g.one_in(2) { Value::Null } else { json!(g.u64()) },
                    }),
                );
            }
            if g.one_in(2) {
                // A part of a snapshot: few snapshots and small counts, so parts of one
                // snapshot meet and complete it; sometimes a part outside its count.
                json!({
                    "kind": "observed_part",
                    "at_ms": g.below(3),
                    "part": g.below(5),
                    "parts": g.below(4),
                    "instances": instances,
                })
            } else {
                json!({"kind": "observed", "at_ms": g.stamp(), "instances": instances})
            }
        }
        _ => {
            let entries: Vec<Value> = (0..g.below(4))
                .map(|_| {
                    json!({
                        "seq": g.u64(),
                        "at_ms": g.stamp(),
                        "kind": g.pick(&["transition", "override", "denial", "policy", "existence", "alarm", "reconciliation"]),
                        "actor": g.text(),
                        "service": if g.one_in(2) { Value::Null } else { json!(g.valid_name()) },
                        "instance": if g.one_in(2) { Value::Null } else { json!(g.instance_id()) },
                        "outcome": g.text(),
                        "detail": {"reason": g.text()},
                    })
                })
                .collect();
            json!({"kind": "audit", "entries": entries})
        }
    }
}
