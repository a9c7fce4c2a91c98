//! The acknowledgement spans: one per release and hop (`waymark.xds.ack`), from the
//! release to the acknowledgement of the last client it was sent to — the part of a
//! withdrawal's trace that says when the callers actually held it.
//!
//! An xDS server stamps each release with an instant ([`waymark_xds::snapshot::Released`])
//! and reports every client's acknowledgement of it with that instant
//! ([`waymark_xds::sync::Propagation::released_at`]). The role opens a span when it sends
//! a release, naming how many clients it went to, and the span ends when that many have
//! acknowledged it, or when [`ACK_WAIT_MAX`] has passed without (then marked failed,
//! with how many did). [`AckLedger`] is the decision, with time passed in; [`AckSpans`]
//! holds the spans.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry::trace::SpanContext;

use super::{Spanned, Telemetry};

/// How long a release waits for its clients' acknowledgements before its span ends
/// incomplete: the age past which `waymark_xds::sync` calls a client stale.
pub const ACK_WAIT_MAX: Duration = waymark_xds::sync::STALE_AFTER;
/// Releases waiting at most; past this the oldest ends incomplete (a role sending faster
/// than its clients acknowledge says so by failed spans, not by growing).
pub const OPEN_MAX: usize = 256;

/// How one release's wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckOutcome {
    /// The release.
    pub released_at: Instant,
    /// Clients it was sent to.
    pub expected: usize,
    /// Clients that acknowledged it.
    pub acked: usize,
    /// The slowest acknowledgement.
    pub slowest: Duration,
    /// Every client acknowledged it.
    pub complete: bool,
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    expected: usize,
    acked: usize,
    slowest: Duration,
}

/// Releases waiting for their clients' acknowledgements, by release instant (oldest
/// first). Pure: every method takes the time.
#[derive(Debug, Default)]
pub struct AckLedger {
    waiting: BTreeMap<Instant, Waiting>,
}

impl AckLedger {
    /// A release at `released_at` went to `expected` clients. Returns what that ended:
    /// releases past their wait, and the oldest when more than [`OPEN_MAX`] wait.
    pub fn sent(&mut self, released_at: Instant, expected: usize, now: Instant) -> Vec<AckOutcome> {
        let mut ended = self.expire(now);
        if expected == 0 {
            return ended;
        }
        let entry = self.waiting.entry(released_at).or_insert(Waiting {
            expected: 0,
            acked: 0,
            slowest: Duration::ZERO,
        });
        // A release sent again (to a client that connected since) waits for it too.
        entry.expected = entry.expected.max(expected);
        while self.waiting.len() > OPEN_MAX {
            if let Some((at, w)) = self.waiting.pop_first() {
                ended.push(outcome(at, w));
            }
        }
        ended
    }

    /// A client acknowledged the release at `released_at`, `took` after it. Returns what
    /// that ended: the release itself once every client has, and releases past their wait.
    pub fn acked(&mut self, released_at: Instant, took: Duration) -> Vec<AckOutcome> {
        let now = released_at + took;
        let mut ended = Vec::new();
        if let Some(w) = self.waiting.get_mut(&released_at) {
            w.acked += 1;
            w.slowest = w.slowest.max(took);
            if w.acked >= w.expected {
                let w = *w;
                self.waiting.remove(&released_at);
                ended.push(outcome(released_at, w));
            }
        }
        ended.extend(self.expire(now));
        ended
    }

    /// Releases whose wait has passed at `now`, ended incomplete.
    pub fn expire(&mut self, now: Instant) -> Vec<AckOutcome> {
        let Some(cut) = now.checked_sub(ACK_WAIT_MAX) else {
            return Vec::new();
        };
        // Released at or before `cut`: waited the whole of it.
        let kept = self.waiting.split_off(&(cut + Duration::from_nanos(1)));
        let expired = std::mem::replace(&mut self.waiting, kept);
        expired.into_iter().map(|(at, w)| outcome(at, w)).collect()
    }

    /// Releases waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

fn outcome(released_at: Instant, w: Waiting) -> AckOutcome {
    AckOutcome {
        released_at,
        expected: w.expected,
        acked: w.acked,
        slowest: w.slowest,
        complete: w.acked >= w.expected,
    }
}

/// The spans of one hop's releases, ended as [`AckLedger`] decides. Does nothing when
/// export is off.
pub struct AckSpans {
    telemetry: Telemetry,
    hop: &'static str,
    state: Mutex<(AckLedger, BTreeMap<Instant, Spanned>)>,
}

impl std::fmt::Debug for AckSpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckSpans")
            .field("hop", &self.hop)
            .finish_non_exhaustive()
    }
}

impl AckSpans {
    /// Acknowledgement spans for `hop` (`authority_agent` or `agent_sidecar`).
    pub fn new(telemetry: Telemetry, hop: &'static str) -> Self {
        Self {
            telemetry,
            hop,
            state: Mutex::default(),
        }
    }

