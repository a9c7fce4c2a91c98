//! The prober against real local servers on 127.0.0.1: HTTP (200, 503, silent, closing),
//! a closed port, a TCP listener and a tonic-health gRPC server; and its address policy,
//! which keeps it off loopback, link-local and metadata addresses unless allowed. Every
//! prober here allows `127.0.0.0/8` explicitly, as a test that probes loopback must.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use waymark_agent::evidence::{ProbeTarget, WireSample};
use waymark_agent::node::probe::{
    AddressPolicy, Check, Denied, HttpCheck, Outcome, Prober, ProberConfig, SkipLabels,
};
use waymark_core::contract::{ProbeKind, ProbeSpec};
use waymark_core::model::{Address, Health, InstanceId, Observation, ServiceName};

/// Bound on every wait; the whole file runs in a few seconds.
const WAIT: Duration = Duration::from_secs(5);
const INTERVAL: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_millis(80);

/// An HTTP server: `/ok` 200, `/bad` 503 with a body, `/hang` never answers.
async fn http_server() -> SocketAddr {
    let app = Router::new()
        .route("/ok", get(|| async { "status: ok" }))
        .route(
            "/bad",
            get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "database down") }),
        )
        .route("/hang", get(std::future::pending::<&'static str>));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Accepts and closes every connection at once.
async fn closing_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    addr
}

/// A port nothing listens on.
async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// A gRPC server with the health service; `waymark.Echo` starts `SERVING`.
async fn grpc_server() -> (SocketAddr, HealthReporter) {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("waymark.Echo", ServingStatus::Serving)
        .await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (addr, reporter)
}

fn target(name: &str, addr: SocketAddr, kind: ProbeKind) -> ProbeTarget {
    ProbeTarget {
        instance: InstanceId::try_new(name).unwrap(),
        service: ServiceName::try_new("checkout").unwrap(),
        address: Address {
            ip: addr.ip(),
            port: addr.port(),
        },
        probe: ProbeSpec {
            kind,
            interval: INTERVAL,
            timeout: TIMEOUT,
        },
        confirmation: false,
    }
}

fn http(path: &str) -> ProbeKind {
    ProbeKind::Http { path: path.into() }
}

fn grpc(service: &str) -> ProbeKind {
    ProbeKind::Grpc {
        service: service.into(),
    }
}

fn start(concurrency: usize) -> (Prober, mpsc::Receiver<WireSample>) {
    start_with(
        concurrency,
        AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()]),
    )
}

fn start_with(concurrency: usize, policy: AddressPolicy) -> (Prober, mpsc::Receiver<WireSample>) {
    let (tx, rx) = mpsc::channel(256);
    let config = ProberConfig {
        concurrency: NonZeroUsize::new(concurrency).unwrap(),
        seed: Some(1),
        policy,
    };
    let (prober, _driver) = Prober::start(config, tx);
    (prober, rx)
}

fn probe_of(sample: &WireSample) -> (Health, Option<&str>) {
    match &sample.observation {
        Observation::Probe { health, detail } => (*health, detail.as_deref()),
        other => panic!("not a probe observation: {other:?}"),
    }
}

/// Receive until `done` says stop; panics after [`WAIT`].
async fn receive_until(
    rx: &mut mpsc::Receiver<WireSample>,
    mut done: impl FnMut(&WireSample) -> bool,
) {
    tokio::time::timeout(WAIT, async {
        loop {
            let sample = rx.recv().await.unwrap();
            if done(&sample) {
                return;
            }
        }
    })
    .await
    .expect("samples did not arrive in time");
}

