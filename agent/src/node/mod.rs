pub mod gossip;
pub mod probe;
