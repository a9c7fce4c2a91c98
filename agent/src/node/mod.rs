//! The node agent role: one per host.
pub mod config;
pub mod dns;
pub mod gossip;
pub mod lrs;
pub mod probe;
