//! Evacuation and shift-back: reversible, rate-capped preference shifts (ADR-13).
//!
//! One step machine serves two targets: a zone of this region (zone evacuation) and a peer
//! region (region failover, ADR-14). An evacuation moves the target's share of traffic away
//! in steps of a configured size, one per step interval, never all at once; shift-back
//! returns it the same way. A *manual* failover's shift-back stops one step short of home
//! and waits for an operator's explicit completion, because the moment everything is
//! allowed back at once is how a recovered target is knocked over again.
//!
//! Repeating a command never skips the cap: asking again in the direction already being
//! moved keeps the pending step. Reversing takes its first step at once (it returns no
//! more than was there a moment before), then waits an interval like any other step.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::units::Permille;

/// Which way an evacuation is moving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Moving traffic away from the target.
    Out,
    /// Bringing traffic back.
    Back,
}

/// One zone's evacuation, or one peer region's failover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evacuation {
    /// Share of the target's traffic moved away so far.
    pub moved: Permille,
    /// Which way it is moving.
    pub direction: Direction,
    /// Started by an operator's manual failover: shift-back needs explicit completion.
    pub manual: bool,
    /// Shift-back is holding at its last step, waiting for completion.
    pub awaiting_completion: bool,
    /// When the next step is due, if one is.
    pub next_step: Option<Instant>,
    /// When the share last changed, and which way: a reversal steps at once unless the
    /// share already moved that way within the interval (a shift-back held one step short
    /// of home moves nothing, so reversing it must not add a second step to the first).
    last_change: Option<(Instant, Direction)>,
}

/// What an operator (or the failover signal) asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvacuationCommand {
    /// Start (or resume) moving traffic away from a zone or peer region. `manual` marks an
    /// operator's failover.
    Evacuate {
        /// Whether shift-back will need explicit completion.
        manual: bool,
    },
    /// Start bringing traffic back.
    ShiftBack,
    /// Finish a manual shift-back that is holding at its last step.
    CompleteShiftBack,
}

/// Why an evacuation or region failover command was refused. Nothing changed: the caller
/// should report the refusal (and audit it) rather than retry the same command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EvacuationError {
    /// The zone is not evacuated, so there is nothing to shift back or complete.
    #[error("zone {zone} is not evacuated")]
    NotEvacuated {
        /// The zone.
        zone: String,
    },
    /// Completion was asked for a shift-back that is not holding at its last step.
    #[error("zone {zone} is not waiting for shift-back completion")]
    NotAwaitingCompletion {
        /// The zone.
        zone: String,
    },
    /// Evacuating this zone would leave no zone of the region taking traffic.
    #[error("evacuating zone {zone} would leave the region with no zone to take traffic")]
    LastZone {
        /// The zone.
        zone: String,
    },
    /// The zone is not part of the region.
    #[error("zone {zone} is not a zone of this region")]
    UnknownZone {
        /// The zone.
        zone: String,
    },
    /// A region cannot fail over away from itself: its own zones are moved by zone
    /// evacuation instead.
    #[error("region {region} is this region; evacuate its zones instead")]
    OwnRegion {
        /// The region.
        region: String,
    },
    /// The peer region is not failed over, so there is nothing to shift back or complete.
    #[error("region {region} is not failed over")]
    RegionNotFailedOver {
        /// The region.
        region: String,
    },
    /// Completion was asked for a region shift-back that is not holding at its last step.
    #[error("region {region} is not waiting for shift-back completion")]
    RegionNotAwaitingCompletion {
        /// The region.
        region: String,
    },
}

impl Evacuation {
    /// A new evacuation, taking its first step now.
    pub(crate) fn start(now: Instant, manual: bool, step: Permille, interval: Duration) -> Self {
        let mut e = Self {
            moved: Permille::ZERO,
            direction: Direction::Out,
            manual,
            awaiting_completion: false,
            next_step: None,
            last_change: None,
        };
        e.step(now, step, interval);
        e
    }

    /// Resumed from a replicated record, as a new leader does: the share already moved
    /// stays moved, and the next step (if any) waits one interval.
    pub(crate) fn restored(
        now: Instant,
        moved: Permille,
        direction: Direction,
        manual: bool,
        awaiting_completion: bool,
        interval: Duration,
    ) -> Self {
        let settled = awaiting_completion
            || match direction {
                Direction::Out => moved == Permille::ONE,
                Direction::Back => moved == Permille::ZERO,
            };
        Self {
            moved,
            direction,
            manual,
            awaiting_completion,
            next_step: (!settled).then(|| now + interval),
            last_change: None,
        }
    }

    /// Move (or keep moving) traffic away. Reversing a shift-back steps at once; already
    /// moving away keeps the pending step, so a repeated command cannot skip the cap.
    pub(crate) fn move_out(
        &mut self,
        now: Instant,
        manual: bool,
        step: Permille,
        interval: Duration,
    ) {
        self.manual |= manual;
        if self.direction == Direction::Out {
            return;
        }
        self.awaiting_completion = false;
        self.reverse(now, Direction::Out, step, interval);
    }

    /// Bring (or keep bringing) traffic back. Reversing steps at once; already moving back
    /// keeps the pending step (or the hold for completion).
    pub(crate) fn move_back(&mut self, now: Instant, step: Permille, interval: Duration) {
        if self.direction == Direction::Back {
            return;
        }
        self.reverse(now, Direction::Back, step, interval);
    }

