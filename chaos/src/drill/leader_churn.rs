//! `leader-churn`: the leader of a three-member authority (Raft over redb) is SIGKILLed
//! again and again while a client registers, renews and deregisters instances through the
//! API. Every acknowledged write must be on every member afterwards, and no version —
//! neither what xDS subscribers attached to the members apply, nor what a member's
//! `/v1/services` says — may ever go backwards.
//!
//! Each kill is followed by the time until a new leader accepts a write (the election as a
//! client sees it), then the killed member is started again on its own data directory.
//! Attempts that fail while there is no leader are a figure, not a failure: only what the
//! API acknowledged is promised.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use http::Method;
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use waymark_xds::client::{BackoffConfig, ClientConfig};

use super::Scale;
use super::figures::Verdict;
use super::report::{self, Distribution, Plots, Progress, StateSampler};
use crate::harness::cluster::{AuthorityCluster, MemberStatus, leader_of};
use crate::harness::registrar::{self, Attempt, Op, Registrar, RegistrarConfig, Reply};
use crate::harness::xds_watch::{VersionWatch, WatchLog};
use crate::harness::{wait_until, waymark_bin};
use crate::traffic::ms;

pub mod figures;

pub use figures::{
    Expect, Expectations, Kill, MemberCheck, RegistryFigures, Regression, SeriesFigures,
    VersionFigures, WatcherSummary, WriteFigures,
};
use figures::{
    as_outcomes, check_member, expectations, series_figures, verdict, watch_figures, write_figures,
};

const REGION: &str = "r1";
const ZONES: [&str; 2] = ["a", "b"];
const SERVICE: &str = "pay";
/// How long any process may take to become ready (CI compiles on the same cores).
const START_DEADLINE: Duration = Duration::from_secs(60);
/// One API call's limit in the drill's own checks.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// The least time between a member's restart and the next kill.
const MIN_GAP: Duration = Duration::from_secs(3);
/// How often each member's `/v1/services` is read.
const POLL_EVERY: Duration = Duration::from_millis(250);

/// What the drill is run with.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub scale: Scale,
    pub members: usize,
    /// Leaders killed, one every `kill_every_s`, after `warmup_s` of load.
    pub kills: usize,
    pub kill_every_s: u64,
    pub warmup_s: u64,
    /// Load after the last kill, before the checks.
    pub tail_s: u64,
    pub registrar: RegistrarConfig,
    /// xDS subscribers pinned to each member, and subscribers moving across all members
    /// (as node agents do).
    pub pinned_watchers: usize,
    pub roaming_watchers: usize,
    pub seed: u64,
    pub budget: Budget,
    /// Break the property on purpose: the killed member restarts with its data directory
    /// deleted and bootstraps itself as a new one-member group (a lost disk re-bootstrapped
    /// by hand), so what it acknowledged and served is not the group's.
    pub break_wipe_on_restart: bool,
}

/// What the drill holds the run to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Budget {
    /// From a leader's SIGKILL until a new leader acknowledges a write.
    pub election_ms: u64,
    /// From a restart until the member answers `/readyz`.
    pub restart_ready_ms: u64,
    /// From the end of the load until every member holds every acknowledged write.
    pub converge_ms: u64,
    /// Then, until every subscriber holds its zone's newest version (a stopped or lagging
    /// subscriber could hide a regression).
    pub catch_up_ms: u64,
    /// Fewer acknowledged writes than this and the run proves nothing.
    pub min_acked: usize,
}

