//! Sends keyring requests down node agents' evidence sessions and matches their answers,
//! as the config broker (`authority/sidecars.rs`) does for sidecar configuration.
//!
//! Bounds: [`QUEUE_PER_NODE`] requests queued per session, [`PENDING_MAX`] waiting at
//! once across nodes (a pool operation asks every node once, so this is the largest pool
//! one operation reaches in one go; nodes beyond it are reported `busy`), each at most
//! [`ANSWER_TIMEOUT`].

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use waymark_core::model::NodeName;

use crate::evidence::{KeyringAnswer, KeyringOutcome, KeyringRequest};
use crate::gossip::rotation::KeyringOp;

/// Keyring requests queued for one node's session.
pub const QUEUE_PER_NODE: usize = 4;
/// Keyring requests waiting for their nodes at once.
pub const PENDING_MAX: usize = 65_536;
/// How long the leader waits for one node's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a node's answer did not come. Its keyring is unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeAskError {
    /// The node holds no evidence session here.
    #[error("node {0} holds no session with this member")]
    NotConnected(NodeName),
    /// Too many requests wait already. Retry shortly.
    #[error("too many keyring requests are waiting; retry")]
    Busy,
    /// The node did not answer within [`ANSWER_TIMEOUT`].
    #[error("node {0} did not answer within {timeout_ms} ms", timeout_ms = ANSWER_TIMEOUT.as_millis())]
    Timeout(NodeName),
    /// The node's session ended before it answered.
    #[error("node {0}'s session ended before it answered")]
    Gone(NodeName),
}

impl NodeAskError {
    /// A stable label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotConnected(_) => "no_session",
            Self::Busy => "busy",
            Self::Timeout(_) => "timeout",
            Self::Gone(_) => "session_ended",
        }
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct KeyringBroker {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: BTreeMap<NodeName, mpsc::Sender<KeyringRequest>>,
    pending: BTreeMap<u64, (NodeName, oneshot::Sender<KeyringOutcome>)>,
    next_id: u64,
}

// === impl KeyringBroker ===

impl KeyringBroker {
    /// A session of `node` opened: its keyring requests go down it from now on.
    pub fn attach(&self, node: &NodeName) -> mpsc::Receiver<KeyringRequest> {
        let (tx, rx) = mpsc::channel(QUEUE_PER_NODE);
        self.lock().sessions.insert(node.clone(), tx);
        rx
    }

    /// A session of `node` ended: forget it unless a newer one is open, and fail what was
    /// asked of it.
    pub fn detach(&self, node: &NodeName) {
        let mut inner = self.lock();
        if inner.sessions.get(node).is_some_and(|tx| tx.is_closed()) {
            inner.sessions.remove(node);
            inner.pending.retain(|_, (asked, _)| asked != node);
        }
    }

    /// The nodes holding a session now.
    pub fn connected(&self) -> Vec<NodeName> {
        self.lock()
            .sessions
            .iter()
            .filter(|(_, tx)| !tx.is_closed())
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// Ask `node` to apply `op` to its keyring, and wait for its answer.
    pub async fn ask(
        &self,
        node: &NodeName,
        op: KeyringOp,
    ) -> Result<KeyringOutcome, NodeAskError> {
        let (id, answer) = {
            let mut inner = self.lock();
            let Some(tx) = inner.sessions.get(node).cloned() else {
                return Err(NodeAskError::NotConnected(node.clone()));
            };
            if inner.pending.len() >= PENDING_MAX {
                return Err(NodeAskError::Busy);
            }
            inner.next_id = inner.next_id.wrapping_add(1);
            let request_id = inner.next_id;
            match tx.try_send(KeyringRequest { request_id, op }) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => return Err(NodeAskError::Busy),
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return Err(NodeAskError::NotConnected(node.clone()));
                }
            }
            let (otx, orx) = oneshot::channel();
            inner.pending.insert(request_id, (node.clone(), otx));
            (request_id, orx)
        };
        let _forget = Forget { broker: self, id };
        match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(_)) => Err(NodeAskError::Gone(node.clone())),
            Err(_) => Err(NodeAskError::Timeout(node.clone())),
        }
    }

    /// `node` answered. An answer to a request it was not asked is dropped: a node speaks
    /// only for itself.
    pub fn answer(&self, node: &NodeName, answer: KeyringAnswer) {
        let mut inner = self.lock();
        let asked = inner
            .pending
            .get(&answer.request_id)
            .is_some_and(|(asked, _)| asked == node);
        if !asked {
            tracing::debug!(node_id = %node, request_id = answer.request_id, "keyring answer to no request of this node; dropped");
            return;
        }
        if let Some((_, tx)) = inner.pending.remove(&answer.request_id) {
            let _ = tx.send(answer.outcome);
        }
    }

    /// Forget every session and request (this member stopped leading).
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.sessions.clear();
        inner.pending.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Removes a request from the pending ones when its asker stops waiting.
struct Forget<'a> {
    broker: &'a KeyringBroker,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.broker.lock().pending.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::gossip::codec::{KEY_LEN, Key};
    use crate::gossip::rotation::KeyringStatus;

    fn node(name: &str) -> NodeName {
        NodeName::try_new(name).unwrap()
    }

    #[tokio::test]
    async fn an_answer_reaches_only_the_request_of_the_node_that_was_asked() {
        // Goal: a node cannot answer for another; its own answer is matched by id.
        let broker = std::sync::Arc::new(KeyringBroker::default());
        let (n1, n2) = (node("n1"), node("n2"));
        let mut rx1 = broker.attach(&n1);
        let _rx2 = broker.attach(&n2);
        assert_eq!(broker.connected(), [n1.clone(), n2.clone()]);
        let asking = {
            let broker = std::sync::Arc::clone(&broker);
            let n1 = n1.clone();
            tokio::spawn(async move { broker.ask(&n1, KeyringOp::List).await })
        };
        let request = rx1.recv().await.unwrap();
        let status = KeyringStatus::of(&crate::gossip::Keyring::single(Key::from_bytes(
            &[1; KEY_LEN],
        )));
        let outcome = KeyringOutcome::Held {
            status,
            changed: false,
        };
        let answer = |outcome| KeyringAnswer {
            request_id: request.request_id,
            outcome,
        };
        broker.answer(&n2, answer(KeyringOutcome::refused("forged", "x")));
        broker.answer(&n1, answer(outcome.clone()));
        assert_eq!(asking.await.unwrap().unwrap(), outcome);
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_that_never_answers_times_out_and_an_unknown_one_is_not_connected() {
        // Goal: the leader's wait for a node is bounded.
        let broker = KeyringBroker::default();
        let n1 = node("n1");
        let _rx = broker.attach(&n1);
        let e = broker.ask(&n1, KeyringOp::List).await.unwrap_err();
        assert_eq!(e, NodeAskError::Timeout(n1));
        let e = broker.ask(&node("n9"), KeyringOp::List).await.unwrap_err();
        assert_eq!(e.reason(), "no_session");
    }
}
