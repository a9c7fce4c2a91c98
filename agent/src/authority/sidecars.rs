//! The sidecars behind every node agent, as the leader hears of them: each node's latest
//! report of its own xDS clients ([`SidecarReports`], pure), and the requests for one
//! client's configuration the API asks a node over its evidence session
//! ([`ConfigBroker`]).
//!
//! ```text
//! node ──sidecars──► Session ──► EvidenceHub ──► SidecarReports ──► GET /v1/proxy-status/sidecars
//! API ──ask(node, client)──► ConfigBroker ──config_request──► node's session
//!     ◄──document (or unknown_client, or timeout)── ConfigBroker ◄──client_config──┘
//! ```
//!
//! Leader-observed, like probe assignment: node agents hold their evidence session with
//! the leader (a follower refuses it), so the reports live there and a new leader hears
//! every node again as its sessions open (a node sends its report first thing). The API
//! routes redirect to the leader.
//!
//! Bounds: one report per node (a new one replaces it; the wire bounds it to 256 clients
//! and 128 KiB, see `evidence/sidecars.rs`), at most [`SidecarsConfig::nodes_max`] nodes (a
//! report from one more is refused and counted in `waymark_sidecar_reports_refused_total`,
//! the nodes held untouched), and a report not refreshed within [`SidecarsConfig::ttl`] is
//! forgotten — a node refreshes every 30 s while its session lives. Typical reports are a
//! few hundred bytes per sidecar; the ceiling is `nodes_max` × 128 KiB. At most [`CONFIG_PENDING_MAX`] config requests wait at once, each at
//! most [`CONFIG_TIMEOUT`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;
use waymark_core::model::NodeName;

use super::node_broker::{Limits, NodeBroker};
use crate::evidence::{ClientConfig, ConfigRequest, SidecarReport};

/// Nodes whose reports are held at most.
pub const NODES_MAX: usize = 16_384;
/// A report not refreshed within this is forgotten: three of a node's refresh periods.
pub const REPORT_TTL: Duration = Duration::from_secs(90);
/// Config requests waiting for their node at once, across nodes.
pub const CONFIG_PENDING_MAX: usize = 64;
/// Config requests queued for one node's session.
pub const CONFIG_QUEUE_PER_NODE: usize = 4;
/// How long the API waits for a node's answer.
pub const CONFIG_TIMEOUT: Duration = Duration::from_secs(5);

/// The leader's reports and broker, shared by the evidence hub (which feeds them) and the
/// API (which reads them). Clones share.
#[derive(Debug, Clone, Default)]
pub struct SidecarsHandle {
    /// Every node's latest report.
    pub reports: Arc<Mutex<SidecarReports>>,
    /// Config requests to nodes.
    pub broker: Arc<ConfigBroker>,
}

impl SidecarsHandle {
    /// The reports, locked.
    pub fn reports(&self) -> std::sync::MutexGuard<'_, SidecarReports> {
        self.reports.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The limits of [`SidecarReports`].
#[derive(Debug, Clone)]
pub struct SidecarsConfig {
    /// Nodes whose reports are held at most.
    pub nodes_max: usize,
    /// How long a report is kept without a refresh.
    pub ttl: Duration,
}

impl Default for SidecarsConfig {
    fn default() -> Self {
        Self {
            nodes_max: NODES_MAX,
            ttl: REPORT_TTL,
        }
    }
}

/// Why a report was not kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReportRefused {
    /// `nodes_max` other nodes' reports are held. Nothing changed; the node's next report
    /// is tried again (every 30 s), and gets in once another node's report expires.
    #[error("sidecar reports of {max} nodes are held already")]
    Full {
        /// The bound.
        max: usize,
    },
}

impl ReportRefused {
    /// A stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Full { .. } => "nodes_full",
        }
    }
}

/// One node's latest report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldReport {
    /// When it arrived.
    pub received: Instant,
    /// What it said.
    pub report: SidecarReport,
    /// The node's evidence session is open (a closed one's report is kept until it
    /// expires: its sidecars may well still be routing).
    pub session_open: bool,
}

/// Every node's latest sidecar report. Pure: time comes in as `now`.
#[derive(Debug)]
pub struct SidecarReports {
    config: SidecarsConfig,
    nodes: BTreeMap<NodeName, HeldReport>,
    last_now: Option<Instant>,
}

