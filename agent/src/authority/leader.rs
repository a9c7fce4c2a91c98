//! The leader's shell: a loop that feeds one [`LeaderTerm`] while this member leads and
//! executes what it asks for.
//!
//! Every decision — the hold after an election, lease restart before expiry, prober
//! reassignment, tier 2 from peer regions, the front-door signal, audit records and
//! metric changes — is the term's (`waymark_registry::term`, pure, tested without a
//! socket). This module only moves bytes: samples, denials and committed entries in;
//! releases to the publisher, records to the auditor, proposals to Raft, metric changes
//! to the registry of series out; and the API's questions about the pipeline answered
//! by the task that owns it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};
use waymark_core::assembler::RemoteEndpoint;
use waymark_core::backoff::{Backoff, BackoffConfig};
use waymark_core::model::{InstanceId, NodeName, RegionName, Sample, ServiceName, ZoneName};
use waymark_core::view::{ReleasedView, ViewKey};
use waymark_registry::machine::{AuditEntry, AuthorityState, Request, Response, registry_applied};
use waymark_registry::pipeline::{PipelineConfig, RegionPipeline};
use waymark_registry::release::{Release, ReleaseEncoder};
use waymark_registry::state::RegistryError;
use waymark_registry::term::{
    HandOver, LeaderCommand, LeaderTerm, MetricChange, Purpose, Surroundings, TermBreaks,
    TermConfig, Written,
};

use super::clock::now_ms;
use super::hub::{Denial, EvidenceHub, LeaderFeed};
use super::metrics::{
    AuthorityMetrics, ModeLabels, OutcomeLabels, PeerRegionLabels, ReasonLabels, ServiceLabels,
    VerdictLabels, ZoneLabels,
};
use super::raft::{AppliedEntry, RaftNode, StateEvent, TransferError, WriteError};
use super::regions::RegionsHandle;

pub use waymark_registry::term::{HOLD_MAX, OBSERVED_EVERY, PROBERS_PER_TARGET, SIGNAL_ACTOR};

/// A question about the leader's pipeline, answered on the loop that owns it: with the
/// pipeline and the loop's `now` while leading, with `None` otherwise.
pub type Query = Box<dyn FnOnce(Option<(&RegionPipeline, std::time::Instant)>) + Send>;

/// Questions waiting for the loop; an asker beyond waits for room (up to its timeout).
pub const QUERIES_MAX: usize = 64;
/// Lease renewals waiting for the loop; one beyond is refused as busy at once (its agent
/// retries well inside the lease).
pub const RENEWALS_MAX: usize = 8_192;
/// Renewals the loop answers as one input.
const RENEWALS_RUN_MAX: usize = 4_096;
/// The longest an asker waits for an answer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// A lease renewal on its way to the leader's term, and where its answer goes.
#[derive(Debug)]
pub struct Renewal {
    instance: InstanceId,
    reply: oneshot::Sender<Result<u64, RenewError>>,
}

/// Why a renewal was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenewError {
    /// This member does not lead (or stopped leading before it answered).
    #[error("this member does not lead")]
    NotLeader,
    /// The registry refuses it: unknown, retired or unleased instance.
    #[error(transparent)]
    Refused(RegistryError),
    /// Too many renewals are waiting; retry.
    #[error("{RENEWALS_MAX} renewals are waiting already")]
    Busy,
}

impl RenewError {
    /// The `outcome` label of `waymark_lease_renewals_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotLeader => "not_leader",
            Self::Refused(_) => "refused",
            Self::Busy => "busy",
        }
    }
}

/// What [`run`] receives from the handles.
#[derive(Debug)]
pub struct LeaderInbox {
    queries: mpsc::Receiver<Query>,
    renewals: mpsc::Receiver<Renewal>,
}

/// How the API asks the leader's pipeline (`explain`, the checks a routing control
/// passes before it is committed) and hands it lease renewals.
#[derive(Debug, Clone)]
pub struct LeaderHandle {
    tx: mpsc::Sender<Query>,
    renewals: mpsc::Sender<Renewal>,
}

impl LeaderHandle {
    /// A handle, and the receiving end for [`run`].
    pub fn new() -> (Self, LeaderInbox) {
        let (tx, queries) = mpsc::channel(QUERIES_MAX);
        let (renewals, renewals_rx) = mpsc::channel(RENEWALS_MAX);
        (
            Self { tx, renewals },
            LeaderInbox {
                queries,
                renewals: renewals_rx,
            },
        )
    }

    /// Renew a registered instance's lease with the leader's term: answered with the
    /// lease's new end (unix ms) without a log entry
    /// ([`LeaderTerm::handle_renewals`]).
    pub async fn renew(&self, instance: InstanceId) -> Result<u64, RenewError> {
        let (reply, answer) = oneshot::channel();
        self.renewals
            .try_send(Renewal { instance, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => RenewError::Busy,
                mpsc::error::TrySendError::Closed(_) => RenewError::NotLeader,
            })?;
        tokio::time::timeout(QUERY_TIMEOUT, answer)
            .await
            .map_err(|_| RenewError::Busy)?
            .unwrap_or(Err(RenewError::NotLeader))
    }

    /// Ask the pipeline; `None` when this member does not lead (or is rebuilding, or the
    /// loop did not answer in time).
    pub async fn ask<T: Send + 'static>(
        &self,
        question: impl FnOnce(&RegionPipeline, std::time::Instant) -> T + Send + 'static,
    ) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        let query: Query = Box::new(move |pipeline| {
            let _ = reply.send(pipeline.map(|(p, now)| question(p, now)));
        });
        let asked = async {
            self.tx.send(query).await.ok()?;
            answer.await.ok().flatten()
        };
        tokio::time::timeout(QUERY_TIMEOUT, asked)
            .await
            .ok()
            .flatten()
    }
}

/// What the loop needs.
#[derive(Debug, Clone)]
pub struct LeaderContext {
    /// This member's Raft.
    pub raft: RaftNode,
    /// The evidence hub.
    pub hub: EvidenceHub,
    /// Metrics.
    pub metrics: AuthorityMetrics,
    /// The region's pipeline configuration.
    pub pipeline: PipelineConfig,
    /// Peer regions' aggregates and the front-door signal, when this member federates.
    pub regions: Option<RegionsHandle>,
    /// A `Publish` commit slower than this reports delivery pressure, so admissions are
    /// shed (`[authority.limits] publish_pressure_after`); `None` when shedding is off
    /// (`shed_admissions = false`).
    pub pressure_after: Option<Duration>,
    /// Where the instants of this leader's releases go, for this member's xDS tier to
    /// time each client's acknowledgement from the release (see [`super::tier`]).
    pub releases: super::tier::ReleaseInstants,
}

/// The leader loop on a thread of its own, with a single-threaded runtime for it and the
/// writers it starts (publisher, auditor).
///
/// A step of the loop is synchronous work that grows with the region: following a run of
/// committed entries, assembling the services they touched, releasing views. On the
/// runtime that serves the API and drives Raft, each long step held one of its workers,
/// and every request and commit queued behind it waited too (under `bench writes` at the
/// reference estate the loop took about 40 % of that runtime's samples; moved off it, the
/// member acknowledged about a fifth more writes). On its own thread the loop competes for
/// the CPU only through the operating system's scheduler, and the request path's tasks
/// always find a worker.
#[derive(Debug)]
pub struct LeaderThread {
    /// Dropped or sent: the loop stops at its next await point.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Sent when the thread's runtime, and every task it held, is gone.
    done: tokio::sync::oneshot::Receiver<()>,
}

