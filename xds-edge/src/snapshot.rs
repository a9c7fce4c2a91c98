//! Snapshots: the encoded resources every client of this server may see, by caller zone.
//!
//! A [`Snapshot`] is immutable and shared (`Arc`) by every stream; each resource is
//! encoded once, when its view changes, not once per client ("grpc marshaling has a cost",
//! as go-control-plane puts it). Clusters are the same for every zone; load assignments
//! are per caller zone and carry their view's version, which comes from the region-wide
//! counter, so a client reconnecting to any server never sees a resource version go back.
//!
//! Each resource also keeps its `Any` as wire bytes ([`Payload`]), so a response is
//! written as a few bytes of its own (nonce, versions, names) followed by encodings
//! every stream shares: a withdrawal sent to 60,000 subscribers is encoded once, and no
//! stream copies it.
//!
//! [`SnapshotBuilder`] is the pure part the publisher drives: releases in, snapshots out.
//! It checks the snapshot's consistency before it is published: every load assignment is
//! named by a cluster.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::google::protobuf::Any;
use prost::Message as _;
use waymark_core::model::{ServiceName, ZoneName};
use waymark_core::view::{ReleasedView, Version, ViewKey};

use crate::translate::{
    EdsEncoder, TYPE_CLUSTER, TYPE_ENDPOINT, TYPE_LISTENER, TYPE_ROUTE, api_listener, cluster,
    route_configuration,
};

/// One encoded resource and its version string.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    /// The resource's version (opaque to clients; monotonic for load assignments).
    pub version: String,
    /// The encoded resource.
    pub resource: Payload,
}

/// A resource as an `Any`, with that `Any`'s protobuf encoding made once and shared (by
/// reference count) by every response that carries it. Reads as the `Any` it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    any: Arc<Any>,
    wire: Bytes,
}

impl Payload {
    /// Encode `any` once.
    pub fn new(any: Any) -> Self {
        let wire = Bytes::from(any.encode_to_vec());
        Self {
            any: Arc::new(any),
            wire,
        }
    }

    /// The `Any`'s protobuf encoding (without a field tag or length).
    pub fn wire(&self) -> &Bytes {
        &self.wire
    }
}

impl From<Any> for Payload {
    fn from(any: Any) -> Self {
        Self::new(any)
    }
}

impl Deref for Payload {
    type Target = Any;

    fn deref(&self) -> &Any {
        &self.any
    }
}

/// Resources of one type, by name.
pub type Resources = BTreeMap<String, Encoded>;

/// Everything this server serves, at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Greatest view version in the snapshot (the SotW `version_info`).
    pub version: u64,
    /// CDS: one cluster per service.
    pub clusters: Resources,
    /// EDS: per caller zone, one load assignment per service.
    pub endpoints: BTreeMap<ZoneName, Resources>,
    /// LDS: one API listener per service, for proxyless gRPC clients.
    pub listeners: Resources,
    /// RDS: one route configuration per service, for proxyless gRPC clients.
    pub routes: Resources,
}

impl Snapshot {
    /// The resources of `type_url` a client in `zone` sees; `None` for a type we do not
    /// serve. A zone with no views yet sees none (a subscription to it stays open).
    pub fn resources(&self, type_url: &str, zone: Option<&ZoneName>) -> Option<&Resources> {
        static EMPTY: std::sync::OnceLock<Resources> = std::sync::OnceLock::new();
        match type_url {
            TYPE_CLUSTER => Some(&self.clusters),
            TYPE_LISTENER => Some(&self.listeners),
            TYPE_ROUTE => Some(&self.routes),
            TYPE_ENDPOINT => {
                // A server with views for one zone only (a node agent serving its host)
                // serves them to every caller, whatever zone it declared, or none.
                let only = (self.endpoints.len() == 1)
                    .then(|| self.endpoints.values().next())
                    .flatten();
                let zone = zone.or_else(|| self.endpoints.keys().next());
                Some(
                    zone.and_then(|z| self.endpoints.get(z))
                        .or(only)
                        .unwrap_or_else(|| EMPTY.get_or_init(BTreeMap::new)),
                )
            }
            _ => None,
        }
    }

