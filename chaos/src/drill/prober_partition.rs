//! `prober-partition`: the probers of one zone are cut off from the authority (addresses
//! in a network namespace, nftables drops both ways), then every prober of the region.
//! Evidence about the targets stops; silence is `unknown`, never a failure (ADR-05), so the
//! instances must stay in rotation — Envoy keeps routing to them and the callers' error
//! rate does not move — and, once no prober can speak, be `unknown`. On heal they return
//! to eligible.
//!
//! ```text
//!  root namespace                                namespaces (the region's prober hosts)
//!  authority (TLS, ingest, gossip) ◄─── ✂ ───►  zb: agents zb-1, zb-2 (probers of zb)
//!  backends web-za-*, web-zb-*     ◄─── ✂ ───►  za: agents za-1, za-2 (probers of za)
//!  agent edge-1 (zone zb, not a prober) ──► Envoy (a caller in zb: zb at priority 0)
//! ```
//!
//! Phase 1 cuts namespace zb; phase 2 cuts namespace za too. The contract is probe-only, so the
//! probe class is the only one that can speak. Prober assignment is rendezvous per zone,
//! two per target, and a zone with no live prober borrows the region's: in phase 1 the
//! report shows whether zone zb's targets went silent or were taken over by zone za's
//! probers; in phase 2 nobody can probe, and every instance must be `unknown` and routed.
//! `--break-silence` sets the contract's `silence_withdraws` (silence read as failure):
//! the verdict must then fail.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::Scale;
use super::figures::{self, PhaseFigures, Verdict, Window};
use super::report::{self, Distribution, Plots, Progress, StateSample, StateSampler};
use crate::harness::backends::{DemoFleet, FleetSpec, MAX_LEASE};
use crate::harness::envoy::EnvoyProc;
use crate::harness::netns::Netns;
use crate::harness::region::{
    AgentSpec, AuthorityAddrs, AuthoritySpec, Pki, RegionAgent, RegionAuthority, gossip_key,
};
use crate::harness::{envoy_bin, wait_until, waymark_bin};
use crate::traffic::{Generator, ms};
use waymark_agent::api_client::ApiClient;

const DRILL: &str = "prober-partition";
const REGION: &str = "r1";
/// The zone that stays connected, and the zone whose probers are cut off.
const KEPT: &str = "za";
const CUT: &str = "zb";
const SERVICE: &str = "web";
const TRUST_DOMAIN: &str = "drill.waymark";
const START_DEADLINE: Duration = Duration::from_secs(60);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Verdicts that take an instance out of rotation.
const OUT: [&str; 4] = ["ineligible", "quarantined", "withdrawn", "draining"];

/// What the drill is run with.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub scale: Scale,
    /// Steady traffic before the cut (the baseline).
    pub baseline_s: u64,
    /// Phase 1: only the cut zone's probers are cut off.
    pub zone_cut_s: u64,
    /// Phase 2: every prober of the region is cut off.
    pub all_cut_s: u64,
    /// Steady traffic after the heal.
    pub after_s: u64,
    /// Requests per second through Envoy.
    pub rate: u32,
    /// Backends per zone.
    pub per_zone: usize,
    /// Node agents (probers) per zone: two, as the assignment gives each target two.
    pub agents_per_zone: usize,
    /// Seeds the gossip key; the drill makes no other random choice.
    pub seed: u64,
    pub budget: Budget,
    /// Break the property on purpose: the contract reads silence as failure
    /// (`silence_withdraws`), so silent instances are withdrawn, not unknown.
    pub break_silence: bool,
}

/// What the drill holds the run to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Budget {
    /// Once no prober can speak, every instance must be `unknown` within this (silence is
    /// three missed 1 s probes; the rest is gossip, publication and sampling).
    pub unknown_within_ms: u64,
    /// After the heal every instance must be `eligible` again within this.
    pub eligible_after_heal_ms: u64,
    /// How much the error rate may rise over the baseline (absolute).
    pub error_rate_margin: f64,
    /// Each phase needs this many requests for its rate to mean anything.
    pub min_requests: u64,
}

