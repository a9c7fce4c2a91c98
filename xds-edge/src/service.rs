//! The ADS gRPC service, routed here rather than through the generated
//! `AggregatedDiscoveryServiceServer`, so each stream's codec buffers fit discovery traffic.
//!
//! The generated server gives every RPC tonic's default codec, which allocates an 8 KiB
//! decode buffer and an 8 KiB encode buffer when the stream opens and keeps them while it
//! lives. An ADS stream lives as long as its sidecar, reads requests of a few hundred
//! bytes (subscriptions and ACKs) and is silent between releases, so at 60,000 streams those
//! two buffers alone were most of what a subscription cost the authority. Here they start
//! at [`CODEC_BUFFER_BYTES`] and grow with the message being read or written, as tonic's
//! buffers always do; a request is still refused above the configured decode limit, a
//! response above the encode limit, exactly as through the generated server.

use std::marker::PhantomData;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use tonic::codec::{BufferSettings, Codec};
use tonic::codegen::{Body, BoxFuture, Context, Poll, Service, StdError, http};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::{ProstDecoder, ProstEncoder};

use crate::server::XdsServer;

/// Bytes a stream's encode and decode buffers start with (tonic's default is 8 KiB each).
pub const CODEC_BUFFER_BYTES: usize = 512;
/// Bytes encoded before a response body yields to the runtime (tonic's default).
const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

/// The gRPC path of state-of-the-world ADS.
pub const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// The gRPC path of incremental (Delta) ADS.
pub const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// [`XdsServer`] as a tonic service: `add_service(server.service())`.
#[derive(Clone)]
pub struct AdsService {
    server: XdsServer,
    decode_max: usize,
    encode_max: usize,
}

impl AdsService {
    pub(crate) fn new(server: XdsServer, decode_max: usize, encode_max: usize) -> Self {
        Self {
            server,
            decode_max,
            encode_max,
        }
    }
}

impl std::fmt::Debug for AdsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdsService")
            .field("decode_max", &self.decode_max)
            .field("encode_max", &self.encode_max)
            .finish_non_exhaustive()
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl<B> Service<http::Request<B>> for AdsService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (server, limits) = (self.server.clone(), (self.decode_max, self.encode_max));
        match req.uri().path() {
            SOTW_PATH => Box::pin(async move {
                Ok(grpc::<DiscoveryResponse, DiscoveryRequest>(limits)
                    .streaming(Sotw(server), req)
                    .await)
            }),
            DELTA_PATH => Box::pin(async move {
                Ok(
                    grpc::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>(limits)
                        .streaming(Delta(server), req)
                        .await,
                )
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("").into_http()) }),
        }
    }
}

fn grpc<T, U>((decode_max, encode_max): (usize, usize)) -> Grpc<SmallBuffers<T, U>>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    Grpc::new(SmallBuffers(PhantomData))
        .apply_max_message_size_config(Some(decode_max), Some(encode_max))
}

/// Protobuf with [`CODEC_BUFFER_BYTES`] buffers: encodes `T`, decodes `U`.
struct SmallBuffers<T, U>(PhantomData<fn() -> (T, U)>);

impl<T, U> Codec for SmallBuffers<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::new(
            CODEC_BUFFER_BYTES,
            YIELD_THRESHOLD_BYTES,
        ))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::new(
            CODEC_BUFFER_BYTES,
            YIELD_THRESHOLD_BYTES,
        ))
    }
}

struct Sotw(XdsServer);

impl StreamingService<DiscoveryRequest> for Sotw {
    type Response = DiscoveryResponse;
    type ResponseStream =
        <XdsServer as AggregatedDiscoveryService>::StreamAggregatedResourcesStream;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<DiscoveryRequest>>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(async move { server.stream_aggregated_resources(request).await })
    }
}

struct Delta(XdsServer);

impl StreamingService<DeltaDiscoveryRequest> for Delta {
    type Response = DeltaDiscoveryResponse;
    type ResponseStream = <XdsServer as AggregatedDiscoveryService>::DeltaAggregatedResourcesStream;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<DeltaDiscoveryRequest>>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(async move { server.delta_aggregated_resources(request).await })
    }
}
