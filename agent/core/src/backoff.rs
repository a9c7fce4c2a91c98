//! Reconnection backoff, once for every client that reconnects: xDS streams, the
//! resolver, evidence sessions, federation links. Pure: the generator is seeded and time
//! comes in as how long the failed attempt lived.

use std::time::Duration;

use crate::hash::SplitMix64;

/// Reconnection backoff limits.
#[derive(Debug, Clone)]
pub struct BackoffConfig {
    /// The first window.
    pub base: Duration,
    /// The largest window.
    pub cap: Duration,
    /// A stream that stayed up this long resets the backoff: the next failure is new.
    pub healthy_after: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(250),
            cap: Duration::from_secs(30),
            healthy_after: Duration::from_secs(10),
        }
    }
}

/// Full-jitter exponential backoff (AWS "full jitter"): the n-th consecutive failure waits a
/// uniform draw from `[0, min(cap, base·2ⁿ)]`, plus the server's hint when it gave one, so
/// a fleet refused together does not come back together. Pure; the RNG is seeded.
#[derive(Debug, Clone)]
pub struct Backoff {
    config: BackoffConfig,
    attempt: u32,
    rng: SplitMix64,
}

impl Backoff {
    /// A backoff with no failures yet, drawing from `seed`.
    pub fn new(config: BackoffConfig, seed: u64) -> Self {
        Self {
            config,
            attempt: 0,
            rng: SplitMix64::new(seed),
        }
    }

    /// How long to wait after a failure. `lived` is how long the failed stream had been up
    /// (zero if it never opened); `hint` is the server's retry hint, waited in full.
    pub fn next_delay(&mut self, lived: Duration, hint: Option<Duration>) -> Duration {
        if lived >= self.config.healthy_after {
            self.attempt = 0;
        }
        let window = self.window();
        self.attempt = self.attempt.saturating_add(1);
        let window_nanos = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        let draw = self.rng.next_u64();
        let jitter = match window_nanos.checked_add(1) {
            Some(n) => draw % n,
            None => draw,
        };
        let jitter = Duration::from_nanos(jitter);
        hint.map_or(jitter, |h| h.saturating_add(jitter))
    }

    /// A success: the next failure waits from the first window again. For retries that
    /// have no stream lifetime to pass as `lived` (a write that committed, a list that
    /// completed).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Consecutive failures counted so far.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The current window: `min(cap, base·2^attempt)`.
    pub fn window(&self) -> Duration {
        let factor = 1u32 << self.attempt.min(31);
        self.config
            .base
            .checked_mul(factor)
            .map_or(self.config.cap, |w| w.min(self.config.cap))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn config() -> BackoffConfig {
        BackoffConfig::default()
    }

    #[test]
    fn backoff_windows_double_from_250_ms_to_a_30_s_cap_and_draws_stay_inside() {
        let mut b = Backoff::new(config(), 7);
        let mut windows = Vec::new();
        for _ in 0..12 {
            let window = b.window();
            let delay = b.next_delay(Duration::ZERO, None);
            assert!(delay <= window, "{delay:?} > {window:?}");
            windows.push(window.as_millis());
        }
        assert_eq!(
            windows,
            [
                250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000, 30_000,
                30_000
            ]
        );
        for _ in 0..100 {
            b.next_delay(Duration::ZERO, None);
        }
        assert_eq!(
            b.window(),
            Duration::from_secs(30),
            "no overflow after many failures"
        );
    }

    #[test]
    fn backoff_draws_are_spread_not_fixed() {
        // Goal: clients refused together do not come back together.
        let draws: BTreeSet<Duration> = (0..20)
            .map(|seed| Backoff::new(config(), seed).next_delay(Duration::ZERO, None))
            .collect();
        assert!(draws.len() > 15, "{draws:?}");
    }

    #[test]
    fn backoff_is_deterministic_for_a_seed() {
        let run = |seed| {
            let mut b = Backoff::new(config(), seed);
            (0..10)
                .map(|_| b.next_delay(Duration::ZERO, None))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn a_retry_hint_is_waited_in_full_plus_jitter() {
        let hint = Duration::from_secs(7);
        for seed in 0..50 {
            let mut b = Backoff::new(config(), seed);
            let d = b.next_delay(Duration::ZERO, Some(hint));
            assert!(d >= hint && d <= hint + Duration::from_millis(250), "{d:?}");
        }
    }

    #[test]
    fn a_stream_that_stayed_healthy_resets_the_backoff() {
        let mut b = Backoff::new(config(), 3);
        for _ in 0..5 {
            b.next_delay(Duration::from_secs(1), None);
        }
        assert_eq!(b.window(), Duration::from_secs(8));
        let d = b.next_delay(Duration::from_secs(10), None);
        assert!(d <= Duration::from_millis(250));
        assert_eq!(b.attempt(), 1);
    }

    #[test]
    fn a_reset_starts_the_next_failure_from_the_first_window() {
        // Goal: a success ends the run of failures, whatever the failed attempts lived.
        let mut b = Backoff::new(config(), 5);
        for _ in 0..6 {
            b.next_delay(Duration::ZERO, None);
        }
        assert_eq!(b.window(), Duration::from_secs(16));
        b.reset();
        assert_eq!((b.attempt(), b.window()), (0, Duration::from_millis(250)));
        let d = b.next_delay(Duration::ZERO, None);
        assert!(d <= Duration::from_millis(250), "{d:?}");
        assert_eq!(b.attempt(), 1);
    }
}
