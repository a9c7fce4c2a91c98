//! Raft RPCs between authority members over HTTP/1.1 + JSON, on the member's own Raft
//! listener (`[authority] raft`), never on the API's.
//!
//! ```text
//! POST /raft/append    AppendEntriesRequest    -> Result<AppendEntriesResponse, RaftError>
//! POST /raft/vote      VoteRequest             -> Result<VoteResponse, RaftError>
//! POST /raft/snapshot  InstallSnapshotRequest  -> Result<InstallSnapshotResponse, RaftError<_, InstallSnapshotError>>
//! POST /raft/pre-vote  PreVoteRequest          -> PreVoteAnswer (changes nothing, see super::prevote)
//! ```
//!
//! The server side is [`router`], served by the member on its Raft listener: with
//! `[authority.tls]` over mutual TLS admitting only authority members of its trust domain
//! and region, and each RPC only from the member its certificate names
//! ([`super::admission`]: otherwise `403` with the reason, counted in
//! `waymark_raft_rpc_refused_total{reason}`); without TLS in plaintext, on loopback only.
//! The client side is [`HttpNetworkFactory`], generic over a hyper connector: plain
//! [`HttpConnector`] without TLS, [`super::tls::TlsConnector`] (presenting the member's
//! certificate, `https`) with it.
//!
//! Bounds: each route has its own body limit ([`VOTE_BODY_LIMIT_BYTES`] for votes,
//! [`BODY_LIMIT_BYTES`] for appends and snapshot chunks); the client reads an answer of at
//! most [`RESPONSE_LIMIT_BYTES`] (an answer is a term, a vote or a log id: small) within
//! the RPC's TTL, and keeps idle connections for less than the server's idle timeout, so
//! it never sends on a connection the server is closing.
//!
//! Errors follow openraft's actions: a refused connection or an unexpected HTTP status
//! (a `403` refusal included) is `Unreachable` (openraft backs off), a request that
//! outlives its soft TTL is `Timeout`, a 413 on append is `PayloadTooLarge` (openraft
//! sends fewer entries), other transport or decoding failures are `Network` (retry), and
//! an error the peer's Raft returned is `RemoteError`.

