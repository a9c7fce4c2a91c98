//! `region-partition`: three regions, each a single-member `waymark authority` federating
//! with the other two over QUIC (mutual TLS). Region `us` runs in a network namespace and is
//! cut off from its peers, changes while cut off, and is healed. Each region must keep
//! routing its own services exactly as before (ADR-14); the peers must keep `us`'s
//! endpoints at tier 2 and report it stale; after the heal the reconciliation must be in
//! the peers' audit logs and the aggregates must converge.
//!
//! ```text
//!  root namespace                                        namespace
//!  ap authority ─┐                                       us authority (+2 instances)
//!  eu authority ─┼── QUIC federation ◄──── ✂ ────►      (an operator puts one in
//!  (+2 each)     │                                        maintenance while cut off)
//!  eu agent ──► Envoy ──► eu's backends (traffic)
//! ```
//!
//! `--break-stale-drop` sets `[authority.federation] drop_stale_peers` on `ap` and `eu`
//! (a drills-only knob: a stale peer's tier 2 is dropped): the verdict must then fail.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;
use http::Method;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;
use waymark_agent::api_client::ApiClient;

use super::Scale;
use super::figures::{self, PhaseFigures, Verdict, Window};
use super::report::{self, Distribution, Plots, Progress, StateSampler};
use crate::harness::backends::{DemoFleet, FleetSpec, MAX_LEASE};
use crate::harness::envoy::EnvoyProc;
use crate::harness::netns::Netns;
use crate::harness::region::{
    AgentSpec, AuthorityAddrs, AuthoritySpec, FederationSpec, Pki, RegionAgent, RegionAuthority,
};
use crate::harness::{envoy_bin, wait_until, waymark_bin};
use crate::traffic::{Generator, ms};

const DRILL: &str = "region-partition";
/// The regions, the cut one last.
const REGIONS: [&str; 3] = ["ap", "eu", "us"];
const CUT: &str = "us";
/// The region whose Envoy carries traffic.
const TRAFFIC: &str = "eu";
const ZONE: &str = "a";
const SERVICE: &str = "web";
const TRUST_DOMAIN: &str = "drill.waymark";
const START_DEADLINE: Duration = Duration::from_secs(60);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What the drill is run with.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub scale: Scale,
    /// Steady traffic before the cut (the baseline).
    pub baseline_s: u64,
    /// How long `us` stays cut off.
    pub partition_s: u64,
    /// Steady traffic after the heal (reconciliation is waited for inside it).
    pub after_s: u64,
    /// Requests per second through Envoy.
    pub rate: u32,
    /// Instances per region.
    pub per_region: usize,
    /// Recorded for uniformity: the drill makes no random choice.
    pub seed: u64,
    pub budget: Budget,
    /// Break the property on purpose: the peers drop a stale region's tier 2.
    pub break_stale_drop: bool,
}

/// What the drill holds the run to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Budget {
    /// Federation's `stale_after` for the run.
    pub stale_after_ms: u64,
    /// The peers must report the cut region stale within this of the cut.
    pub stale_within_ms: u64,
    /// After the heal, reconciliation audited and aggregates converged within this.
    pub converge_within_ms: u64,
    /// How much the error rate may rise over the baseline (absolute).
    pub error_rate_margin: f64,
    /// Each phase needs this many requests for its rate to mean anything.
    pub min_requests: u64,
}

impl Params {
    /// The defaults of a scale.
    pub fn for_scale(scale: Scale) -> Self {
        // After minutes cut off, the QUIC links redial with backoff capped at 30 s: the full
        // scale's convergence budget allows for one capped wait.
        let (baseline_s, partition_s, after_s, converge_ms) = match scale {
            Scale::Short => (10, 20, 15, 15_000),
            Scale::Full => (60, 300, 60, 45_000),
        };
        Self {
            scale,
            baseline_s,
            partition_s,
            after_s,
            rate: 20,
            per_region: 2,
            seed: 1,
            budget: Budget {
                stale_after_ms: 2_000,
                stale_within_ms: 10_000,
                converge_within_ms: converge_ms,
                error_rate_margin: 0.01,
                min_requests: 50,
            },
            break_stale_drop: false,
        }
    }
}

