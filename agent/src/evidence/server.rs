//! The serving half of the evidence protocol: [`EvidenceService`] attributes each session to
//! its peer's verified identity, validates each message (`wire.rs`), and hands what it
//! carries to an [`EvidenceSink`] — the authority's evidence hub, or a node agent's relay
//! for the workloads on its host. A malformed message ends the session with
//! `INVALID_ARGUMENT`, is logged and counted ([`SessionMetrics::malformed`]), and reaches no
//! sink.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};
use tracing::{Instrument, debug, info, warn};
use waymark_certs::identity::{Identity, Subject};
use waymark_core::model::{NodeName, RegionName, Reporter, ZoneName};

use super::codec::{MALFORMED_PREFIX, malformed};
use super::pb::evidence_server::{Evidence, EvidenceServer};
use super::{
    AGENT_MESSAGE_BYTES_MAX, AUTHORITY_MESSAGE_BYTES_MAX, AgentMessage, AuthorityMessage,
    ClientConfig, ConfigRequest, KeyringAnswer, KeyringRequest, ProbeTarget, RefusedSample,
    SidecarReport, WireSample, pb,
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
    /// `node`'s report of its own xDS clients. `Err` ends the session; by default a sink
    /// keeps no reports and refuses them.
    fn sidecars(&self, node: &NodeName, report: SidecarReport) -> Result<(), Status> {
        let _ = (node, report);
        Err(Status::permission_denied(
            "sidecar reports go to the authority",
        ))
    }
    /// After `hello`: the config requests for `node`, which its session forwards to it;
    /// `None` when this sink asks none.
    fn config_requests(&self, node: &NodeName) -> Option<mpsc::Receiver<ConfigRequest>> {
        let _ = node;
        None
    }
    /// `node`'s answer to a config request. By default ignored.
    fn client_config(&self, node: &NodeName, answer: ClientConfig) {
        let _ = (node, answer);
    }
    /// After `hello`: the keyring requests for `node` (online gossip key rotation), which
    /// its session forwards to it; `None` when this sink asks none.
    fn keyring_requests(&self, node: &NodeName) -> Option<mpsc::Receiver<KeyringRequest>> {
        let _ = node;
        None
    }
    /// `node`'s answer to a keyring request. By default ignored.
    fn keyring_answer(&self, node: &NodeName, answer: KeyringAnswer) {
        let _ = (node, answer);
    }
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

/// What a session refuses before any sink sees it, counted. Clones share state.
#[derive(Debug, Clone, Default)]
pub struct SessionMetrics {
    /// Sessions refused because the peer had no usable identity.
    pub unattributed: Counter,
    /// Messages refused as malformed (they ended their session), by
    /// [`WireError::label`](super::WireError::label), or `undecodable` for bytes that are
    /// not the message at all.
    pub malformed: Family<MalformedLabels, Counter>,
}

/// The kind of fault in a malformed message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MalformedLabels {
    /// `missing`, `unknown_enum`, `out_of_range`, `bad_length`, `too_many`, `bad_name`,
    /// `bad_address`, `not_json` or `undecodable`.
    pub reason: String,
}

/// The ingest service. Serve it with [`EvidenceService::into_server`], which applies the
/// message size caps.
pub struct EvidenceService {
    sink: Arc<dyn EvidenceSink>,
    region: RegionName,
    metrics: SessionMetrics,
}

impl std::fmt::Debug for EvidenceService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvidenceService")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl EvidenceService {
    /// A service feeding `sink`, accepting identities of `region`, counting what it refuses
    /// in `metrics`.
    pub fn new(sink: Arc<dyn EvidenceSink>, region: RegionName, metrics: SessionMetrics) -> Self {
        Self {
            sink,
            region,
            metrics,
        }
    }

    /// The service for `tonic::transport::Server::add_service`, with the protocol's
    /// message size caps.
    pub fn into_server(self) -> EvidenceServer<Self> {
        EvidenceServer::new(self)
            .max_decoding_message_size(AGENT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(AUTHORITY_MESSAGE_BYTES_MAX)
    }
}

