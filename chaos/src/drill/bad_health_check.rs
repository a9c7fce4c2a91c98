//! `bad-health-check`: under steady traffic through a real Envoy, the service's contract is
//! replaced by one whose probe fails on every replica (the gRPC health protocol, asked of
//! backends that speak plain HTTP/1 and JSON — a wrong check, not a sick service). The
//! evaluator then judges every replica failing; the fraction guard must publish the full
//! set anyway, declare `health_disregarded`, raise the alarm (API and metric), and the
//! callers must keep every endpoint with the error rate unchanged: degraded, never drained.
//!
//! The service is probe-only (a low-traffic internal service's profile), so the probe is
//! the only class and its failure withdraws on its own: the guard is the line under test.
//! With callers' outcomes in the profile the broken probe would not even withdraw anything
//! (passive evidence disagrees, so the failure is uncorroborated and only lowers weight) —
//! a first line in front of the guard, which this drill deliberately takes away.
//!
//! Where the property is measured: the guard lives at the authority, so the authority's
//! *published* view (`/v1/services/{svc}/view`, what every caller of the region is sent)
//! must never lose an endpoint; the callers (Envoy, synthetic Delta xDS subscriptions to
//! the node agent) are measured too. The node agent's own bound (it refuses a view that
//! would empty a service, and caps how fast a set shrinks) is a second line behind the
//! guard; `--break-fraction-guard` switches the guard off
//! (`WAYMARK_UNSAFE_DISABLE_FRACTION_GUARD=1`) and the report shows what each line did.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;
use waymark_agent::dev::backends::BackendOptions;
use waymark_core::defaults as d;

use super::Scale;
use super::figures::{self, PhaseFigures, Verdict, Window};
use super::report::{self, Plots, Progress, StateSampler};
use crate::harness::callers::{ViewLog, Watchers};
use crate::harness::evidence::{Rig, RigSpec, get_json, probed_contract};
use crate::harness::{envoy_bin, wait_until, waymark_bin};
use crate::traffic::{Generator, Outcome, ms};

const REGION: &str = "r1";
const ZONE: &str = "z1";
const SERVICE: &str = "web";
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How long the synthetic callers may take to all hold a view: an agent admits new
/// streams at a capped rate (reconnection admission), so many subscribers take a while.
const SUBSCRIBE_DEADLINE: Duration = Duration::from_secs(180);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// How often the authority's view, markers and alarms are read.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// The drill-only switch that turns the fraction guard off.
const GUARD_OFF: &str = "WAYMARK_UNSAFE_DISABLE_FRACTION_GUARD";

/// What the figures are held to.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Budget {
    /// From the push until `health_disregarded` is declared and the alarm raised: the
    /// damping budget for the failing probes to cross, the withdrawal budget to publish
    /// ([`d::DAMPING_BUDGET`] + [`d::WITHDRAWAL_BUDGET_P99`]).
    pub declare_ms: u64,
    /// The error rate after the push may exceed the one before by at most this.
    pub error_rate_margin: f64,
    /// Fewer requests than this in a phase is not a measurement.
    pub min_requests: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            declare_ms: ms(d::DAMPING_BUDGET + d::WITHDRAWAL_BUDGET_P99),
            error_rate_margin: 0.01,
            min_requests: 50,
        }
    }
}

/// What the drill is run with.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub scale: Scale,
    pub backends: usize,
    /// Synthetic Delta xDS subscriptions to the agent.
    pub subscribers: usize,
    /// Requests per second through Envoy.
    pub rate: u32,
    /// Steady traffic before the push.
    pub baseline_s: u64,
    /// How long the bad contract stays in force under observation.
    pub observe_s: u64,
    /// Recorded for uniformity: this drill makes no random choice.
    pub seed: u64,
    pub budget: Budget,
    /// Break the property on purpose: the authority runs without its fraction guard.
    pub break_fraction_guard: bool,
}

