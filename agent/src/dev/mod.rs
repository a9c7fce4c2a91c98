//! `waymark dev`: a whole region in one process, and the demo backends it runs.
//!
//! Nothing here is simulated: a single-member authority (Raft on redb, the evaluator, the
//! xDS tier, evidence ingest over mutual TLS), a node agent (sled cache, bounds, local xDS,
//! DNS, LRS, gossip, probing) and demo backends on real loopback sockets, with a dev CA
//! written to the state folder. Only the topology is small: three zones on one host, one
//! agent probing everything (prober assignment falls back to any live agent when a zone
//! has none).

pub mod backends;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use http::Method;
use serde_json::json;
use waymark_certs::ca::HostSan;
use waymark_certs::layout::PkiDir;
use waymark_certs::reload::MaterialPaths;
use waymark_certs::{Identity, Name, TrustDomain};
use waymark_core::model::{InstanceId, SelfReport};

use self::backends::{BackendOptions, BackendSpec, Backends, SelfReportFn};
use crate::api_client::ApiClient;
use crate::authority::member::Authority;
use crate::authority::settings::{
    AuthorityConfig, FederationSettings, GossipSettings, TlsSettings,
};
use crate::cli::tls::{ClientFiles, api_client_config};
use crate::gossip::Keyring;
use crate::node::NodeAgent;
use crate::node::config::{
    AgentConfig, Bounds, Gossip as GossipSection, Listen, ProbeSection, Tls,
};

/// The dev estate's trust domain: every certificate of the dev CA names it.
pub const TRUST_DOMAIN: &str = "dev.waymark";
const REGION: &str = "dev";
const NODE: &str = "dev-node";
const ZONES: [&str; 3] = ["az1", "az2", "az3"];

/// `waymark dev` flags. Every listener is on loopback; port 0 picks a free one.
#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// Where state lives (Raft log, the agent's cache, the dev CA).
    #[arg(long, default_value = ".waymark-dev")]
    pub dir: PathBuf,
    /// The authority's HTTP API (what the CLI talks to).
    #[arg(long, default_value = "127.0.0.1:8500")]
    pub api: SocketAddr,
    /// The node agent's xDS/LRS listener (what the host's Envoys connect to).
    #[arg(long, default_value = "127.0.0.1:18000")]
    pub xds: SocketAddr,
    /// The node agent's DNS listener.
    #[arg(long, default_value = "127.0.0.1:8600")]
    pub dns: SocketAddr,
    /// The node agent's HTTP API.
    #[arg(long, default_value = "127.0.0.1:8400")]
    pub agent_api: SocketAddr,
    /// The demo backends' control API.
    #[arg(long, default_value = "127.0.0.1:8300")]
    pub backends_api: SocketAddr,
}

/// The demo services: (name, instances per zone, probe, shared dependency). Every one
/// declares `db`, so `degraded-dependency` works on any demo backend.
const SERVICES: [(&str, usize, &str, Option<&str>); 3] = [
    ("web", 2, "http", Some("db")),
    ("checkout", 1, "http", Some("db")),
    ("inventory", 1, "tcp", Some("db")),
];

/// Run the dev region until `shutdown` resolves.
pub async fn run(
    args: DevArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let otel = crate::otel::OtelSettings::from_env(std::env::vars())?;
    let dev = DevRegion::start_traced(args, otel.as_ref()).await?;
    if crate::logging::json_in_force() {
        // Every line is a JSON object then: the listeners as an event, not the guide.
        dev.announce();
    } else {
        print!("{}", dev.guide());
    }
    shutdown.await;
    tracing::info!("stopping the dev region");
    dev.stop().await;
    Ok(())
}

/// A running dev region.
pub struct DevRegion {
    authority: Authority,
    agent: NodeAgent,
    backends: Arc<Backends>,
    instances: Arc<Mutex<BTreeMap<String, InstanceId>>>,
    renewals: tokio::task::JoinHandle<()>,
    control: tokio::task::JoinHandle<()>,
    backends_api: SocketAddr,
    token: String,
    token_file: std::path::PathBuf,
    ca_bundle: PathBuf,
    /// The dev CA's folder.
    pki: PathBuf,
    /// TLS towards the authority API: the dev bundle, no client certificate (the token).
    tls: Arc<rustls::ClientConfig>,
}

