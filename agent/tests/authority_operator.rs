//! Raft operations an operator runs, against real in-process members: a backup saved,
//! the region wiped (a fresh one on a new data directory), the backup restored, and the
//! registry equal to the original; damaged or foreign backups refused with nothing
//! changed; leadership moved to a named member while a writer registers instances
//! without pause.
//!
//! "Without a failed write" means: the writer never sees a 5xx or any refusal (a write
//! that races the transfer is held by the old leader, then redirected to the new one,
//! which the client follows), and every acknowledged registration is on the new leader.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::call;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::member::Authority;
use waymark_agent::authority::raft::{backup, codec};
use waymark_agent::cli::operator as cli;
use waymark_testkit::until;

const WAIT: Duration = Duration::from_secs(60);

fn config(dir: &Path, id: u64) -> waymark_agent::authority::settings::AuthorityConfig {
    common::plain_member(dir, id, &["a", "b"])
}

fn registration(i: u32) -> Value {
    json!({
        "service": "pay",
        "locality": {"region": "eu", "zone": "a", "node": "n1"},
        "address": {"ip": format!("10.1.{}.{}", i / 250, i % 250 + 1), "port": 8080},
        "lease_ms": 0,
    })
}

/// What a restore must bring back: services with their contracts, policies, instances.
fn registry(a: &Authority) -> String {
    a.raft().with_state(|s, _| {
        let r = s.registry();
        let services: Vec<_> = r.services().collect();
        let policies: Vec<_> = r.policies().collect();
        // A restore restarts every lease's clock: the lease's end is not compared.
        let instances: Vec<_> = r
            .instances()
            .map(|i| (&i.instance, i.lease_ms, i.draining, &i.maintenance))
            .collect();
        format!("{services:?}\n{policies:?}\n{instances:?}")
    })
}

