//! The ADS server over real loopback gRPC: sync state, admission, slow consumers, bad input.
//!
//! These drive the server with envoy-types' generated client, speaking the protocol by
//! hand so each edge case is explicit. Behaviour against a real Envoy is in `envoy_ads.rs`.

// Test helpers outside #[test] functions unwrap too: a panic is how a test reports.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;
use support::views;

use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;
use waymark_core::view::{EndpointStatus, Markers, ReleasedView, ViewEndpoint};
use waymark_testkit::until;
use waymark_xds::admission::AdmissionConfig;
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT};
use waymark_xds::{Keepalive, Publisher, ServerConfig, SnapshotBuilder, XdsServer};

const WAIT: Duration = Duration::from_secs(10);

fn endpoint(n: u8) -> ViewEndpoint {
    let addr = SocketAddr::from(([127, 0, 0, 1], 9000 + u16::from(n)));
    views::endpoint(
        &format!("pay-{n}"),
        addr,
        "a",
        0,
        100,
        EndpointStatus::Eligible,
    )
}

fn view(version: u64, members: &[u8]) -> ReleasedView {
    views::released(
        version,
        "a",
        members.iter().map(|n| endpoint(*n)),
        Markers::default(),
    )
}

/// How a fixture serves ADS: on HTTP/2 directly (`XdsServer::serve`, as an authority
/// member does), or as a tonic service that could sit beside others (as a node agent's
/// listener does). Behaviour that both share is checked on both.
#[derive(Debug, Clone, Copy)]
enum Transport {
    Direct,
    Tonic,
}

const TRANSPORTS: [Transport; 2] = [Transport::Direct, Transport::Tonic];

/// A test named `$name` that runs `$on` on each transport in turn.
macro_rules! on_every_transport {
    ($name:ident, $on:ident) => {
        #[tokio::test]
        async fn $name() {
            for transport in TRANSPORTS {
                eprintln!("served {transport:?}");
                $on(transport).await;
            }
        }
    };
}

struct Fixture {
    server: XdsServer,
    publisher: Publisher,
    builder: SnapshotBuilder,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    serving: tokio::task::JoinHandle<()>,
}

impl Fixture {
    async fn start(config: ServerConfig) -> Self {
        Self::start_via(Transport::Direct, config).await
    }

    async fn start_via(transport: Transport, config: ServerConfig) -> Self {
        Self::start_on(transport, config, Keepalive::default()).await
    }

