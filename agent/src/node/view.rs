//! The node agent's served view: what the upstream authority sent, passed through the
//! client-side bounds (ADR-01), ready for the host's sidecars. Pure: time is passed in.
//!
//! ```text
//! upstream Applied ──► LocalView::apply ──► bounds per service (never empty, shrink cap)
//!                                     └──► clusters: ejection cap, LRS to this agent
//! LocalView::handle_timeout ──► held-back removals released as the window allows
//! LocalView::snapshot ──► xds-edge Snapshot for the local server, DNS, LRS address book
//! ```
//!
//! A load assignment the bounds changed is served under a version of its own: the greater
//! of the previous served version plus one and the upstream version, so a sidecar never
//! sees a version go backwards while the agent runs. Endpoints are keyed by `ip:port`; an
//! endpoint the authority withdrew but the shrink cap still holds keeps its last served
//! form (locality, weight, health).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{
    ConfigSource, SelfConfigSource, config_source::ConfigSourceSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use prost::Message as _;
use waymark_core::bounds::{BoundsConfig, ClientBounds};
use waymark_core::delta::Path;
use waymark_core::model::ZoneName;
use waymark_xds::client::AppliedType;
use waymark_xds::snapshot::{Encoded, Payload, Released, Resources, Snapshot, Stamps};
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT, TYPE_LISTENER, TYPE_ROUTE, to_any};

/// Resources by type URL, then name: (version, resource). The upstream's applied state, or
/// what was loaded from the last-known-good cache.
pub type Upstream = BTreeMap<String, Arc<AppliedType>>;

/// The served state of one service's load assignment.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceState {
    /// The upstream's version of its assignment.
    pub upstream_version: String,
    /// The version served to sidecars.
    pub served_version: u64,
    /// Endpoints served.
    pub endpoints: usize,
    /// Withdrawn upstream, still served (shrink cap).
    pub held_back: usize,
    /// The upstream asked for an empty set; the previous set is kept.
    pub refused_empty: bool,
    /// The upstream's assignment could not be decoded; the previous one is kept.
    pub undecodable: bool,
}

/// What one change did, for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Services whose served assignment changed.
    pub services: BTreeSet<String>,
    /// Resources of other types that changed.
    pub other: usize,
    /// Services whose upstream assignment was refused whole (empty or undecodable).
    pub refused: BTreeSet<String>,
}

impl Changes {
    /// Nothing served changed.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.other == 0
    }
}

/// One served load assignment and how to rebuild held-back endpoints.
#[derive(Debug, Clone)]
struct Served {
    state: ServiceState,
    assignment: ClusterLoadAssignment,
    encoded: Payload,
    /// Every endpoint served, by key: its locality group (without endpoints) and itself.
    endpoints: BTreeMap<String, (LocalityLbEndpoints, LbEndpoint)>,
    /// When this version reached the agent and which path it is (a version that takes
    /// a served endpoint away is a withdrawal): what the sidecars' ACKs are timed from.
    released: Released,
}

/// The agent's view for its host. See the module documentation.
#[derive(Debug)]
pub struct LocalView {
    zone: ZoneName,
    max_ejection_percent: u32,
    bounds: ClientBounds<String>,
    upstream: Upstream,
    served: BTreeMap<String, Served>,
    clusters: Resources,
    listeners: Resources,
    routes: Resources,
}

impl LocalView {
    /// An empty view for sidecars in `zone`.
    pub fn new(zone: ZoneName, bounds: BoundsConfig, max_ejection_percent: u32) -> Self {
        Self {
            zone,
            max_ejection_percent,
            bounds: ClientBounds::new(bounds),
            upstream: Upstream::new(),
            served: BTreeMap::new(),
            clusters: Resources::new(),
            listeners: Resources::new(),
            routes: Resources::new(),
        }
    }

    /// Start from what the cache held: served as is (the bounds start from it), under
    /// versions above `floor` — the highest version served before the restart — so a
    /// sidecar that reconnects holding a version the bounds made up is still sent the
    /// restored view rather than judged ahead of it.
    pub fn restore(&mut self, cached: Upstream, floor: u64, now: Instant) -> Changes {
        let mut changes = self.apply(&cached, now);
        for (service, served) in &mut self.served {
            self.bounds
                .restore(service, served.endpoints.keys().cloned().collect());
            if floor > 0 {
                served.state.served_version = served.state.served_version.max(floor + 1);
            }
        }
        changes.refused.clear();
        changes
    }

