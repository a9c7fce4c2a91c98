//! LRS forwarding end to end on 127.0.0.1: Envoy-shaped load reports from three sidecars in,
//! passive samples per instance out, attributed through the assignments the agent serves,
//! with a flooding sidecar held to its per-reporter cap.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{Address, Locality, Node, SocketAddress};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, ClusterStats, UpstreamEndpointStats, UpstreamLocalityStats,
};
use envoy_types::pb::envoy::service::load_stats::v3::load_reporting_service_client::LoadReportingServiceClient;
use envoy_types::pb::envoy::service::load_stats::v3::{LoadStatsRequest, LoadStatsResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::time::timeout;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::Streaming;
use tonic::transport::{Channel, Server};
use waymark_agent::evidence::WireSample;
use waymark_agent::node::lrs::{FLUSH_INTERVAL_MIN, LrsForwardConfig, LrsForwarder};
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address as CoreAddress, InstanceId, Observation};
use waymark_core::model::{RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::{
    EndpointStatus, Markers, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey,
};
use waymark_xds::translate::load_assignment;

/// A guard against hangs only; every wait below is for data, not for time to pass.
const WAIT: Duration = Duration::from_secs(10);
const REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// One reporter's requests counted per endpoint and flush window.
const CAP: u64 = 100;
/// What the flooding sidecar claims for pay-1, all of it errors.
const FLOOD: u64 = 1_000_000_000;

fn released(service: &str, endpoints: &[(&str, &str)]) -> ReleasedView {
    let endpoints = endpoints
        .iter()
        .map(|(instance, address)| {
            let instance = InstanceId::try_new(instance).unwrap();
            let address: SocketAddr = address.parse().unwrap();
            let endpoint = ViewEndpoint {
                instance: instance.clone(),
                address: CoreAddress {
                    ip: address.ip(),
                    port: address.port(),
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
            };
            (instance, endpoint)
        })
        .collect::<std::collections::BTreeMap<_, _>>()
        .into();
    ReleasedView {
        version: Version(7),
        view: View {
            key: ViewKey {
                service: ServiceName::try_new(service).unwrap(),
                zone: ZoneName::try_new("a").unwrap(),
            },
            endpoints,
            markers: Markers::default(),
        },
    }
}

fn endpoint_stats(address: &str, ok: u64, err: u64) -> UpstreamEndpointStats {
    let address: SocketAddr = address.parse().unwrap();
    UpstreamEndpointStats {
        address: Some(Address {
            address: Some(AddressKind::SocketAddress(SocketAddress {
                address: address.ip().to_string(),
                port_specifier: Some(PortSpecifier::PortValue(u32::from(address.port()))),
                ..Default::default()
            })),
        }),
        total_successful_requests: ok,
        total_error_requests: err,
        total_issued_requests: ok + err,
        ..Default::default()
    }
}

fn cluster_stats(cluster: &str, endpoints: Vec<UpstreamEndpointStats>) -> ClusterStats {
    ClusterStats {
        cluster_name: cluster.to_owned(),
        upstream_locality_stats: vec![UpstreamLocalityStats {
            locality: Some(Locality {
                zone: "a".to_owned(),
                ..Default::default()
            }),
            upstream_endpoint_stats: endpoints,
            ..Default::default()
        }],
        load_report_interval: Some(PbDuration {
            seconds: 1,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// One sidecar's LRS stream, spoken the way Envoy speaks it.
struct FakeEnvoy {
    requests: mpsc::Sender<LoadStatsRequest>,
    responses: Streaming<LoadStatsResponse>,
}

impl FakeEnvoy {
    /// Open the stream with the node in the first request, and read the first response.
    async fn connect(channel: Channel, node_id: &str) -> (Self, LoadStatsResponse) {
        let mut client = LoadReportingServiceClient::new(channel);
        let (requests, requests_rx) = mpsc::channel(4);
        let node = Node {
            id: node_id.to_owned(),
            locality: Some(Locality {
                zone: "a".to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        };
        requests
            .send(LoadStatsRequest {
                node: Some(node),
                cluster_stats: Vec::new(),
            })
            .await
            .unwrap();
        let mut responses = client
            .stream_load_stats(ReceiverStream::new(requests_rx))
            .await
            .unwrap()
            .into_inner();
        let first = timeout(WAIT, responses.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        (
            Self {
                requests,
                responses,
            },
            first,
        )
    }

    async fn report(&self, clusters: Vec<ClusterStats>) {
        self.requests
            .send(LoadStatsRequest {
                node: None,
                cluster_stats: clusters,
            })
            .await
            .unwrap();
    }
}

/// Per instance: (requests, errors), summed over every sample received so far.
type Totals = BTreeMap<String, (u64, u64)>;

/// Receive batches until the summed totals reach `expected` (or exceed it, which fails).
async fn collect_until(rx: &mut mpsc::Receiver<Vec<WireSample>>, expected: &Totals) -> Totals {
    let mut got = Totals::new();
    while &got != expected {
        let batch = timeout(WAIT, rx.recv()).await.unwrap().unwrap();
        let mut seen = Vec::new();
        for sample in batch {
            let instance = sample.instance.to_string();
            assert!(
                !seen.contains(&instance),
                "one sample per instance per flush: {instance}"
            );
            let Observation::Passive { requests, errors } = sample.observation else {
                panic!("a non-passive sample: {sample:?}");
            };
            assert!(requests > 0, "a sample without requests for {instance}");
            let total = got.entry(instance.clone()).or_default();
            total.0 += requests;
            total.1 += errors;
            seen.push(instance);
        }
        assert!(
            got.iter()
                .all(|(i, t)| expected.get(i).is_some_and(|e| t.0 <= e.0 && t.1 <= e.1)),
            "more than was reported, or an unexpected instance: {got:?}"
        );
    }
    got
}

fn metric(registry: &Registry, name: &str) -> Option<u64> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn sidecar_load_reports_come_out_as_summed_passive_samples_per_instance() {
    // Goal: two Envoys' reports are summed per endpoint, mapped to the instances of the
    // assignments in force, and forwarded; an unknown address and an idle endpoint are not.
    // A third claiming 10⁹ errors for pay-1 adds only its cap, and the rest is counted.
    let pay = load_assignment(&released(
        "pay",
        &[("pay-1", "127.0.0.1:8001"), ("pay-2", "127.0.0.2:8002")],
    ));
    let cart = load_assignment(&released("cart", &[("cart-1", "127.0.0.3:8003")]));
    let assignments: [ClusterLoadAssignment; 2] = [pay, cart];

    let mut registry = Registry::default();
    let (samples_tx, mut samples) = mpsc::channel(16);
    let forwarder = LrsForwarder::start(
        LrsForwardConfig {
            flush_interval: FLUSH_INTERVAL_MIN,
            report_interval: REPORT_INTERVAL,
            reporter_endpoint_requests_max: NonZeroU64::new(CAP).unwrap(),
            ..LrsForwardConfig::default()
        },
        samples_tx,
        &mut registry,
    );
    forwarder.set_assignments(&assignments);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(
        Server::builder()
            .add_service(forwarder.service())
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();

    let (envoy_a, first) = FakeEnvoy::connect(channel.clone(), "sidecar-a").await;
    assert_eq!(
        first.clusters,
        ["cart", "pay"],
        "exactly the served clusters"
    );
    assert!(!first.send_all_clusters);
    assert!(first.report_endpoint_granularity);
    assert_eq!(
        first.load_reporting_interval,
        Some(PbDuration {
            seconds: 1,
            nanos: 0
        })
    );
    let (envoy_b, _) = FakeEnvoy::connect(channel.clone(), "sidecar-b").await;
    let (flood, _) = FakeEnvoy::connect(channel, "sidecar-flood").await;

    envoy_a
        .report(vec![
            cluster_stats(
                "pay",
                vec![
                    endpoint_stats("127.0.0.1:8001", 90, 10),
                    endpoint_stats("127.0.0.2:8002", 50, 0),
                    // Nobody the agent serves: must be counted, never forwarded.
                    endpoint_stats("10.9.9.9:9999", 5, 5),
                ],
            ),
            cluster_stats("cart", vec![endpoint_stats("127.0.0.3:8003", 0, 0)]),
        ])
        .await;
    envoy_b
        .report(vec![
            cluster_stats("pay", vec![endpoint_stats("127.0.0.1:8001", 40, 0)]),
            cluster_stats("cart", vec![endpoint_stats("127.0.0.3:8003", 7, 3)]),
        ])
        .await;
    // One load, so its cap applies once whichever window it lands in.
    flood
        .report(vec![cluster_stats(
            "pay",
            vec![endpoint_stats("127.0.0.1:8001", 0, FLOOD)],
        )])
        .await;

    // The honest sidecars' 100 and 40 requests for pay-1 are at or under the cap: exact.
    let expected: Totals = [
        ("cart-1".to_owned(), (10, 3)),
        ("pay-1".to_owned(), (140 + CAP, 10 + CAP)),
        ("pay-2".to_owned(), (50, 0)),
    ]
    .into();
    assert_eq!(collect_until(&mut samples, &expected).await, expected);

    // The unknown address was in the same report as pay-1's first load, so it was
    // flushed (and counted) before the totals above could be complete.
    assert_eq!(
        metric(&registry, "waymark_lrs_endpoint_loads_unmapped_total"),
        Some(1)
    );
    assert_eq!(metric(&registry, "waymark_lrs_reports_total"), Some(3));
    assert_eq!(metric(&registry, "waymark_lrs_streams_total"), Some(3));
    assert_eq!(
        metric(
            &registry,
            "waymark_lrs_requests_dropped_total{reason=\"reporter_cap\"}"
        ),
        Some(FLOOD - CAP)
    );
    assert_eq!(
        metric(
            &registry,
            "waymark_lrs_requests_dropped_total{reason=\"reporters_full\"}"
        ),
        Some(0)
    );
    assert_eq!(
        metric(&registry, "waymark_lrs_streams_unauthenticated_total"),
        Some(0)
    );
    assert_eq!(
        metric(&registry, "waymark_lrs_samples_dropped_total"),
        Some(0)
    );
    assert_eq!(metric(&registry, "waymark_lrs_addresses"), Some(3));
    assert!(metric(&registry, "waymark_lrs_samples_forwarded_total").unwrap() >= 3);

    // Nothing more arrives: no sample for the unknown address, no double counting. The
    // forwarder is idle, so this only waits for a few empty flushes.
    let more = timeout(5 * FLUSH_INTERVAL_MIN, samples.recv()).await;
    assert!(more.is_err(), "unexpected samples: {more:?}");

    drop((envoy_a.requests, envoy_b.requests, flood.requests));
    drop((envoy_a.responses, envoy_b.responses, flood.responses));
    stop.send(()).unwrap();
    timeout(WAIT, serving).await.unwrap().unwrap().unwrap();
    assert!(!forwarder.is_finished());
}
