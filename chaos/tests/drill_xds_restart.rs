//! `waymark-drill run xds-restart --scale short`: a real authority serving 500 Delta xDS
//! subscribers is SIGKILLed and restarted under light churn; for a minute afterwards at most
//! 5% of the subscribers reconnect in any 10 s window and no subscriber's view goes back.
//!
//! Needs the `waymark` binary next to `waymark-drill` (`cargo build -p waymark-agent --bin
//! waymark`) or `WAYMARK_BIN`. Runs alone: it opens 1,000 sockets and measures rates.
#![allow(clippy::unwrap_used)]

use crate::common;

#[test]
fn the_xds_restart_drill_passes_at_short_scale() {
    let dir = tempfile::tempdir().unwrap();
    // 40 s watched: four 10 s windows of admission.
    let report = common::passing_run("xds-restart", &["--duration", "40s"], dir.path());
    let r = &report["reconnections"];
    assert!(r["max_checked_share"].as_f64().unwrap() <= 0.05, "{r:#}");
    // The tier came back and let clients in at its pace: at least the floor's 10 a window.
    assert!(r["reconnected"].as_u64().unwrap() >= 40, "{r:#}");
    assert_eq!(report["regressions"]["count"], 0, "{report:#}");
    assert!(
        report["refused_streams"].as_u64().unwrap() > 0,
        "{report:#}"
    );
}

#[test]
fn the_xds_restart_drill_fails_with_its_property_broken() {
    // The break: no reconnection admission: the whole population reconnects at once. A drill that
    // still passes cannot tell anyone anything.
    let dir = tempfile::tempdir().unwrap();
    // Everyone is back within the first window, so 8 s of watching shows it.
    common::failing_on(
        "xds-restart",
        &["--duration", "8s", "--break-reconnect-admission"],
        dir.path(),
        "reconnected in one 10 s window",
    );
}
