//! The Delta client against the real ADS server over 127.0.0.1: subscribe, apply, ACK,
//! withdraw, NACK, reconnect after a restart, report a lost stream, and honour
//! reconnection admission's hint.
//!
//! Client progress is awaited on its watch channels. The server's sync registry has no
//! change notification, so server-side facts are awaited by bounded polling (`server_until`).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use crate::support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use support::views;

use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::google::protobuf::Any;
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Endpoint, Server};
use waymark_certs::testing::TestPki;
use waymark_certs::{IdentityKind, KindSet};
use waymark_core::view::{EndpointStatus, Markers, ReleasedView, ViewEndpoint};
use waymark_xds::admission::AdmissionConfig;
use waymark_xds::client::{
    Applied, BackoffConfig, ClientConfig, StreamError, StreamStatus, Subscription, Validator,
    XdsClient,
};
use waymark_xds::sync::ClientSync;
use waymark_xds::translate::{TYPE_CLUSTER, TYPE_ENDPOINT};
use waymark_xds::{Keepalive, Publisher, ServerConfig, SnapshotBuilder, XdsServer};

const WAIT: Duration = Duration::from_secs(10);
/// The port of the endpoint the validator in the NACK test refuses.
const POISON_PORT: u16 = 8009;

// === fixtures ===

fn ep(n: u8) -> ViewEndpoint {
    let addr = SocketAddr::from(([127, 0, 0, n], 8000 + u16::from(n)));
    views::endpoint(
        &format!("pay-{n}"),
        addr,
        "a",
        0,
        100,
        EndpointStatus::Eligible,
    )
}

fn released(version: u64, eps: &[u8]) -> ReleasedView {
    views::released(version, "a", eps.iter().map(|n| ep(*n)), Markers::default())
}