use std::fmt::{self, Debug};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use axum::{Extension, Json, Router};
use bytes::Bytes;
use http::uri::Scheme;
use http::{Method, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util_client::client::legacy::Client;
use hyper_util_client::client::legacy::connect::{Connect, HttpConnector};
use hyper_util_client::rt::TokioExecutor;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{RPCTypes, Raft, RaftNetwork, RaftNetworkFactory};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;
use waymark_certs::grpc::PeerInfo;

use super::admission::{RaftRpcMetrics, Refusal, Senders};
use super::codec;
use super::{Member, TypeConfig};

/// Path of the AppendEntries RPC.
pub const APPEND_PATH: &str = "/raft/append";
/// Path of the RequestVote RPC.
pub const VOTE_PATH: &str = "/raft/vote";
/// Path of the InstallSnapshot RPC (one chunk per request).
pub const SNAPSHOT_PATH: &str = "/raft/snapshot";
/// Audit records a follower forwards to the leader (refusals it decided): only the leader
/// can commit them.
pub(super) const AUDIT_PATH: &str = "/raft/audit";
/// The leader asks a caught-up voter to stand for election now (leadership transfer,
/// [`super::transfer`]).
pub(super) const ELECT_PATH: &str = "/raft/elect";
/// "Would you vote for me?", asked before standing ([`super::prevote`]).
pub(super) const PRE_VOTE_PATH: &str = "/raft/pre-vote";
/// Most records in one forwarded batch.
pub(super) const AUDIT_FORWARD_RECORDS_MAX: usize = 256;
/// Largest forwarded batch.
pub(super) const AUDIT_FORWARD_BODY_LIMIT_BYTES: usize = 256 * 1024;
/// Largest accepted AppendEntries or InstallSnapshot body. Snapshot chunks (4 MiB, JSON
/// encoded at up to four bytes per byte) and a batch of `Publish` entries fit well below.
pub const BODY_LIMIT_BYTES: usize = 64 * 1024 * 1024;
/// Largest accepted RequestVote body (a vote and a log id).
pub const VOTE_BODY_LIMIT_BYTES: usize = 64 * 1024;
/// Largest answer the client reads; a larger one is a `Network` error.
pub const RESPONSE_LIMIT_BYTES: usize = 1024 * 1024;
/// AppendEntries and InstallSnapshot requests served at once; one more is answered `503`
/// at once (the sending peer backs off, as from an unreachable member). Each may buffer up
/// to [`BODY_LIMIT_BYTES`], so this bounds the memory the `/raft/*` routes can be made to
/// hold (on a plaintext loopback listener, by anything local; with TLS, by the region's
/// members). A region's peers need a few at a time.
pub const LARGE_RPCS_IN_FLIGHT_MAX: usize = 8;
/// How long the client keeps an idle connection: below the server's header read timeout
/// (which also closes idle keep-alive connections, see `crate::listener::HttpLimits::RAFT`).
const POOL_IDLE: Duration = Duration::from_secs(5);
/// How long the client's TCP connect may take, so a black-holed peer fails fast even when
/// the RPC's TTL is long (snapshots).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

type NodeId = u64;

/// What the `/raft/*` handlers share.
#[derive(Clone)]
struct RpcState {
    raft: Raft<TypeConfig>,
    elections: super::elections::Elections,
    senders: Senders,
    metrics: RaftRpcMetrics,
}

/// The `/raft/*` routes serving `raft`; `senders` says whether an RPC's claimed sender
/// must be the member its client certificate names.
pub(super) fn router(
    raft: Raft<TypeConfig>,
    elections: super::elections::Elections,
    senders: Senders,
    metrics: RaftRpcMetrics,
) -> Router {
    let large = Arc::new(Large {
        permits: Semaphore::new(LARGE_RPCS_IN_FLIGHT_MAX),
        metrics: metrics.clone(),
    });
    Router::new()
        .route(APPEND_PATH, gated(post(append), &large))
        .route(
            VOTE_PATH,
            post(vote).layer(DefaultBodyLimit::max(VOTE_BODY_LIMIT_BYTES)),
        )
        .route(SNAPSHOT_PATH, gated(post(snapshot), &large))
        .route(
            AUDIT_PATH,
            post(audit).layer(DefaultBodyLimit::max(AUDIT_FORWARD_BODY_LIMIT_BYTES)),
        )
        .route(
            ELECT_PATH,
            post(elect).layer(DefaultBodyLimit::max(VOTE_BODY_LIMIT_BYTES)),
        )
        .route(
            PRE_VOTE_PATH,
            post(pre_vote).layer(DefaultBodyLimit::max(VOTE_BODY_LIMIT_BYTES)),
        )
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .with_state(RpcState {
            raft,
            elections,
            senders,
            metrics,
        })
}

/// The places for large RPCs, and where a refusal for want of one is counted.
struct Large {
    permits: Semaphore,
    metrics: RaftRpcMetrics,
}

/// `route`, served only while a place among `large` is free (held until it answers,
/// body read included); otherwise `503` at once.
fn gated<S: Clone + Send + Sync + 'static>(
    route: MethodRouter<S>,
    large: &Arc<Large>,
) -> MethodRouter<S> {
    route.route_layer(axum::middleware::from_fn_with_state(
        Arc::clone(large),
        admit_large,
    ))
}

async fn admit_large(
    State(large): State<Arc<Large>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Ok(_permit) = large.permits.try_acquire() else {
        large.metrics.count("busy");
        tracing::warn!(path = %request.uri().path(), in_flight_max = LARGE_RPCS_IN_FLIGHT_MAX, "raft rpc refused: too many in flight");
        let body = serde_json::json!({"error": {
            "reason": "busy",
            "field": null,
            "message": "too many raft RPCs in flight; retry",
        }});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    };
    next.run(request).await
}

