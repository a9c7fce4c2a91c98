//! Two sessions wired back to back: convergence, bounded messages, heal records, and a
//! link that carries only its sender's own region.

use std::sync::Arc;

use waymark_core::model::ServiceName;

use super::*;
use crate::aggregate::ServiceAggregate;

#[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
fn t0() -> Instant {
    Instant::now()
}

fn region(s: &str) -> RegionName {
    RegionName::try_new(s).unwrap()
}

fn entry(r: &str, s: usize, v: u64) -> Entry {
    Entry {
        region: region(r),
        service: ServiceName::try_new(format!("s{s}")).unwrap(),
        version: v,
        aggregate: Arc::new(ServiceAggregate::default()),
    }
}

fn publish(a: &mut RegionAggregates, r: &str, services: usize, v: u64) {
    for s in 0..services {
        a.publish_local(entry(r, s, v)).unwrap();
    }
}

/// Deliver everything queued both ways until both outboxes are empty; count messages.
fn pump(
    now: Instant,
    a: (&mut Session, &mut RegionAggregates),
    b: (&mut Session, &mut RegionAggregates),
) -> usize {
    let (sa, aa) = a;
    let (sb, ab) = b;
    let mut sent = 0;
    for _ in 0..1_000 {
        let mut moved = false;
        while let Some(m) = sa.poll_transmit() {
            sb.handle_message(now, m, ab).unwrap();
            sent += 1;
            moved = true;
        }
        while let Some(m) = sb.poll_transmit() {
            sa.handle_message(now, m, aa).unwrap();
            sent += 1;
            moved = true;
        }
        if !moved {
            break;
        }
    }
    sent
}

#[test]
fn two_regions_converge_and_only_what_is_missing_travels() {
    let now = t0();
    let config = SessionConfig {
        entries_per_message: 4,
        ..SessionConfig::default()
    };
    let (mut eu, mut us) = (RegionAggregates::new(), RegionAggregates::new());
    publish(&mut eu, "eu", 10, 1);
    publish(&mut us, "us", 3, 1);
    let mut s_eu = Session::new(config.clone(), region("eu"), region("us"));
    let mut s_us = Session::new(config, region("us"), region("eu"));
    s_eu.handle_connected(now, &eu);
    s_us.handle_connected(now, &us);
    pump(now, (&mut s_eu, &mut eu), (&mut s_us, &mut us));
    assert_eq!(eu.digest(), us.digest());
    // 10 entries at 4 per message: three entry messages one way, one the other.
    assert_eq!(
        s_us.take_records()
            .iter()
            .map(|r| r.entries.len())
            .sum::<usize>(),
        10
    );
    assert_eq!(
        s_eu.take_records()
            .iter()
            .map(|r| r.entries.len())
            .sum::<usize>(),
        3
    );
    // A second round finds nothing missing: digests only.
    s_eu.handle_timeout(now + Duration::from_secs(5), &eu);
    s_us.handle_timeout(now + Duration::from_secs(5), &us);
    let sent = pump(now, (&mut s_eu, &mut eu), (&mut s_us, &mut us));
    assert_eq!(sent, 2, "only the two digests");
    assert!(s_eu.take_records().is_empty() && s_us.take_records().is_empty());
}

#[test]
fn after_a_partition_the_heal_is_recorded() {
    let now = t0();
    let (mut eu, mut us) = (RegionAggregates::new(), RegionAggregates::new());
    publish(&mut eu, "eu", 2, 1);
    let mut s_eu = Session::new(SessionConfig::default(), region("eu"), region("us"));
    let mut s_us = Session::new(SessionConfig::default(), region("us"), region("eu"));
    s_eu.handle_connected(now, &eu);
    s_us.handle_connected(now, &us);
    pump(now, (&mut s_eu, &mut eu), (&mut s_us, &mut us));
    s_us.take_records();
    // Partition: eu moves on; us hears nothing and ages.
    publish(&mut eu, "eu", 2, 7);
    let later = now + Duration::from_secs(90);
    assert!(s_us.is_stale(later, Duration::from_secs(60)));
    assert_eq!(
        us.version(&region("eu"), &ServiceName::try_new("s0").unwrap()),
        Some(1),
        "kept, not dropped"
    );
    // Heal.
    s_eu.handle_connected(later, &eu);
    s_us.handle_connected(later, &us);
    pump(later, (&mut s_eu, &mut eu), (&mut s_us, &mut us));
    let records = s_us.take_records();
    let lines: Vec<_> = records
        .iter()
        .flat_map(|r| r.entries.iter().map(|e| (e.ours, e.theirs)))
        .collect();
    assert_eq!(lines, vec![(Some(1), 7), (Some(1), 7)]);
    assert!(!s_us.is_stale(later, Duration::from_secs(60)));
}

#[test]
fn messages_survive_the_wire() {
    let mut a = RegionAggregates::new();
    publish(&mut a, "eu", 2, 3);
    let digest = Message::Digest {
        versions: a.digest().into_iter().collect(),
    };
    let entries = Message::Entries {
        entries: a.missing_for(&Digest::new()),
    };
    for m in [digest, entries] {
        let back: Message = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }
}

