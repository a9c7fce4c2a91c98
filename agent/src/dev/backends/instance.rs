//! One backend's shared state (mode, listener slot, connection generation, counters), its
//! mode transitions, and the task that reports about it.
//!
//! The listener lives in a slot behind a mutex rather than inside the server task, so that
//! [`Backend::set_mode`] can drop it synchronously: when it returns, the port refuses
//! connections. Every change to the slot bumps the *generation*, which wakes the accept loop
//! and closes the connections accepted under the previous generation.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use waymark_core::model::{DependencyStatus, SelfReport};
use waymark_core::units::Permille;

use super::{BackendError, BackendOptions, BackendSpec, BackendStatus, Mode, SelfReportFn, lock};

/// One running backend, shared by its server, its connections, its reporter and the control API.
#[derive(Debug)]
pub(super) struct Backend {
    pub(super) spec: BackendSpec,
    /// The address actually bound (port `0` resolved); re-bound after [`Mode::FailHard`].
    pub(super) addr: SocketAddr,
    pub(super) options: Arc<BackendOptions>,
    mode: watch::Sender<ModeState>,
    listener: Mutex<ListenerSlot>,
    generation: watch::Sender<u64>,
    served: AtomicU64,
    failed: AtomicU64,
    probes: AtomicU64,
    /// Traffic requests seen in [`Mode::Slow`], to spread the failures evenly.
    slow_seq: AtomicU64,
}

/// A mode and when it was set (the origin of [`Mode::Flap`]'s phases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ModeState {
    pub(super) mode: Mode,
    pub(super) since: Instant,
}

#[derive(Debug)]
struct ListenerSlot {
    /// `None` exactly while in [`Mode::FailHard`] or once closed.
    listener: Option<TcpListener>,
    /// Set by [`Backend::close`]; no transition happens afterwards.
    closed: bool,
}

// === impl Backend ===

impl Backend {
    /// Binds `spec.bind`; must run within a tokio runtime.
    pub(super) fn bind(
        spec: BackendSpec,
        options: Arc<BackendOptions>,
    ) -> Result<Self, BackendError> {
        let bound = listen(spec.bind).and_then(|l| Ok((l.local_addr()?, l)));
        let (addr, listener) = bound.map_err(|source| BackendError::Bind {
            instance: spec.instance.clone(),
            addr: spec.bind,
            source,
        })?;
        let (mode, _) = watch::channel(ModeState {
            mode: Mode::Healthy,
            since: Instant::now(),
        });
        let (generation, _) = watch::channel(0);
        Ok(Self {
            spec,
            addr,
            options,
            mode,
            listener: Mutex::new(ListenerSlot {
                listener: Some(listener),
                closed: false,
            }),
            generation,
            served: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            probes: AtomicU64::new(0),
            slow_seq: AtomicU64::new(0),
        })
    }

    pub(super) fn mode(&self) -> Mode {
        self.mode.borrow().mode
    }

    pub(super) fn mode_state(&self) -> ModeState {
        *self.mode.borrow()
    }

    /// A receiver that has seen the current generation.
    pub(super) fn subscribe_generation(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Switches to `to`; see [`super::Backends::set_mode`] for the contract.
    pub(super) fn set_mode(&self, to: Mode, runtime: &Handle) -> Result<(), BackendError> {
        // The slot's lock serialises transitions, so mode and listener always agree.
        let mut slot = lock(&self.listener);
        if slot.closed {
            return Err(BackendError::ShutDown);
        }
        match (slot.listener.is_some(), to == Mode::FailHard) {
            (true, true) => {
                // Dropping the listener closes the port now; the bump closes open connections.
                slot.listener = None;
                self.bump_generation();
            }
            (false, false) => {
                let _entered = runtime.enter();
                let listener = listen(self.addr).map_err(|source| BackendError::Rebind {
                    instance: self.spec.instance.clone(),
                    addr: self.addr,
                    source,
                })?;
                slot.listener = Some(listener);
                // Wakes the accept loop, which parks while the slot is empty.
                self.bump_generation();
            }
            (true, false) | (false, true) => {}
        }
        let since = Instant::now();
        let from = self.mode.send_replace(ModeState { mode: to, since }).mode;
        drop(slot);
        tracing::info!(
            instance = %self.spec.instance,
            service = %self.spec.service,
            zone = %self.spec.zone,
            from = %from,
            to = %to,
            "demo backend mode changed"
        );
        Ok(())
    }

    /// Drops the listener, closes the connections and refuses later transitions.
    pub(super) fn close(&self) {
        let mut slot = lock(&self.listener);
        slot.closed = true;
        slot.listener = None;
        self.bump_generation();
    }

    /// Accepts from the current listener; pending while there is none (the generation bump
    /// that fills the slot is what wakes the caller then).
    pub(super) fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        match &lock(&self.listener).listener {
            Some(listener) => listener.poll_accept(cx),
            None => Poll::Pending,
        }
    }

