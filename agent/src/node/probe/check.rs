//! One check against one address, and how its outcome becomes a [`Health`].
//!
//! The mapping is the part the evaluator depends on, so it lives in pure functions with unit
//! tests below: refused is the only hard failure (ADR-05 fast path); a deadline is soft and
//! ambiguous; an answer that says "no" is `Fail`; anything else the network does to us
//! (reset, unreachable, bad protocol) is `Fail` with the error chain as detail.

use std::error::Error as StdError;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use waymark_core::audit::truncate_detail;
use waymark_core::contract::ProbeKind;
use waymark_core::model::{Health, Observation};

use super::{grpc, http, tcp};
use crate::evidence::TARGET_TEXT_MARKER;

/// What one probe asks, built from a [`ProbeKind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// HTTP/1.1 `GET`.
    Http(HttpCheck),
    /// A TCP connect.
    Tcp,
    /// `grpc.health.v1.Health/Check`.
    Grpc(GrpcCheck),
}

/// An HTTP check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCheck {
    /// The request path, e.g. `/readyz`.
    pub path: String,
    /// Text a 2xx body must contain (within its first [`BODY_MATCH_LEN_MAX`] bytes) to pass.
    ///
    /// `None` from [`Check::from_kind`]: the contract's `ProbeKind::Http` has no field for
    /// it yet, so only callers building checks by hand can ask for it.
    pub expect_body: Option<String>,
}

/// A gRPC health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcCheck {
    /// The service to ask about; empty means the server as a whole.
    pub service: String,
}

/// How much of a 2xx body is searched for [`HttpCheck::expect_body`].
pub const BODY_MATCH_LEN_MAX: usize = 64 * 1024;

/// Bytes of the target's own text kept in a detail, control characters blanked.
pub const TARGET_TEXT_LEN_MAX: usize = 128;

/// A check's result, ready to become an [`Observation::Probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The verdict.
    pub health: Health,
    /// What the target said or what went wrong, at most `DETAIL_LEN_MAX` bytes (plus `…`).
    pub detail: Option<String>,
}