#[tokio::test]
async fn each_kind_of_target_reports_its_health() {
    // Goal: every outcome class maps to its health, from real sockets.
    let web = http_server().await;
    let closing = closing_server().await;
    let closed = closed_port().await;
    let (rpc, _reporter) = grpc_server().await;
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (prober, mut rx) = start(64);
    prober.set_targets(vec![
        target("http-ok", web, http("/ok")),
        target("http-503", web, http("/bad")),
        target("http-hang", web, http("/hang")),
        target("http-closed", closed, http("/ok")),
        target("http-reset", closing, http("/ok")),
        target("tcp-open", tcp.local_addr().unwrap(), ProbeKind::Tcp),
        target("tcp-closed", closed, ProbeKind::Tcp),
        target("grpc-serving", rpc, grpc("waymark.Echo")),
        target("grpc-unknown", rpc, grpc("waymark.Nope")),
        target("grpc-closed", closed, grpc("")),
    ]);

    let mut first: BTreeMap<String, (Health, Option<String>)> = BTreeMap::new();
    receive_until(&mut rx, |s| {
        let (health, detail) = probe_of(s);
        first
            .entry(s.instance.to_string())
            .or_insert((health, detail.map(str::to_owned)));
        first.len() == 10
    })
    .await;

    let expect = |name: &str, health: Health, detail: Option<&str>| {
        let (h, d) = &first[name];
        assert_eq!(*h, health, "{name}: {d:?}");
        if let Some(detail) = detail {
            assert_eq!(d.as_deref(), Some(detail), "{name}");
        }
    };
    expect("http-ok", Health::Pass, None);
    expect(
        "http-503",
        Health::Fail,
        Some("HTTP 503; said: database down"),
    );
    expect("http-hang", Health::Timeout, Some("no answer within 80ms"));
    expect("http-closed", Health::Refused, Some("connection refused"));
    expect("http-reset", Health::Fail, None);
    expect("tcp-open", Health::Pass, None);
    expect("tcp-closed", Health::Refused, Some("connection refused"));
    expect("grpc-serving", Health::Pass, None);
    expect("grpc-unknown", Health::Fail, Some("SERVICE_UNKNOWN"));
    expect("grpc-closed", Health::Refused, Some("connection refused"));
    let reset = first["http-reset"].1.as_deref().unwrap();
    assert!(reset.starts_with("http exchange failed: "), "{reset}");
    assert_eq!(first["http-ok"].1, None);
}

#[tokio::test]
async fn grpc_target_fails_once_set_not_serving() {
    // Goal: the gRPC health status is read on every probe, not cached.
    let (rpc, reporter) = grpc_server().await;
    let (prober, mut rx) = start(4);
    prober.set_targets(vec![target("grpc", rpc, grpc("waymark.Echo"))]);
    receive_until(&mut rx, |s| probe_of(s).0 == Health::Pass).await;
    reporter
        .set_service_status("waymark.Echo", ServingStatus::NotServing)
        .await;
    receive_until(&mut rx, |s| {
        probe_of(s) == (Health::Fail, Some("NOT_SERVING"))
    })
    .await;
}

#[tokio::test]
async fn removed_target_sends_no_more_samples() {
    // Goal: once a new set is applied, a removed target is silent.
    let web = http_server().await;
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (prober, mut rx) = start(4);
    prober.set_targets(vec![
        target("gone", web, http("/ok")),
        target("kept", tcp.local_addr().unwrap(), ProbeKind::Tcp),
    ]);
    let mut seen = std::collections::BTreeSet::new();
    receive_until(&mut rx, |s| {
        seen.insert(s.instance.to_string());
        seen.len() == 2
    })
    .await;

    prober.set_targets(vec![target(
        "kept",
        tcp.local_addr().unwrap(),
        ProbeKind::Tcp,
    )]);
    prober.applied().await.unwrap();
    // Whatever is buffered was sent before the change was applied.
    while rx.try_recv().is_ok() {}
    let mut kept = 0;
    receive_until(&mut rx, |s| {
        assert_eq!(s.instance.as_str(), "kept");
        kept += 1;
        kept == 5
    })
    .await;
    assert_eq!(prober.metrics().targets.get(), 1);
}

