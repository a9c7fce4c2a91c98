//! `zone-evacuation`: a zone is evacuated during a burst of 40,000 changes per minute
//! (registrations and deregistrations through the authority's API) while the prototype's
//! fleet is attached (40 services, 2,000 instances, up to 2,000 Delta xDS subscribers, see
//! [`crate::harness::fleet`]). During the burst instances of the evacuated zone are withdrawn
//! (deregistered — the zone's hosts leaving); every subscriber following their service must
//! stop seeing them within the withdrawal budget (99% in 5 s, 99.9% in 15 s, measured per
//! subscriber from the moment the deregistration was sent), while the admission path sheds
//! and declares it (`waymark_shedding`, `waymark_shed_episodes_total`).
//!
//! Admissions (new instances) are sampled too: their propagation is reported against the
//! 30 s admission budget, which is what shedding spends.
//!
//! Beside its own measurement the report sets the authority's: the quantiles of
//! `waymark_xds_propagation_seconds{hop="authority_agent"}` scraped from its `/metrics` at
//! the end (release → each subscriber's ACK, as the member timed it). The drill measures
//! from the deregistration's send, so its figures include the API and the withdrawal
//! window and can only be the larger; both must give the same budget verdict.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use tokio::time::Instant;
use waymark_core::defaults as d;

use super::Scale;
use super::figures::Verdict;
use super::report::{self, Distribution, Plots, Progress, StateSampler, quantile};
use crate::harness::fleet::{
    self, Api, FleetAuthority, Limits, Shape, SubLog, Subscribers, first_holding,
};
use crate::harness::waymark_bin;
use crate::rng::SplitMix64 as Rng;
use crate::traffic::ms;

const REGION: &str = "r1";
const START_DEADLINE: Duration = Duration::from_secs(60);

/// What the drill is run with.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub scale: Scale,
    pub seed: u64,
    pub shape: Shape,
    /// The zone evacuated (and whose instances are withdrawn).
    pub zone: String,
    /// The burst's target rate.
    pub changes_per_min: u32,
    pub burst_s: u64,
    /// Requests in flight at most during the burst.
    pub concurrency: usize,
    /// Instances of the evacuated zone withdrawn during the burst (spread evenly).
    pub withdrawals: usize,
    /// Every n-th registration of the burst is followed to the subscribers.
    pub admission_sample_every: usize,
    /// After the burst, how long the subscribers are still watched.
    pub settle_s: u64,
    pub budget: Budget,
    /// The authority's `[authority.limits]`.
    pub limits: Limits,
    /// Break the property on purpose: admission shedding off (`[authority.limits]
    /// shed_admissions = false`).
    pub break_shedding: bool,
}

/// What must hold.
#[derive(Debug, Clone, Serialize)]
pub struct Budget {
    /// 99% of (withdrawal, subscriber) pairs within this ([`d::WITHDRAWAL_BUDGET_P99`]).
    pub withdrawal_p99_ms: f64,
    /// 99.9% within this ([`d::WITHDRAWAL_BUDGET_P999`]).
    pub withdrawal_p999_ms: f64,
    /// The burst must be offered at this share of its target rate, and either accepted at
    /// it or saturate the authority, or it did not test anything.
    pub min_rate_share: f64,
    /// Admission shedding must have been declared whenever delivery came under pressure
    /// (a `Publish` commit slower than the pressure threshold) during the burst.
    pub shedding_declared: bool,
}

impl Params {
    /// How slow a `Publish` commit must be for the authority to report delivery pressure.
    pub fn pressure_after(&self) -> Duration {
        self.limits.publish_pressure_after_ms.map_or(
            waymark_core::defaults::PUBLISH_PRESSURE_AFTER,
            Duration::from_millis,
        )
    }

    pub fn for_scale(scale: Scale) -> Self {
        let (subscriptions, burst_s, withdrawals) = match scale {
            Scale::Short => (500, 20, 40),
            Scale::Full => (2_000, 60, 120),
        };
        let zones: Vec<String> = ["z1", "z2", "z3"].iter().map(|z| (*z).to_owned()).collect();
        Self {
            scale,
            seed: 8,
            shape: Shape {
                services: 40,
                instances: 2_000,
                zones: zones.clone(),
                subscriptions,
                services_per_subscriber: 1,
            },
            zone: zones[0].clone(),
            changes_per_min: 40_000,
            burst_s,
            concurrency: 64,
            withdrawals,
            admission_sample_every: 20,
            settle_s: 16,
            budget: Budget {
                withdrawal_p99_ms: ms(d::WITHDRAWAL_BUDGET_P99) as f64,
                withdrawal_p999_ms: ms(d::WITHDRAWAL_BUDGET_P999) as f64,
                min_rate_share: 0.9,
                shedding_declared: true,
            },
            limits: Limits {
                // Attaching the subscribers is setup, not what this drill measures: let
                // them all in at once (the xds-restart drill holds the default).
                reconnect_floor: Some(u32::try_from(subscriptions).unwrap_or(u32::MAX)),
                ..Limits::default()
            },
            break_shedding: false,
        }
    }
}

