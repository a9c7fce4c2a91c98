//! Merge is a join: commutative, associative, idempotent; stale never wins; anti-entropy
//! by digest converges; own entries are never overwritten by a peer.

use proptest::prelude::*;

use super::*;
use std::net::{IpAddr, Ipv4Addr};

fn region(n: u8) -> RegionName {
    RegionName::try_new(format!("r{n}")).unwrap()
}

fn service(n: u8) -> ServiceName {
    ServiceName::try_new(format!("s{n}")).unwrap()
}

/// A region's content at a version is a function of (region, service, version), as it is
/// for a correct publisher: one version, one content.
fn entry(r: u8, s: u8, version: u64) -> Entry {
    let endpoints = (0..(version % 4))
        .map(|i| AggregateEndpoint {
            instance: InstanceId::try_new(format!("r{r}-s{s}-v{version}-{i}")).unwrap(),
            address: Address {
                ip: IpAddr::V4(Ipv4Addr::new(10, r, s, i as u8)),
                port: 8080,
            },
            zone: ZoneName::try_new("z1").unwrap(),
            weight: Weight::DEFAULT,
            status: EndpointStatus::Eligible,
            verdict: Verdict::Eligible,
        })
        .collect();
    Entry {
        region: region(r),
        service: service(s),
        version,
        aggregate: Arc::new(ServiceAggregate { endpoints }),
    }
}

fn replica() -> impl Strategy<Value = RegionAggregates> {
    prop::collection::vec((0u8..3, 0u8..3, 1u64..20), 0..12).prop_map(|es| {
        let mut a = RegionAggregates::new();
        let other = region(9);
        let entries = es.into_iter().map(|(r, s, v)| entry(r, s, v)).collect();
        a.merge_from(&region(8), &other, entries).unwrap();
        a
    })
}

proptest! {
    #[test]
    fn merge_is_commutative(a in replica(), b in replica()) {
        let (mut ab, mut ba) = (a.clone(), b.clone());
        ab.merge(&b).unwrap();
        ba.merge(&a).unwrap();
        prop_assert_eq!(ab, ba);
    }

    #[test]
    fn merge_is_associative(a in replica(), b in replica(), c in replica()) {
        let mut left = a.clone();
        left.merge(&b).unwrap();
        left.merge(&c).unwrap();
        let mut bc = b.clone();
        bc.merge(&c).unwrap();
        let mut right = a.clone();
        right.merge(&bc).unwrap();
        prop_assert_eq!(left, right);
    }

    #[test]
    fn merge_is_idempotent(a in replica(), b in replica()) {
        let mut once = a.clone();
        once.merge(&b).unwrap();
        let mut twice = once.clone();
        twice.merge(&b).unwrap();
        prop_assert_eq!(once, twice);
    }

    #[test]
    fn a_stale_delivery_never_overwrites_newer_state(newer in 2u64..50, older in 1u64..50) {
        prop_assume!(older < newer);
        let mut a = RegionAggregates::new();
        a.merge_from(&region(8), &region(1), vec![entry(1, 1, newer)]).unwrap();
        let record = a.merge_from(&region(8), &region(2), vec![entry(1, 1, older)]).unwrap();
        prop_assert_eq!(a.version(&region(1), &service(1)), Some(newer));
        prop_assert_eq!(record.entries[0].outcome, Outcome::KeptOurs);
    }

    #[test]
    fn anti_entropy_by_digest_converges(a in replica(), b in replica()) {
        let (mut a2, mut b2) = (a.clone(), b.clone());
        let to_b = a2.missing_for(&b2.digest());
        let to_a = b2.missing_for(&a2.digest());
        b2.merge_from(&region(7), &region(6), to_b).unwrap();
        a2.merge_from(&region(7), &region(6), to_a).unwrap();
        prop_assert_eq!(a2.digest(), b2.digest());
        prop_assert!(a2.missing_for(&b2.digest()).is_empty());
    }

    #[test]
    fn entries_round_trip_through_the_wire(es in prop::collection::vec((0u8..3, 0u8..3, 1u64..20), 0..6)) {
        let entries: Vec<Entry> = es.into_iter().map(|(r, s, v)| entry(r, s, v)).collect();
        let bytes = serde_json::to_vec(&entries).unwrap();
        let back: Vec<Entry> = serde_json::from_slice(&bytes).unwrap();
        prop_assert_eq!(back, entries);
    }
}

