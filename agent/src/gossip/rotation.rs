//! Online keyring rotation, decided purely: the keyring a member holds and one operation
//! give the next keyring, or a typed refusal that changed nothing.
//!
//! ```text
//! install B   {A}    -> {A, B}   seals with A still; opens B from now on
//! use B       {A, B} -> {B, A}   refused unless B is held: install comes first
//! remove A    {B, A} -> {B}      refused while A is the primary
//! ```
//!
//! An operation already in force changes nothing and succeeds (install of a held key,
//! use of the primary, remove of a key not held), so an operator may repeat one across
//! the pool after a partial failure. A ring holds at most [`KEYS_MAX`] keys. The shell
//! that persists the result and hands it to the gossip driver is [`super::GossipKeyring`].

use super::codec::{Key, KeyId, Keyring};

/// Keys one ring holds at most: a rotation needs two; the rest is room for a rotation
/// begun while another is unfinished.
pub const KEYS_MAX: usize = 8;

/// What to do to a member's keyring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyringOp {
    /// Change nothing; report the keys held.
    List,
    /// Open with this key too; keep sealing with the primary.
    Install(Key),
    /// Seal with the held key of this id from now on; the old primary still opens.
    Use(KeyId),
    /// Stop opening with the key of this id; never the primary.
    Remove(KeyId),
}

/// Why an operation was refused. Every refusal leaves the keyring as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyringRefusal {
    /// `use` of a key this member does not hold: install it everywhere first.
    #[error("key {0} is not installed here; install it before using it")]
    NotInstalled(KeyId),
    /// `remove` of the key this member seals with: `use` another key first.
    #[error("key {0} is the primary key; use another key before removing it")]
    RemovePrimary(KeyId),
    /// `install` into a ring of [`KEYS_MAX`] keys: remove a retired key first.
    #[error("the keyring holds {max} keys already; remove one first")]
    Full {
        /// The bound.
        max: usize,
    },
}

impl KeyringRefusal {
    /// A stable label for the API, the wire and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotInstalled(_) => "key_not_installed",
            Self::RemovePrimary(_) => "remove_primary",
            Self::Full { .. } => "keyring_full",
        }
    }
}

/// The key ids a member holds: what may be shown anywhere (never key material).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyringStatus {
    /// The key it seals with.
    pub primary: KeyId,
    /// Every key it opens with, primary first.
    pub keys: Vec<KeyId>,
}

/// The outcome of an operation that was not refused.
#[derive(Debug, Clone)]
pub struct Rotated {
    /// The keyring now in force.
    pub keyring: Keyring,
    /// Whether it differs from the one before.
    pub changed: bool,
}

// === impl KeyringOp ===

impl KeyringOp {
    /// `list`, `install`, `use` or `remove`: the label of the API and of metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::List => "list",
            Self::Install(_) => "install",
            Self::Use(_) => "use",
            Self::Remove(_) => "remove",
        }
    }

    /// The id of the key the operation is about, if any.
    pub fn key_id(&self) -> Option<KeyId> {
        match self {
            Self::List => None,
            Self::Install(key) => Some(key.id()),
            Self::Use(id) | Self::Remove(id) => Some(*id),
        }
    }
}

// === impl KeyringStatus ===

impl KeyringStatus {
    /// The ids `keyring` holds.
    pub fn of(keyring: &Keyring) -> Self {
        Self {
            primary: keyring.primary().id(),
            keys: keyring.keys().map(Key::id).collect(),
        }
    }
}

/// Applies `op` to `current`: the next keyring, or why not (nothing changed).
pub fn rotate(current: &Keyring, op: &KeyringOp) -> Result<Rotated, KeyringRefusal> {
    let unchanged = || Rotated {
        keyring: current.clone(),
        changed: false,
    };
    let held = |id: KeyId| current.keys().find(|k| k.id() == id).cloned();
    match op {
        KeyringOp::List => Ok(unchanged()),
        KeyringOp::Install(key) => {
            if held(key.id()).is_some() {
                return Ok(unchanged());
            }
            if current.keys().count() >= KEYS_MAX {
                return Err(KeyringRefusal::Full { max: KEYS_MAX });
            }
            let mut others = current.others().to_vec();
            others.push(key.clone());
            Ok(Rotated {
                keyring: Keyring::new(current.primary().clone(), others),
                changed: true,
            })
        }
        KeyringOp::Use(id) => {
            if current.primary().id() == *id {
                return Ok(unchanged());
            }
            let key = held(*id).ok_or(KeyringRefusal::NotInstalled(*id))?;
            // The old primary goes first among the others: it is the key peers that have
            // not switched yet still seal with.
            let others = current.keys().filter(|k| k.id() != *id).cloned().collect();
            Ok(Rotated {
                keyring: Keyring::new(key, others),
                changed: true,
            })
        }
        KeyringOp::Remove(id) => {
            if current.primary().id() == *id {
                return Err(KeyringRefusal::RemovePrimary(*id));
            }
            if held(*id).is_none() {
                return Ok(unchanged());
            }
            let others = current
                .others()
                .iter()
                .filter(|k| k.id() != *id)
                .cloned()
                .collect();
            Ok(Rotated {
                keyring: Keyring::new(current.primary().clone(), others),
                changed: true,
            })
        }
    }
}

#[cfg(test)]
#[path = "rotation_test.rs"]
mod tests;
