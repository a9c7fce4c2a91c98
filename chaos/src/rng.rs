//! The seeded generator benchmarks and simulations use, so their streams are identical run
//! to run: the workspace's one SplitMix64, from the core.

pub use waymark_core::hash::SplitMix64;
