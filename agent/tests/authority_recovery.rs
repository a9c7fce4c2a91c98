//! Operating a three-member region of real `waymark authority` processes (own redb files,
//! real sockets):
//!
//! - quorum loss: two members killed and their data deleted; the survivor cannot commit;
//!   `waymark operator raft recover` on the stopped survivor; it leads alone with every
//!   acknowledged registration, versions and audit numbers above the old ones, accepts
//!   writes, and a new member joins from an empty data directory and receives the state;
//! - rolling restart: every member restarted in turn, followers first, leadership moved
//!   off the leader before its own restart, while a writer registers throughout: nothing
//!   acknowledged is lost.
#![allow(clippy::unwrap_used)]
#![allow(clippy::disallowed_methods)] // waits on real processes by the wall clock

use crate::common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{authority_file, free_port, members, write_authority};
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::watch;
use waymark_agent::api_client::ApiClient;
use waymark_testkit::until;

const WAIT: Duration = Duration::from_secs(120);

struct Proc {
    id: u64,
    http: SocketAddr,
    raft: SocketAddr,
    config: PathBuf,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    token: String,
}

impl Proc {
    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_waymark"))
            .args(["authority", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "warn,waymark_agent=info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// SIGKILL: a crash, or a machine gone.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    fn api(&self) -> ApiClient {
        ApiClient::new(&self.http.to_string(), Some(self.token.clone()))
    }

    /// `waymark <args>` as this region's operator, against this member's API.
    fn cli(&self, args: &[&str]) -> Output {
        tokio::task::block_in_place(|| {
            Command::new(env!("CARGO_BIN_EXE_waymark"))
                .args(args)
                .args(["--api", &self.http.to_string(), "--token", &self.token])
                .output()
                .unwrap()
        })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// Members 1..=3 of region `eu`, configured and not started; `extra` more configured
/// to join later (ids 4…, knowing no initial members, so they never bootstrap).
fn region(dir: &Path, extra: u64) -> Vec<Proc> {
    let token = waymark_agent::authority::credentials::generate("management").unwrap();
    let token_file = dir.join("management.token");
    std::fs::write(&token_file, &token).unwrap();
    let addrs: Vec<(SocketAddr, SocketAddr)> =
        (0..3 + extra).map(|_| (loopback(), loopback())).collect();
    let initial = members(&addrs[..3]);
    (1..=3 + extra)
        .zip(&addrs)
        .map(|(id, &(http, raft))| {
            let config = dir.join(format!("m{id}.toml"));
            let data = dir.join(format!("m{id}"));
            let mut a = authority_file(id, "eu", &["a", "b"], &data);
            a.http = http;
            a.raft = raft;
            a.xds = loopback();
            if id <= 3 {
                a.members = initial.clone();
            }
            a.acl.initial_management_token_file = Some(token_file.clone());
            write_authority(&config, a);
            Proc {
                id,
                http,
                raft,
                config,
                data,
                log: dir.join(format!("m{id}.log")),
                child: None,
                token: token.clone(),
            }
        })
        .collect()
}

/// The leader the live members agree on (its own status says it leads).
async fn leader(procs: &[Proc]) -> u64 {
    until("a leader the live members agree on", WAIT, async || {
        for p in procs.iter().filter(|p| p.child.is_some()) {
            if let Ok(s) = p.api().get_json("/v1/status").await
                && let Some(id) = s["leader"]["id"].as_u64()
                && s["is_leader"].as_bool() == Some(id == p.id)
                && procs.iter().any(|x| x.id == id && x.child.is_some())
            {
                return Some(id);
            }
        }
        None
    })
    .await
}

/// Member `id`'s place in the region's list.
fn at(id: u64) -> usize {
    usize::try_from(id - 1).unwrap()
}

fn registration(n: u32) -> Value {
    json!({
        "service": "pay",
        "locality": {"region": "eu", "zone": if n.is_multiple_of(2) { "a" } else { "b" }, "node": "n1"},
        "address": {"ip": format!("10.2.{}.{}", n / 250, n % 250 + 1), "port": 8080},
        "lease_ms": 0,
    })
}

/// Register instance `n` through `api`; its id once acknowledged.
async fn register(api: &ApiClient, n: u32) -> Option<String> {
    let r = api
        .send(Method::POST, "/v1/instances", Some(&registration(n)))
        .await
        .ok()?;
    (r.status == StatusCode::CREATED)
        .then(|| r.json().ok())
        .flatten()
        .and_then(|v| v["instance"].as_str().map(str::to_owned))
}

/// The ids of `pay`'s instances as `p` holds them.
async fn held(p: &Proc) -> BTreeSet<String> {
    let list = p.api().get_json("/v1/instances?service=pay").await;
    list.ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|r| r["instance"]["id"].as_str().map(str::to_owned))
        .collect()
}

async fn holds_all(p: &Proc, acked: &BTreeSet<String>) {
    let what = format!("member {} to hold every acknowledged registration", p.id);
    until(&what, WAIT, async || {
        let missing = acked.difference(&held(p).await).count();
        if missing == 0 { Ok(()) } else { Err(missing) }
    })
    .await;
}

/// The highest version of `pay`'s published views on `p` (0: none yet).
async fn view_version(p: &Proc) -> u64 {
    let views = p.api().get_json("/v1/services/pay/view").await;
    views
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|v| {
            v["version"]
                .as_u64()
                .or_else(|| v["version"].as_str()?.parse().ok())
        })
        .max()
        .unwrap_or(0)
}

/// Every audit sequence number `p` holds, in the order it lists them.
async fn audit_seqs(p: &Proc) -> Vec<u64> {
    let r = p.api().send(Method::GET, "/v1/audit", None).await.unwrap();
    assert!(r.status.is_success(), "{}", r.status);
    String::from_utf8_lossy(&r.body)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok()?["seq"].as_u64())
        .collect()
}

