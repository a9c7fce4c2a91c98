//! waymark-resolver: in-process service resolution for callers without an Envoy sidecar.
//!
//! A [`Resolver`] subscribes to the local waymark node agent over Delta xDS with
//! `waymark_xds`'s `XdsClient` (CDS wildcard, EDS for the services asked for), translates
//! each applied `ClusterLoadAssignment` into an immutable [`Table`], persists it to a cache
//! file, and only then serves it. Reads are lock-free: an `ArcSwap<Table>` load and a hash
//! lookup (see [`bench`](mod@bench) for the figures).
//!
//! ```text
//! agent ──Delta xDS──► XdsClient ──Table::update──► cache file ──► ArcSwap<Table> ◄── resolve
//! cache file (at start) ───────────────────────────────────────────┘
//! ```
//!
//! The client contract of ADR-01, as this crate enforces it:
//! - the last-known-good view is authoritative: it is loaded from disk at start and served
//!   at once, and kept through any agent outage (its age is reported, [`Resolver::age`],
//!   and when the stream was lost, [`Resolver::lost_since`]);
//! - "resolved to empty" ([`Resolution::Empty`]) and "could not resolve"
//!   ([`Resolution::Unknown`]) are different answers, and an error never yields an empty
//!   set: a malformed update is rejected whole (NACKed, counted; the previous table stays),
//!   a removed resource keeps its previous set, a corrupt cache file is never served.
//!
//! Who it talks to (ADR-15: every control-plane door authenticated): with
//! [`ResolverConfig::tls`] set ([`ResolverTls`]) the stream is mutual TLS: the caller
//! presents its workload certificate (`spiffe://<td>/region/<r>/service/<s>/instance/<i>`)
//! and admits only a node identity of its own trust domain and region `<r>` that chains to
//! the trust bundle; refusals are counted by reason in `waymark_certs_rejected_total` on
//! [`ResolverTls::metrics`] and the files are watched for rotation. Without it the stream
//! is plain text and [`Resolver::connect`] dials a loopback address only, matching the
//! agent's `[agent.listen] local_plaintext`. See `docs/configuration.md`.
//!
//! Invariants checked by `tests/props.rs`: whatever sequence of valid and malformed updates
//! arrives, a service resolves to `Empty` only if the latest valid update holding it said it
//! had no routable endpoint.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
#![deny(missing_docs)]

pub mod bench;
pub mod cache;
mod error;
mod resolver;
mod table;
mod tls;

pub use error::ResolverError;
pub use resolver::{Resolver, ResolverConfig, ResolverStats};
pub use table::{
    Endpoint, Resolution, ServiceEndpoints, Table, TableError, service_endpoints, translate,
};
pub use tls::ResolverTls;
