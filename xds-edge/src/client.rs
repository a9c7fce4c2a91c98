//! The Delta xDS client: used by the node agent upstream and by the load generator.
//!
//! Pure parts and a thin shell, like the server:
//!
//! - [`ClientState`] (pure): subscriptions and applied resources per type URL; builds the
//!   requests that open a stream (with `initial_resource_versions`, so a reconnecting
//!   client is not resent what it already holds), validates each response as a whole and
//!   either applies it and ACKs or applies nothing and NACKs (google.rpc code 3);
//! - [`Backoff`] (pure): full jitter, 250 ms doubling to 30 s, seeded, honouring a server's
//!   `grpc-retry-pushback-ms` hint (reconnection admission), reset once a stream has stayed
//!   up for a while;
//! - [`XdsClient`] (shell): one task owning both, which opens `DeltaAggregatedResources`,
//!   ACKs, publishes every applied state on a `watch` channel and reconnects on any error
//!   or stream end. HTTP/2 keepalive is always set so a black-holed connection is noticed.
//!   The stream itself is published on a second `watch` ([`XdsClient::stream_status`]):
//!   open since when, or lost since when and why, with counters of opens and failed
//!   attempts, so a caller can report its own staleness while it serves what it holds.
//! - a **standby** (optional, with more than one server): an idle Delta stream held open
//!   at a second server, subscribed to nothing. When the active stream's server dies, the
//!   next stream opens at once over the standby's connection, beside the stream that
//!   server already holds for this client — which reconnection admission lets in outside
//!   its window (`crate::admission`), so the members that survive a failover take a dead
//!   member's clients in seconds instead of at 5 % per 10 s. The standby is then closed
//!   and a new one opened at another server, through admission like any arrival.
//!
//! ```text
//! DeltaDiscoveryResponse ──► ClientState::handle_response ──► ACK/NACK ──► server
//!                                                        └──► watch<Arc<Applied>>
//! stream open / end / failed attempt ──► StreamStatus ──► watch<StreamStatus>
//! stream end / error ──► standby open? ──yes──► reconnect over it at once
//!                                      └─no───► Backoff::next_delay ──► reconnect
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tracing::Instrument as _;

pub use crate::protocol::Subscription;

/// google.rpc.Code `INVALID_ARGUMENT`, the code a NACK carries.
const CODE_INVALID_ARGUMENT: i32 = 3;
/// The trailer a server sets on `UNAVAILABLE` to say when to come back.
const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// Refuses resources the caller cannot use: `(type_url, resource) → Err(reason)` NACKs the
/// whole response. Runs on the client task, so it must be quick.
pub type Validator = Arc<dyn Fn(&str, &Any) -> Result<(), String> + Send + Sync>;

/// Makes an accepted response durable before it is acknowledged (the node agent's
/// last-known-good cache): called with each response that passed validation, on a blocking
/// thread; `Ok` means durable. On `Err(reason)` nothing of the response is applied and it
/// is NACKed with the reason, so the server's view of what this client holds stays true.
pub type Persist = Arc<dyn Fn(&DeltaDiscoveryResponse) -> Result<(), String> + Send + Sync>;

/// The resources applied for one type.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppliedType {
    /// By name: (resource version, resource).
    pub resources: BTreeMap<String, (String, Any)>,
    /// `system_version_info` of the last response applied.
    pub system_version: String,
    /// By name: the release age its current version carried and when that response
    /// arrived (see [`crate::release_age`]), for a resource whose server carried one.
    /// At most one per resource held.
    pub carried: BTreeMap<String, Arrival>,
}

/// A resource version that arrived with its release's age.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// The version it came with.
    pub version: String,
    /// When the response carrying it arrived, on this client's clock.
    pub at: std::time::Instant,
    /// How old its release was when the server sent it, on the server's account.
    pub age: Duration,
}

impl Arrival {
    /// How old the release is at `now` (this client's clock): the age it arrived with
    /// plus the time since it arrived.
    pub fn age_at(&self, now: std::time::Instant) -> Duration {
        self.age
            .saturating_add(now.saturating_duration_since(self.at))
    }
}

/// Everything applied, as published after each change.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// Per type URL.
    pub types: BTreeMap<String, Arc<AppliedType>>,
    /// Responses applied since the client started.
    pub updates: u64,
    /// Responses rejected since the client started.
    pub nacks: u64,
    /// The last rejection: (type URL, reason).
    pub last_nack: Option<(String, String)>,
    /// Streams opened since the client started (1 after the first connect).
    pub streams: u64,
    /// A stream is open now.
    pub connected: bool,
    /// Release ages ignored since the client started: filed in a resource's metadata but
    /// malformed or past [`crate::release_age::AGE_MAX`].
    pub ages_ignored: u64,
}

impl Applied {
    /// The resources applied for `type_url`, if any response of it was.
    pub fn resources(&self, type_url: &str) -> Option<&BTreeMap<String, (String, Any)>> {
        self.types.get(type_url).map(|t| &t.resources)
    }

    /// The system version last applied for `type_url`.
    pub fn version(&self, type_url: &str) -> Option<&str> {
        self.types.get(type_url).map(|t| t.system_version.as_str())
    }
}

