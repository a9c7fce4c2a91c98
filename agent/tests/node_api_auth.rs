//! The node agent's local HTTP API off loopback: served over TLS with the node's
//! certificate, the probes open to anyone, everything else (`/metrics`, `/v1/*`, unknown
//! paths) only to a bearer of a token from `[agent.listen] http_tokens_file`, with tokens
//! rotated by editing the file. A real agent on a wildcard address (off loopback, so the
//! config demands both), reached through `127.0.0.1` with the CLI's own clients.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::path::Path;

use http::{Method, StatusCode};
use serde_json::Value;
use waymark_agent::api_client::{ApiClient, ApiResponse};
use waymark_agent::cli::tls::agent_api_client_config;
use waymark_agent::node::NodeAgent;
use waymark_agent::node::config::{Gossip, Tls};
use waymark_certs::testing::TestPkiDir;

const TD: &str = "waymark.test";
const OLD: &str = "wm-agent-api-0123456789abcdef";
const NEW: &str = "wm-agent-api-fedcba9876543210";

async fn get(api: SocketAddr, bundle: &Path, token: Option<&str>, path: &str) -> ApiResponse {
    let client = ApiClient::new(&api.to_string(), token.map(str::to_owned))
        .with_tls(agent_api_client_config(bundle).unwrap());
    client.send(Method::GET, path, None).await.unwrap()
}

fn reason(r: &ApiResponse) -> String {
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    body["error"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_loopback_the_local_api_is_tls_and_reads_need_a_token_in_force() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPkiDir::init(&dir.path().join("pki"), TD, &["eu"]);
    let tokens = dir.path().join("api-tokens");
    std::fs::write(&tokens, format!("# Prometheus\n{OLD}\n")).unwrap();
    // No authority answers: the API serves regardless (readiness says no view yet).
    let nowhere: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut config = common::agent_on_loopback("n1", "eu", "a", &dir.path().join("d"), &[nowhere]);
    config.tls = Some(Tls::new(TD, &pki.issue("region/eu/node/n1")));
    config.listen.http = "0.0.0.0:0".parse().unwrap();
    config.listen.http_tokens_file = Some(tokens.clone());
    // A pool of one, so that `waymark members` has something to list.
    config.gossip = Some(Gossip {
        bind: "127.0.0.1:0".parse().unwrap(),
        seeds: Vec::new(),
        keys: vec!["ab".repeat(32)],
    });
    let agent = NodeAgent::start(config).await.unwrap();
    let api = SocketAddr::from(([127, 0, 0, 1], agent.bound().http.port()));
    let bundle = pki.bundle();

    // Probes answer anyone, over TLS.
    assert_eq!(
        get(api, &bundle, None, "/livez").await.status,
        StatusCode::OK
    );
    let ready = get(api, &bundle, None, "/readyz").await.status;
    assert_eq!(ready, StatusCode::SERVICE_UNAVAILABLE, "no view yet");

    // Everything else needs a token in force; each refusal says why.
    for path in [
        "/metrics",
        "/v1/view",
        "/v1/members",
        "/v1/clients",
        "/v1/nothing",
    ] {
        let r = get(api, &bundle, None, path).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(reason(&r), "missing", "{path}");
        assert!(
            r.headers
                .get(http::header::WWW_AUTHENTICATE)
                .is_some_and(|v| v.to_str().unwrap().starts_with("Bearer")),
            "{path}"
        );
    }
    let wrong = get(api, &bundle, Some(NEW), "/v1/view").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(reason(&wrong), "unknown_token");
    let view = get(api, &bundle, Some(OLD), "/v1/view").await;
    assert_eq!(view.status, StatusCode::OK);
    let absent = get(api, &bundle, Some(OLD), "/v1/nothing").await;
    assert_eq!(
        absent.status,
        StatusCode::NOT_FOUND,
        "a reader learns what is absent"
    );

    // The refusals are counted on the agent's own /metrics.
    let metrics = get(api, &bundle, Some(OLD), "/metrics").await;
    assert_eq!(metrics.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains("waymark_agent_http_refused_total{reason=\"missing\"} 5"),
        "{text}"
    );
    assert!(
        text.contains("waymark_agent_http_refused_total{reason=\"unknown_token\"} 1"),
        "{text}"
    );

    // Rotation without a restart: the new token added, then the old one removed.
    std::fs::write(&tokens, format!("{OLD}\n{NEW}\n")).unwrap();
    assert_eq!(
        get(api, &bundle, Some(NEW), "/v1/view").await.status,
        StatusCode::OK
    );
    std::fs::write(&tokens, format!("# rotated\n{NEW}\n")).unwrap();
    let old = get(api, &bundle, Some(OLD), "/v1/view").await;
    assert_eq!(old.status, StatusCode::UNAUTHORIZED, "the removed token");
    // A broken file keeps the token in force.
    std::fs::write(&tokens, "x\n").unwrap();
    assert_eq!(
        get(api, &bundle, Some(NEW), "/v1/view").await.status,
        StatusCode::OK
    );

    // The CLI reads it as an operator would: https, the bundle, a token file.
    let token_file = dir.path().join("reader-token");
    std::fs::write(&token_file, format!("{NEW}\n")).unwrap();
    let members = |token: Option<&Path>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_waymark"));
        cmd.args(["members", "-o", "json", "--agent"])
            .arg(format!("https://{api}"))
            .arg("--ca-bundle")
            .arg(&bundle)
            .env_remove("WAYMARK_AGENT_TOKEN_FILE")
            .env_remove("WAYMARK_CA_BUNDLE");
        if let Some(t) = token {
            cmd.arg("--token-file").arg(t);
        }
        cmd.output().unwrap()
    };
    let read = members(Some(&token_file));
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let doc: Value = serde_json::from_slice(&read.stdout).unwrap();
    let names: Vec<&str> = doc["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(names, ["n1"], "{doc}");
    let refused = members(None);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("401") && stderr.contains("missing"),
        "{stderr}"
    );

    // Plain text is not served there: the token would cross the network in the clear.
    let plain = ApiClient::new(&api.to_string(), Some(NEW.to_owned()))
        .send(Method::GET, "/v1/view", None)
        .await;
    assert!(
        plain.as_ref().map_or(true, |r| r.status != StatusCode::OK),
        "plain HTTP answered {:?}",
        plain.map(|r| r.status)
    );
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokens_file_without_a_token_stops_the_start_naming_the_key() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPkiDir::init(&dir.path().join("pki"), TD, &["eu"]);
    let tokens = dir.path().join("api-tokens");
    std::fs::write(&tokens, "# nobody yet\n").unwrap();
    let nowhere: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut config = common::agent_on_loopback("n1", "eu", "a", &dir.path().join("d"), &[nowhere]);
    config.tls = Some(Tls::new(TD, &pki.issue("region/eu/node/n1")));
    config.listen.http_tokens_file = Some(tokens);
    let Err(e) = NodeAgent::start(config).await else {
        panic!("an agent started with no token any reader could present");
    };
    let e = format!("{e:#}");
    assert!(e.starts_with("agent.listen.http_tokens_file"), "{e}");
    assert!(e.contains("no token in it"), "{e}");
}
