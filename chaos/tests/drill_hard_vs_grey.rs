//! `waymark-drill run hard-vs-grey --scale short`: an evidence-capable region (authority
//! with mutual-TLS ingest and gossip, three node agents probing and forwarding load
//! reports, three Envoys carrying traffic, thirty synthetic xDS callers); one replica
//! killed, one made slow but alive. The verdict must pass: the hard failure out of 99% of
//! the callers' views within its budget, the grey one withdrawn from 99% of them by the
//! callers' population (its traffic is above the contract's passive-primary threshold)
//! with its probe green throughout; with too little traffic, the grey one stays routed
//! and is reported single-class.
//!
//! Needs `ENVOY_BIN` and the `waymark` binary next to `waymark-drill` (or `WAYMARK_BIN`).
#![allow(clippy::unwrap_used)]

use crate::common;

#[test]
fn the_hard_vs_grey_drill_passes_at_short_scale() {
    let dir = tempfile::tempdir().unwrap();
    let report = common::passing_run("hard-vs-grey", &[], dir.path());
    // Every caller (3 Envoys + 27 subscriptions) held both replicas and lost them.
    for which in ["hard", "grey_removed"] {
        assert_eq!(report[which]["callers"], 30, "{report:#}");
        assert_eq!(report[which]["stopped"], 30, "{report:#}");
    }
    let evidence = &report["grey_evidence"];
    assert_eq!(evidence["population"], true, "{report:#}");
    // The rule as explain gives it, fields not Debug text.
    let rule = evidence["rule"].as_str().unwrap();
    assert!(rule.starts_with("caller_population"), "{rule}");
    let hard_rule = report["hard_rule"].as_str().unwrap();
    assert!(hard_rule.contains("hard_failure"), "{hard_rule}");
    // Probes are counted beside the traffic.
    let share = report["probe_traffic"]["share"].as_f64().unwrap();
    assert!(share > 0.0 && share < 1.0, "{report:#}");
}

#[test]
fn with_too_little_traffic_the_grey_replica_stays_probe_primary_and_single_class() {
    let dir = tempfile::tempdir().unwrap();
    let report = common::passing_run("hard-vs-grey", &["--low-traffic"], dir.path());
    assert_eq!(
        report["grey_evidence"]["mode"], "single_class",
        "{report:#}"
    );
    assert_eq!(report["grey_removed"]["stopped"], 0, "{report:#}");
}

#[test]
fn the_hard_vs_grey_drill_fails_with_its_property_broken() {
    // The break: Envoys without load reports: no passive evidence, the grey replica is never
    // withdrawn. A drill that still passes cannot tell anyone anything.
    let dir = tempfile::tempdir().unwrap();
    common::failing_on(
        "hard-vs-grey",
        &["--break-load-reports"],
        dir.path(),
        "grey: the authority never withdrew it",
    );
}