fn node(id: &str) -> Node {
    Node {
        id: id.to_owned(),
        locality: Some(Locality {
            zone: "a".to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn wildcard() -> Subscription {
    Subscription {
        wildcard: true,
        names: BTreeSet::new(),
    }
}

fn subscriptions() -> Vec<(String, Subscription)> {
    let pay = Subscription {
        wildcard: false,
        names: BTreeSet::from(["pay".to_owned()]),
    };
    vec![
        (TYPE_CLUSTER.to_owned(), wildcard()),
        (TYPE_ENDPOINT.to_owned(), pay),
    ]
}

fn fast_config() -> ClientConfig {
    ClientConfig {
        backoff: BackoffConfig {
            base: Duration::from_millis(20),
            cap: Duration::from_millis(200),
            ..BackoffConfig::default()
        },
        seed: 11,
        ..ClientConfig::default()
    }
}

fn ports(any: &Any) -> Vec<u16> {
    cla_ports(&ClusterLoadAssignment::decode(any.value.as_slice()).unwrap())
}

fn cla_ports(cla: &ClusterLoadAssignment) -> Vec<u16> {
    cla.endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(HostIdentifier::Endpoint(e)) => e.address.as_ref(),
            _ => None,
        })
        .filter_map(|a| match &a.address {
            Some(AddressKind::SocketAddress(s)) => match s.port_specifier {
                Some(PortSpecifier::PortValue(p)) => Some(p as u16),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn endpoint_ports(applied: &Applied) -> Option<Vec<u16>> {
    let (_, any) = applied.resources(TYPE_ENDPOINT)?.get("pay")?;
    Some(ports(any))
}

// === a server we can stop and restart on the same port ===

struct Running {
    server: XdsServer,
    publisher: Publisher,
    builder: SnapshotBuilder,
    stop: oneshot::Sender<()>,
    serving: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Running {
    async fn start(addr: SocketAddr, config: ServerConfig) -> (Self, SocketAddr) {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (server, publisher) = XdsServer::new(config);
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(
            Server::builder()
                .http2_keepalive_interval(Some(Duration::from_secs(5)))
                .http2_keepalive_timeout(Some(Duration::from_secs(5)))
                .add_service(server.service())
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        let running = Self {
            server,
            publisher,
            builder: SnapshotBuilder::new(),
            stop,
            serving,
        };
        (running, addr)
    }

    fn release(&mut self, view: &ReleasedView) {
        assert!(self.builder.handle_release(view));
        self.publisher.publish(self.builder.build());
    }

    /// Ending the snapshot feed ends every stream; then the listener closes.
    async fn stop(self) {
        drop(self.publisher);
        let _ = self.stop.send(());
        timeout(WAIT, self.serving).await.unwrap().unwrap().unwrap();
    }
}

fn client(
    addr: SocketAddr,
    id: &str,
    config: ClientConfig,
) -> (XdsClient, watch::Receiver<Arc<Applied>>) {
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).unwrap();
    XdsClient::connect_with(config, endpoint, node(id), subscriptions())
}

async fn until(
    rx: &mut watch::Receiver<Arc<Applied>>,
    what: &str,
    cond: impl Fn(&Applied) -> bool,
) -> Arc<Applied> {
    let waited = timeout(WAIT, rx.wait_for(|a| cond(a)))
        .await
        .map(|r| r.map(|applied| applied.clone()));
    match waited {
        Ok(Ok(applied)) => applied,
        Ok(Err(_)) => panic!("client stopped while waiting for {what}"),
        Err(_) => panic!(
            "timed out waiting for {what}; last: {}",
            summary(&rx.borrow())
        ),
    }
}

/// What a waiting test prints: counters and versions, not resource bytes.
fn summary(a: &Applied) -> String {
    let versions: Vec<(&str, &str)> = a
        .types
        .iter()
        .map(|(t, applied)| {
            (
                t.rsplit('.').next().unwrap_or(t),
                applied.system_version.as_str(),
            )
        })
        .collect();
    format!(
        "streams {}, updates {}, nacks {}, versions {versions:?}",
        a.streams, a.updates, a.nacks
    )
}

async fn server_until(
    server: &XdsServer,
    what: &str,
    cond: impl Fn(&[ClientSync]) -> bool,
) -> Vec<ClientSync> {
    waymark_testkit::until(what, WAIT, async || {
        let state = server.sync_state();
        if cond(&state) {
            Ok(state)
        } else {
            Err(format!("{state:?}"))
        }
    })
    .await
}

fn acked_all(state: &[ClientSync]) -> bool {
    state.len() == 1
        && [TYPE_CLUSTER, TYPE_ENDPOINT].iter().all(|t| {
            state[0]
                .types
                .get(*t)
                .is_some_and(|s| s.sent.is_some() && s.acked == s.sent)
        })
}

fn any_addr() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

// === tests ===

#[tokio::test]
async fn the_client_applies_clusters_and_endpoints_acks_them_and_sees_a_withdrawal() {
    // Goal: CDS and EDS arrive and are ACKed; a newer view without an endpoint removes it.
    let (mut running, addr) = Running::start(any_addr(), ServerConfig::default()).await;
    running.release(&released(1, &[1, 2]));
    let (_client, mut applied) = client(addr, "node-a", fast_config());

    let first = until(&mut applied, "endpoints of v1", |a| {
        endpoint_ports(a).is_some() && a.resources(TYPE_CLUSTER).is_some()
    })
    .await;
    assert_eq!(endpoint_ports(&first), Some(vec![8001, 8002]));
    assert_eq!(
        first
            .resources(TYPE_CLUSTER)
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["pay"]
    );
    assert_eq!(first.version(TYPE_ENDPOINT), Some("1"));
    assert_eq!(first.streams, 1);
    let state = server_until(&running.server, "both types acked", acked_all).await;
    assert_eq!(state[0].node_id, "node-a");
    assert_eq!(state[0].protocol, "delta");

    running.release(&released(2, &[1]));
    let second = until(&mut applied, "endpoints of v2", |a| {
        a.version(TYPE_ENDPOINT) == Some("2")
    })
    .await;
    assert_eq!(endpoint_ports(&second), Some(vec![8001]), "pay-2 withdrawn");
    assert_eq!(second.nacks, 0);
    server_until(&running.server, "v2 acked", |s| {
        acked_all(s) && s[0].types[TYPE_ENDPOINT].acked.as_deref() == Some("2")
    })
    .await;
    assert_eq!(running.server.stats().nacks.load(Ordering::Relaxed), 0);
    running.stop().await;
}

#[tokio::test]
async fn after_a_server_restart_the_client_reconnects_and_is_resent_only_what_changed() {
    // Goal: the reconnecting client names what it holds, so a restarted server with the
    // same snapshot sends nothing until something changes, and then only the change.
    let (mut running, addr) = Running::start(any_addr(), ServerConfig::default()).await;
    running.release(&released(1, &[1, 2]));
    let (_client, mut applied) = client(addr, "node-a", fast_config());
    until(&mut applied, "endpoints of v1", |a| {
        endpoint_ports(a).is_some()
    })
    .await;
    server_until(&running.server, "both types acked", acked_all).await;
    let updates_before = applied.borrow().updates;
    running.stop().await;

    let (mut restarted, same) = Running::start(addr, ServerConfig::default()).await;
    assert_eq!(same, addr);
    restarted.release(&released(1, &[1, 2]));
    let reconnected = until(&mut applied, "a second stream", |a| a.streams == 2).await;
    assert_eq!(
        reconnected.updates, updates_before,
        "nothing applied on reconnect"
    );
    assert_eq!(
        endpoint_ports(&reconnected),
        Some(vec![8001, 8002]),
        "state kept"
    );

    restarted.release(&released(2, &[1]));
    let changed = until(&mut applied, "endpoints of v2", |a| {
        a.version(TYPE_ENDPOINT) == Some("2")
    })
    .await;
    assert_eq!(endpoint_ports(&changed), Some(vec![8001]));
    assert_eq!(changed.updates, updates_before + 1);
    assert_eq!(
        restarted.server.stats().responses.load(Ordering::Relaxed),
        1,
        "only the changed load assignment was sent; the cluster was not resent"
    );
    let state = server_until(&restarted.server, "v2 acked", |s| {
        s.len() == 1
            && s[0]
                .types
                .get(TYPE_ENDPOINT)
                .is_some_and(|t| t.acked.as_deref() == Some("2"))
    })
    .await;
    assert!(
        !state[0].types.contains_key(TYPE_CLUSTER),
        "no cluster response"
    );
    restarted.stop().await;
}

/// Wait on the stream status channel for `cond`.
async fn status_until(
    rx: &mut watch::Receiver<StreamStatus>,
    what: &str,
    cond: impl Fn(&StreamStatus) -> bool,
) -> StreamStatus {
    let waited = timeout(WAIT, rx.wait_for(|s| cond(s)))
        .await
        .map(|r| r.map(|status| status.clone()));
    match waited {
        Ok(Ok(status)) => status,
        Ok(Err(_)) => panic!("client stopped while waiting for {what}"),
        Err(_) => panic!("timed out waiting for {what}; last: {:?}", *rx.borrow()),
    }
}

#[tokio::test]
async fn the_stream_status_reports_a_lost_stream_the_failed_attempts_and_the_reopen() {
    // Goal: a caller learns when its stream is lost (and when, and why), sees reconnect
    // attempts fail while the server is down, and sees the stream reopen, while the
    // applied state is kept throughout.
    let (mut running, addr) = Running::start(any_addr(), ServerConfig::default()).await;
    running.release(&released(1, &[1, 2]));
    let (client, mut applied) = client(addr, "node-a", fast_config());
    let mut status = client.stream_status();
    let open = status_until(&mut status, "the stream", StreamStatus::is_connected).await;
    assert_eq!((open.opened, open.error().is_none()), (1, true));
    until(&mut applied, "endpoints of v1", |a| {
        endpoint_ports(a).is_some()
    })
    .await;

    let stopping = tokio::time::Instant::now();
    running.stop().await;
    let lost = status_until(&mut status, "the loss", |s| s.lost_since().is_some()).await;
    let since = lost.lost_since().unwrap();
    assert!(since >= stopping && since <= tokio::time::Instant::now());
    assert!(lost.error().is_some(), "{lost:?}");
    assert!(!applied.borrow().connected, "published before the loss");
    let retrying = status_until(&mut status, "a failed reconnect", |s| {
        s.failed_attempts >= 1
    })
    .await;
    assert_eq!(
        retrying.lost_since(),
        Some(since),
        "the loss keeps its time"
    );
    assert!(matches!(
        retrying.error().map(|e| &**e),
        Some(StreamError::Connect(_))
    ));
    assert_eq!(
        endpoint_ports(&applied.borrow()),
        Some(vec![8001, 8002]),
        "kept while lost"
    );

    let (restarted, same) = Running::start(addr, ServerConfig::default()).await;
    assert_eq!(same, addr);
    let back = status_until(&mut status, "the reopen", StreamStatus::is_connected).await;
    assert_eq!(back.opened, 2);
    assert!(back.failed_attempts >= retrying.failed_attempts);
    assert_eq!(applied.borrow().streams, 2);
    drop(client);
    assert!(
        timeout(WAIT, status.changed()).await.unwrap().is_err(),
        "a dropped client ends the status channel"
    );
    restarted.stop().await;
}

#[tokio::test]
async fn a_resource_the_validator_refuses_is_nacked_and_the_applied_state_stays() {
    // Goal: an undecodable (here: unacceptable) assignment is NACKed as a whole, the server
    // records the NACK, and the client keeps serving the last good assignment.
    let (mut running, addr) = Running::start(any_addr(), ServerConfig::default()).await;
    running.release(&released(1, &[1, 2]));
    let validator: Validator = Arc::new(|type_url: &str, any: &Any| {
        if type_url != TYPE_ENDPOINT {
            return Ok(());
        }
        let cla = ClusterLoadAssignment::decode(any.value.as_slice()).map_err(|e| e.to_string())?;
        if cla_ports(&cla).contains(&POISON_PORT) {
            return Err(format!("endpoint port {POISON_PORT} refused"));
        }
        Ok(())
    });
    let config = ClientConfig {
        validator: Some(validator),
        ..fast_config()
    };
    let (_client, mut applied) = client(addr, "node-a", config);
    until(&mut applied, "endpoints of v1", |a| {
        endpoint_ports(a).is_some()
    })
    .await;
    server_until(&running.server, "both types acked", acked_all).await;

    running.release(&released(2, &[1, 2, 9]));
    let rejected = until(&mut applied, "a NACK", |a| a.nacks == 1).await;
    assert_eq!(endpoint_ports(&rejected), Some(vec![8001, 8002]), "v1 kept");
    assert_eq!(rejected.version(TYPE_ENDPOINT), Some("1"));
    let (nacked_type, reason) = rejected.last_nack.clone().unwrap();
    assert_eq!(nacked_type, TYPE_ENDPOINT);
    assert!(reason.contains("8009"), "{reason}");

    let state = server_until(&running.server, "the NACK recorded", |s| {
        s.len() == 1
            && s[0]
                .types
                .get(TYPE_ENDPOINT)
                .is_some_and(|t| t.last_nack.is_some())
    })
    .await;
    let eds = &state[0].types[TYPE_ENDPOINT];
    let (version, error) = eds.last_nack.clone().unwrap();
    assert_eq!(version, "2");
    assert!(error.contains("8009"), "{error}");
    assert_eq!(eds.acked.as_deref(), Some("1"), "the acked version stays");

    // A fixed view is accepted again.
    running.release(&released(3, &[1]));
    let fixed = until(&mut applied, "endpoints of v3", |a| {
        a.version(TYPE_ENDPOINT) == Some("3")
    })
    .await;
    assert_eq!(endpoint_ports(&fixed), Some(vec![8001]));
    running.stop().await;
}

#[tokio::test]
async fn a_client_refused_by_admission_waits_out_the_retry_hint() {
    // Goal: with a backoff far shorter than the hint, a client that ignored the hint would
    // be refused again and again; one that honours it is refused once (twice at most: the
    // server truncates its hint to whole milliseconds, so the retry can land a fraction
    // of a millisecond before the window rolls).
    let admission = AdmissionConfig {
        floor: 1,
        window: Duration::from_millis(600),
        ..AdmissionConfig::default()
    };
    let config = ServerConfig {
        admission,
        ..ServerConfig::default()
    };
    let (mut running, addr) = Running::start(any_addr(), config).await;
    running.release(&released(1, &[1]));
    let tiny = ClientConfig {
        backoff: BackoffConfig {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(5),
            ..BackoffConfig::default()
        },
        ..ClientConfig::default()
    };
    let (_first, mut first_applied) = client(addr, "node-a", tiny.clone());
    until(&mut first_applied, "the first client's stream", |a| {
        a.streams == 1
    })
    .await;

    let (_second, mut second_applied) = client(addr, "node-b", tiny);
    let admitted = until(&mut second_applied, "the second client's endpoints", |a| {
        endpoint_ports(a).is_some()
    })
    .await;
    assert_eq!(admitted.streams, 1);
    let refused = running
        .server
        .stats()
        .refused_streams
        .load(Ordering::Relaxed);
    assert!((1..=2).contains(&refused), "refused {refused} times");
    running.stop().await;
}

/// A TCP proxy that can black-hole every connection it holds: bytes stop flowing both
/// ways but no socket is closed (no FIN, no RST), as when a middlebox drops a flow.
/// Connections accepted after the cut are forwarded normally.
struct Proxy {
    addr: SocketAddr,
    cut: watch::Sender<u64>,
    accepting: JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind(any_addr()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, epochs) = watch::channel(0u64);
        let accepting = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let Ok(up) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let born = *epochs.borrow();
                let (down_r, down_w) = down.into_split();
                let (up_r, up_w) = up.into_split();
                tokio::spawn(pump(down_r, up_w, epochs.clone(), born));
                tokio::spawn(pump(up_r, down_w, epochs.clone(), born));
            }
        });
        Self {
            addr,
            cut,
            accepting,
        }
    }

    fn black_hole_existing(&self) {
        self.cut.send_modify(|e| *e += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut epochs: watch::Receiver<u64>,
    born: u64,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let cut = tokio::select! {
            true = cut_after(&mut epochs, born) => true,
            n = from.read(&mut buf) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if to.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    false
                }
            },
        };
        if cut {
            // Hold both halves open and silent until the proxy goes away.
            while epochs.changed().await.is_ok() {}
            return;
        }
    }
}

/// Whether connections born at `born` have been cut (`false` once the proxy is gone).
async fn cut_after(epochs: &mut watch::Receiver<u64>, born: u64) -> bool {
    epochs.wait_for(|e| *e > born).await.is_ok()
}

#[tokio::test]
async fn a_black_holed_connection_is_detected_by_keepalive_and_the_client_reconnects() {
    // Goal: with no FIN or RST, only HTTP/2 keepalive notices the dead connection; the
    // client must reconnect within two keepalive intervals plus the timeout (and backoff).
    let (mut running, addr) = Running::start(any_addr(), ServerConfig::default()).await;
    running.release(&released(1, &[1, 2]));
    let proxy = Proxy::start(addr).await;
    let keepalive = Duration::from_millis(300);
    let config = ClientConfig {
        keepalive_interval: keepalive,
        keepalive_timeout: keepalive,
        ..fast_config()
    };
    let backoff_cap = config.backoff.cap;
    let (_client, mut applied) = client(proxy.addr, "node-a", config);
    until(&mut applied, "endpoints of v1", |a| {
        endpoint_ports(a).is_some()
    })
    .await;

    proxy.black_hole_existing();
    let cut_at = tokio::time::Instant::now();
    until(&mut applied, "a second stream", |a| a.streams == 2).await;
    let detected = cut_at.elapsed();
    // Scheduling slack on a busy machine: one more second.
    let bound = 2 * keepalive + keepalive + backoff_cap + Duration::from_secs(1);
    assert!(
        detected <= bound,
        "reconnected after {detected:?} > {bound:?}"
    );

    running.release(&released(2, &[1]));
    let after = until(&mut applied, "endpoints of v2", |a| {
        a.version(TYPE_ENDPOINT) == Some("2")
    })
    .await;
    assert_eq!(endpoint_ports(&after), Some(vec![8001]));
    // Not `stop()`: the server's side of the black-holed connection would hold a graceful
    // shutdown until the server's own keepalive gives up on it.
    drop(proxy);
}

#[tokio::test]
async fn a_resource_filter_hides_a_service_from_clients_it_does_not_admit() {
    // Resolution authorisation: only `web-*` nodes may see `pay`.
    let filter = waymark_xds::server::ResourceFilter::new(|client, _type_url, name| {
        name != "pay" || client.node_id.starts_with("web-")
    });
    let config = ServerConfig {
        filter: Some(filter),
        ..ServerConfig::default()
    };
    let (mut server, addr) = Running::start("127.0.0.1:0".parse().unwrap(), config).await;
    server.release(&released(1, &[1, 2]));
    // A second service everyone may see, so the refused client gets a CDS response.
    let mut ledger = released(1, &[3]);
    ledger.view.key.service = "ledger".parse().unwrap();
    server.release(&ledger);
    let (_web, mut web_rx) = client(addr, "web-1", ClientConfig::default());
    let (_batch, mut batch_rx) = client(addr, "batch-1", ClientConfig::default());
    until(&mut web_rx, "web sees pay", |a| endpoint_ports(a).is_some()).await;
    let batch = until(&mut batch_rx, "batch gets the ledger cluster", |a| {
        a.resources(TYPE_CLUSTER)
            .is_some_and(|c| c.contains_key("ledger"))
    })
    .await;
    assert!(
        batch
            .resources(TYPE_CLUSTER)
            .is_none_or(|c| !c.contains_key("pay")),
        "a client the filter refuses sees the cluster: {}",
        summary(&batch)
    );
    assert!(endpoint_ports(&batch).is_none());
    server.stop().await;
}

// === a standby stream over mutual TLS ===

const TD: &str = "mesh.test";
/// A window no test outlives: each server lets in its first arrival and refuses the rest.
const LONG_WINDOW: Duration = Duration::from_secs(3_600);

/// An authority member serving ADS over mutual TLS, admitting one arrival per window.
struct Member {
    server: XdsServer,
    publisher: Publisher,
    builder: SnapshotBuilder,
    stop: oneshot::Sender<()>,
    serving: JoinHandle<()>,
    addr: SocketAddr,
}

impl Member {
    async fn start(pki: &TestPki, name: &str) -> Self {
        let who = format!("region/eu/authority/{name}");
        let tls = pki.server(&who, pki.policy(KindSet::only(IdentityKind::Node)));
        let config = ServerConfig {
            admission: AdmissionConfig {
                floor: 1,
                window: LONG_WINDOW,
                ..AdmissionConfig::default()
            },
            ..ServerConfig::default()
        };
        let listener = TcpListener::bind(any_addr()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (server, publisher) = XdsServer::new(config);
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(server.clone().serve_tls(
            listener,
            tls,
            Keepalive::default(),
            async {
                let _ = stopped.await;
            },
        ));
        Self {
            server,
            publisher,
            builder: SnapshotBuilder::new(),
            stop,
            serving,
            addr,
        }
    }

    fn release(&mut self, view: &ReleasedView) {
        assert!(self.builder.handle_release(view));
        self.publisher.publish(self.builder.build());
    }

    /// Ends every stream and closes the listener, as a member that dies does.
    async fn stop(self) {
        drop(self.publisher);
        let _ = self.stop.send(());
        timeout(WAIT, self.serving).await.unwrap().unwrap();
    }

    fn stat(&self, f: impl Fn(&waymark_xds::server::XdsStats) -> &AtomicU64) -> u64 {
        f(self.server.stats()).load(Ordering::Relaxed)
    }
}

/// A node agent's client over mutual TLS to `members`, starting at the first.
fn node_client(
    pki: &TestPki,
    id: &str,
    members: &[&Member],
    standby: bool,
) -> (XdsClient, watch::Receiver<Arc<Applied>>) {
    let who = format!("region/eu/node/{id}");
    let tls = pki.client(&who, pki.policy(KindSet::only(IdentityKind::Authority)));
    let config = ClientConfig {
        tls: Some(tls),
        standby,
        seed: 0,
        ..fast_config()
    };
    let endpoints = members
        .iter()
        .map(|m| Endpoint::from_shared(format!("http://{}", m.addr)).unwrap())
        .collect();
    XdsClient::connect_any(config, endpoints, node(id), subscriptions())
}

/// `node/<id>`'s client to `members` (starting at the first), once it holds v1 of `pay`.
async fn following(
    pki: &TestPki,
    id: &str,
    members: &[&Member],
    standby: bool,
) -> (XdsClient, watch::Receiver<Arc<Applied>>) {
    let (client, mut applied) = node_client(pki, id, members, standby);
    until(&mut applied, &format!("{id} holding v1"), |a| {
        endpoint_ports(a) == Some(vec![8001, 8002])
    })
    .await;
    (client, applied)
}

/// Both members serve `pay` at v1; `node/n1` follows it from `a`.
async fn two_members(pki: &TestPki) -> (Member, Member) {
    let mut a = Member::start(pki, "a1").await;
    let mut b = Member::start(pki, "a2").await;
    a.release(&released(1, &[1, 2]));
    b.release(&released(1, &[1, 2]));
    (a, b)
}

#[tokio::test]
async fn a_standby_stream_takes_over_at_once_when_the_active_member_dies() {
    // Goal: ADR-13 caps arrivals, and a member that dies sends all its clients to the
    // others at once. A node agent holding a standby stream at a second member is not
    // arriving there: its new stream opens beside the standby and is let in although
    // that member's window is full (the standby itself filled it), and the client is
    // current again without waiting out a retry hint.
    let pki = TestPki::new(TD, &["eu"]);
    let (a, mut b) = two_members(&pki).await;
    let (client, mut applied) = following(&pki, "n1", &[&a, &b], true).await;
    // The standby at b: a stream that subscribes to nothing and is sent nothing.
    let standby = server_until(&b.server, "the standby open at b", |s| s.len() == 1).await;
    assert!(
        standby[0].types.values().all(|t| t.sent.is_none()),
        "{standby:?}"
    );
    assert_eq!(
        standby[0].identity.as_deref(),
        Some("spiffe://mesh.test/region/eu/node/n1")
    );
    let mut status = client.stream_status();
    timeout(WAIT, status.wait_for(|s| s.standby))
        .await
        .expect("the client reports its standby")
        .unwrap();

    a.stop().await;
    b.release(&released(2, &[1]));
    let moved = until(&mut applied, "v2 from b", |a| {
        a.version(TYPE_ENDPOINT) == Some("2")
    })
    .await;
    assert_eq!(endpoint_ports(&moved), Some(vec![8001]));
    assert_eq!(moved.streams, 2, "one stream at a, then one at b");
    assert_eq!(b.stat(|s| &s.beside_streams), 1);
    assert_eq!(b.stat(|s| &s.refused_streams), 0);
    // The standby closed once the new stream was up: b holds the one active stream.
    server_until(&b.server, "only the active stream at b", |s| {
        s.len() == 1
            && s[0]
                .types
                .get(TYPE_ENDPOINT)
                .is_some_and(|t| t.acked.is_some())
    })
    .await;
    let status = client.stream_status().borrow().clone();
    assert!(status.is_connected(), "{status:?}");
    assert_eq!(status.failed_attempts, 0, "{status:?}");
    assert_eq!(status.promotions, 1, "{status:?}");
    drop(client);
    b.stop().await;
}

#[tokio::test]
async fn without_a_standby_the_displaced_client_waits_out_the_members_window() {
    // Goal: the control for the test above. The same client with no standby arrives at b
    // as a new client, b's window is full (another node got the one place), and b turns
    // it away with a retry hint — so its view stays at v1.
    let pki = TestPki::new(TD, &["eu"]);
    let (a, mut b) = two_members(&pki).await;
    let (_other, _) = following(&pki, "n2", &[&b, &a], false).await;
    let (client, applied) = following(&pki, "n1", &[&a, &b], false).await;
    assert_eq!(b.server.sync_state().len(), 1, "no standby: only n2 at b");

    a.stop().await;
    b.release(&released(2, &[1]));
    waymark_testkit::until("b refusing n1", WAIT, async || {
        let refused = b.stat(|s| &s.refused_streams);
        if refused >= 1 {
            Ok(())
        } else {
            Err(format!("refused {refused}"))
        }
    })
    .await;
    assert_eq!(b.stat(|s| &s.beside_streams), 0);
    assert_eq!(applied.borrow().version(TYPE_ENDPOINT), Some("1"));
    assert!(!client.stream_status().borrow().is_connected());
    drop(client);
    b.stop().await;
}