impl LeaderThread {
    /// Start [`run`] on a new thread named `waymark-leader`.
    pub fn spawn(ctx: LeaderContext, inbox: LeaderInbox) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("waymark-leader")
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (finished, done) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("waymark-leader".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        () = run(ctx, inbox) => {}
                        _ = stopped => debug!("leader loop stopped"),
                    }
                });
                // Drops the publisher and auditor with the runtime, before saying so.
                drop(runtime);
                let _ = finished.send(());
            })?;
        Ok(Self {
            stop: Some(stop),
            done,
        })
    }

    /// Stop the loop and wait until its thread let go of everything it held.
    pub async fn stop(mut self) {
        drop(self.stop.take());
        let _ = (&mut self.done).await;
    }
}

/// Lead whenever this member is the leader, until Raft stops. Questions asked while not
/// leading are answered with `None` at once.
async fn run(ctx: LeaderContext, mut inbox: LeaderInbox) {
    let mut metrics_rx = ctx.raft.watch_metrics();
    loop {
        let term = loop {
            let (leading, term) = {
                let m = metrics_rx.borrow_and_update();
                (m.state.is_leader(), m.current_term)
            };
            ctx.metrics
                .term
                .set(i64::try_from(term).unwrap_or(i64::MAX));
            if leading {
                break term;
            }
            tokio::select! {
                changed = metrics_rx.changed() => if changed.is_err() { return },
                Some(query) = inbox.queries.recv() => query(None),
                Some(renewal) = inbox.renewals.recv() => {
                    ctx.metrics.lease_renewals.get_or_create(&outcome("not_leader")).inc();
                    let _ = renewal.reply.send(Err(RenewError::NotLeader));
                }
            }
        };
        info!(term, "leading: rebuilding computed state");
        ctx.metrics.leader.set(1);
        lead_term(&ctx, term, &mut metrics_rx, &mut inbox).await;
        ctx.hub.follow();
        ctx.metrics.leader.set(0);
        ctx.metrics.publish_refused.set(0);
        info!(term, "no longer leading");
    }
}

type Metrics = openraft::RaftMetrics<u64, super::raft::Member>;

async fn lead_term(
    ctx: &LeaderContext,
    term: u64,
    metrics: &mut watch::Receiver<Metrics>,
    inbox: &mut LeaderInbox,
) {
    let feed = ctx.hub.lead();
    let events = ctx.raft.subscribe();
    let env = Env::new(ctx);
    let config = TermConfig {
        term,
        pipeline: ctx.pipeline.clone(),
        breaks: TermBreaks::default(),
    };
    let mut core = LeaderTerm::new(config, now(), &env);
    let mut applied = env.read_index();
    let (publish, publish_rx) = mpsc::unbounded_channel();
    let (audit, audit_rx) = mpsc::unbounded_channel();
    let (written, written_rx) = mpsc::unbounded_channel();
    // At most one hand-over is in flight (the term asks for the next after this reports).
    let (handed, handed_rx) = mpsc::channel(1);
    let (pressure_tx, pressure) = watch::channel(0u64);
    let writers = [
        tokio::spawn(publisher(ctx.clone(), publish_rx, pressure_tx)),
        tokio::spawn(auditor(ctx.raft.clone(), ctx.metrics.clone(), audit_rx)),
    ];
    let shell = Shell {
        ctx,
        term,
        publish,
        audit,
        written,
    };
    let mut inputs = Inputs {
        term,
        metrics,
        queries: &mut inbox.queries,
        renewals: &mut inbox.renewals,
        feed,
        events,
        membership: ctx.hub.membership(),
        pressure,
        written: written_rx,
        hand_over: handed_rx,
        stashed: None,
    };
    let mut last_fired: Option<Instant> = None;
    let mut decided: Option<Decided> = None;
    loop {
        if shell.execute(core.take_commands(), decided.take()) {
            // A new term gets a fresh version space; its leader (another voter) rebuilds
            // every view from the desired state and releases it. The transfer holds writes
            // for seconds, so it runs beside the loop and reports back.
            tokio::spawn(hand_over(ctx.raft.clone(), term, handed.clone()));
        }
        // Timers due within one tick of the last firing wait for the tick and fire
        // together: each firing assembles every view it touched, and at the reference
        // estate thousands of per-instance timers a second would otherwise each pay that.
        let deadline = core
            .poll_timeout()
            .map(Instant::from_std)
            .map(|d| last_fired.map_or(d, |last| d.max(last + TIMER_TICK)));
        let input = inputs.next(deadline).await;
        if matches!(input, Input::Timeout) {
            last_fired = Some(Instant::now());
        }
        decided = Decided::of(&input);
        if !step(&mut core, &env, &mut applied, input) {
            break;
        }
    }
    for w in writers {
        w.abort();
    }
}

/// Move leadership to the most caught-up other voter, and tell the term how it went.
async fn hand_over(raft: RaftNode, term: u64, report: mpsc::Sender<HandOver>) {
    let outcome = match raft.transfer_leader(None).await {
        Ok(done) => {
            info!(
                term,
                to = done.leader,
                new_term = done.term,
                "leadership handed over: versions exhausted"
            );
            HandOver::Moved
        }
        // Someone else leads already: this term is over either way.
        Err(TransferError::NotLeader { .. }) => HandOver::Moved,
        Err(TransferError::NoTarget) => HandOver::NoOtherVoter,
        Err(error) => {
            warn!(term, %error, "handing leadership over failed; the term asks again");
            HandOver::Failed
        }
    };
    let _ = report.send(outcome).await;
}

/// Feed one input to the term; `false` once this member no longer leads it.
fn step(core: &mut LeaderTerm, env: &Env<'_>, applied: &mut Option<u64>, input: Input) -> bool {
    match input {
        Input::Deposed | Input::Event(Err(RecvError::Closed)) => return false,
        Input::Samples(samples) => {
            for error in core.handle_samples(now(), samples) {
                debug!(%error, "sample refused by the evaluator");
            }
        }
        Input::Denial(denial) => core.handle_denial(denial),
        Input::Pressure => core.handle_pressure(now(), true),
        Input::Written(purpose, outcome) => core.handle_written(now(), purpose, outcome),
        Input::HandOver(outcome) => core.handle_hand_over(now(), outcome),
        Input::Applied(entries) => {
            let fresh: Vec<_> = entries
                .iter()
                .filter(|e| applied.is_none_or(|a| e.index > a))
                .collect();
            let Some(last) = fresh.last() else {
                return true;
            };
            *applied = Some(last.index);
            let done = fresh
                .iter()
                .flat_map(|e| registry_applied(&e.request, &e.response));
            core.handle_applied_all(now(), done, env);
        }
        // A snapshot was installed, or the loop fell behind the log.
        Input::Event(event) => {
            match event {
                Err(RecvError::Lagged(missed)) => {
                    warn!(missed, applied = ?*applied, "leader fell behind the log");
                }
                Ok(StateEvent::SnapshotInstalled { index }) => {
                    info!(index, "a snapshot was installed under the leader");
                }
                _ => {}
            }
            core.handle_rebuild(now(), env);
            *applied = env.read_index();
        }
        Input::StillLeading => {}
        Input::Membership => core.handle_membership_changed(),
        Input::Query(query) => query(Some((core.pipeline(), now()))),
        Input::Renewals(run) => {
            let (instances, replies): (Vec<_>, Vec<_>) =
                run.into_iter().map(|r| (r.instance, r.reply)).unzip();
            let answers = core.handle_renewals(now(), &instances, env);
            for (reply, answer) in replies.into_iter().zip(answers) {
                let answer = answer.map_err(RenewError::Refused);
                let label = answer
                    .as_ref()
                    .map_or_else(RenewError::label, |_| "renewed");
                env.ctx
                    .metrics
                    .lease_renewals
                    .get_or_create(&outcome(label))
                    .inc();
                let _ = reply.send(answer);
            }
        }
        Input::Timeout => core.handle_timeout(now(), env),
    }
    true
}