/// What the run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub drill: &'static str,
    pub params: Params,
    pub run_dir: PathBuf,
    pub netns: String,
    /// Phase boundaries, ms since traffic started.
    pub timeline: Timeline,
    pub before: PhaseFigures,
    pub during: PhaseFigures,
    pub after: PhaseFigures,
    /// Per surviving peer region: what it saw while `us` was cut off.
    pub peers: BTreeMap<String, PeerFigures>,
    /// `us`'s own endpoints before the cut and after the heal, as `us` serves them.
    pub cut_region_local_before: BTreeSet<String>,
    pub cut_region_local_after: BTreeSet<String>,
    /// `us`'s aggregate version for the service, before the cut and once it changed.
    pub cut_region_version_before: u64,
    pub cut_region_version_after: u64,
    /// The fewest endpoints Envoy held (its own region's and tier 2) while `us` was cut.
    pub envoy_min_endpoints: Option<usize>,
    pub envoy_endpoints_expected: usize,
    pub verdict: Verdict,
    pub plots: Plots,
}

/// Phase boundaries.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    pub before: Window,
    pub during: Window,
    pub after: Window,
}

/// What one surviving region saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PeerFigures {
    /// Samples of its view taken from the cut to the end.
    pub samples: usize,
    /// Samples whose own endpoints differed from before the cut.
    pub own_changed_samples: usize,
    /// The fewest of the cut region's endpoints it held at tier 2 while cut off.
    pub cut_region_min_endpoints: Option<usize>,
    /// From the cut until it reported the cut region stale.
    pub stale_after_ms: Option<u64>,
    /// From the heal until it held the cut region's new version and its reconciliation
    /// (`took_theirs`) was in its audit log.
    pub converged_after_ms: Option<u64>,
    /// The reconciliation record found.
    pub reconciliation: Option<Value>,
}

/// The verdict: traffic unharmed; every surviving region kept its own endpoints, kept the
/// cut region's at tier 2, reported it stale in time, and after the heal audited the
/// reconciliation and converged in time; the cut region's own endpoints unchanged; Envoy
/// kept every endpoint.
#[allow(clippy::too_many_arguments)]
pub fn verdict(
    before: &PhaseFigures,
    during: &PhaseFigures,
    after: &PhaseFigures,
    peers: &BTreeMap<String, PeerFigures>,
    cut_local: (&BTreeSet<String>, &BTreeSet<String>),
    envoy: (Option<usize>, usize),
    per_region: usize,
    budget: &Budget,
) -> Verdict {
    let mut failures = Vec::new();
    for (name, p) in [("before", before), ("during", during), ("after", after)] {
        if p.requests < budget.min_requests {
            failures.push(format!(
                "{name}: {} requests, fewer than {}",
                p.requests, budget.min_requests
            ));
        }
    }
    for (name, p) in [("during", during), ("after", after)] {
        if p.error_rate > before.error_rate + budget.error_rate_margin {
            failures.push(format!(
                "{name}: error rate {:.4} above the baseline {:.4} + {}",
                p.error_rate, before.error_rate, budget.error_rate_margin
            ));
        }
    }
    for (region, f) in peers {
        if f.samples < 4 {
            failures.push(format!("{region}: only {} view samples", f.samples));
        }
        if f.own_changed_samples > 0 {
            failures.push(format!(
                "{region}: its own endpoints changed in {} samples",
                f.own_changed_samples
            ));
        }
        if f.cut_region_min_endpoints != Some(per_region) {
            failures.push(format!(
                "{region}: held {:?} of {CUT}'s {per_region} endpoints at the fewest (tier 2 must be kept)",
                f.cut_region_min_endpoints
            ));
        }
        match f.stale_after_ms {
            None => failures.push(format!("{region}: never reported {CUT} stale")),
            Some(t) if t > budget.stale_within_ms => failures.push(format!(
                "{region}: reported {CUT} stale {t} ms after the cut, over {} ms",
                budget.stale_within_ms
            )),
            Some(_) => {}
        }
        match f.converged_after_ms {
            None => failures.push(format!(
                "{region}: no reconciliation of {CUT}'s change, or the aggregates did not converge"
            )),
            Some(t) if t > budget.converge_within_ms => failures.push(format!(
                "{region}: converged {t} ms after the heal, over {} ms",
                budget.converge_within_ms
            )),
            Some(_) => {}
        }
    }
    if cut_local.0 != cut_local.1 || cut_local.0.len() != per_region {
        failures.push(format!(
            "{CUT}'s own endpoints changed across the partition: {:?} → {:?}",
            cut_local.0, cut_local.1
        ));
    }
    if envoy.0 != Some(envoy.1) {
        failures.push(format!(
            "Envoy held {:?} endpoints at the fewest while {CUT} was cut off, not {}",
            envoy.0, envoy.1
        ));
    }
    Verdict {
        pass: failures.is_empty(),
        failures,
    }
}