/// The dev region's operator, bootstrapped with every grant.
pub const DEV_OPERATOR: &str = "dev";
/// How long the dev operator's token lasts (a new one is minted at every start).
pub const DEV_TOKEN_TTL: Duration = Duration::from_secs(30 * 86_400);

/// Write a credential readable by this user only.
fn write_secret(path: &std::path::Path, secret: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(secret.as_bytes())?;
    file.write_all(b"\n")?;
    Ok(())
}

impl DevRegion {
    /// Start everything; returns once services are declared and backends registered.
    pub async fn start(args: DevArgs) -> anyhow::Result<Self> {
        Self::start_traced(args, None).await
    }

    /// [`DevRegion::start`], its authority and agent exporting traces as `otel` says
    /// (`None`: off; see `crate::otel`), each under its own service name.
    pub async fn start_traced(
        args: DevArgs,
        otel: Option<&crate::otel::OtelSettings>,
    ) -> anyhow::Result<Self> {
        Self::start_with(args, otel, None).await
    }

    /// [`DevRegion::start`], its authority federating as `federation` says. Its federation
    /// identity is its member certificate (`region/dev/authority/1`, issued by the dev CA),
    /// so a peer region's members need certificates of that CA: [`DevRegion::pki`] issues
    /// them.
    pub async fn start_federated(
        args: DevArgs,
        federation: FederationSettings,
    ) -> anyhow::Result<Self> {
        Self::start_with(args, None, Some(federation)).await
    }

