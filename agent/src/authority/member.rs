//! One authority member, assembled: Raft on redb with its own listener, the HTTP API, the
//! xDS tier, evidence ingest over mutual TLS, and the leader loop.
//!
//! ```text
//! [authority] http    the query/policy API                     TLS with [authority.tls] (a client
//!                                                              certificate of this region or an
//!                                                              operator's, else a bearer token)
//! [authority] raft    /raft/* between the region's members     mutual TLS with [authority.tls]
//!                                                              (same-region authorities only,
//!                                                              each RPC as its own id)
//! [authority] xds     the xDS tier                             mutual TLS with [authority.tls]
//! [authority] ingest  evidence from node agents and workloads  mutual TLS only
//! ```
//!
//! Without `[authority.tls]` the API, Raft and xDS are plaintext, which
//! [`plaintext_off_loopback`] allows on loopback addresses only.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Context as _;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::{info, warn};
use waymark_certs::grpc::{self, GrpcMetrics, IncomingConfig};
use waymark_certs::identity::{Identity, IdentityKind, KindSet, Name};
use waymark_certs::reload::{ReloadEvent, Reloader, WatchHandle, load_material};
use waymark_certs::tls::{
    ALPN_H2, LiveMaterial, anonymous_client_config, client_config, server_config,
    server_config_client_optional,
};
use waymark_certs::{CertMetrics, PeerPolicy};
use waymark_core::delta::DeltaConfig;
use waymark_core::evaluator::EvaluatorConfig;
use waymark_core::model::NodeName;
use waymark_federation::signal::RegionSignal;
use waymark_federation_quic::{
    FederationConfig, FederationMetrics, FederationNode, FederationTls, PeerConfig,
    SharedAggregates,
};
use waymark_registry::pipeline::PipelineConfig;
use waymark_xds::admission::AdmissionConfig;
use waymark_xds::server::{ServerConfig, XdsServer};

use super::api::{self, ApiState};
use super::existence;
use super::hub::EvidenceHub;
use super::keyring::{KeyringPool, member_router};
use super::kube::metrics::KubeMetrics;
use super::leader::{self, LeaderContext};
use super::metrics::AuthorityMetrics;
use super::raft::admission::member_id;
use super::raft::{Member, RaftConfig, RaftNode, RaftRpcMetrics, Senders};
use super::regions::{self, RegionMetrics, RegionsHandle, SharedSignal};
use super::settings::{
    AuthorityConfig, FederationSettings, GossipSettings, TlsSettings, plaintext_off_loopback,
};
use super::tier;
use crate::api_client::ApiClient;
use crate::evidence::{EvidenceService, SessionMetrics};
use crate::gossip::{Gossip, GossipConfig, GossipId, Role, keyring_file};
use crate::listener::{ALPN_HTTP1, HttpLimits, HttpMetrics};

/// A running member.
pub struct Authority {
    id: u64,
    raft: RaftNode,
    http: SocketAddr,
    raft_addr: SocketAddr,
    xds: SocketAddr,
    ingest: Option<SocketAddr>,
    xds_server: XdsServer,
    metrics: AuthorityMetrics,
    tasks: Vec<JoinHandle<()>>,
    leader: leader::LeaderThread,
    hub: EvidenceHub,
    gossip: Option<Gossip>,
    federation: Option<Arc<FederationNode>>,
    /// See [`Authority::api_client`].
    api_client: Option<Arc<rustls::ClientConfig>>,
    reloader: Option<Arc<Reloader>>,
    _cert_watch: Option<WatchHandle>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("http", &self.http)
            .field("raft", &self.raft_addr)
            .field("xds", &self.xds)
            .field("ingest", &self.ingest)
            .finish_non_exhaustive()
    }
}

