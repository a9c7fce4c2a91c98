//! `bench fanout`: how fast a withdrawal reaches every subscriber of the real ADS server,
//! and what each subscription costs the server.
//!
//! The server runs in a process of its own (`waymark-drill fanout-serve`, started by the
//! bench), so its CPU time and resident memory are the server's alone: a real
//! `waymark_xds::XdsServer` with the authority's gRPC limits (at most
//! [`STREAMS_PER_CONNECTION_MAX`] streams per HTTP/2 connection) and a `SnapshotBuilder`
//! releasing the view. The bench process opens N Delta streams multiplexed over
//! N ÷ `streams_per_connection` HTTP/2 connections (as a node agent multiplexes its
//! sidecars' subscriptions), every stream subscribed to the same service's load assignment,
//! decoding each response and ACKing it. The subscribers speak gRPC on the `h2` crate
//! directly (see [`connection`]): they share the machine's two cores with the server, so
//! the cheaper they are, the more of the fan-out's time is the server's. It then
//! publishes W withdrawals one after another and records, per withdrawal, the time until
//! every subscriber has received it.
//!
//! The limit is the same fan-out with no xDS logic at all: a plain HTTP/2 server (the `h2`
//! crate tonic itself runs on), also in a process of its own, writing identical
//! pre-encoded gRPC frames to every stream and discarding what clients send. Its clients
//! are the very same ADS clients, doing the same decoding and ACKs. The xDS server
//! is stopped and its clients dropped before the limit starts. The efficiency ratio is
//! messages per CPU-second (server and clients together) of ours over the limit's; RSS per
//! subscription is the server process's growth from before the first stream to the
//! higher of all streams current and all withdrawals delivered (what sending queued
//! counts too), divided by the streams. Each process reads its CPU time from
//! `/proc/self/stat` and its RSS from `/proc/self/status` (Linux).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use prost::Message as _;
use serde::Serialize;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, RegionName};
use waymark_core::units::Weight;
use waymark_core::view::{
    EndpointStatus, Markers, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey,
};
use waymark_xds::admission::AdmissionConfig;
use waymark_xds::server::service::DELTA_PATH;
use waymark_xds::translate::TYPE_ENDPOINT;
use waymark_xds::{Keepalive, ServerConfig, SnapshotBuilder, XdsServer};

/// The authority's limit on concurrent streams per HTTP/2 connection (its gRPC default);
/// the limit server enforces the same.
pub const STREAMS_PER_CONNECTION_MAX: usize = 64;

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Delta streams to open.
    pub subscriptions: usize,
    /// Streams multiplexed over one HTTP/2 connection (at most
    /// [`STREAMS_PER_CONNECTION_MAX`]).
    pub streams_per_connection: usize,
    /// Withdrawals to publish, one after another.
    pub withdrawals: usize,
    /// Endpoints in the view.
    pub endpoints: usize,
    /// Runs of both phases.
    pub repeats: usize,
}

impl Params {
    /// HTTP/2 connections the subscribers use.
    pub fn connections(&self) -> usize {
        self.subscriptions.div_ceil(self.streams_per_connection)
    }

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.subscriptions > 0
                && self.withdrawals > 0
                && self.endpoints > 1
                && self.repeats > 0,
            "counts must be positive (and the view needs two endpoints)"
        );
        anyhow::ensure!(
            (1..=STREAMS_PER_CONNECTION_MAX).contains(&self.streams_per_connection),
            "--streams-per-connection must be 1..={STREAMS_PER_CONNECTION_MAX} (the server's limit)"
        );
        anyhow::ensure!(self.endpoints <= 65_536, "at most 65,536 endpoints");
        Ok(())
    }
}

