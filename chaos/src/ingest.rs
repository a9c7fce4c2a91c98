//! `bench ingest`: evidence samples admitted per second by a real authority leader, fed
//! over mutual TLS by many node-agent sessions, against the evaluator alone fed the same
//! samples in this process — the limit, since every admitted sample ends in it.
//!
//! One `waymark authority` process ([`FleetAuthority`] with its ingest listener) holds the
//! estate (the reference region's 60,000 instances over 450 services unless sized down),
//! registered through its API on the sessions' nodes, under a contract with all three
//! evidence classes. Each session is a node agent as the real one connects: its own
//! certificate from the run's CA, the agent's TLS policy and keepalives, the evidence client
//! ([`ClientSession`]), `hello` with its zone, then the probe assignment the leader hands it.
//! Its stream, per round: a probe result for every target it is assigned, a relayed
//! self-report for every instance on its node, and callers' outcomes for its share of the
//! estate, in batches of the agent's size. By default a session keeps `window` messages
//! unacknowledged and sends on as each is answered (a closed loop: the most the authority
//! will take); `rate` paces all sessions to an offered load instead, and `backoff_ms` makes
//! a session hold off after an overload.
//!
//! *Admitted* is what the authority's acknowledgements say it admitted (beside the change
//! of `waymark_ingest_samples_accepted_total` over the same window), counted over a window
//! after a warm-up, so the hub's bounded queue is at its steady state and overload
//! refusals count against the rate, never for it. The per-core figure divides by the CPU
//! time the authority process spent in the window (`/proc/<pid>/stat`); the sessions' own
//! CPU and the rest of the machine's are reported beside it.
//!
//! The limit replays the very samples the sessions sent, interleaved as they arrive,
//! through a [`waymark_core::evaluator::Evaluator`] holding the same services and
//! instances; cloning the samples is kept out of its timing. Phases alternate (authority,
//! then evaluator) and repeat; each figure is given as median and spread.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tonic::transport::Endpoint;
use waymark_agent::evidence::{
    AgentMessage, AuthorityMessage, ClientSession, RefusedSample, WireSample,
};
use waymark_core::contract::{CapabilityProfile, HealthContract};
use waymark_core::evaluator::{Admission, Evaluator, EvaluatorConfig};
use waymark_core::model::{
    Address, Health, Instance, InstanceId, Locality, Observation, Origin, Reporter, Sample,
    SelfReport,
};
use waymark_core::units::Weight;

use crate::harness::configs::name;
use crate::harness::evidence::RegionPki;
use crate::harness::fleet::{self, Api, FleetAuthority, Limits};
use crate::harness::wait_until;
use crate::rng::SplitMix64;
use crate::writes::Spread;

/// The target for the whole path on this project's 2-core machine.
pub const TARGET_SAMPLES_PER_SEC: f64 = 400_000.0;
/// Region the authority serves.
const REGION: &str = "bench";
/// Zones the estate and the sessions spread over.
const ZONES: [&str; 3] = ["z1", "z2", "z3"];
/// How long the authority may take to come up, and the assignment to settle.
const START_DEADLINE: Duration = Duration::from_secs(120);
/// The assignment is settled once no session has been handed a new one for this long.
const ASSIGNMENT_QUIET: Duration = Duration::from_secs(2);
/// Registrations in flight while loading the estate.
const LOAD_CONCURRENCY: usize = 64;
/// Samples the limit clones at a time, outside its timing.
const LIMIT_CHUNK: usize = 4096;

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Services the estate spreads over.
    pub services: usize,
    /// Instances registered.
    pub estate: usize,
    /// Node-agent sessions.
    pub sessions: usize,
    /// Samples per message (the node agent's own batch is 512).
    pub batch: usize,
    /// Messages a session keeps unacknowledged.
    pub window: usize,
    /// How long a session holds off after an acknowledgement refusing samples as
    /// `overloaded` (0: it sends on at once, a flood of what will be refused).
    pub backoff_ms: u64,
    /// Samples per second offered by all sessions together, evenly paced (0: as fast as
    /// the window lets them, a closed loop).
    pub rate: u64,
    /// Seconds streamed before the measured window of each phase.
    pub warmup_s: u64,
    /// Seconds each measured window lasts.
    pub phase_s: u64,
    /// Seconds of samples the limit replays per phase, at least one round.
    pub limit_s: u64,
    /// Times each phase runs.
    pub repeats: usize,
    /// Share of instances failing, in permille.
    pub failing_permille: u64,
    /// Seed of the stream's choices (which instances fail, callers' error counts).
    pub seed: u64,
}

