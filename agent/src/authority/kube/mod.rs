//! Kubernetes existence reconciler (ADR-03): EndpointSlices in, `Observe`/`Forget` out.
//!
//! Runs on the authority leader. A kube-rs [`watcher`] feeds a reflector store of
//! EndpointSlices; on every change (debounced) and every `resync`, the pure [`diff::plan`]
//! compares the store with the registry and the commands are proposed through [`Propose`]
//! (Raft on the leader, an in-memory state in tests). The last [`ReconciliationDiff`] is
//! published on a `tokio::sync::watch` and as metrics.
//!
//! ```text
//! API server ──list/watch──► watch task ──► reflector store ──┐
//!                                   │ WatchState (synced?)    ▼
//!                                   └──────────────► reconcile task ──plan──► Propose
//!                                                          └──► ReconcileStatus (watch), metrics
//! ```
//!
//! Invariants:
//! - a broken watch is silence, not deletion: after any list/watch error nothing is proposed
//!   until a fresh, complete list has replaced the store (the watcher is rebuilt, so it
//!   re-lists), and the store keeps the last complete list meanwhile;
//! - refusals are logged, counted and never stop the loop; ids are never re-proposed once
//!   retired;
//! - Forgets go before Observes in every pass (see [`diff`]).

pub mod diff;
pub mod metrics;
pub mod standin;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use ::kube::Api;
use ::kube::runtime::reflector::{self, Store, store::Writer};
use ::kube::runtime::watcher;
use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};
use waymark_core::backoff::{Backoff, BackoffConfig};
use waymark_core::hash::fnv1a;
use waymark_core::model::InstanceId;
use waymark_registry::state::{Applied, Command, DesiredState};

pub use self::diff::{DiffConfig, ReconciliationDiff};
pub use self::metrics::KubeMetrics;
use waymark_registry::machine::Refusal;

/// How long a change waits for more changes before a pass runs.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// A full pass at least this often, so a newly registered service is picked up.
pub const RESYNC: Duration = Duration::from_secs(30);
/// First backoff window after a list/watch error (waits are drawn with full jitter).
pub const BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Largest backoff window between list/watch attempts.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The reconciler's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeReconcilerConfig {
    /// The mapping (region, cluster, namespace scope, fallbacks).
    pub diff: DiffConfig,
    /// See [`DEBOUNCE`].
    pub debounce: Duration,
    /// See [`RESYNC`].
    pub resync: Duration,
    /// See [`BACKOFF_MIN`].
    pub backoff_min: Duration,
    /// See [`BACKOFF_MAX`].
    pub backoff_max: Duration,
    /// Server-side watch timeout (`timeoutSeconds`); `None` keeps kube-rs's 290 s.
    pub watch_timeout_s: Option<u32>,
}

impl KubeReconcilerConfig {
    /// The defaults above around a mapping.
    pub fn new(diff: DiffConfig) -> Self {
        Self {
            diff,
            debounce: DEBOUNCE,
            resync: RESYNC,
            backoff_min: BACKOFF_MIN,
            backoff_max: BACKOFF_MAX,
            watch_timeout_s: None,
        }
    }
}

/// Where the reconciler reads the registry and sends its commands.
///
/// ### To ensure correctness:
/// - [`read_registry`](Propose::read_registry) shows state at least as new as every
///   command this proposer has acknowledged, or a pass re-proposes what already applied
///   (harmless: Observe is idempotent, a repeated Forget is refused and counted);
/// - [`propose`](Propose::propose) resolves once the command is applied (or refused) by
///   the state machine, in proposal order.
pub trait Propose: Send + Sync + 'static {
    /// Runs `read` over the current desired state.
    fn read_registry<R>(&self, read: impl FnOnce(&DesiredState) -> R) -> R;

    /// Proposes one command and waits for its outcome.
    fn propose(
        &self,
        command: Command,
    ) -> impl Future<Output = Result<Applied, ProposeError>> + Send;
}

/// Why a proposal did not apply.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProposeError {
    /// The registry refused the command; nothing changed. The reconciler logs and counts
    /// it and goes on with the pass.
    #[error("the registry refused the command")]
    Refused(#[source] Refusal),
    /// The command could not be proposed (not the leader, consensus unavailable); it did
    /// not apply. The reconciler stops the pass and recomputes on the next one.
    #[error("the command could not be proposed")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What the reconciler last did, published after every pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct ReconcileStatus {
    /// Whether the store holds a complete list and the watch is healthy.
    pub synced: bool,
    /// Passes run so far (held ones included).
    pub passes: u64,
    /// The divergence found by the last pass, before its commands applied.
    pub diff: ReconciliationDiff,
    /// The last pass's outcome.
    pub last_pass: PassSummary,
}