/// The fan-out benchmark's figures: medians over the runs, and each run.
#[derive(Debug, Clone, Serialize)]
pub struct FanoutReport {
    /// Always `"fanout"`.
    pub bench: &'static str,
    /// Delta streams open.
    pub subscriptions: usize,
    /// HTTP/2 connections carrying them.
    pub connections: usize,
    /// Streams per connection.
    pub streams_per_connection: usize,
    /// Withdrawals published per run.
    pub withdrawals: usize,
    /// Endpoints in the view.
    pub endpoints: usize,
    /// Median over runs: the median time for a withdrawal to reach every subscriber.
    pub p50_ms: f64,
    /// Median over runs of the 99th percentile of that time.
    pub p99_ms: f64,
    /// Worst of that time in any run.
    pub max_ms: f64,
    /// Median over runs of the limit's 99th percentile.
    pub limit_p99_ms: f64,
    /// Median over runs: messages delivered per CPU-second (server and clients together).
    pub messages_per_cpu_second: f64,
    /// The same for the limit.
    pub limit_messages_per_cpu_second: f64,
    /// Median over runs of `messages_per_cpu_second / limit_messages_per_cpu_second`.
    pub ratio: f64,
    /// Median over runs: the server process's resident memory per open subscription.
    pub rss_bytes_per_subscription: f64,
    /// The same for the limit's server.
    pub limit_rss_bytes_per_subscription: f64,
    /// Each run's figures (the spread).
    pub runs: Vec<RunFigures>,
}

/// One run of both phases.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    /// Median withdrawal → every subscriber.
    pub p50_ms: f64,
    /// 99th percentile of that.
    pub p99_ms: f64,
    /// Worst.
    pub max_ms: f64,
    /// The limit's 99th percentile.
    pub limit_p99_ms: f64,
    /// Messages per CPU-second, ours.
    pub messages_per_cpu_second: f64,
    /// Messages per CPU-second, the limit's.
    pub limit_messages_per_cpu_second: f64,
    /// Ours ÷ the limit's.
    pub ratio: f64,
    /// Of which the server's CPU-seconds (ours).
    pub server_cpu_s: f64,
    /// Of which the server's CPU-seconds (the limit's).
    pub limit_server_cpu_s: f64,
    /// Server RSS per subscription, ours.
    pub rss_bytes_per_subscription: f64,
    /// Server RSS per subscription, the limit's.
    pub limit_rss_bytes_per_subscription: f64,
    /// Each withdrawal's time to reach every subscriber, in order, ours.
    pub completions_ms: Vec<u64>,
}

/// Which server a `fanout-serve` process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// waymark's ADS server.
    Xds,
    /// Pre-encoded frames on plain HTTP/2.
    Limit,
}

impl ServerKind {
    fn arg(self) -> &'static str {
        match self {
            Self::Xds => "xds",
            Self::Limit => "limit",
        }
    }
}

impl std::str::FromStr for ServerKind {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "xds" => Ok(Self::Xds),
            "limit" => Ok(Self::Limit),
            other => anyhow::bail!("no fan-out server kind {other:?} (xds, limit)"),
        }
    }
}

struct Phase {
    completions: Vec<Duration>,
    cpu: Duration,
    server_cpu: Duration,
    messages: usize,
    rss_per_sub: f64,
}

