//! Real mutual-TLS handshakes over loopback TCP, with tonic and the grpc.health.v1 service.
// Helpers outside #[test] fns panic on purpose: a panic is how a test reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use tokio::net::TcpListener;
use tonic::transport::{Channel, Endpoint, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use waymark_certs::grpc::{IncomingConfig, TlsConnector, incoming, peer_identity};
use waymark_certs::metrics::RejectSource;
use waymark_certs::tls::{ALPN_H2, LiveMaterial, client_config, server_config};
use waymark_certs::{CertError, CertMetrics, Identity, IdentityKind, KindSet, RejectReason};

struct Harness {
    addr: std::net::SocketAddr,
    metrics: CertMetrics,
    seen: Arc<Mutex<Vec<Identity>>>,
}

/// Serves grpc.health.v1 over mTLS as `server_identity`, admitting `accepted` kinds; the
/// interceptor records the identity tonic hands to handlers.
async fn serve(pki: &TestPki, server_identity: &str, accepted: KindSet) -> Harness {
    let live = pki.live(server_identity);
    let metrics = CertMetrics::new();
    let tls = server_config(&live, policy(accepted), metrics.clone(), &[ALPN_H2]).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let (_reporter, health) = tonic_health::server::health_reporter();
    let svc = tonic::service::interceptor::InterceptedService::new(
        health,
        move |req: tonic::Request<()>| {
            let who = peer_identity(&req)
                .cloned()
                .ok_or_else(|| tonic::Status::unauthenticated("no peer identity"))?;
            record.lock().unwrap().push(who);
            Ok(req)
        },
    );
    let stream = incoming(listener, Arc::new(tls), IncomingConfig::default());
    tokio::spawn(
        Server::builder()
            .add_service(svc)
            .serve_with_incoming(stream),
    );
    Harness {
        addr,
        metrics,
        seen,
    }
}

async fn channel(
    addr: std::net::SocketAddr,
    config: rustls::ClientConfig,
) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(PATIENCE)
        .timeout(PATIENCE)
        .connect_with_connector(TlsConnector::new(Arc::new(config)))
        .await
}

/// A node's client configuration, admitting only authorities.
fn node_client(live: &Arc<LiveMaterial>) -> rustls::ClientConfig {
    client_config(
        live,
        policy(only(IdentityKind::Authority)),
        CertMetrics::new(),
        &[ALPN_H2],
    )
    .unwrap()
}

