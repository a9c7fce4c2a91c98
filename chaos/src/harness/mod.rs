//! The shell that runs real processes for the drills: each child has its own log file in
//! the run directory, is waited on through real signals (HTTP readiness, Envoy's admin API)
//! with deadlines, and is killed when its handle is dropped.
//!
//! What exists: [`authority::AuthorityProc`] (one `waymark authority` member),
//! [`cluster::AuthorityCluster`] (a multi-member authority: leader, kill, restart),
//! [`registrar::Registrar`] (registration load through the authority's API, every attempt
//! recorded), [`xds_watch::VersionWatch`] (Delta xDS subscribers recording every version),
//! [`agent::AgentProc`] (one `waymark agent`), [`envoy::EnvoyProc`] (a real Envoy fed by
//! the agent over Delta ADS) and [`backends::DemoFleet`] (the dev region's demo backends,
//! run in this process on real sockets and registered with the authority); [`evidence`]
//! adds a region whose evidence paths are real (mutual TLS, ingest, gossip, probes, LRS);
//! [`fleet`] is the synthetic fleet for scale (a multi-zone authority, registered instances
//! and thousands of Delta xDS subscribers).

pub mod agent;
pub mod authority;
pub mod backends;
pub mod callers;
pub mod cluster;
pub mod configs;
pub mod envoy;
pub mod evidence;
pub mod fleet;
pub mod netns;
pub mod region;
pub mod registrar;
pub mod xds_watch;

use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;

use crate::traffic;

/// How often [`wait_until`] looks again.
pub const POLL: Duration = Duration::from_millis(100);

/// A port nothing listens on now, over TCP or UDP (the probes are dropped before
/// returning), for a child process to bind moments later.
///
/// Taken below the kernel's ephemeral range: a port the kernel hands out (`:0`) can be
/// handed out again as the source port of any outgoing connection — a drill makes
/// hundreds — between this check and the child's bind, which then fails. Ports are taken
/// in turn from an offset that differs per process, so a drill never reuses one it gave
/// out. Falls back to an ephemeral port if none in the range is free.
pub fn free_port() -> anyhow::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    /// Below Linux's default ephemeral range (32768–60999) and above the well-known ports.
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..256 {
        let port = u16::try_from(LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN)?;
        let free = TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if free {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")
        .context("binding a probe port")?
        .local_addr()?
        .port())
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The `waymark` binary: `WAYMARK_BIN`, else next to the running executable (or one folder
/// up, where a test binary in `target/<profile>/deps` finds it).
pub fn waymark_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("WAYMARK_BIN").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        anyhow::ensure!(p.is_file(), "WAYMARK_BIN={} is not a file", p.display());
        return Ok(p);
    }
    let exe = std::env::current_exe().context("locating the running executable")?;
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let candidate = d.join("waymark");
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent();
    }
    anyhow::bail!(
        "no waymark binary next to {}: build it (`cargo build -p waymark-agent --bin waymark`) \
         or set WAYMARK_BIN",
        exe.display()
    )
}

/// The Envoy binary: `ENVOY_BIN` (`./scripts/install-envoy` prints its path).
pub fn envoy_bin() -> anyhow::Result<PathBuf> {
    let p = std::env::var_os("ENVOY_BIN")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .context(
            "ENVOY_BIN is not set: install Envoy with ./scripts/install-envoy, which prints \
             the binary's path",
        )?;
    anyhow::ensure!(p.is_file(), "ENVOY_BIN={} is not a file", p.display());
    Ok(p)
}

