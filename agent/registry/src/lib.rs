//! waymark-registry: the authority's replicated desired state, as a pure state machine.
//!
//! The Raft driver (openraft on redb, in the `waymark` binary) replicates [`state::Stamped`]
//! commands and applies them here; every replica reaches the same [`state::DesiredState`].
//! [`assignment`] computes which node agents probe which targets, and [`overrides`] the
//! override budget from the replicated audit log. No I/O, no clocks: the leader stamps
//! wall-clock time into each command as data.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
#![deny(missing_docs)]

pub mod acl;
pub mod assignment;
pub mod batch;
pub mod budget;
pub mod fold;
pub mod ingest;
pub mod machine;
pub mod overrides;
pub mod pipeline;
pub mod release;
pub mod state;
pub mod term;
