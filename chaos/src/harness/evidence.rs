//! A region whose evidence paths are real: an authority member with mutual-TLS evidence
//! ingest and a gossip pool, node agents that join the pool (so the leader assigns them
//! probe targets), probe their targets and forward their Envoys' load reports upstream, and
//! a fleet of demo backends declared under a contract that asks for probes and passive
//! evidence. The plain-text [`super::authority::AuthorityProc`] and
//! [`super::agent::AgentProc`] carry views only; drills about *evidence* (grey failure, a
//! bad health check) need this one.
//!
//! Everything is on loopback; certificates come from a CA created in the run folder.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http::Method;
use serde_json::{Value, json};
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::config::GossipSection;
use waymark_agent::dev::backends::{BackendOptions, BackendSpec, Backends, Mode, SelfReportFn};
use waymark_agent::node::config::Gossip;
use waymark_agent::tls::TlsSection;

use super::authority::Voter;
use super::region::Pki;
use super::{Proc, RoleProc, configs, free_port, loopback, wait_serving, wait_until};
use crate::rng::SplitMix64;

/// The drills' trust domain.
pub const TRUST_DOMAIN: &str = "drill.waymark";
/// The actor the drills act as on the authority's API.
const ACTOR: &str = "waymark-drill";

/// The drill CA ([`Pki`]) with one region, and the region's gossip key.
#[derive(Debug)]
pub struct RegionPki {
    pki: Pki,
    region: String,
    gossip_key: String,
}

impl RegionPki {
    /// Creates the CA and `region`'s intermediate under `dir`, and a gossip key from `seed`.
    pub fn create(dir: &Path, region: &str, seed: u64) -> anyhow::Result<Self> {
        let pki = Pki::create(dir, TRUST_DOMAIN, &[region])?;
        let mut rng = SplitMix64::new(seed ^ 0x6b65_7972_696e_6721);
        let gossip_key: String = (0..4).map(|_| format!("{:016x}", rng.next_u64())).collect();
        Ok(Self {
            pki,
            region: region.to_owned(),
            gossip_key,
        })
    }

    /// Issues `spiffe://<td>/region/<region>/<what>`: the `[*.tls]` naming its files.
    pub(crate) fn issue(&self, what: &str) -> anyhow::Result<TlsSection> {
        self.pki.issue(&format!("region/{}/{what}", self.region))
    }

    /// `bundle.pem`, what every peer of the region trusts.
    pub fn bundle(&self) -> PathBuf {
        self.pki.bundle()
    }

    /// The client side of node `node`'s mutual TLS towards its region's authorities, built
    /// as a node agent builds it: a certificate issued into the run folder, loaded from its
    /// files, and a policy admitting only authority members of this region.
    pub async fn node_client(&self, node: &str) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        use waymark_certs::tls::{ALPN_H2, LiveMaterial, client_config};
        use waymark_certs::{CertMetrics, IdentityKind, KindSet, PeerPolicy, TrustDomain};
        let paths = self
            .pki
            .issue_paths(&format!("region/{}/node/{node}", self.region))?;
        let trust_domain = TrustDomain::new(TRUST_DOMAIN)?;
        let own = PeerPolicy {
            trust_domain: trust_domain.clone(),
            accepted: KindSet::only(IdentityKind::Node),
            region: None,
        };
        let material =
            waymark_certs::reload::load_material(&paths, &own, std::time::SystemTime::now())
                .await
                .with_context(|| format!("loading node {node}'s certificate"))?;
        let live = LiveMaterial::new(material);
        let region = live.current().identity.region().cloned();
        let authorities = PeerPolicy {
            trust_domain,
            accepted: KindSet::only(IdentityKind::Authority),
            region,
        };
        let config = client_config(&live, authorities, CertMetrics::new(), &[ALPN_H2])?;
        Ok(Arc::new(config))
    }
}

