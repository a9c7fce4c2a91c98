//! LRS: Envoy's per-endpoint load reports in, passive-outcome evidence out.
//!
//! Envoy already counts every request it sends and whether it failed (a 503 counts as an
//! error); asking it for endpoint granularity gives waymark passive evidence for free. The
//! server answers each stream's first request with `send_all_clusters`,
//! `report_endpoint_granularity` and the configured interval; every report after that is
//! converted *purely* ([`endpoint_loads`]) into typed [`EndpointLoad`]s, attributed to the
//! reporting node, and handed to a [`LoadSink`]. Bad entries are skipped and counted, never
//! fatal: one odd endpoint must not cost the evidence about the others.
//!
//! Every report carries the [`LrsReporter`] its stream was authenticated as, the key a
//! consumer caps one reporter's influence under (ADR-15): over mutual TLS the identity the
//! client certificate proved (`waymark_certs::grpc::peer_identity`), never the node id the
//! client wrote; on a plaintext connection from loopback only, `node:<node_id>`. A
//! plaintext stream from anywhere else is refused before its first request is read
//! (`LrsStats::unauthenticated`).
//!
//! ```text
//! LoadStatsRequest ──► endpoint_loads (pure) ──► LoadReport ──► LoadSink
//!                                         AddressBook (pure, view in force) ──► Sample
//! ```
//!
//! Envoy names endpoints by address only, so turning a load into a [`Sample`] needs the
//! view that was in force: [`AddressBook`] does that, and counts what it cannot map rather
//! than inventing instances. HTTP/2 keepalive belongs on the tonic `Server` this service is
//! added to (`http2_keepalive_interval` / `http2_keepalive_timeout`), as for ADS.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{Address, Metadata, Node};
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, UpstreamEndpointStats};
use envoy_types::pb::envoy::service::load_stats::v3::load_reporting_service_server::{
    LoadReportingService, LoadReportingServiceServer,
};
use envoy_types::pb::envoy::service::load_stats::v3::{LoadStatsRequest, LoadStatsResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use envoy_types::pb::google::protobuf::value::Kind;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;
use waymark_certs::Identity;
use waymark_core::model::{InstanceId, NameError, NodeName, Observation, Reporter, Sample};
use waymark_core::view::View;

use crate::translate::METADATA_NAMESPACE;

/// Largest LRS message decoded or encoded.
pub const REPORT_BYTES_MAX: usize = 4 * 1024 * 1024;

/// The reporting interval asked of Envoy unless configured otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Longest node id a stream's first request may carry; a longer one is refused. Envoy's
/// ids are well under this; the bound keeps what a consumer remembers per reporter small.
pub const NODE_ID_BYTES_MAX: usize = 1024;

/// Server settings.
#[derive(Debug, Clone)]
pub struct LrsConfig {
    /// How often Envoy should report (`load_reporting_interval`).
    pub interval: Duration,
    /// How long a new stream may take to send its first request (the one with the node).
    pub first_request_timeout: Duration,
}

impl Default for LrsConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_INTERVAL,
            first_request_timeout: Duration::from_secs(15),
        }
    }
}

/// One endpoint's request outcomes over one reporting interval, as one caller saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointLoad {
    /// The Envoy cluster the endpoint belongs to (the service, for clusters we serve).
    pub cluster: String,
    /// The endpoint, as Envoy dialled it.
    pub address: SocketAddr,
    /// Requests completed in the interval (successful + error); never less than `errors`.
    pub requests: u64,
    /// Of those, how many failed.
    pub errors: u64,
    /// The interval the counts cover, as Envoy measured it.
    pub interval: Duration,
}

/// Who sent a load report: the key one reporter's influence is capped under.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LrsReporter {
    /// The identity the stream's client certificate proved (mutual TLS).
    Verified(Identity),
    /// The node id the client declared in its first request; only on a plaintext
    /// connection from loopback, where every client is on this host.
    Declared(String),
}