impl Params {
    /// The defaults of a scale.
    pub fn for_scale(scale: Scale) -> Self {
        let (backends, subscribers, observe_s) = match scale {
            // Short: 9 subscribers and the Envoy are the ten arrivals a node agent's
            // reconnection admission lets in at once (its floor); an eleventh waited out
            // the window, about 6 s, before the baseline could start.
            Scale::Short => (4, 9, 25),
            Scale::Full => (6, 50, 300),
        };
        Self {
            scale,
            backends,
            subscribers,
            rate: 30,
            baseline_s: 10,
            observe_s,
            seed: 1,
            budget: Budget::default(),
            break_fraction_guard: false,
        }
    }
}

/// The service's contract before the push: probes only (`GET /healthz` every second).
pub fn good_contract() -> Value {
    let mut c = probed_contract();
    c["profile"] = json!({"probe": true, "self_report": false, "passive": false});
    c
}

/// The contract pushed: the same, but the gRPC health protocol against HTTP/1 backends.
pub fn bad_contract() -> Value {
    let mut c = good_contract();
    c["probe"] = json!({"kind": "grpc", "interval": "1s", "timeout": "500ms"});
    c
}

/// The authority at one moment (ms since the push).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuthoritySample {
    pub t_ms: u64,
    /// Instances judged not routable: published as `ineligible` (under the guard) or
    /// not published at all (`withdrawn`).
    pub judged_failing: u64,
    /// `health_disregarded` names a zone of the service.
    pub declared: bool,
    /// `/v1/alarms` lists the service's fraction-guard alarm.
    pub alarm: bool,
    /// `waymark_alarm_fraction_guard_engaged` is 1 for the service.
    pub metric: bool,
    /// The fewest endpoints any published view of the service holds.
    pub published: Option<usize>,
}

/// What the authority samples add up to.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GuardFigures {
    /// ms after the push until every replica was judged failing (the bad check bit).
    pub all_failing_ms: Option<u64>,
    pub declared_ms: Option<u64>,
    pub alarm_ms: Option<u64>,
    pub metric_ms: Option<u64>,
    /// The fewest endpoints the authority published at any sample after the push.
    pub published_min: Option<usize>,
    /// What it published at the last sample.
    pub published_last: Option<usize>,
}

/// Samples (after the push) → figures.
pub fn guard_figures(samples: &[AuthoritySample], backends: usize) -> GuardFigures {
    let first =
        |f: &dyn Fn(&AuthoritySample) -> bool| samples.iter().find(|s| f(s)).map(|s| s.t_ms);
    GuardFigures {
        all_failing_ms: first(&|s| s.judged_failing as usize >= backends),
        declared_ms: first(&|s| s.declared),
        alarm_ms: first(&|s| s.alarm),
        metric_ms: first(&|s| s.metric),
        published_min: samples.iter().filter_map(|s| s.published).min(),
        published_last: samples.last().and_then(|s| s.published),
    }
}

/// What one caller held from the push on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CallerHeld {
    pub caller: String,
    /// The fewest usable endpoints at any moment.
    pub min: usize,
    /// Usable endpoints at the end.
    pub last: usize,
}

/// The fewest usable endpoints each caller held from `from_ms` on, and what it held last.
pub fn callers_held(logs: &[ViewLog], from_ms: u64) -> Vec<CallerHeld> {
    let usable = |v: &crate::harness::callers::CallerView| v.values().filter(|s| s.usable).count();
    logs.iter()
        .map(|l| {
            let at_start = l.at(from_ms);
            let min = std::iter::once(&at_start)
                .chain(
                    l.changes
                        .iter()
                        .filter(|(t, _)| *t > from_ms)
                        .map(|(_, v)| v),
                )
                .map(usable)
                .min()
                .unwrap_or(0);
            CallerHeld {
                caller: l.caller.clone(),
                min,
                last: usable(&l.at(u64::MAX)),
            }
        })
        .collect()
}

/// The fewest endpoints the guard lets a zone of `total` keep routed: `ceil(total ×
/// floor‰ / 1000)` (below it the zone is published whole).
pub fn floor_count(total: usize, floor_permille: u16) -> usize {
    (total * usize::from(floor_permille)).div_ceil(1000)
}

