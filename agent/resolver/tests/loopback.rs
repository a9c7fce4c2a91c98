//! The resolver against a real `waymark_xds::XdsServer` on 127.0.0.1: it follows a publish,
//! keeps answering from the last view when the server stops, reports the lost stream and
//! recovers when the server returns, and after a restart with the server still down
//! answers from its cache file at once.
//!
//! The resolver has no change notification, so its progress is awaited by bounded polling
//! (`until`, every 10 ms, failing with the last answer); never a fixed sleep.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::{
    EndpointStatus, Markers, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey,
};
use waymark_resolver::{Resolution, Resolver, ResolverConfig};
use waymark_testkit::until;
use waymark_xds::client::{BackoffConfig, ClientConfig};
use waymark_xds::{Publisher, ServerConfig, SnapshotBuilder, XdsServer};

const WAIT: Duration = Duration::from_secs(10);

// === fixtures ===

fn endpoint(n: u8) -> ViewEndpoint {
    let addr = SocketAddr::from(([127, 0, 0, n], 8000 + u16::from(n)));
    ViewEndpoint {
        instance: InstanceId::try_new(format!("pay-{n}")).unwrap(),
        address: Address {
            ip: addr.ip(),
            port: addr.port(),
        },
        region: RegionName::try_new("eu").unwrap(),
        zone: ZoneName::try_new("a").unwrap(),
        tier: Tier::Local,
        priority: 0,
        weight: Weight::new(100),
        status: EndpointStatus::Eligible,
        verdict: Verdict::Eligible,
        tags: Arc::default(),
        metadata: Arc::default(),
        capability: None,
    }
}

fn released(version: u64, eps: &[u8]) -> ReleasedView {
    ReleasedView {
        version: Version(version),
        view: View {
            key: ViewKey {
                service: ServiceName::try_new("pay").unwrap(),
                zone: ZoneName::try_new("a").unwrap(),
            },
            endpoints: eps
                .iter()
                .map(|n| endpoint(*n))
                .map(|e| (e.instance.clone(), e))
                .collect::<std::collections::BTreeMap<_, _>>()
                .into(),
            markers: Markers::default(),
        },
    }
}

fn config(addr: SocketAddr, cache: &Path) -> ResolverConfig {
    let mut config = ResolverConfig::new(format!("http://{addr}"), "caller-1", "a");
    config.services = vec!["pay".into()];
    config.cache_file = Some(cache.to_path_buf());
    config.xds = ClientConfig {
        backoff: BackoffConfig {
            base: Duration::from_millis(20),
            cap: Duration::from_millis(200),
            ..BackoffConfig::default()
        },
        seed: 7,
        ..ClientConfig::default()
    };
    config
}

fn ports(r: &Resolution) -> Vec<u16> {
    match r {
        Resolution::Endpoints(s) => s.endpoints.iter().map(|e| e.port).collect(),
        _ => vec![],
    }
}

/// Waits until `cond` holds of `resolver`; a timeout shows what it resolves `pay` to.
async fn resolver_until(resolver: &Resolver, what: &str, cond: impl Fn(&Resolver) -> bool) {
    until(what, WAIT, async || {
        if cond(resolver) {
            Ok(())
        } else {
            Err(format!(
                "{:?}, connected {}, stats {:?}",
                resolver.resolve("pay"),
                resolver.is_connected(),
                resolver.stats()
            ))
        }
    })
    .await;
}

// === a server we can stop ===

