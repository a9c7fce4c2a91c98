//! How fast the log moves, as metrics (`waymark_raft_*`): commit and apply latency, each
//! follower's lag behind the leader in entries and in seconds, and snapshot sizes.
//!
//! The follower lag is a pure function of what openraft's `RaftMetrics` says (the leader's
//! last log index, each follower's matched index) and of when this leader first saw each
//! index in its log ([`LogClock`], fed with `now` by the driver): a follower is as many
//! seconds behind as the oldest entry it lacks is old. The driver, [`follow_lag`], wakes
//! on every metrics change and once a second.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::RaftNode;

/// `follower`: a member id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct FollowerLabels {
    /// The follower's member id.
    pub follower: String,
}

/// The log's metrics; clones share them.
#[derive(Debug, Clone)]
pub struct RaftTimings {
    /// A write proposed here, until it is committed and applied on this (leading) member.
    pub commit_seconds: Histogram,
    /// Applying one batch of committed entries to the state machine.
    pub apply_seconds: Histogram,
    /// Size of the last snapshot this member built.
    pub snapshot_built_bytes: Gauge,
    /// Sizes of the snapshots this member installed from a leader (its count: installs).
    pub snapshot_installed_bytes: Histogram,
    /// On the leader: entries each follower lacks of the leader's log.
    pub follower_lag_entries: Family<FollowerLabels, Gauge>,
    /// On the leader: how old the oldest entry each follower lacks is (0 when caught up).
    pub follower_lag_seconds: Family<FollowerLabels, Gauge<f64, AtomicU64>>,
}

impl Default for RaftTimings {
    fn default() -> Self {
        Self {
            commit_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            apply_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            snapshot_built_bytes: Gauge::default(),
            // 1 KiB … 4 GiB.
            snapshot_installed_bytes: Histogram::new(exponential_buckets(1024.0, 4.0, 12)),
            follower_lag_entries: Family::default(),
            follower_lag_seconds: Family::default(),
        }
    }
}

impl RaftTimings {
    /// Register under `waymark_raft_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("waymark_raft");
        r.register(
            "commit_seconds",
            "From proposing a write on the leader to its commit and apply there",
            self.commit_seconds.clone(),
        );
        r.register(
            "apply_seconds",
            "Applying one batch of committed entries to the state machine",
            self.apply_seconds.clone(),
        );
        r.register(
            "snapshot_built_bytes",
            "Size of the last snapshot this member built",
            self.snapshot_built_bytes.clone(),
        );
        r.register(
            "snapshot_installed_bytes",
            "Sizes of the snapshots this member installed from a leader",
            self.snapshot_installed_bytes.clone(),
        );
        r.register(
            "follower_lag_entries",
            "On the leader: entries of its log each follower has not matched",
            self.follower_lag_entries.clone(),
        );
        r.register(
            "follower_lag_seconds",
            "On the leader: age of the oldest entry each follower has not matched (0 when caught up)",
            self.follower_lag_seconds.clone(),
        );
    }
}

/// Indexes of the leader's log remembered with the instant they were first seen; past
/// this the oldest are forgotten, and a follower further behind reads as behind since
/// the oldest remembered.
pub const LOG_CLOCK_MAX: usize = 4_096;

/// When this leader first saw each last-log index: a pure record, fed with `now`.
#[derive(Debug, Default)]
pub struct LogClock {
    /// (index, first seen), indexes increasing.
    seen: VecDeque<(u64, Instant)>,
}

/// One follower's lag.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lag {
    /// Entries it has not matched.
    pub entries: u64,
    /// Age of the oldest of them.
    pub age: Duration,
}

impl LogClock {
    /// The leader's log reaches `last_index` at `now`.
    pub fn handle_last_index(&mut self, now: Instant, last_index: u64) {
        if self.seen.back().is_none_or(|(i, _)| *i < last_index) {
            self.seen.push_back((last_index, now));
        }
        while self.seen.len() > LOG_CLOCK_MAX {
            self.seen.pop_front();
        }
    }

