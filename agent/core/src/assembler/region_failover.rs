//! Region failover: shifting this region's tier-2 preference away from a peer region.
//!
//! The command comes from outside the registry (ADR-14): a direct probe of the peer's front
//! door, or an operator's routing control. Both arrive as an [`EvacuationCommand`] on a
//! [`RegionName`] and drive the same rate-capped step machine as zone evacuation (ADR-13),
//! including the manual shift-back that holds one step short of home until completed.
//!
//! Effect on views: each endpoint of the peer region is published at its weight scaled by
//! the share kept; once the whole share has moved, the region is ranked after every other
//! peer region at its own weight. Nothing is removed, so a failover never empties a view:
//! when every region is failed over, the preference order is all that changes.
//!
//! A region without endpoints yet may still be failed over (the signal is about its front
//! door, not about what its aggregate happens to hold); this region may not.

use std::time::Instant;

use super::evacuation::{Evacuation, EvacuationCommand, EvacuationError, ShiftRefusal};
use super::{Direction, Effect, ViewAssembler, rank_in};
use crate::model::RegionName;
use crate::units::{Permille, Weight};

// === impl ViewAssembler ===

impl ViewAssembler {
    /// Start, reverse or complete a failover away from a peer region.
    pub fn handle_region_failover(
        &mut self,
        now: Instant,
        region: &RegionName,
        command: EvacuationCommand,
    ) -> Result<(), EvacuationError> {
        self.check_own_region(region)?;
        let (step, interval) = (
            self.config.region_failover_step,
            self.config.region_failover_step_interval,
        );
        self.region_failovers
            .apply(now, region, command, step, interval)
            .map_err(|r| region_error(r, region))?;
        self.region_failover_changed(region);
        Ok(())
    }

    /// Whether [`ViewAssembler::handle_region_failover`] would accept `command`, without
    /// acting.
    pub fn check_region_failover(
        &self,
        region: &RegionName,
        command: EvacuationCommand,
    ) -> Result<(), EvacuationError> {
        self.check_own_region(region)?;
        self.region_failovers
            .check(region, command)
            .map_err(|r| region_error(r, region))
    }

    fn check_own_region(&self, region: &RegionName) -> Result<(), EvacuationError> {
        if *region == self.config.region {
            return Err(EvacuationError::OwnRegion {
                region: region.to_string(),
            });
        }
        Ok(())
    }

    /// Resume a region failover where a previous leader left it (from the replicated
    /// record): the share already moved stays moved, and stepping continues from there. A
    /// record naming this region, or one already home, is ignored.
    pub fn restore_region_failover(
        &mut self,
        now: Instant,
        region: &RegionName,
        moved: Permille,
        direction: Direction,
        manual: bool,
        awaiting_completion: bool,
    ) {
        if *region == self.config.region {
            return;
        }
        let interval = self.config.region_failover_step_interval;
        let kept = self.region_failovers.restore(
            now,
            region,
            moved,
            direction,
            manual,
            awaiting_completion,
            interval,
        );
        if kept {
            self.region_failover_changed(region);
        }
    }

    /// A peer region's failover state, if it is failed over (or shifting back).
    pub fn region_failover(&self, region: &RegionName) -> Option<&Evacuation> {
        self.region_failovers.get(region)
    }

    /// Every region failover in progress, in region order.
    pub fn region_failovers(&self) -> impl Iterator<Item = (&RegionName, &Evacuation)> {
        self.region_failovers.iter()
    }

    pub(super) fn step_region_failovers(&mut self, now: Instant) {
        let (step, interval) = (
            self.config.region_failover_step,
            self.config.region_failover_step_interval,
        );
        for region in self.region_failovers.step_due(now, step, interval) {
            self.region_failover_changed(&region);
        }
    }

    /// A peer region endpoint's weight, and its rank among peer regions (0 first), after
    /// failover. `order` is the service's preferred region order, if it has one.
    pub(super) fn remote_shift(
        &self,
        region: &RegionName,
        order: Option<&[RegionName]>,
        weight: Weight,
    ) -> (Weight, u32) {
        let rank = rank_in(order, region);
        let moved = self
            .region_failovers
            .get(region)
            .map_or(Permille::ZERO, |e| e.moved);
        if moved == Permille::ONE {
            // Fully moved: failover only, after every region that still takes its share.
            // The order among failed-over regions is kept; their weights need no scaling,
            // since they share a priority only with each other.
            let slots = order.map_or(0, |o| o.len() as u32);
            return (weight, slots + 1 + rank);
        }
        let kept = Permille::saturating(1000 - u32::from(moved.get()));
        (weight.scale(kept), rank)
    }

    fn region_failover_changed(&mut self, region: &RegionName) {
        let (moved, awaiting_completion) = self
            .region_failovers
            .get(region)
            .map_or((Permille::ZERO, false), |e| {
                (e.moved, e.awaiting_completion)
            });
        tracing::debug!(peer_region = %region, moved = moved.get(), awaiting_completion, "region failover step");
        self.effects.push(Effect::RegionFailoverProgress {
            region: region.clone(),
            moved,
            awaiting_completion,
        });
        // Only views holding the region's endpoints change.
        let touched = self
            .services
            .iter()
            .filter(|(_, slot)| slot.remote.contains_key(region))
            .map(|(name, _)| name.clone());
        let touched: Vec<_> = touched.collect();
        for service in &touched {
            self.touch_all(service);
        }
    }
}

#[cfg(test)]
mod tests;

fn region_error(refusal: ShiftRefusal, region: &RegionName) -> EvacuationError {
    let region = region.to_string();
    match refusal {
        ShiftRefusal::NotShifted => EvacuationError::RegionNotFailedOver { region },
        ShiftRefusal::NotAwaitingCompletion => {
            EvacuationError::RegionNotAwaitingCompletion { region }
        }
    }
}
