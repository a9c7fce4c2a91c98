//! Per-client sync state: what every client was sent, acknowledged and rejected.
//!
//! The data behind a `proxy-status` view (as `istioctl proxy-status` shows for Istio): per
//! client and resource type, the version sent, the version acknowledged, the last NACK with
//! its error, and when the client connected. A view that may be an hour old is only safe
//! if its age is visible. Pure bookkeeping: each stream keeps its own [`ClientSync`] (the
//! server shares it with `proxy-status` readers behind a per-stream lock, so 60,000 streams
//! never queue on one) and stamps times from the server's clock.
//!
//! A server that records held resources ([`crate::ServerConfig::record_held`]; a node agent
//! does, for `proxy-config`) also keeps, per type, the names and versions it has sent the
//! client, so what one client holds can be told apart from what the server serves now.

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
    /// The resources sent, by name → version, once the server records them
    /// ([`crate::ServerConfig::record_held`]): what the client holds when `acked == sent`
    /// (after a NACK it holds the versions it last acknowledged instead).
    pub held: Option<BTreeMap<String, String>>,
}

/// One client's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSync {
    /// The Envoy node id.
    pub node_id: String,
    /// The node's zone, as it declared it.
    pub zone: String,
    /// The node's cluster (Envoy's `--service-cluster`: the service it fronts), as it
    /// declared it.
    pub cluster: String,
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

impl ClientSync {
    /// A stream opened.
    pub fn new(
        stream_id: u64,
        node_id: String,
        zone: String,
        protocol: &'static str,
        now: Instant,
    ) -> Self {
        Self {
            node_id,
            zone,
            cluster: String::new(),
            stream_id,
            protocol,
            identity: None,
            connected_since: now,
            types: BTreeMap::new(),
        }
    }

    /// A response was sent.
    pub fn sent(&mut self, type_url: &str, version: &str, nonce: &str, resources: usize) {
        if let Some(t) = self.type_mut(type_url) {
            t.sent = Some(version.to_owned());
            t.sent_nonce = Some(nonce.to_owned());
            t.resources = resources;
        }
    }

    /// Make the record of what the client was sent of `type_url` what `update` leaves.
    /// `update` is given the previous record, so that unchanged entries are not copied.
    pub fn record_held(
        &mut self,
        type_url: &str,
        update: impl FnOnce(&mut BTreeMap<String, String>),
    ) {
        if let Some(t) = self.type_mut(type_url) {
            update(t.held.get_or_insert_with(BTreeMap::new));
        }
    }

    /// The client acknowledged the response with `nonce`.
    pub fn acked(&mut self, type_url: &str, nonce: &str) {
        if let Some(t) = self.type_mut(type_url)
            && t.sent_nonce.as_deref() == Some(nonce)
        {
            t.acked = t.sent.clone();
        }
    }

    /// The client rejected the response with `nonce`; its acknowledged version stays.
    pub fn nacked(&mut self, type_url: &str, nonce: &str, error: &str) {
        let Some(t) = self.type_mut(type_url) else {
            return;
        };
        let version = if t.sent_nonce.as_deref() == Some(nonce) {
            t.sent.clone()
        } else {
            None
        };
        t.last_nack = Some((version.unwrap_or_default(), error.to_owned()));
        t.nacks += 1;
    }

    fn type_mut(&mut self, type_url: &str) -> Option<&mut TypeSync> {
        // Every send and ACK comes here: only a type's first use allocates its key.
        if !self.types.contains_key(type_url) {
            self.types.insert(type_url.to_owned(), TypeSync::default());
        }
        self.types.get_mut(type_url)
    }
}
