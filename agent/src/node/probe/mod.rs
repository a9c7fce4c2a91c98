//! The prober: probes the targets the authority assigned this node and sends back samples.
//!
//! [`ProbeSchedule`] (pure) decides what runs when; [`Prober`] is its driver: one task owns
//! the schedule, spawns each run, and forwards current results as [`WireSample`]s.
//!
//! ```text
//! set_targets ──► driver ──► ProbeSchedule ──► Start ──► Check::probe (HTTP / TCP / gRPC)
//!                   ▲                          Stop  ──► abort the run        │
//!                   └──────────── handle_done ◄───────────────────────────────┘
//!                   └──► samples: mpsc::Sender<WireSample>
//! ```
//!
//! Mapping (see [`check`]): refused is the only hard failure; a deadline is `Timeout`; an
//! answer that says no (non-2xx, `NOT_SERVING`) or any other error is `Fail` with a detail.
//!
//! Guarantees: after [`Prober::applied`] returns, no sample of a removed target is sent;
//! at most `concurrency` probes are in flight; a probe that finds no slot for a whole
//! interval is skipped and counted (`waymark_probes_skipped_total{reason="concurrency"}`).
//!
//! No connection is opened to an address the [`AddressPolicy`] refuses (loopback,
//! link-local, cloud metadata, … unless allowed): such a target is never scheduled, its
//! refusal is logged, counted once (`waymark_probe_targets_refused_total{reason}`) and
//! listed by [`Prober::refusals`]; it sends no samples, so it reads as silent (`unknown`).

mod check;
mod grpc;
mod http;
mod metrics;
pub mod policy;
mod schedule;
mod tcp;

use std::collections::BTreeMap;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinError, JoinHandle, JoinSet};
use tokio::time::Instant;
use tracing::{Instrument, debug, error, info, warn};
use waymark_core::model::{Health, InstanceId};

pub use check::{
    BODY_MATCH_LEN_MAX, Check, GrpcCheck, HttpCheck, Outcome, ProbeError, TARGET_TEXT_LEN_MAX,
};
pub use metrics::{KindLabels, ProbeLabels, ProberMetrics, SkipLabels};
pub use policy::{AddressPolicy, Cidr, Denied};
pub use schedule::{Effect, INTERVAL_MIN, ProbeSchedule, RunId, ScheduleConfig, SkipReason};

use crate::evidence::{ProbeTarget, WireSample};

/// How the prober runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProberConfig {
    /// Probes in flight at once, at most.
    pub concurrency: NonZeroUsize,
    /// Seed for start offsets; `None` draws one from the process's hash seed.
    pub seed: Option<u64>,
    /// Which target addresses may be probed.
    pub policy: AddressPolicy,
}

impl Default for ProberConfig {
    fn default() -> Self {
        Self {
            concurrency: NonZeroUsize::new(64).unwrap_or(NonZeroUsize::MIN),
            seed: None,
            policy: AddressPolicy::default(),
        }
    }
}

/// A target the address policy refused: not probed, listed here.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProbeRefusal {
    /// The instance.
    pub instance: InstanceId,
    /// Its address.
    pub address: SocketAddr,
    /// The class of address that was refused.
    pub reason: Denied,
}

/// Why a prober call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProberError {
    /// The driver has stopped (the sample receiver was dropped, or it panicked); nothing
    /// is probed any more. Start a new prober.
    #[error("prober stopped")]
    Stopped,
}

/// Handle to a running prober. Dropping it stops the driver and every probe in flight.
#[derive(Debug)]
pub struct Prober {
    assignment: watch::Sender<Assignment>,
    applied: watch::Receiver<u64>,
    refusals: watch::Receiver<Vec<ProbeRefusal>>,
    metrics: ProberMetrics,
}

/// The latest target set and its version (bumped by every `set_targets`).
#[derive(Debug, Default)]
struct Assignment {
    version: u64,
    targets: Vec<ProbeTarget>,
}

// === impl Prober ===

