//! `xds-restart`: the xDS tier is restarted with the fleet's subscriptions attached. The
//! authority here is a single member, so its xDS tier is that member: it is SIGKILLed and
//! started again (same data, same ports) while light registration churn keeps versions
//! moving. The subscribers are the node agent's own Delta client
//! (`waymark_xds::client::XdsClient`: full-jitter backoff honouring the server's retry
//! hint). Measured from the subscribers' side:
//!
//! - reconnections completed per 10 s window (a stream opened after the kill), as a share
//!   of the subscribers: at most 5% in every window (ADR-13's reconnection admission on the
//!   server, jitter on the clients);
//! - every subscriber's received versions per resource never go backwards across the
//!   restart (the client keeps its last-known-good while disconnected, and resumes with
//!   `initial_resource_versions`).
//!
//! Attaching the fleet in the first place is setup: the first start lets everyone in (a
//! raised `reconnect_floor`); the restart runs the design's defaults (5% per 10 s, floor 10)
//! unless the drill is broken on purpose (`reconnect_permille = 1000`: no admission).
//! At 5% per 10 s a whole fleet needs 200 s to come back: the short run watches the first
//! minute, the full run waits for every subscriber.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use tokio::time::Instant;
use waymark_core::defaults as d;

use super::Scale;
use super::figures::Verdict;
use super::report::{self, Distribution, Plots, Progress, StateSampler};
use crate::harness::fleet::{self, Api, FleetAuthority, Limits, Shape, SubLog, Subscribers};
use crate::harness::waymark_bin;
use crate::rng::SplitMix64 as Rng;
use crate::traffic::ms;

const REGION: &str = "r1";
const START_DEADLINE: Duration = Duration::from_secs(90);
/// The reconnection window the cap is counted over ([`d::RECONNECT_WINDOW`]).
pub const WINDOW_MS: u64 = d::RECONNECT_WINDOW.as_millis() as u64;
/// How much later than the server admitted it a subscriber may stamp its reconnection,
/// beyond the others' delay (its first response has to arrive). The server holds the cap
/// over any 10 s of admissions; what the subscribers see is blurred by this much, so the
/// verdict counts every interval of `WINDOW_MS - DELIVERY_SLACK_MS`. A guard that let a
/// burst through is still seen: its excess lands within milliseconds.
pub const DELIVERY_SLACK_MS: u64 = 500;

/// What the drill is run with.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub scale: Scale,
    pub seed: u64,
    pub subscriptions: usize,
    pub services: usize,
    pub instances: usize,
    /// Changes per second kept up for the whole run (so versions move across the restart).
    pub churn_per_sec: u32,
    /// Steady state watched before the kill.
    pub before_s: u64,
    /// How long the member stays down.
    pub down_s: u64,
    /// How long reconnections are watched after the restart; 0 = until every subscriber is
    /// back (bounded by `watch_max_s`).
    pub watch_s: u64,
    pub watch_max_s: u64,
    /// At most this share of the subscribers reconnect in any 10 s window.
    pub max_share_per_window: f64,
    /// Break the property on purpose: reconnection admission off.
    pub break_reconnect_admission: bool,
}

impl Params {
    pub fn for_scale(scale: Scale) -> Self {
        let (subscriptions, watch_s) = match scale {
            Scale::Short => (500, 60),
            Scale::Full => (2_000, 0),
        };
        Self {
            scale,
            seed: 9,
            subscriptions,
            services: 40,
            instances: 2_000,
            churn_per_sec: 10,
            before_s: 5,
            down_s: 3,
            watch_s,
            watch_max_s: 420,
            max_share_per_window: d::RECONNECT_PERMILLE.as_f64(),
            break_reconnect_admission: false,
        }
    }
}

/// Reconnection figures.
#[derive(Debug, Clone, Serialize)]
pub struct Reconnections {
    /// Subscribers that opened a stream again after the kill.
    pub reconnected: usize,
    /// Completed reconnections in consecutive 10 s windows from the first one.
    pub per_window: Vec<usize>,
    /// The most in any of those windows, as a share of the subscribers (what the verdict
    /// holds).
    pub max_window_share: f64,
    /// The most in any 10 s interval, wherever it starts. Stricter than the windows, and
    /// blurred by delivery: a subscriber stamps its reconnection a little after the server
    /// admitted it, so two admissions 10 s apart at the server can land 9.9 s apart here.
    pub max_sliding: usize,
    /// That as a share of the subscribers.
    pub max_sliding_share: f64,
    /// The most in any interval of `WINDOW_MS - DELIVERY_SLACK_MS`, as a share of the
    /// subscribers: what the verdict holds to the cap.
    pub max_checked_share: f64,
    /// From the restart until the last subscriber was back, if all were.
    pub all_back_ms: Option<u64>,
    /// Per subscriber, ms from the restart to its reconnection.
    pub times_ms: Vec<u64>,
}

