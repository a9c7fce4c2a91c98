//! Who may read the node agent's local HTTP API.
//!
//! `/livez` and `/readyz` answer anyone: a kubelet or a load balancer probes them, and they
//! tell nothing but whether the agent serves. Every other route — `/metrics`, the views,
//! the gossip pool, the sidecars' configs — needs `Authorization: Bearer <token>` with a
//! token from `[agent.listen] http_tokens_file` whenever that file is configured. It must
//! be when the API listens off loopback, where the API is also served over TLS with the
//! node's certificate ([`super::config`]): a token never crosses a network in plain text.
//!
//! The file holds one token per line (`#` comments and blank lines ignored). It is read at
//! start — a missing, empty or malformed file stops the agent there — and again whenever
//! its modification time or length changes, so a token is rotated without a restart: add
//! the new one, move the readers over, remove the old. A reread that fails keeps the
//! tokens in force, logs why and counts it. Only SHA-256 digests of the tokens are kept.
//! Refusals are `401` with the reason in a JSON body (as the authority API refuses), a log
//! line and `waymark_agent_http_refused_total{reason}`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::json;

/// The largest tokens file read (a few hundred tokens).
const FILE_MAX: u64 = 64 * 1024;
/// The shortest token accepted: anything shorter is guessable.
const TOKEN_MIN: usize = 16;
/// The longest token accepted.
const TOKEN_MAX: usize = 512;

/// Why a tokens file cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokensError {
    /// It could not be read.
    #[error("{path}: {message}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What the system said.
        message: String,
    },
    /// It is larger than [`FILE_MAX`].
    #[error("{path}: {len} bytes, over the {FILE_MAX}-byte bound")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// A line is not a usable token.
    #[error("{path}, line {line}: a token is {TOKEN_MIN} to {TOKEN_MAX} visible ASCII characters")]
    BadToken {
        /// The file.
        path: PathBuf,
        /// The line (1-based).
        line: usize,
    },
    /// It holds no token (every reader would be refused).
    #[error("{path}: no token in it")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// The digests of the tokens in `text` (the contents of `path`), or why not.
pub fn parse_tokens(path: &Path, text: &str) -> Result<Vec<[u8; 32]>, TokensError> {
    let mut digests = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let token = line.trim();
        if token.is_empty() || token.starts_with('#') {
            continue;
        }
        let visible = token.bytes().all(|b| b.is_ascii_graphic());
        if !visible || !(TOKEN_MIN..=TOKEN_MAX).contains(&token.len()) {
            return Err(TokensError::BadToken {
                path: path.to_path_buf(),
                line: i + 1,
            });
        }
        digests.push(digest(token));
    }
    if digests.is_empty() {
        return Err(TokensError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(digests)
}

fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// What a request presented, judged against the tokens in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A token in force.
    Admitted,
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header that is not `Bearer <token>`.
    Malformed,
    /// A bearer token that is not in force.
    Unknown,
}

impl Verdict {
    fn reason(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::Unknown => "unknown_token",
        }
    }
}

/// Judges an `Authorization` header value against `digests`.
pub fn judge(authorization: Option<&[u8]>, digests: &[[u8; 32]]) -> Verdict {
    let Some(value) = authorization else {
        return Verdict::Missing;
    };
    let Some(token) = std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
    else {
        return Verdict::Malformed;
    };
    let presented = digest(token);
    // Digests, not secrets, are compared: how long a comparison takes says nothing of a token.
    if digests.contains(&presented) {
        Verdict::Admitted
    } else {
        Verdict::Unknown
    }
}

/// `reason` label of a refusal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefusalLabels {
    /// `missing`, `malformed` or `unknown_token`.
    pub reason: String,
}

/// The metrics of the local API's authentication; clones share state.
#[derive(Debug, Clone, Default)]
pub struct AuthMetrics {
    /// Requests refused, by reason.
    pub refused: Family<RefusalLabels, Counter>,
    /// Rereads of the tokens file that failed (the tokens in force stayed).
    pub reloads_failed: Counter,
}

impl AuthMetrics {
    /// Register both under `waymark_agent_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("waymark_agent");
        r.register(
            "http_refused",
            "Requests to the local HTTP API refused for want of a valid bearer token, by reason",
            self.refused.clone(),
        );
        r.register(
            "http_tokens_reloads_failed",
            "Rereads of agent.listen.http_tokens_file that failed (the tokens in force stayed)",
            self.reloads_failed.clone(),
        );
    }
}