impl RpcState {
    /// `None` when the RPC at `path`, claiming to come from `claimed`, may reach Raft;
    /// otherwise the `403` answer, counted and logged. Raft is not touched either way.
    fn refusal(
        &self,
        peer: Option<&PeerInfo>,
        claimed: Option<NodeId>,
        path: &'static str,
    ) -> Option<Response> {
        let refusal: Refusal = self.senders.check(peer, claimed).err()?;
        let reason = refusal.reason();
        self.metrics.count(reason);
        let identity = peer.map(|p| p.identity.to_string());
        tracing::warn!(
            peer = identity.as_deref().unwrap_or("none"),
            claimed = ?claimed,
            path,
            reason,
            "raft rpc refused: sender is not the certificate's member"
        );
        let body = serde_json::json!({"error": {
            "reason": reason,
            "field": "vote.leader_id",
            "message": refusal.to_string(),
        }});
        Some((StatusCode::FORBIDDEN, Json(body)).into_response())
    }
}

async fn append(
    State(s): State<RpcState>,
    peer: Option<Extension<PeerInfo>>,
    Body { value: rpc, binary }: Body<AppendEntriesRequest<TypeConfig>>,
) -> Response {
    let peer = peer.as_ref().map(|Extension(p)| p);
    if let Some(refused) = s.refusal(peer, rpc.vote.leader_id.voted_for(), APPEND_PATH) {
        return refused;
    }
    let (leader, term, committed) = (
        rpc.vote.leader_id.voted_for(),
        rpc.vote.leader_id.term,
        rpc.vote.is_committed(),
    );
    let result = s.raft.append_entries(rpc).await;
    // An established leader this member accepts: its election timer restarts. A stale
    // leader (answered with the higher vote) does not count.
    let accepted = result
        .as_ref()
        .is_ok_and(|r| !matches!(r, AppendEntriesResponse::HigherVote(_)));
    if let (true, true, Some(leader)) = (accepted, committed, leader) {
        s.elections.heard(leader, term);
    }
    answer(binary, &result)
}

async fn vote(
    State(s): State<RpcState>,
    peer: Option<Extension<PeerInfo>>,
    Body { value: rpc, binary }: Body<VoteRequest<NodeId>>,
) -> Response {
    let peer = peer.as_ref().map(|Extension(p)| p);
    if let Some(refused) = s.refusal(peer, rpc.vote.leader_id.voted_for(), VOTE_PATH) {
        return refused;
    }
    answer(binary, &s.raft.vote(rpc).await)
}

async fn snapshot(
    State(s): State<RpcState>,
    peer: Option<Extension<PeerInfo>>,
    Body { value: rpc, binary }: Body<InstallSnapshotRequest<TypeConfig>>,
) -> Response {
    let peer = peer.as_ref().map(|Extension(p)| p);
    if let Some(refused) = s.refusal(peer, rpc.vote.leader_id.voted_for(), SNAPSHOT_PATH) {
        return refused;
    }
    answer(binary, &s.raft.install_snapshot(rpc).await)
}

/// An RPC body as a peer sent it: binary when it carries the codec's mark (see
/// [`codec`]), else JSON — what a member from before the binary encoding sends. The answer
/// goes back in the same encoding ([`answer`]), so peers of either build understand each
/// other while a region is upgraded member by member. A body that decodes as neither is
/// refused with `400`; Raft is not touched.
struct Body<T> {
    value: T,
    binary: bool,
}

impl<T, S> axum::extract::FromRequest<S> for Body<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, Response> {
        let bytes = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let binary = codec::is_binary(&bytes);
        match codec::decode(&bytes) {
            Ok(value) => Ok(Self { value, binary }),
            Err(e) => {
                tracing::warn!(error = %e, binary, bytes = bytes.len(), "raft rpc body does not decode");
                let body = serde_json::json!({"error": {
                    "reason": "malformed",
                    "field": null,
                    "message": e.to_string(),
                }});
                Err((StatusCode::BAD_REQUEST, Json(body)).into_response())
            }
        }
    }
}