/// One measured window of the authority.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// Samples acknowledged as admitted in the window.
    pub admitted: u64,
    /// The change of `waymark_ingest_samples_accepted_total` over the window.
    pub metric_admitted: f64,
    /// Samples sent in the window.
    pub sent: u64,
    /// Samples refused in the window, by the authority's reason label.
    pub refused: BTreeMap<String, u64>,
    /// The window's length.
    pub seconds: f64,
    /// `admitted / seconds`.
    pub per_sec: f64,
    /// CPU time the authority process spent in the window.
    pub authority_cpu_s: f64,
    /// `authority_cpu_s / seconds`: cores the authority kept busy.
    pub authority_cores: f64,
    /// `admitted / authority_cpu_s`.
    pub per_core: f64,
    /// CPU time this process (the sessions) spent in the window.
    pub sessions_cpu_s: f64,
    /// CPU time everything else on the machine spent in the window, in cores: the
    /// machine is shared, and what others run is taken from the authority.
    pub other_cores: f64,
    /// How long, after the sessions stopped, the last acknowledgement took and the
    /// authority took to go idle (its queue drained).
    pub drain_s: f64,
    /// Whether it went idle within the drain's 15 s: if not, admitted samples were still
    /// queued for the leader and the next phase starts behind.
    pub drained: bool,
}

/// One replay of the stream through the evaluator alone.
#[derive(Debug, Clone, Serialize)]
pub struct LimitPhase {
    /// Samples fed.
    pub samples: u64,
    /// Of those, applied (the rest the evaluator refused, see `rejected`).
    pub applied: u64,
    /// Eligibility changes the samples produced (each is a re-assembly of its service's
    /// views at the leader), and of those, transitions between verdicts.
    pub eligibility_changes: u64,
    pub transitions: u64,
    /// Time spent in the evaluator.
    pub seconds: f64,
    /// `samples / seconds`.
    pub per_sec: f64,
}

/// One round of the sessions' stream, by evidence class.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Mix {
    pub probe: usize,
    pub self_report: usize,
    pub passive: usize,
}

/// The benchmark's figures.
#[derive(Debug, Clone, Serialize)]
pub struct IngestReport {
    /// Always `"ingest"`.
    pub bench: &'static str,
    pub params: Params,
    /// The `waymark` binary measured: measure a release build.
    pub waymark_bin: String,
    /// Instances registered, and probe targets handed out in all (per prober).
    pub instances: usize,
    pub probe_assignments: usize,
    /// One round of the stream (every session's batches once).
    pub round: Mix,
    /// Samples admitted per second, end to end.
    pub samples_per_sec: Spread,
    /// Admitted per CPU-second of the authority process.
    pub per_core_samples_per_sec: Spread,
    /// Cores the authority kept busy.
    pub authority_cores: Spread,
    /// The evaluator alone on the same samples.
    pub limit_samples_per_sec: Spread,
    /// `samples_per_sec.median / limit_samples_per_sec.median`.
    pub ratio: f64,
    pub target_samples_per_sec: f64,
    /// Whether the median meets the target.
    pub meets_target: bool,
    /// Inputs the evaluator refused in the limit's replays, by label (a sanity check
    /// that the replay was work the evaluator accepts).
    pub limit_rejected: BTreeMap<String, u64>,
    /// Every phase as measured, in order.
    pub waymark_phases: Vec<Phase>,
    pub limit_phases: Vec<LimitPhase>,
}

/// One registered instance, as the sessions and the limit's evaluator know it.
#[derive(Debug, Clone)]
struct Registered {
    instance: Instance,
    failing: bool,
}

/// Runs the benchmark with the authority's files under `dir`.
pub async fn run(params: Params, dir: &Path) -> anyhow::Result<IngestReport> {
    check(&params)?;
    let bin = fleet::bench_start("ingest", dir)?;
    let zones = zones(params.sessions);
    let pki = RegionPki::create(&dir.join("pki"), REGION, params.seed)?;
    let mut authority = FleetAuthority::new(
        &bin,
        &dir.join("authority"),
        REGION,
        &zones,
        Limits::default(),
    )?
    .with_ingest(&pki)?;
    authority.start()?;
    authority
        .wait_ready(START_DEADLINE)
        .await
        .with_context(|| format!("authority log:\n{}", authority.log_tail(30)))?;
    let ingest = authority.ingest_addr().context("no ingest listener")?;
    let pid = authority.pid().context("the authority is not running")?;
    let api = Api::new(authority.http_addr(), REGION);
    let estate = load(&api, &params, &zones).await?;
    let counters = Arc::new(Counters::default());
    let sessions = open_sessions(&pki, ingest, &params, &zones, &counters).await?;
    let probe_assignments = settle(&sessions, &counters, estate.len()).await?;
    let (streams, round) = streams(&sessions, &estate, &params);
    let replay = interleave(&sessions, &streams)?;
    let mut evaluator = limit_evaluator(&params, &estate)?;
    let (mut w, mut l) = (Vec::new(), Vec::new());
    for repeat in 1..=params.repeats {
        let phase = measure(&sessions, &streams, &counters, &api, pid, &params).await?;
        say(&format!(
            "waymark repeat {repeat}: {:.0} samples/s admitted ({:.0} per authority core, {:.2} cores; {} refused)",
            phase.per_sec,
            phase.per_core,
            phase.authority_cores,
            phase.refused.values().sum::<u64>()
        ));
        w.push(phase);
        let (ev, limit) = replay_limit(evaluator, Arc::clone(&replay), params.limit_s).await?;
        evaluator = ev;
        say(&format!(
            "evaluator repeat {repeat}: {:.0} samples/s",
            limit.per_sec
        ));
        l.push(limit);
    }
    counters.check_errors()?;
    drop(sessions);
    authority.kill();
    let limit_rejected = evaluator
        .stats()
        .rejected
        .iter()
        .map(|(k, v)| ((*k).to_owned(), *v))
        .collect();
    Ok(report(
        params,
        &bin,
        estate.len(),
        probe_assignments,
        round,
        w,
        l,
        limit_rejected,
    ))
}

