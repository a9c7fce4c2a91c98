//! The `waymark` binary's library: the node agent and authority roles, and the operator CLI.
//!
//! Shells around the pure cores: tokio, tonic, openraft, redb, axum and kube live here, and
//! every decision is delegated to `waymark-core` and `waymark-registry`.
//!
//! ```text
//! dev, cli ──► authority, node          waymark dev runs both roles; the CLI talks to an authority
//! authority, node ──► evidence, gossip, api_client, tls, metrics, listener, dial, net, logging
//! ```
//!
//! The roles never import each other: what both use sits beside them, and
//! `testkit/tests/module_graph.rs` fails on any cycle between these modules (or between
//! `authority`'s or `node`'s), and on any path from one role to the other.
#![forbid(unsafe_code)]

pub mod api_client;
pub mod authority;
pub mod cli;
pub mod dev;
pub mod dial;
pub mod evidence;
pub mod gossip;
pub mod listener;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod node;
pub mod otel;
pub mod tls;
