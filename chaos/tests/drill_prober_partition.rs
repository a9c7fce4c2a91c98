//! `waymark-drill run prober-partition --scale short`: real authority, node agents (the
//! probers of each zone in their own network namespace), Envoy and demo backends; one
//! zone's probers cut off, then every prober; the verdict must pass.
//!
//! Needs root (network namespaces and nftables: `apt-get install nftables`), `ENVOY_BIN`
//! (`./scripts/install-envoy` prints it) and the `waymark` binary next to `waymark-drill`
//! (`cargo build -p waymark-agent --bin waymark`) or `WAYMARK_BIN`. Without root or `nft`
//! the drill fails saying so; it never skips.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::process::Command;

#[test]
fn the_prober_partition_drill_passes_at_short_scale() {
    let dir = tempfile::tempdir().unwrap();
    let report = common::passing_run("prober-partition", &[], dir.path());
    // Nothing left rotation, and with every prober cut off all four went unknown.
    for phase in ["zone_cut_states", "all_cut_states"] {
        assert_eq!(report[phase]["max_out_of_rotation"], 0, "{report:#}");
    }
    assert_eq!(report["all_cut_states"]["max_unknown"], 4, "{report:#}");
    assert_eq!(report["envoy_min_endpoints"], 4, "{report:#}");
    for (name, answers) in report["cut_zone_answers"].as_object().unwrap() {
        assert!(answers[0].as_u64().unwrap() > 0, "{name}: {report:#}");
        assert!(answers[1].as_u64().unwrap() > 0, "{name}: {report:#}");
    }
    // The namespaces and rules are gone with the drill.
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let name = report["network"]["netns"][0].as_str().unwrap();
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains(name),
        "namespace {name} left behind"
    );
}

#[test]
fn the_prober_partition_drill_fails_with_its_property_broken() {
    // The break: silence read as failure: cut-off probers withdraw healthy instances. A drill that
    // still passes cannot tell anyone anything.
    let dir = tempfile::tempdir().unwrap();
    // Silence read as failure withdraws within seconds of the cut, so 10 s of it shows it.
    common::failing_on(
        "prober-partition",
        &["--duration", "10s", "--break-silence"],
        dir.path(),
        "taken out of rotation",
    );
}
