//! ADS request sequences on the xDS server's pure core: `DeltaState` and `SotwState` per
//! type (subscriptions, nonces, ACK/NACK, what to send next), over snapshots that
//! `SnapshotBuilder` makes from released views while the streams run, with the
//! `ClientSync` per stream that `proxy-status` reads. The stream driver in `server.rs` is a thin
//! loop over exactly these calls; this target repeats that loop without tonic.
//!
//! Input: bytes for the structured decoder. Each step is a Delta request or a SotW request
//! (built from names, nonces the server sent and versions it gave, or decoded from raw
//! protobuf bytes), a new release, or a service removal. Checked after every response: a
//! Delta response never both updates and removes a name, sends only what was subscribed,
//! and asking again at once sends nothing; a SotW response sends only what was asked for
//! and is not repeated; every snapshot is consistent.
#![no_main]

use std::collections::BTreeMap;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use waymark_core::model::{ServiceName, ZoneName};
use waymark_core::view::ReleasedView;
use waymark_fuzz::{Gen, Limits, capped};
use waymark_xds::protocol::{Ack, DeltaState, SotwState};
use waymark_xds::snapshot::{Snapshot, SnapshotBuilder};
use waymark_xds::sync::ClientSync;
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT, TYPE_LISTENER, TYPE_ROUTE};

const TYPES: [&str; 6] = [
    TYPE_CLUSTER,
    TYPE_ENDPOINT,
    TYPE_LISTENER,
    TYPE_ROUTE,
    "type.googleapis.com/envoy.config.cluster.v3.Unknown",
    "",
];
const TYPE_ORDER: [&str; 4] = [TYPE_CLUSTER, TYPE_ENDPOINT, TYPE_LISTENER, TYPE_ROUTE];
const DELTA_STREAM: u64 = 1;
const SOTW_STREAM: u64 = 2;

fuzz_target!(|data: &[u8]| run(capped(data)));

fn run(data: &[u8]) {
    let mut g = Gen::new(data);
    let mut server = Server::new();
    let mut steps = 0;
    while !g.is_empty() && steps < Limits::STEPS_MAX {
        steps += 1;
        match g.below(10) {
            0 => {
                let raw = g.bytes(512);
                if let Ok(req) = DeltaDiscoveryRequest::decode(raw) {
                    server.delta_request(&req);
                }
            }
            1 => {
                let raw = g.bytes(512);
                if let Ok(req) = DiscoveryRequest::decode(raw) {
                    server.sotw_request(&req);
                }
            }
            2..=4 => {
                let req = server.delta_from(&mut g);
                server.delta_request(&req);
            }
            5..=7 => {
                let req = server.sotw_from(&mut g);
                server.sotw_request(&req);
            }
            8 => server.release(&mut g),
            _ => {
                if let Ok(service) = ServiceName::try_new(g.valid_name()) {
                    server.builder.handle_service_removed(&service);
                    server.publish();
                }
            }
        }
    }
}

struct Server {
    builder: SnapshotBuilder,
    snapshot: Snapshot,
    version: u64,
    nonce: u64,
    /// Each stream's sync state, by stream id.
    sync: BTreeMap<u64, ClientSync>,
    delta: BTreeMap<String, DeltaState>,
    sotw: BTreeMap<String, SotwState>,
    /// Nonces sent, by type, newest last; requests echo them.
    nonces: BTreeMap<String, Vec<String>>,
    zone: Option<ZoneName>,
}

impl Server {
    fn new() -> Self {
        let now = Instant::now();
        let sync = [
            ClientSync::new(
                DELTA_STREAM,
                "node-1".into(),
                "eu-west-1a".into(),
                "delta",
                now,
            ),
            ClientSync::new(
                SOTW_STREAM,
                "node-2".into(),
                "eu-west-1b".into(),
                "sotw",
                now,
            ),
        ]
        .into_iter()
        .map(|c| (c.stream_id, c))
        .collect();
        Self {
            builder: SnapshotBuilder::new(),
            snapshot: Snapshot::default(),
            version: 0,
            nonce: 0,
            sync,
            delta: BTreeMap::new(),
            sotw: BTreeMap::new(),
            nonces: BTreeMap::new(),
            zone: ZoneName::try_new("eu-west-1a").ok(),
        }
    }

