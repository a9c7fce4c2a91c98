//! kill -9 during updates leaves the agent serving the view it last acknowledged, or a newer
//! one it had already persisted — never an older one, never a torn one.
//!
//! An upstream xDS server in this test publishes a new version of every service's load
//! assignment every few milliseconds; a real `waymark agent` process subscribes to it. At a
//! varying moment the agent is SIGKILLed; the server's sync state says which version the
//! agent last acknowledged (the agent acknowledges only what is on disk). The agent is then
//! restarted with no reachable upstream, and what it serves to a fresh Delta client — from
//! its sled cache alone — is compared with that version: every service at one version (a
//! response is persisted as one batch), at least the acknowledged one, with exactly the
//! content that version had. 100 rounds by default (`WAYMARK_CRASH_ROUNDS`).
#![allow(clippy::unwrap_used)]
#![allow(clippy::disallowed_methods)] // waits on real processes by the wall clock; no paused time here

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{
    Address, Locality, Node, SocketAddress, address, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use prost::Message as _;
use tonic::transport::Endpoint as GrpcEndpoint;
use waymark_core::model::{ServiceName, ZoneName};
use waymark_testkit::try_until;
use waymark_xds::client::{Applied, Subscription, XdsClient};
use waymark_xds::snapshot::{Encoded, Payload, Snapshot};
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT, cluster, to_any};
use waymark_xds::{Keepalive, ServerConfig, XdsServer};

use common::{agent_file, free_port, write_agent};

const SERVICES: [&str; 4] = ["pay", "cart", "search", "auth"];
const NODE: &str = "crash-node";
const WAIT: Duration = Duration::from_secs(30);
/// How often a round looks for the agent's first acknowledgement.
const FIRST_ACK_POLL: Duration = Duration::from_millis(5);

fn zone() -> ZoneName {
    ZoneName::try_new("z1").unwrap()
}