/// One report of one node: what its Envoy saw of every endpoint since the last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadReport {
    /// Who sent it, as its stream was authenticated.
    pub reporter: LrsReporter,
    /// The reporting Envoy's node id (from the stream's first request), as it declared it:
    /// for logs and sync state, never for keying a reporter.
    pub node_id: String,
    /// The zone the node declared (`node.locality.zone`); empty if none.
    pub zone: String,
    /// The endpoints' loads, in report order.
    pub loads: Vec<EndpointLoad>,
}

impl LoadReport {
    /// The declared node id as a waymark node name.
    pub fn node_name(&self) -> Result<NodeName, NameError> {
        NodeName::try_new(&self.node_id)
    }
}

/// The reporter a stream's reports are keyed by: the verified identity of a mutual-TLS
/// peer; on a plaintext connection from a loopback address, the node id it declared;
/// otherwise none, and the stream must be refused. Pure.
pub fn reporter_of(
    peer: Option<&Identity>,
    remote: Option<SocketAddr>,
    node_id: &str,
) -> Option<LrsReporter> {
    match peer {
        Some(identity) => Some(LrsReporter::Verified(identity.clone())),
        None if is_loopback(remote) => Some(LrsReporter::Declared(node_id.to_owned())),
        None => None,
    }
}

/// Whether `remote` is a loopback address (an IPv4-mapped one included).
fn is_loopback(remote: Option<SocketAddr>) -> bool {
    remote.is_some_and(|a| a.ip().to_canonical().is_loopback())
}

impl std::fmt::Display for LrsReporter {
    /// The identity's URI, or `node:<node_id>` for a declared one.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Verified(identity) => write!(f, "{identity}"),
            Self::Declared(node_id) => write!(f, "node:{node_id}"),
        }
    }
}

/// Why one entry of a report was skipped. Each variant affects only that entry: the rest
/// of the report is kept, nothing else changes, and the caller only counts it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The endpoint stats carried no address. Skipped.
    #[error("endpoint in cluster {cluster} has no address")]
    NoAddress {
        /// The cluster.
        cluster: String,
    },
    /// The address is not an IP socket address with a numeric port (a pipe, an internal
    /// address, a host name, a named port). Skipped: views hold IP addresses only.
    #[error("endpoint in cluster {cluster} has a non-ip address")]
    NotIp {
        /// The cluster.
        cluster: String,
    },
    /// The counts are impossible: successful + error requests overflow. (As `requests` is
    /// their sum, errors can never exceed requests otherwise.) Skipped.
    #[error("endpoint {address} in cluster {cluster} reports impossible counts")]
    BadCounts {
        /// The cluster.
        cluster: String,
        /// The endpoint.
        address: SocketAddr,
    },
    /// The cluster's `load_report_interval` is negative or out of range. Every endpoint of
    /// that cluster is skipped.
    #[error("cluster {cluster} reports an invalid interval")]
    BadInterval {
        /// The cluster.
        cluster: String,
    },
}

/// The result of converting one request: the loads kept and why the others were skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Converted {
    /// Endpoint loads, in report order.
    pub loads: Vec<EndpointLoad>,
    /// One entry per skipped endpoint.
    pub skipped: Vec<LoadError>,
}

/// Convert a request's `cluster_stats` into endpoint loads. Pure. A cluster without a
/// `load_report_interval` is taken to cover `default_interval` (the one we asked for).
pub fn endpoint_loads(req: &LoadStatsRequest, default_interval: Duration) -> Converted {
    let mut out = Converted::default();
    for cluster in &req.cluster_stats {
        let name = &cluster.cluster_name;
        let endpoints = cluster
            .upstream_locality_stats
            .iter()
            .flat_map(|l| &l.upstream_endpoint_stats);
        match interval(cluster.load_report_interval.as_ref(), default_interval) {
            Some(interval) => {
                for stats in endpoints {
                    match endpoint_load(name, interval, stats) {
                        Ok(load) => out.loads.push(load),
                        Err(e) => out.skipped.push(e),
                    }
                }
            }
            None => {
                let bad = || LoadError::BadInterval {
                    cluster: name.clone(),
                };
                out.skipped.extend(endpoints.map(|_| bad()));
            }
        }
    }
    out
}