fn check(params: &Params) -> anyhow::Result<()> {
    anyhow::ensure!(
        params.services > 0 && params.estate >= params.services,
        "the estate needs at least one instance per service"
    );
    anyhow::ensure!(params.sessions > 0, "--sessions must be positive");
    anyhow::ensure!(
        (1..=waymark_agent::evidence::BATCH_MAX).contains(&params.batch),
        "--batch must be 1 to {}",
        waymark_agent::evidence::BATCH_MAX
    );
    anyhow::ensure!(params.window > 0, "--window must be positive");
    anyhow::ensure!(
        params.phase_s > 0 && params.repeats > 0,
        "--seconds and --repeats must be positive"
    );
    Ok(())
}

fn say(line: &str) {
    eprintln!("bench ingest: {line}");
}

/// The zones in use: as many as there are sessions to probe them, up to three.
fn zones(sessions: usize) -> Vec<String> {
    ZONES[..sessions.min(ZONES.len())]
        .iter()
        .map(|z| (*z).to_owned())
        .collect()
}

/// Session `k`'s node name and zone.
fn node_of(k: usize, zones: &[String]) -> (String, String) {
    (format!("node-{k:03}"), zones[k % zones.len()].clone())
}

/// The node instance `n` (in zone index `z`) runs on: one of the sessions of its zone.
fn host_of(n: usize, z: usize, params: &Params, zones: &[String]) -> String {
    let in_zone: Vec<usize> = (0..params.sessions)
        .filter(|k| k % zones.len() == z)
        .collect();
    let k = in_zone[(n / (params.services * zones.len())) % in_zone.len()];
    node_of(k, zones).0
}

/// The contract every service is declared under: every evidence class, no slow start.
fn contract() -> HealthContract {
    HealthContract {
        profile: CapabilityProfile::FULL,
        slow_start: Duration::ZERO,
        ..HealthContract::default()
    }
}

/// Declares the services and registers the estate on the sessions' nodes.
async fn load(api: &Api, params: &Params, zones: &[String]) -> anyhow::Result<Vec<Registered>> {
    let services: Vec<String> = (0..params.services).map(fleet::service_name).collect();
    let body = serde_json::to_value(contract())?;
    api.declare_with(&services, body, START_DEADLINE).await?;
    let started = Instant::now();
    let specs: Vec<(usize, String, usize)> = (0..params.estate)
        .map(|n| {
            let z = (n / params.services) % zones.len();
            (n, fleet::service_name(n % params.services), z)
        })
        .collect();
    let queue = Arc::new(Mutex::new(specs));
    let mut workers = Vec::new();
    for _ in 0..LOAD_CONCURRENCY {
        let (queue, api, params, zones) = (
            Arc::clone(&queue),
            api.clone(),
            params.clone(),
            zones.to_vec(),
        );
        workers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let next = queue.lock().unwrap_or_else(PoisonError::into_inner).pop();
                let Some((n, service, z)) = next else {
                    return Ok::<_, anyhow::Error>(done);
                };
                let node = host_of(n, z, &params, &zones);
                let addr = fleet::address(n + 1);
                let id = api.register_on(&service, &zones[z], &node, addr).await?;
                done.push((n, instance(&id, &service, &zones[z], &node, addr)?));
            }
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.context("a registering client panicked")??);
    }
    all.sort_by_key(|(n, _)| *n);
    say(&format!(
        "{} instances over {} services registered in {:.1} s",
        all.len(),
        params.services,
        started.elapsed().as_secs_f64()
    ));
    let mut rng = SplitMix64::new(params.seed);
    Ok(all
        .into_iter()
        .map(|(_, instance)| Registered {
            instance,
            failing: rng.chance(params.failing_permille),
        })
        .collect())
}

/// The instance record the authority holds for a registration.
fn instance(
    id: &str,
    service: &str,
    zone: &str,
    node: &str,
    addr: SocketAddr,
) -> anyhow::Result<Instance> {
    Ok(Instance {
        id: name(id)?,
        service: name(service)?,
        locality: Locality {
            region: name(REGION)?,
            zone: name(zone)?,
            node: name(node)?,
        },
        address: Address {
            ip: addr.ip(),
            port: addr.port(),
        },
        origin: Origin::Registered,
        weight: Weight::DEFAULT,
        tags: BTreeSet::new(),
        metadata: Default::default(),
    })
}

