//! Demo backends for `waymark dev` and the drills: small HTTP servers whose behaviour is
//! switched at run time, so every eligibility verdict can be produced on demand.
//!
//! Each backend is one listener serving traffic on every path, liveness on [`HEALTH_PATH`]
//! and readiness on [`READY_PATH`]. Its [`Mode`] decides what those answer, whether the port
//! listens at all, and what the backend says about itself through the installed
//! [`SelfReportFn`]. The control API ([`Backends::router`]) lists the backends and switches
//! their modes:
//!
//! ```text
//! GET /v1/dev/backends                  {"backends": [{instance, service, zone, address, mode, served, failed, probes}]}
//! PUT /v1/dev/backends/{instance}/mode  {"mode": "slow"}   → 200 with the backend's new status
//! ```
//!
//! Invariants (checked by `tests.rs`):
//! - a backend in [`Mode::FailHard`] holds no listener and no connection; leaving it re-binds
//!   the same address, so [`Backends::addresses`] never changes
//! - a backend reports about itself on every mode change and then every `report_interval`,
//!   except in [`Mode::FailHard`], where it is silent like a dead process

mod api;
mod instance;
mod serve;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;
use waymark_core::model::SelfReport;
use waymark_core::units::Permille;

use self::instance::Backend;

/// The liveness path: what a prober checks. Answers quickly in every mode that listens.
pub const HEALTH_PATH: &str = "/healthz";
/// The readiness path: `200` unless the backend is not ready (or flapping through a bad phase).
pub const READY_PATH: &str = "/readyz";
/// How long [`Backends::shutdown`] waits for open requests before it stops waiting.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Receives what a backend says about itself: `(instance, report)`.
///
/// Called from the backend's reporting task, so it must not block: forward the report over a
/// channel (`try_send`) or hand it to a non-blocking sink.
pub type SelfReportFn = Arc<dyn Fn(&str, SelfReport) + Send + Sync>;

/// One demo backend to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendSpec {
    /// Its instance id, unique among the backends started together; also its name in the API.
    pub instance: String,
    /// The service it belongs to.
    pub service: String,
    /// The zone it runs in.
    pub zone: String,
    /// Where it listens; port `0` picks a free port, kept for the backend's whole life.
    pub bind: SocketAddr,
}

/// How a backend behaves. Set with [`Backends::set_mode`] or the control API.
///
/// Serialised in `snake_case`; the `kebab-case` spellings (`"fail-hard"`) are accepted too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Everything works: traffic (any path but the health paths) answers `200` with a small
    /// JSON body naming the instance, service and zone; [`HEALTH_PATH`] and [`READY_PATH`]
    /// answer `200`. Self-reports: ready, dependency ok.
    #[default]
    Healthy,
    /// A crash: the listener is dropped, so connections are refused, and open connections are
    /// closed. Probes see `Refused` (a hard failure) and callers see connect errors. The
    /// backend is silent, so its self-reports go stale. Leaving this mode re-binds the same
    /// address.
    #[serde(alias = "fail-hard")]
    FailHard,
    /// A grey failure: [`HEALTH_PATH`] and [`READY_PATH`] answer `200` at once, while traffic
    /// takes [`BackendOptions::slow_delay`] and a share ([`BackendOptions::slow_failed`])
    /// of it answers `503`. Self-reports: ready. Only passive evidence (the callers' outcomes)
    /// can catch it.
    Slow,
    /// An unstable process: [`HEALTH_PATH`], [`READY_PATH`] and traffic answer `200` for one
    /// [`BackendOptions::flap_period`], then `503` for the next, and so on, starting with
    /// `200` when the mode is set. Self-reports: ready (the process believes it is fine).
    Flap,
    /// Alive but not ready: [`HEALTH_PATH`] answers `200`, [`READY_PATH`] and traffic `503`.
    /// Self-reports: not ready.
    #[serde(alias = "not-ready")]
    NotReady,
    /// A shared dependency is in trouble, but this instance is not: everything answers `200`,
    /// and the backend self-reports its dependency ([`BackendOptions::dependency`]) as
    /// degraded. Per-instance ejection must not follow; this verdict belongs to a human.
    #[serde(alias = "degraded-dependency")]
    DegradedDependency,
}

/// Tuning shared by all the backends started together. [`Default`] gives the documented
/// defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendOptions {
    /// How long each traffic request takes in [`Mode::Slow`] (default 2 s).
    pub slow_delay: Duration,
    /// The share of traffic requests answering `503` in [`Mode::Slow`] (default 500 ‰),
    /// spread evenly rather than drawn at random, so runs repeat.
    pub slow_failed: Permille,
    /// How long each phase lasts in [`Mode::Flap`] (default 3 s); must not be zero.
    pub flap_period: Duration,
    /// How often a backend repeats its self-report (default 5 s); must not be zero. Keep it
    /// under the contract's self-report freshness window, or reports go stale between sends.
    pub report_interval: Duration,
    /// The shared dependency each backend reports on (default `"db"`); it must be declared in
    /// the service's health contract, or the evaluator refuses the reports.
    pub dependency: String,
}

