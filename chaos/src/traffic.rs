//! Traffic through a real listener: a fixed-rate generator recording every request's
//! outcome with its time since the run started, and the plain HTTP/1.1 GET it sends.
//!
//! Each request opens its own connection (`Connection: close`), so a restarted Envoy is
//! seen at the next request rather than through a pooled connection that happens to live.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// At most this much of a response is read.
const MAX_RESPONSE: usize = 64 * 1024;

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("timed out")]
    Timeout,
    #[error("malformed response")]
    Malformed,
}

/// `GET path` on `addr` over a fresh HTTP/1.1 connection, within `timeout`.
pub async fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<Response, GetError> {
    get_with(addr, path, timeout, None).await
}

/// [`get`] presenting `token` as a bearer token, when one is given.
pub async fn get_with(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    token: Option<&str>,
) -> Result<Response, GetError> {
    tokio::time::timeout(timeout, async {
        let mut s = TcpStream::connect(addr).await.map_err(GetError::Connect)?;
        let auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        (&mut s)
            .take(MAX_RESPONSE as u64)
            .read_to_end(&mut buf)
            .await?;
        parse(&buf).ok_or(GetError::Malformed)
    })
    .await
    .map_err(|_| GetError::Timeout)?
}

/// Status and body of a `Connection: close` response (the body is what follows the head).
fn parse(raw: &[u8]) -> Option<Response> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head
        .lines()
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(Response {
        status,
        body: body.to_owned(),
    })
}

/// What became of one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Answer {
    /// 2xx, and which backend answered if its body says (`{"instance": …}`).
    Ok { instance: Option<String> },
    /// An HTTP answer that is not 2xx (Envoy's 503 "no healthy upstream", a backend's 500).
    Status { status: u16 },
    /// The listener refused the connection (nothing listening: Envoy is down).
    Refused,
    /// Any other failure: reset, timeout, garbage.
    Failed,
}

/// One request: when it was sent (ms since the run started), how long it took, and what
/// became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub at_ms: u64,
    pub latency_ms: u64,
    pub result: Answer,
}

impl Outcome {
    /// Whether the caller got a 2xx.
    pub fn ok(&self) -> bool {
        matches!(self.result, Answer::Ok { .. })
    }
}

fn classify(r: Result<Response, GetError>) -> Answer {
    match r {
        Ok(r) if (200..300).contains(&r.status) => Answer::Ok {
            instance: serde_json::from_str::<serde_json::Value>(&r.body)
                .ok()
                .and_then(|v| v["instance"].as_str().map(str::to_owned)),
        },
        Ok(r) => Answer::Status { status: r.status },
        Err(GetError::Connect(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Answer::Refused
        }
        Err(_) => Answer::Failed,
    }
}

/// A running generator: `rate` requests per second to `target`, each in its own task so a
/// slow answer never delays the schedule.
#[derive(Debug)]
pub struct Generator {
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    task: tokio::task::JoinHandle<()>,
    /// Closed once the sending loop and every request it started are done: each holds a
    /// sender, and nothing is ever sent.
    in_flight: tokio::sync::mpsc::Receiver<()>,
}

impl Generator {
    /// Starts sending `GET /` to `target` at `rate` per second; times are measured from
    /// `epoch`; each request gives up after `timeout`.
    pub fn start(target: SocketAddr, rate: u32, timeout: Duration, epoch: Instant) -> Self {
        let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
        let sink = Arc::clone(&outcomes);
        let period = Duration::from_secs(1) / rate.max(1);
        let (alive, in_flight) = tokio::sync::mpsc::channel::<()>(1);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let sink = Arc::clone(&sink);
                let alive = alive.clone();
                tokio::spawn(async move {
                    let _alive = alive;
                    let sent = Instant::now();
                    let result = classify(get(target, "/", timeout).await);
                    let outcome = Outcome {
                        at_ms: ms(sent.duration_since(epoch)),
                        latency_ms: ms(sent.elapsed()),
                        result,
                    };
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(outcome);
                });
            }
        });
        Self {
            outcomes,
            task,
            in_flight,
        }
    }

    /// How many outcomes are recorded so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// A handle that counts the outcomes recorded so far, for progress lines.
    pub fn tally(&self) -> Tally {
        Tally(Arc::clone(&self.outcomes))
    }

    /// Whether nothing is recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops sending, waits until the requests in flight are answered (at most `drain`),
    /// and returns every outcome ordered by send time.
    pub async fn stop(mut self, drain: Duration) -> Vec<Outcome> {
        self.task.abort();
        let _ = (&mut self.task).await;
        // Every request gives up within its own timeout, so this ends well before `drain`
        // unless the runtime is starved; it only bounds the wait.
        let _ = tokio::time::timeout(drain, self.in_flight.recv()).await;
        let mut all = self.lock().clone();
        all.sort_by_key(|o| o.at_ms);
        all
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Outcome>> {
        self.outcomes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Counts a running generator's outcomes.
#[derive(Debug, Clone)]
pub struct Tally(Arc<Mutex<Vec<Outcome>>>);

impl Tally {
    /// Requests answered (or given up) so far, and how many of them failed.
    pub fn counts(&self) -> (usize, usize) {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        (all.len(), all.iter().filter(|o| !o.ok()).count())
    }

    /// A progress line: totals so far.
    pub fn line(&self) -> String {
        let (n, e) = self.counts();
        format!("traffic: {n} requests so far, {e} failed")
    }
}

/// Whole milliseconds, saturating.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_status_and_body() {
        let r = parse(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\nno").unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.body, "no");
        assert!(parse(b"garbage").is_none());
    }

    #[test]
    fn classifies_who_answered() {
        let ok = Response {
            status: 200,
            body: r#"{"instance":"web-z1-1","service":"web"}"#.into(),
        };
        assert_eq!(
            classify(Ok(ok)),
            Answer::Ok {
                instance: Some("web-z1-1".into())
            }
        );
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(classify(Err(GetError::Connect(refused))), Answer::Refused);
        assert_eq!(classify(Err(GetError::Timeout)), Answer::Failed);
        let unavailable = Response {
            status: 503,
            body: String::new(),
        };
        assert_eq!(classify(Ok(unavailable)), Answer::Status { status: 503 });
    }
}
