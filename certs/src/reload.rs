//! Rotation without restart: watch certificate, key and bundle files; swap atomically.
//!
//! ```text
//! notify (fs events) ─► debounce ─► read files ─► validate_material(now) ─► decide ─► swap
//!                                                                            │
//!                                  ReloadEvent::{Swapped, Unchanged, Rejected} (broadcast)
//! ```
//!
//! [`decide`] is the pure part: given what is served and what the files now hold, swap,
//! do nothing, or refuse. A refusal (truncated PEM, key that does not match, expired,
//! wrong CA, changed identity, …) is logged at `error` with the reason, counted, and
//! published as an event; the old material keeps serving. Tests and operators wait on
//! [`Reloader::subscribe`] rather than on time.
//!
//! Writers should replace files atomically (write a temporary file, then rename; that is
//! what `waymark certs issue` does). A non-atomic writer may be caught half-way, which is
//! refused and then accepted once the write completes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{broadcast, mpsc};
use tracing::{error, info};

use crate::error::{CertError, PemPart, RejectReason};
use crate::live::LiveMaterial;
use crate::material::{Material, MaterialPem, PeerPolicy, validate_material};
use crate::metrics::{CertMetrics, RejectSource, ReloadOutcome};

/// Quiet time after the last file event before reloading, so one rotation (several
/// writes and renames) is read once.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// Events kept for slow subscribers before the oldest are dropped.
pub const EVENTS_CAPACITY: usize = 64;

/// The three files that make up our material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaterialPaths {
    /// Leaf followed by intermediates (`fullchain.pem`).
    pub cert_chain: PathBuf,
    /// Private key (`key.pem`).
    pub key: PathBuf,
    /// Trust bundle (`bundle.pem`).
    pub bundle: PathBuf,
}

/// What to do with freshly read files.
#[derive(Debug)]
pub enum Decision {
    /// Serve the new material.
    Swap(Material),
    /// The files hold what is already served.
    Unchanged,
    /// Keep serving the old material; the files were refused for this reason.
    Reject(CertError),
}

/// What one reload attempt did.
#[derive(Debug, Clone)]
pub enum ReloadEvent {
    /// New material is in force from `generation` on.
    Swapped {
        /// Generation now served.
        generation: u64,
        /// New leaf serial, hex.
        serial: String,
        /// New leaf fingerprint.
        fingerprint: String,
        /// New leaf expiry, unix seconds.
        not_after: i64,
    },
    /// Nothing changed.
    Unchanged,
    /// The files were refused; the old material keeps serving.
    Rejected {
        /// Why, as a metric label.
        reason: RejectReason,
        /// The full error.
        error: Arc<CertError>,
    },
}

/// Why the watcher could not start. Nothing is watched; reloads can still be triggered
/// with [`Reloader::reload_now`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WatchError {
    /// The platform watcher refused.
    #[error("cannot watch certificate files")]
    Notify(#[from] notify::Error),
}

/// Decides whether `candidate` should replace `current`. Pure.
pub fn decide(current: &Material, candidate: Result<Material, CertError>) -> Decision {
    let new = match candidate {
        Ok(new) => new,
        Err(err) => return Decision::Reject(err),
    };
    if new.identity != current.identity {
        return Decision::Reject(CertError::IdentityChanged {
            serving: Box::new(current.identity.clone()),
            found: Box::new(new.identity),
        });
    }
    if new.leaf.fingerprint == current.leaf.fingerprint
        && new.bundle_digest == current.bundle_digest
    {
        return Decision::Unchanged;
    }
    Decision::Swap(new)
}

/// Reads the three files and validates them at `now`. Reading is the only IO.
pub async fn load_material(
    paths: &MaterialPaths,
    policy: &PeerPolicy,
    now: SystemTime,
) -> Result<Material, CertError> {
    let cert_chain = read(&paths.cert_chain, PemPart::Certificate).await?;
    let key = read(&paths.key, PemPart::Key).await?;
    let bundle = read(&paths.bundle, PemPart::Bundle).await?;
    let pem = MaterialPem {
        cert_chain: &cert_chain,
        key: &key,
        bundle: &bundle,
    };
    validate_material(pem, policy, now)
}

/// Reloads [`LiveMaterial`] from files, on demand or on file events.
#[derive(Debug)]
pub struct Reloader {
    paths: MaterialPaths,
    live: Arc<LiveMaterial>,
    policy: PeerPolicy,
    metrics: CertMetrics,
    events: broadcast::Sender<ReloadEvent>,
}

