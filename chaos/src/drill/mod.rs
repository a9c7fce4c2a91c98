//! The drills: each re-runs one of the prototype's experiments against real processes and
//! returns a [`outage::Report`]-like value whose verdict says whether the claim held.
//!
//! Pure parts (aggregating outcomes into figures, the verdict against a budget) are plain
//! functions in [`figures`]; each drill's `run` is the shell that drives the processes.

pub mod bad_health_check;
pub mod figures;
pub mod hard_vs_grey;
pub mod html;
pub mod leader_churn;
pub mod outage;
pub mod prober_partition;
pub mod region_partition;
pub mod report;
pub mod xds_restart;
pub mod zone_evacuation;

/// How long a drill runs: `short` for CI and tests, `full` for the claim's real length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    Short,
    Full,
}
