//! The node agent's DNS `respond` on raw request bytes, over a table built from the
//! agent's own load assignments (services with tags, zones, IPv6, drained endpoints, and
//! one large enough to need truncation).
//!
//! Input: byte 0 picks the transport (bit 0: TCP) and the rotation; the rest is the DNS
//! message as it arrived. Checked: nothing panics; a reply is a response carrying the
//! request's id; a UDP reply fits the 1232-byte EDNS ceiling.
#![no_main]

use std::sync::OnceLock;

use hickory_proto::op::{Message, MessageType};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use waymark_agent::node::dns::fuzzing::respond;
use waymark_agent::node::dns::{DnsConfig, DnsOrigin, DnsTable};
use waymark_core::view::ReleasedView;
use waymark_xds::translate::load_assignment;

/// The largest UDP reply the server sends (its advertised EDNS size).
const UDP_REPLY_MAX: usize = 1232;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, request)) = data.split_first() else {
        return;
    };
    if request.len() > u16::MAX as usize {
        return;
    }
    let (table, origin) = fixture();
    let tcp = flags & 1 == 1;
    let reply = respond(table, origin, request, tcp, usize::from(flags >> 1));
    let Some(reply) = reply else {
        return;
    };
    if !tcp {
        assert!(
            reply.len() <= UDP_REPLY_MAX,
            "a {}-byte UDP reply",
            reply.len()
        );
    }
    let decoded = Message::from_vec(&reply).expect("a reply decodes");
    assert_eq!(decoded.metadata.message_type, MessageType::Response);
    let id = u16::from_be_bytes([request[0], request[1]]);
    assert_eq!(
        decoded.metadata.id, id,
        "the reply carries the request's id"
    );
});

fn fixture() -> &'static (DnsTable, DnsOrigin) {
    static FIXTURE: OnceLock<(DnsTable, DnsOrigin)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let views = [
            view("web", "zone-a", 3, "10.0.0.", false),
            view("web", "zone-b", 2, "10.0.1.", true),
            view("api", "zone-a", 300, "10.1.", false),
            view("v6.svc", "zone-a", 4, "2001:db8::", false),
        ];
        let assignments: Vec<_> = views.iter().map(load_assignment).collect();
        let origin = DnsOrigin::new(&DnsConfig::default()).expect("the default origin is valid");
        (DnsTable::build(&assignments), origin)
    })
}

fn view(service: &str, zone: &str, n: usize, prefix: &str, disregarded: bool) -> ReleasedView {
    let mut endpoints = serde_json::Map::new();
    for i in 0..n {
        let ip = if prefix.ends_with("::") {
            format!("{prefix}{:x}", i + 1)
        } else if prefix.matches('.').count() == 2 {
            format!("{prefix}{}.{}", i / 250, i % 250 + 1)
        } else {
            format!("{prefix}{}", i + 1)
        };
        let id = format!("{service}-{zone}-{i}");
        let weight = [100, 0, 1, 70_000, 5][i % 5];
        let status = ["eligible", "degraded", "unknown", "draining", "disregarded"][i % 5];
        endpoints.insert(
            id.clone(),
            json!({
                "instance": id,
                "address": {"ip": ip, "port": 8080 + i % 3},
                "region": "eu",
                "zone": zone,
                "tier": if i % 5 == 4 { "region" } else { "local" },
                "priority": if i % 5 == 4 { 1 } else { 0 },
                "weight": weight,
                "status": status,
                "verdict": "eligible",
                "tags": if i % 2 == 0 { json!(["canary", "v1.2"]) } else { json!(["v1.2"]) },
                "metadata": {"version": "7"},
            }),
        );
    }
    let disregarded: Vec<&str> = if disregarded { vec![zone] } else { vec![] };
    let view: Value = json!({
        "version": 7,
        "view": {
            "key": {"service": service, "zone": zone},
            "endpoints": endpoints,
            "markers": {
                "health_disregarded": disregarded,
                "evacuating": {},
                "no_eligible_in_region": false,
                "zone_floor": {},
            },
        },
    });
    serde_json::from_value(view).expect("the fixture view decodes")
}