/// One change of the burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Register,
    Deregister,
    /// A measured withdrawal of a base instance of the evacuated zone.
    Withdraw,
}

/// A change as sent and answered.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Change {
    pub kind: Kind,
    pub sent_ms: u64,
    pub answered_ms: u64,
    pub ok: bool,
}

/// The burst's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Burst {
    /// Changes the load generator's schedule offered (the target rate over the burst).
    pub offered: usize,
    /// The rate the load generator offered them at.
    pub offered_per_min: f64,
    /// Offered changes not sent because the authority still held `concurrency` requests.
    pub dropped: usize,
    /// Whether the authority accepted the claim's rate (≥ 90% of the target).
    pub claim_rate_reached: bool,
    pub changes: usize,
    pub failed: usize,
    pub registrations: usize,
    pub deregistrations: usize,
    pub withdrawals: usize,
    /// Achieved changes per minute over the burst.
    pub changes_per_min: f64,
    /// API answer times of the changes.
    pub answer_p50_ms: f64,
    pub answer_p99_ms: f64,
}

/// Propagation of one kind of change to the subscribers.
#[derive(Debug, Clone, Serialize)]
pub struct Propagation {
    /// (change, subscriber) pairs measured.
    pub pairs: usize,
    /// Pairs that never arrived while watched.
    pub missing: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// Share of pairs within [`d::WITHDRAWAL_BUDGET_P99`] (5 s; the name is the report's).
    pub within_5s: f64,
}

/// The admission path's declaration.
#[derive(Debug, Clone, Serialize)]
pub struct Shedding {
    /// `waymark_shed_episodes_total` before and after the burst.
    pub episodes_before: f64,
    pub episodes_after: f64,
    /// `waymark_shedding` was 1 at some sample during the burst.
    pub seen_shedding: bool,
    /// Share of the burst's metric samples with `waymark_shedding 1`.
    pub shedding_share: f64,
    /// `Publish` commits slower than the authority's pressure threshold
    /// ([`Params::pressure_after`]) from the burst's start to the end of the run: delivery
    /// was under pressure, so shedding had to be declared. None slow means the
    /// authority delivered the burst without pressure and had nothing to shed.
    pub slow_publishes: f64,
}

impl Shedding {
    /// Shedding was declared during the run.
    pub fn declared(&self) -> bool {
        self.seen_shedding || self.episodes_after > self.episodes_before
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub drill: &'static str,
    pub params: Params,
    pub run_dir: PathBuf,
    pub subscribers: usize,
    pub burst: Burst,
    pub withdrawal: Propagation,
    pub admission: Propagation,
    pub shedding: Shedding,
    /// The authority's `/v1/zones` answer at the end.
    pub evacuation: serde_json::Value,
    /// The authority's own propagation histogram, beside the drill's measurement.
    pub authority_histogram: AuthorityHistogram,
    pub verdict: Verdict,
    pub plots: Plots,
}

/// Quantiles of one path of the authority's `waymark_xds_propagation_seconds`.
#[derive(Debug, Clone, Serialize)]
pub struct HistogramQuantiles {
    /// Releases timed.
    pub count: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
}

/// The authority's histogram against the drill's own measurement.
#[derive(Debug, Clone, Serialize)]
pub struct AuthorityHistogram {
    pub withdrawal: HistogramQuantiles,
    pub admission: HistogramQuantiles,
    /// Both say the withdrawals kept the 5 s p99 budget, or both say they missed it.
    pub same_withdrawal_verdict: bool,
    /// The drill's withdrawal p99 over the histogram's (≥ 1: the drill starts earlier).
    pub withdrawal_p99_ratio: Option<f64>,
}

/// The quantiles of `waymark_xds_propagation_seconds{hop, path}` in a Prometheus text
/// exposition, interpolated within buckets as Prometheus's `histogram_quantile` does.
pub fn histogram_quantiles(text: &str, hop: &str, path: &str) -> HistogramQuantiles {
    let want = [format!("hop=\"{hop}\""), format!("path=\"{path}\"")];
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("waymark_xds_propagation_seconds_bucket{")?;
            let (labels, value) = rest.split_once("} ")?;
            if !want.iter().all(|w| labels.split(',').any(|l| l == w)) {
                return None;
            }
            let le = labels
                .split(',')
                .find_map(|l| l.strip_prefix("le=\""))?
                .trim_end_matches('"');
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, value.trim().parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let count = buckets.last().map_or(0.0, |b| b.1);
    let q = |q: f64| histogram_quantile(q, &buckets).map(|s| s * 1000.0);
    HistogramQuantiles {
        count,
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        p999_ms: q(0.999),
    }
}

/// Prometheus's `histogram_quantile` over cumulative `(le, count)` buckets sorted by `le`
/// (the last `+Inf`): linear within the bucket the rank falls in, the first bucket
/// starting at 0, and a rank in `+Inf` answered with the highest finite bound.
pub fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            if count == prev.1 {
                return Some(le);
            }
            return Some(prev.0 + (le - prev.0) * (rank - prev.1) / (count - prev.1));
        }
        prev = (le, count);
    }
    Some(prev.0)
}

