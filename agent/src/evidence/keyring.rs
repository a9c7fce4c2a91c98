//! Gossip keyring operations the leader asks of a node agent over its evidence session
//! (online key rotation, see `gossip/rotation.rs`):
//!
//! ```text
//! node agent ◄──keyring_request {id, list | install key | use id | remove id}── leader
//! node agent ──keyring_answer {id, held {key ids, changed} | refused {reason}}─► leader
//! ```
//!
//! The session is mutual TLS both ways, so the node knows the request comes from an
//! authority of its region and the leader knows which node answers. A region key travels
//! only inside an `install`; `use` and `remove` name a key by its 8-byte id, and answers
//! carry ids only.

use super::pb;
use super::wire::{WireError, text};
use crate::gossip::codec::{KEY_LEN, Key, KeyId};
use crate::gossip::rotation::{KEYS_MAX, KeyringOp, KeyringStatus};
use crate::gossip::{KeyringApplied, KeyringError};

/// Longest refusal reason label.
pub const KEYRING_REASON_BYTES_MAX: usize = 64;
/// Longest refusal message.
pub const KEYRING_MESSAGE_BYTES_MAX: usize = 1024;
/// Bytes of a key id on the wire.
const KEY_ID_BYTES: usize = crate::gossip::codec::crypto::KEY_ID_LEN;

/// The leader asks a node to list or change its gossip keyring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyringRequest {
    /// Echoed in the answer.
    pub request_id: u64,
    /// What to do.
    pub op: KeyringOp,
}

/// A node's answer to a [`KeyringRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyringAnswer {
    /// The request answered.
    pub request_id: u64,
    /// What happened.
    pub outcome: KeyringOutcome,
}

/// What a keyring operation did on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyringOutcome {
    /// In force (or nothing to change): the key ids held now.
    Held {
        /// The ids.
        status: KeyringStatus,
        /// Whether the operation changed them.
        changed: bool,
    },
    /// Refused; nothing changed.
    Refused {
        /// A stable label.
        reason: String,
        /// For the operator.
        message: String,
    },
}

impl KeyringOutcome {
    /// The outcome of applying an operation to a live keyring.
    pub fn of(result: Result<KeyringApplied, KeyringError>) -> Self {
        match result {
            Ok(applied) => Self::Held {
                status: applied.status,
                changed: applied.changed,
            },
            Err(e) => Self::refused(e.reason(), &chain(&e)),
        }
    }

    /// A refusal, its words cut to the wire's bounds.
    pub fn refused(reason: &str, message: &str) -> Self {
        Self::Refused {
            reason: super::clipped(reason, KEYRING_REASON_BYTES_MAX),
            message: super::clipped(message, KEYRING_MESSAGE_BYTES_MAX),
        }
    }
}

impl From<KeyringRequest> for pb::KeyringRequest {
    fn from(value: KeyringRequest) -> Self {
        use pb::keyring_request::Op;
        let op = match value.op {
            KeyringOp::List => Op::List(pb::KeyringList {}),
            KeyringOp::Install(key) => Op::Install(key.secret_bytes().to_vec()),
            KeyringOp::Use(id) => Op::UseKey(id.as_bytes().to_vec()),
            KeyringOp::Remove(id) => Op::Remove(id.as_bytes().to_vec()),
        };
        Self {
            request_id: value.request_id,
            op: Some(op),
        }
    }
}

impl TryFrom<pb::KeyringRequest> for KeyringRequest {
    type Error = WireError;

    fn try_from(value: pb::KeyringRequest) -> Result<Self, WireError> {
        use pb::keyring_request::Op;
        let op = match value.op {
            None => {
                return Err(WireError::Missing {
                    field: "keyring_request.op",
                });
            }
            Some(Op::List(_)) => KeyringOp::List,
            Some(Op::Install(bytes)) => {
                let field = "keyring_request.install";
                let key = Key::try_from_slice(&bytes)
                    .map_err(|_| bad_length(field, bytes.len(), KEY_LEN))?;
                KeyringOp::Install(key)
            }
            Some(Op::UseKey(bytes)) => KeyringOp::Use(key_id("keyring_request.use_key", &bytes)?),
            Some(Op::Remove(bytes)) => KeyringOp::Remove(key_id("keyring_request.remove", &bytes)?),
        };
        Ok(Self {
            request_id: value.request_id,
            op,
        })
    }
}

impl From<KeyringAnswer> for pb::KeyringAnswer {
    fn from(value: KeyringAnswer) -> Self {
        use pb::keyring_answer::Outcome;
        let outcome = match value.outcome {
            KeyringOutcome::Held { status, changed } => Outcome::Held(pb::KeyringHeld {
                keys: status
                    .keys
                    .iter()
                    .map(|id| id.as_bytes().to_vec())
                    .collect(),
                changed,
            }),
            KeyringOutcome::Refused { reason, message } => {
                Outcome::Refused(pb::KeyringRefused { reason, message })
            }
        };
        Self {
            request_id: value.request_id,
            outcome: Some(outcome),
        }
    }
}