#[tonic::async_trait]
impl Evidence for EvidenceService {
    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: tonic::Request<Streaming<pb::AgentMessage>>,
    ) -> Result<tonic::Response<SessionStream>, Status> {
        let identity = waymark_certs::grpc::peer_identity(&request).cloned();
        let Some(reporter) = identity
            .as_ref()
            .and_then(|id| reporter_of(id, &self.region))
        else {
            self.metrics.unattributed.inc();
            warn!(
                peer = identity.as_ref().map(tracing::field::display),
                "evidence session refused: unattributable peer"
            );
            return Err(Status::permission_denied(
                "evidence must come over mutual TLS from a node or workload identity of this region",
            ));
        };
        let (tx, rx) = mpsc::channel::<Result<pb::AuthorityMessage, Status>>(16);
        let session = Session {
            sink: Arc::clone(&self.sink),
            metrics: self.metrics.clone(),
            reporter,
            tx,
            assignment: None,
            requests: None,
            keyring: None,
            hello_node: None,
        };
        tokio::spawn(session.run(request.into_inner()).in_current_span());
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// One session's driver: reads the reporter's messages, answers them, forwards the
/// assignment while it changes.
struct Session {
    sink: Arc<dyn EvidenceSink>,
    metrics: SessionMetrics,
    reporter: Reporter,
    tx: mpsc::Sender<Result<pb::AuthorityMessage, Status>>,
    assignment: Option<watch::Receiver<Vec<ProbeTarget>>>,
    /// Config requests for the node, once it said hello.
    requests: Option<mpsc::Receiver<ConfigRequest>>,
    /// Keyring requests for the node, once it said hello.
    keyring: Option<mpsc::Receiver<KeyringRequest>>,
    hello_node: Option<NodeName>,
}

impl Session {
    async fn run(mut self, mut inbound: Streaming<pb::AgentMessage>) {
        loop {
            let next = tokio::select! {
                next = inbound.next() => next,
                changed = wait_changed(&mut self.assignment) => {
                    if !changed {
                        self.assignment = None;
                    } else if let Some(rx) = &self.assignment {
                        let targets = rx.borrow().clone();
                        if !self.send(AuthorityMessage::Assignment { targets }).await {
                            break;
                        }
                    }
                    continue;
                }
                request = next_request(&mut self.requests) => {
                    match request {
                        Some(r) => {
                            if !self.send(AuthorityMessage::ConfigRequest(r)).await {
                                break;
                            }
                        }
                        None => self.requests = None,
                    }
                    continue;
                }
                request = next_request(&mut self.keyring) => {
                    match request {
                        Some(r) => {
                            if !self.send(AuthorityMessage::KeyringRequest(r)).await {
                                break;
                            }
                        }
                        None => self.keyring = None,
                    }
                    continue;
                }
            };
            let message = match next {
                Some(Ok(m)) => m,
                Some(Err(status)) => {
                    self.inbound_failed(status);
                    break;
                }
                None => break,
            };
            let message = match AgentMessage::try_from(message) {
                Ok(m) => m,
                Err(e) => {
                    self.refuse_malformed(e.label(), &e.chain()).await;
                    break;
                }
            };
            if !self.handle(message).await {
                break;
            }
        }
        // Closed before goodbye, so the sink sees this session's request channels gone.
        self.requests = None;
        self.keyring = None;
        if let Some(node) = &self.hello_node {
            self.sink.goodbye(node);
        }
    }

    /// Answer one valid message; `false` when the session is over.
    async fn handle(&mut self, message: AgentMessage) -> bool {
        let reporter = &self.reporter;
        match message {
            AgentMessage::Hello { .. } if self.hello_node.is_some() => {
                // One hello per session: a second would count the node as connected once
                // more than it ever says goodbye.
                warn!(%reporter, "evidence session ended: a second hello");
                self.fail(Status::failed_precondition(
                    "hello: at most once per session",
                ))
                .await
            }
            AgentMessage::Hello { zone } => {
                let Reporter::Node(node) = reporter else {
                    return self
                        .fail(Status::permission_denied(
                            "only node agents say hello (they probe)",
                        ))
                        .await;
                };
                match self.sink.hello(node, &zone) {
                    Ok(mut rx) => {
                        let targets = rx.borrow_and_update().clone();
                        info!(%node, %zone, targets = targets.len(), "node agent connected");
                        self.hello_node = Some(node.clone());
                        self.assignment = Some(rx);
                        self.requests = self.sink.config_requests(node);
                        self.keyring = self.sink.keyring_requests(node);
                        self.send(AuthorityMessage::Assignment { targets }).await
                    }
                    Err(status) => self.fail(status).await,
                }
            }
            AgentMessage::Relayed { samples } => {
                let Reporter::Node(node) = reporter else {
                    return self
                        .fail(Status::permission_denied(
                            "only node agents relay self-reports",
                        ))
                        .await;
                };
                let outcome = self.sink.ingest_relayed(node, samples);
                self.answer(outcome).await
            }
            AgentMessage::Samples { samples } => {
                let outcome = self.sink.ingest(reporter, samples);
                self.answer(outcome).await
            }
            AgentMessage::Sidecars { report } => {
                let Reporter::Node(node) = reporter else {
                    return self
                        .fail(Status::permission_denied(
                            "only node agents report sidecars",
                        ))
                        .await;
                };
                match self.sink.sidecars(node, report) {
                    Ok(()) => true,
                    Err(status) => self.fail(status).await,
                }
            }
            AgentMessage::ClientConfig(answer) => {
                let Reporter::Node(node) = reporter else {
                    return self
                        .fail(Status::permission_denied(
                            "only node agents answer config requests",
                        ))
                        .await;
                };
                self.sink.client_config(node, answer);
                true
            }
            AgentMessage::KeyringAnswer(answer) => {
                let Reporter::Node(node) = reporter else {
                    return self
                        .fail(Status::permission_denied(
                            "only node agents answer keyring requests",
                        ))
                        .await;
                };
                self.sink.keyring_answer(node, answer);
                true
            }
        }
    }

    /// The reporter's side failed: it went away, or its message could not be read (over
    /// the size cap, not protobuf). Say which, if it is still listening.
    fn inbound_failed(&self, status: Status) {
        let reporter = &self.reporter;
        // Our codec's parse failure (see `codec.rs`); everything else is the transport's.
        if status.code() == tonic::Code::InvalidArgument
            && status.message().starts_with(MALFORMED_PREFIX)
        {
            self.count_malformed("undecodable");
            warn!(%reporter, reason = "undecodable", error = status.message(), "evidence message refused: malformed");
        } else {
            debug!(%reporter, %status, "evidence session ended: the agent's side failed");
        }
        let _ = self.tx.try_send(Err(status));
    }

    /// A message that parsed but says something invalid: counted, logged, and the session
    /// ends with `INVALID_ARGUMENT` naming the field. Nothing it carried reached the sink.
    async fn refuse_malformed(&self, reason: &'static str, error: &str) {
        let reporter = &self.reporter;
        self.count_malformed(reason);
        warn!(%reporter, reason, error, "evidence message refused: malformed");
        let _ = self
            .tx
            .send(Err(Status::invalid_argument(malformed(&error))))
            .await;
    }

    fn count_malformed(&self, reason: &str) {
        self.metrics
            .malformed
            .get_or_create(&MalformedLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Send a batch's outcome: its acknowledgement, or the status that ends the session.
    async fn answer(&self, outcome: Result<Ack, Status>) -> bool {
        match outcome {
            Ok(ack) => {
                self.send(AuthorityMessage::Ack {
                    accepted: ack.accepted,
                    refused: ack.refused,
                })
                .await
            }
            Err(status) => self.fail(status).await,
        }
    }

    /// `false` when the reporter is gone.
    async fn send(&self, message: AuthorityMessage) -> bool {
        self.tx.send(Ok(message.into())).await.is_ok()
    }

    /// End the session with `status`; always `false`.
    async fn fail(&self, status: Status) -> bool {
        let _ = self.tx.send(Err(status)).await;
        false
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

/// The next request for the node; pends forever when there is no channel.
async fn next_request<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// What a session sends, as the generated service wants it.
pub type SessionStream = Pin<Box<dyn Stream<Item = Result<pb::AuthorityMessage, Status>> + Send>>;