impl Params {
    /// The defaults of a scale: short for CI (5 kills in 50 s), full for the claim
    /// (30 kills over 10 minutes).
    pub fn for_scale(scale: Scale) -> Self {
        let (kills, kill_every_s, rate) = match scale {
            Scale::Short => (5, 10, 10),
            Scale::Full => (30, 20, 20),
        };
        let seed = 8;
        Self {
            scale,
            members: 3,
            kills,
            kill_every_s,
            warmup_s: 8,
            tail_s: 6,
            registrar: RegistrarConfig {
                service: SERVICE.to_owned(),
                region: REGION.to_owned(),
                zones: ZONES.iter().map(|z| (*z).to_owned()).collect(),
                rate,
                lease_ms: 600_000,
                renew_permille: 200,
                deregister_permille: 100,
                max_live: 300,
                attempts: 40,
                attempt_timeout: CALL_TIMEOUT,
                retry_pause: Duration::from_millis(100),
                seed,
            },
            pinned_watchers: 1,
            roaming_watchers: 3,
            seed,
            budget: Budget {
                // Raft's election timeout is 1–2 s; a restarted ex-leader resuming its old
                // term costs another round. Generous: the drill guards safety, and the
                // design's budget for a new leader's rebuild is 5 minutes.
                election_ms: 30_000,
                restart_ready_ms: 30_000,
                converge_ms: 30_000,
                catch_up_ms: 20_000,
                min_acked: 100,
            },
            break_wipe_on_restart: false,
        }
    }
}

/// Everything the run found; printed as the last stdout line and written to
/// `<run dir>/report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub drill: &'static str,
    pub params: Params,
    pub run_dir: PathBuf,
    pub kills: Vec<Kill>,
    /// Kill → a new leader acknowledging a write, over all kills.
    pub election_p50_ms: Option<f64>,
    pub election_max_ms: Option<f64>,
    pub writes: WriteFigures,
    pub registry: RegistryFigures,
    pub versions: VersionFigures,
    pub verdict: Verdict,
    pub plots: Plots,
}

/// Runs the drill in `run_dir` (created if needed).
pub async fn run(params: Params, run_dir: &Path) -> anyhow::Result<Report> {
    let waymark = waymark_bin()?;
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let progress = Progress::new("leader-churn", Instant::now());
    progress.say(&format!("run directory {}", run_dir.display()));

    let mut cluster = AuthorityCluster::new(&waymark, run_dir, params.members, REGION, &ZONES)?;
    cluster.start_all()?;
    cluster.wait_all_ready(START_DEADLINE).await?;
    let first = cluster.wait_leader(None, START_DEADLINE).await?;
    progress.event(&format!(
        "{} members ready, member {first} leads",
        params.members
    ));

    let apis = cluster.http_addrs();
    let put = json!({"owner": "drill", "contract": {}});
    wait_until("the service is registered", START_DEADLINE, async || {
        let r = registrar::attempt(
            apis[0],
            Method::PUT,
            &format!("/v1/services/{SERVICE}"),
            Some(&put),
            CALL_TIMEOUT,
        )
        .await;
        matches!(r, Reply::Acked { .. }).then_some(())
    })
    .await?;
    // The instance renewed to tell when a new leader accepts writes.
    let probe_body = json!({
        "service": SERVICE,
        "locality": {"region": REGION, "zone": ZONES[0], "node": "probe"},
        "address": {"ip": "10.255.255.1", "port": 9},
        "lease_ms": params.registrar.lease_ms,
    });
    let epoch = progress.epoch();
    let registered = wait_until(
        "the probe instance is registered",
        START_DEADLINE,
        async || {
            let (wall_ms, sent) = (registrar::wall_ms(), Instant::now());
            let result = registrar::attempt(
                apis[0],
                Method::POST,
                "/v1/instances",
                Some(&probe_body),
                CALL_TIMEOUT,
            )
            .await;
            let Reply::Acked {
                issued: Some(id), ..
            } = &result
            else {
                return None;
            };
            Some(Attempt {
                t_ms: ms(sent.duration_since(epoch)),
                wall_ms,
                latency_ms: ms(sent.elapsed()),
                op_id: PROBE_OPS,
                op: Op::Register,
                attempt: 1,
                member: apis[0],
                instance: Some(id.clone()),
                result,
            })
        },
    )
    .await?;
    let probe_id = registered.instance.clone().unwrap_or_default();
    let probe_log = vec![registered];
    progress.say(&format!(
        "service {SERVICE} and probe instance {probe_id} registered"
    ));

    let result = drive(&params, &mut cluster, probe_log, &progress, run_dir).await;
    if result.is_err() {
        for id in cluster.ids() {
            if let Ok(m) = cluster.member(id) {
                progress.say(&format!("member {id} log tail:\n{}", m.log_tail(15)));
            }
        }
    }
    let report = result?;
    report::finish(run_dir, &report)?;
    Ok(report)
}

