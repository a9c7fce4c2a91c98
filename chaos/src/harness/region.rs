//! A region the way production runs one, as child processes: an authority member with
//! mutual TLS, evidence ingest, gossip and (optionally) federation, and node agents that
//! probe, gossip and report over mutual TLS — each bound to an address of the drill's
//! choosing, so that some can run inside a network namespace ([`super::netns`]).
//!
//! Certificates come from the drills' one CA ([`Pki`]); configurations are written
//! here and run through [`RoleProc`] (so `ip netns exec` can prefix them). The plain
//! single-member harness is [`super::authority`]; this one is for drills whose property
//! depends on probing, gossip or federation.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::config::{AuthoritySection, FederationSection, GossipSection};
use waymark_agent::authority::settings::FederationPeerEntry;
use waymark_agent::node::config::Gossip;
use waymark_agent::tls::TlsSection;
use waymark_certs::reload::MaterialPaths;
use waymark_certs::testing::TestPkiDir;

use super::authority::Voter;
use super::{RoleProc, configs, free_port};

/// The drills' CA in the run folder: an estate root and one intermediate per region, made
/// by `waymark_certs::testing` (the layout and issuing code `waymark certs` runs), issuing
/// each role its `[*.tls]`. Every drill's certificates come from here.
#[derive(Debug)]
pub struct Pki {
    pki: TestPkiDir,
}

impl Pki {
    /// The CA and `regions`' intermediates under `dir`.
    pub fn create(dir: &Path, trust_domain: &str, regions: &[&str]) -> anyhow::Result<Self> {
        let pki = TestPkiDir::try_init(dir, trust_domain, regions)
            .with_context(|| format!("creating the drill CA in {}", dir.display()))?;
        Ok(Self { pki })
    }

    /// The estate's trust bundle.
    pub fn bundle(&self) -> PathBuf {
        self.pki.bundle()
    }

    /// Issues `spiffe://<td>/<path>` (e.g. `region/r1/node/n1`): the `[*.tls]` naming its
    /// files.
    pub fn issue(&self, path: &str) -> anyhow::Result<TlsSection> {
        let paths = self.issue_paths(path)?;
        Ok(TlsSection::new(self.pki.trust_domain().as_str(), &paths))
    }

    /// [`Pki::issue`], as the paths a process loads its material from.
    pub fn issue_paths(&self, path: &str) -> anyhow::Result<MaterialPaths> {
        self.pki
            .try_issue(path)
            .with_context(|| format!("issuing {path}"))
    }
}

/// A UDP port nothing uses on `ip` now.
pub fn free_udp_port(ip: IpAddr) -> anyhow::Result<u16> {
    Ok(UdpSocket::bind((ip, 0))
        .with_context(|| format!("binding a UDP probe port on {ip}"))?
        .local_addr()?
        .port())
}

/// 32 random-enough bytes as hex, from `seed` (a gossip key for a drill, not a secret).
pub fn gossip_key(seed: u64) -> String {
    let mut rng = crate::rng::SplitMix64::new(seed ^ 0x5eed_6055_1900_0001);
    (0..32).map(|_| format!("{:02x}", rng.below(256))).collect()
}

/// The addresses of one authority member, chosen before any configuration is written
/// (peers name each other).
#[derive(Debug, Clone, Copy)]
pub struct AuthorityAddrs {
    pub http: SocketAddr,
    pub raft: SocketAddr,
    pub xds: SocketAddr,
    pub ingest: SocketAddr,
    pub gossip: SocketAddr,
    pub federation: SocketAddr,
}

impl AuthorityAddrs {
    /// Free ports for `ip`: TCP ports probed on loopback, UDP ports on `probe_ip` (an
    /// address of this namespace). A namespace has a port space of its own, so a port free
    /// here is free there too.
    pub fn pick(ip: IpAddr, probe_ip: IpAddr) -> anyhow::Result<Self> {
        let tcp = || -> anyhow::Result<SocketAddr> { Ok(SocketAddr::new(ip, free_port()?)) };
        Ok(Self {
            http: tcp()?,
            raft: tcp()?,
            xds: tcp()?,
            ingest: tcp()?,
            gossip: SocketAddr::new(ip, free_udp_port(probe_ip)?),
            federation: SocketAddr::new(ip, free_udp_port(probe_ip)?),
        })
    }
}

/// Federation settings of one member.
#[derive(Debug, Clone)]
pub struct FederationSpec {
    /// (peer region, member id, address) for every member of every peer region.
    pub peers: Vec<(String, String, SocketAddr)>,
    pub stale_after: Duration,
    pub digest_interval: Duration,
    /// `drop_stale_peers` (a drill's break knob: it breaks ADR-14).
    pub drop_stale_peers: bool,
}

