//! The `waymark` binary's library: the node agent and authority roles, and the operator CLI.
//!
//! Shells around the pure cores: tokio, tonic, openraft, redb, axum and kube live here, and
//! every decision is delegated to `waymark-core` and `waymark-registry`.
#![forbid(unsafe_code)]

pub mod api_client;
pub mod authority;
pub mod cli;
pub mod dev;
pub mod dial;
pub mod evidence;
pub mod gossip;
pub mod listener;
pub mod metrics;
pub mod net;
pub mod node;
pub mod tls;
