//! The xDS protocol per stream and type, as pure state machines (no I/O, no clocks).
//!
//! [`DeltaState`] follows the incremental protocol: the client's subscriptions (wildcard
//! and/or named), the versions it holds (seeded from `initial_resource_versions` on
//! reconnect, so an unchanged resource is not resent and one deleted while it was away is
//! sent as removed), ACK/NACK by nonce. [`SotwState`] follows State-of-the-World: every
//! response carries the full set the client asked for, a request with a stale nonce is
//! ignored, and absence means deletion for CDS but not for EDS.
//!
//! Both compute their next response from a [`Resources`] map and nothing else, so the
//! stream driver only moves messages (go-control-plane's `createDeltaResponse` split).
//! A response is an [`Outgoing`]: the stream's own fields, and the resources as the
//! snapshot's shared encodings, never copied into a per-stream message.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use bytes::{BufMut as _, Bytes};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use crate::snapshot::{Encoded, Payload, Released, Resources, Stamps};
use crate::translate::{TYPE_CLUSTER, TYPE_LISTENER};

/// The field both `DiscoveryResponse` and `DeltaDiscoveryResponse` carry resources in.
const RESOURCES_FIELD: u32 = 2;
/// `Resource`'s fields, as the Delta response's entries carry them.
const RESOURCE_VERSION_FIELD: u32 = 1;
const RESOURCE_PAYLOAD_FIELD: u32 = 2;
const RESOURCE_NAME_FIELD: u32 = 3;
/// `Resource.metadata`, where a release's age rides ([`crate::release_age`]).
const RESOURCE_METADATA_FIELD: u32 = 9;

/// The instants a Delta response's release ages are taken at (passed in: this module
/// reads no clock). A resource's age is `now` less its release stamp, carried only for a
/// release made since `since` (the stream's opening: an older one is the client's
/// catch-up, as [`crate::sync::propagation`] judges it) and no older than
/// [`crate::release_age::AGE_MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgeClock {
    /// When the response is made.
    pub now: Instant,
    /// When the client's stream opened.
    pub since: Instant,
}

impl AgeClock {
    /// The metadata bytes carrying `released`'s age, if it is carried.
    fn carry(&self, released: Released) -> Option<Vec<u8>> {
        if released.at < self.since {
            return None;
        }
        crate::release_age::encode(self.now.saturating_duration_since(released.at))
    }
}

/// A response as the protocol decided it: `head` holds the stream's own fields (version,
/// nonce, type, removed names) with its resources field empty, and each resource follows
/// as a few bytes of its own and the snapshot's shared encoding of its `Any`. Protobuf
/// lets a repeated field's entries follow the other fields, so the concatenation is the
/// whole message, byte for byte what a client decodes.
#[derive(Debug, Clone)]
pub struct Outgoing<M> {
    /// The response without its resources.
    pub head: M,
    /// Per resource: the start of its `resources` entry, then its shared `Any`.
    entries: Vec<(Vec<u8>, Bytes)>,
    /// The release stamps of the resource versions it brings the client (never sent).
    released: Vec<Released>,
}

impl<M: prost::Message + Default> Outgoing<M> {
    fn new(head: M) -> Self {
        Self {
            head,
            entries: Vec::new(),
            released: Vec::new(),
        }
    }

    /// When the resource versions this response brings the client were released, where
    /// the snapshot knew it: what the client's acknowledgement of it is timed against.
    pub fn released(&self) -> &[Released] {
        &self.released
    }

    /// Resources carried.
    pub fn resource_count(&self) -> usize {
        self.entries.len()
    }

    /// Bytes of the whole encoded message.
    pub fn encoded_len(&self) -> usize {
        self.head.encoded_len()
            + self
                .entries
                .iter()
                .map(|(start, any)| start.len() + any.len())
                .sum::<usize>()
    }