    fn next_nonce(&mut self, type_url: &str) -> String {
        self.nonce += 1;
        let nonce = self.nonce.to_string();
        let sent = self.nonces.entry(type_url.to_owned()).or_default();
        sent.push(nonce.clone());
        if sent.len() > 8 {
            sent.remove(0);
        }
        nonce
    }

    fn nonce_for(&self, g: &mut Gen<'_>, type_url: &str) -> String {
        let sent = self.nonces.get(type_url).map(Vec::as_slice).unwrap_or(&[]);
        match g.below(6) {
            0 => String::new(),
            1 => g.raw_text(8),
            _ if !sent.is_empty() => {
                // Mostly the latest (an ACK or NACK), sometimes an older one (stale).
                if g.one_in(4) {
                    sent[g.below(sent.len())].clone()
                } else {
                    sent[sent.len() - 1].clone()
                }
            }
            _ => String::new(),
        }
    }

    fn names(g: &mut Gen<'_>) -> Vec<String> {
        (0..g.below(4))
            .map(|_| {
                if g.one_in(6) {
                    "*".to_owned()
                } else {
                    g.valid_name()
                }
            })
            .collect()
    }

    fn node(g: &mut Gen<'_>) -> Option<Node> {
        g.one_in(4).then(|| Node {
            id: g.valid_name(),
            ..Default::default()
        })
    }

    fn error(g: &mut Gen<'_>) -> Option<RpcStatus> {
        g.one_in(4).then(|| RpcStatus {
            code: 3,
            message: g.raw_text(16),
            ..Default::default()
        })
    }

    fn delta_from(&self, g: &mut Gen<'_>) -> DeltaDiscoveryRequest {
        let type_url = TYPES[g.below(TYPES.len())].to_owned();
        let mut initial = std::collections::HashMap::new();
        if g.one_in(4) {
            for _ in 0..g.below(3) {
                let version = ["1", "7", "999999999999", "18446744073709551615", "x", ""]
                    [g.below(6)]
                .to_owned();
                initial.insert(g.valid_name(), version);
            }
        }
        DeltaDiscoveryRequest {
            node: Self::node(g),
            response_nonce: self.nonce_for(g, &type_url),
            resource_names_subscribe: Self::names(g),
            resource_names_unsubscribe: if g.one_in(3) {
                Self::names(g)
            } else {
                Vec::new()
            },
            initial_resource_versions: initial,
            error_detail: Self::error(g),
            type_url,
            ..Default::default()
        }
    }

    fn sotw_from(&self, g: &mut Gen<'_>) -> DiscoveryRequest {
        let type_url = TYPES[g.below(TYPES.len())].to_owned();
        DiscoveryRequest {
            version_info: self.version.to_string(),
            node: Self::node(g),
            resource_names: Self::names(g),
            response_nonce: self.nonce_for(g, &type_url),
            error_detail: Self::error(g),
            type_url,
            ..Default::default()
        }
    }

    fn release(&mut self, g: &mut Gen<'_>) {
        self.version = match g.below(4) {
            0 => self.version.saturating_sub(1),
            1 => g.u64(),
            _ => self.version.saturating_add(1),
        };
        let service = g.valid_name();
        let zone = g.pick(&["eu-west-1a", "eu-west-1b"]);
        let view = g.released_view(&service, zone, self.version);
        if let Some(view) = waymark_fuzz::decode::<ReleasedView>(view) {
            self.builder.handle_release(&view);
            self.publish();
        }
    }

    /// A new snapshot: every stream pushes what changed, in the server's type order.
    fn publish(&mut self) {
        self.snapshot = self.builder.build();
        assert!(
            self.snapshot.is_consistent(),
            "an inconsistent snapshot was built"
        );
        for type_url in TYPE_ORDER {
            if self.delta.contains_key(type_url) {
                self.delta_push(type_url);
            }
            if self.sotw.contains_key(type_url) {
                self.sotw_push(type_url);
            }
        }
    }

