//! `waymark dev` as a newcomer uses it: the whole region starts in one process, every
//! demo instance becomes eligible from real probes and self-reports, a real Envoy started
//! with `deploy/envoy/dev.yaml` (as the README says) routes a request to a demo backend, and
//! switching demo backends over the control API produces the verdicts the README promises.
//!
//! The agent's xDS listener is on the bootstrap's port (18000) and Envoy's listener and
//! admin on 10000 and 9901, so this test runs alone (nextest group `processes`).
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support;

use std::process::{Command, Stdio};

use common::dev::WAIT;
use http::Method;
use serde_json::{Value, json};
use waymark_agent::api_client::ApiClient;
use waymark_agent::dev::{DevArgs, DevRegion};
use waymark_testkit::until;

async fn verdicts(api: &ApiClient, service: &str) -> Value {
    let list = api.get_json("/v1/services").await.unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .find(|s| s["service"] == service)
        .map(|s| s["verdicts"].clone())
        .unwrap_or(Value::Null)
}

async fn explain(api: &ApiClient, instance: &str) -> Value {
    api.get_json(&format!("/v1/instances/{instance}/explain"))
        .await
        .unwrap()
}

async fn set_mode(control: &ApiClient, backend: &str, mode: &str) {
    let r = control
        .send(
            Method::PUT,
            &format!("/v1/dev/backends/{backend}/mode"),
            Some(&json!({ "mode": mode })),
        )
        .await
        .unwrap();
    assert!(r.status.is_success(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dev_region_shows_every_verdict() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let any = "127.0.0.1:0".parse().unwrap();
    let dev = DevRegion::start(DevArgs {
        dir: dir.path().to_path_buf(),
        api: any,
        // The port deploy/envoy/dev.yaml dials.
        xds: "127.0.0.1:18000".parse().unwrap(),
        dns: any,
        agent_api: any,
        backends_api: any,
    })
    .await
    .unwrap();
    let api = dev.api_client();
    let control = ApiClient::new(&dev.backends_api().to_string(), None);
    let agent = ApiClient::new(&dev.agent().bound().http.to_string(), None);
    let guide = dev.guide();
    for listener in [
        dev.authority().http_addr().to_string(),
        dev.agent().bound().xds.to_string(),
        dev.backends_api().to_string(),
    ] {
        assert!(
            guide.contains(&listener),
            "the guide names {listener}:\n{guide}"
        );
    }

    // Every instance becomes eligible from evidence alone (probes, self-reports).
    for (service, n) in [("web", 6), ("checkout", 3), ("inventory", 3)] {
        until(&format!("{service}: {n} eligible"), WAIT, async || {
            (verdicts(&api, service).await["eligible"] == n).then_some(())
        })
        .await;
    }
    // The README's sidecar: a real Envoy from deploy/envoy/dev.yaml routes to a web backend.
    let bootstrap =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/envoy/dev.yaml");
    let mut envoy = Command::new(support::envoy_bin())
        .args(["-c"])
        .arg(&bootstrap)
        .args([
            "--disable-hot-restart",
            "--concurrency",
            "1",
            "-l",
            "warning",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("envoy.log")).unwrap())
        .spawn()
        .unwrap();
    let listener = "127.0.0.1:10000".parse().unwrap();
    let body = until(
        "Envoy routes to a demo backend",
        WAIT,
        async || match support::http::get(listener, "/").await {
            Ok(r) if r.status == 200 => Some(r.body),
            _ => None,
        },
    )
    .await;
    let _ = envoy.kill();
    let _ = envoy.wait();
    assert!(body.contains("\"service\":\"web\""), "{body}");

    // The node agent serves it, and is in the gossip pool with the authority.
    let view = agent.get_json("/v1/view").await.unwrap();
    assert_eq!(view["upstream_connected"], true, "{view}");
    let members = agent.get_json("/v1/members").await.unwrap();
    assert_eq!(members["members"].as_array().unwrap().len(), 2, "{members}");

    let ids = dev.instances();
    // A hard failure withdraws the instance.
    set_mode(&control, "web-az1-1", "fail-hard").await;
    let id = ids["web-az1-1"].to_string();
    until("web-az1-1 ineligible (hard failure)", WAIT, async || {
        let e = explain(&api, &id).await;
        (e["verdict"] == "ineligible").then_some(())
    })
    .await;
    // A degraded shared dependency lowers weight, it does not withdraw.
    set_mode(&control, "checkout-az2-1", "degraded-dependency").await;
    let id = ids["checkout-az2-1"].to_string();
    until("checkout-az2-1 degraded", WAIT, async || {
        let e = explain(&api, &id).await;
        (e["verdict"] == "degraded").then_some(())
    })
    .await;
    // Back to healthy: it returns.
    set_mode(&control, "web-az1-1", "healthy").await;
    let id = ids["web-az1-1"].to_string();
    until("web-az1-1 eligible again", WAIT, async || {
        let e = explain(&api, &id).await;
        (e["verdict"] == "eligible").then_some(())
    })
    .await;
    // An unknown backend is refused by name.
    let r = control
        .send(
            Method::PUT,
            "/v1/dev/backends/nope/mode",
            Some(&json!({"mode": "slow"})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, http::StatusCode::NOT_FOUND);

    dev.stop().await;
}