/// Samples the loop takes from the hub's queue at once: enough that assembly is paid once
/// per run rather than per sample, few enough that timers and committed entries are not
/// kept waiting behind a flood.
const SAMPLES_RUN_MAX: usize = 4096;

/// What the loop waits on while it leads.
struct Inputs<'a> {
    term: u64,
    metrics: &'a mut watch::Receiver<Metrics>,
    queries: &'a mut mpsc::Receiver<Query>,
    renewals: &'a mut mpsc::Receiver<Renewal>,
    feed: LeaderFeed,
    events: broadcast::Receiver<StateEvent>,
    membership: watch::Receiver<u64>,
    /// Slow `Publish` commits so far: a count, so none is missed between two reads.
    pressure: watch::Receiver<u64>,
    written: mpsc::UnboundedReceiver<(Purpose, Written)>,
    hand_over: mpsc::Receiver<HandOver>,
    /// A state event read while collecting an applied run, followed next.
    stashed: Option<Result<StateEvent, RecvError>>,
}

/// The next thing that happened.
enum Input {
    /// This member no longer leads this term.
    Deposed,
    /// Raft's metrics changed, and this member still leads this term.
    StillLeading,
    /// Admitted samples: every one already queued when the first arrived (up to
    /// [`SAMPLES_RUN_MAX`]), evaluated together and assembled once.
    Samples(Vec<Sample>),
    Denial(Denial),
    /// A `Publish` commit was slow (one or more since the last read).
    Pressure,
    Written(Purpose, Written),
    HandOver(HandOver),
    /// Applied entries, in log order: every one already waiting when the first arrived
    /// (up to [`APPLIED_RUN_MAX`]), so a loop that falls behind catches up in runs whose
    /// services are assembled once, instead of once per entry.
    Applied(Vec<Arc<AppliedEntry>>),
    /// Any other state event: a snapshot installed, the log lost to lag, or the end.
    Event(Result<StateEvent, RecvError>),
    Membership,
    Query(Query),
    /// Lease renewals: every one already queued when the first arrived (up to
    /// [`RENEWALS_RUN_MAX`]), answered together under one read of the state.
    Renewals(Vec<Renewal>),
    Timeout,
}

impl Inputs<'_> {
    async fn next(&mut self, deadline: Option<Instant>) -> Input {
        if let Some(event) = self.stashed.take() {
            return Input::Event(event);
        }
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = self.metrics.changed() => {
                let still = changed.is_ok() && {
                    let m = self.metrics.borrow_and_update();
                    m.state.is_leader() && m.current_term == self.term
                };
                if still { Input::StillLeading } else { Input::Deposed }
            }
            Some(first) = self.feed.samples.recv() => {
                Input::Samples(queued_run(first, &mut self.feed.samples, SAMPLES_RUN_MAX))
            }
            Some(denial) = self.feed.denials.recv() => Input::Denial(denial),
            Ok(()) = self.pressure.changed() => {
                self.pressure.borrow_and_update();
                Input::Pressure
            }
            Some((purpose, outcome)) = self.written.recv() => Input::Written(purpose, outcome),
            Some(outcome) = self.hand_over.recv() => Input::HandOver(outcome),
            event = self.events.recv() => self.applied_run(event),
            _ = self.membership.changed() => Input::Membership,
            Some(query) = self.queries.recv() => Input::Query(query),
            Some(first) = self.renewals.recv() => {
                Input::Renewals(queued_run(first, self.renewals, RENEWALS_RUN_MAX))
            }
            () = sleep => Input::Timeout,
        }
    }

    /// `first`, and the applied entries queued behind it, as one input.
    fn applied_run(&mut self, first: Result<StateEvent, RecvError>) -> Input {
        let Ok(StateEvent::Applied(entry)) = first else {
            return Input::Event(first);
        };
        let (run, stashed) = applied_run(entry, &mut self.events, APPLIED_RUN_MAX);
        self.stashed = stashed;
        Input::Applied(run)
    }
}

/// `first` and what is already queued behind it on `rx`, up to `max` in all.
fn queued_run<T>(first: T, rx: &mut mpsc::Receiver<T>, max: usize) -> Vec<T> {
    let mut run = vec![first];
    while run.len() < max {
        match rx.try_recv() {
            Ok(next) => run.push(next),
            Err(_) => break,
        }
    }
    run
}

/// `first` and the applied entries already queued behind it, up to `max`; the event that
/// ended the run, when it was not an applied entry, is returned to be followed after it.
fn applied_run(
    first: Arc<AppliedEntry>,
    events: &mut broadcast::Receiver<StateEvent>,
    max: usize,
) -> (
    Vec<Arc<AppliedEntry>>,
    Option<Result<StateEvent, RecvError>>,
) {
    let mut run = vec![first];
    while run.len() < max {
        match events.try_recv() {
            Ok(StateEvent::Applied(entry)) => run.push(entry),
            Err(TryRecvError::Empty) => break,
            Ok(other) => return (run, Some(Ok(other))),
            Err(TryRecvError::Lagged(missed)) => {
                return (run, Some(Err(RecvError::Lagged(missed))));
            }
            Err(TryRecvError::Closed) => return (run, Some(Err(RecvError::Closed))),
        }
    }
    (run, None)
}

/// Shortest time between two firings of the term's timers: a timer fires at most this late
/// (against budgets of seconds), and a busy leader assembles a touched view at most once
/// per tick for its timers.
const TIMER_TICK: Duration = Duration::from_millis(10);

/// Most applied entries followed as one input.
const APPLIED_RUN_MAX: usize = 1024;

fn outcome(label: &str) -> OutcomeLabels {
    OutcomeLabels {
        outcome: label.to_owned(),
    }
}

/// The driver's clock, as the core's instant (`tokio::time::pause` controls it).
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

/// The term's surroundings: this member's replicated state, connected probers and peer
/// regions. Each read takes its lock for the read alone.
struct Env<'a> {
    ctx: &'a LeaderContext,
    /// The log index of the state the last [`Surroundings::read_state`] saw
    /// (`u64::MAX`: none applied yet), so committed entries already in it are skipped.
    read_index: AtomicU64,
}

impl<'a> Env<'a> {
    fn new(ctx: &'a LeaderContext) -> Self {
        Self {
            ctx,
            read_index: AtomicU64::new(u64::MAX),
        }
    }

    fn read_index(&self) -> Option<u64> {
        Some(self.read_index.load(Ordering::Relaxed)).filter(|i| *i != u64::MAX)
    }
}

