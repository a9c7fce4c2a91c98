//! Our ADS server against a second, independent xDS client: Python `grpcio` (pinned by
//! `./scripts/install-test-peers`) dialling `xds:///pay`, with no Envoy in between.
//!
//! grpcio's xDS resolver needs more than CDS and EDS: it starts from the Listener named
//! after the target (LDS), follows its connection manager to a RouteConfiguration (RDS),
//! and only then asks for the Cluster and its ClusterLoadAssignment. This test proves that
//! the minimal listener and route we serve for that case are enough, and that the client
//! accepts (ACKs) every resource we send it.
//!
//! Peers (in `tests/proxyless/`): `backend.py` is a gRPC server that answers
//! `/waymark.test.Echo/Who` with its own name; `client.py` writes a gRPC xDS bootstrap
//! naming our server and calls that method through `xds:///pay`, one output line per
//! answer. The test judges from their output and from our server's `sync_state()`.
//!
//! Synchronisation is on process output and exit, plus bounded polls of the server's sync
//! state where the client's ACK is the only signal; never fixed sleeps.

// Test helpers outside #[test] functions unwrap too: a panic is how a test reports.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::views;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;
use waymark_core::view::{EndpointStatus, Markers, ReleasedView};
use waymark_testkit::try_until;
use waymark_xds::sync::ClientSync;
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT, TYPE_LISTENER, TYPE_ROUTE};
use waymark_xds::{Keepalive, Publisher, ServerConfig, SnapshotBuilder, XdsServer};

/// How long one step (a process starting, a round of calls, an ACK) may take. Generous:
/// CI compiles on the same two cores.
const PATIENCE: Duration = Duration::from_secs(30);
/// The budget `client.py` gets for connecting and for each round of calls: shorter than
/// [`PATIENCE`], so a client that cannot connect says so (and why) before we stop waiting.
const CLIENT_BUDGET: Duration = Duration::from_secs(20);
/// How often a poll of the server's sync state looks again.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How many lines of a peer's stderr go into a failure message.
const STDERR_TAIL_LINES: usize = 60;
/// Every type a proxyless client subscribes to, in the order it asks.
const ALL_TYPES: [&str; 4] = [TYPE_LISTENER, TYPE_ROUTE, TYPE_CLUSTER, TYPE_ENDPOINT];

// === the Python peers ===

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/proxyless")
        .join(name)
}

