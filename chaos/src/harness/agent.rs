//! One `waymark agent` as a child process: plain text on loopback, its sled cache in the
//! run directory so that a restart serves what the previous process persisted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use waymark_agent::api_client::ApiClient;

use super::{RoleProc, configs, free_port, loopback};

/// A node agent whose ports and data directory survive restarts.
#[derive(Debug)]
pub struct AgentProc {
    process: RoleProc,
    data: PathBuf,
    http: SocketAddr,
    xds: SocketAddr,
}

impl AgentProc {
    /// Writes the configuration under `dir` for node `name` in `region`/`zone`, subscribing
    /// to `upstream`; does not start anything.
    pub fn new(
        bin: &Path,
        dir: &Path,
        name: &str,
        region: &str,
        zone: &str,
        upstream: SocketAddr,
    ) -> anyhow::Result<Self> {
        let (xds, dns, http) = (free_port()?, free_port()?, free_port()?);
        std::fs::create_dir_all(dir)?;
        let config = dir.join("agent.toml");
        let data = dir.join("data");
        let mut a = configs::agent(name, region, zone, &data, &[upstream.to_string()])?;
        a.listen.xds = loopback(xds);
        a.listen.dns = loopback(dns);
        a.listen.http = loopback(http);
        configs::write_agent(&config, a)?;
        Ok(Self {
            process: RoleProc::new("agent", bin, config, dir.join("agent.log"), loopback(http)),
            data: dir.join("data"),
            http: loopback(http),
            xds: loopback(xds),
        })
    }

    /// The local xDS address (what Envoy dials).
    pub fn xds_addr(&self) -> SocketAddr {
        self.xds
    }

    /// Where the agent keeps its sled cache.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The agent's HTTP API.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// Start the process (no wait).
    pub fn start(&mut self) -> anyhow::Result<()> {
        self.process.start()
    }

    /// Waits for `/readyz` (a view loaded and served locally), within `deadline`.
    pub async fn wait_ready(&mut self, deadline: Duration) -> anyhow::Result<()> {
        self.process.wait_ready(deadline).await
    }

    /// `GET /v1/view`: what the agent serves, where it started from, whether it is connected.
    pub async fn view(&self) -> anyhow::Result<serde_json::Value> {
        ApiClient::new(&self.http.to_string(), None)
            .get_json("/v1/view")
            .await
    }

    /// SIGKILL the agent.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// The last lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }
}
