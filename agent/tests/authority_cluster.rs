//! A three-member authority on loopback, each a real `waymark authority` process with its
//! own redb files. The leader is killed with SIGKILL again and again while a client
//! registers and renews instances: every acknowledged registration must be present
//! afterwards on every member (renewals are the leader's memory, never a log entry, and no
//! renewed instance may be retired), and xDS clients watching every member throughout must never see a
//! version go backwards.
//!
//! And three members in process with Raft on its own listener over mutual TLS: only the
//! region's authority members are admitted, each RPC only as the member its certificate
//! names.
#![allow(clippy::unwrap_used)]
#![allow(clippy::disallowed_methods)] // waits on real processes by the wall clock; no paused time here

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::pki::{estate, request, tls_client};
use common::{authority_file, free_port, members, write_authority};
use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use http::Method;
use openraft::Vote;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use serde_json::{Value, json};
use tokio::sync::watch;
use tonic::transport::Endpoint;
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::member::Authority;
use waymark_agent::authority::raft::TypeConfig;
use waymark_agent::authority::settings::{AuthorityConfig, TlsSettings};
use waymark_certs::testing::{TestPkiDir, certified};
use waymark_core::contract::HealthContract;
use waymark_core::model::ServiceName;
use waymark_registry::machine::Request;
use waymark_registry::state::{Command as Registry, Stamped};
use waymark_testkit::until;
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

