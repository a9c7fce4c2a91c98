//! `bench fanout`: how fast a withdrawal reaches every subscriber of the real ADS server.
//!
//! Opens N Delta streams (one HTTP/2 connection each, as N sidecars would) on loopback to
//! a real `waymark_xds::XdsServer`, every client subscribed to the same service's load
//! assignment and ACKing each response. It then publishes W withdrawals one after another
//! and records, per withdrawal, the time until every subscriber has received it.
//!
//! The limit is the same fan-out with no xDS at all: identical, pre-encoded response bytes
//! written to N plain HTTP/2 streams (the `h2` crate tonic itself runs on). Both sides run
//! in this process, so CPU and memory figures include the clients; the ratio compares like
//! with like. CPU time comes from `/proc/self/stat`, RSS from `/proc/self/status` (Linux).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use prost::Message as _;
use serde::Serialize;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, RegionName};
use waymark_core::units::Weight;
use waymark_core::view::{
    EndpointStatus, Markers, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey,
};
use waymark_xds::admission::AdmissionConfig;
use waymark_xds::translate::TYPE_ENDPOINT;
use waymark_xds::{Keepalive, ServerConfig, SnapshotBuilder, XdsServer};

/// The fan-out benchmark's figures.
#[derive(Debug, Clone, Serialize)]
pub struct FanoutReport {
    /// Always `"fanout"`.
    pub bench: &'static str,
    /// Delta streams open.
    pub subscriptions: usize,
    /// Withdrawals published.
    pub withdrawals: usize,
    /// Endpoints in the view.
    pub endpoints: usize,
    /// Median time for a withdrawal to reach every subscriber.
    pub p50_ms: f64,
    /// 99th percentile of that time.
    pub p99_ms: f64,
    /// Worst of that time.
    pub max_ms: f64,
    /// The same for the plain HTTP/2 fan-out.
    pub limit_p99_ms: f64,
    /// Messages delivered per CPU-second (server and clients together).
    pub messages_per_cpu_second: f64,
    /// The same for the plain HTTP/2 fan-out.
    pub limit_messages_per_cpu_second: f64,
    /// `messages_per_cpu_second / limit_messages_per_cpu_second`.
    pub ratio: f64,
    /// Resident memory added per open subscription (server and client sides together).
    pub rss_bytes_per_subscription: f64,
}

struct Phase {
    completions: Vec<Duration>,
    cpu: Duration,
    messages: usize,
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

/// Run the benchmark: `subscriptions` streams, `withdrawals` published in sequence.
pub async fn run(
    subscriptions: usize,
    withdrawals: usize,
    endpoints: usize,
) -> anyhow::Result<FanoutReport> {
    let rss_before = rss_bytes();
    let ours = xds_phase(subscriptions, withdrawals, endpoints).await?;
    let rss_per_sub = (ours.1.saturating_sub(rss_before)) as f64 / subscriptions as f64;
    let payload = Bytes::from(encoded_response(&view(1, endpoints, usize::MAX)));
    let limit = h2_phase(subscriptions, withdrawals, payload).await?;
    let (ours, limit) = (ours.0, limit);
    let rate = |p: &Phase| p.messages as f64 / p.cpu.as_secs_f64().max(1e-3);
    let (ours_rate, limit_rate) = (rate(&ours), rate(&limit));
    Ok(FanoutReport {
        bench: "fanout",
        subscriptions,
        withdrawals,
        endpoints,
        p50_ms: percentile_ms(&ours.completions, 0.5),
        p99_ms: percentile_ms(&ours.completions, 0.99),
        max_ms: percentile_ms(&ours.completions, 1.0),
        limit_p99_ms: percentile_ms(&limit.completions, 0.99),
        messages_per_cpu_second: ours_rate,
        limit_messages_per_cpu_second: limit_rate,
        ratio: ours_rate / limit_rate,
        rss_bytes_per_subscription: rss_per_sub,
    })
}

async fn xds_phase(
    subs: usize,
    withdrawals: usize,
    endpoints: usize,
) -> anyhow::Result<(Phase, u64)> {
    let admission = AdmissionConfig {
        floor: u32::try_from(subs)?.max(1),
        ..AdmissionConfig::default()
    };
    let (server, publisher) = XdsServer::new(ServerConfig {
        admission,
        ..ServerConfig::default()
    });
    let listener = listen()?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        server
            .clone()
            .serve(listener, Keepalive::default(), std::future::pending()),
    );
    let mut builder = SnapshotBuilder::new();
    builder.handle_release(&view(1, endpoints, usize::MAX));
    publisher.publish(builder.build());
    let tracker = Tracker::new(subs, withdrawals + 2);
    // Connect in batches, as reconnection admission would pace them anyway; a storm of
    // simultaneous SYNs measures the kernel's accept queue, not us.
    for i in 0..subs {
        let tracker_i = tracker.clone();
        tokio::spawn(async move {
            if let Err(e) = subscriber(addr, i, tracker_i).await {
                eprintln!("subscriber {i}: {e:#}");
            }
        });
        if (i + 1) % CONNECT_BATCH == 0 {
            tracker.wait_for(1, i + 1).await?;
        }
    }
    tracker.wait(1).await?; // everyone holds version 1
    let rss = rss_bytes();
    let cpu0 = cpu_time();
    let mut completions = Vec::with_capacity(withdrawals);
    for w in 0..withdrawals {
        let version = w as u64 + 2;
        let start = Instant::now();
        builder.handle_release(&view(version, endpoints, w % endpoints));
        publisher.publish(builder.build());
        tracker.wait(version as usize).await?;
        completions.push(start.elapsed());
    }
    let phase = Phase {
        completions,
        cpu: cpu_time().saturating_sub(cpu0),
        messages: subs * withdrawals,
    };
    Ok((phase, rss))
}

