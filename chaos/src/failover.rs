//! `bench failover`: the real recovery time of a region's authority. The leader of a
//! three-member group (real `waymark authority` processes, Raft over redb) holding the
//! reference estate is SIGKILLed while node agents' Delta xDS clients follow it; the bench
//! times, from the kill:
//!
//! 1. **leader known**: a live member says it leads, at a term above the killed leader's
//!    (`/v1/status`);
//! 2. **publishing**: the new leader has committed a newer version of the views. A probe
//!    instance of the probe service (every subscriber follows it) is registered through
//!    the API after the kill and must be acknowledged; the figure is the first moment a
//!    version of the probe service above everything committed before the kill was seen —
//!    on a member's API (`/v1/services/{service}/view`, the applied state) or arriving at
//!    any subscriber, whichever came first (a subscriber only receives committed views).
//!    The wait ends once a member's committed views of every zone hold the probe instance.
//!    A new leader commits views only as `Release` entries from its publisher, after its
//!    hold (`waymark_registry::term`: one contract interval in which nothing it computed
//!    is published), so this is election + rebuild + hold + one commit;
//! 3. **every subscriber current**: every subscriber holds, for each view it follows, the
//!    newest version committed (read from the new leader once the publishing settled),
//!    including those whose member was killed and had to reconnect to another.
//!
//! The region runs as in production: the members' API, Raft and xDS over mutual TLS, and
//! every subscriber presenting its own node certificate, which is how the members'
//! reconnection guard counts clients. Each subscriber holds a standby stream at a second
//! member, as node agents do by default (`--no-standby` measures without): the killed
//! member's subscribers open their next stream beside it, outside the guard's window.
//!
//! Then the killed member is restarted and caught up, and the bench repeats with
//! whichever member leads now. Each figure's median and spread over the repeats, and every
//! run, are reported beside a limit measured in the same run: the soonest a follower of the
//! members' Raft configuration can notice a dead leader (the leader's lease, which openraft
//! sets to the longest election timeout, plus the shortest timeout) plus the in-process
//! rebuild of the same estate (`bench rebuild`'s stages) — the floor no failover can beat
//! on this machine. Times are read by polling every
//! [`harness::POLL`](crate::harness::POLL) (API) or stamped on arrival (subscribers).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use tokio::time::Instant;
use waymark_agent::authority::config::LimitsSection;
use waymark_agent::authority::raft::{Member, RaftConfig};
use waymark_core::defaults::RECONNECT_WINDOW;
use waymark_core::view::ReleasedView;

use crate::bench::{self, Shape};
use crate::drill::leader_churn::leader_known;
use crate::drill::report::quantile;
use crate::estate::{self, LOAD_CONCURRENCY, ZONES};
use crate::harness::cluster::{AuthorityCluster, MemberStatus};
use crate::harness::evidence::RegionPki;
use crate::harness::fleet::{self, Api, SubLog, SubSpec, Subscribers, Upstream};
use crate::harness::{api_client, wait_until};
use crate::traffic::ms;
use crate::writes::Spread;

/// Region the authority serves.
const REGION: &str = "bench";
/// Members of the group.
const MEMBERS: usize = 3;
/// How long any process may take to become ready, and the group to elect its first leader.
const START_DEADLINE: Duration = Duration::from_secs(120);
/// How long the subscribers may take to attach (the reconnection guard admits 5 % of them
/// per 10 s on each member, so 2,000 take about a minute).
const ATTACH_DEADLINE: Duration = Duration::from_secs(600);
/// How long each stage of a failover may take before the run is abandoned: far past the
/// budgets, so a slow recovery is measured rather than cut off.
const STAGE_DEADLINE: Duration = Duration::from_secs(300);
/// One API call's limit.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The budgets issue 18 sets: a new leader publishing, and every subscriber current.
pub const PUBLISH_BUDGET_MS: f64 = 10_000.0;
pub const CURRENT_BUDGET_MS: f64 = 30_000.0;

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Services the estate spreads over; the first is the probe service.
    pub services: usize,
    /// Instances loaded before the first kill.
    pub estate: usize,
    /// Delta xDS subscribers, spread over the members, each configured with all three.
    pub subscriptions: usize,
    /// Services each subscriber follows (the probe service and others in turn).
    pub services_per_subscriber: usize,
    /// Leaders killed, one after another.
    pub repeats: usize,
    /// Seeds the subscribers' jitter.
    pub seed: u64,
    /// The members' reconnection guard, streams admitted per window in thousandths of the
    /// population (`[authority.limits] reconnect_permille`); `None` keeps the authority's
    /// default (50). 1000 lets every reconnecting subscriber in at once, to show what the
    /// guard costs.
    pub reconnect_permille: Option<u32>,
    /// Subscribers hold a standby stream at a second member, as node agents do by default
    /// (`upstream_standby`); `false` shows what a dead member's subscribers wait without.
    pub standby: bool,
}