/// Run the benchmark; `drill` is the `waymark-drill` executable that serves each phase.
pub async fn run(params: Params, drill: &Path) -> anyhow::Result<FanoutReport> {
    params.check()?;
    let mut runs = Vec::with_capacity(params.repeats);
    for run in 0..params.repeats {
        let ours = phase(ServerKind::Xds, params, drill)
            .await
            .context("the xDS phase")?;
        let limit = phase(ServerKind::Limit, params, drill)
            .await
            .context("the limit phase")?;
        let rate = |p: &Phase| p.messages as f64 / p.cpu.as_secs_f64().max(1e-3);
        let figures = RunFigures {
            p50_ms: percentile_ms(&ours.completions, 0.5),
            p99_ms: percentile_ms(&ours.completions, 0.99),
            max_ms: percentile_ms(&ours.completions, 1.0),
            limit_p99_ms: percentile_ms(&limit.completions, 0.99),
            messages_per_cpu_second: rate(&ours),
            limit_messages_per_cpu_second: rate(&limit),
            ratio: rate(&ours) / rate(&limit),
            server_cpu_s: ours.server_cpu.as_secs_f64(),
            limit_server_cpu_s: limit.server_cpu.as_secs_f64(),
            rss_bytes_per_subscription: ours.rss_per_sub,
            limit_rss_bytes_per_subscription: limit.rss_per_sub,
            completions_ms: ours
                .completions
                .iter()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .collect(),
        };
        eprintln!("bench fanout: run {}: {figures:?}", run + 1);
        runs.push(figures);
    }
    let median = |f: fn(&RunFigures) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(FanoutReport {
        bench: "fanout",
        subscriptions: params.subscriptions,
        connections: params.connections(),
        streams_per_connection: params.streams_per_connection,
        withdrawals: params.withdrawals,
        endpoints: params.endpoints,
        p50_ms: median(|r| r.p50_ms),
        p99_ms: median(|r| r.p99_ms),
        max_ms: runs.iter().map(|r| r.max_ms).fold(0.0, f64::max),
        limit_p99_ms: median(|r| r.limit_p99_ms),
        messages_per_cpu_second: median(|r| r.messages_per_cpu_second),
        limit_messages_per_cpu_second: median(|r| r.limit_messages_per_cpu_second),
        ratio: median(|r| r.ratio),
        rss_bytes_per_subscription: median(|r| r.rss_bytes_per_subscription),
        limit_rss_bytes_per_subscription: median(|r| r.limit_rss_bytes_per_subscription),
        runs,
    })
}

/// One phase: start its server, subscribe everyone, publish the withdrawals, tear down.
async fn phase(kind: ServerKind, params: Params, drill: &Path) -> anyhow::Result<Phase> {
    let mut server = ServerProcess::start(kind, params, drill).await?;
    let before = server.stats().await?;
    let tracker = Tracker::new(params.subscriptions, params.withdrawals + 2);
    // Set before the clients are aborted: what fails after it is only the teardown (a
    // subscriber cut off mid-ACK while its connection's tasks are being dropped).
    let stopping = Arc::new(AtomicBool::new(false));
    let mut clients = JoinSet::new();
    let spc = params.streams_per_connection;
    for c in 0..params.connections() {
        let streams = spc.min(params.subscriptions - c * spc);
        let (arrivals, addr, stopping) = (tracker.clone(), server.addr, stopping.clone());
        clients.spawn(async move {
            if let Err(e) = connection(addr, c, streams, arrivals, stopping.clone()).await
                && !stopping.load(Ordering::SeqCst)
            {
                eprintln!("fanout connection {c}: {e:#}");
            }
        });
        // Connect in batches, as reconnection admission would pace them anyway; a storm
        // of simultaneous SYNs measures the kernel's accept queue, not us.
        let opened = (c + 1) * spc;
        if opened / CONNECT_BATCH != (opened - spc) / CONNECT_BATCH {
            tracker
                .wait_for(1, opened.min(params.subscriptions))
                .await?;
        }
    }
    tracker.wait(1).await?; // everyone holds version 1
    let subscribed = server.stats().await?;
    let client_cpu0 = cpu_time();
    let mut completions = Vec::with_capacity(params.withdrawals);
    for w in 0..params.withdrawals {
        let version = w + 2;
        let start = Instant::now();
        server.publish(version).await?;
        tracker.wait(version).await?;
        completions.push(start.elapsed());
    }
    let client_cpu = cpu_time().saturating_sub(client_cpu0);
    let done = server.stats().await?;
    // Drop the clients before the server goes: a subscriber that saw its connection
    // close would report an error that is only the teardown.
    stopping.store(true, Ordering::SeqCst);
    clients.abort_all();
    while clients.join_next().await.is_some() {}
    server.stop().await?;
    let server_cpu = done.cpu.saturating_sub(subscribed.cpu);
    Ok(Phase {
        completions,
        cpu: client_cpu + server_cpu,
        server_cpu,
        messages: params.subscriptions * params.withdrawals,
        // The higher of the two: what the releases' sending queued (the allocator keeps
        // what it grew to) counts as much as the subscriptions' own state.
        rss_per_sub: subscribed.rss.max(done.rss).saturating_sub(before.rss) as f64
            / params.subscriptions as f64,
    })
}