/// Why a check could not complete. Internal to the prober; every variant maps to a
/// [`Health`] through [`Outcome::of_error`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// The TCP connect failed (refused, unreachable, …).
    #[error("connect failed")]
    Connect(#[source] io::Error),
    /// The request could not be built (e.g. a path that is not a valid URI).
    #[error("invalid request")]
    Request(#[source] ::http::Error),
    /// The HTTP exchange failed after connecting.
    #[error("http exchange failed")]
    Http(#[source] hyper::Error),
    /// The gRPC channel could not be set up.
    #[error("grpc transport failed")]
    Transport(#[source] tonic::transport::Error),
    /// The gRPC call ended with a non-OK status.
    #[error("grpc call failed")]
    Status(#[source] tonic::Status),
}

// === impl Check ===

impl Check {
    /// The check a contract's probe kind asks for.
    pub fn from_kind(kind: &ProbeKind) -> Self {
        match kind {
            ProbeKind::Http { path } => Self::Http(HttpCheck {
                path: path.clone(),
                expect_body: None,
            }),
            ProbeKind::Tcp => Self::Tcp,
            ProbeKind::Grpc { service } => Self::Grpc(GrpcCheck {
                service: service.clone(),
            }),
        }
    }

    /// The metric label for this kind: `http`, `tcp` or `grpc`.
    pub fn kind_label(&self) -> &'static str {
        match self {
            Self::Http(_) => "http",
            Self::Tcp => "tcp",
            Self::Grpc(_) => "grpc",
        }
    }

    /// Run the check against `addr`, giving it `timeout` from connect to verdict.
    ///
    /// Every call opens a fresh connection: a pooled one would hide a listener that stopped
    /// accepting.
    pub async fn probe(&self, addr: SocketAddr, timeout: Duration) -> Outcome {
        let run = async {
            match self {
                Self::Http(check) => http::probe(addr, check).await,
                Self::Tcp => tcp::probe(addr).await,
                Self::Grpc(check) => grpc::probe(addr, check, timeout).await,
            }
        };
        match tokio::time::timeout(timeout, run).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(error)) => Outcome::of_error(&error),
            Err(_elapsed) => Outcome::timed_out(timeout),
        }
    }
}

// === impl Outcome ===

impl Outcome {
    /// A passing outcome with no detail.
    pub fn pass() -> Self {
        Self {
            health: Health::Pass,
            detail: None,
        }
    }

    /// `health` with `detail` cut to `DETAIL_LEN_MAX`.
    pub fn with_detail(health: Health, detail: &str) -> Self {
        Self {
            health,
            detail: Some(truncate_detail(detail)),
        }
    }

    /// No verdict within `timeout`: soft.
    pub fn timed_out(timeout: Duration) -> Self {
        Self::with_detail(
            Health::Timeout,
            &format!("no answer within {}ms", timeout.as_millis()),
        )
    }

    /// An HTTP answer: 2xx passes (if its body holds `expect_body`), anything else fails
    /// with the status and the first bytes of the body.
    pub fn of_http(status: u16, body: &[u8], expect_body: Option<&str>) -> Self {
        if !(200..300).contains(&status) {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            return if text.is_empty() {
                Self::with_detail(Health::Fail, &format!("HTTP {status}"))
            } else {
                let said = target_text(text);
                Self::with_detail(
                    Health::Fail,
                    &format!("HTTP {status}{TARGET_TEXT_MARKER}{said}"),
                )
            };
        }
        match expect_body {
            Some(expected) if !contains(body, expected.as_bytes()) => Self::with_detail(
                Health::Fail,
                &format!("HTTP {status}: body does not contain {expected:?}"),
            ),
            _ => Self::pass(),
        }
    }

    /// A gRPC health answer (`grpc.health.v1.HealthCheckResponse.status`, raw).
    pub fn of_grpc_status(status: i32) -> Self {
        use tonic_health::pb::health_check_response::ServingStatus;
        match ServingStatus::try_from(status) {
            Ok(ServingStatus::Serving) => Self::pass(),
            Ok(other) => Self::with_detail(Health::Fail, other.as_str_name()),
            Err(_) => Self::with_detail(Health::Fail, &format!("unknown serving status {status}")),
        }
    }

    /// A check that could not complete: refused is hard, a deadline is soft, the rest fail
    /// with the error chain as detail.
    pub fn of_error(error: &ProbeError) -> Self {
        if let ProbeError::Status(status) = error {
            return Self::of_grpc_error(status);
        }
        if let Some(io) = find_io(error) {
            match io.kind() {
                io::ErrorKind::ConnectionRefused => {
                    return Self::with_detail(Health::Refused, "connection refused");
                }
                io::ErrorKind::TimedOut => {
                    return Self::with_detail(Health::Timeout, &chain(error));
                }
                _ => {}
            }
        }
        Self::with_detail(Health::Fail, &chain(error))
    }

    fn of_grpc_error(status: &tonic::Status) -> Self {
        match status.code() {
            // The health protocol's answer for a service the server does not know.
            tonic::Code::NotFound => Self::with_detail(Health::Fail, "SERVICE_UNKNOWN"),
            tonic::Code::DeadlineExceeded => Self::with_detail(
                Health::Timeout,
                &format!("gRPC {:?}: {}", status.code(), status.message()),
            ),
            _ if find_io(status).is_some_and(|e| e.kind() == io::ErrorKind::ConnectionRefused) => {
                Self::with_detail(Health::Refused, "connection refused")
            }
            code if status.message().trim().is_empty() => {
                Self::with_detail(Health::Fail, &format!("gRPC {code:?}"))
            }
            code => Self::with_detail(
                Health::Fail,
                &format!(
                    "gRPC {code:?}{TARGET_TEXT_MARKER}{}",
                    target_text(status.message())
                ),
            ),
        }
    }

    /// The sample this outcome becomes.
    pub fn into_observation(self) -> Observation {
        Observation::Probe {
            health: self.health,
            detail: self.detail,
        }
    }
}

/// The first `io::Error` in `error`'s source chain, itself included.
fn find_io<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a io::Error> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            // Connectors wrap the real cause in an `io::Error` of kind `Other`, and
            // `io::Error::source` skips the wrapped error itself: look inside by hand.
            match io.get_ref() {
                Some(inner) if io.kind() == io::ErrorKind::Other => {
                    next = Some(inner);
                    continue;
                }
                _ => return Some(io),
            }
        }
        next = e.source();
    }
    None
}

/// `error: cause: cause…`, the whole chain on one line.
fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        text.push_str(": ");
        text.push_str(&e.to_string());
        next = e.source();
    }
    text
}

/// What a target said, as a detail may carry it: trimmed, control characters blanked (so
/// it cannot forge log lines or terminal output), at most [`TARGET_TEXT_LEN_MAX`] bytes.
fn target_text(raw: &str) -> String {
    let clean: String = raw
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if clean.len() <= TARGET_TEXT_LEN_MAX {
        return clean;
    }
    let mut end = TARGET_TEXT_LEN_MAX;
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &clean[..end])
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
#[path = "check_test.rs"]
mod tests;