async fn check(addr: std::net::SocketAddr, config: rustls::ClientConfig) -> anyhow::Result<()> {
    let channel = channel(addr, config).await?;
    HealthClient::new(channel)
        .check(HealthCheckRequest::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn node_with_valid_certificate_reaches_health_and_handler_sees_its_identity() {
    let pki = estate();
    let server = serve(&pki, AUTHORITY, only(IdentityKind::Node)).await;
    check(server.addr, node_client(&pki.live(NODE)))
        .await
        .unwrap();
    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(seen, vec![NODE.parse::<Identity>().unwrap()]);
}

#[tokio::test]
async fn each_bad_client_certificate_is_refused_and_counted_by_reason() {
    let pki = estate();
    let server = serve(&pki, AUTHORITY, only(IdentityKind::Node)).await;
    for case in pki.bad_clients(NODE, WORKLOAD) {
        let before = server.metrics.rejected(case.reason, RejectSource::Peer);
        let config = raw_client_config(
            Some(case.key),
            pki.verifier(only(IdentityKind::Authority)),
            ALPN_H2,
        );
        let result = check(server.addr, config).await;
        assert!(
            result.is_err(),
            "{}: a bad certificate was admitted",
            case.name
        );
        assert_eq!(
            server.metrics.rejected(case.reason, RejectSource::Peer),
            before + 1,
            "{}: not counted as {}",
            case.name,
            case.reason
        );
    }
    // Nothing bad reached a handler.
    assert!(server.seen.lock().unwrap().is_empty());
    // And each case landed under its own reason only.
    for reason in RejectReason::ALL {
        assert!(
            server.metrics.rejected(reason, RejectSource::Peer) <= 1,
            "{reason}"
        );
    }
}

#[tokio::test]
async fn client_refuses_a_server_of_the_wrong_kind_with_a_typed_error() {
    let pki = estate();
    // The server is a node agent, but this client only talks to authority members.
    let server = serve(&pki, NODE, only(IdentityKind::Node)).await;
    let client_live = pki.live(NODE);
    let metrics = CertMetrics::new();
    let config = client_config(
        &client_live,
        policy(only(IdentityKind::Authority)),
        metrics.clone(),
        &[ALPN_H2],
    )
    .unwrap();
    let err = channel(server.addr, config).await.unwrap_err();
    let typed = CertError::from_tls(&err).expect("a CertError in the chain");
    assert!(matches!(typed, CertError::WrongKind { .. }), "{typed:?}");
    assert_eq!(typed.reason(), RejectReason::WrongKind);
    assert!(
        typed
            .to_string()
            .starts_with("node identity spiffe://mesh.test/region/eu/node/n1 is not accepted here")
    );
    assert_eq!(
        metrics.rejected(RejectReason::WrongKind, RejectSource::Peer),
        1
    );
}

#[tokio::test]
async fn server_rotation_is_seen_by_the_next_connection() {
    let pki = estate();
    let live: Arc<LiveMaterial> = pki.live(AUTHORITY);
    let tls = server_config(
        &live,
        policy(only(IdentityKind::Node)),
        CertMetrics::new(),
        &[ALPN_H2],
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_r, health) = tonic_health::server::health_reporter();
    let stream = incoming(listener, Arc::new(tls), IncomingConfig::default());
    tokio::spawn(
        Server::builder()
            .add_service(health)
            .serve_with_incoming(stream),
    );

    let client_live = pki.live(NODE);
    let serial_seen = |config: rustls::ClientConfig| async move {
        // Dial with a raw TLS client to read the server's leaf serial.
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .unwrap();
        let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
        waymark_certs::material::cert_info(&leaf).unwrap().serial
    };
    let config = || node_client(&client_live);
    let first = serial_seen(config()).await;
    assert_eq!(first, live.current().leaf.serial);

    let generation = live.swap(pki.material(&pki.leaf(AUTHORITY), KindSet::ALL));
    assert_eq!(generation, 1);
    let second = serial_seen(config()).await;
    assert_ne!(first, second);
    assert_eq!(second, live.current().leaf.serial);
}

/// HTTP/2 writes a frame's header and payload as separate buffers; the accepted TLS
/// stream must take them in one gathered write (one record, one system call) rather than
/// falling back to a write per buffer, and deliver them whole and in order.
#[tokio::test]
async fn an_accepted_tls_stream_writes_gathered_buffers_whole_and_in_order() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;
    use tower::Service;

    let pki = estate();
    let live = pki.live(AUTHORITY);
    let tls = server_config(
        &live,
        policy(only(IdentityKind::Node)),
        CertMetrics::new(),
        &[ALPN_H2],
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut accepted = incoming(listener, Arc::new(tls), IncomingConfig::default());
    let client = node_client(&pki.live(NODE));
    let uri: tonic::codegen::http::Uri = format!("https://{addr}").parse().unwrap();
    let (peer, served) = tokio::join!(
        TlsConnector::new(Arc::new(client)).call(uri),
        accepted.next()
    );
    let mut peer = peer.unwrap().into_inner();
    let mut served = served.unwrap().unwrap();

    assert!(tokio::io::AsyncWrite::is_write_vectored(&served));
    let parts: [&[u8]; 3] = [b"header:", b"payload;", b"next frame"];
    let mut slices = parts.map(std::io::IoSlice::new);
    let mut slices = &mut slices[..];
    while !slices.is_empty() {
        let n = served.write_vectored(slices).await.unwrap();
        assert!(n > 0);
        std::io::IoSlice::advance_slices(&mut slices, n);
    }
    served.flush().await.unwrap();
    let mut got = vec![0; parts.concat().len()];
    tokio::time::timeout(PATIENCE, peer.read_exact(&mut got))
        .await
        .expect("the bytes arrive")
        .unwrap();
    assert_eq!(got, parts.concat());
}
