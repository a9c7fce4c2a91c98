//! Gossip over real UDP on 127.0.0.1: joining, failure detection, leave, region keys.
//!
//! Timings are shrunk (100 ms probes) so each scenario takes a second or two; every wait is
//! on the membership watch or a metric with a deadline, never a bare sleep.
#![allow(clippy::unwrap_used)]

use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::time::{Instant, timeout};
use waymark_agent::gossip::{
    DropReason, Gossip, GossipConfig, GossipId, Key, Keyring, Liveness, MemberState, Role,
};
use waymark_core::model::{NodeName, ZoneName};
use waymark_testkit::until;

/// Generous bound for anything that should take well under a second.
const CONVERGE: Duration = Duration::from_secs(5);

/// How long a suspect stays suspect in these tests.
const SUSPECT_TO_DOWN: Duration = Duration::from_millis(400);

fn fast_protocol() -> foca::Config {
    foca::Config {
        probe_period: Duration::from_millis(100),
        probe_rtt: Duration::from_millis(40),
        num_indirect_probes: NonZeroUsize::new(2).unwrap(),
        max_transmissions: NonZeroU8::new(6).unwrap(),
        suspect_to_down_after: SUSPECT_TO_DOWN,
        periodic_gossip: Some(foca::PeriodicParams {
            frequency: Duration::from_millis(50),
            num_members: NonZeroUsize::new(3).unwrap(),
        }),
        ..foca::Config::new_lan(std::num::NonZeroU32::new(8).unwrap())
    }
}

fn key(byte: u8) -> Key {
    Key::from_bytes(&[byte; 32])
}

async fn member(name: &str, zone: &str, seeds: &[&Gossip], keyring: Keyring) -> Gossip {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let id = GossipId::new(
        NodeName::try_new(name).unwrap(),
        addr,
        ZoneName::try_new(zone).unwrap(),
        Role::Agent,
    );
    let mut config = GossipConfig::new(addr, id, keyring);
    config.seeds = seeds.iter().map(|g| g.local_addr().into()).collect();
    config.protocol = fast_protocol();
    config.announce_period = Duration::from_millis(100);
    Gossip::start_with_socket(config, socket).unwrap()
}

/// A member whose seeds are given as text (IP or DNS name).
async fn member_with_seed_names(name: &str, seeds: &[String], keyring: Keyring) -> Gossip {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let id = GossipId::new(
        NodeName::try_new(name).unwrap(),
        addr,
        ZoneName::try_new("z0").unwrap(),
        Role::Agent,
    );
    let mut config = GossipConfig::new(addr, id, keyring);
    config.seeds = seeds.iter().map(|s| s.parse().unwrap()).collect();
    config.protocol = fast_protocol();
    config.announce_period = Duration::from_millis(100);
    // `.invalid` fails at once where a resolver answers; where none does, this bound
    // makes it a timeout, which counts the same.
    config.seed_resolve_timeout = Duration::from_millis(300);
    Gossip::start_with_socket(config, socket).unwrap()
}

async fn cluster(n: usize, keyring: &Keyring) -> Vec<Gossip> {
    let seed = member("node-0", "z0", &[], keyring.clone()).await;
    let mut members = vec![seed];
    for i in 1..n {
        let zone = format!("z{}", i % 2);
        let m = member(&format!("node-{i}"), &zone, &[&members[0]], keyring.clone()).await;
        members.push(m);
    }
    members
}

fn alive(members: &[MemberState]) -> usize {
    members
        .iter()
        .filter(|m| m.state == Liveness::Alive)
        .count()
}

fn state_of(members: &[MemberState], name: &str) -> Option<Liveness> {
    members
        .iter()
        .find(|m| m.id.name.as_str() == name)
        .map(|m| m.state)
}

async fn wait_for(
    rx: &mut watch::Receiver<Vec<MemberState>>,
    within: Duration,
    what: &str,
    pred: impl FnMut(&Vec<MemberState>) -> bool,
) {
    let ok = matches!(timeout(within, rx.wait_for(pred)).await, Ok(Ok(_)));
    let last = rx.borrow().clone();
    assert!(ok, "timed out waiting for {what}; last snapshot: {last:?}");
}

async fn all_see_alive(members: &[Gossip], n: usize) {
    for m in members {
        let mut rx = m.subscribe();
        wait_for(&mut rx, CONVERGE, "all alive", |s| alive(s) == n).await;
    }
}

