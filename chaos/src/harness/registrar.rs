//! A registration load generator against the authority's API: registers, renews and
//! deregisters instances of one service at a steady rate, through any member (a follower
//! answers `307` to the leader, which the client follows), retrying an operation on the
//! next member when an attempt fails. Every attempt is recorded with its time and what
//! came of it; an acknowledged write is one the API answered with a 2xx.
//!
//! An instance whose lease is past its half is renewed before anything else is done, as a
//! real client keeps its registration alive.
//!
//! Operations run one after another (a renewal or deregistration always names an instance
//! whose registration was acknowledged before), so while an election lasts the rate drops
//! instead of piling requests up.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::Method;
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::rng::SplitMix64;
use crate::traffic::ms;

/// What one operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Register,
    Renew,
    Deregister,
}

/// What came of one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Reply {
    /// 2xx: the write is acknowledged. `issued` is the id a registration was given,
    /// `expires_at_ms` the lease end the API gave (registration and renewal).
    Acked {
        issued: Option<String>,
        expires_at_ms: Option<u64>,
    },
    /// An answer that is not 2xx, with the API's reason.
    Refused { status: u16, reason: String },
    /// No answer: connection refused, reset, timed out, too many redirects.
    Failed { error: String },
}

/// One attempt at one operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    /// When it was sent, ms since the drill's epoch.
    pub t_ms: u64,
    /// The same moment as Unix ms (as data: leases are judged against it).
    pub wall_ms: u64,
    pub latency_ms: u64,
    /// Which operation (numbered from 1) it belongs to; retries share the number.
    pub op_id: u64,
    pub op: Op,
    /// 1 for the first try.
    pub attempt: u32,
    /// The member it was sent to (the leader may have answered after a redirect).
    pub member: SocketAddr,
    /// The instance the operation is about: the id the registration was issued (when
    /// acknowledged) or the id renewed or deregistered.
    pub instance: Option<String>,
    pub result: Reply,
}

impl Attempt {
    /// Whether it was acknowledged.
    pub fn acked(&self) -> bool {
        matches!(self.result, Reply::Acked { .. })
    }
}

/// What the generator does.
#[derive(Debug, Clone, Serialize)]
pub struct RegistrarConfig {
    pub service: String,
    pub region: String,
    pub zones: Vec<String>,
    /// Operations started per second (fewer while attempts fail).
    pub rate: u32,
    pub lease_ms: u64,
    /// Of the operations, how many are renewals and deregistrations (per mille).
    pub renew_permille: u64,
    pub deregister_permille: u64,
    /// At most this many registered instances at once: above it, deregister instead.
    pub max_live: usize,
    /// Tries per operation before it is given up (unacknowledged).
    pub attempts: u32,
    /// How long one attempt may take.
    pub attempt_timeout: Duration,
    /// Pause before the next attempt of a failed operation.
    pub retry_pause: Duration,
    pub seed: u64,
}