impl Authority {
    /// Open the member's state and start serving. The group still has to be initialised
    /// (once, on one member) or this member added to an existing group.
    ///
    /// In order: the API, Raft and xDS listeners are bound (so a taken port fails before
    /// Raft opens), the certificate loaded, Raft opened; then gossip, the xDS tier, ingest
    /// and federation (each binding its own socket), the leader loop and the listeners'
    /// servers, each from what the ones before it built.
    pub async fn start(config: AuthorityConfig) -> anyhow::Result<Self> {
        Self::start_traced(config, None).await
    }

    /// [`Authority::start`], exporting traces as `otel` says (`None`: off; see
    /// `crate::otel`).
    pub async fn start_traced(
        config: AuthorityConfig,
        otel: Option<&crate::otel::OtelSettings>,
    ) -> anyhow::Result<Self> {
        let telemetry = crate::otel::Telemetry::start(otel, crate::otel::AUTHORITY_SERVICE)?;
        waymark_certs::install_crypto_provider();
        if config.tls.is_none()
            && let Some(refused) = plaintext_off_loopback(config.http, config.raft, config.xds)
        {
            anyhow::bail!("{}: {}", refused.key, refused.message);
        }
        let listeners = Listeners::bind(&config).await?;
        let (http, raft_addr, xds) = listeners.addrs()?;
        // Before Raft opens: its client presents this member's certificate.
        let cert_metrics = CertMetrics::new();
        let tls = match &config.tls {
            Some(t) => Some(tls_configs(t, &config, &cert_metrics).await?),
            None => None,
        };
        let member = Member {
            raft_addr: raft_addr.to_string(),
            api_addr: http.to_string(),
        };
        let mut raft_config = RaftConfig::new(config.id, config.data_dir.join("raft"), member);
        raft_config.tls = tls.as_ref().map(|t| Arc::clone(&t.raft_client));
        let raft = RaftNode::open(raft_config).await.context("opening raft")?;

        let mut families = Families::new(&config, &raft, cert_metrics);
        telemetry.register(&mut families.registry);
        let metrics = families.authority.clone();
        let gossip = match &config.gossip {
            Some(g) => Some(start_gossip(&config, g, &mut families.registry).await?),
            None => None,
        };
        let mut hub =
            EvidenceHub::new(raft.clone(), metrics.clone()).with_telemetry(telemetry.clone());
        if let Some(g) = &gossip {
            hub = hub.with_gossip(g.subscribe());
        }

        let mut tasks = Vec::new();
        if telemetry.is_on() {
            tasks.push(tokio::spawn(super::traces::follow_commits(
                raft.subscribe(),
                telemetry,
            )));
        }
        // The leader's release instants, read by this member's xDS tier.
        let releases = tier::ReleaseInstants::default();
        let xds_server = serve_xds(
            &config,
            (&raft, &metrics, &releases),
            listeners.xds,
            tls.as_ref(),
            &families.grpc,
            &mut tasks,
        );
        tasks.push(tokio::spawn(super::staleness::run(
            xds_server.clone(),
            metrics.clone(),
        )));
        tasks.push(tokio::spawn(super::raft::timings::follow_lag(
            raft.clone(),
            metrics.raft.clone(),
        )));
        let ingest = match (config.ingest, &tls) {
            (Some(addr), Some(t)) => {
                Some(serve_ingest(&config, addr, &hub, &t.ingest, &families, &mut tasks).await?)
            }
            _ => None,
        };
        let federation = match &config.federation {
            Some(f) => {
                let (Some(t), Some(MemberTls { live, .. })) = (&config.tls, &tls) else {
                    anyhow::bail!("federation needs mutual TLS ([authority.tls])");
                };
                let tls = FederationTls {
                    live: Arc::clone(live),
                    trust_domain: t.trust_domain.clone(),
                    metrics: families.certs.clone(),
                };
                Some(start_federation(
                    &config,
                    f,
                    tls,
                    &raft,
                    &mut families.registry,
                    &mut tasks,
                )?)
            }
            None => None,
        };
        let regions = federation.as_ref().map(|f| f.regions.clone());
        let (leader_handle, leader_inbox) = leader::LeaderHandle::new();
        let leader = leader::LeaderThread::spawn(
            leader_context(&config, &raft, &hub, &metrics, regions.clone(), releases),
            leader_inbox,
        )
        .context("starting the leader loop's thread")?;

        let node = federation.map(|f| f.node);
        let api = ApiState::new(
            raft.clone(),
            leader_handle,
            metrics.clone(),
            xds_server.clone(),
            Arc::new(families.registry),
            config.region.clone(),
        )
        .with_federation(node.clone(), regions)
        .with_sidecars(hub.sidecars())
        .with_keyring(Arc::new(KeyringPool::new(
            config.id,
            raft.clone(),
            hub.keyring_broker(),
            gossip.as_ref(),
            tls.as_ref().map(|t| Arc::clone(&t.raft_client)),
        )))
        .with_tls(tls.is_some());
        if let (Some(kube), Some(kube_metrics)) = (config.kubernetes.clone(), families.kube) {
            tasks.push(tokio::spawn(existence::run_kube(
                raft.clone(),
                kube,
                config.region.clone(),
                kube_metrics,
                api.reconciliation(),
            )));
        }
        tasks.push(tokio::spawn(serve_http(
            listeners.http,
            "authority",
            api::router(api),
            tls.as_ref().map(|t| Arc::clone(&t.api)),
            config.limits.http,
            families.http.clone(),
        )));
        // Behind mutual TLS each RPC must come from the member its certificate names.
        let senders = match tls {
            Some(_) => Senders::Certified,
            None => Senders::Unchecked,
        };
        // The leader's keyring operations reach this member's own gossip there too.
        let raft_routes = raft
            .router(senders, families.raft_rpc.clone())
            .merge(member_router(
                gossip.as_ref().map(Gossip::keyring),
                raft.clone(),
                senders,
                families.raft_rpc,
            ));
        tasks.push(tokio::spawn(serve_http(
            listeners.raft,
            "raft",
            raft_routes,
            tls.as_ref().map(|t| Arc::clone(&t.raft_server)),
            config.limits.raft,
            families.http,
        )));
        info!(id = config.id, %http, raft = %raft_addr, tls = tls.is_some(), %xds, ingest = ?ingest, "authority member serving");
        let reloader = tls.as_ref().map(|t| Arc::clone(&t.reloader));
        let cert_watch = reloader.as_ref().and_then(watch_certificates);
        Ok(Self {
            reloader,
            _cert_watch: cert_watch,
            api_client: tls.as_ref().map(|t| Arc::clone(&t.api_client)),
            id: config.id,
            raft,
            http,
            raft_addr,
            xds,
            ingest,
            xds_server,
            metrics,
            tasks,
            leader,
            hub,
            gossip,
            federation: node,
        })
    }

