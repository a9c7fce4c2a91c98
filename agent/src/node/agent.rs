//! The node agent process: the shells around [`LocalView`] (ADR-01, 04, 05, 10, 13, 15).
//!
//! ```text
//!  authority xDS ──► XdsClient ──persist (sled batch)──► ACK
//!                        │ applied
//!                        ▼
//!                   LocalView (bounds) ──► local xDS/LRS server ──► host's Envoys
//!                        │            └──► DNS table, LRS address book
//!  authority ingest ◄── session ◄── prober, LRS forwarder, relayed self-reports,
//!                                   the sidecars' sync state (and their config, asked)
//!  gossip pool ◄──► foca over sealed UDP
//! ```
//!
//! Start order matters: the cache is loaded and served before anything dials out, so a
//! sidecar restarted during an outage gets its view at once. Stop order too: service
//! definitions are deregistered before the local listeners close.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Endpoint;
use waymark_certs::CertMetrics;
use waymark_certs::PeerPolicy;
use waymark_certs::grpc::{GrpcLimits, GrpcMetrics, IncomingConfig};
use waymark_certs::identity::{IdentityKind, KindSet, TrustDomain};
use waymark_certs::reload::{MaterialPaths, Reloader, WatchHandle, load_material};
use waymark_certs::tls::{
    ALPN_H2, LiveMaterial, client_config, server_config, server_config_client_optional,
};
use waymark_core::bounds::BoundsConfig;
use waymark_core::model::{InstanceId, SelfReport};
use waymark_core::units::Permille;
use waymark_lkg::{SledViewStore, ViewStore};
use waymark_xds::client::{Applied, ClientConfig, Subscription, XdsClient};
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT, TYPE_LISTENER, TYPE_ROUTE};
use waymark_xds::{ServerConfig, XdsServer};

use super::cache;
use super::config::AgentConfig;
use super::dns::{DnsConfig, DnsServer, DnsTable};
use super::lrs::{LrsForwardConfig, LrsForwarder};
use super::metrics::{AgentMetrics, ServiceLabels};
use super::probe::{AddressPolicy, Prober, ProberConfig};
use super::session::{self, SessionConfig};
use super::shared::{Shared, ViewStatus};
use super::view::LocalView;
use crate::evidence::{AgentMessage, SidecarReport, WireSample};
use crate::gossip::{Gossip, GossipConfig, GossipId, Keyring, Role, keyring_file};
use crate::listener::{ALPN_HTTP1, HttpLimits, HttpMetrics};
use waymark_core::model::Observation;

/// Connections the local xDS/LRS listener takes at once: the host's sidecars and
/// workloads, a few per pod.
pub const LOCAL_GRPC_CONNECTIONS_MAX: usize = 1_024;

/// Local listeners as bound (port 0 resolved).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// xDS and LRS for the host's sidecars.
    pub xds: SocketAddr,
    /// DNS (UDP and TCP).
    pub dns: SocketAddr,
    /// HTTP API.
    pub http: SocketAddr,
    /// Gossip (UDP), if any.
    pub gossip: Option<SocketAddr>,
}

/// A running node agent.
pub struct NodeAgent {
    shared: Arc<Shared>,
    bound: Bound,
    tasks: Vec<JoinHandle<()>>,
    gossip: Option<Gossip>,
    shutdown: watch::Sender<bool>,
    client: XdsClient,
    _dns: DnsServer,
    registrations: Option<super::registration::Registrations>,
    reloader: Option<Arc<Reloader>>,
    _cert_watch: Option<WatchHandle>,
}

impl NodeAgent {
    /// Start the agent: load and serve the cache, then connect upstream.
    pub async fn start(config: AgentConfig) -> anyhow::Result<Self> {
        Self::start_traced(config, None).await
    }

