//! Every TLS door of a region refuses who it should, counts it under its reason, and
//! changes nothing (ADR-15): the authority's API, xDS and ingest listeners and a node
//! agent's sidecar listener, each tried with no credential, a certificate of the wrong
//! kind, of another region, of another trust domain and of another estate, and the API
//! also with a verified principal that lacks the grant.
//!
//! Raft's listener is tried the same way in `authority_cluster.rs`, federation's in
//! `federation_quic.rs`, gossip's (keyed, not certified) in `gossip_udp.rs`.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::pki::{estate, request, tls_client, tls_client_alpn};
use rustls::sign::CertifiedKey;
use serde_json::json;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::member::Authority;
use waymark_agent::authority::settings::TlsSettings;
use waymark_agent::node::NodeAgent;
use waymark_agent::node::config::Tls;
use waymark_certs::ca::HostSan;
use waymark_certs::reload::ReloadEvent;
use waymark_certs::testing::{TestPkiDir, certified};

const TD: &str = "waymark.test";
const WAIT: Duration = Duration::from_secs(30);

type Presented = Arc<CertifiedKey>;

/// The credentials every listener is tried with, each with the reason it must be refused
/// under (`None`: no certificate at all).
fn strangers(
    pki: &TestPkiDir,
    other_estate: &TestPkiDir,
    wrong_kind: &str,
) -> Vec<(&'static str, Option<Presented>)> {
    vec![
        ("no_certificate", None),
        ("wrong_kind", Some(pki.certified(wrong_kind))),
        (
            "wrong_region",
            Some(pki.certified("region/us/service/pay/instance/p1")),
        ),
        (
            "wrong_trust_domain",
            Some(certified(
                &pki.forge("eu", "spiffe://other.test/region/eu/node/n1"),
            )),
        ),
        (
            "wrong_ca",
            Some(other_estate.certified("region/eu/node/n1")),
        ),
    ]
}

