//! The authority's side of federation: what this region tells its peers, what it does with
//! what they tell it, and the out-of-band signal its region failover follows.
//!
//! ```text
//!  committed Publish ──► publish_local ──► SharedAggregates ◄──► FederationNode (QUIC)
//!                                              │                     │ records
//!                        leader: tier 2 ◄──────┘    audit_reconciliations (leader audits)
//!  front doors ──► probe_front_doors ──► RegionSignal ──► leader: region failover intent
//! ```
//!
//! - **Publishing.** Every member derives this region's aggregates from the views the log
//!   committed ([`waymark_federation::local`]), so all members publish the same content at
//!   the same versions and a peer may hear them from any member.
//! - **Using.** Only the leader's pipeline assembles views; it takes peer regions' endpoints
//!   from the shared aggregates as tier 2 (see `leader.rs`). Losing a link removes nothing:
//!   the entries stay, aged and marked stale.
//! - **Reconciling.** A merge from a peer region that had gone silent (stale, or not heard
//!   since start) is a reconciliation: logged by the member that made it, and — on the
//!   leader, whose views are built from its merges — audited as a `reconciliation` record
//!   with both sides' versions. Routine replication is only counted.
//! - **The signal.** Each member probes the peer regions' front doors directly (a TCP
//!   connection, no registry involved); the leader turns a region going down into an
//!   automatic failover and its recovery into a rate-capped shift-back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;
use tracing::{debug, info, warn};
use waymark_core::model::{RegionName, ServiceName};
use waymark_federation::aggregate::{Entry, Outcome, ReconciliationRecord};
use waymark_federation::local::local_aggregate;
use waymark_federation::signal::{FrontDoor, RegionSignal};
use waymark_federation_quic::{FederationNode, SharedAggregates};

use super::clock::now_ms;
use super::metrics::PeerRegionLabels;
use super::raft::{RaftNode, StateEvent};
use super::settings::FrontDoorEntry;
use waymark_registry::machine::{AuditEntry, AuditKind, AuthorityState, Request, published_views};

/// The actor named on federation's audit records.
pub const FEDERATION_ACTOR: &str = "waymark:federation";
/// How often merge records are collected from the federation node.
const RECORDS_EVERY: Duration = Duration::from_millis(500);

/// The front-door signal, shared by the prober, the leader and the API.
pub type SharedSignal = Arc<Mutex<RegionSignal>>;

/// What the leader and the API read of federation.
#[derive(Debug, Clone)]
pub struct RegionsHandle {
    /// Every region's aggregates as this member holds them.
    pub aggregates: SharedAggregates,
    /// The front-door signal.
    pub signal: SharedSignal,
    /// Set only with `drop_stale_peers` (a drill's break): the links, so the leader can
    /// tell which peer regions are stale and drop their tier 2.
    pub drop_stale: Option<Arc<FederationNode>>,
}

/// Region-level federation metrics the QUIC driver does not own.
#[derive(Debug, Clone, Default)]
pub struct RegionMetrics {
    /// 1 while a peer region's front door answers, 0 while it is down.
    pub front_door_up: Family<PeerRegionLabels, Gauge>,
    /// Front-door probe rounds by outcome (`ok`, `failed`).
    pub front_door_rounds: Family<RoundLabels, Counter>,
    /// Local aggregates published (one per service version).
    pub published: Counter,
    /// Reconciliation records written to the audit log.
    pub reconciliations_audited: Counter,
    /// Entries taken from peers in routine replication (not after silence).
    pub replicated: Counter,
}

/// `peer_region`, `outcome`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RoundLabels {
    /// The peer region.
    pub peer_region: String,
    /// `ok` or `failed`.
    pub outcome: &'static str,
}

impl RegionMetrics {
    /// Register under `waymark_federation_*`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("waymark_federation");
        r.register(
            "front_door_up",
            "1 while a peer region's front door answers the out-of-band probe",
            self.front_door_up.clone(),
        );
        r.register(
            "front_door_rounds",
            "Front-door probe rounds by outcome",
            self.front_door_rounds.clone(),
        );
        r.register(
            "local_published",
            "This region's aggregates published to peers (one per service version)",
            self.published.clone(),
        );
        r.register(
            "reconciliations_audited",
            "Reconciliation records written to the audit log",
            self.reconciliations_audited.clone(),
        );
        r.register(
            "replicated_entries",
            "Entries taken from peer regions in routine replication",
            self.replicated.clone(),
        );
    }
}

