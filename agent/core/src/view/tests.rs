//! View diff/apply: exact inverses, and disjoint removals and updates.

use proptest::prelude::*;

use super::*;
use crate::testkit::*;

pub(crate) fn endpoint(
    n: u8,
    zone_name: &str,
    weight: u32,
    status: EndpointStatus,
) -> ViewEndpoint {
    let i = instance("pay", &format!("pay-{n}"), zone_name, n);
    ViewEndpoint {
        instance: i.id,
        address: i.address,
        region: region(),
        zone: zone(zone_name),
        tier: Tier::Local,
        priority: 0,
        weight: Weight::new(weight),
        status,
        verdict: Verdict::Eligible,
        tags: Arc::default(),
        metadata: Arc::default(),
        capability: None,
    }
}

fn view_strategy() -> impl Strategy<Value = View> {
    let status = prop_oneof![
        Just(EndpointStatus::Eligible),
        Just(EndpointStatus::Degraded),
        Just(EndpointStatus::Unknown),
        Just(EndpointStatus::Disregarded),
        Just(EndpointStatus::Draining)
    ];
    let ep = (
        0u8..12,
        prop_oneof![Just("a"), Just("b")],
        1u32..200,
        status,
    )
        .prop_map(|(n, z, w, s)| endpoint(n, z, w, s));
    (prop::collection::vec(ep, 0..12), any::<bool>()).prop_map(|(eps, guarded)| {
        let mut v = View::empty(ViewKey {
            service: svc("pay"),
            zone: zone("a"),
        });
        for e in eps {
            v.endpoints.insert(e.instance.clone(), e);
        }
        if guarded {
            v.markers.health_disregarded.insert(zone("a"));
        }
        v
    })
}

proptest! {
    #[test]
    fn applying_the_diff_reproduces_the_new_view(old in view_strategy(), new in view_strategy()) {
        let delta = diff(&old, &new);
        prop_assert_eq!(apply(&old, &delta), new.clone());
        let removed: BTreeSet<_> = delta.removed.iter().collect();
        prop_assert!(delta.upserted.iter().all(|e| !removed.contains(&e.instance)));
        prop_assert_eq!(delta.is_empty(&old.markers), old == new);
    }

    #[test]
    fn changed_yields_each_differing_instance_once_with_what_each_view_holds(old in view_strategy(), new in view_strategy()) {
        let ids: Vec<_> = old
            .endpoints
            .keys()
            .chain(new.endpoints.keys())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|id| old.endpoints.get(*id) != new.endpoints.get(*id))
            .collect();
        let pairs: Vec<_> = changed(&old.endpoints, &new.endpoints).collect();
        prop_assert_eq!(pairs.len(), ids.len());
        for (id, (was, is)) in ids.into_iter().zip(pairs) {
            prop_assert_eq!(was, old.endpoints.get(id));
            prop_assert_eq!(is, new.endpoints.get(id));
        }
        // A version derived from another by one change yields that change alone.
        let mut next = old.clone();
        if let Some((id, e)) = old.endpoints.iter().next() {
            let mut e = e.clone();
            e.weight = Weight::new(e.weight.get() % 100 + 1);
            next.endpoints.insert(id.clone(), e);
            let only: Vec<_> = changed(&old.endpoints, &next.endpoints).collect();
            prop_assert_eq!(only.len(), 1);
        }
    }
}

#[test]
fn draining_endpoints_are_present_but_not_routed() {
    let mut v = View::empty(ViewKey {
        service: svc("pay"),
        zone: zone("a"),
    });
    let e = endpoint(1, "a", 100, EndpointStatus::Draining);
    v.endpoints.insert(e.instance.clone(), e.clone());
    assert!(!v.routes_to(&e.instance));
    assert_eq!(v.routed_in(&zone("a")), 0);
}

#[test]
fn the_counter_is_strictly_increasing_from_where_it_resumes() {
    let mut c = MonotonicCounter::starting_after(Version(41));
    assert_eq!(c.next_version(), Some(Version(42)));
    assert_eq!(c.next_version(), Some(Version(43)));
    let mut last = MonotonicCounter::starting_after(Version(u64::MAX - 1));
    assert_eq!(last.next_version(), Some(Version(u64::MAX)));
    assert_eq!(
        last.next_version(),
        None,
        "an exhausted counter never wraps"
    );
}