/// Probe operations are numbered from here (the registrar's from 1).
const PROBE_OPS: u64 = 1 << 40;

/// Load, subscribers, the kills; then the checks and the figures.
async fn drive(
    params: &Params,
    cluster: &mut AuthorityCluster,
    mut probe_log: Vec<Attempt>,
    progress: &Progress,
    run_dir: &Path,
) -> anyhow::Result<Report> {
    let epoch = progress.epoch();
    let at = |s: u64| epoch + Duration::from_secs(s);
    let apis = cluster.http_addrs();
    let xds = cluster.xds_addrs();
    let ids = cluster.ids();
    let sampler = StateSampler::start(apis.clone(), vec![SERVICE.to_owned()], epoch);
    let poller = ServicesPoller::start(
        ids.iter().copied().zip(apis.iter().copied()).collect(),
        epoch,
    );

    let watches = start_watches(params, &ids, &xds, epoch)?;
    let load = Registrar::start(params.registrar.clone(), apis.clone(), epoch);
    progress.event(&format!(
        "registration load at {}/s; {} xDS subscribers",
        params.registrar.rate,
        watches.len()
    ));
    // Every subscriber holds the service's endpoints before the first kill, so a version
    // series exists to regress (a wait on the real signal, not on the clock).
    let held = wait_until(
        "every subscriber holds the endpoints",
        START_DEADLINE,
        async || {
            watches
                .iter()
                .all(|w| w.has_endpoints(SERVICE))
                .then_some(())
        },
    )
    .await;
    if let Err(e) = &held {
        progress.event(&format!("{e:#}"));
    }

    let mut kills = Vec::new();
    // A kill never follows a restart closer than this, whatever the schedule says.
    let mut not_before = Instant::now();
    for k in 0..params.kills {
        let scheduled = at(params.warmup_s + k as u64 * params.kill_every_s);
        tokio::time::sleep_until(scheduled.max(not_before)).await;
        let Some(kill) = kill_leader(k, params, cluster, &mut probe_log, &load, progress).await?
        else {
            continue;
        };
        not_before = Instant::now() + MIN_GAP;
        let stop = kill.write_accepted_ms.is_none();
        kills.push(kill);
        if stop {
            // No quorum takes writes any more: further kills would measure nothing.
            progress.event("no leader accepts writes; the churn stops here");
            break;
        }
    }
    tokio::time::sleep_until(at(params.warmup_s
        + params.kills as u64 * params.kill_every_s
        + params.tail_s))
    .await;
    let mut attempts = load.stop().await;
    let load_end = Instant::now();
    progress.event(&format!("load stopped: {} attempts", attempts.len()));
    attempts.extend(probe_log);
    let expect = expectations(&attempts, registrar::wall_ms());

    // Every member must come to hold every acknowledged write, and the same instances.
    let members: Vec<(u64, SocketAddr)> = ids.iter().copied().zip(apis.iter().copied()).collect();
    let mut last: Vec<MemberCheck> = Vec::new();
    let mut agree = false;
    let converged = wait_until(
        "every member holds every acknowledged write",
        Duration::from_millis(params.budget.converge_ms),
        async || {
            let mut held = Vec::new();
            for (id, api) in &members {
                held.push((*id, instances(*api).await));
            }
            last = held
                .iter()
                .map(|(id, h)| check_member(*id, &expect, h.as_ref()))
                .collect();
            let sets: Vec<Vec<&String>> = held
                .iter()
                .filter_map(|(_, h)| h.as_ref().map(|h| h.keys().collect()))
                .collect();
            agree = sets.len() == members.len() && sets.windows(2).all(|w| w[0] == w[1]);
            (agree && last.iter().all(MemberCheck::holds)).then_some(())
        },
    )
    .await;
    let converged_ms = converged.is_ok().then(|| ms(load_end.elapsed()));
    progress.event(&format!(
        "registry check: converged after {converged_ms:?} ms; members agree: {agree}"
    ));

    // Every subscriber comes to hold the newest version the members serve: a regression
    // cannot hide behind a subscriber that stopped receiving.
    let newest = newest_by_zone(&members).await;
    let behind_newest = |w: &VersionWatch| {
        newest
            .get(w.zone())
            .is_some_and(|n| w.endpoints_version(SERVICE) < Some(*n))
    };
    let caught_up = wait_until(
        "every subscriber holds its zone's newest version",
        Duration::from_millis(params.budget.catch_up_ms),
        async || (!watches.iter().any(behind_newest)).then_some(()),
    )
    .await;
    let subscribers_caught_up_ms = caught_up.is_ok().then(|| ms(load_end.elapsed()));
    let behind: Vec<String> = watches
        .iter()
        .filter(|w| behind_newest(w))
        .map(|w| w.name().to_owned())
        .collect();
    progress.event(&format!(
        "subscribers hold the newest version {newest:?} after {subscribers_caught_up_ms:?} ms; behind: {behind:?}"
    ));

    let member_series = poller.stop();
    let logs: Vec<WatchLog> = watches.into_iter().map(VersionWatch::stop).collect();
    let states = sampler.stop();
    write_jsonl(&run_dir.join("attempts.jsonl"), &attempts)?;
    write_jsonl(&run_dir.join("versions.jsonl"), &logs)?;

    let mut series: Vec<SeriesFigures> = logs.iter().flat_map(watch_figures).collect();
    for (id, points) in &member_series {
        series.push(series_figures(format!("member:{id}:/v1/services"), points));
    }
    let versions = VersionFigures {
        newest,
        subscribers_caught_up_ms,
        subscribers_behind: behind,
        regressions: series.iter().map(|s| s.regressions.len() as u64).sum(),
        watchers_without_endpoints: logs
            .iter()
            .filter(|l| !l.seen.iter().any(|s| s.resource == SERVICE))
            .map(|l| l.name.clone())
            .collect(),
        watchers: logs
            .iter()
            .map(|l| WatcherSummary {
                name: l.name.clone(),
                servers: l.servers.clone(),
                updates: l.updates,
                nacks: l.nacks,
                streams: l.streams,
                cluster_changes: l.cluster_changes,
                unparsable: l.unparsable,
            })
            .collect(),
        series,
    };
    let count =
        |f: fn(&Expect) -> bool| expect.by_instance.values().filter(|e| f(e)).count() as u64;
    let registry = RegistryFigures {
        expected_present: count(|e| matches!(e, Expect::Present { .. })),
        expected_absent: count(|e| matches!(e, Expect::Absent)),
        undetermined: count(|e| matches!(e, Expect::Either)),
        expired: expect.expired,
        refused_as_unknown: expect.refused_as_unknown.clone(),
        members: last,
        members_agree: agree,
        converged_ms,
    };
    let writes = write_figures(&attempts);
    let verdict = verdict(params, &kills, &writes, &registry, &versions);
    let elections: Vec<f64> = kills
        .iter()
        .filter_map(|k| k.write_accepted_ms)
        .map(|v| v as f64)
        .collect();
    let known: Vec<f64> = kills
        .iter()
        .filter_map(|k| k.leader_known_ms)
        .map(|v| v as f64)
        .collect();
    let restarts: Vec<f64> = kills
        .iter()
        .filter_map(|k| k.restart_ready_ms)
        .map(|v| v as f64)
        .collect();
    let latencies: Vec<f64> = attempts
        .iter()
        .filter(|a| a.acked())
        .map(|a| a.latency_ms as f64)
        .collect();
    let dist = |name: &str, values: Vec<f64>| Distribution {
        name: name.to_owned(),
        unit: "ms".to_owned(),
        values,
    };
    Ok(Report {
        drill: "leader-churn",
        params: params.clone(),
        run_dir: run_dir.to_path_buf(),
        election_p50_ms: report::quantile(&elections, 0.5),
        election_max_ms: report::quantile(&elections, 1.0),
        kills,
        writes,
        registry,
        versions,
        verdict,
        plots: Plots {
            states,
            errors: report::error_series(&as_outcomes(&attempts)),
            distributions: vec![
                dist("kill → new leader accepts a write", elections),
                dist("kill → a member says it leads", known),
                dist("restart → member ready", restarts),
                dist("acknowledged write latency", latencies),
            ],
            events: progress.events(),
        },
    })
}

