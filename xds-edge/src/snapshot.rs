//! Snapshots: the encoded resources every client of this server may see, by caller zone.
//!
//! A [`Snapshot`] is immutable and shared (`Arc`) by every stream; each resource is
//! encoded at most once, not once per client ("grpc marshaling has a cost", as
//! go-control-plane puts it): clusters when their service appears, load assignments when
//! a stream first reads that version of the view (a version no stream reads is never
//! encoded). Clusters are the same for every zone; load assignments are per caller zone
//! and carry their view's version, which comes from the region-wide counter, so a client
//! reconnecting to any server never sees a resource version go back.
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
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use envoy_types::pb::google::protobuf::Any;
use prost::Message as _;
use waymark_core::delta::Path;
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
///
/// A payload may be made lazily ([`Payload::lazy`]): the encoding is then made the first
/// time anything reads it, by whichever stream asks first, and never again. A load
/// assignment is released far more often than most of its versions are read (a busy
/// service's view moves many times between two of its subscribers' requests, and a view
/// no caller follows is never read), so encoding each release as it arrives was work
/// nobody used.
#[derive(Clone)]
pub struct Payload(Arc<Lazy>);

/// A payload's `Any`, made at most once.
struct Lazy {
    made: OnceLock<Made>,
    /// What makes it; taken by the one call that does.
    make: Mutex<Option<MakeAny>>,
}

/// What makes a lazy payload's `Any`.
type MakeAny = Box<dyn FnOnce() -> Any + Send>;

impl Lazy {
    fn force(&self) -> &Made {
        self.made.get_or_init(|| {
            let make = self
                .make
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take()
                // `get_or_init` runs one initialiser to completion before any other; only
                // a maker that panicked could have been taken without a value being made.
                .expect("a payload's maker runs once");
            Made::new(make())
        })
    }
}

/// A payload once made: the `Any` and its encoding.
#[derive(Debug)]
struct Made {
    any: Any,
    wire: Bytes,
}

impl Made {
    fn new(any: Any) -> Self {
        let wire = Bytes::from(any.encode_to_vec());
        Self { any, wire }
    }
}

impl Payload {
    /// Encode `any` once, now.
    pub fn new(any: Any) -> Self {
        Self(Arc::new(Lazy {
            made: OnceLock::from(Made::new(any)),
            make: Mutex::new(None),
        }))
    }

    /// A payload whose `Any` is made by `make` when first read, once.
    pub fn lazy(make: impl FnOnce() -> Any + Send + 'static) -> Self {
        Self(Arc::new(Lazy {
            made: OnceLock::new(),
            make: Mutex::new(Some(Box::new(make))),
        }))
    }

    /// The `Any`'s protobuf encoding (without a field tag or length).
    pub fn wire(&self) -> &Bytes {
        &self.0.force().wire
    }

    /// Whether the encoding has been made (a lazy payload nobody has read has not).
    pub fn is_made(&self) -> bool {
        self.0.made.get().is_some()
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.made.get() {
            Some(made) => f.debug_tuple("Payload").field(&made.any).finish(),
            None => f.write_str("Payload(<not yet made>)"),
        }
    }
}

/// Two payloads are equal when their encodings are (reading makes both).
impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.wire() == other.wire()
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
        &self.0.force().any
    }
}

/// Resources of one type, by name: a persistent map, so a snapshot that changes one
/// resource shares every other with the snapshot before it, and publishing one view's
/// change costs the change, not the region.
pub type Resources = imbl::OrdMap<String, Encoded>;

/// When a resource's version was released (or reached this server), and which delta
/// queue it left by. Kept beside the resources, never sent: it lets the server time each
/// client's acknowledgement of the release (`waymark_xds_propagation_seconds`). The
/// instant is data on the clock of whoever made the snapshot, as every time in this
/// crate is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// When it was released.
    pub at: Instant,
    /// The withdrawal (fast) or admission (batched) path.
    pub path: Path,
    /// How old the release already was at `at`, where this server learned that from its
    /// upstream (a node agent: the age the authority carried with the version, plus the
    /// agent's own wait from the response's arrival to `at`; see
    /// [`crate::release_age`]). A client's acknowledgement then also times the whole path:
    /// this plus its own wait. `None` where the release was made here or its age is unknown.
    pub carried: Option<std::time::Duration>,
}

/// Release stamps by resource name, then version: a load assignment has one version per
/// caller zone, each its own release.
pub type Stamps = imbl::OrdMap<String, BTreeMap<String, Released>>;

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
    /// When the load assignments' current versions were released, where known: at most
    /// one stamp per resource and version served.
    pub released: Stamps,
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
    /// encodings next time (shared with the lazy payloads of its releases).
    views: BTreeMap<ViewKey, (Version, Arc<Mutex<EdsEncoder>>)>,
}

