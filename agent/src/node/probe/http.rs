//! HTTP check: one `GET` over a fresh HTTP/1.1 connection; 2xx passes.
//!
//! The connection is driven inside the probe's own future rather than a spawned task, so
//! the caller's deadline (or an abort when the target is removed) tears everything down.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::pin::pin;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util_client::rt::TokioIo;
use tokio::net::TcpStream;
use waymark_core::audit::DETAIL_LEN_MAX;

use super::check::{BODY_MATCH_LEN_MAX, HttpCheck, Outcome, ProbeError};

const USER_AGENT: &str = "waymark-prober";

/// `GET check.path` from `addr`; the caller bounds the time.
pub(super) async fn probe(addr: SocketAddr, check: &HttpCheck) -> Result<Outcome, ProbeError> {
    // An origin-form target needs its leading slash; a contract may have left it off.
    let path = if check.path.starts_with('/') {
        Cow::Borrowed(check.path.as_str())
    } else {
        Cow::Owned(format!("/{}", check.path))
    };
    let request = hyper::Request::get(&*path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::USER_AGENT, USER_AGENT)
        // One request per connection: nothing is pooled between probes.
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(ProbeError::Request)?;

    let stream = TcpStream::connect(addr)
        .await
        .map_err(ProbeError::Connect)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(ProbeError::Http)?;

    let expect_body = check.expect_body.as_deref();
    let exchange = async {
        let response = sender.send_request(request).await?;
        let status = response.status();
        // Read only what the verdict needs: the body's head for a failure's detail, or the
        // searched prefix for a body match. A plain 2xx reads nothing.
        let limit = match (status.is_success(), expect_body) {
            (true, None) => 0,
            (true, Some(_)) => BODY_MATCH_LEN_MAX,
            (false, _) => DETAIL_LEN_MAX,
        };
        let body = read_prefix(response.into_body(), limit).await?;
        Ok::<_, hyper::Error>((status.as_u16(), body))
    };
    let mut exchange = pin!(exchange);
    let mut conn = pin!(conn);
    let (status, body) = tokio::select! {
        biased;
        done = &mut exchange => done,
        ended = &mut conn => match ended {
            // The connection may finish before the exchange has seen the last frame it
            // delivered; the exchange completes from what is buffered.
            Ok(()) => exchange.await,
            Err(error) => Err(error),
        },
    }
    .map_err(ProbeError::Http)?;
    Ok(Outcome::of_http(status, &body, expect_body))
}

/// Up to `limit` bytes of `body` (possibly a few more: whole frames are kept).
async fn read_prefix(mut body: Incoming, limit: usize) -> Result<Bytes, hyper::Error> {
    let mut prefix = BytesMut::new();
    while prefix.len() < limit {
        let Some(frame) = body.frame().await else {
            break;
        };
        if let Ok(data) = frame?.into_data() {
            prefix.extend_from_slice(&data);
        }
    }
    prefix.truncate(limit);
    Ok(prefix.freeze())
}