/// What the sessions count together.
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    sent: AtomicU64,
    refused: Mutex<BTreeMap<String, u64>>,
    /// Messages sent and not yet acknowledged, over every session.
    in_flight: AtomicI64,
    /// Assignment messages received, and when the last one came.
    assignments: AtomicU64,
    last_assignment: Mutex<Option<Instant>>,
    /// Why a session ended early.
    errors: Mutex<Vec<String>>,
}

impl Counters {
    /// One acknowledgement; whether it refused samples as `overloaded`.
    fn acknowledged(&self, accepted: u64, refused: Vec<RefusedSample>) -> bool {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.accepted.fetch_add(accepted, Ordering::Relaxed);
        if refused.is_empty() {
            return false;
        }
        let overloaded = refused.iter().any(|r| r.reason == "overloaded");
        let mut by = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        for r in refused {
            *by.entry(r.reason).or_default() += 1;
        }
        overloaded
    }

    fn refused(&self) -> BTreeMap<String, u64> {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn check_errors(&self) -> anyhow::Result<()> {
        let errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        anyhow::ensure!(
            errors.is_empty(),
            "{} sessions ended early, the first: {}",
            errors.len(),
            errors[0]
        );
        Ok(())
    }
}

/// One node agent's session, driven by its own task.
struct AgentSession {
    node: String,
    /// The instances it was last assigned to probe.
    targets: Arc<Mutex<Vec<InstanceId>>>,
    /// What to stream: `None` holds still.
    control: watch::Sender<Option<Arc<Vec<AgentMessage>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AgentSession {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens every session (each says hello), a few at a time.
async fn open_sessions(
    pki: &RegionPki,
    ingest: SocketAddr,
    params: &Params,
    zones: &[String],
    counters: &Arc<Counters>,
) -> anyhow::Result<Vec<AgentSession>> {
    let mut sessions = Vec::with_capacity(params.sessions);
    for k in 0..params.sessions {
        let (node, zone) = node_of(k, zones);
        let tls = pki.node_client(&node).await?;
        let session = connect(ingest, tls)
            .await
            .with_context(|| format!("opening {node}'s evidence session"))?;
        session
            .send(AgentMessage::Hello { zone: name(&zone)? })
            .await?;
        let targets = Arc::default();
        let (control, rx) = watch::channel(None);
        let task = tokio::spawn(drive(
            session,
            rx,
            Arc::clone(&targets),
            Arc::clone(counters),
            Pace {
                window: params.window,
                backoff: Duration::from_millis(params.backoff_ms),
                per_sample: (params.rate > 0).then(|| {
                    Duration::from_secs(1).mul_f64(params.sessions as f64 / params.rate as f64)
                }),
            },
        ));
        sessions.push(AgentSession {
            node,
            targets,
            control,
            task,
        });
    }
    say(&format!("{} sessions open over mutual TLS", sessions.len()));
    Ok(sessions)
}

/// A session as the node agent opens it (`node/session.rs`): its keepalives, mutual TLS
/// with the node's identity, the evidence client.
async fn connect(
    ingest: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> anyhow::Result<ClientSession> {
    // `http://` even over TLS: the connector does the handshake.
    let channel = Endpoint::from_shared(format!("http://{ingest}"))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .connect_with_connector(waymark_certs::grpc::TlsConnector::new(tls))
        .await?;
    Ok(ClientSession::open(channel).await?)
}

/// How a session paces what it sends.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// Messages unacknowledged at most.
    window: usize,
    /// Held off after an overload.
    backoff: Duration,
    /// This session's share of the offered rate, as time per sample; `None`: unpaced.
    per_sample: Option<Duration>,
}

/// Streams the messages `control` names, round after round, as `pace` allows; counts what
/// the authority answers.
async fn drive(
    mut session: ClientSession,
    mut control: watch::Receiver<Option<Arc<Vec<AgentMessage>>>>,
    targets: Arc<Mutex<Vec<InstanceId>>>,
    counters: Arc<Counters>,
    pace: Pace,
) {
    let (mut next, mut in_flight) = (0usize, 0usize);
    let mut resume = tokio::time::Instant::now();
    let ended = loop {
        let stream = control.borrow().clone();
        let held = tokio::time::Instant::now() < resume;
        if let Some(messages) = stream.filter(|m| !m.is_empty())
            && in_flight < pace.window
            && !held
        {
            let message = messages[next % messages.len()].clone();
            next += 1;
            let samples = match &message {
                AgentMessage::Samples { samples } | AgentMessage::Relayed { samples } => {
                    samples.len()
                }
                AgentMessage::Hello { .. }
                | AgentMessage::Sidecars { .. }
                | AgentMessage::ClientConfig(_)
                | AgentMessage::KeyringAnswer(_) => 0,
            };
            if let Err(status) = session.send(message).await {
                break format!("send: {status}");
            }
            if let Some(per_sample) = pace.per_sample {
                // Evenly paced from where the last message's share ended, never banking
                // time a stopped phase did not use.
                resume = resume.max(tokio::time::Instant::now() - per_sample * 64)
                    + per_sample * samples as u32;
            }
            in_flight += 1;
            counters.in_flight.fetch_add(1, Ordering::Relaxed);
            counters.sent.fetch_add(samples as u64, Ordering::Relaxed);
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep_until(resume), if held => {}
            changed = control.changed() => if changed.is_err() { return },
            message = session.inbound.next() => match message {
                Some(Ok(AuthorityMessage::Ack { accepted, refused })) => {
                    in_flight = in_flight.saturating_sub(1);
                    if counters.acknowledged(accepted, refused) {
                        resume = resume.max(tokio::time::Instant::now() + pace.backoff);
                    }
                }
                Some(Ok(AuthorityMessage::Assignment { targets: t })) => {
                    *targets.lock().unwrap_or_else(PoisonError::into_inner) =
                        t.into_iter().map(|t| t.instance).collect();
                    counters.assignments.fetch_add(1, Ordering::Relaxed);
                    *counters.last_assignment.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(Instant::now());
                }
                // A load generator holds no sidecars to describe, and runs no gossip.
                Some(Ok(AuthorityMessage::ConfigRequest(_) | AuthorityMessage::KeyringRequest(_))) => {}
                Some(Err(status)) => break format!("authority: {status}"),
                None => break "the authority closed the session".to_owned(),
            },
        }
    };
    counters
        .errors
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(ended);
}

/// Waits until every instance has a prober and no session has been handed a new
/// assignment for [`ASSIGNMENT_QUIET`]; the probe assignments handed out in all.
async fn settle(
    sessions: &[AgentSession],
    counters: &Counters,
    estate: usize,
) -> anyhow::Result<usize> {
    let started = Instant::now();
    let what = format!("the probe assignment to cover all {estate} instances and settle");
    let handed = wait_until(&what, START_DEADLINE, async || {
        if let Err(e) = counters.check_errors() {
            // Done, and failed: a stream that ended early will not come back.
            return Ok(Err(e));
        }
        let covered: BTreeSet<InstanceId> = sessions
            .iter()
            .flat_map(|s| {
                s.targets
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            })
            .collect();
        let quiet = counters
            .last_assignment
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|t| t.elapsed() >= ASSIGNMENT_QUIET);
        if covered.len() < estate {
            let seen = covered.len();
            return Err(format!("{seen} of {estate} instances have a prober"));
        }
        if !quiet {
            return Err("every instance has a prober; assignments still arrive".to_owned());
        }
        let handed: usize = sessions
            .iter()
            .map(|s| {
                s.targets
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .len()
            })
            .sum();
        Ok(Ok(handed))
    })
    .await??;
    say(&format!(
        "assignment settled after {:.1} s: {handed} probe targets over {} sessions ({} assignment messages)",
        started.elapsed().as_secs_f64(),
        sessions.len(),
        counters.assignments.load(Ordering::Relaxed)
    ));
    Ok(handed)
}

/// Each session's round of messages, and the round's mix. A session probes what it is
/// assigned, relays the self-reports of the instances on its node, and forwards callers'
/// outcomes for every `sessions`th instance from its own index.
fn streams(
    sessions: &[AgentSession],
    estate: &[Registered],
    params: &Params,
) -> (Vec<Arc<Vec<AgentMessage>>>, Mix) {
    let index: BTreeMap<&InstanceId, &Registered> =
        estate.iter().map(|r| (&r.instance.id, r)).collect();
    let mut rng = SplitMix64::new(params.seed ^ 0x696e_6765_7374);
    let mut mix = Mix::default();
    let streams = sessions
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let targets = s.targets.lock().unwrap_or_else(PoisonError::into_inner);
            let mut own: Vec<WireSample> = Vec::new();
            for t in targets.iter().filter_map(|t| index.get(t)) {
                own.push(probe(t));
            }
            mix.probe += own.len();
            for r in estate.iter().skip(k).step_by(params.sessions) {
                own.push(passive(r, &mut rng));
            }
            mix.passive += own.len() - targets.len();
            let relayed: Vec<WireSample> = estate
                .iter()
                .filter(|r| r.instance.locality.node.as_str() == s.node)
                .map(self_report)
                .collect();
            mix.self_report += relayed.len();
            Arc::new(batches(own, relayed, params.batch))
        })
        .collect();
    (streams, mix)
}