/// A single-member authority with TLS, evidence ingest and gossip.
#[derive(Debug)]
pub struct EvidenceAuthority {
    bin: PathBuf,
    config: PathBuf,
    log: PathBuf,
    envs: Vec<(String, String)>,
    proc: Option<Proc>,
    http: SocketAddr,
    xds: SocketAddr,
    ingest: SocketAddr,
    gossip: SocketAddr,
}

impl EvidenceAuthority {
    /// Writes the configuration under `dir`; the process gets `envs` besides `RUST_LOG`
    /// (e.g. a knob a drill breaks on purpose). Does not start anything.
    pub fn new(
        bin: &Path,
        dir: &Path,
        pki: &RegionPki,
        zone: &str,
        envs: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let (http, raft, xds, ingest, gossip) = (
            loopback(free_port()?),
            loopback(free_port()?),
            loopback(free_port()?),
            loopback(free_port()?),
            loopback(free_port()?),
        );
        std::fs::create_dir_all(dir)?;
        // The member name is its Raft id (1): peers admit Raft RPC only as the id it names.
        let tls = pki.issue("authority/1")?;
        let config = dir.join("authority.toml");
        let mut a = configs::authority(1, &pki.region, &[zone], &dir.join("data"))?;
        a.http = http;
        a.raft = raft;
        a.xds = xds;
        a.ingest = Some(ingest);
        a.members = configs::members(&[Voter { id: 1, http, raft }]);
        a.tls = Some(tls);
        a.gossip = Some(GossipSection {
            bind: gossip,
            zone: None,
            seeds: Vec::new(),
            keys: vec![pki.gossip_key.clone()],
        });
        a.acl = configs::drill_acl(dir)?;
        configs::write_authority(&config, a)?;
        super::api_over_tls(http, &pki.bundle())?;
        Ok(Self {
            bin: bin.to_path_buf(),
            config,
            log: dir.join("authority.log"),
            envs: envs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            proc: None,
            http,
            xds,
            ingest,
            gossip,
        })
    }

    /// The HTTP API.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// Start the process (no wait).
    pub fn start(&mut self) -> anyhow::Result<()> {
        let config = self.config.display().to_string();
        let mut envs: Vec<(&str, &str)> = vec![("RUST_LOG", "info")];
        envs.extend(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        self.proc = Some(Proc::spawn(
            "authority",
            &self.bin,
            ["authority", "--config", config.as_str()],
            &envs,
            &self.log,
        )?);
        Ok(())
    }

    /// Waits for `/readyz`, within `deadline`.
    pub async fn wait_ready(&mut self, deadline: Duration) -> anyhow::Result<()> {
        let proc = self.proc.as_mut().context("the authority is not running")?;
        wait_serving(
            proc,
            "the authority's /readyz",
            deadline,
            self.http,
            "/readyz",
        )
        .await
    }

    /// The last lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.proc
            .as_ref()
            .map(|p| p.log_tail(n))
            .unwrap_or_default()
    }
}

/// A node agent with TLS upstream, evidence ingest and gossip; its sidecars connect to
/// it in plain text on loopback.
#[derive(Debug)]
pub struct EvidenceAgent {
    process: RoleProc,
    name: String,
    http: SocketAddr,
    xds: SocketAddr,
}