    /// Take the upstream's applied state at `now`.
    pub fn apply(&mut self, upstream: &Upstream, now: Instant) -> Changes {
        let mut changes = Changes::default();
        for (type_url, target) in [
            (TYPE_CLUSTER, &mut self.clusters),
            (TYPE_LISTENER, &mut self.listeners),
            (TYPE_ROUTE, &mut self.routes),
        ] {
            let fresh = upstream.get(type_url).map(|t| &t.resources);
            let cap = self.max_ejection_percent;
            changes.other += sync_plain(target, fresh, |any| {
                if type_url == TYPE_CLUSTER {
                    cap_cluster(any, cap)
                } else {
                    any.clone()
                }
            });
        }
        // Shared, not copied: the payloads are only read here.
        let fresh = upstream.get(TYPE_ENDPOINT).cloned().unwrap_or_default();
        let held = self
            .upstream
            .get(TYPE_ENDPOINT)
            .cloned()
            .unwrap_or_default();
        let (fresh_eds, held_eds) = (&fresh.resources, &held.resources);
        self.upstream = upstream.clone();
        for (name, (version, any)) in fresh_eds {
            if held_eds.get(name).is_some_and(|(v, _)| v == version)
                && self.served.contains_key(name)
            {
                continue;
            }
            self.offer(name, version, any, now, &mut changes);
        }
        // An assignment the upstream removed: gone with its cluster, kept (and declared)
        // while the cluster stays — an error never empties a service.
        let gone: Vec<String> = self
            .served
            .keys()
            .filter(|n| !fresh_eds.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            if self.clusters.contains_key(&name) {
                if let Some(s) = self.served.get_mut(&name)
                    && !s.state.refused_empty
                {
                    s.state.refused_empty = true;
                    changes.refused.insert(name);
                }
            } else {
                self.served.remove(&name);
                self.bounds.remove(&name);
                changes.services.insert(name);
            }
        }
        changes
    }

