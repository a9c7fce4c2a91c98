//! The ADS server: Delta and State-of-the-World, CDS and EDS.
//!
//! Two transports carry the same streams: HTTP/2 directly ([`http2`]: [`XdsServer::serve`],
//! [`XdsServer::serve_tls`], [`XdsServer::serve_incoming`]) for a listener that serves ADS
//! alone, as an authority member's does, and a tonic service ([`XdsServer::service`]) for
//! a listener shared with other gRPC services, as a node agent's is.
//!
//! Thin shell around the pure parts: each stream is one task owning its per-type protocol
//! state ([`DeltaState`] / [`SotwState`]); it wakes on a client request or on a new
//! [`Snapshot`] (a `watch` channel, so a slow stream skips intermediate snapshots instead of
//! queueing them), computes the next response purely, and hands it to its transport.
//! A client that does not read is disconnected with `RESOURCE_EXHAUSTED` once it has left
//! no room for `send_timeout`; other clients are unaffected.
//!
//! On every snapshot change CDS is sent before EDS (a new cluster exists before its
//! endpoints); the delta queues upstream already release withdrawals before admissions.
//! New streams pass reconnection admission first; a refused stream ends with `UNAVAILABLE`
//! and a `grpc-retry-pushback-ms` hint. Admission counts clients by something they cannot
//! mint at will: the verified certificate identity over mutual TLS, else the peer's IP
//! address — never the node id a client writes in its request.
//!
//! Bounds: requests are decoded up to [`ServerConfig::request_bytes_max`], responses encoded
//! up to [`ServerConfig::response_bytes_max`]; one stream subscribes to at most
//! [`ServerConfig::resource_names_max`] names across its types (a request going beyond ends
//! the stream with `RESOURCE_EXHAUSTED` naming the cap); a NACK's error text is kept up to
//! [`NACK_ERROR_LEN_MAX`] bytes for the sync state.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Status, Streaming};
use tracing::Instrument as _;
use waymark_core::model::ZoneName;

use waymark_certs::grpc::{GrpcLimits, IncomingConfig, PeerInfo};

use crate::admission::{AdmissionConfig, AdmissionController, Admit, Caller};
use crate::protocol::{Ack, AgeClock, DeltaState, Outgoing, SotwState};
use crate::snapshot::{Resources, Snapshot, Stamps};
use crate::sync::{ClientSync, Propagation};
use crate::translate::{TYPE_CLUSTER, TYPE_ENDPOINT, TYPE_LISTENER, TYPE_ROUTE};

mod coalesce;
pub mod http2;
pub mod service;

use http2::{Peer, Undelivered};
use service::AdsService;

/// Server limits.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Responses buffered per stream before the client counts as slow, on the tonic
    /// transport. On HTTP/2 directly the bound is in bytes: `h2` stops granting a stream
    /// send capacity once [`http2::SEND_BUFFER_BYTES`] are queued unwritten.
    pub response_buffer: usize,
    /// How long a full buffer may stay full before the client is disconnected.
    pub send_timeout: Duration,
    /// How long a new stream may take to send its first request.
    pub first_request_timeout: Duration,
    /// Reconnection admission.
    pub admission: AdmissionConfig,
    /// Which resources each client may see (resolution authorisation); `None` serves
    /// everything to everyone.
    pub filter: Option<ResourceFilter>,
    /// Largest request decoded (a discovery request is names and a nonce).
    pub request_bytes_max: usize,
    /// Largest response encoded (a whole SotW EDS response of a large region).
    pub response_bytes_max: usize,
    /// Resource names (and Delta initial versions) one stream may hold across its types.
    pub resource_names_max: usize,
    /// Keep, per client and type, the names and versions sent ([`TypeSync::held`]), so
    /// that `proxy-config` can say what one client holds. Off by default: it doubles what
    /// a stream keeps, which a node agent's few sidecars afford and an authority member's
    /// tens of thousands of streams do not.
    ///
    /// [`TypeSync::held`]: crate::sync::TypeSync::held
    pub record_held: bool,
    /// Told of every release a client acknowledged, with how long it took (see
    /// [`crate::sync::ClientSync::acked_at`]); the driver turns it into metrics.
    pub on_propagated: Option<PropagationSink>,
    /// Carry, in each Delta resource's metadata, how old its release was when the response
    /// left ([`crate::release_age`]), so a node agent can time the whole path to its
    /// sidecars. Envoy ignores the field; on where the releases are stamped (an authority
    /// member), off where they are not the origin (a node agent serving its sidecars).
    pub carry_release_age: bool,
}

/// Bytes of a NACK's error text kept in the sync state (and shown by `proxy-status`).
pub const NACK_ERROR_LEN_MAX: usize = 1_024;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            response_buffer: 16,
            send_timeout: Duration::from_secs(30),
            first_request_timeout: Duration::from_secs(15),
            admission: AdmissionConfig::default(),
            filter: None,
            request_bytes_max: 1024 * 1024,
            response_bytes_max: 64 * 1024 * 1024,
            resource_names_max: 16_384,
            record_held: false,
            on_propagated: None,
            carry_release_age: false,
        }
    }
}