/// One failover.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// The member killed and its term.
    pub killed: u64,
    pub killed_term: u64,
    /// The member that led next and its term.
    pub new_leader: u64,
    pub new_term: u64,
    /// Kill → a live member says it leads at a higher term.
    pub leader_known_ms: f64,
    /// Kill → the probe write acknowledged.
    pub write_acked_ms: f64,
    /// Kill → a newer version of the views committed (see the module documentation).
    pub publish_ms: f64,
    /// Kill → the last subscriber current.
    pub subscribers_current_ms: f64,
    /// Subscribers holding the newest views when the wait for them ended (all of them).
    pub current_at_end: usize,
    /// Subscribers whose stream ended and was opened again (the killed member's).
    pub reconnected: usize,
    /// Subscribers holding a standby stream when the leader was killed.
    pub standing_by_at_kill: usize,
    /// Of the reconnections, those opened over the subscriber's standby.
    pub promoted: u64,
    /// Kill → each of those opening its new stream: the median and the last.
    pub reattach_p50_ms: Option<f64>,
    pub reattach_max_ms: Option<f64>,
    /// Views (service × zone) committed after the kill, before every subscriber was current.
    pub views_changed: usize,
    /// What the new leader's log says of its hold: its length and the views its end
    /// published.
    pub hold_ms: Option<u64>,
    pub hold_published: Option<u64>,
    /// Restart of the killed member → it answers `/readyz`, and → it holds the newest views.
    pub restart_ready_ms: f64,
    pub restart_caught_up_ms: f64,
}

/// The floor the figures are set against, measured in the same run.
#[derive(Debug, Clone, Serialize)]
pub struct Limit {
    /// The members' Raft election timeout (openraft draws each one from this range).
    pub election_timeout_min_ms: f64,
    pub election_timeout_max_ms: f64,
    /// How long a follower that knows a leader honours its lease before its own election
    /// timeout starts counting: openraft 0.9 sets the lease to the longest election timeout
    /// (`EngineConfig::new`) and a follower with a committed vote waits lease + timeout since
    /// it last heard from the leader (`RaftCore::handle_tick_election`).
    pub leader_lease_ms: f64,
    /// The soonest a follower can notice the leader is gone: lease + shortest timeout.
    pub notice_ms: f64,
    /// `bench rebuild` at the estate's shape: decode, rebuild, release, encode, build.
    pub rebuild_ms: f64,
    /// `notice_ms + rebuild_ms`.
    pub limit_ms: f64,
}

/// Whether each budget held in every run.
#[derive(Debug, Clone, Serialize)]
pub struct Budgets {
    pub publish_ms: f64,
    pub publish_held: bool,
    pub subscribers_current_ms: f64,
    pub subscribers_current_held: bool,
}

/// The benchmark's figures.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverReport {
    /// Always `"failover"`.
    pub bench: &'static str,
    pub params: Params,
    /// The `waymark` binary measured.
    pub waymark_bin: String,
    /// Time to load the estate and to attach every subscriber (not measured figures).
    pub load_s: f64,
    pub attach_s: f64,
    pub leader_known_ms: Spread,
    pub write_acked_ms: Spread,
    pub publish_ms: Spread,
    pub subscribers_current_ms: Spread,
    pub limit: Limit,
    /// `limit_ms / subscribers_current_ms.median`: how close the whole recovery comes to
    /// the floor.
    pub ratio: f64,
    /// `limit_ms / publish_ms.median`.
    pub publish_ratio: f64,
    pub budgets: Budgets,
    pub runs: Vec<Run>,
}

