//! The propagation histograms count a real release on the hop and path it took.
//!
//! A single-member authority, a node agent and a real Envoy behind it, and a second Envoy
//! subscribed to the member directly (it must take the release ages the member carries
//! without a NACK). After everything is connected, one instance is registered (an
//! admission) and then one is deregistered (a withdrawal); each must be counted in
//! `waymark_xds_propagation_seconds` on both hops — `authority_agent` by the member,
//! `agent_sidecar` by the agent — under its own path, and only once Envoy holds the
//! change. The agent also times the whole path (`hop="whole"`: the release's age the
//! member carried with the version, plus the agent's own time to the sidecar's ACK),
//! never shorter than its own hop for the same release. Both expositions pass `promtool
//! check metrics`, carry `waymark_build_info`, and the agent answers OpenMetrics when
//! asked.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use http::Method;
use serde_json::json;
use support::{Backend, Envoy, EnvoyConfig, Route, Xds, XdsMode};
use waymark_agent::api_client::ApiClient;
use waymark_agent::node::agent::NodeAgent;
use waymark_testkit::until;

const WAIT: Duration = Duration::from_secs(60);

/// `waymark_xds_propagation_seconds_count{hop,path}` in an exposition (0 when absent).
fn timed(text: &str, hop: &str, path: &str) -> u64 {
    common::series_value(
        text,
        &format!("waymark_xds_propagation_seconds_count{{hop=\"{hop}\",path=\"{path}\"}}"),
    )
}

