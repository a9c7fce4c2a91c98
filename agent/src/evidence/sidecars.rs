//! What a node agent tells the authority about its own xDS clients (its host's sidecars),
//! over the evidence session its certificate already authenticates:
//!
//! ```text
//! node agent ──sidecars (whole, on change, every 30 s)──► authority member (leader)
//! node agent ◄──config_request {id, client}─────────────  authority member (leader)
//! node agent ──client_config {id, JSON document}────────► authority member (leader)
//! ```
//!
//! A report replaces the node's previous one. It is bounded so that no node can grow what
//! the authority keeps: at most [`SIDECAR_CLIENTS_MAX`] clients and
//! [`SIDECAR_REPORT_BYTES_MAX`] bytes (the sender leaves the rest out and says how many),
//! [`SIDECAR_TYPES_MAX`] types per client, and every string within its own bound (the
//! sender cuts them; NACK text at [`NACK_ERROR_BYTES_MAX`]).
//! A report over a bound is refused like any malformed message. The client's configuration
//! travels as the JSON document the node agent's own API serves, at most
//! [`CLIENT_CONFIG_BYTES_MAX`]: the authority relays it, never reads it.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::pb;
use super::wire::{WireError, entries, text};

/// Clients in one report, at most.
pub const SIDECAR_CLIENTS_MAX: usize = 256;
/// Bytes of one encoded report, at most: a few hundred ordinary clients fit; a report whose
/// clients all carry long NACK text holds fewer.
pub const SIDECAR_REPORT_BYTES_MAX: usize = 128 * 1024;
/// Resource types per client, at most (four are served).
pub const SIDECAR_TYPES_MAX: usize = 8;
/// Longest client node id.
pub const CLIENT_ID_BYTES_MAX: usize = 256;
/// Longest declared cluster or zone.
pub const LABEL_BYTES_MAX: usize = 256;
/// Longest verified identity (a SPIFFE id).
pub const IDENTITY_BYTES_MAX: usize = 1024;
/// Longest type URL.
pub const TYPE_URL_BYTES_MAX: usize = 256;
/// Longest version string.
pub const VERSION_BYTES_MAX: usize = 64;
/// Longest NACK error text kept: what the xDS server keeps of it.
pub const NACK_ERROR_BYTES_MAX: usize = waymark_xds::server::NACK_ERROR_LEN_MAX;
/// Largest client configuration document.
pub const CLIENT_CONFIG_BYTES_MAX: usize = 1024 * 1024;

/// A node agent's xDS clients and their sync state, whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SidecarReport {
    /// Time since the node's view was last confirmed upstream; `None` if it never was.
    pub view_age: Option<Duration>,
    /// The clients, at most [`SIDECAR_CLIENTS_MAX`].
    pub clients: Vec<SidecarClient>,
    /// Clients connected but left out of `clients` to stay within the bound.
    pub clients_left_out: u32,
}

/// One xDS stream of a node agent's client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarClient {
    /// The client's node id.
    pub client: String,
    /// The client's declared cluster (the service it fronts).
    pub cluster: String,
    /// The client's declared zone.
    pub zone: String,
    /// Its verified identity, over mutual TLS.
    pub identity: Option<String>,
    /// Delta or State-of-the-World.
    pub protocol: XdsProtocol,
    /// The node's id for the stream.
    pub stream_id: u64,
    /// How long the stream has been open, when the report was made.
    pub connected_for: Duration,
    /// Per resource type.
    pub types: Vec<TypeSync>,
}

/// How a client speaks xDS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum XdsProtocol {
    /// Incremental ADS.
    Delta,
    /// State-of-the-World ADS.
    Sotw,
}

impl XdsProtocol {
    /// `delta` or `sotw`, as the xDS server names them.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Delta => "delta",
            Self::Sotw => "sotw",
        }
    }
}

/// What one client was sent, acknowledged and rejected of one type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeSync {
    /// The type URL.
    pub type_url: String,
    /// Version of the last response sent.
    pub sent: Option<String>,
    /// Version last acknowledged.
    pub acked: Option<String>,
    /// Responses rejected.
    pub nacks: u64,
    /// The last rejection.
    pub last_nack: Option<Nack>,
    /// Resources the client holds.
    pub resources: u64,
}

impl TypeSync {
    /// The client acknowledged the last response it was sent.
    pub fn in_sync(&self) -> bool {
        self.sent == self.acked
    }
}

/// A rejected response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "SidecarNack")] // the xDS tier's own `Nack` has the name
pub struct Nack {
    /// The version rejected (empty when unknown).
    pub version: String,
    /// The client's error.
    pub error: String,
}

