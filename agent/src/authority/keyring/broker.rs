//! Sends keyring requests down node agents' evidence sessions and matches their answers,
//! through the broker the sidecar-config requests use (`authority::node_broker`).
//!
//! Bounds: [`QUEUE_PER_NODE`] requests queued per session, [`PENDING_MAX`] waiting at
//! once across nodes (a pool operation asks every node once, so this is the largest pool
//! one operation reaches in one go; nodes beyond it are reported `busy`), each at most
//! [`ANSWER_TIMEOUT`].

use std::time::Duration;

use tokio::sync::mpsc;
use waymark_core::model::NodeName;

use crate::authority::node_broker::{Limits, NodeBroker};
use crate::evidence::{KeyringAnswer, KeyringOutcome, KeyringRequest};
use crate::gossip::rotation::KeyringOp;

/// Keyring requests queued for one node's session.
pub const QUEUE_PER_NODE: usize = 4;
/// Keyring requests waiting for their nodes at once.
pub const PENDING_MAX: usize = 65_536;
/// How long the leader waits for one node's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a node's answer did not come. Its keyring is unknown.
pub use crate::authority::node_broker::NodeAskError;

/// See the module documentation.
#[derive(Debug)]
pub struct KeyringBroker(NodeBroker<KeyringRequest, KeyringOutcome>);

impl Default for KeyringBroker {
    fn default() -> Self {
        Self(NodeBroker::new(Limits {
            queue_per_node: QUEUE_PER_NODE,
            pending_max: PENDING_MAX,
            timeout: ANSWER_TIMEOUT,
            what: "keyring",
        }))
    }
}

// === impl KeyringBroker ===

impl KeyringBroker {
    /// A session of `node` opened: its keyring requests go down it from now on.
    pub fn attach(&self, node: &NodeName) -> mpsc::Receiver<KeyringRequest> {
        self.0.attach(node)
    }

    /// A session of `node` ended: forget it unless a newer one is open, and fail what was
    /// asked of it.
    pub fn detach(&self, node: &NodeName) {
        self.0.detach(node);
    }

    /// The nodes holding a session now.
    pub fn connected(&self) -> Vec<NodeName> {
        self.0.connected()
    }

    /// Ask `node` to apply `op` to its keyring, and wait for its answer.
    pub async fn ask(
        &self,
        node: &NodeName,
        op: KeyringOp,
    ) -> Result<KeyringOutcome, NodeAskError> {
        self.0
            .ask(node, |request_id| KeyringRequest { request_id, op })
            .await
    }

    /// `node` answered. An answer to a request it was not asked is dropped: a node speaks
    /// only for itself.
    pub fn answer(&self, node: &NodeName, answer: KeyringAnswer) {
        self.0.answer(node, answer.request_id, answer.outcome);
    }

    /// Forget every session and request (this member stopped leading).
    pub fn clear(&self) {
        self.0.clear();
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