impl EvidenceAgent {
    /// Writes the configuration of node `name` in `zone` under `dir`; does not start it.
    pub fn new(
        bin: &Path,
        dir: &Path,
        pki: &RegionPki,
        name: &str,
        zone: &str,
        authority: &EvidenceAuthority,
    ) -> anyhow::Result<Self> {
        let (xds, dns, http, gossip) = (
            free_port()?,
            free_port()?,
            free_port()?,
            loopback(free_port()?),
        );
        std::fs::create_dir_all(dir)?;
        let tls = pki.issue(&format!("node/{name}"))?;
        let config = dir.join("agent.toml");
        let mut a = configs::agent(
            name,
            &pki.region,
            zone,
            &dir.join("data"),
            &[authority.xds.to_string()],
        )?;
        a.ingest = vec![authority.ingest.to_string()];
        a.api = vec![authority.http.to_string()];
        a.listen.xds = loopback(xds);
        a.listen.dns = loopback(dns);
        a.listen.http = loopback(http);
        a.listen.local_plaintext = true;
        a.gossip = Some(Gossip {
            bind: gossip,
            seeds: vec![configs::name(&authority.gossip.to_string())?],
            keys: vec![pki.gossip_key.clone()],
        });
        a.tls = Some(tls);
        configs::write_agent(&config, a)?;
        Ok(Self {
            process: RoleProc::new("agent", bin, config, dir.join("agent.log"), loopback(http)),
            name: name.to_owned(),
            http: loopback(http),
            xds: loopback(xds),
        })
    }

    /// The node's name (its evidence is attributed to it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The local xDS/LRS address (what Envoy dials).
    pub fn xds_addr(&self) -> SocketAddr {
        self.xds
    }

    /// The agent's HTTP API.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// Start the process (no wait).
    pub fn start(&mut self) -> anyhow::Result<()> {
        self.process.start()
    }

    /// Waits for `/readyz`, within `deadline`.
    pub async fn wait_ready(&mut self, deadline: Duration) -> anyhow::Result<()> {
        self.process.wait_ready(deadline).await
    }

    /// The last lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }
}

/// A contract asking for probes (HTTP `GET /healthz` every second) and callers' outcomes,
/// with no slow-start ramp so every weight a caller sees is the verdict's own.
pub fn probed_contract() -> Value {
    json!({
        "profile": {"probe": true, "self_report": false, "passive": true},
        "probe": {"kind": "http", "path": "/healthz", "interval": "1s", "timeout": "500ms"},
        "slow_start": "0s",
    })
}

/// Demo backends of one service declared under a given contract and registered with an
/// evidence-capable authority.
pub struct ProbedFleet {
    backends: Backends,
    api: ApiClient,
    service: String,
    /// Demo instance name → the id the authority issued.
    ids: BTreeMap<String, String>,
    addresses: BTreeMap<String, SocketAddr>,
    renewals: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for ProbedFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbedFleet")
            .field("ids", &self.ids)
            .finish()
    }
}

impl ProbedFleet {
    /// Declares `service` with `contract` at `api` (retrying until the authority accepts
    /// writes, up to `deadline`), starts `count` backends in `zone` with `options`, and
    /// registers each on node `node` with the longest lease, renewed until shutdown.
    pub async fn start(
        api: SocketAddr,
        service: &str,
        contract: Value,
        count: usize,
        (region, zone, node): (&str, &str, &str),
        options: BackendOptions,
        deadline: Duration,
    ) -> anyhow::Result<Self> {
        let client = super::api_client(api);
        let body = json!({"owner": ACTOR, "contract": contract});
        let path = format!("/v1/services/{service}");
        wait_until("the authority accepts a service", deadline, async || {
            client
                .send(Method::PUT, &path, Some(&body))
                .await
                .ok()
                .filter(|r| r.status.is_success())
        })
        .await?;
        let specs: Vec<BackendSpec> = (1..=count)
            .map(|i| BackendSpec {
                instance: format!("{service}-{zone}-{i}"),
                service: service.to_owned(),
                zone: zone.to_owned(),
                bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            })
            .collect();
        // The contract asks for no self-reports: nothing to relay.
        let self_report: SelfReportFn = Arc::new(|_, _| {});
        let backends =
            Backends::start(specs, options, self_report).context("starting the demo backends")?;
        let addresses = backends.addresses();
        let lease = super::backends::MAX_LEASE;
        let mut ids = BTreeMap::new();
        for (name, addr) in &addresses {
            let reg = json!({
                "service": service,
                "locality": {"region": region, "zone": zone, "node": node},
                "address": {"ip": addr.ip().to_string(), "port": addr.port()},
                "tags": [name],
                "lease_ms": u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            });
            let v = client
                .send(Method::POST, "/v1/instances", Some(&reg))
                .await?
                .json()
                .with_context(|| format!("registering {name}"))?;
            let id = v["instance"]
                .as_str()
                .context("registration answered without an instance id")?
                .to_owned();
            ids.insert(name.clone(), id);
        }
        let renewals = tokio::spawn(renew(
            client.clone(),
            ids.values().cloned().collect(),
            lease / 3,
        ));
        Ok(Self {
            backends,
            api: client,
            service: service.to_owned(),
            ids,
            addresses: addresses.into_iter().collect(),
            renewals,
        })
    }