/// Why a response was rejected. Every variant has the same effect: nothing of the response
/// was applied (the previous state stays), and the caller sends [`Nack::request`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResponseError {
    /// The response is for a type this client never subscribed to.
    #[error("type {type_url} is not subscribed")]
    UnsubscribedType {
        /// The response's type URL.
        type_url: String,
    },
    /// A resource has no name.
    #[error("resource #{index} has no name")]
    MissingName {
        /// Its position in the response.
        index: usize,
    },
    /// A resource has no payload.
    #[error("resource {name} has no payload")]
    MissingPayload {
        /// The resource.
        name: String,
    },
    /// A resource's payload is of another type than the response.
    #[error("resource {name} is a {found}, not the response's type")]
    TypeMismatch {
        /// The resource.
        name: String,
        /// The payload's type URL.
        found: String,
    },
    /// The validator refused a resource.
    #[error("resource {name} refused: {reason}")]
    Refused {
        /// The resource.
        name: String,
        /// The validator's reason.
        reason: String,
    },
    /// The response could not be made durable (see [`Persist`]).
    #[error("response not persisted: {reason}")]
    NotPersisted {
        /// Why.
        reason: String,
    },
}

/// A rejected response: the NACK to send and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Nack {
    /// The NACK (`response_nonce` and `error_detail` set).
    pub request: DeltaDiscoveryRequest,
    /// Why.
    pub error: ResponseError,
}

/// The client's protocol state. Pure. See the module documentation.
#[derive(Clone, Default)]
pub struct ClientState {
    subscriptions: BTreeMap<String, Subscription>,
    applied: BTreeMap<String, Arc<AppliedType>>,
    validator: Option<Validator>,
    updates: u64,
    nacks: u64,
    last_nack: Option<(String, String)>,
    streams: u64,
    connected: bool,
    ages_ignored: u64,
}

// === impl ClientState ===