/// The verdict: the bad check bit; the guard declared it and alarmed within budget; the
/// published view and every caller never fell below the zone's floor (the first failures
/// above the floor are withdrawn as for any failure, until the guard engages) and ended
/// holding every endpoint; the error rate did not move.
pub fn bad_check_verdict(
    g: &GuardFigures,
    callers: &[CallerHeld],
    backends: usize,
    floor: usize,
    before: &PhaseFigures,
    after: &PhaseFigures,
    budget: &Budget,
) -> Verdict {
    let mut failures = Vec::new();
    if g.all_failing_ms.is_none() {
        failures
            .push("the bad check never failed every replica: the guard was not exercised".into());
    }
    for (what, t) in [
        ("health_disregarded declared", g.declared_ms),
        ("alarm raised (/v1/alarms)", g.alarm_ms),
        ("alarm metric set", g.metric_ms),
    ] {
        match t {
            None => failures.push(format!("{what}: never")),
            Some(t) if t > budget.declare_ms => {
                failures.push(format!(
                    "{what}: after {t} ms, budget {} ms",
                    budget.declare_ms
                ));
            }
            Some(_) => {}
        }
    }
    match g.published_min {
        Some(n) if n >= floor => {}
        n => failures.push(format!(
            "drained at the authority: a published view held {n:?} of {backends} endpoints \
             (floor {floor})"
        )),
    }
    if g.published_last != Some(backends) {
        failures.push(format!(
            "the authority ended publishing {:?} of {backends} endpoints, not the full set",
            g.published_last
        ));
    }
    let below: Vec<String> = callers
        .iter()
        .filter(|c| c.min < floor)
        .map(|c| format!("{}={}", c.caller, c.min))
        .collect();
    if !below.is_empty() {
        failures.push(format!(
            "{} of {} callers fell below the floor of {floor} endpoints ({})",
            below.len(),
            callers.len(),
            below.join(", ")
        ));
    }
    let partial: Vec<String> = callers
        .iter()
        .filter(|c| c.last < backends)
        .map(|c| format!("{}={}", c.caller, c.last))
        .collect();
    if !partial.is_empty() {
        failures.push(format!(
            "{} of {} callers ended without the full set ({})",
            partial.len(),
            callers.len(),
            partial.join(", ")
        ));
    }
    for (name, f) in [("before", before), ("after", after)] {
        if f.requests < budget.min_requests {
            failures.push(format!("{name}: only {} requests", f.requests));
        }
    }
    if after.error_rate > before.error_rate + budget.error_rate_margin {
        failures.push(format!(
            "error rate {:.4} after the push, {:.4} before (margin {:.4})",
            after.error_rate, before.error_rate, budget.error_rate_margin
        ));
    }
    Verdict {
        pass: failures.is_empty(),
        failures,
    }
}

/// Everything the run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub drill: &'static str,
    pub params: Params,
    pub run_dir: PathBuf,
    /// The contract pushed.
    pub bad_contract: Value,
    /// When it was pushed, ms since traffic started.
    pub push_ms: u64,
    pub guard: GuardFigures,
    /// The guard's floor for the zone: fewer routed endpoints than this and it engages.
    pub floor: usize,
    /// What each caller held after the push.
    pub callers: Vec<CallerHeld>,
    pub before: PhaseFigures,
    pub after: PhaseFigures,
    /// What `/v1/alarms` listed at the end.
    pub alarms: Value,
    /// The authority's samples after the push.
    pub samples: Vec<AuthoritySample>,
    pub verdict: Verdict,
    pub plots: Plots,
}

