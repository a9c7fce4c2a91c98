//! The release age a server carries to its client with each resource version, so the
//! client can time the whole propagation path without reading the server's clock.
//!
//! The authority's xDS tier knows when each load-assignment version was released (on the
//! leader, its delta queues' instant; on a follower, its apply of the committed entry),
//! but that instant is on its own monotonic clock, and a wall-clock stamp sent across
//! would measure the hosts' clock skew along with the path. So the server sends a
//! *duration* instead: how old the release was when this response left, in milliseconds.
//! The node agent adds its own monotonic time from receiving the response to each
//! sidecar's acknowledgement of the version carrying those endpoints, and so measures
//! release → sidecar ACK with only the one-way transit authority → agent uncounted
//! (bounded by the authority's own `authority_agent` hop, which includes it and the
//! agent's ACK back).
//!
//! **Carrier.** The Delta protocol's `Resource` has a `metadata` field
//! (`envoy.config.core.v3.Metadata`, field 9) that the protocol defines as free-form
//! information about the resource ("e.g. the trace data for debugging"): the age rides
//! there, per resource, as `filter_metadata["waymark.propagation"]["release_age_ms"]`, a
//! number. Per resource rather than per response (the response's `system_version_info` or
//! `control_plane`), because one response may bring several versions released at
//! different times; and in a field Envoy decodes and does nothing with, so a real Envoy
//! subscribing to the authority directly sees nothing it would reject (its
//! `system_version_info` and control-plane identifier are unchanged). State-of-the-World
//! responses carry bare `Any`s and so carry no age.
//!
//! Everything here is pure: the caller passes the age in, or gets it out.
//!
//! **Bounds.** The age is parsed totally: anything but a finite, non-negative number of
//! milliseconds no greater than [`AGE_MAX`] under that key is [`Carried::Malformed`] —
//! ignored (the version is timed on the agent's own hop only) and counted by the caller.
//! The server never sends an age past the bound either.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use prost::Message as _;

/// The `filter_metadata` key the age is filed under.
pub const METADATA_KEY: &str = "waymark.propagation";
/// The field of that struct holding the age, in milliseconds.
pub const AGE_FIELD: &str = "release_age_ms";
/// The oldest age sent or trusted: a release older than this when it reaches a client is
/// a catch-up, not propagation, and an age past it is not believed.
pub const AGE_MAX: Duration = Duration::from_secs(3600);

/// What a resource's metadata says about its release's age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carried {
    /// No age: a server that does not carry one, or a release it did not stamp.
    Absent,
    /// The release was this old when the response left the server.
    Age(Duration),
    /// An age was filed but is not one to trust (not a number, negative, not finite, or
    /// past [`AGE_MAX`]): ignore it and count it.
    Malformed,
}

/// The metadata carrying `age` (rounded down to whole milliseconds), or `None` past
/// [`AGE_MAX`].
pub fn metadata(age: Duration) -> Option<Metadata> {
    if age > AGE_MAX {
        return None;
    }
    let ms = age.as_millis() as f64; // ≤ 3.6e6: exact as a float
    let value = Value {
        kind: Some(Kind::NumberValue(ms)),
    };
    let fields = [(AGE_FIELD.to_owned(), value)].into_iter().collect();
    Some(Metadata {
        filter_metadata: [(METADATA_KEY.to_owned(), Struct { fields })]
            .into_iter()
            .collect(),
        ..Default::default()
    })
}

/// [`metadata`], encoded as the `Metadata` message's bytes.
pub fn encode(age: Duration) -> Option<Vec<u8>> {
    metadata(age).map(|m| m.encode_to_vec())
}

/// The age a resource's metadata carries. Total: any input gives an answer.
pub fn parse(metadata: Option<&Metadata>) -> Carried {
    let Some(filed) = metadata.and_then(|m| m.filter_metadata.get(METADATA_KEY)) else {
        return Carried::Absent;
    };
    let Some(Value {
        kind: Some(Kind::NumberValue(ms)),
    }) = filed.fields.get(AGE_FIELD)
    else {
        return Carried::Malformed;
    };
    let ms = *ms;
    if !ms.is_finite() || ms < 0.0 || ms > AGE_MAX.as_millis() as f64 {
        return Carried::Malformed;
    }
    Carried::Age(Duration::from_secs_f64(ms / 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: Kind) -> Metadata {
        let fields = [(AGE_FIELD.to_owned(), Value { kind: Some(value) })]
            .into_iter()
            .collect();
        Metadata {
            filter_metadata: [(METADATA_KEY.to_owned(), Struct { fields })]
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn an_age_round_trips_in_whole_milliseconds() {
        let m = metadata(Duration::from_micros(1_234_567)).unwrap();
        let bytes = encode(Duration::from_micros(1_234_567)).unwrap();
        assert_eq!(Metadata::decode(bytes.as_slice()).unwrap(), m);
        assert_eq!(parse(Some(&m)), Carried::Age(Duration::from_millis(1234)));
        assert_eq!(
            parse(metadata(Duration::ZERO).as_ref()),
            Carried::Age(Duration::ZERO)
        );
        assert_eq!(parse(metadata(AGE_MAX).as_ref()), Carried::Age(AGE_MAX));
    }

    #[test]
    fn an_age_past_the_bound_is_neither_sent_nor_trusted() {
        assert_eq!(metadata(AGE_MAX + Duration::from_millis(1)), None);
        let past = AGE_MAX.as_millis() as f64 + 1.0;
        assert_eq!(
            parse(Some(&with(Kind::NumberValue(past)))),
            Carried::Malformed
        );
    }

    #[test]
    fn a_malformed_age_is_told_apart_from_none() {
        // Goal: nothing filed is Absent (a plain server); anything filed but unusable is
        // Malformed, so the agent can count it.
        assert_eq!(parse(None), Carried::Absent);
        assert_eq!(parse(Some(&Metadata::default())), Carried::Absent);
        for bad in [
            Kind::NumberValue(-1.0),
            Kind::NumberValue(f64::NAN),
            Kind::NumberValue(f64::INFINITY),
            Kind::NumberValue(f64::MAX),
            Kind::StringValue("12".into()),
            Kind::BoolValue(true),
            Kind::NullValue(0),
        ] {
            assert_eq!(
                parse(Some(&with(bad.clone()))),
                Carried::Malformed,
                "{bad:?}"
            );
        }
        let mut other_field = with(Kind::NumberValue(5.0));
        let s = other_field.filter_metadata.get_mut(METADATA_KEY).unwrap();
        let v = s.fields.remove(AGE_FIELD).unwrap();
        s.fields.insert("age".into(), v);
        assert_eq!(parse(Some(&other_field)), Carried::Malformed);
    }
}