    /// Every load assignment is named by a cluster (go-control-plane's `Consistent()`).
    pub fn is_consistent(&self) -> bool {
        self.endpoints
            .values()
            .all(|r| r.keys().all(|name| self.clusters.contains_key(name)))
    }
}

/// Builds snapshots from released views. Pure.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    clusters: BTreeMap<ServiceName, Encoded>,
    listeners: BTreeMap<ServiceName, Encoded>,
    routes: BTreeMap<ServiceName, Encoded>,
    /// Per view: its version, its encoded assignment, and the encoder that reuses its
    /// unchanged endpoints' encodings next time.
    views: BTreeMap<ViewKey, (Version, Encoded, EdsEncoder)>,
    /// The highest version ever held, so a snapshot's version never goes back when the
    /// view that carried it is removed with its service.
    high_water: u64,
}

impl SnapshotBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Take a released view; returns `false` (and changes nothing) if it is not newer than
    /// the one held, so a snapshot never goes backwards.
    pub fn handle_release(&mut self, released: &ReleasedView) -> bool {
        let key = &released.view.key;
        if self
            .views
            .get(key)
            .is_some_and(|(v, _, _)| *v >= released.version)
        {
            return false;
        }
        if !self.clusters.contains_key(&key.service) {
            let s = &key.service;
            self.clusters
                .insert(s.clone(), encode(TYPE_CLUSTER, &cluster(s)));
            self.listeners
                .insert(s.clone(), encode(TYPE_LISTENER, &api_listener(s)));
            self.routes
                .insert(s.clone(), encode(TYPE_ROUTE, &route_configuration(s)));
        }
        let mut encoder = self
            .views
            .remove(key)
            .map(|(_, _, encoder)| encoder)
            .unwrap_or_default();
        let encoded = Encoded {
            version: released.version.to_string(),
            resource: Payload::new(Any {
                type_url: TYPE_ENDPOINT.to_owned(),
                value: encoder.encode(released),
            }),
        };
        self.views
            .insert(key.clone(), (released.version, encoded, encoder));
        self.high_water = self.high_water.max(released.version.0);
        true
    }

    /// Forget a service entirely (its cluster and every zone's assignment); returns
    /// whether it was held.
    pub fn handle_service_removed(&mut self, service: &ServiceName) -> bool {
        self.listeners.remove(service);
        self.routes.remove(service);
        self.views.retain(|k, _| &k.service != service);
        self.clusters.remove(service).is_some()
    }

    /// The services held, in name order.
    pub fn services(&self) -> impl Iterator<Item = &ServiceName> {
        self.clusters.keys()
    }

    /// The snapshot of everything held.
    pub fn build(&self) -> Snapshot {
        let by_name = |m: &BTreeMap<ServiceName, Encoded>| {
            m.iter().map(|(s, e)| (s.to_string(), e.clone())).collect()
        };
        let (clusters, listeners, routes) = (
            by_name(&self.clusters),
            by_name(&self.listeners),
            by_name(&self.routes),
        );
        let mut endpoints: BTreeMap<ZoneName, Resources> = BTreeMap::new();
        let mut version = self.high_water;
        for (key, (v, e, _)) in &self.views {
            version = version.max(v.0);
            endpoints
                .entry(key.zone.clone())
                .or_default()
                .insert(key.service.to_string(), e.clone());
        }
        let snapshot = Snapshot {
            version,
            clusters,
            endpoints,
            listeners,
            routes,
        };
        debug_assert!(
            snapshot.is_consistent(),
            "every load assignment has its cluster"
        );
        snapshot
    }
}

/// Encode once, versioned by content (these resources carry no view version).
fn encode<M: prost::Message>(type_url: &str, message: &M) -> Encoded {
    let bytes = message.encode_to_vec();
    let version = format!("{:016x}", fnv1a(&bytes));
    Encoded {
        version,
        resource: Payload::new(Any {
            type_url: type_url.to_owned(),
            value: bytes,
        }),
    }
}

/// FNV-1a: a stable content hash for resource versions (std's hasher is not stable
/// across releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    waymark_core::hash::fnv1a(bytes)
}
