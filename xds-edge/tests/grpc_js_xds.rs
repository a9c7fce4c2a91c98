//! Our ADS server against a third independent xDS client: Node's `@grpc/grpc-js-xds` 1.14
//! with its `@grpc/grpc-js` (pinned by `tests/proxyless/node/package-lock.json`, installed
//! by `./scripts/install-test-peers`, found through `WAYMARK_NODE_XDS`) dialling
//! `xds:///pay` in front of the Python backends `grpc_proxyless.rs` uses. No Envoy.
//!
//! It was written for a crash. Our clusters used to leave every outlier-detection field but
//! the ejection cap unset; grpc-js-xds read the success-rate ones as `undefined`, and 10 s
//! in, the first outlier-detection sweep threw `TypeError: Reduce of empty array` from a
//! timer, ending the process (`waymark_xds::translate::outlier` says where). So after the
//! client has (a) balanced over the local tier, (b) followed a withdrawal and (c) failed
//! over to the next priority when the local tier emptied (and back), it (d) calls without a
//! break (about 200 a second) for at least 30 s and three sweeps, and must then still be
//! running and answering, with every resource we sent ACKed and none NACKed.
//!
//! `client.js` is `client.py`'s twin (same flags, same lines) and also prints `sweep N` each
//! time grpc-js's outlier-detection timer runs, read from grpc-js's own trace, so the test
//! knows the code that crashed really ran. Synchronisation is on process output and bounded
//! polls of the server's sync state; never fixed sleeps.

// Test helpers outside #[test] functions unwrap too: a panic is how a test reports.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::proxyless::{
    ALL_TYPES, Caller, ControlPlane, GrpcBackend, GrpcClient, Round, node_xds, python,
};
use support::views;
use waymark_core::view::{EndpointStatus, Markers, ReleasedView};

/// How long the client calls without a break, at the least (`WAYMARK_GRPC_JS_SOAK_S`
/// lengthens it for a longer run by hand, under `cargo test`: nextest stops the processes
/// group after five minutes; the test command keeps the default)...
const SOAK: Duration = Duration::from_secs(30);
/// ...and how many of its outlier-detection sweeps (10 s apart) must run meanwhile, at the
/// least (one per 10 s of a longer soak). The old crash came at the first.
const SOAK_SWEEPS: usize = 3;

/// The soak's length and sweeps: the defaults, or `WAYMARK_GRPC_JS_SOAK_S` seconds.
fn soak_plan() -> (Duration, usize) {
    match std::env::var("WAYMARK_GRPC_JS_SOAK_S")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        Some(secs) if secs > SOAK.as_secs() => (
            Duration::from_secs(secs),
            usize::try_from(secs / 10).unwrap_or(SOAK_SWEEPS),
        ),
        _ => (SOAK, SOAK_SWEEPS),
    }
}
/// Rounds of [`STEP_CALLS`] a client may take to converge on an update it has ACKed (grpc
/// applies an update to the channel after ACKing it).
const CONVERGE_ROUNDS: usize = 20;
const STEP_CALLS: usize = 5;
/// Calls in a round that must reach only the expected backends.
const CHECK_CALLS: usize = 20;

/// The view of `pay` for callers in `zone-a`: `local` in zone-a at priority 0 (eligible, or
/// as given), then `remote` in zone-b at the next priority. As the assembler publishes
/// them, priorities are dense: with no local endpoint left, zone-b is priority 0.
fn released(
    version: u64,
    local: &[(&GrpcBackend, EndpointStatus)],
    remote: &[&GrpcBackend],
) -> ReleasedView {
    let remote_priority = u32::from(!local.is_empty());
    let local = local
        .iter()
        .map(|(b, status)| views::endpoint(&b.name, b.addr, "zone-a", 0, 100, *status));
    let remote = remote.iter().map(|b| {
        views::endpoint(
            &b.name,
            b.addr,
            "zone-b",
            remote_priority,
            100,
            EndpointStatus::Eligible,
        )
    });
    views::released(version, "zone-a", local.chain(remote), Markers::default())
}

/// Calls until a round reaches only `only` (at most [`CONVERGE_ROUNDS`]), then one more
/// round of [`CHECK_CALLS`] that must reach every one of `only` and nothing else. No call
/// may fail on the way.
async fn converge(client: &mut GrpcClient, cp: &ControlPlane, only: &[&str], what: &str) -> Round {
    let only: BTreeSet<&str> = only.iter().copied().collect();
    let within = |round: &Round| round.answers.keys().all(|k| only.contains(k.as_str()));
    let mut converged = false;
    for _ in 0..CONVERGE_ROUNDS {
        let round = client.calls(cp, STEP_CALLS).await;
        client.assert_no_errors(&round, cp);
        if within(&round) {
            converged = true;
            break;
        }
    }
    assert!(
        converged,
        "{what}: calls still reach others than {only:?} after {} calls",
        CONVERGE_ROUNDS * STEP_CALLS
    );
    let round = client.calls(cp, CHECK_CALLS).await;
    client.assert_no_errors(&round, cp);
    let reached: BTreeSet<&str> = round.answers.keys().map(String::as_str).collect();
    assert_eq!(
        reached, only,
        "{what}: {CHECK_CALLS} calls reach exactly these"
    );
    round
}

