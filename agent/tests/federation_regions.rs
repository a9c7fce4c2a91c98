//! Three regions on loopback, each a real `waymark authority` process with its own QUIC
//! federation endpoint, mutual TLS from one estate CA, and its own Raft files.
//!
//! Region `us` is reached by its peers only through a UDP relay the test controls, and its
//! front door is a TCP listener the test controls. Partitioning `us` drops every datagram
//! at the relay and closes its front door. Then:
//! - every region keeps resolving its own services exactly as before;
//! - `eu` and `ap` keep `us`'s endpoints in their views (tier 2), reported stale, and fail
//!   over away from `us` automatically (the out-of-band signal, not the registry);
//! - on heal, `eu` and `ap` record a reconciliation in the audit log naming what each side
//!   held, the aggregates converge on every region, and the failover shifts back.
#![allow(clippy::unwrap_used)]
#![allow(clippy::disallowed_methods)] // waits on real processes by the wall clock; no paused time here

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::Method;
use serde_json::{Value, json};
use tokio::net::UdpSocket;
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::config::FederationSection;
use waymark_agent::authority::settings::{FederationPeerEntry, FrontDoorEntry};
use waymark_agent::cli::tls::{ClientFiles, api_client_config};
use waymark_agent::tls::TlsSection;
use waymark_certs::reload::MaterialPaths;
use waymark_certs::testing::TestPkiDir;
use waymark_testkit::{POLL_INTERVAL, try_until, until};

use common::{authority_file, free_port, members, write_authority};

const TD: &str = "fed.test";
const REGIONS: [&str; 3] = ["ap", "eu", "us"];
const WAIT: Duration = Duration::from_secs(60);

/// A UDP relay in front of one federation endpoint: one upstream socket per client, so
/// replies find their way back. While `blocked`, every datagram both ways is dropped.
struct Relay {
    addr: SocketAddr,
    blocked: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Self {
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let addr = front.local_addr().unwrap();
        let blocked = Arc::new(AtomicBool::new(false));
        let gate = Arc::clone(&blocked);
        let task = tokio::spawn(async move {
            let mut upstreams: BTreeMap<SocketAddr, Arc<UdpSocket>> = BTreeMap::new();
            let mut buf = vec![0u8; 65_536];
            loop {
                let Ok((n, client)) = front.recv_from(&mut buf).await else {
                    return;
                };
                if gate.load(Ordering::SeqCst) {
                    continue;
                }
                let up = match upstreams.get(&client) {
                    Some(up) => Arc::clone(up),
                    None => {
                        let up = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
                        up.connect(target).await.unwrap();
                        let (back, front, gate) =
                            (Arc::clone(&up), Arc::clone(&front), Arc::clone(&gate));
                        tokio::spawn(async move {
                            let mut buf = vec![0u8; 65_536];
                            loop {
                                // A datagram sent before the target listened comes back as
                                // ICMP "refused" on this connected socket: not an end.
                                let Ok(n) = back.recv(&mut buf).await else {
                                    continue;
                                };
                                if !gate.load(Ordering::SeqCst) {
                                    let _ = front.send_to(&buf[..n], client).await;
                                }
                            }
                        });
                        upstreams.insert(client, Arc::clone(&up));
                        up
                    }
                };
                let _ = up.send(&buf[..n]).await;
            }
        });
        Self {
            addr,
            blocked,
            task,
        }
    }

