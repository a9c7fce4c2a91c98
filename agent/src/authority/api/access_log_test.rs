//! The access-log layer on a small router: what each answer logs, and the request id.

use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use axum::middleware::from_fn;
use axum::response::IntoResponse as _;
use axum::routing::{get, post};
use serde_json::Value;
use tower::ServiceExt as _;
use tracing_subscriber::fmt::MakeWriter;

use super::*;
use crate::authority::api::ApiError;

/// Every line the JSON formatter wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn lines(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(|l| serde_json::from_str(l).expect("every line is one JSON object"))
            .collect()
    }

    fn access(&self) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["target"] == "waymark::access")
            .collect()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}

/// The JSON log of this thread, with the access log on.
fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_env_filter("info,waymark::access=debug")
        .with_writer(captured.clone())
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

/// Reads as `operator/alice` (standing in for `authenticate`), an override refused, and the
/// probe without credentials, as the API's router is laid out.
fn app() -> Router {
    async fn read() -> &'static str {
        tracing::info!("inside the handler");
        "ok"
    }
    async fn refused() -> axum::response::Response {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            None,
            "needs override:pay",
        )
        .into_response()
    }
    async fn as_alice(request: Request, next: Next) -> Response {
        let mut response = next.run(request).await;
        let alice = LoggedPrincipal("operator/alice".into());
        response.extensions_mut().insert(alice);
        response
    }
    Router::new()
        .route("/v1/services/{service}", get(read))
        .route("/v1/overrides", post(refused))
        .layer(from_fn(as_alice))
        .route("/livez", get(|| async { "alive" }))
        .layer(from_fn(record))
}

async fn send(method: &str, path: &str, request_id: Option<&str>) -> Response {
    let mut request = HttpRequest::builder().method(method).uri(path);
    if let Some(id) = request_id {
        request = request.header("x-request-id", id);
    }
    app()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

fn echoed(response: &Response) -> String {
    response.headers()[X_REQUEST_ID]
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn every_answer_is_logged_with_its_route_principal_status_and_reason() {
    // Goal: the fields an operator filters on, for a read, a refusal, a probe and a miss.
    let (log, _guard) = capture();
    for (method, path) in [
        ("GET", "/v1/services/pay"),
        ("POST", "/v1/overrides"),
        ("GET", "/livez"),
        ("GET", "/v1/nothing/here"),
    ] {
        send(method, path, None).await;
    }
    let got: Vec<_> = log
        .access()
        .iter()
        .map(|l| {
            let f = &l["fields"];
            assert_eq!(l["level"], "DEBUG", "{l}");
            assert!(f["duration_ms"].as_f64().is_some(), "{l}");
            (
                f["method"].as_str().unwrap().to_owned(),
                f["route"].as_str().unwrap().to_owned(),
                f["status"].as_u64().unwrap(),
                f["principal"].as_str().unwrap().to_owned(),
                f["reason"].as_str().map(str::to_owned),
            )
        })
        .collect();
    let want = [
        ("GET", "/v1/services/{service}", 200, "operator/alice", None),
        (
            "POST",
            "/v1/overrides",
            403,
            "operator/alice",
            Some("forbidden"),
        ),
        ("GET", "/livez", 200, "anonymous", None),
        // A layer on the router wraps its fallback too: as in the API, where a path no
        // route serves is answered to a verified principal only.
        ("GET", "unmatched", 404, "operator/alice", None),
    ]
    .map(|(m, r, s, p, reason)| {
        (
            m.to_owned(),
            r.to_owned(),
            s,
            p.to_owned(),
            reason.map(str::to_owned),
        )
    });
    assert_eq!(got, want);
}

#[tokio::test]
async fn a_well_formed_request_id_is_kept_echoed_and_carried_by_the_handlers_events() {
    let (log, _guard) = capture();
    let kept = send("GET", "/v1/services/pay", Some("edge-7f3a.1:2")).await;
    assert_eq!(echoed(&kept), "edge-7f3a.1:2");
    let lines = log.lines();
    let inside = lines
        .iter()
        .find(|l| l["fields"]["message"] == "inside the handler")
        .expect("the handler's event");
    assert_eq!(inside["span"]["request_id"], "edge-7f3a.1:2", "{inside}");
    assert_eq!(
        log.access()[0]["fields"]["request_id"],
        "edge-7f3a.1:2",
        "{lines:?}"
    );
}

#[tokio::test]
async fn a_missing_or_malformed_request_id_is_replaced_by_a_fresh_uuid() {
    let (log, _guard) = capture();
    let too_long = "a".repeat(REQUEST_ID_LEN_MAX + 1);
    let mut seen = Vec::new();
    for given in [
        None,
        Some(""),
        Some("has space"),
        Some("{x}"),
        Some(too_long.as_str()),
    ] {
        let response = send("GET", "/livez", given).await;
        let id = echoed(&response);
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(&id[14..15], "4", "a version 4 UUID: {id}");
        assert!(!seen.contains(&id), "ids are fresh: {id}");
        seen.push(id);
    }
    let logged: Vec<_> = log
        .access()
        .iter()
        .map(|l| l["fields"]["request_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(logged, seen);
}
