//! Hostile input against a running region (`waymark dev`: authority, Raft on redb, node
//! agent with its sled cache, real sockets): each request that once halted the region gets
//! a typed refusal, nothing changes, a withdrawal still reaches the node agent afterwards,
//! and the region restarted on the same data folder becomes ready again. A deleted service
//! leaves the agent's view and DNS.
//!
//! Needs `dig` (Debian `dnsutils`; `./scripts/test` installs it).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::process::Command;

use common::dev::{WAIT, call, start};
use http::{Method, StatusCode};
use serde_json::{Value, json};
use waymark_agent::api_client::ApiClient;
use waymark_agent::dev::DevRegion;
use waymark_testkit::until;

fn reason(v: &Value) -> (&str, &str) {
    (
        v["error"]["reason"].as_str().unwrap_or_default(),
        v["error"]["field"].as_str().unwrap_or_default(),
    )
}

async fn eligible(api: &ApiClient, service: &str) -> u64 {
    let (_, list) = call(api, Method::GET, "/v1/services", None).await;
    list.as_array()
        .and_then(|l| l.iter().find(|s| s["service"] == service))
        .and_then(|s| s["verdicts"]["eligible"].as_u64())
        .unwrap_or(0)
}

/// What the node agent serves for `service`: its endpoint count, if it serves it at all.
fn served(dev: &DevRegion, service: &str) -> Option<usize> {
    let status = serde_json::to_value(dev.agent().status()).unwrap();
    status["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["service"] == service)
        .map(|s| s["endpoints"].as_u64().unwrap() as usize)
}

fn dig_status(dev: &DevRegion, name: &str) -> String {
    let port = dev.agent().bound().dns.port().to_string();
    let out = Command::new("dig")
        .args([
            "@127.0.0.1",
            "-p",
            &port,
            "+time=2",
            "+tries=1",
            "+noall",
            "+comments",
            name,
            "A",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run dig ({e}); ./scripts/test installs dnsutils"));
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    out.split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("no status in dig output:\n{out}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_once_halted_the_region_are_refused_and_change_nothing() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let dev = start(dir.path()).await;
    let api = dev.api_client();
    until("web: 6 eligible", WAIT, async || {
        (eligible(&api, "web").await == 6).then_some(())
    })
    .await;
    let (_, services_before) = call(&api, Method::GET, "/v1/services", None).await;
    let (_, instances_before) = call(&api, Method::GET, "/v1/instances", None).await;

    // 1. A 251-byte service name (registered ids would not fit), then a registration.
    let long = "s".repeat(251);
    let (status, body) = call(
        &api,
        Method::PUT,
        &format!("/v1/services/{long}"),
        Some(json!({"owner": "x", "contract": {}})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(reason(&body), ("too_long", "service"), "{body}");
    let registration = |service: &str, port: u16| {
        json!({
            "service": service,
            "locality": {"region": "dev", "zone": "az1", "node": "dev-node"},
            "address": {"ip": "127.0.0.1", "port": port},
            "lease_ms": 30_000,
        })
    };
    let (status, body) = call(
        &api,
        Method::POST,
        "/v1/instances",
        Some(registration(&long, 9)),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // 2. A contract whose silence (interval × factor) overflows.
    let (status, body) = call(
        &api,
        Method::PUT,
        "/v1/services/x",
        Some(json!({"owner": "x", "contract": {
            "profile": {"probe": true, "self_report": true, "passive": true},
            "self_report_interval": format!("{}ms", u64::MAX),
            "scoring": {"half_life": "1s", "remove": 800, "readmit": 200, "readmit_hold": "10s",
                        "corroborate": 500, "silence_factor": u32::MAX},
        }})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(reason(&body).0, "contract", "{body}");

    // 3. An orchestrated or registered instance named as an external endpoint.
    let web = dev.instances()["web-az1-1"].to_string();
    let (status, body) = call(&api, Method::DELETE, &format!("/v1/external/{web}"), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(reason(&body).0, "origin_mismatch", "{body}");

    // 4. Labels past their ceilings.
    let mut many = registration("web", 9);
    many["tags"] = json!((0..100).map(|i| format!("t{i}")).collect::<Vec<_>>());
    let (status, body) = call(&api, Method::POST, "/v1/instances", Some(many)).await;
    assert!(status.is_client_error(), "{status} {body}");

    // Nothing changed, and the member is up and ready.
    let (_, services_after) = call(&api, Method::GET, "/v1/services", None).await;
    let (_, instances_after) = call(&api, Method::GET, "/v1/instances", None).await;
    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s["service"].to_string())
            .collect()
    };
    assert_eq!(names(&services_before), names(&services_after));
    assert_eq!(
        instances_before.as_array().unwrap().len(),
        instances_after.as_array().unwrap().len()
    );
    let ready = api.send(Method::GET, "/readyz", None).await.unwrap();
    assert_eq!(ready.status, StatusCode::OK);

    // A withdrawal still reaches the node agent.
    let control = ApiClient::new(&dev.backends_api().to_string(), None);
    let before = served(&dev, "web").unwrap();
    let r = control
        .send(
            Method::PUT,
            "/v1/dev/backends/web-az1-1/mode",
            Some(&json!({"mode": "fail-hard"})),
        )
        .await
        .unwrap();
    assert!(r.status.is_success());
    until("the withdrawal reaches the agent", WAIT, async || {
        (served(&dev, "web").is_some_and(|n| n < before)).then_some(())
    })
    .await;

    // Restarted on the same folder, the region becomes ready again.
    dev.stop().await;
    let dev = start(dir.path()).await;
    let api = dev.api_client();
    let ready = api.send(Method::GET, "/readyz", None).await.unwrap();
    assert_eq!(ready.status, StatusCode::OK);
    until("web eligible after the restart", WAIT, async || {
        (eligible(&api, "web").await > 0).then_some(())
    })
    .await;
    dev.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_service_leaves_the_agents_view_and_dns() {
    // Goal: deleting a service and its instances left the agent serving the old endpoints
    // and DNS answering for it for ever.
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let dev = start(dir.path()).await;
    let api = dev.api_client();
    let (status, body) = call(
        &api,
        Method::PUT,
        "/v1/services/tmp",
        Some(json!({"owner": "x", "contract": {
            "profile": {"probe": false, "self_report": false, "passive": true},
            "probe": null,
        }})),
    )
    .await;
    assert!(status.is_success(), "{status} {body}");
    let (status, body) = call(
        &api,
        Method::POST,
        "/v1/instances",
        Some(json!({
            "service": "tmp",
            "locality": {"region": "dev", "zone": "az1", "node": "dev-node"},
            "address": {"ip": "127.0.0.1", "port": 9},
            "lease_ms": 30_000,
        })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["instance"].as_str().unwrap().to_owned();
    until("the agent serves tmp", WAIT, async || {
        (served(&dev, "tmp") == Some(1)).then_some(())
    })
    .await;
    assert_eq!(dig_status(&dev, "tmp.service.waymark."), "NOERROR");

    let (status, body) = call(&api, Method::DELETE, &format!("/v1/instances/{id}"), None).await;
    assert!(status.is_success(), "{status} {body}");
    let (status, body) = call(&api, Method::DELETE, "/v1/services/tmp", None).await;
    assert!(status.is_success(), "{status} {body}");
    until("the agent forgets tmp", WAIT, async || {
        served(&dev, "tmp").is_none().then_some(())
    })
    .await;
    // Nor does the agent keep ageing a view it no longer serves.
    let agent = ApiClient::new(&dev.agent().bound().http.to_string(), None);
    until(
        "the agent stops reporting tmp's view age",
        WAIT,
        async || {
            let r = agent.send(Method::GET, "/metrics", None).await.ok()?;
            let text = String::from_utf8_lossy(&r.body).into_owned();
            let web = text.contains("waymark_agent_view_age_seconds{service=\"web\"}");
            let tmp = text.contains("waymark_agent_view_age_seconds{service=\"tmp\"}");
            (web && !tmp).then_some(())
        },
    )
    .await;
    until("DNS forgets tmp", WAIT, async || {
        (dig_status(&dev, "tmp.service.waymark.") == "NXDOMAIN").then_some(())
    })
    .await;
    dev.stop().await;
}