/// Where a server reports each release a client acknowledged. Called on the stream's
/// task, outside every lock: it must be quick (a histogram observation).
#[derive(Clone)]
pub struct PropagationSink(Arc<dyn Fn(Propagation) + Send + Sync>);

impl PropagationSink {
    /// A sink calling `f` with each acknowledged release.
    pub fn new(f: impl Fn(Propagation) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Report `p` to the sink (for a sink that passes each release on to another).
    pub fn report(&self, p: Propagation) {
        (self.0)(p);
    }
}

impl std::fmt::Debug for PropagationSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PropagationSink(…)")
    }
}

/// Decides, per stream, whether a client may see a resource: called with the client's
/// verified identity (`None` without mutual TLS), its node id, the type URL and the
/// resource name. A resource it may not see is simply absent from its responses.
#[derive(Clone)]
pub struct ResourceFilter(Arc<ResourceFilterFn>);

type ResourceFilterFn = dyn Fn(&ClientRef<'_>, &str, &str) -> bool + Send + Sync;

/// Who is asking, for a [`ResourceFilter`].
#[derive(Debug, Clone, Copy)]
pub struct ClientRef<'a> {
    /// The verified identity (`spiffe://…`), when the stream is mutual TLS.
    pub identity: Option<&'a str>,
    /// The Envoy node id the client declared.
    pub node_id: &'a str,
}

impl ResourceFilter {
    /// A filter from a function of (client, type URL, resource name).
    pub fn new(f: impl Fn(&ClientRef<'_>, &str, &str) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    fn allows(&self, client: &ClientRef<'_>, type_url: &str, name: &str) -> bool {
        (self.0)(client, type_url, name)
    }
}

impl std::fmt::Debug for ResourceFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResourceFilter(…)")
    }
}

/// Connection bounds shared by [`XdsServer::serve`] and [`XdsServer::serve_tls`]: the
/// default gRPC bounds with `keepalive`.
fn limits(keepalive: Keepalive) -> GrpcLimits {
    GrpcLimits {
        keepalive_interval: keepalive.interval,
        keepalive_timeout: keepalive.timeout,
        ..GrpcLimits::default()
    }
}

/// HTTP/2 keepalive for long-lived streams (set on both ends).
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    /// Ping after this much idleness.
    pub interval: Duration,
    /// Drop the connection if a ping is not answered within this.
    pub timeout: Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
        }
    }
}

/// Counters a driver exports as metrics (`waymark_xds_*`).
#[derive(Debug, Default)]
pub struct XdsStats {
    /// Responses sent.
    pub responses: AtomicU64,
    /// ACKs received.
    pub acks: AtomicU64,
    /// NACKs received.
    pub nacks: AtomicU64,
    /// Requests whose nonce was not the latest sent.
    pub stale_nonces: AtomicU64,
    /// Requests for a type this server does not serve.
    pub unknown_types: AtomicU64,
    /// Streams refused by reconnection admission.
    pub refused_streams: AtomicU64,
    /// Streams let in outside reconnection admission's window because their verified
    /// client already held one here (a standby being promoted).
    pub beside_streams: AtomicU64,
    /// Streams closed because the client stopped reading.
    pub slow_consumers: AtomicU64,
    /// Streams that ended with a malformed first request or none at all.
    pub bad_streams: AtomicU64,
    /// Streams ended for subscribing to more names than `resource_names_max`.
    pub oversubscribed_streams: AtomicU64,
}

struct Inner {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    /// Every open stream's sync state, each behind its own lock: the stream updates it on
    /// every send and ACK, `proxy-status` reads them all now and then.
    sync: Mutex<BTreeMap<u64, Arc<Mutex<ClientSync>>>>,
    admission: Mutex<AdmissionController>,
    next_stream: AtomicU64,
    config: ServerConfig,
    stats: XdsStats,
}

/// The ADS server. Cheap to clone; every clone serves the same snapshots.
#[derive(Clone)]
pub struct XdsServer {
    inner: Arc<Inner>,
}

/// Publishes snapshots to every stream of one server.
#[derive(Debug)]
pub struct Publisher {
    tx: watch::Sender<Arc<Snapshot>>,
}

impl Publisher {
    /// Make `snapshot` the one every stream converges to.
    pub fn publish(&self, snapshot: Snapshot) {
        self.tx.send_replace(Arc::new(snapshot));
    }
}

// === impl XdsServer ===

