//! The synthetic fleet for scale: the prototype's 40 services, 2,000 instances and 2,000
//! xDS subscriptions against one real `waymark authority` process.
//!
//! - [`FleetAuthority`]: a single-member authority with several zones and an
//!   `[authority.limits]` section (the load guards' budgets), rewritten before a restart.
//! - Instances are registered over the authority's HTTP API like any runtime nothing
//!   watches (`POST /v1/instances`, 10-minute leases). They are not real sockets and no
//!   prober or agent reports on them: with every evidence class silent each instance is
//!   `unknown`, which stays in rotation (DESIGN: silence is unknown), so existence alone —
//!   registrations and deregistrations through the authority's admission path — decides what
//!   the views hold. That is what the scale drills measure: the path from a committed change
//!   to every subscriber, not evidence.
//! - [`Subscribers`]: N real Delta xDS streams opened with the node agent's own client
//!   (`waymark_xds::client::XdsClient`, full-jitter backoff honouring the server's retry
//!   hints), each subscribed to the load assignments of a few services from a caller zone.
//!   Every applied version of every resource is stamped with its arrival time; each
//!   (zone, service, version) is decoded once into its set of endpoint addresses, so
//!   propagation times per subscriber are computed afterwards from the stamps.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use http::Method;
use prost::Message as _;
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::config::LimitsSection;
use waymark_agent::tls::TlsSection;
use waymark_xds::client::{Applied, ClientConfig, Subscription, XdsClient};
use waymark_xds::translate::TYPE_ENDPOINT;

use super::authority::Voter;
use super::evidence::RegionPki;
use super::{RoleProc, configs, free_port, loopback, wait_until};
use crate::traffic::ms;

/// The actor the drills act as on the authority's API.
pub const ACTOR: &str = "waymark-drill";
/// Leases of the synthetic instances: the longest the authority grants, so no renewal is
/// needed within a drill.
pub const LEASE_MS: u64 = 600_000;

/// The load guards' budgets written as `[authority.limits]`; `None` keeps the default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Limits {
    pub reconnect_permille: Option<u32>,
    pub reconnect_floor: Option<u32>,
    pub reconnect_expected_clients: Option<u32>,
    pub admit_releases_per_sec: Option<u32>,
    pub shed_admissions: Option<bool>,
    /// `publish_pressure_after`, in milliseconds.
    pub publish_pressure_after_ms: Option<u64>,
}

impl Limits {
    /// The defaults, with every budget this names set.
    fn section(&self) -> LimitsSection {
        let mut s = LimitsSection::default();
        if let Some(v) = self.reconnect_permille {
            s.reconnect_permille = v;
        }
        if let Some(v) = self.reconnect_floor {
            s.reconnect_floor = v;
        }
        if let Some(v) = self.reconnect_expected_clients {
            s.reconnect_expected_clients = v;
        }
        if let Some(v) = self.admit_releases_per_sec {
            s.admit_releases_per_sec = v;
        }
        if let Some(v) = self.shed_admissions {
            s.shed_admissions = v;
        }
        if let Some(ms) = self.publish_pressure_after_ms {
            s.publish_pressure_after = Duration::from_millis(ms);
        }
        s
    }
}

/// A single-member authority serving several zones; ports and data survive restarts.
#[derive(Debug)]
pub struct FleetAuthority {
    process: RoleProc,
    config: PathBuf,
    dir: PathBuf,
    region: String,
    zones: Vec<String>,
    http: SocketAddr,
    raft: SocketAddr,
    xds: SocketAddr,
    limits: Limits,
    /// Mutual TLS and the evidence ingest listener, when [`FleetAuthority::with_ingest`]
    /// asked for them.
    ingest: Option<(SocketAddr, TlsSection)>,
}