    async fn start_with(
        args: DevArgs,
        otel: Option<&crate::otel::OtelSettings>,
        federation: Option<FederationSettings>,
    ) -> anyhow::Result<Self> {
        // Its listeners carry no credential but the dev token and the dev CA: a dev region
        // is for this host alone.
        for (flag, addr) in [
            ("--api", args.api),
            ("--xds", args.xds),
            ("--dns", args.dns),
            ("--agent-api", args.agent_api),
            ("--backends-api", args.backends_api),
        ] {
            anyhow::ensure!(
                addr.ip().is_loopback(),
                "{flag} {addr}: a dev region listens on loopback only"
            );
        }
        std::fs::create_dir_all(&args.dir)
            .with_context(|| format!("creating {}", args.dir.display()))?;
        let pki_dir = args.dir.join("pki");
        let pki = dev_pki(&pki_dir)?;
        let keyring = dev_keyring(&args.dir.join("gossip.key"))?;

        let zones = ZONES.iter().map(|z| z.parse()).collect::<Result<_, _>>()?;
        let authority = Authority::start_traced(
            AuthorityConfig {
                id: 1,
                region: REGION.parse()?,
                zones,
                data_dir: args.dir.join("authority"),
                http: args.api,
                // One member: no peer calls it, so any free loopback port (mutual TLS anyway).
                raft: "127.0.0.1:0".parse()?,
                xds: "127.0.0.1:0".parse()?,
                ingest: Some("127.0.0.1:0".parse()?),
                tls: Some(TlsSettings {
                    trust_domain: TrustDomain::new(TRUST_DOMAIN)?,
                    paths: pki.authority.clone(),
                }),
                kubernetes: None,
                gossip: Some(GossipSettings {
                    bind: "127.0.0.1:0".parse()?,
                    zone: ZONES[0].parse()?,
                    seeds: Vec::new(),
                    keyring: Keyring::parse(std::slice::from_ref(&keyring))?,
                }),
                federation,
                limits: Default::default(),
            },
            otel,
        )
        .await
        .context("starting the authority")?;
        authority
            .bootstrap(BTreeMap::from([(1, authority.member())]))
            .await?;
        let mut m = authority.raft().watch_metrics();
        tokio::time::timeout(Duration::from_secs(30), m.wait_for(|m| m.state.is_leader()))
            .await
            .context("the authority did not become leader")??;
        // Even the dev region refuses anonymous requests: its operator holds a token,
        // written where the guide says, readable by this user only.
        let token = crate::authority::credentials::operator_token(
            authority.raft(),
            DEV_OPERATOR,
            DEV_OPERATOR,
            DEV_TOKEN_TTL,
        )
        .await
        .context("minting the dev operator's token")?;
        let token_file = args.dir.join("operator.token");
        write_secret(&token_file, &token)?;
        let tls = api_client_config(
            &ClientFiles {
                bundle: pki.bundle.clone(),
                identity: None,
            },
            SystemTime::now(),
        )?;
        let api = ApiClient::new(&authority.http_addr().to_string(), Some(token.clone()))
            .with_tls(Arc::clone(&tls));
        for (name, _, probe, dependency) in SERVICES {
            let probe = match probe {
                "http" => {
                    json!({"kind": "http", "path": "/healthz", "interval": "1s", "timeout": "500ms"})
                }
                _ => json!({"kind": "tcp", "interval": "1s", "timeout": "500ms"}),
            };
            let dependencies: Vec<_> = dependency
                .map(|d| json!({"name": d, "shared": true, "authority": "weight_reduction"}))
                .into_iter()
                .collect();
            let body = json!({
                "owner": "dev",
                "contract": {
                    "profile": {"probe": true, "self_report": true, "passive": true},
                    "probe": probe,
                    "dependencies": dependencies,
                    "self_report_interval": "5s",
                },
            });
            api.send(Method::PUT, &format!("/v1/services/{name}"), Some(&body))
                .await?
                .json()
                .with_context(|| format!("declaring service {name}"))?;
        }

        let gossip_seed = authority
            .gossip()
            .map(|g| g.local_addr())
            .context("the authority has no gossip")?;
        let agent = NodeAgent::start_traced(
            AgentConfig {
                name: NODE.parse()?,
                region: REGION.parse()?,
                zone: ZONES[0].parse()?,
                data_dir: args.dir.join("agent"),
                upstream: vec![authority.xds_addr().to_string()],
                upstream_standby: true,
                ingest: authority
                    .ingest_addr()
                    .map(|a| vec![a.to_string()])
                    .unwrap_or_default(),
                api: vec![authority.http_addr().to_string()],
                listen: Listen {
                    xds: args.xds,
                    dns: args.dns,
                    http: args.agent_api,
                    http_tokens_file: None,
                    local_plaintext: true,
                },
                bounds: Bounds::default(),
                services_dir: None,
                api_token_file: None,
                gossip: Some(GossipSection {
                    bind: "127.0.0.1:0".parse()?,
                    seeds: vec![gossip_seed.into()],
                    keys: vec![keyring],
                }),
                tls: Some(pki.node.clone()),
                // The demo backends listen on loopback: the dev region allows it, and nothing
                // else the default policy refuses.
                probe: ProbeSection {
                    allow_cidrs: vec!["127.0.0.0/8".parse()?],
                },
            },
            otel,
        )
        .await
        .context("starting the node agent")?;

        // Backends report about themselves through the agent, under their issued ids.
        let instances: Arc<Mutex<BTreeMap<String, InstanceId>>> = Arc::default();
        let relay = agent.self_report_relay();
        let ids = Arc::clone(&instances);
        let self_report: SelfReportFn = Arc::new(move |name: &str, report: SelfReport| {
            let id = ids
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(name)
                .cloned();
            if let Some(id) = id {
                relay(id, report);
            }
        });
        let mut specs = Vec::new();
        for (service, per_zone, _, _) in SERVICES {
            for zone in ZONES {
                for i in 1..=per_zone {
                    specs.push(BackendSpec {
                        instance: format!("{service}-{zone}-{i}"),
                        service: service.to_owned(),
                        zone: zone.to_owned(),
                        bind: "127.0.0.1:0".parse()?,
                    });
                }
            }
        }
        let backends = Arc::new(
            Backends::start(specs.clone(), BackendOptions::default(), self_report)
                .context("starting the demo backends")?,
        );
        let addresses = backends.addresses();
        for spec in &specs {
            let address = addresses[&spec.instance];
            let body = json!({
                "service": spec.service,
                "locality": {"region": REGION, "zone": spec.zone, "node": NODE},
                "address": {"ip": address.ip().to_string(), "port": address.port()},
                "tags": [spec.instance],
                "lease_ms": 30_000,
            });
            let v = api
                .send(Method::POST, "/v1/instances", Some(&body))
                .await?
                .json()
                .with_context(|| format!("registering {}", spec.instance))?;
            let id: InstanceId = v["instance"]
                .as_str()
                .context("registration answered without an instance id")?
                .parse()?;
            instances
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(spec.instance.clone(), id);
        }
        let renewals = tokio::spawn(renew(api, Arc::clone(&instances)));

        let listener = tokio::net::TcpListener::bind(args.backends_api)
            .await
            .with_context(|| format!("binding the backends API on {}", args.backends_api))?;
        let backends_api = listener.local_addr()?;
        let router = Arc::clone(&backends).router();
        let control = tokio::spawn(crate::listener::serve(
            listener,
            "dev_backends",
            router,
            crate::listener::HttpLimits::LOCAL,
            crate::listener::HttpMetrics::default(),
            std::future::pending(),
        ));
        Ok(Self {
            authority,
            agent,
            backends,
            instances,
            renewals,
            control,
            backends_api,
            token,
            token_file,
            ca_bundle: pki.bundle,
            pki: pki_dir,
            tls,
        })
    }

