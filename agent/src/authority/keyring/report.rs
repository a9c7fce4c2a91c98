//! What a pool-wide keyring operation found, decided purely: each target's outcome, the
//! counts per key id (`N of M hold key X, primary on P`, as `consul keyring -list` says it),
//! and the checks that refuse a `use` or `remove` before anything changes.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::gossip::KeyId;
use crate::gossip::rotation::{KeyringOp, KeyringStatus};

/// Names listed in a refusal's message at most (the rest are counted).
pub const NAMES_IN_MESSAGE_MAX: usize = 10;

/// Which kind of pool member a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TargetKind {
    /// An authority member (its own gossip pool member, `authority-<id>`).
    Authority,
    /// A node agent.
    Agent,
}

impl TargetKind {
    /// `authority` or `agent`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Authority => "authority",
            Self::Agent => "agent",
        }
    }
}

/// What one target said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetOutcome {
    /// It holds these keys now (the operation applied, or changed nothing).
    Held {
        /// The ids.
        status: KeyringStatus,
        /// Whether the operation changed them.
        changed: bool,
    },
    /// It refused the operation; nothing changed there.
    Refused {
        /// A stable label.
        reason: String,
        /// Its words.
        message: String,
    },
    /// No answer: not connected, timed out, unreachable. Its keyring is unknown.
    Failed {
        /// A stable label (`timeout`, `no_session`, `unreachable`, …).
        reason: String,
        /// Why.
        message: String,
    },
}

/// One target's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetResult {
    /// Its gossip name (`authority-<id>` or the node's name).
    pub name: String,
    /// Which kind.
    pub kind: TargetKind,
    /// What it said.
    pub outcome: TargetOutcome,
}

/// Why a pool-wide `use` or `remove` was refused before any target changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolRefusal {
    /// Some targets do not hold the key to use: install it there first.
    #[error("key {key} is not installed on {}: install it everywhere before using it", names(.on))]
    NotInstalled {
        /// The key.
        key: KeyId,
        /// Where it is missing.
        on: Vec<String>,
    },
    /// Some targets still seal with the key to remove: use another key first.
    #[error("key {key} is the primary key on {}: use another key before removing it", names(.on))]
    Primary {
        /// The key.
        key: KeyId,
        /// Where it is primary.
        on: Vec<String>,
    },
    /// Some targets did not say which keys they hold, so the operation could strand
    /// them. Bring them back (or retry), or pass `force` to leave them behind.
    #[error("{} did not answer, so whether they hold key {key} is unknown; retry, or force", names(.on))]
    Unconfirmed {
        /// The key.
        key: KeyId,
        /// Who did not answer.
        on: Vec<String>,
    },
}

impl PoolRefusal {
    /// A stable label for the API.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotInstalled { .. } => "key_not_installed",
            Self::Primary { .. } => "remove_primary",
            Self::Unconfirmed { .. } => "unconfirmed",
        }
    }
}

/// Whether `op` may go to the pool, given what every target `listed` now. A `use` needs
/// the key on every target; a `remove` needs it primary nowhere; either needs an answer
/// from every target unless `force`. Install and list always may.
pub fn precheck(op: &KeyringOp, listed: &[TargetResult], force: bool) -> Result<(), PoolRefusal> {
    let (key, want_held) = match op {
        KeyringOp::Use(key) => (*key, true),
        KeyringOp::Remove(key) => (*key, false),
        KeyringOp::List | KeyringOp::Install(_) => return Ok(()),
    };
    let mut blocking = Vec::new();
    let mut unconfirmed = Vec::new();
    for target in listed {
        match &target.outcome {
            TargetOutcome::Held { status, .. } => {
                let bad = if want_held {
                    !status.keys.contains(&key)
                } else {
                    status.primary == key
                };
                if bad {
                    blocking.push(target.name.clone());
                }
            }
            TargetOutcome::Refused { .. } | TargetOutcome::Failed { .. } => {
                unconfirmed.push(target.name.clone());
            }
        }
    }
    if !blocking.is_empty() {
        return Err(if want_held {
            PoolRefusal::NotInstalled { key, on: blocking }
        } else {
            PoolRefusal::Primary { key, on: blocking }
        });
    }
    if !unconfirmed.is_empty() && !force {
        return Err(PoolRefusal::Unconfirmed {
            key,
            on: unconfirmed,
        });
    }
    Ok(())
}

/// Every target's outcome of one operation, and the counts per key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolReport {
    /// `list`, `install`, `use` or `remove`.
    pub op: &'static str,
    /// The key the operation was about.
    pub key: Option<KeyId>,
    /// Every target, by kind then name.
    pub targets: Vec<TargetResult>,
}

/// How many targets hold a key, and on how many it is primary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyCount {
    /// Targets that hold it.
    pub held_by: usize,
    /// Targets that seal with it.
    pub primary_on: usize,
}