    /// [`NodeAgent::start`], exporting traces as `otel` says (`None`: off; see
    /// `crate::otel`).
    pub async fn start_traced(
        config: AgentConfig,
        otel: Option<&crate::otel::OtelSettings>,
    ) -> anyhow::Result<Self> {
        let telemetry = crate::otel::Telemetry::start(otel, crate::otel::AGENT_SERVICE)?;
        let mut registry = Registry::default();
        let metrics = AgentMetrics::default();
        metrics.register(&mut registry);
        telemetry.register(&mut registry);
        let (shutdown, shutdown_rx) = watch::channel(false);

        // 1. The cache, served before anything else.
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("creating {}", config.data_dir.display()))?;
        let store: Arc<dyn ViewStore> = Arc::new(
            SledViewStore::open(&config.data_dir.join("lkg"))
                .context("opening the last-known-good cache")?,
        );
        let loaded = cache::load(store.as_ref()).context("loading the last-known-good cache")?;
        metrics.lkg_loaded_records.set(loaded.records as i64);
        metrics.lkg_corrupt_records.inc_by(loaded.corrupt as u64);
        if loaded.corrupt > 0 {
            tracing::error!(
                corrupt = loaded.corrupt,
                "corrupted cache records discarded"
            );
        }
        let bounds = BoundsConfig {
            shrink_max: Permille::saturating(u32::from(config.bounds.shrink_max_permille)),
            shrink_window: config.bounds.shrink_window,
        };
        let mut view = LocalView::new(
            config.zone.clone(),
            bounds,
            u32::from(config.bounds.max_ejection_percent),
        );
        let started_from = if loaded.records > 0 { "cache" } else { "empty" };
        let restored = view.restore(loaded.upstream.clone(), loaded.served_high_water, now());
        tracing::info!(
            records = loaded.records,
            services = restored.services.len(),
            "last-known-good view loaded"
        );

        // 2. TLS material, if any.
        let tls = match &config.tls {
            Some(t) => Some(tls_configs(t, &mut registry).await?),
            None => None,
        };

        // 3. The local xDS + LRS server, serving the cache at once.
        // What each sidecar was sent is kept for `proxy-config`: a host's few clients
        // afford it (see `ServerConfig::record_held`).
        let acks = Arc::new(crate::otel::AckSpans::new(
            telemetry.clone(),
            crate::metrics::HOP_AGENT_SIDECAR,
        ));
        let on_propagated = {
            let histograms = metrics.propagation.sink(crate::metrics::HOP_AGENT_SIDECAR);
            let acks = Arc::clone(&acks);
            waymark_xds::server::PropagationSink::new(move |p| {
                histograms.report(p);
                acks.acked(p.released_at, p.took);
            })
        };
        let (xds, publisher) = XdsServer::new(ServerConfig {
            record_held: true,
            on_propagated: Some(on_propagated),
            ..ServerConfig::default()
        });
        let (lrs_tx, mut lrs_rx) = mpsc::channel::<Vec<WireSample>>(16);
        let lrs = LrsForwarder::start(LrsForwardConfig::default(), lrs_tx, &mut registry);
        let dns_table = Arc::new(ArcSwap::from_pointee(DnsTable::default()));
        let (outbound_tx, outbound_rx) = mpsc::channel::<AgentMessage>(256);
        let (connected_tx, connected_rx) = watch::channel(false);
        let confirmed_at = loaded.confirmed_at.unwrap_or_else(SystemTime::now);

        let mut gossip = None;
        let mut gossip_rx = None;
        let mut gossip_addr = None;
        if let Some(g) = &config.gossip {
            let configured = Keyring::parse(&g.keys).context("agent.gossip.keys")?;
            // A keyring rotated online wins over the configured keys (docs/operations.md).
            let keyring_file = config.data_dir.join(keyring_file::FILE_NAME);
            let (keyring, source) = keyring_file::load_or(&keyring_file, configured)
                .with_context(|| format!("loading {}", keyring_file.display()))?;
            tracing::info!(
                source = source.as_str(),
                primary = %keyring.primary().id(),
                keys = keyring.keys().count(),
                "gossip keyring loaded"
            );
            // Bound first, so port 0 works: the identity carries the address peers use.
            let socket = tokio::net::UdpSocket::bind(g.bind)
                .await
                .with_context(|| format!("binding gossip on {}", g.bind))?;
            let addr = socket.local_addr()?;
            let identity =
                GossipId::new(config.name.clone(), addr, config.zone.clone(), Role::Agent);
            let mut gc = GossipConfig::new(addr, identity, keyring);
            gc.seeds = g.seeds.clone();
            gc.keyring_file = Some(keyring_file);
            gc.metrics.register(&mut registry);
            let started = Gossip::start_with_socket(gc, socket).context("starting gossip")?;
            gossip_rx = Some(started.subscribe());
            gossip_addr = Some(started.local_addr());
            gossip = Some(started);
        }

