//! The out-of-band region signal: is a peer region's front door answering?
//!
//! The registry is never asked whether a region is reachable — its own reachability is the
//! question (ADR-14). Instead a shell probes each peer region's declared front-door
//! endpoints directly and feeds one result per round here. A region turns **down** after
//! `fail_after` consecutive failed rounds and **up** again after `recover_after`
//! consecutive good ones: asymmetric on purpose, so one lost packet does not fail a region
//! over and one lucky answer does not bring traffic back. A round is good when any of the
//! region's front-door endpoints answered.
//!
//! A region never probed is up: a failover needs evidence of failure, never the mere
//! absence of a probe. Pure: no clocks, no I/O.

use std::collections::BTreeMap;

use serde::Serialize;
use waymark_core::model::RegionName;

/// Thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalConfig {
    /// Consecutive failed rounds before a region is down.
    pub fail_after: u32,
    /// Consecutive good rounds before a down region is up again.
    pub recover_after: u32,
}

impl Default for SignalConfig {
    fn default() -> Self {
        Self {
            fail_after: 3,
            recover_after: 5,
        }
    }
}

/// One region's front-door state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct FrontDoor {
    /// Whether the region's front door is considered up.
    pub up: bool,
    /// Consecutive failed rounds.
    pub failures: u32,
    /// Consecutive good rounds.
    pub successes: u32,
    /// Rounds seen.
    pub rounds: u64,
    /// Why the last failed round failed.
    pub last_error: Option<String>,
}

/// A change of a region's front-door state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The region.
    pub region: RegionName,
    /// Its new state.
    pub up: bool,
}

/// Every peer region's front-door state. See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct RegionSignal {
    config: SignalConfig,
    regions: BTreeMap<RegionName, FrontDoor>,
}

impl RegionSignal {
    /// Nothing probed yet; every region is up.
    pub fn new(config: SignalConfig) -> Self {
        Self {
            config,
            regions: BTreeMap::new(),
        }
    }

    /// One probe round of `region`: `Ok(())` if any front-door endpoint answered, else why
    /// none did. Returns the transition, if the round caused one.
    pub fn handle_round(
        &mut self,
        region: &RegionName,
        result: Result<(), String>,
    ) -> Option<Transition> {
        let door = self.regions.entry(region.clone()).or_insert(FrontDoor {
            up: true,
            ..FrontDoor::default()
        });
        door.rounds += 1;
        let was_up = door.up;
        match result {
            Ok(()) => {
                door.failures = 0;
                door.successes = door.successes.saturating_add(1);
                if !door.up && door.successes >= self.config.recover_after {
                    door.up = true;
                }
            }
            Err(error) => {
                door.successes = 0;
                door.failures = door.failures.saturating_add(1);
                door.last_error = Some(error);
                if door.up && door.failures >= self.config.fail_after {
                    door.up = false;
                }
            }
        }
        (door.up != was_up).then(|| Transition {
            region: region.clone(),
            up: door.up,
        })
    }

    /// Whether `region` is up (a region never probed is).
    pub fn is_up(&self, region: &RegionName) -> bool {
        self.regions.get(region).is_none_or(|d| d.up)
    }

    /// Every probed region's state.
    pub fn regions(&self) -> &BTreeMap<RegionName, FrontDoor> {
        &self.regions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us() -> RegionName {
        RegionName::try_new("us").unwrap()
    }

    fn fail() -> Result<(), String> {
        Err("connection refused".into())
    }

    #[test]
    fn down_after_consecutive_failures_up_after_more_successes() {
        let mut s = RegionSignal::new(SignalConfig {
            fail_after: 3,
            recover_after: 5,
        });
        assert!(s.is_up(&us()), "never probed: up");
        assert_eq!(s.handle_round(&us(), fail()), None);
        assert_eq!(s.handle_round(&us(), fail()), None);
        // One good round resets the failure count.
        assert_eq!(s.handle_round(&us(), Ok(())), None);
        assert_eq!(s.handle_round(&us(), fail()), None);
        assert_eq!(s.handle_round(&us(), fail()), None);
        assert_eq!(
            s.handle_round(&us(), fail()),
            Some(Transition {
                region: us(),
                up: false
            })
        );
        assert!(!s.is_up(&us()));
        for _ in 0..4 {
            assert_eq!(s.handle_round(&us(), Ok(())), None);
        }
        // A failure among the good rounds starts the recovery count again.
        assert_eq!(s.handle_round(&us(), fail()), None);
        for _ in 0..4 {
            assert_eq!(s.handle_round(&us(), Ok(())), None);
        }
        assert_eq!(
            s.handle_round(&us(), Ok(())),
            Some(Transition {
                region: us(),
                up: true
            })
        );
        assert_eq!(s.regions()[&us()].rounds, 16);
        assert_eq!(
            s.regions()[&us()].last_error.as_deref(),
            Some("connection refused")
        );
    }
}