impl FleetAuthority {
    /// Writes the configuration under `dir`; does not start anything.
    pub fn new(
        bin: &Path,
        dir: &Path,
        region: &str,
        zones: &[String],
        limits: Limits,
    ) -> anyhow::Result<Self> {
        let (http, raft, xds) = (
            loopback(free_port()?),
            loopback(free_port()?),
            loopback(free_port()?),
        );
        std::fs::create_dir_all(dir)?;
        let config = dir.join("authority.toml");
        let me = Self {
            process: RoleProc::new(
                "authority",
                bin,
                config.clone(),
                dir.join("authority.log"),
                http,
            ),
            config,
            dir: dir.to_path_buf(),
            region: region.to_owned(),
            zones: zones.to_vec(),
            http,
            raft,
            xds,
            limits,
            ingest: None,
        };
        me.set_limits(limits)?;
        Ok(me)
    }

    /// Adds mutual TLS (a member certificate from `pki`) and an evidence ingest listener,
    /// as a region whose node agents report evidence runs it; the API is then served over
    /// TLS too, and this harness's API clients speak it. Rewrites the configuration.
    pub fn with_ingest(mut self, pki: &RegionPki) -> anyhow::Result<Self> {
        // The member name is its Raft id (1): peers admit Raft RPC only as the id it names.
        let tls = pki.issue("authority/1")?;
        self.ingest = Some((loopback(free_port()?), tls));
        super::api_over_tls(self.http, &pki.bundle())?;
        self.set_limits(self.limits)?;
        Ok(self)
    }

    /// The evidence ingest listener, when there is one.
    pub fn ingest_addr(&self) -> Option<SocketAddr> {
        self.ingest.as_ref().map(|(addr, _)| *addr)
    }

    /// The process's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Rewrites the configuration with `limits` (read at the next start).
    pub fn set_limits(&self, limits: Limits) -> anyhow::Result<()> {
        let zones: Vec<&str> = self.zones.iter().map(String::as_str).collect();
        let mut a = configs::authority(1, &self.region, &zones, &self.dir.join("data"))?;
        a.http = self.http;
        a.raft = self.raft;
        a.xds = self.xds;
        a.members = configs::members(&[Voter {
            id: 1,
            http: self.http,
            raft: self.raft,
        }]);
        a.acl = configs::drill_acl(&self.dir)?;
        a.limits = limits.section();
        if let Some((ingest, tls)) = &self.ingest {
            a.ingest = Some(*ingest);
            a.tls = Some(tls.clone());
        }
        configs::write_authority(&self.config, a)
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    pub fn xds_addr(&self) -> SocketAddr {
        self.xds
    }

    pub fn start(&mut self) -> anyhow::Result<()> {
        self.process.start()
    }

    pub async fn wait_ready(&mut self, deadline: Duration) -> anyhow::Result<()> {
        self.process.wait_ready(deadline).await
    }

    pub fn kill(&mut self) {
        self.process.kill();
    }

    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }
}

/// The fleet's shape.
#[derive(Debug, Clone, Serialize)]
pub struct Shape {
    pub services: usize,
    pub instances: usize,
    pub zones: Vec<String>,
    pub subscriptions: usize,
    /// Services each subscriber follows.
    pub services_per_subscriber: usize,
}

/// `svc-07`.
pub fn service_name(i: usize) -> String {
    format!("svc-{i:02}")
}

/// A unique address for the `n`th synthetic instance (never reused within a run).
pub fn address(n: usize) -> SocketAddr {
    let n = n as u32;
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(10, (n >> 16) as u8, (n >> 8) as u8, n as u8)),
        8080,
    )
}

/// One synthetic instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub service: String,
    pub zone: String,
    pub addr: SocketAddr,
    /// The id the authority issued.
    pub id: String,
}

/// What to register: service, zone and address; the `n`th of the base fleet goes to
/// service `n % services` and zone `(n / services) % zones`.
pub fn base_specs(shape: &Shape) -> Vec<(String, String, SocketAddr)> {
    (0..shape.instances)
        .map(|n| {
            (
                service_name(n % shape.services),
                shape.zones[(n / shape.services) % shape.zones.len()].clone(),
                address(n + 1),
            )
        })
        .collect()
}

