//! `hard-vs-grey`: under steady traffic through several real Envoys (each with its own node
//! agent), one replica fails hard (its listener closes: connections refused) and another
//! turns slow but alive (its `/healthz` stays green; its traffic is slow and half 503).
//! For each, the drill measures the time until the callers stop using it — every Envoy's
//! `/clusters` and a number of synthetic Delta xDS subscriptions to the agents — and
//! reports the per-caller times as distributions with their p99.
//!
//! The service declares callers' outcomes primary above a traffic threshold (ADR-04,
//! `passive.primary`: three callers, 15 requests a second between them). The hard failure
//! must leave within the hard-failure budget; the grey one must be *withdrawn* from 99 % of
//! the callers' views within one load-report interval plus the damping budget plus the
//! withdrawal budget, by the callers' population (explain's rule `caller_population`),
//! while its probe stays green throughout. The run reports probe traffic as a share of
//! all requests: passive-primary instances are probed at the confirmation cadence.
//!
//! `--low-traffic` runs the same faults with too little traffic for callers' outcomes to
//! say anything: the grey replica must then stay routed on its green probe and be reported
//! `single_class` — the cost ADR-04 names, shown rather than hidden. Breaking the passive
//! path (`--break-load-reports`: Envoys without load reporting) must fail the verdict.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;
use waymark_agent::dev::backends::{BackendOptions, Mode};
use waymark_core::defaults as d;

use super::Scale;
use super::figures::{self, PhaseFigures, Verdict, Window};
use super::report::{self, Distribution, Plots, Progress, StateSampler, quantile};
use crate::harness::callers::{Stop, ViewLog, Watchers, stop_time};
use crate::harness::envoy::EnvoyProc;
use crate::harness::evidence::{
    EvidenceAgent, ProbedFleet, Rig, RigSpec, get_json, probed_contract,
};
use crate::harness::{envoy_bin, wait_until, waymark_bin};
use crate::rng::SplitMix64;
use crate::traffic::{Generator, Outcome, ms};

const REGION: &str = "r1";
const ZONE: &str = "z1";
const SERVICE: &str = "web";
/// How long any process may take to become ready (CI compiles on the same cores).
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How long the synthetic callers may take to all hold a view: an agent admits new
/// streams at a capped rate (reconnection admission), so many subscribers take a while.
const SUBSCRIBE_DEADLINE: Duration = Duration::from_secs(180);
/// A request with no answer within this is a failure.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How often each Envoy's `/clusters` is read.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// How long a slow replica takes per request (below Envoy's route timeout, so its
/// successes stay successes and its failures are its own 503s).
const SLOW_DELAY: Duration = Duration::from_millis(300);

/// The budgets the figures are held to.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Budget {
    /// p99 over callers from the kill until the hard failure is out of their view
    /// ([`d::HARD_FAILURE_BUDGET_P99`]).
    pub hard_p99_ms: u64,
    /// p99 over callers from the slowdown until their view routes the grey replica less
    /// (lower weight or removed): one load-report interval for the first evidence to
    /// exist, the damping budget for the score to cross, the withdrawal budget to reach
    /// the callers ([`d::PASSIVE_INTERVAL`] + [`d::DAMPING_BUDGET`] +
    /// [`d::WITHDRAWAL_BUDGET_P99`]).
    pub grey_p99_ms: u64,
    /// A probe score at or above this is not "green" ([`d::CORROBORATE_PERMILLE`]: it
    /// would corroborate).
    pub probe_green_below: u16,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            hard_p99_ms: ms(d::HARD_FAILURE_BUDGET_P99),
            grey_p99_ms: ms(d::PASSIVE_INTERVAL + d::DAMPING_BUDGET + d::WITHDRAWAL_BUDGET_P99),
            probe_green_below: d::CORROBORATE_PERMILLE.get(),
        }
    }
}