/// The authority asks what one client of the node holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigRequest {
    /// Echoed in the answer.
    pub request_id: u64,
    /// The client's node id.
    pub client: String,
}

/// A node's answer to a [`ConfigRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// The request answered.
    pub request_id: u64,
    /// What the client holds (a JSON object); `None` when the node has no such client.
    pub document: Option<serde_json::Value>,
}

impl SidecarClient {
    /// Bytes this client takes in an encoded report (its entry, tag and length included).
    pub fn encoded_len(&self) -> usize {
        let len = prost::Message::encoded_len(&pb::SidecarClient::from(self.clone()));
        1 + prost::encoding::encoded_len_varint(len as u64) + len
    }

    /// `SYNCED` (every type acknowledged as sent), `NACK` (the last response of a type was
    /// rejected) or `STALE` (a response is not acknowledged yet).
    pub fn state(&self) -> &'static str {
        let rejected = self.types.iter().any(|t| {
            !t.in_sync()
                && t.last_nack
                    .as_ref()
                    .is_some_and(|n| Some(&n.version) == t.sent.as_ref())
        });
        if rejected {
            "NACK"
        } else if self.types.iter().all(TypeSync::in_sync) {
            "SYNCED"
        } else {
            "STALE"
        }
    }

    /// The client as both APIs show it (the node agent's `GET /v1/clients`, the
    /// authority's `GET /v1/proxy-status/sidecars`); `since` is the time since the report
    /// was made, added to its durations.
    pub fn body(&self, since: Duration) -> SidecarBody {
        let types = self
            .types
            .iter()
            .map(|t| {
                let short = t.type_url.rsplit('.').next().unwrap_or(&t.type_url);
                let entry = TypeSyncBody {
                    sent: t.sent.clone(),
                    acked: t.acked.clone(),
                    in_sync: t.in_sync(),
                    nacks: t.nacks,
                    last_nack: t.last_nack.clone(),
                    resources: t.resources,
                };
                (short.to_owned(), entry)
            })
            .collect();
        SidecarBody {
            client: self.client.clone(),
            cluster: self.cluster.clone(),
            zone: self.zone.clone(),
            protocol: self.protocol,
            identity: self.identity.clone(),
            stream_id: self.stream_id,
            connected_for_ms: millis(self.connected_for.saturating_add(since)),
            state: self.state().to_owned(),
            types,
        }
    }
}

impl SidecarReport {
    /// The report as both APIs show it: the view's age and every client, with `since` (the
    /// time since the report was made) added to their durations.
    pub fn body(&self, since: Duration) -> SidecarReportBody {
        SidecarReportBody {
            view_age_ms: self.view_age.map(|a| millis(a.saturating_add(since))),
            clients_left_out: self.clients_left_out,
            sidecars: self.clients.iter().map(|c| c.body(since)).collect(),
        }
    }
}

/// A node agent's report of its own xDS clients, as the node agent's `GET /v1/clients`
/// and the authority's `GET /v1/proxy-status/sidecars` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SidecarReportBody {
    /// Time since the node's view was last confirmed upstream, in ms; `null` if it never
    /// was.
    pub view_age_ms: Option<u64>,
    /// Clients connected but left out of `sidecars` to stay within the report's bound.
    pub clients_left_out: u32,
    /// The clients.
    pub sidecars: Vec<SidecarBody>,
}

/// One xDS client of a node agent: its stream and per type what it was sent and acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SidecarBody {
    /// The client's xDS node id.
    pub client: String,
    /// The client's declared cluster (the service it fronts).
    pub cluster: String,
    /// The client's declared zone.
    pub zone: String,
    /// Delta or State-of-the-World ADS.
    pub protocol: XdsProtocol,
    /// Its verified identity, over mutual TLS.
    pub identity: Option<String>,
    /// The node's id for the stream.
    pub stream_id: u64,
    /// How long the stream has been open, in ms.
    pub connected_for_ms: u64,
    /// `SYNCED` (every type acknowledged as sent), `NACK` (the last response of a type was
    /// rejected) or `STALE` (a response is not acknowledged yet).
    pub state: String,
    /// Per resource type, by its short name (`Cluster`, `ClusterLoadAssignment`, …).
    pub types: BTreeMap<String, TypeSyncBody>,
}

/// What one client was sent, acknowledged and rejected of one type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TypeSyncBody {
    /// Version of the last response sent.
    pub sent: Option<String>,
    /// Version last acknowledged.
    pub acked: Option<String>,
    /// `sent == acked`.
    pub in_sync: bool,
    /// Responses rejected.
    pub nacks: u64,
    /// The last rejection.
    pub last_nack: Option<Nack>,
    /// Resources the client holds.
    pub resources: u64,
}

