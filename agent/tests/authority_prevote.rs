//! Pre-vote against three real in-process members, whose Raft traffic to each member runs
//! through a relay the test can cut: a follower cut off from the leader for several
//! election timeouts, under write load, asks for pre-votes, is refused (the others hear
//! the leader), and rejoins without an election: the leader and the term are unchanged and
//! every acknowledged write is on every member. And a leader that dies is still replaced:
//! its silence lets a majority grant a pre-vote.
//!
//! The cut is of what reaches the follower (its listener's relay refuses every connection
//! and drops the open ones); what it sends still reaches the others, so its pre-vote
//! questions are answered — and refused — throughout, the harder case for a leader.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::Method;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use waymark_agent::authority::member::Authority;
use waymark_agent::authority::raft::Member;
use waymark_agent::authority::raft::prevote::{ElectReason, Outcome};
use waymark_testkit::until;

const WAIT: Duration = Duration::from_secs(60);
/// How soon a dead leader must be replaced: a few election timeouts (1–2 s each) and a
/// pre-vote round trip.
const ELECTION_BUDGET: Duration = Duration::from_secs(15);

/// A TCP relay in front of one member's Raft listener; `cut` refuses new connections and
/// drops the open ones.
struct Relay {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, _) = watch::channel(false);
        let cut_rx = cut.subscribe();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if *cut_rx.borrow() {
                    drop(inbound);
                    continue;
                }
                let mut cut = cut_rx.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Self { addr, cut, task }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn config(dir: &Path, id: u64) -> waymark_agent::authority::settings::AuthorityConfig {
    common::plain_member(dir, id, &["a", "b"])
}

/// Three plain members, each reached by the others through its relay.
async fn group(dir: &Path) -> (Vec<Authority>, Vec<Relay>) {
    waymark_certs::install_crypto_provider();
    let mut members = Vec::new();
    let mut relays = Vec::new();
    for id in 1..=3 {
        let m = Authority::start(config(dir, id)).await.unwrap();
        let raft_addr: SocketAddr = m.member().raft_addr.parse().unwrap();
        relays.push(Relay::start(raft_addr).await);
        members.push(m);
    }
    let voters: BTreeMap<u64, Member> = (1..=3)
        .zip(members.iter().zip(&relays))
        .map(|(id, (m, r))| {
            let member = Member {
                raft_addr: r.addr.to_string(),
                ..m.member()
            };
            (id, member)
        })
        .collect();
    for m in &members {
        m.bootstrap(voters.clone()).await.unwrap();
    }
    (members, relays)
}

/// The leader every member in `members` names, with its term.
async fn leader_named_by(members: &[&Authority]) -> (u64, u64) {
    until("a leader every member names", WAIT, async || {
        let named: BTreeSet<(Option<u64>, u64)> = members
            .iter()
            .map(|m| (m.raft().leader().map(|(id, _)| id), m.raft().current_term()))
            .collect();
        match named.into_iter().collect::<Vec<_>>()[..] {
            [(Some(id), term)] => Ok((id, term)),
            ref other => Err(format!("{other:?}")),
        }
    })
    .await
}

