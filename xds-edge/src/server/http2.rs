//! ADS served on HTTP/2 directly, for a listener that serves nothing else.
//!
//! The tonic path ([`super::service`]) runs three tasks' worth of work for every response:
//! the stream's own task hands the response to a channel, hyper's per-stream task pulls it
//! out and gives it to `h2`, and the connection's task writes it — one system call per
//! response. An authority member holds tens of thousands of ADS streams and sends each of
//! them every release, so here a connection is one task: its streams run inside it (each
//! reads its requests from `h2` and gives its responses to `h2` itself), a release wakes
//! the connection once, and everything its streams answer in that wake leaves in one
//! write ([`super::coalesce`]). The protocol (the same [`super::ProtocolStream`] as the
//! tonic path), admission, the names cap and every size bound are shared. A stream that
//! panicked ends alone; its connection and the connection's other streams serve on.
//!
//! What the gRPC server did and this one does in its place:
//! - **Routing:** the two ADS methods; any other path is `UNIMPLEMENTED`.
//! - **Headers:** a request that is not `application/grpc` is refused with HTTP 415, a
//!   compressed one (`grpc-encoding` other than `identity`) with `UNIMPLEMENTED`.
//! - **Framing:** gRPC's length-prefixed messages, decoded up to the configured
//!   `request_bytes_max` (a longer one ends the stream with `OUT_OF_RANGE` before it is
//!   buffered); a message marked compressed is refused.
//! - **Back-pressure:** a response is handed to `h2` only once the stream has send capacity
//!   again (`h2` grants none while [`SEND_BUFFER_BYTES`] are queued and unwritten), as
//!   hyper does; a client that leaves it without capacity for `send_timeout` is slow.
//! - **Bounds on the connection:** at most `streams_per_connection_max` concurrent streams
//!   and `header_list_bytes_max` of headers (both HTTP/2 settings), the HTTP/2 preface
//!   within [`HANDSHAKE_TIMEOUT`], and keepalive pings: a peer that does not answer one
//!   within `keepalive_timeout` is disconnected.
//! - **Shutdown:** every connection is sent GOAWAY and every stream ends with
//!   `UNAVAILABLE`, so clients reconnect elsewhere at once.
//!
//! Authentication happens before a connection gets here ([`waymark_certs::grpc::incoming`]
//! completes mutual TLS and caps connections); the verified identity travels with the
//! connection ([`AdsConnection::peer`]).

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use h2::server::SendResponse;
use h2::{Ping, RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_stream::{Stream, StreamExt as _};
use tonic::Status;
use tracing::Instrument as _;

use waymark_certs::grpc::{AuthenticatedStream, GrpcLimits, PlainStream};

use super::XdsServer;
use super::coalesce;
use super::service::{DELTA_PATH, SOTW_PATH};
use crate::protocol::{DeltaState, SotwState};

/// Bytes of responses `h2` may hold unwritten for one stream before the stream gets no
/// more send capacity (hyper's default).
pub const SEND_BUFFER_BYTES: usize = 400 * 1024;
/// How long a new connection may take to send the HTTP/2 preface and settings.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a closed connection's streams get to see it closed and end.
const STREAMS_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The receive window of each request stream: requests are a few hundred bytes, and the
/// window is given back as they are read, so a large request only takes more round trips.
const REQUEST_WINDOW_BYTES: u32 = 64 * 1024;
/// The receive window of a connection, shared by its streams' requests.
const CONNECTION_WINDOW_BYTES: u32 = 1024 * 1024;
/// Gathered slices a response offers one write: a response is a few of its own bytes and
/// the shared encodings of the resources it carries.
const GATHER_SLICES_MAX: usize = 64;

/// A connection ADS can be served on, and who is at its other end.
pub trait AdsConnection: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The peer as the listener established it.
    fn peer(&self) -> Peer;
}

/// Who is at the other end of a connection: never something the client wrote in a request.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// The identity its certificate proved, over mutual TLS.
    pub identity: Option<String>,
    /// Where it connected from.
    pub addr: Option<SocketAddr>,
}

impl AdsConnection for AuthenticatedStream {
    fn peer(&self) -> Peer {
        let info = AuthenticatedStream::peer(self);
        Peer {
            identity: Some(info.identity.to_string()),
            addr: info.remote_addr,
        }
    }
}

