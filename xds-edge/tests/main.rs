//! The crate's integration tests, one module per file, linked into one binary.
//! Run one file's tests with `cargo nextest run --workspace -E 'test(/^envoy_ads::/)'`.

// Test code: an unwrap that fails is a failing test, with the error in its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(clippy::disallowed_methods)] // its waits poll real processes by the wall clock
mod support;

mod ads_server;
mod client_loopback;
mod envoy_ads;
mod envoy_harness;
mod envoy_mtls;
mod grpc_js_xds;
mod grpc_proxyless;
mod lrs_loopback;
mod pure_fence;
