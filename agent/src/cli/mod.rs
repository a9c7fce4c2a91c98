//! Operator commands: thin clients of an authority member's HTTP API (through
//! [`crate::api_client`], which the roles use too). [`commands`] is their surface (clap),
//! [`ops`] what each does, [`output`] how it prints.

pub mod commands;
pub mod keyring;
pub mod operator;
pub mod ops;
pub mod output;
pub mod tls;
