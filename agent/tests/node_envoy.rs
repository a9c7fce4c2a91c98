//! A real Envoy routing through a real node agent process, fed by an authority.
//!
//! One story, in order (each step depends on the state the previous one left):
//! 1. traffic flows; `dig` answers the same endpoints Envoy holds;
//! 2. a single withdrawal reaches Envoy at once; a mass withdrawal is slowed by the agent's
//!    shrink cap (held back, declared in `/v1/view`) and released as the window allows;
//! 3. the authority stops; Envoy is restarted and routes from the agent without waiting;
//! 4. the agent is SIGKILLed and restarted while the authority is still down: it serves its
//!    sled cache, and both the old Envoy and a new one route;
//! 5. the authority returns: the agent reconnects and nothing regresses.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support;

use common::{agent_file, free_port, write_agent};

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use http::Method;
use serde_json::{Value, json};
use support::{Backend, Envoy, EnvoyConfig, Route, Xds, XdsMode};
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::member::Authority;
use waymark_agent::node::config::Bounds;
use waymark_testkit::until;

const WAIT: Duration = Duration::from_secs(60);
const BACKENDS: usize = 10;

async fn authority(dir: &Path, xds: u16) -> Authority {
    let xds = SocketAddr::from(([127, 0, 0, 1], xds));
    common::single_member(common::plain(dir, "r1", &["z1"], xds)).await
}

struct Agent {
    config: PathBuf,
    log: PathBuf,
    http: SocketAddr,
    dns: u16,
    xds: SocketAddr,
    child: Option<Child>,
}

impl Agent {
    fn new(dir: &Path, upstream: SocketAddr) -> Self {
        let (xds, dns, http) = (free_port(), free_port(), free_port());
        let config = dir.join("agent.toml");
        let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let mut a = agent_file("n1", "r1", "z1", &dir.join("agent-data"), &[upstream]);
        a.listen.xds = loopback(xds);
        a.listen.dns = loopback(dns);
        a.listen.http = loopback(http);
        a.bounds = Bounds {
            shrink_max_permille: 300,
            shrink_window: Duration::from_secs(3),
            max_ejection_percent: 20,
        };
        write_agent(&config, a);
        Self {
            config,
            log: dir.join("agent.log"),
            http: SocketAddr::from(([127, 0, 0, 1], http)),
            dns,
            xds: SocketAddr::from(([127, 0, 0, 1], xds)),
            child: None,
        }
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_waymark"))
            .args(["agent", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap(); // SIGKILL
            c.wait().unwrap();
        }
    }

    async fn view(&self) -> Option<Value> {
        ApiClient::new(&self.http.to_string(), None)
            .get_json("/v1/view")
            .await
            .ok()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- agent log tail ---\n{}", self.log_tail());
        }
    }
}

fn service(view: &Value, name: &str) -> Option<Value> {
    view["services"]
        .as_array()?
        .iter()
        .find(|s| s["service"] == name)
        .cloned()
}