/// One HTTP/2 connection carrying `streams` Delta subscriptions.
///
/// The subscribers speak gRPC on `h2` directly, one task per stream, rather than through
/// tonic's client: tonic adds a task per stream to pipe the request body, a channel and
/// an encoder per stream, and on this two-core machine the 60,000 simulated sidecars'
/// CPU is taken from the server under test. The work that matters is the same as any
/// xDS client's: every response is decoded whole (`DeltaDiscoveryResponse`, with its
/// resources) and ACKed with a gRPC-framed `DeltaDiscoveryRequest` carrying its nonce.
async fn connection(
    addr: SocketAddr,
    c: usize,
    streams: usize,
    tracker: Arc<Tracker>,
    stopping: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    // The receive windows hyper's client (and so tonic's) opens with: h2's own 64 KiB
    // connection window would hold a release to fifty streams back for a window update.
    let (send_request, conn) = h2::client::Builder::new()
        .initial_window_size(2 << 20)
        .initial_connection_window_size(5 << 20)
        .handshake::<_, Bytes>(tcp)
        .await?;
    let driver = tokio::spawn(conn);
    let mut subscribers = JoinSet::new();
    for s in 0..streams {
        let (send_request, tracker) = (send_request.clone(), tracker.clone());
        let stopping = stopping.clone();
        subscribers.spawn(async move {
            let node = format!("bench-{c}-{s}");
            if let Err(e) = subscriber(send_request, addr, node, tracker).await
                && !stopping.load(Ordering::SeqCst)
            {
                eprintln!("fanout subscriber {c}-{s}: {e:#}");
            }
        });
    }
    while subscribers.join_next().await.is_some() {}
    driver.abort();
    Ok(())
}