/// The newest committed version of each view, by (zone, service).
type Newest = BTreeMap<(String, String), u64>;

/// Runs the benchmark with the members' files under `dir`.
pub async fn run(params: Params, dir: &Path) -> anyhow::Result<FailoverReport> {
    anyhow::ensure!(
        params.services >= 2 && params.estate >= params.services * ZONES.len(),
        "the estate needs two services and an instance of each in every zone"
    );
    anyhow::ensure!(params.subscriptions > 0 && params.repeats > 0);
    anyhow::ensure!(params.services_per_subscriber > 0);
    let bin = fleet::bench_start("failover", dir)?;
    let limit = limit(&params).await?;
    say(&format!("limit {limit:?}"));

    // Mutual TLS everywhere, as a region runs: the members' API, Raft and xDS, and every
    // subscriber with its own node certificate, which is how the reconnection guard counts
    // clients (and knows a standby's client when it opens its next stream).
    let pki = RegionPki::create(&dir.join("pki"), REGION, params.seed)?;
    let mut cluster = AuthorityCluster::new(&bin, dir, MEMBERS, REGION, &ZONES)?;
    cluster.with_tls(&pki)?;
    let mut limits = LimitsSection::default();
    if let Some(permille) = params.reconnect_permille {
        limits.reconnect_permille = permille;
    }
    cluster.set_limits(&limits)?;
    cluster.start_all()?;
    cluster.wait_all_ready(START_DEADLINE).await?;
    let first = cluster.wait_leader(None, START_DEADLINE).await?;
    let result = measure(&params, &mut cluster, &pki, first, &bin, limit).await;
    if result.is_err() {
        for id in cluster.ids() {
            if let Ok(m) = cluster.member(id) {
                say(&format!("member {id} log tail:\n{}", m.log_tail(20)));
            }
        }
    }
    result
}

/// Load, attach, then the failovers; the report.
async fn measure(
    params: &Params,
    cluster: &mut AuthorityCluster,
    pki: &RegionPki,
    first: u64,
    bin: &Path,
    limit: Limit,
) -> anyhow::Result<FailoverReport> {
    let started = Instant::now();
    let api = Api::new(cluster.member(first)?.http_addr(), REGION);
    let services: Vec<String> = (0..params.services).map(fleet::service_name).collect();
    api.declare(&services, START_DEADLINE).await?;
    let next = Arc::new(AtomicUsize::new(0));
    // One service after another: loaded in `bench writes`' order (every registration to
    // the next service), each admission window re-released every view of the region, and
    // with three members the group stopped committing (see `estate::spec_by_service`).
    let (count, total) = (params.services, params.estate);
    let loader = api.clone();
    estate::load(params.estate, LOAD_CONCURRENCY, &next, move |n| {
        let api = loader.clone();
        async move {
            let (service, zone, addr) = estate::spec_by_service(n, count, total);
            api.register(&service, zone, addr).await
        }
    })
    .await?;
    let load_s = started.elapsed().as_secs_f64();
    say(&format!(
        "member {first} leads; {} instances over {} services loaded in {load_s:.1} s",
        params.estate, params.services
    ));

    let epoch = Instant::now();
    let specs = sub_specs(params);
    let subs = Subscribers::start_across(
        &cluster.xds_addrs(),
        specs,
        params.seed,
        epoch,
        params.subscriptions,
        ATTACH_DEADLINE,
        Upstream {
            pki: Some(pki),
            standby: params.standby,
        },
    )
    .await?;
    let attach_s = epoch.elapsed().as_secs_f64();
    say(&format!(
        "{} subscribers attached across {MEMBERS} members in {attach_s:.1} s",
        subs.len()
    ));

    let mut runs = Vec::new();
    for k in 0..params.repeats {
        let run = failover(cluster, &subs, &next, epoch, k, params.standby).await?;
        say(&format!("failover {}: {run:?}", k + 1));
        runs.push(run);
    }
    drop(subs.stop());
    Ok(report(params, bin, load_s, attach_s, limit, runs))
}