    /// When held-back removals may next be released.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.bounds.poll_timeout()
    }

    /// Release what the shrink window allows at `now`.
    pub fn handle_timeout(&mut self, now: Instant) -> Changes {
        let mut changes = Changes::default();
        for (service, bounded) in self.bounds.handle_timeout(now) {
            let Some(fresh) = self
                .upstream
                .get(TYPE_ENDPOINT)
                .and_then(|t| t.resources.get(&service))
                .and_then(|(_, any)| ClusterLoadAssignment::decode(any.value.as_slice()).ok())
            else {
                continue;
            };
            self.serve(&service, &fresh, bounded.set, bounded.held_back.len(), now);
            changes.services.insert(service);
        }
        changes
    }

    /// The snapshot to serve: every cluster, listener and route, and the bounded
    /// assignments under this agent's zone.
    pub fn snapshot(&self) -> Snapshot {
        let endpoints: Resources = self
            .served
            .iter()
            .map(|(name, s)| {
                let enc = Encoded {
                    version: s.state.served_version.to_string(),
                    resource: s.encoded.clone(),
                };
                (name.clone(), enc)
            })
            .collect();
        let released: Stamps = self
            .served
            .iter()
            .map(|(name, s)| {
                let version = s.state.served_version.to_string();
                (name.clone(), BTreeMap::from([(version, s.released)]))
            })
            .collect();
        Snapshot {
            version: self.max_served_version(),
            clusters: self.clusters.clone(),
            endpoints: [(self.zone.clone(), endpoints)].into_iter().collect(),
            listeners: self.listeners.clone(),
            routes: self.routes.clone(),
            released,
        }
    }

    /// The highest version served.
    pub fn max_served_version(&self) -> u64 {
        self.served
            .values()
            .map(|s| s.state.served_version)
            .max()
            .unwrap_or(0)
    }

    /// The served assignments (for DNS and the LRS address book).
    pub fn assignments(&self) -> impl Iterator<Item = &ClusterLoadAssignment> {
        self.served.values().map(|s| &s.assignment)
    }

    /// Per service: what is served and why.
    pub fn states(&self) -> impl Iterator<Item = (&String, &ServiceState)> {
        self.served.iter().map(|(n, s)| (n, &s.state))
    }

    fn offer(&mut self, name: &str, version: &str, any: &Any, now: Instant, changes: &mut Changes) {
        let fresh = match ClusterLoadAssignment::decode(any.value.as_slice()) {
            Ok(cla) => cla,
            Err(e) => {
                tracing::error!(service = %name, upstream_version = %version, error = %e, "undecodable load assignment; keeping the previous one");
                if let Some(s) = self.served.get_mut(name) {
                    s.state.undecodable = true;
                }
                changes.refused.insert(name.to_owned());
                return;
            }
        };
        let wanted: BTreeSet<String> = endpoints(&fresh).map(|(k, _, _)| k).collect();
        let bounded = self.bounds.offer(name, now, wanted);
        if bounded.refused_empty {
            tracing::warn!(service = %name, upstream_version = %version, served = bounded.set.len(), "upstream view would empty the service; keeping the previous set");
            if let Some(s) = self.served.get_mut(name) {
                s.state.refused_empty = true;
                s.state.upstream_version = version.to_owned();
            }
            changes.refused.insert(name.to_owned());
            return;
        }
        if !bounded.held_back.is_empty() {
            tracing::info!(service = %name, upstream_version = %version, held_back = bounded.held_back.len(), "shrink cap holds back withdrawals");
        }
        if self.serve(name, &fresh, bounded.set, bounded.held_back.len(), now) {
            changes.services.insert(name.to_owned());
        }
    }

    /// Serve `set` for `name`: the fresh assignment's endpoints in it, plus held-back ones
    /// in their last served form. Whether what is served changed.
    fn serve(
        &mut self,
        name: &str,
        fresh: &ClusterLoadAssignment,
        set: BTreeSet<String>,
        held_back: usize,
        now: Instant,
    ) -> bool {
        let previous = self.served.get(name);
        let mut groups: BTreeMap<GroupKey, LocalityLbEndpoints> = BTreeMap::new();
        let mut kept: BTreeMap<String, (LocalityLbEndpoints, LbEndpoint)> = BTreeMap::new();
        for (key, group, lb) in endpoints(fresh) {
            if set.contains(&key) {
                kept.insert(key, (group, lb));
            }
        }
        if let Some(prev) = previous {
            for key in &set {
                if !kept.contains_key(key)
                    && let Some(old) = prev.endpoints.get(key)
                {
                    kept.insert(key.clone(), old.clone());
                }
            }
        }
        for (group, lb) in kept.values() {
            groups
                .entry(group_key(group))
                .or_insert_with(|| group.clone())
                .lb_endpoints
                .push(lb.clone());
        }
        let verbatim = kept.len() == endpoints(fresh).count();
        let assignment = if verbatim {
            // Nothing held back: serve the upstream's assignment as it is.
            fresh.clone()
        } else {
            let endpoints_out: Vec<LocalityLbEndpoints> = groups
                .into_values()
                .map(|mut g| {
                    // A locality weight, where the upstream set one, follows its endpoints.
                    if g.load_balancing_weight.is_some() {
                        let sum = g
                            .lb_endpoints
                            .iter()
                            .map(|e| e.load_balancing_weight.as_ref().map_or(1, |w| w.value))
                            .fold(0u32, u32::saturating_add)
                            .max(1);
                        g.load_balancing_weight = Some(UInt32Value { value: sum });
                    }
                    g
                })
                .collect();
            ClusterLoadAssignment {
                endpoints: endpoints_out,
                ..fresh.clone()
            }
        };
        let upstream_version = fresh_version(&self.upstream, name);
        if let Some(p) = self.served.get_mut(name)
            && p.assignment == assignment
        {
            p.state = ServiceState {
                upstream_version,
                held_back,
                refused_empty: false,
                undecodable: false,
                ..p.state.clone()
            };
            return false;
        }
        let numeric = upstream_version.parse::<u64>().unwrap_or(0);
        let served_version = self
            .served
            .get(name)
            .map(|p| p.state.served_version + 1)
            .unwrap_or(0)
            .max(numeric);
        let state = ServiceState {
            upstream_version,
            served_version,
            endpoints: kept.len(),
            held_back,
            refused_empty: false,
            undecodable: false,
        };
        let encoded = Payload::new(to_any(TYPE_ENDPOINT, &assignment));
        let released = Released {
            at: now,
            path: release_path(self.served.get(name).map(|p| &p.endpoints), &kept),
            carried: self.release_age(name, now),
        };
        self.served.insert(
            name.to_owned(),
            Served {
                state,
                assignment,
                encoded,
                endpoints: kept,
                released,
            },
        );
        true
    }
}

impl LocalView {
    /// How old the upstream release of `name`'s current upstream version is at `now`,
    /// where the authority carried its age with it: the age it arrived with plus this
    /// agent's time since the response arrived (persisting it, bounds, a shrink cap's
    /// hold). Never past [`waymark_xds::release_age::AGE_MAX`]: an older one is no
    /// propagation worth timing.
    fn release_age(&self, name: &str, now: Instant) -> Option<std::time::Duration> {
        let eds = self.upstream.get(TYPE_ENDPOINT)?;
        let (version, _) = eds.resources.get(name)?;
        let arrival = eds.carried.get(name)?;
        let age = arrival.age_at(now);
        (arrival.version == *version && age <= waymark_xds::release_age::AGE_MAX).then_some(age)
    }
}

