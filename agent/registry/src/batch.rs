//! Group commit, sans I/O: registry commands that arrive while earlier ones are being
//! committed are proposed together, as one log entry ([`crate::machine::Request::Batch`]),
//! and each is acknowledged with its own outcome once that entry commits.
//!
//! No timer adds latency: an idle authority proposes a command the moment it arrives. Under
//! load, a batch is what arrived while the entries in flight were committing, so its size
//! follows the commit latency and the arrival rate by itself — the wait is bounded by one
//! commit. At most [`GroupCommitConfig::max_in_flight`] entries are in flight and each holds
//! at most [`GroupCommitConfig::max_commands`] commands and
//! [`GroupCommitConfig::max_bytes`] of them (as the driver sizes each; a lone command
//! larger than that still goes, alone), so neither the log entry nor the queue of
//! unacknowledged callers grows without bound — an entry stays far below what one Raft
//! append may carry; beyond
//! [`GroupCommitConfig::max_waiting`] a command is refused at once ([`Full`]) for the caller
//! to retry.
//!
//! The driver (the authority's API) owns the Raft handle: it [`GroupCommit::submit`]s each
//! command with whatever identifies its caller, proposes what [`GroupCommit::next_batch`]
//! hands out, and calls [`GroupCommit::finished`] when that proposal committed or failed.

use std::collections::VecDeque;

/// Bounds of group commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommitConfig {
    /// Most commands in one log entry.
    pub max_commands: usize,
    /// Most bytes of commands in one log entry.
    pub max_bytes: usize,
    /// Most entries proposed and not yet committed. One by default: what arrives while
    /// an entry commits goes in the next one whole, and the batch grows with the commit's
    /// latency, which is what makes a busy member cheaper per command. Measured at the
    /// reference estate (`waymark-drill bench writes`, 16 clients, one member), two in
    /// flight split the same arrivals into entries of about four commands instead of
    /// seven, and the member acknowledged about a fifth fewer writes; four, about 40 %
    /// fewer.
    pub max_in_flight: usize,
    /// Most commands waiting for a batch; beyond it a command is refused.
    pub max_waiting: usize,
}

impl Default for GroupCommitConfig {
    fn default() -> Self {
        Self {
            max_commands: 512,
            max_bytes: 2 * 1024 * 1024,
            max_in_flight: 1,
            max_waiting: 16_384,
        }
    }
}

/// A command refused because too many are waiting already.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{waiting} registry commands are waiting to be committed; retry")]
pub struct Full {
    /// How many were waiting.
    pub waiting: usize,
}

/// See the module documentation. `T` is a command with whatever the driver needs to answer
/// its caller.
#[derive(Debug)]
pub struct GroupCommit<T> {
    config: GroupCommitConfig,
    waiting: VecDeque<(T, usize)>,
    in_flight: usize,
}

impl<T> GroupCommit<T> {
    /// Nothing waiting, nothing in flight.
    pub fn new(config: GroupCommitConfig) -> Self {
        Self {
            config: GroupCommitConfig {
                max_commands: config.max_commands.max(1),
                max_bytes: config.max_bytes,
                max_in_flight: config.max_in_flight.max(1),
                max_waiting: config.max_waiting.max(1),
            },
            waiting: VecDeque::new(),
            in_flight: 0,
        }
    }

    /// Queue a command of `bytes` (its encoded size, as the driver measures it); refused
    /// (and handed back) when [`GroupCommitConfig::max_waiting`] are waiting already.
    pub fn submit(&mut self, item: T, bytes: usize) -> Result<(), (Full, T)> {
        if self.waiting.len() >= self.config.max_waiting {
            return Err((
                Full {
                    waiting: self.waiting.len(),
                },
                item,
            ));
        }
        self.waiting.push_back((item, bytes));
        Ok(())
    }

    /// The next batch to propose, oldest command first, if one may be proposed now: some
    /// command waits and fewer than `max_in_flight` entries are in flight.
    pub fn next_batch(&mut self) -> Option<Vec<T>> {
        if self.waiting.is_empty() || self.in_flight >= self.config.max_in_flight {
            return None;
        }
        let mut n = 0;
        let mut bytes = 0usize;
        for (_, size) in self.waiting.iter().take(self.config.max_commands) {
            bytes = bytes.saturating_add(*size);
            if n > 0 && bytes > self.config.max_bytes {
                break;
            }
            n += 1;
        }
        self.in_flight += 1;
        Some(self.waiting.drain(..n).map(|(item, _)| item).collect())
    }