/// `ip:port` of every endpoint of `region` in a `/v1/services/{s}/view` answer.
pub fn endpoints_of(views: &Value, region: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for v in views.as_array().into_iter().flatten() {
        for e in v["view"]["endpoints"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(_, e)| e)
        {
            if e["region"] == region {
                out.insert(format!(
                    "{}:{}",
                    e["address"]["ip"].as_str().unwrap_or("?"),
                    e["address"]["port"]
                ));
            }
        }
    }
    out
}

/// Per surviving peer: cut → stale, heal → converged (ms).
fn distributions(peers: &BTreeMap<String, PeerFigures>) -> Vec<Distribution> {
    let of = |name: &str, pick: fn(&PeerFigures) -> Option<u64>| Distribution {
        name: name.to_owned(),
        unit: "ms".to_owned(),
        values: peers.values().filter_map(pick).map(|v| v as f64).collect(),
    };
    vec![
        of("cut → peer reports it stale", |f| f.stale_after_ms),
        of("heal → peer reconciled and converged", |f| {
            f.converged_after_ms
        }),
    ]
}

/// One region of the run.
struct Region {
    name: &'static str,
    authority: RegionAuthority,
    fleet: Option<DemoFleet>,
}

/// The processes; dropped (killed) before the namespace.
struct Estate {
    regions: Vec<Region>,
    _agent: RegionAgent,
    envoy: EnvoyProc,
    waymark: PathBuf,
    /// The estate's trust bundle (the CLI checks each authority's API against it).
    bundle: PathBuf,
}

impl Estate {
    fn api(&self, region: &str) -> ApiClient {
        self.regions
            .iter()
            .find(|r| r.name == region)
            .expect("a region of the run")
            .authority
            .api()
    }
}

/// Runs the drill in `run_dir` (created if needed).
pub async fn run(params: Params, run_dir: &Path) -> anyhow::Result<Report> {
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let setup = Progress::new(DRILL, Instant::now());
    setup.say(&format!("run directory {}", run_dir.display()));
    // Declared first so it is dropped last: processes die before their namespace goes.
    let mut netns = Netns::create()?;
    setup.say(&format!(
        "namespace {}: {CUT} at {}, the others at {}",
        netns.name(),
        netns.ns_ip(),
        netns.host_ip()
    ));
    let mut estate = start_estate(&params, run_dir, &netns, &setup).await?;
    let result = drive(&params, &mut estate, &mut netns, run_dir).await;
    for r in &estate.regions {
        if let Some(f) = &r.fleet {
            f.shutdown().await;
        }
    }
    drop(estate);
    let report = result?;
    report::finish(run_dir, &report)?;
    Ok(report)
}