/// Kill `k`: SIGKILL the leader, time the election as a client sees it, restart the
/// member (wiped first under `--break-wipe-on-restart`). `None` when no member leads.
async fn kill_leader(
    k: usize,
    params: &Params,
    cluster: &mut AuthorityCluster,
    probe_log: &mut Vec<Attempt>,
    load: &Registrar,
    progress: &Progress,
) -> anyhow::Result<Option<Kill>> {
    let epoch = progress.epoch();
    let leader = wait_until("a leader to kill", Duration::from_secs(20), async || {
        cluster.leader_status().await
    })
    .await;
    let Ok(MemberStatus {
        id: victim,
        term: victim_term,
        ..
    }) = leader
    else {
        progress.event(&format!("kill {}: no member leads; nothing to kill", k + 1));
        return Ok(None);
    };
    let live: Vec<(u64, SocketAddr)> = cluster
        .ids()
        .into_iter()
        .zip(cluster.http_addrs())
        .filter(|(id, _)| *id != victim)
        .collect();
    let election_limit = Duration::from_millis(params.budget.election_ms);
    let killed_at = Instant::now();
    let at_ms = ms(killed_at.duration_since(epoch));
    cluster.kill(victim)?;
    let (writes, acked) = load.counts();
    progress.event(&format!(
        "kill {}: leader {victim} SIGKILLed ({acked} of {writes} attempts acknowledged so far)",
        k + 1
    ));
    let (known, accepted) = tokio::join!(
        leader_known(&live, victim_term.unwrap_or(0), killed_at, election_limit),
        write_accepted(
            &live,
            params.registrar.lease_ms,
            killed_at,
            election_limit,
            epoch,
            probe_log,
            k as u64
        ),
    );
    progress.event(&format!(
        "kill {}: member {:?} leads after {:?} ms, a write accepted after {:?} ms",
        k + 1,
        known.map(|x| x.0),
        known.map(|x| x.1),
        accepted
    ));
    let wiped = params.break_wipe_on_restart;
    if wiped {
        let m = cluster.member(victim)?;
        let dir = m.data_dir().to_path_buf();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("deleting {}", dir.display()))?;
        }
        m.set_initial_members(&[(victim, m.http_addr())])?;
        progress.event(&format!(
            "member {victim}: data deleted, restarting as a new one-member group (--break-wipe-on-restart)"
        ));
    }
    let restarted = Instant::now();
    let ready = cluster
        .restart(
            victim,
            Duration::from_millis(params.budget.restart_ready_ms),
        )
        .await;
    let restart_ready_ms = match &ready {
        Ok(()) => Some(ms(restarted.elapsed())),
        Err(e) => {
            progress.event(&format!("member {victim} not ready: {e:#}"));
            None
        }
    };
    progress.event(&format!(
        "member {victim} restarted, ready after {restart_ready_ms:?} ms"
    ));
    Ok(Some(Kill {
        at_ms,
        killed: victim,
        leader_known_ms: known.map(|x| x.1),
        write_accepted_ms: accepted,
        new_leader: known.map(|x| x.0),
        restart_ready_ms,
        wiped,
    }))
}

