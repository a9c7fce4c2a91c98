//! Delta responses from upstream on the node agent's xDS client core: `ClientState`
//! (`handle_response_at`: the checks, then apply and ACK or NACK) and the release age a
//! resource's metadata carries (`waymark_xds::release_age::parse`), which the agent trusts
//! to time the whole propagation path.
//!
//! Input: bytes for the structured decoder. Each step is a response decoded from raw
//! protobuf bytes, or one built from the names and versions in play with a release age
//! filed in each resource's metadata as a number (any: negative, huge, not finite, a
//! fraction), as another kind of value, or not at all; arrivals move forward by a
//! generated amount. Checked after every response: an age kept is never past
//! `AGE_MAX`, is kept only for a resource held at the version it came with, and the count
//! of ignored ages never goes back; a parsed age re-encodes to the same whole
//! milliseconds.
#![no_main]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, Resource};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Any, Struct, Value};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use waymark_fuzz::{Gen, Limits, capped};
use waymark_xds::client::{ClientState, Subscription};
use waymark_xds::release_age::{self, AGE_FIELD, AGE_MAX, Carried, METADATA_KEY};
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT};

const NAMES: [&str; 4] = ["pay", "web", "db", ""];
const VERSIONS: [&str; 4] = ["1", "2", "18446744073709551615", "x"];

fuzz_target!(|data: &[u8]| run(capped(data)));

fn run(data: &[u8]) {
    let mut g = Gen::new(data);
    let wildcard = Subscription {
        wildcard: true,
        names: BTreeSet::new(),
    };
    let mut client = ClientState::new([
        (TYPE_ENDPOINT.to_owned(), wildcard.clone()),
        (TYPE_CLUSTER.to_owned(), wildcard),
    ]);
    let mut now = Instant::now();
    let mut ignored = 0;
    let mut steps = 0;
    while !g.is_empty() && steps < Limits::STEPS_MAX {
        steps += 1;
        now += Duration::from_millis(g.u64() % 10_000);
        let resp = if g.one_in(4) {
            match DeltaDiscoveryResponse::decode(g.bytes(512)) {
                Ok(r) => r,
                Err(_) => continue,
            }
        } else {
            built(&mut g)
        };
        for r in &resp.resources {
            check_parse(r.metadata.as_ref());
        }
        let _ = client.handle_response_at(resp, now);
        let applied = client.applied();
        assert!(
            applied.ages_ignored >= ignored,
            "ignored ages never go back"
        );
        ignored = applied.ages_ignored;
        for t in applied.types.values() {
            for (name, arrival) in &t.carried {
                assert!(arrival.age <= AGE_MAX, "{arrival:?}");
                assert!(arrival.at <= now);
                let held = t.resources.get(name).map(|(v, _)| v);
                assert_eq!(held, Some(&arrival.version), "kept only with its version");
            }
        }
    }
}

/// `parse` is total, bounded, and what it accepts re-encodes to the same milliseconds.
fn check_parse(metadata: Option<&Metadata>) {
    if let Carried::Age(age) = release_age::parse(metadata) {
        assert!(age <= AGE_MAX, "{age:?}");
        let again = release_age::metadata(age).expect("within the bound");
        let ms = |d: Duration| d.as_millis();
        match release_age::parse(Some(&again)) {
            Carried::Age(a) => assert_eq!(ms(a), ms(age)),
            other => panic!("{age:?} re-encoded parses as {other:?}"),
        }
        let bytes = release_age::encode(age).expect("within the bound");
        assert_eq!(Metadata::decode(bytes.as_slice()).ok(), Some(again));
    }
}

fn built(g: &mut Gen<'_>) -> DeltaDiscoveryResponse {
    let type_url = if g.one_in(4) {
        TYPE_CLUSTER
    } else {
        TYPE_ENDPOINT
    };
    let resources = (0..g.below(4))
        .map(|_| Resource {
            name: g.pick(&NAMES).to_owned(),
            version: g.pick(&VERSIONS).to_owned(),
            resource: (!g.one_in(8)).then(|| Any {
                type_url: type_url.to_owned(),
                value: g.bytes(16).to_vec(),
            }),
            metadata: age_metadata(g),
            ..Default::default()
        })
        .collect();
    let removed_resources = (0..g.below(2)).map(|_| g.pick(&NAMES).to_owned()).collect();
    DeltaDiscoveryResponse {
        type_url: type_url.to_owned(),
        resources,
        removed_resources,
        nonce: g.u64().to_string(),
        ..Default::default()
    }
}

fn age_metadata(g: &mut Gen<'_>) -> Option<Metadata> {
    let kind = match g.below(8) {
        0 => return None,
        1 => Kind::NumberValue(f64::from_bits(g.u64())),
        2 => Kind::NumberValue((g.u64() % 4_000_000) as f64),
        3 => Kind::NumberValue(AGE_MAX.as_millis() as f64 + g.below(3) as f64 - 1.0),
        4 => Kind::NumberValue(-((g.u64() % 1000) as f64)),
        5 => Kind::NumberValue((g.u64() % 1_000_000) as f64 / 7.0),
        6 => Kind::StringValue(g.u64().to_string()),
        _ => Kind::BoolValue(g.one_in(2)),
    };
    let field = if g.one_in(8) { "age" } else { AGE_FIELD };
    let key = if g.one_in(8) { "waymark" } else { METADATA_KEY };
    let fields = [(field.to_owned(), Value { kind: Some(kind) })]
        .into_iter()
        .collect();
    Some(Metadata {
        filter_metadata: [(key.to_owned(), Struct { fields })].into_iter().collect(),
        ..Default::default()
    })
}
