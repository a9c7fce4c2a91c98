//! Reconnection admission (ADR-13): at most 5% of the known client population per 10 s.
//!
//! When a server restarts, or a peer server dies, every client comes back at once; letting
//! them all in together is how a recovered tier is knocked over again. The controller admits
//! up to a share of the known population per window (with a floor, so a small deployment is
//! never throttled to nothing) and refuses the rest with a retry hint that spreads the
//! backlog over the following windows; clients add full jitter on top. Pure: time is passed in.
//!
//! A client that already holds an open stream here is not arriving: a node agent keeps a
//! standby stream at a second member and, when its own member dies, opens its new stream
//! beside the standby it holds. So a verified client (mutual TLS; an address can be shared
//! and proves nothing) holding exactly one open stream is let in without taking a place in
//! the window — it moves no new client onto this server, and its connection is already up.
//! A third concurrent stream, or any stream from a client known only by its address, is
//! counted as every other.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use waymark_core::defaults as d;
use waymark_core::units::Permille;

/// Limits.
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// Share of the known population admitted per window.
    pub share: Permille,
    /// The window.
    pub window: Duration,
    /// Admissions always allowed per window, whatever the population.
    pub floor: u32,
    /// Population to assume before clients have been seen (e.g. after a restart).
    pub expected_clients: u32,
    /// Distinct clients remembered (bounds memory).
    pub known_max: usize,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            share: d::RECONNECT_PERMILLE,
            window: d::RECONNECT_WINDOW,
            floor: 10,
            expected_clients: 0,
            known_max: 1_000_000,
        }
    }
}

/// Who asks to connect, as far as the server can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller<'a> {
    /// A certificate identity, verified by the TLS handshake.
    Verified(&'a str),
    /// Known only by something it does not prove (its address).
    Unverified(&'a str),
}

impl<'a> Caller<'a> {
    /// What the client is counted as.
    pub fn key(self) -> &'a str {
        match self {
            Self::Verified(k) | Self::Unverified(k) => k,
        }
    }
}

/// The verdict on one connection attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Serve it.
    Yes,
    /// Serve it outside the window: a verified client opening a stream beside the one it
    /// holds here (a standby being promoted).
    Beside,
    /// Refuse it; come back no sooner than `retry_after` (plus jitter).
    No {
        /// The hint.
        retry_after: Duration,
    },
}

/// The admission controller. See the module documentation.
///
/// The window slides: a connection is admitted when fewer than [`Self::allowed`] were in
/// the last `window`, so no 10 s interval, wherever it starts, holds more than the share. (A
/// counter reset at window boundaries lets twice the share through across a boundary.)
#[derive(Debug)]
pub struct AdmissionController {
    config: AdmissionConfig,
    known: BTreeSet<String>,
    /// When each admission of the last window happened, oldest first.
    admitted: VecDeque<Instant>,
    /// The windows refused clients were told to come back in, oldest first: when each
    /// starts and how many were sent to it. Each gets at most what a window admits.
    booked: VecDeque<(Instant, u32)>,
    /// Streams open now, per client (admitted and not yet closed); no entry at zero.
    open: BTreeMap<String, u32>,
}

impl AdmissionController {
    /// A controller with no history.
    pub fn new(config: AdmissionConfig) -> Self {
        Self {
            config,
            known: BTreeSet::new(),
            admitted: VecDeque::new(),
            booked: VecDeque::new(),
            open: BTreeMap::new(),
        }
    }

    /// A client asks to open a stream. On `Yes` or `Beside` the stream counts as open until
    /// [`Self::handle_closed`] is called for it.
    pub fn handle_connect(&mut self, now: Instant, caller: Caller<'_>) -> Admit {
        let client = caller.key();
        if let Caller::Verified(key) = caller
            && self.open.get(key) == Some(&1)
        {
            self.open.insert(key.to_owned(), 2);
            return Admit::Beside;
        }
        let verdict = self.handle_arrival(now, client);
        if verdict == Admit::Yes {
            *self.open.entry(client.to_owned()).or_default() += 1;
        }
        verdict
    }

