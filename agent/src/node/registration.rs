//! Service definitions for runtimes nothing watches (plain VMs): each `*.toml` file in the
//! agent's `services_dir` is registered with a lease through the authority's API, renewed
//! at a third of the lease, registered again (a new instance: ids are never reused) if the
//! lease was lost, and deregistered when the agent stops — before its listeners close, so
//! callers stop being sent here while this host still answers.
//!
//! ```toml
//! # /etc/waymark/services/billing.toml
//! name = "billing"
//! address = "10.0.3.7"
//! port = 8080
//! tags = ["v2"]
//! weight = 100
//! lease = "30s"
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::Method;
use serde::Deserialize;
use tokio::task::JoinHandle;
use waymark_core::model::{Address, Locality, ServiceName};
use waymark_core::units::Weight;
use waymark_registry::state::Registration;

use super::config::AgentConfig;
use crate::api_client::ApiClient;

/// One service definition file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceDefinition {
    /// The service.
    pub name: ServiceName,
    /// Where callers reach this instance.
    pub address: IpAddr,
    /// Its port.
    pub port: u16,
    /// Labels.
    #[serde(default)]
    pub tags: BTreeSet<String>,
    /// Metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Its weight (default: the platform's).
    #[serde(default)]
    pub weight: Option<u32>,
    /// The lease asked for.
    #[serde(default = "default_lease", with = "waymark_core::duration_str")]
    pub lease: Duration,
}

/// How long one deregistration may take when the agent stops.
pub const DEREGISTER_TIMEOUT: Duration = Duration::from_secs(5);

fn default_lease() -> Duration {
    waymark_core::defaults::LEASE
}

/// Where the authority's HTTP API is (any member; followers redirect to the leader).
#[derive(Clone)]
pub struct ApiTarget {
    /// `host:port` of members.
    pub members: Vec<String>,
    /// The bearer token presented, if any (`agent.api_token_file`).
    pub token: Option<String>,
    /// With `[agent.tls]`: the API is called over mutual TLS as this node.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for ApiTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTarget")
            .field("members", &self.members)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// Read every `*.toml` in `dir`, in name order; the first bad file is an error naming it.
pub fn read_definitions(dir: &Path) -> anyhow::Result<Vec<(PathBuf, ServiceDefinition)>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))?;
            let def: ServiceDefinition =
                toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            Ok((p, def))
        })
        .collect()
}

type Definitions = Arc<Mutex<Vec<(PathBuf, ServiceDefinition)>>>;

/// The running registrations.
pub struct Registrations {
    dir: PathBuf,
    api: ApiTarget,
    defs: Definitions,
    held: Arc<Mutex<BTreeMap<PathBuf, String>>>,
    task: JoinHandle<()>,
}

impl Registrations {
    /// Read the definitions (an error names the bad file) and keep them registered in the
    /// background; an unreachable authority is retried, never fatal.
    pub async fn start(dir: &Path, config: &AgentConfig, api: ApiTarget) -> anyhow::Result<Self> {
        let defs = read_definitions(dir)?;
        anyhow::ensure!(
            defs.is_empty() || !api.members.is_empty(),
            "service definitions need agent.api (the authority's HTTP API)"
        );
        let locality = Locality {
            region: config.region.clone(),
            zone: config.zone.clone(),
            node: config.name.clone(),
        };
        let held: Arc<Mutex<BTreeMap<PathBuf, String>>> = Arc::default();
        let defs: Definitions = Arc::new(Mutex::new(defs));
        let task = tokio::spawn(keep_registered(
            Arc::clone(&defs),
            locality,
            api.clone(),
            Arc::clone(&held),
        ));
        Ok(Self {
            dir: dir.to_path_buf(),
            api,
            defs,
            held,
            task,
        })
    }