/// Watches every member for `period` and fails if anyone stops being alive.
async fn stays_connected(members: &[Gossip], n: usize, period: Duration, phase: &str) {
    let mut receivers: Vec<_> = members.iter().map(Gossip::subscribe).collect();
    let deadline = Instant::now() + period;
    for rx in &receivers {
        let snapshot = rx.borrow().clone();
        assert_eq!(alive(&snapshot), n, "{phase}: {snapshot:?}");
    }
    loop {
        let changed =
            futures::future::select_all(receivers.iter_mut().map(|rx| Box::pin(rx.changed())));
        let (result, i) = match tokio::time::timeout_at(deadline, changed).await {
            Err(_) => return,
            Ok((result, i, _rest)) => (result, i),
        };
        result.unwrap();
        let snapshot = receivers[i].borrow_and_update().clone();
        assert_eq!(alive(&snapshot), n, "{phase}: member {i} saw {snapshot:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_through_a_seed_name_past_one_that_does_not_resolve() {
    // Goal: a DNS seed is resolved when used, and a name that does not resolve (a Service
    // not created yet) is counted without stopping the round for the other seeds.
    let keyring = Keyring::single(key(1));
    let first = member("node-0", "z0", &[], keyring.clone()).await;
    let port = first.local_addr().port();
    let seeds = ["seed.invalid:7946".to_owned(), format!("localhost:{port}")];
    let second = member_with_seed_names("node-1", &seeds, keyring).await;
    let members = [first, second];
    all_see_alive(&members, 2).await;
    assert!(
        members[1].metrics().seed_resolve_failures() >= 1,
        "the unresolvable seed is counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_that_does_not_resolve_is_tried_again_every_round_while_gossip_runs() {
    // Goal: an unresolvable seed never stops the member; each announce round resolves it
    // again (which is also how a seed name that moved to a new address is followed).
    let alone = member_with_seed_names(
        "node-0",
        &["seed.invalid:7946".to_owned()],
        Keyring::single(key(1)),
    )
    .await;
    let metrics = alone.metrics().clone();
    until("three rounds, three attempts", CONVERGE, async || {
        let failures = metrics.seed_resolve_failures();
        if failures >= 3 { Ok(()) } else { Err(failures) }
    })
    .await;
    let snapshot = alone.members();
    assert_eq!(alive(&snapshot), 1, "still running, alone: {snapshot:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_join_through_one_seed_and_all_see_five_alive() {
    // Goal: announce to a single seed is enough for full membership everywhere.
    let members = cluster(5, &Keyring::single(key(1))).await;
    all_see_alive(&members, 5).await;
    let snapshot = members[3].members();
    assert_eq!(snapshot.iter().filter(|m| m.local).count(), 1);
    let zones = waymark_agent::gossip::live_members_by_zone(&snapshot);
    assert_eq!(zones.values().map(Vec::len).sum::<usize>(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_cut_off_together_find_their_seed_again_soon_after_the_cut_heals() {
    // Goal: two members that still see each other (never idle) announce to their seed
    // again once it is down, so a healed partition reconnects within announce periods, not
    // at foca's periodic announce (30 s here, from the LAN defaults). The cut is a key
    // change on the seed: neither side can open the other's datagrams.
    let keyring = Keyring::single(key(5));
    let members = cluster(3, &keyring).await;
    all_see_alive(&members, 3).await;
    let seed = &members[0];
    seed.set_keyring(Keyring::single(key(6))).await.unwrap();
    for m in &members[1..] {
        let mut rx = m.subscribe();
        wait_for(&mut rx, CONVERGE, "the seed down", |s| {
            state_of(s, "node-0") == Some(Liveness::Down)
        })
        .await;
    }
    // And the seed has given both up: nobody on its side will reach out.
    let mut rx = seed.subscribe();
    wait_for(&mut rx, CONVERGE, "the seed alone", |s| {
        ["node-1", "node-2"]
            .iter()
            .all(|n| state_of(s, n) == Some(Liveness::Down))
    })
    .await;
    seed.set_keyring(keyring).await.unwrap();
    let healed = Instant::now();
    for m in &members[1..] {
        let mut rx = m.subscribe();
        wait_for(&mut rx, CONVERGE, "the seed alive again", |s| {
            state_of(s, "node-0") == Some(Liveness::Alive)
        })
        .await;
    }
    let mut rx = seed.subscribe();
    for name in ["node-1", "node-2"] {
        wait_for(&mut rx, CONVERGE, "the seed sees the member alive", |s| {
            state_of(s, name) == Some(Liveness::Alive)
        })
        .await;
    }
    assert!(
        healed.elapsed() < CONVERGE,
        "reconnected {:?} after the heal",
        healed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_member_goes_down_and_a_leaving_member_goes_down_fast() {
    // Goal: SWIM detects an abrupt stop; a graceful leave is seen without waiting on probes.
    let mut members = cluster(5, &Keyring::single(key(2))).await;
    all_see_alive(&members, 5).await;

    let crashed = members.pop().unwrap();
    drop(crashed);
    for m in &members {
        let mut rx = m.subscribe();
        wait_for(&mut rx, CONVERGE, "node-4 down", |s| {
            state_of(s, "node-4") == Some(Liveness::Down)
        })
        .await;
    }

    // Watch node-3 on every survivor from before the leave, recording each state seen.
    let leaving = members.pop().unwrap();
    let watchers: Vec<_> = members
        .iter()
        .map(|m| {
            let mut rx = m.subscribe();
            // Read the starting state here: the spawned task may first run after the leave.
            let mut seen = vec![state_of(&rx.borrow_and_update(), "node-3")];
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    let state = state_of(&rx.borrow_and_update(), "node-3");
                    if seen.last() != Some(&state) {
                        seen.push(state);
                    }
                    if state == Some(Liveness::Down) {
                        break;
                    }
                }
                seen
            })
        })
        .collect();
    let started = Instant::now();
    leaving.leave().await.unwrap();
    for watcher in watchers {
        let seen = timeout(Duration::from_secs(2), watcher)
            .await
            .unwrap()
            .unwrap();
        // A survivor that probed node-3 before hearing of the leave may see it suspect first.
        assert!(
            seen == [Some(Liveness::Alive), Some(Liveness::Down)]
                || seen
                    == [
                        Some(Liveness::Alive),
                        Some(Liveness::Suspect),
                        Some(Liveness::Down)
                    ],
            "{seen:?}"
        );
    }
    // A leave is announced, not detected: everyone knows before a suspicion could expire.
    let elapsed = started.elapsed();
    assert!(elapsed < SUSPECT_TO_DOWN, "leave took {elapsed:?}");
    for m in &members {
        assert_eq!(alive(&m.members()), 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_another_key_cannot_join_and_its_packets_are_dropped() {
    // Goal: the region key is the admission ticket; foreign and junk datagrams are counted.
    let members = cluster(3, &Keyring::single(key(3))).await;
    all_see_alive(&members, 3).await;

    let intruder = member("intruder", "z0", &[&members[0]], Keyring::single(key(4))).await;
    let seed_metrics = members[0].metrics().clone();
    until(
        "the seed to count the intruder's announces",
        CONVERGE,
        async || seed_metrics.packets_dropped(DropReason::Auth) >= 3,
    )
    .await;
    for m in &members {
        assert_eq!(state_of(&m.members(), "intruder"), None);
        assert_eq!(alive(&m.members()), 3);
    }
    assert_eq!(intruder.members().len(), 1, "{:?}", intruder.members());

    // Junk that is not even an envelope is counted apart from authentication failures.
    let junk = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    junk.send_to(b"\x00not gossip", members[1].local_addr())
        .await
        .unwrap();
    let metrics = members[1].metrics().clone();
    until(
        "the junk datagram counted as malformed",
        CONVERGE,
        async || metrics.packets_dropped(DropReason::Malformed) >= 1,
    )
    .await;
    // A datagram over the size cap is dropped before it is opened or decoded.
    let before = metrics.packets_dropped(DropReason::Malformed);
    junk.send_to(&vec![0u8; 60_000], members[1].local_addr())
        .await
        .unwrap();
    until(
        "the oversized datagram counted as malformed",
        CONVERGE,
        async || metrics.packets_dropped(DropReason::Malformed) > before,
    )
    .await;
    assert_eq!(alive(&members[1].members()), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_key_rotation_keeps_the_pool_connected() {
    // Goal: install B, promote B, retire A — each step rolled out to half the pool first —
    // and nobody is ever suspected or dropped for authentication.
    let (a, b) = (key(0xA), key(0xB));
    let members = cluster(4, &Keyring::single(a.clone())).await;
    all_see_alive(&members, 4).await;

    let steps = [
        ("install", Keyring::new(a.clone(), vec![b.clone()])),
        ("promote", Keyring::new(b.clone(), vec![a.clone()])),
        ("retire", Keyring::single(b.clone())),
    ];
    let hold = Duration::from_millis(700);
    for (phase, keyring) in steps {
        for m in &members[..2] {
            m.set_keyring(keyring.clone()).await.unwrap();
        }
        stays_connected(&members, 4, hold, phase).await;
        for m in &members[2..] {
            m.set_keyring(keyring.clone()).await.unwrap();
        }
        stays_connected(&members, 4, hold, phase).await;
    }
    for m in &members {
        assert_eq!(m.metrics().packets_dropped(DropReason::Auth), 0);
    }

    // Only B is accepted now: a member still on A is locked out.
    let stale = member("stale", "z0", &[&members[0]], Keyring::single(a)).await;
    let metrics = members[0].metrics().clone();
    until(
        "the stale member's announces refused",
        CONVERGE,
        async || metrics.packets_dropped(DropReason::Auth) >= 1,
    )
    .await;
    assert_eq!(stale.members().len(), 1);
}
