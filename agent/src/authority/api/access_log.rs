//! The API's access log: one event per request the router answers, target
//! `waymark::access`, at `debug` — one per request, as STYLE.md's levels have it, and at
//! tens of thousands of lease renewals a minute too many for `info`. Turn it on with
//! `--log-level info,waymark::access=debug` (or `[log] level`).
//!
//! ```text
//! request ─► record ─► (body limit ─► authenticate ─► handler) ─► response + X-Request-Id
//!              └─ span api_request{request_id}        └─ LoggedPrincipal / LoggedRefusal
//! ```
//!
//! Fields: `method`; `route`, the matched path template (`/v1/services/{service}`), so its
//! values stay few whatever paths clients send (`unmatched` where no route matched);
//! `status`; `duration_ms`; `principal`, the verified one `access::authenticate` found, or
//! `anonymous` (the probes `/livez` and `/readyz`, and every 401); `request_id`; and for a
//! refusal, the `reason` its body carries (`unauthenticated`, `bad_token`, `forbidden`,
//! `body_too_large`, `rate_limited`, …).
//!
//! The request id is the client's `X-Request-Id` when it is well formed (1 to 64 of
//! `A-Z a-z 0-9 - _ . :`, which Envoy's UUIDs are), else a fresh random UUID. It is echoed
//! in the response's `X-Request-Id`, and every event logged while the request is served
//! carries it (span `api_request`), so a refusal's `api request refused` line joins its
//! access line. What the listener ends before the router answers (the connection cap's
//! 503, the request timeout's 408) is counted by the listener's metrics, not logged here.
//!
//! The same fields count every answer where the router provides [`ApiRequestMetrics`] (an
//! extension): `waymark_api_requests_total{route,method,status,principal_kind}` and
//! `waymark_api_request_duration_seconds{route}` — the route template, never the path,
//! and the principal's kind, never its name, so the series stay few.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use tracing::Instrument as _;

use crate::authority::metrics::{ApiRequestLabels, RouteLabels};

/// The request id's header, read from the request and written on the response.
pub(super) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// The longest client request id taken as it is; a longer one is replaced.
pub(super) const REQUEST_ID_LEN_MAX: usize = 64;
/// The `principal` of a request without a verified one.
pub(super) const ANONYMOUS: &str = "anonymous";
/// The `route` of a request no route matched.
pub(super) const UNMATCHED: &str = "unmatched";

/// The verified principal, left on the response by `access::authenticate`.
#[derive(Debug, Clone)]
pub(super) struct LoggedPrincipal(pub(super) String);

/// A refusal's reason, left on the response by `ApiError`.
#[derive(Debug, Clone)]
pub(super) struct LoggedRefusal(pub(super) String);

/// The access-log layer's function (`axum::middleware::from_fn`): serves the request in
/// its span, then logs it and echoes its id.
pub(super) async fn record(mut request: Request, next: Next) -> Response {
    let started = tokio::time::Instant::now();
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED, MatchedPath::as_str)
        .to_owned();
    let id = request
        .headers()
        .get(&X_REQUEST_ID)
        .filter(|v| well_formed(v.as_bytes()))
        .cloned()
        .unwrap_or_else(new_request_id);
    // The handler sees the id in force, not one that was refused.
    request.headers_mut().insert(X_REQUEST_ID, id.clone());
    let request_id = id.to_str().unwrap_or_default().to_owned();
    let metrics = request.extensions().get::<ApiRequestMetrics>().cloned();
    let span = tracing::info_span!("api_request", request_id = %request_id);
    let mut response = next.run(request).instrument(span).await;
    let principal = response
        .extensions()
        .get::<LoggedPrincipal>()
        .map_or(ANONYMOUS, |p| p.0.as_str());
    let reason = response
        .extensions()
        .get::<LoggedRefusal>()
        .map(|r| r.0.as_str());
    let took = started.elapsed();
    if let Some(m) = metrics {
        m.count(&route, &method, response.status().as_u16(), principal, took);
    }
    tracing::debug!(
        target: "waymark::access",
        method = %method,
        route,
        status = response.status().as_u16(),
        // Microseconds, in milliseconds: no float noise past the third decimal.
        duration_ms = took.as_micros() as f64 / 1e3,
        principal,
        request_id,
        reason,
        "api request"
    );
    response.headers_mut().insert(X_REQUEST_ID, id);
    response
}

/// Where [`record`] counts the answers: given to the router as an extension (clones share
/// the families of the member's registry).
#[derive(Debug, Clone)]
pub(crate) struct ApiRequestMetrics {
    /// `waymark_api_requests_total`.
    pub(crate) requests: Family<ApiRequestLabels, Counter>,
    /// `waymark_api_request_duration_seconds`.
    pub(crate) seconds: Family<RouteLabels, Histogram, fn() -> Histogram>,
}

impl ApiRequestMetrics {
    /// The member's families.
    pub(crate) fn of(metrics: &crate::authority::metrics::AuthorityMetrics) -> Self {
        Self {
            requests: metrics.api_requests.clone(),
            seconds: metrics.api_request_seconds.clone(),
        }
    }

    fn count(
        &self,
        route: &str,
        method: &axum::http::Method,
        status: u16,
        principal: &str,
        took: std::time::Duration,
    ) {
        self.requests
            .get_or_create(&ApiRequestLabels {
                route: route.to_owned(),
                method: method_label(method).to_owned(),
                status,
                principal_kind: principal_kind(principal),
            })
            .inc();
        self.seconds
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
            })
            .observe(took.as_secs_f64());
    }
}

/// A method as a label: the standard ones by name, anything else `other` (a client may
/// send any token as a method).
fn method_label(method: &axum::http::Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    }
}

/// The kind of a principal from its display form (`operator/…`, `token/…`,
/// `region/…/node/…`, `region/…/service/…` for a workload, `region/…/authority/…`), or
/// `anonymous`.
pub(super) fn principal_kind(principal: &str) -> &'static str {
    if principal == ANONYMOUS {
        return ANONYMOUS;
    }
    let mut parts = principal.split('/');
    match (parts.next(), parts.nth(1)) {
        (Some("operator"), _) => "operator",
        (Some("token"), _) => "token",
        (Some("region"), Some("node")) => "node",
        (Some("region"), Some("service")) => "workload",
        (Some("region"), Some("authority")) => "authority",
        _ => "other",
    }
}

/// Whether a client's request id is taken as it is: short, and only characters that need
/// no escaping in a log line or a header.
fn well_formed(id: &[u8]) -> bool {
    (1..=REQUEST_ID_LEN_MAX).contains(&id.len())
        && id
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c))
}

/// A random (version 4) UUID; if the system's random source fails, a counter, which is
/// unique in this process and says where it came from.
fn new_request_id() -> HeaderValue {
    use ring::rand::SecureRandom as _;
    static FALLBACK: AtomicU64 = AtomicU64::new(0);
    let mut b = [0u8; 16];
    let text = match ring::rand::SystemRandom::new().fill(&mut b) {
        Ok(()) => {
            b[6] = (b[6] & 0x0f) | 0x40;
            b[8] = (b[8] & 0x3f) | 0x80;
            let h = hex::encode(b);
            format!(
                "{}-{}-{}-{}-{}",
                &h[..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            )
        }
        Err(_) => format!("local-{}", FALLBACK.fetch_add(1, Ordering::Relaxed)),
    };
    HeaderValue::from_str(&text).expect("hex, dashes and digits make a header value")
}

#[cfg(test)]
#[path = "access_log_test.rs"]
mod tests;