impl Params {
    /// The defaults of a scale.
    pub fn for_scale(scale: Scale) -> Self {
        // After minutes cut off, an agent's evidence session redials with backoff capped at
        // 30 s: the full scale's heal budget allows for one capped wait.
        let (baseline_s, zone_cut_s, all_cut_s, after_s, heal_ms) = match scale {
            Scale::Short => (10, 15, 15, 10, 30_000),
            Scale::Full => (60, 300, 300, 60, 45_000),
        };
        Self {
            scale,
            baseline_s,
            zone_cut_s,
            all_cut_s,
            after_s,
            rate: 20,
            per_zone: 2,
            agents_per_zone: 2,
            seed: 1,
            budget: Budget {
                unknown_within_ms: 10_000,
                eligible_after_heal_ms: heal_ms,
                error_rate_margin: 0.01,
                min_requests: 50,
            },
            break_silence: false,
        }
    }
}

/// What the run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub drill: &'static str,
    pub params: Params,
    pub run_dir: PathBuf,
    /// The namespace and addresses used.
    pub network: Network,
    /// Phase boundaries, ms since traffic started.
    pub timeline: Timeline,
    pub before: PhaseFigures,
    pub zone_cut: PhaseFigures,
    pub all_cut: PhaseFigures,
    pub after: PhaseFigures,
    /// Verdict counts in each phase.
    pub zone_cut_states: WindowStates,
    pub all_cut_states: WindowStates,
    /// Instances eligible in the last sample before the cut.
    pub eligible_before_cut: u64,
    /// From the heal until every instance was `eligible`.
    pub eligible_after_heal_ms: Option<u64>,
    /// The fewest endpoints Envoy held for the service while probers were cut off.
    pub envoy_min_endpoints: Option<usize>,
    pub envoy_endpoints_expected: usize,
    /// Requests answered by each cut-zone instance in each phase.
    pub cut_zone_answers: BTreeMap<String, (u64, u64)>,
    /// `waymark explain` of each cut-zone instance at the end of phase 1 (silent, or
    /// probed by the other zone?) and of phase 2.
    pub explain_zone_cut: BTreeMap<String, Value>,
    pub explain_all_cut: BTreeMap<String, Value>,
    pub verdict: Verdict,
    pub plots: Plots,
}

/// Where the partition ran.
#[derive(Debug, Clone, Serialize)]
pub struct Network {
    /// The cut zone's namespace, then the other zone's.
    pub netns: Vec<String>,
    pub host_ip: IpAddr,
    pub zb_ip: IpAddr,
    pub za_ip: IpAddr,
}

/// Phase boundaries.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    pub before: Window,
    pub zone_cut: Window,
    pub all_cut: Window,
    pub after: Window,
}

/// Verdict counts over one window of the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WindowStates {
    /// Samples taken in the window.
    pub samples: usize,
    /// The most instances `unknown` at once.
    pub max_unknown: u64,
    /// The most instances out of rotation (ineligible, quarantined, withdrawn, draining)
    /// at once.
    pub max_out_of_rotation: u64,
    /// From the window's start until `want` instances were `unknown` at once.
    pub unknown_after_ms: Option<u64>,
    /// From the window's start until nothing was `unknown` again after something had been
    /// (probers took the silent targets over).
    pub reprobed_after_ms: Option<u64>,
}

