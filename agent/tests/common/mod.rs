//! Shared by the agent's integration tests: a free port, the roles' configurations (built
//! from the config types, written with their `to_toml`), and a single-member authority
//! that is leading before the test goes on. Each test file uses the part it needs.
#![allow(dead_code, unreachable_pub)]

pub mod dev;
pub mod pki;
pub mod prometheus;
pub mod writer;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use waymark_agent::authority::config::{AuthoritySection, ConfigFile, MemberEntry};
use waymark_agent::authority::member::Authority;
use waymark_agent::authority::settings::AuthorityConfig;
use waymark_agent::node::config::{AgentConfig, AgentFile};

/// How long a single member may take to lead.
pub const LEAD_WAIT: Duration = Duration::from_secs(60);

/// A port nothing listens on now (the listener is dropped before returning).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Member 1 of `region` with `zones`, run in process: plain text (no TLS, ingest,
/// Kubernetes or gossip), storing in `dir`, its xDS on `xds` (port 0 picks one), every
/// other listener on a free loopback port. Change what the test needs.
pub fn plain(dir: &Path, region: &str, zones: &[&str], xds: SocketAddr) -> AuthorityConfig {
    AuthorityConfig {
        id: 1,
        region: region.parse().unwrap(),
        zones: zones.iter().map(|z| z.parse().unwrap()).collect(),
        data_dir: dir.to_path_buf(),
        http: "127.0.0.1:0".parse().unwrap(),
        raft: "127.0.0.1:0".parse().unwrap(),
        xds,
        ingest: None,
        tls: None,
        kubernetes: None,
        gossip: None,
        federation: None,
        limits: Default::default(),
    }
}

/// [`plain`] member `id` of region `eu` with `zones`, storing in `dir/m<id>`, xDS on a
/// free port: one of a group a test starts in process.
pub fn plain_member(dir: &Path, id: u64, zones: &[&str]) -> AuthorityConfig {
    let mut config = plain(
        &dir.join(format!("m{id}")),
        "eu",
        zones,
        "127.0.0.1:0".parse().unwrap(),
    );
    config.id = id;
    config
}

/// `[authority]` of member `id` of `region` with `zones`, storing in `data_dir`; every
/// other key at its default. Change what the test needs, then [`write_authority`].
pub fn authority_file(id: u64, region: &str, zones: &[&str], data_dir: &Path) -> AuthoritySection {
    AuthoritySection::new(
        id,
        region.parse().unwrap(),
        zones.iter().map(|z| z.parse().unwrap()).collect(),
        data_dir.to_path_buf(),
    )
}

/// `[[authority.members]]`: member `i + 1` at the `i`-th (API, Raft) address pair.
pub fn members(addrs: &[(SocketAddr, SocketAddr)]) -> Vec<MemberEntry> {
    (1..)
        .zip(addrs)
        .map(|(id, (http, raft))| MemberEntry {
            id,
            addr: http.to_string(),
            raft: raft.to_string(),
        })
        .collect()
}

/// Writes `authority` to `path` as a member's configuration file.
pub fn write_authority(path: &Path, authority: AuthoritySection) {
    let text = ConfigFile::new(authority).to_toml().unwrap();
    std::fs::write(path, text).unwrap();
}

/// `[agent]` of node `name` in `region`/`zone`, its cache in `data_dir`, subscribing to
/// `upstream`; every other key at its default. Change what the test needs, then
/// [`write_agent`].
pub fn agent_file(
    name: &str,
    region: &str,
    zone: &str,
    data_dir: &Path,
    upstream: &[SocketAddr],
) -> AgentConfig {
    AgentConfig::new(
        name.parse().unwrap(),
        region.parse().unwrap(),
        zone.parse().unwrap(),
        data_dir.to_path_buf(),
        upstream.iter().map(SocketAddr::to_string).collect(),
    )
}

/// [`agent_file`] for a node agent run in process: every listener on a free loopback port.
pub fn agent_on_loopback(
    name: &str,
    region: &str,
    zone: &str,
    data_dir: &Path,
    upstream: &[SocketAddr],
) -> AgentConfig {
    let mut agent = agent_file(name, region, zone, data_dir, upstream);
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    agent.listen.xds = any;
    agent.listen.dns = any;
    agent.listen.http = any;
    agent
}

/// Writes `agent` to `path` as a node agent's configuration file.
pub fn write_agent(path: &Path, agent: AgentConfig) {
    let text = AgentFile::new(agent).to_toml().unwrap();
    std::fs::write(path, text).unwrap();
}

/// Start `config` as the only member (bootstrapping it the first time) and wait until it
/// leads.
pub async fn single_member(config: AuthorityConfig) -> Authority {
    waymark_certs::install_crypto_provider();
    let a = Authority::start(config).await.unwrap();
    a.bootstrap(BTreeMap::from([(1, a.member())]))
        .await
        .unwrap();
    wait_leader(&a).await;
    a
}

/// Wait until `a` leads (a single member that was just bootstrapped).
pub async fn wait_leader(a: &Authority) {
    let mut m = a.raft().watch_metrics();
    tokio::time::timeout(LEAD_WAIT, m.wait_for(|m| m.state.is_leader()))
        .await
        .expect("the member leads")
        .unwrap();
}

/// `promtool check metrics` on an exposition; panics with promtool's complaint.
pub fn promtool_check(text: &str) {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian `prometheus`) is installed by scripts/test");
    lint.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A client of `a`'s API holding a fresh token with every operator grant (bootstrapping
/// the region for operator `name` if nobody has). The token is named `name` plus a
/// sequence number, so every client a test makes is its own principal.
pub async fn operator(a: &Authority, name: &str) -> waymark_agent::api_client::ApiClient {
    let token = operator_token(a, name).await;
    a.api_client(Some(token))
}

/// The bearer token [`operator`] holds (for the CLI's `--token`).
pub async fn operator_token(a: &Authority, name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let token_name = format!("{name}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    waymark_agent::authority::credentials::operator_token(
        a.raft(),
        name,
        &token_name,
        Duration::from_secs(86_400),
    )
    .await
    .unwrap()
}

/// The value of `series` (name and labels exactly as exposed) in a Prometheus text
/// exposition; 0 when absent.
pub fn series_value(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// `GET /metrics` through `api`, which must be allowed to read it.
pub async fn metrics_text(api: &waymark_agent::api_client::ApiClient) -> String {
    let r = api
        .send(http::Method::GET, "/metrics", None)
        .await
        .expect("the metrics answer");
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(r.status.is_success(), "{}: {text}", r.status);
    text
}

/// Waits until `series` read through `api` reaches `want`, and asserts it went no
/// further (a refusal is counted as the server's task ends, just after the client saw it).
pub async fn counted(api: &waymark_agent::api_client::ApiClient, series: &str, want: u64) {
    let what = format!("{series} to reach {want}");
    let got = waymark_testkit::until(&what, Duration::from_secs(60), async || {
        let got = series_value(&metrics_text(api).await, series);
        if got >= want { Ok(got) } else { Err(got) }
    })
    .await;
    assert_eq!(got, want, "{series}");
}

/// Sends a request and returns (status, body as JSON; `null` when it is not JSON).
pub async fn call(
    api: &waymark_agent::api_client::ApiClient,
    method: http::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (http::StatusCode, serde_json::Value) {
    let r = api.send(method, path, body.as_ref()).await.unwrap();
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null),
    )
}

/// A refusal's `error.reason` (empty when there is none).
pub fn reason(v: &serde_json::Value) -> &str {
    v["error"]["reason"].as_str().unwrap_or_default()
}