async fn put_service(api: &ApiClient) {
    let body = json!({"owner": "payments", "contract": {}});
    let r = api
        .send(Method::PUT, "/v1/services/pay", Some(&body))
        .await
        .unwrap();
    assert!(r.status.is_success(), "{:?}", r.json());
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `waymark operator raft recover --config <member's file>`.
fn recover(p: &Proc) -> Output {
    tokio::task::block_in_place(|| {
        Command::new(env!("CARGO_BIN_EXE_waymark"))
            .args(["operator", "raft", "recover", "--config"])
            .arg(&p.config)
            .output()
            .unwrap()
    })
}

fn keep_dir(prefix: &str) -> tempfile::TempDir {
    // WAYMARK_KEEP_DIR=1 keeps the members' files and logs for inspection.
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .disable_cleanup(std::env::var_os("WAYMARK_KEEP_DIR").is_some())
        .tempdir()
        .unwrap();
    eprintln!("members' files and logs in {}", dir.path().display());
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_that_lost_two_of_three_members_is_recovered_from_the_survivor() {
    waymark_certs::install_crypto_provider();
    let dir = keep_dir("authority-recovery");
    let mut procs = region(dir.path(), 1);
    for p in procs.iter_mut().take(3) {
        p.start();
    }
    let first = leader(&procs).await;
    let api = procs[at(first)].api();
    put_service(&api).await;
    let mut acked = BTreeSet::new();
    for n in 0..30 {
        acked.insert(register(&api, n).await.expect("acknowledged"));
    }
    // The survivor is a follower: what it holds is all that is left of the region.
    let survivor = (1..=3).find(|&id| id != first).unwrap();
    holds_all(&procs[at(survivor)], &acked).await;
    let version_before = until("a published view", WAIT, async || {
        let v = view_version(&procs[at(survivor)]).await;
        (v > 0).then_some(v)
    })
    .await;
    let seqs_before = audit_seqs(&procs[at(survivor)]).await;
    let seq_before = seqs_before.iter().copied().max().unwrap_or(0);

    // Two members lost for good: killed, their data deleted.
    for id in (1..=3).filter(|&id| id != survivor) {
        let p = &mut procs[at(id)];
        p.kill();
        std::fs::remove_dir_all(&p.data).unwrap();
    }
    let s = &mut procs[at(survivor)];
    let refused = register(&s.api().with_timeout(Duration::from_secs(5)), 1000).await;
    assert_eq!(refused, None, "one member of three commits nothing");

    // The recovery refuses to touch a store its member holds open.
    let out = recover(s);
    assert!(!out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("in use by a running process"),
        "{}",
        said(&out)
    );

    s.kill();
    let started = Instant::now();
    let out = recover(s);
    assert!(out.status.success(), "{}", said(&out));
    let printed = said(&out);
    eprintln!("{printed}");
    for part in [
        "old membership:  voters [1, 2, 3]",
        &format!("new membership:  voters [{survivor}]"),
    ] {
        assert!(printed.contains(part), "{part:?} in {printed}");
    }
    s.start();
    let s = &procs[at(survivor)];
    until("the survivor to lead alone", WAIT, async || {
        let st = s.api().get_json("/v1/status").await.ok()?;
        (st["is_leader"].as_bool() == Some(true)).then_some(())
    })
    .await;
    let led_after = started.elapsed();
    holds_all(s, &acked).await;
    let new = until("a write on the recovered member", WAIT, async || {
        register(&s.api(), 2000).await
    })
    .await;
    let recovered_after = started.elapsed();
    eprintln!(
        "recovery: leading {} ms after the recover command started, first write acknowledged at {} ms",
        led_after.as_millis(),
        recovered_after.as_millis()
    );
    acked.insert(new);

    // Nothing went backwards: the new view (with the new instance) is numbered above
    // everything published before; the audit log kept its numbers and goes on above them.
    let version_after = until("the new instance published", WAIT, async || {
        let v = view_version(s).await;
        (v > version_before).then_some(v)
    })
    .await;
    assert!(
        version_after >> 32 > version_before >> 32,
        "a later term's versions"
    );
    let seqs_after = audit_seqs(s).await;
    assert_eq!(
        seqs_after[..seqs_before.len()],
        seqs_before[..],
        "the audit log before the loss is kept as it was"
    );
    assert!(seqs_after.windows(2).all(|w| w[0] < w[1]), "{seqs_after:?}");
    assert!(seqs_after.last().copied().unwrap_or(0) > seq_before);

    // A new member joins from an empty data directory and receives the state.
    procs[at(4)].start();
    let (http, raft) = (procs[at(4)].http.to_string(), procs[at(4)].raft.to_string());
    let s = &procs[at(survivor)];
    let out = s.cli(&[
        "operator", "raft", "join", "--id", "4", "--addr", &http, "--raft", &raft,
    ]);
    assert!(out.status.success(), "{}", said(&out));
    holds_all(&procs[at(4)], &acked).await;
    let peers = s.api().get_json("/v1/operator/raft/peers").await.unwrap();
    let voters: BTreeSet<u64> = peers
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] != "learner")
        .filter_map(|p| p["id"].as_u64())
        .collect();
    assert_eq!(voters, BTreeSet::from([survivor, 4]), "{peers}");
    // And the two commit together.
    let more = register(&s.api(), 3000).await.expect("committed by two");
    acked.insert(more);
    holds_all(&procs[at(4)], &acked).await;
}

