//! The DNS server's shell: a UDP socket and a TCP listener on one port, each message handed
//! to the pure [`super::message::respond`] with the table of the moment.
//!
//! - UDP: one task receives, answers and sends, one datagram at a time. Answering is a
//!   lookup in memory, so the task is never the bottleneck and needs no queue.
//! - TCP: one task accepts, at most [`DnsConfig::tcp_connections_max`] connections at once
//!   (more are closed at once and counted); each connection is served by its own task until
//!   the peer closes it or sends nothing for [`DnsConfig::tcp_idle_timeout`].
//! - The table is read with [`ArcSwap::load`] per message: no lock, and a swap by the agent
//!   takes effect from the next message on.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep, timeout};
use tracing::{Instrument as _, debug, info, info_span, trace};

use super::message::{self, Outcome, Transport};
use super::metrics::DnsMetrics;
use super::origin::DnsOrigin;
use super::table::DnsTable;
use super::{DnsConfig, DnsError};

/// With port 0, how many UDP ports to try before giving up on finding one whose TCP twin is
/// free too.
const BIND_ATTEMPTS: usize = 8;
/// Pause after a failed `recv_from`/`accept`, so a persistent socket error cannot spin.
const SOCKET_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// The running DNS server. Dropping it stops it (its sockets close shortly after);
/// [`DnsServer::shutdown`] stops it and waits until they are closed.
#[derive(Debug)]
pub struct DnsServer {
    udp_addr: SocketAddr,
    tcp_addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

/// What every serving task shares.
struct Shared {
    table: Arc<ArcSwap<DnsTable>>,
    origin: DnsOrigin,
    metrics: DnsMetrics,
    /// Round-robin counter for the order of answers.
    rotation: AtomicUsize,
}

// === impl DnsServer ===

impl DnsServer {
    /// Bind UDP and TCP on `config.bind` (the same port for both: UDP first, then TCP on
    /// UDP's port; with port 0, retried on a few ports if TCP's is taken), register the
    /// `waymark_dns_*` metrics in `registry`, and serve `table` until dropped.
    ///
    /// Must be called from within a tokio runtime ([`DnsError::NoRuntime`] otherwise).
    /// Metrics are registered only once the sockets are bound, so a failed start can be
    /// retried with the same registry.
    pub fn start(
        config: DnsConfig,
        table: Arc<ArcSwap<DnsTable>>,
        registry: &mut Registry,
    ) -> Result<Self, DnsError> {
        let runtime = Handle::try_current().map_err(|_| DnsError::NoRuntime)?;
        let origin = DnsOrigin::new(&config)?;
        let (udp, tcp) = bind(config.bind)?;
        let udp_addr = local_addr(&udp, "udp", config.bind)?;
        let tcp_addr = local_addr(&tcp, "tcp", config.bind)?;
        let udp = UdpSocket::from_std(udp).map_err(|source| DnsError::Bind {
            transport: "udp",
            addr: udp_addr,
            source,
        })?;
        let tcp = TcpListener::from_std(tcp).map_err(|source| DnsError::Bind {
            transport: "tcp",
            addr: tcp_addr,
            source,
        })?;

        let metrics = DnsMetrics::default();
        metrics.register(registry);
        let shared = Arc::new(Shared {
            table,
            origin,
            metrics,
            rotation: AtomicUsize::new(0),
        });
        let span = info_span!("dns", addr = %udp_addr);
        let connections_max = config.tcp_connections_max.min(Semaphore::MAX_PERMITS);
        let tasks = vec![
            runtime.spawn(serve_udp(udp, shared.clone()).instrument(span.clone())),
            runtime.spawn(
                serve_tcp(tcp, shared, connections_max, config.tcp_idle_timeout).instrument(span),
            ),
        ];
        info!(
            udp = %udp_addr,
            tcp = %tcp_addr,
            domain = %config.domain,
            ttl_s = config.ttl.as_secs(),
            negative_ttl_s = config.negative_ttl.as_secs(),
            "dns server started"
        );
        Ok(Self {
            udp_addr,
            tcp_addr,
            tasks,
        })
    }

    /// The UDP socket's address (the port is the TCP listener's too).
    pub fn local_addr(&self) -> SocketAddr {
        self.udp_addr
    }

    /// The UDP socket's address.
    pub fn udp_local_addr(&self) -> SocketAddr {
        self.udp_addr
    }

    /// The TCP listener's address.
    pub fn tcp_local_addr(&self) -> SocketAddr {
        self.tcp_addr
    }

