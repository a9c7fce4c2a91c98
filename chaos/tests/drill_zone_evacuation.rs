//! `waymark-drill run zone-evacuation --scale short`: a real authority, 2,000 registered
//! instances in 40 services, 500 Delta xDS subscribers, a zone evacuated during a burst
//! offered at 40,000 changes per minute; withdrawals must reach 99% of subscribers within
//! 5 s while the admission path sheds, declared, whenever delivery comes under pressure.
//!
//! Needs the `waymark` binary next to `waymark-drill` (`cargo build -p waymark-agent --bin
//! waymark`) or `WAYMARK_BIN`. Runs alone: it saturates the authority on purpose.
#![allow(clippy::unwrap_used)]

use crate::common;

#[test]
fn the_zone_evacuation_drill_passes_at_short_scale() {
    let dir = tempfile::tempdir().unwrap();
    let report = common::passing_run("zone-evacuation", &[], dir.path());
    let w = &report["withdrawal"];
    // 40 withdrawals × the subscribers following each service (500 over 40 services).
    assert!(w["pairs"].as_u64().unwrap() >= 400, "{w:#}");
    assert_eq!(w["missing"], 0, "{w:#}");
    assert!(w["p99_ms"].as_f64().unwrap() <= 5_000.0, "{w:#}");
    // The authority's own histogram timed the withdrawals and gives the same verdict.
    let h = &report["authority_histogram"];
    assert!(h["withdrawal"]["count"].as_f64().unwrap() > 0.0, "{h:#}");
    assert_eq!(h["same_withdrawal_verdict"], true, "{h:#}");
    // Declared whenever delivery came under pressure (a slow Publish commit).
    let s = &report["shedding"];
    let declared = s["episodes_after"].as_f64().unwrap() > s["episodes_before"].as_f64().unwrap()
        || s["seen_shedding"] == true;
    assert!(
        declared || s["slow_publishes"].as_f64().unwrap() == 0.0,
        "{s:#}"
    );
    assert!(
        report["evacuation"]["evacuations"]["z1"]["moved"]
            .as_u64()
            .unwrap()
            > 0,
        "{report:#}"
    );
}

#[test]
fn the_zone_evacuation_drill_fails_with_its_property_broken() {
    // The break: no shedding. Whether admissions then delay withdrawals past the budget
    // depends on how fast this machine commits, so the threshold is set to zero: every
    // `Publish` commit counts as pressure, and a run that never declares shedding must fail
    // on any machine. A drill that still passes cannot tell anyone anything.
    let dir = tempfile::tempdir().unwrap();
    let report = common::failing_run(
        "zone-evacuation",
        &[
            "--break-shedding",
            "--pressure-after",
            "0ms",
            "--duration",
            "8s",
            "--subscriptions",
            "200",
            // What this run must show (shedding never declared) is settled by the end of
            // the burst; the settle is for the withdrawal budgets, which it does not check.
            "--settle",
            "4s",
        ],
        dir.path(),
    );
    let failures = report["verdict"]["failures"].as_array().unwrap();
    assert!(
        failures
            .iter()
            .any(|f| f.as_str().unwrap().contains("never declared shedding")),
        "{failures:#?}"
    );
}
