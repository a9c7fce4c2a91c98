//! Per-client sync state: what every client was sent, acknowledged and rejected.
//!
//! The data behind a `proxy-status` view (as `istioctl proxy-status` shows for Istio): per
//! client and resource type, the version sent, the version acknowledged, the last NACK with
//! its error, and when the client connected. A view that may be an hour old is only safe
//! if its age is visible. Pure bookkeeping; the server holds it behind a mutex and stamps
//! times from its own clock.

use std::collections::BTreeMap;
use std::time::Instant;

/// One client's state for one resource type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeSync {
    /// Version (system version / version_info) of the last response sent.
    pub sent: Option<String>,
    /// Nonce of the last response sent.
    pub sent_nonce: Option<String>,
    /// Version the client last acknowledged.
    pub acked: Option<String>,
    /// The last rejection: (version rejected, the client's error).
    pub last_nack: Option<(String, String)>,
    /// NACKs received.
    pub nacks: u64,
    /// Resources the client holds of this type, as far as we know.
    pub resources: usize,
}

/// One client's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSync {
    /// The Envoy node id.
    pub node_id: String,
    /// The node's zone, as it declared it.
    pub zone: String,
    /// The stream serving it.
    pub stream_id: u64,
    /// `delta` or `sotw`.
    pub protocol: &'static str,
    /// The client's verified workload identity, when it connected over mutual TLS.
    pub identity: Option<String>,
    /// When the stream opened.
    pub connected_since: Instant,
    /// Per type URL.
    pub types: BTreeMap<String, TypeSync>,
}

/// All clients of one server, by stream.
#[derive(Debug, Default)]
pub struct SyncRegistry {
    clients: BTreeMap<u64, ClientSync>,
}

impl SyncRegistry {
    /// A stream opened.
    pub fn connect(
        &mut self,
        stream_id: u64,
        node_id: String,
        zone: String,
        protocol: &'static str,
        now: Instant,
    ) {
        let client = ClientSync {
            node_id,
            zone,
            stream_id,
            protocol,
            identity: None,
            connected_since: now,
            types: BTreeMap::new(),
        };
        self.clients.insert(stream_id, client);
    }

    /// Record the identity the stream's TLS handshake verified.
    pub fn set_identity(&mut self, stream_id: u64, identity: Option<String>) {
        if let Some(c) = self.clients.get_mut(&stream_id) {
            c.identity = identity;
        }
    }

    /// A stream closed.
    pub fn disconnect(&mut self, stream_id: u64) {
        self.clients.remove(&stream_id);
    }

    /// A response was sent.
    pub fn sent(
        &mut self,
        stream_id: u64,
        type_url: &str,
        version: &str,
        nonce: &str,
        resources: usize,
    ) {
        if let Some(t) = self.type_mut(stream_id, type_url) {
            t.sent = Some(version.to_owned());
            t.sent_nonce = Some(nonce.to_owned());
            t.resources = resources;
        }
    }

    /// The client acknowledged the response with `nonce`.
    pub fn acked(&mut self, stream_id: u64, type_url: &str, nonce: &str) {
        if let Some(t) = self.type_mut(stream_id, type_url)
            && t.sent_nonce.as_deref() == Some(nonce)
        {
            t.acked = t.sent.clone();
        }
    }

    /// The client rejected the response with `nonce`; its acknowledged version stays.
    pub fn nacked(&mut self, stream_id: u64, type_url: &str, nonce: &str, error: &str) {
        if let Some(t) = self.type_mut(stream_id, type_url) {
            let version = if t.sent_nonce.as_deref() == Some(nonce) {
                t.sent.clone()
            } else {
                None
            };
            t.last_nack = Some((version.unwrap_or_default(), error.to_owned()));
            t.nacks += 1;
        }
    }

    /// Every client, by stream id.
    pub fn clients(&self) -> impl Iterator<Item = &ClientSync> {
        self.clients.values()
    }

    /// The clients with a node id.
    pub fn by_node(&self, node_id: &str) -> Vec<&ClientSync> {
        self.clients
            .values()
            .filter(|c| c.node_id == node_id)
            .collect()
    }

    fn type_mut(&mut self, stream_id: u64, type_url: &str) -> Option<&mut TypeSync> {
        let c = self.clients.get_mut(&stream_id)?;
        // Every send and ACK comes here: only a type's first use allocates its key.
        if !c.types.contains_key(type_url) {
            c.types.insert(type_url.to_owned(), TypeSync::default());
        }
        c.types.get_mut(type_url)
    }
}