/// The report from the runs.
fn report(
    params: &Params,
    bin: &Path,
    load_s: f64,
    attach_s: f64,
    limit: Limit,
    runs: Vec<Run>,
) -> FailoverReport {
    let spread = |f: fn(&Run) -> f64| Spread::of(&runs.iter().map(f).collect::<Vec<_>>());
    let publish_ms = spread(|r| r.publish_ms);
    let subscribers_current_ms = spread(|r| r.subscribers_current_ms);
    let ratio = |measured: f64| {
        if measured > 0.0 {
            limit.limit_ms / measured
        } else {
            0.0
        }
    };
    FailoverReport {
        bench: "failover",
        params: params.clone(),
        waymark_bin: bin.display().to_string(),
        load_s,
        attach_s,
        leader_known_ms: spread(|r| r.leader_known_ms),
        write_acked_ms: spread(|r| r.write_acked_ms),
        ratio: ratio(subscribers_current_ms.median),
        publish_ratio: ratio(publish_ms.median),
        budgets: Budgets {
            publish_ms: PUBLISH_BUDGET_MS,
            publish_held: publish_ms.max <= PUBLISH_BUDGET_MS,
            subscribers_current_ms: CURRENT_BUDGET_MS,
            subscribers_current_held: subscribers_current_ms.max <= CURRENT_BUDGET_MS,
        },
        publish_ms,
        subscribers_current_ms,
        limit,
        runs,
    }
}

/// The election timeout the members run with (the authority's Raft defaults; no key of the
/// configuration file changes them) and the in-process rebuild at the estate's shape.
async fn limit(params: &Params) -> anyhow::Result<Limit> {
    let raft = RaftConfig::new(
        1,
        PathBuf::new(),
        Member {
            raft_addr: String::new(),
            api_addr: String::new(),
        },
    );
    let shape = Shape {
        services: params.services,
        instances: params.estate,
        zones: ZONES.len(),
        seed: params.seed,
    };
    say(&format!(
        "rebuilding {} x {} in process for the limit",
        shape.services, shape.instances
    ));
    let rebuild = tokio::task::spawn_blocking(move || bench::rebuild(shape))
        .await
        .context("the rebuild panicked")?;
    let (min, max) = (
        raft.election_min.as_secs_f64() * 1e3,
        raft.election_max.as_secs_f64() * 1e3,
    );
    Ok(Limit {
        election_timeout_min_ms: min,
        election_timeout_max_ms: max,
        leader_lease_ms: max,
        notice_ms: max + min,
        rebuild_ms: rebuild.total_ms,
        limit_ms: max + min + rebuild.total_ms,
    })
}

/// Subscriber `i` follows the probe service and `services_per_subscriber - 1` others in
/// turn, from zone `(i / 3) % 3` (its first member is `i % 3`, so each member serves every
/// zone).
fn sub_specs(params: &Params) -> Vec<SubSpec> {
    let others = params.services - 1;
    let per = params.services_per_subscriber.min(params.services) - 1;
    (0..params.subscriptions)
        .map(|i| SubSpec {
            zone: ZONES[(i / MEMBERS) % ZONES.len()].to_owned(),
            services: std::iter::once(probe_service())
                .chain((0..per).map(|k| fleet::service_name(1 + (i * per + k) % others)))
                .collect(),
        })
        .collect()
}

/// The service every subscriber follows and the probe writes go to.
fn probe_service() -> String {
    fleet::service_name(0)
}

