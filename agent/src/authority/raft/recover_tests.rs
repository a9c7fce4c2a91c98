//! Recovery on real redb files: every refusal leaves the store as it was; a recovered
//! survivor keeps its whole log and leads alone.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftLogReader, Vote};
use tempfile::TempDir;
use tokio::sync::broadcast;
use waymark_core::contract::HealthContract;
use waymark_core::model::ServiceName;
use waymark_registry::machine::{Request, Response};
use waymark_registry::state::{Command, Stamped};

use super::super::{Member, RaftConfig, RaftNode, TypeConfig, store};
use super::{RecoverError, recover};

const WAIT: Duration = Duration::from_secs(10);
/// The old group's leader, in term 1.
const LEADER: u64 = 2;

fn member(id: u64) -> Member {
    Member {
        raft_addr: format!("127.0.0.1:{}", 9100 + id),
        api_addr: format!("127.0.0.1:{}", 9200 + id),
    }
}

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, LEADER), index)
}

fn put_service(i: u64) -> Request {
    Request::Registry(Stamped {
        at_ms: 1_000 + i,
        command: Command::PutService {
            service: ServiceName::try_new(format!("svc-{i}")).unwrap(),
            owner: "team".into(),
            contract: HealthContract::default(),
        },
    })
}

/// A follower's store as member 2 led it in term 1: voters `voters` (and `learners`) at
/// index 0 (where openraft puts the group's first membership), services at 1..=`last`,
/// committed up to `committed`; then closed.
async fn follower_store(dir: &Path, voters: &[u64], learners: &[u64], last: u64, committed: u64) {
    let (events, _) = broadcast::channel(16);
    let (mut log, _, shared) = store::open(dir, events).unwrap();
    let nodes: BTreeMap<u64, Member> = voters
        .iter()
        .chain(learners)
        .map(|&id| (id, member(id)))
        .collect();
    let membership = Membership::new(vec![voters.iter().copied().collect()], nodes);
    let mut entries = vec![Entry::<TypeConfig> {
        log_id: log_id(0),
        payload: EntryPayload::Membership(membership),
    }];
    entries.extend((1..=last).map(|i| Entry {
        log_id: log_id(i),
        payload: EntryPayload::Normal(put_service(i)),
    }));
    log.save_vote(&Vote::new_committed(1, LEADER))
        .await
        .unwrap();
    log.blocking_append(entries).await.unwrap();
    log.save_committed(Some(log_id(committed))).await.unwrap();
    let mut closed = shared.closed.clone();
    drop((log, shared));
    while closed.changed().await.is_ok() {}
}

/// The vote, the log's last entry and its membership entries, as the store holds them.
async fn held(dir: &Path) -> (Option<Vote<u64>>, Option<LogId<u64>>, Vec<LogId<u64>>) {
    let (events, _) = broadcast::channel(16);
    let (mut log, _, shared) = store::open(dir, events).unwrap();
    let vote = log.read_vote().await.unwrap();
    let last = log.get_log_state().await.unwrap().last_log_id;
    let memberships = log
        .try_get_log_entries(0..u64::MAX)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| matches!(e.payload, EntryPayload::Membership(_)))
        .map(|e| e.log_id)
        .collect();
    let mut closed = shared.closed.clone();
    drop((log, shared));
    while closed.changed().await.is_ok() {}
    (vote, last, memberships)
}