/// One endpoint's stats as an [`EndpointLoad`]. Pure.
pub fn endpoint_load(
    cluster: &str,
    interval: Duration,
    stats: &UpstreamEndpointStats,
) -> Result<EndpointLoad, LoadError> {
    let address = socket_addr(cluster, stats.address.as_ref())?;
    let errors = stats.total_error_requests;
    let requests = stats
        .total_successful_requests
        .checked_add(errors)
        .ok_or_else(|| LoadError::BadCounts {
            cluster: cluster.to_owned(),
            address,
        })?;
    Ok(EndpointLoad {
        cluster: cluster.to_owned(),
        address,
        requests,
        errors,
        interval,
    })
}

fn socket_addr(cluster: &str, address: Option<&Address>) -> Result<SocketAddr, LoadError> {
    let not_ip = || LoadError::NotIp {
        cluster: cluster.to_owned(),
    };
    let kind = address
        .and_then(|a| a.address.as_ref())
        .ok_or_else(|| LoadError::NoAddress {
            cluster: cluster.to_owned(),
        })?;
    let AddressKind::SocketAddress(sa) = kind else {
        return Err(not_ip());
    };
    let ip: IpAddr = sa.address.parse().map_err(|_| not_ip())?;
    let port = match sa.port_specifier {
        Some(PortSpecifier::PortValue(p)) => u16::try_from(p).map_err(|_| not_ip())?,
        _ => return Err(not_ip()),
    };
    Ok(SocketAddr::new(ip, port))
}

fn interval(d: Option<&PbDuration>, default: Duration) -> Option<Duration> {
    let Some(d) = d else {
        return Some(default);
    };
    let seconds = u64::try_from(d.seconds).ok()?;
    let nanos = u32::try_from(d.nanos).ok().filter(|n| *n < 1_000_000_000)?;
    Some(Duration::new(seconds, nanos))
}

// === LoadSink ===

/// Where converted reports go (the evaluator's input queue, a test channel).
///
/// ### To ensure correctness
/// - `handle_report` must not block: it runs on the stream's task, and a blocked stream
///   stops reading Envoy's reports. Queue, or drop and count.
pub trait LoadSink: Send + Sync + 'static {
    /// Take one report.
    fn handle_report(&self, report: LoadReport);
}

impl<S: LoadSink> LoadSink for Arc<S> {
    fn handle_report(&self, report: LoadReport) {
        (**self).handle_report(report);
    }
}

/// A sink over a bounded channel: when the channel is full the report is dropped and
/// counted (passive evidence is periodic; the next interval brings fresh counts).
#[derive(Debug)]
pub struct ChannelSink {
    tx: mpsc::Sender<LoadReport>,
    dropped: AtomicU64,
}

impl ChannelSink {
    /// A sink feeding `tx`.
    pub fn new(tx: mpsc::Sender<LoadReport>) -> Self {
        Self {
            tx,
            dropped: AtomicU64::new(0),
        }
    }

    /// Reports dropped because the channel was full or closed.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl LoadSink for ChannelSink {
    fn handle_report(&self, report: LoadReport) {
        if let Err(e) = self.tx.try_send(report) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            let (mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r)) = &e;
            tracing::debug!(node_id = %r.node_id, reporter = %r.reporter, "load report dropped: sink full or closed");
        }
    }
}

// === AddressBook ===

/// Address → instance, from the views in force. Pure.
///
/// An address held by two different instances in the views given is ambiguous and maps to
/// nothing: attributing evidence to the wrong instance is worse than losing it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressBook {
    /// `None` marks an ambiguous address.
    by_address: BTreeMap<SocketAddr, Option<InstanceId>>,
}

impl AddressBook {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// A book of one view's endpoints.
    pub fn from_view(view: &View) -> Self {
        let mut book = Self::new();
        book.insert_view(view);
        book
    }