impl ClientState {
    /// A state subscribed to `subscriptions`, holding nothing.
    pub fn new(subscriptions: impl IntoIterator<Item = (String, Subscription)>) -> Self {
        Self {
            subscriptions: subscriptions.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Refuse, with a NACK, any response holding a resource `validator` rejects.
    pub fn with_validator(mut self, validator: Validator) -> Self {
        self.validator = Some(validator);
        self
    }

    /// Start from resources held before (loaded from a cache): they are named in the
    /// initial requests, so the server sends only what changed and removes what is gone.
    pub fn with_applied(mut self, types: BTreeMap<String, AppliedType>) -> Self {
        self.applied = types.into_iter().map(|(t, a)| (t, Arc::new(a))).collect();
        self
    }

    /// The subscriptions, by type URL.
    pub fn subscriptions(&self) -> &BTreeMap<String, Subscription> {
        &self.subscriptions
    }

    /// The requests that open a stream: one per subscribed type (clusters sort before
    /// endpoints), naming what is held so the server resends only what changed. Only the
    /// first carries the node. A type subscribed to nothing is left out, since an empty
    /// first request would mean "wildcard".
    pub fn initial_requests(&self, node: &Node) -> Vec<DeltaDiscoveryRequest> {
        let mut out: Vec<DeltaDiscoveryRequest> = Vec::with_capacity(self.subscriptions.len());
        for (type_url, sub) in &self.subscriptions {
            let names = subscribe_names(sub);
            if names.is_empty() {
                continue;
            }
            let initial_resource_versions = self
                .applied
                .get(type_url)
                .map(|t| {
                    t.resources
                        .iter()
                        .map(|(name, (version, _))| (name.clone(), version.clone()))
                        .collect()
                })
                .unwrap_or_default();
            out.push(DeltaDiscoveryRequest {
                node: out.is_empty().then(|| node.clone()),
                type_url: type_url.clone(),
                resource_names_subscribe: names,
                initial_resource_versions,
                ..Default::default()
            });
        }
        out
    }

    /// Add to the subscription of `type_url`; the request to send on an open stream, if
    /// anything was added.
    pub fn subscribe(
        &mut self,
        type_url: &str,
        subscription: Subscription,
    ) -> Option<DeltaDiscoveryRequest> {
        let held = self.subscriptions.entry(type_url.to_owned()).or_default();
        let added = Subscription {
            wildcard: subscription.wildcard && !held.wildcard,
            names: subscription
                .names
                .difference(&held.names)
                .cloned()
                .collect(),
        };
        held.wildcard |= added.wildcard;
        held.names.extend(added.names.iter().cloned());
        let names = subscribe_names(&added);
        (!names.is_empty()).then(|| DeltaDiscoveryRequest {
            type_url: type_url.to_owned(),
            resource_names_subscribe: names,
            ..Default::default()
        })
    }

    /// Take a response: if every resource in it is acceptable, apply it (upserts and
    /// removals) and return the ACK; otherwise apply nothing and return the NACK.
    pub fn handle_response(
        &mut self,
        resp: DeltaDiscoveryResponse,
    ) -> Result<DeltaDiscoveryRequest, Box<Nack>> {
        self.apply(resp, None)
    }

    /// [`ClientState::handle_response`] for a response that arrived at `now`: the
    /// release ages its resources carry are kept ([`AppliedType::carried`]), malformed
    /// ones counted ([`Applied::ages_ignored`]).
    pub fn handle_response_at(
        &mut self,
        resp: DeltaDiscoveryResponse,
        now: std::time::Instant,
    ) -> Result<DeltaDiscoveryRequest, Box<Nack>> {
        self.apply(resp, Some(now))
    }

    fn apply(
        &mut self,
        resp: DeltaDiscoveryResponse,
        now: Option<std::time::Instant>,
    ) -> Result<DeltaDiscoveryRequest, Box<Nack>> {
        if let Err(error) = self.check(&resp) {
            return Err(self.reject(&resp, error));
        }
        let applied = Arc::make_mut(self.applied.entry(resp.type_url.clone()).or_default());
        for name in &resp.removed_resources {
            applied.resources.remove(name);
            applied.carried.remove(name);
        }
        for r in resp.resources {
            let any = r
                .resource
                .expect("checked above: every resource has a payload");
            match (crate::release_age::parse(r.metadata.as_ref()), now) {
                (crate::release_age::Carried::Age(age), Some(at)) => {
                    let arrival = Arrival {
                        version: r.version.clone(),
                        at,
                        age,
                    };
                    applied.carried.insert(r.name.clone(), arrival);
                }
                (carried, _) => {
                    if carried == crate::release_age::Carried::Malformed {
                        self.ages_ignored += 1;
                    }
                    applied.carried.remove(&r.name);
                }
            }
            applied.resources.insert(r.name, (r.version, any));
        }
        applied.system_version = resp.system_version_info;
        self.updates += 1;
        Ok(DeltaDiscoveryRequest {
            type_url: resp.type_url,
            response_nonce: resp.nonce,
            ..Default::default()
        })
    }

    /// Refuse `resp` for `error`: nothing is applied; the NACK to send.
    pub fn reject(&mut self, resp: &DeltaDiscoveryResponse, error: ResponseError) -> Box<Nack> {
        self.nacks += 1;
        self.last_nack = Some((resp.type_url.clone(), error.to_string()));
        let request = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: CODE_INVALID_ARGUMENT,
                message: error.to_string(),
                details: Vec::new(),
            }),
            ..Default::default()
        };
        Box::new(Nack { request, error })
    }

    /// Whether `resp` would be applied (the checks of [`ClientState::handle_response`]).
    pub fn precheck(&self, resp: &DeltaDiscoveryResponse) -> Result<(), ResponseError> {
        self.check(resp)
    }

    /// A stream opened (counted in [`Applied::streams`]).
    pub fn handle_stream_opened(&mut self) {
        self.streams += 1;
        self.connected = true;
    }

    /// The stream ended; what is applied stays.
    pub fn handle_stream_closed(&mut self) {
        self.connected = false;
    }

    /// Everything applied, for publishing. Cheap: resources are shared per type.
    pub fn applied(&self) -> Applied {
        Applied {
            types: self.applied.clone(),
            updates: self.updates,
            nacks: self.nacks,
            last_nack: self.last_nack.clone(),
            streams: self.streams,
            connected: self.connected,
            ages_ignored: self.ages_ignored,
        }
    }

    fn check(&self, resp: &DeltaDiscoveryResponse) -> Result<(), ResponseError> {
        if !self.subscriptions.contains_key(&resp.type_url) {
            return Err(ResponseError::UnsubscribedType {
                type_url: resp.type_url.clone(),
            });
        }
        for (index, r) in resp.resources.iter().enumerate() {
            if r.name.is_empty() {
                return Err(ResponseError::MissingName { index });
            }
            let Some(any) = &r.resource else {
                return Err(ResponseError::MissingPayload {
                    name: r.name.clone(),
                });
            };
            if any.type_url != resp.type_url {
                return Err(ResponseError::TypeMismatch {
                    name: r.name.clone(),
                    found: any.type_url.clone(),
                });
            }
            if let Some(validator) = &self.validator {
                validator(&resp.type_url, any).map_err(|reason| ResponseError::Refused {
                    name: r.name.clone(),
                    reason,
                })?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for ClientState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientState")
            .field("subscriptions", &self.subscriptions)
            .field("applied", &self.applied)
            .field("validator", &self.validator.as_ref().map(|_| "…"))
            .field("updates", &self.updates)
            .field("nacks", &self.nacks)
            .finish_non_exhaustive()
    }
}

fn subscribe_names(sub: &Subscription) -> Vec<String> {
    let wildcard = sub.wildcard.then(|| "*".to_owned());
    wildcard
        .into_iter()
        .chain(sub.names.iter().cloned())
        .collect()
}

// === Backoff ===

pub use waymark_core::backoff::{Backoff, BackoffConfig};

/// The server's retry hint: `grpc-retry-pushback-ms` on an `UNAVAILABLE` status.
pub fn retry_hint(status: &tonic::Status) -> Option<Duration> {
    if status.code() != tonic::Code::Unavailable {
        return None;
    }
    let ms: u64 = status
        .metadata()
        .get(RETRY_PUSHBACK)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms))
}

// === Stream status ===