/// Counts over `w` from the authority's samples; `want` unknown instances are waited for.
pub fn window_states(samples: &[StateSample], w: Window, want: u64) -> WindowStates {
    let n = |s: &StateSample, k: &str| s.counts.get(k).copied().unwrap_or(0);
    let mut f = WindowStates::default();
    for s in samples
        .iter()
        .filter(|s| (w.start_ms..w.end_ms).contains(&s.t_ms))
    {
        let unknown = n(s, "unknown");
        f.samples += 1;
        f.max_out_of_rotation = f
            .max_out_of_rotation
            .max(OUT.iter().map(|k| n(s, k)).sum::<u64>());
        if f.unknown_after_ms.is_none() && unknown >= want {
            f.unknown_after_ms = Some(s.t_ms - w.start_ms);
        }
        if f.max_unknown > 0 && unknown == 0 && f.reprobed_after_ms.is_none() {
            f.reprobed_after_ms = Some(s.t_ms - w.start_ms);
        }
        f.max_unknown = f.max_unknown.max(unknown);
    }
    f
}

/// The eligible count of the last sample before `t_ms`.
pub fn eligible_before(samples: &[StateSample], t_ms: u64) -> u64 {
    samples
        .iter()
        .rfind(|s| s.t_ms < t_ms)
        .and_then(|s| s.counts.get("eligible").copied())
        .unwrap_or(0)
}

/// From `t_ms` until a sample shows all `total` instances eligible.
pub fn eligible_after(samples: &[StateSample], t_ms: u64, total: u64) -> Option<u64> {
    samples
        .iter()
        .find(|s| s.t_ms >= t_ms && s.counts.get("eligible").copied() == Some(total))
        .map(|s| s.t_ms - t_ms)
}

/// The recovery times plotted: every prober cut → all unknown; heal → all eligible.
fn distributions(all_cut: &WindowStates, healed_ms: Option<u64>) -> Vec<Distribution> {
    let one = |name: &str, v: Option<u64>| Distribution {
        name: name.to_owned(),
        unit: "ms".to_owned(),
        values: v.into_iter().map(|x| x as f64).collect(),
    };
    vec![
        one(
            "every prober cut off → all unknown",
            all_cut.unknown_after_ms,
        ),
        one("heal → all eligible", healed_ms),
    ]
}

/// Everything the verdict weighs.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    pub before: &'a PhaseFigures,
    pub zone_cut: &'a PhaseFigures,
    pub all_cut: &'a PhaseFigures,
    pub after: &'a PhaseFigures,
    pub zone_cut_states: &'a WindowStates,
    pub all_cut_states: &'a WindowStates,
    pub eligible_before_cut: u64,
    pub eligible_after_heal_ms: Option<u64>,
    pub total: u64,
    pub envoy_min: Option<usize>,
    /// Answers per cut-zone instance: (phase 1, phase 2).
    pub cut_answers: &'a BTreeMap<String, (u64, u64)>,
}

/// The verdict: nothing left rotation while probers were cut off, Envoy kept every
/// endpoint and kept sending the cut zone traffic, the error rate held, every instance was
/// `unknown` in time once no prober could speak, and the heal brought every instance back
/// to eligible in time.
pub fn verdict(o: &Observed<'_>, budget: &Budget) -> Verdict {
    let mut failures = Vec::new();
    let phases = [
        ("before", o.before),
        ("zone cut", o.zone_cut),
        ("all cut", o.all_cut),
        ("after", o.after),
    ];
    for (name, p) in phases {
        if p.requests < budget.min_requests {
            failures.push(format!(
                "{name}: {} requests, fewer than {}",
                p.requests, budget.min_requests
            ));
        }
    }
    for (name, p) in &phases[1..] {
        if p.error_rate > o.before.error_rate + budget.error_rate_margin {
            failures.push(format!(
                "{name}: error rate {:.4} above the baseline {:.4} + {}",
                p.error_rate, o.before.error_rate, budget.error_rate_margin
            ));
        }
    }
    if o.eligible_before_cut != o.total {
        failures.push(format!(
            "before the cut {} of {} instances were eligible",
            o.eligible_before_cut, o.total
        ));
    }
    for (name, w) in [
        ("zone cut", o.zone_cut_states),
        ("all cut", o.all_cut_states),
    ] {
        if w.max_out_of_rotation > 0 {
            failures.push(format!(
                "{name}: {} instance(s) taken out of rotation (silence must never remove)",
                w.max_out_of_rotation
            ));
        }
        if w.samples < 4 {
            failures.push(format!("{name}: only {} verdict samples", w.samples));
        }
    }
    match o.all_cut_states.unknown_after_ms {
        None => failures
            .push("with every prober cut off, the instances never all went unknown".to_owned()),
        Some(t) if t > budget.unknown_within_ms => failures.push(format!(
            "with every prober cut off, all unknown only after {t} ms, over {} ms",
            budget.unknown_within_ms
        )),
        Some(_) => {}
    }
    if o.envoy_min != Some(o.total as usize) {
        failures.push(format!(
            "Envoy held {:?} endpoints at the fewest while probers were cut off, not {}",
            o.envoy_min, o.total
        ));
    }
    if o.cut_answers.is_empty() || o.cut_answers.values().any(|(a, b)| *a == 0 || *b == 0) {
        failures.push(format!(
            "the cut zone's instances must keep answering traffic in both phases: {:?}",
            o.cut_answers
        ));
    }
    match o.eligible_after_heal_ms {
        None => failures.push("not every instance eligible after the heal".to_owned()),
        Some(t) if t > budget.eligible_after_heal_ms => failures.push(format!(
            "every instance eligible {t} ms after the heal, over {} ms",
            budget.eligible_after_heal_ms
        )),
        Some(_) => {}
    }
    Verdict {
        pass: failures.is_empty(),
        failures,
    }
}

