//! The anti-entropy session with one peer region, sans I/O.
//!
//! Each side periodically sends its digest of the peer's region; on a peer's digest it
//! answers with what the peer lacks of *our own* region, at most `entries_per_message`
//! entries per message (bounded bandwidth; a full outbox drops its oldest message, which
//! the next round recomputes from digests). Received entries are merged with a
//! reconciliation record when they changed anything. The driver owns the QUIC connection
//! and the clock; it feeds [`Session::handle_message`] and [`Session::handle_timeout`] and
//! sends what [`Session::poll_transmit`] returns. A peer's age is the time since it last
//! spoke.
//!
//! Direct links only: the driver tells the session which region the connection's
//! certificate names ([`Session::handle_authenticated`]), and a batch of entries is merged
//! only if every entry is that region's own; anything else is refused whole with
//! [`AggregateError::ForeignEntry`] and changes nothing (see `aggregate`). No region relays
//! another's entries, so a region reads only the peers it links to.

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
    /// The region the current connection is authenticated as (the configured peer until
    /// a driver says otherwise).
    sender: RegionName,
    outbox: VecDeque<Message>,
    next_digest: Option<Instant>,
    last_heard: Option<Instant>,
    records: Vec<ReconciliationRecord>,
}

impl Session {
    /// A session from `local` to the configured `peer` region, not yet connected.
    pub fn new(config: SessionConfig, local: RegionName, peer: RegionName) -> Self {
        Self {
            config,
            local,
            sender: peer.clone(),
            peer,
            outbox: VecDeque::new(),
            next_digest: None,
            last_heard: None,
            records: Vec::new(),
        }
    }

    /// The transport connected to a peer whose certificate names `region`, which the
    /// driver has checked is the configured peer: send our digest at once. Entries on this
    /// connection are admitted only if they are `region`'s own.
    pub fn handle_authenticated(
        &mut self,
        now: Instant,
        region: RegionName,
        aggregates: &RegionAggregates,
    ) {
        // Admitting a connection of another region is the driver's bug; entries would still
        // be held to the region the certificate proves.
        debug_assert_eq!(
            region, self.peer,
            "the driver admits only the configured peer"
        );
        self.sender = region;
        self.push_digest(aggregates);
        self.next_digest = Some(now + self.config.digest_interval);
    }

    /// [`Session::handle_authenticated`] as the configured peer region, for transports
    /// that authenticate it themselves (tests, simulations).
    pub fn handle_connected(&mut self, now: Instant, aggregates: &RegionAggregates) {
        self.handle_authenticated(now, self.peer.clone(), aggregates);
    }

    /// A message from the peer. Entries are merged into `aggregates` if every one is the
    /// peer's own region; a refused batch changes nothing and is returned as an error for
    /// the driver to count.
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
                // Only our own region: the peer would refuse anything else, and must.
                let missing = aggregates.missing_of(&self.local, &digest);
                for chunk in missing.chunks(self.config.entries_per_message.max(1)) {
                    self.push(Message::Entries {
                        entries: chunk.to_vec(),
                    });
                }
                Ok(())
            }
            Message::Entries { entries } => {
                let record = aggregates.merge_from(&self.local, &self.sender, entries)?;
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
        let versions = aggregates.digest_of(&self.sender).into_iter().collect();
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
mod tests;
