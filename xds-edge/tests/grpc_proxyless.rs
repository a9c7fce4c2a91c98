//! Our ADS server against a second, independent xDS client: Python `grpcio` (pinned by
//! `./scripts/install-test-peers`) dialling `xds:///pay`, with no Envoy in between.
//!
//! grpcio's xDS resolver needs more than CDS and EDS: it starts from the Listener named
//! after the target (LDS), follows its connection manager to a RouteConfiguration (RDS),
//! and only then asks for the Cluster and its ClusterLoadAssignment. This test proves that
//! the minimal listener and route we serve for that case are enough, and that the client
//! accepts (ACKs) every resource we send it.
//!
//! Peers (in `tests/proxyless/`): `backend.py` is a gRPC server that answers
//! `/waymark.test.Echo/Who` with its own name; `client.py` writes a gRPC xDS bootstrap
//! naming our server and calls that method through `xds:///pay`, one output line per
//! answer. The test judges from their output and from our server's `sync_state()`.
//!
//! Synchronisation is on process output and exit, plus bounded polls of the server's sync
//! state where the client's ACK is the only signal; never fixed sleeps. The peers and the
//! server harness are in `support/proxyless.rs`.

// Test helpers outside #[test] functions unwrap too: a panic is how a test reports.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::collections::BTreeMap;

use support::proxyless::{ALL_TYPES, Caller, ControlPlane, GrpcBackend, GrpcClient, python};
use support::views;
use waymark_core::view::{EndpointStatus, Markers, ReleasedView};

/// The view of `pay` for callers in `zone-a`: `backends`, all eligible, in that zone.
fn released(version: u64, backends: &[&GrpcBackend]) -> ReleasedView {
    let endpoints = backends
        .iter()
        .map(|b| views::endpoint(&b.name, b.addr, "zone-a", 0, 100, EndpointStatus::Eligible));
    views::released(version, "zone-a", endpoints, Markers::default())
}

#[tokio::test]
async fn grpcio_resolves_xds_target_balances_and_follows_a_withdrawal() {
    let python = python().await;
    let grpcio = Caller::grpcio(&python);
    let a = GrpcBackend::start(&python, "pay-a").await;
    let b = GrpcBackend::start(&python, "pay-b").await;
    let mut cp = ControlPlane::start().await;
    cp.publish(released(1, &[&a, &b]));

    // One long-lived client: LDS → RDS → CDS → EDS, then round robin over both backends.
    let node = "grpc-proxyless-live";
    let mut client = GrpcClient::start(&grpcio, &cp, node, 20, true).await;
    let first = client.read_round(&cp).await;
    client.assert_no_errors(&first, &cp);
    assert!(
        first.answers.get("pay-a").is_some_and(|n| *n >= 5)
            && first.answers.get("pay-b").is_some_and(|n| *n >= 5),
        "20 calls should be spread over both backends (round robin): {:?}",
        first.answers
    );

    // It subscribed to all four types over ADS and acknowledged each; nothing was rejected.
    cp.wait_synced(node, 1, &client).await;
    let sync = cp.client(node).unwrap();
    let types: Vec<&str> = sync.types.keys().map(String::as_str).collect();
    for t in ALL_TYPES {
        assert!(
            types.contains(&t),
            "{node} never subscribed to {t}: {sync:#?}"
        );
        assert_eq!(sync.types[t].nacks, 0, "{sync:#?}");
        assert_eq!(sync.types[t].resources, 1, "one {t} for pay: {sync:#?}");
    }

    // Withdraw pay-b (it keeps running, so only the withdrawal can stop its traffic). Once
    // the client has ACKed the new assignment, its balancer converges within a few calls
    // (grpc applies an update to the channel after ACKing it), then never reaches pay-b.
    cp.publish(released(2, &[&a]));
    cp.wait_synced(node, 2, &client).await;
    let mut converged = false;
    for _ in 0..20 {
        let round = client.calls(&cp, 5).await;
        client.assert_no_errors(&round, &cp);
        if !round.answers.contains_key("pay-b") {
            converged = true;
            break;
        }
    }
    assert!(converged, "calls still reach the withdrawn pay-b after 100");
    let after = client.calls(&cp, 20).await;
    client.assert_no_errors(&after, &cp);
    assert_eq!(
        after.answers,
        BTreeMap::from([("pay-a".to_owned(), 20)]),
        "after the withdrawal only pay-a answers"
    );

    // A client that connects only now sees only the current view.
    let mut fresh = GrpcClient::start(&grpcio, &cp, "grpc-proxyless-fresh", 10, false).await;
    let round = fresh.read_round(&cp).await;
    fresh.assert_no_errors(&round, &cp);
    assert_eq!(
        round.answers,
        BTreeMap::from([("pay-a".to_owned(), 10)]),
        "a new client only reaches pay-a"
    );
    assert_eq!(
        fresh.peer.finish(Some(&cp)).await,
        0,
        "fresh client exit code"
    );

    client.peer.send("quit").await;
    assert_eq!(
        client.peer.finish(Some(&cp)).await,
        0,
        "live client exit code"
    );
    assert_eq!(cp.nacks(), 0, "no NACKs from either client");
}