/// What an authority member runs with.
#[derive(Debug, Clone)]
pub struct AuthoritySpec {
    pub region: String,
    pub zones: Vec<String>,
    pub tls: TlsSection,
    /// `[authority.gossip]` with these keys (the member is never a prober).
    pub gossip_keys: Option<Vec<String>>,
    pub federation: Option<FederationSpec>,
}

/// A single-member authority with TLS, ingest, gossip and federation as asked.
#[derive(Debug)]
pub struct RegionAuthority {
    process: RoleProc,
    addrs: AuthorityAddrs,
}

impl RegionAuthority {
    /// Writes the configuration under `dir`; does not start anything.
    pub fn new(
        bin: &Path,
        dir: &Path,
        spec: &AuthoritySpec,
        addrs: AuthorityAddrs,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let config = dir.join("authority.toml");
        let mut section = authority_section(spec, &addrs, &dir.join("data"))?;
        section.acl = configs::drill_acl(dir)?;
        configs::write_authority(&config, section)?;
        super::api_over_tls(addrs.http, &spec.tls.bundle)?;
        Ok(Self {
            process: RoleProc::new(
                "authority",
                bin,
                config,
                dir.join("authority.log"),
                addrs.http,
            ),
            addrs,
        })
    }

    /// Run it through `prefix` (e.g. inside a network namespace).
    pub fn with_prefix(mut self, prefix: Vec<String>) -> Self {
        self.process = self.process.with_prefix(prefix);
        self
    }

    /// Its addresses.
    pub fn addrs(&self) -> AuthorityAddrs {
        self.addrs
    }

    /// An API client (actor `waymark-drill`).
    pub fn api(&self) -> ApiClient {
        super::api_client(self.addrs.http)
    }

    /// Start the process (no wait).
    pub fn start(&mut self) -> anyhow::Result<()> {
        self.process.start()
    }

    /// Waits for `/readyz`, within `deadline`.
    pub async fn wait_ready(&mut self, deadline: Duration) -> anyhow::Result<()> {
        self.process
            .wait_ready(deadline)
            .await
            .with_context(|| format!("authority log:\n{}", self.process.log_tail(30)))
    }

    /// SIGKILL it.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// The last lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }
}

/// The `[authority]` of [`RegionAuthority`] (without its `[authority.acl]`).
pub fn authority_section(
    spec: &AuthoritySpec,
    a: &AuthorityAddrs,
    data: &Path,
) -> anyhow::Result<AuthoritySection> {
    let zones: Vec<&str> = spec.zones.iter().map(String::as_str).collect();
    let mut s = configs::authority(1, &spec.region, &zones, data)?;
    s.http = a.http;
    s.raft = a.raft;
    s.xds = a.xds;
    s.ingest = Some(a.ingest);
    s.members = configs::members(&[Voter {
        id: 1,
        http: a.http,
        raft: a.raft,
    }]);
    s.tls = Some(spec.tls.clone());
    s.gossip = spec.gossip_keys.as_ref().map(|keys| GossipSection {
        bind: a.gossip,
        zone: None,
        seeds: Vec::new(),
        keys: keys.clone(),
    });
    if let Some(f) = &spec.federation {
        let mut section = FederationSection::new(a.federation);
        section.stale_after = f.stale_after;
        section.digest_interval = f.digest_interval;
        section.drop_stale_peers = f.drop_stale_peers;
        for (region, member, addr) in &f.peers {
            section.peers.push(FederationPeerEntry {
                region: configs::name(region)?,
                member: member.clone(),
                addr: *addr,
            });
        }
        s.federation = Some(section);
    }
    Ok(s)
}

/// What a node agent runs with.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    pub name: String,
    pub region: String,
    pub zone: String,
    /// Every listener (xDS, DNS, HTTP, gossip) binds here.
    pub ip: IpAddr,
    pub authority: AuthorityAddrs,
    pub tls: TlsSection,
    /// Gossip keys; `None`: no gossip (the agent is then never a prober where the
    /// authority gossips).
    pub gossip_keys: Option<Vec<String>>,
}

/// A node agent with mutual TLS upstream, evidence ingest and gossip.
#[derive(Debug)]
pub struct RegionAgent {
    process: RoleProc,
    http: SocketAddr,
    xds: SocketAddr,
}

