//! The shared HTTP listener against real sockets: a client that never finishes its headers
//! is cut off, a connection over the cap is refused with a 503 and counted, a request over
//! its deadline is answered 408 and counted, and the listener goes on serving through all
//! of it. Over TLS: the router sees the client's verified identity, and a client without a
//! certificate or that never finishes its handshake is cut off and counted.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

/// How long a test waits for the server to do what it must; a failure, never a pace.
const GUARD: Duration = Duration::from_secs(30);

fn router() -> Router {
    Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route("/never", get(std::future::pending::<&'static str>))
}

async fn start(limits: HttpLimits) -> (SocketAddr, HttpMetrics, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = HttpMetrics::default();
    let task = tokio::spawn(serve(
        listener,
        "test",
        router(),
        limits,
        metrics.clone(),
        std::future::pending(),
    ));
    (addr, metrics, task)
}

/// One request on a fresh connection; the whole answer as text.
async fn get_text(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(GUARD, s.read_to_string(&mut out))
        .await
        .expect("the server answers")
        .unwrap();
    out
}

/// Reads until the server closes the connection; what it sent before.
async fn until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(GUARD, s.read_to_end(&mut out))
        .await
        .expect("the server closes the connection")
        .unwrap_or_default();
    out
}

fn labels() -> ListenerLabels {
    ListenerLabels { listener: "test" }
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let limits = HttpLimits {
        header_read_timeout: Duration::from_millis(200),
        ..HttpLimits::LOCAL
    };
    let (addr, _, _task) = start(limits).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    until_closed(&mut slow).await;
    // An idle keep-alive connection that never sends anything is closed the same way.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    until_closed(&mut idle).await;
    assert!(get_text(addr, "/ok").await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn a_connection_over_the_cap_is_refused_with_503_and_counted() {
    let limits = HttpLimits {
        connections_max: 1,
        ..HttpLimits::LOCAL
    };
    let (addr, metrics, _task) = start(limits).await;
    // The one permitted connection, proven accepted by a request answered on it.
    let mut held = TcpStream::connect(addr).await.unwrap();
    held.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 12];
    held.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");

    let mut refused = TcpStream::connect(addr).await.unwrap();
    let answer = String::from_utf8(until_closed(&mut refused).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("too_many_connections"), "{answer}");
    assert_eq!(
        metrics.connections_refused.get_or_create(&labels()).get(),
        1
    );

    // Freeing the slot lets the next client in: the listener is still serving.
    drop(held);
    let served = tokio::time::timeout(GUARD, async {
        loop {
            let answer = get_text(addr, "/ok").await;
            if answer.starts_with("HTTP/1.1 200") {
                return answer;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("a freed slot is reused");
    assert!(served.ends_with("ok"), "{served}");
}

#[tokio::test]
async fn a_request_over_its_deadline_is_answered_408_and_counted() {
    let limits = HttpLimits {
        request_timeout: Duration::from_millis(100),
        ..HttpLimits::LOCAL
    };
    let (addr, metrics, _task) = start(limits).await;
    let answer = get_text(addr, "/never").await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert_eq!(metrics.requests_timed_out.get_or_create(&labels()).get(), 1);
    assert!(get_text(addr, "/ok").await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn a_request_held_on_purpose_is_timed_from_the_end_of_its_hold() {
    // A handler that holds its request (as a blocking query does) outlives the base
    // timeout; past its hold plus the timeout it is answered 408 all the same.
    let timeout = Duration::from_millis(100);
    let held = |hold: Duration, sleep: Duration| {
        move |axum::Extension(d): axum::Extension<RequestDeadline>| async move {
            d.hold_until(tokio::time::Instant::now() + hold);
            tokio::time::sleep(sleep).await;
            "held"
        }
    };
    let router = Router::new()
        .route(
            "/held",
            get(held(Duration::from_millis(400), Duration::from_millis(300))),
        )
        .route(
            "/over",
            get(held(Duration::from_millis(200), Duration::from_secs(60))),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = HttpMetrics::default();
    let limits = HttpLimits {
        request_timeout: timeout,
        ..HttpLimits::LOCAL
    };
    let _task = tokio::spawn(serve(
        listener,
        "test",
        router,
        limits,
        metrics.clone(),
        std::future::pending(),
    ));
    let answer = get_text(addr, "/held").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("held"), "{answer}");
    let start = tokio::time::Instant::now();
    let answer = get_text(addr, "/over").await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(metrics.requests_timed_out.get_or_create(&labels()).get(), 1);
}

#[tokio::test]
async fn headers_over_the_cap_are_refused_with_431() {
    let (addr, _, _task) = start(HttpLimits::LOCAL).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let big = "a".repeat(HttpLimits::LOCAL.head_bytes_max + 1);
    let req = format!("GET /ok HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\n\r\n");
    let _ = s.write_all(req.as_bytes()).await;
    let answer = String::from_utf8_lossy(&until_closed(&mut s).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(get_text(addr, "/ok").await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn shutdown_stops_accepting_and_returns() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(
        listener,
        "test",
        router(),
        HttpLimits::LOCAL,
        HttpMetrics::default(),
        async move {
            let _ = rx.await;
        },
    ));
    assert!(get_text(addr, "/ok").await.starts_with("HTTP/1.1 200"));
    // An idle keep-alive connection does not hold shutdown up.
    let _idle = TcpStream::connect(addr).await.unwrap();
    tx.send(()).unwrap();
    tokio::time::timeout(GUARD, task)
        .await
        .expect("serve returns")
        .unwrap();
}

// === TLS ===

mod tls {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use axum::Extension;
    use tokio_rustls::TlsConnector;
    use waymark_certs::ca::RootCa;
    use waymark_certs::material::{MaterialPem, validate_material};
    use waymark_certs::tls::{LiveMaterial, client_config, server_config};
    use waymark_certs::{CertMetrics, Identity, IdentityKind, KindSet, Name, PeerPolicy};

    use super::*;

    const TD: &str = "listener.test";

    /// Material for `path` (`region/eu/…`) under a fresh estate `root`.
    fn material(root: &RootCa, path: &str) -> Arc<LiveMaterial> {
        let now = SystemTime::now();
        let region = root.issue_region(Name::new("eu").unwrap(), now).unwrap();
        let identity = Identity::parse(&format!("spiffe://{TD}/{path}")).unwrap();
        let leaf = region
            .issue(&identity, now, Duration::from_secs(24 * 3600))
            .unwrap();
        let chain = leaf.fullchain_pem();
        let pem = MaterialPem {
            cert_chain: chain.as_bytes(),
            key: leaf.key_pem.as_bytes(),
            bundle: root.cert_pem().as_bytes(),
        };
        LiveMaterial::new(validate_material(pem, &policy(KindSet::ALL), now).unwrap())
    }

    fn policy(accepted: KindSet) -> PeerPolicy {
        PeerPolicy {
            trust_domain: root_td(),
            accepted,
            region: None,
        }
    }

    fn root_td() -> waymark_certs::TrustDomain {
        waymark_certs::TrustDomain::new(TD).unwrap()
    }

    fn whoami() -> Router {
        Router::new().route(
            "/whoami",
            get(|peer: Option<Extension<PeerInfo>>| async move {
                peer.map_or_else(
                    || "nobody".to_owned(),
                    |Extension(p)| p.identity.to_string(),
                )
            }),
        )
    }

    async fn start_tls(
        limits: HttpLimits,
    ) -> (SocketAddr, HttpMetrics, RootCa, tokio::task::JoinHandle<()>) {
        waymark_certs::install_crypto_provider();
        let root = RootCa::generate(root_td(), SystemTime::now()).unwrap();
        let live = material(&root, "region/eu/authority/1");
        let only = policy(KindSet::only(IdentityKind::Authority));
        let config = server_config(&live, only, CertMetrics::new(), &[ALPN_HTTP1]).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = HttpMetrics::default();
        let task = tokio::spawn(serve_tls(
            listener,
            "test",
            whoami(),
            limits,
            metrics.clone(),
            Arc::new(config),
            std::future::pending(),
        ));
        (addr, metrics, root, task)
    }

    /// `GET /whoami` over TLS with `config`: the whole answer, or the error that ended it.
    async fn get_whoami(
        addr: SocketAddr,
        config: Arc<rustls::ClientConfig>,
    ) -> std::io::Result<String> {
        let tcp = TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut s = TlsConnector::from(config).connect(name, tcp).await?;
        s.write_all(b"GET /whoami HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await?;
        let mut out = String::new();
        tokio::time::timeout(GUARD, s.read_to_string(&mut out))
            .await
            .expect("the server answers or closes")?;
        Ok(out)
    }

    async fn until_counted(metrics: &HttpMetrics, reason: &'static str) {
        tokio::time::timeout(GUARD, async {
            while metrics.handshakes_failed("test", reason) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("a {reason} handshake failure is counted"));
        assert_eq!(metrics.handshakes_failed("test", reason), 1);
    }

    #[tokio::test]
    async fn the_router_sees_the_verified_client_and_a_client_without_a_certificate_is_cut_off() {
        let (addr, metrics, root, _task) = start_tls(HttpLimits::LOCAL).await;
        let client = material(&root, "region/eu/authority/2");
        let servers = policy(KindSet::only(IdentityKind::Authority));
        let config =
            client_config(&client, servers.clone(), CertMetrics::new(), &[ALPN_HTTP1]).unwrap();
        let answer = get_whoami(addr, Arc::new(config)).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer.ends_with(&format!("spiffe://{TD}/region/eu/authority/2")),
            "{answer}"
        );

        // The same client without its certificate gets no answer, only a closed connection.
        let verifier =
            waymark_certs::verify::PeerVerifier::new(client, servers, CertMetrics::new());
        let mut anonymous = rustls::ClientConfig::builder_with_provider(waymark_certs::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        anonymous.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        let refused = get_whoami(addr, Arc::new(anonymous)).await;
        assert!(
            refused
                .as_ref()
                .map_or(true, |a| !a.starts_with("HTTP/1.1")),
            "{refused:?}"
        );
        until_counted(&metrics, "no_certificate").await;
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_handshake_is_cut_off_and_counted() {
        let limits = HttpLimits {
            handshake_timeout: Duration::from_millis(200),
            ..HttpLimits::LOCAL
        };
        let (addr, metrics, _root, _task) = start_tls(limits).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        until_closed(&mut silent).await;
        until_counted(&metrics, "timeout").await;
    }
}
