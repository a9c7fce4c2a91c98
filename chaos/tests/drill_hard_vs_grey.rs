//! `waymark-drill run hard-vs-grey --scale short`: an evidence-capable region (authority
//! with mutual-TLS ingest and gossip, three node agents probing and forwarding load
//! reports, three Envoys carrying traffic, thirty synthetic xDS callers); one replica
//! killed, one made slow but alive. The verdict must pass: the hard failure out of 99% of
//! the callers' views within its budget, the grey one caught by passive evidence with its
//! probe green.
//!
//! Needs `ENVOY_BIN` and the `waymark` binary next to `waymark-drill` (or `WAYMARK_BIN`).
#![allow(clippy::unwrap_used)]

use crate::common;

#[test]
fn the_hard_vs_grey_drill_passes_at_short_scale() {
    let dir = tempfile::tempdir().unwrap();
    let report = common::passing_run("hard-vs-grey", &[], dir.path());
    // Every caller (3 Envoys + 30 subscriptions) held both replicas and moved off them.
    for which in ["hard", "grey"] {
        assert_eq!(report[which]["callers"], 33, "{report:#}");
        assert_eq!(report[which]["stopped"], 33, "{report:#}");
    }
    let evidence = &report["grey_evidence"];
    assert_eq!(evidence["passive_named"], true, "{report:#}");
    // The rule as explain gives it, fields not Debug text: `uncorroborated failing=passive`.
    let rule = evidence["rule"].as_str().unwrap();
    assert!(rule.contains("failing=passive"), "{rule}");
    let hard_rule = report["hard_rule"].as_str().unwrap();
    assert!(hard_rule.contains("hard_failure"), "{hard_rule}");
}

#[test]
fn the_hard_vs_grey_drill_fails_with_its_property_broken() {
    // The break: Envoys without load reports: no passive evidence, the grey replica is never
    // caught. A drill that still passes cannot tell anyone anything.
    let dir = tempfile::tempdir().unwrap();
    common::failing_run("hard-vs-grey", &["--break-load-reports"], dir.path());
}