/// One failover: kill the leader, time the three figures, restart the member.
async fn failover(
    cluster: &mut AuthorityCluster,
    subs: &Subscribers,
    next: &Arc<AtomicUsize>,
    epoch: Instant,
    k: usize,
    standby: bool,
) -> anyhow::Result<Run> {
    quiet_window(subs, epoch).await;
    if standby {
        // Standbys lost with the last killed member are reopened through admission, at
        // 5 % per 10 s like any arrival: the next kill waits for them all.
        wait_until(
            "every subscriber holds a standby stream",
            ATTACH_DEADLINE,
            async || (subs.standing_by() == subs.len()).then_some(()),
        )
        .await?;
    }
    let victim = settled_leader(cluster).await?;
    let killed_term = victim.term.unwrap_or(0);
    let leader_api = cluster.member(victim.id)?.http_addr();
    let before = newest_views(leader_api, &followed(subs)).await?;
    wait_until(
        "every subscriber holds the newest views before the kill",
        STAGE_DEADLINE,
        async || (behind(subs, &before) == 0).then_some(()),
    )
    .await?;
    let probe = probe_service();
    let floor = before
        .iter()
        .filter(|((_, s), _)| *s == probe)
        .map(|(_, v)| *v)
        .max()
        .unwrap_or(0);
    let streams: Vec<u64> = (0..subs.len()).map(|i| subs.streams(i)).collect();
    let standing_by_at_kill = subs.standing_by();
    let promotions = subs.promotions();
    let live: Vec<(u64, SocketAddr)> = cluster
        .ids()
        .into_iter()
        .zip(cluster.http_addrs())
        .filter(|(id, _)| *id != victim.id)
        .collect();

    let killed = Instant::now();
    cluster.kill(victim.id)?;
    say(&format!(
        "failover {}: leader {} (term {killed_term}) SIGKILLed",
        k + 1,
        victim.id
    ));
    let (known, published) = tokio::join!(
        leader_known(&live, killed_term, killed, STAGE_DEADLINE),
        publish(&live, next, floor, killed),
    );
    let (new_leader, known_ms) = known.context("no member led after the kill")?;
    let published = published?;
    let committed_ms = first_arrival(subs, &probe, floor, ms(killed.duration_since(epoch)))
        .map(|t| t.saturating_sub(ms(killed.duration_since(epoch))) as f64);
    let publish_ms = committed_ms.map_or(published.seen_ms, |c| c.min(published.seen_ms));
    say(&format!(
        "failover {}: member {new_leader} leads after {known_ms} ms; publishing after {publish_ms:.0} ms",
        k + 1
    ));

    let (newest, current_ms) = all_current(subs, published.api, &before, killed, epoch).await?;
    let current_at_end = subs.len() - behind(subs, &newest);
    let killed_ms = ms(killed.duration_since(epoch));
    let reattached: Vec<f64> = (0..subs.len())
        .filter(|i| subs.streams(*i) > streams[*i])
        .filter_map(|i| {
            let log = subs.log(i);
            let t = log.streams_opened_ms.iter().find(|t| **t >= killed_ms)?;
            Some((t - killed_ms) as f64)
        })
        .collect();
    let reconnected = (0..subs.len())
        .filter(|i| subs.streams(*i) > streams[*i])
        .count();
    let promoted = subs.promotions() - promotions;
    let views_changed = newest
        .iter()
        .filter(|(key, v)| before.get(*key).is_none_or(|b| *v > b))
        .count();
    let leader = cluster.member(new_leader)?;
    let (hold_ms, hold_published) = hold_from_log(&leader.log_tail(5_000));
    let new_term = cluster
        .leader_status()
        .await
        .and_then(|s| s.term)
        .unwrap_or(0);

    let restarted = Instant::now();
    cluster.restart(victim.id, STAGE_DEADLINE).await?;
    let restart_ready_ms = restarted.elapsed().as_secs_f64() * 1e3;
    let api = cluster.member(victim.id)?.http_addr();
    wait_until(
        "the restarted member holds the newest views",
        STAGE_DEADLINE,
        async || {
            let views = service_views(api, &probe).await.ok()?;
            probe_caught_up(&views, &newest, &probe).then_some(())
        },
    )
    .await?;
    Ok(Run {
        killed: victim.id,
        killed_term,
        new_leader,
        new_term,
        leader_known_ms: known_ms as f64,
        write_acked_ms: published.acked_ms,
        publish_ms,
        subscribers_current_ms: current_ms,
        current_at_end,
        reconnected,
        standing_by_at_kill,
        promoted,
        reattach_p50_ms: quantile(&reattached, 0.5),
        reattach_max_ms: quantile(&reattached, 1.0),
        views_changed,
        hold_ms,
        hold_published,
        restart_ready_ms,
        restart_caught_up_ms: restarted.elapsed().as_secs_f64() * 1e3,
    })
}

