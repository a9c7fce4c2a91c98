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

use std::time::Duration;

/// How long a drill runs: `short` for CI and tests, `full` for the claim's real length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    Short,
    Full,
}

/// `90`, `90s`, `15m`, `1h` → a duration.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (digits, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?}: expected a number followed by s, m or h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("{s:?}: the unit must be s, m or h")),
    };
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("60m"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("1d").is_err());
        assert!(parse_duration("s").is_err());
    }
}
