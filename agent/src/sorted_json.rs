//! [`SortedKeys`]: a body type written with every object's keys in name order.
//!
//! Several API bodies were first built as `serde_json::Value` (whose objects, without
//! serde_json's `preserve_order`, write their keys in name order) and only later given a
//! type. Wrapping the type keeps their bytes as they were, whatever order its fields are
//! declared in, while the OpenAPI document describes the type itself.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize, Serializer};

/// `T`, serialised through `serde_json::Value`: the same fields and values, every object's
/// keys in name order. Its schema is `T`'s.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SortedKeys<T>(pub T);

/// `T`'s, name and all: the document names `T`, not the wrapper.
impl<T: JsonSchema> JsonSchema for SortedKeys<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }

    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}

impl<T: Serialize> Serialize for SortedKeys<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde_json::to_value(&self.0)
            .map_err(serde::ser::Error::custom)?
            .serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[derive(Serialize, Deserialize, JsonSchema)]
    struct Out {
        z: u8,
        a: Inner,
    }

    #[derive(Serialize, Deserialize, JsonSchema)]
    struct Inner {
        y: Option<u8>,
        b: bool,
    }

    #[test]
    fn keys_are_written_in_name_order_at_every_depth_and_read_back() {
        let out = SortedKeys(Out {
            z: 1,
            a: Inner { y: None, b: true },
        });
        let text = serde_json::to_string(&out).unwrap();
        assert_eq!(text, r#"{"a":{"b":true,"y":null},"z":1}"#);
        let back: SortedKeys<Out> = serde_json::from_str(&text).unwrap();
        assert_eq!(back.0.z, 1);
    }

    #[test]
    fn its_schema_is_the_wrapped_types() {
        let wrapped = schemars::schema_for!(SortedKeys<Out>);
        let plain = schemars::schema_for!(Out);
        assert_eq!(wrapped, plain);
    }
}
