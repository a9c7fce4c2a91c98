//! Operator commands: thin clients of an authority member's HTTP API.

pub mod http;
pub mod ops;
pub mod tls;