/// What the drill is run with.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub scale: Scale,
    /// Node agents, each with one real Envoy carrying traffic.
    pub envoys: usize,
    /// Synthetic Delta xDS subscriptions per agent (callers that hold a view, no traffic).
    pub subscribers_per_agent: usize,
    /// Backends of the service, all in one zone.
    pub backends: usize,
    /// Requests per second through each Envoy.
    pub rate: u32,
    /// Steady traffic before the faults.
    pub baseline_s: u64,
    /// How long after the faults the callers are watched at most.
    pub observe_s: u64,
    /// Chooses which backends fail.
    pub seed: u64,
    pub budget: Budget,
    /// Break the property on purpose: Envoy bootstraps without load reporting, so no
    /// passive evidence reaches the evaluator (the grey replica must then go uncaught).
    pub break_load_reports: bool,
    /// Too little traffic for callers' outcomes to count ([`LOW_TRAFFIC_RATE`] per Envoy):
    /// the grey replica must stay probe-primary, routed, and reported single-class.
    pub low_traffic: bool,
}

/// How long after traffic starts the evidence modes are given to settle before the
/// steady probe share is measured (a few load reports, then the new assignment).
const SETTLE: Duration = Duration::from_secs(10);

/// Requests per second through each Envoy in the `--low-traffic` variant: spread over the
/// backends, each caller's load report about a replica holds fewer than
/// `passive.min_requests`, so it says nothing either way.
pub const LOW_TRAFFIC_RATE: u32 = 4;

/// The service's contract: probed over HTTP every second, callers' outcomes primary from
/// three callers and 15 requests a second between them (the drill's traffic is well
/// above that; the `--low-traffic` variant well below).
pub fn contract() -> Value {
    let mut c = probed_contract();
    c["passive"] = serde_json::json!({
        "interval": "1s",
        "min_requests": d::PASSIVE_MIN_REQUESTS,
        "error_rate": d::PASSIVE_ERROR_PERMILLE.get(),
        "primary": {"min_callers": 3, "min_requests": 15, "confirm_interval": "30s"},
    });
    c
}

impl Params {
    /// The defaults of a scale.
    pub fn for_scale(scale: Scale) -> Self {
        let (envoys, subscribers_per_agent, backends, observe_s, baseline_s) = match scale {
            // Short: 18 s after the faults is the grey budget (11 s) and then some; a caller
            // still routing either replica by then fails the verdict whatever follows.
            // (9 subscribers and an Envoy per agent: its admission floor, as in
            // bad-health-check.)
            Scale::Short => (3, 9, 4, 18, 8),
            // Long enough a baseline to see probes at the confirmation cadence in steady
            // state (`probe_traffic_steady`).
            Scale::Full => (5, 50, 6, 60, 45),
        };
        Self {
            scale,
            envoys,
            subscribers_per_agent,
            backends,
            rate: 40,
            baseline_s,
            observe_s,
            seed: 1,
            budget: Budget::default(),
            break_load_reports: false,
            low_traffic: false,
        }
    }
}

/// Per-caller stop times for one replica.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CallerFigures {
    /// Callers that held the replica at the fault.
    pub callers: usize,
    /// Of those, how many stopped using it within the observation.
    pub stopped: usize,
    pub p50_ms: Option<u64>,
    pub p99_ms: Option<u64>,
    pub max_ms: Option<u64>,
    /// Each caller's time (ms after the fault), `None` if it never stopped.
    pub per_caller: Vec<(String, Option<u64>)>,
}

/// Per-caller times → figures. Quantiles are over every caller: one that never stopped
/// counts as slower than any that did (so p99 is `None` unless at least 99% stopped).
pub fn caller_figures(per_caller: Vec<(String, Option<u64>)>) -> CallerFigures {
    let times: Vec<f64> = per_caller
        .iter()
        .map(|(_, t)| t.map_or(f64::INFINITY, |t| t as f64))
        .collect();
    let q = |p: f64| {
        quantile(&times, p)
            .filter(|v| v.is_finite())
            .map(|v| v as u64)
    };
    CallerFigures {
        callers: per_caller.len(),
        stopped: per_caller.iter().filter(|(_, t)| t.is_some()).count(),
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        max_ms: q(1.0),
        per_caller,
    }
}

