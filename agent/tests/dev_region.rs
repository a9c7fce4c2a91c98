//! `waymark dev` as a newcomer uses it: the whole region starts in one process, every
//! demo instance becomes eligible from real probes and self-reports, a real Envoy started
//! with `deploy/envoy/dev.yaml` (as docs/dev.md says) routes a request to a demo backend, and
//! switching demo backends over the control API produces the verdicts docs/dev.md promises.
//!
//! The agent's xDS listener is on the bootstrap's port (18000) and Envoy's listener and
//! admin on 10000 and 9901, so this test runs alone (nextest group `processes`).
//!
//! `waymark proxy-status` and `proxy-config` against the dev region, as an operator runs
//! them: a real Envoy behind the dev node agent is listed under that agent, and what it
//! holds is what its admin API says it holds.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use common::dev::{WAIT, operator_command, set_mode};
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
    // The dev guide's sidecar: a real Envoy from deploy/envoy/dev.yaml routes to a web backend.
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

/// `waymark <args>` against the dev region: stdout, or a panic with stderr.
fn waymark(dev: &DevRegion, args: &[&str]) -> String {
    let out = operator_command(dev, args);
    assert!(
        out.status.success(),
        "waymark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The client's entry in `proxy-status -o json`, if its node reports it.
fn sidecar(status: &Value, client: &str) -> Option<Value> {
    status["sidecars"]["nodes"]
        .as_array()?
        .iter()
        .flat_map(|n| n["sidecars"].as_array().into_iter().flatten())
        .find(|c| c["client"] == client)
        .cloned()
}

/// The `web` endpoints a `proxy-config -o json` document says its client holds.
fn web_endpoints(doc: &Value) -> BTreeSet<SocketAddr> {
    let web = doc["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["cluster"] == "web")
        .unwrap_or_else(|| panic!("no web assignment: {doc}"));
    assert_eq!(web["current"], true, "{web}");
    web["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["address"].as_str().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_status_lists_a_real_envoy_under_its_agent_and_proxy_config_shows_what_it_holds() {
    // Goal (what `istioctl proxy-status` / `proxy-config` give an Istio user): a real Envoy
    // on the dev node agent is listed under that agent as SYNCED, and `proxy-config` — via
    // the authority, or the agent's own API — lists the endpoints Envoy's admin API holds.
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let dev = common::dev::start(&dir.path().join("dev")).await;
    let api = dev.api_client();
    until("web: 6 eligible", WAIT, async || {
        (verdicts(&api, "web").await["eligible"] == 6).then_some(())
    })
    .await;
    let envoy = common::dev::envoy_on_web(&dev, "sidecar-web-1", "web-client").await;
    let held: BTreeSet<SocketAddr> = envoy
        .cluster_endpoints("web")
        .await
        .expect("Envoy holds web")
        .into_iter()
        .collect();

    // proxy-status: the dev agent, and under it the Envoy, in sync.
    let status: Value = until("proxy-status lists the Envoy as SYNCED", WAIT, async || {
        let status: Value =
            serde_json::from_str(&waymark(&dev, &["proxy-status", "-o", "json"])).unwrap();
        let c = sidecar(&status, "sidecar-web-1")?;
        (c["state"] == "SYNCED" && c["types"]["ClusterLoadAssignment"]["acked"].is_string())
            .then_some(status)
    })
    .await;
    let c = sidecar(&status, "sidecar-web-1").unwrap();
    assert_eq!(
        (
            c["cluster"].as_str(),
            c["zone"].as_str(),
            c["protocol"].as_str()
        ),
        (Some("web-client"), Some("az1"), Some("delta")),
        "{c}"
    );
    let node = &status["sidecars"]["nodes"][0];
    assert_eq!(node["node"], "dev-node", "{status}");
    assert!(node["view_age_ms"].as_u64().unwrap() < 60_000, "{node}");
    assert!(
        status["agents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["node"] == "dev-node"),
        "the agent itself is listed: {status}"
    );
    let table = waymark(&dev, &["proxy-status"]);
    let agent_line = table.lines().position(|l| l.contains("(agent)")).unwrap();
    let envoy_line = table
        .lines()
        .position(|l| l.contains("sidecar-web-1"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(envoy_line > agent_line, "listed under its agent:\n{table}");
    let row = table.lines().nth(envoy_line).unwrap();
    assert!(
        row.starts_with("dev-node") && row.contains("web-client") && row.contains("SYNCED"),
        "{table}"
    );
    assert!(waymark(&dev, &["proxy-status", "-o", "wide"]).contains("EDS "));

    // proxy-config: the endpoints Envoy holds, found by client id alone.
    let doc: Value = serde_json::from_str(&waymark(
        &dev,
        &["proxy-config", "sidecar-web-1", "-o", "json"],
    ))
    .unwrap();
    assert_eq!(web_endpoints(&doc), held, "{doc}");
    let web = doc["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["cluster"] == "web")
        .unwrap();
    for e in web["endpoints"].as_array().unwrap() {
        assert_eq!(e["health"], "HEALTHY", "{e}");
        assert!(e["weight"].as_u64().unwrap() > 0, "{e}");
        assert!(e["instance"].as_str().unwrap().starts_with("web-"), "{e}");
        assert_eq!(e["health_disregarded"], false, "{e}");
    }
    let table = waymark(
        &dev,
        &["proxy-config", "sidecar-web-1", "--node", "dev-node"],
    );
    for addr in &held {
        assert!(table.contains(&addr.to_string()), "{addr} in:\n{table}");
    }
    let yaml: Value = serde_norway::from_str(&waymark(
        &dev,
        &["proxy-config", "sidecar-web-1", "-o", "yaml"],
    ))
    .unwrap();
    assert_eq!(web_endpoints(&yaml), held);
    // The same from the node agent's own API on the host, no authority involved.
    let agent = dev.agent().bound().http.to_string();
    let local: Value = serde_json::from_str(&waymark(
        &dev,
        &[
            "proxy-config",
            "sidecar-web-1",
            "--agent",
            &agent,
            "-o",
            "json",
        ],
    ))
    .unwrap();
    assert_eq!(web_endpoints(&local), held);
    // A client nobody has is refused by name.
    let out = operator_command(&dev, &["proxy-config", "nobody", "--node", "dev-node"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("unknown_client"),
        "{stderr}"
    );

    // The Envoy goes away: its agent says so within a report, not at the TTL.
    drop(envoy);
    until("proxy-status no longer lists the Envoy", WAIT, async || {
        let status: Value =
            serde_json::from_str(&waymark(&dev, &["proxy-status", "-o", "json"])).unwrap();
        sidecar(&status, "sidecar-web-1").is_none().then_some(())
    })
    .await;
    dev.stop().await;
}
