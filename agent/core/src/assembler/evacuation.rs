//! Zone evacuation and shift-back: reversible, rate-capped preference shifts (ADR-13).
//!
//! An evacuation moves a zone's share of traffic away in steps of
//! [`EVACUATION_STEP`](crate::defaults::EVACUATION_STEP), one per step interval, never all
//! at once; shift-back returns it the same way. A *manual* failover's shift-back stops one
//! step short of home and waits for an operator's explicit completion, because the moment
//! everything is allowed back at once is how a recovered zone is knocked over again.

use std::time::{Duration, Instant};

use crate::units::Permille;

/// Which way an evacuation is moving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Moving traffic away from the zone.
    Out,
    /// Bringing traffic back.
    Back,
}

/// One zone's evacuation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evacuation {
    /// Share of the zone's traffic moved away so far.
    pub moved: Permille,
    /// Which way it is moving.
    pub direction: Direction,
    /// Started by an operator's manual failover: shift-back needs explicit completion.
    pub manual: bool,
    /// Shift-back is holding at its last step, waiting for completion.
    pub awaiting_completion: bool,
    /// When the next step is due, if one is.
    pub next_step: Option<Instant>,
}

/// What an operator (or the failover signal) asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvacuationCommand {
    /// Start (or resume) moving traffic away. `manual` marks an operator's failover.
    Evacuate {
        /// Whether shift-back will need explicit completion.
        manual: bool,
    },
    /// Start bringing traffic back.
    ShiftBack,
    /// Finish a manual shift-back that is holding at its last step.
    CompleteShiftBack,
}

/// Why an evacuation command was refused. Nothing changed.
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
        };
        e.step(now, step, interval);
        e
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
        self.moved != before
    }

    /// Whether the evacuation is over and can be forgotten.
    pub(crate) fn is_home(&self) -> bool {
        self.direction == Direction::Back && self.moved == Permille::ZERO
    }
}
