//! A node agent dials only its own region's authorities (ADR-15): its upstream TLS policy
//! takes the region from its own certificate, so a genuine authority of another region is
//! refused in the handshake, and one of its own region is accepted.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use waymark_agent::node::NodeAgent;
use waymark_agent::node::config::Tls;
use waymark_certs::testing::TestPkiDir;
use waymark_certs::{IdentityKind, KindSet};

const TD: &str = "waymark.test";
const WAIT: Duration = Duration::from_secs(30);

/// A TLS listener presenting `who`'s certificate and admitting node agents, reporting
/// each handshake's outcome (`Err` carries the server's view of the failure).
async fn fake_authority(
    pki: &TestPkiDir,
    who: &str,
) -> (SocketAddr, mpsc::Receiver<Result<(), String>>) {
    let config = pki.server(who, pki.policy(KindSet::only(IdentityKind::Node)));
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let outcome = match acceptor.accept(tcp).await {
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            };
            if tx.send(outcome).await.is_err() {
                return;
            }
        }
    });
    (addr, rx)
}

async fn agent(pki: &TestPkiDir, dir: &std::path::Path, upstream: SocketAddr) -> NodeAgent {
    let mut config = common::agent_on_loopback("n1", "eu", "a", dir, &[upstream]);
    config.tls = Some(Tls::new(TD, &pki.issue("region/eu/node/n1")));
    NodeAgent::start(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_agent_refuses_another_regions_authority_and_accepts_its_own() {
    // Goal: an eu node agent ends the handshake with a us authority (the agent's verifier
    // refuses it, so the server sees the agent's alert) and completes it with an eu one.
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPkiDir::init(&dir.path().join("pki"), TD, &["eu", "us"]);

    let (us, mut us_handshakes) = fake_authority(&pki, "region/us/authority/a1").await;
    let refused = agent(&pki, &dir.path().join("agent-us"), us).await;
    let outcome = tokio::time::timeout(WAIT, us_handshakes.recv())
        .await
        .expect("the agent dialled the us authority")
        .unwrap();
    let err = outcome.expect_err("a us authority was admitted by an eu node agent");
    assert!(err.contains("received fatal alert"), "{err}");
    refused.shutdown().await;

    let (eu, mut eu_handshakes) = fake_authority(&pki, "region/eu/authority/a1").await;
    let admitted = agent(&pki, &dir.path().join("agent-eu"), eu).await;
    let outcome = tokio::time::timeout(WAIT, eu_handshakes.recv())
        .await
        .expect("the agent dialled the eu authority")
        .unwrap();
    assert_eq!(
        outcome,
        Ok(()),
        "an eu node agent refused its own region's authority"
    );
    admitted.shutdown().await;
}