type GroupKey = (u32, String, String, String);

/// Which path a served change took, judged by what it does, as the delta queues judge a
/// release: one that takes a served endpoint away is a withdrawal; anything else (the
/// first version, endpoints added or changed) is an admission.
fn release_path<V>(before: Option<&BTreeMap<String, V>>, after: &BTreeMap<String, V>) -> Path {
    match before {
        Some(before) if before.keys().any(|k| !after.contains_key(k)) => Path::Withdrawal,
        _ => Path::Admission,
    }
}

fn group_key(g: &LocalityLbEndpoints) -> GroupKey {
    let l = g.locality.clone().unwrap_or_default();
    (g.priority, l.region, l.zone, l.sub_zone)
}

fn fresh_version(upstream: &Upstream, name: &str) -> String {
    upstream
        .get(TYPE_ENDPOINT)
        .and_then(|t| t.resources.get(name))
        .map(|(v, _)| v.clone())
        .unwrap_or_default()
}

/// Every endpoint of an assignment: its key (`ip:port`), its group without endpoints, and
/// itself. An endpoint without a socket address is keyed by its position.
fn endpoints(
    cla: &ClusterLoadAssignment,
) -> impl Iterator<Item = (String, LocalityLbEndpoints, LbEndpoint)> + '_ {
    cla.endpoints.iter().enumerate().flat_map(|(gi, group)| {
        let header = LocalityLbEndpoints {
            lb_endpoints: Vec::new(),
            ..group.clone()
        };
        group.lb_endpoints.iter().enumerate().map(move |(ei, lb)| {
            (
                endpoint_key(lb).unwrap_or_else(|| format!("#{gi}.{ei}")),
                header.clone(),
                lb.clone(),
            )
        })
    })
}

/// `ip:port` of an endpoint, when it has a socket address.
pub fn endpoint_key(lb: &LbEndpoint) -> Option<String> {
    let (ip, port) = waymark_xds::translate::endpoint_socket(lb).ok()?;
    Some(std::net::SocketAddr::new(ip, port).to_string())
}

/// Mirror `fresh` into `target` (transformed), returning how many entries changed.
fn sync_plain(
    target: &mut Resources,
    fresh: Option<&BTreeMap<String, (String, Any)>>,
    transform: impl Fn(&Any) -> Any,
) -> usize {
    let empty = BTreeMap::new();
    let fresh = fresh.unwrap_or(&empty);
    let before = target.len();
    let gone: Vec<String> = target
        .keys()
        .filter(|name| !fresh.contains_key(*name))
        .cloned()
        .collect();
    for name in &gone {
        target.remove(name);
    }
    let mut changed = before - target.len();
    for (name, (version, any)) in fresh {
        if target.get(name).is_some_and(|e| &e.version == version) {
            continue;
        }
        target.insert(
            name.clone(),
            Encoded {
                version: version.clone(),
                resource: Payload::new(transform(any)),
            },
        );
        changed += 1;
    }
    changed
}

/// A served cluster: outlier ejection capped at `cap` percent, load reports to this agent.
/// An undecodable cluster is passed through unchanged (the sidecar will NACK it, visibly).
fn cap_cluster(any: &Any, cap: u32) -> Any {
    let Ok(mut cluster) = Cluster::decode(any.value.as_slice()) else {
        tracing::warn!("undecodable cluster passed through unchanged");
        return any.clone();
    };
    // A cluster without outlier detection (an authority from before every field was set)
    // gets the full explicit set, not one field: a client that reads unset fields as
    // `undefined` (grpc-js-xds) crashes on a half-filled one.
    let od = cluster
        .outlier_detection
        .get_or_insert_with(waymark_xds::translate::outlier::detection);
    // Envoy's default is 10%; whatever the upstream asks, never above the cap.
    let asked = od.max_ejection_percent.as_ref().map_or(10, |v| v.value);
    od.max_ejection_percent = Some(UInt32Value {
        value: asked.min(cap),
    });
    cluster.lrs_server = Some(ConfigSource {
        config_source_specifier: Some(ConfigSourceSpecifier::Self_(SelfConfigSource::default())),
        ..Default::default()
    });
    to_any(TYPE_CLUSTER, &cluster)
}

#[cfg(test)]
#[path = "view_test.rs"]
mod tests;
