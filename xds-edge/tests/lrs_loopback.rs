//! LRS over a real tonic connection on 127.0.0.1: the stream shape Envoy speaks, end to end,
//! and who a report is keyed by: the client certificate's identity over mutual TLS, the
//! declared node id only in plaintext from loopback, and nobody otherwise.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{Address, Locality, Node, SocketAddress};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterStats, UpstreamEndpointStats, UpstreamLocalityStats,
};
use envoy_types::pb::envoy::service::load_stats::v3::load_reporting_service_client::LoadReportingServiceClient;
use envoy_types::pb::envoy::service::load_stats::v3::{LoadStatsRequest, LoadStatsResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::timeout;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::{Channel, Endpoint, Server};
use waymark_certs::grpc::{IncomingConfig, TlsConnector, incoming};
use waymark_certs::testing::TestPki;
use waymark_certs::{Identity, IdentityKind, KindSet};
use waymark_xds::lrs::{ChannelSink, LoadReport, LrsConfig, LrsReporter, LrsServer};

const WAIT: Duration = Duration::from_secs(5);
const KEEPALIVE: Duration = Duration::from_secs(5);

fn endpoint_stats(ip: &str, port: u32, ok: u64, err: u64) -> UpstreamEndpointStats {
    UpstreamEndpointStats {
        address: Some(Address {
            address: Some(AddressKind::SocketAddress(SocketAddress {
                address: ip.to_owned(),
                port_specifier: Some(PortSpecifier::PortValue(port)),
                ..Default::default()
            })),
        }),
        total_successful_requests: ok,
        total_error_requests: err,
        total_issued_requests: ok + err,
        total_requests_in_progress: 1,
        ..Default::default()
    }
}

fn report(eps: Vec<UpstreamEndpointStats>) -> LoadStatsRequest {
    LoadStatsRequest {
        node: None,
        cluster_stats: vec![ClusterStats {
            cluster_name: "pay".to_owned(),
            cluster_service_name: "pay".to_owned(),
            upstream_locality_stats: vec![UpstreamLocalityStats {
                locality: Some(Locality {
                    zone: "a".to_owned(),
                    ..Default::default()
                }),
                upstream_endpoint_stats: eps,
                ..Default::default()
            }],
            load_report_interval: Some(PbDuration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        }],
    }
}

#[tokio::test]
async fn envoy_shaped_reports_reach_the_sink_per_endpoint_with_the_node_id() {
    // Goal: the first response asks for endpoint granularity; each later report reaches the
    // sink as typed loads attributed to the node that sent it, bad entries skipped.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reports_tx, mut reports) = mpsc::channel::<LoadReport>(8);
    let sink = Arc::new(ChannelSink::new(reports_tx));
    let server = LrsServer::new(LrsConfig::default(), sink.clone());
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(
        Server::builder()
            .http2_keepalive_interval(Some(KEEPALIVE))
            .http2_keepalive_timeout(Some(KEEPALIVE))
            .add_service(server.service())
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );

    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true)
        .connect()
        .await
        .unwrap();
    let mut client = LoadReportingServiceClient::new(channel);
    let (requests, requests_rx) = mpsc::channel(4);
    let node = Node {
        id: "node-a".to_owned(),
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
    assert!(first.send_all_clusters);
    assert!(first.report_endpoint_granularity);
    assert_eq!(
        first.load_reporting_interval,
        Some(PbDuration {
            seconds: 1,
            nanos: 0
        })
    );

    requests
        .send(report(vec![
            endpoint_stats("127.0.0.1", 8001, 90, 10),
            endpoint_stats("127.0.0.2", 8002, 50, 0),
        ]))
        .await
        .unwrap();
    let one = timeout(WAIT, reports.recv()).await.unwrap().unwrap();
    assert_eq!(one.node_id, "node-a");
    assert_eq!(one.zone, "a");
    // Plaintext from loopback: keyed by what it declared, and marked as declared.
    assert_eq!(one.reporter, LrsReporter::Declared("node-a".to_owned()));
    let counts: Vec<_> = one
        .loads
        .iter()
        .map(|l| {
            (
                l.cluster.as_str(),
                l.address.to_string(),
                l.requests,
                l.errors,
            )
        })
        .collect();
    assert_eq!(
        counts,
        [
            ("pay", "127.0.0.1:8001".to_owned(), 100, 10),
            ("pay", "127.0.0.2:8002".to_owned(), 50, 0),
        ]
    );
    assert!(
        one.loads
            .iter()
            .all(|l| l.interval == Duration::from_secs(1))
    );

    requests
        .send(report(vec![
            endpoint_stats("127.0.0.1", 8001, 0, 7),
            endpoint_stats("not-an-ip", 8003, 1, 0),
        ]))
        .await
        .unwrap();
    let two = timeout(WAIT, reports.recv()).await.unwrap().unwrap();
    assert_eq!(two.node_id, "node-a");
    assert_eq!(two.loads.len(), 1);
    assert_eq!((two.loads[0].requests, two.loads[0].errors), (7, 7));

    let stats = server.stats();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(load(&stats.streams), 1);
    assert_eq!(load(&stats.reports), 2);
    assert_eq!(load(&stats.endpoints), 3);
    assert_eq!(load(&stats.skipped), 1);
    assert_eq!(sink.dropped(), 0);

    // The response stream stays open while the client reports, and ends when it leaves.
    drop(requests);
    let end = timeout(WAIT, responses.message()).await.unwrap();
    assert!(matches!(end, Ok(None)), "{end:?}");
    stop.send(()).unwrap();
    timeout(WAIT, serving).await.unwrap().unwrap().unwrap();
}

#[tokio::test]
async fn a_stream_whose_first_request_has_no_node_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reports_tx, _reports) = mpsc::channel::<LoadReport>(1);
    let server = LrsServer::new(LrsConfig::default(), Arc::new(ChannelSink::new(reports_tx)));
    let serving = tokio::spawn(
        Server::builder()
            .add_service(server.service())
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let mut client = LoadReportingServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let first = LoadStatsRequest {
        node: None,
        cluster_stats: Vec::new(),
    };
    let result = client.stream_load_stats(tokio_stream::iter([first])).await;
    let status = result.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        server
            .stats()
            .bad_streams
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    serving.abort();
}

// === who a report is keyed by ===

const TD: &str = "mesh.test";
const WORKLOAD: &str = "spiffe://mesh.test/region/eu/service/cart/instance/i1";

/// Opens an LRS stream declaring `node_id` and reads the first response.
async fn open(
    channel: Channel,
    node_id: &str,
) -> Result<
    (
        mpsc::Sender<LoadStatsRequest>,
        tonic::Streaming<LoadStatsResponse>,
    ),
    tonic::Status,
> {
    let mut client = LoadReportingServiceClient::new(channel);
    let (requests, requests_rx) = mpsc::channel(4);
    let node = Node {
        id: node_id.to_owned(),
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
        .await?
        .into_inner();
    timeout(WAIT, responses.message()).await.unwrap()?.unwrap();
    Ok((requests, responses))
}

#[tokio::test]
async fn over_mutual_tls_a_report_is_keyed_by_the_certificate_not_the_declared_node_id() {
    // Goal: a workload that declares someone else's node id is still its certificate's
    // identity to the sink, so the name a client writes can never dodge its cap.
    let pki = TestPki::new(TD, &["eu"]);
    let workload: Identity = WORKLOAD.parse().unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reports_tx, mut reports) = mpsc::channel::<LoadReport>(8);
    let server = LrsServer::new(LrsConfig::default(), Arc::new(ChannelSink::new(reports_tx)));
    let workloads = pki.policy(KindSet::only(IdentityKind::Workload));
    let tls = pki.server("region/eu/node/n1", workloads);
    let serving = tokio::spawn(
        Server::builder()
            .add_service(server.service())
            .serve_with_incoming(incoming(listener, tls, IncomingConfig::default())),
    );
    let tls = pki.client(WORKLOAD, pki.policy(KindSet::only(IdentityKind::Node)));
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(TlsConnector::new(tls))
        .await
        .unwrap();
    let (requests, _responses) = open(channel, "someone-else").await.unwrap();
    requests
        .send(report(vec![endpoint_stats("127.0.0.1", 8001, 1, 1)]))
        .await
        .unwrap();
    let got = timeout(WAIT, reports.recv()).await.unwrap().unwrap();
    assert_eq!(got.reporter, LrsReporter::Verified(workload));
    assert_eq!(got.reporter.to_string(), WORKLOAD);
    assert_eq!(got.node_id, "someone-else", "kept for logs, not for keying");
    serving.abort();
}

/// A TCP stream whose peer address reads as one off this host, as a plaintext listener
/// bound to a routable address would see it.
struct FromAfar(TcpStream);

impl Connected for FromAfar {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.0.local_addr().ok(),
            remote_addr: Some(SocketAddr::from(([192, 0, 2, 7], 40_000))),
        }
    }
}

impl AsyncRead for FromAfar {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for FromAfar {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn a_plaintext_stream_from_off_this_host_is_refused_before_it_reports() {
    // Goal: without a certificate there is no identity to key a reporter by, and a node id
    // from the network is only a name the client chose: refused, counted, nothing reported.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reports_tx, mut reports) = mpsc::channel::<LoadReport>(1);
    let server = LrsServer::new(LrsConfig::default(), Arc::new(ChannelSink::new(reports_tx)));
    let incoming = TcpListenerStream::new(listener).map(|tcp| tcp.map(FromAfar));
    let serving = tokio::spawn(
        Server::builder()
            .add_service(server.service())
            .serve_with_incoming(incoming),
    );
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = open(channel, "node-a").await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let stats = server.stats();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((load(&stats.unauthenticated), load(&stats.streams)), (1, 0));
    assert!(reports.try_recv().is_err());
    serving.abort();
}