        let shared = Arc::new(Shared {
            view: Mutex::new(view),
            store: Arc::clone(&store),
            high_water: std::sync::atomic::AtomicU64::new(loaded.served_high_water),
            publisher,
            xds: xds.clone(),
            dns: Arc::clone(&dns_table),
            lrs,
            metrics: metrics.clone(),
            registry: Mutex::new(Registry::default()),
            connected: connected_rx,
            confirmed_at: Mutex::new(confirmed_at),
            started_from,
            telemetry: telemetry.clone(),
            acks,
            gossip: gossip_rx,
            outbound: outbound_tx.clone(),
            heartbeat: Mutex::new(Instant::now()),
            name: config.name.clone(),
            probe_refusals: std::sync::OnceLock::new(),
            aged: Mutex::default(),
        });
        {
            let v = shared.lock_view();
            let mut all = restored.clone();
            all.other = all.other.max(1); // publish even an empty view: sidecars get an answer
            shared.publish(&v, &all);
        }

        let mut tasks = Vec::new();
        let xds_listener = tokio::net::TcpListener::bind(config.listen.xds)
            .await
            .with_context(|| format!("binding xDS on {}", config.listen.xds))?;
        let xds_addr = xds_listener.local_addr()?;
        {
            let mut stop = shutdown_rx.clone();
            let router = GrpcLimits::default()
                .server()
                .add_service(xds.service())
                .add_service(shared.lrs.service())
                .add_service(
                    crate::evidence::EvidenceService::new(
                        Arc::new(super::selfreport::LocalRelay::new(
                            outbound_tx.clone(),
                            metrics.clone(),
                        )),
                        config.region.clone(),
                        crate::evidence::SessionMetrics {
                            unattributed: metrics.self_reports_refused.clone(),
                            malformed: metrics.self_report_messages_malformed.clone(),
                        },
                    )
                    .into_server(),
                );
            let stop_fut = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let server_tls = tls
                .as_ref()
                .filter(|_| !config.listen.local_plaintext)
                .map(|t| Arc::clone(&t.server));
            let grpc_metrics = GrpcMetrics::default();
            grpc_metrics.register(&mut registry);
            let incoming = IncomingConfig {
                connections_max: LOCAL_GRPC_CONNECTIONS_MAX,
                ..IncomingConfig::named("agent_xds", &grpc_metrics)
            };
            tasks.push(tokio::spawn(async move {
                let result = match server_tls {
                    Some(cfg) => {
                        let incoming = waymark_certs::grpc::incoming(xds_listener, cfg, incoming);
                        router
                            .serve_with_incoming_shutdown(incoming, stop_fut)
                            .await
                    }
                    None => {
                        let incoming = waymark_certs::grpc::incoming_plain(xds_listener, incoming);
                        router
                            .serve_with_incoming_shutdown(incoming, stop_fut)
                            .await
                    }
                };
                // Either way the sidecars now meet a closed port: say so.
                match result {
                    Ok(()) => tracing::info!("local xDS server stopped"),
                    Err(e) => tracing::error!(error = %e, "local xDS server failed"),
                }
            }));
        }

        // 4. DNS.
        let dns = DnsServer::start(
            DnsConfig {
                bind: config.listen.dns,
                ..DnsConfig::default()
            },
            Arc::clone(&dns_table),
            &mut registry,
        )
        .context("starting DNS")?;
        let dns_addr = dns.local_addr();