    /// The message as one gRPC length-prefixed frame, in chunks: the frame's header, the
    /// head and the first entry's start in one buffer of this stream's own, then the
    /// shared encodings with each further entry's start between them. `None` when the
    /// message is longer than a gRPC frame can say.
    pub fn into_grpc_chunks(self) -> Option<Vec<Bytes>> {
        let len = u32::try_from(self.encoded_len()).ok()?;
        let mut chunks = Vec::with_capacity(1 + 2 * self.entries.len());
        let mut own = Vec::with_capacity(5 + self.head.encoded_len() + 32);
        own.put_u8(0); // not compressed
        own.put_u32(len);
        self.head.encode_raw(&mut own);
        let mut entries = self.entries.into_iter();
        if let Some((start, any)) = entries.next() {
            own.extend_from_slice(&start);
            chunks.push(Bytes::from(own));
            chunks.push(any);
        } else {
            chunks.push(Bytes::from(own));
        }
        for (start, any) in entries {
            chunks.push(Bytes::from(start));
            chunks.push(any);
        }
        Some(chunks)
    }

    /// The whole message, as a client decodes it.
    pub fn message(&self) -> Result<M, prost::DecodeError> {
        let mut buf = self.head.encode_to_vec();
        for (start, any) in &self.entries {
            buf.extend_from_slice(start);
            buf.extend_from_slice(any);
        }
        M::decode(buf.as_slice())
    }
}

impl Outgoing<DeltaDiscoveryResponse> {
    /// Add a `Resource { name, version, resource }` entry, with `metadata` (an encoded
    /// `Metadata`) where given.
    fn push_resource(
        &mut self,
        name: &str,
        version: &str,
        payload: &Payload,
        metadata: Option<&[u8]>,
    ) {
        let any = payload.wire();
        let string_len = |tag: u32, s: &str| {
            if s.is_empty() {
                0
            } else {
                key_len(tag) + encoded_len_varint(s.len() as u64) + s.len()
            }
        };
        let metadata_len = metadata.map_or(0, |m| {
            key_len(RESOURCE_METADATA_FIELD) + encoded_len_varint(m.len() as u64) + m.len()
        });
        let resource_len = string_len(RESOURCE_VERSION_FIELD, version)
            + string_len(RESOURCE_NAME_FIELD, name)
            + metadata_len
            + key_len(RESOURCE_PAYLOAD_FIELD)
            + encoded_len_varint(any.len() as u64)
            + any.len();
        let mut start = Vec::with_capacity(resource_len - any.len() + 16);
        encode_key(RESOURCES_FIELD, WireType::LengthDelimited, &mut start);
        encode_varint(resource_len as u64, &mut start);
        for (tag, s) in [
            (RESOURCE_VERSION_FIELD, version),
            (RESOURCE_NAME_FIELD, name),
        ] {
            if !s.is_empty() {
                encode_key(tag, WireType::LengthDelimited, &mut start);
                encode_varint(s.len() as u64, &mut start);
                start.extend_from_slice(s.as_bytes());
            }
        }
        if let Some(m) = metadata {
            encode_key(
                RESOURCE_METADATA_FIELD,
                WireType::LengthDelimited,
                &mut start,
            );
            encode_varint(m.len() as u64, &mut start);
            start.extend_from_slice(m);
        }
        encode_key(
            RESOURCE_PAYLOAD_FIELD,
            WireType::LengthDelimited,
            &mut start,
        );
        encode_varint(any.len() as u64, &mut start);
        self.entries.push((start, any.clone()));
    }
}

impl Outgoing<DiscoveryResponse> {
    /// Add an `Any` entry.
    fn push_any(&mut self, payload: &Payload) {
        let any = payload.wire();
        let mut start = Vec::with_capacity(key_len(RESOURCES_FIELD) + 5);
        encode_key(RESOURCES_FIELD, WireType::LengthDelimited, &mut start);
        encode_varint(any.len() as u64, &mut start);
        self.entries.push((start, any.clone()));
    }
}

