//! waymark-chaos: the drills, load generation, deterministic simulation and benchmarks.
//!
//! It holds the benchmarks of the pure core (`waymark-drill bench NAME`) and the drills that
//! re-run the prototype's experiments against real processes and real Envoy
//! (`waymark-drill run NAME`, see `chaos/DRILLS.md`). Every benchmark and drill prints, as
//! its last line, one JSON object with its figures (and a drill its verdict).
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod bench;
pub mod drill;
pub mod estate;
pub mod failover;
pub mod fanout;
pub mod harness;
pub mod ingest;
pub mod rng;
pub mod sim;
pub mod traffic;
pub mod writes;
