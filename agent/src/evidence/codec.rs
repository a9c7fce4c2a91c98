//! The evidence stream's gRPC codec: protobuf through prost, as tonic-prost's, except that a
//! message that does not parse is the sender's fault (`INVALID_ARGUMENT`), not ours.
//!
//! The generated stubs (`pb::evidence_client`, `pb::evidence_server`) name this codec
//! through `codec_path` in `build.rs`. What a message that *parses* may say is checked
//! afterwards, by the conversions in `wire.rs`.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Protobuf messages (`application/grpc`), encoding `E` and decoding `D`.
#[derive(Debug)]
pub struct ProtoCodec<E, D>(PhantomData<fn(E) -> D>);

impl<E, D> Default for ProtoCodec<E, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<E, D> Codec for ProtoCodec<E, D>
where
    E: Message + Send + 'static,
    D: Message + Default + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = ProtoEncoder<E>;
    type Decoder = ProtoDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        ProtoEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtoDecoder(PhantomData)
    }
}

/// The encoding half of [`ProtoCodec`].
#[derive(Debug)]
pub struct ProtoEncoder<E>(PhantomData<fn(E)>);

impl<E: Message> Encoder for ProtoEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // `EncodeBuf` grows as needed, so the only error prost has (too little room)
        // cannot happen; map it anyway rather than assume.
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }
}

/// The decoding half of [`ProtoCodec`]. A message that is not valid protobuf for `D` fails
/// the stream with `INVALID_ARGUMENT` naming what is wrong.
#[derive(Debug)]
pub struct ProtoDecoder<D>(PhantomData<fn() -> D>);

impl<D: Message + Default> Decoder for ProtoDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        let item = D::decode(src).map_err(|e| Status::invalid_argument(malformed(&e)))?;
        Ok(Some(item))
    }
}

/// The status message for a message that does not parse. The session's driver recognises
/// a decode failure by this prefix (see `server.rs`), to count and log it as malformed.
pub(super) fn malformed(error: &dyn std::fmt::Display) -> String {
    format!("{MALFORMED_PREFIX}{error}")
}

/// What every malformed-message status starts with.
pub(super) const MALFORMED_PREFIX: &str = "malformed message: ";