/// Keep this region's aggregates in step with the committed views, until the member's
/// event channel closes.
pub async fn publish_local(
    raft: RaftNode,
    region: RegionName,
    aggregates: SharedAggregates,
    metrics: RegionMetrics,
) {
    let mut events = raft.subscribe();
    raft.with_state(|s, _| publish(s, &region, &aggregates, &metrics, None));
    loop {
        match events.recv().await {
            Ok(StateEvent::Applied(entry)) => {
                let views = published_views(&entry.request, &entry.response);
                if !views.is_empty() {
                    let touched: BTreeSet<ServiceName> =
                        views.iter().map(|v| v.view.key.service.clone()).collect();
                    raft.with_state(|s, _| {
                        publish(s, &region, &aggregates, &metrics, Some(&touched));
                    });
                }
            }
            Ok(_) | Err(RecvError::Lagged(_)) => {
                raft.with_state(|s, _| publish(s, &region, &aggregates, &metrics, None));
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// Publish the aggregates of `only` (or of every service) from the committed views.
fn publish(
    state: &AuthorityState,
    region: &RegionName,
    aggregates: &SharedAggregates,
    metrics: &RegionMetrics,
    only: Option<&BTreeSet<ServiceName>>,
) {
    let mut by_service: BTreeMap<&ServiceName, Vec<_>> = BTreeMap::new();
    for (key, view) in state.published() {
        if only.is_none_or(|o| o.contains(&key.service)) {
            by_service.entry(&key.service).or_default().push(view);
        }
    }
    let mut held = aggregates.lock().unwrap_or_else(PoisonError::into_inner);
    for (service, views) in by_service {
        let Some((version, aggregate)) = local_aggregate(views) else {
            continue;
        };
        if held.version(region, service).is_some_and(|v| v >= version) {
            continue;
        }
        let endpoints = aggregate.endpoints.len();
        match held.publish_local(Entry {
            region: region.clone(),
            service: service.clone(),
            version,
            aggregate: Arc::new(aggregate),
        }) {
            Ok(()) => {
                metrics.published.inc();
                debug!(%service, version, endpoints, "published this region's aggregate");
            }
            Err(error) => debug!(%service, %error, "aggregate not published"),
        }
    }
}

/// Collect merge records from the federation node and sort them. Entries about a region
/// that is recovering from silence (stale, or never heard since start) are
/// **reconciliations** — logged, and audited while this member leads; entries about a region
/// that never went silent are routine replication, counted and logged at debug. Links are
/// direct: a peer is accepted only for its own region's entries (nothing is relayed), so
/// the region recovering is always the peer that delivered them.
///
/// A region is recovering from the first check that finds it stale until the first check
/// after it is fresh again in which nothing new about it arrived: the whole catch-up after
/// a heal is one reconciliation, however many messages it took.
pub async fn audit_reconciliations(
    raft: RaftNode,
    node: Arc<FederationNode>,
    metrics: RegionMetrics,
) {
    let mut tick = tokio::time::interval(RECORDS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut recovering: BTreeSet<RegionName> = BTreeSet::new();
    loop {
        tick.tick().await;
        let records = node.take_reconciliations();
        let (audit, heard) = split_reconciliations(records, &recovering, &metrics);
        for region in node.regions() {
            if region.stale {
                recovering.insert(region.region);
            } else if !heard.contains(&region.region) {
                recovering.remove(&region.region);
            }
        }
        if audit.is_empty() {
            continue;
        }
        for r in &audit {
            let changed: Vec<String> = r
                .changed()
                .map(|e| format!("{}/{} {:?}->{}", e.region, e.service, e.ours, e.theirs))
                .collect();
            info!(peer_region = ?r.peer, changed = ?changed, entries = r.entries.len(), "reconciled a region after silence");
        }
        if !raft.is_leader() {
            continue;
        }
        let entries: Vec<AuditEntry> = audit.iter().map(audit_entry).collect();
        let n = entries.len() as u64;
        match raft.write(Request::Audit { entries }).await {
            Ok(_) => {
                metrics.reconciliations_audited.inc_by(n);
            }
            Err(error) => {
                warn!(%error, records = n, "reconciliation records not audited (leadership lost)");
            }
        }
    }
}

/// Split merge records into reconciliations (entries about a `recovering` region, kept
/// with the peer that delivered them) and routine replication (counted). Also returns the
/// regions something new arrived about.
fn split_reconciliations(
    records: Vec<ReconciliationRecord>,
    recovering: &BTreeSet<RegionName>,
    metrics: &RegionMetrics,
) -> (Vec<ReconciliationRecord>, BTreeSet<RegionName>) {
    let mut audit = Vec::new();
    let mut heard = BTreeSet::new();
    for record in records {
        heard.extend(record.changed().map(|e| e.region.clone()));
        let (reconciled, routine): (Vec<_>, Vec<_>) = record
            .entries
            .into_iter()
            .partition(|e| recovering.contains(&e.region));
        let replicated = routine
            .iter()
            .filter(|e| e.outcome == Outcome::TookTheirs)
            .count();
        if replicated > 0 {
            metrics.replicated.inc_by(replicated as u64);
            debug!(peer_region = ?record.peer, replicated, "replicated from a peer region");
        }
        let reconciled = ReconciliationRecord {
            peer: record.peer,
            entries: reconciled,
        };
        if reconciled.changed().next().is_some() {
            audit.push(reconciled);
        }
    }
    (audit, heard)
}

/// One reconciliation record as an audit entry: both sides' versions per entry.
pub fn audit_entry(record: &ReconciliationRecord) -> AuditEntry {
    AuditEntry {
        seq: 0,
        at_ms: now_ms(),
        kind: AuditKind::Reconciliation,
        actor: FEDERATION_ACTOR.into(),
        service: None,
        instance: None,
        outcome: "merged".into(),
        detail: json!({
            "peer_region": record.peer,
            "changed": record.changed().count(),
            "entries": record.entries,
        }),
    }
}

/// Probe every configured front door each interval and feed the signal; log and count
/// every transition. The leader acts on the signal (see `leader.rs`).
pub async fn probe_front_doors(
    doors: Vec<FrontDoorEntry>,
    interval: Duration,
    timeout: Duration,
    signal: SharedSignal,
    metrics: RegionMetrics,
) {
    if doors.is_empty() {
        return;
    }
    for d in &doors {
        metrics
            .front_door_up
            .get_or_create(&peer_labels(&d.region))
            .set(1);
    }
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let rounds = doors.iter().map(|d| async move {
            let result = probe_region(&d.addrs, timeout).await;
            (d.region.clone(), result)
        });
        for (region, result) in futures::future::join_all(rounds).await {
            let outcome = if result.is_ok() { "ok" } else { "failed" };
            metrics
                .front_door_rounds
                .get_or_create(&RoundLabels {
                    peer_region: region.to_string(),
                    outcome,
                })
                .inc();
            let transition = signal
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .handle_round(&region, result.clone());
            if let Some(t) = transition {
                metrics
                    .front_door_up
                    .get_or_create(&peer_labels(&t.region))
                    .set(i64::from(t.up));
                if t.up {
                    info!(peer_region = %t.region, "peer region's front door answers again");
                } else {
                    warn!(peer_region = %t.region, error = ?result.err(), "peer region's front door is down");
                }
            }
        }
    }
}

/// One round: good when any address accepts a TCP connection within `timeout`.
async fn probe_region(addrs: &[String], timeout: Duration) -> Result<(), String> {
    let mut errors = Vec::new();
    for addr in addrs {
        match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr.as_str())).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => errors.push(format!("{addr}: {e}")),
            Err(_) => errors.push(format!("{addr}: no answer within {timeout:?}")),
        }
    }
    Err(errors.join("; "))
}

/// Every probed region's front-door state (for the API).
pub fn front_doors(signal: &SharedSignal) -> BTreeMap<RegionName, FrontDoor> {
    signal
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .regions()
        .clone()
}

/// The versions held of one region's aggregates, by service.
pub fn versions_of(
    aggregates: &SharedAggregates,
    region: &RegionName,
) -> BTreeMap<ServiceName, u64> {
    aggregates
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .digest()
        .into_iter()
        .filter(|((r, _), _)| r == region)
        .map(|((_, service), v)| (service, v))
        .collect()
}

fn peer_labels(region: &RegionName) -> PeerRegionLabels {
    PeerRegionLabels {
        peer_region: region.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use waymark_federation::aggregate::ReconciledEntry;

    use super::*;

    fn line(region: &str, ours: Option<u64>, theirs: u64, outcome: Outcome) -> ReconciledEntry {
        ReconciledEntry {
            region: region.parse().unwrap(),
            service: "web".parse().unwrap(),
            ours,
            theirs,
            outcome,
        }
    }

    #[test]
    fn only_entries_about_a_region_back_from_silence_are_reconciliations() {
        let metrics = RegionMetrics::default();
        let recovering: BTreeSet<RegionName> = ["us".parse().unwrap()].into();
        // Relayed by eu: its own routine update, and us's catch-up.
        let record = ReconciliationRecord {
            peer: Some("eu".parse().unwrap()),
            entries: vec![
                line("eu", Some(4), 5, Outcome::TookTheirs),
                line("us", Some(7), 9, Outcome::TookTheirs),
                line("ap", Some(3), 3, Outcome::Same),
            ],
        };
        let (audit, heard) = split_reconciliations(vec![record], &recovering, &metrics);
        assert_eq!(audit.len(), 1);
        assert_eq!(audit[0].peer.as_ref().map(|p| p.as_str()), Some("eu"));
        assert_eq!(
            audit[0].entries,
            vec![line("us", Some(7), 9, Outcome::TookTheirs)]
        );
        assert_eq!(metrics.replicated.get(), 1, "eu's update is routine");
        let heard: Vec<&str> = heard.iter().map(|r| r.as_str()).collect();
        assert_eq!(heard, ["eu", "us"]);
        // A record about a recovering region that changed nothing is not audited.
        let same = ReconciliationRecord {
            peer: Some("us".parse().unwrap()),
            entries: vec![line("us", Some(9), 9, Outcome::Same)],
        };
        let (audit, _) = split_reconciliations(vec![same], &recovering, &metrics);
        assert!(audit.is_empty());
    }
}