/// The authority's API, as the drills use it.
#[derive(Debug, Clone)]
pub struct Api {
    client: ApiClient,
    region: String,
}

impl Api {
    pub fn new(api: SocketAddr, region: &str) -> Self {
        Self {
            client: super::api_client(api),
            region: region.to_owned(),
        }
    }

    /// Declares `services` (default contract), retrying while the authority is not yet
    /// accepting writes, up to `deadline`.
    pub async fn declare(&self, services: &[String], deadline: Duration) -> anyhow::Result<()> {
        self.declare_with(services, json!({}), deadline).await
    }

    /// [`Self::declare`] under `contract`.
    pub async fn declare_with(
        &self,
        services: &[String],
        contract: serde_json::Value,
        deadline: Duration,
    ) -> anyhow::Result<()> {
        let body = json!({"owner": ACTOR, "contract": contract});
        for s in services {
            let path = format!("/v1/services/{s}");
            wait_until("the authority accepts a service", deadline, async || {
                self.client
                    .send(Method::PUT, &path, Some(&body))
                    .await
                    .ok()
                    .filter(|r| r.status.is_success())
            })
            .await?;
        }
        Ok(())
    }

    /// Registers one instance on node `node-<zone>`; its issued id.
    pub async fn register(
        &self,
        service: &str,
        zone: &str,
        addr: SocketAddr,
    ) -> anyhow::Result<String> {
        self.register_on(service, zone, &format!("node-{zone}"), addr)
            .await
    }

    /// Registers one instance running on `node`; its issued id.
    pub async fn register_on(
        &self,
        service: &str,
        zone: &str,
        node: &str,
        addr: SocketAddr,
    ) -> anyhow::Result<String> {
        let reg = json!({
            "service": service,
            "locality": {"region": self.region, "zone": zone, "node": node},
            "address": {"ip": addr.ip().to_string(), "port": addr.port()},
            "lease_ms": LEASE_MS,
        });
        let r = self
            .client
            .send(Method::POST, "/v1/instances", Some(&reg))
            .await?;
        anyhow::ensure!(
            r.status.is_success(),
            "registering {addr} answered {}",
            r.status
        );
        let v = r.json()?;
        Ok(v["instance"]
            .as_str()
            .context("registration answered without an instance id")?
            .to_owned())
    }

    /// Renews the lease of instance `id`.
    pub async fn renew(&self, id: &str) -> anyhow::Result<()> {
        let r = self
            .client
            .send(Method::PUT, &format!("/v1/instances/{id}/renew"), None)
            .await?;
        anyhow::ensure!(r.status.is_success(), "renewing {id} answered {}", r.status);
        Ok(())
    }

    /// Deregisters one instance.
    pub async fn deregister(&self, id: &str) -> anyhow::Result<()> {
        let r = self
            .client
            .send(Method::DELETE, &format!("/v1/instances/{id}"), None)
            .await?;
        anyhow::ensure!(
            r.status.is_success(),
            "deregistering {id} answered {}",
            r.status
        );
        Ok(())
    }

