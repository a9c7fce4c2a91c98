//! Real mutual-TLS handshakes over loopback UDP with quinn.
// Helpers outside #[test] fns panic on purpose: a panic is how a test reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::*;
use tokio::sync::mpsc;
use waymark_certs::metrics::RejectSource;
use waymark_certs::quic::{ALPN_WAYMARK, peer_identity, quic_client_config, quic_server_config};
use waymark_certs::{CertMetrics, Identity, IdentityKind, RejectReason};

struct QuicServer {
    addr: SocketAddr,
    metrics: CertMetrics,
    /// One item per incoming connection: the admitted identity, or the handshake error text.
    outcomes: mpsc::Receiver<Result<Identity, String>>,
    _endpoint: quinn::Endpoint,
}

/// An authority-member endpoint that admits only node agents and echoes one stream.
fn serve(pki: &TestPki) -> QuicServer {
    let live = pki.live(AUTHORITY);
    let metrics = CertMetrics::new();
    let config =
        quic_server_config(&live, policy(only(IdentityKind::Node)), metrics.clone()).unwrap();
    let endpoint = quinn::Endpoint::server(config, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let (tx, outcomes) = mpsc::channel(16);
    let accept = endpoint.clone();
    tokio::spawn(async move {
        while let Some(incoming) = accept.accept().await {
            let outcome = match incoming.await {
                Ok(conn) => {
                    let who = peer_identity(&conn).map_err(|e| e.to_string());
                    if let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        let msg = recv.read_to_end(1024).await.unwrap_or_default();
                        let _ = send.write_all(&msg).await;
                        let _ = send.finish();
                        let _ = conn.closed().await;
                    }
                    who
                }
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(outcome).await;
        }
    });
    QuicServer {
        addr,
        metrics,
        outcomes,
        _endpoint: endpoint,
    }
}

/// Connects with `config` and does one echo round trip.
async fn echo(addr: SocketAddr, config: quinn::ClientConfig) -> anyhow::Result<Vec<u8>> {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    endpoint.set_default_client_config(config);
    let conn = endpoint.connect(addr, "authority.invalid")?.await?;
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(b"ping").await?;
    send.finish()?;
    let reply = recv.read_to_end(1024).await?;
    conn.close(0u32.into(), b"done");
    endpoint.wait_idle().await;
    Ok(reply)
}

#[tokio::test]
async fn node_with_valid_certificate_completes_a_quic_round_trip() {
    let pki = estate();
    let mut server = serve(&pki);
    let client_live = pki.live(NODE);
    let config = quic_client_config(
        &client_live,
        policy(only(IdentityKind::Authority)),
        CertMetrics::new(),
    )
    .unwrap();
    let reply = tokio::time::timeout(PATIENCE, echo(server.addr, config))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply, b"ping");
    let seen = tokio::time::timeout(PATIENCE, server.outcomes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.unwrap(), NODE.parse::<Identity>().unwrap());
}

#[tokio::test]
async fn each_bad_client_certificate_is_refused_over_quic_with_its_reason() {
    let pki = estate();
    let mut server = serve(&pki);
    for case in pki.bad_clients(NODE, WORKLOAD) {
        let before = server.metrics.rejected(case.reason, RejectSource::Peer);
        let tls = raw_client_config(
            Some(case.key),
            pki.verifier(only(IdentityKind::Authority)),
            ALPN_WAYMARK,
        );
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
        let config = quinn::ClientConfig::new(Arc::new(crypto));
        let result = tokio::time::timeout(PATIENCE, echo(server.addr, config))
            .await
            .unwrap();
        assert!(
            result.is_err(),
            "{}: a bad certificate was admitted",
            case.name
        );
        // The server side of the same connection failed its handshake.
        let outcome = tokio::time::timeout(PATIENCE, server.outcomes.recv())
            .await
            .unwrap()
            .unwrap();
        let text = outcome.expect_err(case.name);
        assert_eq!(
            server.metrics.rejected(case.reason, RejectSource::Peer),
            before + 1,
            "{}: not counted as {} (server saw: {text})",
            case.name,
            case.reason
        );
    }
    for reason in RejectReason::ALL {
        assert!(
            server.metrics.rejected(reason, RejectSource::Peer) <= 1,
            "{reason}"
        );
    }
}

#[tokio::test]
async fn quic_client_refuses_a_server_of_the_wrong_kind() {
    let pki = estate();
    let server = serve(&pki);
    let client_live = pki.live(NODE);
    let metrics = CertMetrics::new();
    // This client only talks to node agents; the server is an authority member.
    let config = quic_client_config(
        &client_live,
        policy(only(IdentityKind::Node)),
        metrics.clone(),
    )
    .unwrap();
    let err = tokio::time::timeout(PATIENCE, echo(server.addr, config))
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("not accepted here"), "{err}");
    assert_eq!(
        metrics.rejected(RejectReason::WrongKind, RejectSource::Peer),
        1
    );
}