fn cluster(dir: &Path) -> Vec<Member> {
    let token = waymark_agent::authority::credentials::generate("management").unwrap();
    let token_file = dir.join("management.token");
    std::fs::write(&token_file, &token).unwrap();
    let ports: Vec<(u16, u16, u16)> = (0..3)
        .map(|_| (free_port(), free_port(), free_port()))
        .collect();
    let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let addrs: Vec<_> = ports
        .iter()
        .map(|(http, raft, _)| (loopback(*http), loopback(*raft)))
        .collect();
    let members = members(&addrs);
    ports
        .iter()
        .enumerate()
        .map(|(i, (http, raft, xds))| {
            let id = i as u64 + 1;
            let config = dir.join(format!("m{id}.toml"));
            let mut a = authority_file(id, "eu", &["a", "b"], &dir.join(format!("m{id}")));
            a.http = loopback(*http);
            a.raft = loopback(*raft);
            a.xds = loopback(*xds);
            a.members = members.clone();
            a.acl.initial_management_token_file = Some(token_file.clone());
            write_authority(&config, a);
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
    until("a leader the live members agree on", WAIT, async || {
        for m in members.iter().filter(|m| m.child.is_some()) {
            if let Ok(s) = m.api().get_json("/v1/status").await
                && let Some(id) = s["leader"]["id"].as_u64()
                && Some(id) != except
                && s["is_leader"].as_bool() == Some(id == m.id)
                && members.iter().any(|x| x.id == id && x.child.is_some())
            {
                return Some(id);
            }
        }
        None
    })
    .await
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
    /// id → the lease end its registration committed. Renewals are acknowledged by the
    /// leader's term without a log entry, so they promise the instance stays, not that a
    /// member holds a later end.
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
                .map(|v| {
                    assert!(v["applied"]["expires_at_ms"].as_u64().is_some(), "{v}");
                    (id, None)
                })
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
                        Some(v["expires_at_ms"].as_u64().unwrap()),
                    )
                })
        };
        match result {
            Some((id, registered)) => {
                let mut a = acked.lock().unwrap();
                let e = a.leases.entry(id).or_default();
                *e = (*e).max(registered.unwrap_or(0));
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
    until(&format!("a version above {after}"), WAIT, async || {
        let newest = seen
            .iter()
            .filter_map(|s| s.lock().unwrap().last().copied())
            .max()
            .unwrap_or(0);
        (newest > after).then_some(newest)
    })
    .await
}

async fn writes_after(acked: &Arc<Mutex<Acked>>, more: usize) {
    let target = acked.lock().unwrap().writes + more;
    until(&format!("{target} acknowledged writes"), WAIT, async || {
        let writes = acked.lock().unwrap().writes;
        if writes >= target {
            Ok(())
        } else {
            Err(writes)
        }
    })
    .await;
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

    // Every acknowledged registration is on every member, with at least the lease end it
    // was acknowledged with; no renewed instance was retired.
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(
        acked.leases.len() >= 20,
        "too few registrations to mean anything"
    );
    for m in &members {
        let what = format!("member {} to hold every acknowledged write", m.id);
        until(&what, WAIT, async || {
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
                Ok(())
            } else {
                Err(format!(
                    "lacks {}, e.g. {:?}",
                    missing.len(),
                    missing.first()
                ))
            }
        })
        .await;
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
    let restarted_end = until("the lease to restart", WAIT, async || {
        match lease_end(m, &id).await {
            None => panic!("the instance was retired for the authority's own outage"),
            Some(end) if end >= back_at + 5_000 => Ok(end),
            Some(end) => Err(format!("ends at {end}")),
        }
    })
    .await;
    assert!(restarted_end > first_end + 2_000);

    // Expiry still works: unrenewed, it goes once the restarted lease ends.
    until("the restarted lease to expire", WAIT, async || {
        lease_end(m, &id).await.is_none()
    })
    .await;
    assert!(unix_ms() >= restarted_end);
}

// === Raft on its own listener, mutually authenticated (members in process) ===

const TD: &str = "waymark.test";
/// Far above any term a test group reaches by itself: a refused vote would have set it.
const FORGED_TERM: u64 = 1_000_000;

/// A token that reads every member's `/metrics` (tokens are replicated state).
static METRICS_TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The value of the series `series` (name and labels, exactly as exposed) on `a`'s API.
async fn series(a: &Authority, series: &str) -> u64 {
    let api = a.api_client(METRICS_TOKEN.get().cloned());
    common::series_value(&common::metrics_text(&api).await, series)
}

/// Waits until `series` on `a` reaches `want`.
async fn counted(a: &Authority, series: &str, want: u64) {
    common::counted(&a.api_client(METRICS_TOKEN.get().cloned()), series, want).await;
}

fn tls_member(pki: &TestPkiDir, dir: &Path, id: u64) -> AuthorityConfig {
    let mut config = common::plain_member(dir, id, &["a"]);
    config.tls = Some(TlsSettings {
        trust_domain: pki.trust_domain().clone(),
        paths: pki.issue(&format!("region/eu/authority/{id}")),
    });
    config
}

/// Three members over mutual TLS, in process, bootstrapped as one group.
async fn tls_group(pki: &TestPkiDir, dir: &Path) -> Vec<Authority> {
    let mut members = Vec::new();
    for id in 1..=3 {
        members.push(Authority::start(tls_member(pki, dir, id)).await.unwrap());
    }
    let voters: BTreeMap<u64, _> = (1..=3).zip(members.iter().map(Authority::member)).collect();
    for m in &members {
        m.bootstrap(voters.clone()).await.unwrap();
    }
    members
}

/// The leader, once every member names the same one.
async fn agreed_leader(members: &[Authority]) -> &Authority {
    until("a leader every member names", WAIT, async || {
        let named: BTreeSet<Option<u64>> = members
            .iter()
            .map(|m| m.raft().leader().map(|(id, _)| id))
            .collect();
        if let [Some(id)] = named.iter().copied().collect::<Vec<_>>()[..]
            && let Some(leader) = members.iter().find(|m| m.raft().is_leader())
        {
            assert_eq!(leader.raft().leader().map(|(l, _)| l), Some(id));
            return Ok(leader);
        }
        Err(format!("named {named:?}"))
    })
    .await
}

/// Waits for a leader, has it commit a new service `name`, and waits until every member
/// has applied it.
async fn commit_everywhere(members: &[Authority], name: &str) {
    let leader = agreed_leader(members).await;
    leader
        .raft()
        .write(Request::Registry(Stamped {
            at_ms: 1_000,
            command: Registry::PutService {
                service: ServiceName::try_new(name).unwrap(),
                owner: "payments".into(),
                contract: HealthContract::default(),
            },
        }))
        .await
        .unwrap();
    let written = leader.raft().watch_metrics().borrow().last_log_index;
    for m in members {
        let mut metrics = m.raft().watch_metrics();
        tokio::time::timeout(
            WAIT,
            metrics.wait_for(|x| x.last_applied.map(|l| l.index) >= written),
        )
        .await
        .expect("every member applies the write")
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_over_mutual_tls_admits_only_the_regions_members_each_as_itself() {
    // Goal: three members elect and commit over mutual TLS on their Raft listeners; the
    // API port serves no Raft; a client without a certificate, a node agent, another
    // region's authority and another trust domain's are refused at the handshake and
    // counted; a member's certificate cannot speak for another member, and the forged
    // vote changes no term.
    waymark_certs::install_crypto_provider();
    let pki = estate(TD);
    let dir = tempfile::tempdir().unwrap();
    let members = tls_group(&pki, dir.path()).await;

    // Elects, and commits a write on every member.
    commit_everywhere(&members, "pay").await;
    let leader = agreed_leader(&members).await;
    let token = waymark_agent::authority::credentials::token_with(
        leader.raft(),
        "metrics",
        &[waymark_registry::acl::Capability::Read],
        Duration::from_secs(3_600),
    )
    .await
    .unwrap();
    METRICS_TOKEN.set(token).unwrap();
    // Tokens are replicated: wait until every member has applied it.
    commit_everywhere(&members, "pay").await;

    let target = &members[0];
    let (raft, api) = (target.raft_addr(), target.http_addr());
    let vote = |term: u64, candidate: u64| {
        serde_json::to_string(&VoteRequest::<u64>::new(Vote::new(term, candidate), None)).unwrap()
    };

    // The API port serves no Raft: an anonymous vote is refused before any route (as
    // every anonymous request is), and the term below shows it changed nothing. Nor does
    // the API port speak plaintext.
    let anonymous = tls_client(&pki, None);
    let (status, _) = request(
        api,
        Some(anonymous),
        "POST",
        "/raft/vote",
        &vote(FORGED_TERM, 2),
    )
    .await
    .unwrap();
    assert_eq!(status, 401);
    assert!(
        request(api, None, "POST", "/raft/vote", &vote(FORGED_TERM, 2))
            .await
            .is_err()
    );
    // Nor does the Raft port speak plaintext.
    assert!(
        request(raft, None, "POST", "/raft/vote", &vote(FORGED_TERM, 2))
            .await
            .is_err()
    );

    // Refused at the handshake, each counted under its reason.
    let refused = [
        ("no_certificate", None),
        ("wrong_kind", Some(pki.certified("region/eu/node/n1"))),
        ("wrong_region", Some(pki.certified("region/us/authority/4"))),
        (
            "wrong_trust_domain",
            Some(certified(
                &pki.forge("eu", "spiffe://other.test/region/eu/authority/2"),
            )),
        ),
        (
            "wrong_ca",
            Some(estate("other.test").certified("region/eu/authority/2")),
        ),
    ];
    for (reason, cert) in refused {
        let client = tls_client(&pki, cert);
        let answer = request(
            raft,
            Some(client),
            "POST",
            "/raft/vote",
            &vote(FORGED_TERM, 2),
        )
        .await;
        assert!(answer.is_err(), "{reason}: answered {answer:?}");
        let name = format!(
            "waymark_http_tls_handshakes_failed_total{{listener=\"raft\",reason=\"{reason}\"}}"
        );
        counted(target, &name, 1).await;
    }

    // Member 3's certificate, speaking as member 3, is served (a stale vote, not granted)…
    let three = tls_client(&pki, Some(pki.certified("region/eu/authority/3")));
    let (status, body) = request(
        raft,
        Some(Arc::clone(&three)),
        "POST",
        "/raft/vote",
        &vote(0, 3),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"vote_granted\":false"), "{body}");
    // …but claiming to be member 2 it is refused, naming why, and counted.
    let mismatch = "waymark_raft_rpc_refused_total{reason=\"sender_mismatch\"}";
    assert_eq!(
        series(target, mismatch).await,
        0,
        "members' own traffic is never refused"
    );
    let (status, body) = request(
        raft,
        Some(three),
        "POST",
        "/raft/vote",
        &vote(FORGED_TERM, 2),
    )
    .await
    .unwrap();
    assert_eq!(status, 403, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["reason"], "sender_mismatch", "{body}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("member 3") && message.contains("member 2"),
        "{message}"
    );
    assert_eq!(series(target, mismatch).await, 1);
    // An AppendEntries as leader 2 at the forged term, which a follower would take as its
    // new leader's heartbeat, is refused the same way.
    let heartbeat = serde_json::to_string(&AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(FORGED_TERM, 2),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    })
    .unwrap();
    let follower = members.iter().find(|m| !m.raft().is_leader()).unwrap();
    let three = tls_client(&pki, Some(pki.certified("region/eu/authority/3")));
    let (status, body) = request(
        follower.raft_addr(),
        Some(three),
        "POST",
        "/raft/append",
        &heartbeat,
    )
    .await
    .unwrap();
    assert_eq!(status, 403, "{body}");
    counted(follower, mismatch, 1).await;
    // Audit records forwarded to the leader are admitted only as their sender, too.
    let three = tls_client(&pki, Some(pki.certified("region/eu/authority/3")));
    let leader = agreed_leader(&members).await;
    let forged = json!({"from": 2, "entries": []}).to_string();
    let before = series(leader, mismatch).await;
    let (status, body) = request(
        leader.raft_addr(),
        Some(three),
        "POST",
        "/raft/audit",
        &forged,
    )
    .await
    .unwrap();
    assert_eq!(status, 403, "{body}");
    counted(leader, mismatch, before + 1).await;

    // Nothing reached Raft: no member took the forged term (elections of its own may
    // happen on a loaded machine, never up to it), and the group still commits on every
    // member (an unchecked forged AppendEntries stops the receiving member's Raft).
    for m in &members {
        let term = m.raft().current_term();
        assert!(term < FORGED_TERM, "a member moved to term {term}");
    }
    assert!(series(target, "waymark_raft_term").await < FORGED_TERM);
    commit_everywhere(&members, "checkout").await;
    for m in members {
        m.shutdown().await;
    }
}

#[tokio::test]
async fn plaintext_raft_off_loopback_is_refused_at_start() {
    // Goal: without [authority.tls] Raft is plaintext, so a member refuses to serve it on
    // anything but loopback, naming the key.
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::plain(dir.path(), "eu", &["a"], "127.0.0.1:0".parse().unwrap());
    config.raft = "0.0.0.0:0".parse().unwrap();
    let e = Authority::start(config).await.unwrap_err().to_string();
    assert!(
        e.contains("authority.raft") && e.contains("[authority.tls]"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_decided_by_a_follower_is_in_the_replicated_audit_log() {
    // Goal: a follower answers reads itself, so it decides their refusals too; it cannot
    // commit the audit record, so it forwards it to the leader over the Raft listener (as
    // itself, over the members' mutual TLS), and every member's log then holds it.
    waymark_certs::install_crypto_provider();
    let pki = estate(TD);
    let dir = tempfile::tempdir().unwrap();
    let members = tls_group(&pki, dir.path()).await;
    commit_everywhere(&members, "pay").await;
    let leader = agreed_leader(&members).await;
    let nobody = waymark_agent::authority::credentials::token_with(
        leader.raft(),
        "nobody",
        &[],
        Duration::from_secs(3_600),
    )
    .await
    .unwrap();
    let auditor = waymark_agent::authority::credentials::token_with(
        leader.raft(),
        "auditor",
        &[waymark_registry::acl::Capability::Read],
        Duration::from_secs(3_600),
    )
    .await
    .unwrap();
    // Both tokens are replicated before the follower is asked.
    commit_everywhere(&members, "checkout").await;
    let follower = members.iter().find(|m| !m.raft().is_leader()).unwrap();
    let refused = follower
        .api_client(Some(nobody))
        .send(Method::GET, "/v1/services", None)
        .await
        .unwrap();
    assert_eq!(refused.status, 403, "{refused:?}");

    // On every member, including the leader that never saw the request.
    for m in &members {
        let audit = m.api_client(Some(auditor.clone()));
        let what = format!("member {} to record the refusal", m.http_addr());
        let line = until(&what, WAIT, async || {
            let r = audit
                .send(
                    Method::GET,
                    "/v1/audit?kind=denial&actor=token/nobody",
                    None,
                )
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&r.body).into_owned();
            text.lines().next().map(str::to_owned)
        })
        .await;
        let record: Value = serde_json::from_str(&line).unwrap();
        assert!(record.to_string().contains("GET /v1/services"), "{record}");
    }
    for m in members {
        m.shutdown().await;
    }
}
