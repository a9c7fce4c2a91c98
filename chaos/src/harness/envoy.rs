//! A real Envoy as a child process: its listener and admin ports fixed for the whole run
//! (so traffic keeps its target across restarts), CDS and EDS over Delta ADS from the node
//! agent, one route sending everything to one service's cluster.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::{Proc, free_port, loopback, wait_serving, wait_until};
use crate::traffic;

/// The static cluster carrying ADS to the node agent.
const XDS_CLUSTER: &str = "waymark_agent";

/// An Envoy whose bootstrap and ports survive restarts.
#[derive(Debug)]
pub struct EnvoyProc {
    bin: PathBuf,
    bootstrap: PathBuf,
    log: PathBuf,
    admin: SocketAddr,
    listener: SocketAddr,
    proc: Option<Proc>,
}

/// The bootstrap: node `node_id` in `region`/`zone`, ADS (Delta) from `xds`, every request
/// on `listener` routed to cluster `service`.
pub fn bootstrap(
    node_id: &str,
    region: &str,
    zone: &str,
    xds: SocketAddr,
    admin: SocketAddr,
    listener: SocketAddr,
    service: &str,
) -> Value {
    let addr = |a: SocketAddr| json!({ "socket_address": { "address": a.ip().to_string(), "port_value": a.port() } });
    json!({
        "node": { "id": node_id, "cluster": "drill", "locality": { "region": region, "zone": zone } },
        "admin": { "address": addr(admin) },
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": addr(listener),
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "ingress",
                        "codec_type": "AUTO",
                        "route_config": {
                            "name": "local",
                            "validate_clusters": false,
                            "virtual_hosts": [{ "name": "all", "domains": ["*"], "routes": [{
                                "match": { "prefix": "/" },
                                "route": { "cluster": service, "timeout": "2s" }
                            }] }]
                        },
                        "http_filters": [{
                            "name": "envoy.filters.http.router",
                            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
                        }]
                    }
                }] }]
            }],
            "clusters": [{
                "name": XDS_CLUSTER,
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": { "cluster_name": XDS_CLUSTER, "endpoints": [{ "lb_endpoints": [
                    { "endpoint": { "address": addr(xds) } }
                ] }] },
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": { "http2_protocol_options": {
                            "connection_keepalive": { "interval": "5s", "timeout": "5s" }
                        } }
                    }
                }
            }]
        },
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": true,
                "grpc_services": [{ "envoy_grpc": { "cluster_name": XDS_CLUSTER } }]
            },
            "cds_config": { "ads": {}, "resource_api_version": "V3" }
        }
    })
}

impl EnvoyProc {
    /// Writes the bootstrap under `dir` (see [`bootstrap`]); does not start anything.
    pub fn new(
        bin: &Path,
        dir: &Path,
        node_id: &str,
        region: &str,
        zone: &str,
        xds: SocketAddr,
        service: &str,
    ) -> anyhow::Result<Self> {
        let (admin, listener) = (loopback(free_port()?), loopback(free_port()?));
        std::fs::create_dir_all(dir)?;
        let path = dir.join("bootstrap.json");
        let b = bootstrap(node_id, region, zone, xds, admin, listener, service);
        std::fs::write(&path, serde_json::to_string_pretty(&b)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(Self {
            bin: bin.to_path_buf(),
            bootstrap: path,
            log: dir.join("envoy.log"),
            admin,
            listener,
            proc: None,
        })
    }

    /// Where traffic goes in.
    pub fn listener_addr(&self) -> SocketAddr {
        self.listener
    }

    /// The admin API.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// Start the process (no wait).
    pub fn start(&mut self) -> anyhow::Result<()> {
        let bootstrap = self.bootstrap.display().to_string();
        self.proc = Some(Proc::spawn(
            "envoy",
            &self.bin,
            [
                "-c",
                bootstrap.as_str(),
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "warning",
            ],
            &[],
            &self.log,
        )?);
        Ok(())
    }

    /// Waits until the admin API says LIVE (`/ready`: initial xDS fetched) and a request
    /// through the listener answers 200, within `deadline`.
    pub async fn wait_routing(&mut self, deadline: Duration) -> anyhow::Result<()> {
        let started = tokio::time::Instant::now();
        let proc = self.proc.as_mut().context("envoy is not running")?;
        wait_serving(proc, "Envoy's admin /ready", deadline, self.admin, "/ready").await?;
        let left = deadline.saturating_sub(started.elapsed());
        let listener = self.listener;
        wait_until("a request routed through Envoy", left, async || {
            traffic::get(listener, "/", Duration::from_secs(1))
                .await
                .ok()
                .filter(|r| r.status == 200)
        })
        .await?;
        Ok(())
    }

    /// SIGKILL Envoy.
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

impl EnvoyProc {
    /// Adds load reporting (LRS, `cluster_manager.load_stats_config`) to the node agent over
    /// the ADS cluster to the bootstrap, as the deployed sidecar bootstraps have it: the
    /// agent forwards the reports upstream as passive evidence. Takes effect at the next
    /// start.
    pub fn report_load(&self) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(&self.bootstrap)
            .with_context(|| format!("reading {}", self.bootstrap.display()))?;
        let mut b: Value = serde_json::from_str(&text)?;
        b["cluster_manager"] = json!({ "load_stats_config": {
            "api_type": "GRPC",
            "transport_api_version": "V3",
            "grpc_services": [{ "envoy_grpc": { "cluster_name": XDS_CLUSTER } }]
        } });
        std::fs::write(&self.bootstrap, serde_json::to_string_pretty(&b)?)
            .with_context(|| format!("writing {}", self.bootstrap.display()))?;
        Ok(())
    }

    /// The admin `/clusters` page (`None` when Envoy does not answer).
    pub async fn clusters_page(&self) -> Option<String> {
        let r = traffic::get(self.admin, "/clusters", Duration::from_secs(1))
            .await
            .ok()?;
        (r.status == 200).then_some(r.body)
    }
}

impl EnvoyProc {
    /// The endpoints Envoy holds for `cluster`, from the admin `/clusters` page.
    pub async fn endpoints(&self, cluster: &str) -> Option<usize> {
        let r = traffic::get(self.admin, "/clusters", Duration::from_secs(1))
            .await
            .ok()?;
        Some(cluster_endpoints(&r.body, cluster))
    }
}

/// Distinct endpoint addresses of `cluster` in an admin `/clusters` page
/// (`name::address::stat::value` lines).
pub fn cluster_endpoints(page: &str, cluster: &str) -> usize {
    let mut seen = std::collections::BTreeSet::new();
    for line in page.lines() {
        let mut parts = line.split("::");
        if parts.next() == Some(cluster)
            && let Some(addr) = parts.next()
            && addr.parse::<SocketAddr>().is_ok()
        {
            seen.insert(addr.to_owned());
        }
    }
    seen.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_a_clusters_endpoints() {
        let page = "web::observability_name::web\n\
                    web::127.0.0.1:4001::cx_active::0\n\
                    web::127.0.0.1:4001::health_flags::healthy\n\
                    web::127.0.0.1:4002::cx_active::1\n\
                    waymark_agent::127.0.0.1:18000::cx_active::1\n";
        assert_eq!(cluster_endpoints(page, "web"), 2);
        assert_eq!(cluster_endpoints(page, "nope"), 0);
    }
}
