//! The dev region's demo backends (`waymark_agent::dev::backends`), run in the drill's own
//! process on real loopback sockets and registered with the authority over its HTTP API.
//! Each answers with a JSON body naming its instance, so the traffic generator records who
//! answered; each can be switched to a failure mode.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http::Method;
use serde_json::json;
use waymark_agent::api_client::ApiClient;
use waymark_agent::dev::backends::{BackendOptions, BackendSpec, Backends, Mode, SelfReportFn};

use super::wait_until;

/// The actor the drills act as on the authority's API.
const ACTOR: &str = "waymark-drill";

/// Demo backends of one service, registered with an authority.
pub struct DemoFleet {
    backends: Backends,
    /// Demo instance name → the id the authority issued.
    ids: BTreeMap<String, String>,
    /// Renews every lease at a third of its length; failures (the authority is down) are
    /// expected during an outage and only logged.
    renewals: tokio::task::JoinHandle<()>,
}

/// What [`DemoFleet::start_with`] adds to [`DemoFleet::start`].
#[derive(Debug, Clone)]
pub struct FleetSpec {
    /// The service's health contract (JSON, as the API takes it).
    pub contract: serde_json::Value,
    /// The address every backend binds.
    pub bind: IpAddr,
}

/// The longest lease the authority grants.
pub const MAX_LEASE: Duration = Duration::from_secs(600);

impl std::fmt::Debug for DemoFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoFleet").field("ids", &self.ids).finish()
    }
}

impl DemoFleet {
    /// Declares `service` (default contract) on the authority at `api`, starts `count`
    /// backends in `region`/`zone` on node `node`, and registers each with a lease of
    /// `lease` (at most [`MAX_LEASE`]), renewed until shutdown. Retries while the authority is not yet accepting writes, up to `deadline`.
    pub async fn start(
        api: SocketAddr,
        service: &str,
        count: usize,
        locality: (&str, &str, &str),
        lease: Duration,
        deadline: Duration,
    ) -> anyhow::Result<Self> {
        let spec = FleetSpec {
            contract: json!({}),
            bind: IpAddr::from([127, 0, 0, 1]),
        };
        Self::start_with(api, service, count, locality, lease, deadline, spec).await
    }

    /// [`start`](Self::start) with a contract of the drill's choosing (e.g. one with a
    /// probe, so probers are assigned) and backends bound on `spec.bind` (e.g. an address
    /// a network namespace can reach).
    pub async fn start_with(
        api: SocketAddr,
        service: &str,
        count: usize,
        (region, zone, node): (&str, &str, &str),
        lease: Duration,
        deadline: Duration,
        spec: FleetSpec,
    ) -> anyhow::Result<Self> {
        let client = super::api_client(api);
        let body = json!({"owner": ACTOR, "contract": spec.contract});
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
                bind: SocketAddr::new(spec.bind, 0),
            })
            .collect();
        // The default contract asks for no self-reports: nothing to relay.
        let self_report: SelfReportFn = Arc::new(|_, _| {});
        let backends = Backends::start(specs, BackendOptions::default(), self_report)
            .context("starting the demo backends")?;
        let mut ids = BTreeMap::new();
        for (name, addr) in backends.addresses() {
            let reg = json!({
                "service": service,
                "locality": {"region": region, "zone": zone, "node": node},
                "address": {"ip": addr.ip().to_string(), "port": addr.port()},
                "tags": [name],
                "lease_ms": u64::try_from(lease.min(MAX_LEASE).as_millis()).unwrap_or(u64::MAX),
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
            ids.insert(name, id);
        }
        let renewals = tokio::spawn(renew(
            client,
            ids.values().cloned().collect(),
            lease.min(MAX_LEASE) / 3,
        ));
        Ok(Self {
            backends,
            ids,
            renewals,
        })
    }

    /// Demo instance name → issued instance id.
    pub fn ids(&self) -> &BTreeMap<String, String> {
        &self.ids
    }

    /// Switch one backend's mode (`healthy`, `fail-hard`, `slow`, …).
    pub fn set_mode(&self, name: &str, mode: Mode) -> anyhow::Result<()> {
        Ok(self.backends.set_mode(name, mode)?)
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

impl Drop for DemoFleet {
    fn drop(&mut self) {
        self.renewals.abort();
    }
}

/// Renew `ids` every `every`, for ever.
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