/// A rule as `explain` gives it (`{"rule": "corroborated", "failing": "probe", "by":
/// "passive"}`), for a report line: `corroborated failing=probe by=passive`.
fn rule_text(rule: &Value) -> String {
    let Some(fields) = rule.as_object() else {
        return "?".to_owned();
    };
    let name = fields.get("rule").and_then(Value::as_str).unwrap_or("?");
    let mut text = name.to_owned();
    for (k, v) in fields.iter().filter(|(k, _)| *k != "rule") {
        let v = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => "?".to_owned(),
        };
        text.push_str(&format!(" {k}={v}"));
    }
    text
}

/// What the authority said about the grey replica, read from its explain answers after
/// the slowdown.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GreyEvidence {
    /// ms after the slowdown when the authority's verdict first left `eligible`.
    pub caught_ms: Option<u64>,
    /// ms after the slowdown when it was first withdrawn (`ineligible`); the fields below
    /// are frozen at that answer (the latest answer read, if never withdrawn).
    pub withdrawn_ms: Option<u64>,
    /// The verdict and the rule.
    pub verdict: Option<String>,
    pub rule: Option<String>,
    /// Whether the rule rests on callers' outcomes: withdrawn by the callers' population
    /// (`caller_population`), or passive evidence the failing class.
    pub passive_named: bool,
    /// Whether the rule is the callers' population (ADR-04's passive-primary withdrawal).
    pub population: bool,
    /// What the verdict rested on (`passive_primary`, `probe_primary`, `single_class`).
    pub mode: Option<String>,
    /// The probe and passive scores (permille).
    pub probe_score: Option<u16>,
    pub passive_score: Option<u16>,
    /// The highest probe score seen in any answer: below the green line throughout, or not.
    pub probe_max: Option<u16>,
    /// The explain answer's text.
    pub text: Option<String>,
}

impl GreyEvidence {
    /// Reads one explain answer taken `at_ms` after the slowdown.
    pub fn observe(&mut self, at_ms: u64, explain: &Value) {
        if self.withdrawn_ms.is_some() {
            return;
        }
        let verdict = explain["verdict"].as_str().unwrap_or_default();
        if verdict.is_empty() {
            return;
        }
        let rule = &explain["rule"];
        let score = |class: &str| {
            explain["classes"].as_array().and_then(|cs| {
                cs.iter()
                    .find(|c| c["class"].as_str() == Some(class))
                    .and_then(|c| c["score"].as_u64())
                    .and_then(|s| u16::try_from(s).ok())
            })
        };
        if verdict != "eligible" && self.caught_ms.is_none() {
            self.caught_ms = Some(at_ms);
        }
        if verdict == "ineligible" {
            self.withdrawn_ms = Some(at_ms);
        }
        self.verdict = Some(verdict.to_owned());
        self.population = rule["rule"] == "caller_population";
        self.passive_named = self.population || rule["failing"] == "passive";
        self.rule = Some(rule_text(rule));
        self.mode = explain["evidence"].as_str().map(str::to_owned);
        self.probe_score = score("probe");
        self.passive_score = score("passive");
        self.probe_max = self.probe_max.max(self.probe_score);
        self.text = explain["text"].as_str().map(str::to_owned);
    }
}

/// Probe requests as a share of all requests the replicas served in the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ProbeShare {
    /// Probes the node agents completed from the start of traffic to its end.
    pub probes: u64,
    /// Requests the callers sent through their Envoys meanwhile.
    pub requests: u64,
    /// `probes / (probes + requests)`.
    pub share: f64,
}

impl ProbeShare {
    pub fn new(probes: u64, requests: u64) -> Self {
        let total = probes + requests;
        Self {
            probes,
            requests,
            share: if total == 0 {
                0.0
            } else {
                probes as f64 / total as f64
            },
        }
    }
}