    fn block(&self, blocked: bool) {
        self.blocked.store(blocked, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A front door that accepts and closes every connection until dropped.
struct FrontDoor {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl FrontDoor {
    async fn open(addr: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                drop(conn);
            }
        });
        Self { addr, task }
    }
}

impl Drop for FrontDoor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Region {
    name: &'static str,
    http: u16,
    fed: u16,
    child: Child,
    /// The region's initial management token, named `alice`.
    token: String,
    /// The estate's trust bundle: the API is TLS, and the CLI checks the server with it.
    bundle: PathBuf,
}

impl Region {
    fn api(&self) -> ApiClient {
        let files = ClientFiles {
            bundle: self.bundle.clone(),
            identity: None,
        };
        ApiClient::new(
            &format!("127.0.0.1:{}", self.http),
            Some(self.token.clone()),
        )
        .with_tls(api_client_config(&files, std::time::SystemTime::now()).unwrap())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The estate CA and one authority certificate per region, as files.
fn pki(dir: &Path) -> BTreeMap<&'static str, MaterialPaths> {
    let pki = TestPkiDir::init(&dir.join("pki"), TD, &REGIONS);
    REGIONS
        .iter()
        .map(|r| (*r, pki.issue(&format!("region/{r}/authority/1"))))
        .collect()
}

/// Writes a region's configuration: its peers at `peer_addr(region)`, `us`'s front door.
#[allow(clippy::too_many_arguments)]
fn config(
    dir: &Path,
    name: &str,
    http: u16,
    fed: u16,
    tls: &MaterialPaths,
    peers: &BTreeMap<&str, SocketAddr>,
    front_door: SocketAddr,
    token: &str,
) -> PathBuf {
    let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let (http, raft) = (loopback(http), loopback(free_port()));
    let token_file = dir.join(format!("{name}.token"));
    std::fs::write(&token_file, token).unwrap();
    let mut a = authority_file(1, name, &["a"], &dir.join(name));
    a.http = http;
    a.raft = raft;
    a.xds = loopback(0);
    a.members = members(&[(http, raft)]);
    a.tls = Some(TlsSection::new(TD, tls));
    let mut federation = FederationSection::new(loopback(fed));
    federation.stale_after = Duration::from_secs(2);
    federation.digest_interval = Duration::from_millis(200);
    federation.probe_interval = Duration::from_millis(300);
    federation.probe_timeout = Duration::from_millis(200);
    federation.fail_after = 2;
    federation.recover_after = 2;
    federation.peers = peers
        .iter()
        .filter(|(p, _)| **p != name)
        .map(|(peer, addr)| FederationPeerEntry {
            region: peer.parse().unwrap(),
            member: "1".into(),
            addr: *addr,
        })
        .collect();
    if name != "us" {
        federation.front_doors = vec![FrontDoorEntry {
            region: "us".parse().unwrap(),
            addrs: vec![front_door.to_string()],
        }];
    }
    a.federation = Some(federation);
    a.acl.initial_management_token_file = Some(token_file);
    let path = dir.join(format!("{name}.toml"));
    write_authority(&path, a);
    path
}

fn spawn(config: &Path, log: &Path) -> Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["authority", "--config"])
        .arg(config)
        .env(
            "RUST_LOG",
            std::env::var("WAYMARK_MEMBER_LOG")
                .unwrap_or_else(|_| "warn,waymark_agent=info".into()),
        )
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Registers an instance of `web` in `region` at 10.`octet`.0.`host`.
async fn register(r: &Region, octet: u8, host: u8) {
    let body = json!({
        "service": "web",
        "locality": {"region": r.name, "zone": "a", "node": format!("{}-n{host}", r.name)},
        "address": {"ip": format!("10.{octet}.0.{host}"), "port": 8080},
        "lease_ms": 600_000,
    });
    r.api()
        .send(Method::POST, "/v1/instances", Some(&body))
        .await
        .unwrap()
        .json()
        .unwrap();
}

/// The endpoints of `web` as region `r` serves them to callers in zone `a`: address → (region, tier).
async fn view(r: &Region) -> BTreeMap<String, (String, String)> {
    endpoints(&r.api().get_json("/v1/services/web/view").await.unwrap())
}

/// The endpoints of a `/v1/services/web/view` answer: address → (region, tier).
fn endpoints(views: &Value) -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    for v in views.as_array().into_iter().flatten() {
        for e in v["view"]["endpoints"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(_, e)| e)
        {
            out.insert(
                e["address"]["ip"].as_str().unwrap().to_owned(),
                (
                    e["region"].as_str().unwrap().to_owned(),
                    e["tier"].as_str().unwrap().to_owned(),
                ),
            );
        }
    }
    out
}

