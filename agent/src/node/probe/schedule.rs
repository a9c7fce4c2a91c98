//! Probe schedule: which target to probe when, within a concurrency bound.
//!
//! Pure state machine; no IO, no clock, no ambient randomness. Time arrives as `now`; the
//! seed for spreading start offsets arrives in [`ScheduleConfig`]. The driver is
//! [`Prober`](super::Prober).
//!
//! ```text
//! handle_targets ──►               ──► Effect::Start { run, target }
//! handle_timeout ──► ProbeSchedule ──► Effect::Stop  { run }
//! handle_done    ──►               ──► Effect::Skip  { instance, reason }
//! ```
//!
//! Invariants (checked by `schedule_test.rs`):
//! - at most `concurrency` runs are started and neither done nor stopped
//! - at most one run per target at a time
//! - a removed or changed target's run is stopped in the same step that removes it
//! - a due probe that finds no free slot waits at most one interval, then is skipped

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};
use waymark_core::hash::SplitMix64;

use waymark_core::model::InstanceId;

use crate::evidence::ProbeTarget;

/// Intervals below this are raised to it, so a bad assignment cannot spin the driver. The
/// contract's own floor is far higher (`PROBE_INTERVAL_MIN`); tests use less than that.
pub const INTERVAL_MIN: Duration = Duration::from_millis(10);

/// How the schedule runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// Runs in flight at once, at most.
    pub concurrency: NonZeroUsize,
    /// Seeds the start offsets of new targets.
    pub seed: u64,
}

/// One started probe, unique for the schedule's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(u64);

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Probe `target` now and report the result with [`ProbeSchedule::handle_done`].
    Start {
        /// The run to report.
        run: RunId,
        /// What to probe.
        target: ProbeTarget,
    },
    /// Abandon `run` (its target was removed or changed): drop any result it produces.
    /// Its slot is already free.
    Stop {
        /// The run to abandon.
        run: RunId,
    },
    /// A due probe of `instance` did not run.
    Skip {
        /// The target.
        instance: InstanceId,
        /// Why.
        reason: SkipReason,
    },
}

/// Why a due probe did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// It waited a whole interval for a concurrency slot.
    Concurrency,
    /// The target's previous run was still in flight.
    Overlap,
}

/// The probe schedule. See the module docs.
#[derive(Debug)]
pub struct ProbeSchedule {
    concurrency: usize,
    rng: SplitMix64,
    entries: BTreeMap<InstanceId, Entry>,
    /// Every entry's next due time, exactly one per entry.
    timers: BTreeSet<(Instant, InstanceId)>,
    /// Entries waiting for a slot, oldest first. Lazily cleaned: an item is live only while
    /// its entry is `Waiting` with the same ticket.
    queue: VecDeque<(u64, InstanceId)>,
    runs: BTreeMap<RunId, InstanceId>,
    waiting: usize,
    next_ticket: u64,
    next_run: u64,
    effects: Vec<Effect>,
    last_now: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    target: ProbeTarget,
    interval: Duration,
    due: Instant,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Waiting { ticket: u64 },
    Running(RunId),
}

impl ProbeSchedule {
    /// An empty schedule.
    pub fn new(config: ScheduleConfig) -> Self {
        Self {
            concurrency: config.concurrency.get(),
            rng: SplitMix64::new(config.seed),
            entries: BTreeMap::new(),
            timers: BTreeSet::new(),
            queue: VecDeque::new(),
            runs: BTreeMap::new(),
            waiting: 0,
            next_ticket: 0,
            next_run: 0,
            effects: Vec::new(),
            last_now: None,
        }
    }

