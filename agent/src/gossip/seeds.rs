//! Seeds by name: resolving them at each join attempt, and keeping track of which fail.
//!
//! A seed is `host:port`; a DNS name may stand for several members (a headless Service) and
//! for different addresses over time (a pod restarted with a new IP), so it is resolved again
//! for every announce round, never once at start-up. A name that does not resolve costs that
//! round for that name only: it is logged, counted, and tried again at the next round.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use futures::future::join_all;

use crate::net::{HostPort, ResolveError};

/// How long one name may take to resolve before its round is given up.
pub const SEED_RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// What one seed resolved to in a round.
#[derive(Debug)]
pub(super) struct Resolved {
    /// The seed as configured.
    pub(super) seed: HostPort,
    /// Its addresses now, or why there are none this round.
    pub(super) outcome: Result<Vec<SocketAddr>, SeedError>,
}

/// Why a seed gave no address this round. Gossip carries on with the other seeds and tries
/// this one again at the next announce.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeedError {
    /// The resolver answered with an error or with no address.
    #[error("seed did not resolve")]
    Resolve(#[from] ResolveError),
    /// The resolver did not answer in time.
    #[error("seed did not resolve within {timeout_ms} ms")]
    Timeout {
        /// The bound.
        timeout_ms: u64,
    },
}

// === impl SeedError ===

impl SeedError {
    /// The metric label.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            Self::Resolve(ResolveError::NoAddress { .. }) => "no_address",
            Self::Resolve(_) => "lookup",
            Self::Timeout { .. } => "timeout",
        }
    }
}

/// Resolves every seed concurrently, each bounded by `timeout`; the answer is in seed order.
pub(super) async fn resolve_all(seeds: Vec<HostPort>, timeout: Duration) -> Vec<Resolved> {
    let rounds = seeds.into_iter().map(|seed| async move {
        let outcome = match tokio::time::timeout(timeout, seed.resolve()).await {
            Ok(Ok(addrs)) => Ok(addrs),
            Ok(Err(e)) => Err(SeedError::Resolve(e)),
            Err(_elapsed) => Err(SeedError::Timeout {
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            }),
        };
        Resolved { seed, outcome }
    });
    join_all(rounds).await
}

/// The addresses to announce to this round: every resolved address except our own,
/// without duplicates (two names may stand for one member).
pub(super) fn targets(round: &[Resolved], local: SocketAddr) -> BTreeSet<SocketAddr> {
    round
        .iter()
        .filter_map(|r| r.outcome.as_ref().ok())
        .flatten()
        .copied()
        .filter(|a| *a != local)
        .collect()
}

/// Whether announcing can ever reach anyone: some seed is a name (it may resolve to others
/// later) or an address other than our own.
pub(super) fn worth_announcing(seeds: &[HostPort], local: SocketAddr) -> bool {
    seeds.iter().any(|s| s.socket_addr() != Some(local))
}

/// The seeds that failed in the last round, so that a failure is logged at `warn` once when
/// it starts, and recovery once when it ends, instead of at every round.
#[derive(Debug, Default)]
pub(super) struct FailingSeeds {
    failing: BTreeSet<HostPort>,
}

/// What changed for one seed between rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SeedChange {
    /// It failed, and did not in the last round.
    StartedFailing,
    /// It failed again.
    StillFailing,
    /// It resolved, having failed in the last round.
    Recovered,
    /// It resolved, as before.
    Unchanged,
}

// === impl FailingSeeds ===

impl FailingSeeds {
    /// Records one seed's outcome in this round.
    pub(super) fn record(&mut self, seed: &HostPort, failed: bool) -> SeedChange {
        match (failed, self.failing.contains(seed)) {
            (true, false) => {
                self.failing.insert(seed.clone());
                SeedChange::StartedFailing
            }
            (true, true) => SeedChange::StillFailing,
            (false, true) => {
                self.failing.remove(seed);
                SeedChange::Recovered
            }
            (false, false) => SeedChange::Unchanged,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(s: &str) -> HostPort {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn each_seed_resolves_on_its_own_and_a_bad_name_costs_only_itself() {
        let seeds = vec![
            hp("127.0.0.1:7946"),
            hp("seed.invalid:7946"),
            hp("localhost:7947"),
        ];
        let round = resolve_all(seeds.clone(), SEED_RESOLVE_TIMEOUT).await;
        assert_eq!(
            round.iter().map(|r| r.seed.clone()).collect::<Vec<_>>(),
            seeds,
            "in seed order"
        );
        assert_eq!(
            round[0].outcome.as_ref().unwrap(),
            &vec!["127.0.0.1:7946".parse::<SocketAddr>().unwrap()]
        );
        let e = round[1].outcome.as_ref().unwrap_err();
        // A timeout only where no resolver answers at all.
        assert!(
            matches!(e.reason(), "lookup" | "no_address" | "timeout"),
            "{e:?}"
        );
        assert!(round[2].outcome.is_ok(), "{:?}", round[2].outcome);

        // Our own address is not a target; the rest are, once each.
        let local: SocketAddr = "127.0.0.1:7946".parse().unwrap();
        let t = targets(&round, local);
        assert!(!t.contains(&local));
        assert!(
            t.iter().all(|a| a.port() == 7947 && a.ip().is_loopback()),
            "{t:?}"
        );
        assert!(!t.is_empty());
    }

    #[test]
    fn a_name_is_always_worth_announcing_to_and_our_own_address_never() {
        let local: SocketAddr = "10.0.0.1:7946".parse().unwrap();
        assert!(!worth_announcing(&[], local));
        assert!(!worth_announcing(&[hp("10.0.0.1:7946")], local));
        assert!(worth_announcing(&[hp("10.0.0.2:7946")], local));
        // A headless Service's name may stand for us alone now and for others later.
        assert!(worth_announcing(
            &[hp("waymark-authority.waymark.svc.cluster.local:7946")],
            local
        ));
    }

    #[test]
    fn a_failing_seed_is_reported_when_it_starts_and_when_it_ends() {
        let mut f = FailingSeeds::default();
        let a = hp("seed-a.example:7946");
        let b = hp("seed-b.example:7946");
        assert_eq!(f.record(&a, false), SeedChange::Unchanged);
        assert_eq!(f.record(&a, true), SeedChange::StartedFailing);
        assert_eq!(f.record(&b, true), SeedChange::StartedFailing);
        assert_eq!(f.record(&a, true), SeedChange::StillFailing);
        assert_eq!(f.record(&a, false), SeedChange::Recovered);
        assert_eq!(f.record(&a, false), SeedChange::Unchanged);
        assert_eq!(f.record(&b, true), SeedChange::StillFailing);
    }
}
