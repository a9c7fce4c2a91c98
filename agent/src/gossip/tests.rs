#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;

use foca::{Identity, Member};
use waymark_core::model::{NodeName, ZoneName};

use super::membership::{ChangeDetector, counts, snapshot};
use super::*;

fn id(name: &str, port: u16, zone: &str, bump: u64) -> GossipId {
    GossipId::with_bump(
        NodeName::try_new(name).unwrap(),
        SocketAddr::from(([127, 0, 0, 1], port)),
        ZoneName::try_new(zone).unwrap(),
        Role::Agent,
        bump,
    )
}

#[test]
fn a_renewed_identity_wins_the_address_conflict() {
    // Goal: automatic rejoin works: renew keeps the address and beats the old life.
    let old = id("n1", 7000, "z1", 5);
    let new = old.renew().unwrap();
    assert_eq!(new.addr(), old.addr());
    assert_eq!(new.name, old.name);
    assert!(new.win_addr_conflict(&old));
    assert!(!old.win_addr_conflict(&new));
}

#[test]
fn identities_round_trip_through_postcard() {
    // Goal: the identity travels in every foca header; names stay validated on decode.
    let original = id("n1", 7000, "z1", 42);
    let bytes = postcard::to_allocvec(&original).unwrap();
    assert_eq!(postcard::from_bytes::<GossipId>(&bytes).unwrap(), original);
}

#[test]
fn snapshot_has_one_entry_per_name_with_the_newest_life() {
    // Goal: a node restarted at a new address shows once, as its newest identity.
    let local = id("a", 7000, "z1", 1);
    let members = [
        Member::down(id("b", 7001, "z1", 1)),
        Member::alive(id("b", 7009, "z1", 2)),
        Member::alive(id("c", 7002, "z2", 1)),
        Member::new(id("d", 7003, "z2", 1), 0, foca::State::Suspect),
        Member::alive(id("a", 7999, "z1", 0)),
    ];
    let snap = snapshot(&local, members.iter());
    let shown: Vec<_> = snap
        .iter()
        .map(|m| (m.id.name.as_str(), m.id.addr.port(), m.state, m.local))
        .collect();
    assert_eq!(
        shown,
        vec![
            ("a", 7000, Liveness::Alive, true),
            ("b", 7009, Liveness::Alive, false),
            ("c", 7002, Liveness::Alive, false),
            ("d", 7003, Liveness::Suspect, false),
        ]
    );
    assert_eq!(counts(&snap), (3, 1, 0));
}

#[test]
fn live_members_are_grouped_by_zone_without_the_down() {
    // Goal: the prober assignment input excludes down members and keeps suspects.
    let local = id("a", 7000, "z1", 1);
    let members = [
        Member::down(id("b", 7001, "z1", 1)),
        Member::new(id("d", 7003, "z2", 1), 0, foca::State::Suspect),
        Member::alive(id("c", 7002, "z2", 1)),
    ];
    let zones = live_members_by_zone(&snapshot(&local, members.iter()));
    let names: Vec<(&str, Vec<&str>)> = zones
        .iter()
        .map(|(z, ids)| (z.as_str(), ids.iter().map(|i| i.name.as_str()).collect()))
        .collect();
    assert_eq!(names, vec![("z1", vec!["a"]), ("z2", vec!["c", "d"])]);
}

#[test]
fn change_detector_fires_only_on_change() {
    // Goal: the driver republishes after a transition and stays quiet otherwise.
    let local = id("a", 7000, "z1", 1);
    let mut members = [Member::alive(id("b", 7001, "z1", 1))];
    let mut detector = ChangeDetector::default();
    assert!(detector.update(&local, members.iter()));
    assert!(!detector.update(&local, members.iter()));
    members[0] = Member::new(id("b", 7001, "z1", 1), 0, foca::State::Suspect);
    assert!(detector.update(&local, members.iter()));
    assert!(detector.update(&local.renew().unwrap(), members.iter()));
    assert!(!detector.update(&local.renew().unwrap(), members.iter()));
}