/// Why an attempt or a stream ended. Every variant has the same effect: the applied state
/// stays, and the client backs off and reconnects on its own; the caller need do nothing
/// but report it (a certificate refusal names its reason through
/// `waymark_certs::CertError::from_tls`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// No connection could be made: the TCP connect or the TLS handshake failed or timed out.
    #[error("connect failed")]
    Connect(#[source] tonic::transport::Error),
    /// The server refused or failed the stream (a refusal may carry a retry hint, see
    /// [`retry_hint`]), or the connection under it broke.
    #[error("stream failed")]
    Status(#[source] tonic::Status),
    /// The server ended the stream cleanly, or an answer could not be sent on it.
    #[error("stream closed")]
    Closed,
}

/// Where the client's stream to its server stands. Applied resources are kept in every
/// state: only the server removes them.
#[derive(Debug, Clone)]
pub enum StreamState {
    /// No stream has opened since the client started. `error` is why the latest attempt
    /// failed; `None` until one has.
    Connecting {
        /// The latest attempt's failure.
        error: Option<Arc<StreamError>>,
    },
    /// A stream is open.
    Connected {
        /// When it opened.
        since: Instant,
    },
    /// The stream that was open ended, and none has opened since.
    Lost {
        /// When the stream ended (failed reconnect attempts do not move it).
        since: Instant,
        /// Why the latest attempt failed, or, before any, why the stream ended.
        error: Arc<StreamError>,
    },
}

/// The stream as the client's task last saw it, published on [`XdsClient::stream_status`]
/// at every open, end and failed attempt. A reader that falls behind sees only the latest
/// state; the counters say how many opens and failures it skipped.
#[derive(Debug, Clone)]
pub struct StreamStatus {
    /// Open, lost, or not yet opened.
    pub state: StreamState,
    /// Streams opened since the client started (the same count as [`Applied::streams`]).
    pub opened: u64,
    /// Attempts that ended before a stream opened: the connect or TLS handshake failed, or
    /// the server refused the stream.
    pub failed_attempts: u64,
    /// A standby stream is open at another server (see [`ClientConfig::standby`]).
    pub standby: bool,
    /// Streams opened over a standby's connection after the active one ended.
    pub promotions: u64,
}

// === impl StreamStatus ===

impl StreamStatus {
    /// Whether a stream is open.
    pub fn is_connected(&self) -> bool {
        matches!(self.state, StreamState::Connected { .. })
    }

    /// When the stream was lost, if one was open and none is now.
    pub fn lost_since(&self) -> Option<Instant> {
        match self.state {
            StreamState::Lost { since, .. } => Some(since),
            _ => None,
        }
    }

    /// Why the latest attempt or stream ended, if it did and none is open now.
    pub fn error(&self) -> Option<&Arc<StreamError>> {
        match &self.state {
            StreamState::Connecting { error } => error.as_ref(),
            StreamState::Lost { error, .. } => Some(error),
            StreamState::Connected { .. } => None,
        }
    }

    fn new() -> Self {
        Self {
            state: StreamState::Connecting { error: None },
            opened: 0,
            failed_attempts: 0,
            standby: false,
            promotions: 0,
        }
    }

    fn handle_opened(&mut self, now: Instant) {
        debug_assert!(!self.is_connected(), "a stream opened over an open one");
        self.opened += 1;
        self.state = StreamState::Connected { since: now };
    }

    /// An attempt ended before its stream opened: the state keeps its kind and `since`.
    fn handle_attempt_failed(&mut self, error: StreamError) {
        debug_assert!(
            !self.is_connected(),
            "an attempt failed while a stream is open"
        );
        self.failed_attempts += 1;
        let error = Arc::new(error);
        match &mut self.state {
            StreamState::Connecting { error: latest } => *latest = Some(error),
            StreamState::Lost { error: latest, .. } => *latest = error,
            StreamState::Connected { .. } => {}
        }
    }

    fn handle_lost(&mut self, now: Instant, error: StreamError) {
        debug_assert!(self.is_connected(), "a stream was lost that never opened");
        self.state = StreamState::Lost {
            since: now,
            error: Arc::new(error),
        };
    }
}

// === XdsClient ===

/// Client settings.
#[derive(Clone)]
pub struct ClientConfig {
    /// Reconnection backoff.
    pub backoff: BackoffConfig,
    /// Seed of the backoff's jitter (vary it per client, e.g. from the node id).
    pub seed: u64,
    /// HTTP/2 keepalive ping interval (also while idle).
    pub keepalive_interval: Duration,
    /// How long a keepalive ping may go unanswered before the connection is dropped.
    pub keepalive_timeout: Duration,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Requests (ACKs, subscriptions) buffered towards the server.
    pub request_buffer: usize,
    /// Refuses resources the caller cannot use (NACK).
    pub validator: Option<Validator>,
    /// Makes each accepted response durable before it is ACKed.
    pub persist: Option<Persist>,
    /// Resources held before this client started (from a cache), by type URL.
    pub initial: BTreeMap<String, AppliedType>,
    /// Mutual TLS towards the server (build it with `waymark_certs::tls::client_config`);
    /// `None` is plain text (loopback and tests).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Largest response decoded (a whole region's EDS in one SotW answer is the worst
    /// case); a larger one ends the stream, which is retried with backoff.
    pub response_bytes_max: usize,
    /// Hold a standby stream at a second server (see the module documentation); ignored
    /// with a single server. It pays off only over mutual TLS, where the server knows the
    /// standby and the new stream are the same client.
    pub standby: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            backoff: BackoffConfig::default(),
            seed: 0,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            request_buffer: 16,
            validator: None,
            persist: None,
            initial: BTreeMap::new(),
            tls: None,
            response_bytes_max: 64 * 1024 * 1024,
            standby: false,
        }
    }
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("backoff", &self.backoff)
            .field("seed", &self.seed)
            .field("keepalive_interval", &self.keepalive_interval)
            .field("keepalive_timeout", &self.keepalive_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_buffer", &self.request_buffer)
            .field("response_bytes_max", &self.response_bytes_max)
            .field("validator", &self.validator.as_ref().map(|_| "…"))
            .field("persist", &self.persist.as_ref().map(|_| "…"))
            .field("initial", &self.initial.keys().collect::<Vec<_>>())
            .field("tls", &self.tls.is_some())
            .field("standby", &self.standby)
            .finish()
    }
}