        // 5. Upstream: persisted before acknowledged; starts from the cache.
        let seed = seed_of(config.name.as_str());
        let client_config = ClientConfig {
            seed,
            persist: Some(cache::persist(Arc::clone(&store))),
            initial: cache::initial(&loaded.upstream),
            tls: tls.as_ref().map(|t| Arc::clone(&t.upstream)),
            standby: config.upstream_standby,
            ..ClientConfig::default()
        };
        // `http://` even over TLS: the client's connector does the handshake.
        let endpoints = config
            .upstream
            .iter()
            .map(|u| Endpoint::from_shared(format!("http://{u}")))
            .collect::<Result<Vec<_>, _>>()
            .context("agent.upstream")?;
        anyhow::ensure!(
            !endpoints.is_empty(),
            "agent.upstream: at least one authority member"
        );
        let node = Node {
            id: config.name.to_string(),
            cluster: config.region.to_string(),
            locality: Some(Locality {
                region: config.region.to_string(),
                zone: config.zone.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let subs = [TYPE_CLUSTER, TYPE_ENDPOINT, TYPE_LISTENER, TYPE_ROUTE].map(|t| {
            (
                t.to_owned(),
                Subscription {
                    wildcard: true,
                    ..Default::default()
                },
            )
        });
        let (client, applied) = XdsClient::connect_any(client_config, endpoints, node, subs);
        tasks.push(tokio::spawn(standby_loop(
            client.stream_status(),
            shared.metrics.clone(),
        )));
        tasks.push(tokio::spawn(apply_loop(
            Arc::clone(&shared),
            applied,
            connected_tx,
            shutdown_rx.clone(),
        )));
        tasks.push(tokio::spawn(sidecar_sync_loop(Arc::clone(&shared))));

        // 6. Evidence: prober, LRS forwarding, relayed self-reports, one session.
        let (probe_tx, probe_rx) = mpsc::channel::<WireSample>(1024);
        let (prober, prober_task) = Prober::start(
            ProberConfig {
                seed: Some(seed),
                policy: AddressPolicy::new(config.probe.allow_cidrs.clone()),
                ..ProberConfig::default()
            },
            probe_tx,
        );
        prober.register(&mut registry);
        let _ = shared.probe_refusals.set(prober.refusals());
        tasks.push(prober_task);
        {
            let outbound = outbound_tx.clone();
            let metrics = metrics.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(samples) = lrs_rx.recv().await {
                    if outbound
                        .try_send(AgentMessage::Samples { samples })
                        .is_err()
                    {
                        metrics.evidence_dropped.inc();
                    }
                }
            }));
        }
        // The sidecars' sync state, reported upstream on the same session.
        let (reports_tx, reports_rx) = watch::channel(SidecarReport::default());
        tasks.push(tokio::spawn(super::sidecars::report_loop(
            Arc::clone(&shared),
            reports_tx,
        )));
        let feed = super::sidecars::SidecarFeed {
            reports: reports_rx,
            shared: Arc::clone(&shared),
        };
        let session_config = SessionConfig {
            members: config.ingest.clone(),
            zone: config.zone.clone(),
            tls: tls.as_ref().map(|t| Arc::clone(&t.upstream)),
            seed,
            keyring: gossip.as_ref().map(Gossip::keyring),
            telemetry,
        };
        tasks.push(tokio::spawn(session::run(
            session_config,
            prober,
            probe_rx,
            outbound_rx,
            metrics.clone(),
            feed,
        )));

        // 7. The HTTP API.
        let http_listener = tokio::net::TcpListener::bind(config.listen.http)
            .await
            .with_context(|| format!("binding HTTP on {}", config.listen.http))?;
        let http_addr = http_listener.local_addr()?;
        {
            let tokens = match &config.listen.http_tokens_file {
                Some(path) => {
                    let metrics = super::api_auth::AuthMetrics::default();
                    metrics.register(&mut registry);
                    let tokens = super::api_auth::LocalTokens::load(path, metrics)
                        .context("agent.listen.http_tokens_file")?;
                    tracing::info!(file = %path.display(), tokens = tokens.len(), "local API tokens loaded");
                    Some(Arc::new(tokens))
                }
                None => None,
            };
            let app = super::api::router(Arc::clone(&shared), tokens);
            let mut stop = shutdown_rx.clone();
            let stop = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let http_metrics = HttpMetrics::default();
            http_metrics.register(&mut registry);
            // Off loopback over TLS with the node's certificate (the config check requires
            // [agent.tls] there); on loopback in plain text.
            let api_tls = tls
                .as_ref()
                .filter(|_| !config.listen.http.ip().is_loopback())
                .map(|t| Arc::clone(&t.http));
            tasks.push(match api_tls {
                Some(cfg) => tokio::spawn(crate::listener::serve_tls(
                    http_listener,
                    "agent",
                    app,
                    HttpLimits::LOCAL,
                    http_metrics,
                    cfg,
                    stop,
                )),
                None => tokio::spawn(crate::listener::serve(
                    http_listener,
                    "agent",
                    app,
                    HttpLimits::LOCAL,
                    http_metrics,
                    stop,
                )),
            });
        }

