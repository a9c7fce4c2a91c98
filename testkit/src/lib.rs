//! Waiting for state that offers nothing to wait on: bounded polling with a message.
//!
//! Tests and drills often need "this holds soon": Envoy applied a cluster, a peer counted a
//! refusal, another process answers. Where a signal exists (a `watch` channel, a join
//! handle, a reload event) wait on it. Where the state can only be asked for (an admin API,
//! a counter, a file another process writes), poll it with a bound: [`until`] asks every
//! [`POLL_INTERVAL`] and, past its deadline, panics naming what it waited for and what it
//! saw last. Neither is ever replaced by a fixed sleep.
//!
//! ```text
//! check() ──► Progress ──► done: the value
//!                     └──► not yet (+ what was seen) ──► sleep ──► check() …  ──► deadline: panic / TimedOut
//! ```
//!
//! A check answers with a [`Progress`]: `bool`, `Option<T>` (done, with a value), or
//! `Result<T, E>` (`Err` is "not yet", and `E` is what was seen, printed on timeout).
//! [`try_until`] is the same wait returning [`TimedOut`] instead of panicking, for callers
//! that report failures as errors (the drills).
//!
//! Time is `tokio::time`, so a test under `tokio::time::pause()` waits in virtual time.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
#![deny(missing_docs)]

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

/// How often [`until`] asks again: short, since what is awaited is usually a loopback call
/// away, and long enough that polling does not compete with the work it waits for.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// What one check found: done (with a value), or not yet (with what it saw, if anything).
pub trait Progress {
    /// What the wait returns once done.
    type Value;

    /// `Ok` when done; `Err` when not yet, carrying what was seen for the timeout message.
    fn into_progress(self) -> Result<Self::Value, Option<String>>;
}

/// Polls `check` every [`POLL_INTERVAL`] until it reports done, and returns its value.
///
/// # Panics
///
/// After `deadline`, with `what` and the last thing `check` saw (see [`TimedOut`]).
pub async fn until<P: Progress>(
    what: &str,
    deadline: Duration,
    check: impl AsyncFnMut() -> P,
) -> P::Value {
    match try_until(what, deadline, POLL_INTERVAL, check).await {
        Ok(value) => value,
        Err(timed_out) => panic!("{timed_out}"),
    }
}

/// Polls `check` every `interval` until it reports done; after `deadline` (checked once
/// more at the deadline itself), returns [`TimedOut`] instead.
pub async fn try_until<P: Progress>(
    what: &str,
    deadline: Duration,
    interval: Duration,
    mut check: impl AsyncFnMut() -> P,
) -> Result<P::Value, TimedOut> {
    let give_up = Instant::now() + deadline;
    loop {
        let last = match check().await.into_progress() {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        let now = Instant::now();
        if now >= give_up {
            return Err(TimedOut {
                what: what.to_owned(),
                waited: deadline,
                last,
            });
        }
        tokio::time::sleep_until((now + interval).min(give_up)).await;
    }
}

/// A wait that ran out: what was awaited, for how long, and what the last check saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    what: String,
    waited: Duration,
    last: Option<String>,
}

// === impl TimedOut ===

impl TimedOut {
    /// What was awaited.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// What the last check saw, when it said.
    pub fn last(&self) -> Option<&str> {
        self.last.as_deref()
    }
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}",
            self.waited, self.what
        )?;
        match &self.last {
            Some(last) => write!(f, "; last seen: {last}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for TimedOut {}

// === impl Progress ===

impl Progress for bool {
    type Value = ();

    fn into_progress(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Progress for Option<T> {
    type Value = T;

    fn into_progress(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

/// `Err(seen)` is "not yet": `seen` (its `Display`) is what the timeout message shows, so
/// a check can hand back the observation it judged, or the error that kept it from one.
impl<T, E: fmt::Display> Progress for Result<T, E> {
    type Value = T;

    fn into_progress(self) -> Result<T, Option<String>> {
        self.map_err(|seen| Some(seen.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn a_wait_returns_the_value_of_the_first_check_that_holds() {
        let mut checks = 0;
        let got = until("the third check", SECOND, async || {
            checks += 1;
            (checks == 3).then_some(checks * 10)
        })
        .await;
        assert_eq!((got, checks), (30, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_out_wait_names_what_it_awaited_and_what_it_saw_last() {
        let mut checks = 0;
        let started = Instant::now();
        let err = try_until("seven", SECOND, POLL_INTERVAL, async || {
            checks += 1;
            Err::<(), _>(format!("{checks} checks"))
        })
        .await
        .unwrap_err();
        assert_eq!(
            started.elapsed(),
            SECOND,
            "the last check is at the deadline"
        );
        assert_eq!(err.what(), "seven");
        assert_eq!(err.last(), Some(format!("{checks} checks").as_str()));
        assert_eq!(
            err.to_string(),
            format!("timed out after 1s waiting for seven; last seen: {checks} checks")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_condition_that_says_nothing_times_out_without_an_observation() {
        let err = try_until("never", SECOND, POLL_INTERVAL, async || false)
            .await
            .unwrap_err();
        assert_eq!(err.last(), None);
        assert_eq!(err.to_string(), "timed out after 1s waiting for never");
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out after 1s waiting for nothing; last seen: 0")]
    async fn until_panics_with_the_timeout_message() {
        until("nothing", SECOND, async || Err::<(), _>(0)).await;
    }
}
