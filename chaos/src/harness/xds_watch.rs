//! xDS subscribers that record every resource version they apply: Delta ADS clients from
//! `waymark-xds` (the same client node agents run), subscribed to every cluster (CDS
//! wildcard) and to one service's load assignment (EDS), attached to one authority member
//! or moving across several as a node agent does.
//!
//! What they record is the raw series of load-assignment (EDS) versions, which are the
//! region-wide view versions and must only grow; whether they went backwards is for the
//! drill's pure figures to judge. Cluster (CDS) versions are content hashes with no order,
//! so only their changes are counted.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::Endpoint;
use waymark_xds::client::{Applied, ClientConfig, Subscription, XdsClient};
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT};

use crate::traffic::ms;

/// One change a subscriber applied to one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Seen {
    /// ms since the drill's epoch.
    pub t_ms: u64,
    /// The load assignment's name.
    pub resource: String,
    /// The numeric resource version; `None` when the resource was removed.
    pub version: Option<u64>,
}

/// What one subscriber saw.
#[derive(Debug, Clone, Serialize)]
pub struct WatchLog {
    pub name: String,
    /// The members it may use (HTTP-less: their xDS addresses).
    pub servers: Vec<SocketAddr>,
    pub seen: Vec<Seen>,
    /// Responses applied, rejected, and streams opened, as the client counts them.
    pub updates: u64,
    pub nacks: u64,
    pub streams: u64,
    /// Cluster (CDS) resources that changed version.
    pub cluster_changes: u64,
    /// Load-assignment versions that were not numbers (each one is a finding: they must
    /// compare).
    pub unparsable: u64,
}

/// A running subscriber.
pub struct VersionWatch {
    name: String,
    zone: String,
    servers: Vec<SocketAddr>,
    client: XdsClient,
    log: Arc<Mutex<Recorded>>,
    last: watch::Receiver<Arc<Applied>>,
    task: tokio::task::JoinHandle<()>,
}

impl VersionWatch {
    /// Subscribes as node `name` (zone `zone`) to every cluster and to `service`'s load
    /// assignment on `servers` (the client moves to the next one whenever a stream ends),
    /// timing what it sees from `epoch`. `config` sets the backoff and its seed.
    pub fn start(
        name: &str,
        servers: Vec<SocketAddr>,
        zone: &str,
        service: &str,
        config: ClientConfig,
        epoch: Instant,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!servers.is_empty(), "a subscriber needs a server");
        let endpoints = servers
            .iter()
            .map(|a| Endpoint::from_shared(format!("http://{a}")))
            .collect::<Result<Vec<_>, _>>()?;
        let node = Node {
            id: name.to_owned(),
            locality: Some(Locality {
                zone: zone.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let subs = [
            (
                TYPE_CLUSTER.to_owned(),
                Subscription {
                    wildcard: true,
                    names: BTreeSet::new(),
                },
            ),
            (
                TYPE_ENDPOINT.to_owned(),
                Subscription {
                    wildcard: false,
                    names: BTreeSet::from([service.to_owned()]),
                },
            ),
        ];
        let (client, rx) = XdsClient::connect_any(config, endpoints, node, subs);
        let log: Arc<Mutex<Recorded>> = Arc::default();
        let sink = Arc::clone(&log);
        let last = rx.clone();
        let task = tokio::spawn(record(rx, sink, epoch));
        Ok(Self {
            name: name.to_owned(),
            zone: zone.to_owned(),
            servers,
            client,
            log,
            last,
            task,
        })
    }

    /// Its node id.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The zone it subscribes from (it receives that zone's view).
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// Whether it has applied a version of `service`'s load assignment yet.
    pub fn has_endpoints(&self, service: &str) -> bool {
        self.last
            .borrow()
            .resources(TYPE_ENDPOINT)
            .is_some_and(|r| r.contains_key(service))
    }

    /// The version of `service`'s load assignment it holds now, if a number.
    pub fn endpoints_version(&self, service: &str) -> Option<u64> {
        self.last
            .borrow()
            .resources(TYPE_ENDPOINT)
            .and_then(|r| r.get(service))
            .and_then(|(v, _)| v.parse().ok())
    }

    /// Stops it and returns what it saw.
    pub fn stop(self) -> WatchLog {
        self.task.abort();
        let applied = self.last.borrow().clone();
        drop(self.client);
        let recorded =
            std::mem::take(&mut *self.log.lock().unwrap_or_else(PoisonError::into_inner));
        WatchLog {
            name: self.name,
            servers: self.servers,
            seen: recorded.seen,
            cluster_changes: recorded.cluster_changes,
            unparsable: recorded.unparsable,
            updates: applied.updates,
            nacks: applied.nacks,
            streams: applied.streams,
        }
    }
}

/// What [`record`] has seen so far.
#[derive(Debug, Default)]
struct Recorded {
    seen: Vec<Seen>,
    cluster_changes: u64,
    unparsable: u64,
}

/// Appends every version change of every load assignment to `sink`, and counts cluster
/// changes.
async fn record(mut rx: watch::Receiver<Arc<Applied>>, sink: Arc<Mutex<Recorded>>, epoch: Instant) {
    let mut endpoints: BTreeMap<String, String> = BTreeMap::new();
    let mut clusters: BTreeMap<String, String> = BTreeMap::new();
    while rx.changed().await.is_ok() {
        let applied = rx.borrow_and_update().clone();
        let t_ms = ms(epoch.elapsed());
        let versions = |type_url: &str| -> BTreeMap<String, String> {
            applied
                .resources(type_url)
                .into_iter()
                .flatten()
                .map(|(name, (version, _))| (name.clone(), version.clone()))
                .collect()
        };
        let (now_endpoints, now_clusters) = (versions(TYPE_ENDPOINT), versions(TYPE_CLUSTER));
        let mut out = sink.lock().unwrap_or_else(PoisonError::into_inner);
        out.cluster_changes += now_clusters
            .iter()
            .filter(|(k, v)| clusters.get(*k) != Some(*v))
            .count() as u64;
        for (name, version) in &now_endpoints {
            if endpoints.get(name) == Some(version) {
                continue;
            }
            match version.parse::<u64>() {
                Ok(v) => out.seen.push(Seen {
                    t_ms,
                    resource: name.clone(),
                    version: Some(v),
                }),
                Err(_) => out.unparsable += 1,
            }
        }
        for name in endpoints.keys().filter(|k| !now_endpoints.contains_key(*k)) {
            out.seen.push(Seen {
                t_ms,
                resource: name.clone(),
                version: None,
            });
        }
        drop(out);
        (endpoints, clusters) = (now_endpoints, now_clusters);
    }
}