impl Prober {
    /// Spawn the driver on the current tokio runtime. Samples go to `samples`; when it is
    /// full a sample is dropped and counted rather than stalling the schedule (a silent
    /// target is `unknown`, not failing). The driver ends when the [`Prober`] is dropped or
    /// the receiver closes; the handle says when.
    pub fn start(
        config: ProberConfig,
        samples: mpsc::Sender<WireSample>,
    ) -> (Self, JoinHandle<()>) {
        let seed = config
            .seed
            .unwrap_or_else(|| RandomState::new().hash_one("waymark-prober"));
        let (assignment, assignment_rx) = watch::channel(Assignment::default());
        let (applied_tx, applied) = watch::channel(0);
        let (refusals_tx, refusals) = watch::channel(Vec::new());
        let metrics = ProberMetrics::default();
        let driver = ProberDriver {
            policy: config.policy,
            refusals: refusals_tx,
            schedule: ProbeSchedule::new(ScheduleConfig {
                concurrency: config.concurrency,
                seed,
            }),
            assignment: assignment_rx,
            applied: applied_tx,
            samples,
            metrics: metrics.clone(),
            tasks: JoinSet::new(),
            runs: BTreeMap::new(),
            handles: BTreeMap::new(),
        };
        let span = tracing::info_span!("prober", concurrency = config.concurrency.get());
        let handle = tokio::spawn(driver.run().instrument(span));
        let prober = Self {
            assignment,
            applied,
            refusals,
            metrics,
        };
        (prober, handle)
    }

    /// Replace the whole target set (the authority sends it whole whenever it changes).
    /// Returns at once; the driver applies the latest set it has seen.
    pub fn set_targets(&self, targets: Vec<ProbeTarget>) {
        self.assignment.send_modify(|a| {
            a.version += 1;
            a.targets = targets;
        });
    }

    /// Wait until the driver has applied the last [`set_targets`](Self::set_targets):
    /// from then on, removed targets send nothing.
    pub async fn applied(&self) -> Result<(), ProberError> {
        let wanted = self.assignment.borrow().version;
        let mut applied = self.applied.clone();
        applied
            .wait_for(|v| *v >= wanted)
            .await
            .map(|_| ())
            .map_err(|_| ProberError::Stopped)
    }

    /// The targets of the current assignment the address policy refused, updated with
    /// each applied assignment.
    pub fn refusals(&self) -> watch::Receiver<Vec<ProbeRefusal>> {
        self.refusals.clone()
    }

    /// The prober's metrics; clones share the series.
    pub fn metrics(&self) -> &ProberMetrics {
        &self.metrics
    }

    /// Register the prober's metrics under `waymark_`.
    pub fn register(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }
}

/// What a finished run hands back to the driver.
#[derive(Debug)]
struct Done {
    run: RunId,
    instance: InstanceId,
    kind: &'static str,
    outcome: Outcome,
    elapsed: Duration,
}

/// The task that owns the schedule.
struct ProberDriver {
    policy: AddressPolicy,
    refusals: watch::Sender<Vec<ProbeRefusal>>,
    schedule: ProbeSchedule,
    assignment: watch::Receiver<Assignment>,
    applied: watch::Sender<u64>,
    samples: mpsc::Sender<WireSample>,
    metrics: ProberMetrics,
    tasks: JoinSet<Done>,
    /// Task → run, to free a slot when a run panics.
    runs: BTreeMap<tokio::task::Id, RunId>,
    handles: BTreeMap<RunId, AbortHandle>,
}

/// Whether the driver goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

// === impl ProberDriver ===

impl ProberDriver {
    async fn run(mut self) {
        info!("prober started");
        loop {
            let wake = self.schedule.poll_timeout().map(Instant::from_std);
            let flow = tokio::select! {
                changed = self.assignment.changed() => match changed {
                    Ok(()) => self.apply_assignment(),
                    Err(_) => Flow::Stop,
                },
                Some(joined) = self.tasks.join_next_with_id() => self.finish(joined),
                () = self.samples.closed() => {
                    info!("probe sample receiver closed");
                    Flow::Stop
                }
                () = sleep_until(wake) => {
                    self.schedule.handle_timeout(now());
                    self.execute();
                    Flow::Continue
                }
            };
            if flow == Flow::Stop {
                break;
            }
        }
        // Dropping the join set aborts every run in flight.
        info!("prober stopped");
    }

    fn apply_assignment(&mut self) -> Flow {
        let (version, targets) = {
            let a = self.assignment.borrow_and_update();
            (a.version, a.targets.clone())
        };
        let targets = self.admit(targets);
        let count = targets.len();
        self.schedule.handle_targets(now(), targets);
        self.execute();
        self.metrics
            .targets
            .set(i64::try_from(self.schedule.len()).unwrap_or(i64::MAX));
        debug!(version, targets = count, "probe targets applied");
        self.applied.send_replace(version);
        Flow::Continue
    }

