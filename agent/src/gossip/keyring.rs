//! The shell around [`rotate`]: a member's live keyring, changed online.
//!
//! ```text
//! op ──► rotate(current, op) ──refused──► KeyringError::Refused (nothing changed)
//!              │ changed
//!              ▼
//!        save gossip.keyring (0600, temp + rename) ──failed──► KeyringError::Persist
//!              ▼                                               (nothing changed)
//!        driver: Command::SetKeyring ──► seals/opens with it from the next datagram
//! ```
//!
//! Operations are serialised (one lock held across the three steps), so two at once
//! never persist one ring and put the other in force. Each is counted in
//! `waymark_gossip_keyring_operations_total{op,result}` and traced in a
//! `gossip_keyring{op, key_id}` span; the keys held are the gauge
//! `waymark_gossip_keyring_keys`. Key material is never logged: ids only.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc, oneshot};
use tracing::Instrument as _;

use super::codec::Keyring;
use super::driver::Command;
use super::keyring_file::{self, KeyringFileError};
use super::metrics::GossipMetrics;
use super::rotation::{KeyringOp, KeyringRefusal, KeyringStatus, rotate};

/// Why a keyring operation did not take effect. None of them changed the keyring in force.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyringError {
    /// The operation is not allowed on this ring (see [`KeyringRefusal`]): fix the
    /// request.
    #[error(transparent)]
    Refused(#[from] KeyringRefusal),
    /// The new ring could not be persisted, so it was not put in force either (a restart
    /// would have lost it). Fix the data directory and retry.
    #[error("the keyring was not persisted")]
    Persist(#[source] KeyringFileError),
    /// The gossip driver has stopped. Restart the member: if the new ring was persisted
    /// before the driver was found gone, the restart puts it in force.
    #[error("gossip driver has stopped")]
    Stopped,
}

impl KeyringError {
    /// A stable label for the API, the wire and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Refused(r) => r.reason(),
            Self::Persist(_) => "not_persisted",
            Self::Stopped => "gossip_stopped",
        }
    }
}

/// What an operation that was not refused left in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyringApplied {
    /// The key ids held now.
    pub status: KeyringStatus,
    /// Whether the operation changed them.
    pub changed: bool,
}

/// A member's live keyring; clones share it. Get one with [`super::Gossip::keyring`].
#[derive(Debug, Clone)]
pub struct GossipKeyring {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    current: Mutex<Keyring>,
    commands: mpsc::Sender<Command>,
    file: Option<PathBuf>,
    metrics: GossipMetrics,
}

// === impl GossipKeyring ===

impl GossipKeyring {
    pub(super) fn new(
        keyring: Keyring,
        commands: mpsc::Sender<Command>,
        file: Option<PathBuf>,
        metrics: GossipMetrics,
    ) -> Self {
        metrics.set_keyring_keys(keyring.keys().count());
        Self {
            inner: Arc::new(Inner {
                current: Mutex::new(keyring),
                commands,
                file,
                metrics,
            }),
        }
    }

    /// The key ids held now.
    pub async fn status(&self) -> KeyringStatus {
        KeyringStatus::of(&*self.inner.current.lock().await)
    }

    /// Applies `op`: persisted, then in force, before this returns; or refused, with
    /// nothing changed.
    pub async fn apply(&self, op: KeyringOp) -> Result<KeyringApplied, KeyringError> {
        let label = op.label();
        let key_id = op.key_id().map(|id| id.to_string());
        let span = tracing::info_span!("gossip_keyring", op = label, key_id = key_id.as_deref());
        let outcome = self.apply_locked(op).instrument(span.clone()).await;
        let result = match &outcome {
            Ok(applied) if applied.changed => "applied",
            Ok(_) => "unchanged",
            Err(KeyringError::Refused(_)) => "refused",
            Err(_) => "failed",
        };
        self.inner.metrics.count_keyring_operation(label, result);
        let _entered = span.enter();
        match &outcome {
            Ok(applied) if applied.changed => tracing::info!(
                primary = %applied.status.primary,
                keys = applied.status.keys.len(),
                "gossip keyring changed"
            ),
            Ok(_) => tracing::debug!("gossip keyring unchanged"),
            Err(error) => {
                tracing::warn!(reason = error.reason(), %error, "gossip keyring operation refused")
            }
        }
        outcome
    }

    /// Puts `keyring` in force without an operation (tests, and [`super::Gossip::set_keyring`]).
    pub(super) async fn replace(&self, keyring: Keyring) -> Result<(), KeyringError> {
        let mut current = self.inner.current.lock().await;
        self.put_in_force(keyring.clone()).await?;
        self.inner.metrics.set_keyring_keys(keyring.keys().count());
        *current = keyring;
        Ok(())
    }

    async fn apply_locked(&self, op: KeyringOp) -> Result<KeyringApplied, KeyringError> {
        let mut current = self.inner.current.lock().await;
        let rotated = rotate(&current, &op)?;
        if rotated.changed {
            if let Some(path) = &self.inner.file {
                let (path, keyring) = (path.clone(), rotated.keyring.clone());
                tokio::task::spawn_blocking(move || keyring_file::save(&path, &keyring))
                    .await
                    .map_err(|_| KeyringError::Stopped)?
                    .map_err(KeyringError::Persist)?;
            }
            self.put_in_force(rotated.keyring.clone()).await?;
            self.inner
                .metrics
                .set_keyring_keys(rotated.keyring.keys().count());
            *current = rotated.keyring;
        }
        Ok(KeyringApplied {
            status: KeyringStatus::of(&current),
            changed: rotated.changed,
        })
    }

    async fn put_in_force(&self, keyring: Keyring) -> Result<(), KeyringError> {
        let (done, ack) = oneshot::channel();
        self.inner
            .commands
            .send(Command::SetKeyring(keyring, done))
            .await
            .map_err(|_| KeyringError::Stopped)?;
        ack.await.map_err(|_| KeyringError::Stopped)
    }
}