impl AdsConnection for PlainStream {
    fn peer(&self) -> Peer {
        use tonic::transport::server::Connected as _;
        Peer {
            identity: None,
            addr: self.connect_info().remote_addr,
        }
    }
}

impl XdsServer {
    /// Serve ADS, and only ADS, on every connection `incoming` yields, until `shutdown`
    /// resolves; then end every stream with `UNAVAILABLE`, close every connection, and
    /// return. `limits` bound each connection (see the module docs); message sizes come
    /// from this server's [`super::ServerConfig`].
    pub async fn serve_incoming<C, E>(
        self,
        incoming: impl Stream<Item = Result<C, E>>,
        limits: GrpcLimits,
        shutdown: impl Future<Output = ()>,
    ) where
        C: AdsConnection,
        E: std::fmt::Display,
    {
        let (stop_tx, stop) = watch::channel(false);
        let mut connections = JoinSet::new();
        let mut incoming = std::pin::pin!(incoming);
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
                accepted = incoming.next() => accepted,
            };
            match accepted {
                Some(Ok(io)) => {
                    let peer = io.peer();
                    let span = tracing::debug_span!("xds_connection", peer = ?peer.addr);
                    let conn = Connection {
                        server: self.clone(),
                        peer,
                        limits,
                        stop: stop.clone(),
                        streams_stop: watch::Sender::new(false),
                    };
                    connections.spawn(conn.run(io).instrument(span));
                }
                Some(Err(error)) => tracing::debug!(%error, "xds connection not accepted"),
                None => break,
            }
        }
        let _ = stop_tx.send(true);
        while connections.join_next().await.is_some() {}
    }
}

/// One HTTP/2 connection: its handshake, keepalive, and the streams it opens.
struct Connection {
    server: XdsServer,
    peer: Peer,
    limits: GrpcLimits,
    stop: watch::Receiver<bool>,
    /// The stop as this connection's streams hear it. Each stream waits on it for its
    /// whole life; were that the server-wide channel, every stream of the server would
    /// take one lock each time it polls its wait (on every request it reads).
    streams_stop: watch::Sender<bool>,
}

impl Connection {
    /// Serve the connection to its end. Its streams run inside this one task rather than a
    /// task each: a release wakes the connection once, every stream it carries answers in
    /// that wake, and what they answer leaves as one write ([`coalesce`]) rather than one
    /// system call and TCP segment per response.
    async fn run<C: AdsConnection>(self, io: C) {
        let (io, writes) = coalesce::coalesce(io);
        coalesce::FlushAfterPoll::new(self.drive(io), writes).await;
    }

    async fn drive<C: AdsConnection>(mut self, io: coalesce::CoalescedIo<C>) {
        let handshake = h2::server::Builder::new()
            .max_concurrent_streams(self.limits.streams_per_connection_max)
            .max_header_list_size(self.limits.header_list_bytes_max)
            .initial_window_size(REQUEST_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            .max_send_buffer_size(SEND_BUFFER_BYTES)
            .handshake::<_, ResponseBuf>(io);
        let mut conn = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(error)) => {
                tracing::debug!(%error, "http/2 handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("http/2 handshake timed out");
                return;
            }
        };
        let keepalive = keepalive(
            conn.ping_pong(),
            self.limits.keepalive_interval,
            self.limits.keepalive_timeout,
        );
        let mut keepalive = std::pin::pin!(keepalive);
        let mut streams = FuturesUnordered::new();
        let mut stopping = *self.stop.borrow();
        if stopping {
            self.streams_stop.send_replace(true);
            conn.graceful_shutdown();
        }
        loop {
            tokio::select! {
                accepted = conn.accept() => match accepted {
                    Some(Ok((request, respond))) => streams.push(self.stream(request, respond)),
                    Some(Err(error)) => {
                        tracing::debug!(%error, "http/2 connection ended with an error");
                        break;
                    }
                    None => break,
                },
                Some(()) = streams.next(), if !streams.is_empty() => {}
                () = &mut keepalive => {
                    tracing::info!(peer = ?self.peer.addr, "xds connection dropped: keepalive ping unanswered");
                    break;
                }
                _ = self.stop.changed(), if !stopping => {
                    stopping = true;
                    self.streams_stop.send_replace(true);
                    conn.graceful_shutdown();
                }
            }
        }
        // With the connection gone, every stream still open fails its next read or write
        // and ends (each giving back its place in admission and the sync registry).
        drop(conn);
        let drained = async { while streams.next().await.is_some() {} };
        if tokio::time::timeout(STREAMS_DRAIN_TIMEOUT, drained)
            .await
            .is_err()
        {
            tracing::warn!(
                streams = streams.len(),
                "streams still running after their connection closed; dropped"
            );
        }
    }

