//! `waymark-drill bench ingest`, smoke-sized: node-agent sessions over mutual TLS stream
//! evidence into a real authority, which admits it, and the same samples are replayed
//! through the evaluator alone. The full-size run is a separate command (README,
//! "Benchmarks"); this only proves the bench counts what the authority admitted and
//! reports every figure, never how fast.
//!
//! Needs the `waymark` binary next to `waymark-drill` or `WAYMARK_BIN`.
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn the_ingest_bench_counts_what_the_authority_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waymark-drill"))
        .args(["bench", "ingest", "--services", "4", "--estate", "120"])
        .args(["--sessions", "6", "--batch", "64", "--seconds", "1"])
        .args(["--warmup", "1", "--limit-seconds", "0", "--repeats", "1"])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let r: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap())
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr:\n{stderr}"));
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
