//! The node agent role: one per host.
pub mod agent;
mod api;
pub mod api_auth;
pub mod cache;
pub mod config;
pub mod dns;
pub mod lrs;
pub mod metrics;
pub mod probe;
pub mod registration;
pub mod selfreport;
pub mod session;
pub mod shared;
mod sidecars;
pub mod view;

pub use agent::{Bound, NodeAgent};
pub use shared::ViewStatus;