impl XdsServer {
    /// A server with an empty snapshot, and the publisher that feeds it.
    pub fn new(config: ServerConfig) -> (Self, Publisher) {
        let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
        let admission = Mutex::new(AdmissionController::new(config.admission.clone()));
        let inner = Inner {
            snapshots: rx,
            sync: Mutex::new(BTreeMap::new()),
            admission,
            next_stream: AtomicU64::new(1),
            config,
            stats: XdsStats::default(),
        };
        (
            Self {
                inner: Arc::new(inner),
            },
            Publisher { tx },
        )
    }

    /// The tonic service to add to a server, with the configured message size limits and
    /// small per-stream codec buffers (see [`service`]).
    pub fn service(&self) -> AdsService {
        AdsService::new(self.clone(), self.inner.config.request_bytes_max)
    }

    /// Serve ADS in plain text on `listener` until `shutdown` resolves, with HTTP/2
    /// keepalive so a black-holed connection (no RST) is detected within
    /// `interval + timeout`. For loopback and tests; production uses [`XdsServer::serve_tls`].
    /// ADS is served on HTTP/2 directly ([`http2`]): the listener serves nothing else.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        keepalive: Keepalive,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) {
        let incoming = waymark_certs::grpc::incoming_plain(listener, IncomingConfig::default());
        self.serve_incoming(incoming, limits(keepalive), shutdown)
            .await;
    }

    /// Serve ADS over mutual TLS: every client presents a certificate the `tls` config's
    /// verifier admits (see `waymark_certs::tls::server_config`), and its identity is
    /// recorded in its sync state. Handshake failures never reach a stream.
    pub async fn serve_tls(
        self,
        listener: tokio::net::TcpListener,
        tls: Arc<rustls::ServerConfig>,
        keepalive: Keepalive,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) {
        let incoming = waymark_certs::grpc::incoming(listener, tls, IncomingConfig::default());
        self.serve_incoming(incoming, limits(keepalive), shutdown)
            .await;
    }

    /// The snapshot every stream converges to now.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.snapshots.borrow().clone()
    }

    /// `f` of every connected client's sync state, in stream order, read in place: a
    /// summary that needs no copy of what each client holds.
    pub fn map_clients<T>(&self, mut f: impl FnMut(&ClientSync) -> T) -> Vec<T> {
        let streams: Vec<Arc<Mutex<ClientSync>>> = self
            .inner
            .sync
            .lock()
            .expect("sync registry lock")
            .values()
            .cloned()
            .collect();
        streams
            .iter()
            .map(|c| f(&c.lock().expect("stream sync lock")))
            .collect()
    }

    /// Every connected client's sync state.
    pub fn sync_state(&self) -> Vec<ClientSync> {
        self.map_clients(ClientSync::clone)
    }

    /// The server's counters.
    pub fn stats(&self) -> &XdsStats {
        &self.inner.stats
    }

    fn admit(&self, node: &Node, caller: Caller<'_>) -> Result<(), Status> {
        let now = tokio::time::Instant::now().into_std();
        let verdict = self
            .inner
            .admission
            .lock()
            .expect("admission lock")
            .handle_connect(now, caller);
        let client = caller.key();
        match verdict {
            Admit::Yes => Ok(()),
            Admit::Beside => {
                self.inner
                    .stats
                    .beside_streams
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(node_id = %node.id, client, "stream admitted beside the one its client holds here");
                Ok(())
            }
            Admit::No { retry_after } => {
                self.inner
                    .stats
                    .refused_streams
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(node_id = %node.id, client, retry_after_ms = retry_after.as_millis() as u64, "stream refused by reconnection admission");
                let mut status = Status::unavailable(
                    "reconnection admission: too many clients reconnecting, retry later",
                );
                if let Ok(v) = retry_after.as_millis().to_string().parse() {
                    status.metadata_mut().insert("grpc-retry-pushback-ms", v);
                }
                Err(status)
            }
        }
    }

    async fn first<T: prost::Message + Default>(
        &self,
        inbound: &mut Inbound<T>,
    ) -> Result<T, Status> {
        let timeout = self.inner.config.first_request_timeout;
        let first = tokio::time::timeout(timeout, inbound.message()).await;
        let bad = |msg: &str| {
            self.inner.stats.bad_streams.fetch_add(1, Ordering::Relaxed);
            Status::invalid_argument(msg.to_owned())
        };
        match first {
            Ok(Ok(Some(req))) => Ok(req),
            Ok(Ok(None)) => Err(bad("stream closed before its first request")),
            Ok(Err(status)) => Err(bad(&format!(
                "malformed first request: {}",
                status.message()
            ))),
            Err(_) => Err(bad("no first request within the timeout")),
        }
    }

    fn open(
        &self,
        node: &Node,
        identity: Option<String>,
        protocol: &'static str,
    ) -> (u64, Arc<Mutex<ClientSync>>) {
        let id = self.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        let zone = node
            .locality
            .as_ref()
            .map(|l| l.zone.clone())
            .unwrap_or_default();
        let now = tokio::time::Instant::now().into_std();
        let shown = identity.as_deref().unwrap_or("-");
        tracing::info!(node_id = %node.id, stream_id = id, protocol, identity = shown, "xds stream opened");
        let mut client = ClientSync::new(id, node.id.clone(), zone, protocol, now);
        client.identity = identity;
        client.cluster.clone_from(&node.cluster);
        let client = Arc::new(Mutex::new(client));
        self.inner
            .sync
            .lock()
            .expect("sync registry lock")
            .insert(id, Arc::clone(&client));
        (id, client)
    }
}

