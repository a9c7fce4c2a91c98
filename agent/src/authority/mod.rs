//! The authority member: replicated desired state (openraft on redb), the leader's
//! pipeline, the xDS tier, evidence ingest, reconcilers and the query/policy API.

pub mod api;
pub mod authorize;
pub mod clock;
pub mod commit;
pub mod config;
pub mod credentials;
pub mod existence;
pub mod fields;
pub mod hub;
pub mod keyring;
pub mod kube;
pub mod leader;
pub mod member;
pub mod metrics;
pub mod node_broker;
pub mod principal;
pub mod raft;
pub mod regions;
pub mod settings;
pub mod sidecars;
pub mod staleness;
pub mod tier;
pub mod traces;
pub mod ui;
