//! `waymark-drill bench writes`, smoke-sized: a real authority and a real single-member etcd
//! (Debian's `etcd-server`, which `./scripts/test` installs) take the same churn from the
//! same client, and the report carries both rates, their ratio, and group commit's own
//! counters; then renewals against etcd's lease keep-alives, none of them a log entry. The full-size run is a separate command (docs/benchmarks.md); this only
//! proves the bench measures real work on both stores.
//!
//! Needs the `waymark` binary next to `waymark-drill` or `WAYMARK_BIN`.
#![allow(clippy::unwrap_used)]

#[test]
fn the_writes_bench_measures_both_stores_on_the_same_work() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = [
        "writes",
        "--clients",
        "8",
        "--seconds",
        "1",
        "--repeats",
        "1",
        "--services",
        "8",
        "--estate",
        "200",
        "--hold",
        "4",
        "--dir",
    ]
    .map(std::ffi::OsStr::new)
    .to_vec();
    args.push(dir.path().as_os_str());
    let (r, _stderr) = crate::common::bench_report(&args);
    assert_eq!(r["bench"], "writes");
    assert!(
        r["etcd_version"].as_str().unwrap().contains("etcd"),
        "{r:#}"
    );
    let c = &r["by_clients"][0];
    assert_eq!(c["clients"], 8, "{r:#}");
    for store in ["waymark_phases", "etcd_phases"] {
        let phase = &c[store][0];
        // Every client wrote (its registrations, then deregistrations of its oldest), and
        // nothing was refused.
        assert!(phase["writes"].as_u64().unwrap() >= 8, "{store}: {phase:#}");
        assert_eq!(phase["failed"], 0, "{store}: {phase:#}");
    }
    let ratio = c["ratio"].as_f64().unwrap();
    let expected = c["waymark_per_sec"]["median"].as_f64().unwrap()
        / c["etcd_per_sec"]["median"].as_f64().unwrap();
    assert!((ratio - expected).abs() < 1e-9, "{r:#}");
    assert_eq!(r["ratio"], c["ratio"]);
    // Group commit's counters moved with the measured writes: at least one command per
    // entry, and an entry for every phase's writes at the most.
    assert!(r["raft_entries"].as_u64().unwrap() >= 1, "{r:#}");
    assert!(r["commands_per_entry"].as_f64().unwrap() >= 1.0, "{r:#}");
    // Renewals were answered on both stores, none refused, and none of waymark's became a
    // log entry (the leader's term keeps them).
    let renewals = &r["renewals"];
    assert_eq!(renewals["instances"], 200, "{r:#}");
    for (rate, store) in [("waymark_per_sec", "waymark"), ("etcd_per_sec", "etcd")] {
        assert!(
            renewals[rate]["min"].as_f64().unwrap() > 0.0,
            "{store} renewed nothing: {renewals:#}"
        );
    }
    assert_eq!(renewals["raft_entries"], 0, "{renewals:#}");
}