/// Errors from the client handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The client's task is gone (it panicked). Nothing changed; the handle is useless.
    #[error("xds client task has stopped")]
    Stopped,
}

enum Command {
    Subscribe {
        type_url: String,
        subscription: Subscription,
    },
}

/// A running Delta xDS client. Dropping it stops the client and closes its stream.
#[derive(Debug)]
pub struct XdsClient {
    commands: mpsc::Sender<Command>,
    status: watch::Receiver<StreamStatus>,
    task: tokio::task::JoinHandle<()>,
}

impl XdsClient {
    /// Start a client with default settings. See [`XdsClient::connect_with`].
    pub fn connect(
        endpoint: Endpoint,
        node: Node,
        subscriptions: impl IntoIterator<Item = (String, Subscription)>,
    ) -> (Self, watch::Receiver<Arc<Applied>>) {
        Self::connect_with(ClientConfig::default(), endpoint, node, subscriptions)
    }

    /// Start a client on the current tokio runtime: it connects to `endpoint` (with
    /// HTTP/2 keepalive set from `config`), subscribes, and publishes every applied state
    /// on the returned channel, reconnecting until the handle is dropped.
    pub fn connect_with(
        config: ClientConfig,
        endpoint: Endpoint,
        node: Node,
        subscriptions: impl IntoIterator<Item = (String, Subscription)>,
    ) -> (Self, watch::Receiver<Arc<Applied>>) {
        Self::connect_any(config, vec![endpoint], node, subscriptions)
    }

    /// Like [`XdsClient::connect_with`], over several equivalent servers (the members of an
    /// authority): it starts at one chosen by the seed and moves to the next after every
    /// stream that ends or fails, so a dead member costs one backoff, not an outage.
    ///
    /// # Panics
    /// If `endpoints` is empty.
    pub fn connect_any(
        config: ClientConfig,
        endpoints: Vec<Endpoint>,
        node: Node,
        subscriptions: impl IntoIterator<Item = (String, Subscription)>,
    ) -> (Self, watch::Receiver<Arc<Applied>>) {
        assert!(!endpoints.is_empty(), "an xds client needs a server");
        let endpoints: Vec<Endpoint> = endpoints
            .into_iter()
            .map(|e| {
                e.http2_keep_alive_interval(config.keepalive_interval)
                    .keep_alive_timeout(config.keepalive_timeout)
                    .keep_alive_while_idle(true)
                    .connect_timeout(config.connect_timeout)
            })
            .collect();
        let next_endpoint = (config.seed % endpoints.len() as u64) as usize;
        let mut state = ClientState::new(subscriptions).with_applied(config.initial.clone());
        if let Some(v) = config.validator.clone() {
            state = state.with_validator(v);
        }
        let (publish, applied) = watch::channel(Arc::new(state.applied()));
        let (publish_status, status) = watch::channel(StreamStatus::new());
        let (commands, commands_rx) = mpsc::channel(config.request_buffer.max(1));
        let span = tracing::info_span!("xds_client", node_id = %node.id);
        let standby = (config.standby && endpoints.len() > 1).then(|| {
            let type_url = state
                .subscriptions()
                .keys()
                .next()
                .cloned()
                .unwrap_or_default();
            Keeper::new(
                Dial {
                    endpoints: endpoints.clone(),
                    tls: config.tls.clone(),
                    node: node.clone(),
                    type_url,
                    response_bytes_max: config.response_bytes_max,
                },
                Backoff::new(config.backoff.clone(), config.seed.rotate_left(32)),
            )
        });
        let driver = Driver {
            state,
            endpoints,
            next_endpoint,
            tls: config.tls.clone(),
            node,
            backoff: Backoff::new(config.backoff.clone(), config.seed),
            commands: commands_rx,
            publish,
            status: StreamStatus::new(),
            publish_status,
            request_buffer: config.request_buffer.max(1),
            response_bytes_max: config.response_bytes_max,
            persist: config.persist.clone(),
            standby,
        };
        let task = tokio::spawn(driver.run().instrument(span));
        let handle = Self {
            commands,
            status,
            task,
        };
        (handle, applied)
    }

    /// The stream's state: open since when, or lost since when and why, with counters of
    /// opens and failed attempts; updated at every change until the handle is dropped.
    /// The applied state of an opening stream is published before its `Connected`, and
    /// that of an ending one before its `Lost`. Each call returns a new receiver whose
    /// first `changed` returns at once, so a loop over it starts from the current state.
    pub fn stream_status(&self) -> watch::Receiver<StreamStatus> {
        let mut status = self.status.clone();
        status.mark_changed();
        status
    }