/// A running generator.
pub struct Registrar {
    log: Arc<Mutex<Vec<Attempt>>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Registrar {
    /// Starts it against `members` (any of them; each operation starts at the next one).
    pub fn start(config: RegistrarConfig, members: Vec<SocketAddr>, epoch: Instant) -> Self {
        let log: Arc<Mutex<Vec<Attempt>>> = Arc::default();
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(drive(config, members, Arc::clone(&log), stopped, epoch));
        Self { log, stop, task }
    }

    /// Attempts so far, and how many of them were acknowledged.
    pub fn counts(&self) -> (usize, usize) {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        (log.len(), log.iter().filter(|a| a.acked()).count())
    }

    /// Stops after the operation in flight (its attempts cut short) and returns every
    /// attempt.
    pub async fn stop(self) -> Vec<Attempt> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        std::mem::take(&mut *self.log.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// One attempt: the method, path and body, through `member`; the API's answer.
pub async fn attempt(
    member: SocketAddr,
    method: Method,
    path: &str,
    body: Option<&serde_json::Value>,
    timeout: Duration,
) -> Reply {
    let api = super::api_client(member);
    match tokio::time::timeout(timeout, api.send(method, path, body)).await {
        Err(_) => Reply::Failed {
            error: "timed out".to_owned(),
        },
        Ok(Err(e)) => Reply::Failed {
            error: format!("{e:#}"),
        },
        Ok(Ok(r)) if r.status.is_success() => {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            let expires = v["expires_at_ms"]
                .as_u64()
                .or_else(|| v["applied"]["expires_at_ms"].as_u64());
            Reply::Acked {
                issued: v["instance"].as_str().map(str::to_owned),
                expires_at_ms: expires,
            }
        }
        Ok(Ok(r)) => {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            Reply::Refused {
                status: r.status.as_u16(),
                reason: v["error"]["reason"]
                    .as_str()
                    .unwrap_or("unexplained")
                    .to_owned(),
            }
        }
    }
}

/// Now as Unix ms.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, ms)
}

/// A refusal that a retry cannot change (the request itself is wrong for the state).
fn is_final(result: &Reply) -> bool {
    matches!(result, Reply::Refused { status, .. } if (400..500).contains(status) && *status != 429)
}

async fn drive(
    config: RegistrarConfig,
    members: Vec<SocketAddr>,
    log: Arc<Mutex<Vec<Attempt>>>,
    stopped: watch::Receiver<bool>,
    epoch: Instant,
) {
    let mut rng = SplitMix64::new(config.seed);
    // Instances whose registration was acknowledged and which no deregistration has
    // been tried on (the only ones renewed or deregistered), with the lease end the API
    // last acknowledged.
    let mut live: BTreeMap<String, u64> = BTreeMap::new();
    let mut next_member = rng.below(members.len() as u64) as usize;
    let period = Duration::from_secs_f64(1.0 / f64::from(config.rate.max(1)));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut op_id = 0u64;
    while !*stopped.borrow() {
        tick.tick().await;
        op_id += 1;
        let roll = rng.below(1000);
        // A lease past its half is renewed first, as a real client keeps its instance.
        let due = live
            .iter()
            .filter(|(_, end)| **end < wall_ms() + config.lease_ms / 2)
            .min_by_key(|(_, end)| **end)
            .map(|(id, _)| id.clone());
        let op = if due.is_some() {
            Op::Renew
        } else if live.len() >= config.max_live
            || (!live.is_empty() && roll < config.deregister_permille)
        {
            Op::Deregister
        } else if !live.is_empty() && roll < config.deregister_permille + config.renew_permille {
            Op::Renew
        } else {
            Op::Register
        };
        let target = match op {
            Op::Register => None,
            _ => due.or_else(|| {
                live.keys()
                    .nth(rng.below(live.len() as u64) as usize)
                    .cloned()
            }),
        };
        let (method, path, body) = match (op, &target) {
            (Op::Register, _) => {
                let zone = &config.zones[(op_id as usize) % config.zones.len()];
                let body = json!({
                    "service": config.service,
                    "locality": {"region": config.region, "zone": zone, "node": "churn"},
                    "address": {
                        "ip": format!("10.{}.{}.{}", (op_id >> 16) & 0xff, (op_id >> 8) & 0xff, op_id & 0xff),
                        "port": 8080,
                    },
                    "lease_ms": config.lease_ms,
                });
                (Method::POST, "/v1/instances".to_owned(), Some(body))
            }
            (Op::Renew, Some(id)) => (Method::PUT, format!("/v1/instances/{id}/renew"), None),
            (Op::Deregister, Some(id)) => (Method::DELETE, format!("/v1/instances/{id}"), None),
            _ => continue,
        };
        if op == Op::Deregister
            && let Some(id) = &target
        {
            live.remove(id);
        }
        for n in 1..=config.attempts {
            let member = members[next_member % members.len()];
            let sent = Instant::now();
            let wall_ms = wall_ms();
            let result = attempt(
                member,
                method.clone(),
                &path,
                body.as_ref(),
                config.attempt_timeout,
            )
            .await;
            let acked = matches!(result, Reply::Acked { .. });
            let done = acked || is_final(&result);
            let instance = match (op, &result) {
                (Op::Register, Reply::Acked { issued, .. }) => issued.clone(),
                _ => target.clone(),
            };
            if let (Some(id), Reply::Acked { expires_at_ms, .. }) = (&instance, &result)
                && op != Op::Deregister
            {
                live.insert(id.clone(), expires_at_ms.unwrap_or(0));
            }
            let record = Attempt {
                t_ms: ms(sent.duration_since(epoch)),
                wall_ms,
                latency_ms: ms(sent.elapsed()),
                op_id,
                op,
                attempt: n,
                member,
                instance,
                result,
            };
            log.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(record);
            if done || *stopped.borrow() {
                break;
            }
            next_member += 1;
            tokio::time::sleep(config.retry_pause).await;
        }
    }
}
