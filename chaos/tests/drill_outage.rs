//! `waymark-drill run outage --scale short` with a 24 s outage: real authority, node agent
//! and Envoy processes, demo backends, steady traffic; the verdict must pass.
//!
//! Needs `ENVOY_BIN` (`./scripts/install-envoy` prints it) and the `waymark` binary next to
//! `waymark-drill` (`cargo build -p waymark-agent --bin waymark`; a workspace-wide
//! `cargo test` builds it) or `WAYMARK_BIN`. Runs alone: it starts four processes' worth
//! of work on the machine and measures error rates.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::process::Command;

#[test]
fn the_outage_drill_passes_at_short_scale() {
    let dir = tempfile::tempdir().unwrap();
    let report = common::passing_run(
        "outage",
        &["--duration", "24s", "--steady", "10s"],
        dir.path(),
    );
    assert_eq!(
        report["restarts"]["agent_started_from"], "cache",
        "{report:#}"
    );
    assert!(
        report["during"]["requests"].as_u64().unwrap() > 100,
        "{report:#}"
    );

    // The page plots the verdict counts and the error rate, and is rebuilt from the JSON.
    let page_path = dir.path().join("report.html");
    let page = std::fs::read_to_string(&page_path).unwrap();
    assert!(page.contains("PASS"), "{page}");
    assert!(page.matches("<svg").count() >= 2, "{page}");
    assert!(page.contains("authority SIGKILLed"), "{page}");
    std::fs::remove_file(&page_path).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waymark-drill"))
        .arg("report")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&page_path).unwrap(), page);

    // Not a report: a clear error, nothing written.
    let out = Command::new(env!("CARGO_BIN_EXE_waymark-drill"))
        .arg("report")
        .arg(dir.path().join("outcomes.jsonl"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a drill report"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_outage_drill_fails_with_its_property_broken() {
    // The break: the agent's cache deleted before its restart: nothing to route from. A drill that
    // still passes cannot tell anyone anything.
    let dir = tempfile::tempdir().unwrap();
    common::failing_on(
        "outage",
        &["--duration", "12s", "--steady", "5s", "--break-cache"],
        dir.path(),
        "did not start from its cache",
    );
}