    /// Registers `specs` with `concurrency` requests in flight.
    pub async fn register_all(
        &self,
        specs: Vec<(String, String, SocketAddr)>,
        concurrency: usize,
    ) -> anyhow::Result<Vec<Instance>> {
        let queue = Arc::new(Mutex::new(
            specs.into_iter().enumerate().collect::<Vec<_>>(),
        ));
        let mut workers = Vec::new();
        for _ in 0..concurrency.max(1) {
            let (queue, api) = (Arc::clone(&queue), self.clone());
            workers.push(tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let next = queue.lock().unwrap_or_else(PoisonError::into_inner).pop();
                    let Some((i, (service, zone, addr))) = next else {
                        return Ok::<_, anyhow::Error>(done);
                    };
                    let id = api.register(&service, &zone, addr).await?;
                    done.push((
                        i,
                        Instance {
                            service,
                            zone,
                            addr,
                            id,
                        },
                    ));
                }
            }));
        }
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.await??);
        }
        all.sort_by_key(|(i, _)| *i);
        Ok(all.into_iter().map(|(_, x)| x).collect())
    }

    /// `POST /v1/zones/{zone}/evacuation` with `{"action": "evacuate"}`.
    pub async fn evacuate(&self, zone: &str) -> anyhow::Result<serde_json::Value> {
        let r = self
            .client
            .send(
                Method::POST,
                &format!("/v1/zones/{zone}/evacuation"),
                Some(&json!({"action": "evacuate"})),
            )
            .await?;
        anyhow::ensure!(
            r.status.is_success(),
            "evacuating {zone} answered {}: {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        r.json()
    }

    /// `GET path` as JSON.
    pub async fn get_json(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        self.client.get_json(path).await
    }

    /// `GET /metrics` as text.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        let r = self.client.send(Method::GET, "/metrics", None).await?;
        Ok(String::from_utf8_lossy(&r.body).into_owned())
    }
}

/// The value of an unlabelled metric in Prometheus text (`waymark_shedding 1`).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `Publish` commits so far certainly slower than `after` (the threshold past which the
/// authority reports delivery pressure), as the histogram `waymark_publish_commit_seconds`
/// can tell: `_count` minus its narrowest bucket reaching `after` — a lower bound, so a
/// commit the authority did not count as slow is never counted here. A zero threshold
/// counts every commit.
pub fn slow_publishes(text: &str, after: Duration) -> Option<f64> {
    let count = metric(text, "waymark_publish_commit_seconds_count")?;
    if after.is_zero() {
        return Some(count);
    }
    let prefix = "waymark_publish_commit_seconds_bucket{le=\"";
    let within = text
        .lines()
        .filter_map(|l| {
            let (le, value) = l.strip_prefix(prefix)?.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let value: f64 = value.trim().parse().ok()?;
            (le >= after.as_secs_f64()).then_some((le, value))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map_or(count, |(_, n)| n);
    Some(count - within)
}

/// One applied version of one resource, as a subscriber received it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Seen {
    pub t_ms: u64,
    /// Index into the subscriber's services.
    pub resource: u16,
    pub version: u64,
}

/// What one subscriber received.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SubLog {
    pub seen: Vec<Seen>,
    /// When each stream was opened (the first is the initial connect).
    pub streams_opened_ms: Vec<u64>,
    /// When a stream was noticed closed.
    pub streams_closed_ms: Vec<u64>,
}

/// A subscriber: its zone and the services it follows.
#[derive(Debug, Clone, Serialize)]
pub struct SubSpec {
    pub zone: String,
    pub services: Vec<String>,
}

/// Subscriber `i` follows `per` consecutive services starting at `i % services`, from zone
/// `i % zones` (shifted so neighbours differ in both).
pub fn sub_specs(shape: &Shape) -> Vec<SubSpec> {
    (0..shape.subscriptions)
        .map(|i| SubSpec {
            zone: shape.zones[(i / shape.services) % shape.zones.len()].clone(),
            services: (0..shape.services_per_subscriber.min(shape.services))
                .map(|k| service_name((i + k) % shape.services))
                .collect(),
        })
        .collect()
}

/// The endpoint addresses of each (zone, service, version) any subscriber received.
pub type Contents = HashMap<(String, String, u64), Arc<HashSet<SocketAddr>>>;

/// How subscribers reach an authority's members.
#[derive(Default, Clone, Copy)]
pub struct Upstream<'a> {
    /// Subscriber `i` presents the node certificate `node/fleet-<i>` issued from this PKI,
    /// as a node agent does (mutual TLS); plaintext when `None`.
    pub pki: Option<&'a RegionPki>,
    /// Each holds a standby stream at a second member (`ClientConfig::standby`), as node
    /// agents do by default.
    pub standby: bool,
}