    /// A follower that matched `matched` (none: nothing yet) of a log at `last_index`.
    pub fn lag(&self, now: Instant, last_index: u64, matched: Option<u64>) -> Lag {
        let entries = match matched {
            Some(m) => last_index.saturating_sub(m),
            None => last_index,
        };
        if entries == 0 {
            return Lag {
                entries,
                age: Duration::ZERO,
            };
        }
        // The first index seen past what it matched: the oldest entry it lacks arrived then.
        let since = self
            .seen
            .iter()
            .find(|(i, _)| matched.is_none_or(|m| *i > m))
            .or(self.seen.front())
            .map_or(now, |(_, at)| *at);
        Lag {
            entries,
            age: now.saturating_duration_since(since),
        }
    }

    /// Forget everything (leadership ended).
    pub fn clear(&mut self) {
        self.seen.clear();
    }
}

/// Keep the follower-lag gauges current while this member leads; clear them otherwise.
/// Runs until Raft stops.
pub async fn follow_lag(raft: RaftNode, timings: RaftTimings) {
    let mut metrics = raft.watch_metrics();
    let mut clock = LogClock::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
        }
        let now = tokio::time::Instant::now().into_std();
        let m = metrics.borrow_and_update().clone();
        let (Some(replication), true) = (m.replication.as_ref(), m.state.is_leader()) else {
            clock.clear();
            timings.follower_lag_entries.clear();
            timings.follower_lag_seconds.clear();
            continue;
        };
        let last = m.last_log_index.unwrap_or(0);
        clock.handle_last_index(now, last);
        let lags: BTreeMap<u64, Lag> = replication
            .iter()
            .filter(|(id, _)| **id != m.id)
            .map(|(id, matched)| (*id, clock.lag(now, last, matched.map(|l| l.index))))
            .collect();
        // Followers removed from the group stop being reported.
        timings.follower_lag_entries.clear();
        timings.follower_lag_seconds.clear();
        for (id, lag) in lags {
            let labels = FollowerLabels {
                follower: id.to_string(),
            };
            timings
                .follower_lag_entries
                .get_or_create(&labels)
                .set(i64::try_from(lag.entries).unwrap_or(i64::MAX));
            timings
                .follower_lag_seconds
                .get_or_create(&labels)
                .set(lag.age.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn a_follower_is_as_far_behind_as_the_oldest_entry_it_lacks() {
        // Goal: lag in entries is last − matched; in seconds, the age of the first index
        // the leader saw past what the follower matched.
        let t0 = t0();
        let s = Duration::from_secs(1);
        let mut clock = LogClock::default();
        clock.handle_last_index(t0, 10);
        clock.handle_last_index(t0 + s, 12);
        clock.handle_last_index(t0 + 3 * s, 15);
        let now = t0 + 5 * s;
        assert_eq!(
            clock.lag(now, 15, Some(15)),
            Lag {
                entries: 0,
                age: Duration::ZERO
            }
        );
        // Matched 12: it lacks 13..=15, first seen at t0+3s.
        assert_eq!(
            clock.lag(now, 15, Some(12)),
            Lag {
                entries: 3,
                age: 2 * s
            }
        );
        // Matched 11: it lacks 12, seen at t0+1s.
        assert_eq!(clock.lag(now, 15, Some(11)).age, 4 * s);
        // Nothing matched yet: behind since the oldest remembered index.
        assert_eq!(
            clock.lag(now, 15, None),
            Lag {
                entries: 15,
                age: 5 * s
            }
        );
    }

    #[test]
    fn the_clock_is_bounded_and_never_goes_back() {
        let t0 = t0();
        let mut clock = LogClock::default();
        for i in 0..(LOG_CLOCK_MAX as u64 + 10) {
            clock.handle_last_index(t0 + Duration::from_millis(i), i + 1);
        }
        clock.handle_last_index(t0, 3); // an older index changes nothing
        assert_eq!(clock.seen.len(), LOG_CLOCK_MAX);
        assert!(
            clock
                .seen
                .iter()
                .zip(clock.seen.iter().skip(1))
                .all(|(a, b)| a.0 < b.0)
        );
    }
}