#[derive(Debug)]
struct Loaded {
    /// Modification time and length of the file when read.
    stamp: Stamp,
    digests: Vec<[u8; 32]>,
    /// The file as it was when a reread last failed (`None`: it could not be found):
    /// until it changes again, requests do not reread, count or log it again.
    refused: Option<Option<Stamp>>,
}

type Stamp = (Option<SystemTime>, u64);

/// The tokens of `[agent.listen] http_tokens_file`, reread when the file changes.
#[derive(Debug)]
pub struct LocalTokens {
    path: PathBuf,
    loaded: Mutex<Loaded>,
    metrics: AuthMetrics,
}

impl LocalTokens {
    /// Reads `path`: at start, a file that cannot be used is an error.
    pub fn load(path: &Path, metrics: AuthMetrics) -> Result<Self, TokensError> {
        let loaded = read(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            loaded: Mutex::new(loaded),
            metrics,
        })
    }

    /// How many tokens are in force.
    pub fn len(&self) -> usize {
        self.lock().digests.len()
    }

    /// Whether none is (never after a successful [`Self::load`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Rereads the file if its stamp changed; a failed reread keeps the tokens in force.
    async fn refresh(&self) {
        let stamp = tokio::fs::metadata(&self.path)
            .await
            .ok()
            .map(|meta| (meta.modified().ok(), meta.len()));
        {
            let loaded = self.lock();
            if stamp == Some(loaded.stamp) || loaded.refused == Some(stamp) {
                // Unchanged, or refused as it is now: said once already.
                return;
            }
        }
        let Some(stamp) = stamp else {
            // Gone or unreadable: the next successful read decides; keep what we have.
            self.reload_failed(None, "the file cannot be read");
            return;
        };
        let path = self.path.clone();
        let read = tokio::task::spawn_blocking(move || read(&path)).await;
        match read {
            Ok(Ok(fresh)) => {
                tracing::info!(
                    file = %self.path.display(),
                    tokens = fresh.digests.len(),
                    "local API tokens reread"
                );
                *self.lock() = fresh;
            }
            Ok(Err(e)) => self.reload_failed(Some(stamp), &e.to_string()),
            Err(e) => self.reload_failed(Some(stamp), &e.to_string()),
        }
    }

    fn reload_failed(&self, stamp: Option<Stamp>, why: &str) {
        self.lock().refused = Some(stamp);
        self.metrics.reloads_failed.inc();
        tracing::warn!(
            file = %self.path.display(),
            error = why,
            "local API tokens not reread; the tokens in force stay"
        );
    }

    /// Judges a request's `Authorization` header.
    pub async fn judge(&self, authorization: Option<&[u8]>) -> Verdict {
        self.refresh().await;
        judge(authorization, &self.lock().digests)
    }
}