/// `value` as the answer to a request that was `binary` (or JSON).
fn answer<T: Serialize>(binary: bool, value: &T) -> Response {
    if !binary {
        return Json(value).into_response();
    }
    match codec::encode(value) {
        Ok(bytes) => ([(header::CONTENT_TYPE, codec::CONTENT_TYPE)], bytes).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "raft rpc answer does not encode");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// A follower's audit records, for the leader to commit.
#[derive(Debug, Serialize, serde::Deserialize)]
pub(super) struct AuditForward {
    /// The forwarding member: its certificate must name it.
    pub from: NodeId,
    /// At most [`AUDIT_FORWARD_RECORDS_MAX`].
    pub entries: Vec<waymark_registry::machine::AuditEntry>,
}

async fn audit(
    State(s): State<RpcState>,
    peer: Option<Extension<PeerInfo>>,
    Json(forward): Json<AuditForward>,
) -> Response {
    let peer = peer.as_ref().map(|Extension(p)| p);
    if let Some(refused) = s.refusal(peer, Some(forward.from), AUDIT_PATH) {
        return refused;
    }
    let refuse = |status: StatusCode, reason: &str, message: String| {
        let body =
            serde_json::json!({"error": {"reason": reason, "field": null, "message": message}});
        (status, Json(body)).into_response()
    };
    let count = forward.entries.len();
    if count > AUDIT_FORWARD_RECORDS_MAX {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_records",
            format!("{count} records; at most {AUDIT_FORWARD_RECORDS_MAX} per batch"),
        );
    }
    let request = waymark_registry::machine::Request::Audit {
        entries: forward.entries,
    };
    match s.raft.client_write(request).await {
        Ok(_) => {
            tracing::info!(
                from = forward.from,
                records = count,
                "forwarded audit records committed"
            );
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_committed",
            format!("not committed here: {e}"),
        ),
    }
}

/// Stand for election now, because the leader asks: its certificate must name the member
/// the body names, and that member must be the leader this member follows (a deposed or
/// foreign member cannot start elections here). A learner refuses: it cannot lead.
async fn elect(
    State(s): State<RpcState>,
    peer: Option<Extension<PeerInfo>>,
    Json(ask): Json<super::transfer::ElectRequest>,
) -> Response {
    let peer = peer.as_ref().map(|Extension(p)| p);
    if let Some(refused) = s.refusal(peer, Some(ask.from), ELECT_PATH) {
        return refused;
    }
    let refuse = |reason: &str, message: String| {
        let body =
            serde_json::json!({"error": {"reason": reason, "field": "from", "message": message}});
        (StatusCode::CONFLICT, Json(body)).into_response()
    };
    let (leader, voter, id) = {
        let m = s.raft.metrics();
        let m = m.borrow();
        let voter = m
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == m.id);
        (m.current_leader, voter, m.id)
    };
    if leader != Some(ask.from) {
        return refuse(
            "not_leader",
            format!(
                "member {} is not the leader this member follows ({leader:?})",
                ask.from
            ),
        );
    }
    if !voter {
        return refuse("not_voter", format!("member {id} is a learner"));
    }
    let term = s.raft.metrics().borrow().current_term;
    match s.raft.trigger().elect().await {
        Ok(()) => {
            // Until it leads, it stands again at every timeout, without asking first.
            s.elections.stood(term);
            tracing::info!(
                node_id = id,
                from = ask.from,
                "standing for election at the leader's request"
            );
            StatusCode::ACCEPTED.into_response()
        }
        Err(e) => refuse("raft_stopped", e.to_string()),
    }
}

/// Answer a peer's pre-vote: would this member vote for it? The peer's certificate must
/// name the member the body names (like every Raft RPC); the answer changes nothing here.
async fn pre_vote(
    State(s): State<RpcState>,
    peer: Option<Extension<PeerInfo>>,
    Json(ask): Json<super::prevote::PreVoteRequest>,
) -> Response {
    let peer = peer.as_ref().map(|Extension(p)| p);
    if let Some(refused) = s.refusal(peer, Some(ask.from), PRE_VOTE_PATH) {
        return refused;
    }
    Json(s.elections.answer(&s.raft, &ask)).into_response()
}

// === impl HttpNetworkFactory ===

/// Makes an [`HttpPeer`] client per peer; all share one connection pool.
pub struct HttpNetworkFactory<C = HttpConnector> {
    id: NodeId,
    client: Client<C, Full<Bytes>>,
    scheme: Scheme,
}

impl HttpNetworkFactory<HttpConnector> {
    /// Plain HTTP from member `id`.
    pub fn new(id: NodeId) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        Self::with_connector(id, connector, Scheme::HTTP)
    }
}

impl<C> HttpNetworkFactory<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// Use `connector` (e.g. a TLS connector) and `scheme` (`https` with TLS) for every peer.
    pub fn with_connector(id: NodeId, connector: C, scheme: Scheme) -> Self {
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        Self { id, client, scheme }
    }
}