/// One backend as the control API lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStatus {
    /// Its instance id.
    pub instance: String,
    /// Its service.
    pub service: String,
    /// Its zone.
    pub zone: String,
    /// The address it listens on (or will again, after [`Mode::FailHard`]).
    pub address: SocketAddr,
    /// Its current mode.
    pub mode: Mode,
    /// Traffic requests answered `2xx` since start.
    pub served: u64,
    /// Traffic requests answered `5xx` since start.
    pub failed: u64,
    /// Requests to [`HEALTH_PATH`] and [`READY_PATH`] since start.
    pub probes: u64,
}

/// Why starting or steering the backends failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// A spec is unusable (empty or duplicate instance id). Nothing was started; fix the specs.
    #[error("invalid backend spec for instance {instance:?}: {reason}")]
    InvalidSpec {
        /// The offending instance id.
        instance: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An option is out of range. Nothing was started; fix the options.
    #[error("invalid backend options: {reason}")]
    InvalidOptions {
        /// What is wrong.
        reason: &'static str,
    },
    /// [`Backends::start`] was called outside a tokio runtime. Nothing was started; call it
    /// from within one.
    #[error("no tokio runtime to run the backends on")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
    /// A backend could not bind its address at start. Nothing is left running; pick another
    /// address (or port `0`).
    #[error("cannot bind backend {instance} to {addr}")]
    Bind {
        /// The backend.
        instance: String,
        /// The address it asked for.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// Leaving [`Mode::FailHard`], the backend could not bind its address again (another
    /// process took the port meanwhile). The backend stays in [`Mode::FailHard`]; retry later.
    #[error("cannot re-bind backend {instance} to {addr}")]
    Rebind {
        /// The backend.
        instance: String,
        /// Its address.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// No backend has this instance id. Nothing changed; list them to see the names.
    #[error("no backend with instance id {instance:?}")]
    UnknownInstance {
        /// The id asked for.
        instance: String,
    },
    /// The backends were shut down. Nothing changed; start new ones.
    #[error("the backends are shut down")]
    ShutDown,
}

/// A set of running demo backends, each a listener plus a self-reporting task.
///
/// Dropping it closes every listener and connection and stops the tasks;
/// [`Backends::shutdown`] does the same but lets open requests finish first.
pub struct Backends {
    backends: BTreeMap<String, Arc<Backend>>,
    runtime: Handle,
    stop: watch::Sender<bool>,
    tasks: Mutex<Option<JoinSet<()>>>,
}

/// The error [`Mode::from_str`](std::str::FromStr::from_str) returns for an unknown name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown mode {input:?}; expected one of healthy, fail_hard, slow, flap, not_ready, degraded_dependency"
)]
pub struct ParseModeError {
    input: String,
}

// === impl Mode ===

impl Mode {
    /// Every mode, in the documented order.
    pub const ALL: [Self; 6] = [
        Self::Healthy,
        Self::FailHard,
        Self::Slow,
        Self::Flap,
        Self::NotReady,
        Self::DegradedDependency,
    ];

    /// The mode's name as the API writes it (`snake_case`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::FailHard => "fail_hard",
            Self::Slow => "slow",
            Self::Flap => "flap",
            Self::NotReady => "not_ready",
            Self::DegradedDependency => "degraded_dependency",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Mode {
    type Err = ParseModeError;

    /// Accepts the `snake_case` and `kebab-case` spellings, case-sensitively like the API.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let snake = s.replace('-', "_");
        Self::ALL
            .into_iter()
            .find(|mode| mode.as_str() == snake)
            .ok_or_else(|| ParseModeError {
                input: s.to_owned(),
            })
    }
}

// === impl BackendOptions ===

impl BackendOptions {
    fn validate(&self) -> Result<(), BackendError> {
        let reason = if self.flap_period.is_zero() {
            "flap_period must not be zero"
        } else if self.report_interval.is_zero() {
            "report_interval must not be zero"
        } else if self.dependency.is_empty() {
            "dependency must not be empty"
        } else {
            return Ok(());
        };
        Err(BackendError::InvalidOptions { reason })
    }
}

impl Default for BackendOptions {
    fn default() -> Self {
        Self {
            slow_delay: Duration::from_secs(2),
            slow_failed: Permille::saturating(500),
            flap_period: Duration::from_secs(3),
            report_interval: Duration::from_secs(5),
            dependency: "db".to_owned(),
        }
    }
}

// === impl Backends ===

