//! Existence on the leader: the Kubernetes reconciler runs while this member leads and
//! proposes its commands through Raft; its latest diff is served by the API.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::{info, warn};
use waymark_core::model::{NodeName, ZoneName};
use waymark_registry::state::{Applied, Command, DesiredState, Stamped};

use super::clock::now_ms;
use super::kube::diff::{AddressFamily, DiffConfig};
use super::kube::metrics::KubeMetrics;
use super::kube::{KubeReconciler, KubeReconcilerConfig, Propose, ProposeError, ReconcileStatus};
use super::raft::RaftNode;
use super::settings::KubeSettings;
use waymark_registry::machine::{Refusal, Request, Response};

/// Proposes commands through this member's Raft (only the leader's succeed).
#[derive(Debug, Clone)]
pub struct RaftProposer {
    raft: RaftNode,
}

impl Propose for RaftProposer {
    fn read_registry<R>(&self, read: impl FnOnce(&DesiredState) -> R) -> R {
        self.raft.with_state(|s, _| read(s.registry()))
    }

    fn propose(
        &self,
        command: Command,
    ) -> impl Future<Output = Result<Applied, ProposeError>> + Send {
        let raft = self.raft.clone();
        async move {
            // What the orchestrator reports is input like any other: a command that can
            // never apply (labels past their ceilings, say) is refused before the log.
            if let Err(error) = command.check() {
                return Err(ProposeError::Refused(Refusal::from(&error)));
            }
            let request = Request::Registry(Stamped {
                at_ms: now_ms(),
                command,
            });
            match raft.write(request).await {
                Ok(Response::Registry { outcome }) => outcome.map_err(ProposeError::Refused),
                Ok(other) => Err(ProposeError::Unavailable(
                    format!("unexpected response {other:?}").into(),
                )),
                Err(e) => Err(ProposeError::Unavailable(Box::new(e))),
            }
        }
    }
}

/// Run the reconciler whenever this member leads; publish its status into `diff`.
pub async fn run_kube(
    raft: RaftNode,
    settings: KubeSettings,
    region: waymark_core::model::RegionName,
    metrics: KubeMetrics,
    diff: Arc<Mutex<Option<ReconcileStatus>>>,
) {
    let (Ok(unknown_zone), Ok(unknown_node)) =
        (ZoneName::try_new("unknown"), NodeName::try_new("unknown"))
    else {
        return;
    };
    let mut leadership = raft.watch_metrics();
    loop {
        if leadership.wait_for(|m| m.state.is_leader()).await.is_err() {
            return;
        }
        let client = match client(&settings).await {
            Ok(c) => c,
            Err(error) => {
                warn!(%error, "kubernetes client unavailable; existence from Kubernetes paused");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                continue;
            }
        };
        let config = KubeReconcilerConfig::new(DiffConfig {
            region: region.clone(),
            cluster: settings.cluster.clone(),
            namespace: settings.namespace.clone(),
            default_zone: settings
                .default_zone
                .clone()
                .unwrap_or_else(|| unknown_zone.clone()),
            unknown_node: unknown_node.clone(),
            address_family: AddressFamily::IPv4,
        });
        info!(cluster = %settings.cluster, "leading: reconciling Kubernetes EndpointSlices");
        let proposer = Arc::new(RaftProposer { raft: raft.clone() });
        let reconciler = KubeReconciler::spawn(client, proposer, config, metrics.clone());
        let mut status = reconciler.status();
        loop {
            tokio::select! {
                changed = status.changed() => {
                    if changed.is_err() { break; }
                    let s = ReconcileStatus::clone(&status.borrow_and_update());
                    *diff.lock().unwrap_or_else(PoisonError::into_inner) = Some(s);
                }
                lost = leadership.wait_for(|m| !m.state.is_leader()) => {
                    if lost.is_err() { reconciler.shutdown(); return; }
                    break;
                }
            }
        }
        info!("no longer leading: kubernetes reconciler stopped");
        reconciler.shutdown();
    }
}

async fn client(settings: &KubeSettings) -> anyhow::Result<::kube::Client> {
    match &settings.api_url {
        Some(url) => {
            let config = ::kube::Config::new(url.parse()?);
            Ok(::kube::Client::try_from(config)?)
        }
        None => Ok(::kube::Client::try_default().await?),
    }
}