    /// Add a view's endpoints (e.g. every zone's view of every service in force).
    pub fn insert_view(&mut self, view: &View) {
        for e in view.endpoints.values() {
            self.insert(SocketAddr::new(e.address.ip, e.address.port), &e.instance);
        }
    }

    /// Say `instance` is at `address`; if another instance is already known there, the
    /// address becomes ambiguous (and stays so).
    pub fn insert(&mut self, address: SocketAddr, instance: &InstanceId) {
        self.insert_entry(address, Some(instance));
    }

    /// Add an EDS resource's endpoints, identified by the `instance` key that
    /// [`translate::load_assignment`](crate::translate::load_assignment) writes into each
    /// endpoint's `filter_metadata["waymark"]`. Returns how many endpoints were skipped:
    /// no such key, a key that is not a valid instance id, or a non-IP address.
    pub fn insert_assignment(&mut self, assignment: &ClusterLoadAssignment) -> usize {
        let mut skipped = 0;
        let cluster = &assignment.cluster_name;
        for lb in assignment.endpoints.iter().flat_map(|l| &l.lb_endpoints) {
            let address = match &lb.host_identifier {
                Some(HostIdentifier::Endpoint(e)) => socket_addr(cluster, e.address.as_ref()).ok(),
                _ => None,
            };
            match (address, metadata_instance(lb.metadata.as_ref())) {
                (Some(address), Some(instance)) => self.insert(address, &instance),
                _ => skipped += 1,
            }
        }
        skipped
    }

    /// Add every entry of `other`, as if each of its views had been inserted here: an
    /// address the two books disagree on, or that either holds as ambiguous, is ambiguous.
    pub fn merge(&mut self, other: &AddressBook) {
        for (address, instance) in &other.by_address {
            self.insert_entry(*address, instance.as_ref());
        }
    }

    /// Addresses known, ambiguous ones included.
    pub fn len(&self) -> usize {
        self.by_address.len()
    }

    /// Whether no address is known.
    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty()
    }

    /// `None` inserts an ambiguous entry.
    fn insert_entry(&mut self, address: SocketAddr, instance: Option<&InstanceId>) {
        let entry = self
            .by_address
            .entry(address)
            .or_insert_with(|| instance.cloned());
        if entry.as_ref() != instance {
            *entry = None;
        }
    }

    /// The instance at `address`, if exactly one is known.
    pub fn instance(&self, address: &SocketAddr) -> Option<&InstanceId> {
        self.by_address.get(address)?.as_ref()
    }

    /// Passive samples for the loads whose address maps to an instance, attributed to
    /// `reporter`, and how many loads did not map (unknown or ambiguous address).
    pub fn resolve(&self, reporter: &NodeName, loads: &[EndpointLoad]) -> (Vec<Sample>, usize) {
        let mut samples = Vec::with_capacity(loads.len());
        for load in loads {
            if let Some(instance) = self.instance(&load.address) {
                samples.push(Sample {
                    instance: instance.clone(),
                    reporter: Reporter::Node(reporter.clone()),
                    observation: Observation::Passive {
                        requests: load.requests,
                        errors: load.errors,
                    },
                });
            }
        }
        let unmapped = loads.len() - samples.len();
        (samples, unmapped)
    }
}

/// The instance id in an endpoint's waymark metadata, if it carries a valid one.
fn metadata_instance(metadata: Option<&Metadata>) -> Option<InstanceId> {
    let value = metadata?
        .filter_metadata
        .get(METADATA_NAMESPACE)?
        .fields
        .get("instance")?;
    match &value.kind {
        Some(Kind::StringValue(s)) => InstanceId::try_new(s).ok(),
        _ => None,
    }
}

// === LrsServer ===