impl RegionAgent {
    /// Writes the configuration under `dir`; does not start anything.
    pub fn new(bin: &Path, dir: &Path, spec: &AgentSpec) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let http = SocketAddr::new(spec.ip, free_port()?);
        // Sidecar xDS in plain text is served on loopback only (a namespace has its own
        // loopback; the Envoy of an edge agent runs beside it).
        let xds = SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), free_port()?);
        let dns = SocketAddr::new(spec.ip, free_port()?);
        let a = &spec.authority;
        let mut c = configs::agent(
            &spec.name,
            &spec.region,
            &spec.zone,
            &dir.join("data"),
            &[a.xds.to_string()],
        )?;
        c.ingest = vec![a.ingest.to_string()];
        c.api = vec![a.http.to_string()];
        c.listen.xds = xds;
        c.listen.dns = dns;
        c.listen.http = http;
        c.listen.local_plaintext = true;
        if !spec.ip.is_loopback() {
            // Off loopback the local API is TLS and reads need a token: the drills' own.
            let tokens = dir.join("api-tokens");
            std::fs::write(&tokens, format!("{}\n", super::management_token()))?;
            c.listen.http_tokens_file = Some(tokens);
            super::agent_api_over_tls(http, &spec.tls.bundle)?;
        }
        c.tls = Some(spec.tls.clone());
        if let Some(keys) = &spec.gossip_keys {
            // A namespace has its own port space: a port free on loopback is free there.
            let bind = SocketAddr::new(spec.ip, free_udp_port("127.0.0.1".parse()?)?);
            c.gossip = Some(Gossip {
                bind,
                seeds: vec![configs::name(&a.gossip.to_string())?],
                keys: keys.clone(),
            });
        }
        let config = dir.join("agent.toml");
        configs::write_agent(&config, c)?;
        Ok(Self {
            process: RoleProc::new("agent", bin, config, dir.join("agent.log"), http),
            http,
            xds,
        })
    }

    /// Run it through `prefix` (e.g. inside a network namespace).
    pub fn with_prefix(mut self, prefix: Vec<String>) -> Self {
        self.process = self.process.with_prefix(prefix);
        self
    }

    /// The local xDS address (what Envoy dials).
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
        self.process
            .wait_ready(deadline)
            .await
            .with_context(|| format!("agent log:\n{}", self.process.log_tail(30)))
    }

    /// SIGKILL it.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// The last lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }

    /// Whether it still runs, and the last `n` lines of its log: what a failed wait on
    /// something it serves (Envoy's routing) should show beside the waiter's own log.
    pub fn describe(&mut self, n: usize) -> String {
        let state = if self.process.is_running() {
            "running"
        } else {
            "not running"
        };
        format!("node agent ({state}) log:\n{}", self.log_tail(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use waymark_agent::authority::config::ConfigFile;

    fn tls() -> TlsSection {
        TlsSection {
            trust_domain: "drill.test".into(),
            cert_chain: "/p/c.pem".into(),
            key: "/p/k.pem".into(),
            bundle: "/p/b.pem".into(),
        }
    }

    #[test]
    fn an_authority_config_names_its_federation_peers_and_gossip() {
        let ip: IpAddr = "10.64.0.1".parse().unwrap();
        let a = AuthorityAddrs {
            http: SocketAddr::new(ip, 1),
            raft: SocketAddr::new(ip, 6),
            xds: SocketAddr::new(ip, 2),
            ingest: SocketAddr::new(ip, 3),
            gossip: SocketAddr::new(ip, 4),
            federation: SocketAddr::new(ip, 5),
        };
        let spec = AuthoritySpec {
            region: "eu".into(),
            zones: vec!["a".into(), "b".into()],
            tls: tls(),
            gossip_keys: Some(vec![gossip_key(1)]),
            federation: Some(FederationSpec {
                peers: vec![("us".into(), "1".into(), SocketAddr::new(ip, 9))],
                stale_after: Duration::from_secs(2),
                digest_interval: Duration::from_millis(200),
                drop_stale_peers: false,
            }),
        };
        let section = authority_section(&spec, &a, Path::new("/d")).unwrap();
        let text = ConfigFile::new(section).to_toml().unwrap();
        // Raft on its own port, off loopback: accepted because [authority.tls] is set.
        let read = ConfigFile::parse(&text, []).unwrap().authority;
        assert_eq!(read.raft, SocketAddr::new(ip, 6), "{text}");
        assert_eq!(read.zones.len(), 2, "{text}");
        assert_eq!(read.gossip.map(|g| g.bind), Some(a.gossip), "{text}");
        let federation = read.federation.expect("federation");
        assert_eq!(federation.stale_after, Duration::from_secs(2));
        assert_eq!(federation.peers.len(), 1);
        assert_eq!(federation.peers[0].addr, SocketAddr::new(ip, 9));
        assert_eq!(federation.peers[0].member, "1");
    }

    #[test]
    fn gossip_keys_are_64_hex_characters_and_depend_on_the_seed() {
        let k = gossip_key(1);
        assert_eq!(k.len(), 64);
        assert!(k.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(k, gossip_key(2));
    }
}
