//! Prometheus metrics of the gossip driver.
//!
//! ```text
//! waymark_gossip_members{state}                  members in the last snapshot: alive, suspect, down
//! waymark_gossip_packets_total{direction}        datagrams sent (out) and received (in)
//! waymark_gossip_packets_dropped_total{reason}   datagrams dropped before or by foca:
//!                                                auth, malformed
//! waymark_gossip_seed_resolve_failures_total{reason}
//!                                                seeds that gave no address in an announce
//!                                                round: lookup, no_address, timeout
//! waymark_gossip_keyring_operations_total{op,result}
//!                                                keyring operations: op = list, install,
//!                                                use, remove; result = applied, unchanged,
//!                                                refused, failed
//! waymark_gossip_keyring_keys                    keys the live keyring holds
//! ```
//!
//! Clones share state: register once with [`GossipMetrics::register`], hand clones around.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::membership::Liveness;

/// Why a received datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// No key of the ring authenticated it.
    Auth,
    /// Not an envelope, or foca could not decode what was inside.
    Malformed,
}

/// Which way a datagram went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Received from the socket.
    In,
    /// Sent to the socket.
    Out,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KeyringOpLabels {
    op: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

/// The gossip driver's gauges and counters; clones share state.
#[derive(Debug, Clone, Default)]
pub struct GossipMetrics {
    members: Family<StateLabels, Gauge>,
    packets: Family<DirectionLabels, Counter>,
    dropped: Family<ReasonLabels, Counter>,
    seed_failures: Family<ReasonLabels, Counter>,
    keyring_operations: Family<KeyringOpLabels, Counter>,
    keyring_keys: Gauge,
}

// === impl GossipMetrics ===

impl GossipMetrics {
    /// New, zeroed metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers every metric under the `waymark_gossip_` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("waymark_gossip");
        sub.register(
            "members",
            "Gossip members in the last membership snapshot, by liveness",
            self.members.clone(),
        );
        sub.register(
            "packets",
            "Gossip datagrams sent and received",
            self.packets.clone(),
        );
        sub.register(
            "packets_dropped",
            "Gossip datagrams dropped, by reason",
            self.dropped.clone(),
        );
        sub.register(
            "seed_resolve_failures",
            "Seeds that gave no address in an announce round, by reason",
            self.seed_failures.clone(),
        );
        sub.register(
            "keyring_operations",
            "Gossip keyring operations, by operation and result",
            self.keyring_operations.clone(),
        );
        sub.register(
            "keyring_keys",
            "Keys the live gossip keyring holds",
            self.keyring_keys.clone(),
        );
    }

    /// Keyring operations `op` that ended in `result` so far.
    pub fn keyring_operations(&self, op: &'static str, result: &'static str) -> u64 {
        self.keyring_operations
            .get_or_create(&KeyringOpLabels { op, result })
            .get()
    }

    /// Keys the live keyring holds.
    pub fn keyring_keys(&self) -> i64 {
        self.keyring_keys.get()
    }

    pub(super) fn count_keyring_operation(&self, op: &'static str, result: &'static str) {
        self.keyring_operations
            .get_or_create(&KeyringOpLabels { op, result })
            .inc();
    }

    pub(super) fn set_keyring_keys(&self, keys: usize) {
        self.keyring_keys
            .set(i64::try_from(keys).unwrap_or(i64::MAX));
    }

    /// Seed resolutions that failed so far, over every reason.
    pub fn seed_resolve_failures(&self) -> u64 {
        ["lookup", "no_address", "timeout"]
            .into_iter()
            .map(|reason| {
                self.seed_failures
                    .get_or_create(&ReasonLabels { reason })
                    .get()
            })
            .sum()
    }

    pub(super) fn count_seed_failure(&self, reason: &'static str) {
        self.seed_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Datagrams dropped for `reason` so far.
    pub fn packets_dropped(&self, reason: DropReason) -> u64 {
        self.dropped.get_or_create(&reason_labels(reason)).get()
    }

    /// Datagrams that went `direction` so far.
    pub fn packets(&self, direction: Direction) -> u64 {
        self.packets
            .get_or_create(&direction_labels(direction))
            .get()
    }

    /// Members in `state` in the last snapshot.
    pub fn members(&self, state: Liveness) -> i64 {
        self.members.get_or_create(&state_labels(state)).get()
    }

    pub(super) fn count_dropped(&self, reason: DropReason) {
        self.dropped.get_or_create(&reason_labels(reason)).inc();
    }

    pub(super) fn count_packet(&self, direction: Direction) {
        self.packets
            .get_or_create(&direction_labels(direction))
            .inc();
    }

    pub(super) fn set_members(&self, alive: usize, suspect: usize, down: usize) {
        for (state, n) in [
            (Liveness::Alive, alive),
            (Liveness::Suspect, suspect),
            (Liveness::Down, down),
        ] {
            let value = i64::try_from(n).unwrap_or(i64::MAX);
            self.members.get_or_create(&state_labels(state)).set(value);
        }
    }
}

fn reason_labels(reason: DropReason) -> ReasonLabels {
    let reason = match reason {
        DropReason::Auth => "auth",
        DropReason::Malformed => "malformed",
    };
    ReasonLabels { reason }
}

fn direction_labels(direction: Direction) -> DirectionLabels {
    let direction = match direction {
        Direction::In => "in",
        Direction::Out => "out",
    };
    DirectionLabels { direction }
}

fn state_labels(state: Liveness) -> StateLabels {
    let state = match state {
        Liveness::Alive => "alive",
        Liveness::Suspect => "suspect",
        Liveness::Down => "down",
    };
    StateLabels { state }
}
