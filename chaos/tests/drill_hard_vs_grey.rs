//! `waymark-drill run hard-vs-grey --scale short`: an evidence-capable region (authority
//! with mutual-TLS ingest and gossip, three node agents probing and forwarding load
//! reports, three Envoys carrying traffic, thirty synthetic xDS callers); one replica
//! killed, one made slow but alive. The verdict must pass: the hard failure out of 99% of
//! the callers' views within its budget, the grey one caught by passive evidence with its
//! probe green.
//!
//! Needs `ENVOY_BIN` and the `waymark` binary next to `waymark-drill` (or `WAYMARK_BIN`).
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn the_hard_vs_grey_drill_passes_at_short_scale() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waymark-drill"))
        .args(["run", "hard-vs-grey", "--scale", "short", "--dir"])
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
    // Every caller (3 Envoys + 30 subscriptions) held both replicas and moved off them.
    for which in ["hard", "grey"] {
        assert_eq!(report[which]["callers"], 33, "{report:#}");
        assert_eq!(report[which]["stopped"], 33, "{report:#}");
    }
    let evidence = &report["grey_evidence"];
    assert_eq!(evidence["passive_named"], true, "{report:#}");
    assert!(evidence["rule"].as_str().unwrap().contains("Passive"));
    assert!(
        report["hard_rule"]
            .as_str()
            .unwrap()
            .contains("HardFailure")
    );
    let saved = std::fs::read_to_string(dir.path().join("report.json")).unwrap();
    let saved: serde_json::Value = serde_json::from_str(&saved).unwrap();
    assert_eq!(saved, report);
}