/// The assignment `service` has at `version`: its endpoints' ports encode the version, so
/// a served assignment names the version it came from.
fn assignment(service: &str, version: u64) -> ClusterLoadAssignment {
    let lb = |i: u64| LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: "10.1.0.1".into(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(
                        (1000 + (version * 3 + i) % 60_000) as u32,
                    )),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        })),
        ..Default::default()
    };
    ClusterLoadAssignment {
        cluster_name: service.into(),
        endpoints: vec![LocalityLbEndpoints {
            locality: Some(Locality {
                zone: "z1".into(),
                ..Default::default()
            }),
            lb_endpoints: (0..3).map(lb).collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn snapshot(version: u64) -> Snapshot {
    let mut s = Snapshot {
        version,
        ..Snapshot::default()
    };
    let mut eds = waymark_xds::snapshot::Resources::new();
    for svc in SERVICES {
        let name = ServiceName::try_new(svc).unwrap();
        s.clusters.insert(
            svc.into(),
            Encoded {
                version: "1".into(),
                resource: Payload::new(to_any(TYPE_CLUSTER, &cluster(&name))),
            },
        );
        eds.insert(
            svc.to_owned(),
            Encoded {
                version: version.to_string(),
                resource: Payload::new(to_any(TYPE_ENDPOINT, &assignment(svc, version))),
            },
        );
    }
    s.endpoints.insert(zone(), eds);
    s
}

fn write_config(dir: &Path, upstream: &str, xds: u16, http: u16) -> PathBuf {
    let path = dir.join(format!("agent-{xds}-{}.toml", upstream.replace(':', "_")));
    let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let mut a = agent_file(NODE, "r1", "z1", &dir.join("data"), &[]);
    a.upstream = vec![upstream.to_owned()];
    a.listen.xds = loopback(xds);
    a.listen.dns = loopback(0);
    a.listen.http = loopback(http);
    write_agent(&path, a);
    path
}

fn start_agent(config: &Path, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["agent", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// What a fresh Delta client gets from the agent first: EDS version and content per service.
async fn served(xds: u16) -> BTreeMap<String, (String, ClusterLoadAssignment)> {
    let node = Node {
        id: "verifier".into(),
        locality: Some(Locality {
            zone: "z1".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let subs = [TYPE_CLUSTER, TYPE_ENDPOINT].map(|t| {
        (
            t.to_owned(),
            Subscription {
                wildcard: true,
                ..Default::default()
            },
        )
    });
    let endpoint = GrpcEndpoint::from_shared(format!("http://127.0.0.1:{xds}")).unwrap();
    let (_client, mut applied) = XdsClient::connect(endpoint, node, subs);
    let ready = |a: &Arc<Applied>| {
        a.resources(TYPE_ENDPOINT)
            .is_some_and(|r| r.len() == SERVICES.len())
    };
    let state = tokio::time::timeout(WAIT, applied.wait_for(ready))
        .await
        .expect("the restarted agent served its cache")
        .unwrap()
        .clone();
    state
        .resources(TYPE_ENDPOINT)
        .unwrap()
        .iter()
        .map(|(name, (version, any))| {
            let cla = ClusterLoadAssignment::decode(any.value.as_slice()).unwrap();
            (name.clone(), (version.clone(), cla))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_updates_never_loses_an_acknowledged_view() {
    waymark_certs::install_crypto_provider();
    let rounds: usize = std::env::var("WAYMARK_CRASH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(100);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");

    // The upstream: publishes a new version of everything every 2 ms while `running`.
    // Reconnection admission would (rightly) pace a client reconnecting 200 times; this
    // test is about the cache, so the floor admits every reconnection.
    let mut config = ServerConfig::default();
    config.admission.floor = 1_000;
    let (server, publisher) = XdsServer::new(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream: SocketAddr = listener.local_addr().unwrap();
    let serving = server.clone();
    tokio::spawn(async move {
        serving
            .serve(listener, Keepalive::default(), std::future::pending())
            .await;
    });
    let version = Arc::new(AtomicU64::new(1));
    let running = Arc::new(AtomicBool::new(false));
    publisher.publish(snapshot(1));
    {
        let (version, running) = (Arc::clone(&version), Arc::clone(&running));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(2)).await;
                if running.load(Ordering::SeqCst) {
                    let v = version.fetch_add(1, Ordering::SeqCst) + 1;
                    publisher.publish(snapshot(v));
                }
            }
        });
    }

    let (xds, http) = (free_port(), free_port());
    let live = write_config(dir.path(), &upstream.to_string(), xds, http);
    let dead = write_config(dir.path(), &format!("127.0.0.1:{}", free_port()), xds, http);
    let api = waymark_agent::api_client::ApiClient::new(&format!("127.0.0.1:{http}"), None);
    let mut last_served = 0u64;
    // The highest version the agent has acknowledged, watched every millisecond (the
    // server forgets a client once its stream ends).
    let max_acked = Arc::new(AtomicU64::new(0));
    {
        let (server, max_acked) = (server.clone(), Arc::clone(&max_acked));
        tokio::spawn(async move {
            loop {
                let acked = server
                    .sync_state()
                    .iter()
                    .filter(|c| c.node_id == NODE)
                    .filter_map(|c| c.types.get(TYPE_ENDPOINT)?.acked.as_ref()?.parse().ok())
                    .max();
                if let Some(a) = acked {
                    max_acked.fetch_max(a, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
    }
    let acked_by_agent = |_: &XdsServer| -> Option<u64> {
        Some(max_acked.load(Ordering::SeqCst)).filter(|a| *a > 0)
    };
    let mut rng_state = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand_ms = |lo: u64, hi: u64| {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        lo + rng_state % (hi - lo)
    };
    let mut ahead = 0;
    let mut slowest = Duration::ZERO;
    for round in 0..rounds {
        // Update phase: the agent follows the upstream while it changes.
        running.store(true, Ordering::SeqCst);
        let before = acked_by_agent(&server).unwrap_or(0);
        let phase = std::time::Instant::now();
        let mut agent = start_agent(&live, &log);
        // Polled finely: the kill below is timed from this first acknowledgement.
        let first_ack = try_until("an acknowledgement", WAIT, FIRST_ACK_POLL, async || {
            acked_by_agent(&server).unwrap_or(0) > before
        })
        .await;
        if let Err(e) = first_ack {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("round {round}: {e}\n{log}");
        }
        if std::env::var("WAYMARK_CRASH_TRACE").is_ok() {
            eprintln!("round {round}: first ack after {:?}", phase.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(rand_ms(5, 120))).await;
        agent.kill().unwrap(); // SIGKILL, mid-stream
        agent.wait().unwrap();
        running.store(false, Ordering::SeqCst);
        let acked = acked_by_agent(&server).unwrap();

        // Verify phase: restarted with no upstream, it serves from sled alone.
        let restarted = std::time::Instant::now();
        let mut agent = start_agent(&dead, &log);
        let view = served(xds).await;
        let status = api.get_json("/v1/view").await.unwrap();
        let serving_after = restarted.elapsed();
        agent.kill().unwrap();
        agent.wait().unwrap();

        // The upstream version each service's served assignment came from.
        let upstream: BTreeMap<String, u64> = status["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let v = s["upstream_version"].as_str().unwrap().parse().unwrap();
                (s["service"].as_str().unwrap().to_owned(), v)
            })
            .collect();
        let first = upstream[SERVICES[0]];
        assert!(
            upstream.values().all(|v| *v == first) && upstream.len() == SERVICES.len(),
            "round {round}: a torn view {upstream:?}"
        );
        assert!(
            first >= acked,
            "round {round}: serves {first}, older than the acknowledged {acked}"
        );
        for (svc, (served_version, cla)) in &view {
            assert_eq!(
                cla,
                &assignment(svc, first),
                "round {round}: {svc}'s content is not version {first}'s"
            );
            // Served versions only go up, across restarts too.
            let served_version: u64 = served_version.parse().unwrap();
            assert!(
                served_version >= last_served,
                "round {round}: {svc} served as {served_version}, below {last_served} served before"
            );
            last_served = last_served.max(served_version);
        }
        if first > acked {
            ahead += 1;
        }
        slowest = slowest.max(serving_after);
    }
    // Persisted-but-not-yet-acknowledged is allowed (the ACK was in flight); say how often.
    eprintln!(
        "{rounds} rounds; {ahead} restarts served a version newer than the last ACK; \
         slowest restart-to-served {slowest:?}"
    );
}
