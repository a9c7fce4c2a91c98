//! How the log's entries, the snapshots' state and the Raft RPC bodies are encoded:
//! MessagePack with field names, behind a one-byte mark.
//!
//! JSON cost the write path twice — every entry encoded for the log and decoded on every
//! read, a whole region's state encoded for each snapshot — and spelled every number and
//! name as text. MessagePack is binary and self-describing: the registry's types keep their
//! serde attributes (internally tagged enums, flattened probe specs, JSON `detail` values,
//! fields added later with `#[serde(default)]`), which a schema-less positional format such
//! as postcard cannot carry without a second set of wire types. Field names are kept
//! (struct maps), so a field added later decodes from an older record. Both sides say
//! they are human-readable, so types with two forms (an IP address: text, or bytes) take
//! the text form everywhere: serde buffers flattened and internally tagged values through
//! a deserializer that always claims to be human-readable, and a value written in the
//! other form would not read back there.
//!
//! Every encoding starts with [`MARK`], a byte that begins neither a MessagePack value
//! (0xC1 is the one code the format never uses) nor JSON. Records without it are read as
//! JSON: what a member wrote before this encoding — its log, its snapshot file, a peer not
//! yet upgraded — stays readable, so a region upgrades one member at a time.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The first byte of every binary encoding: never the first byte of MessagePack or JSON.
pub const MARK: u8 = 0xC1;

/// The media type of a binary Raft RPC body (a body without the mark is JSON).
pub const CONTENT_TYPE: &str = "application/vnd.waymark.raft+msgpack";

/// Why a record could not be read or written. Either way nothing was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// A binary record that does not decode (truncated, corrupt, or not the type).
    #[error("binary record does not decode: {0}")]
    Decode(#[source] rmp_serde::decode::Error),
    /// A record from before the binary encoding that does not decode.
    #[error("JSON record does not decode: {0}")]
    Json(#[source] serde_json::Error),
    /// The value could not be encoded (a type serde cannot express; never expected).
    #[error("record does not encode: {0}")]
    Encode(#[source] rmp_serde::encode::Error),
}

/// `value`, marked and encoded.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![MARK];
    let mut serializer = rmp_serde::Serializer::new(&mut out)
        .with_struct_map()
        .with_human_readable();
    value
        .serialize(&mut serializer)
        .map_err(CodecError::Encode)?;
    Ok(out)
}

/// The value `bytes` hold: binary when marked, else JSON (an older record). The whole of
/// `bytes` must be one value: trailing bytes are refused, as JSON refuses them.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.split_first() {
        Some((&MARK, body)) => {
            let mut reader = body;
            let mut deserializer = rmp_serde::Deserializer::new(&mut reader).with_human_readable();
            let value = T::deserialize(&mut deserializer).map_err(CodecError::Decode)?;
            if reader.is_empty() {
                Ok(value)
            } else {
                Err(CodecError::Decode(rmp_serde::decode::Error::Syntax(
                    format!("{} bytes after the value", reader.len()),
                )))
            }
        }
        _ => serde_json::from_slice(bytes).map_err(CodecError::Json),
    }
}

/// Whether `bytes` are in the binary encoding (else JSON).
pub fn is_binary(bytes: &[u8]) -> bool {
    bytes.first() == Some(&MARK)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    enum Tagged {
        Http { path: String },
        Tcp { ip: std::net::IpAddr },
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Inner {
        #[serde(flatten)]
        tagged: Tagged,
        interval_ms: u64,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Record {
        name: String,
        by_zone: BTreeMap<String, Vec<Inner>>,
        detail: serde_json::Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    }

    /// What this test writes: every serde shape the registry's types use.
    fn record() -> Record {
        let inner = |tagged| Inner {
            tagged,
            interval_ms: 5_000,
        };
        Record {
            name: "pay".to_owned(),
            by_zone: BTreeMap::from([(
                "eu-a".to_owned(),
                vec![
                    inner(Tagged::Http {
                        path: "/healthz".to_owned(),
                    }),
                    inner(Tagged::Tcp {
                        ip: std::net::IpAddr::from([10, 9, 0, 1]),
                    }),
                ],
            )]),
            detail: serde_json::json!({"floor": 3, "ratio": 0.25, "zones": ["eu-a"], "none": null}),
            note: None,
        }
    }

    #[test]
    fn a_record_round_trips_in_binary_and_is_smaller_than_its_json() {
        let r = record();
        let bytes = encode(&r).unwrap();
        assert!(is_binary(&bytes));
        assert_eq!(decode::<Record>(&bytes).unwrap(), r);
        let json = serde_json::to_vec(&r).unwrap();
        assert!(
            bytes.len() < json.len(),
            "{} vs {}",
            bytes.len(),
            json.len()
        );
    }

    #[test]
    fn a_record_written_as_json_before_the_binary_encoding_still_reads() {
        // Goal: a member upgraded in place reads the log and snapshot it wrote before.
        let r = record();
        let json = serde_json::to_vec(&r).unwrap();
        assert!(!is_binary(&json));
        assert_eq!(decode::<Record>(&json).unwrap(), r);
    }

    #[test]
    fn a_field_added_later_decodes_from_an_older_binary_record() {
        #[derive(Serialize)]
        struct Older {
            name: String,
            by_zone: BTreeMap<String, Vec<Inner>>,
            detail: serde_json::Value,
        }
        let r = record();
        let older = Older {
            name: r.name.clone(),
            by_zone: r.by_zone.clone(),
            detail: r.detail.clone(),
        };
        assert_eq!(decode::<Record>(&encode(&older).unwrap()).unwrap(), r);
    }

    #[test]
    fn truncated_corrupt_or_trailing_bytes_are_refused() {
        let bytes = encode(&record()).unwrap();
        for cut in 1..bytes.len() {
            assert!(
                decode::<Record>(&bytes[..cut]).is_err(),
                "cut at {cut} of {}",
                bytes.len()
            );
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(matches!(
            decode::<Record>(&trailing),
            Err(CodecError::Decode(_))
        ));
        assert!(matches!(decode::<Record>(&[]), Err(CodecError::Json(_))));
        assert!(matches!(
            decode::<Record>(&[MARK]),
            Err(CodecError::Decode(_))
        ));
    }
}