/// What one xDS client of a node agent holds: the node agent's
/// `GET /v1/clients/{client}/config`, relayed by the authority's
/// `GET /v1/proxy-config/{node}/{client}`. At most [`CLIENT_CONFIG_BYTES_MAX`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClientConfigBody {
    /// The node agent.
    pub node: String,
    /// The version of the node's xDS snapshot served now.
    pub snapshot_version: u64,
    /// Time since the node's view was last confirmed upstream, in ms.
    pub view_age_ms: u64,
    /// The clusters the client was sent, by name.
    pub clusters: Vec<HeldCluster>,
    /// The load assignments the client was sent, by cluster.
    pub endpoints: Vec<HeldAssignment>,
    /// Endpoints not listed, to stay within the document's bounds.
    pub endpoints_left_out: u64,
    /// Clusters not listed: present only when the document was over its byte bound even
    /// without endpoints (`clusters` and `endpoints` are then empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters_left_out: Option<u64>,
    /// The client, as in the node's report.
    #[serde(flatten)]
    pub client: SidecarBody,
}

/// A cluster a client was sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HeldCluster {
    /// The cluster.
    pub name: String,
    /// The version the client was sent.
    pub version: String,
    /// The version served now; `null` if it is no longer served.
    pub served_version: Option<String>,
    /// Whether the client holds the version served now.
    pub current: bool,
}

/// A load assignment a client was sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HeldAssignment {
    /// Its cluster.
    pub cluster: String,
    /// The version the client was sent.
    pub version: String,
    /// The version served now; `null` if it is no longer served.
    pub served_version: Option<String>,
    /// Whether the client holds the version served now (only then are its endpoints
    /// known).
    pub current: bool,
    /// Whether its view disregards health; `null` when not current.
    pub health_disregarded: Option<bool>,
    /// Its endpoints; `null` when not current or left out.
    pub endpoints: Option<Vec<HeldEndpoint>>,
    /// Its endpoints left out to stay within the document's bounds, when they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints_left_out: Option<u64>,
}

/// One endpoint of a load assignment, as the client holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HeldEndpoint {
    /// ip:port; `null` if it has no socket address.
    pub address: Option<String>,
    /// The instance (waymark's metadata).
    pub instance: Option<Marker>,
    /// Its locality's zone.
    pub zone: Option<String>,
    /// Its locality's priority.
    pub priority: u32,
    /// Its load-balancing weight.
    pub weight: Option<u32>,
    /// Envoy's health status (`HEALTHY`, `UNHEALTHY`, `DRAINING`, …).
    pub health: String,
    /// waymark's published status (metadata).
    pub status: Option<Marker>,
    /// The evaluator's verdict (metadata).
    pub verdict: Option<Marker>,
    /// Whether its capability was verified (metadata).
    pub verified: Option<bool>,
    /// Whether its view disregards health (metadata).
    pub health_disregarded: Option<Marker>,
}

/// A metadata field of an endpoint: text or a flag, as waymark's translation writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Marker {
    /// A string value.
    Text(String),
    /// A boolean value.
    Flag(bool),
}