fn registration(i: u32) -> Value {
    json!({
        "service": "pay",
        "locality": {"region": "eu", "zone": "a", "node": "n1"},
        "address": {"ip": format!("10.2.{}.{}", i / 250, i % 250 + 1), "port": 8080},
        "lease_ms": 0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_the_leader_rejoins_without_an_election() {
    let dir = tempfile::tempdir().unwrap();
    let (members, relays) = group(dir.path()).await;
    let all: Vec<&Authority> = members.iter().collect();
    let (leader_id, term) = leader_named_by(&all).await;
    let leader = &members[(leader_id - 1) as usize];
    let token = common::operator_token(leader, "writer").await;
    let api = leader.api_client(Some(token)).with_timeout(WAIT);
    let (status, body) = common::call(
        &api,
        Method::PUT,
        "/v1/services/pay",
        Some(json!({"owner": "payments", "contract": {}})),
    )
    .await;
    assert!(status.is_success(), "{status} {body}");
    // The token's own write may have ended an earlier term's first entries: read the
    // term now that the group is writing.
    let (leader_id, term) = {
        let (id, t) = leader_named_by(&all).await;
        assert_eq!(id, leader_id);
        assert!(t >= term);
        (id, t)
    };

    let writer = common::writer::Writer::start(api.clone(), registration);
    writer.acked_at_least(10, WAIT).await;

    // Cut the follower off for several election timeouts: it asks, and is refused, round
    // after round.
    let follower_id = (1..=3).find(|&id| id != leader_id).unwrap();
    let follower = &members[(follower_id - 1) as usize];
    let elections = follower.raft().election_metrics();
    relays[(follower_id - 1) as usize].set_cut(true);
    until("several refused pre-vote rounds", WAIT, async || {
        let refused = elections.pre_votes(Outcome::Refused);
        if refused >= 3 { Ok(()) } else { Err(refused) }
    })
    .await;
    let during = writer.acked();
    writer.acked_at_least(during + 10, WAIT).await;
    assert_eq!(
        term,
        follower.raft().current_term(),
        "refused pre-votes bump no term"
    );

    // Heal; the follower catches up with every write acknowledged meanwhile.
    relays[(follower_id - 1) as usize].set_cut(false);
    let healed = writer.acked();
    writer.acked_at_least(healed + 10, WAIT).await;
    let w = writer.stop().await;
    assert!(w.failed.is_empty(), "writes failed: {:?}", w.failed);
    for m in &members {
        until("every acknowledged write applied", WAIT, async || {
            let missing: Vec<String> = m.raft().with_state(|s, _| {
                w.acked
                    .iter()
                    .filter(|id| {
                        !s.registry()
                            .instances()
                            .any(|r| r.instance.id.to_string() == **id)
                    })
                    .cloned()
                    .collect()
            });
            if missing.is_empty() {
                Ok(())
            } else {
                Err(missing.len())
            }
        })
        .await;
    }

    assert_eq!(
        (leader_id, term),
        leader_named_by(&all).await,
        "the rejoining member caused no election"
    );
    assert_eq!(0, elections.elections(ElectReason::PreVote));
    assert_eq!(0, elections.pre_votes(Outcome::Granted));
    for m in members {
        m.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_leader_is_replaced_after_a_granted_pre_vote() {
    let dir = tempfile::tempdir().unwrap();
    let (mut members, _relays) = group(dir.path()).await;
    let all: Vec<&Authority> = members.iter().collect();
    let (leader_id, term) = leader_named_by(&all).await;
    let leader = members.remove((leader_id - 1) as usize);
    leader.shutdown().await;

    let rest: Vec<&Authority> = members.iter().collect();
    let (new_leader, new_term) = until("a new leader", ELECTION_BUDGET, async || {
        let named: BTreeSet<(Option<u64>, u64)> = rest
            .iter()
            .map(|m| (m.raft().leader().map(|(id, _)| id), m.raft().current_term()))
            .collect();
        match named.into_iter().collect::<Vec<_>>()[..] {
            [(Some(id), t)] if id != leader_id && t > term => Ok((id, t)),
            ref other => Err(format!("{other:?}")),
        }
    })
    .await;
    let winner = members
        .iter()
        .find(|m| m.raft().leader().is_some_and(|_| m.raft().is_leader()))
        .unwrap();
    let metrics = winner.raft().election_metrics();
    assert!(
        metrics.pre_votes(Outcome::Granted) >= 1 && metrics.elections(ElectReason::PreVote) >= 1,
        "member {new_leader} leads term {new_term} after a granted pre-vote"
    );
    for m in members {
        m.shutdown().await;
    }
}
