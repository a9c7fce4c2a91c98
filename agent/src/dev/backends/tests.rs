//! Each mode observed through real sockets on 127.0.0.1, plus the control API's refusals.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util_client::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tower::ServiceExt;
use waymark_core::model::{DependencyStatus, SelfReport};
use waymark_core::units::Permille;

use super::instance::{flap_up, reports_for, spread_fails};
use super::*;

/// Guards against a hang only; no test asserts speed.
const HANG_GUARD: Duration = Duration::from_secs(20);

type Reports = mpsc::UnboundedReceiver<(String, SelfReport)>;

fn spec(instance: &str) -> BackendSpec {
    BackendSpec {
        instance: instance.to_owned(),
        service: "checkout".to_owned(),
        zone: "zone-a".to_owned(),
        bind: "127.0.0.1:0".parse().unwrap(),
    }
}

/// Short delays so the tests run quickly; reports only on changes (and the first tick).
fn options() -> BackendOptions {
    BackendOptions {
        slow_delay: Duration::from_millis(200),
        flap_period: Duration::from_millis(200),
        report_interval: Duration::from_secs(3600),
        ..BackendOptions::default()
    }
}

fn start_with(instances: &[&str], options: BackendOptions) -> (Backends, Reports) {
    let (tx, rx) = mpsc::unbounded_channel();
    // Unbounded: the test drains it, and at most a few reports per mode change arrive.
    let sink: SelfReportFn = Arc::new(move |instance: &str, report| {
        let _ = tx.send((instance.to_owned(), report));
    });
    let specs = instances.iter().map(|i| spec(i)).collect();
    (Backends::start(specs, options, sink).unwrap(), rx)
}

fn start(instances: &[&str]) -> (Backends, Reports) {
    start_with(instances, options())
}

fn addr(backends: &Backends, instance: &str) -> SocketAddr {
    backends.addresses()[instance]
}