    /// One stream, from its headers to its end: route it, check its headers, then run it.
    /// It runs inside the connection's task; a panic in it ends that stream alone.
    fn stream(
        &self,
        request: http::Request<RecvStream>,
        respond: SendResponse<ResponseBuf>,
    ) -> BoxFuture<'static, ()> {
        let (server, peer) = (self.server.clone(), self.peer.clone());
        let stop = self.streams_stop.subscribe();
        let stream = async move {
            let (head, body) = request.into_parts();
            let mut respond = respond;
            if let Err(refusal) = check_headers(&head) {
                refuse(&mut respond, refusal);
                return;
            }
            let delta = match head.uri.path() {
                DELTA_PATH => true,
                SOTW_PATH => false,
                _ => return refuse(&mut respond, Refusal::Status(Status::unimplemented(""))),
            };
            let outlet = Outlet::new(respond, stop);
            if delta {
                let inbound = super::Inbound::Direct(Requests::new(body, &server));
                server.run_direct::<DeltaState>(inbound, peer, outlet).await;
            } else {
                let inbound = super::Inbound::Direct(Requests::new(body, &server));
                server.run_direct::<SotwState>(inbound, peer, outlet).await;
            }
        };
        // A combinator, not an `async` block around `stream`: the block would keep the
        // captured future and the one it awaits as two fields, doubling what every open
        // stream holds.
        AssertUnwindSafe(stream)
            .catch_unwind()
            .map(|ended| {
                if let Err(panic) = ended {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!(panic = %message, "xds stream panicked; it alone is ended");
                }
            })
            .boxed()
    }
}

/// Resolves once a keepalive ping goes unanswered for `timeout`; pings every `interval`.
/// Pending forever if the connection cannot ping or has gone (its accept loop ends then).
async fn keepalive(pinger: Option<h2::PingPong>, interval: Duration, timeout: Duration) {
    let Some(mut pinger) = pinger else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, pinger.ping(Ping::opaque())).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return std::future::pending().await,
            Err(_) => return,
        }
    }
}

/// Why a stream is refused before it starts.
#[derive(Debug)]
enum Refusal {
    /// Not gRPC at all: an HTTP status.
    Http(http::StatusCode),
    /// A gRPC call this server will not take: a trailers-only response.
    Status(Status),
}

fn check_headers(head: &http::request::Parts) -> Result<(), Refusal> {
    let grpc = head
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == "application/grpc" || v.starts_with("application/grpc+"));
    if head.method != http::Method::POST || !grpc {
        return Err(Refusal::Http(http::StatusCode::UNSUPPORTED_MEDIA_TYPE));
    }
    if let Some(encoding) = head.headers.get("grpc-encoding")
        && encoding != "identity"
    {
        let shown = encoding.to_str().unwrap_or("(not text)");
        return Err(Refusal::Status(Status::unimplemented(format!(
            "requests compressed with `{shown}` are not accepted"
        ))));
    }
    Ok(())
}

fn refuse(respond: &mut SendResponse<ResponseBuf>, refusal: Refusal) {
    let response = match refusal {
        Refusal::Http(code) => {
            let mut response = http::Response::new(());
            *response.status_mut() = code;
            response
        }
        Refusal::Status(status) => trailers_only(&status),
    };
    let _ = respond.send_response(response, true);
}

/// The head of a gRPC response that is only its status (a call refused before it began).
/// Not tonic's `Status::into_http`, which panics on a status whose details do not encode.
fn trailers_only(status: &Status) -> http::Response<()> {
    let mut response = http::Response::new(());
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
    add_status(status, headers);
    response
}