/// The processes of the run; dropped (killed) when the run ends, before the namespace.
struct Region {
    authority: RegionAuthority,
    /// Kept so they live as long as the run: the probers, then the edge agent last.
    _probers: Vec<RegionAgent>,
    _edge: RegionAgent,
    envoy: EnvoyProc,
    fleets: Vec<DemoFleet>,
}

/// The probers' namespaces, one per zone.
struct Nets {
    zb: Netns,
    za: Netns,
}

/// Runs the drill in `run_dir` (created if needed).
pub async fn run(params: Params, run_dir: &Path) -> anyhow::Result<Report> {
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let setup = Progress::new(DRILL, Instant::now());
    setup.say(&format!("run directory {}", run_dir.display()));
    // Declared first so they are dropped last: processes die before their namespaces go.
    let mut nets = Nets {
        zb: Netns::create()?,
        za: Netns::create()?,
    };
    setup.say(&format!(
        "namespaces: zone {CUT}'s probers in {} at {}, zone {KEPT}'s in {} at {}; the root side at {}",
        nets.zb.name(),
        nets.zb.ns_ip(),
        nets.za.name(),
        nets.za.ns_ip(),
        nets.zb.host_ip(),
    ));
    let mut region = start_region(&params, run_dir, &nets, &setup).await?;
    let result = drive(&params, &mut region, &mut nets, run_dir).await;
    for f in &region.fleets {
        f.shutdown().await;
    }
    drop(region);
    let report = result?;
    report::finish(run_dir, &report)?;
    Ok(report)
}

/// The contract: probe-only (so probe silence is total silence), no slow start.
fn contract(break_silence: bool) -> Value {
    json!({
        "profile": {"probe": true, "self_report": false, "passive": false},
        "probe": {"kind": "http", "path": "/healthz", "interval": "1s", "timeout": "500ms"},
        "slow_start": "0s",
        "silence_withdraws": break_silence,
    })
}

