//! The serving half of the evidence protocol: [`EvidenceService`] attributes each session to
//! its peer's verified identity and hands what it carries to an [`EvidenceSink`] — the
//! authority's evidence hub, or a node agent's relay for the workloads on its host.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tonic::server::NamedService;
use tonic::{Status, Streaming};
use tracing::{debug, info, warn};
use waymark_certs::identity::{Identity, Subject};
use waymark_core::model::{NodeName, RegionName, Reporter, ZoneName};

use super::codec::JsonCodec;
use super::{
    AGENT_MESSAGE_BYTES_MAX, AUTHORITY_MESSAGE_BYTES_MAX, AgentMessage, AuthorityMessage,
    BATCH_MAX, ProbeTarget, RefusedSample, SERVICE, SESSION_PATH, WireSample,
};

/// Where ingested evidence goes: the leader's pipeline, or a refusal naming the leader.
pub trait EvidenceSink: Send + Sync + 'static {
    /// A node agent in `zone` connected; the receiver carries its probe targets.
    fn hello(
        &self,
        node: &NodeName,
        zone: &ZoneName,
    ) -> Result<watch::Receiver<Vec<ProbeTarget>>, Status>;
    /// The node's session ended.
    fn goodbye(&self, node: &NodeName);
    /// Admit what may be admitted, refuse the rest. `Err` ends the session (e.g. this
    /// member is not the leader: the status says which member is).
    fn ingest(&self, reporter: &Reporter, samples: Vec<WireSample>) -> Result<Ack, Status>;
    /// Self-reports relayed by `node` (see [`AgentMessage::Relayed`]).
    fn ingest_relayed(&self, node: &NodeName, samples: Vec<WireSample>) -> Result<Ack, Status>;
}

/// The outcome of one batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ack {
    /// Admitted.
    pub accepted: u64,
    /// Refused.
    pub refused: Vec<RefusedSample>,
}

/// The reporter a verified identity speaks as, in `region`; `None` when it may not report.
pub fn reporter_of(identity: &Identity, region: &RegionName) -> Option<Reporter> {
    match identity.subject() {
        Subject::Node { region: r, node } if r.as_str() == region.as_str() => {
            node.as_str().parse().ok().map(Reporter::Node)
        }
        Subject::Workload {
            region: r,
            instance,
            ..
        } if r.as_str() == region.as_str() => {
            instance.as_str().parse().ok().map(Reporter::Instance)
        }
        _ => None,
    }
}

/// The ingest service, for `tonic::transport::Server::add_service`.
pub struct EvidenceService {
    sink: Arc<dyn EvidenceSink>,
    region: RegionName,
    refused_unattributed: prometheus_client::metrics::counter::Counter,
}

impl std::fmt::Debug for EvidenceService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvidenceService")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl Clone for EvidenceService {
    fn clone(&self) -> Self {
        Self {
            sink: Arc::clone(&self.sink),
            region: self.region.clone(),
            refused_unattributed: self.refused_unattributed.clone(),
        }
    }
}

impl EvidenceService {
    /// A service feeding `sink`, accepting identities of `region`. `unattributed` counts
    /// sessions refused because the peer had no usable identity.
    pub fn new(
        sink: Arc<dyn EvidenceSink>,
        region: RegionName,
        unattributed: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        Self {
            sink,
            region,
            refused_unattributed: unattributed,
        }
    }

