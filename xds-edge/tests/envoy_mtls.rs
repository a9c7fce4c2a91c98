//! ADS over mutual TLS with a real Envoy: the sidecar presents its node identity (issued by
//! waymark's own CA, from files, as its bootstrap would in production) and the server admits
//! only node identities of its trust domain.

// Test helpers outside #[test] functions unwrap too: a panic is how a test reports.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::{Backend, Envoy, EnvoyConfig, Route, TlsFiles, Xds, XdsMode, views};
use waymark_certs::reload::MaterialPaths;
use waymark_certs::testing::TestPkiDir;
use waymark_certs::tls::{ALPN_H2, server_config};
use waymark_certs::{CertMetrics, IdentityKind, KindSet, RejectReason};
use waymark_core::view::{EndpointStatus, Markers, ReleasedView};
use waymark_xds::{Keepalive, ServerConfig, SnapshotBuilder, XdsServer};

const TD: &str = "mesh.test";
const PATIENCE: Duration = Duration::from_secs(20);

/// What Envoy's bootstrap names for its upstream TLS context.
fn envoy_tls(paths: MaterialPaths) -> TlsFiles {
    TlsFiles {
        cert_chain: paths.cert_chain,
        key: paths.key,
        ca: paths.bundle,
    }
}

fn view(backend: &Backend) -> ReleasedView {
    let e = views::endpoint(
        backend.name(),
        backend.addr(),
        "zone-a",
        0,
        100,
        EndpointStatus::Eligible,
    );
    views::released(1, "zone-a", [e], Markers::default())
}

/// Our server over mutual TLS as an authority member, admitting node identities only.
async fn authority(
    pki: &TestPkiDir,
    backend: &Backend,
) -> (XdsServer, CertMetrics, std::net::SocketAddr) {
    // Built by hand, not with `pki.server`: the test reads the refusals it counts.
    let own = pki.live("region/eu/authority/a1");
    let nodes = pki.policy(KindSet::only(IdentityKind::Node));
    let metrics = CertMetrics::new();
    let tls = server_config(&own, nodes, metrics.clone(), &[ALPN_H2]).unwrap();
    let (server, publisher) = XdsServer::new(ServerConfig::default());
    let mut builder = SnapshotBuilder::new();
    builder.handle_release(&view(backend));
    publisher.publish(builder.build());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = server.clone();
    tokio::spawn(async move {
        let _publisher = publisher; // keeps the snapshot channel open while serving
        serving
            .serve_tls(
                listener,
                Arc::new(tls),
                Keepalive::default(),
                std::future::pending(),
            )
            .await;
    });
    (server, metrics, addr)
}

fn sidecar(addr: std::net::SocketAddr, node: &str, tls: TlsFiles) -> EnvoyConfig {
    EnvoyConfig {
        node_id: node.into(),
        zone: "zone-a".into(),
        xds: Some(Xds {
            addr,
            mode: XdsMode::Delta,
        }),
        xds_tls: Some(tls),
        routes: vec![Route::new("/pay/", "pay")],
        ..EnvoyConfig::default()
    }
}

#[tokio::test]
async fn envoy_speaks_ads_over_mutual_tls_with_its_node_identity() {
    let pki = TestPkiDir::new(TD, &["eu"]);
    let backend = Backend::start("pay-a").await;
    let (server, _, addr) = authority(&pki, &backend).await;
    let node = format!("spiffe://{TD}/region/eu/node/n1");
    let envoy = Envoy::start(sidecar(addr, "n1", envoy_tls(pki.issue(&node)))).await;
    envoy.wait_live(PATIENCE).await;
    envoy
        .wait_until("the pay host", PATIENCE, async || {
            envoy.cluster_endpoints("pay").await == Some(vec![backend.addr()])
        })
        .await;
    let (status, body) = envoy.get("/pay/hi").await;
    assert_eq!((status, body.as_str()), (200, "pay-a"));
    let sync = server.sync_state();
    assert_eq!(
        sync[0].identity.as_deref(),
        Some(node.as_str()),
        "the stream is attributed to the node"
    );
}

#[tokio::test]
async fn a_sidecar_presenting_a_workload_identity_is_refused_and_counted() {
    let pki = TestPkiDir::new(TD, &["eu"]);
    let backend = Backend::start("pay-a").await;
    let (server, metrics, addr) = authority(&pki, &backend).await;
    let workload = envoy_tls(pki.issue("region/eu/service/pay/instance/i1"));
    let envoy = Envoy::start(sidecar(addr, "impostor", workload)).await;
    envoy
        .wait_until("the refusal counted", PATIENCE, async || {
            metrics.rejected(
                RejectReason::WrongKind,
                waymark_certs::metrics::RejectSource::Peer,
            ) >= 1
        })
        .await;
    assert!(server.sync_state().is_empty(), "no stream was opened");
    assert_eq!(
        envoy.cluster_endpoints("pay").await,
        None,
        "nothing was served"
    );
}