/// The authority's histogram (scraped `text`) beside the drill's `withdrawal` figures.
pub fn authority_histogram(text: &str, withdrawal: &Propagation) -> AuthorityHistogram {
    let hop = "authority_agent";
    let w = histogram_quantiles(text, hop, "withdrawal");
    let budget_ms = ms(d::WITHDRAWAL_BUDGET_P99) as f64;
    let kept = |p99: Option<f64>| p99.is_some_and(|p| p <= budget_ms);
    AuthorityHistogram {
        same_withdrawal_verdict: kept(withdrawal.p99_ms) == kept(w.p99_ms),
        withdrawal_p99_ratio: match (withdrawal.p99_ms, w.p99_ms) {
            (Some(drill), Some(hist)) if hist > 0.0 => Some(drill / hist),
            _ => None,
        },
        admission: histogram_quantiles(text, hop, "admission"),
        withdrawal: w,
    }
}

/// Propagation figures from per-pair times (`None` = never arrived).
pub fn propagation(times: &[Option<f64>]) -> Propagation {
    let arrived: Vec<f64> = times.iter().flatten().copied().collect();
    let missing = times.len() - arrived.len();
    // A missing pair is slower than any arrival: rank it as infinite.
    let mut ranked = arrived.clone();
    ranked.extend(std::iter::repeat_n(f64::INFINITY, missing));
    let budget_ms = ms(d::WITHDRAWAL_BUDGET_P99) as f64;
    let within = arrived.iter().filter(|t| **t <= budget_ms).count();
    Propagation {
        pairs: times.len(),
        missing,
        p50_ms: quantile(&ranked, 0.5),
        p99_ms: quantile(&ranked, 0.99),
        p999_ms: quantile(&ranked, 0.999),
        max_ms: quantile(&ranked, 1.0),
        within_5s: if times.is_empty() {
            0.0
        } else {
            within as f64 / times.len() as f64
        },
    }
}

/// The verdict against the budget.
pub fn verdict(
    params: &Params,
    burst: &Burst,
    withdrawal: &Propagation,
    shedding: &Shedding,
) -> Verdict {
    let b = &params.budget;
    let mut failures = Vec::new();
    let target = f64::from(params.changes_per_min);
    if burst.offered_per_min < target * b.min_rate_share {
        failures.push(format!(
            "the load generator offered {:.0} changes/min, under {:.0}% of the {target:.0} asked",
            burst.offered_per_min,
            b.min_rate_share * 100.0
        ));
    }
    // Busy: the authority took the claim's rate, or was saturated by it (the generator had
    // to drop changes because as many as it allows were outstanding).
    if !burst.claim_rate_reached && burst.dropped == 0 {
        failures.push(format!(
            "the authority was not busy: {:.0} changes/min accepted and nothing dropped",
            burst.changes_per_min
        ));
    }
    if withdrawal.pairs == 0 {
        failures.push("no withdrawal was measured".into());
    }
    match withdrawal.p99_ms {
        Some(p) if p <= b.withdrawal_p99_ms => {}
        p => failures.push(format!(
            "withdrawal p99 {} over the {} ms budget ({} of {} pairs never arrived)",
            p.map_or("none".into(), |p| format!("{p:.0} ms")),
            b.withdrawal_p99_ms,
            withdrawal.missing,
            withdrawal.pairs
        )),
    }
    match withdrawal.p999_ms {
        Some(p) if p <= b.withdrawal_p999_ms => {}
        p => failures.push(format!(
            "withdrawal p99.9 {} over the {} ms budget",
            p.map_or("none".into(), |p| format!("{p:.0} ms")),
            b.withdrawal_p999_ms
        )),
    }
    if b.shedding_declared && shedding.slow_publishes > 0.0 && !shedding.declared() {
        failures.push(format!(
            "delivery was under pressure ({} Publish commits over {} ms) and the admission \
             path never declared shedding",
            shedding.slow_publishes,
            params.pressure_after().as_millis()
        ));
    }
    Verdict {
        pass: failures.is_empty(),
        failures,
    }
}