/// The verdict. With traffic: the hard failure within its budget for 99 % of callers, the
/// grey one withdrawn from 99 % of them within its budget by the callers' population,
/// its probe green throughout. With `low_traffic`: the hard failure as before, and the
/// grey one still routed on its green probe, reported single-class.
pub fn hard_vs_grey_verdict(
    hard: &CallerFigures,
    grey_removed: &CallerFigures,
    evidence: &GreyEvidence,
    budget: &Budget,
    low_traffic: bool,
) -> Verdict {
    let mut failures = Vec::new();
    let mut held = vec![("hard", hard, budget.hard_p99_ms)];
    if !low_traffic {
        held.push(("grey", grey_removed, budget.grey_p99_ms));
    }
    for (what, f, limit) in held {
        if f.callers == 0 {
            failures.push(format!("{what}: no caller held the replica at the fault"));
            continue;
        }
        match f.p99_ms {
            None => failures.push(format!(
                "{what}: only {} of {} callers stopped using it (99% needed)",
                f.stopped, f.callers
            )),
            Some(p99) if p99 > limit => failures.push(format!(
                "{what}: p99 over callers {p99} ms, budget {limit} ms"
            )),
            Some(_) => {}
        }
    }
    if evidence
        .probe_max
        .is_none_or(|s| s >= budget.probe_green_below)
    {
        failures.push(format!(
            "grey: its probe was not green throughout (highest score {:?})",
            evidence.probe_max
        ));
    }
    if low_traffic {
        if evidence.withdrawn_ms.is_some() {
            failures.push(format!(
                "grey: withdrawn with too little traffic to judge (rule {:?})",
                evidence.rule
            ));
        }
        if evidence.mode.as_deref() != Some("single_class") {
            failures.push(format!(
                "grey: reported {:?}, not single_class, with too little traffic",
                evidence.mode
            ));
        }
    } else if evidence.withdrawn_ms.is_none() {
        failures.push(format!(
            "grey: the authority never withdrew it (last verdict {:?}, rule {:?})",
            evidence.verdict, evidence.rule
        ));
    } else if !evidence.population {
        failures.push(format!(
            "grey: withdrawn, but not by the callers' population (rule {:?})",
            evidence.rule
        ));
    }
    Verdict {
        pass: failures.is_empty(),
        failures,
    }
}

/// Everything the run found; the last stdout line and `<run dir>/report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub drill: &'static str,
    pub params: Params,
    pub run_dir: PathBuf,
    /// Which demo backends failed, and how.
    pub hard_replica: String,
    pub grey_replica: String,
    /// When both faults were injected, ms since traffic started.
    pub fault_ms: u64,
    /// Until the hard replica is out of each caller's view.
    pub hard: CallerFigures,
    /// Until each caller's view routes the grey replica less (lower weight or removed).
    pub grey: CallerFigures,
    /// Until the grey replica is out of each caller's view entirely: what the verdict
    /// holds to the budget (with traffic).
    pub grey_removed: CallerFigures,
    pub grey_evidence: GreyEvidence,
    /// Probe traffic as a share of all traffic from the start of traffic to its end
    /// (faults included: a withdrawn or dead replica has no callers, so it is probed at
    /// the normal cadence again).
    pub probe_traffic: ProbeShare,
    /// The same before the faults, from [`SETTLE`] after traffic started: the steady
    /// state of a service above its passive-primary threshold. `None` when the baseline is
    /// too short to have one (short scale).
    pub probe_traffic_steady: Option<ProbeShare>,
    /// The hard replica's verdict and rule at the authority, once it left `eligible`.
    pub hard_rule: Option<String>,
    /// Traffic through every Envoy before the faults and after them.
    pub before: PhaseFigures,
    pub after: PhaseFigures,
    pub verdict: Verdict,
    pub plots: Plots,
}