async fn start_region(
    params: &Params,
    run_dir: &Path,
    nets: &Nets,
    setup: &Progress,
) -> anyhow::Result<Region> {
    let waymark = waymark_bin()?;
    let envoy_path = envoy_bin()?;
    let host = IpAddr::V4(nets.zb.host_ip());
    let pki = Pki::create(&run_dir.join("pki"), TRUST_DOMAIN, &[REGION])?;
    let keys = vec![gossip_key(params.seed)];
    let addrs = AuthorityAddrs::pick(host, host)?;
    let spec = AuthoritySpec {
        region: REGION.into(),
        zones: vec![KEPT.into(), CUT.into()],
        tls: pki.issue(&format!("region/{REGION}/authority/1"))?,
        gossip_keys: Some(keys.clone()),
        federation: None,
    };
    let mut authority = RegionAuthority::new(&waymark, &run_dir.join("authority"), &spec, addrs)?;
    authority.start()?;
    authority.wait_ready(START_DEADLINE).await?;
    setup.say(&format!("authority ready on {}", addrs.http));

    let mut fleets = Vec::new();
    for zone in [KEPT, CUT] {
        let node = format!("{zone}-1");
        let fleet_spec = FleetSpec {
            contract: contract(params.break_silence),
            bind: host,
        };
        fleets.push(
            DemoFleet::start_with(
                addrs.http,
                SERVICE,
                params.per_zone,
                (REGION, zone, &node),
                MAX_LEASE,
                START_DEADLINE,
                fleet_spec,
            )
            .await?,
        );
    }
    setup.say(&format!("{} backends per zone registered", params.per_zone));

    let agent = |name: &str, zone: &str, ip: IpAddr, gossip: bool| -> anyhow::Result<RegionAgent> {
        let spec = AgentSpec {
            name: name.to_owned(),
            region: REGION.into(),
            zone: zone.into(),
            ip,
            authority: addrs,
            tls: pki.issue(&format!("region/{REGION}/node/{name}"))?,
            gossip_keys: gossip.then(|| keys.clone()),
        };
        RegionAgent::new(&waymark, &run_dir.join(name), &spec)
    };
    let mut probers = Vec::new();
    for (zone, ns) in [(KEPT, &nets.za), (CUT, &nets.zb)] {
        for i in 1..=params.agents_per_zone {
            let mut a = agent(&format!("{zone}-{i}"), zone, IpAddr::V4(ns.ns_ip()), true)?
                .with_prefix(ns.exec_prefix());
            a.start()?;
            probers.push(a);
        }
    }
    // Envoy's own agent: in the root namespace, never cut off, and not a prober (it does
    // not gossip, and the authority assigns targets only to agents gossip holds alive).
    let mut edge = agent("edge-1", CUT, host, false)?;
    edge.start()?;
    for a in probers.iter_mut().chain(std::iter::once(&mut edge)) {
        a.wait_ready(START_DEADLINE).await?;
    }
    setup.say(&format!(
        "{} probers and the edge agent ready",
        probers.len()
    ));

    // A caller in the cut zone: its view ranks the cut zone's instances first (priority
    // 0), so they carry the traffic.
    let mut envoy = EnvoyProc::new(
        &envoy_path,
        &run_dir.join("envoy"),
        "sidecar-1",
        REGION,
        CUT,
        edge.xds_addr(),
        SERVICE,
    )?;
    envoy.start()?;
    envoy
        .wait_routing(START_DEADLINE)
        .await
        .with_context(|| format!("envoy log:\n{}\n{}", envoy.log_tail(30), edge.describe(30)))?;
    let total = 2 * params.per_zone;
    wait_until("Envoy holds every backend", START_DEADLINE, async || {
        (envoy.endpoints(SERVICE).await == Some(total)).then_some(())
    })
    .await?;
    let api = authority.api();
    wait_until(
        "every instance eligible from probes",
        START_DEADLINE,
        async || (eligible(&api).await == Some(total as u64)).then_some(()),
    )
    .await?;
    setup.say(&format!(
        "Envoy routing to {total} backends, all eligible from probes"
    ));
    Ok(Region {
        authority,
        _probers: probers,
        _edge: edge,
        envoy,
        fleets,
    })
}

/// The service's eligible count, from the authority.
async fn eligible(api: &ApiClient) -> Option<u64> {
    let v = api.get_json("/v1/services").await.ok()?;
    report::counts_from_services(&v, &[SERVICE.to_owned()])
        .get("eligible")
        .copied()
}

