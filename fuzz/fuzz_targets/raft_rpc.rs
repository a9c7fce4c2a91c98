//! Raft RPC bodies and snapshots as a member decodes them: the bodies of
//! `POST /raft/append`, `/raft/vote` and `/raft/snapshot` (openraft's request types over
//! the authority's `TypeConfig`), the responses a member's client decodes from its peers,
//! a snapshot's data (`AuthorityState`), and the snapshot file a member reads at start —
//! then what a member does with them: apply the entries' requests, and serve from and keep
//! applying to an installed snapshot.
//!
//! Input: byte 0 picks the body; the rest is the body as the codec reads it — binary after
//! its mark, JSON otherwise (`0` append, `1` vote, `2` install snapshot, `3` the peer
//! responses, `5` a whole snapshot file, otherwise raw snapshot data). Checked: nothing panics; a decoded body re-encodes and decodes to itself; a
//! decoded snapshot file decodes the same once re-encoded; a decoded snapshot survives
//! applying.
#![no_main]

use libfuzzer_sys::fuzz_target;
use openraft::EntryPayload;
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use waymark_agent::authority::raft::{self, TypeConfig, codec};
use waymark_fuzz::{Limits, capped};
use waymark_registry::machine::{AuthorityState, Request};
use waymark_registry::state::{Command, Stamped};

type NodeId = u64;

fuzz_target!(|data: &[u8]| {
    let data = capped(data);
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    match mode {
        0 => {
            let Some(rpc) = round_trip::<AppendEntriesRequest<TypeConfig>>(body) else {
                return;
            };
            // What a follower's state machine does with the entries once committed.
            let mut state = AuthorityState::default();
            for entry in rpc.entries.into_iter().take(Limits::STEPS_MAX) {
                if let EntryPayload::Normal(request) = entry.payload {
                    let _ = state.apply(request);
                }
            }
            codec::encode(&state).expect("the authority state serializes");
        }
        1 => {
            let _ = round_trip::<VoteRequest<NodeId>>(body);
        }
        2 => {
            let Some(rpc) = round_trip::<InstallSnapshotRequest<TypeConfig>>(body) else {
                return;
            };
            install(&rpc.data);
        }
        3 => {
            let _ = round_trip::<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>>(body);
            let _ = round_trip::<Result<VoteResponse<NodeId>, RaftError<NodeId>>>(body);
            let _ = round_trip::<
                Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
            >(body);
        }
        5 => snapshot_file(body),
        _ => install(body),
    }
});

/// A snapshot file as a member reads it at start: refused, or decoded into metadata and
/// data that encode back to exactly the file (nothing read that was not checked).
fn snapshot_file(body: &[u8]) {
    let Ok((meta, data)) = raft::snapshot_file::decode(body.to_vec()) else {
        return;
    };
    let mut again = raft::snapshot_file::encode_head(&meta, &data).expect("metadata encodes");
    again.extend_from_slice(&data);
    // The metadata's JSON may be spelled differently (spacing, key order); what is stable is
    // that the re-encoded file decodes to the same snapshot.
    let (meta2, data2) = raft::snapshot_file::decode(again).expect("an encoded file decodes");
    assert_eq!(
        (meta2, &data2),
        (meta, &data),
        "a snapshot file survives its encoding"
    );
    install(&data);
}

/// Decode, and if that works, check the value survives its own encoding.
fn round_trip<T: Serialize + DeserializeOwned>(body: &[u8]) -> Option<T> {
    let value: T = codec::decode(body).ok()?;
    let encoded = codec::encode(&value).expect("a decoded body encodes");
    let again: T = codec::decode(&encoded).expect("an encoded body decodes");
    let reencoded = codec::encode(&again).expect("and encodes again");
    assert_eq!(encoded, reencoded, "a body's encoding is stable");
    Some(value)
}

/// What a member does with snapshot data: decode it as the store's `install_snapshot`
/// does, serve from it, and keep applying the log on top.
fn install(data: &[u8]) {
    let Ok(mut state) = codec::decode::<AuthorityState>(data) else {
        return;
    };
    let registry = state.registry();
    let _ = (registry.services().count(), registry.instances().count());
    let _ = (
        registry.next_expiry_ms(),
        registry.clock_ms(),
        state.max_version(),
    );
    let at_ms = state.registry().clock_ms().saturating_add(1_000);
    let services: Vec<_> = state
        .registry()
        .services()
        .map(|(s, _)| s.clone())
        .collect();
    let instances: Vec<_> = state
        .registry()
        .instances()
        .map(|r| r.instance.id.clone())
        .collect();
    let mut commands = vec![
        Command::ExpireLeases,
        Command::RestartLeases,
        Command::ExpireInstances {
            instances: instances.iter().take(4).cloned().collect(),
        },
    ];
    for instance in instances.into_iter().take(8) {
        commands.push(Command::Renew {
            instance: instance.clone(),
        });
        commands.push(Command::Deregister { instance });
    }
    for service in services.into_iter().take(8) {
        commands.push(Command::RemoveService { service });
    }
    for command in commands {
        let _ = state.apply(Request::Registry(Stamped { at_ms, command }));
    }
    let bytes = codec::encode(&state).expect("the authority state serializes");
    let _: AuthorityState = codec::decode(&bytes).expect("its snapshot decodes");
}