impl Surroundings for Env<'_> {
    fn now_ms(&self) -> u64 {
        now_ms()
    }

    fn read_state<T>(&self, read: impl FnOnce(&AuthorityState) -> T) -> T {
        self.ctx.raft.with_state(|s, index| {
            self.read_index
                .store(index.unwrap_or(u64::MAX), Ordering::Relaxed);
            read(s)
        })
    }

    fn probers(&self) -> Vec<(NodeName, ZoneName)> {
        self.ctx.hub.probers()
    }

    fn peer_digest(&self) -> Vec<((RegionName, ServiceName), u64)> {
        self.ctx.regions.as_ref().map_or_else(Vec::new, |r| {
            let held = r
                .aggregates
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            held.digest().into_iter().collect()
        })
    }

    fn peer_endpoints(&self, region: &RegionName, service: &ServiceName) -> Vec<RemoteEndpoint> {
        self.ctx.regions.as_ref().map_or_else(Vec::new, |r| {
            let held = r
                .aggregates
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            held.remote_endpoints(region, service)
        })
    }

    fn stale_peers(&self) -> std::collections::BTreeSet<RegionName> {
        let node = self
            .ctx
            .regions
            .as_ref()
            .and_then(|r| r.drop_stale.as_ref());
        node.map_or_else(Default::default, |node| {
            node.regions()
                .into_iter()
                .filter(|r| r.stale)
                .map(|r| r.region)
                .collect()
        })
    }

    fn front_doors(&self) -> Vec<(RegionName, bool)> {
        self.ctx.regions.as_ref().map_or_else(Vec::new, |r| {
            let signal = r
                .signal
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            signal
                .regions()
                .iter()
                .map(|(r, d)| (r.clone(), d.up))
                .collect()
        })
    }
}

/// Where the term's commands go.
struct Shell<'a> {
    ctx: &'a LeaderContext,
    term: u64,
    // Unbounded, and small in practice: the publisher coalesces releases per view, the
    // auditor batches records, and the term proposes at most a few requests per tick.
    publish: mpsc::UnboundedSender<Vec<ReleasedView>>,
    audit: mpsc::UnboundedSender<AuditEntry>,
    written: mpsc::UnboundedSender<(Purpose, Written)>,
}

/// The input a step took, for the trace of what it released: when it began, and what
/// kind of input it was (an evaluation of samples, a timer, committed entries).
struct Decided {
    at: std::time::SystemTime,
    input: &'static str,
    samples: usize,
}

impl Decided {
    /// `None` for inputs that never release views.
    fn of(input: &Input) -> Option<Self> {
        let (input, samples) = match input {
            Input::Samples(s) => ("samples", s.len()),
            Input::Timeout => ("timeout", 0),
            Input::Applied(_) => ("applied", 0),
            Input::Event(_) => ("rebuild", 0),
            Input::Pressure => ("pressure", 0),
            Input::Membership => ("membership", 0),
            _ => return None,
        };
        Some(Self {
            at: std::time::SystemTime::now(),
            input,
            samples,
        })
    }
}

impl Shell<'_> {
    /// The trace of one release: the pipeline step that released it (begun when its
    /// input arrived; linked to the latest evidence admissions) and the release itself, a
    /// child carrying counts and the version range. Each released version remembers the
    /// release span, so its commit and delivery join the same trace.
    fn trace_release(&self, views: &[ReleasedView], decided: Option<Decided>) {
        let telemetry = self.ctx.hub.telemetry();
        if !telemetry.is_on() || views.is_empty() {
            return;
        }
        let (at, input, samples) =
            decided.map_or((None, "unknown", 0), |d| (Some(d.at), d.input, d.samples));
        // The batches admitted since the previous release: what this one may have
        // weighed (a withdrawal is often released by the delta queue's timer, a step
        // after the samples that decided it).
        let links = self.ctx.hub.take_admissions();
        let evaluate = telemetry.span_from(
            "waymark.evaluate",
            at,
            None,
            &links,
            vec![
                KeyValue::new("waymark.term", self.term as i64),
                KeyValue::new("waymark.input", input),
                KeyValue::new("waymark.samples", samples as i64),
            ],
        );
        let release = telemetry.span(
            "waymark.release",
            Some(&evaluate.context()),
            &[],
            release_attributes(views),
        );
        telemetry.remember(views.iter().map(|v| v.version.0), &release.context());
        release.end();
        evaluate.end();
    }

    /// Carry out the commands in order; whether one asked for a hand-over.
    fn execute(&self, commands: Vec<LeaderCommand>, mut decided: Option<Decided>) -> bool {
        let mut hand_over = false;
        // Cadence changes come in bursts (a region's traffic ramping past the threshold):
        // the probers they touch are handed their targets once per batch, not per change.
        let mut cadence = Vec::new();
        for command in commands {
            match command {
                LeaderCommand::Publish(views) => {
                    self.trace_release(&views, decided.take());
                    // tokio's clock, as the xDS server times acknowledgements on it.
                    let now = tokio::time::Instant::now().into_std();
                    self.ctx
                        .releases
                        .record(views.iter().map(|v| v.version), now);
                    let _ = self.publish.send(views);
                }
                LeaderCommand::Audit(entry) => {
                    let _ = self.audit.send(entry);
                }
                LeaderCommand::Propose { purpose, request } => self.propose(purpose, request),
                LeaderCommand::Metric(change) => record_metric(&self.ctx.metrics, change),
                LeaderCommand::RefreshTargets => {
                    let hub = &self.ctx.hub;
                    self.ctx
                        .raft
                        .with_state(|s, _| hub.refresh_targets(s.registry()));
                }
                LeaderCommand::ProbeCadence {
                    instance,
                    confirming,
                } => cadence.push((instance, confirming)),
                LeaderCommand::HandOver => hand_over = true,
            }
        }
        if !cadence.is_empty() {
            let hub = &self.ctx.hub;
            self.ctx
                .raft
                .with_state(|s, _| hub.set_confirming(s.registry(), &cadence));
        }
        hand_over
    }

    /// Commit in the background and report the outcome to the term. Lost with the
    /// leadership, like the term itself.
    fn propose(&self, purpose: Purpose, request: Request) {
        let raft = self.ctx.raft.clone();
        let done = self.written.clone();
        let term = self.term;
        tokio::spawn(async move {
            let outcome = match raft.write(request).await {
                Ok(Response::Registry {
                    outcome: Err(refusal),
                }) => {
                    debug!(term, ?purpose, reason = %refusal.reason, "leader proposal refused");
                    Written::Refused
                }
                Ok(_) => Written::Applied,
                Err(error) => {
                    debug!(term, ?purpose, %error, "leader proposal not committed");
                    Written::Failed
                }
            };
            let _ = done.send((purpose, outcome));
        });
    }
}

/// A release's span attributes: counts, the version range, and the services (at most a
/// few by name; the count always).
fn release_attributes(views: &[ReleasedView]) -> Vec<KeyValue> {
    let services: std::collections::BTreeSet<&str> =
        views.iter().map(|v| v.view.key.service.as_str()).collect();
    let named: Vec<&str> = services.iter().take(8).copied().collect();
    let endpoints: usize = views.iter().map(|v| v.view.endpoints.len()).sum();
    let (min, max) = views.iter().fold((u64::MAX, 0), |(lo, hi), v| {
        (lo.min(v.version.0), hi.max(v.version.0))
    });
    vec![
        KeyValue::new("waymark.views", views.len() as i64),
        KeyValue::new("waymark.services", services.len() as i64),
        KeyValue::new("waymark.service", named.join(",")),
        KeyValue::new("waymark.endpoints", endpoints as i64),
        KeyValue::new("waymark.view.version", max as i64),
        KeyValue::new("waymark.view.version_min", min as i64),
    ]
}