    /// Add to a subscription; sent at once on an open stream, and on every reconnect.
    pub async fn subscribe(
        &self,
        type_url: &str,
        subscription: Subscription,
    ) -> Result<(), ClientError> {
        let command = Command::Subscribe {
            type_url: type_url.to_owned(),
            subscription,
        };
        self.commands
            .send(command)
            .await
            .map_err(|_| ClientError::Stopped)
    }

    /// Stop the client and wait until its task has dropped everything it held (the
    /// persist hook among them), so that what it held — a cache file's lock — is free
    /// once this returns. Dropping the client stops it too, without waiting.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for XdsClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How an attempt ended: `None` from [`Driver::run_stream`] means the handle is gone.
struct Ended {
    /// Whether its stream had opened (else the attempt failed).
    opened: bool,
    lived: Duration,
    error: StreamError,
}

/// The task owning a client's state: one stream at a time, reconnecting with backoff.
struct Driver {
    state: ClientState,
    endpoints: Vec<Endpoint>,
    next_endpoint: usize,
    tls: Option<Arc<rustls::ClientConfig>>,
    node: Node,
    backoff: Backoff,
    commands: mpsc::Receiver<Command>,
    publish: watch::Sender<Arc<Applied>>,
    status: StreamStatus,
    publish_status: watch::Sender<StreamStatus>,
    request_buffer: usize,
    response_bytes_max: usize,
    persist: Option<Persist>,
    /// The standby, when configured with more than one server.
    standby: Option<Keeper>,
}

/// Largest request this client encodes (subscriptions, ACKs, a NACK's text).
const REQUEST_BYTES_MAX: usize = 1024 * 1024;

impl Driver {
    async fn run(mut self) {
        let mut via = None;
        while let Some(ended) = self.run_stream(via.take()).await {
            let hint = match &ended.error {
                StreamError::Status(status) => retry_hint(status),
                _ => None,
            };
            let delay = self.backoff.next_delay(ended.lived, hint);
            via = self.standby.as_mut().and_then(Keeper::take_open);
            self.status.standby = false;
            // A certificate refusal, ours or the server's, names its reason.
            let cert = waymark_certs::CertError::from_tls(&ended.error).map(|e| e.reason());
            if let Some(standby) = &via {
                self.status.promotions += 1;
                tracing::info!(
                    error = ?ended.error,
                    cert_reason = cert.map(|r| r.as_str()),
                    opened = ended.opened,
                    lived_ms = ended.lived.as_millis() as u64,
                    standby = standby.index,
                    "xds stream ended; reconnecting over the standby at once"
                );
            } else {
                tracing::info!(
                    error = ?ended.error,
                    cert_reason = cert.map(|r| r.as_str()),
                    opened = ended.opened,
                    lived_ms = ended.lived.as_millis() as u64,
                    hint_ms = hint.map(|h| h.as_millis() as u64),
                    backoff_ms = delay.as_millis() as u64,
                    "xds stream ended; reconnecting after backoff"
                );
            }
            if ended.opened {
                self.status.handle_lost(Instant::now(), ended.error);
            } else {
                self.status.handle_attempt_failed(ended.error);
            }
            self.publish_status();
            if via.is_some() {
                continue;
            }
            if !self.wait(delay).await {
                return;
            }
        }
    }

