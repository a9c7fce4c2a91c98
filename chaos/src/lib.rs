//! waymark-chaos: the drills, load generation, deterministic simulation and benchmarks.
//!
//! Today it holds the benchmarks of the pure core (`waymark-drill bench NAME`); the drills
//! that re-run the prototype's experiments against real processes and real Envoy land
//! with their issue. Every benchmark measures a limit in the same run and prints, as its
//! last line, one JSON object with its figures and the ratio to that limit.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod bench;
pub mod fanout;
pub mod rng;
pub mod sim;