async fn start_estate(
    params: &Params,
    run_dir: &Path,
    netns: &Netns,
    setup: &Progress,
) -> anyhow::Result<Estate> {
    let waymark = waymark_bin()?;
    let envoy_path = envoy_bin()?;
    let host = IpAddr::V4(netns.host_ip());
    let pki = Pki::create(&run_dir.join("pki"), TRUST_DOMAIN, &REGIONS)?;
    let ip_of = |r: &str| {
        if r == CUT {
            IpAddr::V4(netns.ns_ip())
        } else {
            host
        }
    };
    let mut addrs = BTreeMap::new();
    for r in REGIONS {
        addrs.insert(r, AuthorityAddrs::pick(ip_of(r), host)?);
    }
    let mut regions = Vec::new();
    for r in REGIONS {
        let peers = REGIONS
            .iter()
            .filter(|p| **p != r)
            .map(|p| ((*p).to_owned(), "1".to_owned(), addrs[p].federation))
            .collect();
        let spec = AuthoritySpec {
            region: r.into(),
            zones: vec![ZONE.into()],
            tls: pki.issue(&format!("region/{r}/authority/1"))?,
            gossip_keys: None,
            federation: Some(FederationSpec {
                peers,
                stale_after: Duration::from_millis(params.budget.stale_after_ms),
                digest_interval: Duration::from_millis(200),
                drop_stale_peers: params.break_stale_drop && r != CUT,
            }),
        };
        let mut a = RegionAuthority::new(&waymark, &run_dir.join(r), &spec, addrs[r])?;
        if r == CUT {
            a = a.with_prefix(netns.exec_prefix());
        }
        a.start()?;
        regions.push(Region {
            name: r,
            authority: a,
            fleet: None,
        });
    }
    for r in &mut regions {
        r.authority.wait_ready(START_DEADLINE).await?;
        let spec = FleetSpec {
            contract: json!({}),
            bind: host,
        };
        let node = format!("{}-n1", r.name);
        r.fleet = Some(
            DemoFleet::start_with(
                r.authority.addrs().http,
                SERVICE,
                params.per_region,
                (r.name, ZONE, &node),
                MAX_LEASE,
                START_DEADLINE,
                spec,
            )
            .await?,
        );
    }
    setup.say("three regions up, each with its instances");

    let spec = AgentSpec {
        name: format!("{TRAFFIC}-edge"),
        region: TRAFFIC.into(),
        zone: ZONE.into(),
        ip: host,
        authority: addrs[TRAFFIC],
        tls: pki.issue(&format!("region/{TRAFFIC}/node/{TRAFFIC}-edge"))?,
        gossip_keys: None,
    };
    let mut agent = RegionAgent::new(&waymark, &run_dir.join("eu-agent"), &spec)?;
    agent.start()?;
    agent.wait_ready(START_DEADLINE).await?;

    // Converged: every region holds its own instances and both peers' at tier 2.
    let want = REGIONS.len() * params.per_region;
    for r in &regions {
        let api = r.authority.api();
        let path = format!("/v1/services/{SERVICE}/view");
        wait_until(
            &format!("{} holding every region's endpoints", r.name),
            START_DEADLINE,
            async || {
                let v = api.get_json(&path).await.ok()?;
                let n: usize = REGIONS.iter().map(|x| endpoints_of(&v, x).len()).sum();
                (n == want).then_some(())
            },
        )
        .await?;
    }
    let mut envoy = EnvoyProc::new(
        &envoy_path,
        &run_dir.join("envoy"),
        "sidecar-eu",
        TRAFFIC,
        ZONE,
        agent.xds_addr(),
        SERVICE,
    )?;
    envoy.start()?;
    envoy
        .wait_routing(START_DEADLINE)
        .await
        .with_context(|| format!("envoy log:\n{}\n{}", envoy.log_tail(30), agent.describe(30)))?;
    wait_until(
        "Envoy holds every region's endpoints",
        START_DEADLINE,
        async || (envoy.endpoints(SERVICE).await == Some(want)).then_some(()),
    )
    .await?;
    setup.say(&format!(
        "federation converged: every region holds {want} endpoints; Envoy in {TRAFFIC} routing"
    ));
    Ok(Estate {
        regions,
        _agent: agent,
        envoy,
        waymark,
        bundle: pki.bundle(),
    })
}

/// A region's federation status, and whether it reports `region` stale.
async fn reports_stale(api: &ApiClient, region: &str) -> Option<bool> {
    let st = api.get_json("/v1/federation/status").await.ok()?;
    st["regions"]
        .as_array()?
        .iter()
        .find(|p| p["region"] == region)
        .and_then(|p| p["stale"].as_bool())
}

