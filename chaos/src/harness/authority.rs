//! One `waymark authority` member as a child process: plain text (no TLS, gossip or
//! Kubernetes). [`AuthorityProc::new`] is a single-member group that bootstraps itself on
//! first start and resumes from its redb state on every later one; [`AuthorityProc::member`]
//! is one member of a larger group (see [`super::cluster::AuthorityCluster`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use waymark_agent::authority::config::LimitsSection;
use waymark_agent::tls::TlsSection;

use super::{RoleProc, configs, free_port, loopback};

/// One initial voter: its id, API address and Raft address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Voter {
    /// Raft member id.
    pub id: u64,
    /// Its HTTP API.
    pub http: SocketAddr,
    /// Its Raft listener.
    pub raft: SocketAddr,
}

/// An authority member whose ports and data directory survive restarts.
#[derive(Debug)]
pub struct AuthorityProc {
    process: RoleProc,
    id: u64,
    config: Config,
}

/// What a member's configuration file says.
#[derive(Debug, Clone)]
struct Config {
    path: PathBuf,
    region: String,
    zones: Vec<String>,
    data: PathBuf,
    http: SocketAddr,
    raft: SocketAddr,
    xds: SocketAddr,
    /// The group's voters as first written, where [`AuthorityProc::set_initial_members`]
    /// finds each one's Raft address.
    voters: Vec<Voter>,
    /// `[authority.limits]`; the defaults unless [`AuthorityProc::set_limits`] said.
    limits: LimitsSection,
    /// `[authority.tls]`; plaintext on loopback unless [`AuthorityProc::set_tls`] said.
    tls: Option<TlsSection>,
}

impl Config {
    /// Writes the file for member `id` with `members` as the initial voters (only the
    /// lowest id initialises the group).
    fn write(&self, id: u64, members: &[Voter]) -> anyhow::Result<()> {
        let zones: Vec<&str> = self.zones.iter().map(String::as_str).collect();
        let mut a = configs::authority(id, &self.region, &zones, &self.data)?;
        a.http = self.http;
        a.raft = self.raft;
        a.xds = self.xds;
        a.members = configs::members(members);
        a.acl = configs::drill_acl(self.path.parent().unwrap_or(&self.data))?;
        a.limits = self.limits.clone();
        a.tls = self.tls.clone();
        configs::write_authority(&self.path, a)
    }
}

impl AuthorityProc {
    /// Writes the configuration under `dir` (region `region`, one zone `zone`) of a
    /// single-member group; does not start anything.
    pub fn new(bin: &Path, dir: &Path, region: &str, zone: &str) -> anyhow::Result<Self> {
        let (http, raft, xds) = (
            loopback(free_port()?),
            loopback(free_port()?),
            loopback(free_port()?),
        );
        let me = Voter { id: 1, http, raft };
        Self::member(bin, dir, me, region, &[zone], xds, &[me])
    }

    /// Writes the configuration under `dir` of member `me` (its id, and its API and Raft
    /// listeners; xDS on `xds`), with `members` (itself included) as the group's initial
    /// voters; does not start anything. Raft is plaintext: every address is on loopback.
    pub fn member(
        bin: &Path,
        dir: &Path,
        me: Voter,
        region: &str,
        zones: &[&str],
        xds: SocketAddr,
        members: &[Voter],
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let (id, http) = (me.id, me.http);
        let config = Config {
            path: dir.join("authority.toml"),
            region: region.to_owned(),
            zones: zones.iter().map(|z| (*z).to_owned()).collect(),
            data: dir.join("data"),
            http,
            raft: me.raft,
            xds,
            voters: members.to_vec(),
            limits: LimitsSection::default(),
            tls: None,
        };
        config.write(id, members)?;
        Ok(Self {
            process: RoleProc::new(
                "authority",
                bin,
                config.path.clone(),
                dir.join("authority.log"),
                http,
            ),
            id,
            config,
        })
    }

    /// The member's Raft id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The HTTP API address.
    pub fn http_addr(&self) -> SocketAddr {
        self.config.http
    }

    /// The Raft listener's address.
    pub fn raft_addr(&self) -> SocketAddr {
        self.config.raft
    }

    /// The xDS address node agents subscribe to.
    pub fn xds_addr(&self) -> SocketAddr {
        self.config.xds
    }

    /// Where it keeps its redb files (Raft log, vote, state machine).
    pub fn data_dir(&self) -> &Path {
        &self.config.data
    }

    /// Rewrites the initial voters in its configuration to `members` (id, HTTP API
    /// address), each with the Raft address it was created with (read at the next start;
    /// only a member with no Raft state bootstraps from it).
    pub fn set_initial_members(&self, members: &[(u64, SocketAddr)]) -> anyhow::Result<()> {
        let voters = members
            .iter()
            .map(|&(id, http)| {
                let known = self.config.voters.iter().find(|v| v.id == id);
                let raft = known
                    .map(|v| v.raft)
                    .with_context(|| format!("member {id} is not one of the group's voters"))?;
                Ok(Voter { id, http, raft })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        self.config.write(self.id, &voters)
    }

    /// Rewrites its configuration with `limits` as `[authority.limits]`, the same initial
    /// voters as first written (read at the next start).
    pub fn set_limits(&mut self, limits: LimitsSection) -> anyhow::Result<()> {
        self.config.limits = limits;
        self.config.write(self.id, &self.config.voters)
    }

    /// Rewrites its configuration with `tls` as `[authority.tls]`: its API, Raft and xDS
    /// listeners then speak mutual TLS (read at the next start). The harness's API clients
    /// must be told ([`super::api_over_tls`]).
    pub fn set_tls(&mut self, tls: TlsSection) -> anyhow::Result<()> {
        self.config.tls = Some(tls);
        self.config.write(self.id, &self.config.voters)
    }

    /// The process's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Start the process (no wait).
    pub fn start(&mut self) -> anyhow::Result<()> {
        self.process.start()
    }

    /// Whether the process was started and has not exited.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// Waits for `/readyz` (committed state applied), within `deadline`.
    pub async fn wait_ready(&mut self, deadline: Duration) -> anyhow::Result<()> {
        self.process.wait_ready(deadline).await
    }

    /// SIGKILL the member.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// The last lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }
}