/// One child process writing stdout and stderr to `log` (appended across restarts).
/// Dropping it kills the child (SIGKILL) and reaps it.
#[derive(Debug)]
pub struct Proc {
    name: String,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// Start `program args…`, its output appended to `log`.
    pub fn spawn<I, S>(
        name: &str,
        program: &Path,
        args: I,
        envs: &[(&str, &str)],
        log: &Path,
    ) -> anyhow::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            // A fatal error is printed without anyhow's backtrace (panics keep theirs): with
            // it, a test's RUST_BACKTRACE pushed the error itself out of the log's tail.
            .env("RUST_LIB_BACKTRACE", "0");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Self {
            name: name.to_owned(),
            log: log.to_path_buf(),
            child: Some(child),
        })
    }

    /// The child's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL and reap. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            // It may have exited on its own already; either way it is gone after wait.
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Fails if the child has exited (with its log's tail).
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(c) = self.child.as_mut()
            && let Some(status) = c.try_wait()?
        {
            anyhow::bail!(
                "{} exited ({status}); log tail:\n{}",
                self.name,
                self.log_tail(30)
            );
        }
        Ok(())
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `waymark <role> --config FILE` child whose readiness is its HTTP `/readyz`: what the
/// authority and agent harnesses share (their configuration files differ, their process
/// handling does not).
#[derive(Debug)]
pub struct RoleProc {
    role: &'static str,
    bin: PathBuf,
    config: PathBuf,
    log: PathBuf,
    http: SocketAddr,
    proc: Option<Proc>,
    /// Runs the process through this command (e.g. `ip netns exec NS`); empty: directly.
    prefix: Vec<String>,
}

impl RoleProc {
    /// `waymark <role> --config <config>`, logging to `log`, ready when `http` answers
    /// `/readyz`; not started.
    pub fn new(
        role: &'static str,
        bin: &Path,
        config: PathBuf,
        log: PathBuf,
        http: SocketAddr,
    ) -> Self {
        Self {
            role,
            bin: bin.to_path_buf(),
            config,
            log,
            http,
            proc: None,
            prefix: Vec::new(),
        }
    }

    /// Run the process through `prefix` (e.g. [`netns::Netns::exec_prefix`]), which must
    /// exec the command it is given so that the child's pid is the process's own.
    pub fn with_prefix(mut self, prefix: Vec<String>) -> Self {
        self.prefix = prefix;
        self
    }

    /// Start the process (no wait).
    pub fn start(&mut self) -> anyhow::Result<()> {
        let config = self.config.display().to_string();
        let bin = self.bin.display().to_string();
        let mut argv: Vec<&str> = self.prefix.iter().map(String::as_str).collect();
        argv.extend([bin.as_str(), self.role, "--config", config.as_str()]);
        self.proc = Some(Proc::spawn(
            self.role,
            Path::new(argv[0]),
            &argv[1..],
            &[("RUST_LOG", "info")],
            &self.log,
        )?);
        Ok(())
    }

    /// Waits for `/readyz`, within `deadline`.
    pub async fn wait_ready(&mut self, deadline: Duration) -> anyhow::Result<()> {
        let what = format!("the {}'s /readyz", self.role);
        let proc = self
            .proc
            .as_mut()
            .with_context(|| format!("the {} is not running", self.role))?;
        wait_serving(proc, &what, deadline, self.http, "/readyz").await
    }

    /// The process's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(Proc::pid)
    }

    /// Whether the process was started and has not exited.
    pub fn is_running(&mut self) -> bool {
        self.proc
            .as_mut()
            .is_some_and(|p| p.check_running().is_ok())
    }

    /// SIGKILL the process.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.proc
            .as_ref()
            .map(|p| p.log_tail(n))
            .unwrap_or_default()
    }
}

/// Polls `check` every [`POLL`] until it is done (`Some`, `Ok`, `true`: see
/// [`waymark_testkit::Progress`]), failing after `deadline` with the last thing it saw.
pub async fn wait_until<P: waymark_testkit::Progress>(
    what: &str,
    deadline: Duration,
    check: impl AsyncFnMut() -> P,
) -> anyhow::Result<P::Value> {
    Ok(waymark_testkit::try_until(what, deadline, POLL, check).await?)
}

/// The management token every drill region starts with (`[authority.acl]`), one per
/// process: the drills' clients present it.
pub fn management_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| {
        waymark_agent::authority::credentials::generate("waymark-drill")
            .expect("waymark-drill is a valid token name")
    })
}