/// What a request meant for the last response of its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    /// No response was outstanding, or the request names no nonce (a first request).
    None,
    /// The client applied the response with this nonce.
    Acked {
        /// The nonce.
        nonce: String,
    },
    /// The client rejected the response with this nonce.
    Nacked {
        /// The nonce.
        nonce: String,
        /// The client's error detail.
        error: String,
    },
    /// The nonce is not the latest we sent on this stream: ignored for ACK/NACK.
    Stale {
        /// The nonce the client sent.
        nonce: String,
    },
}

/// A client's subscriptions for one type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscription {
    /// Subscribed to everything of the type.
    pub wildcard: bool,
    /// Subscribed by name.
    pub names: BTreeSet<String>,
}

impl Subscription {
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    /// The resources of `resources` this subscription names (all of them if `wildcard`),
    /// in name order. A stream names a few of a region's hundreds of resources, and every
    /// stream computes this on every push: looking its names up costs what it follows,
    /// walking the map cost the region.
    fn select<'a>(
        &'a self,
        resources: &'a Resources,
        wildcard: bool,
    ) -> Box<dyn Iterator<Item = (&'a String, &'a Encoded)> + 'a> {
        if wildcard {
            Box::new(resources.iter())
        } else {
            Box::new(
                self.names
                    .iter()
                    .filter_map(|n| resources.get_key_value(n.as_str())),
            )
        }
    }
}

// === Delta ===

/// One Delta stream's state for one type.
#[derive(Debug, Clone, Default)]
pub struct DeltaState {
    /// What the client subscribed to.
    pub subscription: Subscription,
    /// Versions the client holds (as far as we know), by name.
    pub known: BTreeMap<String, String>,
    /// The nonce of the last response sent, if any.
    pub last_nonce: Option<String>,
    started: bool,
}

impl DeltaState {
    /// Take a request: subscriptions always apply; the nonce decides ACK/NACK.
    pub fn handle_request(&mut self, req: &DeltaDiscoveryRequest) -> Ack {
        if !self.started {
            self.started = true;
            // A first request with no names is a wildcard subscription (legacy rule).
            if req.resource_names_subscribe.is_empty() {
                self.subscription.wildcard = true;
            }
            for (name, version) in &req.initial_resource_versions {
                self.known.insert(name.clone(), version.clone());
            }
        }
        for name in &req.resource_names_subscribe {
            if name == "*" {
                self.subscription.wildcard = true;
            } else {
                self.subscription.names.insert(name.clone());
            }
        }
        for name in &req.resource_names_unsubscribe {
            if name == "*" {
                self.subscription.wildcard = false;
            } else {
                self.subscription.names.remove(name);
            }
            // Unsubscribed resources are forgotten; unknown names are a no-op.
            if !self.subscription.wants(name) {
                self.known.remove(name);
            }
        }
        self.classify(
            &req.response_nonce,
            req.error_detail.as_ref().map(|s| s.message.clone()),
        )
    }

    fn classify(&self, nonce: &str, error: Option<String>) -> Ack {
        if nonce.is_empty() {
            return Ack::None;
        }
        if self.last_nonce.as_deref() != Some(nonce) {
            return Ack::Stale {
                nonce: nonce.to_owned(),
            };
        }
        match error {
            Some(error) => Ack::Nacked {
                nonce: nonce.to_owned(),
                error,
            },
            None => Ack::Acked {
                nonce: nonce.to_owned(),
            },
        }
    }

    /// The response that brings the client up to `resources`, if anything differs.
    /// Records what it sends as known (a NACKed version is not resent until it changes).
    pub fn next_response(
        &mut self,
        type_url: &str,
        resources: &Resources,
        system_version: &str,
        nonce: String,
    ) -> Option<Outgoing<DeltaDiscoveryResponse>> {
        self.next_response_stamped(type_url, resources, system_version, nonce, &Stamps::new())
    }

    /// [`DeltaState::next_response`], with the response carrying the release stamps (from
    /// `stamps`) of the resource versions it sends.
    pub fn next_response_stamped(
        &mut self,
        type_url: &str,
        resources: &Resources,
        system_version: &str,
        nonce: String,
        stamps: &Stamps,
    ) -> Option<Outgoing<DeltaDiscoveryResponse>> {
        self.next_response_carrying(type_url, resources, system_version, nonce, stamps, None)
    }

