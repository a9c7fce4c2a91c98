//! `outage`: the whole authority is SIGKILLed under steady traffic through Envoy → node
//! agent → backends. Mid-outage the node agent, then Envoy, are SIGKILLed and restarted;
//! they must come back from the agent's sled cache without the authority. The error rate
//! during the outage (and after the authority returns) must stay within a small margin of
//! the pre-outage baseline.
//!
//! Requests alive while Envoy itself is down cannot be served by anyone: they are counted
//! apart (`envoy_restart`) and the time until Envoy routes again is held to a budget.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use tokio::time::Instant;
use waymark_core::defaults as d;

use super::Scale;
use super::figures::{self, Budget, PhaseFigures, Verdict, Window};
use super::report::{self, Plots, Progress, StateSampler};
use crate::harness::agent::AgentProc;
use crate::harness::authority::AuthorityProc;
use crate::harness::backends::DemoFleet;
use crate::harness::envoy::EnvoyProc;
use crate::harness::{envoy_bin, wait_until, waymark_bin};
use crate::traffic::{Generator, ms};

const REGION: &str = "r1";
const ZONE: &str = "z1";
const NODE: &str = "n1";
const SERVICE: &str = "web";
/// How long any process may take to become ready (CI compiles on the same cores).
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How long the break (`--break-cache`) waits for what cannot happen.
const BROKEN_DEADLINE: Duration = Duration::from_secs(10);
/// A request with no answer within this is a failure.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What the drill is run with.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub scale: Scale,
    /// How long the authority stays down.
    pub outage_s: u64,
    /// Steady traffic before the outage (the baseline) and after the authority returns.
    pub baseline_s: u64,
    pub after_s: u64,
    /// Requests per second through Envoy.
    pub rate: u32,
    pub backends: usize,
    /// Recorded for uniformity with the other drills: this drill makes no random choice.
    pub seed: u64,
    pub budget: Budget,
    /// Break the property on purpose: delete the agent's cache before it restarts, to show
    /// the verdict fails when routing cannot come from disk.
    pub break_cache: bool,
}

impl Params {
    /// The defaults of a scale: full is the claim's 60 minutes ([`d::STATIC_SERVING_MIN`]).
    pub fn for_scale(scale: Scale) -> Self {
        let (outage_s, baseline_s, after_s) = match scale {
            Scale::Short => (60, 15, 15),
            Scale::Full => (d::STATIC_SERVING_MIN.as_secs(), 60, 60),
        };
        Self {
            scale,
            outage_s,
            baseline_s,
            after_s,
            rate: 20,
            backends: 4,
            seed: 1,
            budget: Budget {
                error_rate_margin: 0.01,
                min_requests: 50,
                restart_to_serving_ms: 15_000,
            },
            break_cache: false,
        }
    }
}

/// Restart figures, ms from the SIGKILL.
#[derive(Debug, Clone, Serialize)]
pub struct Restarts {
    pub agent_ready_ms: Option<u64>,
    /// `cache` when the restarted agent served what it had persisted.
    pub agent_started_from: Option<String>,
    pub agent_upstream_connected_after_restart: Option<bool>,
    pub envoy_routing_ms: Option<u64>,
    /// From the authority's restart until the agent says it is connected upstream again.
    pub authority_reconnect_ms: Option<u64>,
}

/// Everything the run found; printed as the last stdout line and written to
/// `<run dir>/report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub drill: &'static str,
    pub params: Params,
    pub run_dir: PathBuf,
    /// Phase boundaries, ms since traffic started.
    pub timeline: Timeline,
    pub before: PhaseFigures,
    pub during: PhaseFigures,
    pub after: PhaseFigures,
    /// Requests alive while Envoy was down (kill → routing again); outside the phases.
    pub envoy_restart: PhaseFigures,
    pub restarts: Restarts,
    pub verdict: Verdict,
    pub plots: Plots,
}

/// Phase boundaries.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    pub before: Window,
    pub during: Window,
    pub after: Window,
    pub agent_restart: Window,
    pub envoy_restart: Window,
}