impl XdsServer {
    /// A State-of-the-World ADS stream: its responses, gRPC-framed, arrive on the receiver.
    pub(crate) async fn open_sotw(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<mpsc::Receiver<Outbound>, Status> {
        self.open_stream::<SotwState>(request).await
    }

    /// A Delta ADS stream: its responses, gRPC-framed, arrive on the receiver.
    pub(crate) async fn open_delta(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<mpsc::Receiver<Outbound>, Status> {
        self.open_stream::<DeltaState>(request).await
    }

    /// Read the first request (it names the node), admit the client, and spawn the stream.
    async fn open_stream<F: Flavor>(
        &self,
        request: Request<Streaming<F::Request>>,
    ) -> Result<mpsc::Receiver<Outbound>, Status> {
        let identity = waymark_certs::grpc::peer_identity(&request).map(ToString::to_string);
        let addr = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(|p| p.remote_addr)
            .or_else(|| request.remote_addr());
        let client = admission_key(identity.as_deref(), addr);
        let mut inbound = Inbound::Tonic(request.into_inner());
        let admitted = self
            .admit_stream::<F>(&mut inbound, identity, client)
            .await?;
        let (tx, rx) = mpsc::channel(self.inner.config.response_buffer);
        let (stream, first, span) = self.start_stream::<F>(admitted, Sink::Channel(tx));
        tokio::spawn(stream.run(first, inbound).instrument(span));
        Ok(rx)
    }

    /// Run one stream served on HTTP/2 directly ([`http2`]) to its end, on the caller's
    /// task: read the first request, admit the client, answer the stream's head, serve.
    async fn run_direct<F: Flavor>(
        &self,
        mut inbound: Inbound<F::Request>,
        peer: Peer,
        mut outlet: http2::Outlet,
    ) {
        let client = admission_key(peer.identity.as_deref(), peer.addr);
        let admitted = match self
            .admit_stream::<F>(&mut inbound, peer.identity, client)
            .await
        {
            Ok(admitted) => admitted,
            Err(status) => return outlet.end(&status),
        };
        // From here the stream holds its place in admission and the sync registry; both
        // are given back when it is dropped, however it ends.
        let (mut stream, first, span) = self.start_stream::<F>(admitted, Sink::Direct(outlet));
        if let Sink::Direct(outlet) = &mut stream.core.sink
            && outlet.start().is_err()
        {
            return;
        }
        stream.run(first, inbound).instrument(span).await;
    }

    /// Read a new stream's first request (it names the node) and admit its client.
    async fn admit_stream<F: Flavor>(
        &self,
        inbound: &mut Inbound<F::Request>,
        identity: Option<String>,
        client: String,
    ) -> Result<Admitted<F::Request>, Status> {
        let first = self.first(inbound).await?;
        let node = F::node(&first).cloned().unwrap_or_default();
        let caller = match identity {
            Some(_) => Caller::Verified(&client),
            None => Caller::Unverified(&client),
        };
        self.admit(&node, caller)?;
        Ok(Admitted {
            first,
            node,
            identity,
            client,
        })
    }

    /// Register an admitted stream: its protocol state, ready to run with its first
    /// request, in the span its logs belong to.
    fn start_stream<F: Flavor>(
        &self,
        admitted: Admitted<F::Request>,
        sink: Sink,
    ) -> (ProtocolStream<F>, F::Request, tracing::Span) {
        let Admitted {
            first,
            node,
            identity,
            client,
        } = admitted;
        let (stream_id, sync) = self.open(&node, identity.clone(), F::NAME);
        let span =
            tracing::info_span!("xds_stream", node_id = %node.id, stream_id, protocol = F::NAME);
        let mut core = StreamCore::new(self.inner.clone(), stream_id, sync, &node, sink, client);
        core.identity = identity;
        (ProtocolStream::<F>::new(core), first, span)
    }
}

/// A stream whose client was admitted, before it is registered.
struct Admitted<R> {
    first: R,
    node: Node,
    identity: Option<String>,
    /// Who it counts as for admission.
    client: String,
}

/// Who a stream counts as for reconnection admission: what the client cannot choose. Over
/// mutual TLS, its verified identity; otherwise the peer's IP address (so clients behind
/// one address count once, which only makes admission stricter); a stream with neither
/// (an in-process transport) counts as one anonymous client.
fn admission_key(identity: Option<&str>, addr: Option<std::net::SocketAddr>) -> String {
    if let Some(identity) = identity {
        return identity.to_owned();
    }
    match addr {
        Some(addr) => format!("ip:{}", addr.ip()),
        None => "anonymous".to_owned(),
    }
}

/// A stream's requests, from whichever transport carries them.
enum Inbound<T> {
    /// Decoded by tonic (a listener shared with other gRPC services).
    Tonic(Streaming<T>),
    /// Decoded from HTTP/2 directly (a listener serving only ADS).
    Direct(http2::Requests<T>),
}

impl<T: prost::Message + Default> Inbound<T> {
    /// The next request; `None` once the client closed its side.
    async fn message(&mut self) -> Result<Option<T>, Status> {
        match self {
            Self::Tonic(streaming) => streaming.message().await,
            Self::Direct(requests) => requests.message().await,
        }
    }
}

/// Where a stream's responses go, by transport.
enum Sink {
    /// To the gRPC response body tonic and hyper send ([`service::ResponseBody`]).
    Channel(mpsc::Sender<Outbound>),
    /// To `h2` directly.
    Direct(http2::Outlet),
}

impl Sink {
    /// Hand over one response, waiting at most `timeout` for room.
    async fn send(&mut self, chunks: Box<[Bytes]>, timeout: Duration) -> Result<(), Undelivered> {
        match self {
            Self::Channel(tx) => match tokio::time::timeout(timeout, tx.send(Ok(chunks))).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(_)) => Err(Undelivered::Gone),
                Err(_) => Err(Undelivered::Slow),
            },
            Self::Direct(outlet) => outlet.send(chunks, timeout).await,
        }
    }