/// Runs the drill in `run_dir`.
pub async fn run(params: Params, run_dir: &Path) -> anyhow::Result<Report> {
    anyhow::ensure!(params.backends >= 2, "at least 2 backends");
    let waymark = waymark_bin()?;
    let envoy = envoy_bin()?;
    std::fs::create_dir_all(run_dir)?;
    let progress = Progress::new("bad-health-check", Instant::now());
    progress.say(&format!("run directory {}", run_dir.display()));
    let authority_env = if params.break_fraction_guard {
        progress.say(&format!(
            "the authority runs WITHOUT its fraction guard ({GUARD_OFF}=1)"
        ));
        vec![(GUARD_OFF.to_owned(), "1".to_owned())]
    } else {
        Vec::new()
    };
    let spec = RigSpec {
        region: REGION.to_owned(),
        zone: ZONE.to_owned(),
        service: SERVICE.to_owned(),
        contract: good_contract(),
        backends: params.backends,
        backend_options: BackendOptions::default(),
        envoys: 1,
        load_reports: true,
        authority_env,
        seed: params.seed,
        deadline: START_DEADLINE,
    };
    let rig = Rig::start(&spec, &waymark, &envoy, run_dir, |l| progress.say(l)).await?;
    let result = drive(&params, &rig, run_dir).await;
    rig.fleet.shutdown().await;
    let report = result?;
    report::finish(run_dir, &report)?;
    Ok(report)
}

async fn drive(params: &Params, rig: &Rig, run_dir: &Path) -> anyhow::Result<Report> {
    let progress = Progress::new("bad-health-check", Instant::now());
    let epoch = progress.epoch();
    let now_ms = || ms(epoch.elapsed());
    let api = rig.authority.http_addr();
    let sampler = StateSampler::start(vec![api], vec![SERVICE.to_owned()], epoch);
    let mut watchers = Watchers::new();
    for (i, e) in rig.envoys.iter().enumerate() {
        watchers.envoy(
            format!("envoy-{}", i + 1),
            e.admin_addr(),
            SERVICE.to_owned(),
            WATCH_EVERY,
            epoch,
        );
    }
    for a in &rig.agents {
        for j in 1..=params.subscribers {
            watchers.subscriber(
                format!("xds-{}-{j}", a.name()),
                a.xds_addr(),
                ZONE.to_owned(),
                SERVICE.to_owned(),
                epoch,
            );
        }
    }
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
    let envoy = &rig.envoys[0];
    let traffic = Generator::start(envoy.listener_addr(), params.rate, REQUEST_TIMEOUT, epoch);
    let traffic_ms = now_ms();
    progress.event(&format!(
        "traffic at {}/s through Envoy; {} callers hold all {n} backends",
        params.rate,
        params.subscribers * rig.agents.len() + rig.envoys.len()
    ));
    tokio::time::sleep(Duration::from_secs(params.baseline_s)).await;

    let contract = bad_contract();
    let push_ms = now_ms();
    rig.fleet.put_contract(contract.clone()).await?;
    let pushed = Instant::now();
    progress.event(&format!("contract pushed: probe {}", contract["probe"]));

    let mut samples = Vec::new();
    let mut seen = (false, false, false, usize::MAX);
    let until = pushed + Duration::from_secs(params.observe_s);
    while Instant::now() < until {
        let s = sample(api, ms(pushed.elapsed())).await;
        if s.judged_failing as usize >= n && !seen.0 {
            progress.event(&format!("every replica judged failing after {} ms", s.t_ms));
            seen.0 = true;
        }
        if s.declared && !seen.1 {
            progress.event(&format!("health_disregarded declared after {} ms", s.t_ms));
            seen.1 = true;
        }
        if s.alarm && !seen.2 {
            progress.event(&format!("fraction-guard alarm raised after {} ms", s.t_ms));
            seen.2 = true;
        }
        if let Some(p) = s.published
            && p < seen.3
        {
            if seen.3 != usize::MAX {
                progress.event(&format!(
                    "the authority publishes {p} of {n} endpoints ({} ms)",
                    s.t_ms
                ));
            }
            seen.3 = p;
        }
        samples.push(s);
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    let end_ms = now_ms();
    let alarms = get_json(api, "/v1/alarms").await.unwrap_or(Value::Null);
    let logs = watchers.stop();
    let outcomes: Vec<Outcome> = traffic
        .stop(REQUEST_TIMEOUT + Duration::from_millis(500))
        .await;
    report::write_outcomes(run_dir, &outcomes)?;
    std::fs::write(
        run_dir.join("caller_views.json"),
        serde_json::to_string(&logs)?,
    )?;
    let states = sampler.stop();
    progress.event(&format!("traffic stopped: {} requests", outcomes.len()));

    let guard = guard_figures(&samples, n);
    let callers = callers_held(&logs, push_ms);
    let floor = floor_count(n, d::MIN_HEALTHY.get());
    let before = figures::phase(
        &outcomes,
        Window {
            start_ms: traffic_ms,
            end_ms: push_ms,
        },
        &[],
    );
    let after = figures::phase(
        &outcomes,
        Window {
            start_ms: push_ms,
            end_ms,
        },
        &[],
    );
    let verdict = bad_check_verdict(&guard, &callers, n, floor, &before, &after, &params.budget);
    Ok(Report {
        drill: "bad-health-check",
        params: params.clone(),
        run_dir: run_dir.to_path_buf(),
        bad_contract: contract,
        push_ms,
        guard,
        floor,
        callers,
        before,
        after,
        alarms,
        samples,
        verdict,
        plots: Plots {
            states,
            errors: report::error_series(&outcomes),
            distributions: Vec::new(),
            events: progress.events(),
        },
    })
}

/// One look at the authority: verdicts and markers, the published views, the alarms and
/// the alarm metric.
async fn sample(api: SocketAddr, t_ms: u64) -> AuthoritySample {
    let services = get_json(api, "/v1/services").await;
    let svc = services
        .as_ref()
        .and_then(|b| b.as_array())
        .and_then(|a| a.iter().find(|s| s["service"] == SERVICE).cloned());
    let judged_failing = ["ineligible", "withdrawn"]
        .iter()
        .map(|v| {
            svc.as_ref()
                .and_then(|s| s["verdicts"][v].as_u64())
                .unwrap_or(0)
        })
        .sum();
    let declared = svc
        .as_ref()
        .and_then(|s| s["health_disregarded"].as_array())
        .is_some_and(|z| !z.is_empty());
    let views = get_json(api, &format!("/v1/services/{SERVICE}/view")).await;
    let published = views
        .as_ref()
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().map(published_endpoints).min());
    let alarm = get_json(api, "/v1/alarms")
        .await
        .and_then(|a| a.as_array().cloned())
        .is_some_and(|a| {
            a.iter()
                .any(|x| x["service"] == SERVICE && x["alarm"] == "fraction_guard")
        });
    let metric = match crate::harness::get_api(api, "/metrics", Duration::from_secs(2)).await {
        Ok(r) => guard_metric_set(&r.body, SERVICE),
        Err(_) => false,
    };
    AuthoritySample {
        t_ms,
        judged_failing,
        declared,
        alarm,
        metric,
        published,
    }
}

