//! `bench writes`: acknowledged registry writes per second through the authority's real API,
//! beside a single-member etcd driven by the same client on the same work.
//!
//! Both stores run on this machine as separate processes with durable writes (waymark's
//! Raft log on redb, committed before the answer; etcd with its default fsync on every
//! commit) and are reached over loopback HTTP/1.1 by the same pooled client
//! ([`waymark_agent::api_client::ApiClient`]). waymark's API checks a bearer token on every
//! request; etcd runs with authentication off, its default — the comparison is tilted
//! towards etcd, not away from it.
//!
//! The work, identical on both sides:
//! - first an estate is loaded (the reference estate's 60,000 instances over 450 services
//!   unless sized down), not measured;
//! - then, for each client count, every client loops for the phase's length: register a new
//!   instance (etcd: put its record under its own key), and once it holds `hold` of its own,
//!   deregister the oldest (etcd: delete that key). The estate stays the same size, and
//!   registrations and deregistrations count alike as acknowledged writes.
//!
//! Measure a release build of `waymark` (`WAYMARK_BIN=target/release/waymark`): etcd is
//! one, and the report names the binary it ran.
//!
//! - then, at the first client count, lease renewals: every client renews its own stride
//!   through the loaded estate (`PUT /v1/instances/{id}/renew`), against etcd's
//!   `LeaseKeepAlive` (its JSON gateway) on 1,024 leases granted for the purpose. Both keep
//!   renewals in the leader's memory rather than the log; the report counts the log entries
//!   waymark proposed meanwhile (0).
//!
//! The record etcd stores is the very JSON body waymark is sent (service, locality, address,
//! lease), so both sides carry the same bytes. Phases alternate between the two stores and
//! repeat, so drift on the machine lands on both; the report gives each figure's median and
//! spread, and the ratio waymark ÷ etcd of the medians.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http::Method;
use serde::Serialize;
use serde_json::json;
use waymark_agent::api_client::ApiClient;

use crate::drill::report::quantile;
use crate::estate::{self, LOAD_CONCURRENCY, ZONES};
use crate::harness::fleet::{self, Api, FleetAuthority, LEASE_MS, Limits};
use crate::harness::{Proc, free_port, loopback, wait_serving, waymark_bin};

/// Region the authority serves.
const REGION: &str = "bench";
/// How long a store may take to come up.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Client counts, each a phase.
    pub clients: Vec<usize>,
    /// Length of each measured phase.
    pub phase_s: u64,
    /// Times each phase runs on each store.
    pub repeats: usize,
    /// Services the estate spreads over.
    pub services: usize,
    /// Instances loaded before measuring.
    pub estate: usize,
    /// Instances each client holds before it deregisters its oldest.
    pub hold: usize,
}

/// One measured phase on one store.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// Acknowledged writes.
    pub writes: usize,
    /// Writes answered with an error (not counted in the rate).
    pub failed: usize,
    /// Acknowledged writes per second.
    pub per_sec: f64,
    /// Median latency of an acknowledged write.
    pub p50_ms: f64,
    /// 99th percentile of that latency.
    pub p99_ms: f64,
}