    /// End the stream with `status` if that can be done without waiting.
    fn end_now(&mut self, status: Status) {
        match self {
            Self::Channel(tx) => {
                let _ = tx.try_send(Err(Box::new(status)));
            }
            Self::Direct(outlet) => outlet.end(&status),
        }
    }

    /// End the stream with `status`, waiting at most `timeout` for room to say it.
    async fn end(&mut self, status: Status, timeout: Duration) {
        match self {
            Self::Channel(tx) => {
                let _ = tokio::time::timeout(timeout, tx.send(Err(Box::new(status)))).await;
            }
            Self::Direct(outlet) => outlet.end(&status),
        }
    }

    /// Resolves when the server serving this stream is shutting down (never, for a
    /// stream tonic serves: its server's shutdown is tonic's).
    async fn stopping(&mut self) {
        match self {
            Self::Channel(_) => std::future::pending().await,
            Self::Direct(outlet) => outlet.stopping().await,
        }
    }
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn truncated(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What the shared parts of a stream need.
struct StreamCore {
    inner: Arc<Inner>,
    id: u64,
    /// This stream's entry in the server's sync state.
    sync: Arc<Mutex<ClientSync>>,
    zone: Option<ZoneName>,
    node_id: String,
    identity: Option<String>,
    /// Who the stream counts as for reconnection admission, told when it ends.
    admission_key: String,
    sink: Sink,
    nonces: u64,
}

/// What a stream's task hands its gRPC response body: one response as the chunks of its
/// gRPC frame (see [`Outgoing::into_grpc_chunks`]), or the status that ends the stream.
/// Both are a pointer wide, because a tokio channel allocates its slots 32 at a time
/// when it is made, for every open stream.
pub(crate) type Outbound = Result<Box<[Bytes]>, Box<Status>>;

impl StreamCore {
    fn new(
        inner: Arc<Inner>,
        id: u64,
        sync: Arc<Mutex<ClientSync>>,
        node: &Node,
        sink: Sink,
        admission_key: String,
    ) -> Self {
        let zone = node
            .locality
            .as_ref()
            .and_then(|l| ZoneName::try_new(&l.zone).ok());
        Self {
            inner,
            id,
            sync,
            zone,
            node_id: node.id.clone(),
            identity: None,
            admission_key,
            sink,
            nonces: 0,
        }
    }

    /// Nonces are unique per stream and never valid on another (they carry the stream id).
    fn nonce(&mut self) -> String {
        self.nonces += 1;
        format!("{}-{}", self.id, self.nonces)
    }

    /// Send, or report the client as slow. `false` ends the stream, as does a response
    /// over `response_bytes_max` (with `OUT_OF_RANGE`, as tonic's encoder would).
    async fn send<M: prost::Message + Default>(&mut self, response: Outgoing<M>) -> bool {
        let (len, max) = (response.encoded_len(), self.inner.config.response_bytes_max);
        let Some(chunks) = response.into_grpc_chunks().filter(|_| len <= max) else {
            tracing::warn!(
                stream_id = self.id,
                bytes = len,
                bytes_max = max,
                "response over the size limit; stream ended"
            );
            self.sink.end_now(Status::out_of_range(format!(
                "response of {len} bytes is over this server's limit of {max}"
            )));
            return false;
        };
        let timeout = self.inner.config.send_timeout;
        match self.sink.send(chunks.into_boxed_slice(), timeout).await {
            Ok(()) => {
                self.inner.stats.responses.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(Undelivered::Gone) => false,
            Err(Undelivered::Slow) => {
                self.inner
                    .stats
                    .slow_consumers
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(stream_id = self.id, "client stopped reading; disconnecting");
                self.sink.end_now(Status::resource_exhausted(
                    "client did not read its responses in time",
                ));
                false
            }
        }
    }

    fn record_ack(&self, type_url: &str, ack: &Ack) {
        let stats = &self.inner.stats;
        let mut sync = self.sync.lock().expect("stream sync lock");
        match ack {
            Ack::None => {}
            Ack::Acked { nonce } => {
                stats.acks.fetch_add(1, Ordering::Relaxed);
                let now = tokio::time::Instant::now().into_std();
                let reached = sync.acked_at(type_url, nonce, now);
                drop(sync);
                if let Some(sink) = &self.inner.config.on_propagated {
                    for p in reached {
                        (sink.0)(p);
                    }
                }
            }
            Ack::Nacked { nonce, error } => {
                stats.nacks.fetch_add(1, Ordering::Relaxed);
                let error = truncated(error, NACK_ERROR_LEN_MAX);
                tracing::warn!(stream_id = self.id, xds.type_url = type_url, xds.nonce = %nonce, error = %error, "client rejected a response");
                sync.nacked(type_url, nonce, error);
            }
            Ack::Stale { nonce } => {
                stats.stale_nonces.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(stream_id = self.id, xds.type_url = type_url, xds.nonce = %nonce, "stale nonce ignored");
            }
        }
    }

    /// Where `type_url` stands in [`TYPE_ORDER`], or `None` (counted) for a type this
    /// server does not serve.
    fn type_index(&self, type_url: &str) -> Option<usize> {
        let index = TYPE_ORDER.iter().position(|t| *t == type_url);
        if index.is_none() {
            self.inner
                .stats
                .unknown_types
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                stream_id = self.id,
                xds.type_url = type_url,
                "request for a type this server does not serve"
            );
        }
        index
    }
}

impl Drop for StreamCore {
    fn drop(&mut self) {
        if let Ok(mut streams) = self.inner.sync.lock() {
            streams.remove(&self.id);
        }
        if let Ok(mut admission) = self.inner.admission.lock() {
            admission.handle_closed(&self.admission_key);
        }
    }
}

/// Types in the order a change is sent: clusters before their endpoints, and both before
/// the listeners and routes that point at them (make before break).
const TYPE_ORDER: [&str; 4] = [TYPE_CLUSTER, TYPE_ENDPOINT, TYPE_LISTENER, TYPE_ROUTE];

/// What differs between the Delta and State-of-the-World protocols, for the stream driver.
trait Flavor: Default + Send + 'static {
    type Request: prost::Message + Default + Send + Sync + 'static;
    /// The response message (its resources travel beside it, see [`Outgoing`]).
    type Response: prost::Message + Default + Send + 'static;
    /// For logs.
    const NAME: &'static str;
    fn type_url(req: &Self::Request) -> &str;
    fn node(req: &Self::Request) -> Option<&Node>;
    fn handle_request(&mut self, req: &Self::Request) -> Ack;
    /// Names this type would hold after `req` at most (`state`: what it holds now).
    fn names_after(state: Option<&Self>, req: &Self::Request) -> usize;
    /// Names this type's state holds (subscriptions and, for Delta, known versions).
    fn held_names(&self) -> usize;
    /// Whether `req` (classified as `ack`) can leave the client short of the snapshot, so
    /// the stream must look for a response. SotW ignores a request with a stale nonce
    /// entirely; Delta still applies its subscription changes.
    fn answers(req: &Self::Request, ack: &Ack) -> bool;
    fn next_response(
        &mut self,
        type_url: &str,
        resources: &Resources,
        version: &str,
        nonce: String,
        stamps: &Stamps,
        clock: Option<AgeClock>,
    ) -> Option<Outgoing<Self::Response>>;
    /// (version, nonce, resources the client now holds) for the sync registry.
    fn sent<'r>(&self, resp: &'r Outgoing<Self::Response>) -> (&'r str, &'r str, usize);
    /// Make `held` the names and versions the client was sent (see
    /// [`ServerConfig::record_held`]), touching only what changed.
    fn record_held(&self, held: &mut BTreeMap<String, String>);
}