/// `own` and `relayed` cut into messages of at most `batch`, alternating.
fn batches(own: Vec<WireSample>, relayed: Vec<WireSample>, batch: usize) -> Vec<AgentMessage> {
    let own: Vec<AgentMessage> = own
        .chunks(batch)
        .map(|c| AgentMessage::Samples {
            samples: c.to_vec(),
        })
        .collect();
    let relayed: Vec<AgentMessage> = relayed
        .chunks(batch)
        .map(|c| AgentMessage::Relayed {
            samples: c.to_vec(),
        })
        .collect();
    let (mut a, mut b) = (own.into_iter(), relayed.into_iter());
    let mut out = Vec::new();
    loop {
        match (a.next(), b.next()) {
            (None, None) => return out,
            (x, y) => out.extend(x.into_iter().chain(y)),
        }
    }
}

fn probe(r: &Registered) -> WireSample {
    let health = if r.failing {
        Health::Fail
    } else {
        Health::Pass
    };
    WireSample {
        instance: r.instance.id.clone(),
        observation: Observation::Probe {
            health,
            detail: None,
        },
    }
}

fn self_report(r: &Registered) -> WireSample {
    let report = if r.failing {
        SelfReport::NotReady {
            detail: "pool exhausted".into(),
        }
    } else {
        SelfReport::Ready
    };
    WireSample {
        instance: r.instance.id.clone(),
        observation: Observation::SelfReport(report),
    }
}