/// `status` as gRPC's headers in `headers`; `INTERNAL` if it cannot be encoded.
fn add_status(status: &Status, headers: &mut http::HeaderMap) {
    if status.add_header(headers).is_err() {
        headers.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
}

const GRPC_CONTENT_TYPE: http::HeaderValue = http::HeaderValue::from_static("application/grpc");

/// A stream's requests, decoded from its HTTP/2 body.
pub(crate) struct Requests<T> {
    body: RecvStream,
    frames: Deframer,
    _message: PhantomData<fn() -> T>,
}

impl<T: prost::Message + Default> Requests<T> {
    fn new(body: RecvStream, server: &XdsServer) -> Self {
        Self {
            body,
            frames: Deframer::new(server.inner.config.request_bytes_max),
            _message: PhantomData,
        }
    }

    /// The next request; `None` once the client closed its side.
    pub(crate) async fn message(&mut self) -> Result<Option<T>, Status> {
        loop {
            if let Some(message) = self.frames.next_message()? {
                return decode(message).map(Some);
            }
            match self.body.data().await {
                Some(Ok(chunk)) => {
                    // Read, so the window is the client's again; what is buffered is
                    // bounded (the deframer refuses a prefix over its maximum).
                    let _ = self.body.flow_control().release_capacity(chunk.len());
                    self.frames.push(chunk);
                }
                Some(Err(error)) => {
                    return Err(match error.reason() {
                        Some(h2::Reason::CANCEL) => Status::cancelled("the client cancelled"),
                        _ => Status::unavailable(format!("request stream failed: {error}")),
                    });
                }
                None if self.frames.is_empty() => return Ok(None),
                None => {
                    return Err(Status::internal(
                        "the request stream ended in the middle of a message",
                    ));
                }
            }
        }
    }
}

fn decode<T: prost::Message + Default>(message: Bytes) -> Result<T, Status> {
    T::decode(message).map_err(|error| Status::internal(format!("malformed request: {error}")))
}

/// gRPC's message prefix: a compressed flag and a big-endian length.
const PREFIX_BYTES: usize = 5;

/// gRPC's length-prefixed messages out of the chunks a body arrives in. Pure: chunks in,
/// messages out. The common request (an ACK) arrives in one DATA frame and is handed out
/// as a slice of it; a message split across frames is gathered first. A prefix announcing
/// more than `max` bytes is refused as soon as it is read, before its body is buffered.
#[derive(Debug)]
pub struct Deframer {
    /// Received and not yet handed out, as it arrived (one chunk)…
    whole: Bytes,
    /// …or gathered from several chunks.
    gathered: BytesMut,
    max: usize,
}

impl Deframer {
    pub fn new(max: usize) -> Self {
        Self {
            whole: Bytes::new(),
            gathered: BytesMut::new(),
            max,
        }
    }

    /// Whether nothing is buffered (so an end of the body here ends it cleanly).
    pub fn is_empty(&self) -> bool {
        self.whole.is_empty() && self.gathered.is_empty()
    }

    /// Take the next chunk of the body.
    pub fn push(&mut self, chunk: Bytes) {
        if self.is_empty() {
            self.whole = chunk;
            return;
        }
        if !self.whole.is_empty() {
            self.gathered.extend_from_slice(&self.whole);
            self.whole = Bytes::new();
        }
        self.gathered.extend_from_slice(&chunk);
    }

    /// The next whole message's bytes (without its prefix), if one is buffered.
    pub fn next_message(&mut self) -> Result<Option<Bytes>, Status> {
        let held: &[u8] = if self.gathered.is_empty() {
            &self.whole
        } else {
            &self.gathered
        };
        let Some(prefix) = held.get(..PREFIX_BYTES) else {
            return Ok(None);
        };
        if prefix[0] != 0 {
            return Err(Status::internal(
                "a compressed request on a stream that named no compression",
            ));
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > self.max {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                self.max
            )));
        }
        let end = PREFIX_BYTES + len;
        if held.len() < end {
            if !self.gathered.is_empty() {
                self.gathered.reserve(end - held.len());
            }
            return Ok(None);
        }
        if self.gathered.is_empty() {
            let mut message = self.whole.split_to(end);
            message.advance(PREFIX_BYTES);
            return Ok(Some(message));
        }
        let mut message = self.gathered.split_to(end);
        message.advance(PREFIX_BYTES);
        if self.gathered.is_empty() {
            // A long message gathered: give its buffer back rather than keep it for the
            // life of the stream.
            self.gathered = BytesMut::new();
        }
        Ok(Some(message.freeze()))
    }
}