fn read(path: &Path) -> Result<Loaded, TokensError> {
    let unreadable = |e: std::io::Error| TokensError::Unreadable {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if meta.len() > FILE_MAX {
        return Err(TokensError::TooLarge {
            path: path.to_path_buf(),
            len: meta.len(),
        });
    }
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    Ok(Loaded {
        stamp: (meta.modified().ok(), meta.len()),
        digests: parse_tokens(path, &text)?,
        refused: None,
    })
}

/// Middleware: the request goes on only with a token in force.
pub async fn require_token(
    State(tokens): State<Arc<LocalTokens>>,
    request: Request,
    next: Next,
) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec());
    let verdict = tokens.judge(header.as_deref()).await;
    if verdict == Verdict::Admitted {
        return next.run(request).await;
    }
    let reason = verdict.reason();
    tokens
        .metrics
        .refused
        .get_or_create(&RefusalLabels {
            reason: reason.to_owned(),
        })
        .inc();
    tracing::warn!(
        path = %request.uri().path(),
        reason,
        "local API request refused"
    );
    let message = match verdict {
        Verdict::Missing => "a bearer token is required (agent.listen.http_tokens_file)",
        Verdict::Malformed => "the Authorization header is not `Bearer <token>`",
        _ => "the bearer token is not one of agent.listen.http_tokens_file",
    };
    let body = json!({"error": {"reason": reason, "message": message}});
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer realm=\"waymark-agent\"")],
        axum::Json(body),
    )
        .into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const A: &str = "wm-local-0123456789abcdef";
    const B: &str = "wm-local-fedcba9876543210";

    fn p() -> &'static Path {
        Path::new("/etc/waymark/api-tokens")
    }

    #[test]
    fn tokens_are_lines_with_comments_and_blanks_ignored() {
        let text = format!("# readers of this host\n\n  {A}  \n{B}\n");
        let d = parse_tokens(p(), &text).unwrap();
        assert_eq!(d, vec![digest(A), digest(B)]);
    }

    #[test]
    fn a_short_spaced_or_absent_token_is_refused_with_its_line() {
        let short = format!("{A}\nshort\n");
        assert_eq!(
            parse_tokens(p(), &short),
            Err(TokensError::BadToken {
                path: p().into(),
                line: 2
            })
        );
        let spaced = "wm local 0123456789abcdef\n";
        assert!(matches!(
            parse_tokens(p(), spaced),
            Err(TokensError::BadToken { line: 1, .. })
        ));
        let long = "x".repeat(TOKEN_MAX + 1);
        assert!(parse_tokens(p(), &long).is_err());
        assert_eq!(
            parse_tokens(p(), "# nothing yet\n\n"),
            Err(TokensError::Empty { path: p().into() })
        );
    }

    #[test]
    fn only_a_bearer_token_in_force_is_admitted() {
        let d = vec![digest(A)];
        let bearer = |t: &str| format!("Bearer {t}").into_bytes();
        assert_eq!(judge(Some(&bearer(A)), &d), Verdict::Admitted);
        assert_eq!(judge(Some(&bearer(B)), &d), Verdict::Unknown);
        assert_eq!(judge(None, &d), Verdict::Missing);
        assert_eq!(judge(Some(A.as_bytes()), &d), Verdict::Malformed);
        assert_eq!(judge(Some(b"Basic dXNlcjpwdw=="), &d), Verdict::Malformed);
        assert_eq!(judge(Some(b"Bearer "), &d), Verdict::Malformed);
        assert_eq!(judge(Some(&[0xff, 0xfe]), &d), Verdict::Malformed);
    }

    #[tokio::test]
    async fn a_changed_file_is_reread_and_a_broken_one_keeps_the_tokens_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, format!("{A}\n")).unwrap();
        let metrics = AuthMetrics::default();
        let tokens = LocalTokens::load(&path, metrics.clone()).unwrap();
        let bearer = |t: &str| format!("Bearer {t}").into_bytes();
        assert_eq!(tokens.judge(Some(&bearer(A))).await, Verdict::Admitted);
        assert_eq!(tokens.judge(Some(&bearer(B))).await, Verdict::Unknown);

        // Rotation: B added (the length changes, so the reread does not hang on the
        // file system's timestamp granularity), then A removed.
        std::fs::write(&path, format!("{A}\n{B}\n")).unwrap();
        assert_eq!(tokens.judge(Some(&bearer(B))).await, Verdict::Admitted);
        assert_eq!(tokens.len(), 2);
        std::fs::write(&path, format!("# rotated\n{B}\n")).unwrap();
        assert_eq!(tokens.judge(Some(&bearer(A))).await, Verdict::Unknown);
        assert_eq!(tokens.judge(Some(&bearer(B))).await, Verdict::Admitted);

        // A broken file: B stays in force, and the failed reread is counted once, not
        // once per request while the file stays as it is.
        std::fs::write(&path, "oops\n").unwrap();
        assert_eq!(tokens.judge(Some(&bearer(B))).await, Verdict::Admitted);
        assert_eq!(tokens.judge(Some(&bearer(B))).await, Verdict::Admitted);
        assert_eq!(metrics.reloads_failed.get(), 1);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(tokens.judge(Some(&bearer(B))).await, Verdict::Admitted);
        assert_eq!(tokens.judge(Some(&bearer(B))).await, Verdict::Admitted);
        assert_eq!(metrics.reloads_failed.get(), 2, "gone: counted once more");
        // Fixed: reread, and the new token in force.
        std::fs::write(&path, format!("{A}\n")).unwrap();
        assert_eq!(tokens.judge(Some(&bearer(A))).await, Verdict::Admitted);
        assert_eq!(tokens.judge(Some(&bearer(B))).await, Verdict::Unknown);
    }

    #[test]
    fn an_unusable_file_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none");
        assert!(matches!(
            LocalTokens::load(&missing, AuthMetrics::default()),
            Err(TokensError::Unreadable { .. })
        ));
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'a'; usize::try_from(FILE_MAX).unwrap() + 1]).unwrap();
        assert!(matches!(
            LocalTokens::load(&big, AuthMetrics::default()),
            Err(TokensError::TooLarge { .. })
        ));
    }
}
