//! `waymark-drill run bad-health-check --scale short`: a probe-only service's contract is
//! replaced under traffic by one whose probe fails on every replica. The verdict must pass:
//! `health_disregarded` declared, the alarm raised (API and metric), the published view and
//! every caller never below the floor and back to the full set, the error rate unchanged.
//!
//! Needs `ENVOY_BIN` and the `waymark` binary next to `waymark-drill` (or `WAYMARK_BIN`).
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn the_bad_health_check_drill_passes_at_short_scale() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waymark-drill"))
        .args(["run", "bad-health-check", "--scale", "short", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stdout.lines().last().unwrap_or_default();
    let report: serde_json::Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr:\n{stderr}"));
    assert_eq!(report["verdict"]["pass"], true, "{report:#}\n{stderr}");
    assert!(out.status.success(), "{stderr}");
    let guard = &report["guard"];
    assert!(guard["all_failing_ms"].is_u64(), "{report:#}");
    assert!(guard["declared_ms"].is_u64(), "{report:#}");
    assert_eq!(guard["published_last"], 4, "{report:#}");
    let callers = report["callers"].as_array().unwrap();
    assert_eq!(callers.len(), 11);
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
