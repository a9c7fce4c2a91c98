//! A three-member authority on loopback, each a real `waymark authority` process with its
//! own redb files. The leader is killed with SIGKILL again and again while a client
//! registers and renews instances: every acknowledged write must be present afterwards on
//! every member, and xDS clients watching every member throughout must never see a
//! version go backwards.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use http::Method;
use serde_json::{Value, json};
use tokio::sync::watch;
use tonic::transport::Endpoint;
use waymark_agent::cli::http::ApiClient;
use waymark_xds::client::{Applied, Subscription, XdsClient};
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT};

const KILLS: usize = 4;
const WAIT: Duration = Duration::from_secs(120);

struct Member {
    id: u64,
    http: u16,
    xds: u16,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// The region's initial management token (every member is configured with it).
    token: String,
}

impl Member {
    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_waymark"))
            .args(["authority", "--config"])
            .arg(&self.config)
            .env(
                "RUST_LOG",
                std::env::var("WAYMARK_MEMBER_LOG")
                    .unwrap_or_else(|_| "warn,waymark_agent=info".into()),
            )
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap(); // SIGKILL
            c.wait().unwrap();
        }
    }

    fn api(&self) -> ApiClient {
        ApiClient::new(
            &format!("127.0.0.1:{}", self.http),
            Some(self.token.clone()),
        )
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn cluster(dir: &Path) -> Vec<Member> {
    let token = waymark_agent::authority::credentials::generate("management").unwrap();
    let token_file = dir.join("management.token");
    std::fs::write(&token_file, &token).unwrap();
    let acl = format!(
        "[authority.acl]\ninitial_management_token_file = \"{}\"\n",
        token_file.display()
    );
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let members_toml: String = ports
        .iter()
        .enumerate()
        .map(|(i, (h, _))| {
            format!(
                "[[authority.members]]\nid = {}\naddr = \"127.0.0.1:{h}\"\n",
                i + 1
            )
        })
        .collect();
    ports
        .iter()
        .enumerate()
        .map(|(i, (http, xds))| {
            let id = i as u64 + 1;
            let config = dir.join(format!("m{id}.toml"));
            let text = format!(
                "[authority]\nid = {id}\nregion = \"eu\"\nzones = [\"a\", \"b\"]\n\
                 data_dir = \"{}\"\nhttp = \"127.0.0.1:{http}\"\nxds = \"127.0.0.1:{xds}\"\n\n{members_toml}\n{acl}",
                dir.join(format!("m{id}")).display()
            );
            std::fs::write(&config, text).unwrap();
            Member {
                id,
                http: *http,
                xds: *xds,
                config,
                log: dir.join(format!("m{id}.log")),
                child: None,
                token: token.clone(),
            }
        })
        .collect()
}

/// The leader as the live members report it, once they agree.
async fn leader(members: &[Member], except: Option<u64>) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        for m in members.iter().filter(|m| m.child.is_some()) {
            if let Ok(s) = m.api().get_json("/v1/status").await
                && let Some(id) = s["leader"]["id"].as_u64()
                && Some(id) != except
                && s["is_leader"].as_bool() == Some(id == m.id)
                && members.iter().any(|x| x.id == id && x.child.is_some())
            {
                return id;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader elected within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn watcher(xds: u16, id: &str) -> (XdsClient, watch::Receiver<Arc<Applied>>) {
    let endpoint = Endpoint::from_shared(format!("http://127.0.0.1:{xds}")).unwrap();
    let node = Node {
        id: id.to_owned(),
        locality: Some(Locality {
            zone: "a".to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let subs = vec![
        (
            TYPE_CLUSTER.to_owned(),
            Subscription {
                wildcard: true,
                names: BTreeSet::new(),
            },
        ),
        (
            TYPE_ENDPOINT.to_owned(),
            Subscription {
                wildcard: false,
                names: BTreeSet::from(["pay".to_owned()]),
            },
        ),
    ];
    XdsClient::connect(endpoint, node, subs)
}

/// Records every EDS version a watcher applies; fails on a regression.
fn record(mut rx: watch::Receiver<Arc<Applied>>, seen: Arc<Mutex<Vec<u64>>>) {
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let applied = rx.borrow_and_update().clone();
            if let Some(v) = applied
                .resources(TYPE_ENDPOINT)
                .and_then(|r| r.get("pay"))
                .and_then(|(v, _)| v.parse::<u64>().ok())
            {
                let mut s = seen.lock().unwrap();
                if s.last() != Some(&v) {
                    s.push(v);
                }
            }
        }
    });
}

#[derive(Default)]
struct Acked {
    /// id → the latest acknowledged lease end.
    leases: BTreeMap<String, u64>,
    writes: usize,
}

async fn writer(apis: Vec<ApiClient>, acked: Arc<Mutex<Acked>>, stop: watch::Receiver<bool>) {
    let mut n = 0u32;
    let mut next_api = 0usize;
    while !*stop.borrow() {
        let api = &apis[next_api % apis.len()];
        n += 1;
        let result = if n.is_multiple_of(3) && !acked.lock().unwrap().leases.is_empty() {
            let ids: Vec<String> = acked.lock().unwrap().leases.keys().cloned().collect();
            let id = ids[(n as usize / 3) % ids.len()].clone();
            api.send(Method::PUT, &format!("/v1/instances/{id}/renew"), None)
                .await
                .ok()
                .filter(|r| r.status.is_success())
                .and_then(|r| r.json().ok())
                .map(|v| (id, v["applied"]["expires_at_ms"].as_u64().unwrap()))
        } else {
            let body = json!({
                "service": "pay",
                "locality": {"region": "eu", "zone": if n.is_multiple_of(2) { "a" } else { "b" }, "node": "n1"},
                "address": {"ip": format!("10.1.{}.{}", n / 250, n % 250 + 1), "port": 8080},
                "lease_ms": 600_000,
            });
            api.send(Method::POST, "/v1/instances", Some(&body))
                .await
                .ok()
                .filter(|r| r.status.is_success())
                .and_then(|r| r.json().ok())
                .map(|v| {
                    (
                        v["instance"].as_str().unwrap().to_owned(),
                        v["expires_at_ms"].as_u64().unwrap(),
                    )
                })
        };
        match result {
            Some((id, expires)) => {
                let mut a = acked.lock().unwrap();
                let e = a.leases.entry(id).or_default();
                *e = (*e).max(expires);
                a.writes += 1;
            }
            // A member down or an election: try another member.
            None => {
                next_api += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Waits until some watcher has seen a version above `after`; returns it.
async fn published_after(seen: &[Arc<Mutex<Vec<u64>>>], after: u64) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let newest = seen
            .iter()
            .filter_map(|s| s.lock().unwrap().last().copied())
            .max()
            .unwrap_or(0);
        if newest > after {
            return newest;
        }
        assert!(Instant::now() < deadline, "nothing published above {after}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn writes_after(acked: &Arc<Mutex<Acked>>, more: usize) {
    let target = acked.lock().unwrap().writes + more;
    let deadline = Instant::now() + WAIT;
    while acked.lock().unwrap().writes < target {
        assert!(Instant::now() < deadline, "writes stalled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_repeatedly_loses_no_acknowledged_write_and_no_version_regresses() {
    waymark_certs::install_crypto_provider();
    // WAYMARK_KEEP_DIR=1 keeps the members' files and logs for inspection.
    let dir = tempfile::Builder::new()
        .prefix("authority-cluster")
        .disable_cleanup(std::env::var_os("WAYMARK_KEEP_DIR").is_some())
        .tempdir()
        .unwrap();
    eprintln!("members' files and logs in {}", dir.path().display());
    let mut members = cluster(dir.path());
    for m in &mut members {
        m.start();
    }
    let first = leader(&members, None).await;
    let any = members[0].api();
    let r = any
        .send(
            Method::PUT,
            "/v1/services/pay",
            Some(&json!({"owner": "payments", "contract": {}})),
        )
        .await
        .unwrap();
    assert!(r.status.is_success(), "{:?}", r.json());

    let mut watchers = Vec::new();
    let mut seen = Vec::new();
    for m in &members {
        let (client, rx) = watcher(m.xds, &format!("watch-{}", m.id));
        let s = Arc::new(Mutex::new(Vec::new()));
        record(rx, Arc::clone(&s));
        watchers.push(client);
        seen.push(s);
    }

    let acked = Arc::new(Mutex::new(Acked::default()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let apis: Vec<ApiClient> = members.iter().map(Member::api).collect();
    let writing = tokio::spawn(writer(apis, Arc::clone(&acked), stop_rx));
    writes_after(&acked, 20).await;
    let mut published = published_after(&seen, 0).await;

    let mut current = first;
    for _ in 0..KILLS {
        let victim = members.iter_mut().find(|m| m.id == current).unwrap();
        victim.kill();
        let next = leader(&members, Some(current)).await;
        writes_after(&acked, 10).await;
        members
            .iter_mut()
            .find(|m| m.id == current)
            .unwrap()
            .start();
        // The new leader publishes (after its hold) above everything published before.
        published = published_after(&seen, published).await;
        current = leader(&members, None).await;
        eprintln!("leader {current} (after {next}) published version {published}");
    }
    stop_tx.send(true).unwrap();
    writing.await.unwrap();

    // Every acknowledged write is on every member.
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(
        acked.leases.len() >= 20,
        "too few registrations to mean anything"
    );
    for m in &members {
        let deadline = Instant::now() + WAIT;
        loop {
            let list = m.api().get_json("/v1/instances?service=pay").await;
            let held: BTreeMap<String, u64> = list
                .ok()
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default()
                .iter()
                .map(|r: &Value| {
                    (
                        r["instance"]["id"].as_str().unwrap().to_owned(),
                        r["lease_expires_at_ms"].as_u64().unwrap_or(0),
                    )
                })
                .collect();
            let missing: Vec<_> = acked
                .leases
                .iter()
                .filter(|(id, exp)| held.get(*id).is_none_or(|h| h < *exp))
                .collect();
            if missing.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "member {} lacks {} acknowledged writes, e.g. {:?}",
                m.id,
                missing.len(),
                missing.first()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // No watcher ever saw the view's version go backwards, and each saw it move.
    for (m, s) in members.iter().zip(&seen) {
        let versions = s.lock().unwrap().clone();
        assert!(
            !versions.is_empty(),
            "watcher of member {} saw no view",
            m.id
        );
        assert!(
            versions.windows(2).all(|w| w[0] < w[1]),
            "member {} sent a version backwards: {versions:?}",
            m.id
        );
    }
    drop(watchers);
}

/// The lease of `id` as `member` holds it: `Some(end)` while registered, `None` once gone.
async fn lease_end(member: &Member, id: &str) -> Option<u64> {
    let list = member
        .api()
        .get_json("/v1/instances?service=pay")
        .await
        .unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .find(|r| r["instance"]["id"] == id)
        .map(|r| r["lease_expires_at_ms"].as_u64().unwrap())
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_without_authority_for_longer_than_a_lease_retires_nothing_for_it() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut members = cluster(dir.path());
    for m in &mut members {
        m.start();
    }
    let first = leader(&members, None).await;
    let api = members[first as usize - 1].api();
    let r = api
        .send(
            Method::PUT,
            "/v1/services/pay",
            Some(&json!({"owner": "payments", "contract": {}})),
        )
        .await
        .unwrap();
    assert!(r.status.is_success(), "{:?}", r.json());
    let body = json!({
        "service": "pay",
        "locality": {"region": "eu", "zone": "a", "node": "n1"},
        "address": {"ip": "10.9.0.1", "port": 8080},
        "lease_ms": 5_000,
    });
    let r = api
        .send(Method::POST, "/v1/instances", Some(&body))
        .await
        .unwrap();
    assert!(r.status.is_success(), "{:?}", r.json());
    let v = r.json().unwrap();
    let id = v["instance"].as_str().unwrap().to_owned();
    let first_end = v["expires_at_ms"].as_u64().unwrap();

    // The whole authority goes down and stays down past the lease's end: nobody can renew.
    for m in &mut members {
        m.kill();
    }
    // Wall time passing *is* the condition under test: no signal stands in for it.
    let past_end = Duration::from_millis(first_end.saturating_sub(unix_ms()) + 2_000);
    tokio::time::sleep(past_end).await;
    let back_at = unix_ms();
    for m in &mut members {
        m.start();
    }
    let second = leader(&members, None).await;
    let m = &members[second as usize - 1];

    // The new leader gives the lease a whole length from its term's start before it
    // expires anything; a leader that expired first would retire it (None).
    let deadline = Instant::now() + WAIT;
    let restarted_end = loop {
        match lease_end(m, &id).await {
            None => panic!("the instance was retired for the authority's own outage"),
            Some(end) if end >= back_at + 5_000 => break end,
            Some(_) => {}
        }
        assert!(Instant::now() < deadline, "the lease was never restarted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(restarted_end > first_end + 2_000);

    // Expiry still works: unrenewed, it goes once the restarted lease ends.
    let deadline = Instant::now() + WAIT;
    while lease_end(m, &id).await.is_some() {
        assert!(
            Instant::now() < deadline,
            "the restarted lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(unix_ms() >= restarted_end);
}