/// Reconnection figures from the stream-open stamps after `kill_ms` (the first stamp of each
/// subscriber is its initial connect, before the kill).
pub fn reconnections(logs: &[SubLog], kill_ms: u64, restart_ms: u64) -> Reconnections {
    let mut times: Vec<u64> = logs
        .iter()
        .filter_map(|l| l.streams_opened_ms.iter().find(|t| **t > kill_ms).copied())
        .collect();
    times.sort_unstable();
    let mut per_window = Vec::new();
    if let Some(first) = times.first() {
        for t in &times {
            let w = ((t - first) / WINDOW_MS) as usize;
            if per_window.len() <= w {
                per_window.resize(w + 1, 0);
            }
            per_window[w] += 1;
        }
    }
    let most_within = |window: u64| {
        let (mut most, mut lo) = (0, 0);
        for hi in 0..times.len() {
            while times[hi] - times[lo] >= window {
                lo += 1;
            }
            most = usize::max(most, hi + 1 - lo);
        }
        most
    };
    let max_sliding = most_within(WINDOW_MS);
    let max_checked = most_within(WINDOW_MS - DELIVERY_SLACK_MS);
    let n = logs.len().max(1) as f64;
    let all_back_ms = (times.len() == logs.len())
        .then(|| times.last().map(|t| t.saturating_sub(restart_ms)))
        .flatten();
    Reconnections {
        reconnected: times.len(),
        max_window_share: per_window.iter().copied().max().unwrap_or(0) as f64 / n,
        max_sliding_share: max_sliding as f64 / n,
        max_checked_share: max_checked as f64 / n,
        per_window,
        max_sliding,
        all_back_ms,
        times_ms: times.iter().map(|t| t.saturating_sub(restart_ms)).collect(),
    }
}

/// Views that went backwards.
#[derive(Debug, Clone, Serialize)]
pub struct Regressions {
    pub count: usize,
    /// The first few: (subscriber, resource index, held, then received).
    pub examples: Vec<(usize, u16, u64, u64)>,
    /// Versions received after the restart (so monotonicity was tested across it).
    pub versions_after_restart: usize,
}