fn passive(r: &Registered, rng: &mut SplitMix64) -> WireSample {
    let errors = if r.failing { 40 } else { rng.below(2) };
    WireSample {
        instance: r.instance.id.clone(),
        observation: Observation::Passive {
            requests: 100,
            errors,
        },
    }
}

/// The samples of every session's round as the authority attributes them (a node's own
/// samples to the node, relayed self-reports to their instance), interleaved one message
/// from each session in turn, as they arrive.
fn interleave(
    sessions: &[AgentSession],
    streams: &[Arc<Vec<AgentMessage>>],
) -> anyhow::Result<Arc<Vec<Sample>>> {
    let longest = streams.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..longest {
        for (session, stream) in sessions.iter().zip(streams) {
            let Some(message) = stream.get(i) else {
                continue;
            };
            let node = Reporter::Node(name(&session.node)?);
            let (samples, relayed) = match message {
                AgentMessage::Samples { samples } => (samples, false),
                AgentMessage::Relayed { samples } => (samples, true),
                AgentMessage::Hello { .. }
                | AgentMessage::Sidecars { .. }
                | AgentMessage::ClientConfig(_)
                | AgentMessage::KeyringAnswer(_) => continue,
            };
            out.extend(samples.iter().map(|w| Sample {
                instance: w.instance.clone(),
                reporter: if relayed {
                    Reporter::Instance(w.instance.clone())
                } else {
                    node.clone()
                },
                observation: w.observation.clone(),
            }));
        }
    }
    Ok(Arc::new(out))
}

/// An evaluator holding what the authority's does: the services under [`contract`] and
/// every instance, established.
fn limit_evaluator(params: &Params, estate: &[Registered]) -> anyhow::Result<Evaluator> {
    let contract = contract()
        .validate()
        .map_err(|e| anyhow::anyhow!("the bench's contract is invalid: {e}"))?;
    let now = Instant::now();
    let mut ev = Evaluator::new(EvaluatorConfig::default());
    for s in 0..params.services {
        ev.handle_service(
            now,
            name(&fleet::service_name(s))?,
            fleet::ACTOR.into(),
            contract.clone(),
        );
    }
    for r in estate {
        ev.handle_instance(now, &r.instance, Admission::Established)
            .map_err(|e| anyhow::anyhow!("{}: {e}", r.instance.id))?;
    }
    ev.take_effects();
    Ok(ev)
}

/// Replays `samples` through `ev`, round after round, until it has spent `seconds` in
/// the evaluator (one round at least). Time comes from the clock, once per chunk, as
/// samples arrive in real time at the leader; cloning a chunk is outside the timing.
async fn replay_limit(
    ev: Evaluator,
    samples: Arc<Vec<Sample>>,
    seconds: u64,
) -> anyhow::Result<(Evaluator, LimitPhase)> {
    let budget = Duration::from_secs(seconds);
    tokio::task::spawn_blocking(move || {
        let mut ev = ev;
        let applied_before = ev.stats().samples_applied;
        let transitions_before = ev.stats().transitions;
        let (mut spent, mut fed, mut changes) = (Duration::ZERO, 0u64, 0u64);
        loop {
            for chunk in samples.chunks(LIMIT_CHUNK) {
                let chunk = chunk.to_vec();
                let n = chunk.len() as u64;
                let start = Instant::now();
                if ev.poll_timeout().is_some_and(|t| t <= start) {
                    ev.handle_timeout(start);
                }
                for sample in chunk {
                    let _ = ev.handle_sample(start, sample);
                }
                // The leader consumes the effects; here they are counted and dropped.
                let effects = std::hint::black_box(ev.take_effects());
                changes += effects
                    .iter()
                    .filter(|e| matches!(e, waymark_core::evaluator::Effect::Eligibility { .. }))
                    .count() as u64;
                drop(effects);
                spent += start.elapsed();
                fed += n;
            }
            if spent >= budget || samples.is_empty() {
                break;
            }
        }
        let seconds = spent.as_secs_f64();
        let phase = LimitPhase {
            samples: fed,
            applied: ev.stats().samples_applied - applied_before,
            eligibility_changes: changes,
            transitions: ev.stats().transitions - transitions_before,
            seconds,
            per_sec: if seconds > 0.0 {
                fed as f64 / seconds
            } else {
                0.0
            },
        };
        (ev, phase)
    })
    .await
    .context("the evaluator's replay panicked")
}

