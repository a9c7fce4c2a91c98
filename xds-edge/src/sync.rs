//! Per-client sync state: what every client was sent, acknowledged and rejected.
//!
//! The data behind a `proxy-status` view (as `istioctl proxy-status` shows for Istio): per
//! client and resource type, the version sent, the version acknowledged, the last NACK with
//! its error, and when the client connected. A view that may be an hour old is only safe
//! if its age is visible. Pure bookkeeping: each stream keeps its own [`ClientSync`] (the
//! server shares it with `proxy-status` readers behind a per-stream lock, so 60,000 streams
//! never queue on one) and stamps times from the server's clock.
//!
//! A server that records held resources ([`crate::ServerConfig::record_held`]; a node agent
//! does, for `proxy-config`) also keeps, per type, the names and versions it has sent the
//! client, so what one client holds can be told apart from what the server serves now.
//!
//! Propagation: a response carries the release stamps of the versions it brings
//! ([`crate::snapshot::Released`]); they wait on the client's type until it acknowledges a
//! response, and each becomes a [`Propagation`] — release to acknowledgement, on the
//! server's clock, passed in as `now`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use waymark_core::delta::Path;

use crate::snapshot::Released;

/// Release stamps one client's type keeps while it has not acknowledged them; past this,
/// the oldest are dropped (a client that never acknowledges is slow, and says so by
/// being stale, not by growing the server).
pub const PENDING_RELEASES_MAX: usize = 64;

/// One release acknowledged by one client: how long after the release, by which path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Propagation {
    /// When the release was made ([`Released::at`]): which release this is, on the
    /// server's clock (every resource one update released shares it).
    pub released_at: Instant,
    /// The withdrawal or admission path.
    pub path: Path,
    /// From the release to the client's acknowledgement.
    pub took: Duration,
    /// From the release upstream to the client's acknowledgement, where the release
    /// carried its age from upstream ([`Released::carried`]): that age plus `took`.
    pub whole: Option<Duration>,
}

/// One client's state for one resource type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeSync {
    /// Version (system version / version_info) of the last response sent.
    pub sent: Option<String>,
    /// Nonce of the last response sent.
    pub sent_nonce: Option<String>,
    /// Version the client last acknowledged.
    pub acked: Option<String>,
    /// The last rejection: (version rejected, the client's error).
    pub last_nack: Option<(String, String)>,
    /// NACKs received.
    pub nacks: u64,
    /// Resources the client holds of this type, as far as we know.
    pub resources: usize,
    /// The resources sent, by name → version, once the server records them
    /// ([`crate::ServerConfig::record_held`]): what the client holds when `acked == sent`
    /// (after a NACK it holds the versions it last acknowledged instead).
    pub held: Option<BTreeMap<String, String>>,
    /// Release stamps of versions sent but not yet acknowledged (at most
    /// [`PENDING_RELEASES_MAX`], oldest first).
    pub pending: Vec<Released>,
}

/// One client's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSync {
    /// The Envoy node id.
    pub node_id: String,
    /// The node's zone, as it declared it.
    pub zone: String,
    /// The node's cluster (Envoy's `--service-cluster`: the service it fronts), as it
    /// declared it.
    pub cluster: String,
    /// The stream serving it.
    pub stream_id: u64,
    /// `delta` or `sotw`.
    pub protocol: &'static str,
    /// The client's verified workload identity, when it connected over mutual TLS.
    pub identity: Option<String>,
    /// When the stream opened.
    pub connected_since: Instant,
    /// Per type URL.
    pub types: BTreeMap<String, TypeSync>,
}

impl ClientSync {
    /// A stream opened.
    pub fn new(
        stream_id: u64,
        node_id: String,
        zone: String,
        protocol: &'static str,
        now: Instant,
    ) -> Self {
        Self {
            node_id,
            zone,
            cluster: String::new(),
            stream_id,
            protocol,
            identity: None,
            connected_since: now,
            types: BTreeMap::new(),
        }
    }

    /// A response was sent.
    pub fn sent(&mut self, type_url: &str, version: &str, nonce: &str, resources: usize) {
        if let Some(t) = self.type_mut(type_url) {
            // Every response of every stream comes here: the strings are rewritten in
            // place rather than allocated anew.
            set(&mut t.sent, version);
            set(&mut t.sent_nonce, nonce);
            t.resources = resources;
        }
    }

    /// Make the record of what the client was sent of `type_url` what `update` leaves.
    /// `update` is given the previous record, so that unchanged entries are not copied.
    pub fn record_held(
        &mut self,
        type_url: &str,
        update: impl FnOnce(&mut BTreeMap<String, String>),
    ) {
        if let Some(t) = self.type_mut(type_url) {
            update(t.held.get_or_insert_with(BTreeMap::new));
        }
    }

    /// The response just [`ClientSync::sent`] of `type_url` brings releases stamped
    /// `released`: they are timed when the client acknowledges it, or a later response.
    pub fn sent_released(&mut self, type_url: &str, released: &[Released]) {
        if released.is_empty() {
            return;
        }
        if let Some(t) = self.type_mut(type_url) {
            t.pending.extend_from_slice(released);
            let over = t.pending.len().saturating_sub(PENDING_RELEASES_MAX);
            t.pending.drain(..over);
        }
    }

