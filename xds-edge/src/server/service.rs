//! The ADS gRPC service, routed here rather than through the generated
//! `AggregatedDiscoveryServiceServer`, so a stream costs what discovery traffic needs.
//!
//! Requests are decoded by tonic's `Streaming`, with a decode buffer that starts at
//! [`CODEC_BUFFER_BYTES`] (tonic's default is 8 KiB) and grows with the message being read,
//! refusing one over the configured limit as the generated server would. Responses are
//! written by [`ResponseBody`], not tonic's encoder: each is handed over as the chunks of
//! its gRPC frame — a few bytes of the stream's own, then the snapshot's shared encoding
//! of each resource ([`crate::protocol::Outgoing`]) — so a release is encoded once for
//! every stream, no stream copies it, and no stream keeps an encode buffer the size of
//! the largest response it ever sent. An ADS stream lives as long as its sidecar and is
//! silent between releases, so at 60,000 streams these per-stream buffers were most of
//! what a subscription cost the authority.

use std::pin::Pin;

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use http_body::Frame;
use tokio::sync::mpsc;
use tonic::codec::BufferSettings;
use tonic::codegen::{Body, BoxFuture, Context, Poll, Service, StdError, http};
use tonic::server::NamedService;
use tonic::{Request, Status, Streaming};
use tonic_prost::ProstDecoder;

use super::{Outbound, XdsServer};

/// Bytes a stream's request decode buffer starts with (tonic's default is 8 KiB).
pub const CODEC_BUFFER_BYTES: usize = 512;
/// Bytes decoded before a request stream yields to the runtime (tonic's default).
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
}

impl AdsService {
    pub(crate) fn new(server: XdsServer, decode_max: usize) -> Self {
        Self { server, decode_max }
    }
}

impl std::fmt::Debug for AdsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdsService")
            .field("decode_max", &self.decode_max)
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
        let (server, decode_max) = (self.server.clone(), self.decode_max);
        match req.uri().path() {
            SOTW_PATH => Box::pin(async move {
                let opened = match requests::<DiscoveryRequest, B>(req, decode_max) {
                    Ok(request) => server.open_sotw(request).await,
                    Err(status) => Err(status),
                };
                Ok(respond(opened))
            }),
            DELTA_PATH => Box::pin(async move {
                let opened = match requests::<DeltaDiscoveryRequest, B>(req, decode_max) {
                    Ok(request) => server.open_delta(request).await,
                    Err(status) => Err(status),
                };
                Ok(respond(opened))
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("").into_http()) }),
        }
    }
}

/// The request body as a stream of `U`, decoded up to `decode_max` bytes each. This
/// server compresses nothing and accepts nothing compressed (as the generated server
/// with no encodings enabled).
fn requests<U, B>(req: http::Request<B>, decode_max: usize) -> Result<Request<Streaming<U>>, Status>
where
    U: prost::Message + Default + Send + 'static,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    if let Some(encoding) = req.headers().get("grpc-encoding")
        && encoding != "identity"
    {
        let shown = encoding.to_str().unwrap_or("(not text)");
        return Err(Status::unimplemented(format!(
            "requests compressed with `{shown}` are not accepted"
        )));
    }
    let decoder = ProstDecoder::<U>::new(BufferSettings::new(
        CODEC_BUFFER_BYTES,
        YIELD_THRESHOLD_BYTES,
    ));
    Ok(Request::from_http(req.map(|body| {
        Streaming::new_request(decoder, body, None, Some(decode_max))
    })))
}

/// The HTTP response of an opened stream, or of a refused one (a trailers-only response
/// carrying its status).
fn respond(opened: Result<mpsc::Receiver<Outbound>, Status>) -> http::Response<tonic::body::Body> {
    match opened {
        Ok(rx) => {
            let mut response = http::Response::new(tonic::body::Body::new(ResponseBody::new(rx)));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            response
        }
        Err(status) => status.into_http(),
    }
}