impl Backends {
    /// Binds every backend in `specs`, then starts serving and self-reporting through
    /// `self_report` (the first report of each backend is sent at once).
    ///
    /// Must be called from within a tokio runtime, on which the backends then run. On error
    /// nothing is left running.
    pub fn start(
        specs: Vec<BackendSpec>,
        options: BackendOptions,
        self_report: SelfReportFn,
    ) -> Result<Self, BackendError> {
        options.validate()?;
        let runtime = Handle::try_current().map_err(BackendError::NoRuntime)?;
        let options = Arc::new(options);
        let mut backends = BTreeMap::new();
        for spec in specs {
            let reason = if spec.instance.is_empty() {
                Some("instance id must not be empty")
            } else if backends.contains_key(&spec.instance) {
                Some("instance id is used twice")
            } else {
                None
            };
            if let Some(reason) = reason {
                let instance = spec.instance;
                return Err(BackendError::InvalidSpec { instance, reason });
            }
            let backend = Backend::bind(spec, Arc::clone(&options))?;
            backends.insert(backend.spec.instance.clone(), Arc::new(backend));
        }

        let (stop, _) = watch::channel(false);
        let mut tasks = JoinSet::new();
        for backend in backends.values() {
            let span = tracing::info_span!(
                "dev_backend",
                instance = %backend.spec.instance,
                service = %backend.spec.service,
                zone = %backend.spec.zone,
            );
            let serving = serve::run(Arc::clone(backend), stop.subscribe());
            tasks.spawn_on(serving.instrument(span.clone()), &runtime);
            let reporting = instance::report(
                Arc::clone(backend),
                stop.subscribe(),
                Arc::clone(&self_report),
            );
            tasks.spawn_on(reporting.instrument(span), &runtime);
            tracing::info!(
                instance = %backend.spec.instance,
                service = %backend.spec.service,
                zone = %backend.spec.zone,
                addr = %backend.addr,
                "demo backend listening"
            );
        }
        Ok(Self {
            backends,
            runtime,
            stop,
            tasks: Mutex::new(Some(tasks)),
        })
    }

    /// Each backend's bound address, by instance id. Stable for the backends' whole life,
    /// across [`Mode::FailHard`] and back.
    pub fn addresses(&self) -> BTreeMap<String, SocketAddr> {
        self.backends
            .iter()
            .map(|(instance, backend)| (instance.clone(), backend.addr))
            .collect()
    }

    /// Each backend's current mode, by instance id.
    pub fn modes(&self) -> BTreeMap<String, Mode> {
        self.backends
            .iter()
            .map(|(instance, backend)| (instance.clone(), backend.mode()))
            .collect()
    }

    /// Every backend's status, ordered by instance id.
    pub fn status(&self) -> Vec<BackendStatus> {
        self.backends.values().map(|b| b.status()).collect()
    }

    /// Switches one backend to `mode` and has it report about itself at once.
    ///
    /// On return, a backend entering [`Mode::FailHard`] refuses connections (its open ones
    /// close moments later), and one leaving it listens again on the same address. Setting
    /// the current mode again restarts its clock ([`Mode::Flap`]'s phase) and re-sends the
    /// self-report. On error nothing changed.
    pub fn set_mode(&self, instance: &str, mode: Mode) -> Result<(), BackendError> {
        let backend = self
            .backends
            .get(instance)
            .ok_or_else(|| BackendError::UnknownInstance {
                instance: instance.to_owned(),
            })?;
        backend.set_mode(mode, &self.runtime)
    }

    /// Stops every backend: listeners and idle connections close at once, open requests get
    /// up to [`SHUTDOWN_GRACE`] to finish, and self-reports stop. Later calls to
    /// [`Backends::set_mode`] fail with [`BackendError::ShutDown`]. Idempotent.
    pub async fn shutdown(&self) {
        self.close();
        let Some(mut tasks) = lock(&self.tasks).take() else {
            return;
        };
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while let Some(joined) = tasks.join_next().await {
                if let Err(error) = joined
                    && error.is_panic()
                {
                    tracing::warn!(%error, "demo backend task panicked");
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                grace_ms = SHUTDOWN_GRACE.as_millis() as u64,
                "demo backends still busy after the grace period; aborting them"
            );
            tasks.shutdown().await;
        }
        tracing::info!(backends = self.backends.len(), "demo backends stopped");
    }

    /// Closes every listener and connection and tells the tasks to stop; returns at once.
    fn close(&self) {
        self.stop.send_replace(true);
        for backend in self.backends.values() {
            backend.close();
        }
    }
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("backends", &self.addresses())
            .field("stopped", &*self.stop.borrow())
            .finish_non_exhaustive()
    }
}

impl Drop for Backends {
    fn drop(&mut self) {
        // Connection tasks outlive the aborted server tasks until their sockets close, and
        // they hold the backend: close explicitly so no port stays bound after the drop.
        self.close();
    }
}

/// Locks `mutex`, ignoring poisoning: every critical section here leaves its data valid.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