#[test]
fn a_peer_cannot_overwrite_our_own_region() {
    let mut a = RegionAggregates::new();
    a.publish_local(entry(1, 1, 5)).unwrap();
    let record = a
        .merge_from(&region(1), &region(2), vec![entry(1, 1, 9)])
        .unwrap();
    assert_eq!(record.entries[0].outcome, Outcome::IgnoredOwnRegion);
    assert_eq!(a.version(&region(1), &service(1)), Some(5));
}

#[test]
fn two_contents_under_one_version_are_refused_whole() {
    let mut a = RegionAggregates::new();
    a.merge_from(&region(8), &region(2), vec![entry(1, 1, 3)])
        .unwrap();
    let mut forged = entry(1, 1, 3);
    forged.aggregate = Arc::new(ServiceAggregate::default());
    let before = a.clone();
    let err = a
        .merge_from(&region(8), &region(2), vec![entry(1, 2, 1), forged])
        .unwrap_err();
    assert!(matches!(
        err,
        AggregateError::ConflictingVersion { version: 3, .. }
    ));
    assert_eq!(a, before, "nothing from the refused batch was merged");
}

#[test]
fn a_local_publication_must_advance() {
    let mut a = RegionAggregates::new();
    a.publish_local(entry(1, 1, 5)).unwrap();
    assert!(matches!(
        a.publish_local(entry(1, 1, 5)),
        Err(AggregateError::NotNewer { .. })
    ));
}

#[test]
fn reconciliation_records_what_each_side_held() {
    // After a partition: we hold r1/s1@4 and r2/s1@7; the peer brings r1/s1@6 and r2/s1@5.
    let mut a = RegionAggregates::new();
    a.merge_from(&region(8), &region(1), vec![entry(1, 1, 4), entry(2, 1, 7)])
        .unwrap();
    let record = a
        .merge_from(
            &region(8),
            &region(3),
            vec![entry(1, 1, 6), entry(2, 1, 5), entry(2, 2, 1)],
        )
        .unwrap();
    let lines: Vec<_> = record
        .entries
        .iter()
        .map(|e| (e.ours, e.theirs, e.outcome))
        .collect();
    assert_eq!(
        lines,
        vec![
            (Some(4), 6, Outcome::TookTheirs),
            (Some(7), 5, Outcome::KeptOurs),
            (None, 1, Outcome::TookTheirs)
        ]
    );
    assert_eq!(record.changed().count(), 2);
    assert_eq!(
        a.remote_endpoints(&region(1), &service(1)).len(),
        (6 % 4) as usize
    );
}

#[test]
fn remote_endpoints_are_qualified_by_region_so_equal_ids_do_not_collide() {
    let mut a = RegionAggregates::new();
    // Both regions number their registrations alike: the same ids in each.
    a.merge_from(&region(8), &region(9), vec![entry(1, 1, 3), entry(2, 1, 3)])
        .unwrap();
    let ids = |r: u8| -> Vec<String> {
        a.remote_endpoints(&region(r), &service(1))
            .into_iter()
            .map(|e| e.instance.to_string())
            .collect()
    };
    assert_eq!(ids(1), ["r1:r1-s1-v3-0", "r1:r1-s1-v3-1", "r1:r1-s1-v3-2"]);
    assert!(ids(2).iter().all(|id| id.starts_with("r2:")));
}