    /// A client of the authority API over TLS, as the dev operator.
    pub fn api_client(&self) -> ApiClient {
        ApiClient::new(
            &self.authority.http_addr().to_string(),
            Some(self.token.clone()),
        )
        .with_tls(Arc::clone(&self.tls))
    }

    /// The dev estate's trust bundle (what `--ca-bundle` and curl's `--cacert` take).
    pub fn ca_bundle(&self) -> &std::path::Path {
        &self.ca_bundle
    }

    /// The dev CA (root and region CAs), to issue certificates its members trust: a
    /// federation peer's, say.
    pub fn pki(&self) -> PkiDir {
        PkiDir::new(self.pki.clone())
    }

    /// The dev operator's bearer token (every grant), as written to [`Self::token_file`].
    pub fn operator_token(&self) -> &str {
        &self.token
    }

    /// Where the dev operator's token is written.
    pub fn token_file(&self) -> &std::path::Path {
        &self.token_file
    }

    /// The authority (for tests).
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The node agent (for tests).
    pub fn agent(&self) -> &NodeAgent {
        &self.agent
    }

    /// The demo backends' control API.
    pub fn backends_api(&self) -> SocketAddr {
        self.backends_api
    }

    /// Demo backend name → issued instance id.
    pub fn instances(&self) -> BTreeMap<String, InstanceId> {
        self.instances
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every listener and what to try.
    pub fn guide(&self) -> String {
        let api = self.authority.http_addr();
        let b = self.agent.bound();
        let backends = self.backends_api;
        format!(
            "\
waymark dev: one region ({REGION}), zones {zones}, state in this folder's .waymark-dev (or --dir)

  authority API      https://{api}       (operator token in {token})
  web UI             https://{api}/ui/   (in a browser: sign in with that token; docs/dev.md)
  authority xDS      {xds} (mutual TLS; the agent's upstream)
  node agent xDS     {axds}   (plain text on loopback: point Envoy here)
  node agent DNS     {dns}   (udp+tcp)
  node agent API     http://{ahttp}
  demo backends API  http://{backends}

in another terminal (the API refuses anonymous requests, even here):
  export WAYMARK_API=https://{api}
  export WAYMARK_CA_BUNDLE={bundle}
  export WAYMARK_TOKEN_FILE={token}

try this:
  waymark services
  waymark acl whoami
  curl -s --cacert {bundle} -H \"Authorization: Bearer $(cat {token})\" https://{api}/v1/services
  curl -s http://{ahttp}/v1/view
  dig @{dip} -p {dport} web.service.waymark. SRV +short
  waymark members --agent {ahttp}
  curl -s http://{backends}/v1/dev/backends
  curl -s -X PUT http://{backends}/v1/dev/backends/web-az1-1/mode -d '{{\"mode\":\"fail-hard\"}}'
       (modes: healthy, fail-hard, slow, flap, not-ready, degraded-dependency)
  waymark explain <instance>                  (instance ids: waymark services / the view)
  waymark override <instance> --justification \"trying it\"
  envoy -c deploy/envoy/dev.yaml               (then: curl http://127.0.0.1:10000/)
  waymark proxy-status                         (the agent, and under it that Envoy)
  waymark proxy-config dev-sidecar             (what it holds: clusters, endpoints)
",
            zones = ZONES.join(", "),
            xds = self.authority.xds_addr(),
            axds = b.xds,
            dns = b.dns,
            dip = b.dns.ip(),
            dport = b.dns.port(),
            ahttp = b.http,
            token = self.token_file.display(),
            bundle = self.ca_bundle.display(),
        )
    }

    /// The guide's listeners and credentials as one event, for a JSON log.
    pub fn announce(&self) {
        let b = self.agent.bound();
        tracing::info!(
            region = REGION,
            api = %self.authority.http_addr(),
            xds = %self.authority.xds_addr(),
            agent_xds = %b.xds,
            agent_dns = %b.dns,
            agent_api = %b.http,
            backends_api = %self.backends_api,
            token_file = %self.token_file.display(),
            ca_bundle = %self.ca_bundle.display(),
            "dev region ready"
        );
    }

    /// Stop: deregister the demo instances, then the agent, then the authority.
    pub async fn stop(self) {
        self.renewals.abort();
        let api = self.api_client();
        for id in self.instances().values() {
            let _ = api
                .send(Method::DELETE, &format!("/v1/instances/{id}"), None)
                .await;
        }
        self.control.abort();
        self.backends.shutdown().await;
        self.agent.shutdown().await;
        self.authority.shutdown().await;
    }
}

/// Keep the demo instances' leases.
async fn renew(api: ApiClient, instances: Arc<Mutex<BTreeMap<String, InstanceId>>>) {
    loop {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let ids: Vec<InstanceId> = instances
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        for id in ids {
            if let Err(e) = api
                .send(Method::PUT, &format!("/v1/instances/{id}/renew"), None)
                .await
                .and_then(|r| r.json())
            {
                tracing::warn!(instance = %id, error = %e, "renewal failed");
            }
        }
    }
}

/// Certificates for the dev region, created once in `dir`.
struct DevPki {
    /// The dev estate's trust bundle.
    bundle: PathBuf,
    authority: MaterialPaths,
    node: Tls,
}

fn dev_pki(dir: &std::path::Path) -> anyhow::Result<DevPki> {
    let td = TrustDomain::new(TRUST_DOMAIN)?;
    let pki = PkiDir::new(dir.to_path_buf());
    let now = SystemTime::now();
    pki.init(&td, &[Name::new(REGION)?], now)
        .context("creating the dev CA")?;
    let issue = |path: &str, hosts: &[HostSan]| -> anyhow::Result<MaterialPaths> {
        let identity = Identity::parse(&format!("spiffe://{TRUST_DOMAIN}/{path}"))?;
        // Re-issued at every start: a dev folder may sit for weeks.
        let (_, paths) = pki.issue_with_hosts(
            &identity,
            None,
            Duration::from_secs(7 * 24 * 3600),
            None,
            now,
            hosts,
        )?;
        Ok(MaterialPaths {
            cert_chain: paths.fullchain,
            key: paths.key,
            bundle: pki.bundle(),
        })
    };
    // The member name is the Raft id: peers admit Raft RPC only from the id it names.
    // The API is reached with curl too, which checks the name it dialled.
    let authority = issue(
        &format!("region/{REGION}/authority/1"),
        &HostSan::loopback(),
    )?;
    let node = issue(&format!("region/{REGION}/node/{NODE}"), &[])?;
    Ok(DevPki {
        bundle: pki.bundle(),
        authority,
        node: Tls {
            trust_domain: TRUST_DOMAIN.into(),
            cert_chain: node.cert_chain,
            key: node.key,
            bundle: node.bundle,
        },
    })
}

/// The region's gossip key, created once (hex).
fn dev_keyring(path: &std::path::Path) -> anyhow::Result<String> {
    if let Ok(k) = std::fs::read_to_string(path) {
        return Ok(k.trim().to_owned());
    }
    let mut key = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
        .map_err(|_| anyhow::anyhow!("no randomness for the gossip key"))?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(path, &hex).with_context(|| format!("writing {}", path.display()))?;
    Ok(hex)
}