impl Flavor for DeltaState {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    const NAME: &'static str = "delta";
    fn type_url(req: &Self::Request) -> &str {
        &req.type_url
    }
    fn node(req: &Self::Request) -> Option<&Node> {
        req.node.as_ref()
    }
    fn handle_request(&mut self, req: &Self::Request) -> Ack {
        DeltaState::handle_request(self, req)
    }
    fn names_after(state: Option<&Self>, req: &Self::Request) -> usize {
        state
            .map_or(0, Flavor::held_names)
            .saturating_add(req.resource_names_subscribe.len())
            .saturating_add(req.initial_resource_versions.len())
    }
    fn held_names(&self) -> usize {
        self.subscription.names.len().max(self.known.len())
    }
    /// A Delta reply (ACK, NACK or stale) that changes no subscription leaves nothing to
    /// send: the stream already sent everything its subscriptions select from the newest
    /// snapshot it saw, and a newer snapshot wakes it on its own. Looking anyway cost a
    /// full comparison per acknowledged response, which at 60,000 streams was a sizeable
    /// share of a release's fan-out.
    fn answers(req: &Self::Request, ack: &Ack) -> bool {
        matches!(ack, Ack::None)
            || !req.resource_names_subscribe.is_empty()
            || !req.resource_names_unsubscribe.is_empty()
    }
    fn next_response(
        &mut self,
        type_url: &str,
        resources: &Resources,
        version: &str,
        nonce: String,
        stamps: &Stamps,
        clock: Option<AgeClock>,
    ) -> Option<Outgoing<Self::Response>> {
        DeltaState::next_response_carrying(self, type_url, resources, version, nonce, stamps, clock)
    }
    fn sent<'r>(&self, resp: &'r Outgoing<Self::Response>) -> (&'r str, &'r str, usize) {
        (
            &resp.head.system_version_info,
            &resp.head.nonce,
            self.known.len(),
        )
    }
    fn record_held(&self, held: &mut BTreeMap<String, String>) {
        same_as(held, &self.known);
    }
}