async fn put(api: &ApiClient, path: &str, body: Value) {
    let (status, answer) = call(api, Method::PUT, path, Some(body)).await;
    assert!(status.is_success(), "{path}: {status} {answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_saved_then_restored_into_a_wiped_region_gives_the_same_registry() {
    let dir = tempfile::tempdir().unwrap();
    let a = common::single_member(config(dir.path(), 1)).await;
    let api = common::operator(&a, "backup").await;
    let contract = json!({"probe": {"kind": "tcp", "interval": "5s"}});
    put(
        &api,
        "/v1/services/pay",
        json!({"owner": "payments", "contract": contract}),
    )
    .await;
    put(
        &api,
        "/v1/services/ledger",
        json!({"owner": "payments", "contract": {}}),
    )
    .await;
    put(
        &api,
        "/v1/services/pay/policy",
        json!({"min_healthy_override": 700, "failover_zones": ["b", "a"]}),
    )
    .await;
    for i in 0..5 {
        let (status, body) = call(&api, Method::POST, "/v1/instances", Some(registration(i))).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let original = registry(&a);
    let file = dir.path().join("eu.snap");
    let said = cli::save(&api, &file).await.unwrap();
    assert!(said.contains("sha256"), "{said}");
    let bytes = std::fs::read(&file).unwrap();
    a.shutdown().await;

    // The wipe: a new region on a new data directory.
    let b = common::single_member(config(&dir.path().join("wiped"), 1)).await;
    let ops = common::operator(&b, "restorer").await;
    let fresh = registry(&b);
    assert_ne!(fresh, original);

    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    let (_, state) = backup::verify(&bytes, "eu").unwrap();
    let foreign = backup::encode("us", Some(1), Some(1), &codec::encode(&state).unwrap());
    for (body, status, reason) in [
        (flipped, StatusCode::BAD_REQUEST, "checksum_mismatch"),
        (
            bytes[..bytes.len() / 2].to_vec(),
            StatusCode::BAD_REQUEST,
            "truncated",
        ),
        (foreign, StatusCode::UNPROCESSABLE_ENTITY, "wrong_region"),
        (b"{}".to_vec(), StatusCode::BAD_REQUEST, "not_a_snapshot"),
    ] {
        let r = ops
            .send_bytes(Method::PUT, "/v1/operator/snapshot", Some(body.into()))
            .await
            .unwrap();
        let answer: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        assert_eq!(
            (r.status, common::reason(&answer)),
            (status, reason),
            "{answer}"
        );
        assert_eq!(registry(&b), fresh, "a refused restore changed nothing");
    }
    let said = cli::restore(&ops, &file).await.unwrap();
    assert!(said.contains("restored"), "{said}");
    until("the restored registry", WAIT, async || {
        let now = registry(&b);
        if now == original { Ok(()) } else { Err(now) }
    })
    .await;
    common::wait_leader(&b).await;
    let audited = b.raft().with_state(|s, _| {
        s.audit()
            .iter()
            .any(|e| e.outcome == "restored" && e.actor.contains("restorer"))
    });
    assert!(audited, "the restore is audited with its actor");
    b.shutdown().await;
}

/// Three plain members in process, bootstrapped as one group.
async fn group(dir: &Path) -> Vec<Authority> {
    waymark_certs::install_crypto_provider();
    let mut members = Vec::new();
    for id in 1..=3 {
        members.push(Authority::start(config(dir, id)).await.unwrap());
    }
    let voters: BTreeMap<u64, _> = (1..=3).zip(members.iter().map(Authority::member)).collect();
    for m in &members {
        m.bootstrap(voters.clone()).await.unwrap();
    }
    members
}

async fn leader_of(members: &[Authority]) -> usize {
    until("a leader every member names", WAIT, async || {
        let named: BTreeSet<Option<u64>> = members
            .iter()
            .map(|m| m.raft().leader().map(|(id, _)| id))
            .collect();
        match named.into_iter().collect::<Vec<_>>()[..] {
            // Member `id` is `members[id - 1]`.
            [Some(id)] => Ok((id - 1) as usize),
            ref other => Err(format!("{other:?}")),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_leader_moves_leadership_while_every_write_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let members = group(dir.path()).await;
    let from = leader_of(&members).await;
    let leader = &members[from];
    let token = common::operator_token(leader, "mover").await;
    let api = leader.api_client(Some(token)).with_timeout(WAIT);
    put(
        &api,
        "/v1/services/pay",
        json!({"owner": "payments", "contract": {}}),
    )
    .await;

    let writer = common::writer::Writer::start(api.clone(), registration);
    writer.acked_at_least(10, WAIT).await;

    let (status, body) = call(
        &api,
        Method::POST,
        "/v1/operator/raft/transfer-leader",
        Some(json!({"to": 42})),
    )
    .await;
    assert_eq!(
        (status, common::reason(&body)),
        (StatusCode::NOT_FOUND, "unknown_member")
    );

    let to = (1..=3).find(|&id| id != from as u64 + 1).unwrap();
    let said = cli::transfer_leader(&api, Some(to)).await.unwrap();
    assert!(said.contains(&format!("to member {to}")), "{said}");
    let target = &members[(to - 1) as usize];
    assert!(target.raft().is_leader(), "the named member leads");

    let before = writer.acked();
    writer.acked_at_least(before + 10, WAIT).await;
    let w = writer.stop().await;
    assert!(w.failed.is_empty(), "writes failed: {:?}", w.failed);
    let missing: Vec<_> = target.raft().with_state(|s, _| {
        w.acked
            .iter()
            .filter(|id| {
                !s.registry()
                    .instances()
                    .any(|r| r.instance.id.to_string() == **id)
            })
            .cloned()
            .collect()
    });
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    let audited = target.raft().with_state(|s, _| {
        s.audit().iter().any(|e| {
            e.actor.contains("mover")
                && e.detail["operation"] == "transfer_leader"
                && e.outcome == "applied"
        })
    });
    assert!(audited, "the transfer is audited with its actor");
    for m in members {
        m.shutdown().await;
    }
}