/// Counters a driver exports as metrics (`waymark_lrs_*`).
#[derive(Debug, Default)]
pub struct LrsStats {
    /// Streams accepted.
    pub streams: AtomicU64,
    /// Streams refused: no first request in time, or one without a node id (or with one
    /// longer than [`NODE_ID_BYTES_MAX`]).
    pub bad_streams: AtomicU64,
    /// Streams refused before their first request: plaintext from a non-loopback address,
    /// so there is no verified identity to key the reporter by.
    pub unauthenticated: AtomicU64,
    /// Load reports received (requests after the first, and a first one carrying stats).
    pub reports: AtomicU64,
    /// Endpoint loads handed to the sink.
    pub endpoints: AtomicU64,
    /// Endpoint entries skipped as bad input.
    pub skipped: AtomicU64,
}

struct Inner {
    config: LrsConfig,
    sink: Arc<dyn LoadSink>,
    stats: LrsStats,
    clusters: tokio::sync::watch::Sender<Arc<Vec<String>>>,
}

/// The LRS server. Cheap to clone; every clone feeds the same sink.
#[derive(Clone)]
pub struct LrsServer {
    inner: Arc<Inner>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// One open stream: the node it declared and the reporter it was authenticated as.
struct StreamOf {
    node: Node,
    reporter: LrsReporter,
}

impl LrsServer {
    /// A server handing every report to `sink`.
    pub fn new(config: LrsConfig, sink: Arc<dyn LoadSink>) -> Self {
        let inner = Inner {
            config,
            sink,
            stats: LrsStats::default(),
            clusters: tokio::sync::watch::Sender::new(Arc::new(Vec::new())),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The tonic service to add to a server. A load report names endpoints by address, so
    /// even a large one is well under [`REPORT_BYTES_MAX`]; larger ones end the stream.
    pub fn service(&self) -> LoadReportingServiceServer<Self> {
        LoadReportingServiceServer::new(self.clone())
            .max_decoding_message_size(REPORT_BYTES_MAX)
            .max_encoding_message_size(REPORT_BYTES_MAX)
    }

    /// The server's counters.
    pub fn stats(&self) -> &LrsStats {
        &self.inner.stats
    }

    /// Name the clusters to report on (the services this server's ADS serves); every
    /// stream is sent a new response at once. Envoy 1.40 fixes the set of clusters a
    /// `send_all_clusters` response covers when it arrives, so clusters CDS delivers later
    /// are never reported: naming them is what makes their reports flow.
    pub fn set_clusters(&self, mut clusters: Vec<String>) {
        clusters.sort();
        clusters.dedup();
        self.inner.clusters.send_if_modified(|current| {
            let changed = **current != clusters;
            if changed {
                *current = Arc::new(clusters);
            }
            changed
        });
    }

    /// The response that starts reporting: the named clusters (every cluster Envoy knows
    /// when none are named yet), per endpoint, at our interval.
    pub fn first_response(&self) -> LoadStatsResponse {
        let clusters = self.inner.clusters.borrow().clone();
        let interval = self.inner.config.interval;
        LoadStatsResponse {
            clusters: clusters.to_vec(),
            send_all_clusters: clusters.is_empty(),
            load_reporting_interval: Some(PbDuration {
                seconds: i64::try_from(interval.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(interval.subsec_nanos()).expect("sub-second nanos fit in i32"),
            }),
            report_endpoint_granularity: true,
        }
    }

    async fn first(
        &self,
        inbound: &mut Streaming<LoadStatsRequest>,
    ) -> Result<(Node, LoadStatsRequest), Status> {
        let timeout = self.inner.config.first_request_timeout;
        let bad = |msg: &str| {
            self.inner.stats.bad_streams.fetch_add(1, Ordering::Relaxed);
            Status::invalid_argument(msg.to_owned())
        };
        let first = match tokio::time::timeout(timeout, inbound.message()).await {
            Ok(Ok(Some(req))) => req,
            Ok(Ok(None)) => return Err(bad("stream closed before its first request")),
            Ok(Err(status)) => {
                self.inner.stats.bad_streams.fetch_add(1, Ordering::Relaxed);
                return Err(status);
            }
            Err(_) => return Err(bad("no first request within the timeout")),
        };
        let node = first.node.clone().unwrap_or_default();
        if node.id.is_empty() {
            return Err(bad("the first load report carries no node id"));
        }
        if node.id.len() > NODE_ID_BYTES_MAX {
            return Err(bad("the first load report's node id is too long"));
        }
        Ok((node, first))
    }

    fn handle_request(&self, stream: &StreamOf, req: &LoadStatsRequest) {
        if req.cluster_stats.is_empty() {
            return;
        }
        let node = &stream.node;
        let stats = &self.inner.stats;
        stats.reports.fetch_add(1, Ordering::Relaxed);
        let converted = endpoint_loads(req, self.inner.config.interval);
        for e in &converted.skipped {
            tracing::debug!(node_id = %node.id, error = %e, "load report entry skipped");
        }
        stats
            .skipped
            .fetch_add(converted.skipped.len() as u64, Ordering::Relaxed);
        stats
            .endpoints
            .fetch_add(converted.loads.len() as u64, Ordering::Relaxed);
        tracing::trace!(node_id = %node.id, endpoints = converted.loads.len(), skipped = converted.skipped.len(), "load report");
        if converted.loads.is_empty() {
            return;
        }
        let zone = node
            .locality
            .as_ref()
            .map(|l| l.zone.clone())
            .unwrap_or_default();
        self.inner.sink.handle_report(LoadReport {
            reporter: stream.reporter.clone(),
            node_id: node.id.clone(),
            zone,
            loads: converted.loads,
        });
    }

    /// Read reports until the client goes away; `tx` lives as long as the stream does, so
    /// the response stream stays open (Envoy reconnects when it closes).
    async fn run(
        self,
        stream: StreamOf,
        mut inbound: Streaming<LoadStatsRequest>,
        tx: mpsc::Sender<Result<LoadStatsResponse, Status>>,
    ) {
        let mut clusters = self.inner.clusters.subscribe();
        clusters.mark_unchanged();
        loop {
            tokio::select! {
                Ok(()) = clusters.changed() => {
                    // The cluster list changed: restart Envoy's reporting period with it.
                    if tx.send(Ok(self.first_response())).await.is_err() {
                        return;
                    }
                }
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => self.handle_request(&stream, &req),
                    Ok(None) => return,
                    Err(status) => {
                        tracing::debug!(code = ?status.code(), "load report stream ended by the client");
                        return;
                    }
                },
                () = tx.closed() => return,
            }
        }
    }
}

#[tonic::async_trait]
impl LoadReportingService for LrsServer {
    type StreamLoadStatsStream = BoxStream<LoadStatsResponse>;

    async fn stream_load_stats(
        &self,
        request: Request<Streaming<LoadStatsRequest>>,
    ) -> Result<Response<Self::StreamLoadStatsStream>, Status> {
        let peer = waymark_certs::grpc::peer_identity(&request).cloned();
        let remote = request.remote_addr();
        if peer.is_none() && !is_loopback(remote) {
            self.inner
                .stats
                .unauthenticated
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(remote = ?remote, "load report stream refused: plaintext from off this host");
            return Err(Status::unauthenticated(
                "load reports are accepted over mutual tls, or in plaintext from loopback",
            ));
        }
        let mut inbound = request.into_inner();
        let (node, first) = self.first(&mut inbound).await?;
        let reporter = reporter_of(peer.as_ref(), remote, &node.id)
            .expect("checked above: a verified peer, or plaintext from loopback");
        let stream = StreamOf { node, reporter };
        self.inner.stats.streams.fetch_add(1, Ordering::Relaxed);
        tracing::info!(node_id = %stream.node.id, reporter = %stream.reporter, "load report stream opened");
        // A first request may already carry stats; they count like any other report.
        self.handle_request(&stream, &first);
        let (tx, rx) = mpsc::channel(1);
        tx.try_send(Ok(self.first_response()))
            .expect("a new channel of capacity one has room for the first response");
        let span = tracing::info_span!("lrs_stream", node_id = %stream.node.id, reporter = %stream.reporter);
        tokio::spawn(self.clone().run(stream, inbound, tx).instrument(span));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests;
