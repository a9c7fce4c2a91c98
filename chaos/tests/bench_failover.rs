//! `waymark-drill bench failover`, smoke-sized: a three-member authority with a small
//! estate and a few dozen Delta xDS subscribers; its leader is SIGKILLed twice. Asserts what
//! the bench measured — a different member took over at a higher term, every subscriber
//! ended current, the killed member's subscribers reopened beside their standby streams,
//! the figures are ordered as the recovery is and summarised honestly — never how fast. The full-size run is a separate command (docs/benchmarks.md).
//!
//! Needs the `waymark` binary next to `waymark-drill` or `WAYMARK_BIN`.
#![allow(clippy::unwrap_used)]

#[test]
fn a_killed_leader_is_replaced_and_every_subscriber_is_current_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = [
        "failover",
        "--services",
        "20",
        "--estate",
        "400",
        "--subscriptions",
        "30",
        "--repeats",
        "2",
        "--dir",
    ]
    .map(std::ffi::OsStr::new)
    .to_vec();
    args.push(dir.path().as_os_str());
    let (r, stderr) = crate::common::bench_report(&args);
    assert_eq!(r["bench"], "failover", "{stderr}");
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "one run per repeat: {r:#}");
    for run in runs {
        assert_ne!(run["new_leader"], run["killed"], "{run:#}");
        assert!(
            run["new_term"].as_u64().unwrap() > run["killed_term"].as_u64().unwrap(),
            "{run:#}"
        );
        // Publishing needs a leader; the last subscriber is current only once something
        // newer was published.
        assert!(
            f(&run["publish_ms"]) >= f(&run["leader_known_ms"]),
            "{run:#}"
        );
        assert!(
            f(&run["subscribers_current_ms"]) >= f(&run["publish_ms"]),
            "{run:#}"
        );
        assert_eq!(run["current_at_end"], 30, "{run:#}");
        // The killed member's subscribers had to reconnect elsewhere, and the probe
        // service's view of every zone was committed anew.
        assert!(run["reconnected"].as_u64().unwrap() > 0, "{run:#}");
        // Every subscriber held a standby at a second member (the bench waits for them),
        // and each that lost its member reopened beside it rather than as an arrival.
        assert_eq!(run["standing_by_at_kill"], 30, "{run:#}");
        assert_eq!(run["promoted"], run["reconnected"], "{run:#}");
        // A reconnecting subscriber can only hold the new version on its new stream.
        assert!(
            f(&run["subscribers_current_ms"]) >= f(&run["reattach_max_ms"]),
            "{run:#}"
        );
        assert!(run["views_changed"].as_u64().unwrap() >= 3, "{run:#}");
    }
    // Each summary is the median and the extremes of the runs' own figures.
    for figure in [
        "leader_known_ms",
        "write_acked_ms",
        "publish_ms",
        "subscribers_current_ms",
    ] {
        let s = &r[figure];
        assert!(
            f(&s["min"]) <= f(&s["median"]) && f(&s["median"]) <= f(&s["max"]),
            "{figure}: {s:#}"
        );
        let values: Vec<f64> = runs.iter().map(|run| f(&run[figure])).collect();
        assert!(values.contains(&f(&s["min"])) && values.contains(&f(&s["max"])));
    }
    let limit = &r["limit"];
    assert!(f(&limit["rebuild_ms"]) > 0.0, "{limit:#}");
    assert!(
        (f(&limit["limit_ms"]) - f(&limit["notice_ms"]) - f(&limit["rebuild_ms"])).abs() < 1e-9
    );
    assert!(f(&limit["notice_ms"]) > f(&limit["election_timeout_min_ms"]));
    let ratio = f(&limit["limit_ms"]) / f(&r["subscribers_current_ms"]["median"]);
    assert!((f(&r["ratio"]) - ratio).abs() < 1e-9, "{r:#}");
    let budgets = &r["budgets"];
    assert_eq!(
        budgets["subscribers_current_held"],
        f(&r["subscribers_current_ms"]["max"]) <= f(&budgets["subscribers_current_ms"])
    );
}
