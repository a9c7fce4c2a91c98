//! Asking a node agent something over its evidence session and waiting for its answer:
//! what the sidecar-config broker (`sidecars`) and the keyring broker (`keyring::broker`)
//! both do, once.
//!
//! Each node's newest session receives requests through a bounded queue; a request waits
//! for its answer at most [`Limits::timeout`], and at most [`Limits::pending_max`] wait
//! at once across nodes. An answer is taken only from the node that was asked, by request
//! id: a node speaks only for itself. However a wait ends (an answer, the timeout, the
//! asker gone), its request is forgotten.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use waymark_core::model::NodeName;

/// How much a broker holds and how long it waits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Requests queued for one node's session.
    pub queue_per_node: usize,
    /// Requests waiting for their nodes at once, across nodes.
    pub pending_max: usize,
    /// How long one request waits for its answer.
    pub timeout: Duration,
    /// What the requests are, for the log (`config`, `keyring`).
    pub what: &'static str,
}

/// Why a node's answer did not come.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeAskError {
    /// The node holds no evidence session here. Ask the leader, or wait for the node.
    #[error("node {0} holds no session with this member")]
    NotConnected(NodeName),
    /// Too many requests wait already (here, or for this node). Retry shortly.
    #[error("too many requests to nodes are waiting; retry")]
    Busy,
    /// The node did not answer within the broker's timeout. Its session may be stuck.
    #[error("node {0} did not answer in time")]
    Timeout(NodeName),
    /// The node's session ended before it answered. Retry once it reconnects.
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

/// See the module documentation. `Req` goes down a session; `Ans` comes back.
pub struct NodeBroker<Req, Ans> {
    limits: Limits,
    inner: Mutex<Inner<Req, Ans>>,
}

struct Inner<Req, Ans> {
    /// Each node's open session (the newest, if it holds two).
    sessions: BTreeMap<NodeName, mpsc::Sender<Req>>,
    /// Requests waiting, by id: who was asked, and where the answer goes.
    pending: BTreeMap<u64, (NodeName, oneshot::Sender<Ans>)>,
    next_id: u64,
}

impl<Req, Ans> std::fmt::Debug for NodeBroker<Req, Ans> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("NodeBroker")
            .field("limits", &self.limits)
            .field("sessions", &inner.sessions.len())
            .field("pending", &inner.pending.len())
            .finish()
    }
}

impl<Req, Ans> NodeBroker<Req, Ans> {
    /// An empty broker.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            inner: Mutex::new(Inner {
                sessions: BTreeMap::new(),
                pending: BTreeMap::new(),
                next_id: 0,
            }),
        }
    }

    /// A session of `node` opened: requests for the node go down it from now on.
    pub fn attach(&self, node: &NodeName) -> mpsc::Receiver<Req> {
        let (tx, rx) = mpsc::channel(self.limits.queue_per_node);
        self.lock().sessions.insert(node.clone(), tx);
        rx
    }

    /// A session of `node` ended: forget it unless a newer one is still open, and fail
    /// what was asked of it.
    pub fn detach(&self, node: &NodeName) {
        let mut inner = self.lock();
        if inner.sessions.get(node).is_some_and(|tx| tx.is_closed()) {
            inner.sessions.remove(node);
            // Dropping a waiter's sender tells it the node is gone.
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

    /// Send `node` the request `make` builds around a fresh request id, and wait for its
    /// answer.
    pub async fn ask(
        &self,
        node: &NodeName,
        make: impl FnOnce(u64) -> Req,
    ) -> Result<Ans, NodeAskError> {
        let (id, answer) = {
            let mut inner = self.lock();
            let Some(tx) = inner.sessions.get(node).cloned() else {
                return Err(NodeAskError::NotConnected(node.clone()));
            };
            if inner.pending.len() >= self.limits.pending_max {
                return Err(NodeAskError::Busy);
            }
            inner.next_id = inner.next_id.wrapping_add(1);
            let id = inner.next_id;
            match tx.try_send(make(id)) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => return Err(NodeAskError::Busy),
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return Err(NodeAskError::NotConnected(node.clone()));
                }
            }
            let (otx, orx) = oneshot::channel();
            inner.pending.insert(id, (node.clone(), otx));
            (id, orx)
        };
        // Forget the request however this ends (an answer, the timeout, the caller gone).
        let _forget = Forget { broker: self, id };
        match tokio::time::timeout(self.limits.timeout, answer).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(NodeAskError::Gone(node.clone())),
            Err(_) => Err(NodeAskError::Timeout(node.clone())),
        }
    }

    /// `node` answered request `request_id`. An answer to a request it was not asked
    /// (another node's id, an expired one) is dropped: a node speaks only for itself.
    pub fn answer(&self, node: &NodeName, request_id: u64, answer: Ans) {
        let mut inner = self.lock();
        let asked = inner
            .pending
            .get(&request_id)
            .is_some_and(|(asked, _)| asked == node);
        if !asked {
            tracing::debug!(
                node_id = %node,
                request_id,
                what = self.limits.what,
                "answer to no request of this node; dropped"
            );
            return;
        }
        if let Some((_, tx)) = inner.pending.remove(&request_id) {
            let _ = tx.send(answer);
        }
    }

    /// How many requests wait for their answers now.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Forget every session and request (this member stopped leading).
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.sessions.clear();
        inner.pending.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<Req, Ans>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Removes a request from the pending ones when its asker stops waiting.
struct Forget<'a, Req, Ans> {
    broker: &'a NodeBroker<Req, Ans>,
    id: u64,
}

impl<Req, Ans> Drop for Forget<'_, Req, Ans> {
    fn drop(&mut self) {
        self.broker.lock().pending.remove(&self.id);
    }
}