#[derive(Default)]
struct Writes {
    acked: BTreeSet<String>,
    count: usize,
}

/// Registers instances until `stop`, through whichever member answers.
async fn writer(apis: Vec<ApiClient>, writes: Arc<Mutex<Writes>>, stop: watch::Receiver<bool>) {
    let mut n = 10_000u32;
    let mut next = 0usize;
    while !*stop.borrow() {
        n += 1;
        match register(&apis[next % apis.len()], n).await {
            Some(id) => {
                let mut w = writes.lock().unwrap();
                w.acked.insert(id);
                w.count += 1;
            }
            // A member restarting, or an election: try another.
            None => {
                next += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn writes_after(writes: &Arc<Mutex<Writes>>, more: usize) {
    let target = writes.lock().unwrap().count + more;
    until(&format!("{target} acknowledged writes"), WAIT, async || {
        let count = writes.lock().unwrap().count;
        if count >= target { Ok(()) } else { Err(count) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_followers_first_then_the_leader_after_a_transfer_loses_nothing() {
    waymark_certs::install_crypto_provider();
    let dir = keep_dir("authority-rolling");
    let mut procs = region(dir.path(), 0);
    for p in &mut procs {
        p.start();
    }
    let first = leader(&procs).await;
    put_service(&procs[at(first)].api()).await;
    let writes = Arc::new(Mutex::new(Writes::default()));
    let (stop, stopped) = watch::channel(false);
    let apis = procs.iter().map(Proc::api).collect();
    let writing = tokio::spawn(writer(apis, Arc::clone(&writes), stopped));
    writes_after(&writes, 10).await;

    // Followers first, one at a time, each back in the group before the next.
    let followers: Vec<u64> = (1..=3).filter(|&id| id != first).collect();
    for id in followers {
        procs[at(id)].kill();
        writes_after(&writes, 5).await; // the other two commit meanwhile
        procs[at(id)].start();
        let acked = writes.lock().unwrap().acked.clone();
        holds_all(&procs[at(id)], &acked).await;
        writes_after(&writes, 5).await;
    }
    // Then the leader: leadership moved to a caught-up voter first.
    let out = procs[at(first)].cli(&["operator", "raft", "transfer-leader"]);
    assert!(out.status.success(), "{}", said(&out));
    let now = leader(&procs).await;
    assert_ne!(now, first, "{}", said(&out));
    procs[at(first)].kill();
    writes_after(&writes, 5).await;
    procs[at(first)].start();
    writes_after(&writes, 5).await;
    stop.send_replace(true);
    writing.await.unwrap();

    let acked = std::mem::take(&mut writes.lock().unwrap().acked);
    assert!(acked.len() >= 30, "too few writes to mean anything");
    for p in &procs {
        holds_all(p, &acked).await;
    }
}