    /// Make this member the first of a new group with `members` (itself included).
    ///
    /// Only the lowest id of the initial voters initialises, and only once: the others
    /// learn the group from it, so there is a single first election instead of a race.
    pub async fn bootstrap(&self, members: BTreeMap<u64, Member>) -> anyhow::Result<()> {
        let initialised = self.raft.watch_metrics().borrow().last_log_index.is_some();
        let first = members.keys().next() == Some(&self.id);
        if initialised || !first {
            return Ok(());
        }
        self.raft.initialize(members).await?;
        Ok(())
    }

    /// This member's Raft handle.
    pub fn raft(&self) -> &RaftNode {
        &self.raft
    }

    /// The evidence hub (the dev region feeds it in process).
    pub fn hub(&self) -> &EvidenceHub {
        &self.hub
    }

    /// SIGHUP: re-read the certificate files now. A certificate that fails its checks
    /// changes nothing; the event says what happened.
    pub async fn reload(&self) -> Option<ReloadEvent> {
        let event = self.reloader.as_ref()?.reload_now().await;
        info!(?event, "certificates reloaded");
        Some(event)
    }

    /// The HTTP API's address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// A client of this member's API authenticating with `token`: over TLS when the API
    /// is (trusting this member's bundle, admitting this region's authorities), else
    /// plaintext. For in-process callers such as tests and drills.
    pub fn api_client(&self, token: Option<String>) -> ApiClient {
        let client = ApiClient::new(&self.http.to_string(), token);
        match &self.api_client {
            Some(tls) => client.with_tls(Arc::clone(tls)),
            None => client,
        }
    }