/// One `GET` over a fresh connection: the status and the body.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(StatusCode, String)> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let request = Request::get(path)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(std::io::Error::other)?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Waits for `instance`'s first report matching `want`, skipping others.
async fn expect_report(reports: &mut Reports, instance: &str, want: &SelfReport) {
    let found = tokio::time::timeout(HANG_GUARD, async {
        while let Some((from, report)) = reports.recv().await {
            if from == instance && &report == want {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "no {want:?} from {instance}");
}

/// A request to the control API: the status and the JSON body.
async fn call(router: &axum::Router, method: Method, uri: &str, body: &str) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

fn dependency(status: DependencyStatus) -> SelfReport {
    SelfReport::Dependency {
        name: "db".to_owned(),
        status,
    }
}

#[tokio::test]
async fn healthy_backend_answers_traffic_and_probes_and_reports_ready() {
    let (backends, mut reports) = start(&["a-1"]);
    let a = addr(&backends, "a-1");

    let (status, body) = get(a, "/checkout/cart").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["instance"], "a-1");
    assert_eq!(body["service"], "checkout");
    assert_eq!(body["zone"], "zone-a");
    assert_eq!(body["mode"], "healthy");
    assert_eq!(get(a, HEALTH_PATH).await.unwrap().0, StatusCode::OK);
    assert_eq!(get(a, READY_PATH).await.unwrap().0, StatusCode::OK);
    expect_report(&mut reports, "a-1", &SelfReport::Ready).await;

    let status = &backends.status()[0];
    assert_eq!((status.served, status.failed, status.probes), (1, 0, 2));
    backends.shutdown().await;
}

#[tokio::test]
async fn fail_hard_refuses_connections_and_healthy_rebinds_the_same_port() {
    let (backends, _reports) = start(&["a-1", "a-2"]);
    let before = backends.addresses();
    let a = before["a-1"];

    backends.set_mode("a-1", Mode::FailHard).unwrap();
    let refused = TcpStream::connect(a).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    // The neighbour is untouched.
    assert_eq!(get(before["a-2"], "/").await.unwrap().0, StatusCode::OK);
    assert_eq!(backends.modes()["a-1"], Mode::FailHard);

    backends.set_mode("a-1", Mode::Healthy).unwrap();
    assert_eq!(backends.addresses(), before);
    assert_eq!(get(a, "/").await.unwrap().0, StatusCode::OK);
    assert_eq!(get(a, HEALTH_PATH).await.unwrap().0, StatusCode::OK);
    backends.shutdown().await;
}

#[tokio::test]
async fn fail_hard_closes_connections_already_open() {
    let (backends, _reports) = start(&["a-1"]);
    let a = addr(&backends, "a-1");
    let stream = TcpStream::connect(a).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let request = Request::get("/")
        .header(http::header::HOST, a.to_string())
        .body(Empty::<Bytes>::new())
        .unwrap();
    assert_eq!(
        sender.send_request(request).await.unwrap().status(),
        StatusCode::OK
    );

    backends.set_mode("a-1", Mode::FailHard).unwrap();
    // The kept-alive connection ends (the server closes it) instead of serving on.
    let ended = tokio::time::timeout(HANG_GUARD, conn).await;
    assert!(ended.is_ok(), "the open connection outlived the listener");
    backends.shutdown().await;
}

#[tokio::test]
async fn slow_backend_passes_probes_but_delays_and_fails_traffic() {
    let (backends, mut reports) = start(&["a-1"]);
    let a = addr(&backends, "a-1");
    backends.set_mode("a-1", Mode::Slow).unwrap();
    expect_report(&mut reports, "a-1", &SelfReport::Ready).await;

    assert_eq!(get(a, HEALTH_PATH).await.unwrap().0, StatusCode::OK);
    assert_eq!(get(a, READY_PATH).await.unwrap().0, StatusCode::OK);
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let started = tokio::time::Instant::now();
        statuses.push(get(a, "/").await.unwrap().0);
        assert!(started.elapsed() >= options().slow_delay);
    }
    statuses.sort();
    // 500 ‰ spread evenly: of two consecutive requests exactly one fails.
    assert_eq!(statuses, [StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE]);
    let status = &backends.status()[0];
    assert_eq!((status.served, status.failed), (1, 1));
    backends.shutdown().await;
}

#[tokio::test]
async fn flapping_backend_alternates_its_probe_answer() {
    let (backends, _reports) = start(&["a-1"]);
    let a = addr(&backends, "a-1");
    backends.set_mode("a-1", Mode::Flap).unwrap();

    // Real time: a paused clock would auto-advance by the reporter's timer while waiting
    // on the sockets. Poll until both phases were seen.
    let seen = tokio::time::timeout(HANG_GUARD, async {
        let (mut up, mut down) = (false, false);
        while !(up && down) {
            match get(a, HEALTH_PATH).await.unwrap().0 {
                StatusCode::OK => up = true,
                StatusCode::SERVICE_UNAVAILABLE => down = true,
                other => panic!("unexpected probe status {other}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(seen.is_ok(), "did not see both phases");
    backends.shutdown().await;
}

#[test]
fn flap_phases_alternate_starting_up() {
    let period = Duration::from_secs(3);
    let at = |ms| flap_up(Duration::from_millis(ms), period);
    assert!(at(0) && at(2_999));
    assert!(!at(3_000) && !at(5_999));
    assert!(at(6_000));
    assert!(flap_up(Duration::from_secs(1), Duration::ZERO));
}

#[tokio::test]
async fn not_ready_backend_reports_it_and_refuses_traffic_while_alive() {
    let (backends, mut reports) = start(&["a-1"]);
    let a = addr(&backends, "a-1");
    backends.set_mode("a-1", Mode::NotReady).unwrap();

    let not_ready = SelfReport::NotReady {
        detail: "demo backend set to not_ready".to_owned(),
    };
    expect_report(&mut reports, "a-1", &not_ready).await;
    assert_eq!(get(a, HEALTH_PATH).await.unwrap().0, StatusCode::OK);
    assert_eq!(
        get(a, READY_PATH).await.unwrap().0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        get(a, "/").await.unwrap().0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    backends.shutdown().await;
}

#[tokio::test]
async fn degraded_dependency_is_reported_while_everything_answers_and_recovery_is_reported() {
    let (backends, mut reports) = start(&["a-1"]);
    let a = addr(&backends, "a-1");
    backends.set_mode("a-1", Mode::DegradedDependency).unwrap();

    expect_report(&mut reports, "a-1", &dependency(DependencyStatus::Degraded)).await;
    assert_eq!(get(a, "/").await.unwrap().0, StatusCode::OK);
    assert_eq!(get(a, HEALTH_PATH).await.unwrap().0, StatusCode::OK);
    assert_eq!(get(a, READY_PATH).await.unwrap().0, StatusCode::OK);

    backends.set_mode("a-1", Mode::Healthy).unwrap();
    expect_report(&mut reports, "a-1", &dependency(DependencyStatus::Ok)).await;
    backends.shutdown().await;
}

#[tokio::test]
async fn reports_repeat_every_interval() {
    let options = BackendOptions {
        report_interval: Duration::from_millis(50),
        ..options()
    };
    let (backends, mut reports) = start_with(&["a-1"], options);
    for _ in 0..3 {
        expect_report(&mut reports, "a-1", &SelfReport::Ready).await;
    }
    backends.shutdown().await;
}

#[test]
fn each_mode_reports_what_the_backend_would_say_and_fail_hard_says_nothing() {
    use DependencyStatus::{Degraded, Ok};
    let ready = || SelfReport::Ready;
    for mode in [Mode::Healthy, Mode::Slow, Mode::Flap] {
        assert_eq!(reports_for(mode, None), [ready()]);
        assert_eq!(reports_for(mode, Some("db")), [dependency(Ok), ready()]);
    }
    assert_eq!(
        reports_for(Mode::DegradedDependency, Some("db")),
        [dependency(Degraded), ready()]
    );
    assert!(matches!(
        reports_for(Mode::NotReady, Some("db")).as_slice(),
        [_, SelfReport::NotReady { .. }]
    ));
    assert_eq!(reports_for(Mode::FailHard, Some("db")), []);
}

#[tokio::test]
async fn the_dependency_is_not_mentioned_until_it_degrades() {
    let (backends, mut reports) = start(&["a-1"]);
    expect_report(&mut reports, "a-1", &SelfReport::Ready).await;
    backends.set_mode("a-1", Mode::Slow).unwrap();
    expect_report(&mut reports, "a-1", &SelfReport::Ready).await;
    backends.shutdown().await;
    // Reporting stopped with the shutdown, so the channel holds everything ever sent.
    while let Some((_, report)) = reports.recv().await {
        assert_eq!(report, SelfReport::Ready);
    }
}

#[test]
fn slow_failures_are_spread_to_the_configured_share() {
    let fails = |permille, n| {
        (0..n)
            .filter(|&seq| spread_fails(seq, Permille::new(permille).unwrap()))
            .count()
    };
    assert_eq!(fails(500, 10), 5);
    assert_eq!(fails(250, 100), 25);
    assert_eq!(fails(0, 100), 0);
    assert_eq!(fails(1000, 100), 100);
}

#[test]
fn modes_parse_in_snake_and_kebab_case() {
    for mode in Mode::ALL {
        assert_eq!(mode.as_str().parse::<Mode>(), Ok(mode));
        let kebab = mode.as_str().replace('_', "-");
        assert_eq!(kebab.parse::<Mode>(), Ok(mode));
        let json = serde_json::to_string(&mode).unwrap();
        assert_eq!(json, format!("\"{mode}\""));
        let from_kebab: Mode = serde_json::from_str(&format!("\"{kebab}\"")).unwrap();
        assert_eq!(from_kebab, mode);
    }
    assert!("broken".parse::<Mode>().is_err());
}

#[tokio::test]
async fn control_api_lists_and_switches_backends() {
    let (backends, _reports) = start(&["a-1", "a-2"]);
    let backends = Arc::new(backends);
    let router = Arc::clone(&backends).router();

    let (status, body) = call(&router, Method::GET, "/v1/dev/backends", "").await;
    assert_eq!(status, StatusCode::OK);
    let listed = body["backends"].as_array().unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["instance"], "a-1");
    assert_eq!(listed[0]["mode"], "healthy");
    assert_eq!(listed[0]["address"], addr(&backends, "a-1").to_string());

    let uri = "/v1/dev/backends/a-2/mode";
    let (status, body) = call(&router, Method::PUT, uri, r#"{"mode":"fail-hard"}"#).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["mode"], "fail_hard");
    assert_eq!(backends.modes()["a-2"], Mode::FailHard);
    backends.shutdown().await;
}

#[tokio::test]
async fn control_api_refuses_unknown_instances_and_bad_modes() {
    let (backends, _reports) = start(&["a-1"]);
    let backends = Arc::new(backends);
    let router = Arc::clone(&backends).router();

    let (status, body) = call(
        &router,
        Method::PUT,
        "/v1/dev/backends/nope/mode",
        r#"{"mode":"slow"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"].as_str().unwrap().contains("nope"));

    let uri = "/v1/dev/backends/a-1/mode";
    for bad in [
        r#"{"mode":"sideways"}"#,
        "not json",
        r#"{"mode":"slow","extra":1}"#,
        "",
    ] {
        let (status, body) = call(&router, Method::PUT, uri, bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "for {bad:?}");
        assert!(body["error"].is_string());
    }
    let huge = format!(r#"{{"mode":"slow","pad":"{}"}}"#, "x".repeat(4096));
    let (status, body) = call(&router, Method::PUT, uri, &huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(body["error"].is_string());
    assert_eq!(backends.modes()["a-1"], Mode::Healthy);

    backends.shutdown().await;
    let (status, _) = call(&router, Method::PUT, uri, r#"{"mode":"slow"}"#).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn set_mode_refuses_an_unknown_instance() {
    let (backends, _reports) = start(&["a-1"]);
    let refused = backends.set_mode("zz", Mode::Slow).unwrap_err();
    assert!(matches!(refused, BackendError::UnknownInstance { instance } if instance == "zz"));
    backends.shutdown().await;
}

#[tokio::test]
async fn start_refuses_duplicate_instances_and_zero_periods() {
    let sink: SelfReportFn = Arc::new(|_: &str, _| {});
    let specs = vec![spec("a-1"), spec("a-1")];
    let refused = Backends::start(specs, options(), Arc::clone(&sink)).unwrap_err();
    assert!(matches!(refused, BackendError::InvalidSpec { .. }));

    let zero = BackendOptions {
        flap_period: Duration::ZERO,
        ..options()
    };
    let refused = Backends::start(vec![spec("a-1")], zero, sink).unwrap_err();
    assert!(matches!(refused, BackendError::InvalidOptions { .. }));
}

#[test]
fn start_outside_a_runtime_is_an_error_not_a_panic() {
    let sink: SelfReportFn = Arc::new(|_: &str, _| {});
    let refused = Backends::start(vec![spec("a-1")], options(), sink).unwrap_err();
    assert!(matches!(refused, BackendError::NoRuntime(_)));
}

#[tokio::test]
async fn shutdown_closes_the_ports_and_ends_steering() {
    let (backends, _reports) = start(&["a-1"]);
    let a = addr(&backends, "a-1");
    backends.shutdown().await;

    assert!(TcpStream::connect(a).await.is_err());
    let refused = backends.set_mode("a-1", Mode::Healthy).unwrap_err();
    assert!(matches!(refused, BackendError::ShutDown));
    backends.shutdown().await;
}
