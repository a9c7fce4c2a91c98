//! Print a resolution benchmark report as JSON:
//! `cargo run --release -p waymark-resolver --example bench_resolve -- [threads] [updates_per_sec] [secs]`.

use std::time::Duration;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap_or_else(|_| panic!("not a number: {a}")))
        .collect();
    let threads = args.first().copied().unwrap_or(2) as usize;
    let rate = args.get(1).copied().unwrap_or(100);
    let secs = args.get(2).copied().unwrap_or(4);
    let report = waymark_resolver::bench::run(threads, rate, Duration::from_secs(secs));
    println!(
        "{}",
        serde_json::to_string_pretty(&report).expect("a report always serialises")
    );
}