/// `text` cut to at most `max` bytes, on a character boundary: how a sender keeps a
/// string within its bound.
pub fn clipped(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

// === wire ===

impl From<SidecarReport> for pb::SidecarReport {
    fn from(value: SidecarReport) -> Self {
        Self {
            view_age_ms: value.view_age.map(millis),
            clients: value.clients.into_iter().map(Into::into).collect(),
            clients_left_out: value.clients_left_out,
        }
    }
}

impl TryFrom<pb::SidecarReport> for SidecarReport {
    type Error = WireError;

    fn try_from(value: pb::SidecarReport) -> Result<Self, WireError> {
        let len = prost::Message::encoded_len(&value);
        if len > SIDECAR_REPORT_BYTES_MAX {
            return Err(WireError::BadLength {
                field: "sidecars",
                len,
                min: 0,
                max: SIDECAR_REPORT_BYTES_MAX,
            });
        }
        Ok(Self {
            view_age: value.view_age_ms.map(Duration::from_millis),
            clients: entries("sidecars.clients", value.clients, SIDECAR_CLIENTS_MAX)?,
            clients_left_out: value.clients_left_out,
        })
    }
}

impl From<SidecarClient> for pb::SidecarClient {
    fn from(value: SidecarClient) -> Self {
        let protocol = match value.protocol {
            XdsProtocol::Delta => pb::XdsProtocol::Delta,
            XdsProtocol::Sotw => pb::XdsProtocol::Sotw,
        };
        Self {
            client: value.client,
            cluster: value.cluster,
            zone: value.zone,
            identity: value.identity,
            protocol: protocol as i32,
            stream_id: value.stream_id,
            connected_for_ms: millis(value.connected_for),
            types: value.types.into_iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<pb::SidecarClient> for SidecarClient {
    type Error = WireError;

    fn try_from(value: pb::SidecarClient) -> Result<Self, WireError> {
        let protocol = match pb::XdsProtocol::try_from(value.protocol) {
            Ok(pb::XdsProtocol::Delta) => XdsProtocol::Delta,
            Ok(pb::XdsProtocol::Sotw) => XdsProtocol::Sotw,
            Ok(pb::XdsProtocol::Unspecified) | Err(_) => {
                return Err(WireError::UnknownEnum {
                    field: "protocol",
                    value: value.protocol,
                });
            }
        };
        let identity = value
            .identity
            .map(|i| text("identity", i, 1, IDENTITY_BYTES_MAX))
            .transpose()?;
        Ok(Self {
            client: text("client", value.client, 1, CLIENT_ID_BYTES_MAX)?,
            cluster: text("cluster", value.cluster, 0, LABEL_BYTES_MAX)?,
            zone: text("zone", value.zone, 0, LABEL_BYTES_MAX)?,
            identity,
            protocol,
            stream_id: value.stream_id,
            connected_for: Duration::from_millis(value.connected_for_ms),
            types: entries("types", value.types, SIDECAR_TYPES_MAX)?,
        })
    }
}

impl From<TypeSync> for pb::TypeSync {
    fn from(value: TypeSync) -> Self {
        Self {
            type_url: value.type_url,
            sent: value.sent,
            acked: value.acked,
            nacks: value.nacks,
            last_nack: value.last_nack.map(|n| pb::Nack {
                version: n.version,
                error: n.error,
            }),
            resources: value.resources,
        }
    }
}

impl TryFrom<pb::TypeSync> for TypeSync {
    type Error = WireError;

    fn try_from(value: pb::TypeSync) -> Result<Self, WireError> {
        let version =
            |field, v: Option<String>| v.map(|v| text(field, v, 0, VERSION_BYTES_MAX)).transpose();
        let last_nack = match value.last_nack {
            None => None,
            Some(n) => Some(Nack {
                version: text("last_nack.version", n.version, 0, VERSION_BYTES_MAX)?,
                error: text("last_nack.error", n.error, 0, NACK_ERROR_BYTES_MAX)?,
            }),
        };
        Ok(Self {
            type_url: text("type_url", value.type_url, 1, TYPE_URL_BYTES_MAX)?,
            sent: version("sent", value.sent)?,
            acked: version("acked", value.acked)?,
            nacks: value.nacks,
            last_nack,
            resources: value.resources,
        })
    }
}

impl From<ConfigRequest> for pb::ConfigRequest {
    fn from(value: ConfigRequest) -> Self {
        Self {
            request_id: value.request_id,
            client: value.client,
        }
    }
}

impl TryFrom<pb::ConfigRequest> for ConfigRequest {
    type Error = WireError;

    fn try_from(value: pb::ConfigRequest) -> Result<Self, WireError> {
        Ok(Self {
            request_id: value.request_id,
            client: text(
                "config_request.client",
                value.client,
                1,
                CLIENT_ID_BYTES_MAX,
            )?,
        })
    }
}

impl From<ClientConfig> for pb::ClientConfig {
    fn from(value: ClientConfig) -> Self {
        Self {
            request_id: value.request_id,
            // A `Value` always serialises.
            document: value
                .document
                .map(|d| serde_json::to_vec(&d).unwrap_or_default()),
        }
    }
}

impl TryFrom<pb::ClientConfig> for ClientConfig {
    type Error = WireError;

    fn try_from(value: pb::ClientConfig) -> Result<Self, WireError> {
        let document = match value.document {
            None => None,
            Some(bytes) => {
                let field = "client_config.document";
                if bytes.len() > CLIENT_CONFIG_BYTES_MAX {
                    return Err(WireError::BadLength {
                        field,
                        len: bytes.len(),
                        min: 2,
                        max: CLIENT_CONFIG_BYTES_MAX,
                    });
                }
                // serde_json bounds its own recursion, so any bytes end in a value or an
                // error; only an object is a configuration.
                match serde_json::from_slice::<serde_json::Value>(&bytes) {
                    Ok(v @ serde_json::Value::Object(_)) => Some(v),
                    _ => return Err(WireError::NotJson { field }),
                }
            }
        };
        Ok(Self {
            request_id: value.request_id,
            document,
        })
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[path = "sidecars_test.rs"]
mod tests;
