//! JSON Schema for what operators write: health contracts (here) and policies (in the
//! registry), derived from the Rust types with `schemars` so the schema cannot drift from
//! what the decoder accepts.
//!
//! Types that serialise through their own code say here what they look like on the wire:
//! durations (strings in the [`crate::duration_str`] grammar), fractions in thousandths
//! ([`Permille`](crate::units::Permille)) and names ([`crate::model`]'s name types).

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

use crate::contract::HealthContract;

/// A duration as operators write it: `250ms`, `1.5s`, `1m30s`, `1d`.
pub struct DurationString;

impl JsonSchema for DurationString {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A duration: a sequence of decimal numbers, each with a unit \
                (ns, us, ms, s, m, h, d), as Go and Envoy write them: `250ms`, `1.5s`, \
                `1m30s`, `1d`.",
            "pattern": "^(([0-9]+\\.?[0-9]*|\\.[0-9]+)(ns|us|µs|ms|s|m|h|d))+$|^0$",
            "examples": ["10s", "1m30s", "250ms"],
        })
    }
}

/// The schema of a health contract (`PUT /v1/services/{service}`'s `contract`), as a
/// standalone JSON Schema document.
pub fn contract() -> Schema {
    let mut schema = schemars::schema_for!(HealthContract);
    stamp(&mut schema, "waymark health contract");
    schema
}

/// Gives a standalone schema its `$id`-free title (the schema is served and checked in,
/// not fetched).
pub fn stamp(schema: &mut Schema, title: &str) {
    schema.insert("title".into(), title.into());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_schema_names_every_field_the_decoder_reads() {
        let schema = serde_json::to_value(contract()).unwrap();
        let fields = schema["properties"].as_object().unwrap();
        let default = serde_json::to_value(HealthContract::default()).unwrap();
        for field in default.as_object().unwrap().keys() {
            assert!(
                fields.contains_key(field),
                "{field} missing from the schema"
            );
        }
        assert_eq!(
            schema["properties"]["slow_start"]["$ref"], "#/$defs/Duration",
            "{schema:#}"
        );
        let min_healthy = &schema["$defs"]["Permille"];
        assert_eq!(min_healthy["maximum"], 1000, "{schema:#}");
    }
}