/// The xDS subscribers: `pinned_watchers` on each member, `roaming_watchers` across all.
fn start_watches(
    params: &Params,
    ids: &[u64],
    xds: &[SocketAddr],
    epoch: Instant,
) -> anyhow::Result<Vec<VersionWatch>> {
    let mut watches = Vec::new();
    for (id, addr) in ids.iter().zip(xds) {
        for n in 0..params.pinned_watchers {
            watches.push(VersionWatch::start(
                &format!("m{id}-pinned-{n}"),
                vec![*addr],
                ZONES[0],
                SERVICE,
                watch_config(params.seed + *id * 100 + n as u64),
                epoch,
            )?);
        }
    }
    for n in 0..params.roaming_watchers {
        watches.push(VersionWatch::start(
            &format!("roaming-{n}"),
            xds.to_vec(),
            ZONES[n % ZONES.len()],
            SERVICE,
            watch_config(params.seed + 1_000 + n as u64),
            epoch,
        )?);
    }
    Ok(watches)
}

/// `GET /v1/instances?service=…` of one member: id → lease end.
async fn instances(api: SocketAddr) -> Option<BTreeMap<String, u64>> {
    // Through the API client: the list is longer than `traffic::get` reads.
    let api = crate::harness::api_client(api);
    let v = tokio::time::timeout(
        CALL_TIMEOUT,
        api.get_json(&format!("/v1/instances?service={SERVICE}")),
    )
    .await
    .ok()?
    .ok()?;
    Some(
        v.as_array()?
            .iter()
            .filter_map(|r| {
                Some((
                    r["instance"]["id"].as_str()?.to_owned(),
                    r["lease_expires_at_ms"].as_u64().unwrap_or(0),
                ))
            })
            .collect(),
    )
}