impl PoolReport {
    /// A report of `targets` (sorted here).
    pub fn new(op: &KeyringOp, mut targets: Vec<TargetResult>) -> Self {
        targets.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
        Self {
            op: op.label(),
            key: op.key_id(),
            targets,
        }
    }

    /// Per key id, who holds it and where it is primary.
    pub fn counts(&self) -> BTreeMap<KeyId, KeyCount> {
        let mut out: BTreeMap<KeyId, KeyCount> = BTreeMap::new();
        for target in &self.targets {
            if let TargetOutcome::Held { status, .. } = &target.outcome {
                for id in &status.keys {
                    out.entry(*id).or_default().held_by += 1;
                }
                out.entry(status.primary).or_default().primary_on += 1;
            }
        }
        out
    }

    /// Targets that answered with their keys.
    pub fn answered(&self) -> usize {
        self.targets
            .iter()
            .filter(|t| matches!(t.outcome, TargetOutcome::Held { .. }))
            .count()
    }

    /// Every target answered and none refused.
    pub fn complete(&self) -> bool {
        self.answered() == self.targets.len()
    }

    /// The API's answer.
    pub fn to_body(&self) -> KeyringReport {
        let total = self.targets.len();
        let mut keys: Vec<(KeyId, KeyCount)> = self.counts().into_iter().collect();
        keys.sort_by(|(a, x), (b, y)| {
            (y.primary_on, y.held_by)
                .cmp(&(x.primary_on, x.held_by))
                .then(a.cmp(b))
        });
        KeyringReport {
            op: self.op.to_owned(),
            key_id: self.key.map(|k| k.to_string()),
            complete: self.complete(),
            total,
            answered: self.answered(),
            keys: keys
                .into_iter()
                .map(|(id, c)| KeyHolders {
                    key_id: id.to_string(),
                    held_by: c.held_by,
                    primary_on: c.primary_on,
                    of: total,
                })
                .collect(),
            nodes: self.targets.iter().map(KeyringNode::of).collect(),
        }
    }

    /// [`PoolReport::to_body`] as JSON.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.to_body()).unwrap_or(Value::Null)
    }
}

/// `GET`/`POST /v1/operator/keyring`: every pool member's keys, as key ids only.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct KeyringReport {
    /// `list`, `install`, `use` or `remove`.
    pub op: String,
    /// The key the operation was about (its id), if any.
    pub key_id: Option<String>,
    /// Every pool member answered and none refused.
    pub complete: bool,
    /// Pool members asked (authority members and node agents), and those gossip holds
    /// alive that could not be asked.
    pub total: usize,
    /// Pool members that answered with their keys.
    pub answered: usize,
    /// Per key: how many hold it and on how many it is primary, most used first.
    pub keys: Vec<KeyHolders>,
    /// Every pool member's outcome, authorities first, by name.
    pub nodes: Vec<KeyringNode>,
}

/// `held_by` of `of` pool members hold the key; `primary_on` of them seal with it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct KeyHolders {
    /// The key's id (a fingerprint, never the key).
    pub key_id: String,
    /// Pool members holding it.
    pub held_by: usize,
    /// Pool members sealing with it.
    pub primary_on: usize,
    /// Pool members in the report.
    pub of: usize,
}

/// One pool member's outcome.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct KeyringNode {
    /// Its gossip name (`authority-<id>`, or the node's name).
    pub name: String,
    /// `authority` or `agent`.
    pub kind: String,
    /// `applied`, `unchanged`, `refused` (nothing changed there) or `failed` (no answer).
    pub result: String,
    /// The key id it seals with, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// Every key id it holds, primary first, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
    /// Why it refused or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its words, or why no answer came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl KeyringNode {
    fn of(t: &TargetResult) -> Self {
        let mut node = Self {
            name: t.name.clone(),
            kind: t.kind.as_str().to_owned(),
            result: String::new(),
            primary: None,
            keys: None,
            reason: None,
            message: None,
        };
        match &t.outcome {
            TargetOutcome::Held { status, changed } => {
                node.result = if *changed { "applied" } else { "unchanged" }.to_owned();
                node.primary = Some(status.primary.to_string());
                node.keys = Some(status.keys.iter().map(ToString::to_string).collect());
            }
            TargetOutcome::Refused { reason, message }
            | TargetOutcome::Failed { reason, message } => {
                let refused = matches!(t.outcome, TargetOutcome::Refused { .. });
                node.result = if refused { "refused" } else { "failed" }.to_owned();
                node.reason = Some(reason.clone());
                node.message = Some(message.clone());
            }
        }
        node
    }
}

/// `a, b and 3 more`.
fn names(names: &[String]) -> String {
    let shown: Vec<&str> = names
        .iter()
        .take(NAMES_IN_MESSAGE_MAX)
        .map(String::as_str)
        .collect();
    let rest = names.len().saturating_sub(NAMES_IN_MESSAGE_MAX);
    if rest == 0 {
        shown.join(", ")
    } else {
        format!("{} and {rest} more", shown.join(", "))
    }
}

#[cfg(test)]
#[path = "report_test.rs"]
mod tests;
