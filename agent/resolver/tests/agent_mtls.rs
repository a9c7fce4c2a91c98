//! The resolver against a real node agent serving mutual TLS (ADR-15), on 127.0.0.1.
//!
//! The agent is started with a node certificate from `waymark_certs::layout::PkiDir` and an
//! upstream "authority" (an `XdsServer` behind mutual TLS with an authority certificate)
//! publishing one view. A resolver presenting a workload certificate of the agent's region
//! resolves it; without a certificate, with one of another region, of another trust domain,
//! or from a CA the estate never trusted, it is refused at the handshake and keeps
//! answering `Unknown`. Progress is awaited by polling an observable (the resolution, the
//! resolver's counters, the agent's `/metrics`) with a deadline; never a fixed sleep.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::{Endpoint, Server};
use waymark_agent::node::NodeAgent;
use waymark_agent::node::config::{AgentConfig, Bounds, Listen, ProbeSection, Tls};
use waymark_certs::grpc::{IncomingConfig, TlsConnector, incoming};
use waymark_certs::metrics::RejectSource;
use waymark_certs::reload::load_material;
use waymark_certs::testing::{TestPkiDir, raw_client_config};
use waymark_certs::tls::{ALPN_H2, LiveMaterial, server_config};
use waymark_certs::{CertMetrics, IdentityKind, KindSet, PeerPolicy, RejectReason, TrustDomain};
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::{
    EndpointStatus, Markers, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey,
};
use waymark_resolver::{Resolution, Resolver, ResolverConfig, ResolverError, ResolverTls};
use waymark_testkit::until;
use waymark_xds::client::{BackoffConfig, ClientConfig};
use waymark_xds::{Publisher, ServerConfig, SnapshotBuilder, XdsServer};

const TD: &str = "waymark.test";
const WAIT: Duration = Duration::from_secs(30);
/// Connect attempts a refused resolver must have made before the test calls it refused.
const ATTEMPTS: u64 = 2;

// === PKI ===

/// An estate of `trust_domain` with regions eu and us, in `dir`.
fn estate(dir: &Path, trust_domain: &str) -> TestPkiDir {
    TestPkiDir::init(dir, trust_domain, &["eu", "us"])
}

/// The resolver's TLS option for `uri`, of this test's trust domain.
fn resolver_tls(estate: &TestPkiDir, uri: &str) -> ResolverTls {
    let m = estate.issue(uri);
    ResolverTls::new(TD, m.cert_chain, m.key, m.bundle)
}

// === the view upstream, behind mutual TLS ===

