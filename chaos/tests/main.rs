//! The drills', benchmarks' and simulations' integration tests, one module per file, linked
//! into one binary. Run one file's tests with `cargo nextest run --workspace -E 'test(/^sim_region::/)'`.

// Test code: an unwrap that fails is a failing test, with the error in its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod bench_failover;
mod bench_fanout;
mod bench_ingest;
mod bench_writes;
mod drill_bad_health_check;
mod drill_hard_vs_grey;
mod drill_leader_churn;
mod drill_outage;
mod drill_prober_partition;
mod drill_region_partition;
mod drill_xds_restart;
mod drill_zone_evacuation;
mod sim;
mod sim_region;
