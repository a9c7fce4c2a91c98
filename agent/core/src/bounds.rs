//! Client-side bounds (ADR-01): what a client does with a view before it serves it.
//!
//! The authority is trusted, but not blindly. A node agent (or the resolver library) serves
//! its host from the last view it accepted, and a new view is accepted through two bounds:
//!
//! - **never empty**: a view that would leave a service with no endpoint, when it had some,
//!   is refused whole; the previous set is kept and the refusal is declared (an error never
//!   reaches here at all: the shell keeps the previous view on any error);
//! - **shrink cap**: at most [`BoundsConfig::shrink_max`] of a service's endpoints may be
//!   removed per [`BoundsConfig::shrink_window`]; the excess is *held back* (still served)
//!   and released as the window allows. A single withdrawal always passes at once — the
//!   common case, a dead instance, must never wait.
//!
//! Additions always pass. Pure: time is passed in, and the caller asks
//! [`ClientBounds::poll_timeout`] when held-back removals may go.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use crate::units::Permille;

/// Limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundsConfig {
    /// Share of a service's endpoints that may be removed per window.
    pub shrink_max: Permille,
    /// The window.
    pub shrink_window: Duration,
}

impl Default for BoundsConfig {
    /// 30% per 10 s.
    fn default() -> Self {
        Self {
            shrink_max: Permille::saturating(300),
            shrink_window: Duration::from_secs(10),
        }
    }
}

/// What was served for one service after an offer or a timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served<K> {
    /// The set to serve now.
    pub set: BTreeSet<K>,
    /// Endpoints the authority withdrew that are still served (shrink cap).
    pub held_back: BTreeSet<K>,
    /// The offer would have emptied the service and was refused; the previous set stays.
    pub refused_empty: bool,
}

#[derive(Debug, Clone)]
struct ServiceBounds<K> {
    /// What the authority last asked for.
    wanted: BTreeSet<K>,
    /// What is served.
    served: BTreeSet<K>,
    /// Removals that passed, with when.
    removals: VecDeque<(Instant, usize)>,
    refused_empty: bool,
}

/// The bounds for every service a client serves. Keys identify endpoints (addresses).
#[derive(Debug, Clone)]
pub struct ClientBounds<K> {
    config: BoundsConfig,
    services: BTreeMap<String, ServiceBounds<K>>,
}

impl<K: Ord + Clone> ClientBounds<K> {
    /// Bounds with `config`.
    pub fn new(config: BoundsConfig) -> Self {
        Self {
            config,
            services: BTreeMap::new(),
        }
    }

    /// Start from a set served before (loaded from the last-known-good cache): it is
    /// served as is.
    pub fn restore(&mut self, service: &str, set: BTreeSet<K>) {
        self.services.insert(
            service.to_owned(),
            ServiceBounds {
                wanted: set.clone(),
                served: set,
                removals: VecDeque::new(),
                refused_empty: false,
            },
        );
    }

    /// The authority's new set for `service`: returns what to serve now.
    pub fn offer(&mut self, service: &str, now: Instant, wanted: BTreeSet<K>) -> Served<K> {
        let config = self.config;
        let entry = self
            .services
            .entry(service.to_owned())
            .or_insert_with(|| ServiceBounds {
                wanted: BTreeSet::new(),
                served: BTreeSet::new(),
                removals: VecDeque::new(),
                refused_empty: false,
            });
        if wanted.is_empty() && !entry.served.is_empty() {
            // Keep what we have; the authority's own fraction guard should never ask for
            // this, so it is declared rather than obeyed.
            entry.refused_empty = true;
            return entry.report();
        }
        entry.refused_empty = false;
        entry.wanted = wanted;
        entry.settle(now, config);
        entry.report()
    }

    /// Forget a service (the authority removed its cluster).
    pub fn remove(&mut self, service: &str) {
        self.services.remove(service);
    }

    /// When held-back removals may next be released.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let window = self.config.shrink_window;
        self.services
            .values()
            .filter(|s| !s.held_back().is_empty())
            .filter_map(|s| s.removals.front().map(|(t, _)| *t + window))
            .min()
    }

    /// Release what the window allows at `now`; returns the services whose set changed.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<(String, Served<K>)> {
        let config = self.config;
        let mut changed = Vec::new();
        for (name, s) in &mut self.services {
            if s.held_back().is_empty() {
                continue;
            }
            let before = s.served.len();
            s.settle(now, config);
            if s.served.len() != before {
                changed.push((name.clone(), s.report()));
            }
        }
        changed
    }

    /// What is served for `service`.
    pub fn served(&self, service: &str) -> Option<Served<K>> {
        self.services.get(service).map(ServiceBounds::report)
    }
}

impl<K: Ord + Clone> ServiceBounds<K> {
    fn held_back(&self) -> BTreeSet<K> {
        self.served.difference(&self.wanted).cloned().collect()
    }

    fn report(&self) -> Served<K> {
        Served {
            set: self.served.clone(),
            held_back: self.held_back(),
            refused_empty: self.refused_empty,
        }
    }

    /// Serve every addition, and as many removals as the window allows.
    fn settle(&mut self, now: Instant, config: BoundsConfig) {
        while self
            .removals
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= config.shrink_window)
        {
            self.removals.pop_front();
        }
        let before = self.served.len();
        let additions = self.wanted.difference(&self.served).count();
        for k in &self.wanted {
            self.served.insert(k.clone());
        }
        let removals: Vec<K> = self.held_back().into_iter().collect();
        if removals.is_empty() {
            return;
        }
        // The cap bounds how far the set *shrinks* per window: a share of its size, never
        // below one. Endpoints replaced by new ones (a rolling deploy) do not shrink it, so
        // each addition lets one removal through on top of the cap.
        let used: usize = self.removals.iter().map(|(_, n)| n).sum();
        let cap = (before * usize::from(config.shrink_max.get()) / 1000).max(1);
        let allowed = if removals.len() == 1 {
            1 // a single withdrawal always passes at once
        } else {
            cap.saturating_sub(used) + additions
        };
        let passing = removals.len().min(allowed);
        for k in removals.into_iter().take(passing) {
            self.served.remove(&k);
        }
        let shrink = passing.saturating_sub(additions);
        if shrink > 0 {
            self.removals.push_back((now, shrink));
        }
    }
}

#[cfg(test)]
mod tests;
