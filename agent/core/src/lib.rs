//! waymark-core: the pure heart of waymark.
//!
//! Everything waymark promises is decided here, as plain state machines with time passed
//! in and outputs returned as values: no clocks, sockets, files, threads or runtimes. The
//! shells (`waymark` authority and node agent, the drills, the simulation) drive them.
//!
//! ```text
//! samples ─► Evaluator ─► eligibility ─► ViewAssembler ─► target views ─► DeltaQueues ─► released views
//!                  │                          │                                 │
//!                  └─ audit records           └─ guard alarms, incidents        └─ shed episodes
//! ```
//!
//! - [`model`], [`contract`], [`units`]: the vocabulary and its validation;
//! - [`evaluator`]: evidence → eligibility (ADR-04…09, 12);
//! - [`assembler`]: eligibility → per-zone views with tiers and the fraction guard
//!   (ADR-08, ADR-13, ADR-14);
//! - [`delta`]: target views → released, versioned views, withdrawals first (ADR-11);
//! - [`view`]: the view type, its diff and its application;
//! - [`audit`]: transition records and `explain`.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
#![deny(missing_docs)]

pub mod assembler;
pub mod audit;
pub mod backoff;
pub mod bounds;
pub mod contract;
pub mod defaults;
pub mod delta;
pub mod duration_str;
pub mod eligibility;
pub mod evaluator;
pub mod hash;
pub mod model;
pub mod schema;
pub mod units;
pub mod view;

#[cfg(test)]
pub(crate) mod testkit;
