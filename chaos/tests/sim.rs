//! Tier-A simulation over many seeds. `WAYMARK_SEED=<n>` replays one run; the seed and
//! every fault parameter are printed first, so a failure names its reproduction.

use waymark_chaos::sim::{SimConfig, run};

fn config(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        services: 4,
        per_service: 9,
        zones: 3,
        seconds: 600,
        fault_permille: 4,
        noise_permille: 20,
    }
}

#[test]
fn invariants_hold_across_seeds() {
    let seeds: Vec<u64> = match std::env::var("WAYMARK_SEED") {
        Ok(s) => vec![s.parse().expect("WAYMARK_SEED is a number")],
        Err(_) => (1..=12).collect(),
    };
    for seed in seeds {
        let c = config(seed);
        println!("SEED={seed} {c:?}");
        let report = run(c);
        assert!(
            report.violations.is_empty(),
            "SEED={seed}: {} violations, first: {:?} (replay with WAYMARK_SEED={seed})",
            report.violations.len(),
            report.violations.first()
        );
        assert!(
            report.releases > 0 && report.transitions > 0,
            "SEED={seed}: the run did nothing: {report:?}"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let (a, b) = (run(config(7)), run(config(7)));
    assert_eq!(
        (a.releases, a.transitions, a.guard_alarms, a.deaths),
        (b.releases, b.transitions, b.guard_alarms, b.deaths)
    );
}

#[test]
fn safety_holds_even_when_every_sample_lies() {
    // With noise at 100% every sample lies; the safety properties never depend on evidence
    // being right, so they must still hold — and deaths (refused connections) still count.
    let c = SimConfig {
        noise_permille: 1000,
        fault_permille: 20,
        ..config(3)
    };
    let report = run(c);
    assert!(report.deaths > 0);
    assert!(
        report.violations.is_empty(),
        "{:?}",
        report.violations.first()
    );
}