/// N Delta streams against one xDS server, recording arrivals.
pub struct Subscribers {
    specs: Vec<SubSpec>,
    logs: Vec<Arc<Mutex<SubLog>>>,
    contents: Arc<Mutex<Contents>>,
    clients: Vec<XdsClient>,
    watchers: Vec<tokio::task::JoinHandle<()>>,
    connected: Vec<tokio::sync::watch::Receiver<Arc<Applied>>>,
}

impl Subscribers {
    /// Opens one stream per spec against `xds`, `batch` at a time (each batch waits until
    /// it holds every resource it asked for, up to `deadline` per batch).
    pub async fn start(
        xds: SocketAddr,
        specs: Vec<SubSpec>,
        seed: u64,
        epoch: Instant,
        batch: usize,
        deadline: Duration,
    ) -> anyhow::Result<Self> {
        let plain = Upstream::default();
        Self::start_across(&[xds], specs, seed, epoch, batch, deadline, plain).await
    }

    /// [`Self::start`] over several equivalent servers (an authority's members), as node
    /// agents are configured: subscriber `i` starts on `servers[i % n]` and moves to the
    /// next after every stream that ends, so the streams spread evenly and a dead member's
    /// subscribers fail over to the others.
    pub async fn start_across(
        servers: &[SocketAddr],
        specs: Vec<SubSpec>,
        seed: u64,
        epoch: Instant,
        batch: usize,
        deadline: Duration,
        upstream: Upstream<'_>,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!servers.is_empty(), "subscribers need a server");
        let endpoints = servers
            .iter()
            .map(|a| tonic::transport::Endpoint::from_shared(format!("http://{a}")))
            .collect::<Result<Vec<_>, _>>()?;
        let contents: Arc<Mutex<Contents>> = Arc::default();
        let mut me = Self {
            specs: Vec::new(),
            logs: Vec::new(),
            contents: Arc::clone(&contents),
            clients: Vec::new(),
            watchers: Vec::new(),
            connected: Vec::new(),
        };
        for (i, spec) in specs.into_iter().enumerate() {
            let node = Node {
                id: format!("fleet-{i}"),
                locality: Some(Locality {
                    zone: spec.zone.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let sub = Subscription {
                wildcard: false,
                names: spec.services.iter().cloned().collect(),
            };
            let tls = match upstream.pki {
                Some(pki) => Some(pki.node_client(&format!("fleet-{i}")).await?),
                None => None,
            };
            let config = ClientConfig {
                seed: seed.wrapping_mul(0x9E37_79B9).wrapping_add(i as u64),
                tls,
                standby: upstream.standby,
                ..ClientConfig::default()
            };
            // The client starts at `endpoints[seed % n]`: rotate the list so that is
            // `servers[i % n]`.
            let n = endpoints.len();
            let mut order = endpoints.clone();
            order.rotate_left((i % n + n - (config.seed % n as u64) as usize) % n);
            let (client, rx) =
                XdsClient::connect_any(config, order, node, [(TYPE_ENDPOINT.to_owned(), sub)]);
            let log: Arc<Mutex<SubLog>> = Arc::default();
            me.watchers.push(tokio::spawn(watch(
                rx.clone(),
                spec.clone(),
                Arc::clone(&log),
                Arc::clone(&contents),
                epoch,
            )));
            me.clients.push(client);
            me.connected.push(rx);
            me.logs.push(log);
            me.specs.push(spec);
            if (i + 1) % batch.max(1) == 0 {
                me.wait_holding(deadline).await?;
            }
        }
        me.wait_holding(deadline).await?;
        Ok(me)
    }

    /// Waits until every subscriber opened so far holds every resource it asked for.
    pub async fn wait_holding(&self, deadline: Duration) -> anyhow::Result<()> {
        let what = format!("{} subscribers holding their views", self.clients.len());
        wait_until(&what, deadline, async || {
            (self.holding() == self.clients.len()).then_some(())
        })
        .await
    }

    /// Subscribers holding every resource they asked for.
    pub fn holding(&self) -> usize {
        self.connected
            .iter()
            .zip(&self.specs)
            .filter(|(rx, spec)| {
                let applied = rx.borrow();
                applied
                    .resources(TYPE_ENDPOINT)
                    .is_some_and(|r| spec.services.iter().all(|s| r.contains_key(s)))
            })
            .count()
    }

    /// Subscribers with a stream open now.
    pub fn connected(&self) -> usize {
        self.connected
            .iter()
            .filter(|rx| rx.borrow().connected)
            .count()
    }

    /// Subscribers holding a standby stream at a second member now.
    pub fn standing_by(&self) -> usize {
        self.clients
            .iter()
            .filter(|c| c.stream_status().borrow().standby)
            .count()
    }

    /// Streams subscribers opened over their standby's connection so far.
    pub fn promotions(&self) -> u64 {
        self.clients
            .iter()
            .map(|c| c.stream_status().borrow().promotions)
            .sum()
    }

    /// The version subscriber `i` holds now of each service it follows (in its spec's
    /// order), `None` where it holds none.
    pub fn held(&self, i: usize) -> Vec<Option<u64>> {
        let (Some(rx), Some(spec)) = (self.connected.get(i), self.specs.get(i)) else {
            return Vec::new();
        };
        let applied = rx.borrow();
        let resources = applied.resources(TYPE_ENDPOINT);
        spec.services
            .iter()
            .map(|s| {
                resources
                    .and_then(|r| r.get(s))
                    .and_then(|(v, _)| v.parse().ok())
            })
            .collect()
    }

    /// Streams subscriber `i` has opened so far (1 after its first connect).
    pub fn streams(&self, i: usize) -> u64 {
        self.connected.get(i).map_or(0, |rx| rx.borrow().streams)
    }

    /// What subscriber `i` has recorded so far (it goes on recording).
    pub fn log(&self, i: usize) -> SubLog {
        self.logs.get(i).map_or_else(SubLog::default, |l| {
            l.lock().unwrap_or_else(PoisonError::into_inner).clone()
        })
    }

    pub fn len(&self) -> usize {
        self.clients.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    pub fn specs(&self) -> &[SubSpec] {
        &self.specs
    }

    /// Stops every stream and returns each subscriber's log and the decoded contents.
    pub fn stop(self) -> (Vec<SubLog>, Contents) {
        for w in &self.watchers {
            w.abort();
        }
        drop(self.clients);
        let logs = self
            .logs
            .iter()
            .map(|l| std::mem::take(&mut *l.lock().unwrap_or_else(PoisonError::into_inner)))
            .collect();
        let contents =
            std::mem::take(&mut *self.contents.lock().unwrap_or_else(PoisonError::into_inner));
        (logs, contents)
    }
}

/// Follows one client's applied state, stamping each new version and stream change.
async fn watch(
    mut rx: tokio::sync::watch::Receiver<Arc<Applied>>,
    spec: SubSpec,
    log: Arc<Mutex<SubLog>>,
    contents: Arc<Mutex<Contents>>,
    epoch: Instant,
) {
    let mut held: Vec<Option<u64>> = vec![None; spec.services.len()];
    let (mut streams, mut connected) = (0u64, false);
    loop {
        let applied = Arc::clone(&rx.borrow_and_update());
        let t_ms = ms(epoch.elapsed());
        {
            let mut entry = log.lock().unwrap_or_else(PoisonError::into_inner);
            while streams < applied.streams {
                streams += 1;
                entry.streams_opened_ms.push(t_ms);
            }
            if connected && !applied.connected {
                entry.streams_closed_ms.push(t_ms);
            }
            connected = applied.connected;
            if let Some(resources) = applied.resources(TYPE_ENDPOINT) {
                for (k, service) in spec.services.iter().enumerate() {
                    let Some((version, any)) = resources.get(service) else {
                        continue;
                    };
                    let Ok(version) = version.parse::<u64>() else {
                        continue;
                    };
                    if held[k] == Some(version) {
                        continue;
                    }
                    held[k] = Some(version);
                    entry.seen.push(Seen {
                        t_ms,
                        resource: k as u16,
                        version,
                    });
                    let key = (spec.zone.clone(), service.clone(), version);
                    let mut c = contents.lock().unwrap_or_else(PoisonError::into_inner);
                    c.entry(key)
                        .or_insert_with(|| Arc::new(addresses(&any.value)));
                }
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// The endpoint addresses of an encoded `ClusterLoadAssignment`.
pub fn addresses(bytes: &[u8]) -> HashSet<SocketAddr> {
    let Ok(cla) = ClusterLoadAssignment::decode(bytes) else {
        return HashSet::new();
    };
    cla.endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match e.host_identifier.as_ref()? {
            HostIdentifier::Endpoint(ep) => match ep.address.as_ref()?.address.as_ref()? {
                AddressKind::SocketAddress(sa) => {
                    let ip: IpAddr = sa.address.parse().ok()?;
                    let port = match sa.port_specifier.as_ref()? {
                        PortSpecifier::PortValue(p) => u16::try_from(*p).ok()?,
                        PortSpecifier::NamedPort(_) => return None,
                    };
                    Some(SocketAddr::new(ip, port))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// When subscriber `log` (following `spec`) first held a version of `service` for which
/// `holds(addresses)` is true, at or after `from_ms`; `None` if it never did.
pub fn first_holding(
    log: &SubLog,
    spec: &SubSpec,
    contents: &Contents,
    service: &str,
    from_ms: u64,
    holds: impl Fn(&HashSet<SocketAddr>) -> bool,
) -> Option<u64> {
    let k = spec.services.iter().position(|s| s == service)? as u16;
    // The version held at `from_ms` counts too (its arrival is clamped to `from_ms`).
    let mut current: Option<&Seen> = None;
    for s in log.seen.iter().filter(|s| s.resource == k) {
        if s.t_ms <= from_ms {
            current = Some(s);
            continue;
        }
        if let Some(c) = current.take() {
            let key = (spec.zone.clone(), service.to_owned(), c.version);
            if contents.get(&key).is_some_and(|a| holds(a)) {
                return Some(from_ms);
            }
        }
        let key = (spec.zone.clone(), service.to_owned(), s.version);
        if contents.get(&key).is_some_and(|a| holds(a)) {
            return Some(s.t_ms);
        }
    }
    let c = current?;
    let key = (spec.zone.clone(), service.to_owned(), c.version);
    contents
        .get(&key)
        .is_some_and(|a| holds(a))
        .then_some(from_ms)
}

/// Per resource, whether any version arrived after a higher one: `(subscriber, resource,
/// from, to)` for each regression.
pub fn regressions(logs: &[SubLog]) -> Vec<(usize, u16, u64, u64)> {
    let mut out = Vec::new();
    for (i, log) in logs.iter().enumerate() {
        let mut highest: BTreeMap<u16, u64> = BTreeMap::new();
        for s in &log.seen {
            let h = highest.entry(s.resource).or_insert(s.version);
            if s.version < *h {
                out.push((i, s.resource, *h, s.version));
            } else {
                *h = s.version;
            }
        }
    }
    out
}

/// Raises this process's open-file limit to its hard limit (2,000 streams need 2,000
/// sockets here and as many in the authority); returns the soft limit now in force.
pub fn raise_nofile() -> u64 {
    // No libc dependency: `prlimit` from util-linux does it for our own pid.
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("prlimit")
        .args(["--pid", &pid, "--nofile=20000:20000"])
        .status();
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        })
        .unwrap_or(0)
}

/// What a benchmark that starts `waymark` processes does first: its folder made, the
/// open-file limit raised, the binary found, and all three said on stderr after `name`.
pub fn bench_start(name: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let nofile = raise_nofile();
    let bin = super::waymark_bin()?;
    eprintln!(
        "bench {name}: waymark at {}; open files allowed {nofile}; files under {}",
        bin.display(),
        dir.display()
    );
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SubSpec {
        SubSpec {
            zone: "z1".into(),
            services: vec!["a".into(), "b".into()],
        }
    }

    fn seen(t_ms: u64, resource: u16, version: u64) -> Seen {
        Seen {
            t_ms,
            resource,
            version,
        }
    }

    #[test]
    fn the_first_version_without_an_address_is_found_after_the_change() {
        let (x, y) = (address(1), address(2));
        let mut contents = Contents::new();
        let set = |v: &[SocketAddr]| Arc::new(v.iter().copied().collect::<HashSet<_>>());
        contents.insert(("z1".into(), "a".into(), 1), set(&[x, y]));
        contents.insert(("z1".into(), "a".into(), 2), set(&[x, y]));
        contents.insert(("z1".into(), "a".into(), 3), set(&[y]));
        let log = SubLog {
            seen: vec![seen(10, 0, 1), seen(500, 0, 2), seen(1_200, 0, 3)],
            ..SubLog::default()
        };
        let gone = |a: &HashSet<SocketAddr>| !a.contains(&x);
        assert_eq!(
            first_holding(&log, &spec(), &contents, "a", 300, gone),
            Some(1_200)
        );
        // Already held when the change was made: arrival clamps to the change.
        assert_eq!(
            first_holding(&log, &spec(), &contents, "a", 1_500, gone),
            Some(1_500)
        );
        // Not a followed service, or never held.
        assert_eq!(first_holding(&log, &spec(), &contents, "c", 0, gone), None);
        let never = |a: &HashSet<SocketAddr>| a.is_empty();
        assert_eq!(first_holding(&log, &spec(), &contents, "a", 0, never), None);
    }

    #[test]
    fn a_lower_version_after_a_higher_one_is_a_regression() {
        let ok = SubLog {
            seen: vec![seen(1, 0, 5), seen(2, 1, 3), seen(3, 0, 6), seen(4, 1, 9)],
            ..SubLog::default()
        };
        let bad = SubLog {
            seen: vec![seen(1, 0, 5), seen(2, 0, 4)],
            ..SubLog::default()
        };
        assert!(regressions(std::slice::from_ref(&ok)).is_empty());
        assert_eq!(regressions(&[ok, bad]), vec![(1, 0, 5, 4)]);
    }

    #[test]
    fn the_fleet_spreads_over_services_and_zones() {
        let shape = Shape {
            services: 40,
            instances: 2_000,
            zones: vec!["z1".into(), "z2".into(), "z3".into()],
            subscriptions: 2_000,
            services_per_subscriber: 2,
        };
        let specs = base_specs(&shape);
        let per_service = specs.iter().filter(|s| s.0 == "svc-00").count();
        assert_eq!(per_service, 50);
        let addrs: HashSet<SocketAddr> = specs.iter().map(|s| s.2).collect();
        assert_eq!(addrs.len(), 2_000, "addresses are unique");
        let subs = sub_specs(&shape);
        assert!(subs.iter().all(|s| s.services.len() == 2));
        for z in &shape.zones {
            assert!(subs.iter().filter(|s| &s.zone == z).count() >= 600);
        }
        assert_eq!(
            metric(
                "# HELP x\nwaymark_shedding 1\nwaymark_shed_episodes_total 3\n",
                "waymark_shed_episodes_total"
            ),
            Some(3.0)
        );
        let h = "waymark_publish_commit_seconds_bucket{le=\"0.256\"} 7\n\
                 waymark_publish_commit_seconds_bucket{le=\"0.512\"} 9\n\
                 waymark_publish_commit_seconds_count 12\n";
        assert_eq!(slow_publishes(h, Duration::from_millis(500)), Some(3.0));
        assert_eq!(slow_publishes(h, Duration::from_millis(200)), Some(5.0));
        // Past the widest bucket nothing is certainly slow.
        assert_eq!(slow_publishes(h, Duration::from_secs(2)), Some(0.0));
        assert_eq!(slow_publishes(h, Duration::ZERO), Some(12.0));
    }
}