/// Explanations of `ids` (instance name → id) from the authority.
async fn explain_all(api: &ApiClient, ids: &BTreeMap<String, String>) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (name, id) in ids {
        if let Ok(v) = api.get_json(&format!("/v1/instances/{id}/explain")).await {
            out.insert(name.clone(), brief_explain(&v));
        }
    }
    out
}

/// The parts of an explanation the report keeps: verdict, rule, and each provided class's
/// reporter, silence and age.
fn brief_explain(v: &Value) -> Value {
    let classes: Vec<Value> = v["classes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["provided"] == true)
        .map(|c| {
            json!({"class": c["class"], "silent": c["silent"], "age_ms": c["age_ms"], "reporter": c["reporter"]})
        })
        .collect();
    json!({"verdict": v["verdict"], "rule": v["rule"], "classes": classes})
}

/// Until `until`: the fewest endpoints Envoy holds, folded into `min`.
async fn watch_envoy(envoy: &EnvoyProc, until: Instant, min: &mut Option<usize>) {
    while Instant::now() < until {
        if let Some(n) = envoy.endpoints(SERVICE).await {
            *min = Some(min.map_or(n, |m| m.min(n)));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn drive(
    params: &Params,
    region: &mut Region,
    nets: &mut Nets,
    run_dir: &Path,
) -> anyhow::Result<Report> {
    let progress = Progress::new(DRILL, Instant::now());
    let epoch = progress.epoch();
    let total = (2 * params.per_zone) as u64;
    let api = region.authority.api();
    let sampler = StateSampler::start(
        vec![region.authority.addrs().http],
        vec![SERVICE.to_owned()],
        epoch,
    );
    let listener = region.envoy.listener_addr();
    let traffic = Generator::start(listener, params.rate, REQUEST_TIMEOUT, epoch);
    let tally = traffic.tally();
    let beat = if params.zone_cut_s + params.all_cut_s >= 600 {
        60
    } else {
        10
    };
    let _heartbeat = progress.heartbeat(Duration::from_secs(beat), move || tally.line());
    progress.event(&format!("traffic at {}/s through {listener}", params.rate));
    let cut_ids: BTreeMap<String, String> = region.fleets[1].ids().clone();
    let at = |s: u64| epoch + Duration::from_secs(s);
    let now_ms = || ms(epoch.elapsed());
    let mut envoy_min = None;

    tokio::time::sleep_until(at(params.baseline_s)).await;
    let zone_cut_ms = now_ms();
    nets.zb.partition()?;
    progress.event(&format!(
        "zone {CUT}'s probers ({}) cut off",
        nets.zb.name()
    ));
    let t = params.baseline_s + params.zone_cut_s;
    watch_envoy(&region.envoy, at(t), &mut envoy_min).await;
    let explain_zone_cut = explain_all(&api, &cut_ids).await;

    let all_cut_ms = now_ms();
    nets.za.partition()?;
    progress.event(&format!(
        "zone {KEPT}'s probers ({}) cut off too: no prober can speak",
        nets.za.name()
    ));
    let t = t + params.all_cut_s;
    watch_envoy(&region.envoy, at(t), &mut envoy_min).await;
    let explain_all_cut = explain_all(&api, &cut_ids).await;
    let heal_ms = now_ms();
    nets.zb.heal()?;
    nets.za.heal()?;
    progress.event("partition healed");

    let healed = wait_until(
        "every instance eligible after the heal",
        Duration::from_millis(params.budget.eligible_after_heal_ms) + Duration::from_secs(10),
        async || (eligible(&api).await == Some(total)).then_some(()),
    )
    .await;
    match &healed {
        Ok(()) => progress.event("every instance eligible again"),
        Err(e) => progress.event(&format!("{e:#}")),
    }
    tokio::time::sleep_until(at(t + params.after_s)).await;
    // A late heal still leaves the after phase its full length of traffic.
    let after_start = heal_ms.max(now_ms().saturating_sub(params.after_s * 1000));
    let end_ms = now_ms();
    let outcomes = traffic
        .stop(REQUEST_TIMEOUT + Duration::from_millis(500))
        .await;
    progress.event(&format!("traffic stopped: {} requests", outcomes.len()));
    report::write_outcomes(run_dir, &outcomes)?;
    let samples = sampler.stop();

    let timeline = Timeline {
        before: Window {
            start_ms: 0,
            end_ms: zone_cut_ms,
        },
        zone_cut: Window {
            start_ms: zone_cut_ms,
            end_ms: all_cut_ms,
        },
        all_cut: Window {
            start_ms: all_cut_ms,
            end_ms: heal_ms,
        },
        after: Window {
            start_ms: after_start,
            end_ms,
        },
    };
    let phase = |w| figures::phase(&outcomes, w, &[]);
    let (before, zone_cut, all_cut, after) = (
        phase(timeline.before),
        phase(timeline.zone_cut),
        phase(timeline.all_cut),
        phase(timeline.after),
    );
    let cut = cut_ids.len() as u64;
    let zone_cut_states = window_states(&samples, timeline.zone_cut, cut);
    let all_cut_states = window_states(&samples, timeline.all_cut, total);
    let answered = |p: &PhaseFigures, n: &str| p.answered_by.get(n).copied().unwrap_or(0);
    let cut_answers: BTreeMap<String, (u64, u64)> = cut_ids
        .keys()
        .map(|n| (n.clone(), (answered(&zone_cut, n), answered(&all_cut, n))))
        .collect();
    let eligible_before_cut = eligible_before(&samples, zone_cut_ms);
    let eligible_after_heal_ms = eligible_after(&samples, heal_ms, total);
    let distributions = distributions(&all_cut_states, eligible_after_heal_ms);
    let verdict = verdict(
        &Observed {
            before: &before,
            zone_cut: &zone_cut,
            all_cut: &all_cut,
            after: &after,
            zone_cut_states: &zone_cut_states,
            all_cut_states: &all_cut_states,
            eligible_before_cut,
            eligible_after_heal_ms,
            total,
            envoy_min,
            cut_answers: &cut_answers,
        },
        &params.budget,
    );
    Ok(Report {
        drill: DRILL,
        params: params.clone(),
        run_dir: run_dir.to_path_buf(),
        network: Network {
            netns: vec![nets.zb.name().to_owned(), nets.za.name().to_owned()],
            host_ip: IpAddr::V4(nets.zb.host_ip()),
            zb_ip: IpAddr::V4(nets.zb.ns_ip()),
            za_ip: IpAddr::V4(nets.za.ns_ip()),
        },
        timeline,
        before,
        zone_cut,
        all_cut,
        after,
        zone_cut_states,
        all_cut_states,
        eligible_before_cut,
        eligible_after_heal_ms,
        envoy_min_endpoints: envoy_min,
        envoy_endpoints_expected: total as usize,
        cut_zone_answers: cut_answers,
        explain_zone_cut,
        explain_all_cut,
        verdict,
        plots: Plots {
            states: samples,
            errors: report::error_series(&outcomes),
            distributions,
            events: progress.events(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t_ms: u64, counts: &[(&str, u64)]) -> StateSample {
        StateSample {
            t_ms,
            counts: counts.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        }
    }

    fn phase(requests: u64, errors: u64, zb: u64) -> PhaseFigures {
        let mut p = PhaseFigures {
            requests,
            errors,
            error_rate: errors as f64 / requests as f64,
            ..PhaseFigures::default()
        };
        p.answered_by.insert("web-zb-1".into(), zb);
        p
    }

    fn w(start_ms: u64, end_ms: u64) -> Window {
        Window { start_ms, end_ms }
    }

    /// Eligible; zone cut at 10 s (silent, then taken over); all cut at 25 s; healed at 40 s.
    fn good_run() -> Vec<StateSample> {
        vec![
            s(9_500, &[("eligible", 4)]),
            s(13_500, &[("eligible", 2), ("unknown", 2)]),
            s(18_000, &[("eligible", 4)]),
            s(21_000, &[("eligible", 4)]),
            s(24_000, &[("eligible", 4)]),
            s(26_000, &[("eligible", 4)]),
            s(29_000, &[("eligible", 2), ("unknown", 2)]),
            s(30_000, &[("unknown", 4)]),
            s(35_000, &[("unknown", 4)]),
            s(41_000, &[("eligible", 4)]),
        ]
    }

    #[test]
    fn window_figures_time_silence_takeover_and_heal() {
        let z = window_states(&good_run(), w(10_000, 25_000), 2);
        assert_eq!(z.unknown_after_ms, Some(3_500));
        assert_eq!(z.reprobed_after_ms, Some(8_000));
        assert_eq!((z.samples, z.max_unknown, z.max_out_of_rotation), (4, 2, 0));
        let a = window_states(&good_run(), w(25_000, 40_000), 4);
        assert_eq!(a.unknown_after_ms, Some(5_000));
        assert_eq!(a.reprobed_after_ms, None);
        assert_eq!(eligible_before(&good_run(), 10_000), 4);
        assert_eq!(eligible_after(&good_run(), 40_000, 4), Some(1_000));
        assert_eq!(eligible_after(&good_run()[..9], 40_000, 4), None);
    }

    fn judge(samples: &[StateSample], errors: u64, envoy_min: usize, zb: u64) -> Verdict {
        let (z, a) = (
            window_states(samples, w(10_000, 25_000), 2),
            window_states(samples, w(25_000, 40_000), 4),
        );
        let answers: BTreeMap<String, (u64, u64)> = [("web-zb-1".to_owned(), (zb, zb))].into();
        let quiet = phase(200, 0, 50);
        let hit = phase(300, errors, zb);
        verdict(
            &Observed {
                before: &quiet,
                zone_cut: &hit,
                all_cut: &hit,
                after: &quiet,
                zone_cut_states: &z,
                all_cut_states: &a,
                eligible_before_cut: eligible_before(samples, 10_000),
                eligible_after_heal_ms: eligible_after(samples, 40_000, 4),
                total: 4,
                envoy_min: Some(envoy_min),
                cut_answers: &answers,
            },
            &Params::for_scale(Scale::Short).budget,
        )
    }

    #[test]
    fn silence_that_stays_unknown_and_routed_passes() {
        let v = judge(&good_run(), 1, 4, 80);
        assert!(v.pass, "{v:?}");
    }

    #[test]
    fn silence_read_as_failure_fails_even_with_traffic_unharmed() {
        // What --break-silence produces: the fraction guard keeps the zone routed (traffic
        // fine), but the verdicts say the instances were withdrawn.
        let mut run = good_run();
        for x in &mut run[6..9] {
            *x = s(x.t_ms, &[("ineligible", 4)]);
        }
        let v = judge(&run, 0, 4, 80);
        assert!(!v.pass);
        assert!(
            v.failures
                .iter()
                .any(|f| f.contains("never all went unknown")),
            "{v:?}"
        );
        assert!(
            v.failures.iter().any(|f| f.contains("out of rotation")),
            "{v:?}"
        );
    }

    #[test]
    fn envoy_dropping_endpoints_errors_rising_or_a_silent_zone_fail() {
        let v = judge(&good_run(), 30, 2, 0);
        assert!(!v.pass);
        assert_eq!(v.failures.len(), 4, "{v:?}");
    }

    #[test]
    fn slow_silence_or_no_heal_fail() {
        let mut run = good_run();
        run.truncate(7);
        run.push(s(39_000, &[("unknown", 4)]));
        let v = judge(&run, 0, 4, 80);
        assert!(
            v.failures.iter().any(|f| f.contains("over 10000 ms")),
            "{v:?}"
        );
        assert!(
            v.failures.iter().any(|f| f.contains("after the heal")),
            "{v:?}"
        );
    }
}