    /// The Raft listener's address.
    pub fn raft_addr(&self) -> SocketAddr {
        self.raft_addr
    }

    /// The xDS address.
    pub fn xds_addr(&self) -> SocketAddr {
        self.xds
    }

    /// The ingest address, if serving.
    pub fn ingest_addr(&self) -> Option<SocketAddr> {
        self.ingest
    }

    /// The member's `Member` record for joining a group.
    pub fn member(&self) -> Member {
        Member {
            raft_addr: self.raft_addr.to_string(),
            api_addr: self.http.to_string(),
        }
    }

    /// The xDS server (sync state, stats).
    pub fn xds_server(&self) -> &XdsServer {
        &self.xds_server
    }

    /// Metrics.
    pub fn metrics(&self) -> &AuthorityMetrics {
        &self.metrics
    }

    /// The gossip member, when this member gossips.
    pub fn gossip(&self) -> Option<&Gossip> {
        self.gossip.as_ref()
    }

    /// The federation endpoint's UDP address, when this member federates.
    pub fn federation_addr(&self) -> Option<SocketAddr> {
        self.federation.as_ref().map(|f| f.local_addr())
    }

    /// Stop everything (as a crash would, minus the process exit).
    pub async fn shutdown(self) {
        if let Some(g) = self.gossip {
            let _ = g.leave().await;
        }
        self.raft.shutdown().await;
        self.leader.stop().await;
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
        // Every task holding the node has ended; close its endpoint so the port is free.
        if let Some(node) = self.federation.and_then(|f| Arc::try_unwrap(f).ok()) {
            node.shutdown().await;
        }
    }
}

/// The member's API, Raft and xDS listeners, bound before Raft opens.
struct Listeners {
    http: TcpListener,
    raft: TcpListener,
    xds: TcpListener,
}

impl Listeners {
    async fn bind(config: &AuthorityConfig) -> anyhow::Result<Self> {
        async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the {what} listener on {addr}"))
        }
        Ok(Self {
            http: bind(config.http, "HTTP").await?,
            raft: bind(config.raft, "Raft").await?,
            xds: bind(config.xds, "xDS").await?,
        })
    }

    /// The bound addresses (HTTP, Raft, xDS): a configured port 0 is a real one here.
    fn addrs(&self) -> std::io::Result<(SocketAddr, SocketAddr, SocketAddr)> {
        Ok((
            self.http.local_addr()?,
            self.raft.local_addr()?,
            self.xds.local_addr()?,
        ))
    }
}

/// Every metric family the member exposes, in the one registry `/metrics` reads.
struct Families {
    registry: Registry,
    authority: AuthorityMetrics,
    certs: CertMetrics,
    raft_rpc: RaftRpcMetrics,
    http: HttpMetrics,
    grpc: GrpcMetrics,
    kube: Option<KubeMetrics>,
}