/// Runs the drill in `run_dir` (created if needed).
pub async fn run(params: Params, run_dir: &Path) -> anyhow::Result<Report> {
    let waymark = waymark_bin()?;
    let envoy = envoy_bin()?;
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let setup = Progress::new("outage", Instant::now());
    setup.say(&format!("run directory {}", run_dir.display()));

    let mut authority = AuthorityProc::new(&waymark, &run_dir.join("authority"), REGION, ZONE)?;
    authority.start()?;
    authority
        .wait_ready(START_DEADLINE)
        .await
        .with_context(|| format!("authority log:\n{}", authority.log_tail(30)))?;
    setup.say(&format!("authority ready on {}", authority.http_addr()));

    // Renewed by the fleet; while the authority is down nothing can renew, so a long
    // outage outlives the lease and the authority's restart decides what stands.
    let lease = crate::harness::backends::MAX_LEASE;
    let fleet = DemoFleet::start(
        authority.http_addr(),
        SERVICE,
        params.backends,
        (REGION, ZONE, NODE),
        lease,
        START_DEADLINE,
    )
    .await?;
    setup.say(&format!("{} backends registered", fleet.ids().len()));

    let mut agent = AgentProc::new(
        &waymark,
        &run_dir.join("agent"),
        NODE,
        REGION,
        ZONE,
        authority.xds_addr(),
    )?;
    agent.start()?;
    agent
        .wait_ready(START_DEADLINE)
        .await
        .with_context(|| format!("agent log:\n{}", agent.log_tail(30)))?;
    setup.say("agent ready");

    let mut envoy = EnvoyProc::new(
        &envoy,
        &run_dir.join("envoy"),
        "sidecar-1",
        REGION,
        ZONE,
        agent.xds_addr(),
        SERVICE,
    )?;
    envoy.start()?;
    envoy
        .wait_routing(START_DEADLINE)
        .await
        .with_context(|| format!("envoy log:\n{}", envoy.log_tail(30)))?;
    let want = params.backends;
    wait_until("Envoy holds every backend", START_DEADLINE, async || {
        (envoy.endpoints(SERVICE).await == Some(want)).then_some(())
    })
    .await?;
    setup.say(&format!("Envoy routing to {want} backends"));

    let result = drive(&params, &mut authority, &mut agent, &mut envoy, run_dir).await;
    fleet.shutdown().await;
    let report = result?;
    report::finish(run_dir, &report)?;
    Ok(report)
}