    /// [`DeltaState::next_response_stamped`], with each stamped resource carrying its
    /// release's age at `clock` in its metadata (see [`crate::release_age`]) when `clock`
    /// is given.
    pub fn next_response_carrying(
        &mut self,
        type_url: &str,
        resources: &Resources,
        system_version: &str,
        nonce: String,
        stamps: &Stamps,
        clock: Option<AgeClock>,
    ) -> Option<Outgoing<DeltaDiscoveryResponse>> {
        // A client that reconnects from a member further ahead may hold newer versions
        // than this server: never send it backwards (ADR-11). Versions that are numbers
        // are compared; the server catches up and sends once it is ahead again.
        // The snapshot's own version is the highest it ever held, kept when a service is
        // removed: a server that deleted a view has seen a version at least the client's,
        // while one that has applied nothing yet (a member still catching up) has not.
        // (Computed only when the client holds something this server lacks.)
        let newest_of = || {
            resources
                .values()
                .filter_map(|e| e.version.parse::<u64>().ok())
                .chain(system_version.parse::<u64>().ok())
                .max()
        };
        let mut out = Vec::new();
        let wildcard = self.subscription.wildcard;
        for (name, enc) in self.subscription.select(resources, wildcard) {
            let held = self.known.get(name);
            if held.is_some_and(|h| is_ahead(h, &enc.version)) {
                continue;
            }
            if held != Some(&enc.version) {
                out.push((name, enc));
            }
        }
        // A resource this server lacks is removed unless the client's copy is newer than
        // anything here (then this server is behind, not the resource gone).
        let newest = std::cell::OnceCell::new();
        let removed: Vec<String> = self
            .known
            .iter()
            .filter(|(n, _)| !resources.contains_key(*n))
            .filter(|(_, v)| {
                let held = v.parse::<u64>().ok();
                let newest = *newest.get_or_init(newest_of);
                !matches!((held, newest), (Some(h), Some(n)) if h > n)
            })
            .map(|(n, _)| n.clone())
            .collect();
        if out.is_empty() && removed.is_empty() {
            return None;
        }
        for n in &removed {
            self.known.remove(n);
        }
        crate::sync::set(&mut self.last_nonce, &nonce);
        let mut response = Outgoing::new(DeltaDiscoveryResponse {
            system_version_info: system_version.to_owned(),
            type_url: type_url.to_owned(),
            removed_resources: removed,
            nonce,
            ..Default::default()
        });
        for (name, enc) in out {
            // Rewritten in place when the client held the resource (the usual change):
            // a stream's known versions are the one thing every response updates.
            match self.known.get_mut(name) {
                Some(held) => held.clone_from(&enc.version),
                None => {
                    self.known.insert(name.clone(), enc.version.clone());
                }
            }
            let stamp = stamp_of(stamps, name, &enc.version);
            let metadata = clock.zip(stamp).and_then(|(c, r)| c.carry(r));
            response.push_resource(name, &enc.version, &enc.resource, metadata.as_deref());
            response.released.extend(stamp);
        }
        Some(response)
    }
}

/// The release stamp of `name` at `version`, if the snapshot holds one.
fn stamp_of(stamps: &Stamps, name: &str, version: &str) -> Option<Released> {
    stamps.get(name).and_then(|v| v.get(version)).copied()
}

/// Whether a client holding `held` is ahead of `ours` (both numeric versions).
fn is_ahead(held: &str, ours: &str) -> bool {
    matches!(
        (held.parse::<u64>(), ours.parse::<u64>()),
        (Ok(h), Ok(o)) if h > o
    )
}

// === State of the World ===

