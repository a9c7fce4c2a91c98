//! The evidence stream's gRPC codec: messages as JSON, for both halves.

use std::marker::PhantomData;

use bytes::{Buf, BufMut};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// gRPC messages as JSON (`application/grpc+json`), encoding `E` and decoding `D`.
#[derive(Debug)]
pub struct JsonCodec<E, D>(PhantomData<fn(E) -> D>);

impl<E, D> Default for JsonCodec<E, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<E, D> Codec for JsonCodec<E, D>
where
    E: Serialize + Send + 'static,
    D: DeserializeOwned + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = JsonEncoder<E>;
    type Decoder = JsonDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        JsonEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        JsonDecoder(PhantomData)
    }
}

/// The encoding half of [`JsonCodec`].
#[derive(Debug)]
pub struct JsonEncoder<E>(PhantomData<fn(E)>);

impl<E: Serialize> Encoder for JsonEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        serde_json::to_writer(dst.writer(), &item)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }
}

/// The decoding half of [`JsonCodec`]. A malformed message fails the stream with
/// `INVALID_ARGUMENT` naming what is wrong.
#[derive(Debug)]
pub struct JsonDecoder<D>(PhantomData<fn() -> D>);

impl<D: DeserializeOwned> Decoder for JsonDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        let item = serde_json::from_reader(src.reader())
            .map_err(|e| Status::invalid_argument(format!("malformed message: {e}")))?;
        Ok(Some(item))
    }
}