/// Runs the drill in `run_dir`.
pub async fn run(mut params: Params, run_dir: &Path) -> anyhow::Result<Report> {
    let waymark = waymark_bin()?;
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let progress = Progress::new("zone-evacuation", Instant::now());
    let epoch = progress.epoch();
    progress.say(&format!("run directory {}", run_dir.display()));
    let nofile = fleet::raise_nofile();
    progress.say(&format!("open files allowed: {nofile}"));
    if params.break_shedding {
        params.limits.shed_admissions = Some(false);
    }
    let shape = params.shape.clone();
    let mut authority = FleetAuthority::new(
        &waymark,
        &run_dir.join("authority"),
        REGION,
        &shape.zones,
        params.limits,
    )?;
    authority.start()?;
    authority
        .wait_ready(START_DEADLINE)
        .await
        .with_context(|| format!("authority log:\n{}", authority.log_tail(30)))?;
    let api = Api::new(authority.http_addr(), REGION);
    let services: Vec<String> = (0..shape.services).map(fleet::service_name).collect();
    api.declare(&services, START_DEADLINE).await?;
    let base = api
        .register_all(fleet::base_specs(&shape), params.concurrency)
        .await?;
    progress.event(&format!(
        "{} services, {} instances registered",
        services.len(),
        base.len()
    ));
    let subs = Subscribers::start(
        authority.xds_addr(),
        fleet::sub_specs(&shape),
        params.seed,
        epoch,
        250,
        START_DEADLINE,
    )
    .await?;
    progress.event(&format!("{} subscribers hold their views", subs.len()));

    let sampler = StateSampler::start(vec![authority.http_addr()], Vec::new(), epoch);
    let result = drive(&params, &api, &base, subs, &progress).await;
    let states = sampler.stop();
    let (offered, burst_log, withdrawn, admitted, shedding, logs, specs, contents) = result?;
    let evacuation = api.get_json("/v1/zones").await.unwrap_or_default();
    // The authority's own histogram, as a scraper would read it at the end of the run.
    let scraped = api.metrics().await.unwrap_or_default();
    authority.kill();

    let mut withdrawal_times = Vec::new();
    for (service, addr, t0) in &withdrawn {
        for (log, spec) in logs.iter().zip(&specs) {
            if spec.services.contains(service) {
                let at = first_holding(log, spec, &contents, service, *t0, |a| !a.contains(addr));
                withdrawal_times.push(at.map(|t| (t - t0) as f64));
            }
        }
    }
    let mut admission_times = Vec::new();
    for (service, addr, t0) in &admitted {
        for (log, spec) in logs.iter().zip(&specs) {
            if spec.services.contains(service) {
                let at = first_holding(log, spec, &contents, service, *t0, |a| a.contains(addr));
                admission_times.push(at.map(|t| (t - t0) as f64));
            }
        }
    }
    let withdrawal = propagation(&withdrawal_times);
    let admission = propagation(&admission_times);
    let burst = burst_figures(&burst_log, &offered, &params);
    let mut verdict = verdict(&params, &burst, &withdrawal, &shedding);
    let authority_histogram = authority_histogram(&scraped, &withdrawal);
    held_to_the_histogram(&mut verdict, &authority_histogram, &withdrawal);
    progress.event(&format!(
        "the authority's histogram: withdrawals p99 {:?} ms over {} releases acknowledged (the drill's p99 {:?} ms)",
        authority_histogram.withdrawal.p99_ms,
        authority_histogram.withdrawal.count,
        withdrawal.p99_ms
    ));
    progress.event(&format!(
        "withdrawals p99 {:?} ms over {} pairs; admissions p99 {:?} ms; {:.0} changes/min; shedding seen {}",
        withdrawal.p99_ms, withdrawal.pairs, admission.p99_ms, burst.changes_per_min, shedding.seen_shedding
    ));
    let report = Report {
        drill: "zone-evacuation",
        params: params.clone(),
        run_dir: run_dir.to_path_buf(),
        subscribers: specs.len(),
        burst,
        withdrawal,
        admission,
        shedding,
        evacuation,
        authority_histogram,
        verdict,
        plots: Plots {
            states,
            errors: Vec::new(),
            distributions: vec![
                Distribution {
                    name: "withdrawal propagation per subscriber".into(),
                    unit: "ms".into(),
                    values: withdrawal_times.iter().flatten().copied().collect(),
                },
                Distribution {
                    name: "admission propagation per subscriber".into(),
                    unit: "ms".into(),
                    values: admission_times.iter().flatten().copied().collect(),
                },
            ],
            events: progress.events(),
        },
    };
    report::finish(run_dir, &report)?;
    Ok(report)
}