    /// A release at `released_at` (begun at wall time `start`) was sent to `expected`
    /// clients: its span opens as a child of `parent` (the send's span).
    pub fn sent(
        &self,
        released_at: Instant,
        start: SystemTime,
        parent: &SpanContext,
        expected: usize,
        mut attributes: Vec<KeyValue>,
    ) {
        if !self.telemetry.is_on() {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (ledger, spans) = &mut *state;
        let ended = ledger.sent(released_at, expected, released_at);
        if expected > 0 && !spans.contains_key(&released_at) {
            attributes.push(KeyValue::new("waymark.xds.hop", self.hop));
            attributes.push(KeyValue::new("waymark.xds.expected", expected as i64));
            let span = self.telemetry.span_from(
                "waymark.xds.ack",
                Some(start),
                Some(parent),
                &[],
                attributes,
            );
            spans.insert(released_at, span);
        }
        finish(spans, ended);
    }

    /// A client acknowledged the release at `released_at`, `took` after it.
    pub fn acked(&self, released_at: Instant, took: Duration) {
        if !self.telemetry.is_on() {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (ledger, spans) = &mut *state;
        let ended = ledger.acked(released_at, took);
        finish(spans, ended);
    }

    /// End the spans whose wait has passed at `now` (call it now and then: a release no
    /// client acknowledges is otherwise ended only by the next event).
    pub fn expire(&self, now: Instant) {
        if !self.telemetry.is_on() {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (ledger, spans) = &mut *state;
        let ended = ledger.expire(now);
        finish(spans, ended);
    }
}

fn finish(spans: &mut BTreeMap<Instant, Spanned>, ended: Vec<AckOutcome>) {
    for o in ended {
        let Some(mut span) = spans.remove(&o.released_at) else {
            continue;
        };
        span.set(KeyValue::new("waymark.xds.acked", o.acked as i64));
        span.set(KeyValue::new(
            "waymark.xds.slowest_ack_ms",
            o.slowest.as_millis() as i64,
        ));
        if !o.complete {
            span.fail(format!(
                "{} of {} clients acknowledged within {} s",
                o.acked,
                o.expected,
                ACK_WAIT_MAX.as_secs()
            ));
        }
        span.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
    fn t0() -> Instant {
        Instant::now()
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_release_ends_when_its_last_client_acknowledges() {
        let t0 = t0();
        let mut l = AckLedger::default();
        assert!(l.sent(t0, 3, t0).is_empty());
        assert!(l.acked(t0, 5 * MS).is_empty());
        assert!(l.acked(t0, 40 * MS).is_empty());
        let ended = l.acked(t0, 20 * MS);
        assert_eq!(
            ended,
            vec![AckOutcome {
                released_at: t0,
                expected: 3,
                acked: 3,
                slowest: 40 * MS,
                complete: true,
            }]
        );
        assert!(l.is_empty());
        assert!(l.acked(t0, 60 * MS).is_empty(), "ended once");
    }

    #[test]
    fn a_release_some_client_never_acknowledges_ends_incomplete_at_the_wait() {
        let t0 = t0();
        let mut l = AckLedger::default();
        l.sent(t0, 2, t0);
        l.acked(t0, 10 * MS);
        assert!(l.expire(t0 + ACK_WAIT_MAX - MS).is_empty());
        let ended = l.expire(t0 + ACK_WAIT_MAX);
        assert_eq!(ended.len(), 1);
        assert_eq!((ended[0].acked, ended[0].expected), (1, 2));
        assert!(!ended[0].complete);
        // A later release's events end it too, without a separate sweep.
        let t1 = t0 + Duration::from_secs(1);
        l.sent(t1, 1, t1);
        let ended = l.sent(t1 + ACK_WAIT_MAX, 1, t1 + ACK_WAIT_MAX);
        assert_eq!(
            ended.iter().map(|o| o.released_at).collect::<Vec<_>>(),
            [t1]
        );
    }

    #[test]
    fn releases_are_told_apart_by_their_instant_and_nobody_waits_for_no_client() {
        let t0 = t0();
        let t1 = t0 + 100 * MS;
        let mut l = AckLedger::default();
        l.sent(t0, 1, t0);
        l.sent(t1, 1, t1);
        assert!(l.sent(t1 + MS, 0, t1 + MS).is_empty());
        assert_eq!(l.len(), 2, "a release sent to no client opens nothing");
        let ended = l.acked(t1, 3 * MS);
        assert_eq!(
            ended.iter().map(|o| o.released_at).collect::<Vec<_>>(),
            [t1]
        );
        assert_eq!(l.len(), 1);
        // An acknowledgement of a release nobody opened (made before tracing saw it) is
        // ignored.
        assert!(l.acked(t0 - MS, MS).is_empty());
    }

    #[test]
    fn the_waiting_releases_are_bounded_the_oldest_ending_first() {
        let t0 = t0();
        let mut l = AckLedger::default();
        let mut ended = Vec::new();
        for i in 0..(OPEN_MAX as u32 + 3) {
            let at = t0 + i * MS;
            ended.extend(l.sent(at, 1, at));
        }
        assert_eq!(l.len(), OPEN_MAX);
        let first: Vec<Instant> = ended.iter().map(|o| o.released_at).collect();
        assert_eq!(first, [t0, t0 + MS, t0 + 2 * MS]);
        assert!(ended.iter().all(|o| !o.complete));
    }
}