/// A stream's response side: its HTTP/2 response once started, and the server's stop.
pub(crate) struct Outlet {
    respond: Option<SendResponse<ResponseBuf>>,
    send: Option<SendStream<ResponseBuf>>,
    /// The server's stop, waited on for the stream's whole life (see [`Outlet::stopping`]).
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// Why a response could not be handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undelivered {
    /// The client went away (or reset the stream).
    Gone,
    /// The client left the stream without send capacity for the whole timeout.
    Slow,
}

impl Outlet {
    fn new(respond: SendResponse<ResponseBuf>, mut stop: watch::Receiver<bool>) -> Self {
        Self {
            respond: Some(respond),
            send: None,
            stop: Box::pin(async move {
                if stop.wait_for(|stop| *stop).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }),
        }
    }

    /// Send the response's head: the stream is admitted.
    pub(crate) fn start(&mut self) -> Result<(), Undelivered> {
        let respond = self.respond.as_mut().ok_or(Undelivered::Gone)?;
        let mut head = http::Response::new(());
        head.headers_mut()
            .insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
        let send = respond
            .send_response(head, false)
            .map_err(|_| Undelivered::Gone)?;
        self.respond = None;
        self.send = Some(send);
        Ok(())
    }

    /// Hand one response (the chunks of its gRPC frame) to `h2`, once the stream has send
    /// capacity; waits at most `timeout` for it.
    pub(crate) async fn send(
        &mut self,
        chunks: Box<[Bytes]>,
        timeout: Duration,
    ) -> Result<(), Undelivered> {
        let send = self.send.as_mut().ok_or(Undelivered::Gone)?;
        send.reserve_capacity(1);
        let deadline = tokio::time::Instant::now() + timeout;
        while send.capacity() == 0 {
            let capacity = std::future::poll_fn(|cx| send.poll_capacity(cx));
            match tokio::time::timeout_at(deadline, capacity).await {
                Err(_) => return Err(Undelivered::Slow),
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(_)) | None) => return Err(Undelivered::Gone),
            }
        }
        send.send_data(ResponseBuf::new(chunks), false)
            .map_err(|_| Undelivered::Gone)
    }

    /// End the stream with `status`: as trailers once it started, else as a
    /// trailers-only response. Never waits; a client that is not reading may never see it.
    pub(crate) fn end(&mut self, status: &Status) {
        if let Some(send) = self.send.as_mut() {
            let mut trailers = http::HeaderMap::new();
            add_status(status, &mut trailers);
            let _ = send.send_trailers(trailers);
        } else if let Some(respond) = self.respond.as_mut() {
            let _ = respond.send_response(trailers_only(status), true);
        }
        self.send = None;
        self.respond = None;
    }

    /// Resolves when the server is shutting down. One wait for the stream's life, kept
    /// between calls: every stream waits on the same channel, and registering anew on
    /// each of its requests would take that channel's lock twice per request.
    pub(crate) async fn stopping(&mut self) {
        (&mut self.stop).await;
    }
}

/// One response as `h2` sends it: the chunks of its gRPC frame, offered to a write as
/// gathered slices, so a release's shared encodings are never copied per stream and a
/// response goes out as one DATA frame rather than one per chunk.
pub struct ResponseBuf {
    chunks: Box<[Bytes]>,
    /// The first chunk not yet wholly sent.
    at: usize,
    remaining: usize,
}

impl ResponseBuf {
    fn new(chunks: Box<[Bytes]>) -> Self {
        let remaining = chunks.iter().map(Bytes::len).sum();
        let mut buf = Self {
            chunks,
            at: 0,
            remaining,
        };
        buf.skip_empty();
        buf
    }

    fn skip_empty(&mut self) {
        while self.chunks.get(self.at).is_some_and(Bytes::is_empty) {
            self.at += 1;
        }
    }
}