    /// Turn to `to` and step at once, unless the share already moved that way less than
    /// an interval ago: then the step waits for that interval to end, so no two steps the
    /// same way ever fall within one interval.
    fn reverse(&mut self, now: Instant, to: Direction, step: Permille, interval: Duration) {
        self.direction = to;
        self.next_step = match self.last_change {
            Some((at, way)) if way == to && now < at + interval => Some(at + interval),
            _ => None,
        };
        self.step(now, step, interval);
    }

    /// Take one step if one is due; returns whether the share changed.
    pub(crate) fn step(&mut self, now: Instant, step: Permille, interval: Duration) -> bool {
        if self.awaiting_completion || self.next_step.is_some_and(|due| due > now) {
            return false;
        }
        let before = self.moved;
        match self.direction {
            Direction::Out => {
                self.moved =
                    Permille::saturating(u32::from(self.moved.get()) + u32::from(step.get()))
            }
            Direction::Back => {
                let after = self.moved.get().saturating_sub(step.get());
                if after == 0 && self.manual {
                    // Hold one step short of home until an operator completes it.
                    self.awaiting_completion = true;
                } else {
                    self.moved = Permille::saturating(u32::from(after));
                }
            }
        }
        let settled = match self.direction {
            Direction::Out => self.moved == Permille::ONE,
            Direction::Back => self.moved == Permille::ZERO || self.awaiting_completion,
        };
        self.next_step = if settled { None } else { Some(now + interval) };
        if self.moved != before {
            self.last_change = Some((now, self.direction));
        }
        self.moved != before
    }

    /// Whether the evacuation is over and can be forgotten.
    pub(crate) fn is_home(&self) -> bool {
        self.direction == Direction::Back && self.moved == Permille::ZERO
    }
}

/// Every shift of one kind of target — the zones of this region, or the peer regions —
/// under the same rules: a command checked against the target's shift, the steps taken
/// on time, a shift forgotten once it is home. What a target may be (a known zone, not
/// this region) is its caller's to check; this table knows only shifts.
#[derive(Debug, Clone)]
pub(crate) struct Shifts<K> {
    table: BTreeMap<K, Evacuation>,
}

/// Why a command does not apply to its target's shift. Nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShiftRefusal {
    /// The target is not shifted: nothing to shift back or complete.
    NotShifted,
    /// Completion was asked of a shift-back not holding at its last step.
    NotAwaitingCompletion,
}

impl<K: Ord + Clone> Shifts<K> {
    pub(crate) fn new() -> Self {
        Self {
            table: BTreeMap::new(),
        }
    }

    /// Whether `command` applies to `key`'s shift now.
    pub(crate) fn check(&self, key: &K, command: EvacuationCommand) -> Result<(), ShiftRefusal> {
        match (command, self.table.get(key)) {
            (EvacuationCommand::Evacuate { .. }, _) => Ok(()),
            (_, None) => Err(ShiftRefusal::NotShifted),
            (EvacuationCommand::ShiftBack, Some(_)) => Ok(()),
            (EvacuationCommand::CompleteShiftBack, Some(e)) if e.awaiting_completion => Ok(()),
            (EvacuationCommand::CompleteShiftBack, Some(_)) => {
                Err(ShiftRefusal::NotAwaitingCompletion)
            }
        }
    }

    /// Start, reverse or complete `key`'s shift; refused (changing nothing) as
    /// [`Shifts::check`] says.
    pub(crate) fn apply(
        &mut self,
        now: Instant,
        key: &K,
        command: EvacuationCommand,
        step: Permille,
        interval: Duration,
    ) -> Result<(), ShiftRefusal> {
        self.check(key, command)?;
        match command {
            EvacuationCommand::Evacuate { manual } => match self.table.get_mut(key) {
                Some(e) => e.move_out(now, manual, step, interval),
                None => {
                    let e = Evacuation::start(now, manual, step, interval);
                    self.table.insert(key.clone(), e);
                }
            },
            EvacuationCommand::ShiftBack => {
                if let Some(e) = self.table.get_mut(key) {
                    e.move_back(now, step, interval);
                    // An automatic shift one step out is home after one step back.
                    if e.is_home() {
                        self.table.remove(key);
                    }
                }
            }
            EvacuationCommand::CompleteShiftBack => {
                self.table.remove(key);
            }
        }
        Ok(())
    }

    /// Resume a shift where a previous leader left it; one already home is not kept.
    /// Whether it was.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn restore(
        &mut self,
        now: Instant,
        key: &K,
        moved: Permille,
        direction: Direction,
        manual: bool,
        awaiting_completion: bool,
        interval: Duration,
    ) -> bool {
        let e = Evacuation::restored(now, moved, direction, manual, awaiting_completion, interval);
        if e.is_home() {
            self.table.remove(key);
            return false;
        }
        self.table.insert(key.clone(), e);
        true
    }

    /// Take the steps due at `now`; the targets whose share changed, in key order. Those
    /// that came home are forgotten.
    pub(crate) fn step_due(&mut self, now: Instant, step: Permille, interval: Duration) -> Vec<K> {
        let mut changed = Vec::new();
        self.table.retain(|key, e| {
            if !e.step(now, step, interval) {
                return true;
            }
            changed.push(key.clone());
            !e.is_home()
        });
        changed
    }

    /// The next step due across every target.
    pub(crate) fn next_step(&self) -> Option<Instant> {
        self.table.values().filter_map(|e| e.next_step).min()
    }

    pub(crate) fn get(&self, key: &K) -> Option<&Evacuation> {
        self.table.get(key)
    }

    pub(crate) fn contains(&self, key: &K) -> bool {
        self.table.contains_key(key)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &Evacuation)> {
        self.table.iter()
    }
}