/// Whether a gRPC (h2) listener admits a TLS client with `config`: an admitted client
/// reads the server's HTTP/2 SETTINGS; a refused one an alert or the connection's end.
async fn grpc_admits(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> bool {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let Ok(mut tls) = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
    else {
        return false;
    };
    let mut first = [0u8; 9];
    matches!(
        tokio::time::timeout(WAIT, tls.read(&mut first)).await,
        Ok(Ok(n)) if n > 0
    )
}

async fn authority(pki: &TestPkiDir, dir: &std::path::Path) -> Authority {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = common::plain(&dir.join("authority"), "eu", &["a"], any);
    config.ingest = Some(any);
    config.tls = Some(TlsSettings {
        trust_domain: pki.trust_domain().clone(),
        paths: pki.issue_with_hosts("region/eu/authority/1", &HostSan::loopback()),
    });
    common::single_member(config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authoritys_api_refuses_strangers_and_principals_without_the_grant() {
    waymark_certs::install_crypto_provider();
    let (pki, other) = (estate(TD), estate("other.test"));
    let dir = tempfile::tempdir().unwrap();
    let a = authority(&pki, dir.path()).await;
    let operator = common::operator(&a, "alice").await;
    let api = a.http_addr();

    // Plaintext to the TLS port gets no answer at all.
    assert!(request(api, None, "GET", "/v1/services", "").await.is_err());
    // TLS without a certificate or token: 401, naming what to present.
    let anonymous = tls_client(&pki, None);
    let (status, body) = request(api, Some(Arc::clone(&anonymous)), "GET", "/v1/services", "")
        .await
        .unwrap();
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("\"unauthenticated\""), "{body}");
    // The probes stay open (a kubelet has no credential).
    let (status, _) = request(api, Some(anonymous), "GET", "/readyz", "")
        .await
        .unwrap();
    assert_eq!(status, 200);

    // Certificates of the wrong kind, region, trust domain or estate: refused in the
    // handshake, each counted under its reason. (No certificate is admitted to the
    // handshake here: a token may follow.)
    for (reason, cert) in strangers(&pki, &other, "region/eu/authority/2") {
        let Some(cert) = cert else { continue };
        let client = tls_client(&pki, Some(cert));
        let answer = request(api, Some(client), "GET", "/v1/services", "").await;
        assert!(answer.is_err(), "{reason}: answered {answer:?}");
        let series = format!(
            "waymark_http_tls_handshakes_failed_total{{listener=\"authority\",reason=\"{reason}\"}}"
        );
        common::counted(&operator, &series, 1).await;
    }

    // A verified node agent of this region reads (its region-wide grant) but may not own
    // a service or take an instance out: 403 naming the capability, and nothing changes.
    let node = tls_client(&pki, Some(pki.certified("region/eu/node/n1")));
    let (status, body) = request(api, Some(Arc::clone(&node)), "GET", "/v1/services", "")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let contract = json!({"owner": "team-pay", "contract": {}}).to_string();
    let (status, body) = request(
        api,
        Some(Arc::clone(&node)),
        "PUT",
        "/v1/services/pay",
        &contract,
    )
    .await
    .unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("own:pay"), "{body}");
    // An operator certificate with no grant is refused the same way: default deny.
    let mallory = tls_client(&pki, Some(pki.certified("operator/mallory")));
    let (status, body) = request(api, Some(mallory), "GET", "/v1/services", "")
        .await
        .unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("operator/mallory"), "{body}");
    let services = operator.get_json("/v1/services").await.unwrap();
    assert_eq!(services, json!([]), "nothing was declared");
    common::counted(
        &operator,
        "waymark_api_refusals_total{reason=\"forbidden\"}",
        2,
    )
    .await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authoritys_xds_and_ingest_listeners_admit_only_this_regions_nodes_and_workloads() {
    waymark_certs::install_crypto_provider();
    let (pki, other) = (estate(TD), estate("other.test"));
    let dir = tempfile::tempdir().unwrap();
    let a = authority(&pki, dir.path()).await;
    let operator = common::operator(&a, "alice").await;
    let listeners = [
        ("authority_xds", a.xds_addr()),
        ("ingest", a.ingest_addr().unwrap()),
    ];
    for (name, addr) in listeners {
        // This region's node agent is admitted: the refusals below are about who, not how.
        let node = tls_client_alpn(&pki, Some(pki.certified("region/eu/node/n1")), b"h2");
        assert!(grpc_admits(addr, node).await, "{name} admits eu/n1");
        for (reason, cert) in strangers(&pki, &other, "region/eu/authority/2") {
            let client = tls_client_alpn(&pki, cert, b"h2");
            assert!(
                !grpc_admits(addr, client).await,
                "{name}: {reason} admitted"
            );
            let series = format!(
                "waymark_grpc_tls_handshakes_failed_total{{listener=\"{name}\",reason=\"{reason}\"}}"
            );
            common::counted(&operator, &series, 1).await;
        }
    }
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_agents_sidecar_listener_admits_only_its_own_regions_workloads() {
    waymark_certs::install_crypto_provider();
    let (pki, other) = (estate(TD), estate("other.test"));
    let dir = tempfile::tempdir().unwrap();
    // Nothing answers upstream: the sidecar listener serves the last-known-good view.
    let nobody = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let mut config =
        common::agent_on_loopback("n1", "eu", "a", &dir.path().join("agent"), &[nobody]);
    config.tls = Some(Tls::new(TD, &pki.issue("region/eu/node/n1")));
    let agent = NodeAgent::start(config).await.unwrap();
    let bound = agent.bound();
    let local = ApiClient::new(&bound.http.to_string(), None);
    let workload = pki.certified("region/eu/service/web/instance/w1");
    let sidecar = tls_client_alpn(&pki, Some(workload), b"h2");
    assert!(
        grpc_admits(bound.xds, sidecar).await,
        "eu's workload admitted"
    );
    // Here the wrong kind is a node agent (of this very region).
    for (reason, cert) in strangers(&pki, &other, "region/eu/node/n2") {
        let client = tls_client_alpn(&pki, cert, b"h2");
        assert!(!grpc_admits(bound.xds, client).await, "{reason} admitted");
        let series = format!(
            "waymark_grpc_tls_handshakes_failed_total{{listener=\"agent_xds\",reason=\"{reason}\"}}"
        );
        common::counted(&local, &series, 1).await;
    }
    // The verifier counted the certificate refusals too, each under the same reason.
    let text = common::metrics_text(&local).await;
    let series = "waymark_certs_rejected_total{reason=\"wrong_region\",source=\"peer\"}";
    assert_eq!(common::series_value(&text, series), 1, "{text}");
    agent.shutdown().await;
}

/// The serial of the certificate the server at `addr` presents.
async fn served_serial(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> String {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .unwrap();
    let leaf = &tls.get_ref().1.peer_certificates().unwrap()[0];
    waymark_certs::material::cert_info(leaf).unwrap().serial
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reissued_member_certificate_is_served_without_a_restart_and_a_foreign_one_refused() {
    // Goal: rotating a member's certificate is replacing its files; the next connection
    // gets the new one. A file naming another member is refused and the old one serves on.
    waymark_certs::install_crypto_provider();
    let pki = estate(TD);
    let dir = tempfile::tempdir().unwrap();
    let a = authority(&pki, dir.path()).await;
    let anonymous = tls_client(&pki, None);
    let before = served_serial(a.http_addr(), Arc::clone(&anonymous)).await;
    // Reissued in place (the same files the member was started with). The file watcher
    // may apply it before the explicit reload does; either way the next connection has it.
    let own = pki.issue_with_hosts("region/eu/authority/1", &HostSan::loopback());
    let event = a.reload().await.expect("a TLS member reloads");
    assert!(
        matches!(event, ReloadEvent::Swapped { .. } | ReloadEvent::Unchanged),
        "{event:?}"
    );
    let after = served_serial(a.http_addr(), Arc::clone(&anonymous)).await;
    assert_ne!(
        before, after,
        "the next connection presents the new certificate"
    );
    // Another member's certificate in this member's files: refused, the current serves on.
    let other = pki.issue("region/eu/authority/2");
    std::fs::copy(&other.key, &own.key).unwrap();
    std::fs::copy(&other.cert_chain, &own.cert_chain).unwrap();
    let event = a.reload().await.expect("a TLS member reloads");
    assert!(matches!(event, ReloadEvent::Rejected { .. }), "{event:?}");
    let kept = served_serial(a.http_addr(), anonymous).await;
    assert_eq!(kept, after, "the refused files are not served");
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_certificate_bootstraps_a_new_region_once_through_the_cli() {
    // Goal: `waymark acl bootstrap` with an operator's certificate (from the estate root)
    // is how a region started without a management token gets its first grant; the CLI
    // then works as that operator, and nobody bootstraps twice.
    waymark_certs::install_crypto_provider();
    let pki = estate(TD);
    let dir = tempfile::tempdir().unwrap();
    let a = authority(&pki, dir.path()).await;
    let root = pki.issue("operator/root");
    let mallory = pki.issue("operator/mallory");
    let cli = |who: &waymark_certs::reload::MaterialPaths, args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_waymark"))
            .args(args)
            .arg("--api")
            .arg(format!("https://{}", a.http_addr()))
            .arg("--ca-bundle")
            .arg(&who.bundle)
            .arg("--cert")
            .arg(&who.cert_chain)
            .arg("--key")
            .arg(&who.key)
            .env_remove("WAYMARK_TOKEN")
            .env_remove("WAYMARK_TOKEN_FILE")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    // Before bootstrap even the operator is refused: no grant exists.
    let (ok, text) = cli(&root, &["services"]);
    assert!(!ok && text.contains("403"), "{text}");
    let (ok, text) = cli(&root, &["acl", "bootstrap"]);
    assert!(ok, "{text}");
    let (ok, text) = cli(&root, &["acl", "whoami"]);
    assert!(ok && text.contains("operator/root"), "{text}");
    let (ok, text) = cli(&root, &["services"]);
    assert!(ok, "{text}");
    // A second bootstrap, by anyone, is refused and grants nothing.
    let (ok, text) = cli(&mallory, &["acl", "bootstrap"]);
    assert!(!ok, "{text}");
    let (ok, text) = cli(&mallory, &["services"]);
    assert!(!ok && text.contains("403"), "{text}");
    a.shutdown().await;
}