    /// Replace the whole target set. Unchanged targets keep their phase; removed ones stop
    /// at once; new and changed ones start at a random offset within their interval, so a
    /// fresh assignment does not probe everything in the same instant. When `targets`
    /// names an instance twice, the last one wins.
    pub fn handle_targets(&mut self, now: Instant, targets: Vec<ProbeTarget>) {
        self.advance(now);
        let mut wanted: BTreeMap<InstanceId, ProbeTarget> = BTreeMap::new();
        for target in targets {
            wanted.insert(target.instance.clone(), target);
        }
        let gone: Vec<InstanceId> = self
            .entries
            .iter()
            .filter(|(id, entry)| wanted.get(*id) != Some(&entry.target))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.remove(&id);
        }
        for (id, target) in wanted {
            if self.entries.contains_key(&id) {
                continue;
            }
            let interval = target.probe.interval.max(INTERVAL_MIN);
            let due = now + below(&mut self.rng, interval);
            self.timers.insert((due, id.clone()));
            let state = State::Idle;
            let entry = Entry {
                target,
                interval,
                due,
                state,
            };
            self.entries.insert(id, entry);
        }
        self.fill_slots();
    }

    /// Start what is due. Call at [`poll_timeout`](Self::poll_timeout) (early or late is
    /// harmless: late probes keep their phase and missed rounds are not made up).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        while let Some((due, id)) = self.timers.first().cloned() {
            if due > now {
                break;
            }
            self.timers.pop_first();
            self.fire(now, id);
        }
        self.fill_slots();
    }

    /// `run` finished. Returns whether its result is current (`false` once its target was
    /// removed or changed: drop the result).
    pub fn handle_done(&mut self, now: Instant, run: RunId) -> bool {
        self.advance(now);
        let Some(id) = self.runs.remove(&run) else {
            return false;
        };
        let entry = self.entries.get_mut(&id);
        debug_assert!(
            entry
                .as_ref()
                .is_some_and(|e| e.state == State::Running(run))
        );
        if let Some(entry) = entry {
            entry.state = State::Idle;
        }
        self.fill_slots();
        true
    }

    /// When [`handle_timeout`](Self::handle_timeout) next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|(due, _)| *due)
    }

    /// The driver's work, in order.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// Targets scheduled.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no target is scheduled.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Runs started and neither done nor stopped.
    pub fn running(&self) -> usize {
        self.runs.len()
    }

    /// Due probes waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    fn advance(&mut self, now: Instant) {
        debug_assert!(
            self.last_now.is_none_or(|last| last <= now),
            "time went backwards"
        );
        self.last_now = Some(now);
    }

    /// `id`'s timer fired: run it, queue it, or skip this round.
    fn fire(&mut self, now: Instant, id: InstanceId) {
        let Some(entry) = self.entries.get_mut(&id) else {
            debug_assert!(false, "timer without entry");
            return;
        };
        // Keep the phase; if we are a whole interval late, do not make up missed rounds.
        let mut due = entry.due + entry.interval;
        if due <= now {
            due = now + entry.interval;
        }
        entry.due = due;
        let state = entry.state;
        self.timers.insert((due, id.clone()));
        match state {
            State::Running(_) => self.skip(id, SkipReason::Overlap),
            State::Waiting { .. } => {
                // A whole interval without a slot: this round is lost. Requeue at the back
                // for the next one, so one slow target cannot hold the head of the line.
                self.skip(id.clone(), SkipReason::Concurrency);
                self.enqueue(id);
            }
            State::Idle => {
                if self.runs.len() < self.concurrency && self.waiting == 0 {
                    self.start(id);
                } else {
                    self.waiting += 1;
                    self.enqueue(id);
                }
            }
        }
    }

    fn enqueue(&mut self, id: InstanceId) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.state = State::Waiting { ticket };
            self.queue.push_back((ticket, id));
        }
    }

    fn fill_slots(&mut self) {
        while self.runs.len() < self.concurrency {
            let Some((ticket, id)) = self.queue.pop_front() else {
                break;
            };
            let live = self
                .entries
                .get(&id)
                .is_some_and(|e| e.state == State::Waiting { ticket });
            if live {
                self.waiting -= 1;
                self.start(id);
            }
        }
    }

    fn start(&mut self, id: InstanceId) {
        let run = RunId(self.next_run);
        self.next_run += 1;
        let Some(entry) = self.entries.get_mut(&id) else {
            debug_assert!(false, "start without entry");
            return;
        };
        entry.state = State::Running(run);
        let target = entry.target.clone();
        self.runs.insert(run, id);
        self.effects.push(Effect::Start { run, target });
    }

    fn skip(&mut self, instance: InstanceId, reason: SkipReason) {
        self.effects.push(Effect::Skip { instance, reason });
    }

    fn remove(&mut self, id: &InstanceId) {
        let Some(entry) = self.entries.remove(id) else {
            return;
        };
        self.timers.remove(&(entry.due, id.clone()));
        match entry.state {
            State::Idle => {}
            // Its queue item goes stale and is dropped by `fill_slots`.
            State::Waiting { .. } => self.waiting -= 1,
            State::Running(run) => {
                self.runs.remove(&run);
                self.effects.push(Effect::Stop { run });
            }
        }
    }
}

/// A duration in `[0, bound)` from `rng`.
fn below(rng: &mut SplitMix64, bound: Duration) -> Duration {
    let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX).max(1);
    Duration::from_nanos(rng.below(nanos))
}

#[cfg(test)]
#[path = "schedule_test.rs"]
mod tests;
