//! `waymark-drill bench fanout`, smoke-sized: the real ADS server in a process of its own
//! and the plain HTTP/2 limit after it, the same multiplexed gRPC subscribers on both. The
//! full-size run is a separate command (docs/benchmarks.md); this only proves the bench
//! measures what it says — every subscriber received every withdrawal on both servers, and
//! the server's memory and CPU are measured in its own process — never how fast.

#[test]
fn the_fanout_bench_reaches_every_subscriber_of_both_servers_over_shared_connections() {
    let args = [
        "fanout",
        "--subscriptions",
        "90",
        "--streams-per-connection",
        "20",
        "--withdrawals",
        "4",
        "--endpoints",
        "10",
        "--repeats",
        "1",
    ]
    .map(std::ffi::OsStr::new);
    let (r, stderr) = crate::common::bench_report(&args);
    assert_eq!(r["bench"], "fanout");
    // 90 streams at 20 a connection: five connections, the last carrying 10.
    assert_eq!(
        (r["subscriptions"].as_u64(), r["connections"].as_u64()),
        (Some(90), Some(5))
    );
    let run = &r["runs"][0];
    // Both phases finished (the bench fails unless every subscriber received every
    // withdrawal), and each server's CPU was measured in its own process.
    assert!(run["server_cpu_s"].as_f64().unwrap() >= 0.0, "{r:#}");
    assert!(run["limit_server_cpu_s"].as_f64().unwrap() >= 0.0, "{r:#}");
    assert!(
        run["p50_ms"].as_f64().unwrap() <= run["p99_ms"].as_f64().unwrap(),
        "{r:#}"
    );
    // One time per withdrawal, in order, and the worst of them is the run's maximum.
    let times: Vec<u64> = run["completions_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(times.len(), 4, "{r:#}");
    let worst = *times.iter().max().unwrap() as f64;
    assert!(
        (worst - run["max_ms"].as_f64().unwrap()).abs() < 1.0,
        "{r:#}"
    );
    assert!(
        run["messages_per_cpu_second"].as_f64().unwrap() > 0.0,
        "{r:#}"
    );
    assert!(
        run["limit_messages_per_cpu_second"].as_f64().unwrap() > 0.0,
        "{r:#}"
    );
    assert!(
        !stderr.contains("fanout subscriber"),
        "a subscriber failed:\n{stderr}"
    );
}