/// A figure's median and spread over the repeats.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The median and extremes of `values`.
    pub fn of(values: &[f64]) -> Self {
        Self {
            median: quantile(values, 0.5).unwrap_or(0.0),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// One kind of work on both stores, over the repeats.
#[derive(Debug, Clone, Serialize)]
pub struct Compared {
    /// waymark's acknowledged operations per second.
    pub waymark_per_sec: Spread,
    /// etcd's, on the same work.
    pub etcd_per_sec: Spread,
    /// Each store's p99 latency, per repeat.
    pub waymark_p99_ms: Spread,
    pub etcd_p99_ms: Spread,
    /// `waymark_per_sec.median / etcd_per_sec.median`.
    pub ratio: f64,
}

impl Compared {
    /// The figures of waymark's phases `w` beside etcd's `e`.
    fn of(w: &[Phase], e: &[Phase]) -> Self {
        let rates = |p: &[Phase]| Spread::of(&p.iter().map(|p| p.per_sec).collect::<Vec<_>>());
        let p99s = |p: &[Phase]| Spread::of(&p.iter().map(|p| p.p99_ms).collect::<Vec<_>>());
        let (wr, er) = (rates(w), rates(e));
        Self {
            ratio: if er.median > 0.0 {
                wr.median / er.median
            } else {
                0.0
            },
            waymark_per_sec: wr,
            etcd_per_sec: er,
            waymark_p99_ms: p99s(w),
            etcd_p99_ms: p99s(e),
        }
    }
}

/// One client count, both stores.
#[derive(Debug, Clone, Serialize)]
pub struct ClientsReport {
    pub clients: usize,
    /// Acknowledged writes per second and their latency on both stores.
    #[serde(flatten)]
    pub compared: Compared,
    /// waymark's median rate as changes per minute.
    pub waymark_changes_per_min: f64,
    /// Every phase as measured, in order.
    pub waymark_phases: Vec<Phase>,
    pub etcd_phases: Vec<Phase>,
}

/// Lease renewals: waymark's `PUT /v1/instances/{id}/renew` over the loaded estate, beside
/// etcd's `LeaseKeepAlive` through its JSON gateway on leases granted for the phase. Both
/// stores keep renewals in the leader's memory, not in their logs (etcd's lessor does the
/// same), so this compares two in-memory paths behind the same HTTP client.
#[derive(Debug, Clone, Serialize)]
pub struct RenewalsReport {
    pub clients: usize,
    /// Acknowledged renewals (etcd: keep-alives) per second and their latency.
    #[serde(flatten)]
    pub compared: Compared,
    /// Log entries group commit proposed during waymark's renewal phases: renewals are no
    /// log entries, so this stays 0.
    pub raft_entries: u64,
    /// Instances renewed over (the loaded estate) and etcd leases kept alive.
    pub instances: usize,
    pub etcd_leases: usize,
}

/// The benchmark's figures.
#[derive(Debug, Clone, Serialize)]
pub struct WritesReport {
    /// Always `"writes"`.
    pub bench: &'static str,
    pub params: Params,
    /// `etcd --version`'s first line.
    pub etcd_version: String,
    /// The `waymark` binary measured (`WAYMARK_BIN`, or the one beside this program):
    /// measure a release build, as etcd's is.
    pub waymark_bin: String,
    /// Log entries group commit proposed during the measured phases, and the registry
    /// commands they carried on average (the authority's own counters).
    pub raft_entries: u64,
    pub commands_per_entry: f64,
    pub by_clients: Vec<ClientsReport>,
    /// Lease renewals at the first client count, beside etcd's lease keep-alives.
    pub renewals: RenewalsReport,
    /// The ratio at the first client count (16 by default): the headline.
    pub ratio: f64,
    /// waymark's median changes per minute at the first client count.
    pub changes_per_min: f64,
}

/// A store the bench drives: waymark's API or etcd's JSON gateway.
#[derive(Clone)]
enum Store {
    Waymark(Api),
    Etcd(ApiClient),
}

/// What one write left behind, to undo later.
enum Held {
    Instance(String),
    Key(String),
}

/// What a renewal renews: a registered instance, or an etcd lease.
#[derive(Clone)]
enum Renewable {
    Instance(String),
    Lease(String),
}

/// etcd leases granted for the renewal phase.
const ETCD_LEASES: usize = 1_024;

impl Store {
    /// Registers (puts) the `n`th instance; what to remove later.
    async fn add(&self, services: usize, n: usize) -> anyhow::Result<Held> {
        let (service, zone, addr) = estate::spec(n, services);
        match self {
            Self::Waymark(api) => Ok(Held::Instance(api.register(&service, zone, addr).await?)),
            Self::Etcd(client) => {
                let key = format!("/waymark/instances/{service}/{addr}");
                let body = json!({
                    "key": BASE64.encode(&key),
                    "value": BASE64.encode(record(&service, zone, addr).to_string()),
                });
                let r = client.send(Method::POST, "/v3/kv/put", Some(&body)).await?;
                anyhow::ensure!(r.status.is_success(), "etcd put answered {}", r.status);
                Ok(Held::Key(key))
            }
        }
    }

    /// Renews a lease: waymark's renewal, etcd's keep-alive.
    async fn renew(&self, what: &Renewable) -> anyhow::Result<()> {
        match (self, what) {
            (Self::Waymark(api), Renewable::Instance(id)) => api.renew(id).await,
            (Self::Etcd(client), Renewable::Lease(id)) => {
                let body = json!({"ID": id});
                let r = client
                    .send(Method::POST, "/v3/lease/keepalive", Some(&body))
                    .await?;
                anyhow::ensure!(
                    r.status.is_success(),
                    "etcd keep-alive answered {}",
                    r.status
                );
                let v = r.json()?;
                // The gateway streams one answer per request; a lease it no longer knows
                // comes back without a TTL.
                anyhow::ensure!(
                    v["result"]["TTL"].as_str().is_some_and(|t| t != "0"),
                    "etcd kept nothing alive: {v}"
                );
                Ok(())
            }
            _ => anyhow::bail!("a lease from one store handed to the other"),
        }
    }

    /// Grants `count` etcd leases of `ttl_s`; their ids.
    async fn grant(&self, count: usize, ttl_s: u64) -> anyhow::Result<Vec<Renewable>> {
        let Self::Etcd(client) = self else {
            anyhow::bail!("only etcd grants leases here");
        };
        let mut leases = Vec::with_capacity(count);
        for _ in 0..count {
            let r = client
                .send(
                    Method::POST,
                    "/v3/lease/grant",
                    Some(&json!({"TTL": ttl_s})),
                )
                .await?;
            anyhow::ensure!(r.status.is_success(), "etcd grant answered {}", r.status);
            let v = r.json()?;
            let id = v["ID"]
                .as_str()
                .with_context(|| format!("etcd granted no id: {v}"))?;
            leases.push(Renewable::Lease(id.to_owned()));
        }
        Ok(leases)
    }

    /// Deregisters (deletes) what [`Self::add`] wrote.
    async fn remove(&self, held: &Held) -> anyhow::Result<()> {
        match (self, held) {
            (Self::Waymark(api), Held::Instance(id)) => api.deregister(id).await,
            (Self::Etcd(client), Held::Key(key)) => {
                let body = json!({"key": BASE64.encode(key)});
                let r = client
                    .send(Method::POST, "/v3/kv/deleterange", Some(&body))
                    .await?;
                anyhow::ensure!(r.status.is_success(), "etcd delete answered {}", r.status);
                Ok(())
            }
            _ => anyhow::bail!("a record from one store handed to the other"),
        }
    }
}

/// The registration body waymark is sent, and the value etcd stores.
fn record(service: &str, zone: &str, addr: SocketAddr) -> serde_json::Value {
    json!({
        "service": service,
        "locality": {"region": REGION, "zone": zone, "node": format!("node-{zone}")},
        "address": {"ip": addr.ip().to_string(), "port": addr.port()},
        "lease_ms": LEASE_MS,
    })
}

/// Runs the benchmark with its stores' files under `dir`.
pub async fn run(params: Params, dir: &Path) -> anyhow::Result<WritesReport> {
    anyhow::ensure!(
        !params.clients.is_empty() && params.clients.iter().all(|c| *c > 0),
        "client counts must be positive"
    );
    anyhow::ensure!(params.services > 0 && params.repeats > 0 && params.phase_s > 0);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let nofile = fleet::raise_nofile();
    eprintln!(
        "bench writes: open files allowed {nofile}; files under {}",
        dir.display()
    );
    let etcd_bin = etcd_bin()?;
    let etcd_version = version(&etcd_bin);
    eprintln!("bench writes: {etcd_version}");

    let zones: Vec<String> = ZONES.iter().map(|z| (*z).to_owned()).collect();
    let bin = waymark_bin()?;
    eprintln!("bench writes: waymark at {}", bin.display());
    let mut authority = FleetAuthority::new(
        &bin,
        &dir.join("authority"),
        REGION,
        &zones,
        Limits::default(),
    )?;
    authority.start()?;
    authority.wait_ready(START_DEADLINE).await?;
    let api = Api::new(authority.http_addr(), REGION);
    let services: Vec<String> = (0..params.services).map(fleet::service_name).collect();
    api.declare(&services, START_DEADLINE).await?;
    let mut etcd = Etcd::start(&etcd_bin, &dir.join("etcd")).await?;

    let waymark = Store::Waymark(api.clone());
    let etcd_store = Store::Etcd(crate::harness::api_client_with(etcd.client, None));
    // Numbers never reused across the run: every instance has its own address and key.
    let next = Arc::new(AtomicUsize::new(0));
    let mut estate = Vec::new();
    for (name, store) in [("waymark", &waymark), ("etcd", &etcd_store)] {
        let started = Instant::now();
        let services = params.services;
        let adder = store.clone();
        let loaded = estate::load(params.estate, LOAD_CONCURRENCY, &next, move |n| {
            let store = adder.clone();
            async move { store.add(services, n).await }
        })
        .await?;
        if name == "waymark" {
            estate = loaded
                .into_iter()
                .filter_map(|h| match h {
                    Held::Instance(id) => Some(Renewable::Instance(id)),
                    Held::Key(_) => None,
                })
                .collect();
        }
        eprintln!(
            "bench writes: {name} holds the estate of {} after {:.1} s",
            params.estate,
            started.elapsed().as_secs_f64()
        );
    }

    let before = commit_counters(&api).await?;
    let mut by_clients = Vec::new();
    for &clients in &params.clients {
        let (mut w, mut e) = (Vec::new(), Vec::new());
        for repeat in 0..params.repeats {
            for (name, store, into) in
                [("waymark", &waymark, &mut w), ("etcd", &etcd_store, &mut e)]
            {
                let phase = churn(store, &params, clients, &next).await;
                etcd.check_running()?;
                eprintln!(
                    "bench writes: {name} {clients} clients, repeat {}: {:.0} writes/s (p99 {:.1} ms, {} failed)",
                    repeat + 1,
                    phase.per_sec,
                    phase.p99_ms,
                    phase.failed
                );
                into.push(phase);
            }
        }
        let compared = Compared::of(&w, &e);
        by_clients.push(ClientsReport {
            clients,
            waymark_changes_per_min: compared.waymark_per_sec.median * 60.0,
            compared,
            waymark_phases: w,
            etcd_phases: e,
        });
    }
    let after = commit_counters(&api).await?;
    let (entries, commands) = (after.0 - before.0, after.1 - before.1);
    let renewals = renewals((&waymark, &etcd_store), &api, &params, estate, &mut etcd).await?;
    etcd.stop();
    authority.kill();
    let first = &by_clients[0];
    Ok(WritesReport {
        bench: "writes",
        etcd_version,
        waymark_bin: bin.display().to_string(),
        raft_entries: entries as u64,
        commands_per_entry: if entries > 0.0 {
            commands / entries
        } else {
            0.0
        },
        ratio: first.compared.ratio,
        changes_per_min: first.waymark_changes_per_min,
        by_clients,
        renewals,
        params,
    })
}

/// The renewal phases at the first client count, alternating between the stores.
async fn renewals(
    (waymark, etcd_store): (&Store, &Store),
    api: &Api,
    params: &Params,
    estate: Vec<Renewable>,
    etcd: &mut Etcd,
) -> anyhow::Result<RenewalsReport> {
    let clients = params.clients[0];
    anyhow::ensure!(!estate.is_empty(), "no instance was loaded to renew");
    let instances = estate.len();
    let estate = Arc::new(estate);
    let leases = Arc::new(etcd_store.grant(ETCD_LEASES, 600).await?);
    let (mut w, mut e) = (Vec::new(), Vec::new());
    let before = commit_counters(api).await?;
    for repeat in 0..params.repeats {
        for (name, store, targets, into) in [
            ("waymark renewals", waymark, &estate, &mut w),
            ("etcd keep-alives", etcd_store, &leases, &mut e),
        ] {
            let phase = renew(store, targets, params.phase_s, clients).await;
            etcd.check_running()?;
            eprintln!(
                "bench writes: {name}, {clients} clients, repeat {}: {:.0}/s (p99 {:.1} ms, {} failed)",
                repeat + 1,
                phase.per_sec,
                phase.p99_ms,
                phase.failed
            );
            into.push(phase);
        }
    }
    // Only waymark's phases could propose entries: etcd's touch nothing of the authority.
    let entries = commit_counters(api).await?.0 - before.0;
    Ok(RenewalsReport {
        clients,
        compared: Compared::of(&w, &e),
        raft_entries: entries as u64,
        instances,
        etcd_leases: leases.len(),
    })
}

/// One renewal phase: `clients` loops, each renewing its own stride through `targets`.
async fn renew(
    store: &Store,
    targets: &Arc<Vec<Renewable>>,
    phase_s: u64,
    clients: usize,
) -> Phase {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(phase_s);
    let mut workers = Vec::new();
    for c in 0..clients {
        let (store, targets) = (store.clone(), Arc::clone(targets));
        workers.push(tokio::spawn(async move {
            let (mut latencies, mut failed) = (Vec::new(), 0usize);
            let mut k = c;
            while Instant::now() < deadline {
                let t = Instant::now();
                if store.renew(&targets[k % targets.len()]).await.is_ok() {
                    latencies.push(t.elapsed().as_secs_f64() * 1e3);
                } else {
                    failed += 1;
                }
                k += clients;
            }
            (latencies, failed)
        }));
    }
    phase(workers, started).await
}

/// One measured phase: `clients` loops of register / deregister-the-oldest.
async fn churn(store: &Store, params: &Params, clients: usize, next: &Arc<AtomicUsize>) -> Phase {
    let length = Duration::from_secs(params.phase_s);
    let started = Instant::now();
    let deadline = started + length;
    let mut workers = Vec::new();
    for _ in 0..clients {
        let (store, next) = (store.clone(), Arc::clone(next));
        let (services, hold) = (params.services, params.hold.max(1));
        workers.push(tokio::spawn(async move {
            let mut held = VecDeque::new();
            let (mut latencies, mut failed) = (Vec::new(), 0usize);
            let mut record = |t: Instant, ok: bool| {
                if ok {
                    latencies.push(t.elapsed().as_secs_f64() * 1e3);
                } else {
                    failed += 1;
                }
            };
            while Instant::now() < deadline {
                let t = Instant::now();
                if held.len() >= hold
                    && let Some(oldest) = held.pop_front()
                {
                    let ok = store.remove(&oldest).await.is_ok();
                    record(t, ok);
                } else {
                    match store
                        .add(services, next.fetch_add(1, Ordering::Relaxed))
                        .await
                    {
                        Ok(h) => {
                            held.push_back(h);
                            record(t, true);
                        }
                        Err(_) => record(t, false),
                    }
                }
            }
            // What this client still holds is left in place: the estate grows by at most
            // `hold` per client, and the next phase starts from the same shape.
            (latencies, failed)
        }));
    }
    phase(workers, started).await
}

/// A phase's figures from its clients' latencies (ms) and failures.
async fn phase(
    workers: Vec<tokio::task::JoinHandle<(Vec<f64>, usize)>>,
    started: Instant,
) -> Phase {
    let (mut latencies, mut failed) = (Vec::new(), 0);
    for w in workers {
        if let Ok((l, f)) = w.await {
            latencies.extend(l);
            failed += f;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    Phase {
        writes: latencies.len(),
        failed,
        per_sec: latencies.len() as f64 / elapsed,
        p50_ms: quantile(&latencies, 0.5).unwrap_or(0.0),
        p99_ms: quantile(&latencies, 0.99).unwrap_or(0.0),
    }
}

/// Group commit's entries and commands so far (`waymark_registry_commit_*_total`).
async fn commit_counters(api: &Api) -> anyhow::Result<(f64, f64)> {
    let text = api.metrics().await?;
    let read = |name: &str| fleet::metric(&text, name).with_context(|| format!("no {name}"));
    Ok((
        read("waymark_registry_commit_entries_total")?,
        read("waymark_registry_commit_commands_total")?,
    ))
}

/// A single-member etcd on loopback, fsync on (its default).
struct Etcd {
    proc: Proc,
    client: SocketAddr,
}

impl Etcd {
    async fn start(bin: &Path, dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let (client, peer) = (loopback(free_port()?), loopback(free_port()?));
        let (client_url, peer_url) = (format!("http://{client}"), format!("http://{peer}"));
        let data = dir.join("data");
        let args = [
            "--name".to_owned(),
            "bench".to_owned(),
            "--data-dir".to_owned(),
            data.display().to_string(),
            "--listen-client-urls".to_owned(),
            client_url.clone(),
            "--advertise-client-urls".to_owned(),
            client_url,
            "--listen-peer-urls".to_owned(),
            peer_url.clone(),
            "--initial-advertise-peer-urls".to_owned(),
            peer_url.clone(),
            "--initial-cluster".to_owned(),
            format!("bench={peer_url}"),
        ];
        let mut proc = Proc::spawn("etcd", bin, args, &[], &dir.join("etcd.log"))?;
        wait_serving(
            &mut proc,
            "etcd answers /health",
            START_DEADLINE,
            client,
            "/health",
        )
        .await?;
        Ok(Self { proc, client })
    }

    fn check_running(&mut self) -> anyhow::Result<()> {
        self.proc.check_running()
    }

    fn stop(&mut self) {
        self.proc.kill();
    }
}

/// etcd from `ETCD_BIN`, the `PATH`, or installed from Debian's `etcd-server` package.
fn etcd_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("ETCD_BIN") {
        return Ok(PathBuf::from(p));
    }
    let found = || {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("etcd"))
                .find(|p| p.is_file())
        })
    };
    if let Some(p) = found() {
        return Ok(p);
    }
    eprintln!("bench writes: etcd is not installed; installing Debian's etcd-server");
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    let install = [
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        "etcd-server",
    ];
    if !apt(&install) {
        anyhow::ensure!(apt(&["update", "-qq"]), "apt-get update failed");
        anyhow::ensure!(apt(&install), "apt-get install etcd-server failed");
    }
    found().context("etcd-server installed, yet no etcd on the PATH")
}

/// The first line of `bin --version`.
fn version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "etcd (version unknown)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_is_the_median_and_the_extremes() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
    }

    #[test]
    fn etcd_stores_the_bytes_waymark_is_sent() {
        let addr = fleet::address(7);
        let r = record("svc-01", "z2", addr);
        assert_eq!(r["address"]["ip"], addr.ip().to_string());
        assert_eq!(r["locality"]["zone"], "z2");
        assert_eq!(r["lease_ms"], LEASE_MS);
    }
}