/// The authority APIs the drills reach over TLS: address → a client config trusting the
/// rig's bundle. A rig whose authority has `[authority.tls]` (and so serves its API over
/// TLS) registers it with [`api_over_tls`] when it writes the configuration; every client
/// of that address here ([`api_client`], [`http_ok`], [`get_api`]) then speaks TLS.
static TLS_APIS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<SocketAddr, std::sync::Arc<rustls::ClientConfig>>>,
> = std::sync::LazyLock::new(Default::default);

/// The API at `addr` is TLS; its server is checked against `bundle`.
pub fn api_over_tls(addr: SocketAddr, bundle: &Path) -> anyhow::Result<()> {
    use waymark_agent::cli::tls::{ClientFiles, api_client_config};
    let files = ClientFiles {
        bundle: bundle.to_path_buf(),
        identity: None,
    };
    let config = api_client_config(&files, std::time::SystemTime::now())?;
    TLS_APIS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(addr, config);
    Ok(())
}

/// The node agent's local API at `addr` is TLS (it listens off loopback); its server is
/// checked against `bundle` as a node agent.
pub fn agent_api_over_tls(addr: SocketAddr, bundle: &Path) -> anyhow::Result<()> {
    let config = waymark_agent::cli::tls::agent_api_client_config(bundle)?;
    TLS_APIS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(addr, config);
    Ok(())
}

/// The TLS client config for the API at `addr`, if it is one [`api_over_tls`] named.
pub fn api_tls(addr: SocketAddr) -> Option<std::sync::Arc<rustls::ClientConfig>> {
    TLS_APIS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&addr)
        .cloned()
}

/// An API client of the authority at `addr` presenting `token`, over TLS when the API is.
pub fn api_client_with(
    addr: SocketAddr,
    token: Option<String>,
) -> waymark_agent::api_client::ApiClient {
    let client = waymark_agent::api_client::ApiClient::new(&addr.to_string(), token);
    match api_tls(addr) {
        Some(tls) => client.with_tls(tls),
        None => client,
    }
}

/// An API client of the authority at `addr`, presenting [`management_token`].
pub fn api_client(addr: SocketAddr) -> waymark_agent::api_client::ApiClient {
    api_client_with(addr, Some(management_token().to_owned()))
}

/// True when `GET path` on `addr` answers 200 within a second.
pub async fn http_ok(addr: SocketAddr, path: &str) -> bool {
    let timeout = Duration::from_secs(1);
    if api_tls(addr).is_some() {
        return api_client_with(addr, None)
            .with_timeout(timeout)
            .send(http::Method::GET, path, None)
            .await
            .is_ok_and(|r| r.status == 200);
    }
    traffic::get(addr, path, timeout)
        .await
        .is_ok_and(|r| r.status == 200)
}

/// [`traffic::get`] of an authority API route, presenting the drills' management token.
pub async fn get_api(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<traffic::Response, traffic::GetError> {
    let token = management_token();
    if api_tls(addr).is_some() {
        let answer = api_client(addr)
            .with_timeout(timeout)
            .send(http::Method::GET, path, None)
            .await
            .map_err(|e| {
                if e.to_string().contains("no answer within") {
                    traffic::GetError::Timeout
                } else {
                    traffic::GetError::Connect(std::io::Error::other(format!("{e:#}")))
                }
            })?;
        return Ok(traffic::Response {
            status: answer.status.as_u16(),
            body: String::from_utf8_lossy(&answer.body).into_owned(),
        });
    }
    traffic::get_with(addr, path, timeout, Some(token)).await
}

/// Waits until `GET path` on `addr` answers 200, failing at once (with the log's tail) if
/// `proc` exits first, or after `deadline`.
pub async fn wait_serving(
    proc: &mut Proc,
    what: &str,
    deadline: Duration,
    addr: SocketAddr,
    path: &str,
) -> anyhow::Result<()> {
    wait_until(what, deadline, async || {
        if let Err(e) = proc.check_running() {
            return Some(Err(e));
        }
        http_ok(addr, path).await.then_some(Ok(()))
    })
    .await?
}
