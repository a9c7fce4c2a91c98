//! The proxyless gRPC peers and the server they dial: what `grpc_proxyless.rs` drives.
//!
//! - [`Peer`]: a peer process, its stdout read line by line, its stderr kept for failure
//!   messages, killed when dropped;
//! - [`GrpcBackend`]: `proxyless/backend.py`, a gRPC server answering
//!   `/waymark.test.Echo/Who` with its name;
//! - [`GrpcClient`]: a [`Caller`] dialling `xds:///pay`, one output line per answer:
//!   `proxyless/client.py` under Python `grpcio`, or its twin `proxyless/client.js` under
//!   Node's `@grpc/grpc-js-xds` (same flags, same output, plus `soak` and `sweep`);
//! - [`ControlPlane`]: our ADS server on a loopback port, publishing the views a test
//!   releases, and its per-client sync state.
//!
//! Synchronisation is on process output and exit, plus bounded polls of the server's sync
//! state where the client's ACK is the only signal; never fixed sleeps.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;
use waymark_core::view::ReleasedView;
use waymark_testkit::try_until;
use waymark_xds::sync::ClientSync;
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT, TYPE_LISTENER, TYPE_ROUTE};
use waymark_xds::{Keepalive, Publisher, ServerConfig, SnapshotBuilder, XdsServer};

/// How long one step (a process starting, a round of calls, an ACK) may take. Generous:
/// CI compiles on the same two cores.
pub const PATIENCE: Duration = Duration::from_secs(30);
/// The budget `client.py` gets for connecting and for each round of calls: shorter than
/// [`PATIENCE`], so a client that cannot connect says so (and why) before we stop waiting.
pub const CLIENT_BUDGET: Duration = Duration::from_secs(20);
/// How often a poll of the server's sync state looks again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How many lines of a peer's stderr go into a failure message.
pub const STDERR_TAIL_LINES: usize = 60;
/// Every type a proxyless client subscribes to, in the order it asks.
pub const ALL_TYPES: [&str; 4] = [TYPE_LISTENER, TYPE_ROUTE, TYPE_CLUSTER, TYPE_ENDPOINT];

// === the peers ===

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A peer's script in `xds-edge/tests/proxyless/`, from whichever crate's tests include
/// this support (the agent's too).
pub fn script(name: &str) -> PathBuf {
    workspace_root().join("xds-edge/tests/proxyless").join(name)
}

pub fn missing_python_message(what: &str) -> String {
    format!(
        "this test needs Python with the pinned grpcio, and {what}. Install it with \
         `./scripts/install-test-peers` from the workspace root (it prints the interpreter's \
         path), or point WAYMARK_PYTHON at one: \
         WAYMARK_PYTHON=$(./scripts/install-test-peers | tail -1) cargo test -p waymark-xds \
         --test integration grpc_proxyless::"
    )
}

