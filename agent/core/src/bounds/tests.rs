use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

#[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
fn t0() -> Instant {
    Instant::now()
}

fn set(range: std::ops::Range<u32>) -> BTreeSet<u32> {
    range.collect()
}

#[test]
fn a_single_withdrawal_always_passes_at_once() {
    let t = t0();
    let mut b = ClientBounds::new(BoundsConfig::default());
    b.offer("pay", t, set(0..10));
    // Five single withdrawals in a row, faster than any window: each passes.
    for gone in 0..5 {
        let served = b.offer("pay", t, set(gone + 1..10));
        assert_eq!(served.set, set(gone + 1..10));
        assert!(served.held_back.is_empty());
    }
}

#[test]
fn a_mass_withdrawal_is_slowed_to_the_cap_and_finishes_over_windows() {
    let t = t0();
    let window = Duration::from_secs(10);
    let mut b = ClientBounds::new(BoundsConfig::default());
    b.offer("pay", t, set(0..10));
    let served = b.offer("pay", t, set(9..10));
    // 30% of 10: three go now, six are held back (still served).
    assert_eq!(served.set.len(), 7);
    assert_eq!(served.held_back.len(), 6);
    assert_eq!(b.poll_timeout(), Some(t + window));
    assert!(b.handle_timeout(t + window / 2).is_empty());
    let changed = b.handle_timeout(t + window);
    assert_eq!(changed.len(), 1);
    // 30% of the 7 served, rounded down: two more.
    assert_eq!(changed[0].1.set.len(), 5);
    let mut now = t + window;
    while let Some(next) = b.poll_timeout() {
        now = next;
        b.handle_timeout(now);
    }
    assert_eq!(b.served("pay").unwrap().set, set(9..10));
    assert!(
        now <= t + 8 * window,
        "the cap must not stall the withdrawal forever"
    );
}

#[test]
fn an_empty_view_is_refused_and_declared_and_the_previous_set_kept() {
    let t = t0();
    let mut b = ClientBounds::new(BoundsConfig::default());
    b.offer("pay", t, set(0..3));
    let served = b.offer("pay", t, BTreeSet::new());
    assert!(served.refused_empty);
    assert_eq!(served.set, set(0..3));
    let served = b.offer("pay", t, set(1..3));
    assert!(!served.refused_empty);
    assert_eq!(served.set, set(1..3));
}

#[test]
fn additions_pass_at_once_even_while_removals_are_held() {
    let t = t0();
    let mut b = ClientBounds::new(BoundsConfig::default());
    b.offer("pay", t, set(0..10));
    let served = b.offer("pay", t, set(20..25));
    assert!(set(20..25).is_subset(&served.set));
    assert!(!served.held_back.is_empty());
}

#[test]
fn a_restored_set_is_served_as_is() {
    let t = t0();
    let mut b = ClientBounds::new(BoundsConfig::default());
    b.restore("pay", set(0..4));
    assert_eq!(b.served("pay").unwrap().set, set(0..4));
    // The first offer after a restart is bounded like any other: 30% of 4, at least one.
    let served = b.offer("pay", t, set(0..1));
    assert_eq!(served.set.len(), 3);
}

proptest! {
    /// Whatever the authority sends: every wanted endpoint is served at once, a non-empty
    /// service never becomes empty, held-back endpoints were served before, removals in
    /// any window stay within the cap (single withdrawals excepted), and once offers stop
    /// the served set converges to the wanted one.
    #[test]
    fn bounds_hold_for_any_sequence(
        offers in proptest::collection::vec(
            (proptest::collection::btree_set(0u32..30, 0..20), 0u64..15_000),
            1..40,
        )
    ) {
        let t = t0();
        let config = BoundsConfig::default();
        let mut b = ClientBounds::new(config);
        let mut now = t;
        let mut last_wanted: Option<BTreeSet<u32>> = None;
        for (wanted, advance_ms) in offers {
            now += Duration::from_millis(advance_ms);
            b.handle_timeout(now);
            let before = b.served("pay").map(|s| s.set).unwrap_or_default();
            let served = b.offer("pay", now, wanted.clone());
            if wanted.is_empty() {
                prop_assert_eq!(&served.set, &before);
            } else {
                prop_assert!(wanted.is_subset(&served.set));
                last_wanted = Some(wanted.clone());
                // Net shrink within the cap (a single withdrawal always passes).
                let shrink = before.len().saturating_sub(served.set.len());
                let cap = (before.len() * 300 / 1000).max(1);
                prop_assert!(shrink <= cap, "shrank by {} of {} at once", shrink, before.len());
            }
            if !before.is_empty() {
                prop_assert!(!served.set.is_empty());
            }
            for k in &served.held_back {
                prop_assert!(before.contains(k));
            }
        }
        while let Some(next) = b.poll_timeout() {
            b.handle_timeout(next);
        }
        if let Some(wanted) = last_wanted {
            prop_assert_eq!(b.served("pay").unwrap().set, wanted);
        }
    }
}