fn local_only(view: &BTreeMap<String, (String, String)>, region: &str) -> BTreeSet<String> {
    view.iter()
        .filter(|(_, (r, _))| r == region)
        .map(|(a, _)| a.clone())
        .collect()
}

async fn fed_status(r: &Region) -> Value {
    r.api().get_json("/v1/federation/status").await.unwrap()
}

fn peer<'a>(status: &'a Value, region: &str) -> &'a Value {
    status["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["region"] == region)
        .unwrap_or_else(|| panic!("no peer {region} in {status:#}"))
}

/// (region, service) → version held, as one region's status reports it (its own region
/// included, from its view of itself being the version peers hold of it).
fn held(status: &Value, region: &str) -> u64 {
    peer(status, region)["versions"]["web"]
        .as_u64()
        .unwrap_or(0)
}

async fn failover(r: &Region, region: &str) -> Value {
    let st = r.api().get_json("/v1/federation/failovers").await.unwrap();
    st[region].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_region_keeps_routing_its_peers_keep_it_stale_and_reconcile_on_heal() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let certs = pki(dir.path());
    let ports: BTreeMap<&str, (u16, u16)> = REGIONS
        .iter()
        .map(|r| (*r, (free_port(), free_port())))
        .collect();
    let us_fed: SocketAddr = format!("127.0.0.1:{}", ports["us"].1).parse().unwrap();
    let relay = Relay::start(us_fed).await;
    let peers: BTreeMap<&str, SocketAddr> = REGIONS
        .iter()
        .map(|r| {
            let addr = if *r == "us" {
                relay.addr
            } else {
                format!("127.0.0.1:{}", ports[r].1).parse().unwrap()
            };
            (*r, addr)
        })
        .collect();
    let door = FrontDoor::open("127.0.0.1:0".parse().unwrap()).await;
    let door_addr = door.addr;
    let regions: Vec<Region> = REGIONS
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let (http, fed) = ports[r];
            let token = waymark_agent::authority::credentials::generate("alice").unwrap();
            let path = config(
                dir.path(),
                r,
                http,
                fed,
                &certs[r],
                &peers,
                door_addr,
                &token,
            );
            let _ = i;
            Region {
                name: r,
                http,
                fed,
                child: spawn(&path, &dir.path().join(format!("{r}.log"))),
                token,
                bundle: certs[r].bundle.clone(),
            }
        })
        .collect();
    let [ap, eu, us] = [&regions[0], &regions[1], &regions[2]];
    for r in &regions {
        until("a leader", WAIT, async || {
            let s = r.api().get_json("/v1/status").await.ok()?;
            (s["is_leader"].as_bool() == Some(true)).then_some(())
        })
        .await;
        r.api()
            .send(
                Method::PUT,
                "/v1/services/web",
                Some(&json!({"owner": "web", "contract": {}})),
            )
            .await
            .unwrap()
            .json()
            .unwrap();
    }
    for (i, r) in regions.iter().enumerate() {
        for host in 1..=2 {
            register(r, i as u8 + 1, host).await;
        }
    }

    // Converged: every region routes its own two instances at tier 0 and the other four
    // at tier 2.
    for r in &regions {
        let what = format!("{}: tier 2 from both peers", r.name);
        let tier_2 = try_until(&what, WAIT, POLL_INTERVAL, async || {
            let v = view(r).await;
            let remote = v.values().filter(|(_, tier)| tier == "remote").count();
            if v.len() == 6 && remote == 4 {
                Ok(())
            } else {
                Err(format!("view {v:?}"))
            }
        })
        .await;
        if let Err(timed_out) = tier_2 {
            panic!(
                "{timed_out}\nviews {:?} {:?} {:?}\nfederation {}",
                view(&regions[0]).await,
                view(&regions[1]).await,
                view(&regions[2]).await,
                fed_status(r).await,
            );
        }
    }
    let before: Vec<BTreeSet<String>> = {
        let mut out = Vec::new();
        for r in &regions {
            out.push(local_only(&view(r).await, r.name));
        }
        out
    };
    assert_eq!(before[2].len(), 2);

    // Partition `us`: datagrams dropped, front door closed.
    relay.block(true);
    drop(door);
    for r in [ap, eu] {
        until("us reported stale", WAIT, async || {
            let st = fed_status(r).await;
            (peer(&st, "us")["stale"].as_bool() == Some(true)).then_some(())
        })
        .await;
        until("automatic failover away from us", WAIT, async || {
            let f = failover(r, "us").await;
            (f["manual"] == false && f["moved"].as_u64().unwrap_or(0) > 0).then_some(())
        })
        .await;
    }
    // `us` changes while cut off; nobody else can hear of it.
    register(us, 3, 3).await;
    // The aggregate is published from the committed views a moment after they change, so
    // the view can show the new instance while `local_versions` is still the old one: take
    // the version only once the aggregate is the one built from the views seen (its version
    // is their newest).
    let us_version = until("us publishes its new aggregate", WAIT, async || {
        let views = us.api().get_json("/v1/services/web/view").await.ok()?;
        let newest = views
            .as_array()?
            .iter()
            .filter_map(|v| v["version"].as_u64())
            .max()?;
        (local_only(&endpoints(&views), "us").len() == 3).then_some(())?;
        let own = us.api().get_json("/v1/federation/status").await.ok()?;
        let published = own["local_versions"]["web"].as_u64()?;
        (published == newest).then_some(published)
    })
    .await;
    for (r, own) in regions.iter().zip(&before).take(2) {
        let v = view(r).await;
        assert_eq!(
            &local_only(&v, r.name),
            own,
            "{}: own services unchanged",
            r.name
        );
        assert_eq!(
            local_only(&v, "us").len(),
            2,
            "{}: the partitioned region's endpoints are kept",
            r.name
        );
        assert!(held(&fed_status(r).await, "us") < us_version);
    }
    assert_eq!(
        local_only(&view(us).await, "eu").len(),
        2,
        "us keeps its peers' endpoints too"
    );

    // Heal.
    let door = FrontDoor::open(door_addr).await;
    relay.block(false);
    for r in [ap, eu] {
        until("us fresh and converged", WAIT, async || {
            let st = fed_status(r).await;
            let p = peer(&st, "us");
            (p["stale"].as_bool() == Some(false) && held(&st, "us") == us_version).then_some(())
        })
        .await;
        let log = until("a reconciliation record for us", WAIT, async || {
            let r = r
                .api()
                .send(
                    Method::GET,
                    "/v1/audit?kind=reconciliation&actor=waymark:federation",
                    None,
                )
                .await
                .ok()?;
            let text = String::from_utf8_lossy(&r.body).into_owned();
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .find(|e| {
                    // Delivered by `us` itself: a link carries only its peer's own
                    // region, so the other peer never relays it.
                    e["detail"]["peer_region"] == "us"
                        && e["detail"]["entries"].as_array().unwrap().iter().any(|x| {
                            x["region"] == "us"
                                && x["outcome"] == "took_theirs"
                                && x["theirs"] == us_version
                                && x["ours"].as_u64().is_some_and(|o| o < us_version)
                        })
                })
        })
        .await;
        assert_eq!(log["actor"], "waymark:federation");
        until("the new us instance at tier 2", WAIT, async || {
            (local_only(&view(r).await, "us").len() == 3).then_some(())
        })
        .await;
        until("shift-back under way", WAIT, async || {
            let f = failover(r, "us").await;
            (f.is_null() || f["direction"] == "back").then_some(())
        })
        .await;
    }
    // The CLI reads the same log.
    let out = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["federation", "reconcile-log", "--api"])
        .arg(format!("127.0.0.1:{}", eu.http))
        .env("WAYMARK_TOKEN", &eu.token)
        .env("WAYMARK_CA_BUNDLE", &eu.bundle)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("us/web") && l.contains("took_theirs")),
        "{text}"
    );

    // An operator's routing control, by the CLI: a manual failover away from `ap` on `eu`,
    // granted and audited with who and why; refusals (own region, completing a shift-back
    // that is not holding) change nothing and are audited too.
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_waymark"))
            .arg("federation")
            .args(args)
            .args(["--api", &format!("127.0.0.1:{}", eu.http)])
            .env("WAYMARK_TOKEN", &eu.token)
            .env("WAYMARK_CA_BUNDLE", &eu.bundle)
            .output()
            .unwrap()
    };
    let ok = cli(&["failover", "--region", "ap", "--reason", "ap drill"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // The command is committed at once; its first step's record follows it into the log.
    let f = until("the manual failover's first step", WAIT, async || {
        let f = failover(eu, "ap").await;
        f.is_object().then_some(f)
    })
    .await;
    assert_eq!(f["manual"], true, "{f}");
    assert_eq!(
        f["actor"], "token/alice",
        "the verified principal is the actor"
    );
    assert_eq!(f["reason"], "ap drill");
    assert!(f["moved"].as_u64().unwrap() > 0, "{f}");
    let own = cli(&["failover", "--region", "eu", "--reason", "no"]);
    assert!(
        !own.status.success(),
        "failing over our own region is refused"
    );
    let early = cli(&[
        "complete-shift-back",
        "--region",
        "ap",
        "--reason",
        "too soon",
    ]);
    assert!(
        !early.status.success(),
        "nothing is holding for completion yet"
    );
    let back = cli(&["shift-back", "--region", "ap", "--reason", "drill over"]);
    assert!(
        back.status.success(),
        "{}",
        String::from_utf8_lossy(&back.stderr)
    );
    until("shifting back", WAIT, async || {
        (failover(eu, "ap").await["direction"] == "back").then_some(())
    })
    .await;
    let audit = eu
        .api()
        .send(Method::GET, "/v1/audit?kind=policy&actor=token/alice", None)
        .await
        .unwrap();
    let outcomes: Vec<(String, String)> = String::from_utf8_lossy(&audit.body)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|e| {
            (
                e["detail"]["peer_region"].as_str().unwrap().to_owned(),
                e["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("ap", "granted"),
        ("eu", "refused"),
        ("ap", "refused"),
        ("ap", "granted"),
    ]
    .iter()
    .map(|(r, o)| ((*r).to_owned(), (*o).to_owned()))
    .collect();
    assert_eq!(outcomes, expected);
    let table = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args([
            "federation",
            "failovers",
            "--api",
            &format!("127.0.0.1:{}", eu.http),
        ])
        .env("WAYMARK_TOKEN", &eu.token)
        .env("WAYMARK_CA_BUNDLE", &eu.bundle)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("ap") && text.contains("manual") && text.contains("alice"),
        "{text}"
    );

    // Every signal above has a metric, and the exposition lints.
    let text = String::from_utf8(
        eu.api()
            .send(Method::GET, "/metrics", None)
            .await
            .unwrap()
            .body
            .to_vec(),
    )
    .unwrap();
    common::promtool_check(&text);
    for series in [
        "waymark_federation_region_stale{peer_region=\"us\"} 0",
        "waymark_federation_region_age_seconds{peer_region=\"us\"}",
        "waymark_federation_front_door_up{peer_region=\"us\"} 1",
        "waymark_federation_reconciliations_audited_total",
        "waymark_region_failover_moved_ratio{peer_region=\"ap\"}",
    ] {
        assert!(text.contains(series), "{series} missing from\n{text}");
    }
    let _ = (door, us.fed);
}