#[test]
fn a_data_dir_without_a_store_is_refused() {
    let dir = TempDir::new().unwrap();
    let missing = dir.path().join("nowhere");
    let refused = recover(&missing, 1, None).unwrap_err();
    assert!(matches!(refused, RecoverError::Missing { .. }), "{refused}");
    assert!(!missing.exists(), "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_never_joined_a_group_is_refused() {
    let dir = TempDir::new().unwrap();
    {
        let (events, _) = broadcast::channel(16);
        let (_, _, shared) = store::open(dir.path(), events).unwrap();
        let mut closed = shared.closed.clone();
        drop(shared);
        while closed.changed().await.is_ok() {}
    }
    let refused = recover(dir.path(), 1, None).unwrap_err();
    assert!(
        matches!(refused, RecoverError::NotInitialised { .. }),
        "{refused}"
    );
    assert_eq!(held(dir.path()).await, (None, None, vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_a_running_member_holds_is_refused_and_left_unchanged() {
    let dir = TempDir::new().unwrap();
    follower_store(dir.path(), &[1, 2, 3], &[], 5, 5).await;
    let before = held(dir.path()).await;
    let mut config = RaftConfig::new(1, dir.path().to_owned(), member(1));
    config.election_min = Duration::from_secs(60);
    config.election_max = Duration::from_secs(61);
    let running = RaftNode::open(config).await.unwrap();
    let refused = recover(dir.path(), 1, None).unwrap_err();
    assert!(matches!(refused, RecoverError::Locked { .. }), "{refused}");
    assert!(refused.to_string().contains("stop the member"), "{refused}");
    running.shutdown().await;
    assert_eq!(held(dir.path()).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_is_not_a_voter_of_the_last_membership_is_refused() {
    let dir = TempDir::new().unwrap();
    follower_store(dir.path(), &[1, 2, 3], &[4], 5, 5).await;
    let before = held(dir.path()).await;
    for id in [4, 7] {
        let refused = recover(dir.path(), id, None).unwrap_err();
        let RecoverError::NotInMembership {
            voters, learners, ..
        } = &refused
        else {
            panic!("member {id}: {refused}");
        };
        assert_eq!(voters, &BTreeSet::from([1, 2, 3]));
        assert_eq!(learners, &BTreeSet::from([4]));
    }
    assert_eq!(held(dir.path()).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_already_alone_is_refused() {
    let dir = TempDir::new().unwrap();
    follower_store(dir.path(), &[1], &[], 3, 3).await;
    let before = held(dir.path()).await;
    let refused = recover(dir.path(), 1, None).unwrap_err();
    assert!(
        matches!(refused, RecoverError::AlreadyAlone { id: 1 }),
        "{refused}"
    );
    assert_eq!(held(dir.path()).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_survivor_keeps_its_whole_log_and_leads_alone() {
    // Goal: the survivor of a group that lost two of three voters keeps what it applied
    // and its uncommitted tail (entries 8..=10), then commits alone.
    let dir = TempDir::new().unwrap();
    follower_store(dir.path(), &[1, 2, 3], &[], 10, 7).await;
    let done = recover(dir.path(), 1, None).unwrap();
    assert_eq!(done.last_log, log_id(10));
    assert_eq!(done.entry, LogId::new(CommittedLeaderId::new(2, 1), 11));
    assert_eq!(done.vote, Vote::new(2, 1));
    assert_eq!(
        done.new_membership.voter_ids().collect::<Vec<_>>(),
        vec![1],
        "this member alone"
    );
    assert_eq!(done.new_membership.get_node(&1), Some(&member(1)));
    let said = done.to_string();
    for part in [
        "index 10, term 1",
        "committed index: 7",
        "voters [1, 2, 3]",
        "voters [1]",
        "entry 11",
    ] {
        assert!(said.contains(part), "{part:?} in {said}");
    }
    let (vote, last, memberships) = held(dir.path()).await;
    assert_eq!(
        (vote, last, memberships),
        (
            Some(Vote::new(2, 1)),
            Some(done.entry),
            vec![log_id(0), done.entry]
        )
    );

    let mut config = RaftConfig::new(1, dir.path().to_owned(), member(1));
    config.election_min = Duration::from_millis(300);
    config.election_max = Duration::from_millis(600);
    let node = RaftNode::open(config).await.unwrap();
    node.raft
        .wait(Some(WAIT))
        .metrics(|m| m.state.is_leader(), "leads alone")
        .await
        .unwrap();
    assert!(node.current_term() > 2, "a term above the recovery's");
    let response = node.write(put_service(11)).await.unwrap();
    assert!(
        matches!(response, Response::Registry { outcome: Ok(_) }),
        "{response:?}"
    );
    let services = node.with_state(|s, _| s.registry().services().count());
    assert_eq!(services, 11, "entries 1..=10 and the new write");
    let voters: Vec<u64> = node
        .watch_metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .collect();
    assert_eq!(voters, [1]);
    node.shutdown().await;
}