/// A snapshot of what a window is measured between.
struct Mark {
    at: Instant,
    accepted: u64,
    sent: u64,
    refused: BTreeMap<String, u64>,
    metric: f64,
    authority_ticks: u64,
    own_ticks: u64,
    machine_ticks: u64,
}

impl Mark {
    async fn take(counters: &Counters, api: &Api, pid: u32) -> anyhow::Result<Self> {
        let text = api.metrics().await?;
        let metric = fleet::metric(&text, "waymark_ingest_samples_accepted_total")
            .context("no waymark_ingest_samples_accepted_total")?;
        Ok(Self {
            at: Instant::now(),
            accepted: counters.accepted.load(Ordering::Relaxed),
            sent: counters.sent.load(Ordering::Relaxed),
            refused: counters.refused(),
            metric,
            authority_ticks: cpu_ticks(&format!("/proc/{pid}/stat"))?,
            own_ticks: cpu_ticks("/proc/self/stat")?,
            machine_ticks: machine_busy_ticks()?,
        })
    }
}

/// One phase of the authority: every session streams; after the warm-up, a window is
/// measured; then the sessions stop and the authority is left to drain.
async fn measure(
    sessions: &[AgentSession],
    streams: &[Arc<Vec<AgentMessage>>],
    counters: &Counters,
    api: &Api,
    pid: u32,
    params: &Params,
) -> anyhow::Result<Phase> {
    for (s, stream) in sessions.iter().zip(streams) {
        s.control.send_replace(Some(Arc::clone(stream)));
    }
    tokio::time::sleep(Duration::from_secs(params.warmup_s)).await;
    let from = Mark::take(counters, api, pid).await?;
    tokio::time::sleep(Duration::from_secs(params.phase_s)).await;
    let to = Mark::take(counters, api, pid).await?;
    for s in sessions {
        s.control.send_replace(None);
    }
    let (drain_s, drained) = drain(counters, pid).await?;
    counters.check_errors()?;
    let tick = clock_ticks_per_sec();
    let seconds = (to.at - from.at).as_secs_f64();
    let admitted = to.accepted - from.accepted;
    let authority_cpu_s = (to.authority_ticks - from.authority_ticks) as f64 / tick;
    let other_cores = others(&from, &to) / tick / seconds;
    let mut refused = to.refused;
    for (reason, n) in &from.refused {
        if let Some(m) = refused.get_mut(reason) {
            *m -= n;
        }
    }
    refused.retain(|_, n| *n > 0);
    Ok(Phase {
        admitted,
        metric_admitted: to.metric - from.metric,
        sent: to.sent - from.sent,
        refused,
        seconds,
        per_sec: admitted as f64 / seconds,
        authority_cpu_s,
        authority_cores: authority_cpu_s / seconds,
        per_core: if authority_cpu_s > 0.0 {
            admitted as f64 / authority_cpu_s
        } else {
            0.0
        },
        sessions_cpu_s: (to.own_ticks - from.own_ticks) as f64 / tick,
        other_cores,
        drain_s,
        drained,
    })
}

/// Waits for the last acknowledgement, then for the authority to go idle (under a tenth
/// of a core over a quarter second: its queue is empty); the seconds it took, and whether
/// it did go idle.
async fn drain(counters: &Counters, pid: u32) -> anyhow::Result<(f64, bool)> {
    const LOOK: Duration = Duration::from_millis(250);
    const LONGEST: Duration = Duration::from_secs(15);
    let started = Instant::now();
    while counters.in_flight.load(Ordering::Relaxed) > 0 && started.elapsed() < LONGEST {
        counters.check_errors()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stat = format!("/proc/{pid}/stat");
    let idle_ticks = clock_ticks_per_sec() * LOOK.as_secs_f64() / 10.0;
    while started.elapsed() < LONGEST {
        let before = cpu_ticks(&stat)?;
        tokio::time::sleep(LOOK).await;
        if ((cpu_ticks(&stat)? - before) as f64) < idle_ticks {
            return Ok((started.elapsed().as_secs_f64(), true));
        }
    }
    Ok((started.elapsed().as_secs_f64(), false))
}

/// User plus system CPU time of a process so far, in clock ticks (`/proc/<pid>/stat`
/// fields 14 and 15, counted after the parenthesised command name).
fn cpu_ticks(stat: &str) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(stat).with_context(|| format!("reading {stat}"))?;
    parse_cpu_ticks(&text).with_context(|| format!("{stat} has no CPU times"))
}