/// Endpoints of one published view (`/v1/services/{svc}/view` entry) that a caller is
/// sent to route to: every endpoint present except draining ones.
fn published_endpoints(v: &Value) -> usize {
    v["view"]["endpoints"]
        .as_object()
        .map(|m| m.values().filter(|e| e["status"] != "draining").count())
        .unwrap_or(0)
}

/// Whether the Prometheus text sets `waymark_alarm_fraction_guard_engaged` to 1 for
/// `service` (any zone).
pub fn guard_metric_set(text: &str, service: &str) -> bool {
    let label = format!("service=\"{service}\"");
    text.lines().any(|l| {
        l.starts_with("waymark_alarm_fraction_guard_engaged")
            && l.contains(&label)
            && l.split_whitespace()
                .last()
                .and_then(|v| v.parse::<f64>().ok())
                == Some(1.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::callers::Seen;

    fn s(
        t_ms: u64,
        judged_failing: u64,
        declared: bool,
        alarm: bool,
        published: usize,
    ) -> AuthoritySample {
        AuthoritySample {
            t_ms,
            judged_failing,
            declared,
            alarm,
            metric: alarm,
            published: Some(published),
        }
    }

    fn phase(requests: u64, errors: u64) -> PhaseFigures {
        PhaseFigures {
            requests,
            errors,
            error_rate: errors as f64 / requests as f64,
            ..PhaseFigures::default()
        }
    }

    #[test]
    fn figures_take_the_first_sample_of_each_signal_and_the_fewest_published() {
        let g = guard_figures(
            &[
                s(0, 0, false, false, 4),
                s(2_000, 4, true, false, 4),
                s(2_500, 4, true, true, 4),
            ],
            4,
        );
        assert_eq!(g.all_failing_ms, Some(2_000));
        assert_eq!(g.declared_ms, Some(2_000));
        assert_eq!(g.alarm_ms, Some(2_500));
        assert_eq!(g.published_min, Some(4));
    }

    fn held(min: usize, last: usize) -> Vec<CallerHeld> {
        vec![CallerHeld {
            caller: "envoy-1".to_owned(),
            min,
            last,
        }]
    }

    #[test]
    fn a_guarded_service_passes_and_a_drained_one_fails_for_that_reason() {
        let b = Budget::default();
        // One withdrawn above the floor before the guard engaged, then the full set.
        let ok = guard_figures(
            &[s(1_500, 1, false, false, 3), s(2_000, 4, true, true, 4)],
            4,
        );
        let v = bad_check_verdict(&ok, &held(3, 4), 4, 2, &phase(300, 0), &phase(600, 3), &b);
        assert!(v.pass, "{v:?}");

        let drained = guard_figures(&[s(2_000, 4, false, false, 0)], 4);
        let v = bad_check_verdict(
            &drained,
            &held(1, 1),
            4,
            2,
            &phase(300, 0),
            &phase(600, 300),
            &b,
        );
        assert!(!v.pass);
        let text = v.failures.join("\n");
        for want in [
            "declared: never",
            "alarm raised",
            "drained at the authority",
            "ended publishing Some(0)",
            "fell below the floor",
            "ended without the full set",
            "error rate",
        ] {
            assert!(text.contains(want), "{want} missing from {text}");
        }
    }

    #[test]
    fn a_check_that_never_bit_is_not_a_pass() {
        let g = guard_figures(&[s(2_000, 1, false, false, 4)], 4);
        let v = bad_check_verdict(
            &g,
            &[],
            4,
            2,
            &phase(300, 0),
            &phase(300, 0),
            &Budget::default(),
        );
        assert!(
            v.failures[0].contains("never failed every replica"),
            "{v:?}"
        );
    }

    #[test]
    fn the_floor_is_the_fewest_the_guard_lets_remain() {
        assert_eq!(floor_count(4, 500), 2);
        assert_eq!(floor_count(5, 500), 3);
        assert_eq!(floor_count(6, 500), 3);
        assert_eq!(floor_count(1, 100), 1);
    }

    #[test]
    fn callers_minimum_starts_from_the_view_in_force_at_the_push() {
        let mut l = ViewLog::default();
        let view = |n: usize| -> crate::harness::callers::CallerView {
            (0..n)
                .map(|i| {
                    (
                        format!("a{i}"),
                        Seen {
                            weight: 1,
                            usable: true,
                        },
                    )
                })
                .collect()
        };
        l.record(0, view(4));
        l.record(5_000, view(1));
        l.record(9_000, view(4));
        assert_eq!(callers_held(&[l.clone()], 1_000)[0].min, 1);
        assert_eq!(callers_held(&[l.clone()], 1_000)[0].last, 4);
        assert_eq!(callers_held(&[l], 9_500)[0].min, 4);
    }

    #[test]
    fn the_alarm_metric_is_read_per_service() {
        let text = "# TYPE waymark_alarm_fraction_guard_engaged gauge\n\
                    waymark_alarm_fraction_guard_engaged{service=\"web\",zone=\"z1\"} 1\n\
                    waymark_alarm_fraction_guard_engaged{service=\"pay\",zone=\"z1\"} 0\n";
        assert!(guard_metric_set(text, "web"));
        assert!(!guard_metric_set(text, "pay"));
        assert!(!guard_metric_set(text, "nope"));
    }

    #[test]
    fn the_bad_contract_only_changes_the_probe() {
        let c = bad_contract();
        assert_eq!(c["probe"]["kind"], "grpc");
        assert_eq!(c["profile"], good_contract()["profile"]);
        assert_eq!(c["profile"]["passive"], false);
    }
}