/// One SotW stream's state for one type.
#[derive(Debug, Clone, Default)]
pub struct SotwState {
    /// What the client asked for (empty names = wildcard, for CDS).
    pub subscription: Subscription,
    /// The nonce of the last response sent.
    pub last_nonce: Option<String>,
    /// The version_info of the last response sent.
    pub last_version: Option<String>,
    /// What the last response contained, by name → version.
    sent: Option<BTreeMap<String, String>>,
}

impl SotwState {
    /// Take a request. A request with a stale nonce is ignored entirely (its names too),
    /// as the protocol asks.
    pub fn handle_request(&mut self, req: &DiscoveryRequest) -> Ack {
        let ack = self.classify(req);
        if matches!(ack, Ack::Stale { .. }) {
            return ack;
        }
        let names: BTreeSet<String> = req
            .resource_names
            .iter()
            .filter(|n| *n != "*")
            .cloned()
            .collect();
        let wildcard = req.resource_names.is_empty() || req.resource_names.iter().any(|n| n == "*");
        let changed = names != self.subscription.names || wildcard != self.subscription.wildcard;
        self.subscription = Subscription { wildcard, names };
        if changed {
            self.sent = None; // a new set of names needs a fresh response
        }
        ack
    }

    fn classify(&self, req: &DiscoveryRequest) -> Ack {
        let nonce = &req.response_nonce;
        if nonce.is_empty() {
            return Ack::None;
        }
        if self.last_nonce.as_deref() != Some(nonce.as_str()) {
            return Ack::Stale {
                nonce: nonce.clone(),
            };
        }
        match &req.error_detail {
            Some(status) => Ack::Nacked {
                nonce: nonce.clone(),
                error: status.message.clone(),
            },
            None => Ack::Acked {
                nonce: nonce.clone(),
            },
        }
    }

    /// What the last response contained, by name → version (`None` before the first).
    pub fn sent_versions(&self) -> Option<&BTreeMap<String, String>> {
        self.sent.as_ref()
    }

    /// The full response for the client's names, if it differs from the last one sent.
    pub fn next_response(
        &mut self,
        type_url: &str,
        resources: &Resources,
        version: &str,
        nonce: String,
    ) -> Option<Outgoing<DiscoveryResponse>> {
        self.next_response_stamped(type_url, resources, version, nonce, &Stamps::new())
    }

    /// [`SotwState::next_response`], with the response carrying the release stamps (from
    /// `stamps`) of the resource versions the client did not hold before: a SotW
    /// response repeats every resource, and only the new ones were released to it now.
    pub fn next_response_stamped(
        &mut self,
        type_url: &str,
        resources: &Resources,
        version: &str,
        nonce: String,
        stamps: &Stamps,
    ) -> Option<Outgoing<DiscoveryResponse>> {
        // CDS/LDS wildcard: everything; EDS/RDS: only what was named (absence ≠ deletion).
        let wildcard =
            self.subscription.wildcard && (type_url == TYPE_CLUSTER || type_url == TYPE_LISTENER);
        let chosen: Vec<(&String, &Encoded)> =
            self.subscription.select(resources, wildcard).collect();
        let now: BTreeMap<String, String> = chosen
            .iter()
            .map(|(n, e)| ((*n).clone(), e.version.clone()))
            .collect();
        if self.sent.as_ref() == Some(&now) {
            return None;
        }
        let released: Vec<Released> = if stamps.is_empty() {
            Vec::new()
        } else {
            now.iter()
                .filter(|(n, v)| self.sent.as_ref().and_then(|s| s.get(*n)) != Some(*v))
                .filter_map(|(n, v)| stamp_of(stamps, n, v))
                .collect()
        };
        self.sent = Some(now);
        self.last_nonce = Some(nonce.clone());
        self.last_version = Some(version.to_owned());
        let mut response = Outgoing::new(DiscoveryResponse {
            version_info: version.to_owned(),
            type_url: type_url.to_owned(),
            nonce,
            ..Default::default()
        });
        for (_, e) in chosen {
            response.push_any(&e.resource);
        }
        response.released = released;
        Some(response)
    }
}

#[cfg(test)]
mod tests;
