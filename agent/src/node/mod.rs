pub mod config;
pub mod gossip;
pub mod probe;