    /// A stream admitted for `client` (the key its [`Caller`] carried) ended.
    pub fn handle_closed(&mut self, client: &str) {
        if let Some(n) = self.open.get_mut(client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.open.remove(client);
            }
        }
    }

    /// A client with no stream to stand beside: the sliding window decides.
    fn handle_arrival(&mut self, now: Instant, client: &str) -> Admit {
        while self
            .admitted
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= self.config.window)
        {
            self.admitted.pop_front();
        }
        if self.known.len() < self.config.known_max {
            self.known.insert(client.to_owned());
        }
        let allowed = self.allowed();
        if self.admitted.len() < allowed as usize {
            self.admitted.push_back(now);
            return Admit::Yes;
        }
        // The next place frees when the oldest admission leaves the window; the refused
        // are sent to the first window from then that still has room, each window taking
        // what one admits. Spreading by the refused count divided by what a window admits
        // would herd them after a restart (the population, and so `allowed`, grows with
        // every arrival, so nearly every late arrival got the same, last window), and a
        // fixed rotation over the population's windows would keep a short backlog waiting
        // as long as a long one.
        let window = self.config.window;
        let earliest = self.admitted.front().map_or(now + window, |t| *t + window);
        while self
            .booked
            .front()
            .is_some_and(|(start, _)| *start + window <= now)
        {
            self.booked.pop_front();
        }
        let slot = match self
            .booked
            .iter_mut()
            .find(|(start, n)| *start >= earliest && *n < allowed)
        {
            Some(slot) => slot,
            None => {
                let start = self
                    .booked
                    .back()
                    .map_or(earliest, |(last, _)| (*last + window).max(earliest));
                self.booked.push_back((start, 0));
                self.booked.back_mut().expect("just pushed")
            }
        };
        slot.1 += 1;
        Admit::No {
            retry_after: slot.0.saturating_duration_since(now),
        }
    }

    /// The population the limits are computed from: the clients seen, or the expected
    /// number when more.
    fn population_estimate(&self) -> u64 {
        (self.known.len() as u64).max(u64::from(self.config.expected_clients))
    }

    /// Admissions allowed per window at the current population.
    pub fn allowed(&self) -> u32 {
        let population = self.population_estimate();
        let share = (population * u64::from(self.config.share.get()) / 1000) as u32;
        share.max(self.config.floor)
    }

    /// Clients seen so far.
    pub fn population(&self) -> usize {
        self.known.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn a_burst_of_reconnects_is_admitted_five_percent_per_window() {
        // Goal: ADR-13 — 2,000 known clients reconnecting at once get 100 per 10 s.
        let config = AdmissionConfig {
            expected_clients: 2_000,
            ..AdmissionConfig::default()
        };
        let mut c = AdmissionController::new(config);
        let now = t0();
        let verdicts: Vec<Admit> = (0..2_000)
            .map(|i| c.handle_connect(now, Caller::Unverified(&format!("envoy-{i}"))))
            .collect();
        let admitted = verdicts.iter().filter(|v| **v == Admit::Yes).count();
        assert_eq!(admitted, 100);
        // The hints spread the refused over the following windows, up to the last.
        let hints: Vec<Duration> = verdicts
            .iter()
            .filter_map(|v| match v {
                Admit::No { retry_after } => Some(*retry_after),
                Admit::Yes | Admit::Beside => None,
            })
            .collect();
        assert_eq!(hints.first(), Some(&Duration::from_secs(10)));
        assert_eq!(hints.last(), Some(&Duration::from_secs(10 * 19)));
        // The next window admits the next hundred.
        let later = now + Duration::from_secs(10);
        let next = (0..200)
            .filter(|i| {
                c.handle_connect(later, Caller::Unverified(&format!("envoy-{i}"))) == Admit::Yes
            })
            .count();
        assert_eq!(next, 100);
    }

    #[test]
    fn after_a_restart_the_hints_spread_the_returning_fleet_instead_of_herding_it() {
        // Goal: ADR-13 — a restarted server knows no client yet (no `expected_clients`):
        // 2,000 clients arriving together must be told to come back spread over the
        // windows it takes to admit them, about 5% per window, not most of them in the same
        // one (which would be refused again, as a herd, a window later).
        let mut c = AdmissionController::new(AdmissionConfig::default());
        let now = t0();
        let mut per_window: BTreeMap<u128, u32> = BTreeMap::new();
        for i in 0..2_000 {
            if let Admit::No { retry_after } =
                c.handle_connect(now, Caller::Unverified(&format!("envoy-{i}")))
            {
                *per_window
                    .entry(retry_after.as_millis() / 10_000)
                    .or_default() += 1;
            }
        }
        let busiest = per_window.values().copied().max().unwrap_or(0);
        assert!(
            busiest <= 100,
            "at most 5% of 2,000 told to return in one window: {per_window:?}"
        );
        // And no later than admitting them all takes: 1,900 at ~100 a window, from 10 s.
        assert!(
            per_window.keys().max().copied().unwrap_or(0) <= 21,
            "{per_window:?}"
        );
    }

    #[test]
    fn no_window_wherever_it_starts_admits_more_than_the_share() {
        // Goal: ADR-13 — at most 5% per 10 s measured from the clients' side, whose 10 s
        // need not start when the server's did. One client at 0 s, a dense crowd around
        // the 10 s mark (where a counter reset at window boundaries admits a window's worth
        // on each side), then 2,000 known clients trying every 50 ms for five minutes.
        let config = AdmissionConfig {
            expected_clients: 2_000,
            ..AdmissionConfig::default()
        };
        let mut c = AdmissionController::new(config);
        let start = t0();
        let arrivals = std::iter::once(0)
            .chain((0..200).map(|k| 9_000 + 10 * k))
            .chain((0..5_600).map(|k| 20_000 + 50 * k));
        let mut admitted: Vec<Duration> = Vec::new();
        for (i, ms) in arrivals.enumerate() {
            let at = Duration::from_millis(ms);
            if c.handle_connect(
                start + at,
                Caller::Unverified(&format!("envoy-{}", i % 2_000)),
            ) == Admit::Yes
            {
                admitted.push(at);
            }
        }
        let mut lo = 0;
        for hi in 0..admitted.len() {
            while admitted[hi] - admitted[lo] >= Duration::from_secs(10) {
                lo += 1;
            }
            assert!(hi + 1 - lo <= 100, "{} admitted within 10 s", hi + 1 - lo);
        }
        assert!(
            admitted.len() >= 2_900,
            "the cap is used, not starved: {}",
            admitted.len()
        );
    }

    #[test]
    fn a_short_backlog_is_told_to_come_back_in_the_next_window() {
        // The fleet is back but for a few: they are not spread over the whole population's
        // horizon (a rotation over 19 windows kept the last of 2,000 waiting 190 s more).
        let config = AdmissionConfig {
            expected_clients: 2_000,
            ..AdmissionConfig::default()
        };
        let mut c = AdmissionController::new(config);
        let now = t0();
        for i in 0..100 {
            assert_eq!(
                c.handle_connect(now, Caller::Unverified(&format!("envoy-{i}"))),
                Admit::Yes
            );
        }
        let later = now + Duration::from_secs(4);
        for i in 100..105 {
            assert_eq!(
                c.handle_connect(later, Caller::Unverified(&format!("envoy-{i}"))),
                Admit::No {
                    retry_after: Duration::from_secs(6)
                }
            );
        }
    }

    /// A controller whose window is already full (`floor` 1, one stream admitted).
    fn full(now: Instant) -> AdmissionController {
        let mut c = AdmissionController::new(AdmissionConfig {
            floor: 1,
            ..AdmissionConfig::default()
        });
        assert_eq!(
            c.handle_connect(now, Caller::Unverified("someone")),
            Admit::Yes
        );
        c
    }

    #[test]
    fn a_verified_client_holding_a_stream_opens_one_more_beside_it_outside_the_window() {
        // Goal: a node agent promoting its standby after its member died is not a
        // reconnection: the stream it opens beside the standby it holds here is let in
        // even when the window is full, and takes no place in it.
        let now = t0();
        let mut c = AdmissionController::new(AdmissionConfig {
            floor: 2,
            ..AdmissionConfig::default()
        });
        assert_eq!(
            c.handle_connect(now, Caller::Verified("node/a")),
            Admit::Yes
        );
        assert_eq!(
            c.handle_connect(now, Caller::Unverified("ip:x")),
            Admit::Yes
        );
        assert_eq!(
            c.handle_connect(now, Caller::Verified("node/a")),
            Admit::Beside
        );
        // A third concurrent stream is an arrival like any other: refused, window full.
        assert!(matches!(
            c.handle_connect(now, Caller::Verified("node/a")),
            Admit::No { .. }
        ));
        // The standby closes once the new stream is up; the client holds one stream again,
        // so a later promotion is let in beside it again.
        c.handle_closed("node/a");
        assert_eq!(
            c.handle_connect(now, Caller::Verified("node/a")),
            Admit::Beside
        );
    }

    #[test]
    fn a_client_holding_nothing_or_known_only_by_address_is_counted() {
        // Goal: the exemption needs a stream held here and a verified identity. A client
        // whose streams all ended arrives anew; an address (shared by every client behind
        // it, and proving nothing) never stands beside anything.
        let now = t0();
        let mut c = full(now);
        assert!(matches!(
            c.handle_connect(now, Caller::Unverified("someone")),
            Admit::No { .. }
        ));
        c.handle_closed("someone");
        assert!(matches!(
            c.handle_connect(now, Caller::Verified("node/b")),
            Admit::No { .. }
        ));

        let later = now + Duration::from_secs(10);
        let mut c = full(later);
        c.handle_closed("someone");
        // Closing what is not open changes nothing.
        c.handle_closed("someone");
        c.handle_closed("nobody");
        assert!(matches!(
            c.handle_connect(later, Caller::Verified("someone")),
            Admit::No { .. }
        ));
    }

    #[test]
    fn a_small_deployment_is_never_throttled_below_the_floor() {
        let mut c = AdmissionController::new(AdmissionConfig::default());
        let now = t0();
        assert!(
            (0..10)
                .all(|i| c.handle_connect(now, Caller::Unverified(&format!("e{i}"))) == Admit::Yes)
        );
        assert!(matches!(
            c.handle_connect(now, Caller::Unverified("e10")),
            Admit::No { .. }
        ));
    }
}