/// Runs the drill in `run_dir` (created if needed).
pub async fn run(params: Params, run_dir: &Path) -> anyhow::Result<Report> {
    anyhow::ensure!(params.backends >= 3, "at least 3 backends");
    anyhow::ensure!(params.envoys >= 1, "at least one Envoy");
    let waymark = waymark_bin()?;
    let envoy = envoy_bin()?;
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let progress = Progress::new("hard-vs-grey", Instant::now());
    progress.say(&format!("run directory {}", run_dir.display()));

    let spec = RigSpec {
        region: REGION.to_owned(),
        zone: ZONE.to_owned(),
        service: SERVICE.to_owned(),
        contract: contract(),
        backends: params.backends,
        backend_options: BackendOptions {
            slow_delay: SLOW_DELAY,
            ..BackendOptions::default()
        },
        envoys: params.envoys,
        load_reports: !params.break_load_reports,
        authority_env: Vec::new(),
        seed: params.seed,
        deadline: START_DEADLINE,
    };
    if params.break_load_reports {
        progress.say("Envoys run WITHOUT load reporting (--break-load-reports)");
    }
    if params.low_traffic {
        progress.say(&format!(
            "low traffic: {LOW_TRAFFIC_RATE}/s per Envoy, below the passive-primary threshold"
        ));
    }
    let rig = Rig::start(&spec, &waymark, &envoy, run_dir, |l| progress.say(l)).await?;
    let Rig {
        authority,
        fleet,
        agents,
        envoys,
    } = &rig;
    let api = authority.http_addr();
    let (hard, grey) = pick_two(fleet.ids().keys().cloned().collect(), params.seed);
    progress.say(&format!("{hard} will fail hard, {grey} will turn grey"));

    let result = drive(&params, fleet, agents, envoys, api, &hard, &grey, run_dir).await;
    fleet.shutdown().await;
    let report = result?;
    report::finish(run_dir, &report)?;
    Ok(report)
}

/// Probes completed so far by every agent (the sum of their `waymark_probes_total`).
async fn probes_completed(agents: &[EvidenceAgent]) -> u64 {
    let mut total = 0;
    for a in agents {
        if let Ok(r) =
            crate::harness::get_api(a.http_addr(), "/metrics", Duration::from_secs(2)).await
        {
            total += probes_in(&r.body);
        }
    }
    total
}