async fn subscriber(addr: SocketAddr, i: usize, tracker: Arc<Tracker>) -> anyhow::Result<()> {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}")).await?;
    let (tx, rx) = mpsc::channel(4);
    let node = Node {
        id: format!("bench-{i}"),
        locality: Some(Locality {
            zone: "zone-a".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    tx.send(DeltaDiscoveryRequest {
        node: Some(node),
        type_url: TYPE_ENDPOINT.into(),
        resource_names_subscribe: vec!["pay".into()],
        ..Default::default()
    })
    .await?;
    let mut inbound = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(resp) = inbound.message().await? {
        let ack = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce,
            ..Default::default()
        };
        for r in &resp.resources {
            if let Ok(v) = r.version.parse::<usize>() {
                tracker.arrived(v);
            }
        }
        tx.send(ack).await?;
    }
    Ok(())
}

async fn h2_phase(subs: usize, withdrawals: usize, payload: Bytes) -> anyhow::Result<Phase> {
    let listener = listen()?;
    let addr = listener.local_addr()?;
    let (broadcast, _) = tokio::sync::broadcast::channel::<Bytes>(withdrawals + 4);
    let opened = Arc::new(AtomicUsize::new(0));
    let server_tx = broadcast.clone();
    let server_opened = opened.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let rx = server_tx.subscribe();
            let opened = server_opened.clone();
            tokio::spawn(h2_serve(socket, rx, opened));
        }
    });
    let tracker = Tracker::new(subs, withdrawals + 2);
    let deadline = Instant::now() + WAIT_MAX;
    for i in 0..subs {
        let (tracker, len) = (tracker.clone(), payload.len());
        tokio::spawn(async move {
            if let Err(e) = h2_subscriber(addr, len, tracker).await {
                eprintln!("h2 subscriber {i}: {e:#}");
            }
        });
        while (i + 1) % CONNECT_BATCH == 0 && opened.load(Ordering::Relaxed) < i + 1 {
            anyhow::ensure!(
                Instant::now() < deadline,
                "only {} h2 streams opened",
                opened.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(2)).await; // setup only, not measured
        }
    }
    while opened.load(Ordering::Relaxed) < subs {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} h2 streams opened",
            opened.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await; // setup only, not measured
    }
    let cpu0 = cpu_time();
    let mut completions = Vec::with_capacity(withdrawals);
    for w in 0..withdrawals {
        let start = Instant::now();
        broadcast
            .send(payload.clone())
            .map_err(|_| anyhow::anyhow!("no h2 streams"))?;
        tracker.wait(w + 2).await?;
        completions.push(start.elapsed());
    }
    Ok(Phase {
        completions,
        cpu: cpu_time().saturating_sub(cpu0),
        messages: subs * withdrawals,
    })
}

async fn h2_serve(
    socket: tokio::net::TcpStream,
    mut rx: tokio::sync::broadcast::Receiver<Bytes>,
    opened: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let mut conn = h2::server::handshake(socket).await?;
    let Some(request) = conn.accept().await else {
        return Ok(());
    };
    let (_, mut respond) = request?;
    tokio::spawn(async move { while conn.accept().await.is_some() {} });
    let mut send = respond.send_response(http::Response::new(()), false)?;
    opened.fetch_add(1, Ordering::Relaxed);
    while let Ok(bytes) = rx.recv().await {
        send.send_data(bytes, false)?;
    }
    Ok(())
}

async fn h2_subscriber(
    addr: SocketAddr,
    message_len: usize,
    tracker: Arc<Tracker>,
) -> anyhow::Result<()> {
    let socket = tokio::net::TcpStream::connect(addr).await?;
    let (mut client, conn) = h2::client::handshake(socket).await?;
    tokio::spawn(conn);
    let request = http::Request::get(format!("http://{addr}/fanout")).body(())?;
    let (response, _) = client.send_request(request, true)?;
    let mut body = response.await?.into_body();
    let (mut buffered, mut messages) = (0usize, 1usize);
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        buffered += chunk.len();
        while buffered >= message_len {
            buffered -= message_len;
            messages += 1;
            tracker.arrived(messages);
        }
    }
    Ok(())
}

/// The bytes our server would send for this view: the limit sends exactly these.
fn encoded_response(released: &ReleasedView) -> Vec<u8> {
    use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, Resource};
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
    // gRPC framing: one flag byte and a four-byte length before the message.
    let message = response.encode_to_vec();
    let mut framed = Vec::with_capacity(message.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    framed
}

/// Subscribers connect in batches of this many.
const CONNECT_BATCH: usize = 100;

/// No single step of the benchmark may take longer than this.
const WAIT_MAX: Duration = Duration::from_secs(60);

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

/// User + system CPU time of this process (Linux `/proc/self/stat`, 10 ms ticks).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line; the first field after ')' is 3.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// Resident set size (Linux `/proc/self/status`).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_fanout_reaches_every_subscriber() {
        let r = run(20, 5, 10).await.unwrap();
        assert_eq!((r.subscriptions, r.withdrawals), (20, 5));
        assert!(r.p50_ms <= r.p99_ms && r.p99_ms <= r.max_ms);
        assert!(r.messages_per_cpu_second > 0.0 && r.limit_messages_per_cpu_second > 0.0);
    }
}