/// A stream's responses as HTTP/2 data: each response's chunks in order, then the
/// stream's status as trailers — `OK` when the stream's task ended it quietly, else the
/// status it handed over.
#[derive(Debug)]
pub(crate) struct ResponseBody {
    rx: mpsc::Receiver<Outbound>,
    pending: std::vec::IntoIter<Bytes>,
    ended: bool,
}

impl ResponseBody {
    pub(crate) fn new(rx: mpsc::Receiver<Outbound>) -> Self {
        Self {
            rx,
            pending: Vec::new().into_iter(),
            ended: false,
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        loop {
            if let Some(chunk) = this.pending.next() {
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            let status = match this.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunks))) => {
                    this.pending = chunks.into_vec().into_iter();
                    continue;
                }
                Poll::Ready(Some(Err(status))) => *status,
                Poll::Ready(None) => Status::ok(""),
            };
            this.ended = true;
            let mut trailers = http::HeaderMap::new();
            return Poll::Ready(Some(
                status
                    .add_header(&mut trailers)
                    .map(|()| Frame::trailers(trailers)),
            ));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.pending.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn next_frame(body: &mut ResponseBody) -> Option<Result<Frame<Bytes>, Status>> {
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }

    fn data(frame: Option<Result<Frame<Bytes>, Status>>) -> Bytes {
        frame
            .expect("a frame")
            .expect("not an error")
            .into_data()
            .expect("a data frame")
    }

    fn trailers(frame: Option<Result<Frame<Bytes>, Status>>) -> http::HeaderMap {
        frame
            .expect("a frame")
            .expect("not an error")
            .into_trailers()
            .expect("trailers")
    }

    #[tokio::test]
    async fn responses_go_out_chunk_by_chunk_in_order_then_ok_when_the_stream_ends() {
        let (tx, rx) = mpsc::channel(4);
        let mut body = ResponseBody::new(rx);
        let chunks = |parts: &[&'static [u8]]| -> Box<[Bytes]> {
            parts.iter().map(|p| Bytes::from_static(p)).collect()
        };
        tx.send(Ok(chunks(&[b"one-", b"a"]))).await.unwrap();
        tx.send(Ok(chunks(&[b"two"]))).await.unwrap();
        drop(tx);
        for expected in [&b"one-"[..], b"a", b"two"] {
            assert_eq!(data(next_frame(&mut body).await), expected);
        }
        assert!(!body.is_end_stream(), "the status is still to come");
        let t = trailers(next_frame(&mut body).await);
        assert_eq!(t.get("grpc-status").unwrap(), "0");
        assert!(next_frame(&mut body).await.is_none());
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn a_status_handed_over_ends_the_body_as_its_trailers() {
        let (tx, rx) = mpsc::channel(4);
        let mut body = ResponseBody::new(rx);
        tx.send(Ok([Bytes::from_static(b"x")].into()))
            .await
            .unwrap();
        let status = Status::resource_exhausted("client did not read");
        tx.send(Err(Box::new(status))).await.unwrap();
        tx.send(Ok([Bytes::from_static(b"never")].into()))
            .await
            .unwrap();
        assert_eq!(data(next_frame(&mut body).await), &b"x"[..]);
        let t = trailers(next_frame(&mut body).await);
        let code = i32::from(tonic::Code::ResourceExhausted).to_string();
        assert_eq!(t.get("grpc-status").unwrap(), code.as_str());
        assert_eq!(t.get("grpc-message").unwrap(), "client%20did%20not%20read");
        assert!(
            next_frame(&mut body).await.is_none(),
            "nothing after the status"
        );
    }

    #[test]
    fn a_compressed_request_stream_is_refused_and_identity_is_accepted() {
        let request = |encoding: &'static str| {
            let mut req = http::Request::new(tonic::body::Body::empty());
            req.headers_mut()
                .insert("grpc-encoding", http::HeaderValue::from_static(encoding));
            requests::<DeltaDiscoveryRequest, _>(req, 1024)
        };
        let refused = request("gzip").expect_err("gzip is not accepted");
        assert_eq!(refused.code(), tonic::Code::Unimplemented);
        assert!(refused.message().contains("gzip"), "{refused:?}");
        assert!(request("identity").is_ok());
    }
}