    /// Sleep for `delay`, still taking subscriptions; `false` if the handle is gone.
    async fn wait(&mut self, delay: Duration) -> bool {
        let deadline = Instant::now() + delay;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return true,
                command = self.commands.recv() => match command {
                    // Not connected: the next stream's initial requests carry it.
                    Some(c) => {
                        let _ = self.handle_command(c);
                    }
                    None => return false,
                },
            }
        }
    }

    /// One stream: over `via`'s connection when a standby is promoted (it is closed once
    /// the new stream is answered), else over a new connection to the next server.
    async fn run_stream(&mut self, via: Option<Standby>) -> Option<Ended> {
        let failed = |error| {
            Some(Ended {
                opened: false,
                lived: Duration::ZERO,
                error,
            })
        };
        let active = match &via {
            Some(standby) => standby.index,
            None => self.next_endpoint % self.endpoints.len(),
        };
        self.next_endpoint = (active + 1) % self.endpoints.len();
        let channel: Channel = match &via {
            Some(standby) => standby.channel.clone(),
            None => {
                let endpoint = self.endpoints[active].clone();
                match connect(endpoint, self.tls.as_ref()).await {
                    Ok(c) => c,
                    Err(e) => return failed(StreamError::Connect(e)),
                }
            }
        };
        if let Some(keeper) = &mut self.standby {
            keeper.handle_active(active);
            self.status.standby = keeper.is_open();
        }
        let (tx, rx) = mpsc::channel(self.request_buffer);
        let initial = self.state.initial_requests(&self.node);
        let outbound = tokio_stream::iter(initial).chain(ReceiverStream::new(rx));
        // Requests are small (names, nonces, a NACK's text); responses are whole views.
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.response_bytes_max)
            .max_encoding_message_size(REQUEST_BYTES_MAX);
        let answered = client.delta_aggregated_resources(outbound).await;
        // The new stream is answered (or refused): the standby it stood beside has done
        // its work either way.
        drop(via);
        let mut inbound = match answered {
            Ok(response) => response.into_inner(),
            Err(status) => return failed(StreamError::Status(status)),
        };
        let opened = Instant::now();
        self.state.handle_stream_opened();
        self.publish();
        self.status.handle_opened(opened);
        self.publish_status();
        tracing::info!(stream = self.status.opened, "xds stream opened");
        let error = loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(resp)) => {
                        if !self.handle_response(resp, &tx).await {
                            break StreamError::Closed;
                        }
                    }
                    Ok(None) => break StreamError::Closed,
                    Err(status) => break StreamError::Status(status),
                },
                command = self.commands.recv() => match command {
                    Some(c) => {
                        if let Some(req) = self.handle_command(c)
                            && tx.send(req).await.is_err()
                        {
                            break StreamError::Closed;
                        }
                    }
                    None => return None,
                },
                open = keep(self.standby.as_mut()) => {
                    if self.status.standby != open {
                        self.status.standby = open;
                        self.publish_status();
                    }
                }
            }
        };
        self.state.handle_stream_closed();
        self.publish();
        Some(Ended {
            opened: true,
            lived: opened.elapsed(),
            error,
        })
    }

    /// Apply or reject, answer, then publish; `false` if the answer could not be sent.
    async fn handle_response(
        &mut self,
        resp: DeltaDiscoveryResponse,
        tx: &mpsc::Sender<DeltaDiscoveryRequest>,
    ) -> bool {
        // Its arrival, before persisting: the agent's part of the path starts here.
        let arrived = Instant::now().into_std();
        let type_url = resp.type_url.clone();
        let version = resp.system_version_info.clone();
        let nonce = resp.nonce.clone();
        let (upserts, removals) = (resp.resources.len(), resp.removed_resources.len());
        let resp = match self.persist(resp).await {
            Ok(resp) => resp,
            Err(nack) => {
                tracing::error!(xds.type_url = %type_url, xds.version = %version, xds.nonce = %nonce, error = %nack.error, "xds response not persisted; rejected");
                let sent = tx.send(nack.request).await.is_ok();
                self.publish();
                return sent;
            }
        };
        let answer = match self.state.handle_response_at(resp, arrived) {
            Ok(ack) => {
                tracing::debug!(xds.type_url = %type_url, xds.version = %version, xds.nonce = %nonce, upserts, removals, "xds response applied");
                ack
            }
            Err(nack) => {
                tracing::warn!(xds.type_url = %type_url, xds.version = %version, xds.nonce = %nonce, error = %nack.error, "xds response rejected");
                nack.request
            }
        };
        if tx.send(answer).await.is_err() {
            return false;
        }
        self.publish();
        true
    }

    /// Make an acceptable response durable before it is applied and ACKed. A response the
    /// checks refuse is passed through (it is NACKed without touching the store).
    async fn persist(
        &mut self,
        resp: DeltaDiscoveryResponse,
    ) -> Result<DeltaDiscoveryResponse, Box<Nack>> {
        let Some(persist) = self.persist.clone() else {
            return Ok(resp);
        };
        if self.state.precheck(&resp).is_err() {
            return Ok(resp);
        }
        let resp = Arc::new(resp);
        let job = Arc::clone(&resp);
        let outcome = tokio::task::spawn_blocking(move || persist(&job))
            .await
            .unwrap_or_else(|e| Err(format!("persist task failed: {e}")));
        let resp = Arc::try_unwrap(resp).unwrap_or_else(|shared| (*shared).clone());
        match outcome {
            Ok(()) => Ok(resp),
            Err(reason) => Err(self
                .state
                .reject(&resp, ResponseError::NotPersisted { reason })),
        }
    }

    fn handle_command(&mut self, command: Command) -> Option<DeltaDiscoveryRequest> {
        match command {
            Command::Subscribe {
                type_url,
                subscription,
            } => self.state.subscribe(&type_url, subscription),
        }
    }

    fn publish(&self) {
        self.publish.send_replace(Arc::new(self.state.applied()));
    }

    fn publish_status(&self) {
        self.publish_status.send_replace(self.status.clone());
    }
}