/// The authority's histogram must have timed withdrawals and agree with the drill's
/// budget verdict: a metric that says otherwise than what callers saw cannot be alerted on.
fn held_to_the_histogram(verdict: &mut Verdict, h: &AuthorityHistogram, withdrawal: &Propagation) {
    let mut failed = |f: String| {
        verdict.pass = false;
        verdict.failures.push(f);
    };
    if withdrawal.pairs > 0 && h.withdrawal.count == 0.0 {
        failed("the authority's propagation histogram timed no withdrawal".into());
    } else if !h.same_withdrawal_verdict {
        failed(format!(
            "the authority's histogram (withdrawal p99 {:?} ms) and the drill (p99 {:?} ms) disagree on the 5 s budget",
            h.withdrawal.p99_ms, withdrawal.p99_ms
        ));
    }
}

/// Figures of the burst's changes.
pub fn burst_figures(changes: &[Change], offered: &Offered, params: &Params) -> Burst {
    let burst_s = params.burst_s;
    let count = |k: Kind| changes.iter().filter(|c| c.kind == k && c.ok).count();
    let answers: Vec<f64> = changes
        .iter()
        .map(|c| c.answered_ms.saturating_sub(c.sent_ms) as f64)
        .collect();
    let ok = changes.iter().filter(|c| c.ok).count();
    // The rate over the burst as scheduled (a burst that answered late ran longer).
    let span_ms = changes
        .iter()
        .map(|c| c.answered_ms)
        .max()
        .zip(changes.iter().map(|c| c.sent_ms).min())
        .map_or(0, |(end, start)| end - start)
        .max(burst_s * 1_000);
    let per_min = ok as f64 * 60_000.0 / span_ms.max(1) as f64;
    Burst {
        offered: offered.changes,
        offered_per_min: offered.changes as f64 * 60_000.0 / offered.took_ms.max(1) as f64,
        dropped: offered.dropped,
        claim_rate_reached: per_min
            >= f64::from(params.changes_per_min) * params.budget.min_rate_share,
        changes: changes.len(),
        failed: changes.len() - ok,
        registrations: count(Kind::Register),
        deregistrations: count(Kind::Deregister),
        withdrawals: count(Kind::Withdraw),
        changes_per_min: per_min,
        answer_p50_ms: quantile(&answers, 0.5).unwrap_or(0.0),
        answer_p99_ms: quantile(&answers, 0.99).unwrap_or(0.0),
    }
}

type Followed = Vec<(String, SocketAddr, u64)>;
/// What the load generator did.
#[derive(Debug, Clone, Default)]
pub struct Offered {
    pub changes: usize,
    pub dropped: usize,
    /// How long offering took (the schedule's length if the generator kept up).
    pub took_ms: u64,
}

type Driven = (
    Offered,
    Vec<Change>,
    Followed,
    Followed,
    Shedding,
    Vec<SubLog>,
    Vec<fleet::SubSpec>,
    fleet::Contents,
);

