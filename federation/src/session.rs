//! The anti-entropy session with one peer region, sans I/O.
//!
//! Each side periodically sends its digest; on a peer's digest it answers with what the
//! peer lacks, at most `entries_per_message` entries per message (bounded bandwidth; a
//! full outbox drops its oldest message, which the next round recomputes from digests). Received entries are merged with a reconciliation record when
//! they changed anything. The driver owns the QUIC connection and the clock; it feeds
//! [`Session::handle_message`] and [`Session::handle_timeout`] and sends what
//! [`Session::poll_transmit`] returns. A peer's age is the time since it last spoke.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use waymark_core::model::RegionName;

use crate::aggregate::{AggregateError, Digest, Entry, ReconciliationRecord, RegionAggregates};

/// Session pacing and limits.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// How often to send our digest.
    pub digest_interval: Duration,
    /// Most entries in one message.
    pub entries_per_message: usize,
    /// Most messages queued for sending; beyond it the oldest digest answer is dropped
    /// (the next round recomputes it).
    pub outbox_max: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            digest_interval: Duration::from_secs(5),
            entries_per_message: 256,
            outbox_max: 16,
        }
    }
}

/// What travels between two regions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Message {
    /// The sender's versions.
    Digest {
        /// (region, service) → version, as a list (JSON maps need string keys).
        versions: Vec<((RegionName, waymark_core::model::ServiceName), u64)>,
    },
    /// Entries the receiver lacks.
    Entries {
        /// The entries.
        entries: Vec<Entry>,
    },
}

/// One peer session. See the module documentation.
#[derive(Debug)]
pub struct Session {
    config: SessionConfig,
    local: RegionName,
    peer: RegionName,
    outbox: VecDeque<Message>,
    next_digest: Option<Instant>,
    last_heard: Option<Instant>,
    records: Vec<ReconciliationRecord>,
}

impl Session {
    /// A session from `local` to `peer`, not yet connected.
    pub fn new(config: SessionConfig, local: RegionName, peer: RegionName) -> Self {
        Self {
            config,
            local,
            peer,
            outbox: VecDeque::new(),
            next_digest: None,
            last_heard: None,
            records: Vec::new(),
        }
    }

    /// The transport connected: send our digest at once.
    pub fn handle_connected(&mut self, now: Instant, aggregates: &RegionAggregates) {
        self.push_digest(aggregates);
        self.next_digest = Some(now + self.config.digest_interval);
    }

    /// A message from the peer. Entries are merged into `aggregates`; a refused batch
    /// changes nothing and is returned as an error for the driver to count.
    pub fn handle_message(
        &mut self,
        now: Instant,
        message: Message,
        aggregates: &mut RegionAggregates,
    ) -> Result<(), AggregateError> {
        self.last_heard = Some(now);
        match message {
            Message::Digest { versions } => {
                let digest: Digest = versions.into_iter().collect();
                let missing = aggregates.missing_for(&digest);
                for chunk in missing.chunks(self.config.entries_per_message.max(1)) {
                    self.push(Message::Entries {
                        entries: chunk.to_vec(),
                    });
                }
                Ok(())
            }
            Message::Entries { entries } => {
                let record = aggregates.merge_from(&self.local, &self.peer, entries)?;
                if record.changed().next().is_some() {
                    self.records.push(record);
                }
                Ok(())
            }
        }
    }

    /// Send the periodic digest when due.
    pub fn handle_timeout(&mut self, now: Instant, aggregates: &RegionAggregates) {
        if self.next_digest.is_some_and(|t| t <= now) {
            self.push_digest(aggregates);
            self.next_digest = Some(now + self.config.digest_interval);
        }
    }

    /// When [`Session::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_digest
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<Message> {
        self.outbox.pop_front()
    }

    /// Reconciliation records produced since the last call (for the audit log).
    pub fn take_records(&mut self) -> Vec<ReconciliationRecord> {
        std::mem::take(&mut self.records)
    }

    /// Time since the peer last spoke; `None` if it never has.
    pub fn age(&self, now: Instant) -> Option<Duration> {
        self.last_heard.map(|t| now.saturating_duration_since(t))
    }

    /// Whether the peer has been silent longer than `threshold` (or never spoke).
    pub fn is_stale(&self, now: Instant, threshold: Duration) -> bool {
        self.age(now).is_none_or(|a| a > threshold)
    }

    fn push_digest(&mut self, aggregates: &RegionAggregates) {
        let versions = aggregates.digest().into_iter().collect();
        self.push(Message::Digest { versions });
    }

