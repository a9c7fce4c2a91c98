//! The probe address policy and the reach of check output, against a running region
//! (`waymark dev`: authority, node agent, demo backends on loopback, which the dev region
//! allows explicitly). An instance registered at the cloud metadata address or a link-local
//! one is never probed: the agent lists the refusal with its reason and counts it, and the
//! instance stays `unknown` (silent), not failing. What a failing target said is shown by
//! `explain` and redacted on the audit read path.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::dev::WAIT;
use http::Method;
use serde_json::{Value, json};
use waymark_agent::api_client::ApiClient;
use waymark_testkit::until;

async fn register(api: &ApiClient, ip: &str, port: u16) -> String {
    let v = api
        .send(
            Method::POST,
            "/v1/instances",
            Some(&json!({
                "service": "web",
                "locality": {"region": "dev", "zone": "az1", "node": "dev-node"},
                "address": {"ip": ip, "port": port},
                "lease_ms": 600_000,
            })),
        )
        .await
        .unwrap()
        .json()
        .unwrap();
    v["instance"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_and_link_local_targets_are_refused_and_what_a_target_said_stays_in_explain() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let dev = common::dev::start(dir.path()).await;
    let api = dev.api_client();
    let agent = ApiClient::new(&dev.agent().bound().http.to_string(), None);
    let control = ApiClient::new(&dev.backends_api().to_string(), None);

    let metadata = register(&api, "169.254.169.254", 80).await;
    let link_local = register(&api, "fe80::1", 80).await;

    // The agent refuses both, by class, and probes the loopback backends it is allowed.
    let refused = until("the agent lists the refusals", WAIT, async || {
        let v = agent.get_json("/v1/probes/refused").await.ok()?;
        let list = v["refused"].as_array()?.clone();
        (list.len() == 2).then_some(list)
    })
    .await;
    let reason_of = |id: &str| {
        refused
            .iter()
            .find(|r| r["instance"] == id)
            .map(|r| r["reason"].as_str().unwrap_or_default().to_owned())
    };
    assert_eq!(reason_of(&metadata).as_deref(), Some("cloud_metadata"));
    assert_eq!(reason_of(&link_local).as_deref(), Some("link_local"));
    let metrics = String::from_utf8(
        agent
            .send(Method::GET, "/metrics", None)
            .await
            .unwrap()
            .body
            .to_vec(),
    )
    .unwrap();
    for reason in ["cloud_metadata", "link_local"] {
        assert!(
            metrics.contains(&format!(
                "waymark_probe_targets_refused_total{{reason=\"{reason}\"}} 1"
            )),
            "{reason} not counted once"
        );
    }

    // Never probed, so never failing: the evaluator holds it as silent.
    let explained = api
        .get_json(&format!("/v1/instances/{metadata}/explain"))
        .await
        .unwrap();
    let probe = explained["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["class"] == "probe")
        .cloned()
        .unwrap();
    assert!(probe["last"].is_null(), "{explained:#}");
    assert_ne!(explained["verdict"], "ineligible", "{explained:#}");

    // A flapping backend answers its probe `503 failing` half the time: explain quotes it,
    // the audit read path shows the status and redacts what the target said.
    let flapping = dev.instances()["web-az1-1"].to_string();
    let r = control
        .send(
            Method::PUT,
            "/v1/dev/backends/web-az1-1/mode",
            Some(&json!({"mode": "flap"})),
        )
        .await
        .unwrap();
    assert!(r.status.is_success(), "{r:?}");
    let lasts = until(
        "a transition with the backend's 503 in the audit log",
        WAIT,
        async || {
            let r = api
                .send(
                    Method::GET,
                    &format!("/v1/audit?kind=transition&instance={flapping}"),
                    None,
                )
                .await
                .ok()?;
            let lasts: Vec<String> = String::from_utf8_lossy(&r.body)
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .flat_map(|e| {
                    e["detail"]["evidence"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                })
                .filter_map(|c| c["last"].as_str().map(str::to_owned))
                .filter(|l| l.contains("HTTP 503"))
                .collect();
            (!lasts.is_empty()).then_some(lasts)
        },
    )
    .await;
    for last in &lasts {
        assert!(last.contains("HTTP 503; said: [redacted"), "{last}");
        assert!(!last.contains("failing"), "{last}");
    }
    let said = until("explain quotes the backend", WAIT, async || {
        let v = api
            .get_json(&format!("/v1/instances/{flapping}/explain"))
            .await
            .ok()?;
        let text = v["text"].as_str()?.to_owned();
        text.contains("said: failing").then_some(text)
    })
    .await;
    assert!(said.contains("HTTP 503"), "{said}");
    dev.stop().await;
}