    /// Stop serving and wait until both sockets and every TCP connection are closed.
    pub async fn shutdown(mut self) {
        let tasks = std::mem::take(&mut self.tasks);
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            // Cancelled is the expected outcome; a panic in a task was already reported.
            let _cancelled = task.await;
        }
        info!(udp = %self.udp_addr, "dns server stopped");
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

// === impl Shared ===

impl Shared {
    /// The reply to one received message, counted and logged; `None` = send nothing.
    fn handle(&self, request: &[u8], peer: SocketAddr, transport: Transport) -> Option<Vec<u8>> {
        let rotation = self.rotation.fetch_add(1, Ordering::Relaxed);
        let outcome = {
            let table = self.table.load();
            message::respond(&table, &self.origin, request, transport, rotation)
        };
        match outcome {
            Outcome::Answered {
                reply,
                qtype,
                rcode,
                truncated,
            } => {
                self.metrics.count_query(transport, qtype, rcode, truncated);
                trace!(%peer, transport = transport.as_str(), %qtype, %rcode, truncated, "dns query answered");
                reply
            }
            Outcome::Malformed { reply, reason } => {
                self.metrics.count_malformed(transport);
                debug!(
                    %peer,
                    transport = transport.as_str(),
                    reason,
                    len = request.len(),
                    formerr = reply.is_some(),
                    "dns message malformed"
                );
                reply
            }
        }
    }
}

// === sockets ===

/// A UDP socket and a TCP listener on the same port of `addr`'s IP, non-blocking.
fn bind(addr: SocketAddr) -> Result<(std::net::UdpSocket, std::net::TcpListener), DnsError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let udp = std::net::UdpSocket::bind(addr).map_err(|source| DnsError::Bind {
            transport: "udp",
            addr,
            source,
        })?;
        let tcp_addr = SocketAddr::new(addr.ip(), local_addr(&udp, "udp", addr)?.port());
        match std::net::TcpListener::bind(tcp_addr) {
            Ok(tcp) => {
                for (transport, result) in [
                    ("udp", udp.set_nonblocking(true)),
                    ("tcp", tcp.set_nonblocking(true)),
                ] {
                    result.map_err(|source| DnsError::Bind {
                        transport,
                        addr,
                        source,
                    })?;
                }
                return Ok((udp, tcp));
            }
            Err(error) if addr.port() == 0 && attempt < BIND_ATTEMPTS => {
                debug!(port = tcp_addr.port(), %error, "dns tcp port taken, trying another");
            }
            Err(source) => {
                return Err(DnsError::Bind {
                    transport: "tcp",
                    addr: tcp_addr,
                    source,
                });
            }
        }
    }
}

/// Either socket's local address, failures typed as a bind error.
fn local_addr(
    socket: &impl LocalAddr,
    transport: &'static str,
    addr: SocketAddr,
) -> Result<SocketAddr, DnsError> {
    socket.local_addr().map_err(|source| DnsError::Bind {
        transport,
        addr,
        source,
    })
}

/// `local_addr` of std and tokio sockets alike.
trait LocalAddr {
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

impl LocalAddr for std::net::UdpSocket {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        std::net::UdpSocket::local_addr(self)
    }
}

impl LocalAddr for std::net::TcpListener {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        std::net::TcpListener::local_addr(self)
    }
}

async fn serve_udp(socket: UdpSocket, shared: Arc<Shared>) {
    // One byte more than any datagram, so nothing is ever cut silently.
    let mut buf = vec![0u8; usize::from(u16::MAX) + 1];
    loop {
        let (len, peer) = match socket.recv_from(&mut buf).await {
            Ok(received) => received,
            Err(error) => {
                debug!(%error, "dns udp receive failed");
                sleep(SOCKET_ERROR_PAUSE).await;
                continue;
            }
        };
        let Some(reply) = shared.handle(&buf[..len], peer, Transport::Udp) else {
            continue;
        };
        if let Err(error) = socket.send_to(&reply, peer).await {
            debug!(%peer, %error, "dns udp send failed");
        }
    }
}

async fn serve_tcp(
    listener: TcpListener,
    shared: Arc<Shared>,
    connections_max: usize,
    idle_timeout: Duration,
) {
    let permits = Arc::new(Semaphore::new(connections_max));
    // Dropped with this task, which aborts every connection.
    let mut connections = JoinSet::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                debug!(%error, "dns tcp accept failed");
                sleep(SOCKET_ERROR_PAUSE).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            shared.metrics.tcp_rejected.inc();
            debug!(%peer, connections_max, "dns tcp connection refused: limit reached");
            continue;
        };
        let shared = shared.clone();
        connections.spawn(
            async move {
                serve_connection(stream, peer, &shared, idle_timeout).await;
                drop(permit);
            }
            .in_current_span(),
        );
    }
}

/// Length-prefixed queries (RFC 1035 §4.2.2) until the peer closes, errs or idles.
async fn serve_connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    idle_timeout: Duration,
) {
    let mut request = Vec::with_capacity(512);
    loop {
        let len = match timeout(idle_timeout, stream.read_u16()).await {
            Ok(Ok(len)) => len,
            Ok(Err(_closed)) => return,
            Err(_idle) => {
                trace!(%peer, "dns tcp connection idle, closing");
                return;
            }
        };
        request.resize(usize::from(len), 0);
        match timeout(idle_timeout, stream.read_exact(&mut request)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) | Err(_) => return,
        }
        let Some(reply) = shared.handle(&request, peer, Transport::Tcp) else {
            continue;
        };
        // TCP replies are encoded within 65 535 bytes, so the prefix always fits.
        let Ok(reply_len) = u16::try_from(reply.len()) else {
            return;
        };
        let mut framed = Vec::with_capacity(reply.len() + 2);
        framed.extend_from_slice(&reply_len.to_be_bytes());
        framed.extend_from_slice(&reply);
        match timeout(idle_timeout, stream.write_all(&framed)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return,
        }
    }
}