    /// Demo instance name → issued instance id.
    pub fn ids(&self) -> &BTreeMap<String, String> {
        &self.ids
    }

    /// Demo instance name → the address it listens on (what callers' views name).
    pub fn addresses(&self) -> &BTreeMap<String, SocketAddr> {
        &self.addresses
    }

    /// Switch one backend's mode.
    pub fn set_mode(&self, name: &str, mode: Mode) -> anyhow::Result<()> {
        Ok(self.backends.set_mode(name, mode)?)
    }

    /// Replace the service's contract (what a bad health-check push does).
    pub async fn put_contract(&self, contract: Value) -> anyhow::Result<()> {
        let body = json!({"owner": ACTOR, "contract": contract});
        let r = self
            .api
            .send(
                Method::PUT,
                &format!("/v1/services/{}", self.service),
                Some(&body),
            )
            .await?;
        anyhow::ensure!(
            r.status.is_success(),
            "the authority refused the contract: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        Ok(())
    }

    /// Requests served and failed per backend.
    pub fn served(&self) -> BTreeMap<String, (u64, u64)> {
        self.backends
            .status()
            .into_iter()
            .map(|s| (s.instance, (s.served, s.failed)))
            .collect()
    }

    /// Stop every backend.
    pub async fn shutdown(&self) {
        self.renewals.abort();
        self.backends.shutdown().await;
    }
}

impl Drop for ProbedFleet {
    fn drop(&mut self) {
        self.renewals.abort();
    }
}

async fn renew(client: ApiClient, ids: Vec<String>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        for id in &ids {
            let r = client
                .send(Method::PUT, &format!("/v1/instances/{id}/renew"), None)
                .await
                .and_then(|r| r.json());
            if let Err(e) = r {
                eprintln!("lease renewal of {id} failed: {e:#}");
            }
        }
    }
}

/// Verdict counts summed over `services` (all when empty) from the authority's
/// `/v1/services` answer.
pub fn counts_from_services(body: &Value, services: &[String]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for s in body.as_array().into_iter().flatten() {
        let name = s["service"].as_str().unwrap_or_default();
        if !services.is_empty() && !services.iter().any(|x| x == name) {
            continue;
        }
        for (verdict, n) in s["verdicts"].as_object().into_iter().flatten() {
            *counts.entry(verdict.clone()).or_default() += n.as_u64().unwrap_or(0);
        }
    }
    counts
}

/// `GET path` on an authority's API as JSON (`None` on any failure).
pub async fn get_json(api: SocketAddr, path: &str) -> Option<Value> {
    let r = super::get_api(api, path, Duration::from_secs(2))
        .await
        .ok()?;
    (r.status == 200)
        .then(|| serde_json::from_str(&r.body).ok())
        .flatten()
}

/// What [`Rig::start`] builds.
#[derive(Debug, Clone)]
pub struct RigSpec {
    pub region: String,
    pub zone: String,
    pub service: String,
    /// The service's contract (e.g. [`probed_contract`]).
    pub contract: Value,
    /// Demo backends of the service (all in `zone`).
    pub backends: usize,
    pub backend_options: BackendOptions,
    /// Node agents, each with one Envoy.
    pub envoys: usize,
    /// Envoys report load to their agent (the deployed bootstraps do).
    pub load_reports: bool,
    /// Extra environment for the authority.
    pub authority_env: Vec<(String, String)>,
    /// Gossip key and nothing else random.
    pub seed: u64,
    /// How long any process may take to become ready.
    pub deadline: Duration,
}