    /// Whether a flapping backend is in its good phase now (always true in other modes).
    pub(super) fn flap_up(&self, state: ModeState) -> bool {
        state.mode != Mode::Flap || flap_up(state.since.elapsed(), self.options.flap_period)
    }

    /// Whether the next slow traffic request fails.
    pub(super) fn next_slow_fails(&self) -> bool {
        let seq = self.slow_seq.fetch_add(1, Ordering::Relaxed);
        spread_fails(seq, self.options.slow_failed)
    }

    pub(super) fn count_probe(&self) {
        self.probes.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn count_traffic(&self, ok: bool) {
        let counter = if ok { &self.served } else { &self.failed };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn status(&self) -> BackendStatus {
        BackendStatus {
            instance: self.spec.instance.clone(),
            service: self.spec.service.clone(),
            zone: self.spec.zone.clone(),
            address: self.addr,
            mode: self.mode(),
            served: self.served.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            probes: self.probes.load(Ordering::Relaxed),
        }
    }

    fn bump_generation(&self) {
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }
}

/// Sends the backend's self-reports: at once, on every mode change, and every
/// `report_interval` in between, until `stop` changes.
pub(super) async fn report(
    backend: Arc<Backend>,
    mut stop: watch::Receiver<bool>,
    sink: SelfReportFn,
) {
    let mut modes = backend.mode.subscribe();
    let mut ticker = tokio::time::interval(backend.options.report_interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Whether the dependency was ever reported degraded; only then is its recovery news.
    let mut mentioned = false;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            changed = modes.changed() => {
                if changed.is_err() {
                    return;
                }
                // Report now, then a whole interval later.
                ticker.reset();
            }
            _ = stop.changed() => return,
        }
        let mode = modes.borrow_and_update().mode;
        mentioned |= mode == Mode::DegradedDependency;
        let dependency = mentioned.then_some(backend.options.dependency.as_str());
        for report in reports_for(mode, dependency) {
            tracing::trace!(instance = %backend.spec.instance, report = ?report, "demo backend self-report");
            sink(&backend.spec.instance, report);
        }
    }
}

/// What a backend in `mode` says about itself, in sending order; `dependency` is the
/// dependency to report on, if any.
///
/// A backend that never saw its dependency degrade does not mention it, so services whose
/// contract declares no such dependency get no reports the evaluator would refuse. Once it
/// was degraded, its condition goes with every report, `ok` included, because the evaluator
/// keeps the last one it heard: a recovery must be said, not implied. Readiness goes last, so
/// it is the latest self-report line in `explain`. A backend failing hard says nothing.
pub(super) fn reports_for(mode: Mode, dependency: Option<&str>) -> Vec<SelfReport> {
    let readiness = match mode {
        Mode::FailHard => return Vec::new(),
        Mode::Healthy | Mode::Slow | Mode::Flap | Mode::DegradedDependency => SelfReport::Ready,
        Mode::NotReady => SelfReport::NotReady {
            detail: "demo backend set to not_ready".to_owned(),
        },
    };
    let status = match mode {
        Mode::DegradedDependency => DependencyStatus::Degraded,
        _ => DependencyStatus::Ok,
    };
    let dependency = dependency.map(|name| SelfReport::Dependency {
        name: name.to_owned(),
        status,
    });
    dependency.into_iter().chain([readiness]).collect()
}

/// Whether `elapsed` since the mode was set falls in a good (even-numbered) phase.
pub(super) fn flap_up(elapsed: Duration, period: Duration) -> bool {
    // The options forbid a zero period; were one to slip through, stay up rather than panic.
    elapsed
        .as_nanos()
        .checked_div(period.as_nanos())
        .is_none_or(|phase| phase % 2 == 0)
}

/// Whether request number `seq` (from 0) fails, so that any run of requests fails in
/// `share` of the cases, give or take one, spread evenly.
pub(super) fn spread_fails(seq: u64, share: Permille) -> bool {
    let (seq, share) = (u128::from(seq), u128::from(share.get()));
    (seq + 1) * share / 1000 > seq * share / 1000
}

/// Binds `addr` synchronously, so mode changes need not be async. On Unix, std sets
/// `SO_REUSEADDR`, so re-binding works while the old connections sit in `TIME_WAIT`.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}
