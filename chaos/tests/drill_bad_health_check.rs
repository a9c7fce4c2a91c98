//! `waymark-drill run bad-health-check --scale short`: a probe-only service's contract is
//! replaced under traffic by one whose probe fails on every replica. The verdict must pass:
//! `health_disregarded` declared, the alarm raised (API and metric), the published view and
//! every caller never below the floor and back to the full set, the error rate unchanged.
//!
//! Needs `ENVOY_BIN` and the `waymark` binary next to `waymark-drill` (or `WAYMARK_BIN`).
#![allow(clippy::unwrap_used)]

use crate::common;

#[test]
fn the_bad_health_check_drill_passes_at_short_scale() {
    let dir = tempfile::tempdir().unwrap();
    let report = common::passing_run("bad-health-check", &[], dir.path());
    let guard = &report["guard"];
    assert!(guard["all_failing_ms"].is_u64(), "{report:#}");
    assert!(guard["declared_ms"].is_u64(), "{report:#}");
    assert_eq!(guard["published_last"], 4, "{report:#}");
    let callers = report["callers"].as_array().unwrap();
    assert_eq!(callers.len(), 10);
    assert!(callers.iter().all(|c| c["last"] == 4), "{report:#}");
    assert!(
        report["alarms"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["alarm"] == "fraction_guard"),
        "{report:#}"
    );
    assert!(
        report["after"]["requests"].as_u64().unwrap() > 300,
        "{report:#}"
    );
}

#[test]
fn the_bad_health_check_drill_fails_with_its_property_broken() {
    // The break: the fraction guard off: the failing check drains the service, undeclared. A drill
    // that still passes cannot tell anyone anything.
    let dir = tempfile::tempdir().unwrap();
    // The drain happens within seconds of the bad contract, so 10 s of it shows it.
    common::failing_on(
        "bad-health-check",
        &["--duration", "10s", "--break-fraction-guard"],
        dir.path(),
        "drained at the authority",
    );
}