impl Default for SidecarReports {
    fn default() -> Self {
        Self::new(SidecarsConfig::default())
    }
}

impl SidecarReports {
    /// No reports yet.
    pub fn new(config: SidecarsConfig) -> Self {
        Self {
            config,
            nodes: BTreeMap::new(),
            last_now: None,
        }
    }

    /// `node` reported: its report replaces the one held. Refused (and nothing changed)
    /// when the node is new and `nodes_max` others are held.
    pub fn handle_report(
        &mut self,
        now: Instant,
        node: &NodeName,
        report: SidecarReport,
    ) -> Result<(), ReportRefused> {
        self.handle_timeout(now);
        if !self.nodes.contains_key(node) && self.nodes.len() >= self.config.nodes_max {
            return Err(ReportRefused::Full {
                max: self.config.nodes_max,
            });
        }
        self.nodes.insert(
            node.clone(),
            HeldReport {
                received: now,
                report,
                session_open: true,
            },
        );
        Ok(())
    }

    /// `node`'s evidence session ended: its report stays until it expires.
    pub fn handle_session_closed(&mut self, node: &NodeName) {
        if let Some(held) = self.nodes.get_mut(node) {
            held.session_open = false;
        }
    }

    /// Forget reports not refreshed within the TTL; returns how many.
    pub fn handle_timeout(&mut self, now: Instant) -> usize {
        debug_assert!(
            self.last_now.is_none_or(|last| last <= now),
            "time never goes backwards"
        );
        self.last_now = Some(now);
        let ttl = self.config.ttl;
        let before = self.nodes.len();
        self.nodes
            .retain(|_, held| now.saturating_duration_since(held.received) < ttl);
        before - self.nodes.len()
    }

    /// When the oldest report expires.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.nodes
            .values()
            .map(|held| held.received + self.config.ttl)
            .min()
    }

    /// The reports held, by node name.
    pub fn reports(&self) -> impl Iterator<Item = (&NodeName, &HeldReport)> {
        self.nodes.iter()
    }

    /// Forget everything (this member stopped leading).
    pub fn clear(&mut self) {
        self.nodes.clear();
    }
}

// === driver: config requests ===

/// Why a node's answer did not come.
pub use super::node_broker::NodeAskError as AskError;

/// Sends config requests down nodes' evidence sessions and matches their answers.
#[derive(Debug)]
pub struct ConfigBroker(NodeBroker<ConfigRequest, Option<Value>>);

impl Default for ConfigBroker {
    fn default() -> Self {
        Self(NodeBroker::new(Limits {
            queue_per_node: CONFIG_QUEUE_PER_NODE,
            pending_max: CONFIG_PENDING_MAX,
            timeout: CONFIG_TIMEOUT,
            what: "config",
        }))
    }
}

impl ConfigBroker {
    /// A session of `node` opened: requests for the node go down it from now on.
    pub fn attach(&self, node: &NodeName) -> mpsc::Receiver<ConfigRequest> {
        self.0.attach(node)
    }

    /// A session of `node` ended: forget it unless a newer one is still open, and fail
    /// what was asked of it.
    pub fn detach(&self, node: &NodeName) {
        self.0.detach(node);
    }

    /// Ask `node` what its client `client` holds; `Ok(None)` when it has no such client.
    pub async fn ask(&self, node: &NodeName, client: &str) -> Result<Option<Value>, AskError> {
        self.0
            .ask(node, |request_id| ConfigRequest {
                request_id,
                client: client.to_owned(),
            })
            .await
    }

    /// `node` answered. An answer to a request it was not asked (another node's id, an
    /// expired one) is dropped: a node speaks only for itself.
    pub fn answer(&self, node: &NodeName, answer: ClientConfig) {
        self.0.answer(node, answer.request_id, answer.document);
    }

    /// How many config requests wait for their answers now.
    pub fn pending(&self) -> usize {
        self.0.pending()
    }

    /// Forget every session and request (this member stopped leading).
    pub fn clear(&self) {
        self.0.clear();
    }
}

#[cfg(test)]
#[path = "sidecars_test.rs"]
mod tests;