/// The sum of every `waymark_probes_total` sample in a Prometheus exposition.
fn probes_in(exposition: &str) -> u64 {
    exposition
        .lines()
        .filter(|l| l.starts_with("waymark_probes_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Two distinct backends chosen by `seed`: (hard, grey).
fn pick_two(names: Vec<String>, seed: u64) -> (String, String) {
    let mut rng = SplitMix64::new(seed);
    let n = names.len() as u64;
    let h = rng.below(n) as usize;
    let g = (h + 1 + rng.below(n - 1) as usize) % names.len();
    (names[h].clone(), names[g].clone())
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    params: &Params,
    fleet: &ProbedFleet,
    agents: &[EvidenceAgent],
    envoys: &[EnvoyProc],
    api: std::net::SocketAddr,
    hard: &str,
    grey: &str,
    run_dir: &Path,
) -> anyhow::Result<Report> {
    let progress = Progress::new("hard-vs-grey", Instant::now());
    let epoch = progress.epoch();
    let now_ms = || ms(epoch.elapsed());
    let sampler = StateSampler::start(vec![api], vec![SERVICE.to_owned()], epoch);
    let mut watchers = Watchers::new();
    for (i, e) in envoys.iter().enumerate() {
        watchers.envoy(
            format!("envoy-{}", i + 1),
            e.admin_addr(),
            SERVICE.to_owned(),
            WATCH_EVERY,
            epoch,
        );
    }
    for a in agents {
        for j in 1..=params.subscribers_per_agent {
            watchers.subscriber(
                format!("xds-{}-{j}", a.name()),
                a.xds_addr(),
                ZONE.to_owned(),
                SERVICE.to_owned(),
                epoch,
            );
        }
    }
    // An agent admits new streams at a capped rate (reconnection admission), so the
    // synthetic callers may take a few seconds to all hold a view.
    let n = params.backends;
    wait_until(
        "every caller holds every backend",
        SUBSCRIBE_DEADLINE,
        async || {
            watchers
                .snapshot()
                .iter()
                .all(|l| l.at(u64::MAX).values().filter(|s| s.usable).count() == n)
                .then_some(())
        },
    )
    .await?;
    progress.event("every caller holds every backend");
    let rate = if params.low_traffic {
        LOW_TRAFFIC_RATE
    } else {
        params.rate
    };
    let probes_before = probes_completed(agents).await;
    let generators: Vec<Generator> = envoys
        .iter()
        .map(|e| Generator::start(e.listener_addr(), rate, REQUEST_TIMEOUT, epoch))
        .collect();
    let traffic_ms = now_ms();
    progress.event(&format!(
        "traffic at {}/s through each of {} Envoys; {} callers watched",
        rate,
        envoys.len(),
        envoys.len() + agents.len() * params.subscribers_per_agent
    ));

    let addr = |name: &str| fleet.addresses()[name].to_string();
    let (hard_addr, grey_addr) = (addr(hard), addr(grey));
    let (hard_id, grey_id) = (fleet.ids()[hard].clone(), fleet.ids()[grey].clone());

    let baseline = Duration::from_secs(params.baseline_s);
    let steady = if baseline > SETTLE + Duration::from_secs(5) {
        tokio::time::sleep(SETTLE).await;
        let from = (now_ms(), probes_completed(agents).await);
        tokio::time::sleep(baseline - SETTLE).await;
        Some((from, probes_completed(agents).await))
    } else {
        tokio::time::sleep(baseline).await;
        None
    };
    let fault_ms = now_ms();
    fleet.set_mode(hard, Mode::FailHard)?;
    fleet.set_mode(grey, Mode::Slow)?;
    let fault_at = Instant::now();
    progress.event(&format!(
        "{hard} ({hard_addr}) fails hard; {grey} ({grey_addr}) turns slow and half 503, probe green"
    ));

    let mut evidence = GreyEvidence::default();
    let mut hard_rule = None;
    let deadline = fault_at + Duration::from_secs(params.observe_s);
    let mut settled_at: Option<Instant> = None;
    loop {
        let since = ms(fault_at.elapsed());
        if evidence.withdrawn_ms.is_none()
            && let Some(e) = get_json(api, &format!("/v1/instances/{grey_id}/explain")).await
        {
            let before = (
                evidence.verdict.clone(),
                evidence.rule.clone(),
                evidence.mode.clone(),
            );
            evidence.observe(since, &e);
            let after = (
                evidence.verdict.clone(),
                evidence.rule.clone(),
                evidence.mode.clone(),
            );
            if before != after {
                progress.event(&format!(
                    "authority: {grey} {} by {} ({}) after {since} ms",
                    evidence.verdict.as_deref().unwrap_or("?"),
                    evidence.rule.as_deref().unwrap_or("?"),
                    evidence.mode.as_deref().unwrap_or("?"),
                ));
            }
        }
        if hard_rule.is_none()
            && let Some(e) = get_json(api, &format!("/v1/instances/{hard_id}/explain")).await
            && e["verdict"].as_str().is_some_and(|v| v != "eligible")
        {
            let rule = format!(
                "{} by {}",
                e["verdict"].as_str().unwrap_or("?"),
                rule_text(&e["rule"])
            );
            progress.event(&format!("authority: {hard} {rule} after {since} ms"));
            hard_rule = Some(rule);
        }
        let logs = watchers.snapshot();
        let all = |a: &str, stop| {
            logs.iter().all(|l| {
                !l.at(fault_ms).get(a).is_some_and(|s| s.usable)
                    || stop_time(l, a, fault_ms, stop).is_some()
            })
        };
        // With too little traffic nothing moves off the grey replica: watch it to the end.
        let grey_done = !params.low_traffic && all(&grey_addr, Stop::Removed);
        if settled_at.is_none() && all(&hard_addr, Stop::Removed) && grey_done {
            progress.event(&format!("every caller has moved off both after {since} ms"));
            settled_at = Some(Instant::now());
        }
        // A little longer once settled, for the last load reports and views to land.
        let stop_at = settled_at.map_or(deadline, |s| (s + Duration::from_secs(2)).min(deadline));
        if Instant::now() >= stop_at {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let end_ms = now_ms();
    let probes = probes_completed(agents).await.saturating_sub(probes_before);
    let logs = watchers.stop();
    let drain = REQUEST_TIMEOUT + Duration::from_millis(500);
    let stopping: Vec<_> = generators
        .into_iter()
        .map(|g| tokio::spawn(g.stop(drain)))
        .collect();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for s in stopping {
        outcomes.extend(s.await?);
    }
    outcomes.sort_by_key(|o| o.at_ms);
    report::write_outcomes(run_dir, &outcomes)?;
    std::fs::write(
        run_dir.join("caller_views.json"),
        serde_json::to_string(&logs)?,
    )?;
    let states = sampler.stop();
    progress.event(&format!("traffic stopped: {} requests", outcomes.len()));

    let times = |a: &str, stop| -> Vec<(String, Option<u64>)> {
        logs.iter()
            .filter(|l| l.at(fault_ms).get(a).is_some_and(|s| s.usable))
            .map(|l: &ViewLog| (l.caller.clone(), stop_time(l, a, fault_ms, stop)))
            .collect()
    };
    let hard_f = caller_figures(times(&hard_addr, Stop::Removed));
    let grey_f = caller_figures(times(&grey_addr, Stop::Shifted));
    let grey_removed = caller_figures(times(&grey_addr, Stop::Removed));
    let verdict = hard_vs_grey_verdict(
        &hard_f,
        &grey_removed,
        &evidence,
        &params.budget,
        params.low_traffic,
    );
    let probe_traffic = ProbeShare::new(probes, outcomes.len() as u64);
    let probe_traffic_steady = steady.map(|((from_ms, before), after)| {
        let sent = outcomes
            .iter()
            .filter(|o| o.at_ms >= from_ms && o.at_ms < fault_ms)
            .count();
        ProbeShare::new(after.saturating_sub(before), sent as u64)
    });
    if let Some(p) = probe_traffic_steady {
        progress.event(&format!(
            "steady probe traffic before the faults: {} probes beside {} requests ({:.3} %)",
            p.probes,
            p.requests,
            p.share * 100.0
        ));
    }
    progress.event(&format!(
        "probe traffic: {probes} probes beside {} requests ({:.3} %)",
        outcomes.len(),
        probe_traffic.share * 100.0
    ));
    let before = figures::phase(
        &outcomes,
        Window {
            start_ms: traffic_ms,
            end_ms: fault_ms,
        },
        &[],
    );
    let after = figures::phase(
        &outcomes,
        Window {
            start_ms: fault_ms,
            end_ms,
        },
        &[],
    );
    let dist = |name: &str, f: &CallerFigures| Distribution {
        name: name.to_owned(),
        unit: "ms".to_owned(),
        values: f
            .per_caller
            .iter()
            .filter_map(|(_, t)| t.map(|t| t as f64))
            .collect(),
    };
    let distributions = vec![
        dist("hard failure: out of the caller's view", &hard_f),
        dist("grey failure: routed less by the caller", &grey_f),
        dist("grey failure: out of the caller's view", &grey_removed),
    ];
    Ok(Report {
        drill: "hard-vs-grey",
        params: params.clone(),
        run_dir: run_dir.to_path_buf(),
        hard_replica: hard.to_owned(),
        grey_replica: grey.to_owned(),
        fault_ms,
        hard: hard_f,
        grey: grey_f,
        grey_removed,
        grey_evidence: evidence,
        probe_traffic,
        probe_traffic_steady,
        hard_rule,
        before,
        after,
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
    use serde_json::json;

    fn callers(times: &[Option<u64>]) -> CallerFigures {
        caller_figures(
            times
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("c{i}"), *t))
                .collect(),
        )
    }

    fn read(answers: &[(u64, &str, Value, u16)]) -> GreyEvidence {
        let mut e = GreyEvidence::default();
        for (at, verdict, rule, probe) in answers {
            let explain = serde_json::json!({
                "verdict": verdict, "rule": rule, "text": "…", "evidence": "passive_primary",
                "classes": [{"class": "probe", "score": probe}, {"class": "passive", "score": 900}],
            });
            e.observe(*at, &explain);
        }
        e
    }

    fn population() -> Value {
        json!({"rule": "caller_population", "failing": 3, "callers": 3})
    }

    #[test]
    fn quantiles_count_callers_that_never_stopped_as_slowest() {
        let f = callers(&[Some(100), Some(300), Some(200)]);
        assert_eq!((f.callers, f.stopped), (3, 3));
        assert_eq!(
            (f.p50_ms, f.p99_ms, f.max_ms),
            (Some(200), Some(300), Some(300))
        );
        let f = callers(&[Some(100), None]);
        assert_eq!(f.p50_ms, Some(100));
        assert_eq!(f.p99_ms, None);
    }

    #[test]
    fn a_rule_reads_as_its_name_and_fields() {
        let rule = json!({"rule": "corroborated", "failing": "probe", "by": "passive"});
        assert_eq!(rule_text(&rule), "corroborated by=passive failing=probe");
        assert_eq!(rule_text(&json!("Silence")), "?", "text is not a rule");
        assert_eq!(
            rule_text(&population()),
            "caller_population callers=3 failing=3"
        );
    }

    #[test]
    fn explain_answers_are_read_until_the_withdrawal_and_the_probe_is_watched_throughout() {
        let e = read(&[
            (1_000, "eligible", json!({"rule": "passing"}), 0),
            (
                2_000,
                "degraded",
                json!({"rule": "uncorroborated", "failing": "passive"}),
                600,
            ),
            (3_000, "ineligible", population(), 100),
            (4_000, "eligible", json!({"rule": "passing"}), 0),
        ]);
        assert_eq!((e.caught_ms, e.withdrawn_ms), (Some(2_000), Some(3_000)));
        assert!(e.population && e.passive_named);
        assert_eq!(e.mode.as_deref(), Some("passive_primary"));
        assert_eq!(
            e.probe_max,
            Some(600),
            "the highest probe score, not the last"
        );
    }

    #[test]
    fn the_verdict_wants_the_grey_replica_withdrawn_by_the_callers_population() {
        let b = Budget::default();
        let fast = callers(&[Some(500), Some(900)]);
        let withdrawn = read(&[(3_000, "ineligible", population(), 0)]);
        let ok = hard_vs_grey_verdict(&fast, &fast, &withdrawn, &b, false);
        assert!(ok.pass, "{ok:?}");

        let slow = callers(&[Some(500), Some(b.hard_p99_ms + 1)]);
        let v = hard_vs_grey_verdict(&slow, &fast, &withdrawn, &b, false);
        assert_eq!(v.failures.len(), 1, "{v:?}");
        assert!(v.failures[0].starts_with("hard: p99"), "{v:?}");

        // Only degraded (today's rules without the threshold): not the claim.
        let degraded = read(&[(
            3_000,
            "degraded",
            json!({"rule": "uncorroborated", "failing": "passive"}),
            0,
        )]);
        let never = callers(&[None, None]);
        let v = hard_vs_grey_verdict(&fast, &never, &degraded, &b, false);
        assert_eq!(v.failures.len(), 2, "{v:?}");
        assert!(v.failures[1].contains("never withdrew"), "{v:?}");

        // Withdrawn by a failing probe: not the claim either.
        let by_probe = read(&[(
            3_000,
            "ineligible",
            json!({"rule": "corroborated", "failing": "probe", "by": "passive"}),
            900,
        )]);
        let v = hard_vs_grey_verdict(&fast, &fast, &by_probe, &b, false);
        assert_eq!(v.failures.len(), 2, "{v:?}");
    }

    #[test]
    fn with_low_traffic_the_verdict_wants_the_grey_replica_routed_and_single_class() {
        let b = Budget::default();
        let fast = callers(&[Some(500), Some(900)]);
        let never = callers(&[None, None]);
        let mut routed = read(&[(1_000, "eligible", json!({"rule": "passing"}), 0)]);
        routed.mode = Some("single_class".into());
        assert!(hard_vs_grey_verdict(&fast, &never, &routed, &b, true).pass);
        let withdrawn = read(&[(3_000, "ineligible", population(), 0)]);
        let v = hard_vs_grey_verdict(&fast, &fast, &withdrawn, &b, true);
        assert_eq!(v.failures.len(), 2, "{v:?}");
    }

    #[test]
    fn probes_are_summed_over_every_series() {
        let text = "# HELP waymark_probes Completed probes\n\
                    waymark_probes_total{kind=\"http\",health=\"pass\"} 12\n\
                    waymark_probes_total{kind=\"http\",health=\"fail\"} 3\n\
                    waymark_probe_targets 4\n";
        assert_eq!(probes_in(text), 15);
        assert_eq!(ProbeShare::new(5, 995).share, 0.005);
    }

    #[test]
    fn two_distinct_replicas_are_picked() {
        for seed in 0..50 {
            let (h, g) = pick_two(vec!["a".into(), "b".into(), "c".into()], seed);
            assert_ne!(h, g);
        }
    }
}
