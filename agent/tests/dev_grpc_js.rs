//! A third independent xDS client against a whole dev region: Node's `@grpc/grpc-js-xds`
//! (pinned by `./scripts/install-test-peers`) resolving `xds:///pay` through the dev
//! region's node agent, the way a proxyless workload on that host would. The service's
//! instances are real gRPC servers (the Python test backends) registered through the API;
//! the dev region's agent probes them (TCP), the authority evaluates and assembles their
//! views, and the agent serves them with its client-side bounds — every part real.
//!
//! The client must balance over the caller zone's instances, follow a withdrawal, fail
//! over to the next zone's priority when its own zone empties, and keep calling across
//! grpc-js's outlier-detection sweeps (the check that crashed grpc-js on clusters that left
//! fields unset) without an error or a crash. `WAYMARK_GRPC_JS_SOAK_S` lengthens the soak
//! for a run of minutes by hand — under `cargo test`, as nextest stops the processes group
//! after five minutes.
//!
//! Waits are bounded polls of the client's answers (the agent's shrink cap may hold a
//! withdrawal back for a window), never fixed sleeps.

use crate::common::{self, call};
use crate::support::proxyless::{Caller, GrpcBackend, GrpcClient, Round, node_xds, python};

use std::collections::BTreeSet;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::json;
use waymark_testkit::until;

/// How long a change may take to reach the client: evaluation, publication, the agent's
/// shrink-cap window (10 s) when it holds a withdrawal back, and grpc's own update.
const CONVERGE: Duration = Duration::from_secs(60);
/// The soak: at least this long and this many outlier-detection sweeps (10 s apart).
const SOAK: Duration = Duration::from_secs(30);
const SOAK_SWEEPS: usize = 3;

/// Calls in rounds of 5 until a round reaches only `only`, then a round of 20 that must
/// reach exactly `only`. No call may fail on the way.
async fn converge(client: &mut GrpcClient, only: &[&str], what: &str) -> Round {
    let only: BTreeSet<&str> = only.iter().copied().collect();
    let reaching = format!("{what}: calls to reach only {only:?}");
    until(&reaching, CONVERGE, async || {
        let round = client.calls(None, 5).await;
        client.assert_no_errors(&round, None);
        if round.answers.keys().all(|k| only.contains(k.as_str())) {
            Ok(())
        } else {
            Err(format!("calls reach {:?}", round.answers))
        }
    })
    .await;
    let round = client.calls(None, 20).await;
    client.assert_no_errors(&round, None);
    let reached: BTreeSet<&str> = round.answers.keys().map(String::as_str).collect();
    assert_eq!(reached, only, "{what}: 20 calls reach exactly these");
    round
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_js_xds_follows_a_dev_region_through_its_node_agent() {
    waymark_certs::install_crypto_provider();
    let node = node_xds().await;
    let python = python().await;
    let dir = tempfile::tempdir().unwrap();
    let dev = common::dev::start(dir.path()).await;
    let api = dev.api_client();
    let contract = json!({
        "profile": {"probe": true, "self_report": false, "passive": false},
        "probe": {"kind": "tcp", "interval": "1s", "timeout": "500ms"},
        "slow_start": "0s",
    });
    let (status, body) = call(
        &api,
        Method::PUT,
        "/v1/services/pay",
        Some(json!({"owner": "payments", "contract": contract})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // pay-a and pay-b in az1, the agent's (and so the client's) zone; pay-c in az2.
    let mut backends = Vec::new();
    let mut ids = Vec::new();
    for (name, zone) in [("pay-a", "az1"), ("pay-b", "az1"), ("pay-c", "az2")] {
        let b = GrpcBackend::start(&python, name).await;
        let reg = json!({
            "service": "pay",
            "locality": {"region": "dev", "zone": zone, "node": "dev-node"},
            "address": {"ip": b.addr.ip().to_string(), "port": b.addr.port()},
            "lease_ms": 600_000,
        });
        let (status, body) = call(&api, Method::POST, "/v1/instances", Some(reg)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.push(body["instance"].as_str().unwrap().to_owned());
        backends.push(b);
    }
    let withdraw = async |id: &str| {
        let (status, body) = call(&api, Method::DELETE, &format!("/v1/instances/{id}"), None).await;
        assert!(status.is_success(), "{body}");
    };

    // (a) Round robin over az1's two; az2's pay-c is failover only.
    let ads = dev.agent().bound().xds.port();
    let caller = Caller::grpc_js_xds(&node);
    let mut client = GrpcClient::start_at(&caller, ads, None, "grpc-js-dev", 0, true).await;
    converge(&mut client, &["pay-a", "pay-b"], "both local instances").await;

    // (b) pay-b withdrawn (it keeps serving: only the withdrawal can stop its traffic).
    withdraw(&ids[1]).await;
    converge(&mut client, &["pay-a"], "after pay-b's withdrawal").await;

    // (c) az1 empties: the client fails over to az2's priority.
    withdraw(&ids[0]).await;
    converge(&mut client, &["pay-c"], "after az1 emptied").await;

    // (d) Calls without a break across outlier-detection sweeps.
    let soak_for = std::env::var("WAYMARK_GRPC_JS_SOAK_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(SOAK, Duration::from_secs)
        .max(SOAK);
    let sweeps = usize::try_from(soak_for.as_secs() / 10)
        .unwrap_or(SOAK_SWEEPS)
        .max(SOAK_SWEEPS);
    let soak = client.soak(None, soak_for, sweeps).await;
    client.assert_no_errors(&soak, None);
    let (called, swept) = soak.soaked.expect("the soak reports how long it called");
    assert!(
        called >= soak_for && swept >= sweeps,
        "the soak called for {called:?} over {swept} sweeps; wanted {soak_for:?} and {sweeps}"
    );
    assert_eq!(
        soak.answers.keys().map(String::as_str).collect::<Vec<_>>(),
        ["pay-c"],
        "{:?}",
        soak.answers
    );
    client.peer.assert_running(None);
    assert_eq!(
        client.peer.finish(None).await,
        0,
        "the client exits cleanly"
    );
    drop(backends);
    dev.stop().await;
}
