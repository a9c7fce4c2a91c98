//! A small HTTP/1.1 JSON client for an authority member's API, following the followers'
//! redirects to the leader.
//!
//! Bounded like the listeners it talks to: connecting takes at most [`CONNECT_TIMEOUT`],
//! a whole exchange (redirects included) at most [`REQUEST_TIMEOUT`], and an answer is
//! read up to [`RESPONSE_LIMIT_BYTES`] — a larger one is an error, never a growing buffer.
//! The CLI, the node agent's registrar of `services_dir`, `waymark dev` and the authority
//! members themselves (a follower forwards audit records to the leader) all use it, so it
//! sits beside them rather than inside any one.
//!
//! Over `https://` ([`ApiClient::with_tls`]) the server is admitted by its verified
//! authority identity, not by the dialled name (so a follower's redirect to the leader's
//! address needs no name in the certificate); the client presents a certificate when its
//! config has one (an operator or a node agent) and a bearer token otherwise.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util_client::client::legacy::Client;
use hyper_util_client::client::legacy::connect::HttpConnector;
use hyper_util_client::rt::TokioExecutor;

use crate::dial::TlsConnector;

/// Redirects followed at most (a follower points at the leader; one hop is normal).
const REDIRECTS_MAX: usize = 3;
/// Time to connect to a member.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for one call, redirects included (the server's own request timeout is 30 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(35);
/// Largest answer read: a full audit page of large records fits.
pub const RESPONSE_LIMIT_BYTES: usize = 64 * 1024 * 1024;
/// How long an idle connection is kept: below the server's idle timeout.
const POOL_IDLE: Duration = Duration::from_secs(5);

/// An API client for one base URL (`http://host:port` or `https://host:port`).
#[derive(Clone)]
pub struct ApiClient {
    base: String,
    token: Option<String>,
    transport: Transport,
    timeout: Duration,
    response_limit: usize,
}

/// How requests reach the server.
#[derive(Clone)]
enum Transport {
    Plain(Client<HttpConnector, Full<Bytes>>),
    Tls(Client<TlsConnector, Full<Bytes>>),
}

impl Transport {
    async fn request(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper_util_client::client::legacy::Error>
    {
        match self {
            Self::Plain(c) => c.request(req).await,
            Self::Tls(c) => c.request(req).await,
        }
    }
}

/// A response: status, headers and body.
#[derive(Debug)]
pub struct ApiResponse {
    /// The status.
    pub status: StatusCode,
    /// The headers (a blocking query's `X-Waymark-Index`, a page's `X-Waymark-Next-Cursor`).
    pub headers: http::HeaderMap,
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

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token: it is a credential.
        f.debug_struct("ApiClient")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

impl ApiClient {
    /// A client for `base`, authenticating with a bearer `token` (`wmt.<name>.<secret>`)
    /// when one is given.
    ///
    /// `base` without a scheme is `http://`; an `https://` base needs [`Self::with_tls`]
    /// (calls without it fail, naming what is missing).
    pub fn new(base: &str, token: Option<String>) -> Self {
        let base = base.trim_end_matches('/');
        let base = if base.starts_with("http://") || base.starts_with("https://") {
            base.to_owned()
        } else {
            format!("http://{base}")
        };
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        Self {
            base,
            token,
            transport: Transport::Plain(
                Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(POOL_IDLE)
                    .build(connector),
            ),
            timeout: REQUEST_TIMEOUT,
            response_limit: RESPONSE_LIMIT_BYTES,
        }
    }

    /// The same client over TLS with `config` (its verifier decides which servers are
    /// admitted; build it with [`crate::cli::tls::api_client_config`]); the base becomes
    /// `https://`.
    pub fn with_tls(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        if let Some(rest) = self.base.strip_prefix("http://") {
            self.base = format!("https://{rest}");
        }
        let connector = TlsConnector::new(config, CONNECT_TIMEOUT);
        self.transport = Transport::Tls(
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(POOL_IDLE)
                .build(connector),
        );
        self
    }

    /// The base URL calls go to.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The same client with another bound on a whole call (default [`REQUEST_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same client with another bound on an answer's size (default
    /// [`RESPONSE_LIMIT_BYTES`]).
    pub fn with_response_limit(mut self, bytes: usize) -> Self {
        self.response_limit = bytes;
        self
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
        let call = self.exchange(method, path, body);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => bail!(
                "{}{path}: no answer within {} ms",
                self.base,
                self.timeout.as_millis()
            ),
        }
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> anyhow::Result<ApiResponse> {
        let has_body = body.is_some();
        let bytes = body.unwrap_or_default();
        let mut url = format!("{}{path}", self.base);
        for _ in 0..=REDIRECTS_MAX {
            match (&self.transport, url.starts_with("https://")) {
                (Transport::Plain(_), true) => bail!(
                    "{url}: an https address needs the estate's trust bundle \
                     (--ca-bundle or WAYMARK_CA_BUNDLE)"
                ),
                // Never send a token in the clear because a redirect said so.
                (Transport::Tls(_), false) => {
                    bail!("{url}: refusing to follow an https client to plain http")
                }
                _ => {}
            }
            let mut req = Request::builder().method(method.clone()).uri(&url);
            if has_body {
                req = req.header(header::CONTENT_TYPE, "application/json");
            }
            if let Some(token) = &self.token {
                req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
            }
            let req = req.body(Full::new(bytes.clone()))?;
            let response = self
                .transport
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
            let headers = response.headers().clone();
            let body = http_body_util::Limited::new(response.into_body(), self.response_limit)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("reading the answer from {url}: {e}"))?
                .to_bytes();
            return Ok(ApiResponse {
                status,
                headers,
                body,
            });
        }
        bail!("too many redirects (no stable leader?)")
    }

    /// GET and parse JSON.
    pub async fn get_json(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        self.send(Method::GET, path, None).await?.json()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    use crate::net::test_support::answering_server as server;

    #[tokio::test]
    async fn an_answer_over_the_size_cap_is_an_error() {
        let body = "x".repeat(4096);
        let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: 4096\r\n\r\n{body}");
        let api = ApiClient::new(&server(Some(answer.into_bytes())).await, None)
            .with_response_limit(1024);
        let e = api.send(Method::GET, "/v1/audit", None).await.unwrap_err();
        assert!(e.to_string().contains("reading the answer"), "{e:#}");
    }

    #[tokio::test]
    async fn a_server_that_never_answers_is_an_error_within_the_timeout() {
        let api =
            ApiClient::new(&server(None).await, None).with_timeout(Duration::from_millis(200));
        let e = api.send(Method::GET, "/v1/status", None).await.unwrap_err();
        assert!(e.to_string().contains("no answer within 200 ms"), "{e:#}");
    }
}