impl<C> Debug for HttpNetworkFactory<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpNetworkFactory")
            .field("id", &self.id)
            .field("scheme", &self.scheme)
            .finish_non_exhaustive()
    }
}

impl<C> RaftNetworkFactory<TypeConfig> for HttpNetworkFactory<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    type Network = HttpPeer<C>;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Self::Network {
        HttpPeer {
            id: self.id,
            target,
            member: node.clone(),
            base: format!("{}://{}", self.scheme, node.raft_addr),
            client: self.client.clone(),
            json: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

// === impl HttpPeer ===

/// The client for one peer.
pub struct HttpPeer<C = HttpConnector> {
    id: NodeId,
    target: NodeId,
    member: Member,
    base: String,
    client: Client<C, Full<Bytes>>,
    /// The peer answered a binary body with `415`: it is a build from before the binary
    /// encoding, and is spoken to in JSON from then on.
    json: std::sync::atomic::AtomicBool,
}

impl<C> Debug for HttpPeer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpPeer")
            .field("target", &self.target)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// Why one call failed before a Raft answer came back.
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error("cannot encode request")]
    Encode(#[source] codec::CodecError),
    #[error("cannot encode request as JSON")]
    EncodeJson(#[source] serde_json::Error),
    #[error("bad peer address")]
    Request(#[source] http::Error),
    #[error("cannot connect")]
    Connect(#[source] hyper_util_client::client::legacy::Error),
    #[error("request failed")]
    Transport(#[source] hyper_util_client::client::legacy::Error),
    #[error("reading response failed")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("peer answered http {0}")]
    Status(StatusCode),
    #[error("cannot decode response")]
    Decode(#[source] codec::CodecError),
    #[error("timed out")]
    Timeout(Duration),
}

impl<C> HttpPeer<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// One RPC: the body in the binary encoding (JSON to a peer that refused it), the
    /// answer in whichever the peer used.
    async fn call<Q, A>(&self, path: &str, body: &Q, ttl: Duration) -> Result<A, CallError>
    where
        Q: Serialize,
        A: DeserializeOwned,
    {
        let json = self.json.load(std::sync::atomic::Ordering::Relaxed);
        match self.exchange(path, body, ttl, json).await {
            Err(CallError::Status(StatusCode::UNSUPPORTED_MEDIA_TYPE)) if !json => {
                tracing::info!(
                    peer = self.target,
                    "raft peer takes JSON only; speaking JSON to it"
                );
                self.json.store(true, std::sync::atomic::Ordering::Relaxed);
                self.exchange(path, body, ttl, true).await
            }
            other => other,
        }
    }

    async fn exchange<Q, A>(
        &self,
        path: &str,
        body: &Q,
        ttl: Duration,
        json: bool,
    ) -> Result<A, CallError>
    where
        Q: Serialize,
        A: DeserializeOwned,
    {
        let (body, content_type) = if json {
            let body = serde_json::to_vec(body).map_err(CallError::EncodeJson)?;
            (body, "application/json")
        } else {
            let body = codec::encode(body).map_err(CallError::Encode)?;
            (body, codec::CONTENT_TYPE)
        };
        let request = http::Request::builder()
            .method(Method::POST)
            .uri(format!("{}{}", self.base, path))
            .header(header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .map_err(CallError::Request)?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                if e.is_connect() {
                    CallError::Connect(e)
                } else {
                    CallError::Transport(e)
                }
            })?;
            let status = response.status();
            if !status.is_success() {
                return Err(CallError::Status(status));
            }
            let bytes = http_body_util::Limited::new(response.into_body(), RESPONSE_LIMIT_BYTES)
                .collect()
                .await
                .map_err(CallError::Body)?
                .to_bytes();
            codec::decode(&bytes).map_err(CallError::Decode)
        };
        tokio::time::timeout(ttl, exchange)
            .await
            .map_err(|_| CallError::Timeout(ttl))?
    }

    /// Map a failed call to the error openraft acts on.
    fn rpc_error<E: std::error::Error>(
        &self,
        action: RPCTypes,
        e: CallError,
    ) -> RPCError<NodeId, Member, E> {
        tracing::debug!(peer = self.target, rpc = %action, error = %e, "raft rpc failed");
        match e {
            CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
                action,
                id: self.id,
                target: self.target,
                timeout,
            }),
            CallError::Connect(_) | CallError::Status(_) => {
                RPCError::Unreachable(Unreachable::new(&e))
            }
            CallError::Encode(_)
            | CallError::EncodeJson(_)
            | CallError::Request(_)
            | CallError::Transport(_)
            | CallError::Body(_)
            | CallError::Decode(_) => RPCError::Network(NetworkError::new(&e)),
        }
    }

    fn remote<E: std::error::Error>(&self, e: E) -> RPCError<NodeId, Member, E> {
        RPCError::RemoteError(RemoteError::new_with_node(
            self.target,
            self.member.clone(),
            e,
        ))
    }
}

impl<C> RaftNetwork<TypeConfig> for HttpPeer<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        let sent = rpc.entries.len();
        let answer: Result<_, RaftError<NodeId>> = self
            .call(APPEND_PATH, &rpc, option.soft_ttl())
            .await
            .map_err(|e| match e {
                CallError::Status(StatusCode::PAYLOAD_TOO_LARGE) => {
                    let hint = u64::try_from(sent / 2).unwrap_or(u64::MAX).max(1);
                    RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(hint))
                }
                // A follower that cannot take this many entries within the heartbeat
                // interval would time out on the same batch for ever: send half next time
                // (openraft keeps the hint for ten sends), down to one entry.
                CallError::Timeout(ttl) if sent > 1 => {
                    let hint = u64::try_from(sent / 2).unwrap_or(u64::MAX).max(1);
                    tracing::warn!(
                        peer = self.target,
                        entries = sent,
                        next_entries = hint,
                        timeout_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                        "append to a follower timed out; sending fewer entries"
                    );
                    RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(hint))
                }
                e => self.rpc_error(RPCTypes::AppendEntries, e),
            })?;
        answer.map_err(|e| self.remote(e))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let answer: Result<_, RaftError<NodeId, InstallSnapshotError>> = self
            .call(SNAPSHOT_PATH, &rpc, option.soft_ttl())
            .await
            .map_err(|e| self.rpc_error(RPCTypes::InstallSnapshot, e))?;
        answer.map_err(|e| self.remote(e))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        let answer: Result<_, RaftError<NodeId>> = self
            .call(VOTE_PATH, &rpc, option.soft_ttl())
            .await
            .map_err(|e| self.rpc_error(RPCTypes::Vote, e))?;
        answer.map_err(|e| self.remote(e))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use openraft::Vote;

    use crate::net::test_support::answering_server as fake_peer;

    async fn vote_to(addr: String) -> RPCError<NodeId, Member, RaftError<NodeId>> {
        let member = Member {
            raft_addr: addr.clone(),
            api_addr: addr,
        };
        let mut peer = HttpNetworkFactory::new(1).new_client(2, &member).await;
        let rpc = VoteRequest::new(Vote::new(1, 1), None);
        peer.vote(rpc, RPCOption::new(Duration::from_millis(400)))
            .await
            .unwrap_err()
    }

    #[tokio::test]
    async fn an_answer_over_the_size_cap_is_a_network_error_not_a_growing_buffer() {
        let len = RESPONSE_LIMIT_BYTES + 1;
        let mut answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n").into_bytes();
        answer.resize(answer.len() + len, b' ');
        let e = vote_to(fake_peer(Some(answer)).await).await;
        assert!(matches!(e, RPCError::Network(_)), "{e:?}");
    }

    #[tokio::test]
    async fn large_rpcs_over_the_in_flight_cap_are_refused_at_once_and_a_freed_place_is_reused() {
        use tower::ServiceExt as _;
        let release = Arc::new(tokio::sync::Notify::new());
        let metrics = RaftRpcMetrics::default();
        let permits = Arc::new(Large {
            permits: Semaphore::new(LARGE_RPCS_IN_FLIGHT_MAX),
            metrics: metrics.clone(),
        });
        let wait = Arc::clone(&release);
        let app: Router = Router::new().route(
            APPEND_PATH,
            gated(
                post(move || {
                    let wait = Arc::clone(&wait);
                    async move { wait.notified().await }
                }),
                &permits,
            ),
        );
        let call = || {
            let req = http::Request::post(APPEND_PATH)
                .body(axum::body::Body::empty())
                .unwrap();
            app.clone().oneshot(req)
        };
        let mut held = Vec::new();
        for _ in 0..LARGE_RPCS_IN_FLIGHT_MAX {
            let mut pending = Box::pin(call());
            assert!(futures::poll!(pending.as_mut()).is_pending());
            held.push(pending);
        }
        let refused = call().await.unwrap();
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(metrics.refused("busy"), 1);
        release.notify_one();
        let done = futures::future::select_all(held).await.0.unwrap();
        assert_eq!(done.status(), StatusCode::OK);
        let mut again = Box::pin(call());
        assert!(
            futures::poll!(again.as_mut()).is_pending(),
            "a freed place is taken"
        );
    }

    #[tokio::test]
    async fn a_peer_from_before_the_binary_encoding_is_spoken_to_in_json() {
        // Goal: a region upgrades one member at a time. A peer whose routes take JSON only
        // refuses the binary body with 415; the RPC is sent again in JSON and answered, and
        // that peer is spoken to in JSON from then on.
        let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let log = Arc::clone(&seen);
        let app: Router = Router::new().route(
            VOTE_PATH,
            post(move |headers: http::HeaderMap, body: axum::body::Bytes| {
                let log = Arc::clone(&log);
                async move {
                    let kind = headers
                        .get(header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    log.lock().unwrap().push(kind.clone());
                    if kind != "application/json" {
                        return StatusCode::UNSUPPORTED_MEDIA_TYPE.into_response();
                    }
                    let rpc: VoteRequest<NodeId> = serde_json::from_slice(&body).unwrap();
                    let answer: Result<VoteResponse<NodeId>, RaftError<NodeId>> =
                        Ok(VoteResponse {
                            vote: rpc.vote,
                            vote_granted: true,
                            last_log_id: None,
                        });
                    Json(answer).into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let serving = tokio::spawn(async move { axum::serve(listener, app).await });
        let member = Member {
            raft_addr: addr.clone(),
            api_addr: addr,
        };
        let mut peer = HttpNetworkFactory::new(1).new_client(2, &member).await;
        for _ in 0..2 {
            let rpc = VoteRequest::new(Vote::new(1, 1), None);
            let answer = peer
                .vote(rpc, RPCOption::new(Duration::from_secs(5)))
                .await
                .unwrap();
            assert!(answer.vote_granted);
        }
        assert_eq!(
            *seen.lock().unwrap(),
            [codec::CONTENT_TYPE, "application/json", "application/json"]
        );
        serving.abort();
    }

    #[tokio::test]
    async fn a_peer_that_never_answers_is_a_timeout() {
        let e = vote_to(fake_peer(None).await).await;
        assert!(matches!(e, RPCError::Timeout(_)), "{e:?}");
    }

    async fn append_to(addr: String, entries: u64) -> RPCError<NodeId, Member, RaftError<NodeId>> {
        let member = Member {
            raft_addr: addr.clone(),
            api_addr: addr,
        };
        let mut peer = HttpNetworkFactory::new(1).new_client(2, &member).await;
        let leader = openraft::CommittedLeaderId::new(1, 1);
        let rpc = AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: (1..=entries)
                .map(|i| openraft::Entry {
                    log_id: openraft::LogId::new(leader, i),
                    payload: openraft::EntryPayload::Blank,
                })
                .collect(),
        };
        peer.append_entries(rpc, RPCOption::new(Duration::from_millis(200)))
            .await
            .unwrap_err()
    }

    #[tokio::test]
    async fn an_append_that_times_out_asks_for_half_the_entries_down_to_one() {
        // Goal: a follower too slow for a batch is sent a smaller one, never the same
        // batch again and again; a single entry that times out is an ordinary timeout.
        let addr = fake_peer(None).await;
        let e = append_to(addr.clone(), 6).await;
        let RPCError::PayloadTooLarge(hint) = e else {
            panic!("{e:?}");
        };
        assert_eq!(hint.entries_hint(), 3);
        let e = append_to(addr, 1).await;
        assert!(matches!(e, RPCError::Timeout(_)), "{e:?}");
    }
}