/// Traffic, the outage and the restarts; then the figures.
async fn drive(
    params: &Params,
    authority: &mut AuthorityProc,
    agent: &mut AgentProc,
    envoy: &mut EnvoyProc,
    run_dir: &Path,
) -> anyhow::Result<Report> {
    let progress = Progress::new("outage", Instant::now());
    let epoch = progress.epoch();
    let sampler = StateSampler::start(vec![authority.http_addr()], vec![SERVICE.to_owned()], epoch);
    let at = |s: u64| epoch + Duration::from_secs(s);
    let now_ms = || ms(epoch.elapsed());
    let listener: SocketAddr = envoy.listener_addr();
    let traffic = Generator::start(listener, params.rate, REQUEST_TIMEOUT, epoch);
    let tally = traffic.tally();
    let beat = if params.outage_s >= 600 { 60 } else { 10 };
    let _heartbeat = progress.heartbeat(Duration::from_secs(beat), move || tally.line());
    progress.event(&format!("traffic at {}/s through {listener}", params.rate));

    // Phase boundaries are the drill's schedule, not waits for readiness.
    tokio::time::sleep_until(at(params.baseline_s)).await;
    // Stamped before the signal: a request in flight as the process dies belongs to it.
    let outage_start = now_ms();
    authority.kill();
    progress.event(&format!(
        "authority SIGKILLed ({} requests so far)",
        traffic.len()
    ));

    tokio::time::sleep_until(at(params.baseline_s + params.outage_s / 3)).await;
    let agent_kill = now_ms();
    agent.kill();
    progress.event("agent SIGKILLed; restarting without the authority");
    if params.break_cache {
        std::fs::remove_dir_all(agent.data_dir())
            .with_context(|| format!("deleting {}", agent.data_dir().display()))?;
        progress.event("the agent's cache deleted (--break-cache)");
    }
    agent.start()?;
    // With its cache deleted nothing can make the agent ready before the authority is
    // back: the break waits long enough to show it, not the full start deadline.
    let deadline = if params.break_cache {
        BROKEN_DEADLINE
    } else {
        START_DEADLINE
    };
    let agent_ready = agent.wait_ready(deadline).await;
    let agent_ready_at = now_ms();
    let view = agent.view().await.ok();
    if let Err(e) = &agent_ready {
        progress.event(&format!("agent did not come back: {e:#}"));
    }
    let agent_ready_ms = agent_ready.is_ok().then(|| agent_ready_at - agent_kill);
    let started_from = view
        .as_ref()
        .and_then(|v| v["started_from"].as_str().map(str::to_owned));
    let connected = view
        .as_ref()
        .and_then(|v| v["upstream_connected"].as_bool());
    progress.event(&format!(
        "agent ready after {agent_ready_ms:?} ms, started from {started_from:?}"
    ));

    tokio::time::sleep_until(at(params.baseline_s + 2 * params.outage_s / 3)).await;
    let envoy_kill = now_ms();
    envoy.kill();
    progress.event("Envoy SIGKILLed; restarting from the agent's cache");
    envoy.start()?;
    let envoy_routing = envoy.wait_routing(deadline).await;
    let envoy_up = now_ms();
    if let Err(e) = &envoy_routing {
        progress.event(&format!("Envoy did not route again: {e:#}"));
    }
    let envoy_routing_ms = envoy_routing.is_ok().then(|| envoy_up - envoy_kill);
    progress.event(&format!("Envoy routing after {envoy_routing_ms:?} ms"));

    tokio::time::sleep_until(at(params.baseline_s + params.outage_s)).await;
    let outage_end = now_ms();
    authority.start()?;
    progress.event("authority restarted");
    // (Only a figure, not part of the verdict: under the break it gets the short deadline.)
    let reconnect = wait_until("the agent reconnects upstream", deadline, async || {
        agent
            .view()
            .await
            .ok()
            .filter(|v| v["upstream_connected"] == true)
    })
    .await;
    let authority_reconnect_ms = reconnect.is_ok().then(|| now_ms() - outage_end);
    progress.event(&format!(
        "agent reconnected upstream after {authority_reconnect_ms:?} ms"
    ));

    tokio::time::sleep_until(at(params.baseline_s + params.outage_s + params.after_s)).await;
    let end = now_ms();
    let outcomes = traffic
        .stop(REQUEST_TIMEOUT + Duration::from_millis(500))
        .await;
    progress.event(&format!("traffic stopped: {} requests", outcomes.len()));
    report::write_outcomes(run_dir, &outcomes)?;
    let states = sampler.stop();

    let timeline = Timeline {
        before: Window {
            start_ms: 0,
            end_ms: outage_start,
        },
        during: Window {
            start_ms: outage_start,
            end_ms: outage_end,
        },
        after: Window {
            start_ms: outage_end,
            end_ms: end,
        },
        agent_restart: Window {
            start_ms: agent_kill,
            end_ms: agent_ready_at,
        },
        envoy_restart: Window {
            start_ms: envoy_kill,
            end_ms: envoy_up,
        },
    };
    let excluded = [timeline.envoy_restart];
    let before = figures::phase(&outcomes, timeline.before, &excluded);
    let during = figures::phase(&outcomes, timeline.during, &excluded);
    let after = figures::phase(&outcomes, timeline.after, &excluded);
    let envoy_restart = figures::affected(&outcomes, timeline.envoy_restart);
    let from_cache = started_from.as_deref() == Some("cache") && connected == Some(false);
    let verdict = figures::outage_verdict(
        &before,
        &during,
        &after,
        from_cache,
        &[
            ("agent restart", agent_ready_ms),
            ("envoy restart", envoy_routing_ms),
        ],
        &params.budget,
    );
    Ok(Report {
        drill: "outage",
        params: params.clone(),
        run_dir: run_dir.to_path_buf(),
        timeline,
        before,
        during,
        after,
        envoy_restart,
        restarts: Restarts {
            agent_ready_ms,
            agent_started_from: started_from,
            agent_upstream_connected_after_restart: connected,
            envoy_routing_ms,
            authority_reconnect_ms,
        },
        verdict,
        plots: Plots {
            states,
            errors: report::error_series(&outcomes),
            distributions: Vec::new(),
            events: progress.events(),
        },
    })
}