#[tokio::test]
async fn grpc_js_xds_balances_follows_withdrawal_fails_over_and_outlives_outlier_sweeps() {
    let node = node_xds().await;
    let python = python().await;
    let a = GrpcBackend::start(&python, "pay-a").await;
    let b = GrpcBackend::start(&python, "pay-b").await;
    let c = GrpcBackend::start(&python, "pay-c").await;
    let eligible = EndpointStatus::Eligible;
    let mut cp = ControlPlane::start().await;
    cp.publish(released(1, &[(&a, eligible), (&b, eligible)], &[&c]));

    // (a) LDS → RDS → CDS → EDS, then round robin over the local tier; zone-b's pay-c is
    // failover only.
    let id = "grpc-js-xds-live";
    let mut client = GrpcClient::start(&Caller::grpc_js_xds(&node), &cp, id, 20, true).await;
    let first = client.read_round(&cp).await;
    client.assert_no_errors(&first, &cp);
    assert!(
        first.answers.get("pay-a").is_some_and(|n| *n >= 5)
            && first.answers.get("pay-b").is_some_and(|n| *n >= 5)
            && !first.answers.contains_key("pay-c"),
        "20 calls should be spread over pay-a and pay-b, none to pay-c: {:?}",
        first.answers
    );
    cp.wait_synced(id, 1, &client).await;

    // (b) pay-b withdrawn (it keeps running, so only the withdrawal can stop its traffic).
    cp.publish(released(2, &[(&a, eligible)], &[&c]));
    cp.wait_synced(id, 2, &client).await;
    converge(&mut client, &cp, &["pay-a"], "after pay-b's withdrawal").await;

    // (c) The local tier empties. A draining instance stays in the view at its priority
    // until it leaves, so first priority 0 holds only a DRAINING pay-a, which grpc does not
    // route to: it must fail over to priority 1. Then pay-a leaves and the assembler's
    // dense priorities make zone-b priority 0.
    let draining = EndpointStatus::Draining;
    cp.publish(released(3, &[(&a, draining)], &[&c]));
    cp.wait_synced(id, 3, &client).await;
    converge(&mut client, &cp, &["pay-c"], "with the local tier draining").await;
    cp.publish(released(4, &[], &[&c]));
    cp.wait_synced(id, 4, &client).await;
    converge(&mut client, &cp, &["pay-c"], "with the local tier gone").await;
    // And back, when the local tier returns.
    cp.publish(released(5, &[(&a, eligible), (&b, eligible)], &[&c]));
    cp.wait_synced(id, 5, &client).await;
    converge(
        &mut client,
        &cp,
        &["pay-a", "pay-b"],
        "with the local tier back",
    )
    .await;

    // (d) Calls without a break across outlier-detection sweeps: each sweep runs the
    // success-rate check that crashed grpc-js on our old clusters.
    let (soak_for, soak_sweeps) = soak_plan();
    let started = tokio::time::Instant::now();
    let soak = client.soak(&cp, soak_for, soak_sweeps).await;
    let took = started.elapsed();
    client.assert_no_errors(&soak, &cp);
    let Some((called, sweeps)) = soak.soaked else {
        client
            .peer
            .fail("its soak reported no `soaked` line", Some(&cp))
    };
    assert!(
        called >= soak_for && took >= soak_for && sweeps >= soak_sweeps,
        "the soak called for {called:?} ({took:?} here) over {sweeps} sweeps; wanted at \
         least {soak_for:?} and {soak_sweeps}"
    );
    let reached: BTreeSet<&str> = soak.answers.keys().map(String::as_str).collect();
    assert_eq!(
        reached,
        BTreeSet::from(["pay-a", "pay-b"]),
        "{} soak calls reach the local tier only: {:?}",
        soak.answered(),
        soak.answers
    );

    // Still running, still answering, and everything we sent it was accepted.
    client.peer.assert_running(Some(&cp));
    let after = client.calls(&cp, 10).await;
    client.assert_no_errors(&after, &cp);
    assert_eq!(after.answered(), 10, "{:?}", after.answers);
    cp.wait_synced(id, 5, &client).await;
    let sync = cp.client(id).unwrap();
    for t in ALL_TYPES {
        let s = sync
            .types
            .get(t)
            .unwrap_or_else(|| panic!("{id} never subscribed to {t}: {sync:#?}"));
        assert_eq!(s.nacks, 0, "{sync:#?}");
        assert_eq!(s.resources, 1, "one {t} for pay: {sync:#?}");
    }
    assert_eq!(cp.nacks(), 0, "no NACKs");
    client.peer.send("quit").await;
    assert_eq!(client.peer.finish(Some(&cp)).await, 0, "client exit code");
}
