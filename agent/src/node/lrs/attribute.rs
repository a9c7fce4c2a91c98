//! Attribution: which instance a flushed address total is about. Pure.
//!
//! Envoy names endpoints by address only; the agent knows which instance is at an address
//! from the `ClusterLoadAssignment`s it serves ([`addresses_from_assignments`]). An Envoy
//! report covers the interval *before* it arrives, and assignments change under it (a
//! Kubernetes pod IP is reused within seconds), so [`WindowBook`] maps an address only if
//! it named the same instance in every assignment set in force over the span the flushed
//! reports can cover. Anything else is unmapped: counted and dropped, because attributing
//! evidence to the wrong instance is worse than losing it.

use std::collections::{BTreeMap, VecDeque};
use std::num::NonZeroUsize;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use waymark_core::model::{InstanceId, Observation};
use waymark_xds::lrs::AddressBook;

use super::aggregate::Flush;
use crate::evidence::WireSample;

/// Address → instance for the EDS resources given, read from the `instance` key waymark
/// writes into each endpoint's metadata. Endpoints without a valid one (or with a non-IP
/// address) are left out; an address two instances claim maps to neither.
pub fn addresses_from_assignments<'a>(
    assignments: impl IntoIterator<Item = &'a ClusterLoadAssignment>,
) -> AddressBook {
    book_of(assignments).0
}

/// The book and how many endpoints were left out.
pub(super) fn book_of<'a>(
    assignments: impl IntoIterator<Item = &'a ClusterLoadAssignment>,
) -> (AddressBook, usize) {
    let mut book = AddressBook::new();
    let skipped = assignments
        .into_iter()
        .map(|a| book.insert_assignment(a))
        .sum();
    (book, skipped)
}

/// The samples of one flush.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributed {
    /// One passive sample per instance, in instance order; never one with zero requests.
    pub samples: Vec<WireSample>,
    /// Endpoint loads whose address mapped to no instance, or to an ambiguous one.
    pub unmapped_loads: u64,
    /// Distinct addresses among them.
    pub unmapped_addresses: usize,
}

/// The address books in force over recent flush windows.
///
/// Holds one merged book per window: the current one, plus `lookback` before it. A flush
/// is attributed with all of them merged, so a load can be attributed only to the instance
/// its address named throughout. Set `lookback` so that `lookback` flush windows span at
/// least one Envoy reporting interval.
#[derive(Debug, Clone)]
pub struct WindowBook {
    /// The book set last.
    current: AddressBook,
    /// Oldest first; the last is the current window's. Never empty.
    windows: VecDeque<AddressBook>,
    lookback: NonZeroUsize,
}

// === impl WindowBook ===

impl WindowBook {
    /// No addresses known yet; attribution looks back `lookback` windows.
    pub fn new(lookback: NonZeroUsize) -> Self {
        Self {
            current: AddressBook::new(),
            windows: VecDeque::from([AddressBook::new()]),
            lookback,
        }
    }

    /// A new book is in force from now on (the agent serves new assignments).
    pub fn handle_book(&mut self, book: AddressBook) {
        if let Some(window) = self.windows.back_mut() {
            window.merge(&book);
        }
        self.current = book;
    }

    /// Attribute a flush, then start the next window with the book in force.
    pub fn handle_flush(&mut self, flush: &Flush) -> Attributed {
        let attributed = attribute(&self.merged(), flush);
        self.windows.push_back(self.current.clone());
        while self.windows.len() > self.lookback.get() + 1 {
            self.windows.pop_front();
        }
        attributed
    }

    /// The book set last.
    pub fn current(&self) -> &AddressBook {
        &self.current
    }

    fn merged(&self) -> AddressBook {
        let mut merged = AddressBook::new();
        for window in &self.windows {
            merged.merge(window);
        }
        merged
    }
}

/// One passive sample per instance: the flush's totals mapped through `book` and summed
/// per instance (several addresses may name the same instance).
pub fn attribute(book: &AddressBook, flush: &Flush) -> Attributed {
    let mut per_instance: BTreeMap<&InstanceId, (u64, u64)> = BTreeMap::new();
    let mut out = Attributed::default();
    for total in &flush.totals {
        match book.instance(&total.address) {
            Some(instance) => {
                let (requests, errors) = per_instance.entry(instance).or_default();
                *requests = requests.saturating_add(total.requests);
                *errors = errors.saturating_add(total.errors);
            }
            None => {
                out.unmapped_loads = out.unmapped_loads.saturating_add(total.loads);
                out.unmapped_addresses += 1;
            }
        }
    }
    out.samples = per_instance
        .into_iter()
        .filter(|(_, (requests, _))| *requests > 0)
        .map(|(instance, (requests, errors))| WireSample {
            instance: instance.clone(),
            observation: Observation::Passive { requests, errors },
        })
        .collect();
    out
}