    /// The targets the address policy allows; the others are listed as refusals, and
    /// counted and logged the first time they are refused.
    fn admit(&mut self, targets: Vec<ProbeTarget>) -> Vec<ProbeTarget> {
        let mut refused = Vec::new();
        let allowed = targets
            .into_iter()
            .filter(|t| {
                let address = SocketAddr::new(t.address.ip, t.address.port);
                match self.policy.check(address.ip()) {
                    Ok(()) => true,
                    Err(reason) => {
                        refused.push(ProbeRefusal {
                            instance: t.instance.clone(),
                            address,
                            reason,
                        });
                        false
                    }
                }
            })
            .collect();
        let before = self.refusals.borrow().clone();
        for r in refused.iter().filter(|r| !before.contains(r)) {
            self.metrics
                .refused
                .get_or_create(&SkipLabels {
                    reason: r.reason.as_str(),
                })
                .inc();
            warn!(endpoint = %r.instance, address = %r.address, reason = %r.reason, "probe target refused by the address policy (allow it with [agent.probe] allow_cidrs)");
        }
        self.refusals.send_replace(refused);
        allowed
    }

    fn execute(&mut self) {
        for effect in self.schedule.take_effects() {
            match effect {
                Effect::Start { run, target } => self.spawn(run, target),
                Effect::Stop { run } => {
                    if let Some(handle) = self.handles.remove(&run) {
                        handle.abort();
                    }
                }
                Effect::Skip { instance, reason } => {
                    let reason = match reason {
                        SkipReason::Concurrency => "concurrency",
                        SkipReason::Overlap => "overlap",
                    };
                    self.metrics
                        .skipped
                        .get_or_create(&SkipLabels { reason })
                        .inc();
                    debug!(endpoint = %instance, reason, "probe skipped");
                }
            }
        }
    }

    fn spawn(&mut self, run: RunId, target: ProbeTarget) {
        let check = Check::from_kind(&target.probe.kind);
        let addr = SocketAddr::new(target.address.ip, target.address.port);
        let timeout = target.probe.timeout;
        let instance = target.instance;
        let probe = async move {
            let started = Instant::now();
            let outcome = check.probe(addr, timeout).await;
            Done {
                run,
                instance,
                kind: check.kind_label(),
                outcome,
                elapsed: started.elapsed(),
            }
        };
        let handle = self.tasks.spawn(probe.in_current_span());
        self.runs.insert(handle.id(), run);
        self.handles.insert(run, handle);
    }

    fn finish(&mut self, joined: Result<(tokio::task::Id, Done), JoinError>) -> Flow {
        let done = match joined {
            Ok((task, done)) => {
                self.runs.remove(&task);
                done
            }
            Err(e) => {
                let run = self.runs.remove(&e.id());
                if let Some(run) = run {
                    self.handles.remove(&run);
                    if e.is_panic() {
                        error!(error = %e, "probe task panicked");
                        self.schedule.handle_done(now(), run);
                        self.execute();
                    }
                }
                // A cancelled run was stopped by the schedule; its slot is already free.
                return Flow::Continue;
            }
        };
        self.handles.remove(&done.run);
        let current = self.schedule.handle_done(now(), done.run);
        self.execute();
        if !current {
            return Flow::Continue;
        }
        self.record(&done);
        let sample = WireSample {
            instance: done.instance,
            observation: done.outcome.into_observation(),
        };
        match self.samples.try_send(sample) {
            Ok(()) => Flow::Continue,
            Err(mpsc::error::TrySendError::Full(sample)) => {
                self.metrics.samples_dropped.inc();
                warn!(endpoint = %sample.instance, "probe sample dropped: channel full");
                Flow::Continue
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                info!("probe sample receiver closed");
                Flow::Stop
            }
        }
    }

    fn record(&self, done: &Done) {
        let health = health_label(done.outcome.health);
        self.metrics
            .probes
            .get_or_create(&ProbeLabels {
                kind: done.kind,
                health,
            })
            .inc();
        self.metrics
            .duration_seconds
            .get_or_create(&KindLabels { kind: done.kind })
            .observe(done.elapsed.as_secs_f64());
        debug!(
            endpoint = %done.instance,
            kind = done.kind,
            health,
            detail = done.outcome.detail.as_deref(),
            latency_ms = u64::try_from(done.elapsed.as_millis()).unwrap_or(u64::MAX),
            "probe done"
        );
    }
}

fn health_label(health: Health) -> &'static str {
    match health {
        Health::Pass => "pass",
        Health::Fail => "fail",
        Health::Timeout => "timeout",
        Health::Refused => "refused",
    }
}

/// The driver's clock, for the schedule. tokio's, so paused-time tests work.
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
