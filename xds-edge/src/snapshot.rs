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

/// Resources of one type, by name: a persistent map, so a snapshot that changes one
/// resource shares every other with the snapshot before it, and publishing one view's
/// change costs the change, not the region.
pub type Resources = imbl::OrdMap<String, Encoded>;

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
                        .unwrap_or_else(|| EMPTY.get_or_init(Resources::new)),
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
///
/// It keeps the snapshot it would publish up to date as releases arrive, in persistent
/// maps, so [`SnapshotBuilder::build`] is a clone that shares everything and costs the
/// same whatever the region's size.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    /// The snapshot of everything held; its `version` is the highest version ever held,
    /// so it never goes back when the view that carried it is removed with its service.
    current: Snapshot,
    /// The services held.
    services: std::collections::BTreeSet<ServiceName>,
    /// Per view: its version, and the encoder that reuses its unchanged endpoints'
    /// encodings next time.
    views: BTreeMap<ViewKey, (Version, EdsEncoder)>,
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
            .is_some_and(|(v, _)| *v >= released.version)
        {
            return false;
        }
        let name = key.service.to_string();
        if self.services.insert(key.service.clone()) {
            let s = &key.service;
            let current = &mut self.current;
            current
                .clusters
                .insert(name.clone(), encode(TYPE_CLUSTER, &cluster(s)));
            current
                .listeners
                .insert(name.clone(), encode(TYPE_LISTENER, &api_listener(s)));
            current
                .routes
                .insert(name.clone(), encode(TYPE_ROUTE, &route_configuration(s)));
        }
        let mut encoder = self
            .views
            .remove(key)
            .map(|(_, encoder)| encoder)
            .unwrap_or_default();
        let encoded = Encoded {
            version: released.version.to_string(),
            resource: Payload::new(Any {
                type_url: TYPE_ENDPOINT.to_owned(),
                value: encoder.encode(released),
            }),
        };
        self.current
            .endpoints
            .entry(key.zone.clone())
            .or_default()
            .insert(name, encoded);
        self.views.insert(key.clone(), (released.version, encoder));
        self.current.version = self.current.version.max(released.version.0);
        true
    }

    /// Forget a service entirely (its cluster and every zone's assignment); returns
    /// whether it was held.
    pub fn handle_service_removed(&mut self, service: &ServiceName) -> bool {
        if !self.services.remove(service) {
            return false;
        }
        let name = service.to_string();
        let current = &mut self.current;
        current.clusters.remove(&name);
        current.listeners.remove(&name);
        current.routes.remove(&name);
        for zone in current.endpoints.values_mut() {
            zone.remove(&name);
        }
        current.endpoints.retain(|_, zone| !zone.is_empty());
        self.views.retain(|k, _| &k.service != service);
        true
    }

    /// The services held, in name order.
    pub fn services(&self) -> impl Iterator<Item = &ServiceName> {
        self.services.iter()
    }

    /// The snapshot of everything held.
    pub fn build(&self) -> Snapshot {
        debug_assert!(
            self.current.is_consistent(),
            "every load assignment has its cluster"
        );
        self.current.clone()
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use proptest::prelude::*;
    use waymark_core::view::View;

    use super::*;

    fn released(service: &str, zone: &str, version: u64, endpoints: u8) -> ReleasedView {
        let mut view = View::empty(ViewKey {
            service: service.parse().unwrap(),
            zone: zone.parse().unwrap(),
        });
        for n in 0..endpoints {
            let e = waymark_core::view::ViewEndpoint::eligible(
                format!("{service}-{n}").parse().unwrap(),
                waymark_core::model::Address {
                    ip: std::net::Ipv4Addr::new(10, 0, 0, n).into(),
                    port: 80,
                },
                "r".parse().unwrap(),
                zone.parse().unwrap(),
            );
            view.endpoints.insert(e.instance.clone(), e);
        }
        ReleasedView {
            version: Version(version),
            view,
        }
    }

    /// The snapshot a builder that saw only `views` (the newest of each, every service
    /// present) would build: the reference an incrementally kept snapshot must equal.
    fn from_scratch(views: &BTreeMap<ViewKey, ReleasedView>) -> Snapshot {
        let mut builder = SnapshotBuilder::new();
        for v in views.values() {
            assert!(builder.handle_release(v));
        }
        builder.build()
    }

    /// A snapshot's content with each load assignment decoded: its metadata are protobuf
    /// maps, whose encoded order is not fixed.
    #[allow(clippy::type_complexity)]
    fn normal(
        s: &Snapshot,
    ) -> (
        Resources,
        Resources,
        Resources,
        Vec<(ZoneName, String, String, ClusterLoadAssignment)>,
    ) {
        let endpoints = s
            .endpoints
            .iter()
            .flat_map(|(zone, r)| {
                r.iter().map(move |(name, e)| {
                    let cla = ClusterLoadAssignment::decode(e.resource.value.as_slice()).unwrap();
                    (zone.clone(), name.clone(), e.version.clone(), cla)
                })
            })
            .collect();
        (
            s.clusters.clone(),
            s.listeners.clone(),
            s.routes.clone(),
            endpoints,
        )
    }

    #[test]
    fn a_release_not_newer_than_the_one_held_changes_nothing() {
        let mut builder = SnapshotBuilder::new();
        assert!(builder.handle_release(&released("pay", "a", 5, 2)));
        let before = builder.build();
        assert!(!builder.handle_release(&released("pay", "a", 5, 3)));
        assert!(!builder.handle_release(&released("pay", "a", 4, 1)));
        assert_eq!(builder.build(), before);
        assert!(builder.handle_release(&released("pay", "a", 6, 1)));
        assert_eq!(builder.build().version, 6);
    }

    #[test]
    fn a_build_shares_every_resource_the_release_did_not_touch() {
        let mut builder = SnapshotBuilder::new();
        for (i, service) in ["a", "b", "c"].iter().enumerate() {
            for zone in ["z1", "z2"] {
                builder.handle_release(&released(service, zone, i as u64 + 1, 3));
            }
        }
        let before = builder.build();
        builder.handle_release(&released("b", "z1", 9, 2));
        let after = builder.build();
        for zone in ["z1", "z2"] {
            let zone: ZoneName = zone.parse().unwrap();
            for service in ["a", "b", "c"] {
                let (old, new) = (
                    &before.endpoints[&zone][service],
                    &after.endpoints[&zone][service],
                );
                let touched = service == "b" && zone.as_str() == "z1";
                // The same encoding, not an equal copy: shared by reference count.
                let shared = old.resource.wire().as_ptr() == new.resource.wire().as_ptr();
                assert_eq!(shared, !touched, "{zone}/{service}");
            }
        }
        assert!(Arc::ptr_eq(
            &before.clusters["a"].resource.any,
            &after.clusters["a"].resource.any
        ));
        assert_eq!(after.version, 9);
    }

    #[test]
    fn removing_a_service_keeps_the_version_and_drops_an_emptied_zone() {
        let mut builder = SnapshotBuilder::new();
        builder.handle_release(&released("a", "z1", 3, 1));
        builder.handle_release(&released("b", "z2", 7, 1));
        assert!(builder.handle_service_removed(&"b".parse().unwrap()));
        assert!(!builder.handle_service_removed(&"b".parse().unwrap()));
        let s = builder.build();
        assert_eq!(s.version, 7, "a snapshot's version never goes back");
        assert_eq!(s.endpoints.len(), 1, "{:?}", s.endpoints.keys());
        assert!(s.clusters.get("b").is_none() && s.listeners.get("b").is_none());
        assert!(s.is_consistent());
        // A released view of a removed service comes back whole, at any newer version.
        assert!(builder.handle_release(&released("b", "z2", 8, 1)));
        assert!(builder.build().clusters.contains_key("b"));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Release {
            service: u8,
            zone: u8,
            bump: u64,
            endpoints: u8,
        },
        Remove {
            service: u8,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..4, 0u8..3, 0u64..3, 0u8..4).prop_map(|(service, zone, bump, endpoints)| {
                Op::Release { service, zone, bump, endpoints }
            }),
            1 => (0u8..4).prop_map(|service| Op::Remove { service }),
        ]
    }

    proptest! {
        /// Kept incrementally, the snapshot is the one built from scratch from the views
        /// that survive, and its version is the highest ever held.
        #[test]
        fn the_kept_snapshot_is_the_one_built_from_scratch(ops in prop::collection::vec(op(), 0..40)) {
            let mut builder = SnapshotBuilder::new();
            let mut live: BTreeMap<ViewKey, ReleasedView> = BTreeMap::new();
            let (mut clock, mut high) = (0u64, 0u64);
            for op in ops {
                match op {
                    Op::Release { service, zone, bump, endpoints } => {
                        // bump 0 repeats the last version: refused, as an older one is.
                        clock += bump;
                        let v = released(&format!("s{service}"), &format!("z{zone}"), clock, endpoints);
                        let newer = live.get(&v.view.key).is_none_or(|held| held.version < v.version);
                        prop_assert_eq!(builder.handle_release(&v), newer);
                        if newer {
                            high = high.max(clock);
                            live.insert(v.view.key.clone(), v);
                        }
                    }
                    Op::Remove { service } => {
                        let name: ServiceName = format!("s{service}").parse().unwrap();
                        let held = live.keys().any(|k| k.service == name);
                        prop_assert_eq!(builder.handle_service_removed(&name), held);
                        live.retain(|k, _| k.service != name);
                    }
                }
                let kept = builder.build();
                let reference = from_scratch(&live);
                prop_assert!(kept.is_consistent());
                prop_assert_eq!(kept.version, high);
                prop_assert_eq!(normal(&kept), normal(&reference));
            }
        }
    }
}