fn released() -> ReleasedView {
    let endpoint = |n: u8| ViewEndpoint {
        instance: InstanceId::try_new(format!("pay-{n}")).unwrap(),
        address: Address {
            ip: [127, 0, 0, n].into(),
            port: 8000 + u16::from(n),
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
    ReleasedView {
        version: Version(1),
        view: View {
            key: ViewKey {
                service: ServiceName::try_new("pay").unwrap(),
                zone: ZoneName::try_new("a").unwrap(),
            },
            endpoints: [1, 2]
                .map(endpoint)
                .into_iter()
                .map(|e| (e.instance.clone(), e))
                .collect::<std::collections::BTreeMap<_, _>>()
                .into(),
            markers: Markers::default(),
        },
    }
}

/// An `XdsServer` presenting an eu authority certificate and admitting node agents,
/// publishing [`released`]. The publisher must outlive the test (dropping it ends streams).
async fn authority(estate: &TestPkiDir) -> (SocketAddr, Publisher) {
    let policy = PeerPolicy {
        trust_domain: TrustDomain::new(TD).unwrap(),
        accepted: KindSet::only(IdentityKind::Authority),
        region: None,
    };
    let paths = estate.issue(&format!("spiffe://{TD}/region/eu/authority/a1"));
    let material = load_material(&paths, &policy, SystemTime::now())
        .await
        .unwrap();
    let nodes = PeerPolicy {
        accepted: KindSet::only(IdentityKind::Node),
        ..policy
    };
    let tls = server_config(
        &LiveMaterial::new(material),
        nodes,
        CertMetrics::new(),
        &[ALPN_H2],
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (server, publisher) = XdsServer::new(ServerConfig::default());
    let mut builder = SnapshotBuilder::new();
    assert!(builder.handle_release(&released()));
    publisher.publish(builder.build());
    let incoming = incoming(listener, Arc::new(tls), IncomingConfig::default());
    tokio::spawn(
        Server::builder()
            .add_service(server.service())
            .serve_with_incoming(incoming),
    );
    (addr, publisher)
}

async fn node_agent(estate: &TestPkiDir, dir: &Path, upstream: SocketAddr) -> NodeAgent {
    let node = estate.issue(&format!("spiffe://{TD}/region/eu/node/n1"));
    NodeAgent::start(AgentConfig {
        name: "n1".parse().unwrap(),
        region: "eu".parse().unwrap(),
        zone: "a".parse().unwrap(),
        data_dir: dir.to_path_buf(),
        upstream: vec![upstream.to_string()],
        upstream_standby: true,
        ingest: Vec::new(),
        api: Vec::new(),
        listen: Listen {
            xds: "127.0.0.1:0".parse().unwrap(),
            dns: "127.0.0.1:0".parse().unwrap(),
            http: "127.0.0.1:0".parse().unwrap(),
            http_tokens_file: None,
            local_plaintext: false,
        },
        bounds: Bounds::default(),
        services_dir: None,
        api_token_file: None,
        gossip: None,
        tls: Some(Tls {
            trust_domain: TD.into(),
            cert_chain: node.cert_chain,
            key: node.key,
            bundle: node.bundle,
        }),
        probe: ProbeSection::default(),
    })
    .await
    .unwrap()
}

// === the resolver ===

fn config(agent: SocketAddr, cache: &Path) -> ResolverConfig {
    let mut config = ResolverConfig::new(format!("http://{agent}"), "caller-1", "a");
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

/// Waits until `resolver` has failed to connect [`ATTEMPTS`] times, then asserts it never
/// opened a stream and still knows nothing.
async fn refused(resolver: &Resolver, what: &str) {
    until(what, WAIT, async || {
        let stats = resolver.stats();
        if stats.connect_failures >= ATTEMPTS {
            Ok(())
        } else {
            Err(format!("{stats:?}"))
        }
    })
    .await;
    assert_eq!(resolver.stats().streams, 0, "{what}: a stream opened");
    assert!(!resolver.is_connected());
    assert_eq!(resolver.resolve("pay"), Resolution::Unknown);
}

/// The agent's `/metrics` exposition, over its loopback HTTP API.
async fn agent_metrics(agent: &NodeAgent) -> String {
    let mut tcp = TcpStream::connect(agent.bound().http).await.unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    tcp.read_to_string(&mut text).await.unwrap();
    text
}

fn counted(metrics: &str, reason: &str) -> u64 {
    let series = format!("waymark_certs_rejected_total{{reason=\"{reason}\",source=\"peer\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

struct Running {
    agent: NodeAgent,
    estate: TestPkiDir,
    _publisher: Publisher,
    dir: tempfile::TempDir,
}

async fn running() -> Running {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let estate = estate(&dir.path().join("pki"), TD);
    let (upstream, publisher) = authority(&estate).await;
    let agent = node_agent(&estate, &dir.path().join("agent"), upstream).await;
    Running {
        agent,
        estate,
        _publisher: publisher,
        dir,
    }
}

// === tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolver_presenting_its_workload_certificate_resolves_through_the_agent() {
    // Goal: the TLS option end to end: workload certificate out, the agent's node identity
    // (own region) admitted, the agent's view resolved; the agent counts no refusal.
    let r = running().await;
    let tls = resolver_tls(
        &r.estate,
        &format!("spiffe://{TD}/region/eu/service/cart/instance/i1"),
    );
    let metrics = tls.metrics.clone();
    let cache = r.dir.path().join("lkg.json");
    let resolver = Resolver::connect(config(r.agent.bound().xds, &cache).with_tls(tls)).unwrap();
    until("pay to resolve", WAIT, async || {
        let got = resolver.resolve("pay");
        if ports(&got) == [8001, 8002] {
            Ok(())
        } else {
            Err(format!("{got:?}, {:?}", resolver.stats()))
        }
    })
    .await;
    assert!(resolver.is_connected());
    assert_eq!(resolver.stats().connect_failures, 0);
    for reason in RejectReason::ALL {
        assert_eq!(metrics.rejected(reason, RejectSource::Peer), 0, "{reason}");
    }
    // The agent's own certificate metrics are on its /metrics, and it refused nobody.
    let text = agent_metrics(&r.agent).await;
    assert!(
        text.contains("waymark_certs_leaf_not_after_seconds "),
        "{text}"
    );
    assert_eq!(counted(&text, "wrong_ca"), 0);
    // A rotation the watcher would apply: unchanged files are recognised as such.
    assert!(matches!(
        resolver.reload_tls().await,
        Some(waymark_certs::reload::ReloadEvent::Unchanged)
    ));
    r.agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_certificate_the_agent_refuses_the_handshake() {
    // Goal: a TLS client that presents no certificate gets no xDS stream, and a plain-text
    // resolver towards the mutual-TLS listener never opens one either.
    let r = running().await;
    let xds = r.agent.bound().xds;
    // It checks the agent like the resolver would, but has no certificate to present.
    let verifier = r.estate.verifier(KindSet::only(IdentityKind::Node));
    let tls = raw_client_config(None, verifier, ALPN_H2);
    let attempt = async {
        let channel = Endpoint::from_shared(format!("http://{xds}"))
            .unwrap()
            .connect_with_connector(TlsConnector::new(Arc::new(tls)))
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let request = DeltaDiscoveryRequest::default();
        AggregatedDiscoveryServiceClient::new(channel)
            .delta_aggregated_resources(tokio_stream::iter([request]))
            .await
            .map(|_| ())
            .map_err(|status| format!("stream: {status:?}"))
    };
    let outcome = tokio::time::timeout(WAIT, attempt).await.unwrap();
    // The agent ends the handshake with certificate_required; whether the client reads
    // that alert (during connect, or as the first request's transport error) or only the
    // closed connection (a reset, a broken pipe) is a race, but the failure is the
    // transport's: no handler ever answered.
    let refusal = outcome.expect_err("a client without a certificate got a stream");
    assert!(
        refusal.starts_with("connect:")
            || refusal.contains("CertificateRequired")
            || refusal.contains("code: Cancelled")
            || refusal.contains("code: Unavailable")
            || refusal.contains("message: \"transport error\""),
        "{refusal}"
    );

    let cache = r.dir.path().join("plain.json");
    let plain = Resolver::connect(config(xds, &cache)).unwrap();
    refused(&plain, "the plain-text resolver to be refused").await;
    r.agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_of_another_region_refuses_the_agent_and_is_counted() {
    // Goal: the resolver's policy takes its region from its own certificate, so a genuine
    // us workload refuses the eu agent's node identity as wrong_region.
    let r = running().await;
    let tls = resolver_tls(
        &r.estate,
        &format!("spiffe://{TD}/region/us/service/cart/instance/i2"),
    );
    let metrics = tls.metrics.clone();
    let cache = r.dir.path().join("us.json");
    let resolver = Resolver::connect(config(r.agent.bound().xds, &cache).with_tls(tls)).unwrap();
    refused(&resolver, "the us resolver to refuse the eu agent").await;
    assert!(metrics.rejected(RejectReason::WrongRegion, RejectSource::Peer) >= ATTEMPTS);
    r.agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_of_another_trust_domain_is_refused_at_the_handshake() {
    // Goal: a caller of another estate (its own root and trust domain) cannot talk to this
    // agent (its chain leads nowhere the caller trusts); one whose certificate names our
    // trust domain but comes from a CA this estate never trusted is refused by the agent,
    // and the refusal shows on the agent's /metrics (wrong_ca).
    let r = running().await;
    let elsewhere = estate(&r.dir.path().join("pki-elsewhere"), "elsewhere.test");
    let m = elsewhere.issue("spiffe://elsewhere.test/region/eu/service/cart/instance/i1");
    let tls = ResolverTls::new("elsewhere.test", m.cert_chain, m.key, m.bundle);
    let metrics = tls.metrics.clone();
    let xds = r.agent.bound().xds;
    let resolver =
        Resolver::connect(config(xds, &r.dir.path().join("td.json")).with_tls(tls)).unwrap();
    refused(&resolver, "the other estate's resolver to be refused").await;
    assert!(metrics.rejected(RejectReason::WrongCa, RejectSource::Peer) >= ATTEMPTS);

    // Our own trust domain with the other estate's files is refused before dialling.
    let m = elsewhere.issue("spiffe://elsewhere.test/region/eu/service/cart/instance/i1");
    let mismatched = ResolverTls::new(TD, m.cert_chain, m.key, m.bundle);
    let err = Resolver::connect(config(xds, &r.dir.path().join("x.json")).with_tls(mismatched))
        .unwrap_err();
    assert!(
        matches!(&err, ResolverError::Tls(e) if e.reason() == RejectReason::WrongTrustDomain),
        "{err:?}"
    );

    // An impostor: a root of its own claiming our trust domain, trusting both roots.
    let impostor = estate(&r.dir.path().join("pki-impostor"), TD);
    let m = impostor.issue(&format!("spiffe://{TD}/region/eu/service/cart/instance/i9"));
    let both = r.dir.path().join("both.pem");
    let bundle = [
        std::fs::read(r.estate.bundle()).unwrap(),
        std::fs::read(&m.bundle).unwrap(),
    ]
    .concat();
    std::fs::write(&both, bundle).unwrap();
    let tls = ResolverTls::new(TD, m.cert_chain, m.key, both);
    let resolver =
        Resolver::connect(config(xds, &r.dir.path().join("imp.json")).with_tls(tls)).unwrap();
    refused(&resolver, "the impostor to be refused").await;
    until("the agent to count the impostor", WAIT, async || {
        let text = agent_metrics(&r.agent).await;
        if counted(&text, "wrong_ca") >= 1 {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
    r.agent.shutdown().await;
}

#[tokio::test]
async fn plain_text_is_refused_towards_anything_but_loopback() {
    // Goal: without TLS the resolver dials loopback only, as the agent serves it.
    let cache = tempfile::tempdir().unwrap();
    let remote: SocketAddr = "192.0.2.7:18000".parse().unwrap();
    let err = Resolver::connect(config(remote, &cache.path().join("c.json"))).unwrap_err();
    assert!(
        matches!(&err, ResolverError::PlaintextNotLoopback { .. }),
        "{err:?}"
    );
    for agent in [
        "http://localhost:18000",
        "http://127.0.0.9:18000",
        "http://[::1]:18000",
    ] {
        let mut c = config(remote, &cache.path().join("c.json"));
        c.agent = agent.to_owned();
        assert!(Resolver::connect(c).is_ok(), "{agent}");
    }
}
