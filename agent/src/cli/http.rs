//! A small HTTP/1.1 JSON client for the API, following the followers' redirects to the
//! leader.

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util_client::client::legacy::Client;
use hyper_util_client::client::legacy::connect::HttpConnector;
use hyper_util_client::rt::TokioExecutor;

/// Redirects followed at most (a follower points at the leader; one hop is normal).
const REDIRECTS_MAX: usize = 3;

/// An API client for one base URL (`http://host:port`).
#[derive(Debug, Clone)]
pub struct ApiClient {
    base: String,
    actor: Option<String>,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// A response: status and body.
#[derive(Debug)]
pub struct ApiResponse {
    /// The status.
    pub status: StatusCode,
    /// The body.
    pub body: Bytes,
}

impl ApiResponse {
    /// The body as JSON, or an error carrying the API's refusal.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        if !self.status.is_success() {
            let detail = serde_json::from_slice::<serde_json::Value>(&self.body)
                .ok()
                .and_then(|v| v.get("error").cloned())
                .map_or_else(
                    || String::from_utf8_lossy(&self.body).into_owned(),
                    |e| {
                        let field = e
                            .get("field")
                            .and_then(|f| f.as_str())
                            .map(|f| format!(" (field {f})"))
                            .unwrap_or_default();
                        format!(
                            "{}{field}: {}",
                            e.get("reason")
                                .and_then(|r| r.as_str())
                                .unwrap_or("refused"),
                            e.get("message").and_then(|m| m.as_str()).unwrap_or("")
                        )
                    },
                );
            bail!("{}: {detail}", self.status);
        }
        if self.body.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_slice(&self.body).context("the API answered with malformed JSON")
    }
}

impl ApiClient {
    /// A client for `base`, acting as `actor` (sent as `x-waymark-actor`).
    pub fn new(base: &str, actor: Option<String>) -> Self {
        let base = if base.starts_with("http://") {
            base.trim_end_matches('/').to_owned()
        } else {
            format!("http://{}", base.trim_end_matches('/'))
        };
        Self {
            base,
            actor,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Send a request with a JSON body, following redirects with the same method and body.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<ApiResponse> {
        let bytes = match body {
            Some(b) => Some(Bytes::from(serde_json::to_vec(b)?)),
            None => None,
        };
        self.send_bytes(method, path, bytes).await
    }

    /// Send a request with a body as given (which may be malformed: tests use this).
    pub async fn send_bytes(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> anyhow::Result<ApiResponse> {
        let has_body = body.is_some();
        let bytes = body.unwrap_or_default();
        let mut url = format!("{}{path}", self.base);
        for _ in 0..=REDIRECTS_MAX {
            let mut req = Request::builder().method(method.clone()).uri(&url);
            if has_body {
                req = req.header(header::CONTENT_TYPE, "application/json");
            }
            if let Some(actor) = &self.actor {
                req = req.header(crate::authority::api::ACTOR_HEADER, actor);
            }
            let req = req.body(Full::new(bytes.clone()))?;
            let response = self
                .client
                .request(req)
                .await
                .with_context(|| format!("calling {url}"))?;
            let status = response.status();
            if status == StatusCode::TEMPORARY_REDIRECT
                && let Some(location) = response.headers().get(header::LOCATION)
            {
                url = location.to_str()?.to_owned();
                continue;
            }
            let body = response.into_body().collect().await?.to_bytes();
            return Ok(ApiResponse { status, body });
        }
        bail!("too many redirects (no stable leader?)")
    }

    /// GET and parse JSON.
    pub async fn get_json(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        self.send(Method::GET, path, None).await?.json()
    }
}