impl Families {
    fn new(config: &AuthorityConfig, raft: &RaftNode, certs: CertMetrics) -> Self {
        let authority = AuthorityMetrics {
            // The store counts failed applies itself; the metric is that same counter.
            apply_failures: raft.apply_failures_total(),
            // So do the log's timings.
            raft: raft.timings(),
            ..AuthorityMetrics::default()
        };
        let mut registry = Registry::default();
        authority.register(&mut registry);
        certs.register(&mut registry);
        let raft_rpc = RaftRpcMetrics::default();
        raft_rpc.register(&mut registry);
        raft.election_metrics().register(&mut registry);
        let http = HttpMetrics::default();
        http.register(&mut registry);
        let grpc = GrpcMetrics::default();
        grpc.register(&mut registry);
        let kube = config.kubernetes.as_ref().map(|_| {
            let m = KubeMetrics::new();
            m.register(&mut registry);
            m
        });
        Self {
            registry,
            authority,
            certs,
            raft_rpc,
            http,
            grpc,
            kube,
        }
    }
}

/// Joins the region's gossip pool as `authority-<id>` (prober liveness for the hub), with
/// the keyring a rotation persisted in the data directory, else the configured one.
async fn start_gossip(
    config: &AuthorityConfig,
    g: &GossipSettings,
    registry: &mut Registry,
) -> anyhow::Result<Gossip> {
    let id = config.id;
    let name = NodeName::try_new(format!("authority-{id}"))
        .map_err(|e| anyhow::anyhow!("gossip name: {e}"))?;
    // Bound first, so port 0 works: the identity carries the address peers use.
    let socket = tokio::net::UdpSocket::bind(g.bind)
        .await
        .with_context(|| format!("binding gossip on {}", g.bind))?;
    let addr = socket.local_addr()?;
    let identity = GossipId::new(name, addr, g.zone.clone(), Role::Authority);
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating {}", config.data_dir.display()))?;
    let keyring_file = config.data_dir.join(keyring_file::FILE_NAME);
    let (keyring, source) = keyring_file::load_or(&keyring_file, g.keyring.clone())
        .with_context(|| format!("loading {}", keyring_file.display()))?;
    info!(
        source = source.as_str(),
        primary = %keyring.primary().id(),
        keys = keyring.keys().count(),
        "gossip keyring loaded"
    );
    let mut gc = GossipConfig::new(addr, identity, keyring);
    gc.seeds = g.seeds.clone();
    gc.keyring_file = Some(keyring_file);
    gc.metrics.register(registry);
    Gossip::start_with_socket(gc, socket).context("starting gossip")
}

/// The xDS tier: follows the committed views into its snapshot (admitting callers by the
/// replicated policy) and serves it on `listener`.
fn serve_xds(
    config: &AuthorityConfig,
    (raft, metrics, releases): (&RaftNode, &AuthorityMetrics, &tier::ReleaseInstants),
    listener: TcpListener,
    tls: Option<&MemberTls>,
    grpc_metrics: &GrpcMetrics,
    tasks: &mut Vec<JoinHandle<()>>,
) -> XdsServer {
    let callers = Arc::new(arc_swap::ArcSwap::from_pointee(
        super::authorize::CallerPolicy::new(),
    ));
    let (xds_server, publisher) = XdsServer::new(ServerConfig {
        filter: Some(super::authorize::filter(Arc::clone(&callers))),
        admission: AdmissionConfig {
            share: config.limits.reconnect,
            floor: config.limits.reconnect_floor,
            expected_clients: config.limits.reconnect_expected_clients,
            ..AdmissionConfig::default()
        },
        on_propagated: Some(
            metrics
                .propagation
                .sink(crate::metrics::HOP_AUTHORITY_AGENT),
        ),
        // The releases are stamped here: each node agent is told their age, to time
        // the whole path to its sidecars.
        carry_release_age: true,
        ..ServerConfig::default()
    });
    tasks.push(tokio::spawn(tier::follow(
        raft.clone(),
        publisher,
        callers,
        releases.clone(),
    )));
    // The xDS listener serves ADS alone, on HTTP/2 directly (`waymark_xds::server::http2`):
    // it holds the region's streams, one per node agent and direct sidecar.
    let limits = config.limits.grpc;
    let tls = tls.map(|t| Arc::clone(&t.xds));
    let incoming = IncomingConfig::named("authority_xds", grpc_metrics);
    let serving = xds_server.clone();
    let forever = std::future::pending::<()>();
    tasks.push(tokio::spawn(async move {
        match tls {
            Some(tls) => {
                let incoming = grpc::incoming(listener, tls, incoming);
                serving.serve_incoming(incoming, limits, forever).await;
            }
            None => {
                let incoming = grpc::incoming_plain(listener, incoming);
                serving.serve_incoming(incoming, limits, forever).await;
            }
        }
        tracing::error!("xds tier stopped");
    }));
    xds_server
}

