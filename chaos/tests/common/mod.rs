//! What every drill test does: run `waymark-drill run <drill> --scale short --dir <tmp>`,
//! take the JSON report from the last stdout line, require a passing verdict and a
//! successful exit (or, with the drill's `--break-…` flag, a failing verdict and a
//! non-zero exit), and check `report.json` in the run folder says the same.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

/// Runs `drill` at short scale in `dir` with `extra` arguments and returns its report;
/// panics with the report and
/// the drill's stderr unless the verdict passed and the process exited 0.
pub(crate) fn passing_run(drill: &str, extra: &[&str], dir: &Path) -> serde_json::Value {
    let (report, ok, stderr) = run(drill, extra, dir);
    assert_eq!(report["verdict"]["pass"], true, "{report:#}\n{stderr}");
    assert!(ok, "{stderr}");
    report
}

/// Runs `drill` with its `--break-…` flag (in `extra`): the property is broken on
/// purpose, so the verdict must fail and the process exit non-zero — a drill that passes
/// with its property broken cannot tell anyone anything. Returns the report.
#[allow(dead_code)] // not every drill test file has a break run
pub(crate) fn failing_run(drill: &str, extra: &[&str], dir: &Path) -> serde_json::Value {
    let (report, ok, stderr) = run(drill, extra, dir);
    assert_eq!(
        report["verdict"]["pass"], false,
        "the drill passed with {extra:?}: {report:#}\n{stderr}"
    );
    assert!(!ok, "a failed verdict must exit non-zero");
    report
}

/// [`failing_run`], and one of the verdict's failures names `broken`: the run failed
/// because of the property broken on purpose, not for a reason of its own (a shortened
/// run that merely timed out would prove nothing).
#[allow(dead_code)] // not every drill test file has a break run
pub(crate) fn failing_on(drill: &str, extra: &[&str], dir: &Path, broken: &str) {
    failing_on_any(drill, extra, dir, &[broken]);
}

/// [`failing_on`] for a break with more than one direct effect, any of which may show
/// first: one of the verdict's failures names one of `effects`.
#[allow(dead_code)] // not every drill test file has a break run
pub(crate) fn failing_on_any(drill: &str, extra: &[&str], dir: &Path, effects: &[&str]) {
    let report = failing_run(drill, extra, dir);
    let failures = report["verdict"]["failures"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        failures.iter().any(|f| f
            .as_str()
            .is_some_and(|f| effects.iter().any(|e| f.contains(e)))),
        "no failure names any of {effects:?}: {failures:#?}"
    );
}

fn run(drill: &str, extra: &[&str], dir: &Path) -> (serde_json::Value, bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_waymark-drill"))
        .args(["run", drill, "--scale", "short"])
        .args(extra)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = stdout.lines().last().unwrap_or_default();
    let report: serde_json::Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr:\n{stderr}"));
    let saved = std::fs::read_to_string(dir.join("report.json")).unwrap();
    let saved: serde_json::Value = serde_json::from_str(&saved).unwrap();
    assert_eq!(saved, report, "report.json differs from the printed report");
    assert!(dir.join("report.html").is_file(), "no report.html");
    (report, out.status.success(), stderr)
}

/// Runs `waymark-drill bench <args>`, requires a successful exit, and returns the JSON
/// report from its last stdout line with its stderr (for assertions' messages).
#[allow(dead_code)] // the drill test files run no bench
pub(crate) fn bench_report(args: &[&std::ffi::OsStr]) -> (serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_waymark-drill"))
        .arg("bench")
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr:\n{stderr}"));
    (report, stderr)
}