    async fn start_on(transport: Transport, config: ServerConfig, keepalive: Keepalive) -> Self {
        let (server, publisher) = XdsServer::new(config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async {
            stopped.await.ok();
        };
        let serving = match transport {
            Transport::Direct => tokio::spawn(server.clone().serve(listener, keepalive, stopped)),
            Transport::Tonic => {
                let router = tonic::transport::Server::builder()
                    .http2_keepalive_interval(Some(keepalive.interval))
                    .http2_keepalive_timeout(Some(keepalive.timeout))
                    .add_service(server.service());
                let incoming = waymark_certs::grpc::incoming_plain(
                    listener,
                    waymark_certs::grpc::IncomingConfig::default(),
                );
                tokio::spawn(async move {
                    router
                        .serve_with_incoming_shutdown(incoming, stopped)
                        .await
                        .unwrap();
                })
            }
        };
        Self {
            server,
            publisher,
            builder: SnapshotBuilder::new(),
            addr,
            stop: Some(stop),
            serving,
        }
    }

    fn publish(&mut self, released: ReleasedView) {
        assert!(self.builder.handle_release(&released));
        self.publisher.publish(self.builder.build());
    }

    async fn client(&self) -> AggregatedDiscoveryServiceClient<Channel> {
        AggregatedDiscoveryServiceClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap()
    }
}

fn node(id: &str) -> Node {
    Node {
        id: id.into(),
        cluster: "test".into(),
        locality: Some(Locality {
            region: "eu".into(),
            zone: "a".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

struct DeltaClient {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<DeltaDiscoveryResponse>,
}

impl DeltaClient {
    async fn open(fx: &Fixture, id: &str) -> Result<Self, tonic::Status> {
        let (tx, requests) = mpsc::channel(16);
        tx.send(DeltaDiscoveryRequest {
            node: Some(node(id)),
            type_url: TYPE_CLUSTER.into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let rx = fx
            .client()
            .await
            .delta_aggregated_resources(ReceiverStream::new(requests))
            .await?
            .into_inner();
        Ok(Self { tx, rx })
    }

    async fn next(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("a response in time")
            .unwrap()
            .unwrap()
    }

    async fn send(&self, req: DeltaDiscoveryRequest) {
        self.tx.send(req).await.unwrap();
    }
}

/// The request subscribing a stream to the `pay` service's load assignment.
fn subscribe_endpoints() -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: TYPE_ENDPOINT.into(),
        resource_names_subscribe: vec!["pay".into()],
        ..Default::default()
    }
}

fn ack(resp: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: resp.type_url.clone(),
        response_nonce: resp.nonce.clone(),
        ..Default::default()
    }
}

on_every_transport!(
    a_delta_client_gets_clusters_then_endpoints_and_its_acks_are_recorded,
    a_delta_client_gets_clusters_then_endpoints_and_its_acks_are_recorded_on
);

async fn a_delta_client_gets_clusters_then_endpoints_and_its_acks_are_recorded_on(
    transport: Transport,
) {
    let mut fx = Fixture::start_via(transport, ServerConfig::default()).await;
    fx.publish(view(1, &[1, 2]));
    let mut c = DeltaClient::open(&fx, "envoy-1").await.unwrap();
    let cds = c.next().await;
    assert_eq!(
        (cds.type_url.as_str(), cds.resources[0].name.as_str()),
        (TYPE_CLUSTER, "pay")
    );
    c.send(ack(&cds)).await;
    c.send(subscribe_endpoints()).await;
    let eds = c.next().await;
    assert_eq!(
        (
            eds.resources[0].name.as_str(),
            eds.resources[0].version.as_str()
        ),
        ("pay", "1")
    );
    c.send(ack(&eds)).await;
    // A withdrawal arrives as a new version of the same resource.
    fx.publish(view(2, &[2]));
    let eds2 = c.next().await;
    assert_eq!(eds2.resources[0].version, "2");
    c.send(ack(&eds2)).await;
    // Sync state: both types acked at what was sent (poll: the ack crosses the network).
    let synced = || {
        let state = fx.server.sync_state();
        let client = state.iter().find(|c| c.node_id == "envoy-1").cloned();
        client.is_some_and(|c| {
            c.types
                .values()
                .all(|t| t.acked.is_some() && t.acked == t.sent)
                && c.types.len() == 2
        })
    };
    until("acks recorded", WAIT, async || synced()).await;
}

#[tokio::test]
async fn a_reply_that_changes_the_subscription_is_answered_as_a_request_would_be() {
    // A plain acknowledgement leaves nothing to send, and the server no longer looks; a
    // reply that also subscribes must still be answered.
    let mut fx = Fixture::start(ServerConfig::default()).await;
    fx.publish(view(1, &[1, 2]));
    let mut c = DeltaClient::open(&fx, "envoy-r").await.unwrap();
    let cds = c.next().await;
    c.send(ack(&cds)).await;
    c.send(subscribe_endpoints()).await;
    let eds = c.next().await;
    assert_eq!(eds.resources[0].name, "pay");
    // Acknowledge and leave in one reply, then acknowledge again and come back.
    c.send(DeltaDiscoveryRequest {
        resource_names_unsubscribe: vec!["pay".into()],
        ..ack(&eds)
    })
    .await;
    c.send(DeltaDiscoveryRequest {
        resource_names_subscribe: vec!["pay".into()],
        ..ack(&eds)
    })
    .await;
    let again = c.next().await;
    assert_eq!(
        (
            again.resources[0].name.as_str(),
            again.resources[0].version.as_str()
        ),
        ("pay", "1"),
        "the resubscribed view is sent again"
    );
    assert_ne!(again.nonce, eds.nonce);
    // A plain acknowledgement of that, then a release: the release still arrives.
    c.send(ack(&again)).await;
    fx.publish(view(2, &[2]));
    assert_eq!(c.next().await.resources[0].version, "2");
}

#[tokio::test]
async fn a_server_that_records_held_resources_keeps_each_clients_names_and_versions() {
    // Goal: `proxy-config` can say what one client holds, by name and version, and a
    // server that does not record (the default, an authority's tier) keeps nothing.
    let mut fx = Fixture::start(ServerConfig {
        record_held: true,
        ..ServerConfig::default()
    })
    .await;
    fx.publish(view(1, &[1, 2]));
    let mut c = DeltaClient::open(&fx, "envoy-h").await.unwrap();
    let cds = c.next().await;
    c.send(ack(&cds)).await;
    c.send(subscribe_endpoints()).await;
    let eds = c.next().await;
    c.send(ack(&eds)).await;
    fx.publish(view(2, &[2]));
    let eds = c.next().await;
    c.send(ack(&eds)).await;
    let held = |type_url: &str| {
        let state = fx.server.sync_state();
        let client = state.iter().find(|c| c.node_id == "envoy-h")?;
        let t = client.types.get(type_url)?;
        (t.acked == t.sent).then(|| t.held.clone())?
    };
    let eds_held = until("the second view is acknowledged", WAIT, async || {
        held(TYPE_ENDPOINT).filter(|h| h.get("pay").map(String::as_str) == Some("2"))
    })
    .await;
    assert_eq!(eds_held.len(), 1, "{eds_held:?}");
    let cds_held = held(TYPE_CLUSTER).unwrap();
    assert_eq!(cds_held.keys().collect::<Vec<_>>(), ["pay"]);
    assert_eq!(cds_held["pay"], cds.resources[0].version);
    let clusters = fx.server.map_clients(|c| c.cluster.clone());
    assert_eq!(clusters, ["test"]);

    let mut plain = Fixture::start(ServerConfig::default()).await;
    plain.publish(view(1, &[1]));
    let mut c = DeltaClient::open(&plain, "envoy-p").await.unwrap();
    let cds = c.next().await;
    c.send(ack(&cds)).await;
    let state = plain.server.sync_state();
    assert!(state[0].types.values().all(|t| t.held.is_none()));
}

#[tokio::test]
async fn a_nack_keeps_the_acknowledged_version_and_records_the_error() {
    let mut fx = Fixture::start(ServerConfig::default()).await;
    fx.publish(view(1, &[1]));
    let mut c = DeltaClient::open(&fx, "envoy-n").await.unwrap();
    let cds = c.next().await;
    c.send(ack(&cds)).await;
    let mut nack = ack(&cds);
    fx.publish(view(2, &[1, 2])); // same cluster: no CDS change, so we NACK the old nonce
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "cluster rejected".into(),
        details: vec![],
    });
    c.send(nack).await;
    let recorded = || {
        let state = fx.server.sync_state();
        state.iter().any(|c| {
            c.types.get(TYPE_CLUSTER).is_some_and(|t| {
                t.nacks == 1
                    && t.last_nack
                        .as_ref()
                        .is_some_and(|(_, e)| e == "cluster rejected")
                    && t.acked.is_some()
            })
        })
    };
    until("nack recorded", WAIT, async || recorded()).await;
    assert_eq!(
        fx.server
            .stats()
            .nacks
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

on_every_transport!(
    reconnections_beyond_the_admission_cap_are_refused_with_a_retry_hint,
    reconnections_beyond_the_admission_cap_are_refused_with_a_retry_hint_on
);

async fn reconnections_beyond_the_admission_cap_are_refused_with_a_retry_hint_on(
    transport: Transport,
) {
    let admission = AdmissionConfig {
        floor: 2,
        expected_clients: 0,
        ..AdmissionConfig::default()
    };
    let fx = Fixture::start_via(
        transport,
        ServerConfig {
            admission,
            ..ServerConfig::default()
        },
    )
    .await;
    let _a = DeltaClient::open(&fx, "e1").await.unwrap();
    let _b = DeltaClient::open(&fx, "e2").await.unwrap();
    let refused = DeltaClient::open(&fx, "e3")
        .await
        .err()
        .expect("third refused");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    let hint: u64 = refused
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(hint > 0 && hint <= 10_000, "hint {hint} ms");
    assert_eq!(
        fx.server
            .stats()
            .refused_streams
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

on_every_transport!(
    a_client_that_stops_reading_is_disconnected_and_others_keep_their_updates,
    a_client_that_stops_reading_is_disconnected_and_others_keep_their_updates_on
);

async fn a_client_that_stops_reading_is_disconnected_and_others_keep_their_updates_on(
    transport: Transport,
) {
    let config = ServerConfig {
        response_buffer: 1,
        send_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let mut fx = Fixture::start_via(transport, config).await;
    fx.publish(view(1, &[1]));
    // The slow client subscribes to endpoints and then never reads.
    let slow = DeltaClient::open(&fx, "slow").await.unwrap();
    slow.send(subscribe_endpoints()).await;
    let mut good = DeltaClient::open(&fx, "good").await.unwrap();
    good.next().await;
    good.send(subscribe_endpoints()).await;
    good.next().await;
    // ~30 KB views, many times over: enough to exhaust the slow client's HTTP/2 windows
    // (hyper's defaults are 2 MB per stream, 5 MB per connection), then its buffer.
    let many: Vec<u8> = (1..=250).collect();
    for v in 2..320u64 {
        if fx
            .server
            .stats()
            .slow_consumers
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1
        {
            break;
        }
        fx.publish(view(v, &many));
        let r = good.next().await;
        assert_eq!(
            r.resources[0].version,
            v.to_string(),
            "the good client keeps up"
        );
        good.send(ack(&r)).await;
    }
    let disconnected = || {
        fx.server
            .stats()
            .slow_consumers
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1
    };
    until("slow client disconnected", WAIT, async || disconnected()).await;
    drop(slow);
}

#[tokio::test]
async fn unknown_types_and_bad_first_requests_are_counted_and_harmless() {
    let mut fx = Fixture::start(ServerConfig::default()).await;
    fx.publish(view(1, &[1]));
    let mut c = DeltaClient::open(&fx, "odd").await.unwrap();
    c.next().await; // CDS
    c.send(DeltaDiscoveryRequest {
        type_url: "type.googleapis.com/not.a.Type".into(),
        ..Default::default()
    })
    .await;
    let unknown = || {
        fx.server
            .stats()
            .unknown_types
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1
    };
    until("unknown type counted", WAIT, async || unknown()).await;
    // A stream that closes before its first request.
    let (tx, requests) = mpsc::channel::<DeltaDiscoveryRequest>(1);
    drop(tx);
    let err = fx
        .client()
        .await
        .delta_aggregated_resources(ReceiverStream::new(requests))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    // The first client is unaffected.
    fx.publish(view(2, &[1, 2]));
    c.send(subscribe_endpoints()).await;
    assert_eq!(c.next().await.resources[0].version, "2");
}

#[tokio::test]
async fn a_nonce_from_another_stream_is_stale_and_types_are_acked_separately() {
    let mut fx = Fixture::start(ServerConfig::default()).await;
    fx.publish(view(1, &[1]));
    let mut one = DeltaClient::open(&fx, "one").await.unwrap();
    let cds_one = one.next().await;
    let mut two = DeltaClient::open(&fx, "two").await.unwrap();
    let cds_two = two.next().await;
    assert_ne!(cds_one.nonce, cds_two.nonce, "nonces are unique per stream");
    // Stream two answers with stream one's nonce: stale, not an ACK.
    two.send(ack(&cds_one)).await;
    let stale = || {
        fx.server
            .stats()
            .stale_nonces
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1
    };
    until("stale nonce counted", WAIT, async || stale()).await;
    // Nonces are per type: acking CDS says nothing about EDS. Subscribing to EDS with a
    // duplicated name yields one resource.
    two.send(ack(&cds_two)).await;
    two.send(DeltaDiscoveryRequest {
        type_url: TYPE_ENDPOINT.into(),
        resource_names_subscribe: vec!["pay".into(), "pay".into()],
        ..Default::default()
    })
    .await;
    let eds = two.next().await;
    assert_eq!(eds.resources.len(), 1);
    let acked = || {
        let state = fx.server.sync_state();
        let c = state.iter().find(|c| c.node_id == "two").cloned();
        c.is_some_and(|c| {
            c.types[TYPE_CLUSTER].acked.is_some() && c.types[TYPE_ENDPOINT].acked.is_none()
        })
    };
    until("cds acked, eds not yet", WAIT, async || acked()).await;
}

#[tokio::test]
async fn admission_counts_one_address_once_however_many_node_ids_it_claims() {
    // Goal: a client cannot widen the reconnection budget by minting node ids. The budget
    // here is the whole known population per window with a floor of one; were clients
    // counted by the node id they write, every new id would grow the population and be let
    // in. Counted by peer address (all of these share 127.0.0.1), only the first is.
    let admission = AdmissionConfig {
        share: waymark_core::units::Permille::ONE,
        floor: 1,
        expected_clients: 0,
        ..AdmissionConfig::default()
    };
    let fx = Fixture::start(ServerConfig {
        admission,
        ..ServerConfig::default()
    })
    .await;
    let _first = DeltaClient::open(&fx, "minted-0").await.unwrap();
    for n in 1..5 {
        let refused = DeltaClient::open(&fx, &format!("minted-{n}"))
            .await
            .err()
            .expect("a new node id from the same address is not a new client");
        assert_eq!(refused.code(), tonic::Code::Unavailable);
    }
    assert_eq!(
        fx.server
            .stats()
            .refused_streams
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );
}

on_every_transport!(
    a_stream_subscribing_past_the_names_cap_is_ended_and_the_server_serves_on,
    a_stream_subscribing_past_the_names_cap_is_ended_and_the_server_serves_on_on
);

async fn a_stream_subscribing_past_the_names_cap_is_ended_and_the_server_serves_on_on(
    transport: Transport,
) {
    // Goal: one stream cannot make the server hold an unbounded subscription; the refusal
    // says why, and other streams (and later ones) are served as before.
    let mut fx = Fixture::start_via(
        transport,
        ServerConfig {
            resource_names_max: 8,
            ..ServerConfig::default()
        },
    )
    .await;
    fx.publish(view(1, &[1]));
    let mut greedy = DeltaClient::open(&fx, "greedy").await.unwrap();
    let cds = greedy.next().await;
    greedy.send(ack(&cds)).await;
    greedy
        .send(DeltaDiscoveryRequest {
            type_url: TYPE_ENDPOINT.into(),
            resource_names_subscribe: (0..9).map(|n| format!("svc-{n}")).collect(),
            ..Default::default()
        })
        .await;
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match greedy.rx.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without a status"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the stream is ended");
    assert_eq!(ended.code(), tonic::Code::ResourceExhausted, "{ended:?}");
    assert!(ended.message().contains("at most 8"), "{ended:?}");
    assert_eq!(
        fx.server
            .stats()
            .oversubscribed_streams
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    let mut modest = DeltaClient::open(&fx, "modest").await.unwrap();
    let cds = modest.next().await;
    assert_eq!(cds.type_url, TYPE_CLUSTER);
    modest.send(ack(&cds)).await;
    modest.send(subscribe_endpoints()).await;
    assert_eq!(modest.next().await.type_url, TYPE_ENDPOINT);
}

on_every_transport!(
    a_request_over_the_size_cap_ends_its_stream_before_it_is_decoded,
    a_request_over_the_size_cap_ends_its_stream_before_it_is_decoded_on
);

async fn a_request_over_the_size_cap_ends_its_stream_before_it_is_decoded_on(transport: Transport) {
    let mut fx = Fixture::start_via(
        transport,
        ServerConfig {
            request_bytes_max: 4 * 1024,
            ..ServerConfig::default()
        },
    )
    .await;
    fx.publish(view(1, &[1]));
    let mut big = DeltaClient::open(&fx, "big").await.unwrap();
    let cds = big.next().await;
    // A NACK of the response just sent, with an error text far over the cap.
    big.send(DeltaDiscoveryRequest {
        error_detail: Some(RpcStatus {
            code: 3,
            message: "e".repeat(16 * 1024),
            details: Vec::new(),
        }),
        ..ack(&cds)
    })
    .await;
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match big.rx.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without a status"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the stream is ended");
    assert_eq!(ended.code(), tonic::Code::OutOfRange, "{ended:?}");
    // It was refused whole: no NACK was recorded, and the server goes on serving.
    assert!(
        fx.server
            .sync_state()
            .iter()
            .all(|c| c.types.values().all(|t| t.nacks == 0))
    );
    let mut next = DeltaClient::open(&fx, "next").await.unwrap();
    assert_eq!(next.next().await.type_url, TYPE_CLUSTER);
}

on_every_transport!(
    a_response_over_the_size_limit_ends_its_stream_with_out_of_range,
    a_response_over_the_size_limit_ends_its_stream_with_out_of_range_on
);

async fn a_response_over_the_size_limit_ends_its_stream_with_out_of_range_on(transport: Transport) {
    let mut fx = Fixture::start_via(
        transport,
        ServerConfig {
            response_bytes_max: 2 * 1024,
            ..ServerConfig::default()
        },
    )
    .await;
    // One cluster fits; its assignment of 200 endpoints does not.
    let everyone: Vec<u8> = (1..=200).collect();
    fx.publish(view(1, &everyone));
    let mut c = DeltaClient::open(&fx, "over").await.unwrap();
    let cds = c.next().await;
    assert_eq!(cds.type_url, TYPE_CLUSTER);
    c.send(ack(&cds)).await;
    c.send(subscribe_endpoints()).await;
    let ended = tokio::time::timeout(WAIT, c.rx.message())
        .await
        .expect("the stream is ended");
    match ended {
        Err(status) => assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}"),
        Ok(resp) => panic!("expected OUT_OF_RANGE, got {resp:?}"),
    }
    let mut next = DeltaClient::open(&fx, "next").await.unwrap();
    assert_eq!(next.next().await.type_url, TYPE_CLUSTER);
}

#[tokio::test]
async fn large_responses_written_as_shared_chunks_arrive_whole_release_after_release() {
    // Goal: the ADS service writes each response as chunks (the stream's own bytes, then
    // the snapshot's shared encodings) with no encode buffer of its own, and starts its
    // request buffer small (`waymark_xds::server::service::CODEC_BUFFER_BYTES`); responses far
    // larger, then small, then large again, arrive whole and decode to every endpoint.
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use prost::Message as _;
    let mut fx = Fixture::start(ServerConfig::default()).await;
    let everyone: Vec<u8> = (1..=200).collect();
    fx.publish(view(1, &everyone));
    let mut c = DeltaClient::open(&fx, "envoy-big").await.unwrap();
    let cds = c.next().await;
    c.send(ack(&cds)).await;
    c.send(subscribe_endpoints()).await;
    let endpoints = |resp: &DeltaDiscoveryResponse| {
        let any = resp.resources[0].resource.as_ref().unwrap();
        let cla = ClusterLoadAssignment::decode(any.value.as_slice()).unwrap();
        (
            resp.resources[0].version.clone(),
            cla.endpoints
                .iter()
                .map(|l| l.lb_endpoints.len())
                .sum::<usize>(),
            resp.encoded_len(),
        )
    };
    let first = c.next().await;
    let (version, count, len) = endpoints(&first);
    assert_eq!((version.as_str(), count), ("1", 200));
    assert!(
        len > 16 * waymark_xds::server::service::CODEC_BUFFER_BYTES,
        "the response ({len} bytes) must dwarf the request buffer"
    );
    c.send(ack(&first)).await;
    for (version, members) in [(2, &everyone[..1]), (3, &everyone[..])] {
        fx.publish(view(version, members));
        let resp = c.next().await;
        let (got, count, _) = endpoints(&resp);
        assert_eq!((got, count), (version.to_string(), members.len()));
        c.send(ack(&resp)).await;
    }
}

/// A request on a raw HTTP/2 connection to `fx`: the response head, and whether it ended
/// the stream with no body (a refusal).
async fn raw_request(
    fx: &Fixture,
    path: &str,
    headers: &[(&str, &str)],
) -> (http::Response<()>, bool) {
    let tcp = tokio::net::TcpStream::connect(fx.addr).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut request = http::Request::post(format!("http://{}{path}", fx.addr));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let (response, _body) = client
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    let response = tokio::time::timeout(WAIT, response).await.unwrap().unwrap();
    let ended = response.body().is_end_stream();
    let (head, _) = response.into_parts();
    (http::Response::from_parts(head, ()), ended)
}

#[tokio::test]
async fn a_direct_listener_refuses_what_is_not_ads_and_says_why() {
    let mut fx = Fixture::start(ServerConfig::default()).await;
    fx.publish(view(1, &[1]));
    let grpc = ("content-type", "application/grpc");
    let delta = waymark_xds::server::service::DELTA_PATH;
    // Another method of the same service, or another service: UNIMPLEMENTED, as a gRPC
    // server without it would say.
    for path in [
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/Nope",
        "/grpc.health.v1.Health/Check",
    ] {
        let (response, ended) = raw_request(&fx, path, &[grpc]).await;
        assert_eq!(response.status(), http::StatusCode::OK, "{path}");
        assert_eq!(response.headers()["grpc-status"], "12", "{path}");
        assert!(ended, "a trailers-only refusal: {path}");
    }
    // Not gRPC at all: HTTP's own refusal.
    let (response, ended) = raw_request(&fx, delta, &[("content-type", "text/plain")]).await;
    assert_eq!(response.status(), http::StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(ended);
    // Compressed requests: this server decompresses nothing.
    let (response, ended) = raw_request(&fx, delta, &[grpc, ("grpc-encoding", "gzip")]).await;
    assert_eq!(response.headers()["grpc-status"], "12");
    assert!(
        response.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .contains("gzip")
    );
    assert!(ended);
    // None of them became a stream, and the server serves on.
    assert!(fx.server.sync_state().is_empty());
    let mut c = DeltaClient::open(&fx, "after").await.unwrap();
    assert_eq!(c.next().await.type_url, TYPE_CLUSTER);
}

#[tokio::test]
async fn shutting_down_a_direct_listener_ends_every_stream_with_unavailable() {
    let mut fx = Fixture::start(ServerConfig::default()).await;
    fx.publish(view(1, &[1]));
    let mut streams = Vec::new();
    for id in ["s1", "s2"] {
        let mut c = DeltaClient::open(&fx, id).await.unwrap();
        assert_eq!(c.next().await.type_url, TYPE_CLUSTER);
        streams.push(c);
    }
    let _ = fx.stop.take().unwrap().send(());
    for mut c in streams {
        let ended = tokio::time::timeout(WAIT, c.rx.message())
            .await
            .expect("the stream ends")
            .expect_err("with a status");
        assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
    }
    tokio::time::timeout(WAIT, fx.serving)
        .await
        .expect("serve returns once its streams are ended")
        .unwrap();
}

#[tokio::test]
async fn a_peer_that_never_answers_a_keepalive_ping_is_disconnected() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let keepalive = Keepalive {
        interval: Duration::from_millis(200),
        timeout: Duration::from_millis(200),
    };
    let fx = Fixture::start_on(Transport::Direct, ServerConfig::default(), keepalive).await;
    // An HTTP/2 client that opens the connection and then goes silent: the preface and an
    // empty SETTINGS frame, and nothing after — no SETTINGS ACK, no PING ACK.
    let mut tcp = tokio::net::TcpStream::connect(fx.addr).await.unwrap();
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let closed = tokio::time::timeout(WAIT, async {
        let mut buf = [0; 1024];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the server kept a peer that answers no ping"
    );
    // The server did ping: a PING frame (type 6) without the ACK flag went out.
    assert!(
        frames(&seen).any(|(kind, flags)| kind == 6 && flags & 1 == 0),
        "no PING was sent"
    );
}

/// (type, flags) of each HTTP/2 frame in what a server wrote.
fn frames(mut bytes: &[u8]) -> impl Iterator<Item = (u8, u8)> + '_ {
    std::iter::from_fn(move || {
        let head = bytes.get(..9)?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let frame = (head[3], head[4]);
        bytes = bytes.get(9 + len..).unwrap_or(&[]);
        Some(frame)
    })
}

on_every_transport!(
    a_client_that_closes_its_side_gets_its_stream_ended_with_ok,
    a_client_that_closes_its_side_gets_its_stream_ended_with_ok_on
);

async fn a_client_that_closes_its_side_gets_its_stream_ended_with_ok_on(transport: Transport) {
    let mut fx = Fixture::start_via(transport, ServerConfig::default()).await;
    fx.publish(view(1, &[1]));
    let mut c = DeltaClient::open(&fx, "closing").await.unwrap();
    assert_eq!(c.next().await.type_url, TYPE_CLUSTER);
    let DeltaClient { tx, mut rx } = c;
    drop(tx);
    let end = tokio::time::timeout(WAIT, rx.message())
        .await
        .expect("the stream ends");
    assert!(matches!(end, Ok(None)), "{transport:?}: {end:?}");
    until("the stream is gone from the sync state", WAIT, async || {
        fx.server.sync_state().is_empty()
    })
    .await;
}

/// The version and endpoint count of the load assignment a response carries first.
fn held_endpoints(resp: &DeltaDiscoveryResponse) -> (String, usize) {
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use prost::Message as _;
    let any = resp.resources[0].resource.as_ref().unwrap();
    let cla = ClusterLoadAssignment::decode(any.value.as_slice()).unwrap();
    let count = cla.endpoints.iter().map(|l| l.lb_endpoints.len()).sum();
    (resp.resources[0].version.clone(), count)
}

/// A connection that counts the writes its server gives it.
struct CountedWrites {
    io: tokio::net::TcpStream,
    writes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl tokio::io::AsyncRead for CountedWrites {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for CountedWrites {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl waymark_xds::server::http2::AdsConnection for CountedWrites {
    fn peer(&self) -> waymark_xds::server::http2::Peer {
        waymark_xds::server::http2::Peer::default()
    }
}

#[tokio::test]
async fn a_release_leaves_a_connection_in_one_write_however_many_streams_it_carries() {
    // Twenty sidecars' streams over one HTTP/2 connection, as a node agent multiplexes
    // them, each holding a load assignment of forty endpoints (well over the size at
    // which `h2` writes a response on its own).
    const STREAMS: usize = 20;
    // They count as one client for reconnection admission; let them all in.
    let admission = AdmissionConfig {
        floor: 64,
        ..AdmissionConfig::default()
    };
    let (server, publisher) = XdsServer::new(ServerConfig {
        admission,
        ..ServerConfig::default()
    });
    let mut builder = SnapshotBuilder::new();
    let members: Vec<u8> = (1..=40).collect();
    assert!(builder.handle_release(&view(1, &members)));
    publisher.publish(builder.build());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let writes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = writes.clone();
    let incoming = futures::stream::unfold(listener, move |listener| {
        let writes = counted.clone();
        async move {
            let accepted = listener
                .accept()
                .await
                .map(|(io, _)| CountedWrites { io, writes });
            Some((accepted, listener))
        }
    });
    tokio::spawn(server.clone().serve_incoming(
        incoming,
        waymark_certs::grpc::GrpcLimits::default(),
        std::future::pending(),
    ));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        let (tx, requests) = mpsc::channel(4);
        let mut first = subscribe_endpoints();
        first.node = Some(node(&format!("sidecar-{s}")));
        tx.send(first).await.unwrap();
        let rx = AggregatedDiscoveryServiceClient::new(channel.clone())
            .delta_aggregated_resources(ReceiverStream::new(requests))
            .await
            .unwrap()
            .into_inner();
        let mut c = DeltaClient { tx, rx };
        let resp = c.next().await;
        assert_eq!(held_endpoints(&resp), ("1".to_owned(), 40));
        c.send(ack(&resp)).await;
        streams.push(c);
    }
    let acked = || {
        let state = server.sync_state();
        state.len() == STREAMS
            && state.iter().all(|c| {
                c.types
                    .get(TYPE_ENDPOINT)
                    .is_some_and(|t| t.acked.as_deref() == Some("1"))
            })
    };
    until("every stream acknowledged", WAIT, async || acked()).await;

    let before = writes.load(std::sync::atomic::Ordering::SeqCst);
    assert!(builder.handle_release(&view(2, &members[1..])));
    publisher.publish(builder.build());
    for c in &mut streams {
        let resp = c.next().await;
        assert_eq!(held_endpoints(&resp), ("2".to_owned(), 39));
    }
    let release_writes = writes.load(std::sync::atomic::Ordering::SeqCst) - before;
    // One response per stream once took a write each. The release wakes the connection
    // once and its responses leave together.
    assert!(
        (1..=2).contains(&release_writes),
        "{STREAMS} streams' responses took {release_writes} writes"
    );
}