/// Apply a metric change to the series (and log what an operator should see).
fn record_metric(m: &AuthorityMetrics, change: MetricChange) {
    match change {
        MetricChange::Quarantined { service } => {
            m.quarantines
                .get_or_create(&ServiceLabels {
                    service: service.to_string(),
                })
                .inc();
        }
        MetricChange::Guard {
            service,
            zone,
            engaged,
        } => {
            if engaged {
                warn!(%service, %zone, "fraction guard engaged: health disregarded");
            } else {
                info!(%service, %zone, "fraction guard released");
            }
            m.guard_engaged
                .get_or_create(&ZoneLabels {
                    service: service.to_string(),
                    zone: zone.to_string(),
                })
                .set(i64::from(engaged));
        }
        MetricChange::LastEligibleWithdrawn { service, withdrawn } => {
            if withdrawn {
                warn!(%service, "last eligible instance in the region withdrawn");
            }
            m.last_eligible_withdrawn
                .get_or_create(&ServiceLabels {
                    service: service.to_string(),
                })
                .set(i64::from(withdrawn));
        }
        MetricChange::RegionFailoverMoved { region, moved } => {
            m.region_failover_moved
                .get_or_create(&PeerRegionLabels {
                    peer_region: region.to_string(),
                })
                .set(f64::from(moved.get()) / 1000.0);
        }
        MetricChange::ShedStarted { window } => {
            m.shed_episodes.inc();
            m.shedding.set(1);
            info!(window_ms = window.as_millis() as u64, "shedding admissions");
        }
        MetricChange::ShedEnded { lasted, deferred } => {
            m.shedding.set(0);
            info!(
                lasted_ms = lasted.as_millis() as u64,
                deferred, "shedding ended"
            );
        }
        MetricChange::VersionsExhausted => {
            m.versions_exhausted.inc();
        }
        MetricChange::PublishRefused { refused } => {
            m.publish_refused.set(i64::from(refused));
        }
        MetricChange::EvidenceModes { service, counts } => {
            for (mode, n) in counts {
                m.evidence_modes
                    .get_or_create(&ModeLabels {
                        service: service.to_string(),
                        mode: mode.label().to_owned(),
                    })
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        MetricChange::Verdicts { service, counts } => {
            for (verdict, n) in counts {
                m.instances
                    .get_or_create(&VerdictLabels {
                        service: service.to_string(),
                        verdict: verdict.as_str().to_owned(),
                    })
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }
}

/// Commits releases in order, coalescing what arrives while a write is in flight (only
/// the newest content of each view matters: releases are whole views). A commit slower
/// than the configured threshold (by default
/// [`waymark_core::defaults::PUBLISH_PRESSURE_AFTER`]) reports delivery pressure, which
/// the delta queues hold for [`waymark_core::delta::PRESSURE_HOLD`], so they shed
/// admissions before withdrawals queue behind them.
///
/// A failed write is retried with backoff, merged with whatever was released meanwhile,
/// for as long as this member leads: a withdrawal must never be dropped because one
/// commit failed. Only losing leadership ends the loop (the next leader republishes).
async fn publisher(
    ctx: LeaderContext,
    rx: mpsc::UnboundedReceiver<Vec<ReleasedView>>,
    pressure: watch::Sender<u64>,
) {
    let raft = ctx.raft.clone();
    let metrics = ctx.metrics.clone();
    let pressure_after = ctx.pressure_after;
    let member = ctx.raft.watch_metrics().borrow().id;
    let telemetry = ctx.hub.telemetry().clone();
    publish_loop(
        rx,
        write_backoff(member),
        |request| {
            let raft = raft.clone();
            let span = commit_span(&telemetry, &request);
            async move {
                let mut span = span;
                let written = raft.write(request).await;
                if let Err(error) = &written {
                    span.fail(error.to_string());
                }
                span.end();
                written
            }
        },
        |outcome| match outcome {
            PublishOutcome::Committed { views, took } => {
                metrics.views_published.inc_by(views);
                metrics.publish_commit_seconds.observe(took.as_secs_f64());
                // Each slow commit is counted, so the leader sees every one even when the
                // next commit is quick again before it looks (the core holds the pressure).
                if pressure_after.is_some_and(|after| took > after) {
                    pressure.send_modify(|slow| *slow += 1);
                }
            }
            PublishOutcome::Failed => {
                metrics
                    .leader_write_failures
                    .get_or_create(&ReasonLabels {
                        reason: "publish".into(),
                    })
                    .inc();
            }
        },
    )
    .await;
}

/// The span of one `Publish` commit: a child of the first of its releases' spans, linked
/// to the others, with the version range it carries.
fn commit_span(telemetry: &crate::otel::Telemetry, request: &Request) -> crate::otel::Spanned {
    let Request::Release { releases } = request else {
        return telemetry.span("waymark.raft.commit", None, &[], Vec::new());
    };
    let versions: Vec<u64> = releases.iter().map(|r| r.version().0).collect();
    let contexts = telemetry.recall_all(versions.iter().copied());
    let endpoints: usize = releases.iter().map(Release::endpoints).sum();
    telemetry.span(
        "waymark.raft.commit",
        contexts.first(),
        contexts.get(1..).unwrap_or_default(),
        vec![
            KeyValue::new("waymark.views", releases.len() as i64),
            KeyValue::new("waymark.endpoints", endpoints as i64),
            KeyValue::new(
                "waymark.view.version",
                versions.iter().copied().max().unwrap_or(0) as i64,
            ),
        ],
    )
}

/// First and longest backoff window before a failed leader write is retried.
const WRITE_RETRY_MIN: Duration = Duration::from_millis(50);
const WRITE_RETRY_MAX: Duration = Duration::from_secs(2);

/// The backoff of one of the leader's writers: full-jitter windows doubling from
/// [`WRITE_RETRY_MIN`] to [`WRITE_RETRY_MAX`], reset by a commit (never by time: a write
/// has no lifetime to pass as `lived`). Seeded by the member id.
fn write_backoff(seed: u64) -> Backoff {
    let config = BackoffConfig {
        base: WRITE_RETRY_MIN,
        cap: WRITE_RETRY_MAX,
        healthy_after: Duration::MAX,
    };
    Backoff::new(config, seed)
}

/// What one publish attempt did, for the caller's metrics.
enum PublishOutcome {
    Committed { views: u64, took: Duration },
    Failed,
}

/// The publisher's loop, over any writer (the Raft node in production, a scripted one in
/// tests).
async fn publish_loop<W, F>(
    mut rx: mpsc::UnboundedReceiver<Vec<ReleasedView>>,
    mut backoff: Backoff,
    write: W,
    mut report: impl FnMut(PublishOutcome),
) where
    W: Fn(Request) -> F,
    F: std::future::Future<Output = Result<Response, WriteError>>,
{
    let mut pending: BTreeMap<ViewKey, ReleasedView> = BTreeMap::new();
    let mut encoder = ReleaseEncoder::new();
    loop {
        if pending.is_empty() {
            match rx.recv().await {
                Some(first) => merge_releases(&mut pending, first),
                None => return,
            }
        }
        while let Ok(more) = rx.try_recv() {
            merge_releases(&mut pending, more);
        }
        let started = Instant::now();
        let releases = next_chunk(&pending, &encoder, PUBLISH_ENDPOINTS_MAX);
        let sent: Vec<(ViewKey, bool)> = releases
            .iter()
            .map(|r| (r.key().clone(), matches!(r, Release::Patch(_))))
            .collect();
        let n = releases.len() as u64;
        match write(Request::Release { releases }).await {
            Ok(response) => {
                let in_force = match &response {
                    Response::Released { views, .. } => views.as_slice(),
                    _ => &[],
                };
                let again = encoder.handle_committed(sent.iter().map(|(k, p)| (k, *p)), in_force);
                for (key, _) in &sent {
                    if !again.contains(key) {
                        pending.remove(key);
                    }
                }
                for key in &again {
                    // Its base was not what the log held: it stays pending, to go whole.
                    warn!(view = %key, "a patched release was skipped by the log; sending it whole");
                }
                backoff.reset();
                report(PublishOutcome::Committed {
                    views: n,
                    took: started.elapsed(),
                });
            }
            Err(WriteError::NotLeader { .. }) => {
                debug!("lost leadership while publishing; the next leader republishes");
                return;
            }
            Err(error) => {
                encoder.handle_failed(sent.iter().map(|(k, _)| k));
                let delay = backoff.next_delay(Duration::ZERO, None);
                warn!(%error, views = n, backoff_ms = delay.as_millis() as u64, "publishing views failed; retrying");
                report(PublishOutcome::Failed);
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Endpoints one `Publish` entry carries at most, unless a single service's views hold
/// more: a busy region's releases go out as several bounded entries, not one that grows
/// with the region.
const PUBLISH_ENDPOINTS_MAX: usize = 2_048;

/// The releases the next entry carries, each a patch where `encoder` knows what the log
/// holds: whole services, in order, until adding the next service would pass
/// `max_endpoints` carried (the first service always goes, whatever its size). Every view
/// of a service commits in one entry, so no subscriber ever holds one zone's view of a
/// service at a newer release than another's.
fn next_chunk(
    pending: &BTreeMap<ViewKey, ReleasedView>,
    encoder: &ReleaseEncoder,
    max_endpoints: usize,
) -> Vec<Release> {
    let mut chunk: Vec<Release> = Vec::new();
    let mut endpoints = 0;
    let mut services = pending.iter().peekable();
    while let Some((key, _)) = services.peek() {
        let service = key.service.clone();
        let mut size = 0;
        let mut releases = Vec::new();
        while let Some((_, view)) = services.next_if(|(k, _)| k.service == service) {
            let release = encoder.encode(view);
            size += release.endpoints();
            releases.push(release);
        }
        if !chunk.is_empty() && endpoints + size > max_endpoints {
            break;
        }
        endpoints += size;
        chunk.extend(releases);
    }
    chunk
}

/// Keep the newest release of each view.
fn merge_releases(pending: &mut BTreeMap<ViewKey, ReleasedView>, releases: Vec<ReleasedView>) {
    for v in releases {
        let newer = pending
            .get(&v.view.key)
            .is_none_or(|held| held.version < v.version);
        if newer {
            pending.insert(v.view.key.clone(), v);
        }
    }
}

/// Appends audit records in batches; a failed batch is retried (with what arrived since)
/// until it commits or leadership is lost.
async fn auditor(
    raft: RaftNode,
    metrics: AuthorityMetrics,
    rx: mpsc::UnboundedReceiver<AuditEntry>,
) {
    // Another stream than the publisher's (seeded by `member`): `!member` never equals it,
    // so the two writers do not retry in step.
    let member = raft.watch_metrics().borrow().id;
    audit_loop(
        rx,
        write_backoff(!member),
        AuditBatching::default(),
        |request| {
            let raft = raft.clone();
            async move { raft.write(request).await }
        },
        || {
            metrics
                .leader_write_failures
                .get_or_create(&ReasonLabels {
                    reason: "audit".into(),
                })
                .inc();
        },
    )
    .await;
}

/// How the auditor gathers records into log entries.
#[derive(Debug, Clone, Copy)]
struct AuditBatching {
    /// Most records in one entry.
    max: usize,
    /// The least time between the starts of two audit writes. Records are not on any
    /// caller's path, so they wait to share an entry: at the reference estate's write
    /// rate, without a wait the auditor wrote an entry every few milliseconds, each a
    /// durable log append that the registry's own entries queued behind. An idle
    /// auditor writes at once; a record waits at most this long (plus the commit).
    coalesce: Duration,
}

impl Default for AuditBatching {
    fn default() -> Self {
        Self {
            max: AUDIT_BATCH_MAX,
            coalesce: AUDIT_COALESCE,
        }
    }
}

/// Most audit records in one log entry.
const AUDIT_BATCH_MAX: usize = 4096;

/// The default of [`AuditBatching::coalesce`]. A leader that stops leading loses at most
/// the records of this window and the write in flight, which were never promised.
const AUDIT_COALESCE: Duration = Duration::from_millis(50);

/// The auditor's loop, over any writer (the Raft node in production, a scripted one in
/// tests); `failed` is called for each write that failed and will be retried.
async fn audit_loop<W, F>(
    mut rx: mpsc::UnboundedReceiver<AuditEntry>,
    mut backoff: Backoff,
    batching: AuditBatching,
    write: W,
    mut failed: impl FnMut(),
) where
    W: Fn(Request) -> F,
    F: std::future::Future<Output = Result<Response, WriteError>>,
{
    let max = batching.max.max(1);
    let mut entries: Vec<AuditEntry> = Vec::new();
    let mut last_write: Option<Instant> = None;
    loop {
        if entries.is_empty() {
            match rx.recv().await {
                Some(first) => entries.push(first),
                None => return,
            }
        }
        // Wait out the rest of the window since the last write, gathering what arrives,
        // unless an entry's worth is waiting already.
        if let Some(due) = last_write.map(|at| at + batching.coalesce) {
            let wait = tokio::time::sleep_until(due);
            tokio::pin!(wait);
            while entries.len() < max {
                tokio::select! {
                    () = &mut wait => break,
                    record = rx.recv() => match record {
                        Some(record) => entries.push(record),
                        None => break,
                    },
                }
            }
        }
        while entries.len() < max {
            match rx.try_recv() {
                Ok(e) => entries.push(e),
                Err(_) => break,
            }
        }
        last_write = Some(Instant::now());
        match write(Request::Audit {
            entries: entries.clone(),
        })
        .await
        {
            Ok(_) => {
                entries.clear();
                backoff.reset();
            }
            Err(WriteError::NotLeader { .. }) => {
                debug!("audit batch not committed (leadership lost)");
                return;
            }
            Err(error) => {
                let delay = backoff.next_delay(Duration::ZERO, None);
                warn!(%error, entries = entries.len(), backoff_ms = delay.as_millis() as u64, "audit batch not committed; retrying");
                failed();
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod audit_tests {
    use waymark_registry::machine::AuditKind;

    use super::*;

    fn record(actor: &str) -> AuditEntry {
        AuditEntry {
            seq: 0,
            at_ms: 0,
            kind: AuditKind::Existence,
            actor: actor.to_owned(),
            service: None,
            instance: None,
            outcome: "applied".to_owned(),
            detail: serde_json::Value::Null,
        }
    }

    type Written = (Instant, Vec<String>);

    /// An auditor over a writer that reports each write (when, which actors) and fails
    /// the calls `fail` names; it ends when `tx` is dropped.
    fn start(
        batching: AuditBatching,
        fail: &'static [usize],
    ) -> (
        mpsc::UnboundedSender<AuditEntry>,
        mpsc::UnboundedReceiver<Written>,
        tokio::task::JoinHandle<usize>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (wtx, written) = mpsc::unbounded_channel();
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let task = tokio::spawn(async move {
            let mut failures = 0;
            audit_loop(
                rx,
                write_backoff(0),
                batching,
                move |request| {
                    let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Request::Audit { entries } = request else {
                        panic!("only audit records")
                    };
                    let actors = entries.into_iter().map(|e| e.actor).collect();
                    let _ = wtx.send((Instant::now(), actors));
                    async move {
                        if fail.contains(&n) {
                            Err(WriteError::Fatal(Box::new(openraft::error::Fatal::Stopped)))
                        } else {
                            Ok(Response::Audited { last_seq: 0 })
                        }
                    }
                },
                || failures += 1,
            )
            .await;
            failures
        });
        (tx, written, task)
    }

    fn actors(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_auditor_writes_at_once_and_what_follows_shares_the_next_entry() {
        // Goal: records never wait while the auditor is idle; under a stream of records
        // the writes are at least the window apart, each carrying what gathered meanwhile,
        // and an entry's worth of records goes without waiting.
        let window = Duration::from_millis(50);
        let batching = AuditBatching {
            max: 3,
            coalesce: window,
        };
        let (tx, mut written, task) = start(batching, &[]);
        let t0 = Instant::now();
        tx.send(record("a")).unwrap();
        assert_eq!(written.recv().await.unwrap(), (t0, actors(&["a"])));

        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send(record("b")).unwrap();
        tx.send(record("c")).unwrap();
        assert_eq!(
            written.recv().await.unwrap(),
            (t0 + window, actors(&["b", "c"]))
        );

        // Idle for longer than the window: the next record goes at once.
        tokio::time::sleep(window * 4).await;
        let t1 = Instant::now();
        tx.send(record("d")).unwrap();
        assert_eq!(written.recv().await.unwrap(), (t1, actors(&["d"])));

        // Five at once, inside the window: three fill an entry and go now, the other two
        // wait for the window.
        for name in ["e", "f", "g", "h", "i"] {
            tx.send(record(name)).unwrap();
        }
        assert_eq!(
            written.recv().await.unwrap(),
            (t1, actors(&["e", "f", "g"]))
        );
        assert_eq!(
            written.recv().await.unwrap(),
            (t1 + window, actors(&["h", "i"]))
        );

        drop(tx);
        assert_eq!(task.await.unwrap(), 0);
        assert!(
            written.recv().await.is_none(),
            "nothing written after the last record"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_audit_write_is_retried_with_what_arrived_since() {
        // Goal: a failed write loses no record: it is written again, with the records
        // that arrived meanwhile, and the failure is counted once.
        let batching = AuditBatching {
            max: 100,
            coalesce: Duration::from_millis(50),
        };
        let (tx, mut written, task) = start(batching, &[0]);
        tx.send(record("a")).unwrap();
        let (first_at, first) = written.recv().await.unwrap();
        assert_eq!(first, actors(&["a"]));
        tx.send(record("b")).unwrap();
        let (retry_at, retry) = written.recv().await.unwrap();
        assert_eq!(retry, actors(&["a", "b"]));
        assert!(retry_at > first_at, "the retry waited for its backoff");
        drop(tx);
        assert_eq!(task.await.unwrap(), 1);
        assert!(written.recv().await.is_none());
    }
}

#[cfg(test)]
mod publisher_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use waymark_core::model::{ServiceName, ZoneName};
    use waymark_core::view::{Version, View};

    use super::*;

    fn release(service: &str, version: u64) -> ReleasedView {
        ReleasedView {
            version: Version(version),
            view: View::empty(ViewKey {
                service: service.parse::<ServiceName>().unwrap(),
                zone: "a".parse::<ZoneName>().unwrap(),
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_publish_is_retried_and_later_releases_still_commit() {
        // Goal: one failed commit must not end publishing for the rest of the term.
        let (tx, rx) = mpsc::unbounded_channel();
        let calls = Arc::new(AtomicUsize::new(0));
        let committed = Arc::new(Mutex::new(Vec::<Vec<Version>>::new()));
        let (c, w) = (calls.clone(), committed.clone());
        let mut failures = 0;
        tx.send(vec![release("pay", 1)]).unwrap();
        let publisher = tokio::spawn(async move {
            publish_loop(
                rx,
                write_backoff(0),
                move |request| {
                    let n = c.fetch_add(1, Ordering::SeqCst);
                    let w = w.clone();
                    async move {
                        if n == 0 {
                            return Err(WriteError::Fatal(Box::new(
                                openraft::error::Fatal::Stopped,
                            )));
                        }
                        let Request::Release { releases } = request else {
                            panic!("only releases")
                        };
                        w.lock()
                            .unwrap()
                            .push(releases.iter().map(Release::version).collect());
                        let views = releases
                            .into_iter()
                            .map(|r| match r {
                                Release::Whole(v) => v,
                                Release::Patch(_) => panic!("nothing committed to patch"),
                            })
                            .collect();
                        Ok(Response::Released { views, skipped: 0 })
                    }
                },
                |outcome| {
                    if matches!(outcome, PublishOutcome::Failed) {
                        failures += 1;
                    }
                },
            )
            .await;
            failures
        });
        // Wait until the retry committed the first release, then send a later one.
        for _ in 0..100 {
            if !committed.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(WRITE_RETRY_MIN).await;
        }
        assert!(
            !committed.lock().unwrap().is_empty(),
            "the failed release was never retried"
        );
        tx.send(vec![release("pay", 2), release("web", 3)]).unwrap();
        drop(tx);
        let failures = publisher.await.unwrap();
        assert_eq!(failures, 1);
        assert_eq!(
            *committed.lock().unwrap(),
            vec![vec![Version(1)], vec![Version(2), Version(3)]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_publishes_wait_at_most_the_cap_and_a_commit_starts_the_waits_again() {
        // Goal: what the backoff promises, on the publisher: every retry comes within the
        // cap, the waits grow while commits keep failing, and a commit resets them.
        const FAILURES: usize = 8;
        let (tx, rx) = mpsc::unbounded_channel();
        let calls = Arc::new(Mutex::new(Vec::<Instant>::new()));
        let c = calls.clone();
        tx.send(vec![release("pay", 1)]).unwrap();
        let publisher = tokio::spawn(publish_loop(
            rx,
            write_backoff(0),
            move |request| {
                let n = {
                    let mut calls = c.lock().unwrap();
                    calls.push(Instant::now());
                    calls.len() - 1
                };
                async move {
                    // Calls 0..FAILURES fail, then one commits, then one more fails.
                    if n < FAILURES || n == FAILURES + 1 {
                        return Err(WriteError::Fatal(Box::new(openraft::error::Fatal::Stopped)));
                    }
                    let Request::Release { releases } = request else {
                        panic!("only releases")
                    };
                    let views = releases
                        .into_iter()
                        .map(|r| match r {
                            Release::Whole(v) => v,
                            Release::Patch(_) => panic!("nothing committed to patch"),
                        })
                        .collect();
                    Ok(Response::Released { views, skipped: 0 })
                }
            },
            |_| {},
        ));
        while calls.lock().unwrap().len() <= FAILURES {
            tokio::time::sleep(WRITE_RETRY_MIN).await;
        }
        tx.send(vec![release("pay", 2)]).unwrap();
        drop(tx);
        publisher.await.unwrap();
        let calls = calls.lock().unwrap();
        assert_eq!(
            calls.len(),
            FAILURES + 3,
            "each failure retried until a commit"
        );
        let waits: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
        let failing = &waits[..FAILURES];
        assert!(failing.iter().all(|w| *w <= WRITE_RETRY_MAX), "{waits:?}");
        assert!(
            failing.iter().any(|w| *w > WRITE_RETRY_MIN),
            "the waits grow while commits fail: {waits:?}"
        );
        // The commit at FAILURES reset the backoff: the next failure waits the first window.
        assert!(waits[FAILURES + 1] <= WRITE_RETRY_MIN, "{waits:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn losing_leadership_ends_publishing() {
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(vec![release("pay", 1)]).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        publish_loop(
            rx,
            write_backoff(0),
            move |_| {
                c.fetch_add(1, Ordering::SeqCst);
                async { Err(WriteError::NotLeader { leader: None }) }
            },
            |_| {},
        )
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        drop(tx);
    }

    fn sized(service: &str, zone: &str, endpoints: u8) -> ReleasedView {
        let mut v = release(service, 1);
        v.view.key.zone = zone.parse().unwrap();
        let map = &mut v.view.endpoints;
        for n in 0..endpoints {
            let e = waymark_core::view::ViewEndpoint::eligible(
                format!("{service}-{n}").parse().unwrap(),
                waymark_core::model::Address {
                    ip: std::net::Ipv4Addr::new(10, 0, 0, n).into(),
                    port: 80,
                },
                "r".parse().unwrap(),
                "a".parse().unwrap(),
            );
            map.insert(e.instance.clone(), e);
        }
        v
    }

    #[test]
    fn publishes_are_bounded_and_never_split_a_service() {
        // Goal: every pending view goes out exactly once, each entry holds whole services,
        // and an entry passes the bound only when one service alone does.
        let mut pending = BTreeMap::new();
        let releases = vec![
            sized("a", "z1", 4),
            sized("a", "z2", 4),
            sized("b", "z1", 3),
            sized("c", "z1", 9),
            sized("c", "z2", 9),
            sized("d", "z1", 1),
        ];
        merge_releases(&mut pending, releases);
        let mut entries: Vec<Vec<ViewKey>> = Vec::new();
        let encoder = ReleaseEncoder::new();
        while !pending.is_empty() {
            let chunk: Vec<ViewKey> = next_chunk(&pending, &encoder, 10)
                .iter()
                .map(|r| r.key().clone())
                .collect();
            assert!(!chunk.is_empty());
            for k in &chunk {
                pending.remove(k);
            }
            entries.push(chunk);
        }
        let services: Vec<Vec<String>> = entries
            .iter()
            .map(|e| e.iter().map(|k| k.to_string()).collect())
            .collect();
        assert_eq!(
            services,
            vec![
                vec!["a@z1", "a@z2"],
                vec!["b@z1"],
                vec!["c@z1", "c@z2"],
                vec!["d@z1"]
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_patch_the_log_skips_is_sent_again_whole() {
        // Goal: the publisher never leaves a release out of force because the log held
        // another version than the one its patch was made against.
        let state = Arc::new(Mutex::new(AuthorityState::default()));
        let sent = Arc::new(Mutex::new(Vec::<(Version, bool)>::new()));
        let (tx, rx) = mpsc::unbounded_channel();
        let (st, log) = (state.clone(), sent.clone());
        let publisher = tokio::spawn(publish_loop(
            rx,
            write_backoff(0),
            move |request| {
                if let Request::Release { releases } = &request {
                    let mut log = log.lock().unwrap();
                    for r in releases {
                        log.push((r.version(), matches!(r, Release::Patch(_))));
                    }
                }
                let response = st.lock().unwrap().apply(request);
                async move { Ok(response) }
            },
            |_| {},
        ));
        let v1 = sized("pay", "a", 10);
        tx.send(vec![v1.clone()]).unwrap();
        while sent.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // Another release of the view reaches the log behind the publisher's back.
        let mut foreign = v1.clone();
        foreign.version = Version(2);
        foreign.view.endpoints = foreign.view.endpoints.without_min().1;
        state.lock().unwrap().apply(Request::Publish {
            views: vec![foreign],
        });
        let mut v3 = v1.clone();
        v3.version = Version(3);
        v3.view.endpoints = v3.view.endpoints.without_max().1;
        tx.send(vec![v3.clone()]).unwrap();
        drop(tx);
        publisher.await.unwrap();
        assert_eq!(
            *sent.lock().unwrap(),
            vec![(Version(1), false), (Version(3), true), (Version(3), false)],
            "whole, a patch against version 1, then whole again"
        );
        assert_eq!(state.lock().unwrap().published()[&v1.view.key], v3);
    }

    #[test]
    fn merged_releases_keep_the_newest_of_each_view() {
        let mut pending = BTreeMap::new();
        merge_releases(&mut pending, vec![release("pay", 5), release("pay", 4)]);
        merge_releases(&mut pending, vec![release("pay", 6)]);
        let versions: Vec<Version> = pending.values().map(|v| v.version).collect();
        assert_eq!(versions, vec![Version(6)]);
    }
}

#[cfg(test)]
mod applied_run_tests {
    use std::sync::Arc;

    use tokio::sync::broadcast;
    use tokio::sync::broadcast::error::RecvError;
    use waymark_registry::machine::{Request, Response};

    use super::{APPLIED_RUN_MAX, AppliedEntry, StateEvent, applied_run};

    fn applied(index: u64) -> StateEvent {
        StateEvent::Applied(Arc::new(AppliedEntry {
            index,
            term: 1,
            request: Request::Audit { entries: vec![] },
            response: Response::Audited { last_seq: 0 },
        }))
    }

    fn indexes(run: &[Arc<AppliedEntry>]) -> Vec<u64> {
        run.iter().map(|e| e.index).collect()
    }

    #[test]
    fn queued_entries_are_followed_as_one_run_and_what_ends_it_comes_next() {
        let (tx, mut rx) = broadcast::channel(64);
        for i in 1..=3 {
            tx.send(applied(i)).unwrap();
        }
        tx.send(StateEvent::SnapshotInstalled { index: 9 }).unwrap();
        tx.send(applied(10)).unwrap();
        let Ok(StateEvent::Applied(first)) = rx.try_recv() else {
            panic!("the first event is an applied entry");
        };
        let (run, stop) = applied_run(first, &mut rx, APPLIED_RUN_MAX);
        assert_eq!(indexes(&run), [1, 2, 3]);
        assert!(matches!(
            stop,
            Some(Ok(StateEvent::SnapshotInstalled { index: 9 }))
        ));
        // The rest stays queued, in order.
        assert!(matches!(rx.try_recv(), Ok(StateEvent::Applied(e)) if e.index == 10));
    }

    #[test]
    fn a_run_is_bounded_and_a_lag_behind_it_is_reported() {
        let (tx, mut rx) = broadcast::channel(4);
        for i in 1..=3 {
            tx.send(applied(i)).unwrap();
        }
        let Ok(StateEvent::Applied(first)) = rx.try_recv() else {
            panic!("the first event is an applied entry");
        };
        let (run, stop) = applied_run(first, &mut rx, 2);
        assert_eq!(indexes(&run), [1, 2]);
        assert!(stop.is_none(), "a full run ends without an event");
        // Overrun the channel behind the receiver: the next run ends with the lag.
        for i in 4..=9 {
            tx.send(applied(i)).unwrap();
        }
        let (run, stop) = applied_run(run[1].clone(), &mut rx, APPLIED_RUN_MAX);
        assert_eq!(indexes(&run), [2]);
        assert!(matches!(stop, Some(Err(RecvError::Lagged(_)))));
    }
}