/// The count of one bucket of `waymark_xds_propagation_seconds{hop,path}` (0 when absent),
/// whatever order the labels are written in.
fn bucket(text: &str, hop: &str, path: &str, le: &str) -> u64 {
    let want = [
        format!("hop=\"{hop}\""),
        format!("path=\"{path}\""),
        format!("le=\"{le}\""),
    ];
    text.lines()
        .filter(|l| l.starts_with("waymark_xds_propagation_seconds_bucket{"))
        .filter(|l| want.iter().all(|w| l.contains(w.as_str())))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// `waymark_xds_propagation_seconds_sum{hop,path}` in an exposition (0 when absent).
fn seconds(text: &str, hop: &str, path: &str) -> f64 {
    let series = format!("waymark_xds_propagation_seconds_sum{{hop=\"{hop}\",path=\"{path}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The agent's exposition, as a scraper asking for `accept` reads it: (content type, body).
async fn scrape(addr: SocketAddr, accept: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let r = support::http::parse_response(&raw).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    (r.header("content-type").unwrap().to_owned(), r.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_timed_on_both_hops_under_the_path_it_took() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let auth = common::single_member(common::plain(
        &dir.path().join("authority"),
        "r1",
        &["z1"],
        any,
    ))
    .await;
    let api = common::operator(&auth, "test").await;
    let put = api
        .send(
            Method::PUT,
            "/v1/services/web",
            Some(&json!({"owner": "web", "contract": {}})),
        )
        .await
        .unwrap();
    assert!(put.status.is_success(), "{put:?}");
    let register = async |b: &Backend| -> String {
        let reg = json!({
            "service": "web",
            "locality": {"region": "r1", "zone": "z1", "node": "n1"},
            "address": {"ip": "127.0.0.1", "port": b.addr().port()},
            "lease_ms": 600_000,
        });
        let v = api
            .send(Method::POST, "/v1/instances", Some(&reg))
            .await
            .unwrap()
            .json()
            .unwrap();
        v["instance"].as_str().unwrap().to_owned()
    };
    let mut backends = Vec::new();
    let mut ids = BTreeMap::new();
    for i in 0..3 {
        let b = Backend::start(&format!("web-{i}")).await;
        ids.insert(i, register(&b).await);
        backends.push(b);
    }

    let agent = NodeAgent::start(common::agent_on_loopback(
        "n1",
        "r1",
        "z1",
        &dir.path().join("agent"),
        &[auth.xds_addr()],
    ))
    .await
    .unwrap();
    let envoy = Envoy::start(EnvoyConfig {
        node_id: "sidecar-1".into(),
        region: "r1".into(),
        zone: "z1".into(),
        xds: Some(Xds {
            addr: agent.bound().xds,
            mode: XdsMode::Delta,
        }),
        routes: vec![Route::new("/", "web")],
        ..EnvoyConfig::default()
    })
    .await;
    envoy.wait_live(WAIT).await;
    let holds = async |n: usize| {
        envoy
            .wait_until(&format!("Envoy holds {n} endpoints"), WAIT, async || {
                envoy.cluster_endpoints("web").await.map(|e| e.len()) == Some(n)
            })
            .await;
    };
    holds(3).await;
    // A real Envoy subscribed to the member directly, as a sidecar without an agent is:
    // the release ages the member carries must be nothing it would reject.
    let direct = Envoy::start(EnvoyConfig {
        node_id: "sidecar-direct".into(),
        region: "r1".into(),
        zone: "z1".into(),
        xds: Some(Xds {
            addr: auth.xds_addr(),
            mode: XdsMode::Delta,
        }),
        routes: vec![Route::new("/", "web")],
        ..EnvoyConfig::default()
    })
    .await;
    direct.wait_live(WAIT).await;
    let direct_holds = async |n: usize| {
        direct
            .wait_until(
                &format!("the direct Envoy holds {n} endpoints"),
                WAIT,
                async || direct.cluster_endpoints("web").await.map(|e| e.len()) == Some(n),
            )
            .await;
    };
    direct_holds(3).await;

    let local = ApiClient::new(&agent.bound().http.to_string(), None);
    let agent_text = async || common::metrics_text(&local).await;
    let member_text = async || common::metrics_text(&api).await;
    // Releases made before a client connected are its catch-up, not propagation: whatever
    // was counted so far is the baseline.
    let base_member = member_text().await;
    let base_agent = agent_text().await;

    // An admission: a fourth instance registered.
    let late = Backend::start("web-3").await;
    ids.insert(3, register(&late).await);
    backends.push(late);
    holds(4).await;
    direct_holds(4).await;
    let admitted = |text: &str, hop: &str, base: &str| {
        timed(text, hop, "admission") > timed(base, hop, "admission")
    };
    until("the admission timed at the member", WAIT, async || {
        admitted(&member_text().await, "authority_agent", &base_member)
    })
    .await;
    until("the admission timed at the agent", WAIT, async || {
        admitted(&agent_text().await, "agent_sidecar", &base_agent)
    })
    .await;
    until("the admission timed on the whole path", WAIT, async || {
        admitted(&agent_text().await, "whole", &base_agent)
    })
    .await;

    // A withdrawal: one instance deregistered.
    let before_member = member_text().await;
    let before_agent = agent_text().await;
    let r = api
        .send(Method::DELETE, &format!("/v1/instances/{}", ids[&0]), None)
        .await
        .unwrap();
    assert!(r.status.is_success(), "{r:?}");
    holds(3).await;
    direct_holds(3).await;
    let withdrawn = |text: &str, hop: &str, base: &str| {
        timed(text, hop, "withdrawal") > timed(base, hop, "withdrawal")
    };
    until("the withdrawal timed at the member", WAIT, async || {
        withdrawn(&member_text().await, "authority_agent", &before_member)
    })
    .await;
    until("the withdrawal timed at the agent", WAIT, async || {
        withdrawn(&agent_text().await, "agent_sidecar", &before_agent)
    })
    .await;
    until("the withdrawal timed on the whole path", WAIT, async || {
        withdrawn(&agent_text().await, "whole", &before_agent)
    })
    .await;
    // The same acknowledgements on both of the agent's series, the whole path never
    // shorter: it is the agent's hop plus the age the release arrived with.
    let after_agent = agent_text().await;
    let added = |hop: &str| {
        (
            timed(&after_agent, hop, "withdrawal") - timed(&before_agent, hop, "withdrawal"),
            seconds(&after_agent, hop, "withdrawal") - seconds(&before_agent, hop, "withdrawal"),
        )
    };
    let ((n_whole, whole), (n_hop, hop)) = (added("whole"), added("agent_sidecar"));
    assert_eq!(n_whole, n_hop, "{after_agent}");
    assert!(
        whole >= hop,
        "whole path {whole} s shorter than the agent's hop {hop} s\n{after_agent}"
    );
    assert_eq!(
        common::series_value(&after_agent, "waymark_agent_release_ages_ignored_total"),
        0,
        "{after_agent}"
    );

    // Every timed release lands in a bucket (none past the last, 60 s, on loopback), and
    // the families are what promtool accepts; both roles say which build they are.
    let (member, agent_now) = (member_text().await, agent_text().await);
    for text in [&member, &agent_now] {
        for l in text.lines().filter(|l| {
            l.starts_with("waymark_xds_propagation_seconds_sum")
                || l.starts_with("waymark_xds_propagation_seconds_count")
        }) {
            eprintln!("{l}");
        }
    }
    for (text, hop) in [(&member, "authority_agent"), (&agent_now, "agent_sidecar")] {
        let n = timed(text, hop, "withdrawal");
        let within = bucket(text, hop, "withdrawal", "60.0");
        assert_eq!(within, n, "{hop}: every withdrawal within 60 s\n{text}");
        assert!(text.contains("waymark_build_info{version=\""), "{text}");
        assert!(
            text.contains(&format!(
                "waymark_xds_client_view_age_seconds_count{{hop=\"{hop}\"}}"
            )),
            "{text}"
        );
        common::promtool_check(text);
    }
    assert!(
        member.contains("# TYPE waymark_xds_nacks_total counter"),
        "{member}"
    );
    assert_eq!(
        common::series_value(&member, "waymark_xds_nacks_total"),
        0,
        "neither the agent nor the direct Envoy rejected a response carrying ages\n{member}"
    );
    assert!(
        agent_now.contains("# TYPE waymark_agent_upstream_nacks_total counter"),
        "{agent_now}"
    );

    // The agent negotiates OpenMetrics as the authority does.
    let (ct, om) = scrape(
        agent.bound().http,
        "application/openmetrics-text;version=1.0.0",
    )
    .await;
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    assert!(om.trim_end().ends_with("# EOF"), "{om}");
    let (ct, text) = scrape(agent.bound().http, "text/plain").await;
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    assert!(!text.contains("# EOF"));

    drop(direct);
    drop(envoy);
    agent.shutdown().await;
    drop(backends);
}