/// The verdict: reconnections within the cap in every window, some progress (the tier came
/// back and let clients in), every subscriber back when the run waited for all, and no
/// regression.
pub fn verdict(
    params: &Params,
    r: &Reconnections,
    g: &Regressions,
    waited_for_all: bool,
) -> Verdict {
    let mut failures = Vec::new();
    if r.max_checked_share > params.max_share_per_window {
        failures.push(format!(
            "{:.1}% of the subscribers reconnected in one {} s window (counted over {} ms for \
             delivery blur; cap {:.1}%): {:?}",
            r.max_checked_share * 100.0,
            WINDOW_MS / 1_000,
            WINDOW_MS - DELIVERY_SLACK_MS,
            params.max_share_per_window * 100.0,
            r.per_window
        ));
    }
    if r.reconnected == 0 {
        failures.push("no subscriber reconnected".into());
    }
    if waited_for_all && r.all_back_ms.is_none() {
        failures.push(format!(
            "only {} of {} subscribers reconnected within {} s",
            r.reconnected, params.subscriptions, params.watch_max_s
        ));
    }
    if g.count > 0 {
        failures.push(format!(
            "{} subscriber views went backwards, e.g. {:?}",
            g.count, g.examples
        ));
    }
    if g.versions_after_restart == 0 {
        failures.push("no version reached a subscriber after the restart".into());
    }
    Verdict {
        pass: failures.is_empty(),
        failures,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub drill: &'static str,
    pub params: Params,
    pub run_dir: PathBuf,
    /// ms since the drill's epoch.
    pub kill_ms: u64,
    pub restart_ms: u64,
    pub ready_ms: u64,
    /// The limits of the restarted member.
    pub limits_after_restart: Limits,
    pub reconnections: Reconnections,
    pub regressions: Regressions,
    /// Streams the restarted member refused (from its log: retry hints sent).
    pub refused_streams: usize,
    pub verdict: Verdict,
    pub plots: Plots,
}

pub async fn run(params: Params, run_dir: &Path) -> anyhow::Result<Report> {
    let waymark = waymark_bin()?;
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let progress = Progress::new("xds-restart", Instant::now());
    let epoch = progress.epoch();
    progress.say(&format!("run directory {}", run_dir.display()));
    let nofile = fleet::raise_nofile();
    progress.say(&format!("open files allowed: {nofile}"));
    let shape = Shape {
        services: params.services,
        instances: params.instances,
        zones: ["z1", "z2", "z3"].iter().map(|z| (*z).to_owned()).collect(),
        subscriptions: params.subscriptions,
        services_per_subscriber: 1,
    };
    let attach = Limits {
        reconnect_floor: Some(u32::try_from(params.subscriptions)?),
        ..Limits::default()
    };
    let mut authority = FleetAuthority::new(
        &waymark,
        &run_dir.join("authority"),
        REGION,
        &shape.zones,
        attach,
    )?;
    authority.start()?;
    authority
        .wait_ready(START_DEADLINE)
        .await
        .with_context(|| format!("authority log:\n{}", authority.log_tail(30)))?;
    let api = Api::new(authority.http_addr(), REGION);
    let services: Vec<String> = (0..shape.services).map(fleet::service_name).collect();
    api.declare(&services, START_DEADLINE).await?;
    let base = api.register_all(fleet::base_specs(&shape), 64).await?;
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
    let stop = Arc::new(AtomicBool::new(false));
    let churn = tokio::spawn(churn(
        api.clone(),
        shape.clone(),
        params.churn_per_sec,
        params.seed,
        Arc::clone(&stop),
    ));
    tokio::time::sleep(Duration::from_secs(params.before_s)).await;

    // The restart runs the design's limits (or none, when broken on purpose). The
    // subscribers share one address and have no certificates, so the tier counts them as
    // one client: the population they are is said explicitly, as an operator would.
    let population = Some(u32::try_from(params.subscriptions)?);
    let after = if params.break_reconnect_admission {
        Limits {
            reconnect_permille: Some(1000),
            reconnect_expected_clients: population,
            ..Limits::default()
        }
    } else {
        Limits {
            reconnect_expected_clients: population,
            ..Limits::default()
        }
    };
    authority.set_limits(after)?;
    let kill_ms = ms(epoch.elapsed());
    authority.kill();
    progress.event(&format!(
        "authority (the xDS tier) SIGKILLed with {} streams attached",
        subs.connected()
    ));
    tokio::time::sleep(Duration::from_secs(params.down_s)).await;
    let restart_ms = ms(epoch.elapsed());
    authority.start()?;
    authority
        .wait_ready(START_DEADLINE)
        .await
        .with_context(|| format!("authority log:\n{}", authority.log_tail(30)))?;
    let ready_ms = ms(epoch.elapsed());
    progress.event(&format!(
        "authority restarted, ready after {} ms",
        ready_ms - restart_ms
    ));

    let waited_for_all = params.watch_s == 0;
    let watch = if waited_for_all {
        params.watch_max_s
    } else {
        params.watch_s
    };
    let until = Instant::now() + Duration::from_secs(watch);
    let mut last_say = Instant::now();
    while Instant::now() < until {
        let back = subs.connected();
        if last_say.elapsed() >= Duration::from_secs(10) {
            progress.event(&format!("{back} of {} subscribers connected", subs.len()));
            last_say = Instant::now();
        }
        if waited_for_all && back == subs.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // One more second of churn so the last reconnected also see a new version.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let _ = churn.await;
    let states = sampler.stop();
    let (logs, _contents) = subs.stop();
    authority.kill();
    let log = std::fs::read_to_string(run_dir.join("authority").join("authority.log"))
        .unwrap_or_default();
    let refused_streams = log
        .matches("stream refused by reconnection admission")
        .count();

    let reconnections = reconnections(&logs, kill_ms, restart_ms);
    let found = fleet::regressions(&logs);
    let versions_after_restart = logs
        .iter()
        .map(|l| l.seen.iter().filter(|s| s.t_ms > restart_ms).count())
        .sum();
    let regressions = Regressions {
        count: found.len(),
        examples: found.iter().take(5).copied().collect(),
        versions_after_restart,
    };
    let verdict = verdict(&params, &reconnections, &regressions, waited_for_all);
    progress.event(&format!(
        "{} reconnected, per 10 s {:?} (max {:.2}%, {:.2}% in any 10 s); {} regressions; {} refused",
        reconnections.reconnected,
        reconnections.per_window,
        reconnections.max_window_share * 100.0,
        reconnections.max_sliding_share * 100.0,
        regressions.count,
        refused_streams
    ));
    let report = Report {
        drill: "xds-restart",
        params,
        run_dir: run_dir.to_path_buf(),
        kill_ms,
        restart_ms,
        ready_ms,
        limits_after_restart: after,
        reconnections: reconnections.clone(),
        regressions,
        refused_streams,
        verdict,
        plots: Plots {
            states,
            errors: Vec::new(),
            distributions: vec![Distribution {
                name: "reconnection time after the restart per subscriber".into(),
                unit: "ms".into(),
                values: reconnections.times_ms.iter().map(|t| *t as f64).collect(),
            }],
            events: progress.events(),
        },
    };
    report::finish(run_dir, &report)?;
    Ok(report)
}

/// Registrations and deregistrations at `per_sec` until stopped; failures (the authority
/// is down) are ignored.
async fn churn(api: Api, shape: Shape, per_sec: u32, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = Rng::new(seed ^ 0xC0FFEE);
    let mut live: std::collections::VecDeque<String> = Default::default();
    let mut next = 2_000_000usize;
    let every = Duration::from_secs_f64(1.0 / f64::from(per_sec.max(1)));
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(every).await;
        if live.len() > 20 && rng.chance(500) {
            if let Some(id) = live.pop_front() {
                let _ = tokio::time::timeout(Duration::from_secs(2), api.deregister(&id)).await;
            }
            continue;
        }
        next += 1;
        let service = fleet::service_name(rng.below(shape.services as u64) as usize);
        let zone = &shape.zones[rng.below(shape.zones.len() as u64) as usize];
        if let Ok(Ok(id)) = tokio::time::timeout(
            Duration::from_secs(2),
            api.register(&service, zone, fleet::address(next)),
        )
        .await
        {
            live.push_back(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(opened: &[u64]) -> SubLog {
        SubLog {
            streams_opened_ms: opened.to_vec(),
            ..SubLog::default()
        }
    }

    #[test]
    fn reconnections_are_counted_per_window_from_the_first() {
        // 20 subscribers connected at 0; killed at 1,000; back at various times.
        let mut logs: Vec<SubLog> = (0..20).map(|i| log(&[0, 5_000 + i * 1_000])).collect();
        logs.push(log(&[0])); // never back
        let r = reconnections(&logs, 1_000, 4_000);
        assert_eq!(r.reconnected, 20);
        assert_eq!(r.per_window, vec![10, 10]);
        assert_eq!(r.max_sliding, 10);
        assert!((r.max_window_share - 10.0 / 21.0).abs() < 1e-9);
        assert!((r.max_sliding_share - 10.0 / 21.0).abs() < 1e-9);
        assert!((r.max_checked_share - 10.0 / 21.0).abs() < 1e-9);
        assert_eq!(r.all_back_ms, None);
        assert_eq!(r.times_ms[0], 1_000);
    }

    #[test]
    fn the_verdict_holds_the_cap_and_monotonic_views() {
        let params = Params::for_scale(Scale::Short);
        let spread: Vec<SubLog> = (0..500).map(|i| log(&[0, 2_000 + i * 400])).collect();
        let r = reconnections(&spread, 1_000, 1_500);
        let cap = params.max_share_per_window;
        assert!(r.max_window_share <= cap, "{:?}", r.per_window);
        assert!(r.max_checked_share <= cap, "{:?}", r.per_window);
        let clean = Regressions {
            count: 0,
            examples: Vec::new(),
            versions_after_restart: 10,
        };
        assert!(verdict(&params, &r, &clean, false).pass);
        let storm: Vec<SubLog> = (0..500).map(|i| log(&[0, 2_000 + i])).collect();
        let v = verdict(&params, &reconnections(&storm, 1_000, 1_500), &clean, false);
        assert!(
            !v.pass && v.failures[0].contains("in one 10 s window"),
            "{:?}",
            v.failures
        );
        // The cap held at the server (25 of 500 in any 10 s of admissions: the 26th came
        // 10 s after the first), but the first one's response was slower to arrive than
        // the 26th's, so the subscribers saw 26 within 10 s: not a breach.
        let mut blurred: Vec<SubLog> = (0..25).map(|i| log(&[0, 2_000 + i * 10])).collect();
        blurred[0] = log(&[0, 2_300]);
        blurred.push(log(&[0, 12_005]));
        blurred.extend((26..500).map(|_| log(&[0])));
        let r = reconnections(&blurred, 1_000, 1_500);
        assert_eq!(r.per_window[0], 26);
        assert!(verdict(&params, &r, &clean, false).pass);
        let back = Regressions {
            count: 1,
            examples: vec![(3, 0, 9, 8)],
            versions_after_restart: 10,
        };
        assert!(!verdict(&params, &r, &back, false).pass);
        // Waiting for all, but some never came back.
        let mut partial = spread.clone();
        partial.push(log(&[0]));
        let r = reconnections(&partial, 1_000, 1_500);
        assert!(!verdict(&params, &r, &clean, true).pass);
    }
}