/// The burst, the evacuation and the withdrawals; then stops the subscribers.
async fn drive(
    params: &Params,
    api: &Api,
    base: &[fleet::Instance],
    subs: Subscribers,
    progress: &Progress,
) -> anyhow::Result<Driven> {
    let epoch = progress.epoch();
    let before = api.metrics().await.unwrap_or_default();
    let episodes_before = fleet::metric(&before, "waymark_shed_episodes_total").unwrap_or(0.0);
    let slow_before = fleet::slow_publishes(&before, params.pressure_after()).unwrap_or(0.0);
    let mut rng = Rng::new(params.seed);
    // The measured withdrawals: base instances of the evacuated zone, in random order.
    let mut victims: Vec<&fleet::Instance> =
        base.iter().filter(|i| i.zone == params.zone).collect();
    for i in (1..victims.len()).rev() {
        victims.swap(i, rng.below(i as u64 + 1) as usize);
    }
    victims.truncate(params.withdrawals);
    let other_zones: Vec<String> = params
        .shape
        .zones
        .iter()
        .filter(|z| **z != params.zone)
        .cloned()
        .collect();

    let changes: Arc<Mutex<Vec<Change>>> = Arc::default();
    let withdrawn: Arc<Mutex<Followed>> = Arc::default();
    let admitted: Arc<Mutex<Followed>> = Arc::default();
    let live: Arc<Mutex<VecDeque<String>>> = Arc::default();
    let limit = Arc::new(tokio::sync::Semaphore::new(params.concurrency));
    let total = (u64::from(params.changes_per_min) * params.burst_s / 60) as usize;
    let every = Duration::from_secs_f64(60.0 / f64::from(params.changes_per_min));
    let withdraw_every = total / params.withdrawals.max(1);
    let burst_start = Instant::now();
    let metrics = tokio::spawn(watch_shedding(api.clone(), burst_start, params.burst_s));
    progress.event(&format!(
        "burst: {total} changes over {} s ({} /min), {} withdrawals of zone {}",
        params.burst_s,
        params.changes_per_min,
        victims.len(),
        params.zone
    ));
    let mut evacuated = false;
    let mut tasks = tokio::task::JoinSet::new();
    let mut next_addr = 1_000_000usize;
    let mut victims = victims.into_iter();
    let mut dropped = 0usize;
    for n in 0..total {
        tokio::time::sleep_until(burst_start + every * n as u32).await;
        if !evacuated && burst_start.elapsed() >= Duration::from_secs(2) {
            evacuated = true;
            match api.evacuate(&params.zone).await {
                Ok(v) => progress.event(&format!("zone {} evacuation asked: {v}", params.zone)),
                Err(e) => progress.event(&format!("evacuation refused: {e:#}")),
            }
        }
        let (api, changes) = (api.clone(), Arc::clone(&changes));
        let sent_ms = ms(epoch.elapsed());
        // Withdrawals are sent on schedule whatever is in flight; the rest of the burst
        // is open-loop with at most `concurrency` requests outstanding, and a change whose
        // turn comes while the authority still holds that many is dropped (counted).
        if withdraw_every > 0
            && n % withdraw_every == withdraw_every / 2
            && let Some(v) = victims.next()
        {
            let (id, service, addr) = (v.id.clone(), v.service.clone(), v.addr);
            let withdrawn = Arc::clone(&withdrawn);
            tasks.spawn(async move {
                let ok = api.deregister(&id).await.is_ok();
                if ok {
                    withdrawn
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((service, addr, sent_ms));
                }
                push(&changes, Kind::Withdraw, sent_ms, epoch, ok);
            });
            continue;
        }
        let Ok(permit) = Arc::clone(&limit).try_acquire_owned() else {
            dropped += 1;
            continue;
        };
        let old = {
            let mut l = live.lock().unwrap_or_else(PoisonError::into_inner);
            if n % 2 == 1 { l.pop_front() } else { None }
        };
        if let Some(id) = old {
            tasks.spawn(async move {
                let ok = api.deregister(&id).await.is_ok();
                push(&changes, Kind::Deregister, sent_ms, epoch, ok);
                drop(permit);
            });
            continue;
        }
        next_addr += 1;
        let addr = fleet::address(next_addr);
        let service = fleet::service_name(rng.below(params.shape.services as u64) as usize);
        let zone = other_zones[rng.below(other_zones.len() as u64) as usize].clone();
        let followed = n % params.admission_sample_every.max(1) == 0;
        let (live, admitted) = (Arc::clone(&live), Arc::clone(&admitted));
        tasks.spawn(async move {
            let r = api.register(&service, &zone, addr).await;
            let ok = r.is_ok();
            if let Ok(id) = r {
                // A followed admission stays registered (the churn never removes it), so
                // its arrival can be waited for.
                if !followed {
                    live.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push_back(id);
                } else {
                    admitted
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((service, addr, sent_ms));
                }
            }
            push(&changes, Kind::Register, sent_ms, epoch, ok);
            drop(permit);
        });
    }
    let offered_ms = ms(burst_start.elapsed());
    while tasks.join_next().await.is_some() {}
    progress.event(&format!(
        "{total} changes offered in {offered_ms} ms; {dropped} dropped while {} were outstanding",
        params.concurrency
    ));
    progress.event(&format!(
        "burst over after {:.1} s; watching {} s more",
        burst_start.elapsed().as_secs_f64(),
        params.settle_s
    ));
    let (samples, shedding_samples) = metrics.await.unwrap_or((0, 0));
    tokio::time::sleep(Duration::from_secs(params.settle_s)).await;
    let after = api.metrics().await.unwrap_or_default();
    let episodes_after =
        fleet::metric(&after, "waymark_shed_episodes_total").unwrap_or(episodes_before);
    let slow_publishes =
        fleet::slow_publishes(&after, params.pressure_after()).map_or(0.0, |s| s - slow_before);
    let specs = subs.specs().to_vec();
    let (logs, contents) = subs.stop();
    let take = |m: &Arc<Mutex<Followed>>| {
        std::mem::take(&mut *m.lock().unwrap_or_else(PoisonError::into_inner))
    };
    let changes = std::mem::take(&mut *changes.lock().unwrap_or_else(PoisonError::into_inner));
    Ok((
        Offered {
            changes: total,
            dropped,
            took_ms: offered_ms,
        },
        changes,
        take(&withdrawn),
        take(&admitted),
        Shedding {
            episodes_before,
            episodes_after,
            seen_shedding: shedding_samples > 0,
            shedding_share: if samples == 0 {
                0.0
            } else {
                shedding_samples as f64 / samples as f64
            },
            slow_publishes,
        },
        logs,
        specs,
        contents,
    ))
}

