//! Service definitions for unwatched runtimes: a real `waymark agent` process registers each
//! definition in its `services_dir` with a lease, renews it, and on SIGTERM deregisters it
//! before it exits (the instance is gone at once, long before its lease would expire).
#![allow(clippy::unwrap_used)]
#![allow(clippy::disallowed_methods)] // waits on real processes by the wall clock; no paused time here

use crate::common;

use common::{agent_file, free_port, write_agent};

use std::process::{Command, Stdio};
use std::time::Duration;

use http::Method;
use serde_json::{Value, json};
use waymark_agent::api_client::ApiClient;
use waymark_testkit::{POLL_INTERVAL, try_until};

const WAIT: Duration = Duration::from_secs(60);

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn billing(api: &ApiClient) -> Option<Value> {
    let list = api.get_json("/v1/instances?service=billing").await.unwrap();
    list.as_array().unwrap().first().cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_are_registered_renewed_and_deregistered_on_sigterm() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let config = common::plain(
        &dir.path().join("authority"),
        "r1",
        &["z1"],
        "127.0.0.1:0".parse().unwrap(),
    );
    let auth = common::single_member(config).await;
    let api = common::operator(&auth, "test").await;
    // The agent's registrations need nothing beyond its own node.
    let agent_token = waymark_agent::authority::credentials::token_with(
        auth.raft(),
        "vm-1",
        &["register:vm-1".parse().unwrap()],
        Duration::from_secs(3_600),
    )
    .await
    .unwrap();
    let agent_token_file = dir.path().join("agent.token");
    std::fs::write(&agent_token_file, &agent_token).unwrap();
    let r = api
        .send(
            Method::PUT,
            "/v1/services/billing",
            Some(&json!({"owner": "billing", "contract": {}})),
        )
        .await
        .unwrap();
    assert!(r.status.is_success(), "{r:?}");

    let services = dir.path().join("services.d");
    std::fs::create_dir_all(&services).unwrap();
    std::fs::write(
        services.join("billing.toml"),
        "name = \"billing\"\naddress = \"10.0.3.7\"\nport = 8080\ntags = [\"v2\"]\nlease = \"6s\"\n",
    )
    .unwrap();
    let config = dir.path().join("agent.toml");
    let loopback = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut a = agent_file(
        "vm-1",
        "r1",
        "z1",
        &dir.path().join("agent"),
        &[auth.xds_addr()],
    );
    a.api = vec![auth.http_addr().to_string()];
    a.api_token_file = Some(agent_token_file.clone());
    a.services_dir = Some(services.clone());
    a.listen.xds = loopback(free_port());
    a.listen.dns = loopback(free_port());
    a.listen.http = loopback(free_port());
    write_agent(&config, a);
    let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["agent", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let log_of = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();

    // Registered, with the agent's locality and the definition's tags.
    let first = try_until("the registration", WAIT, POLL_INTERVAL, async || {
        billing(&api).await
    })
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", log_of()));
    assert_eq!(first["instance"]["locality"]["node"], "vm-1", "{first}");
    assert_eq!(first["instance"]["locality"]["zone"], "z1", "{first}");
    assert_eq!(first["instance"]["tags"], json!(["v2"]), "{first}");
    let id = first["instance"]["id"].clone();

    // Renewed: the same instance outlives the lease end its registration committed, the
    // leader answering the renewals from memory (no log entry moves that end).
    let expires = first["lease_expires_at_ms"].as_u64().unwrap();
    try_until("the renewal", WAIT, POLL_INTERVAL, async || {
        let now = billing(&api).await.expect("kept registered");
        assert_eq!(now["instance"]["id"], id, "the same instance, renewed");
        assert_eq!(
            now["lease_expires_at_ms"].as_u64().unwrap(),
            expires,
            "a renewal is no log entry"
        );
        let metrics = api.send(Method::GET, "/metrics", None).await.unwrap();
        let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
        let renewed = metrics
            .lines()
            .find(|l| l.starts_with("waymark_lease_renewals_total{outcome=\"renewed\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        renewed >= 1.0 && unix_ms() > expires + 1_500
    })
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", log_of()));

    // SIGHUP after the definition changed: the old instance goes, a new one comes (ids are
    // never reused). A broken file next to it changes nothing.
    let pid = agent.id().to_string();
    std::fs::write(
        services.join("billing.toml"),
        "name = \"billing\"\naddress = \"10.0.3.7\"\nport = 8081\nlease = \"6s\"\n",
    )
    .unwrap();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let moved = try_until("SIGHUP applied", WAIT, POLL_INTERVAL, async || {
        billing(&api)
            .await
            .filter(|v| v["instance"]["address"]["port"] == 8081)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", log_of()));
    assert_ne!(
        moved["instance"]["id"], id,
        "a changed definition is a new instance"
    );
    let list = api.get_json("/v1/instances?service=billing").await.unwrap();
    assert_eq!(
        list.as_array().unwrap().len(),
        1,
        "the old one is gone: {list}"
    );
    std::fs::write(services.join("broken.toml"), "name = 3\n").unwrap();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );

    // SIGTERM: deregistered before the process exits.
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    let exited = agent.wait().unwrap();
    assert!(
        exited.success(),
        "the agent stops cleanly on SIGTERM: {exited:?}"
    );
    let gone = billing(&api).await;
    assert!(
        gone.is_none(),
        "deregistered on SIGTERM, not left to expire: {gone:?}\n{}",
        log_of()
    );
    auth.shutdown().await;
}