/// Waits until no subscriber has opened a stream for one reconnection window. A real
/// fleet has been attached for long before a failover, so no member's guard still counts
/// recent admissions against the reconnecting clients; without this wait the subscribers
/// just attached (or just moved by the previous failover) would use up the survivors'
/// window and the figure would measure the bench's own history. The guard's window is
/// time, so this waits for time, from the subscribers' own stamps.
async fn quiet_window(subs: &Subscribers, epoch: Instant) {
    let last_opened = (0..subs.len())
        .filter_map(|i| subs.log(i).streams_opened_ms.last().copied())
        .max()
        .unwrap_or(0);
    let quiet = epoch + Duration::from_millis(last_opened) + RECONNECT_WINDOW;
    if quiet > Instant::now() {
        say(&format!(
            "waiting {} ms for a reconnection window without new streams",
            ms(quiet - Instant::now())
        ));
        tokio::time::sleep_until(quiet).await;
    }
}

/// The leader once every member runs and all of them name it, at one term: the group is
/// settled, so the kill is of a leader everyone follows.
async fn settled_leader(cluster: &mut AuthorityCluster) -> anyhow::Result<MemberStatus> {
    wait_until(
        "a leader every member follows",
        STAGE_DEADLINE,
        async || {
            let statuses = cluster.statuses().await;
            let leader = statuses.iter().find(|s| s.is_leader)?.clone();
            let agreed = statuses.len() == MEMBERS
                && statuses
                    .iter()
                    .all(|s| s.leader == Some(leader.id) && s.term == leader.term);
            agreed.then_some(leader)
        },
    )
    .await
}

/// What [`publish`] saw: when the probe write was acknowledged, when a member's API first
/// showed a newer version of the probe service, and that member.
struct Published {
    acked_ms: f64,
    seen_ms: f64,
    api: SocketAddr,
}

/// Registers a probe instance of the probe service through the live members in turn until
/// one is acknowledged, then waits until a member's committed views of the probe service
/// hold it in every zone, above `floor`.
async fn publish(
    live: &[(u64, SocketAddr)],
    next: &Arc<AtomicUsize>,
    floor: u64,
    killed: Instant,
) -> anyhow::Result<Published> {
    let probe = probe_service();
    let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (_, zone, addr) = estate::spec(n, 1);
    let mut attempt = 0usize;
    let id = wait_until(
        "a live member acknowledges a write",
        STAGE_DEADLINE,
        async || {
            let (_, member) = live[attempt % live.len()];
            attempt += 1;
            let api = Api::new(member, REGION);
            tokio::time::timeout(CALL_TIMEOUT, api.register(&probe, zone, addr))
                .await
                .ok()?
                .ok()
        },
    )
    .await?;
    let acked_ms = killed.elapsed().as_secs_f64() * 1e3;
    let (seen_ms, api) = wait_until(
        "a member's views hold the probe write",
        STAGE_DEADLINE,
        async || {
            for (_, member) in live {
                let Ok(views) = service_views(*member, &probe).await else {
                    continue;
                };
                let holds = views.len() >= ZONES.len()
                    && views.iter().all(|v| {
                        v.version.0 > floor && v.view.endpoints.keys().any(|k| k.to_string() == id)
                    });
                if holds {
                    return Some((killed.elapsed().as_secs_f64() * 1e3, *member));
                }
            }
            None
        },
    )
    .await?;
    Ok(Published {
        acked_ms,
        seen_ms,
        api,
    })
}

/// The earliest arrival (ms since the epoch, at or after `from_ms`) at any subscriber of a
/// version of `service` above `floor`.
fn first_arrival(subs: &Subscribers, service: &str, floor: u64, from_ms: u64) -> Option<u64> {
    (0..subs.len())
        .filter_map(|i| {
            let k = subs.specs()[i].services.iter().position(|s| s == service)? as u16;
            subs.log(i)
                .seen
                .iter()
                .find(|s| s.resource == k && s.version > floor && s.t_ms >= from_ms)
                .map(|s| s.t_ms)
        })
        .min()
}