/// Keeps the file watcher alive; dropping it stops watching.
#[derive(Debug)]
pub struct WatchHandle {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

// === impl Reloader ===

impl Reloader {
    /// A reloader for `live`, whose own material must satisfy `policy` (trust domain and
    /// kind of the process's identity).
    pub fn new(
        paths: MaterialPaths,
        live: Arc<LiveMaterial>,
        policy: PeerPolicy,
        metrics: CertMetrics,
    ) -> Arc<Self> {
        let (events, _) = broadcast::channel(EVENTS_CAPACITY);
        metrics.set_leaf_not_after(live.current().leaf.not_after);
        Arc::new(Self {
            paths,
            live,
            policy,
            metrics,
            events,
        })
    }

    /// Events of every later reload attempt.
    pub fn subscribe(&self) -> broadcast::Receiver<ReloadEvent> {
        self.events.subscribe()
    }

    /// Reads the files now and applies the decision.
    pub async fn reload_now(&self) -> ReloadEvent {
        // The shell reads the clock; everything below takes it as data.
        let candidate = load_material(&self.paths, &self.policy, SystemTime::now()).await;
        let event = self.apply(decide(&self.live.current(), candidate));
        // No subscribers is fine: the event is also logged and counted.
        let _ = self.events.send(event.clone());
        event
    }

    fn apply(&self, decision: Decision) -> ReloadEvent {
        match decision {
            Decision::Swap(material) => {
                let (serial, fingerprint) = (
                    material.leaf.serial.clone(),
                    material.leaf.fingerprint.clone(),
                );
                let not_after = material.leaf.not_after;
                let generation = self.live.swap(material);
                self.metrics.record_reload(ReloadOutcome::Swapped);
                self.metrics.set_leaf_not_after(not_after);
                info!(generation, %serial, %fingerprint, not_after, "certificate reloaded");
                ReloadEvent::Swapped {
                    generation,
                    serial,
                    fingerprint,
                    not_after,
                }
            }
            Decision::Unchanged => {
                self.metrics.record_reload(ReloadOutcome::Unchanged);
                ReloadEvent::Unchanged
            }
            Decision::Reject(err) => {
                let reason = err.reason();
                let serving = self.live.current();
                self.metrics.record_reload(ReloadOutcome::Rejected);
                self.metrics.record_rejection(reason, RejectSource::Local);
                error!(
                    %reason,
                    error = %err,
                    serving_serial = %serving.leaf.serial,
                    serving_not_after = serving.leaf.not_after,
                    cert = %self.paths.cert_chain.display(),
                    "new certificate files refused; still serving the old ones"
                );
                ReloadEvent::Rejected {
                    reason,
                    error: Arc::new(err),
                }
            }
        }
    }

    /// Watches the directories holding the three files and reloads after each burst of
    /// changes. Must be called inside a tokio runtime.
    pub fn watch(self: &Arc<Self>) -> Result<WatchHandle, WatchError> {
        use notify::Watcher as _;
        // Capacity 1 is enough: a pending signal already means "reload", and reloads
        // re-read everything, so extra signals carry no information.
        let (tx, mut rx) = mpsc::channel::<()>(1);
        let names: Vec<PathBuf> = self.paths().map(Path::to_path_buf).collect();
        let mut watcher =
            notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
                let ours = |event: &notify::Event| {
                    event
                        .paths
                        .iter()
                        .any(|p| names.iter().any(|n| same_file(p, n)))
                };
                if res.as_ref().is_ok_and(ours) {
                    // Full means a reload is already pending; dropping this signal is right.
                    let _ = tx.try_send(());
                }
            })?;
        let mut dirs: Vec<&Path> = self.paths().filter_map(Path::parent).collect();
        dirs.sort();
        dirs.dedup();
        for dir in dirs {
            watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
        }
        let me = Arc::clone(self);
        let task = tokio::spawn(async move {
            while rx.recv().await.is_some() {
                // Debounce: wait until the files have been quiet for DEBOUNCE.
                while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
                me.reload_now().await;
            }
        });
        Ok(WatchHandle {
            _watcher: watcher,
            task,
        })
    }

    fn paths(&self) -> impl Iterator<Item = &Path> {
        [&self.paths.cert_chain, &self.paths.key, &self.paths.bundle]
            .into_iter()
            .map(PathBuf::as_path)
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read(path: &Path, part: PemPart) -> Result<Vec<u8>, CertError> {
    tokio::fs::read(path)
        .await
        .map_err(|source| CertError::Unreadable { part, source })
}

/// Whether an event path names one of our files (events may carry absolute or
/// canonicalised paths while ours are as configured).
fn same_file(event_path: &Path, ours: &Path) -> bool {
    event_path == ours || (event_path.file_name() == ours.file_name() && ours.file_name().is_some())
}

#[cfg(test)]
#[path = "reload_test.rs"]
mod tests;
