//! `waymark-drill bench ingest`, smoke-sized: node-agent sessions over mutual TLS stream
//! evidence into a real authority, which admits it, and the same samples are replayed
//! through the evaluator alone. The full-size run is a separate command (docs/benchmarks.md);
//! this only proves the bench counts what the authority admitted and
//! reports every figure, never how fast.
//!
//! Needs the `waymark` binary next to `waymark-drill` or `WAYMARK_BIN`.
#![allow(clippy::unwrap_used)]

#[test]
fn the_ingest_bench_counts_what_the_authority_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = [
        "ingest",
        "--services",
        "4",
        "--estate",
        "120",
        "--sessions",
        "6",
        "--batch",
        "64",
        "--seconds",
        "1",
        "--warmup",
        "1",
        "--limit-seconds",
        "0",
        "--repeats",
        "1",
        "--dir",
    ]
    .map(std::ffi::OsStr::new)
    .to_vec();
    args.push(dir.path().as_os_str());
    let (r, _stderr) = crate::common::bench_report(&args);
    assert_eq!(r["bench"], "ingest");
    assert_eq!(r["instances"], 120, "{r:#}");
    // Every class is in the stream: each instance has a prober, a host relaying its
    // self-reports, and callers.
    for class in ["probe", "self_report", "passive"] {
        assert!(r["round"][class].as_u64().unwrap() >= 120, "{class}: {r:#}");
    }
    let phase = &r["waymark_phases"][0];
    let admitted = phase["admitted"].as_u64().unwrap();
    assert!(admitted > 0, "nothing admitted: {phase:#}");
    // The acknowledgements and the authority's own counter agree that work was admitted,
    // and nothing was refused for who sent it: every sample was attributable and assigned
    // (a full queue may refuse some as `overloaded`, which is what a closed loop finds).
    assert!(
        phase["metric_admitted"].as_f64().unwrap() > 0.0,
        "{phase:#}"
    );
    let refused = phase["refused"].as_object().unwrap();
    assert!(
        refused.keys().all(|reason| reason == "overloaded"),
        "{phase:#}"
    );
    assert!(
        phase["authority_cpu_s"].as_f64().unwrap() > 0.0,
        "{phase:#}"
    );
    let limit = &r["limit_phases"][0];
    assert!(limit["samples"].as_u64().unwrap() > 0, "{limit:#}");
    assert_eq!(limit["applied"], limit["samples"], "{r:#}");
    let ratio = r["ratio"].as_f64().unwrap();
    let expected = r["samples_per_sec"]["median"].as_f64().unwrap()
        / r["limit_samples_per_sec"]["median"].as_f64().unwrap();
    assert!((ratio - expected).abs() < 1e-9, "{r:#}");
    for figure in ["per_core_samples_per_sec", "authority_cores"] {
        assert!(
            r[figure]["median"].as_f64().unwrap() > 0.0,
            "{figure}: {r:#}"
        );
    }
    assert!(r["target_samples_per_sec"].as_f64().unwrap() > 0.0);
    assert!(r["meets_target"].is_boolean());
}