/// The interpreter: `WAYMARK_PYTHON`, else the workspace's `.venv`. Panics with the
/// install command if it is missing or cannot import grpcio: never a silent skip.
pub async fn python() -> PathBuf {
    let env: Option<OsString> = std::env::var_os("WAYMARK_PYTHON").filter(|p| !p.is_empty());
    let path = env
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    if !path.is_file() {
        panic!(
            "{}",
            missing_python_message(&format!("there is no {}", path.display()))
        );
    }
    let out = Command::new(&path)
        .args(["-c", "import grpc, grpc_health.v1.health"])
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{}",
                missing_python_message(&format!("{} does not run: {e}", path.display()))
            )
        });
    if !out.status.success() {
        panic!(
            "{}",
            missing_python_message(&format!(
                "{} cannot import grpcio: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        );
    }
    path
}

/// Where grpc-js-xds is installed: the directory holding its `node_modules`, and the
/// `node` that runs `client.js` against it.
pub struct NodeXds {
    pub node: PathBuf,
    pub modules: PathBuf,
}

pub fn missing_node_message(what: &str) -> String {
    format!(
        "this test needs Node.js with the pinned @grpc/grpc-js-xds, and {what}. Install it \
         with `./scripts/install-test-peers` from the workspace root: it runs npm ci in \
         xds-edge/tests/proxyless/node/, where this test looks unless WAYMARK_NODE_XDS names \
         another directory whose node_modules holds it. Then: \
         eval \"$(./scripts/install-test-peers --env)\"; cargo test -p waymark-xds \
         --test integration grpc_js_xds::"
    )
}

/// grpc-js-xds: `WAYMARK_NODE_XDS`, else `xds-edge/tests/proxyless/node`, run by the `node`
/// on `PATH`. Panics with the install command if either is missing or the modules do not
/// load: never a silent skip.
pub async fn node_xds() -> NodeXds {
    let env: Option<OsString> = std::env::var_os("WAYMARK_NODE_XDS").filter(|p| !p.is_empty());
    let dir = env
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("xds-edge/tests/proxyless/node"));
    let modules = dir.join("node_modules");
    let manifest = modules.join("@grpc/grpc-js-xds/package.json");
    if !manifest.is_file() {
        panic!(
            "{}",
            missing_node_message(&format!("there is no {}", manifest.display()))
        );
    }
    let node = PathBuf::from("node");
    let out = Command::new(&node)
        .env("NODE_PATH", &modules)
        .args(["-e", "require('@grpc/grpc-js-xds').register()"])
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{}",
                missing_node_message(&format!("`node` (from PATH) does not run: {e}"))
            )
        });
    if !out.status.success() {
        panic!(
            "{}",
            missing_node_message(&format!(
                "{} does not load: {}",
                modules.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        );
    }
    NodeXds { node, modules }
}

/// A proxyless client program: `client.py` under a Python with grpcio, or `client.js`
/// under Node with grpc-js-xds. Both take the same flags and print the same lines.
pub struct Caller {
    what: &'static str,
    program: PathBuf,
    script: PathBuf,
    env: Vec<(&'static str, OsString)>,
}

impl Caller {
    pub fn grpcio(python: &Path) -> Caller {
        Caller {
            what: "grpc client",
            program: python.to_path_buf(),
            script: script("client.py"),
            env: Vec::new(),
        }
    }

    pub fn grpc_js_xds(node: &NodeXds) -> Caller {
        Caller {
            what: "grpc-js-xds client",
            program: node.node.clone(),
            script: script("client.js"),
            env: vec![("NODE_PATH", node.modules.clone().into_os_string())],
        }
    }
}

/// A peer process: its stdout read line by line, its stderr kept for failure messages,
/// killed when dropped.
pub struct Peer {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<String>>,
    stderr_task: JoinHandle<()>,
}

impl Peer {
    /// Start `command` (program, arguments and environment set) as the peer `what`.
    pub fn spawn(mut command: Command, what: &str) -> Peer {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = Arc::clone(&stderr);
        let stderr_task = tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Peer {
            what: what.to_owned(),
            stdin: child.stdin.take(),
            child,
            stdout,
            stderr,
            stderr_task,
        }
    }

    fn stderr_tail(&self) -> String {
        let all = self.stderr.lock().unwrap();
        let lines: Vec<&str> = all.lines().collect();
        lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join("\n")
    }

    /// Fail the test with `msg`, this peer's stderr and (when given) our server's view of
    /// its clients.
    pub fn fail(&self, msg: &str, cp: Option<&ControlPlane>) -> ! {
        let sync = cp.map(|cp| format!("{:#?}", cp.server.sync_state()));
        panic!(
            "{}: {msg}\n--- its stderr (last {STDERR_TAIL_LINES} lines; WAYMARK_GRPC_DEBUG=1 \
             adds grpc's xds_client trace) ---\n{}\n--- our server's sync state ---\n{}",
            self.what,
            self.stderr_tail(),
            sync.unwrap_or_else(|| "(n/a)".into())
        );
    }

    /// The next line of stdout.
    pub async fn line(&mut self, cp: Option<&ControlPlane>) -> String {
        self.line_within(PATIENCE, cp).await
    }

    /// The next line of stdout, waiting at most `patience` for it.
    pub async fn line_within(&mut self, patience: Duration, cp: Option<&ControlPlane>) -> String {
        match tokio::time::timeout(patience, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => {
                let status = self.child.wait().await.unwrap();
                self.fail(&format!("exited ({status}) before the next line"), cp)
            }
            Ok(Err(e)) => self.fail(&format!("reading stdout: {e}"), cp),
            Err(_) => self.fail(&format!("no output line within {patience:?}"), cp),
        }
    }

    /// Fail unless the process is still running.
    pub fn assert_running(&mut self, cp: Option<&ControlPlane>) {
        match self.child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => self.fail(&format!("exited ({status})"), cp),
            Err(e) => self.fail(&format!("cannot tell whether it runs: {e}"), cp),
        }
    }

    pub async fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    /// Close stdin (the peer's cue to exit) and wait for its exit code.
    pub async fn finish(mut self, cp: Option<&ControlPlane>) -> i32 {
        drop(self.stdin.take());
        match tokio::time::timeout(PATIENCE, self.child.wait()).await {
            Ok(status) => {
                // Its stderr is complete once it has exited and the pipe drained.
                let _ = tokio::time::timeout(PATIENCE, &mut self.stderr_task).await;
                status.unwrap().code().unwrap_or(-1)
            }
            Err(_) => self.fail(&format!("did not exit within {PATIENCE:?}"), cp),
        }
    }
}

/// A `backend.py` on a kernel-chosen loopback port.
pub struct GrpcBackend {
    pub name: String,
    pub addr: SocketAddr,
    _peer: Peer,
}

impl GrpcBackend {
    pub async fn start(python: &Path, name: &str) -> GrpcBackend {
        let mut command = Command::new(python);
        command.arg(script("backend.py")).args([name, "0"]);
        let mut peer = Peer::spawn(command, &format!("backend {name}"));
        let line = peer.line(None).await;
        let Some(port) = line
            .strip_prefix("ready ")
            .and_then(|p| p.parse::<u16>().ok())
        else {
            peer.fail(&format!("expected `ready <port>`, got {line:?}"), None)
        };
        GrpcBackend {
            name: name.to_owned(),
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            _peer: peer,
        }
    }
}

/// A [`Caller`] dialling `xds:///pay` through our server.
pub struct GrpcClient {
    pub peer: Peer,
}

/// One round of calls: how many each backend answered, and every failure's line.
#[derive(Debug, Default)]
pub struct Round {
    pub answers: BTreeMap<String, usize>,
    pub errors: Vec<String>,
    /// For a soak: how long it called and how many outlier-detection sweeps ran meanwhile,
    /// as the client measured them (`soaked MS SWEEPS`).
    pub soaked: Option<(Duration, usize)>,
}

impl Round {
    /// Calls answered, by any backend.
    pub fn answered(&self) -> usize {
        self.answers.values().sum()
    }
}

impl GrpcClient {
    /// Start `caller` as the client `node_id` that makes `calls` calls once connected, then
    /// (if `interactive`) waits for more commands. Returns once its channel is ready.
    pub async fn start(
        caller: &Caller,
        cp: &ControlPlane,
        node_id: &str,
        calls: usize,
        interactive: bool,
    ) -> GrpcClient {
        Self::start_at(
            caller,
            cp.addr.port(),
            Some(cp),
            node_id,
            calls,
            interactive,
        )
        .await
    }

    /// [`GrpcClient::start`] against any ADS server on loopback port `ads_port` (a node
    /// agent, say); `cp`, when it is ours, adds its sync state to failure messages.
    pub async fn start_at(
        caller: &Caller,
        ads_port: u16,
        cp: Option<&ControlPlane>,
        node_id: &str,
        calls: usize,
        interactive: bool,
    ) -> GrpcClient {
        let mut command = Command::new(&caller.program);
        command.envs(caller.env.iter().cloned());
        command.arg(&caller.script).args([
            "--ads-port",
            &ads_port.to_string(),
            "--node-id",
            node_id,
            "--region",
            "eu",
            "--zone",
            "zone-a",
            "--calls",
            &calls.to_string(),
            "--timeout",
            &CLIENT_BUDGET.as_secs().to_string(),
        ]);
        if interactive {
            command.arg("--interactive");
        }
        let peer = Peer::spawn(command, &format!("{} {node_id}", caller.what));
        let mut client = GrpcClient { peer };
        let line = client.line(PATIENCE, cp).await;
        if line != "ready" {
            // If every type below shows as ACKed, grpc accepted our resources but found no
            // endpoint it will use: it ACKs, then drops, a locality without a non-zero
            // `load_balancing_weight` (its xds_endpoint_parser.cc: "If LB weight is not
            // specified or 0, it means this locality is assigned no load").
            client.peer.fail(
                &format!(
                    "its channel to xds:///pay never became ready: {line:?} (all types \
                     ACKed means grpc took our resources but found no usable endpoint; \
                     WAYMARK_GRPC_DEBUG=1 shows what it parsed)"
                ),
                cp,
            );
        }
        client
    }

    /// The next line that is not a `sweep N`: `client.js` prints one whenever its outlier
    /// detection's timer runs, between any two other lines; a soak counts them itself.
    async fn line<'c>(
        &mut self,
        patience: Duration,
        cp: impl Into<Option<&'c ControlPlane>> + Copy,
    ) -> String {
        loop {
            let line = self.peer.line_within(patience, cp.into()).await;
            if !line.starts_with("sweep ") {
                return line;
            }
        }
    }

    /// Read one round's lines, up to and including `round OK ERR`.
    pub async fn read_round<'c>(
        &mut self,
        cp: impl Into<Option<&'c ControlPlane>> + Copy,
    ) -> Round {
        self.read_round_within(PATIENCE, cp).await
    }

    async fn read_round_within<'c>(
        &mut self,
        patience: Duration,
        cp: impl Into<Option<&'c ControlPlane>> + Copy,
    ) -> Round {
        let mut round = Round::default();
        loop {
            let line = self.line(patience, cp).await;
            if let Some(name) = line.strip_prefix("answer ") {
                *round.answers.entry(name.to_owned()).or_insert(0) += 1;
            } else if let Some((name, n)) = line
                .strip_prefix("tally ")
                .and_then(|t| t.rsplit_once(' '))
                .and_then(|(name, n)| Some((name, n.parse::<usize>().ok()?)))
            {
                *round.answers.entry(name.to_owned()).or_insert(0) += n;
            } else if let Some((ms, sweeps)) = line
                .strip_prefix("soaked ")
                .and_then(|t| t.split_once(' '))
                .and_then(|(ms, n)| Some((ms.parse::<u64>().ok()?, n.parse::<usize>().ok()?)))
            {
                round.soaked = Some((Duration::from_millis(ms), sweeps));
            } else if line.starts_with("error ") {
                round.errors.push(line);
            } else if line.starts_with("round ") {
                return round;
            } else {
                self.peer
                    .fail(&format!("unexpected output line {line:?}"), cp.into());
            }
        }
    }

    pub async fn calls<'c>(
        &mut self,
        cp: impl Into<Option<&'c ControlPlane>> + Copy,
        n: usize,
    ) -> Round {
        self.peer.send(&format!("calls {n}")).await;
        self.read_round(cp).await
    }

    /// (`client.js` only.) Calls without a break (about 200 a second) until at least
    /// `at_least` has passed and the client's outlier detection has run its timer `sweeps`
    /// more times. The client ends a soak that has not seen them by three times `at_least`
    /// with an error line; we wait that long plus [`PATIENCE`] for its last line.
    pub async fn soak<'c>(
        &mut self,
        cp: impl Into<Option<&'c ControlPlane>> + Copy,
        at_least: Duration,
        sweeps: usize,
    ) -> Round {
        self.peer
            .send(&format!("soak {} {sweeps}", at_least.as_secs()))
            .await;
        self.read_round_within(3 * at_least + PATIENCE, cp).await
    }

    pub fn assert_no_errors<'c>(&self, round: &Round, cp: impl Into<Option<&'c ControlPlane>>) {
        if !round.errors.is_empty() {
            self.peer
                .fail(&format!("calls failed: {:#?}", round.errors), cp.into());
        }
    }
}