/// Waits until every subscriber holds the newest committed views, read from `api` (the
/// publishing member) until two reads agree around the wait; the newest views and when
/// the last subscriber held them (ms since `killed`, from the subscribers' own stamps).
async fn all_current(
    subs: &Subscribers,
    api: SocketAddr,
    before: &Newest,
    killed: Instant,
    epoch: Instant,
) -> anyhow::Result<(Newest, f64)> {
    let deadline = Instant::now() + STAGE_DEADLINE;
    let mut newest = refresh(api, before).await?;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        wait_until(
            "every subscriber holds the newest views",
            left,
            async || (behind(subs, &newest) == 0).then_some(()),
        )
        .await?;
        let again = refresh(api, &newest).await?;
        if again == newest {
            break;
        }
        newest = again;
    }
    let from_ms = ms(killed.duration_since(epoch));
    let times = (0..subs.len())
        .map(|i| current_since(&subs.log(i), &wanted(&subs.specs()[i], &newest), from_ms))
        .collect::<Option<Vec<u64>>>()
        .context("a subscriber holds the newest views, yet its log never shows them")?;
    let last = times.into_iter().max().unwrap_or(from_ms);
    Ok((newest, last.saturating_sub(from_ms) as f64))
}

/// What subscriber `spec` must hold of each service it follows.
fn wanted(spec: &SubSpec, newest: &Newest) -> Vec<u64> {
    spec.services
        .iter()
        .map(|s| {
            newest
                .get(&(spec.zone.clone(), s.clone()))
                .copied()
                .unwrap_or(0)
        })
        .collect()
}

/// The first time at or after `from_ms` that `log` shows at least `wanted` of every
/// resource (clamped to `from_ms` when already held then); `None` if never.
fn current_since(log: &SubLog, wanted: &[u64], from_ms: u64) -> Option<u64> {
    let mut held = vec![0u64; wanted.len()];
    let holds = |held: &[u64]| held.iter().zip(wanted).all(|(h, w)| h >= w);
    for s in &log.seen {
        if let Some(h) = held.get_mut(usize::from(s.resource)) {
            *h = s.version;
        }
        if holds(&held) {
            return Some(s.t_ms.max(from_ms));
        }
    }
    None
}

/// Subscribers that hold less than the newest version of a view they follow.
fn behind(subs: &Subscribers, newest: &Newest) -> usize {
    (0..subs.len())
        .filter(|i| {
            let want = wanted(&subs.specs()[*i], newest);
            subs.held(*i)
                .iter()
                .zip(&want)
                .any(|(h, w)| h.is_none_or(|h| h < *w))
        })
        .count()
}

/// Every service some subscriber follows.
fn followed(subs: &Subscribers) -> BTreeSet<String> {
    subs.specs()
        .iter()
        .flat_map(|s| s.services.iter().cloned())
        .collect()
}

/// The committed views of `services` on member `api`, by (zone, service).
async fn newest_views(api: SocketAddr, services: &BTreeSet<String>) -> anyhow::Result<Newest> {
    let mut newest = Newest::new();
    for service in services {
        for v in service_views(api, service).await? {
            newest.insert((v.view.key.zone.to_string(), service.clone()), v.version.0);
        }
    }
    Ok(newest)
}

/// `known` with every service whose newest version on `api` (`/v1/services`) moved past it
/// read again, view by view.
async fn refresh(api: SocketAddr, known: &Newest) -> anyhow::Result<Newest> {
    let client = api_client(api);
    let list = tokio::time::timeout(CALL_TIMEOUT * 4, client.get_json("/v1/services"))
        .await
        .context("/v1/services timed out")??;
    let mut highest: BTreeMap<&str, u64> = BTreeMap::new();
    for ((_, service), v) in known {
        let h = highest.entry(service.as_str()).or_default();
        *h = (*h).max(*v);
    }
    let moved: BTreeSet<String> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let name = s["service"].as_str()?;
            let version: u64 = s["version"].as_str()?.parse().ok()?;
            let h = highest.get(name)?;
            (version > *h).then(|| name.to_owned())
        })
        .collect();
    let mut newest = known.clone();
    newest.extend(newest_views(api, &moved).await?);
    Ok(newest)
}