/// Evidence ingest over mutual TLS on `addr`; returns the bound address.
async fn serve_ingest(
    config: &AuthorityConfig,
    addr: SocketAddr,
    hub: &EvidenceHub,
    tls: &Arc<rustls::ServerConfig>,
    families: &Families,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the ingest listener on {addr}"))?;
    let bound = listener.local_addr()?;
    let service = EvidenceService::new(
        Arc::new(hub.clone()),
        config.region.clone(),
        SessionMetrics {
            unattributed: families.authority.sessions_unattributed.clone(),
            malformed: families.authority.messages_malformed.clone(),
        },
    )
    .into_server();
    let incoming = grpc::incoming(
        listener,
        Arc::clone(tls),
        IncomingConfig::named("ingest", &families.grpc),
    );
    let server = config.limits.grpc.server().add_service(service);
    tasks.push(tokio::spawn(async move {
        if let Err(error) = server.serve_with_incoming(incoming).await {
            tracing::error!(%error, "evidence ingest stopped");
        }
    }));
    Ok(bound)
}

/// What the leader loop needs, from the member's configuration and the parts started.
fn leader_context(
    config: &AuthorityConfig,
    raft: &RaftNode,
    hub: &EvidenceHub,
    metrics: &AuthorityMetrics,
    regions: Option<RegionsHandle>,
    releases: tier::ReleaseInstants,
) -> LeaderContext {
    let limits = &config.limits;
    LeaderContext {
        raft: raft.clone(),
        hub: hub.clone(),
        metrics: metrics.clone(),
        pipeline: PipelineConfig {
            region: config.region.clone(),
            zones: config.zones.clone(),
            evaluator: EvaluatorConfig::default(),
            delta: DeltaConfig {
                admit_releases_per_sec: if limits.shed_admissions {
                    limits.admit_releases_per_sec
                } else {
                    u32::MAX
                },
                ..DeltaConfig::default()
            },
            fraction_guard: fraction_guard_on(),
        },
        regions,
        pressure_after: limits
            .shed_admissions
            .then_some(limits.publish_pressure_after),
        releases,
    }
}

/// Watches the certificate files so a reissued certificate is loaded without a signal;
/// without a watch (the platform refused one), SIGHUP still reloads.
fn watch_certificates(reloader: &Arc<Reloader>) -> Option<WatchHandle> {
    match reloader.watch() {
        Ok(w) => Some(w),
        Err(error) => {
            warn!(%error, "cannot watch certificate files; reload on SIGHUP only");
            None
        }
    }
}

/// What a started federation hands the rest of the member.
struct StartedFederation {
    node: Arc<FederationNode>,
    regions: RegionsHandle,
}