/// Ports of `web`'s endpoints in DNS (SRV), as `dig` sees them.
/// Every `filter_metadata["waymark"].capability` in an Envoy config dump (EDS included).
fn capabilities(dump: &Value) -> Vec<Value> {
    let mut found = Vec::new();
    let mut stack = vec![dump];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(map) => {
                if let Some(c) = map
                    .get("filter_metadata")
                    .and_then(|f| f.get("waymark"))
                    .and_then(|w| w.get("capability"))
                {
                    found.push(c.clone());
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    found
}

fn dig_ports(dns: u16, tcp: bool) -> BTreeSet<u16> {
    let mut cmd = Command::new("dig");
    cmd.args([
        "@127.0.0.1",
        "-p",
        &dns.to_string(),
        "web.service.waymark.",
        "SRV",
        "+short",
    ]);
    if tcp {
        cmd.arg("+tcp");
    }
    let out = cmd
        .output()
        .expect("dig runs (./scripts/test installs dnsutils)");
    assert!(out.status.success(), "dig failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2)?.parse().ok())
        .collect()
}

async fn envoy_ports(envoy: &Envoy) -> BTreeSet<u16> {
    envoy
        .cluster_endpoints("web")
        .await
        .unwrap_or_default()
        .iter()
        .map(SocketAddr::port)
        .collect()
}

async fn start_envoy(agent: &Agent) -> Envoy {
    let envoy = Envoy::start(EnvoyConfig {
        node_id: "sidecar-1".into(),
        region: "r1".into(),
        zone: "z1".into(),
        xds: Some(Xds {
            addr: agent.xds,
            mode: XdsMode::Delta,
        }),
        routes: vec![Route::new("/", "web")],
        ..EnvoyConfig::default()
    })
    .await;
    envoy.wait_live(WAIT).await;
    envoy
}

async fn wait_routing(envoy: &Envoy, want: usize) {
    envoy
        .wait_until(
            &format!("Envoy holds {want} endpoints and routes"),
            WAIT,
            async || {
                envoy.cluster_endpoints("web").await.map(|e| e.len()) == Some(want)
                    && envoy.try_get("/").await.is_ok_and(|(s, _)| s == 200)
            },
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_routes_through_the_agent_across_outages_and_withdrawals() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let xds_port = free_port();
    let auth = authority(&dir.path().join("authority"), xds_port).await;
    let api = common::operator(&auth, "test").await;
    let put = api
        .send(
            Method::PUT,
            "/v1/services/web",
            Some(&json!({"owner": "web", "contract": {}})),
        )
        .await
        .unwrap();
    assert!(put.status.is_success(), "{put:?}");

    let mut backends = Vec::new();
    let mut ids: BTreeMap<u16, String> = BTreeMap::new();
    for i in 0..BACKENDS {
        let b = Backend::start(&format!("web-{i}")).await;
        let reg = json!({
            "service": "web",
            "locality": {"region": "r1", "zone": "z1", "node": "n1"},
            "address": {"ip": "127.0.0.1", "port": b.addr().port()},
            "lease_ms": 600_000,
        });
        let v = api
            .send(Method::POST, "/v1/instances", Some(&reg))
            .await
            .unwrap()
            .json()
            .unwrap();
        ids.insert(b.addr().port(), v["instance"].as_str().unwrap().to_owned());
        backends.push(b);
    }
    let all: BTreeSet<u16> = ids.keys().copied().collect();

    let mut agent = Agent::new(dir.path(), auth.xds_addr());
    agent.start();
    let envoy = start_envoy(&agent).await;

    // 1. Traffic flows; DNS answers the EDS set (UDP and TCP).
    wait_routing(&envoy, BACKENDS).await;
    assert_eq!(envoy_ports(&envoy).await, all);
    assert_eq!(dig_ports(agent.dns, false), all);
    assert_eq!(dig_ports(agent.dns, true), all);
    // Staleness and the compatibility surfaces are exposed, in a format promtool accepts.
    let metrics = ApiClient::new(&agent.http.to_string(), None)
        .send(Method::GET, "/metrics", None)
        .await
        .unwrap();
    let text = String::from_utf8(metrics.body.to_vec()).unwrap();
    for name in [
        "waymark_agent_upstream_connected 1",
        "waymark_agent_lkg_age_seconds",
        "waymark_agent_view_age_seconds{service=\"web\"}",
        "waymark_agent_held_back_endpoints",
        "waymark_dns_queries_total",
        "waymark_lrs_",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
    common::promtool_check(&text);
    let dump = envoy.config_dump().await;
    assert!(
        dump.to_string().contains("\"max_ejection_percent\":20"),
        "the agent caps outlier ejection in served clusters"
    );
    // Every endpoint Envoy holds states what its health rests on (ADR-16): the default
    // contract's classes, and whether anything has verified it yet.
    let stated = capabilities(&dump);
    assert_eq!(
        stated.len(),
        BACKENDS,
        "one capability per endpoint: {stated:?}"
    );
    for c in &stated {
        assert_eq!(c["classes"], json!(["probe", "passive"]), "{c}");
        assert!(c["verified"].is_boolean(), "{c}");
        let mode = c["evidence"].as_str().unwrap_or_default();
        assert!(
            ["passive_primary", "probe_primary", "single_class"].contains(&mode),
            "{c}"
        );
    }

    // 2a. A single withdrawal passes at once.
    let mut remaining = all.clone();
    let one = *remaining.iter().next().unwrap();
    let deregister = async |port: u16| {
        let r = api
            .send(
                Method::DELETE,
                &format!("/v1/instances/{}", ids[&port]),
                None,
            )
            .await
            .unwrap();
        assert!(r.status.is_success(), "{r:?}");
    };
    deregister(one).await;
    remaining.remove(&one);
    wait_routing(&envoy, remaining.len()).await;
    let v = agent.view().await.unwrap();
    assert_eq!(service(&v, "web").unwrap()["held_back"], 0, "{v}");

    // 2b. A mass withdrawal (5 of 9) is slowed: the agent holds some back and says so.
    let before = service(&agent.view().await.unwrap(), "web").unwrap()["upstream_version"].clone();
    let gone: Vec<u16> = remaining.iter().copied().take(5).collect();
    for p in &gone {
        deregister(*p).await;
        remaining.remove(p);
    }
    let mut held = None;
    until("the agent sees the withdrawal", WAIT, async || {
        let Some(v) = agent.view().await else {
            return false;
        };
        let s = service(&v, "web").unwrap();
        let seen = s["upstream_version"] != before && s["held_back"].as_u64().unwrap_or(0) > 0;
        if seen {
            held = Some(s);
        }
        seen
    })
    .await;
    let held = held.unwrap();
    assert!(
        held["endpoints"].as_u64().unwrap() > remaining.len() as u64,
        "the shrink cap keeps withdrawn endpoints for now: {held}"
    );
    let now = envoy_ports(&envoy).await;
    assert!(
        now.len() > remaining.len(),
        "Envoy still holds some of the withdrawn endpoints: {now:?}"
    );
    // …and releases them as the window allows.
    wait_routing(&envoy, remaining.len()).await;
    assert_eq!(envoy_ports(&envoy).await, remaining);
    assert_eq!(dig_ports(agent.dns, false), remaining);
    let served_before_outage =
        service(&agent.view().await.unwrap(), "web").unwrap()["served_version"]
            .as_u64()
            .unwrap();

    // 3. The authority stops; a restarted Envoy routes from the agent.
    auth.shutdown().await;
    drop(envoy);
    let envoy = start_envoy(&agent).await;
    wait_routing(&envoy, remaining.len()).await;
    assert_eq!(envoy_ports(&envoy).await, remaining);

    // 4. The agent is killed and restarted with the authority still down: sled serves.
    agent.kill();
    agent.start();
    until("the restarted agent answers", WAIT, async || {
        agent
            .view()
            .await
            .is_some_and(|v| v["started_from"] == "cache")
    })
    .await;
    let v = agent.view().await.unwrap();
    assert_eq!(v["upstream_connected"], false, "{v}");
    let fresh = start_envoy(&agent).await;
    wait_routing(&fresh, remaining.len()).await;
    assert_eq!(envoy_ports(&fresh).await, remaining);
    wait_routing(&envoy, remaining.len()).await;
    assert_eq!(dig_ports(agent.dns, false), remaining);

    // 5. The authority returns: the agent reconnects; nothing regresses.
    let auth = authority(&dir.path().join("authority"), xds_port).await;
    until("the agent reconnects upstream", WAIT, async || {
        agent
            .view()
            .await
            .is_some_and(|v| v["upstream_connected"] == true)
    })
    .await;
    let v = agent.view().await.unwrap();
    let s = service(&v, "web").unwrap();
    assert!(
        s["served_version"].as_u64().unwrap() >= served_before_outage,
        "no regression: {s}"
    );
    assert_eq!(s["endpoints"].as_u64().unwrap(), remaining.len() as u64);
    assert_eq!(envoy_ports(&fresh).await, remaining);
    let (status, _) = fresh.get("/").await;
    assert_eq!(status, 200);
    auth.shutdown().await;
}
