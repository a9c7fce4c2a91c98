//! Prober assignment: which node agents probe which targets (ADR-04, ADR-15).
//!
//! Rendezvous (highest-random-weight) hashing per zone: every (prober, target) pair gets a
//! stable score and each target takes the `per_target` highest-scoring probers of its own
//! zone. The load is bounded and spread, and membership churn moves only what it must: a
//! prober joining or leaving changes only the targets whose top set it enters or leaves.
//! A zone with no live prober borrows from the rest of the region, so its targets are
//! probed rather than left silent. The hash is fixed (FNV-1a with a finaliser), so every
//! replica computes the same assignment. Pure.

use std::collections::BTreeMap;
use waymark_core::hash::{Fnv1a, mix64};

use waymark_core::model::{InstanceId, NodeName, ZoneName};

/// Targets by instance, each with the probers assigned to it (best first).
pub type Assignment = BTreeMap<InstanceId, Vec<NodeName>>;

/// Assign up to `per_target` probers to every target.
///
/// `targets` and `probers` carry their zones; probers are the live members gossip reports.
pub fn assign(
    targets: &[(InstanceId, ZoneName)],
    probers: &[(NodeName, ZoneName)],
    per_target: usize,
) -> Assignment {
    let mut by_zone: BTreeMap<&ZoneName, Vec<&NodeName>> = BTreeMap::new();
    for (node, zone) in probers {
        by_zone.entry(zone).or_default().push(node);
    }
    let everyone: Vec<&NodeName> = probers.iter().map(|(n, _)| n).collect();
    targets
        .iter()
        .map(|(target, zone)| {
            let pool = by_zone
                .get(zone)
                .filter(|p| !p.is_empty())
                .unwrap_or(&everyone);
            (target.clone(), top(pool, target, per_target))
        })
        .collect()
}

/// The `k` probers with the highest score for `target`, best first.
fn top(pool: &[&NodeName], target: &InstanceId, k: usize) -> Vec<NodeName> {
    let mut scored: Vec<(u64, &NodeName)> = pool.iter().map(|n| (score(n, target), *n)).collect();
    // Ties are broken by name so the order is total and identical everywhere.
    scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored.into_iter().take(k).map(|(_, n)| n.clone()).collect()
}

fn score(node: &NodeName, target: &InstanceId) -> u64 {
    let h = Fnv1a::new()
        .chain(node.as_str().as_bytes())
        .chain(&[0xff])
        .chain(target.as_str().as_bytes())
        .finish();
    // Finalised so short, similar names still spread.
    mix64(h)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn node(i: usize) -> NodeName {
        NodeName::try_new(format!("node-{i}")).unwrap()
    }

    fn zone(i: usize) -> ZoneName {
        ZoneName::try_new(format!("zone-{i}")).unwrap()
    }

    fn targets(n: usize, zones: usize) -> Vec<(InstanceId, ZoneName)> {
        (0..n)
            .map(|i| {
                (
                    InstanceId::try_new(format!("inst-{i}")).unwrap(),
                    zone(i % zones),
                )
            })
            .collect()
    }

    fn probers(n: usize, zones: usize) -> Vec<(NodeName, ZoneName)> {
        (0..n).map(|i| (node(i), zone(i % zones))).collect()
    }

    #[test]
    fn each_target_gets_two_probers_of_its_own_zone() {
        let p = probers(12, 3);
        let a = assign(&targets(300, 3), &p, 2);
        for (target, nodes) in &a {
            assert_eq!(nodes.len(), 2, "{target}");
            let t_zone = &targets(300, 3)
                .into_iter()
                .find(|(t, _)| t == target)
                .unwrap()
                .1;
            assert!(
                nodes
                    .iter()
                    .all(|n| &p.iter().find(|(x, _)| x == n).unwrap().1 == t_zone)
            );
        }
        // Spread: no prober carries more than twice its fair share.
        let mut load: BTreeMap<&NodeName, usize> = BTreeMap::new();
        for n in a.values().flatten() {
            *load.entry(n).or_default() += 1;
        }
        let fair = 300 * 2 / 12;
        assert!(load.values().all(|l| *l <= 2 * fair), "{load:?}");
    }

    #[test]
    fn a_zone_without_probers_borrows_from_the_region() {
        let p = vec![(node(1), zone(0))];
        let a = assign(&targets(4, 2), &p, 2);
        assert!(a.values().all(|n| n == &vec![node(1)]));
    }

    proptest! {
        #[test]
        fn removing_a_prober_moves_only_its_targets(n in 3usize..20, gone in 0usize..20) {
            let gone = gone % n;
            let t = targets(200, 2);
            let before = assign(&t, &probers(n, 2), 2);
            let remaining: Vec<_> = probers(n, 2).into_iter().filter(|(x, _)| x != &node(gone)).collect();
            let after = assign(&t, &remaining, 2);
            for (target, nodes) in &before {
                if !nodes.contains(&node(gone)) {
                    prop_assert_eq!(&after[target], nodes, "target {} moved though its probers stayed", target);
                }
            }
        }

        #[test]
        fn assignment_is_deterministic_and_bounded(n in 1usize..20, k in 1usize..4) {
            let t = targets(50, 3);
            let a = assign(&t, &probers(n, 3), k);
            prop_assert_eq!(&a, &assign(&t, &probers(n, 3), k));
            prop_assert!(a.values().all(|v| v.len() <= k && !v.is_empty()));
        }
    }
}