/// Binds the federation endpoint and starts the tasks around it: local aggregates from
/// committed views, reconciliation records to the audit log, the front-door probe.
fn start_federation(
    config: &AuthorityConfig,
    f: &FederationSettings,
    tls: FederationTls,
    raft: &RaftNode,
    registry: &mut Registry,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<StartedFederation> {
    let peers = f
        .peers
        .iter()
        .map(|p| PeerConfig {
            region: p.region.clone(),
            member: p.member.clone(),
            addr: p.addr,
        })
        .collect();
    let mut fc = FederationConfig::new(config.region.clone(), f.bind, peers);
    fc.stale_after = f.stale_after;
    fc.session.digest_interval = f.digest_interval;
    fc.seed = config.id;
    let fed_metrics = FederationMetrics::new();
    fed_metrics.register(registry);
    let region_metrics = RegionMetrics::default();
    region_metrics.register(registry);
    let aggregates: SharedAggregates = Arc::default();
    let node = FederationNode::start(fc, tls, Arc::clone(&aggregates), fed_metrics)
        .context("starting the federation endpoint")?;
    let node = Arc::new(node);
    let signal: SharedSignal = Arc::new(Mutex::new(RegionSignal::new(f.signal)));
    tasks.push(tokio::spawn(regions::publish_local(
        raft.clone(),
        config.region.clone(),
        Arc::clone(&aggregates),
        region_metrics.clone(),
    )));
    tasks.push(tokio::spawn(regions::audit_reconciliations(
        raft.clone(),
        Arc::clone(&node),
        region_metrics.clone(),
    )));
    tasks.push(tokio::spawn(regions::probe_front_doors(
        f.front_doors.clone(),
        f.probe_interval,
        f.probe_timeout,
        Arc::clone(&signal),
        region_metrics,
    )));
    info!(region = %config.region, addr = %node.local_addr(), peers = f.peers.len(), front_doors = f.front_doors.len(), "federating");
    if f.drop_stale_peers {
        warn!(
            "drop_stale_peers is set: stale peer regions lose their tier 2 (breaks ADR-14; drills only)"
        );
    }
    let drop_stale = f.drop_stale_peers.then(|| Arc::clone(&node));
    Ok(StartedFederation {
        node,
        regions: RegionsHandle {
            aggregates,
            signal,
            drop_stale,
        },
    })
}

/// Serves `router` on `listener` (`name` labels its metrics): TLS with `tls`, plaintext
/// without.
async fn serve_http(
    listener: TcpListener,
    name: &'static str,
    router: axum::Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: HttpLimits,
    metrics: HttpMetrics,
) {
    let forever = std::future::pending();
    match tls {
        Some(tls) => {
            crate::listener::serve_tls(listener, name, router, limits, metrics, tls, forever).await;
        }
        None => crate::listener::serve(listener, name, router, limits, metrics, forever).await,
    }
}

/// The member's TLS configs, all over its one live certificate.
struct MemberTls {
    /// xDS server: the region's node agents and workloads.
    xds: Arc<rustls::ServerConfig>,
    /// Evidence ingest server: the region's node agents and workloads.
    ingest: Arc<rustls::ServerConfig>,
    /// API server: operators, and the region's node agents and workloads, by certificate;
    /// clients without one (bearer tokens) are admitted to the handshake too.
    api: Arc<rustls::ServerConfig>,
    /// Raft server: the region's authority members.
    raft_server: Arc<rustls::ServerConfig>,
    /// Raft client: presents this member's certificate, admits the region's members.
    raft_client: Arc<rustls::ClientConfig>,
    /// A token-authenticated client of the API (no certificate), trusting this member's
    /// bundle: see [`Authority::api_client`].
    api_client: Arc<rustls::ClientConfig>,
    /// The certificate itself (federation builds its own configs over it).
    live: Arc<LiveMaterial>,
    /// Re-reads the certificate files into `live` when they change (and on SIGHUP).
    reloader: Arc<Reloader>,
}

/// Loads this member's certificate, checks it names this member, and builds its configs.
async fn tls_configs(
    t: &TlsSettings,
    config: &AuthorityConfig,
    metrics: &CertMetrics,
) -> anyhow::Result<MemberTls> {
    let own = PeerPolicy {
        trust_domain: t.trust_domain.clone(),
        accepted: KindSet::only(IdentityKind::Authority),
        region: None,
    };
    let material = load_material(&t.paths, &own, SystemTime::now())
        .await
        .context("loading this member's certificate")?;
    let region = own_region(&material.identity, config)?;
    let live = LiveMaterial::new(material);
    // A reissued certificate must name the same identity (so the same member and region).
    let reloader = Reloader::new(t.paths.clone(), Arc::clone(&live), own, metrics.clone());
    // Only this region's node agents and workloads: a node of another region reads its
    // own region's views, and this region's others only through tier 2.
    let peers = PeerPolicy {
        trust_domain: t.trust_domain.clone(),
        accepted: KindSet::only(IdentityKind::Node).with(IdentityKind::Workload),
        region: Some(region.clone()),
    };
    let xds = server_config(&live, peers.clone(), metrics.clone(), &[ALPN_H2])?;
    let ingest = server_config(&live, peers, metrics.clone(), &[ALPN_H2])?;
    let callers = PeerPolicy {
        trust_domain: t.trust_domain.clone(),
        accepted: KindSet::only(IdentityKind::Operator)
            .with(IdentityKind::Node)
            .with(IdentityKind::Workload),
        region: Some(region.clone()),
    };
    let api = server_config_client_optional(&live, callers, metrics.clone(), &[ALPN_HTTP1])?;
    let members = super::raft::tls::peer_policy(t.trust_domain.clone(), region.clone());
    let raft_server = server_config(&live, members.clone(), metrics.clone(), &[ALPN_HTTP1])?;
    let raft_client = client_config(&live, members, metrics.clone(), &[ALPN_HTTP1])?;
    let authorities = PeerPolicy {
        trust_domain: t.trust_domain.clone(),
        accepted: KindSet::only(IdentityKind::Authority),
        region: Some(region.clone()),
    };
    let roots = Arc::clone(&live.current().roots);
    let api_client = anonymous_client_config(roots, authorities, metrics.clone(), &[ALPN_HTTP1])?;
    Ok(MemberTls {
        xds: Arc::new(xds),
        ingest: Arc::new(ingest),
        api: Arc::new(api),
        raft_server: Arc::new(raft_server),
        raft_client: Arc::new(raft_client),
        api_client: Arc::new(api_client),
        live,
        reloader,
    })
}

/// The region of this member's certificate, once it is known to name this member: its
/// peers admit a Raft RPC only from the member id the certificate names, and only from
/// their own region, so any other certificate would leave it unable to take part.
fn own_region(identity: &Identity, config: &AuthorityConfig) -> anyhow::Result<Name> {
    let (Some(region), Some(member)) = (identity.region(), identity.member()) else {
        anyhow::bail!("authority.tls.cert_chain: {identity} is not an authority identity");
    };
    if member_id(member.as_str()) != Some(config.id) {
        anyhow::bail!(
            "authority.tls.cert_chain: the certificate names authority member {member}, but this \
             member's Raft id is {} (authority.id): its peers would refuse every Raft RPC from it",
            config.id
        );
    }
    if region.as_str() != config.region.as_str() {
        anyhow::bail!(
            "authority.tls.cert_chain: the certificate is for region {region}, but this member \
             serves region {} (authority.region)",
            config.region
        );
    }
    Ok(region.clone())
}

/// Set to `1` to switch the fraction guard off (ADR-08): a broken health check then drains
/// the service it judges. For drills that must show what the guard prevents
/// (`waymark-drill run bad-health-check --break-fraction-guard`); never in production.
pub const UNSAFE_DISABLE_FRACTION_GUARD: &str = "WAYMARK_UNSAFE_DISABLE_FRACTION_GUARD";

/// Whether the fraction guard runs: always, unless [`UNSAFE_DISABLE_FRACTION_GUARD`] is `1`.
fn fraction_guard_on() -> bool {
    let off = std::env::var(UNSAFE_DISABLE_FRACTION_GUARD).is_ok_and(|v| v.trim() == "1");
    if off {
        tracing::error!(
            "{UNSAFE_DISABLE_FRACTION_GUARD}=1: the fraction guard is OFF; a broken health \
             check will drain the services it judges (drills only)"
        );
    }
    !off
}