impl TryFrom<pb::KeyringAnswer> for KeyringAnswer {
    type Error = WireError;

    fn try_from(value: pb::KeyringAnswer) -> Result<Self, WireError> {
        use pb::keyring_answer::Outcome;
        let outcome = match value.outcome {
            None => {
                return Err(WireError::Missing {
                    field: "keyring_answer.outcome",
                });
            }
            Some(Outcome::Held(held)) => {
                let field = "keyring_answer.held.keys";
                if held.keys.is_empty() || held.keys.len() > KEYS_MAX {
                    return Err(WireError::TooMany {
                        field,
                        len: held.keys.len(),
                        max: KEYS_MAX,
                    });
                }
                let keys = held
                    .keys
                    .iter()
                    .map(|bytes| key_id(field, bytes))
                    .collect::<Result<Vec<_>, _>>()?;
                KeyringOutcome::Held {
                    status: KeyringStatus {
                        primary: keys[0],
                        keys,
                    },
                    changed: held.changed,
                }
            }
            Some(Outcome::Refused(r)) => KeyringOutcome::Refused {
                reason: text(
                    "keyring_answer.refused.reason",
                    r.reason,
                    1,
                    KEYRING_REASON_BYTES_MAX,
                )?,
                message: text(
                    "keyring_answer.refused.message",
                    r.message,
                    0,
                    KEYRING_MESSAGE_BYTES_MAX,
                )?,
            },
        };
        Ok(Self {
            request_id: value.request_id,
            outcome,
        })
    }
}

/// An error and its sources, `outer: inner: …`.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

fn key_id(field: &'static str, bytes: &[u8]) -> Result<KeyId, WireError> {
    let array: [u8; KEY_ID_BYTES] = bytes
        .try_into()
        .map_err(|_| bad_length(field, bytes.len(), KEY_ID_BYTES))?;
    Ok(KeyId::from_bytes(array))
}

fn bad_length(field: &'static str, len: usize, expected: usize) -> WireError {
    WireError::BadLength {
        field,
        len,
        min: expected,
        max: expected,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::evidence::{AgentMessage, AuthorityMessage};

    #[test]
    fn keyring_messages_survive_the_wire() {
        // Goal: every operation and both outcomes round-trip through protobuf unchanged.
        let key = Key::from_bytes(&[3; KEY_LEN]);
        for op in [
            KeyringOp::List,
            KeyringOp::Install(key.clone()),
            KeyringOp::Use(key.id()),
            KeyringOp::Remove(key.id()),
        ] {
            let m = AuthorityMessage::KeyringRequest(KeyringRequest { request_id: 7, op });
            let back = AuthorityMessage::try_from(pb::AuthorityMessage::from(m.clone())).unwrap();
            assert_eq!(back, m);
        }
        let status = KeyringStatus {
            primary: key.id(),
            keys: vec![key.id(), Key::from_bytes(&[4; KEY_LEN]).id()],
        };
        for outcome in [
            KeyringOutcome::Held {
                status,
                changed: true,
            },
            KeyringOutcome::refused("remove_primary", "no"),
        ] {
            let m = AgentMessage::KeyringAnswer(KeyringAnswer {
                request_id: 9,
                outcome,
            });
            let back = AgentMessage::try_from(pb::AgentMessage::from(m.clone())).unwrap();
            assert_eq!(back, m);
        }
    }

    #[test]
    fn malformed_keyring_messages_are_refused() {
        // Goal: a short key, a long id, an unset op, an empty or oversized key list and a
        // missing reason are typed refusals, never a panic or a guess.
        use pb::keyring_request::Op;
        let request = |op| pb::KeyringRequest { request_id: 1, op };
        for op in [
            None,
            Some(Op::Install(vec![1; KEY_LEN - 1])),
            Some(Op::UseKey(vec![1; 9])),
            Some(Op::Remove(Vec::new())),
        ] {
            assert!(
                KeyringRequest::try_from(request(op.clone())).is_err(),
                "{op:?}"
            );
        }
        let held = |keys: Vec<Vec<u8>>| pb::KeyringAnswer {
            request_id: 1,
            outcome: Some(pb::keyring_answer::Outcome::Held(pb::KeyringHeld {
                keys,
                changed: false,
            })),
        };
        assert!(KeyringAnswer::try_from(held(Vec::new())).is_err());
        assert!(KeyringAnswer::try_from(held(vec![vec![0; 8]; KEYS_MAX + 1])).is_err());
        assert!(KeyringAnswer::try_from(held(vec![vec![0; 7]])).is_err());
        let refused = pb::KeyringAnswer {
            request_id: 1,
            outcome: Some(pb::keyring_answer::Outcome::Refused(pb::KeyringRefused {
                reason: String::new(),
                message: "x".into(),
            })),
        };
        assert!(KeyringAnswer::try_from(refused).is_err());
    }
}