impl Flavor for SotwState {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    const NAME: &'static str = "sotw";
    fn type_url(req: &Self::Request) -> &str {
        &req.type_url
    }
    fn node(req: &Self::Request) -> Option<&Node> {
        req.node.as_ref()
    }
    fn handle_request(&mut self, req: &Self::Request) -> Ack {
        SotwState::handle_request(self, req)
    }
    fn names_after(_: Option<&Self>, req: &Self::Request) -> usize {
        // A SotW request replaces the type's names.
        req.resource_names.len()
    }
    fn held_names(&self) -> usize {
        self.subscription.names.len()
    }
    fn answers(_: &Self::Request, ack: &Ack) -> bool {
        !matches!(ack, Ack::Stale { .. })
    }
    fn next_response(
        &mut self,
        type_url: &str,
        resources: &Resources,
        version: &str,
        nonce: String,
        stamps: &Stamps,
        _clock: Option<AgeClock>,
    ) -> Option<Outgoing<Self::Response>> {
        SotwState::next_response_stamped(self, type_url, resources, version, nonce, stamps)
    }
    fn sent<'r>(&self, resp: &'r Outgoing<Self::Response>) -> (&'r str, &'r str, usize) {
        (
            &resp.head.version_info,
            &resp.head.nonce,
            resp.resource_count(),
        )
    }
    fn record_held(&self, held: &mut BTreeMap<String, String>) {
        match self.sent_versions() {
            Some(sent) => same_as(held, sent),
            None => held.clear(),
        }
    }
}

/// Make `held` equal `now`, allocating only for entries that changed.
fn same_as(held: &mut BTreeMap<String, String>, now: &BTreeMap<String, String>) {
    held.retain(|name, _| now.contains_key(name));
    for (name, version) in now {
        match held.get_mut(name) {
            Some(v) if v == version => {}
            Some(v) => v.clone_from(version),
            None => {
                held.insert(name.clone(), version.clone());
            }
        }
    }
}

/// One stream: its per-type protocol state and the loop that drives it.
struct ProtocolStream<F: Flavor> {
    core: StreamCore,
    /// Per type, in [`TYPE_ORDER`]'s places: a fixed slot each rather than a map keyed by
    /// type URLs, which every request and response compared byte by byte.
    states: [Option<F>; TYPE_ORDER.len()],
}

impl<F: Flavor> ProtocolStream<F> {
    fn new(core: StreamCore) -> Self {
        Self {
            core,
            states: Default::default(),
        }
    }

