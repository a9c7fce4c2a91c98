//! waymark's xDS edge: views in, Envoy resources out, over ADS.
//!
//! The same server runs in two places: the authority serving node agents (and sidecars
//! directly, where wanted), and each node agent serving its host's Envoy from the
//! last-known-good cache. Pure parts and shells are kept apart:
//!
//! - [`translate`] (pure): views → `Cluster` / `ClusterLoadAssignment`, with Envoy's own
//!   panic threshold, ejection cap and every other outlier-detection field set explicitly
//!   (see the module for why);
//! - [`snapshot`] (pure): released views → an immutable, consistent, encoded-once snapshot;
//! - [`protocol`] (pure): per-stream, per-type Delta and SotW state machines (subscriptions,
//!   nonces, ACK/NACK, what to send next);
//! - [`admission`] (pure): reconnection admission, 5% of the population per 10 s;
//! - [`release_age`] (pure): the age of a release, carried to a client in a resource's
//!   metadata so it can time the whole propagation path;
//! - [`sync`] (pure): per-client sync state for `proxy-status`;
//! - [`server`] (shell): the ADS server driving all of the above, on HTTP/2 directly or as a
//!   tonic service.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod admission;
pub mod client;
pub mod lrs;
pub mod protocol;
pub mod release_age;
pub mod server;
pub mod snapshot;
pub mod sync;
pub mod translate;

pub use server::{Keepalive, Publisher, ServerConfig, XdsServer};
pub use snapshot::{Snapshot, SnapshotBuilder};
