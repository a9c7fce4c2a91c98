//! One `waymark authority` member as a child process: plain text (no TLS, gossip or
//! Kubernetes), a single-member group that bootstraps itself on first start and resumes
//! from its redb state on every later one.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use super::{RoleProc, free_port, loopback};

/// A single-member authority whose ports and data directory survive restarts.
#[derive(Debug)]
pub struct AuthorityProc {
    process: RoleProc,
    http: SocketAddr,
    xds: SocketAddr,
}

impl AuthorityProc {
    /// Writes the configuration under `dir` (region `region`, one zone `zone`); does not
    /// start anything.
    pub fn new(bin: &Path, dir: &Path, region: &str, zone: &str) -> anyhow::Result<Self> {
        let (http, xds) = (loopback(free_port()?), loopback(free_port()?));
        std::fs::create_dir_all(dir)?;
        let config = dir.join("authority.toml");
        std::fs::write(
            &config,
            format!(
                r#"[authority]
id = 1
region = "{region}"
zones = ["{zone}"]
data_dir = "{data}"
http = "{http}"
xds = "{xds}"

[[authority.members]]
id = 1
addr = "{http}"
"#,
                data = dir.join("data").display()
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        Ok(Self {
            process: RoleProc::new("authority", bin, config, dir.join("authority.log"), http),
            http,
            xds,
        })
    }

    /// The HTTP API (and Raft) address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// The xDS address node agents subscribe to.
    pub fn xds_addr(&self) -> SocketAddr {
        self.xds
    }

    /// Start the process (no wait).
    pub fn start(&mut self) -> anyhow::Result<()> {
        self.process.start()
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