#[tokio::test]
async fn concurrency_one_with_slow_targets_counts_skips() {
    // Goal: probes that cannot get a slot within their interval are skipped and counted.
    let web = http_server().await;
    let (prober, mut rx) = start(1);
    let mut registry = prometheus_client::registry::Registry::default();
    prober.register(&mut registry);
    prober.set_targets(
        (0..3)
            .map(|i| target(&format!("slow-{i}"), web, http("/hang")))
            .collect(),
    );
    let mut timeouts = 0;
    receive_until(&mut rx, |s| {
        assert_eq!(probe_of(s).0, Health::Timeout);
        timeouts += 1;
        timeouts == 6
    })
    .await;
    let skipped = prober
        .metrics()
        .skipped
        .get_or_create(&SkipLabels {
            reason: "concurrency",
        })
        .get();
    assert!(skipped > 0, "no skips counted");

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for name in [
        "waymark_probes_total{kind=\"http\",health=\"timeout\"}",
        "waymark_probe_duration_seconds_bucket{le=",
        "waymark_probes_skipped_total{reason=\"concurrency\"}",
        "waymark_probe_targets 3",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
}

#[tokio::test]
async fn http_body_match_decides_a_2xx() {
    // Goal: an `expect_body` check passes only when the body holds the text.
    let web = http_server().await;
    let check = |expect: &str| {
        Check::Http(HttpCheck {
            path: "/ok".into(),
            expect_body: Some(expect.into()),
        })
    };
    assert_eq!(check("status: ok").probe(web, WAIT).await, Outcome::pass());
    let outcome = check("status: degraded").probe(web, WAIT).await;
    assert_eq!(outcome.health, Health::Fail);
}

/// A TCP listener on `ip` that counts the connections it accepts.
async fn counting_listener(
    ip: &str,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let count = std::sync::Arc::clone(&accepted);
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn targets_the_address_policy_refuses_are_never_connected_to() {
    // Goal: a registration naming loopback, link-local or a metadata address gets no
    // connection from the prober, a typed refusal and a count; allowed targets are probed.
    use std::sync::atomic::Ordering;
    let (refused_addr, refused_accepts) = counting_listener("127.0.0.1").await;
    let (allowed_addr, _) = counting_listener("127.0.0.2").await;
    let (prober, mut rx) = start_with(4, AddressPolicy::new(vec!["127.0.0.2/32".parse().unwrap()]));
    let metadata: SocketAddr = "169.254.169.254:80".parse().unwrap();
    let link_local: SocketAddr = "[fe80::1]:80".parse().unwrap();
    let targets = vec![
        target("loopback", refused_addr, ProbeKind::Tcp),
        target("metadata", metadata, http("/latest/meta-data/")),
        target("link-local", link_local, ProbeKind::Tcp),
        target("allowed", allowed_addr, ProbeKind::Tcp),
    ];
    prober.set_targets(targets.clone());
    prober.applied().await.unwrap();

    let refusals: BTreeMap<String, (SocketAddr, Denied)> = prober
        .refusals()
        .borrow()
        .iter()
        .map(|r| (r.instance.to_string(), (r.address, r.reason)))
        .collect();
    assert_eq!(
        refusals,
        BTreeMap::from([
            ("loopback".into(), (refused_addr, Denied::Loopback)),
            ("metadata".into(), (metadata, Denied::CloudMetadata)),
            ("link-local".into(), (link_local, Denied::LinkLocal)),
        ])
    );
    assert_eq!(
        prober.metrics().targets.get(),
        1,
        "only the allowed one is scheduled"
    );

    // Five samples of the allowed target: the refused ones were due as often, and sent none.
    let mut allowed = 0;
    receive_until(&mut rx, |s| {
        assert_eq!(
            s.instance.as_str(),
            "allowed",
            "a refused target was probed"
        );
        allowed += 1;
        allowed == 5
    })
    .await;
    assert_eq!(
        refused_accepts.load(Ordering::SeqCst),
        0,
        "the loopback listener was dialled"
    );

    // The same assignment again counts nothing new.
    prober.set_targets(targets);
    prober.applied().await.unwrap();
    for (reason, count) in [("loopback", 1), ("cloud_metadata", 1), ("link_local", 1)] {
        let got = prober
            .metrics()
            .refused
            .get_or_create(&SkipLabels { reason })
            .get();
        assert_eq!(got, count, "{reason}");
    }
}
