//! Federation: the link's frame codec (length-prefixed JSON, as the QUIC reader loop reads
//! it), the anti-entropy `Session`, and the CRDT merge of `RegionAggregates`.
//!
//! Input: raw link bytes (a sequence of frames; the first byte `0xff` selects this), or
//! bytes for the structured decoder, whose messages are encoded by the link's own writer
//! first. Each decoded message goes to a session holding this region's aggregates; what the
//! session sends back is encoded and decoded again and must round-trip. Checked too:
//! merging two replicas is commutative and idempotent whenever both orders are accepted.
//!
//! A session accepts from its peer only entries about the peer's own region and refuses a
//! batch naming any other, so generated batches mostly name only the peer's region (the
//! merge path) and sometimes mix in others (the refusal path); digests mostly name ours.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use waymark_core::model::RegionName;
use waymark_federation::aggregate::RegionAggregates;
use waymark_federation::session::{Message, Session, SessionConfig};
use waymark_federation_quic::fuzzing::{encode, read_frame};
use waymark_fuzz::{Gen, Limits, capped};

/// The frame limit the targets use (small, so the refusal path is reached too).
const FRAME_BYTES_MAX: u32 = 256 * 1024;
/// This side of the session.
const LOCAL: &str = "eu";
/// The session's peer: the only region whose entries it merges.
const PEER: &str = "us";
/// Regions a batch or digest may name when it strays from the usual one.
const REGIONS: &[&str] = &["eu", "us", "ap"];
/// One batch in this many names any region; the rest name only the peer's.
const MIXED_BATCH_ONE_IN: u8 = 4;

fuzz_target!(|data: &[u8]| run(capped(data)));

fn run(data: &[u8]) {
    let messages = if data.first() == Some(&0xff) {
        frames(&data[1..])
    } else {
        generated(data)
    };
    let local = region(LOCAL);
    let peer = region(PEER);
    let mut session = Session::new(SessionConfig::default(), local.clone(), peer.clone());
    let mut ours = RegionAggregates::new();
    let mut theirs = RegionAggregates::new();
    let mut now = Instant::now();
    session.handle_connected(now, &ours);
    for message in messages {
        now += Duration::from_millis(500);
        if let Message::Entries { entries } = &message {
            // The peer's replica, built from everything it sent.
            for e in entries {
                let _ = theirs.publish_local(e.clone());
            }
        }
        let _ = session.handle_message(now, message, &mut ours);
        session.handle_timeout(now, &ours);
        for _ in 0..64 {
            let Some(out) = session.poll_transmit() else {
                break;
            };
            round_trip(out);
        }
        let _ = session.take_records();
        let _ = ours.remote_endpoints(&peer, &"web".parse().expect("a valid service"));
    }
    check_merge(&ours, &theirs);
}

/// Every frame the link reader would accept from `bytes`, in order, until it stops.
fn frames(mut bytes: &[u8]) -> Vec<Message> {
    let mut out = Vec::new();
    while !bytes.is_empty() && out.len() < Limits::STEPS_MAX {
        match block_on(read_frame(&mut bytes, FRAME_BYTES_MAX)) {
            Ok(m) => out.push(m),
            Err(_) => break,
        }
    }
    out
}

fn generated(data: &[u8]) -> Vec<Message> {
    let mut g = Gen::new(data);
    let mut out = Vec::new();
    while !g.is_empty() && out.len() < Limits::STEPS_MAX {
        let Some(message) = waymark_fuzz::decode::<Message>(message(&mut g)) else {
            continue;
        };
        // Through the link's writer and reader, as a peer would send it.
        for frame in encode(message, FRAME_BYTES_MAX) {
            if let Ok(bytes) = frame {
                let back = block_on(read_frame(&mut bytes.as_slice(), FRAME_BYTES_MAX))
                    .expect("a frame the writer made reads back");
                out.push(back);
            }
        }
    }
    out
}

/// What the session sends must survive the wire unchanged (split into frames or not).
fn round_trip(message: Message) {
    let mut entries = Vec::new();
    let mut digest = None;
    for frame in encode(message.clone(), FRAME_BYTES_MAX) {
        let Ok(bytes) = frame else {
            return; // refused as too large: not sent, nothing to compare
        };
        match block_on(read_frame(&mut bytes.as_slice(), FRAME_BYTES_MAX))
            .expect("a frame the writer made reads back")
        {
            Message::Entries { entries: e } => entries.extend(e),
            d @ Message::Digest { .. } => digest = Some(d),
        }
    }
    match message {
        Message::Entries { entries: sent } => assert_eq!(sent, entries),
        d @ Message::Digest { .. } => assert_eq!(Some(d), digest),
    }
}

fn check_merge(a: &RegionAggregates, b: &RegionAggregates) {
    let mut ab = a.clone();
    let mut ba = b.clone();
    if ab.merge(b).is_ok() && ba.merge(a).is_ok() {
        assert_eq!(ab, ba, "merge is commutative");
        let once = ab.clone();
        ab.merge(&once)
            .expect("merging a replica with itself is accepted");
        assert_eq!(ab, once, "merge is idempotent");
    }
}

fn message(g: &mut Gen<'_>) -> Value {
    // A digest is answered with what we hold of our own region, so it mostly names ours.
    if g.one_in(3) {
        let mixed = g.one_in(MIXED_BATCH_ONE_IN);
        let versions: Vec<Value> = (0..g.below(6))
            .map(|_| json!([[region_name(g, mixed, LOCAL), g.valid_name()], g.u64()]))
            .collect();
        return json!({"kind": "digest", "versions": versions});
    }
    let mixed = g.one_in(MIXED_BATCH_ONE_IN);
    let entries: Vec<Value> = (0..g.below(6)).map(|_| entry(g, mixed)).collect();
    json!({"kind": "entries", "entries": entries})
}

fn entry(g: &mut Gen<'_>, mixed: bool) -> Value {
    let n = [0, 1, 2, 5, 200][g.below(5)];
    let endpoints: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "instance": if g.one_in(4) { g.name() } else { format!("i-{i}") },
                "address": g.address(),
                "zone": g.pick(&["eu-west-1a", "us-east-1a"]),
                "weight": g.u32(),
                "status": g.pick(&["eligible", "degraded", "unknown", "disregarded", "draining"]),
                "verdict": g.pick(&["eligible", "degraded", "unknown", "ineligible", "quarantined", "draining"]),
            })
        })
        .collect();
    json!({
        "region": region_name(g, mixed, PEER),
        "service": g.valid_name(),
        "version": g.u64(),
        "aggregate": {"endpoints": endpoints},
    })
}

/// `usual`, or in a mixed message any of [`REGIONS`].
fn region_name(g: &mut Gen<'_>, mixed: bool, usual: &str) -> String {
    if mixed { g.pick(REGIONS) } else { usual }.to_owned()
}

fn region(name: &str) -> RegionName {
    RegionName::try_new(name).expect("a valid region")
}

/// Runs a future that never waits (reads from a slice) to completion.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}