/// Open a connection to `endpoint`, over mutual TLS when `tls` is set.
async fn connect(
    endpoint: Endpoint,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Channel, tonic::transport::Error> {
    match tls {
        Some(tls) => {
            let connector = waymark_certs::grpc::TlsConnector::new(Arc::clone(tls));
            endpoint.connect_with_connector(connector).await
        }
        None => endpoint.connect().await,
    }
}

// === Standby ===

/// An open standby stream: the connection it rides, and the stream itself.
struct Standby {
    /// The server, as an index into the endpoints.
    index: usize,
    channel: Channel,
    /// Held so the stream stays open; dropping it half-closes the stream.
    _requests: mpsc::Sender<DeltaDiscoveryRequest>,
    inbound: tonic::Streaming<DeltaDiscoveryResponse>,
    opened: Instant,
}

/// What opening a standby needs.
#[derive(Clone)]
struct Dial {
    endpoints: Vec<Endpoint>,
    tls: Option<Arc<rustls::ClientConfig>>,
    node: Node,
    /// The type the standby's one request names (it subscribes to nothing of it).
    type_url: String,
    response_bytes_max: usize,
}

impl Dial {
    /// Connect to server `index` and open a stream subscribed to nothing: its first
    /// request names the node and unsubscribes the wildcard a first request would
    /// otherwise imply, so the server sends nothing on it.
    async fn open(self, index: usize) -> Result<Standby, StreamError> {
        let endpoint = self.endpoints[index].clone();
        let channel = connect(endpoint, self.tls.as_ref())
            .await
            .map_err(StreamError::Connect)?;
        let (requests, rx) = mpsc::channel(1);
        let first = DeltaDiscoveryRequest {
            node: Some(self.node),
            type_url: self.type_url,
            resource_names_unsubscribe: vec!["*".to_owned()],
            ..Default::default()
        };
        let outbound = tokio_stream::iter([first]).chain(ReceiverStream::new(rx));
        let mut client = AggregatedDiscoveryServiceClient::new(channel.clone())
            .max_decoding_message_size(self.response_bytes_max)
            .max_encoding_message_size(REQUEST_BYTES_MAX);
        let inbound = client
            .delta_aggregated_resources(outbound)
            .await
            .map_err(StreamError::Status)?
            .into_inner();
        Ok(Standby {
            index,
            channel,
            _requests: requests,
            inbound,
            opened: Instant::now(),
        })
    }
}

/// Where the standby stands.
enum Phase {
    /// None open; the next attempt is due then.
    Waiting(Instant),
    /// An attempt is under way (on its own task, so the active stream never waits for it).
    Opening(tokio::task::JoinHandle<Result<Standby, StreamError>>),
    Open(Box<Standby>),
}

/// Keeps a standby stream open at a server other than the active one, reopening it with
/// backoff when it ends or cannot be opened.
struct Keeper {
    dial: Dial,
    backoff: Backoff,
    phase: Phase,
    /// The active stream's server, which the standby must not share.
    active: usize,
    /// The next server to try.
    next: usize,
}

impl Keeper {
    fn new(dial: Dial, backoff: Backoff) -> Self {
        Self {
            dial,
            backoff,
            phase: Phase::Waiting(Instant::now()),
            active: 0,
            next: 0,
        }
    }

    /// The open standby, taken for promotion; a new one is opened elsewhere afterwards.
    fn take_open(&mut self) -> Option<Standby> {
        match std::mem::replace(&mut self.phase, Phase::Waiting(Instant::now())) {
            Phase::Open(standby) => Some(*standby),
            other => {
                self.phase = other;
                None
            }
        }
    }

    /// The active stream is (about to be) at server `index`. A standby on the same server
    /// would stand beside nothing useful: it is closed and reopened elsewhere.
    fn handle_active(&mut self, index: usize) {
        self.active = index;
        if let Phase::Open(standby) = &self.phase
            && standby.index == index
        {
            self.phase = Phase::Waiting(Instant::now());
        }
    }

    /// The next server to try that is not the active one.
    fn pick(&mut self) -> usize {
        let n = self.dial.endpoints.len();
        let mut index = self.next % n;
        if index == self.active {
            index = (index + 1) % n;
        }
        self.next = (index + 1) % n;
        index
    }

    /// Move the standby one step (open one, take one that opened, notice one that
    /// ended); whether one is open after it. Cancel-safe (every wait is on state kept
    /// here), so it runs as one branch of the active stream's `select!`.
    async fn step(&mut self) -> bool {
        match &mut self.phase {
            Phase::Waiting(at) => {
                tokio::time::sleep_until(*at).await;
                let index = self.pick();
                let dial = self.dial.clone();
                self.phase = Phase::Opening(tokio::spawn(dial.open(index)));
            }
            Phase::Opening(task) => {
                let outcome = task.await.unwrap_or(Err(StreamError::Closed));
                self.phase = match outcome {
                    Ok(standby) if standby.index != self.active => {
                        tracing::debug!(server = standby.index, "xds standby stream opened");
                        Phase::Open(Box::new(standby))
                    }
                    // The active stream moved onto that server meanwhile.
                    Ok(_) => Phase::Waiting(Instant::now()),
                    Err(error) => {
                        let hint = match &error {
                            StreamError::Status(status) => retry_hint(status),
                            _ => None,
                        };
                        let delay = self.backoff.next_delay(Duration::ZERO, hint);
                        tracing::debug!(error = ?error, backoff_ms = delay.as_millis() as u64, "xds standby stream not opened");
                        Phase::Waiting(Instant::now() + delay)
                    }
                };
            }
            Phase::Open(standby) => {
                // Nothing is subscribed, so nothing should come; anything that does is
                // dropped, and an end (the server gone) is retried elsewhere.
                let ended = loop {
                    match standby.inbound.message().await {
                        Ok(Some(_)) => continue,
                        Ok(None) => break StreamError::Closed,
                        Err(status) => break StreamError::Status(status),
                    }
                };
                let lived = standby.opened.elapsed();
                let delay = self.backoff.next_delay(lived, None);
                tracing::debug!(error = ?ended, lived_ms = lived.as_millis() as u64, backoff_ms = delay.as_millis() as u64, "xds standby stream ended");
                self.phase = Phase::Waiting(Instant::now() + delay);
            }
        }
        self.is_open()
    }

    fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open(_))
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if let Phase::Opening(task) = &self.phase {
            task.abort();
        }
    }
}

/// Move the standby one step, if there is one (pending forever if not); whether one is
/// open after it.
async fn keep(keeper: Option<&mut Keeper>) -> bool {
    match keeper {
        Some(keeper) => keeper.step().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