        // 8. Service definitions for runtimes nothing watches.
        let registrations = match &config.services_dir {
            Some(dir) => Some(
                super::registration::Registrations::start(
                    dir,
                    &config,
                    http_client_for(&config, tls.as_ref())?,
                )
                .await
                .context("agent.services_dir")?,
            ),
            None => None,
        };

        // Certificates are re-read when their files change (and on SIGHUP).
        let reloader = tls.as_ref().map(|t| Arc::clone(&t.reloader));
        let cert_watch = match &reloader {
            Some(r) => match r.watch() {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch certificate files; reload on SIGHUP only");
                    None
                }
            },
            None => None,
        };

        *shared
            .registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = registry;
        tracing::info!(xds = %xds_addr, dns = %dns_addr, http = %http_addr, "node agent serving");
        Ok(Self {
            shared,
            bound: Bound {
                xds: xds_addr,
                dns: dns_addr,
                http: http_addr,
                gossip: gossip_addr,
            },
            tasks,
            gossip,
            shutdown,
            client,
            _dns: dns,
            registrations,
            reloader,
            _cert_watch: cert_watch,
        })
    }

    /// SIGHUP: re-read service definitions and certificate files. What fails to parse
    /// changes nothing and is reported.
    pub async fn reload(&self) -> anyhow::Result<()> {
        if let Some(r) = &self.reloader {
            let event = r.reload_now().await;
            tracing::info!(?event, "certificates reloaded");
        }
        if let Some(r) = &self.registrations {
            r.reload().await?;
        }
        Ok(())
    }

    /// Where the listeners are.
    pub fn bound(&self) -> Bound {
        self.bound
    }

    /// The gossip member, when this agent gossips.
    pub fn gossip(&self) -> Option<&Gossip> {
        self.gossip.as_ref()
    }

    /// The served view.
    pub fn status(&self) -> ViewStatus {
        self.shared.status()
    }

    /// A handle that relays self-reports from workloads this process trusts (the demo
    /// backends of `waymark dev`, which run inside it). Workloads elsewhere report over
    /// mutual TLS to the agent's evidence service.
    pub fn self_report_relay(&self) -> impl Fn(InstanceId, SelfReport) + Send + Sync + 'static {
        let outbound = self.shared.outbound.clone();
        let metrics = self.shared.metrics.clone();
        move |instance, report| {
            let message = AgentMessage::Relayed {
                samples: vec![WireSample {
                    instance,
                    observation: Observation::SelfReport(report),
                }],
            };
            if outbound.try_send(message).is_err() {
                metrics.evidence_dropped.inc();
            }
        }
    }

    /// Stop: deregister service definitions first, then leave gossip, then close the
    /// listeners. Returns once every task the agent started has ended and the upstream
    /// client has let go of the last-known-good cache, so an agent started on the same
    /// data directory right after opens it (its lock is held until then).
    pub async fn shutdown(mut self) {
        if let Some(r) = self.registrations.take() {
            r.deregister_all().await;
        }
        if let Some(g) = self.gossip.take() {
            let _ = g.leave().await;
        }
        let _ = self.shutdown.send(true);
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        self.client.stop().await;
    }
}