/// `GET /v1/services/{service}/view` of one member.
async fn service_views(api: SocketAddr, service: &str) -> anyhow::Result<Vec<ReleasedView>> {
    let path = format!("/v1/services/{service}/view");
    let v = tokio::time::timeout(CALL_TIMEOUT, api_client(api).get_json(&path))
        .await
        .with_context(|| format!("{path} timed out"))??;
    Ok(serde_json::from_value(v)?)
}

/// Whether `views` hold the newest version of every zone's view of `service`.
fn probe_caught_up(views: &[ReleasedView], newest: &Newest, service: &str) -> bool {
    newest
        .iter()
        .filter(|((_, s), _)| s == service)
        .all(|((zone, _), want)| {
            views
                .iter()
                .any(|v| v.view.key.zone.to_string() == *zone && v.version.0 >= *want)
        })
}

/// The last hold the log tells of: its length (`hold_ms=`) and the views its end published
/// (`changed=`).
fn hold_from_log(log: &str) -> (Option<u64>, Option<u64>) {
    let log = strip_ansi(log);
    let field = |line: &str, key: &str| -> Option<u64> {
        let rest = &line[line.find(key)? + key.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let last = |what: &str, key: &str| {
        log.lines()
            .rev()
            .find(|l| l.contains(what))
            .and_then(|l| field(l, key))
    };
    (
        last("holding published views", "hold_ms="),
        last("hold over", "changed="),
    )
}

/// `text` without its terminal colour sequences (`ESC [ … m`), which the authority's log
/// puts around every field name.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn say(what: &str) {
    eprintln!("bench failover: {what}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::fleet::Seen;

    fn seen(t_ms: u64, resource: u16, version: u64) -> Seen {
        Seen {
            t_ms,
            resource,
            version,
        }
    }

    #[test]
    fn a_subscriber_is_current_once_every_view_it_follows_reached_the_newest() {
        let log = SubLog {
            seen: vec![
                seen(10, 0, 5),
                seen(20, 1, 7),
                seen(900, 0, 9),
                seen(1_500, 1, 8),
            ],
            ..SubLog::default()
        };
        assert_eq!(current_since(&log, &[9, 8], 100), Some(1_500));
        // Already current at the kill: the time is the kill's.
        assert_eq!(current_since(&log, &[5, 7], 100), Some(100));
        assert_eq!(current_since(&log, &[10, 8], 100), None);
    }

    #[test]
    fn every_subscriber_follows_the_probe_service_and_the_members_share_the_zones() {
        let params = Params {
            services: 20,
            estate: 400,
            subscriptions: 30,
            services_per_subscriber: 3,
            repeats: 1,
            seed: 1,
            reconnect_permille: None,
            standby: true,
        };
        let specs = sub_specs(&params);
        assert!(specs.iter().all(|s| s.services[0] == probe_service()));
        assert!(specs.iter().all(|s| s.services.len() == 3));
        assert!(
            specs
                .iter()
                .all(|s| !s.services[1..].contains(&probe_service()))
        );
        for member in 0..MEMBERS {
            let zones: BTreeSet<&str> = specs
                .iter()
                .enumerate()
                .filter(|(i, _)| i % MEMBERS == member)
                .map(|(_, s)| s.zone.as_str())
                .collect();
            assert_eq!(zones.len(), ZONES.len(), "member {member}: {zones:?}");
        }
    }

    #[test]
    fn the_hold_is_read_from_the_last_term_in_the_log() {
        let log = "INFO holding published views for fresh evidence term=2 hold_ms=5000\n\
                   INFO hold over: publishing computed views term=2 changed=3\n\
                   INFO holding published views for fresh evidence term=4 hold_ms=1000\n\
                   INFO hold over: publishing computed views term=4 changed=12";
        assert_eq!(hold_from_log(log), (Some(1_000), Some(12)));
        let coloured = "\u{1b}[3mhold_ms\u{1b}[0m\u{1b}[2m=\u{1b}[0m1000 holding published views";
        assert_eq!(hold_from_log(coloured).0, Some(1_000));
        assert_eq!(hold_from_log(""), (None, None));
    }
}