struct Running {
    publisher: Publisher,
    builder: SnapshotBuilder,
    stop: oneshot::Sender<()>,
    serving: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Running {
    /// A server on `addr` (port 0: any free port).
    async fn start(addr: SocketAddr) -> (Self, SocketAddr) {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (server, publisher) = XdsServer::new(ServerConfig::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(
            Server::builder()
                .add_service(server.service())
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        let running = Self {
            publisher,
            builder: SnapshotBuilder::new(),
            stop,
            serving,
        };
        (running, addr)
    }

    fn release(&mut self, view: &ReleasedView) {
        assert!(self.builder.handle_release(view));
        self.publisher.publish(self.builder.build());
    }

    /// Ending the snapshot feed ends every stream; then the listener closes.
    async fn stop(self) {
        drop(self.publisher);
        let _ = self.stop.send(());
        timeout(WAIT, self.serving).await.unwrap().unwrap().unwrap();
    }
}

fn any_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

// === tests ===

#[tokio::test]
async fn the_resolver_follows_publishes_survives_the_agent_stopping_and_restarts_from_its_cache() {
    // Goal: ADR-01 end to end: stream → table → disk; outage → last view; restart → disk.
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("resolver-lkg.json");
    let (mut running, addr) = Running::start(any_addr()).await;
    running.release(&released(1, &[1, 2]));

    let resolver = Resolver::connect(config(addr, &cache)).unwrap();
    assert_eq!(resolver.resolve("cart"), Resolution::Unknown);
    resolver_until(&resolver, "v1", |r| {
        ports(&r.resolve("pay")) == [8001, 8002]
    })
    .await;
    assert!(resolver.is_connected());
    assert_eq!(
        resolver.age("pay"),
        Some(Duration::ZERO),
        "connected: current"
    );
    assert!(cache.exists(), "persisted before served");

    // A withdrawal follows the publish.
    running.release(&released(2, &[1]));
    resolver_until(&resolver, "v2", |r| ports(&r.resolve("pay")) == [8001]).await;

    // Everything withdrawn: resolved to empty, not unknown.
    running.release(&released(3, &[]));
    resolver_until(&resolver, "v3", |r| r.resolve("pay") == Resolution::Empty).await;
    running.release(&released(4, &[2]));
    resolver_until(&resolver, "v4", |r| ports(&r.resolve("pay")) == [8002]).await;

    // The agent goes away: the last view keeps answering, and ages.
    running.stop().await;
    resolver_until(&resolver, "the stream to end", |r| !r.is_connected()).await;
    assert_eq!(ports(&resolver.resolve("pay")), [8002]);
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(resolver.age("pay").unwrap() >= Duration::from_millis(20));
    assert_eq!(resolver.stats().rejected, 0);
    drop(resolver);

    // A restarted caller, agent still down: answers from disk at once, without waiting.
    let restarted = Resolver::connect(config(addr, &cache)).unwrap();
    assert_eq!(ports(&restarted.resolve("pay")), [8002]);
    assert!(!restarted.is_connected());
    assert!(restarted.age("pay").is_some());
    assert_eq!(restarted.resolve("cart"), Resolution::Unknown);
    assert_eq!(restarted.stats().cache_corrupt, 0);
}

#[tokio::test]
async fn a_service_subscribed_later_resolves_once_the_agent_answers() {
    // Goal: `subscribe` adds a service to an open stream.
    let dir = tempfile::tempdir().unwrap();
    let (mut running, addr) = Running::start(any_addr()).await;
    running.release(&released(1, &[3]));
    let mut config = config(addr, &dir.path().join("lkg.json"));
    config.services.clear();
    let resolver = Resolver::connect(config).unwrap();
    resolver_until(&resolver, "the stream", Resolver::is_connected).await;
    assert_eq!(resolver.resolve("pay"), Resolution::Unknown);
    resolver.subscribe("pay").await.unwrap();
    resolver_until(&resolver, "pay", |r| ports(&r.resolve("pay")) == [8003]).await;
    running.stop().await;
}

#[tokio::test]
async fn the_resolver_reports_a_lost_stream_serves_its_last_view_and_recovers_when_the_agent_returns()
 {
    // Goal: the resolver learns its stream is gone (not connected, lost since when, failed
    // reconnects counted), keeps serving and ageing its last view, and on the agent's
    // return is current again and follows what changed while it was away.
    let dir = tempfile::tempdir().unwrap();
    let (mut running, addr) = Running::start(any_addr()).await;
    running.release(&released(1, &[1, 2]));
    let resolver = Resolver::connect(config(addr, &dir.path().join("lkg.json"))).unwrap();
    resolver_until(&resolver, "v1", |r| {
        ports(&r.resolve("pay")) == [8001, 8002]
    })
    .await;
    resolver_until(&resolver, "the stream", Resolver::is_connected).await;
    assert_eq!(resolver.lost_since(), None);
    assert_eq!(resolver.stats().streams, 1);

    let stopping = SystemTime::now();
    running.stop().await;
    resolver_until(&resolver, "the loss", |r| r.lost_since().is_some()).await;
    assert!(!resolver.is_connected());
    let lost = resolver.lost_since().unwrap();
    // Wall-clock stamps are whole milliseconds.
    assert!(
        lost + Duration::from_millis(1) >= stopping,
        "{lost:?} before {stopping:?}"
    );
    assert!(lost <= SystemTime::now());
    let failures = resolver.stats().connect_failures;
    resolver_until(&resolver, "a failed reconnect", |r| {
        r.stats().connect_failures > failures
    })
    .await;
    assert_eq!(
        resolver.lost_since(),
        Some(lost),
        "a failed attempt keeps the loss time"
    );
    assert_eq!(
        ports(&resolver.resolve("pay")),
        [8001, 8002],
        "the last view"
    );
    resolver_until(&resolver, "the view to age", |r| {
        r.age("pay").is_some_and(|a| a > Duration::ZERO)
    })
    .await;

    let (mut back, same) = Running::start(addr).await;
    assert_eq!(same, addr);
    back.release(&released(2, &[2]));
    resolver_until(&resolver, "v2 after the return", |r| {
        ports(&r.resolve("pay")) == [8002]
    })
    .await;
    resolver_until(&resolver, "the second stream", Resolver::is_connected).await;
    assert_eq!(resolver.stats().streams, 2);
    assert_eq!(resolver.lost_since(), None);
    assert_eq!(resolver.age("pay"), Some(Duration::ZERO), "current again");
    assert_eq!(resolver.stats().rejected, 0);
    back.stop().await;
}