/// Apply every upstream change; release held-back removals on time; keep the staleness
/// metrics current.
async fn apply_loop(
    shared: Arc<Shared>,
    mut applied: watch::Receiver<Arc<Applied>>,
    connected: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let due = shared.lock_view().poll_timeout();
        let timer = async {
            match due {
                Some(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = applied.changed() => {
                if changed.is_err() {
                    return;
                }
                let state = applied.borrow_and_update().clone();
                connected.send_replace(state.connected);
                shared.metrics.upstream_connected.set(i64::from(state.connected));
                // The client counts NACKs since it started, as the counter does.
                let counted = shared.metrics.upstream_nacks.get();
                shared.metrics.upstream_nacks.inc_by(state.nacks.saturating_sub(counted));
                let counted = shared.metrics.release_ages_ignored.get();
                shared
                    .metrics
                    .release_ages_ignored
                    .inc_by(state.ages_ignored.saturating_sub(counted));
                let received = SystemTime::now();
                let released_at = now();
                let mut view = shared.lock_view();
                let changes = view.apply(&state.types, released_at);
                if !changes.is_empty() || !changes.refused.is_empty() {
                    tracing::info!(services = changes.services.len(), other = changes.other, refused = changes.refused.len(), "upstream view applied");
                }
                shared.publish(&view, &changes);
                shared.trace_apply(&view, &changes, received, released_at);
                if state.connected {
                    *shared.confirmed_at.lock().unwrap_or_else(PoisonError::into_inner) = SystemTime::now();
                }
                drop(view);
                // A service's age is reported from the moment it is served.
                refresh_staleness(&shared);
            }
            () = timer => {
                let mut view = shared.lock_view();
                let changes = view.handle_timeout(now());
                shared.publish(&view, &changes);
            }
            _ = tick.tick() => {
                *shared.heartbeat.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
                // A release some sidecar never acknowledges ends its span here.
                shared.acks.expire(now());
                if *connected.borrow() {
                    *shared.confirmed_at.lock().unwrap_or_else(PoisonError::into_inner) = SystemTime::now();
                }
                refresh_staleness(&shared);
            }
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// The driver's clock, as the view's instant. tokio's, so paused-time tests work, and the
/// view's deadlines are then on the clock `apply_loop` sleeps on.
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

fn refresh_staleness(shared: &Shared) {
    let confirmed = *shared
        .confirmed_at
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let age = SystemTime::now()
        .duration_since(confirmed)
        .unwrap_or_default()
        .as_secs_f64();
    shared.metrics.lkg_age_seconds.set(age);
    // Every service's view is as old as the last upstream confirmation: the agent does not
    // age a service whose upstream view it refused separately (that refusal is its own
    // metric, `waymark_agent_views_refused`).
    let served: BTreeSet<String> = shared
        .lock_view()
        .states()
        .map(|(n, _)| n.clone())
        .collect();
    let mut aged = shared.aged.lock().unwrap_or_else(PoisonError::into_inner);
    for gone in aged.difference(&served) {
        shared.metrics.view_age_seconds.remove(&ServiceLabels {
            service: gone.clone(),
        });
    }
    for name in &served {
        shared
            .metrics
            .view_age_seconds
            .get_or_create(&ServiceLabels {
                service: name.clone(),
            })
            .set(age);
    }
    *aged = served;
}

/// Once a second, each sidecar's view age (how long it has acknowledged less than it was
/// sent) into `waymark_xds_client_view_age_seconds{hop="agent_sidecar"}`, and the NACKs
/// the sidecars sent into `waymark_agent_sidecar_nacks_total`. Runs until aborted.
async fn sidecar_sync_loop(shared: Arc<Shared>) {
    let mut lag = waymark_xds::sync::Lag::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let clients = shared.xds.sync_state();
        let report = lag.sample(
            &clients,
            Instant::now().into_std(),
            waymark_core::defaults::WITHDRAWAL_BUDGET_P99,
        );
        shared
            .metrics
            .propagation
            .observe_view_ages(crate::metrics::HOP_AGENT_SIDECAR, &report.view_ages);
        let nacks = shared
            .xds
            .stats()
            .nacks
            .load(std::sync::atomic::Ordering::Relaxed);
        let counted = shared.metrics.sidecar_nacks.get();
        shared
            .metrics
            .sidecar_nacks
            .inc_by(nacks.saturating_sub(counted));
    }
}

/// Export the upstream standby's state until the client stops.
async fn standby_loop(
    mut status: tokio::sync::watch::Receiver<waymark_xds::client::StreamStatus>,
    metrics: super::metrics::AgentMetrics,
) {
    let mut promotions = 0;
    while status.changed().await.is_ok() {
        let (standby, promoted) = {
            let s = status.borrow_and_update();
            (s.standby, s.promotions)
        };
        metrics.upstream_standby.set(i64::from(standby));
        metrics
            .upstream_standby_promotions
            .inc_by(promoted.saturating_sub(promotions));
        promotions = promoted;
    }
}

/// TLS configs: the server side for sidecars and workloads, the client side towards the
/// authority.
struct AgentTls {
    server: Arc<rustls::ServerConfig>,
    /// The local HTTP API off loopback (HTTP/1.1; readers authenticate by bearer token,
    /// so a client certificate is optional, and checked when presented).
    http: Arc<rustls::ServerConfig>,
    upstream: Arc<rustls::ClientConfig>,
    /// Client side towards the authority API (HTTP/1.1), presenting the node's identity.
    api: Arc<rustls::ClientConfig>,
    reloader: Arc<Reloader>,
}

async fn tls_configs(t: &super::config::Tls, registry: &mut Registry) -> anyhow::Result<AgentTls> {
    let trust_domain = TrustDomain::new(&t.trust_domain)
        .map_err(|e| anyhow::anyhow!("agent.tls.trust_domain: {e}"))?;
    let own = PeerPolicy {
        trust_domain: trust_domain.clone(),
        accepted: KindSet::only(IdentityKind::Node),
        region: None,
    };
    let paths = MaterialPaths {
        cert_chain: t.cert_chain.clone(),
        key: t.key.clone(),
        bundle: t.bundle.clone(),
    };
    let material = load_material(&paths, &own, SystemTime::now())
        .await
        .context("loading this node's certificate")?;
    let live = LiveMaterial::new(material);
    let metrics = CertMetrics::new();
    // On /metrics: this agent's own refusals (a sidecar's wrong_kind, an authority's
    // wrong_region) and reloads.
    metrics.register(registry);
    let reloader = Reloader::new(paths, Arc::clone(&live), own, metrics.clone());
    // A node speaks for its own region only: its sidecars and its authorities are of it.
    let region = live.current().identity.region().cloned();
    let sidecars = PeerPolicy {
        trust_domain: trust_domain.clone(),
        accepted: KindSet::only(IdentityKind::Workload),
        region: region.clone(),
    };
    let server = server_config(&live, sidecars, metrics.clone(), &[ALPN_H2])?;
    let readers = PeerPolicy {
        trust_domain: trust_domain.clone(),
        accepted: KindSet::ALL,
        region: None,
    };
    let http = server_config_client_optional(&live, readers, metrics.clone(), &[ALPN_HTTP1])?;
    let authorities = PeerPolicy {
        trust_domain,
        accepted: KindSet::only(IdentityKind::Authority),
        region,
    };
    let upstream = client_config(&live, authorities.clone(), metrics.clone(), &[ALPN_H2])?;
    // The authority API, as this node (its registrations are checked against that name).
    let api = client_config(&live, authorities, metrics, &[ALPN_HTTP1])?;
    Ok(AgentTls {
        server: Arc::new(server),
        http: Arc::new(http),
        upstream: Arc::new(upstream),
        api: Arc::new(api),
        reloader,
    })
}

fn http_client_for(
    config: &AgentConfig,
    tls: Option<&AgentTls>,
) -> anyhow::Result<super::registration::ApiTarget> {
    let token = match &config.api_token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("agent.api_token_file: reading {}", path.display()))?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    Ok(super::registration::ApiTarget {
        members: config.api.clone(),
        token,
        tls: tls.map(|t| Arc::clone(&t.api)),
    })
}

/// A stable per-node seed for jitter (FNV-1a of the name).
fn seed_of(name: &str) -> u64 {
    waymark_core::hash::fnv1a(name.as_bytes())
}
