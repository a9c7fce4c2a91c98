//! Merge is a join: commutative, associative, idempotent; stale never wins; anti-entropy
//! by digest converges; a peer writes only its own region: never ours, never a third's.

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

/// Region 8's replica of regions 0..3, each entry delivered by its own region.
fn replica() -> impl Strategy<Value = RegionAggregates> {
    prop::collection::vec((0u8..3, 0u8..3, 1u64..20), 0..12).prop_map(|es| {
        let mut a = RegionAggregates::new();
        for (r, s, v) in es {
            a.merge_from(&region(8), &region(r), vec![entry(r, s, v)])
                .unwrap();
        }
        a
    })
}

/// A batch region 1 sends, with at least one entry of another region (0, 2, or the
/// receiver's own 8) somewhere in it.
fn batch_with_a_foreign_entry() -> impl Strategy<Value = Vec<Entry>> {
    let own = prop::collection::vec((0u8..3, 1u64..20), 0..6);
    let foreign = (prop::sample::select(vec![0u8, 2, 8]), 0u8..3, 1u64..20);
    (own, foreign, any::<prop::sample::Index>()).prop_map(|(own, (r, s, v), at)| {
        let mut batch: Vec<Entry> = own.into_iter().map(|(s, v)| entry(1, s, v)).collect();
        let at = at.index(batch.len() + 1);
        batch.insert(at, entry(r, s, v));
        batch
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
        // Late, through another of region 1's members.
        let record = a.merge_from(&region(8), &region(1), vec![entry(1, 1, older)]).unwrap();
        prop_assert_eq!(a.version(&region(1), &service(1)), Some(newer));
        prop_assert_eq!(record.entries[0].outcome, Outcome::KeptOurs);
    }

    #[test]
    fn anti_entropy_by_digest_converges_on_the_senders_region(a in replica(), b in replica()) {
        // Region 1 (holding `a`) answers region 5's (holding `b`) digest of region 1.
        let (sender, receiver) = (region(1), region(5));
        let mut b2 = b.clone();
        let answer = a.missing_of(&sender, &b2.digest_of(&sender));
        prop_assert!(answer.iter().all(|e| e.region == sender));
        b2.merge_from(&receiver, &sender, answer).unwrap();
        prop_assert!(a.missing_of(&sender, &b2.digest_of(&sender)).is_empty());
        for ((r, s), v) in a.digest_of(&sender) {
            prop_assert!(b2.version(&r, &s) >= Some(v));
        }
        // Nothing of any other region moved.
        for other in [0, 2] {
            prop_assert_eq!(b2.digest_of(&region(other)), b.digest_of(&region(other)));
        }
    }

    #[test]
    fn a_batch_naming_another_region_changes_nothing(
        a in replica(),
        batch in batch_with_a_foreign_entry(),
    ) {
        let mut after = a.clone();
        let err = after.merge_from(&region(8), &region(1), batch).unwrap_err();
        prop_assert!(
            matches!(&err, AggregateError::ForeignEntry { sender, region: r, .. }
                if sender == &region(1) && r != &region(1)),
            "{:?}", err
        );
        prop_assert_eq!(after, a);
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
fn a_peer_cannot_write_our_region_or_a_third_one() {
    // We are region 1 and hold our own s1@5 and region 3's s1@2; region 2 sends newer
    // versions of both alongside its own entry. Refused whole: not even region 2's own
    // entry is taken from a batch that lies.
    let mut a = RegionAggregates::new();
    a.publish_local(entry(1, 1, 5)).unwrap();
    a.merge_from(&region(1), &region(3), vec![entry(3, 1, 2)])
        .unwrap();
    let before = a.clone();
    for claimed in [entry(1, 1, 9), entry(3, 1, 9)] {
        let err = a
            .merge_from(
                &region(1),
                &region(2),
                vec![entry(2, 1, 1), claimed.clone()],
            )
            .unwrap_err();
        assert_eq!(
            err,
            AggregateError::ForeignEntry {
                sender: region(2),
                region: claimed.region.clone(),
                service: service(1),
            }
        );
        assert_eq!(a, before, "nothing from the refused batch was merged");
    }
    // A region that claims to be us is refused too.
    let err = a
        .merge_from(&region(1), &region(1), vec![entry(1, 1, 9)])
        .unwrap_err();
    assert!(matches!(err, AggregateError::ForeignEntry { .. }));
    assert_eq!(a, before);
}

#[test]
fn two_contents_under_one_version_are_refused_whole() {
    let mut a = RegionAggregates::new();
    a.merge_from(&region(8), &region(1), vec![entry(1, 1, 3)])
        .unwrap();
    let mut forged = entry(1, 1, 3);
    forged.aggregate = Arc::new(ServiceAggregate::default());
    let before = a.clone();
    let err = a
        .merge_from(&region(8), &region(1), vec![entry(1, 2, 1), forged])
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
    // After a partition: we hold r1/s1@4 and r1/s2@7 (the later one from another of its
    // members); r1 brings s1@6, s2@5 and a new s3@1.
    let mut a = RegionAggregates::new();
    a.merge_from(&region(8), &region(1), vec![entry(1, 1, 4), entry(1, 2, 7)])
        .unwrap();
    let record = a
        .merge_from(
            &region(8),
            &region(1),
            vec![entry(1, 1, 6), entry(1, 2, 5), entry(1, 3, 1)],
        )
        .unwrap();
    assert_eq!(record.peer, Some(region(1)));
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
    for r in [1, 2] {
        a.merge_from(&region(8), &region(r), vec![entry(r, 1, 3)])
            .unwrap();
    }
    let ids = |r: u8| -> Vec<String> {
        a.remote_endpoints(&region(r), &service(1))
            .into_iter()
            .map(|e| e.instance.to_string())
            .collect()
    };
    assert_eq!(ids(1), ["r1:r1-s1-v3-0", "r1:r1-s1-v3-1", "r1:r1-s1-v3-2"]);
    assert!(ids(2).iter().all(|id| id.starts_with("r2:")));
}