    /// A batch handed out by [`GroupCommit::next_batch`] committed or failed (either way its
    /// callers have been answered): its slot is free.
    pub fn finished(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Commands waiting for a batch.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Batches proposed and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn config(max_commands: usize, max_in_flight: usize, max_waiting: usize) -> GroupCommitConfig {
        GroupCommitConfig {
            max_commands,
            max_bytes: usize::MAX,
            max_in_flight,
            max_waiting,
        }
    }

    #[test]
    fn an_idle_authority_proposes_a_command_at_once_alone() {
        let mut g = GroupCommit::new(config(8, 1, 100));
        g.submit(1, 1).unwrap();
        assert_eq!(g.next_batch(), Some(vec![1]));
        assert_eq!(g.in_flight(), 1);
    }

    #[test]
    fn what_arrives_during_a_commit_goes_together_after_it() {
        let mut g = GroupCommit::new(config(8, 1, 100));
        g.submit(1, 1).unwrap();
        assert_eq!(g.next_batch(), Some(vec![1]));
        for i in 2..=4 {
            g.submit(i, 1).unwrap();
        }
        // The one slot is taken: nothing more until the first entry committed.
        assert_eq!(g.next_batch(), None);
        g.finished();
        assert_eq!(g.next_batch(), Some(vec![2, 3, 4]));
        assert_eq!(g.next_batch(), None);
    }

    #[test]
    fn a_batch_holds_at_most_max_commands_and_the_rest_waits() {
        let mut g = GroupCommit::new(config(2, 2, 100));
        for i in 0..5 {
            g.submit(i, 1).unwrap();
        }
        assert_eq!(g.next_batch(), Some(vec![0, 1]));
        assert_eq!(g.next_batch(), Some(vec![2, 3]));
        assert_eq!(g.next_batch(), None, "two in flight already");
        g.finished();
        assert_eq!(g.next_batch(), Some(vec![4]));
    }

    #[test]
    fn a_batch_holds_at_most_max_bytes_and_a_larger_command_goes_alone() {
        let mut g = GroupCommit::new(GroupCommitConfig {
            max_bytes: 10,
            ..config(8, 4, 100)
        });
        for (item, bytes) in [("a", 4), ("b", 4), ("c", 4), ("huge", 50), ("d", 1)] {
            g.submit(item, bytes).unwrap();
        }
        assert_eq!(g.next_batch(), Some(vec!["a", "b"]));
        assert_eq!(g.next_batch(), Some(vec!["c"]));
        assert_eq!(g.next_batch(), Some(vec!["huge"]));
        assert_eq!(g.next_batch(), Some(vec!["d"]));
    }

    #[test]
    fn beyond_max_waiting_a_command_is_refused_and_handed_back() {
        let mut g = GroupCommit::new(config(8, 1, 2));
        g.submit("a", 1).unwrap();
        g.submit("b", 1).unwrap();
        assert_eq!(g.submit("c", 1), Err((Full { waiting: 2 }, "c")));
        assert_eq!(g.waiting(), 2);
    }

    #[test]
    fn zero_bounds_are_read_as_one() {
        let mut g = GroupCommit::new(config(0, 0, 0));
        g.submit(1, 1).unwrap();
        assert!(g.submit(2, 1).is_err());
        assert_eq!(g.next_batch(), Some(vec![1]));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Submit(usize),
        Propose,
        Finish,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1usize..8).prop_map(Step::Submit),
            Just(Step::Propose),
            Just(Step::Finish)
        ]
    }

    proptest! {
        /// Every accepted command is proposed exactly once, in arrival order; no batch is
        /// empty or over its bounds (a lone command may exceed the bytes); never more in
        /// flight than allowed.
        #[test]
        fn every_command_is_proposed_once_in_order_within_bounds(
            steps in prop::collection::vec(step(), 0..200),
            max_commands in 1usize..6,
            max_in_flight in 1usize..4,
            max_waiting in 1usize..20,
            max_bytes in 1usize..20,
        ) {
            let mut g = GroupCommit::new(GroupCommitConfig {
                max_bytes,
                ..config(max_commands, max_in_flight, max_waiting)
            });
            let mut sizes = std::collections::BTreeMap::new();
            let (mut next, mut accepted, mut proposed) = (0u32, Vec::new(), Vec::new());
            let mut outstanding = 0usize;
            for s in steps {
                match s {
                    Step::Submit(bytes) => {
                        if g.submit(next, bytes).is_ok() {
                            accepted.push(next);
                            sizes.insert(next, bytes);
                        }
                        next += 1;
                    }
                    Step::Propose => {
                        if let Some(batch) = g.next_batch() {
                            prop_assert!(!batch.is_empty() && batch.len() <= max_commands);
                            let bytes: usize = batch.iter().map(|i| sizes[i]).sum();
                            prop_assert!(batch.len() == 1 || bytes <= max_bytes);
                            proposed.extend(batch);
                            outstanding += 1;
                        }
                    }
                    Step::Finish => {
                        if outstanding > 0 {
                            g.finished();
                            outstanding -= 1;
                        }
                    }
                }
                prop_assert!(g.in_flight() <= max_in_flight);
                prop_assert!(g.waiting() <= max_waiting);
            }
            while outstanding > 0 {
                g.finished();
                outstanding -= 1;
            }
            while let Some(batch) = g.next_batch() {
                proposed.extend(batch);
                g.finished();
            }
            prop_assert_eq!(proposed, accepted);
        }
    }
}