fn push(changes: &Mutex<Vec<Change>>, kind: Kind, sent_ms: u64, epoch: Instant, ok: bool) {
    let c = Change {
        kind,
        sent_ms,
        answered_ms: ms(epoch.elapsed()),
        ok,
    };
    changes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(c);
}

/// Samples `waymark_shedding` every 250 ms for the burst and a little after: (samples, how
/// many said 1).
async fn watch_shedding(api: Api, start: Instant, burst_s: u64) -> (u64, u64) {
    let (mut samples, mut shedding) = (0, 0);
    let until = start + Duration::from_secs(burst_s + 2);
    while Instant::now() < until {
        if let Some(v) = api
            .metrics()
            .await
            .ok()
            .and_then(|m| fleet::metric(&m, "waymark_shedding"))
        {
            samples += 1;
            if v >= 1.0 {
                shedding += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (samples, shedding)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shedding(seen: bool) -> Shedding {
        Shedding {
            episodes_before: 0.0,
            episodes_after: if seen { 1.0 } else { 0.0 },
            seen_shedding: seen,
            shedding_share: 0.0,
            slow_publishes: 4.0,
        }
    }

    fn burst(per_min: f64) -> Burst {
        Burst {
            offered: 100,
            offered_per_min: 40_000.0,
            dropped: 0,
            claim_rate_reached: per_min >= 36_000.0,
            changes: 100,
            failed: 0,
            registrations: 50,
            deregistrations: 40,
            withdrawals: 10,
            changes_per_min: per_min,
            answer_p50_ms: 1.0,
            answer_p99_ms: 2.0,
        }
    }

    #[test]
    fn the_authoritys_histogram_is_read_as_prometheus_reads_it() {
        // Goal: quantiles interpolate within buckets as `histogram_quantile` does, only
        // the asked hop and path count, and the verdicts are compared against the budget.
        let text = "\
waymark_xds_propagation_seconds_bucket{hop=\"authority_agent\",path=\"withdrawal\",le=\"0.05\"} 0
waymark_xds_propagation_seconds_bucket{hop=\"authority_agent\",path=\"withdrawal\",le=\"0.1\"} 50
waymark_xds_propagation_seconds_bucket{hop=\"authority_agent\",path=\"withdrawal\",le=\"5.0\"} 100
waymark_xds_propagation_seconds_bucket{hop=\"authority_agent\",path=\"withdrawal\",le=\"+Inf\"} 100
waymark_xds_propagation_seconds_bucket{hop=\"agent_sidecar\",path=\"withdrawal\",le=\"+Inf\"} 7
";
        let h = histogram_quantiles(text, "authority_agent", "withdrawal");
        assert_eq!(h.count, 100.0);
        // Rank 50 ends the (0.05, 0.1] bucket; rank 99 is 49/50 into (0.1, 5].
        assert!((h.p50_ms.unwrap() - 100.0).abs() < 1e-9, "{h:?}");
        assert!(
            (h.p99_ms.unwrap() - (100.0 + 4900.0 * 49.0 / 50.0)).abs() < 1e-6,
            "{h:?}"
        );
        assert_eq!(
            histogram_quantiles(text, "authority_agent", "admission").count,
            0.0
        );
        assert_eq!(
            histogram_quantile(0.99, &[(1.0, 0.0), (f64::INFINITY, 3.0)]),
            Some(1.0)
        );
        let drill = |p99: f64| Propagation {
            pairs: 10,
            missing: 0,
            p50_ms: Some(p99),
            p99_ms: Some(p99),
            p999_ms: Some(p99),
            max_ms: Some(p99),
            within_5s: 1.0,
        };
        assert!(authority_histogram(text, &drill(4_990.0)).same_withdrawal_verdict);
        let late = authority_histogram(text, &drill(6_000.0));
        assert!(!late.same_withdrawal_verdict);
        let mut v = Verdict {
            pass: true,
            failures: Vec::new(),
        };
        held_to_the_histogram(&mut v, &late, &drill(6_000.0));
        assert!(!v.pass && v.failures[0].contains("disagree"), "{v:?}");
    }

    #[test]
    fn propagation_ranks_missing_pairs_last() {
        let mut times: Vec<Option<f64>> = (1..=999).map(|i| Some(f64::from(i))).collect();
        times.push(None);
        let p = propagation(&times);
        assert_eq!((p.pairs, p.missing), (1_000, 1));
        assert_eq!(p.p99_ms, Some(990.0));
        assert_eq!(p.max_ms, Some(f64::INFINITY));
        assert!((p.within_5s - 0.999).abs() < 1e-9);
    }

    #[test]
    fn the_verdict_needs_the_budget_the_rate_and_a_declaration() {
        let params = Params::for_scale(Scale::Short);
        let fast: Vec<Option<f64>> = (0..1_000).map(|i| Some(f64::from(i))).collect();
        let ok = propagation(&fast);
        assert!(verdict(&params, &burst(40_000.0), &ok, &shedding(true)).pass);
        let v = verdict(&params, &burst(40_000.0), &ok, &shedding(false));
        assert!(!v.pass && v.failures[0].contains("shedding"));
        // Delivery never under pressure: nothing to shed, nothing to declare.
        let calm = Shedding {
            slow_publishes: 0.0,
            ..shedding(false)
        };
        assert!(verdict(&params, &burst(40_000.0), &ok, &calm).pass);
        // Not busy: took less than the claim's rate and never saturated.
        let v = verdict(&params, &burst(20_000.0), &ok, &shedding(true));
        assert!(!v.pass && v.failures[0].contains("not busy"));
        // Saturated (changes dropped) at a lower accepted rate: busy, it counts.
        let saturated = Burst {
            dropped: 50,
            ..burst(5_000.0)
        };
        assert!(verdict(&params, &saturated, &ok, &shedding(true)).pass);
        let lazy = Burst {
            offered_per_min: 10_000.0,
            ..burst(40_000.0)
        };
        let v = verdict(&params, &lazy, &ok, &shedding(true));
        assert!(!v.pass && v.failures[0].contains("offered"));
        // 2% of pairs at 6 s: over the 5 s p99.
        let slow: Vec<Option<f64>> = (0..1_000)
            .map(|i| Some(if i < 20 { 6_000.0 } else { 100.0 }))
            .collect();
        let v = verdict(
            &params,
            &burst(40_000.0),
            &propagation(&slow),
            &shedding(true),
        );
        assert!(!v.pass && v.failures[0].contains("p99"));
    }

    #[test]
    fn the_burst_rate_counts_answered_changes_over_the_burst() {
        let c = |kind, sent_ms, ok| Change {
            kind,
            sent_ms,
            answered_ms: sent_ms + 10,
            ok,
        };
        let changes = vec![
            c(Kind::Register, 0, true),
            c(Kind::Deregister, 500, true),
            c(Kind::Withdraw, 900, true),
            c(Kind::Register, 990, false),
        ];
        let offered = Offered {
            changes: 5,
            dropped: 1,
            took_ms: 1_000,
        };
        let params = Params {
            burst_s: 1,
            ..Params::for_scale(Scale::Short)
        };
        let b = burst_figures(&changes, &offered, &params);
        assert_eq!((b.offered, b.dropped), (5, 1));
        assert!((b.offered_per_min - 300.0).abs() < 1e-9);
        assert!(!b.claim_rate_reached);
        assert_eq!(
            (b.registrations, b.deregistrations, b.withdrawals, b.failed),
            (1, 1, 1, 1)
        );
        assert!((b.changes_per_min - 3.0 * 60.0).abs() < 1e-9);
    }
}