    /// Read the folder again (SIGHUP): a removed or changed definition's instance is
    /// deregistered (a changed one is then registered anew); new ones are registered. A
    /// folder that no longer parses changes nothing (the error names the file).
    pub async fn reload(&self) -> anyhow::Result<()> {
        let fresh = read_definitions(&self.dir)?;
        let stale: Vec<PathBuf> = {
            let old = self.defs.lock().unwrap_or_else(PoisonError::into_inner);
            old.iter()
                .filter(|(p, d)| !fresh.iter().any(|(fp, fd)| fp == p && fd == d))
                .map(|(p, _)| p.clone())
                .collect()
        };
        *self.defs.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
        for path in stale {
            let id = self
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&path);
            if let Some(instance) = id {
                match call(
                    &self.api,
                    Method::DELETE,
                    &format!("/v1/instances/{instance}"),
                    None,
                )
                .await
                {
                    Ok(_) => {
                        tracing::info!(file = %path.display(), %instance, "definition removed or changed; deregistered")
                    }
                    Err(e) => {
                        tracing::warn!(file = %path.display(), %instance, error = %e, "deregistration failed; the lease will expire")
                    }
                }
            }
        }
        Ok(())
    }

    /// Instance ids currently held, by definition file.
    pub fn held(&self) -> BTreeMap<PathBuf, String> {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stop renewing and deregister everything held, each call bounded by
    /// [`DEREGISTER_TIMEOUT`] (an unreachable authority must not hold the stop: the lease
    /// expires anyway).
    pub async fn deregister_all(self) {
        self.task.abort();
        let held = self.held();
        for (path, instance) in held {
            let route = format!("/v1/instances/{instance}");
            let call = call(&self.api, Method::DELETE, &route, None);
            match tokio::time::timeout(DEREGISTER_TIMEOUT, call).await {
                Ok(Ok(_)) => tracing::info!(file = %path.display(), %instance, "deregistered"),
                Ok(Err(e)) => {
                    tracing::warn!(file = %path.display(), %instance, error = %e, "deregistration failed; the lease will expire")
                }
                Err(_) => {
                    tracing::warn!(file = %path.display(), %instance, "deregistration timed out; the lease will expire")
                }
            }
        }
    }
}

async fn keep_registered(
    defs: Definitions,
    locality: Locality,
    api: ApiTarget,
    held: Arc<Mutex<BTreeMap<PathBuf, String>>>,
) {
    loop {
        let current = defs.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let shortest = current
            .iter()
            .map(|(_, d)| d.lease)
            .min()
            .unwrap_or(Duration::from_secs(30));
        let period = (shortest / 3).max(Duration::from_millis(200));
        for (path, def) in &current {
            let current = held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(path)
                .cloned();
            if let Some(id) = &current {
                // Only a lost lease (the instance is gone) registers anew: an unreachable
                // authority is retried, or the old instance and a new one would collide.
                match call(
                    &api,
                    Method::PUT,
                    &format!("/v1/instances/{id}/renew"),
                    None,
                )
                .await
                {
                    Err(e) if e.to_string().starts_with("404") => {
                        tracing::warn!(file = %path.display(), instance = %id, "lease lost; registering again");
                    }
                    Err(e) => {
                        tracing::warn!(file = %path.display(), instance = %id, error = %e, "renewal failed; retrying");
                        continue;
                    }
                    Ok(_) => continue,
                }
            }
            let body = registration(def, &locality);
            match call(&api, Method::POST, "/v1/instances", Some(&body)).await {
                Ok(v) => {
                    if let Some(id) = v.get("instance").and_then(|i| i.as_str()) {
                        tracing::info!(file = %path.display(), service = %def.name, instance = id, "registered");
                        held.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .insert(path.clone(), id.to_owned());
                    }
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), service = %def.name, error = %e, "registration failed; retrying");
                }
            }
        }
        tokio::time::sleep(period).await;
    }
}

fn registration(def: &ServiceDefinition, locality: &Locality) -> serde_json::Value {
    let reg = Registration {
        service: def.name.clone(),
        locality: locality.clone(),
        address: Address {
            ip: def.address,
            port: def.port,
        },
        weight: def.weight.map(Weight::new).unwrap_or_default(),
        tags: def.tags.clone(),
        metadata: def.metadata.clone(),
        lease_ms: def.lease.as_millis() as u64,
    };
    serde_json::to_value(reg).unwrap_or_default()
}

/// Call the first member that answers; the API's refusal is an error.
async fn call(
    api: &ApiTarget,
    method: Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    let mut last = anyhow::anyhow!("no authority API member configured");
    for member in &api.members {
        let mut client = ApiClient::new(member, api.token.clone());
        if let Some(tls) = &api.tls {
            client = client.with_tls(std::sync::Arc::clone(tls));
        }
        match client.send(method.clone(), path, body).await {
            Ok(resp) => return resp.json(),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_parse_and_a_bad_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("billing.toml"),
            "name = \"billing\"\naddress = \"10.0.3.7\"\nport = 8080\ntags = [\"v2\"]\nlease = \"15s\"\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let defs = read_definitions(dir.path()).unwrap();
        assert_eq!(defs.len(), 1);
        assert_eq!(defs[0].1.name.as_str(), "billing");
        assert_eq!(defs[0].1.lease, Duration::from_secs(15));

        std::fs::write(
            dir.path().join("broken.toml"),
            "name = \"x\"\nport = \"eighty\"\n",
        )
        .unwrap();
        let err = read_definitions(dir.path()).unwrap_err().to_string();
        assert!(err.contains("broken.toml"), "{err}");
    }
}