/// One pass's outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct PassSummary {
    /// Commands the plan asked for.
    pub planned: usize,
    /// Commands applied.
    pub applied: usize,
    /// Commands refused by the registry.
    pub refused: usize,
    /// Nothing proposed: the watch is broken or not yet listed.
    pub held: bool,
    /// Stopped early: the proposer was unavailable.
    pub aborted: bool,
}

/// A running reconciler; dropping it stops both tasks.
#[derive(Debug)]
pub struct KubeReconciler {
    status: watch::Receiver<Arc<ReconcileStatus>>,
    store: Store<EndpointSlice>,
    tasks: [JoinHandle<()>; 2],
}

/// What the watch task tells the reconcile task.
#[derive(Debug, Clone, Copy, Default)]
struct WatchState {
    /// Bumped on every store change.
    generation: u64,
    /// The store holds a complete list and no error happened since.
    synced: bool,
}

// === impl KubeReconciler ===

impl KubeReconciler {
    /// Starts watching EndpointSlices (in `config.diff.namespace`, or all namespaces) and
    /// reconciling them into the registry behind `proposer`. Must run inside a tokio runtime.
    pub fn spawn<P: Propose>(
        client: ::kube::Client,
        proposer: Arc<P>,
        config: KubeReconcilerConfig,
        metrics: KubeMetrics,
    ) -> Self {
        let api: Api<EndpointSlice> = match config.diff.namespace.as_deref() {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let (store, writer) = reflector::store();
        let (watch_tx, watch_rx) = watch::channel(WatchState::default());
        let (status_tx, status) = watch::channel(Arc::new(ReconcileStatus::default()));
        let span = info_span!("kube_reconciler", cluster = %config.diff.cluster);
        let watching = WatchTask {
            api,
            writer,
            state: watch_tx,
            metrics: metrics.clone(),
            config: config.clone(),
        };
        let reconciling = ReconcileTask {
            store: store.clone(),
            watch: watch_rx,
            proposer,
            config,
            metrics,
            status: status_tx,
            passes: 0,
        };
        let tasks = [
            tokio::spawn(watching.run().instrument(span.clone())),
            tokio::spawn(reconciling.run().instrument(span)),
        ];
        Self {
            status,
            store,
            tasks,
        }
    }

    /// The latest status, updated after every pass; `changed()` / `wait_for` to follow it.
    pub fn status(&self) -> watch::Receiver<Arc<ReconcileStatus>> {
        self.status.clone()
    }

    /// The reflector's store (the last complete list plus watched changes).
    pub fn store(&self) -> Store<EndpointSlice> {
        self.store.clone()
    }

    /// Stops both tasks.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for KubeReconciler {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

// === the watch task ===

struct WatchTask {
    api: Api<EndpointSlice>,
    writer: Writer<EndpointSlice>,
    state: watch::Sender<WatchState>,
    metrics: KubeMetrics,
    config: KubeReconcilerConfig,
}

impl WatchTask {
    /// Runs a watcher into the store; on any error drops it and, after a backoff, starts a
    /// new one, which re-lists. The store keeps the last complete list until the new list is
    /// complete (the reflector buffers between `Init` and `InitDone`), and a complete list
    /// resets the backoff.
    async fn run(mut self) {
        let mut backoff = self.backoff();
        loop {
            let mut wc = watcher::Config::default();
            if let Some(t) = self.config.watch_timeout_s {
                wc = wc.timeout(t);
            }
            let mut events = pin!(watcher(self.api.clone(), wc));
            let mut failed = None;
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        if matches!(event, watcher::Event::InitDone) {
                            backoff.reset();
                        }
                        self.handle(&event);
                    }
                    Err(error) => {
                        failed = Some(error);
                        break;
                    }
                }
            }
            let delay = backoff.next_delay(Duration::ZERO, None);
            if let Some(error) = failed {
                self.metrics.record_watch_error();
                warn!(
                    error = %error,
                    backoff_ms = delay.as_millis() as u64,
                    "endpointslice watch failed; holding the registry until a fresh list"
                );
                self.state.send_modify(|s| s.synced = false);
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// Full-jitter windows doubling from `backoff_min` to `backoff_max`, reset by a complete
    /// list (not by time: a watch that lived long but never listed has not recovered).
    /// Seeded by the cluster's name, so reconcilers of several clusters do not retry in step.
    fn backoff(&self) -> Backoff {
        let config = BackoffConfig {
            base: self.config.backoff_min,
            cap: self.config.backoff_max,
            healthy_after: Duration::MAX,
        };
        Backoff::new(config, fnv1a(self.config.diff.cluster.as_bytes()))
    }

    fn handle(&mut self, event: &watcher::Event<EndpointSlice>) {
        self.writer.apply_watcher_event(event);
        match event {
            watcher::Event::InitDone => {
                info!("endpointslice list complete");
                self.state.send_modify(|s| {
                    s.synced = true;
                    s.generation += 1;
                });
            }
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => {
                self.state.send_modify(|s| s.generation += 1);
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }
}

// === the reconcile task ===

struct ReconcileTask<P> {
    store: Store<EndpointSlice>,
    watch: watch::Receiver<WatchState>,
    proposer: Arc<P>,
    config: KubeReconcilerConfig,
    metrics: KubeMetrics,
    status: watch::Sender<Arc<ReconcileStatus>>,
    passes: u64,
}

impl<P: Propose> ReconcileTask<P> {
    async fn run(mut self) {
        let mut resync = tokio::time::interval(self.config.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut due: Option<Instant> = None;
        loop {
            let debounce = async move {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = self.watch.changed() => {
                    if changed.is_err() {
                        return; // the watch task is gone: we are shutting down
                    }
                    due.get_or_insert_with(|| Instant::now() + self.config.debounce);
                }
                () = debounce => {
                    due = self.pass().await.then(|| Instant::now() + self.config.debounce);
                }
                _ = resync.tick() => {
                    due = self.pass().await.then(|| Instant::now() + self.config.debounce);
                }
            }
        }
    }

    /// One pass. Returns whether anything applied, in which case a follow-up pass
    /// verifies convergence (and publishes the converged diff).
    async fn pass(&mut self) -> bool {
        let synced = self.watch.borrow_and_update().synced;
        let slices = self.store.state();
        let plan = self
            .proposer
            .read_registry(|r| diff::plan(slices.iter().map(|s| &**s), r, &self.config.diff));
        drop(slices);
        self.metrics.set_diff(&plan.report.totals);
        let mut summary = PassSummary {
            planned: plan.commands.len(),
            held: !synced,
            ..PassSummary::default()
        };
        if synced {
            for command in plan.commands {
                if !self.propose(command, &mut summary).await {
                    summary.aborted = true;
                    break;
                }
            }
        }
        self.passes += 1;
        if summary.planned > 0 || summary.held {
            info!(
                planned = summary.planned,
                applied = summary.applied,
                refused = summary.refused,
                held = summary.held,
                aborted = summary.aborted,
                unmanaged = plan.report.totals.unmanaged,
                "kubernetes reconciliation pass"
            );
        } else {
            debug!(
                in_sync = plan.report.totals.in_sync,
                "kubernetes reconciliation pass"
            );
        }
        let status = ReconcileStatus {
            synced,
            passes: self.passes,
            diff: plan.report,
            last_pass: summary,
        };
        self.status.send_replace(Arc::new(status));
        summary.applied > 0
    }

    /// Proposes one command; false if the proposer is unavailable.
    async fn propose(&self, command: Command, summary: &mut PassSummary) -> bool {
        let target = command_target(&command);
        let op = command_op(&command);
        match self.proposer.propose(command).await {
            Ok(_) => {
                summary.applied += 1;
                true
            }
            Err(ProposeError::Refused(refusal)) => {
                summary.refused += 1;
                self.metrics.record_refusal(&refusal.reason);
                warn!(
                    endpoint = ?target,
                    op,
                    reason = %refusal.reason,
                    error = %refusal.message,
                    "registry refused a reconciler command"
                );
                true
            }
            Err(error) => {
                warn!(
                    endpoint = ?target,
                    op,
                    error = %error,
                    "proposer unavailable; pass stopped"
                );
                false
            }
        }
    }
}

fn command_target(command: &Command) -> Option<InstanceId> {
    match command {
        Command::Observe { instance, .. } => Some(instance.id.clone()),
        Command::Forget { instance } => Some(instance.clone()),
        _ => None,
    }
}

fn command_op(command: &Command) -> &'static str {
    match command {
        Command::Observe { .. } => "observe",
        Command::Forget { .. } => "forget",
        _ => "other",
    }
}
