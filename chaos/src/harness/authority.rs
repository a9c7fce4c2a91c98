//! One `waymark authority` member as a child process: plain text (no TLS, gossip or
//! Kubernetes), a single-member group that bootstraps itself on first start and resumes
//! from its redb state on every later one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use super::{Proc, free_port, loopback, wait_serving};

/// A single-member authority whose ports and data directory survive restarts.
#[derive(Debug)]
pub struct AuthorityProc {
    bin: PathBuf,
    config: PathBuf,
    log: PathBuf,
    http: SocketAddr,
    xds: SocketAddr,
    proc: Option<Proc>,
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
            bin: bin.to_path_buf(),
            config,
            log: dir.join("authority.log"),
            http,
            xds,
            proc: None,
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
        let config = self.config.display().to_string();
        self.proc = Some(Proc::spawn(
            "authority",
            &self.bin,
            ["authority", "--config", config.as_str()],
            &[("RUST_LOG", "info")],
            &self.log,
        )?);
        Ok(())
    }

    /// Waits for `/readyz` (committed state applied), within `deadline`.
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

    /// SIGKILL the member.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.proc
            .as_ref()
            .map(|p| p.log_tail(n))
            .unwrap_or_default()
    }
}