/// Polls the live members' `/v1/status` until one says it leads in a term above
/// `killed_term` (a restarted ex-leader may resume its old term for a moment): (its id,
/// ms since the kill).
pub(crate) async fn leader_known(
    live: &[(u64, SocketAddr)],
    killed_term: u64,
    since: Instant,
    deadline: Duration,
) -> Option<(u64, u64)> {
    wait_until("a new leader", deadline, async || {
        let mut statuses: Vec<MemberStatus> = Vec::new();
        for (id, api) in live {
            if let Ok(r) =
                crate::harness::get_api(*api, "/v1/status", Duration::from_millis(500)).await
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&r.body)
            {
                statuses.push(MemberStatus {
                    id: *id,
                    leader: v["leader"]["id"].as_u64(),
                    is_leader: v["is_leader"].as_bool() == Some(true),
                    term: v["term"].as_u64(),
                });
            }
        }
        statuses.retain(|s| s.term.is_some_and(|t| t > killed_term));
        leader_of(&statuses).map(|id| (id, ms(since.elapsed())))
    })
    .await
    .ok()
}

/// Registers a probe instance through the live members in turn until a leader
/// acknowledges it — a committed write, not a renewal (renewals are the leader term's
/// memory and say nothing of the log): ms since the kill. Each attempt registers at its own
/// port, since one whose answer was lost may still have committed. Every attempt goes into
/// `log`.
async fn write_accepted(
    live: &[(u64, SocketAddr)],
    lease_ms: u64,
    since: Instant,
    deadline: Duration,
    epoch: Instant,
    log: &mut Vec<Attempt>,
    kill: u64,
) -> Option<u64> {
    let mut n = 0u32;
    loop {
        let (_, api) = live[n as usize % live.len()];
        n += 1;
        let port = 20_000 + (kill % 40) * 1_000 + u64::from(n % 1_000);
        let body = json!({
            "service": SERVICE,
            "locality": {"region": REGION, "zone": ZONES[0], "node": "probe"},
            "address": {"ip": "10.255.255.2", "port": port},
            "lease_ms": lease_ms,
        });
        let wall_ms = registrar::wall_ms();
        let sent = Instant::now();
        let result = registrar::attempt(
            api,
            Method::POST,
            "/v1/instances",
            Some(&body),
            Duration::from_secs(1),
        )
        .await;
        let acked = matches!(result, Reply::Acked { .. });
        let issued = match &result {
            Reply::Acked { issued, .. } => issued.clone(),
            _ => None,
        };
        log.push(Attempt {
            t_ms: ms(sent.duration_since(epoch)),
            wall_ms,
            latency_ms: ms(sent.elapsed()),
            // Each attempt its own operation: a retry is a new registration.
            op_id: PROBE_OPS + 1 + kill * 1_000_000 + u64::from(n),
            op: Op::Register,
            attempt: 1,
            member: api,
            instance: issued,
            result,
        });
        if acked {
            return Some(ms(since.elapsed()));
        }
        if since.elapsed() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Versions over time: (ms since the epoch, the version or `None` when absent).
type Series = Vec<(u64, Option<u64>)>;

/// Reads every member's `/v1/services` and keeps the service's version per member
/// (`None` when a member that answers does not have it).
struct ServicesPoller {
    series: Arc<Mutex<BTreeMap<u64, Series>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ServicesPoller {
    fn start(members: Vec<(u64, SocketAddr)>, epoch: Instant) -> Self {
        let series: Arc<Mutex<BTreeMap<u64, Series>>> = Arc::default();
        let sink = Arc::clone(&series);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                for (id, api) in &members {
                    let Ok(r) =
                        crate::harness::get_api(*api, "/v1/services", Duration::from_millis(500))
                            .await
                    else {
                        continue;
                    };
                    if r.status != 200
                        || serde_json::from_str::<serde_json::Value>(&r.body).is_err()
                    {
                        continue;
                    }
                    let version = service_version(&r.body);
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .entry(*id)
                        .or_default()
                        .push((ms(epoch.elapsed()), version));
                }
            }
        });
        Self { series, task }
    }

    fn stop(self) -> BTreeMap<u64, Series> {
        self.task.abort();
        std::mem::take(&mut *self.series.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The drill's subscribers back off at most this long between reconnections (node
/// agents' default is 30 s, which would only lengthen the run).
const WATCH_BACKOFF_CAP: Duration = Duration::from_secs(5);

fn watch_config(seed: u64) -> ClientConfig {
    ClientConfig {
        seed,
        backoff: BackoffConfig {
            cap: WATCH_BACKOFF_CAP,
            ..BackoffConfig::default()
        },
        ..ClientConfig::default()
    }
}

/// The newest version of each zone's view of the service that any member has committed
/// (`/v1/services/{service}/view`).
async fn newest_by_zone(members: &[(u64, SocketAddr)]) -> BTreeMap<String, u64> {
    let mut newest: BTreeMap<String, u64> = BTreeMap::new();
    for (_, api) in members {
        // Through the API client: the views are longer than `traffic::get` reads.
        let api = crate::harness::api_client(*api);
        let path = format!("/v1/services/{SERVICE}/view");
        let Ok(Ok(views)) = tokio::time::timeout(CALL_TIMEOUT, api.get_json(&path)).await else {
            continue;
        };
        for v in views.as_array().into_iter().flatten() {
            if let (Some(zone), Some(version)) =
                (v["view"]["key"]["zone"].as_str(), v["version"].as_u64())
            {
                let n = newest.entry(zone.to_owned()).or_default();
                *n = (*n).max(version);
            }
        }
    }
    newest
}

/// The service's view version in a `/v1/services` answer.
fn service_version(body: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let s = v.as_array()?.iter().find(|s| s["service"] == SERVICE)?;
    s["version"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .or_else(|| s["version"].as_u64())
}

/// One JSON object a line.
fn write_jsonl<T: Serialize>(path: &Path, items: &[T]) -> anyhow::Result<()> {
    let mut text = String::new();
    for i in items {
        text.push_str(&serde_json::to_string(i)?);
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