// === our server ===

pub struct ControlPlane {
    pub addr: SocketAddr,
    pub server: XdsServer,
    publisher: Publisher,
    builder: SnapshotBuilder,
    task: JoinHandle<()>,
}

impl ControlPlane {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (server, publisher) = XdsServer::new(ServerConfig::default());
        let serving = server.clone();
        let task = tokio::spawn(async move {
            serving
                .serve(listener, Keepalive::default(), std::future::pending())
                .await;
        });
        let builder = SnapshotBuilder::new();
        publisher.publish(builder.build());
        Self {
            addr,
            server,
            publisher,
            builder,
            task,
        }
    }

    pub fn publish(&mut self, view: ReleasedView) {
        assert!(
            self.builder.handle_release(&view),
            "versions only move forward"
        );
        self.publisher.publish(self.builder.build());
    }

    pub fn client(&self, node_id: &str) -> Option<ClientSync> {
        self.server
            .sync_state()
            .into_iter()
            .find(|c| c.node_id == node_id)
    }

    /// Wait (bounded poll) until `node_id` has acknowledged everything we sent it of all
    /// four types, with EDS at view `eds_version`; panics with the sync state if not, or at
    /// once on any NACK.
    pub async fn wait_synced(&self, node_id: &str, eds_version: u64, client: &GrpcClient) {
        let eds_version = eds_version.to_string();
        let what = format!("{node_id} to ACK all four types");
        let synced = try_until(&what, PATIENCE, POLL_INTERVAL, async || {
            let c = self.client(node_id)?;
            if let Some((t, nack)) = c
                .types
                .iter()
                .find_map(|(t, s)| s.last_nack.as_ref().map(|n| (t, n)))
            {
                client.peer.fail(
                    &format!("it rejected (NACKed) our {t}: {nack:?}"),
                    Some(self),
                );
            }
            let synced = ALL_TYPES.iter().all(|t| {
                c.types
                    .get(*t)
                    .is_some_and(|s| s.sent.is_some() && s.acked == s.sent)
            });
            (synced && c.types[TYPE_ENDPOINT].acked.as_deref() == Some(eds_version.as_str()))
                .then_some(())
        })
        .await;
        if synced.is_err() {
            client.peer.fail(
                &format!(
                    "not subscribed to and ACKing all of LDS, RDS, CDS and EDS \
                     (EDS at version {eds_version}) within {PATIENCE:?}"
                ),
                Some(self),
            );
        }
    }

    pub fn nacks(&self) -> u64 {
        self.server
            .stats()
            .nacks
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.task.abort();
    }
}
