//! The agent's integration tests, one module per file, linked into one binary.
//! Run one file's tests with `cargo nextest run --workspace -E 'test(/^node_envoy::/)'`.

// Test code: an unwrap that fails is a failing test, with the error in its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(clippy::disallowed_methods)] // its waits poll real processes by the wall clock
mod common;
#[path = "../../xds-edge/tests/support/mod.rs"]
#[allow(clippy::disallowed_methods)]
mod support;

mod api_auth;
mod authority_api;
mod authority_cluster;
mod authority_ingest;
mod authority_kube;
mod authority_operator;
mod authority_prevote;
mod authority_queries;
mod authority_recovery;
mod certs_cli;
mod cli_coverage;
mod contract_guide;
mod deploy_configs;
mod deploy_manifests;
mod deploy_monitoring;
mod dev_grpc_js;
mod dev_newcomer;
mod dev_region;
mod dns_dig;
mod dns_limits;
mod federation_quic;
mod federation_regions;
mod gossip_keyring;
mod gossip_udp;
mod hostile_inputs;
mod kube_reconcile;
mod listener_limits;
mod listener_refusals;
mod logging;
mod lrs_forward;
mod node_api_auth;
mod node_envoy;
mod node_lkg_crash;
mod node_registration;
mod node_selfreport;
mod node_upstream_region;
mod otel_traces;
mod override_budget;
mod probe_policy;
mod probe_targets;
mod prometheus_sd;
mod propagation_metrics;
mod ui;