/// An evidence-capable region with traffic-ready Envoys: the authority, the fleet under
/// the spec's contract, one agent and one Envoy per caller host. Every process dies with it.
#[derive(Debug)]
pub struct Rig {
    pub authority: EvidenceAuthority,
    pub fleet: ProbedFleet,
    pub agents: Vec<EvidenceAgent>,
    pub envoys: Vec<super::envoy::EnvoyProc>,
}

impl Rig {
    /// Starts everything under `dir` and waits until every backend is eligible from probes
    /// and every Envoy routes to all of them. `say` gets progress lines.
    pub async fn start(
        spec: &RigSpec,
        waymark: &Path,
        envoy: &Path,
        dir: &Path,
        say: impl Fn(&str),
    ) -> anyhow::Result<Self> {
        let d = spec.deadline;
        let pki = RegionPki::create(&dir.join("pki"), &spec.region, spec.seed)?;
        let env: Vec<(&str, &str)> = spec
            .authority_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut authority =
            EvidenceAuthority::new(waymark, &dir.join("authority"), &pki, &spec.zone, &env)?;
        authority.start()?;
        authority
            .wait_ready(d)
            .await
            .with_context(|| format!("authority log:\n{}", authority.log_tail(30)))?;
        let api = authority.http_addr();
        say(&format!("authority ready on {api}"));
        let fleet = ProbedFleet::start(
            api,
            &spec.service,
            spec.contract.clone(),
            spec.backends,
            (&spec.region, &spec.zone, "n1"),
            spec.backend_options.clone(),
            d,
        )
        .await?;
        say(&format!("{} backends registered", fleet.ids().len()));
        let mut agents = Vec::new();
        for i in 1..=spec.envoys {
            let mut a = EvidenceAgent::new(
                waymark,
                &dir.join(format!("agent-{i}")),
                &pki,
                &format!("n{i}"),
                &spec.zone,
                &authority,
            )?;
            a.start()?;
            agents.push(a);
        }
        for a in &mut agents {
            a.wait_ready(d)
                .await
                .with_context(|| format!("agent {} log:\n{}", a.name(), a.log_tail(30)))?;
        }
        say(&format!("{} agents ready", agents.len()));
        let mut envoys = Vec::new();
        for (i, a) in agents.iter().enumerate() {
            let e = super::envoy::EnvoyProc::new(
                envoy,
                &dir.join(format!("envoy-{}", i + 1)),
                &format!("sidecar-{}", i + 1),
                &spec.region,
                &spec.zone,
                a.xds_addr(),
                &spec.service,
            )?;
            if spec.load_reports {
                e.report_load()?;
            }
            envoys.push(e);
        }
        for e in &mut envoys {
            e.start()?;
        }
        for e in &mut envoys {
            e.wait_routing(d)
                .await
                .with_context(|| format!("envoy log:\n{}", e.log_tail(30)))?;
        }
        let want = spec.backends as u64;
        let services = [spec.service.clone()];
        wait_until("every backend eligible from probes", d, async || {
            let body = get_json(api, "/v1/services").await?;
            let counts = counts_from_services(&body, &services);
            (counts.get("eligible") == Some(&want)).then_some(())
        })
        .await
        .with_context(|| format!("authority log:\n{}", authority.log_tail(30)))?;
        for e in &envoys {
            wait_until("Envoy holds every backend", d, async || {
                (e.endpoints(&spec.service).await == Some(spec.backends)).then_some(())
            })
            .await?;
        }
        say(&format!(
            "{} Envoys routing to {} eligible backends",
            envoys.len(),
            spec.backends
        ));
        Ok(Self {
            authority,
            fleet,
            agents,
            envoys,
        })
    }
}