/// A sidecar's Delta subscription: subscribe, then decode and ACK every response.
async fn subscriber(
    send_request: h2::client::SendRequest<Bytes>,
    addr: SocketAddr,
    node_id: String,
    tracker: Arc<Tracker>,
) -> anyhow::Result<()> {
    let node = Node {
        id: node_id,
        locality: Some(Locality {
            zone: "zone-a".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let first = DeltaDiscoveryRequest {
        node: Some(node),
        type_url: TYPE_ENDPOINT.into(),
        resource_names_subscribe: vec!["pay".into()],
        ..Default::default()
    };
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("http://{addr}{DELTA_PATH}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(())?;
    let mut send_request = send_request.ready().await?;
    let (response, mut send) = send_request.send_request(request, false)?;
    send.send_data(grpc_frame(&first), false)?;
    let response = response.await?;
    anyhow::ensure!(
        response.status() == http::StatusCode::OK,
        "HTTP status {}",
        response.status()
    );
    let mut body = response.into_body();
    let mut buf = bytes::BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        body.flow_control().release_capacity(chunk.len())?;
        buf.extend_from_slice(&chunk);
        while let Some(message) = next_grpc_message(&mut buf)? {
            let resp = DeltaDiscoveryResponse::decode(message)?;
            for r in &resp.resources {
                if let Ok(v) = r.version.parse::<usize>() {
                    tracker.arrived(v);
                }
            }
            let ack = DeltaDiscoveryRequest {
                type_url: resp.type_url,
                response_nonce: resp.nonce,
                ..Default::default()
            };
            send.send_data(grpc_frame(&ack), false)?;
        }
    }
    Ok(())
}

/// `message` as one uncompressed gRPC length-prefixed frame: one flag byte and a
/// four-byte length before the message.
fn grpc_frame(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut framed = Vec::with_capacity(len + 5);
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    message
        .encode(&mut framed)
        .expect("a Vec grows to hold any message");
    Bytes::from(framed)
}

/// The next whole gRPC message in `buf`, taken out of it; `None` until one has arrived.
fn next_grpc_message(buf: &mut bytes::BytesMut) -> anyhow::Result<Option<Bytes>> {
    const MESSAGE_BYTES_MAX: usize = 16 << 20;
    let Some(header) = buf.get(..5) else {
        return Ok(None);
    };
    anyhow::ensure!(header[0] == 0, "a compressed response (flag {})", header[0]);
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    anyhow::ensure!(
        len <= MESSAGE_BYTES_MAX,
        "a response of {len} bytes, over {MESSAGE_BYTES_MAX}"
    );
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let mut message = buf.split_to(5 + len);
    Ok(Some(message.split_off(5).freeze()))
}

/// A `fanout-serve` process, driven over its standard input and output. Its answers take
/// microseconds, so they are awaited in place (`block_in_place`) rather than through
/// tokio's process driver.
struct ServerProcess {
    child: std::process::Child,
    /// `None` once closed (the server then exits).
    stdin: Option<std::process::ChildStdin>,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    addr: SocketAddr,
}

/// What a server process reports of itself.
#[derive(Debug, Clone, Copy)]
struct Usage {
    rss: u64,
    cpu: Duration,
}

impl ServerProcess {
    async fn start(kind: ServerKind, params: Params, drill: &Path) -> anyhow::Result<Self> {
        let mut child = std::process::Command::new(drill)
            .arg("fanout-serve")
            .args(["--kind", kind.arg()])
            .args(["--endpoints", &params.endpoints.to_string()])
            .args(["--versions", &(params.withdrawals + 1).to_string()])
            .args(["--subscriptions", &params.subscriptions.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} fanout-serve", drill.display()))?;
        let stdin = child.stdin.take().context("server stdin")?;
        let stdout = child.stdout.take().context("server stdout")?;
        let mut server = Self {
            child,
            stdin: Some(stdin),
            lines: std::io::BufRead::lines(std::io::BufReader::new(stdout)),
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        };
        let line = server.next_line()?;
        server.addr = line
            .strip_prefix("listening ")
            .context("the fan-out server's first line names its address")?
            .parse()?;
        Ok(server)
    }

    fn next_line(&mut self) -> anyhow::Result<String> {
        tokio::task::block_in_place(|| self.lines.next())
            .context("the fan-out server exited")?
            .context("reading the fan-out server's answer")
    }

    fn command(&mut self, line: &str) -> anyhow::Result<String> {
        use std::io::Write as _;
        let stdin = self
            .stdin
            .as_mut()
            .context("the fan-out server was stopped")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        self.next_line()
    }

    async fn publish(&mut self, version: usize) -> anyhow::Result<()> {
        let answer = self.command(&format!("publish {version}"))?;
        anyhow::ensure!(answer == "published", "publish answered {answer:?}");
        Ok(())
    }

    async fn stats(&mut self) -> anyhow::Result<Usage> {
        let answer = self.command("stats")?;
        let mut fields = answer.split_whitespace();
        let (Some("stats"), Some(rss), Some(cpu_ms)) =
            (fields.next(), fields.next(), fields.next())
        else {
            anyhow::bail!("stats answered {answer:?}");
        };
        Ok(Usage {
            rss: rss.parse()?,
            cpu: Duration::from_millis(cpu_ms.parse()?),
        })
    }

    /// Close its input (it exits), and wait for it.
    async fn stop(mut self) -> anyhow::Result<()> {
        drop(self.stdin.take());
        let status = tokio::task::block_in_place(|| self.child.wait())?;
        anyhow::ensure!(status.success(), "the fan-out server failed: {status}");
        Ok(())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // A phase that failed half-way must not leave its server behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server side of one phase, in its own process (`waymark-drill fanout-serve`): listen
/// on loopback, print `listening ADDR`, then answer lines on standard input —
/// `publish V` (release version V: the view without endpoint `V - 2`; answers `published`),
/// `stats` (answers `stats RSS_BYTES CPU_MS`) — until it closes.
pub async fn serve(
    kind: ServerKind,
    endpoints: usize,
    versions: usize,
    subscriptions: usize,
) -> anyhow::Result<()> {
    let listener = listen()?;
    let addr = listener.local_addr()?;
    let mut publish: Box<dyn FnMut(usize) + Send> = match kind {
        ServerKind::Xds => {
            let admission = AdmissionConfig {
                floor: u32::try_from(subscriptions)?.max(1),
                ..AdmissionConfig::default()
            };
            let (server, publisher) = XdsServer::new(ServerConfig {
                admission,
                ..ServerConfig::default()
            });
            tokio::spawn(server.serve(listener, Keepalive::default(), std::future::pending()));
            let mut builder = SnapshotBuilder::new();
            builder.handle_release(&view(1, endpoints, usize::MAX));
            publisher.publish(builder.build());
            Box::new(move |version| {
                builder.handle_release(&view(version as u64, endpoints, version - 2));
                publisher.publish(builder.build());
            })
        }
        ServerKind::Limit => {
            let payloads: Arc<Vec<Bytes>> = Arc::new(
                (0..=versions)
                    .map(|v| {
                        let without = v.checked_sub(2).unwrap_or(usize::MAX);
                        encoded_response(&view(v as u64, endpoints, without))
                    })
                    .collect(),
            );
            let (broadcast, _) = tokio::sync::broadcast::channel::<usize>(versions + 4);
            let server_tx = broadcast.clone();
            let served = payloads.clone();
            tokio::spawn(async move {
                while let Ok((socket, _)) = listener.accept().await {
                    let (rx, payloads) = (server_tx.subscribe(), served.clone());
                    tokio::spawn(h2_serve(socket, rx, payloads));
                }
            });
            Box::new(move |version| {
                let _ = broadcast.send(version);
            })
        }
    };
    // Standard input is read on a thread of its own (its lines are rare), answers are
    // written in place: neither needs tokio's process or stdio drivers.
    let (lines_tx, mut lines) = mpsc::channel::<String>(4);
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::stdin().lock()) {
            let Ok(line) = line else { break };
            if lines_tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    let say = |line: &str| -> std::io::Result<()> {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{line}")?;
        stdout.flush()
    };
    say(&format!("listening {addr}"))?;
    while let Some(line) = lines.recv().await {
        let answer = match line.split_once(' ') {
            Some(("publish", v)) => match v.parse::<usize>() {
                Ok(v) if (2..=versions).contains(&v) => {
                    publish(v);
                    "published".to_owned()
                }
                _ => format!("refused: no version {v:?}"),
            },
            None if line == "stats" => {
                format!("stats {} {}", rss_bytes(), cpu_time().as_millis())
            }
            _ => format!("refused: unknown command {line:?}"),
        };
        say(&answer)?;
    }
    Ok(())
}

/// One limit connection: every stream gets the current frame, then each published one;
/// whatever the client sends is read and dropped.
async fn h2_serve(
    socket: tokio::net::TcpStream,
    rx: tokio::sync::broadcast::Receiver<usize>,
    payloads: Arc<Vec<Bytes>>,
) -> anyhow::Result<()> {
    let mut conn = h2::server::Builder::new()
        .max_concurrent_streams(STREAMS_PER_CONNECTION_MAX as u32)
        .handshake(socket)
        .await?;
    while let Some(request) = conn.accept().await {
        let (request, mut respond) = request?;
        let (mut rx, payloads) = (rx.resubscribe(), payloads.clone());
        tokio::spawn(async move {
            let mut body = request.into_body();
            tokio::spawn(async move {
                while let Some(Ok(chunk)) = body.data().await {
                    let _ = body.flow_control().release_capacity(chunk.len());
                }
            });
            let response = http::Response::builder()
                .header("content-type", "application/grpc")
                .body(())
                .expect("a static response");
            let Ok(mut send) = respond.send_response(response, false) else {
                return;
            };
            if send.send_data(payloads[1].clone(), false).is_err() {
                return;
            }
            while let Ok(version) = rx.recv().await {
                if send.send_data(payloads[version].clone(), false).is_err() {
                    return;
                }
            }
        });
    }
    Ok(())
}

fn view(version: u64, endpoints: usize, without: usize) -> ReleasedView {
    let key = ViewKey {
        service: name("pay"),
        zone: name("zone-a"),
    };
    let endpoints: BTreeMap<_, _> = (0..endpoints)
        .filter(|i| *i != without)
        .map(|i| {
            let e = ViewEndpoint {
                instance: name(&format!("pay-{i}")),
                address: Address {
                    ip: IpAddr::V4(Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8)),
                    port: 8080,
                },
                region: name::<RegionName>("eu"),
                zone: name("zone-a"),
                tier: Tier::Local,
                priority: 0,
                weight: Weight::DEFAULT,
                status: EndpointStatus::Eligible,
                verdict: Verdict::Eligible,
                tags: Arc::default(),
                metadata: Arc::default(),
                capability: None,
            };
            (e.instance.clone(), e)
        })
        .collect();
    ReleasedView {
        version: Version(version),
        view: View {
            key,
            endpoints: endpoints.into(),
            markers: Markers::default(),
        },
    }
}

fn name<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().expect("bench names are valid")
}

/// The bytes our server would send for this view: the limit sends exactly these.
fn encoded_response(released: &ReleasedView) -> Bytes {
    use envoy_types::pb::envoy::service::discovery::v3::Resource;
    use waymark_xds::translate::{load_assignment, to_any};
    let resource = Resource {
        name: "pay".into(),
        version: released.version.to_string(),
        resource: Some(to_any(TYPE_ENDPOINT, &load_assignment(released))),
        ..Default::default()
    };
    let response = DeltaDiscoveryResponse {
        resources: vec![resource],
        type_url: TYPE_ENDPOINT.into(),
        nonce: "1-1".into(),
        ..Default::default()
    };
    grpc_frame(&response)
}

/// Subscribers connect in batches of this many streams.
const CONNECT_BATCH: usize = 1_000;

/// No single step of the benchmark may take longer than this.
const WAIT_MAX: Duration = Duration::from_secs(120);

/// Counts arrivals per version; wakes the publisher when all subscribers have one.
struct Tracker {
    subs: usize,
    counts: Vec<AtomicUsize>,
    done: Notify,
}

impl Tracker {
    fn new(subs: usize, versions: usize) -> Arc<Self> {
        Arc::new(Self {
            subs,
            counts: (0..=versions).map(|_| AtomicUsize::new(0)).collect(),
            done: Notify::new(),
        })
    }

    fn arrived(&self, version: usize) {
        if let Some(c) = self.counts.get(version)
            && (c.fetch_add(1, Ordering::AcqRel) + 1 == self.subs || version == 1)
        {
            self.done.notify_waiters();
        }
    }

    /// Wait until every subscriber holds `version`; an error names how many did in time.
    async fn wait(&self, version: usize) -> anyhow::Result<()> {
        self.wait_for(version, self.subs).await
    }

    /// Wait until at least `want` subscribers hold `version`.
    async fn wait_for(&self, version: usize, want: usize) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + WAIT_MAX;
        loop {
            let notified = self.done.notified();
            let have = self.counts[version].load(Ordering::Acquire);
            if have >= want {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                anyhow::bail!(
                    "only {have} of {} subscribers received version {version} within {WAIT_MAX:?}",
                    self.subs
                );
            }
        }
    }
}

/// A loopback listener with a deep accept queue.
fn listen() -> std::io::Result<tokio::net::TcpListener> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    socket.listen(4096)
}

fn percentile_ms(samples: &[Duration], q: f64) -> f64 {
    let mut v: Vec<Duration> = samples.to_vec();
    v.sort();
    if v.is_empty() {
        return 0.0;
    }
    let idx = ((v.len() - 1) as f64 * q).round() as usize;
    v[idx].as_secs_f64() * 1e3
}

/// User + system CPU time of this process (Linux `/proc/self/stat`).
fn cpu_time() -> Duration {
    // Asked first: the first call runs `getconf`, which must not fall inside a reading.
    let per_sec = crate::ingest::clock_ticks_per_sec();
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| crate::ingest::parse_cpu_ticks(&stat))
        .unwrap_or(0);
    Duration::from_secs_f64(ticks as f64 / per_sec)
}

/// Resident set size of this process (Linux `/proc/self/status`).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