    fn record(&mut self, stream: u64, type_url: &str, ack: &Ack) {
        let Some(client) = self.sync.get_mut(&stream) else {
            return;
        };
        match ack {
            Ack::Acked { nonce } => client.acked(type_url, nonce),
            Ack::Nacked { nonce, error } => client.nacked(type_url, nonce, error),
            Ack::None | Ack::Stale { .. } => {}
        }
    }

    fn delta_request(&mut self, req: &DeltaDiscoveryRequest) {
        if !TYPE_ORDER.contains(&req.type_url.as_str()) {
            return;
        }
        let ack = self
            .delta
            .entry(req.type_url.clone())
            .or_default()
            .handle_request(req);
        self.record(DELTA_STREAM, &req.type_url, &ack);
        self.delta_push(&req.type_url);
    }

    fn delta_push(&mut self, type_url: &str) {
        let Some(resources) = self
            .snapshot
            .resources(type_url, self.zone.as_ref())
            .cloned()
        else {
            return;
        };
        let nonce = self.next_nonce(type_url);
        let version = self.snapshot.version.to_string();
        let state = self
            .delta
            .get_mut(type_url)
            .expect("pushed only for known states");
        let Some(resp) = state.next_response(type_url, &resources, &version, nonce) else {
            return;
        };
        // What a client decodes from the wire form is the response checked below.
        let resp = resp
            .message()
            .expect("a response the protocol built decodes whole");
        for r in &resp.resources {
            assert!(
                !resp.removed_resources.contains(&r.name),
                "{} both updated and removed",
                r.name
            );
            assert!(
                state.subscription.wildcard || state.subscription.names.contains(&r.name),
                "{} sent but not subscribed",
                r.name
            );
        }
        let again = state.next_response(type_url, &resources, &version, "again".into());
        assert!(
            again.is_none(),
            "a delta response repeated at once: {again:?}"
        );
        let held = state.known.len();
        if let Some(c) = self.sync.get_mut(&DELTA_STREAM) {
            c.sent(type_url, &resp.system_version_info, &resp.nonce, held);
        }
    }

    fn sotw_request(&mut self, req: &DiscoveryRequest) {
        if !TYPE_ORDER.contains(&req.type_url.as_str()) {
            return;
        }
        let ack = self
            .sotw
            .entry(req.type_url.clone())
            .or_default()
            .handle_request(req);
        self.record(SOTW_STREAM, &req.type_url, &ack);
        if !matches!(ack, Ack::Stale { .. }) {
            self.sotw_push(&req.type_url);
        }
    }

    fn sotw_push(&mut self, type_url: &str) {
        let Some(resources) = self
            .snapshot
            .resources(type_url, self.zone.as_ref())
            .cloned()
        else {
            return;
        };
        let nonce = self.next_nonce(type_url);
        let version = self.snapshot.version.to_string();
        let state = self
            .sotw
            .get_mut(type_url)
            .expect("pushed only for known states");
        let Some(resp) = state.next_response(type_url, &resources, &version, nonce) else {
            return;
        };
        // What a client decodes from the wire form is the response checked below.
        let resp = resp
            .message()
            .expect("a response the protocol built decodes whole");
        let wildcard =
            state.subscription.wildcard && (type_url == TYPE_CLUSTER || type_url == TYPE_LISTENER);
        let expected = resources
            .keys()
            .filter(|n| wildcard || state.subscription.names.contains(*n))
            .count();
        assert_eq!(
            resp.resources.len(),
            expected,
            "a SotW response is the whole asked-for set"
        );
        let again = state.next_response(type_url, &resources, &version, "again".into());
        assert!(again.is_none(), "a SotW response repeated at once");
        let count = resp.resources.len();
        if let Some(c) = self.sync.get_mut(&SOTW_STREAM) {
            c.sent(type_url, &resp.version_info, &resp.nonce, count);
        }
    }
}