    /// The client acknowledged the response with `nonce`.
    pub fn acked(&mut self, type_url: &str, nonce: &str) {
        if let Some(t) = self.types.get_mut(type_url)
            && t.sent_nonce.as_deref() == Some(nonce)
        {
            t.acked.clone_from(&t.sent);
        }
    }

    /// The client acknowledged the response with `nonce` at `now`: every release it was
    /// sent and has not acknowledged yet has reached it. Each is returned with the time
    /// it took — except releases made before this stream opened, whose wait measures
    /// the client's reconnection, not propagation. A stale nonce acknowledges nothing.
    pub fn acked_at(&mut self, type_url: &str, nonce: &str, now: Instant) -> Vec<Propagation> {
        let since = self.connected_since;
        // A type never sent has nothing to acknowledge.
        let Some(t) = self.types.get_mut(type_url) else {
            return Vec::new();
        };
        if t.sent_nonce.as_deref() != Some(nonce) {
            return Vec::new();
        }
        t.acked.clone_from(&t.sent);
        // Drained, not taken: the backlog's allocation is the next response's.
        t.pending
            .drain(..)
            .filter_map(|r| propagation(r, since, now))
            .collect()
    }

    /// The client rejected the response with `nonce`; its acknowledged version stays.
    pub fn nacked(&mut self, type_url: &str, nonce: &str, error: &str) {
        let Some(t) = self.type_mut(type_url) else {
            return;
        };
        let version = if t.sent_nonce.as_deref() == Some(nonce) {
            t.sent.clone()
        } else {
            None
        };
        t.last_nack = Some((version.unwrap_or_default(), error.to_owned()));
        t.nacks += 1;
    }

    /// The type's record, made on its first use.
    fn type_mut(&mut self, type_url: &str) -> Option<&mut TypeSync> {
        // Every send and ACK comes here: only a type's first use allocates its key.
        if !self.types.contains_key(type_url) {
            self.types.insert(type_url.to_owned(), TypeSync::default());
        }
        self.types.get_mut(type_url)
    }
}

/// Make `slot` hold `value`, reusing the string it holds.
pub(crate) fn set(slot: &mut Option<String>, value: &str) {
    match slot {
        Some(held) => {
            held.clear();
            held.push_str(value);
        }
        None => *slot = Some(value.to_owned()),
    }
}

/// The propagation of release `r` to a client connected since `since`, acknowledged at
/// `now`; `None` for a release made before the client connected.
pub fn propagation(r: Released, since: Instant, now: Instant) -> Option<Propagation> {
    (r.at >= since).then(|| {
        let took = now.saturating_duration_since(r.at);
        Propagation {
            released_at: r.at,
            path: r.path,
            took,
            whole: r.carried.map(|c| c.saturating_add(took)),
        }
    })
}

// === client lag: what both roles' xDS servers judge of their clients ===

/// A client lagging this long is stale.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

/// Tracks, per (stream, type), the version sent but not yet acknowledged and since when.
#[derive(Debug, Default)]
pub struct Lag {
    pending: BTreeMap<(u64, String), Pending>,
}

#[derive(Debug)]
struct Pending {
    /// The unacknowledged version and when it was first seen sent.
    version: String,
    version_since: Instant,
    /// When the client first fell behind (kept while newer versions pile up).
    episode_since: Instant,
    over_budget: bool,
}

/// What one sample found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LagReport {
    /// Releases newly past the withdrawal budget without an ACK.
    pub newly_over_budget: u64,
    /// Clients lagging longer than [`STALE_AFTER`].
    pub stale_clients: u64,
    /// Each subscribed client's view age: how long it has acknowledged less than it was
    /// sent (since it first fell behind; zero when it holds what it was sent). A standby
    /// stream, sent nothing, has none.
    pub view_ages: Vec<Duration>,
}

impl Lag {
    /// Take one sample of every client's sync state at `now`.
    pub fn sample(&mut self, clients: &[ClientSync], now: Instant, budget: Duration) -> LagReport {
        let mut report = LagReport::default();
        let mut seen = BTreeMap::new();
        let mut stale_streams = std::collections::BTreeSet::new();
        for c in clients {
            let mut age = Duration::ZERO;
            for (type_url, t) in &c.types {
                let key = (c.stream_id, type_url.clone());
                let Some(sent) = t.sent.as_ref().filter(|s| t.acked.as_ref() != Some(s)) else {
                    continue;
                };
                let mut entry = match self.pending.remove(&key) {
                    Some(p) if &p.version == sent => p,
                    // A newer release: its own budget starts now; the lag episode goes on.
                    Some(p) => Pending {
                        version: sent.clone(),
                        version_since: now,
                        episode_since: p.episode_since,
                        over_budget: false,
                    },
                    None => Pending {
                        version: sent.clone(),
                        version_since: now,
                        episode_since: now,
                        over_budget: false,
                    },
                };
                if now.saturating_duration_since(entry.version_since) >= budget
                    && !entry.over_budget
                {
                    entry.over_budget = true;
                    report.newly_over_budget += 1;
                }
                let behind = now.saturating_duration_since(entry.episode_since);
                if behind >= STALE_AFTER {
                    stale_streams.insert(c.stream_id);
                }
                age = age.max(behind);
                seen.insert(key, entry);
            }
            if holds_anything(c) {
                report.view_ages.push(age);
            }
        }
        self.pending = seen;
        report.stale_clients = stale_streams.len() as u64;
        report
    }
}

