//! The evidence protocol both roles speak: one gRPC stream per reporter carrying probe
//! results, self-reports and forwarded load reports, each attributed by the connection's
//! mutual-TLS identity (ADR-15).
//!
//! ```text
//! node agent ──ClientSession──► authority member: EvidenceService ──► EvidenceHub (leader)
//! workload   ──ClientSession──► its node agent:   EvidenceService ──► LocalRelay ──► Relayed
//! ```
//!
//! The wire never names the reporter: the serving side takes it from the verified peer
//! certificate, so a sample cannot claim to come from someone else. What the reporter may
//! say is then checked by [`waymark_registry::ingest::admit`] on the leader (a probe only
//! about an assigned target, a self-report only about itself). Refusals are counted and
//! returned in the acknowledgement; they are never applied.
//!
//! The service is `waymark.evidence.v1.Evidence/Session`, bidirectional, with JSON messages
//! (`application/grpc+json`): the agent sends `hello` and `samples`; the authority answers
//! with the node's probe `assignment` whenever it changes and an `ack` per batch. Neither
//! role owns it, so it sits beside both (the authority's sink is `authority/evidence.rs`,
//! the node's `node/selfreport.rs` and `node/session.rs`).

use std::convert::Infallible;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::NamedService;
use tonic::{Status, Streaming};
use tracing::{debug, info, warn};
use waymark_certs::identity::{Identity, Subject};
use waymark_core::contract::ProbeSpec;
use waymark_core::model::{
    Address, InstanceId, NodeName, Observation, RegionName, Reporter, ServiceName, ZoneName,
};

/// The gRPC service name.
pub const SERVICE: &str = "waymark.evidence.v1.Evidence";
/// The one method's path.
pub const SESSION_PATH: &str = "/waymark.evidence.v1.Evidence/Session";
/// Samples accepted in one message; larger batches are refused whole.
pub const BATCH_MAX: usize = 4096;
/// Largest message an agent may send (a full batch with every detail at its ceiling fits);
/// a larger one ends the session with `RESOURCE_EXHAUSTED` before it is decoded.
pub const AGENT_MESSAGE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Largest message the authority sends (a node's whole probe assignment).
pub const AUTHORITY_MESSAGE_BYTES_MAX: usize = 16 * 1024 * 1024;

/// What an agent sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum AgentMessage {
    /// First message of a node agent: its zone, so it can be assigned probe targets there.
    Hello {
        /// The node's zone.
        zone: ZoneName,
    },
    /// Evidence; the reporter is the connection's identity.
    Samples {
        /// The samples.
        samples: Vec<WireSample>,
    },
    /// Self-reports a node agent received from workloads on its host, each verified by the
    /// agent against the workload's own mutual-TLS identity and about that workload only.
    /// The authority admits one only if the instance runs on the relaying node.
    Relayed {
        /// The self-reports.
        samples: Vec<WireSample>,
    },
}

/// Separates a check's own words from text the target chose (an HTTP body, a gRPC status
/// message) in an observation's detail: `HTTP 503; said: database down`. The prober writes
/// it; the target may be anything the registry names, so read paths that must not relay its
/// words cut a detail here (the authority's audit read path does; `explain` shows it).
pub const TARGET_TEXT_MARKER: &str = "; said: ";

/// One sample as sent: about which instance, and what was observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireSample {
    /// The instance it is about.
    pub instance: InstanceId,
    /// What was observed.
    pub observation: Observation,
}

/// What the authority sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum AuthorityMessage {
    /// The node's probe targets, whole, whenever they change.
    Assignment {
        /// What to probe.
        targets: Vec<ProbeTarget>,
    },
    /// The outcome of one `samples` message.
    Ack {
        /// Samples admitted to the evaluator.
        accepted: u64,
        /// Samples refused, with the reason label.
        refused: Vec<RefusedSample>,
    },
}

/// One target a node must probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeTarget {
    /// The instance.
    pub instance: InstanceId,
    /// Its service.
    pub service: ServiceName,
    /// Where to probe it.
    pub address: Address,
    /// How.
    pub probe: ProbeSpec,
}

/// A refused sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedSample {
    /// The instance it was about.
    pub instance: InstanceId,
    /// A stable reason label (`not_assigned`, `not_attributable`, `unknown_target`, …).
    pub reason: String,
}

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

/// A client session: send with [`ClientSession::send`], read the authority's messages from
/// [`ClientSession::inbound`].
#[derive(Debug)]
pub struct ClientSession {
    outbound: mpsc::Sender<AgentMessage>,
    /// The authority's messages.
    pub inbound: Streaming<AuthorityMessage>,
}

impl ClientSession {
    /// Open a session over `channel` (build it with mutual TLS: the identity is the
    /// reporter).
    pub async fn open(channel: tonic::transport::Channel) -> Result<Self, Status> {
        let mut grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(AUTHORITY_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(AGENT_MESSAGE_BYTES_MAX);
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("evidence channel not ready: {e}")))?;
        let (tx, rx) = mpsc::channel::<AgentMessage>(64);
        let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
        let response = grpc
            .streaming(
                tonic::Request::new(outbound),
                http::uri::PathAndQuery::from_static(SESSION_PATH),
                JsonCodec::<AgentMessage, AuthorityMessage>::default(),
            )
            .await?;
        Ok(Self {
            outbound: tx,
            inbound: response.into_inner(),
        })
    }

    /// Send one message.
    pub async fn send(&self, message: AgentMessage) -> Result<(), Status> {
        self.outbound
            .send(message)
            .await
            .map_err(|_| Status::unavailable("evidence session closed"))
    }
}

/// gRPC messages as JSON (`application/grpc+json`), encoding `E` and decoding `D`.
#[derive(Debug)]
pub struct JsonCodec<E, D>(PhantomData<fn(E) -> D>);

impl<E, D> Default for JsonCodec<E, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<E, D> Codec for JsonCodec<E, D>
where
    E: Serialize + Send + 'static,
    D: DeserializeOwned + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = JsonEncoder<E>;
    type Decoder = JsonDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        JsonEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        JsonDecoder(PhantomData)
    }
}

/// The encoding half of [`JsonCodec`].
#[derive(Debug)]
pub struct JsonEncoder<E>(PhantomData<fn(E)>);

impl<E: Serialize> Encoder for JsonEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        serde_json::to_writer(dst.writer(), &item)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }
}

/// The decoding half of [`JsonCodec`]. A malformed message fails the stream with
/// `INVALID_ARGUMENT` naming what is wrong.
#[derive(Debug)]
pub struct JsonDecoder<D>(PhantomData<fn() -> D>);

impl<D: DeserializeOwned> Decoder for JsonDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        let item = serde_json::from_reader(src.reader())
            .map_err(|e| Status::invalid_argument(format!("malformed message: {e}")))?;
        Ok(Some(item))
    }
}