impl SnapshotBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Take a released view; returns `false` (and changes nothing) if it is not newer than
    /// the one held, so a snapshot never goes backwards.
    pub fn handle_release(&mut self, released: &ReleasedView) -> bool {
        self.handle_release_stamped(released, None)
    }

    /// [`SnapshotBuilder::handle_release`], remembering when (and by which path) the view
    /// was released, so each client's acknowledgement of it can be timed.
    pub fn handle_release_stamped(
        &mut self,
        released: &ReleasedView,
        stamp: Option<Released>,
    ) -> bool {
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
        // Encoded when a stream first reads it (see [`Payload::lazy`]), by the view's own
        // encoder, which reuses its unchanged endpoints' encodings.
        let (before, encoder) = self
            .views
            .remove(key)
            .map_or((None, None), |(v, encoder)| (Some(v), Some(encoder)));
        let encoder = encoder.unwrap_or_default();
        self.restamp(&name, before, released.version, stamp);
        let (view, shared) = (released.clone(), Arc::clone(&encoder));
        let encoded = Encoded {
            version: released.version.to_string(),
            resource: Payload::lazy(move || Any {
                type_url: TYPE_ENDPOINT.to_owned(),
                value: shared
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .encode(&view),
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

    /// Replace the stamp of `name`'s version `before` (if any) by `stamp` for `version`:
    /// only versions served keep a stamp, so the stamps stay as many as the views.
    fn restamp(
        &mut self,
        name: &str,
        before: Option<Version>,
        version: Version,
        stamp: Option<Released>,
    ) {
        let mut versions = self.current.released.get(name).cloned().unwrap_or_default();
        if let Some(before) = before {
            versions.remove(&before.to_string());
        }
        if let Some(stamp) = stamp {
            versions.insert(version.to_string(), stamp);
        }
        if versions.is_empty() {
            self.current.released.remove(name);
        } else {
            self.current.released.insert(name.to_owned(), versions);
        }
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
        current.released.remove(&name);
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
    fn a_view_keeps_one_stamp_its_current_versions_and_loses_it_with_its_service() {
        // Goal: stamps follow the versions served, one per view, so they never pile up.
        use waymark_core::delta::Path;
        #[allow(clippy::disallowed_methods)] // the one anchor instant of this test
        let t0 = std::time::Instant::now();
        let stamp = |path| Released {
            at: t0,
            path,
            carried: None,
        };
        let mut builder = SnapshotBuilder::new();
        assert!(
            builder
                .handle_release_stamped(&released("pay", "a", 5, 2), Some(stamp(Path::Admission)))
        );
        assert!(
            builder
                .handle_release_stamped(&released("pay", "b", 6, 2), Some(stamp(Path::Admission)))
        );
        assert!(
            builder
                .handle_release_stamped(&released("pay", "a", 7, 1), Some(stamp(Path::Withdrawal)))
        );
        let versions: Vec<(String, Path)> = builder.build().released["pay"]
            .iter()
            .map(|(v, r)| (v.clone(), r.path))
            .collect();
        assert_eq!(
            versions,
            vec![
                ("6".into(), Path::Admission),
                ("7".into(), Path::Withdrawal)
            ]
        );
        // An unstamped release (a resync) drops the stamp of the version it replaces.
        assert!(builder.handle_release(&released("pay", "b", 8, 2)));
        assert_eq!(builder.build().released["pay"].len(), 1);
        assert!(builder.handle_service_removed(&"pay".parse().unwrap()));
        assert!(builder.build().released.is_empty());
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
            &before.clusters["a"].resource.0,
            &after.clusters["a"].resource.0
        ));
        assert_eq!(after.version, 9);
    }

    #[test]
    fn a_load_assignment_is_encoded_when_first_read_once_for_every_reader() {
        let mut builder = SnapshotBuilder::new();
        let zone: ZoneName = "z1".parse().unwrap();
        builder.handle_release(&released("pay", "z1", 1, 3));
        let first = builder.build();
        // Superseded before anyone read it: never encoded.
        builder.handle_release(&released("pay", "z1", 2, 4));
        let second = builder.build();
        let (old, new) = (
            &first.endpoints[&zone]["pay"].resource,
            &second.endpoints[&zone]["pay"].resource,
        );
        assert!(!old.is_made() && !new.is_made());
        assert!(
            first.clusters["pay"].resource.is_made(),
            "clusters are made at once"
        );
        // Many readers at once get one encoding, the one a fresh encoder makes.
        let wires: Vec<usize> = std::thread::scope(|s| {
            let readers: Vec<_> = (0..8)
                .map(|_| s.spawn(|| new.wire().as_ptr() as usize))
                .collect();
            readers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert!(wires.iter().all(|w| *w == wires[0]), "{wires:?}");
        assert!(new.is_made() && !old.is_made());
        // Compared decoded: metadata are protobuf maps, encoded in no fixed order.
        let fresh = EdsEncoder::new().encode(&released("pay", "z1", 2, 4));
        let decode = |b: &[u8]| ClusterLoadAssignment::decode(b).unwrap();
        assert_eq!(decode(&new.value), decode(&fresh));
        assert_eq!(new.type_url, TYPE_ENDPOINT);
        // The older version, read later, is still its own content (4 endpoints vs 3).
        let older = decode(&old.value);
        let count = |c: &ClusterLoadAssignment| -> usize {
            c.endpoints.iter().map(|l| l.lb_endpoints.len()).sum()
        };
        assert_eq!(count(&older), 3);
        assert_eq!(count(&decode(&fresh)), 4);
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