fn missing_python_message(what: &str) -> String {
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
async fn python() -> PathBuf {
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

/// A Python peer: its stdout read line by line, its stderr kept for failure messages,
/// killed when dropped.
struct Peer {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<String>>,
    stderr_task: JoinHandle<()>,
}

impl Peer {
    fn spawn(python: &Path, what: &str, args: &[String]) -> Peer {
        let mut child = Command::new(python)
            .args(args)
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
    fn fail(&self, msg: &str, cp: Option<&ControlPlane>) -> ! {
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
    async fn line(&mut self, cp: Option<&ControlPlane>) -> String {
        match tokio::time::timeout(PATIENCE, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => {
                let status = self.child.wait().await.unwrap();
                self.fail(&format!("exited ({status}) before the next line"), cp)
            }
            Ok(Err(e)) => self.fail(&format!("reading stdout: {e}"), cp),
            Err(_) => self.fail(&format!("no output line within {PATIENCE:?}"), cp),
        }
    }

    async fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    /// Close stdin (the peer's cue to exit) and wait for its exit code.
    async fn finish(mut self, cp: Option<&ControlPlane>) -> i32 {
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
struct GrpcBackend {
    name: String,
    addr: SocketAddr,
    _peer: Peer,
}

impl GrpcBackend {
    async fn start(python: &Path, name: &str) -> GrpcBackend {
        let mut peer = Peer::spawn(
            python,
            &format!("backend {name}"),
            &[
                script("backend.py").display().to_string(),
                name.into(),
                "0".into(),
            ],
        );
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

/// A `client.py` dialling `xds:///pay` through our server.
struct GrpcClient {
    peer: Peer,
}

/// One round of calls: how many each backend answered, and every failure's line.
#[derive(Debug, Default)]
struct Round {
    answers: BTreeMap<String, usize>,
    errors: Vec<String>,
}

impl GrpcClient {
    /// Start a client with `node_id` that makes `calls` calls once connected, then (if
    /// `interactive`) waits for more commands. Returns once its channel is ready.
    async fn start(
        python: &Path,
        cp: &ControlPlane,
        node_id: &str,
        calls: usize,
        interactive: bool,
    ) -> GrpcClient {
        let mut args = vec![
            script("client.py").display().to_string(),
            "--ads-port".into(),
            cp.addr.port().to_string(),
            "--node-id".into(),
            node_id.into(),
            "--region".into(),
            "eu".into(),
            "--zone".into(),
            "zone-a".into(),
            "--calls".into(),
            calls.to_string(),
            "--timeout".into(),
            CLIENT_BUDGET.as_secs().to_string(),
        ];
        if interactive {
            args.push("--interactive".into());
        }
        let mut peer = Peer::spawn(python, &format!("grpc client {node_id}"), &args);
        let line = peer.line(Some(cp)).await;
        if line != "ready" {
            // If every type below shows as ACKed, grpc accepted our resources but found no
            // endpoint it will use: it ACKs, then drops, a locality without a non-zero
            // `load_balancing_weight` (its xds_endpoint_parser.cc: "If LB weight is not
            // specified or 0, it means this locality is assigned no load").
            peer.fail(
                &format!(
                    "its channel to xds:///pay never became ready: {line:?} (all types \
                     ACKed means grpc took our resources but found no usable endpoint; \
                     WAYMARK_GRPC_DEBUG=1 shows what it parsed)"
                ),
                Some(cp),
            );
        }
        GrpcClient { peer }
    }

    /// Read one round's lines, up to and including `round OK ERR`.
    async fn read_round(&mut self, cp: &ControlPlane) -> Round {
        let mut round = Round::default();
        loop {
            let line = self.peer.line(Some(cp)).await;
            if let Some(name) = line.strip_prefix("answer ") {
                *round.answers.entry(name.to_owned()).or_insert(0) += 1;
            } else if line.starts_with("error ") {
                round.errors.push(line);
            } else if line.starts_with("round ") {
                return round;
            } else {
                self.peer
                    .fail(&format!("unexpected output line {line:?}"), Some(cp));
            }
        }
    }

    async fn calls(&mut self, cp: &ControlPlane, n: usize) -> Round {
        self.peer.send(&format!("calls {n}")).await;
        self.read_round(cp).await
    }

    fn assert_no_errors(&self, round: &Round, cp: &ControlPlane) {
        if !round.errors.is_empty() {
            self.peer
                .fail(&format!("calls failed: {:#?}", round.errors), Some(cp));
        }
    }
}

// === our server ===

struct ControlPlane {
    addr: SocketAddr,
    server: XdsServer,
    publisher: Publisher,
    builder: SnapshotBuilder,
    task: JoinHandle<()>,
}

impl ControlPlane {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (server, publisher) = XdsServer::new(ServerConfig::default());
        let serving = server.clone();
        let task = tokio::spawn(async move {
            serving
                .serve(listener, Keepalive::default(), std::future::pending())
                .await
                .unwrap();
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

    fn publish(&mut self, view: ReleasedView) {
        assert!(
            self.builder.handle_release(&view),
            "versions only move forward"
        );
        self.publisher.publish(self.builder.build());
    }

    fn client(&self, node_id: &str) -> Option<ClientSync> {
        self.server
            .sync_state()
            .into_iter()
            .find(|c| c.node_id == node_id)
    }

    /// Wait (bounded poll) until `node_id` has acknowledged everything we sent it of all
    /// four types, with EDS at view `eds_version`; panics with the sync state if not, or at
    /// once on any NACK.
    async fn wait_synced(&self, node_id: &str, eds_version: u64, client: &GrpcClient) {
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

    fn nacks(&self) -> u64 {
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

/// The view of `pay` for callers in `zone-a`: `backends`, all eligible, in that zone.
fn released(version: u64, backends: &[&GrpcBackend]) -> ReleasedView {
    let endpoints = backends
        .iter()
        .map(|b| views::endpoint(&b.name, b.addr, "zone-a", 0, 100, EndpointStatus::Eligible));
    views::released(version, "zone-a", endpoints, Markers::default())
}

#[tokio::test]
async fn grpcio_resolves_xds_target_balances_and_follows_a_withdrawal() {
    let python = python().await;
    let a = GrpcBackend::start(&python, "pay-a").await;
    let b = GrpcBackend::start(&python, "pay-b").await;
    let mut cp = ControlPlane::start().await;
    cp.publish(released(1, &[&a, &b]));

    // One long-lived client: LDS → RDS → CDS → EDS, then round robin over both backends.
    let node = "grpc-proxyless-live";
    let mut client = GrpcClient::start(&python, &cp, node, 20, true).await;
    let first = client.read_round(&cp).await;
    client.assert_no_errors(&first, &cp);
    assert!(
        first.answers.get("pay-a").is_some_and(|n| *n >= 5)
            && first.answers.get("pay-b").is_some_and(|n| *n >= 5),
        "20 calls should be spread over both backends (round robin): {:?}",
        first.answers
    );

    // It subscribed to all four types over ADS and acknowledged each; nothing was rejected.
    cp.wait_synced(node, 1, &client).await;
    let sync = cp.client(node).unwrap();
    let types: Vec<&str> = sync.types.keys().map(String::as_str).collect();
    for t in ALL_TYPES {
        assert!(
            types.contains(&t),
            "{node} never subscribed to {t}: {sync:#?}"
        );
        assert_eq!(sync.types[t].nacks, 0, "{sync:#?}");
        assert_eq!(sync.types[t].resources, 1, "one {t} for pay: {sync:#?}");
    }

    // Withdraw pay-b (it keeps running, so only the withdrawal can stop its traffic). Once
    // the client has ACKed the new assignment, its balancer converges within a few calls
    // (grpc applies an update to the channel after ACKing it), then never reaches pay-b.
    cp.publish(released(2, &[&a]));
    cp.wait_synced(node, 2, &client).await;
    let mut converged = false;
    for _ in 0..20 {
        let round = client.calls(&cp, 5).await;
        client.assert_no_errors(&round, &cp);
        if !round.answers.contains_key("pay-b") {
            converged = true;
            break;
        }
    }
    assert!(converged, "calls still reach the withdrawn pay-b after 100");
    let after = client.calls(&cp, 20).await;
    client.assert_no_errors(&after, &cp);
    assert_eq!(
        after.answers,
        BTreeMap::from([("pay-a".to_owned(), 20)]),
        "after the withdrawal only pay-a answers"
    );

    // A client that connects only now sees only the current view.
    let mut fresh = GrpcClient::start(&python, &cp, "grpc-proxyless-fresh", 10, false).await;
    let round = fresh.read_round(&cp).await;
    fresh.assert_no_errors(&round, &cp);
    assert_eq!(
        round.answers,
        BTreeMap::from([("pay-a".to_owned(), 10)]),
        "a new client only reaches pay-a"
    );
    assert_eq!(
        fresh.peer.finish(Some(&cp)).await,
        0,
        "fresh client exit code"
    );

    client.peer.send("quit").await;
    assert_eq!(
        client.peer.finish(Some(&cp)).await,
        0,
        "live client exit code"
    );
    assert_eq!(cp.nacks(), 0, "no NACKs from either client");
}