    fn push(&mut self, message: Message) {
        if self.outbox.len() >= self.config.outbox_max {
            self.outbox.pop_front();
        }
        self.outbox.push_back(message);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use waymark_core::model::ServiceName;

    use super::*;
    use crate::aggregate::ServiceAggregate;

    #[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
    fn t0() -> Instant {
        Instant::now()
    }

    fn region(s: &str) -> RegionName {
        RegionName::try_new(s).unwrap()
    }

    fn entry(r: &str, s: usize, v: u64) -> Entry {
        Entry {
            region: region(r),
            service: ServiceName::try_new(format!("s{s}")).unwrap(),
            version: v,
            aggregate: Arc::new(ServiceAggregate::default()),
        }
    }

    fn publish(a: &mut RegionAggregates, r: &str, services: usize, v: u64) {
        for s in 0..services {
            a.publish_local(entry(r, s, v)).unwrap();
        }
    }

    /// Deliver everything queued both ways until both outboxes are empty; count messages.
    fn pump(
        now: Instant,
        a: (&mut Session, &mut RegionAggregates),
        b: (&mut Session, &mut RegionAggregates),
    ) -> usize {
        let (sa, aa) = a;
        let (sb, ab) = b;
        let mut sent = 0;
        for _ in 0..1_000 {
            let mut moved = false;
            while let Some(m) = sa.poll_transmit() {
                sb.handle_message(now, m, ab).unwrap();
                sent += 1;
                moved = true;
            }
            while let Some(m) = sb.poll_transmit() {
                sa.handle_message(now, m, aa).unwrap();
                sent += 1;
                moved = true;
            }
            if !moved {
                break;
            }
        }
        sent
    }

    #[test]
    fn two_regions_converge_and_only_what_is_missing_travels() {
        let now = t0();
        let config = SessionConfig {
            entries_per_message: 4,
            ..SessionConfig::default()
        };
        let (mut eu, mut us) = (RegionAggregates::new(), RegionAggregates::new());
        publish(&mut eu, "eu", 10, 1);
        publish(&mut us, "us", 3, 1);
        let mut s_eu = Session::new(config.clone(), region("eu"), region("us"));
        let mut s_us = Session::new(config, region("us"), region("eu"));
        s_eu.handle_connected(now, &eu);
        s_us.handle_connected(now, &us);
        pump(now, (&mut s_eu, &mut eu), (&mut s_us, &mut us));
        assert_eq!(eu.digest(), us.digest());
        // 10 entries at 4 per message: three entry messages one way, one the other.
        assert_eq!(
            s_us.take_records()
                .iter()
                .map(|r| r.entries.len())
                .sum::<usize>(),
            10
        );
        assert_eq!(
            s_eu.take_records()
                .iter()
                .map(|r| r.entries.len())
                .sum::<usize>(),
            3
        );
        // A second round finds nothing missing: digests only.
        s_eu.handle_timeout(now + Duration::from_secs(5), &eu);
        s_us.handle_timeout(now + Duration::from_secs(5), &us);
        let sent = pump(now, (&mut s_eu, &mut eu), (&mut s_us, &mut us));
        assert_eq!(sent, 2, "only the two digests");
        assert!(s_eu.take_records().is_empty() && s_us.take_records().is_empty());
    }

    #[test]
    fn after_a_partition_the_heal_is_recorded() {
        let now = t0();
        let (mut eu, mut us) = (RegionAggregates::new(), RegionAggregates::new());
        publish(&mut eu, "eu", 2, 1);
        let mut s_eu = Session::new(SessionConfig::default(), region("eu"), region("us"));
        let mut s_us = Session::new(SessionConfig::default(), region("us"), region("eu"));
        s_eu.handle_connected(now, &eu);
        s_us.handle_connected(now, &us);
        pump(now, (&mut s_eu, &mut eu), (&mut s_us, &mut us));
        s_us.take_records();
        // Partition: eu moves on; us hears nothing and ages.
        publish(&mut eu, "eu", 2, 7);
        let later = now + Duration::from_secs(90);
        assert!(s_us.is_stale(later, Duration::from_secs(60)));
        assert_eq!(
            us.version(&region("eu"), &ServiceName::try_new("s0").unwrap()),
            Some(1),
            "kept, not dropped"
        );
        // Heal.
        s_eu.handle_connected(later, &eu);
        s_us.handle_connected(later, &us);
        pump(later, (&mut s_eu, &mut eu), (&mut s_us, &mut us));
        let records = s_us.take_records();
        let lines: Vec<_> = records
            .iter()
            .flat_map(|r| r.entries.iter().map(|e| (e.ours, e.theirs)))
            .collect();
        assert_eq!(lines, vec![(Some(1), 7), (Some(1), 7)]);
        assert!(!s_us.is_stale(later, Duration::from_secs(60)));
    }

    #[test]
    fn messages_survive_the_wire() {
        let mut a = RegionAggregates::new();
        publish(&mut a, "eu", 2, 3);
        let digest = Message::Digest {
            versions: a.digest().into_iter().collect(),
        };
        let entries = Message::Entries {
            entries: a.missing_for(&Digest::new()),
        };
        for m in [digest, entries] {
            let back: Message = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
            assert_eq!(back, m);
        }
    }
}