#[test]
fn a_batch_naming_a_third_region_or_ours_changes_nothing_and_is_refused() {
    // Goal: on eu's link to us, a batch carrying ap's entry (or eu's own) is refused
    // whole with a typed error the driver counts, merges nothing and records nothing;
    // us's own entries alone are merged.
    let now = t0();
    let mut eu = RegionAggregates::new();
    publish(&mut eu, "eu", 1, 4);
    let mut s = Session::new(SessionConfig::default(), region("eu"), region("us"));
    s.handle_authenticated(now, region("us"), &eu);
    let before = eu.clone();
    for claimed in [entry("ap", 0, 9), entry("eu", 0, 9)] {
        let batch = Message::Entries {
            entries: vec![entry("us", 0, 1), claimed.clone()],
        };
        let err = s.handle_message(now, batch, &mut eu).unwrap_err();
        assert_eq!(
            err,
            AggregateError::ForeignEntry {
                sender: region("us"),
                region: claimed.region,
                service: claimed.service,
            }
        );
        assert_eq!(eu, before, "the refused batch changed nothing");
        assert!(s.take_records().is_empty());
    }
    let honest = Message::Entries {
        entries: vec![entry("us", 0, 1)],
    };
    s.handle_message(now, honest, &mut eu).unwrap();
    assert_eq!(eu.version(&region("us"), &svc(0)), Some(1));
    assert_eq!(s.take_records()[0].peer, Some(region("us")));
}

#[test]
fn a_link_carries_only_its_two_regions() {
    // Goal: eu holds ap's entries from its ap link; on its link to us it asks only about
    // us and answers only with eu's own entries, so ap's never travel through it.
    let now = t0();
    let mut eu = RegionAggregates::new();
    publish(&mut eu, "eu", 2, 3);
    eu.merge_from(&region("eu"), &region("ap"), vec![entry("ap", 0, 5)])
        .unwrap();
    eu.merge_from(&region("eu"), &region("us"), vec![entry("us", 0, 1)])
        .unwrap();
    let mut s = Session::new(SessionConfig::default(), region("eu"), region("us"));
    s.handle_authenticated(now, region("us"), &eu);
    let Some(Message::Digest { versions }) = s.poll_transmit() else {
        panic!("a digest first");
    };
    assert_eq!(versions, vec![((region("us"), svc(0)), 1)]);
    // us knows nothing: the answer is eu's two entries, not ap's.
    let empty = Message::Digest {
        versions: Vec::new(),
    };
    s.handle_message(now, empty, &mut eu).unwrap();
    let Some(Message::Entries { entries }) = s.poll_transmit() else {
        panic!("entries in answer");
    };
    let regions: Vec<_> = entries.iter().map(|e| e.region.as_str()).collect();
    assert_eq!(regions, ["eu", "eu"]);
}

#[test]
fn regions_in_a_line_hear_only_their_neighbours() {
    // Goal: the cost of direct links, stated. ap — eu — us with no ap—us link: after
    // convergence ap and us hold eu's entries, eu holds both, and neither end holds the
    // other's: nothing is relayed.
    let now = t0();
    let config = SessionConfig::default();
    let (mut ap, mut eu, mut us) = (
        RegionAggregates::new(),
        RegionAggregates::new(),
        RegionAggregates::new(),
    );
    publish(&mut ap, "ap", 1, 1);
    publish(&mut eu, "eu", 1, 1);
    publish(&mut us, "us", 1, 1);
    let mut ap_eu = Session::new(config.clone(), region("ap"), region("eu"));
    let mut eu_ap = Session::new(config.clone(), region("eu"), region("ap"));
    let mut eu_us = Session::new(config.clone(), region("eu"), region("us"));
    let mut us_eu = Session::new(config, region("us"), region("eu"));
    for (s, a) in [
        (&mut ap_eu, &ap),
        (&mut eu_ap, &eu),
        (&mut eu_us, &eu),
        (&mut us_eu, &us),
    ] {
        s.handle_connected(now, a);
    }
    // Two rounds each way, so whatever eu learnt in the first could travel in the second.
    for round in 1..=2 {
        let at = now + SessionConfig::default().digest_interval * round;
        pump(at, (&mut ap_eu, &mut ap), (&mut eu_ap, &mut eu));
        pump(at, (&mut eu_us, &mut eu), (&mut us_eu, &mut us));
        ap_eu.handle_timeout(at, &ap);
        eu_ap.handle_timeout(at, &eu);
        eu_us.handle_timeout(at, &eu);
        us_eu.handle_timeout(at, &us);
    }
    pump(now, (&mut ap_eu, &mut ap), (&mut eu_ap, &mut eu));
    pump(now, (&mut eu_us, &mut eu), (&mut us_eu, &mut us));
    let held = |a: &RegionAggregates| -> Vec<String> {
        a.digest().keys().map(|(r, _)| r.to_string()).collect()
    };
    assert_eq!(held(&ap), ["ap", "eu"]);
    assert_eq!(held(&eu), ["ap", "eu", "us"]);
    assert_eq!(held(&us), ["eu", "us"]);
}

fn svc(s: usize) -> ServiceName {
    ServiceName::try_new(format!("s{s}")).unwrap()
}
