//! A tiny HTTP/1.1 upstream for Envoy to route to: it answers every request with its status
//! (200 unless told otherwise) and its name as the body, so a test can see which backend
//! served a request and how many each one served.
//!
//! Keep-alive is supported (Envoy pools upstream connections): requests are framed by
//! `Content-Length`, several per connection, until the peer closes or asks to.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::http::find;

struct Shared {
    name: String,
    status: AtomicU16,
    hits: AtomicU64,
    paths: Mutex<Vec<String>>,
}

/// A running backend on `127.0.0.1:<ephemeral>`; it stops (and drops its connections) on drop.
pub struct Backend {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Backend {
    /// Binds `127.0.0.1:0` and serves on the current tokio runtime.
    pub async fn start(name: &str) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a backend port");
        let addr = listener.local_addr().expect("backend address");
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            status: AtomicU16::new(200),
            hits: AtomicU64::new(0),
            paths: Mutex::new(Vec::new()),
        });
        let accept_shared = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            // Dropping the set (when this task is aborted) aborts every connection task.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        connections.spawn(serve(stream, Arc::clone(&accept_shared)));
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Backend { addr, shared, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Requests answered so far (whatever the status).
    pub fn hits(&self) -> u64 {
        self.shared.hits.load(Ordering::SeqCst)
    }

    /// The request targets seen so far, in order (e.g. to check a prefix rewrite).
    pub fn paths(&self) -> Vec<String> {
        self.shared.paths.lock().expect("paths lock").clone()
    }

    /// The status every later request is answered with (e.g. 503 to look unhealthy).
    pub fn set_status(&self, status: u16) {
        self.shared.status.store(status, Ordering::SeqCst);
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        // Read until a whole head is buffered.
        let head_end = loop {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                break end;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default();
        let path = request_line
            .split(' ')
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let mut body_len = 0usize;
        let mut close = request_line.ends_with("HTTP/1.0");
        for (name, value) in lines.filter_map(|l| l.split_once(':')) {
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("content-length") {
                body_len = value.parse().unwrap_or(0);
            } else if name.eq_ignore_ascii_case("connection") {
                close = value.eq_ignore_ascii_case("close");
            }
        }
        // Skip the request body, if any.
        let request_end = head_end + 4 + body_len;
        while buf.len() < request_end {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..request_end);

        let status = shared.status.load(Ordering::SeqCst);
        shared.hits.fetch_add(1, Ordering::SeqCst);
        shared.paths.lock().expect("paths lock").push(path);
        let response = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{}\r\n{}",
            reason(status),
            shared.name.len(),
            if close { "Connection: close\r\n" } else { "" },
            shared.name,
        );
        if stream.write_all(response.as_bytes()).await.is_err() || close {
            return;
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        404 => "Not Found",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}
