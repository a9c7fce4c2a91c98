//! Operator commands: thin clients of an authority member's HTTP API (through
//! [`crate::api_client`], which the roles use too).

pub mod ops;
pub mod tls;