pub(crate) fn parse_cpu_ticks(text: &str) -> Option<u64> {
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Ticks the rest of the machine was busy between two marks.
fn others(from: &Mark, to: &Mark) -> f64 {
    let all = to.machine_ticks.saturating_sub(from.machine_ticks);
    let ours = (to.authority_ticks - from.authority_ticks) + (to.own_ticks - from.own_ticks);
    all.saturating_sub(ours) as f64
}

/// Every CPU's busy time so far (`/proc/stat`'s first line, all but idle and iowait), in
/// clock ticks.
fn machine_busy_ticks() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    parse_busy_ticks(&text).context("/proc/stat has no cpu line")
}

fn parse_busy_ticks(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest is inside user already).
    let busy: u64 = fields.iter().take(8).sum::<u64>() - fields.get(3)? - fields.get(4)?;
    Some(busy)
}

/// `getconf CLK_TCK`; 100, Linux's value everywhere in practice, if it cannot say.
pub(crate) fn clock_ticks_per_sec() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .filter(|t: &f64| *t > 0.0)
            .unwrap_or(100.0)
    })
}

#[allow(clippy::too_many_arguments)]
fn report(
    params: Params,
    bin: &Path,
    instances: usize,
    probe_assignments: usize,
    round: Mix,
    waymark_phases: Vec<Phase>,
    limit_phases: Vec<LimitPhase>,
    limit_rejected: BTreeMap<String, u64>,
) -> IngestReport {
    let spread =
        |f: &dyn Fn(&Phase) -> f64| Spread::of(&waymark_phases.iter().map(f).collect::<Vec<_>>());
    let samples_per_sec = spread(&|p| p.per_sec);
    let limit = Spread::of(&limit_phases.iter().map(|p| p.per_sec).collect::<Vec<_>>());
    IngestReport {
        bench: "ingest",
        waymark_bin: bin.display().to_string(),
        instances,
        probe_assignments,
        round,
        per_core_samples_per_sec: spread(&|p| p.per_core),
        authority_cores: spread(&|p| p.authority_cores),
        ratio: if limit.median > 0.0 {
            samples_per_sec.median / limit.median
        } else {
            0.0
        },
        meets_target: samples_per_sec.median >= TARGET_SAMPLES_PER_SEC,
        target_samples_per_sec: TARGET_SAMPLES_PER_SEC,
        samples_per_sec,
        limit_samples_per_sec: limit,
        limit_rejected,
        waymark_phases,
        limit_phases,
        params,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_are_read_after_the_command_name() {
        // A command name with spaces and a parenthesis must not shift the fields.
        let stat = "4242 (way mark) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 750 250 0 0 20 0 9 0";
        assert_eq!(parse_cpu_ticks(stat), Some(1_000));
        assert_eq!(parse_cpu_ticks("4242 (waymark"), None);
        let stat = "cpu  100 5 50 900 40 3 2 0 7 0\ncpu0 50 2 25 450 20 1 1 0 3 0\n";
        assert_eq!(parse_busy_ticks(stat), Some(160));
    }

    #[test]
    fn the_estate_lives_on_the_sessions_of_its_own_zone() {
        let params = Params {
            services: 4,
            estate: 120,
            sessions: 7,
            batch: 512,
            window: 4,
            backoff_ms: 0,
            rate: 0,
            warmup_s: 0,
            phase_s: 1,
            limit_s: 1,
            repeats: 1,
            failing_permille: 30,
            seed: 1,
        };
        let zones = zones(params.sessions);
        let mut hosts = BTreeSet::new();
        for n in 0..params.estate {
            let z = (n / params.services) % zones.len();
            let host = host_of(n, z, &params, &zones);
            let k: usize = host["node-".len()..].parse().unwrap();
            assert_eq!(node_of(k, &zones).1, zones[z], "instance {n} on {host}");
            hosts.insert(host);
        }
        assert_eq!(
            hosts.len(),
            params.sessions,
            "every session hosts instances"
        );
        assert_eq!(zones.len(), 3);
    }

    #[test]
    fn messages_alternate_between_own_samples_and_relayed_ones() {
        let w = |i: &str| WireSample {
            instance: name(i).unwrap(),
            observation: Observation::SelfReport(SelfReport::Ready),
        };
        let own = vec![w("a"), w("b"), w("c")];
        let relayed = vec![w("d")];
        let kinds: Vec<(bool, usize)> = batches(own, relayed, 2)
            .iter()
            .map(|m| match m {
                AgentMessage::Samples { samples } => (false, samples.len()),
                AgentMessage::Relayed { samples } => (true, samples.len()),
                other => unreachable!("only samples in a stream: {other:?}"),
            })
            .collect();
        assert_eq!(kinds, vec![(false, 2), (true, 1), (false, 1)]);
    }
}