/// The version of `region`'s aggregate for the service that `api`'s region holds (its
/// own: `local_versions`).
async fn held_version(api: &ApiClient, region: Option<&str>) -> Option<u64> {
    let st = api.get_json("/v1/federation/status").await.ok()?;
    match region {
        None => st["local_versions"][SERVICE].as_u64(),
        Some(r) => st["regions"]
            .as_array()?
            .iter()
            .find(|p| p["region"] == r)
            .and_then(|p| p["versions"][SERVICE].as_u64()),
    }
}

/// The reconciliation record in `api`'s audit log where `region`'s newer version won.
async fn reconciliation(api: &ApiClient, region: &str, theirs: u64) -> Option<Value> {
    let r = api
        .send(
            Method::GET,
            "/v1/audit?kind=reconciliation&actor=waymark:federation",
            None,
        )
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| {
            e["detail"]["entries"].as_array().is_some_and(|xs| {
                xs.iter().any(|x| {
                    x["region"] == region && x["outcome"] == "took_theirs" && x["theirs"] == theirs
                })
            })
        })
}

/// Puts one of `us`'s instances in maintenance from inside its namespace (the drill's
/// own process cannot reach it while cut off): an operator's change the peers cannot hear.
fn change_cut_region(estate: &Estate, netns: &Netns, id: &str) -> anyhow::Result<()> {
    let api = estate
        .regions
        .iter()
        .find(|r| r.name == CUT)
        .expect("the cut region")
        .authority
        .addrs()
        .http;
    let out = Command::new("ip")
        .args(["netns", "exec", netns.name()])
        .arg(&estate.waymark)
        .args([
            "override",
            id,
            "--justification",
            "region-partition drill: a change the peers cannot hear",
            "--api",
            &api.to_string(),
        ])
        .env("WAYMARK_TOKEN", crate::harness::management_token())
        .env("WAYMARK_CA_BUNDLE", &estate.bundle)
        .output()
        .context("running waymark override inside the namespace")?;
    anyhow::ensure!(
        out.status.success(),
        "waymark override failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

async fn drive(
    params: &Params,
    estate: &mut Estate,
    netns: &mut Netns,
    run_dir: &Path,
) -> anyhow::Result<Report> {
    let progress = Progress::new(DRILL, Instant::now());
    let epoch = progress.epoch();
    let at = |s: u64| epoch + Duration::from_secs(s);
    let now_ms = || ms(epoch.elapsed());
    let traffic_api: SocketAddr = estate
        .regions
        .iter()
        .find(|r| r.name == TRAFFIC)
        .expect("the traffic region")
        .authority
        .addrs()
        .http;
    let sampler = StateSampler::start(vec![traffic_api], vec![SERVICE.to_owned()], epoch);
    let listener = estate.envoy.listener_addr();
    let traffic = Generator::start(listener, params.rate, REQUEST_TIMEOUT, epoch);
    let tally = traffic.tally();
    let beat = if params.partition_s >= 600 { 60 } else { 10 };
    let _heartbeat = progress.heartbeat(Duration::from_secs(beat), move || tally.line());
    progress.event(&format!("traffic at {}/s through {listener}", params.rate));
    let view_path = format!("/v1/services/{SERVICE}/view");
    let peers: Vec<&str> = REGIONS.iter().copied().filter(|r| *r != CUT).collect();
    let mut own_before = BTreeMap::new();
    for p in &peers {
        let v = estate.api(p).get_json(&view_path).await?;
        own_before.insert(*p, endpoints_of(&v, p));
    }
    let cut_api = estate.api(CUT);
    let cut_local_before = endpoints_of(&cut_api.get_json(&view_path).await?, CUT);
    let cut_version_before = held_version(&cut_api, None).await.unwrap_or(0);
    let cut_ids: Vec<String> = estate
        .regions
        .iter()
        .find(|r| r.name == CUT)
        .and_then(|r| r.fleet.as_ref())
        .map(|f| f.ids().values().cloned().collect())
        .unwrap_or_default();

    tokio::time::sleep_until(at(params.baseline_s)).await;
    let cut_ms = now_ms();
    netns.partition()?;
    progress.event(&format!("{CUT} cut off from its peers ({})", netns.name()));
    let mut figures: BTreeMap<String, PeerFigures> = peers
        .iter()
        .map(|p| ((*p).to_owned(), PeerFigures::default()))
        .collect();
    let mut envoy_min: Option<usize> = None;
    let mut changed = false;
    let heal_at = at(params.baseline_s + params.partition_s);
    while Instant::now() < heal_at {
        for p in &peers {
            let api = estate.api(p);
            let f = figures.get_mut(*p).expect("a peer");
            if let Ok(v) = api.get_json(&view_path).await {
                f.samples += 1;
                f.own_changed_samples += usize::from(endpoints_of(&v, p) != own_before[p]);
                let n = endpoints_of(&v, CUT).len();
                f.cut_region_min_endpoints =
                    Some(f.cut_region_min_endpoints.map_or(n, |m| m.min(n)));
            }
            if f.stale_after_ms.is_none() && reports_stale(&api, CUT).await == Some(true) {
                f.stale_after_ms = Some(now_ms() - cut_ms);
                progress.event(&format!("{p} reports {CUT} stale"));
            }
        }
        if let Some(n) = estate.envoy.endpoints(SERVICE).await {
            envoy_min = Some(envoy_min.map_or(n, |m| m.min(n)));
        }
        if !changed && figures.values().all(|f| f.stale_after_ms.is_some()) {
            let id = cut_ids.first().context("no instance in the cut region")?;
            change_cut_region(estate, netns, id)?;
            changed = true;
            progress.event(&format!(
                "{id} put in maintenance inside {CUT} while cut off"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let heal_ms = now_ms();
    netns.heal()?;
    progress.event("partition healed");

    // Reconciliation and convergence: the peers take `us`'s newer version and audit it.
    let cut_version_after = wait_until(
        &format!("{CUT}'s own newer version"),
        Duration::from_secs(10),
        async || {
            held_version(&cut_api, None)
                .await
                .filter(|v| *v > cut_version_before)
        },
    )
    .await
    .unwrap_or(cut_version_before);
    let converge_deadline = Instant::now()
        + Duration::from_millis(params.budget.converge_within_ms)
        + Duration::from_secs(5);
    while Instant::now() < converge_deadline
        && figures.values().any(|f| f.converged_after_ms.is_none())
    {
        for p in &peers {
            let api = estate.api(p);
            let f = figures.get_mut(*p).expect("a peer");
            if f.converged_after_ms.is_some() {
                continue;
            }
            if held_version(&api, Some(CUT)).await == Some(cut_version_after)
                && cut_version_after > cut_version_before
                && let Some(rec) = reconciliation(&api, CUT, cut_version_after).await
            {
                f.converged_after_ms = Some(now_ms() - heal_ms);
                f.reconciliation = Some(rec);
                progress.event(&format!("{p} reconciled {CUT} and converged"));
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Own views keep being watched after the heal too.
    let mut after_samples = 0;
    let end_at = at(params.baseline_s + params.partition_s + params.after_s);
    while Instant::now() < end_at {
        for p in &peers {
            if let Ok(v) = estate.api(p).get_json(&view_path).await {
                let f = figures.get_mut(*p).expect("a peer");
                f.samples += 1;
                f.own_changed_samples += usize::from(endpoints_of(&v, p) != own_before[p]);
                after_samples += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let cut_local_after = endpoints_of(&cut_api.get_json(&view_path).await?, CUT);
    let end_ms = now_ms();
    let outcomes = traffic
        .stop(REQUEST_TIMEOUT + Duration::from_millis(500))
        .await;
    progress.event(&format!(
        "traffic stopped: {} requests ({after_samples} view samples after the heal)",
        outcomes.len()
    ));
    report::write_outcomes(run_dir, &outcomes)?;
    let states = sampler.stop();

    let timeline = Timeline {
        before: Window {
            start_ms: 0,
            end_ms: cut_ms,
        },
        during: Window {
            start_ms: cut_ms,
            end_ms: heal_ms,
        },
        after: Window {
            start_ms: heal_ms,
            end_ms,
        },
    };
    let before = figures::phase(&outcomes, timeline.before, &[]);
    let during = figures::phase(&outcomes, timeline.during, &[]);
    let after = figures::phase(&outcomes, timeline.after, &[]);
    let expected = REGIONS.len() * params.per_region;
    let distributions = distributions(&figures);
    let verdict = verdict(
        &before,
        &during,
        &after,
        &figures,
        (&cut_local_before, &cut_local_after),
        (envoy_min, expected),
        params.per_region,
        &params.budget,
    );
    Ok(Report {
        drill: DRILL,
        params: params.clone(),
        run_dir: run_dir.to_path_buf(),
        netns: netns.name().to_owned(),
        timeline,
        before,
        during,
        after,
        peers: figures,
        cut_region_local_before: cut_local_before,
        cut_region_local_after: cut_local_after,
        cut_region_version_before: cut_version_before,
        cut_region_version_after: cut_version_after,
        envoy_min_endpoints: envoy_min,
        envoy_endpoints_expected: expected,
        verdict,
        plots: Plots {
            states,
            errors: report::error_series(&outcomes),
            distributions,
            events: progress.events(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(requests: u64, errors: u64) -> PhaseFigures {
        PhaseFigures {
            requests,
            errors,
            error_rate: errors as f64 / requests as f64,
            ..PhaseFigures::default()
        }
    }

    fn good_peer() -> PeerFigures {
        PeerFigures {
            samples: 40,
            own_changed_samples: 0,
            cut_region_min_endpoints: Some(2),
            stale_after_ms: Some(2_600),
            converged_after_ms: Some(1_200),
            reconciliation: Some(json!({})),
        }
    }

    fn set(xs: &[&str]) -> BTreeSet<String> {
        xs.iter().map(|x| (*x).to_owned()).collect()
    }

    fn judge(peers: &BTreeMap<String, PeerFigures>, envoy_min: usize, errors: u64) -> Verdict {
        let local = set(&["10.0.0.1:1", "10.0.0.1:2"]);
        verdict(
            &phase(200, 0),
            &phase(400, errors),
            &phase(300, 0),
            peers,
            (&local, &local),
            (Some(envoy_min), 6),
            2,
            &Params::for_scale(Scale::Short).budget,
        )
    }

    #[test]
    fn kept_stale_reconciled_and_routing_unchanged_passes() {
        let peers = [
            ("ap".to_owned(), good_peer()),
            ("eu".to_owned(), good_peer()),
        ]
        .into();
        let v = judge(&peers, 6, 0);
        assert!(v.pass, "{v:?}");
    }

    #[test]
    fn a_peer_dropping_the_stale_region_fails() {
        // What --break-stale-drop produces: tier 2 emptied, Envoy loses those endpoints.
        let mut dropped = good_peer();
        dropped.cut_region_min_endpoints = Some(0);
        let peers = [("ap".to_owned(), good_peer()), ("eu".to_owned(), dropped)].into();
        let v = judge(&peers, 4, 0);
        assert!(!v.pass);
        assert_eq!(v.failures.len(), 2, "{v:?}");
        assert!(v.failures[0].contains("tier 2 must be kept"), "{v:?}");
    }

    #[test]
    fn own_routing_changing_no_reconciliation_or_errors_fail() {
        let mut p = good_peer();
        p.own_changed_samples = 3;
        p.converged_after_ms = None;
        p.stale_after_ms = Some(30_000);
        let peers = [("eu".to_owned(), p)].into();
        let v = judge(&peers, 6, 40);
        assert_eq!(v.failures.len(), 4, "{v:?}");
    }

    #[test]
    fn endpoints_are_read_per_region_from_a_view() {
        let views = json!([{"view": {"endpoints": {
            "a": {"region": "eu", "address": {"ip": "10.0.0.1", "port": 80}, "tier": "zone"},
            "b": {"region": "us", "address": {"ip": "10.0.0.2", "port": 81}, "tier": "remote"},
        }}}]);
        assert_eq!(endpoints_of(&views, "eu"), set(&["10.0.0.1:80"]));
        assert_eq!(endpoints_of(&views, "us"), set(&["10.0.0.2:81"]));
        assert!(endpoints_of(&views, "ap").is_empty());
    }
}