/// Whether the stream was sent, or holds, anything: not a standby.
pub fn holds_anything(c: &ClientSync) -> bool {
    c.types
        .values()
        .any(|t| t.sent.is_some() || t.resources > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
    fn t0() -> Instant {
        Instant::now()
    }

    fn stamp(at: Instant, path: Path) -> Released {
        Released {
            at,
            path,
            carried: None,
        }
    }

    #[test]
    fn an_ack_times_every_release_the_client_was_sent_since_its_last_ack() {
        // Goal: releases wait on the type until an ACK of the latest response; each is
        // timed from its release; a stale nonce or a NACK times nothing.
        let t0 = t0();
        let s = Duration::from_secs(1);
        let mut c = ClientSync::new(1, "n".into(), "a".into(), "delta", t0);
        c.sent("eds", "5", "1-1", 1);
        c.sent_released("eds", &[stamp(t0 + s, Path::Withdrawal)]);
        c.sent("eds", "6", "1-2", 1);
        c.sent_released("eds", &[stamp(t0 + 2 * s, Path::Admission)]);
        assert_eq!(c.acked_at("eds", "1-1", t0 + 3 * s), vec![], "stale nonce");
        c.nacked("eds", "1-2", "bad");
        assert_eq!(c.types["eds"].pending.len(), 2, "a NACK keeps them waiting");
        let timed = c.acked_at("eds", "1-2", t0 + 4 * s);
        assert_eq!(
            timed,
            vec![
                Propagation {
                    released_at: t0 + s,
                    path: Path::Withdrawal,
                    took: 3 * s,
                    whole: None,
                },
                Propagation {
                    released_at: t0 + 2 * s,
                    path: Path::Admission,
                    took: 2 * s,
                    whole: None,
                },
            ]
        );
        assert_eq!(c.types["eds"].acked.as_deref(), Some("6"));
        assert!(
            c.acked_at("eds", "1-2", t0 + 5 * s).is_empty(),
            "timed once"
        );
    }

    #[test]
    fn a_release_made_before_the_client_connected_is_not_propagation() {
        // Goal: a reconnecting client catching up on an hour-old view does not count as
        // an hour-long propagation.
        let t0 = t0();
        let s = Duration::from_secs(1);
        let mut c = ClientSync::new(1, "n".into(), "a".into(), "delta", t0 + 10 * s);
        c.sent("eds", "5", "1-1", 2);
        c.sent_released(
            "eds",
            &[
                stamp(t0, Path::Withdrawal),
                stamp(t0 + 11 * s, Path::Withdrawal),
            ],
        );
        assert_eq!(
            c.acked_at("eds", "1-1", t0 + 12 * s),
            vec![Propagation {
                released_at: t0 + 11 * s,
                path: Path::Withdrawal,
                took: s,
                whole: None,
            }]
        );
    }

    #[test]
    fn a_release_that_carried_its_age_from_upstream_is_timed_on_the_whole_path_too() {
        // Goal: a node agent's stamp holds how old the release already was upstream;
        // the sidecar's ACK adds its own wait to it, on the agent's clock alone.
        let t0 = t0();
        let s = Duration::from_secs(1);
        let mut c = ClientSync::new(1, "n".into(), "a".into(), "delta", t0);
        c.sent("eds", "5", "1-1", 1);
        let carried = Released {
            carried: Some(Duration::from_millis(700)),
            ..stamp(t0 + s, Path::Withdrawal)
        };
        c.sent_released("eds", &[carried]);
        assert_eq!(
            c.acked_at("eds", "1-1", t0 + 3 * s),
            vec![Propagation {
                released_at: t0 + s,
                path: Path::Withdrawal,
                took: 2 * s,
                whole: Some(Duration::from_millis(2700)),
            }]
        );
    }

    #[test]
    fn a_client_that_never_acknowledges_keeps_a_bounded_backlog() {
        let t0 = t0();
        let mut c = ClientSync::new(1, "n".into(), "a".into(), "delta", t0);
        for i in 0..(PENDING_RELEASES_MAX as u64 * 2) {
            c.sent("eds", &i.to_string(), &format!("1-{i}"), 1);
            c.sent_released(
                "eds",
                &[stamp(t0 + Duration::from_millis(i), Path::Admission)],
            );
        }
        let pending = &c.types["eds"].pending;
        assert_eq!(pending.len(), PENDING_RELEASES_MAX);
        // The newest are kept.
        assert_eq!(
            pending.last().unwrap().at,
            t0 + Duration::from_millis(PENDING_RELEASES_MAX as u64 * 2 - 1)
        );
    }
}
