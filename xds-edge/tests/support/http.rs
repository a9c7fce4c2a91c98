//! A minimal HTTP/1.1 GET client over a tokio `TcpStream`, enough to talk to Envoy's admin
//! API and its listener without pulling an HTTP stack into the tests.
//!
//! One request per connection (`Connection: close`); the body is framed by
//! `Transfer-Encoding: chunked`, `Content-Length`, or the end of the stream, in that order.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one request may take, from connect to the last byte, unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// An answer: status code, headers in order (names lower-cased) and the body as text.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` from `addr` with [`DEFAULT_TIMEOUT`].
pub async fn get(addr: SocketAddr, path: &str) -> io::Result<Response> {
    get_with_timeout(addr, path, DEFAULT_TIMEOUT).await
}

/// `GET path` from `addr`; the whole exchange must finish within `timeout`.
pub async fn get_with_timeout(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> io::Result<Response> {
    match tokio::time::timeout(timeout, exchange(addr, path)).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("GET http://{addr}{path}: no complete answer within {timeout:?}"),
        )),
    }
}

async fn exchange(addr: SocketAddr, path: &str) -> io::Result<Response> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: waymark-test\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse_response(&raw)
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Parses a complete HTTP/1.1 response (the peer has closed the stream).
pub fn parse_response(raw: &[u8]) -> io::Result<Response> {
    let head_end = find(raw, b"\r\n\r\n")
        .ok_or_else(|| invalid(format!("no end of headers in {} bytes", raw.len())))?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|e| invalid(e.to_string()))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| invalid(format!("bad status line {status_line:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &raw[head_end + 4..];
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(rest)?
    } else if let Some(len) = header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| invalid(format!("bad content-length {len:?}")))?;
        rest.get(..len)
            .ok_or_else(|| invalid(format!("body cut short: {} of {len} bytes", rest.len())))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn dechunk(mut rest: &[u8]) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n").ok_or_else(|| invalid("chunk size line cut short"))?;
        let size_text =
            std::str::from_utf8(&rest[..line_end]).map_err(|e| invalid(e.to_string()))?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| invalid(format!("bad chunk size {size_text:?}")))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest.get(..size).ok_or_else(|| invalid("chunk cut short"))?;
        body.extend_from_slice(chunk);
        rest = rest
            .get(size + 2..)
            .ok_or_else(|| invalid("chunk end cut short"))?;
    }
}

pub(super) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