    /// Wake on a request or a new snapshot; answer; end when either side goes away.
    async fn run(mut self, first: F::Request, mut inbound: Inbound<F::Request>) {
        // Held across the loop rather than asked anew each turn: each stream waits on the
        // one channel every stream of the server waits on, and dropping and making that
        // wait again for every request (each ACK) took the channel's lock twice.
        let mut releases = WatchStream::from_changes(self.core.inner.snapshots.clone());
        let mut next = Some(first);
        // `handle` and `push_all` are boxed while they run: inlined, their state made this
        // future — which every open stream keeps for its whole life — over 5 KiB.
        loop {
            if let Some(req) = next.take()
                && !Box::pin(self.handle(req)).await
            {
                return;
            }
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => next = Some(req),
                    Ok(None) => {
                        // The client closed its side: the stream ends well, with `OK`.
                        self.core.sink.end_now(Status::ok(""));
                        return;
                    }
                    Err(status) => {
                        // A request that could not be decoded (over the size cap, or
                        // malformed) ends the stream; say why, in case the client is
                        // still there to hear it.
                        tracing::debug!(code = ?status.code(), message = status.message(), "stream ended: the request side failed");
                        self.core.sink.end_now(status);
                        return;
                    }
                },
                () = self.core.sink.stopping() => {
                    tracing::debug!("stream ended: the server is shutting down");
                    self.core.sink.end_now(Status::unavailable("the server is shutting down"));
                    return;
                }
                changed = releases.next() => {
                    if changed.is_none() || !Box::pin(self.push_all()).await {
                        return;
                    }
                }
            }
        }
    }

    async fn handle(&mut self, req: F::Request) -> bool {
        let Some(index) = self.core.type_index(F::type_url(&req)) else {
            return true;
        };
        // Checked before the request is applied, so a refused request never grows the
        // stream's state.
        let (first, after) = {
            let held = self.states[index].as_ref();
            (held.is_none(), F::names_after(held, &req))
        };
        if !self.within_names_cap(index, after).await {
            return false;
        }
        let state = self.states[index].get_or_insert_with(F::default);
        let ack = state.handle_request(&req);
        self.core.record_ack(TYPE_ORDER[index], &ack);
        if !first && !F::answers(&req, &ack) {
            return true;
        }
        self.push(index).await
    }

    /// Whether the stream stays within `resource_names_max` when the type in place `index`
    /// holds `after` names; if not, the stream is ended with `RESOURCE_EXHAUSTED`
    /// (counted, logged).
    async fn within_names_cap(&mut self, index: usize, after: usize) -> bool {
        let max = self.core.inner.config.resource_names_max;
        let type_url = TYPE_ORDER[index];
        let others: usize = self
            .states
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != index)
            .filter_map(|(_, s)| s.as_ref().map(Flavor::held_names))
            .sum();
        let total = others.saturating_add(after);
        if total <= max {
            return true;
        }
        self.core
            .inner
            .stats
            .oversubscribed_streams
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(stream_id = self.core.id, node_id = %self.core.node_id, xds.type_url = type_url, names = total, names_max = max, "stream refused: too many resource names");
        let status = Status::resource_exhausted(format!(
            "resource names: {total} on this stream, at most {max}; subscribe by wildcard or split across streams"
        ));
        let timeout = self.core.inner.config.send_timeout;
        self.core.sink.end(status, timeout).await;
        false
    }

    async fn push_all(&mut self) -> bool {
        for index in 0..TYPE_ORDER.len() {
            if self.states[index].is_some() && !self.push(index).await {
                return false;
            }
        }
        true
    }

    /// Send the type in place `index` whatever its client is missing, if anything.
    async fn push(&mut self, index: usize) -> bool {
        let type_url = TYPE_ORDER[index];
        let snapshot = self.core.inner.snapshots.borrow().clone();
        let Some(resources) = snapshot.resources(type_url, self.core.zone.as_ref()) else {
            return true;
        };
        let filtered;
        let resources = match &self.core.inner.config.filter {
            None => resources,
            Some(filter) => {
                let client = ClientRef {
                    identity: self.core.identity.as_deref(),
                    node_id: &self.core.node_id,
                };
                filtered = resources
                    .iter()
                    .filter(|(name, _)| filter.allows(&client, type_url, name))
                    .map(|(n, e)| (n.clone(), e.clone()))
                    .collect();
                &filtered
            }
        };
        let nonce = self.core.nonce();
        let Some(state) = self.states[index].as_mut() else {
            return true;
        };
        let clock = self.core.inner.config.carry_release_age.then(|| AgeClock {
            // tokio's clock, as acknowledgements and the tier's stamps are taken on it.
            now: tokio::time::Instant::now().into_std(),
            since: self
                .core
                .sync
                .lock()
                .expect("stream sync lock")
                .connected_since,
        });
        let Some(response) = state.next_response(
            type_url,
            resources,
            &snapshot.version.to_string(),
            nonce,
            &snapshot.released,
            clock,
        ) else {
            return true;
        };
        let (version, nonce, held) = state.sent(&response);
        {
            let mut sync = self.core.sync.lock().expect("stream sync lock");
            sync.sent(type_url, version, nonce, held);
            sync.sent_released(type_url, response.released());
            if self.core.inner.config.record_held {
                sync.record_held(type_url, |h| state.record_held(h));
            }
        }
        tracing::debug!(protocol = F::NAME, xds.type_url = type_url, xds.version = %version, xds.nonce = %nonce, held, "response");
        self.core.send(response).await
    }
}
