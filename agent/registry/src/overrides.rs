//! The override budget: how many times one actor may mark instances of one service out of
//! rotation by hand within a window (ADR-15: overrides are rate-limited per principal per
//! service).
//!
//! Pure: no clock is read; wall-clock time arrives as `now_ms` (data, as the leader stamps
//! it into the log) and monotonic time as `now`. The API grants an override only within
//! both counts:
//!
//! ```text
//! replicated audit log ──► overrides_granted(.., now_ms) < OVERRIDES_PER_WINDOW ─┐
//!                                                                                ├─► granted
//! this leader, at now ───► OverrideLimiter::try_acquire(.., now) ────────────────┘
//! ```
//!
//! The log's count is what a leader change cannot reset: it holds every leader's grants.
//! The limiter covers this leader's grants whose audit records are still in flight.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use waymark_core::model::ServiceName;

use crate::machine::{AuditKind, AuditLog};

/// Overrides one actor may make on one service per window.
pub const OVERRIDES_PER_WINDOW: usize = 5;
/// The override rate window.
pub const OVERRIDE_WINDOW: Duration = Duration::from_secs(600);
/// How far before the window the log is still read: records are appended in time order,
/// give or take the members' clock skew.
const SKEW_MS_MAX: u64 = 60_000;

/// Overrides `actor` was granted (or approved, as a second principal) on `service` within
/// the window before `now_ms`, as the replicated audit log records them (every leader's
/// grants, not only this member's).
pub fn overrides_granted(
    audit: &AuditLog,
    actor: &str,
    service: &ServiceName,
    now_ms: u64,
) -> usize {
    let window = u64::try_from(OVERRIDE_WINDOW.as_millis()).unwrap_or(u64::MAX);
    let since = now_ms.saturating_sub(window);
    audit
        .iter()
        .rev()
        .take_while(|e| e.at_ms >= since.saturating_sub(SKEW_MS_MAX))
        .filter(|e| {
            e.kind == AuditKind::Override
                && e.at_ms >= since
                && (e.outcome == "granted" || e.outcome == crate::budget::OUTCOME_APPROVED)
                && e.actor == actor
                && e.service.as_ref() == Some(service)
        })
        .count()
}

/// Per actor × service sliding-window limiter for overrides, over this member's own
/// grants. Time is passed in; it holds at most [`OVERRIDES_PER_WINDOW`] instants per
/// actor and service.
#[derive(Debug, Default)]
pub struct OverrideLimiter {
    recent: BTreeMap<(String, String), VecDeque<Instant>>,
}

// === impl OverrideLimiter ===

impl OverrideLimiter {
    /// Whether `actor` may override on `service` at `now`; records it if so. A refusal
    /// records nothing, so asking again does not lengthen the wait.
    pub fn try_acquire(&mut self, actor: &str, service: &str, now: Instant) -> bool {
        let q = self
            .recent
            .entry((actor.to_owned(), service.to_owned()))
            .or_default();
        while q
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= OVERRIDE_WINDOW)
        {
            q.pop_front();
        }
        if q.len() >= OVERRIDES_PER_WINDOW {
            return false;
        }
        q.push_back(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use crate::machine::AuditEntry;

    use super::*;

    #[test]
    fn the_override_budget_is_counted_from_the_replicated_audit_log() {
        // Goal: the budget lived in the leader's memory, so a leader change gave every
        // principal a fresh one. Whatever leader granted them, they count.
        let pay = ServiceName::try_new("pay").unwrap_or_else(|e| panic!("{e}"));
        let web = ServiceName::try_new("web").unwrap_or_else(|e| panic!("{e}"));
        let window = u64::try_from(OVERRIDE_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let now = 10 * window;
        let entry = |at_ms, actor: &str, service: &ServiceName, outcome: &str| AuditEntry {
            seq: 0,
            at_ms,
            kind: AuditKind::Override,
            actor: actor.into(),
            service: Some(service.clone()),
            instance: None,
            outcome: outcome.into(),
            detail: Value::Null,
        };
        let audit: AuditLog = [
            entry(now - window - 1, "token/bob", &pay, "granted"), // outside the window
            entry(now - window + 1, "token/bob", &pay, "granted"),
            entry(now - 10, "token/bob", &pay, "refused"),
            entry(now - 5, "token/bob", &web, "granted"),
            entry(now - 4, "token/alice", &pay, "granted"),
            entry(now - 1, "token/bob", &pay, "granted"),
        ]
        .into();
        assert_eq!(overrides_granted(&audit, "token/bob", &pay, now), 2);
        assert_eq!(overrides_granted(&audit, "token/bob", &web, now), 1);
        assert_eq!(overrides_granted(&audit, "token/carol", &pay, now), 0);
    }

    #[test]
    fn an_actor_gets_its_budget_per_service_and_waits_out_the_window_for_more() {
        // Goal: the sixth override of one actor on one service within the window is
        // refused, others' budgets are their own, and refusals do not push the wait out.
        #[allow(clippy::disallowed_methods)] // the one anchor instant of this test
        let t0 = Instant::now();
        let mut limiter = OverrideLimiter::default();
        for _ in 0..OVERRIDES_PER_WINDOW {
            assert!(limiter.try_acquire("token/bob", "pay", t0));
        }
        let later = t0 + OVERRIDE_WINDOW / 2;
        assert!(!limiter.try_acquire("token/bob", "pay", later));
        assert!(limiter.try_acquire("token/bob", "web", later));
        assert!(limiter.try_acquire("token/alice", "pay", later));
        assert!(!limiter.try_acquire(
            "token/bob",
            "pay",
            t0 + OVERRIDE_WINDOW - Duration::from_millis(1)
        ));
        // The first grants leave the window together; the refusals never entered it.
        assert!(limiter.try_acquire("token/bob", "pay", t0 + OVERRIDE_WINDOW));
    }
}