impl Buf for ResponseBuf {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.chunks.get(self.at).map_or(&[], |c| c.as_ref())
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        let mut n = 0;
        for chunk in self.chunks[self.at..].iter().filter(|c| !c.is_empty()) {
            if n == dst.len().min(GATHER_SLICES_MAX) {
                break;
            }
            dst[n] = std::io::IoSlice::new(chunk);
            n += 1;
        }
        n
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.remaining, "advanced past the end of a response");
        self.remaining -= cnt;
        while cnt > 0 {
            let chunk = &mut self.chunks[self.at];
            let step = cnt.min(chunk.len());
            chunk.advance(step);
            cnt -= step;
            self.skip_empty();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    fn all(d: &mut Deframer) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(m) = d.next_message().unwrap() {
            out.push(m.to_vec());
        }
        out
    }

    #[test]
    fn messages_come_out_whole_however_the_body_is_cut() {
        let messages: [&[u8]; 4] = [b"ack", b"", b"a longer request", &[7; 300]];
        let body: Vec<u8> = messages.iter().flat_map(|m| framed(m)).collect();
        for cut in [1, 2, 4, 5, 6, 17, 64, body.len()] {
            let mut d = Deframer::new(1024);
            let mut out = Vec::new();
            for chunk in body.chunks(cut) {
                d.push(Bytes::copy_from_slice(chunk));
                out.extend(all(&mut d));
            }
            let want: Vec<Vec<u8>> = messages.iter().map(|m| m.to_vec()).collect();
            assert_eq!(out, want, "cut every {cut} bytes");
            assert!(d.is_empty(), "nothing left over (cut {cut})");
        }
    }

    #[test]
    fn a_message_over_the_limit_is_refused_from_its_prefix_alone() {
        let mut d = Deframer::new(16);
        d.push(Bytes::copy_from_slice(&framed(&[1; 16])));
        assert_eq!(all(&mut d), [vec![1; 16]], "the limit itself is allowed");
        let big = framed(&[2; 17]);
        d.push(Bytes::copy_from_slice(&big[..PREFIX_BYTES]));
        let refused = d
            .next_message()
            .expect_err("17 bytes announced, 16 allowed");
        assert_eq!(refused.code(), tonic::Code::OutOfRange);
    }

    #[test]
    fn a_message_marked_compressed_is_refused_and_a_cut_one_is_left_pending() {
        let mut d = Deframer::new(64);
        let mut cut = framed(b"half of it");
        cut.truncate(8);
        d.push(Bytes::from(cut));
        assert!(d.next_message().unwrap().is_none(), "not whole yet");
        assert!(!d.is_empty(), "an end of body here is mid-message");
        let mut d = Deframer::new(64);
        let mut compressed = framed(b"zz");
        compressed[0] = 1;
        d.push(Bytes::from(compressed));
        assert_eq!(d.next_message().unwrap_err().code(), tonic::Code::Internal);
    }

    fn buf(parts: &[&'static [u8]]) -> ResponseBuf {
        ResponseBuf::new(parts.iter().map(|p| Bytes::from_static(p)).collect())
    }

    fn drain(mut b: ResponseBuf, step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while b.has_remaining() {
            let n = b.chunk().len().min(step);
            out.extend_from_slice(&b.chunk()[..n]);
            b.advance(n);
        }
        out
    }

    #[test]
    fn a_response_buffer_yields_its_chunks_whole_and_in_order_however_it_is_advanced() {
        for step in [1, 2, 3, 7, 100] {
            let b = buf(&[b"ab", b"", b"cde", b"", b"", b"f"]);
            assert_eq!(b.remaining(), 6);
            assert_eq!(drain(b, step), b"abcdef", "step {step}");
        }
        let empty = buf(&[b"", b""]);
        assert_eq!(empty.remaining(), 0);
        assert!(empty.chunk().is_empty());
    }

    #[test]
    fn a_response_buffer_offers_its_unsent_chunks_as_gathered_slices() {
        let mut b = buf(&[b"head", b"", b"shared-one", b"shared-two"]);
        b.advance(2);
        let mut slices = [std::io::IoSlice::new(&[]); 8];
        let n = b.chunks_vectored(&mut slices);
        let got: Vec<&[u8]> = slices[..n].iter().map(|s| &s[..]).collect();
        assert_eq!(got, [&b"ad"[..], b"shared-one", b"shared-two"]);
        let mut two = [std::io::IoSlice::new(&[]); 2];
        assert_eq!(b.chunks_vectored(&mut two), 2, "bounded by the slots given");
    }
}