    async fn session(
        self,
        request: tonic::Request<Streaming<AgentMessage>>,
    ) -> Result<tonic::Response<SessionStream>, Status> {
        let identity = waymark_certs::grpc::peer_identity(&request).cloned();
        let Some(reporter) = identity
            .as_ref()
            .and_then(|id| reporter_of(id, &self.region))
        else {
            self.refused_unattributed.inc();
            warn!(
                peer = identity.as_ref().map(tracing::field::display),
                "evidence session refused: unattributable peer"
            );
            return Err(Status::permission_denied(
                "evidence must come over mutual TLS from a node or workload identity of this region",
            ));
        };
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<AuthorityMessage, Status>>(16);
        let sink = Arc::clone(&self.sink);
        tokio::spawn(async move {
            let mut assignment: Option<watch::Receiver<Vec<ProbeTarget>>> = None;
            let mut hello_node: Option<NodeName> = None;
            loop {
                let next = tokio::select! {
                    next = inbound.next() => next,
                    changed = wait_changed(&mut assignment) => {
                        if changed {
                            if let Some(rx) = &assignment {
                                let targets = rx.borrow().clone();
                                if tx.send(Ok(AuthorityMessage::Assignment { targets })).await.is_err() {
                                    break;
                                }
                            }
                        } else {
                            assignment = None;
                        }
                        continue;
                    }
                };
                let message = match next {
                    Some(Ok(m)) => m,
                    Some(Err(status)) => {
                        // The agent went away, or its message could not be decoded (over
                        // the size cap, malformed): say which, if it is still listening.
                        debug!(%reporter, %status, "evidence session ended: the agent's side failed");
                        let _ = tx.try_send(Err(status));
                        break;
                    }
                    None => break,
                };
                match message {
                    AgentMessage::Hello { .. } if hello_node.is_some() => {
                        // One hello per session: a second would count the node as
                        // connected once more than it ever says goodbye.
                        warn!(%reporter, "evidence session ended: a second hello");
                        let _ = tx
                            .send(Err(Status::failed_precondition(
                                "hello: at most once per session",
                            )))
                            .await;
                        break;
                    }
                    AgentMessage::Hello { zone } => {
                        let Reporter::Node(node) = &reporter else {
                            let _ = tx
                                .send(Err(Status::permission_denied(
                                    "only node agents say hello (they probe)",
                                )))
                                .await;
                            break;
                        };
                        match sink.hello(node, &zone) {
                            Ok(mut rx) => {
                                let targets = rx.borrow_and_update().clone();
                                info!(%node, %zone, targets = targets.len(), "node agent connected");
                                hello_node = Some(node.clone());
                                assignment = Some(rx);
                                if tx
                                    .send(Ok(AuthorityMessage::Assignment { targets }))
                                    .await
                                    .is_err()
                                {
                                    break;
                                }
                            }
                            Err(status) => {
                                let _ = tx.send(Err(status)).await;
                                break;
                            }
                        }
                    }
                    AgentMessage::Samples { samples } | AgentMessage::Relayed { samples }
                        if samples.len() > BATCH_MAX =>
                    {
                        let _ = tx
                            .send(Err(Status::invalid_argument(format!(
                                "samples: {} in one message, at most {BATCH_MAX}",
                                samples.len()
                            ))))
                            .await;
                        break;
                    }
                    AgentMessage::Relayed { samples } => {
                        let Reporter::Node(node) = &reporter else {
                            let _ = tx
                                .send(Err(Status::permission_denied(
                                    "only node agents relay self-reports",
                                )))
                                .await;
                            break;
                        };
                        if !answer(&tx, sink.ingest_relayed(node, samples)).await {
                            break;
                        }
                    }
                    AgentMessage::Samples { samples } => {
                        if !answer(&tx, sink.ingest(&reporter, samples)).await {
                            break;
                        }
                    }
                }
            }
            if let Some(node) = hello_node {
                sink.goodbye(&node);
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Resolves when the assignment changes (`true`) or its sender is gone (`false`); pends
/// forever when there is none.
async fn wait_changed(rx: &mut Option<watch::Receiver<Vec<ProbeTarget>>>) -> bool {
    match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<AuthorityMessage, Status>> + Send>>;
type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl NamedService for EvidenceService {
    const NAME: &'static str = SERVICE;
}

struct SessionMethod(EvidenceService);

impl tonic::server::StreamingService<AgentMessage> for SessionMethod {
    type Response = AuthorityMessage;
    type ResponseStream = SessionStream;
    type Future = BoxFuture<Result<tonic::Response<SessionStream>, Status>>;

    fn call(&mut self, request: tonic::Request<Streaming<AgentMessage>>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(service.session(request))
    }
}

impl<B> tower::Service<http::Request<B>> for EvidenceService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let service = self.clone();
        Box::pin(async move {
            if request.uri().path() != SESSION_PATH {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            let mut grpc =
                tonic::server::Grpc::new(JsonCodec::<AuthorityMessage, AgentMessage>::default())
                    .apply_max_message_size_config(
                        Some(AGENT_MESSAGE_BYTES_MAX),
                        Some(AUTHORITY_MESSAGE_BYTES_MAX),
                    );
            Ok(grpc.streaming(SessionMethod(service), request).await)
        })
    }
}

/// Send a batch's outcome: its acknowledgement, or the status that ends the session.
/// `false` when the session is over.
async fn answer(
    tx: &mpsc::Sender<Result<AuthorityMessage, Status>>,
    outcome: Result<Ack, Status>,
) -> bool {
    match outcome {
        Ok(ack) => {
            let msg = AuthorityMessage::Ack {
                accepted: ack.accepted,
                refused: ack.refused,
            };
            tx.send(Ok(msg)).await.is_ok()
        }
        Err(status) => {
            let _ = tx.send(Err(status)).await;
            false
        }
    }
}
