//! The agent's DNS server under hostile TCP and UDP clients: connections over the cap are
//! closed at once and counted, a connection that never completes a query is closed after
//! the idle timeout, an oversized datagram is dropped, and the server answers on.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use waymark_agent::node::dns::{DnsConfig, DnsServer, DnsTable};

/// How long a test waits for the server to do what it must; a failure, never a pace.
const GUARD: Duration = Duration::from_secs(30);

/// A query for `web.service.waymark. A`, with id `id`.
fn query(id: u16) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in ["web", "service", "waymark"] {
        q.push(u8::try_from(label.len()).unwrap());
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

async fn start(config: DnsConfig) -> (DnsServer, Registry) {
    let table = Arc::new(ArcSwap::from_pointee(DnsTable::build(std::iter::empty())));
    let mut registry = Registry::default();
    let server = DnsServer::start(config, table, &mut registry).unwrap();
    (server, registry)
}

/// One query over `s`; the answer's id.
async fn tcp_query(s: &mut TcpStream, id: u16) -> u16 {
    let q = query(id);
    let mut framed = u16::try_from(q.len()).unwrap().to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    s.write_all(&framed).await.unwrap();
    let len = tokio::time::timeout(GUARD, s.read_u16())
        .await
        .expect("an answer")
        .unwrap();
    let mut reply = vec![0u8; usize::from(len)];
    s.read_exact(&mut reply).await.unwrap();
    u16::from_be_bytes([reply[0], reply[1]])
}

async fn closed(s: &mut TcpStream) {
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(GUARD, s.read(&mut buf))
        .await
        .expect("the server closes the connection");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

async fn udp_answers(addr: SocketAddr, id: u16) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(&query(id), addr).await.unwrap();
    let mut buf = [0u8; 1500];
    let (len, _) = tokio::time::timeout(GUARD, socket.recv_from(&mut buf))
        .await
        .expect("a UDP answer")
        .unwrap();
    assert!(len >= 12);
    assert_eq!(u16::from_be_bytes([buf[0], buf[1]]), id);
}

fn metric(registry: &Registry, name: &str) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn tcp_connections_over_the_cap_are_closed_at_once_and_counted() {
    let (server, registry) = start(DnsConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        tcp_connections_max: 2,
        ..DnsConfig::default()
    })
    .await;
    let addr = server.tcp_local_addr();
    let mut held = Vec::new();
    for id in 1..=2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert_eq!(tcp_query(&mut s, id).await, id);
        held.push(s);
    }
    let mut over = TcpStream::connect(addr).await.unwrap();
    closed(&mut over).await;
    assert_eq!(
        metric(&registry, "waymark_dns_tcp_rejected_total"),
        "waymark_dns_tcp_rejected_total 1"
    );
    // Those already served go on being served, and UDP is untouched.
    assert_eq!(tcp_query(&mut held[0], 7).await, 7);
    udp_answers(server.udp_local_addr(), 8).await;
}

#[tokio::test]
async fn a_tcp_client_that_never_completes_a_query_is_closed_after_the_idle_timeout() {
    let (server, _registry) = start(DnsConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        tcp_idle_timeout: Duration::from_millis(300),
        ..DnsConfig::default()
    })
    .await;
    let addr = server.tcp_local_addr();
    // Announces the largest message the framing allows, then sends a few bytes of it.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(&[0xff, 0xff, 0x12, 0x34]).await.unwrap();
    closed(&mut slow).await;
    // One that sends nothing at all.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    closed(&mut silent).await;
    let mut fine = TcpStream::connect(addr).await.unwrap();
    assert_eq!(tcp_query(&mut fine, 9).await, 9);
}

#[tokio::test]
async fn an_oversized_or_malformed_datagram_is_dropped_and_counted_and_the_server_answers_on() {
    let (server, registry) = start(DnsConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        ..DnsConfig::default()
    })
    .await;
    let addr = server.udp_local_addr();
    let junk = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    junk.send_to(&vec![0xAB; 60_000], addr).await.unwrap();
    junk.send_to(b"\x00", addr).await.unwrap();
    udp_answers(addr, 42).await;
    let malformed = metric(&registry, "waymark_dns_malformed_total");
    assert!(
        !malformed.is_empty() && !malformed.ends_with(" 0"),
        "{malformed}"
    );
}
