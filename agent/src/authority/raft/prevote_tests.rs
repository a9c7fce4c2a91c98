#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::*;

/// Any instant to start from: the machine only ever sees the times it is given.
fn start() -> Instant {
    tokio::time::Instant::now().into_std()
}

const MIN: Duration = Duration::from_millis(1000);
const MAX: Duration = Duration::from_millis(2000);

fn config(id: u64, seed: u64) -> PreVoteConfig {
    PreVoteConfig {
        id,
        election_min: MIN,
        election_max: MAX,
        seed,
    }
}

fn local(term: u64, last_log: Option<(u64, u64)>) -> Local {
    Local {
        term,
        last_log: last_log.map(|(term, index)| LastLog { term, index }),
        voters: BTreeSet::from([1, 2, 3]),
        leading: false,
    }
}

fn ask(from: u64, term: u64, last_log: Option<(u64, u64)>) -> PreVoteRequest {
    PreVoteRequest {
        from,
        term,
        last_log: last_log.map(|(term, index)| LastLog { term, index }),
    }
}

/// Member 1 at term 5, log 5-10, its timer expired with no leader heard: round 1 asked.
fn expired() -> (PreVote, Instant) {
    let t0 = start();
    let mut m = PreVote::new(config(1, 7), t0);
    let at = m.poll_timeout();
    m.handle_timeout(at, &local(5, Some((5, 10))));
    (m, at)
}

#[test]
fn timeout_without_a_leader_asks_every_other_voter_for_the_next_term() {
    // Goal: silence for one election timeout starts a pre-vote round, not an election.
    let (mut m, _) = expired();
    assert_eq!(
        vec![Action::RequestPreVotes {
            round: 1,
            request: ask(1, 6, Some((5, 10))),
            to: BTreeSet::from([2, 3]),
        }],
        m.take_actions()
    );
}

#[test]
fn the_first_timeout_comes_within_the_election_bounds() {
    // Goal: the timer is drawn from [min, max), and seeds spread it.
    let t0 = start();
    let deadlines: BTreeSet<Instant> = (0..16)
        .map(|seed| PreVote::new(config(1, seed), t0).poll_timeout())
        .collect();
    assert!(deadlines.iter().all(|d| *d >= t0 + MIN && *d < t0 + MAX));
    assert!(deadlines.len() > 1, "jitter spreads the timeouts");
}

#[test]
fn nothing_happens_before_the_timer_expires() {
    // Goal: an early wake-up is harmless.
    let t0 = start();
    let mut m = PreVote::new(config(1, 7), t0);
    m.handle_timeout(t0 + MIN - Duration::from_millis(1), &local(5, None));
    assert_eq!(Vec::<Action>::new(), m.take_actions());
}

#[test]
fn a_majority_granted_counting_itself_starts_an_election() {
    // Goal: one yes of two peers, plus itself, is a majority of three.
    let (mut m, at) = expired();
    m.take_actions();
    m.handle_pre_vote_reply(at + Duration::from_millis(5), 1, 2, true);
    assert_eq!(
        vec![
            Action::RoundEnded {
                round: 1,
                outcome: Outcome::Granted
            },
            Action::Elect {
                reason: ElectReason::PreVote
            },
        ],
        m.take_actions()
    );
    // The late answer of the third changes nothing.
    m.handle_pre_vote_reply(at + Duration::from_millis(6), 1, 3, true);
    assert_eq!(Vec::<Action>::new(), m.take_actions());
}

#[test]
fn refused_by_a_majority_changes_no_term_and_retries_after_a_new_jitter() {
    // Goal: a refused round ends without an election; the next round is asked only at
    // the next (re-drawn) timeout, for the same term.
    let (mut m, at) = expired();
    m.take_actions();
    let first_wait = m.poll_timeout() - at;
    m.handle_pre_vote_reply(at + Duration::from_millis(5), 1, 2, false);
    assert_eq!(
        Vec::<Action>::new(),
        m.take_actions(),
        "one no of three decides nothing"
    );
    m.handle_pre_vote_reply(at + Duration::from_millis(6), 1, 3, false);
    assert_eq!(
        vec![Action::RoundEnded {
            round: 1,
            outcome: Outcome::Refused
        }],
        m.take_actions()
    );
    let next = m.poll_timeout();
    assert!(next >= at + MIN && next < at + MAX);
    m.handle_timeout(next, &local(5, Some((5, 10))));
    assert_eq!(
        vec![Action::RequestPreVotes {
            round: 2,
            request: ask(1, 6, Some((5, 10))),
            to: BTreeSet::from([2, 3]),
        }],
        m.take_actions(),
        "the same term is asked again: refusals bumped nothing"
    );
    let second_wait = m.poll_timeout() - next;
    assert_ne!(first_wait, second_wait, "each timeout draws a new jitter");
}

#[test]
fn a_round_without_answers_is_lost_at_the_next_timeout() {
    // Goal: unreachable peers end the round as lost, and a new one is asked.
    let (mut m, _) = expired();
    m.take_actions();
    let next = m.poll_timeout();
    m.handle_timeout(next, &local(5, Some((5, 10))));
    let actions = m.take_actions();
    assert_eq!(
        Action::RoundEnded {
            round: 1,
            outcome: Outcome::Lost
        },
        actions[0]
    );
    assert!(matches!(
        actions[1],
        Action::RequestPreVotes { round: 2, .. }
    ));
}

#[test]
fn a_heartbeat_resets_the_timer_and_abandons_the_round() {
    // Goal: hearing a leader pushes the timeout out by a fresh jitter; answers to the
    // abandoned round elect nobody.
    let (mut m, at) = expired();
    m.take_actions();
    let heard = at + Duration::from_millis(100);
    m.handle_heartbeat(heard, 2, 6);
    assert_eq!(
        vec![Action::RoundEnded {
            round: 1,
            outcome: Outcome::Lost
        }],
        m.take_actions()
    );
    assert!(m.poll_timeout() >= heard + MIN);
    m.handle_pre_vote_reply(heard, 1, 3, true);
    m.handle_pre_vote_reply(heard, 1, 2, true);
    m.handle_timeout(
        heard + MIN - Duration::from_millis(1),
        &local(6, Some((6, 11))),
    );
    assert_eq!(Vec::<Action>::new(), m.take_actions());
}

#[test]
fn a_peer_that_hears_a_leader_refuses_and_then_grants_once_it_is_silent() {
    // Goal: leader stickiness: within election_min of a heartbeat the answer is no.
    let t0 = start();
    let mut peer = PreVote::new(config(2, 9), t0);
    peer.handle_heartbeat(t0, 1, 5);
    let me = local(5, Some((5, 10)));
    let request = ask(3, 6, Some((5, 10)));
    let early = peer.answer(t0 + MIN - Duration::from_millis(1), &request, &me);
    assert_eq!(
        PreVoteAnswer {
            granted: false,
            refusal: Some("leader_heard".into()),
            term: 5
        },
        early
    );
    let late = peer.answer(t0 + MIN, &request, &me);
    assert!(late.granted, "{late:?}");
    assert_eq!(
        Vec::<Action>::new(),
        peer.take_actions(),
        "answering acts on nothing"
    );
}

#[test]
fn a_peer_refuses_a_less_up_to_date_log() {
    // Goal: Raft's vote rule, applied before the term is bumped anywhere.
    let t0 = start();
    let peer = PreVote::new(config(2, 9), t0);
    let now = t0 + MAX;
    let me = local(5, Some((5, 10)));
    let refusal = |last| peer.refusal(now, &ask(3, 6, last), &me);
    assert_eq!(Some(Refusal::LogBehind), refusal(Some((5, 9))));
    assert_eq!(Some(Refusal::LogBehind), refusal(Some((4, 20))));
    assert_eq!(Some(Refusal::LogBehind), refusal(None));
    assert_eq!(None, refusal(Some((5, 10))));
    assert_eq!(None, refusal(Some((6, 1))));
}

#[test]
fn a_leader_a_stale_term_or_a_non_voter_is_refused() {
    // Goal: the other refusals, each with its reason.
    let t0 = start();
    let peer = PreVote::new(config(2, 9), t0);
    let now = t0 + MAX;
    let mut me = local(7, Some((5, 10)));
    assert_eq!(
        Some(Refusal::StaleTerm),
        peer.refusal(now, &ask(3, 6, Some((5, 10))), &me)
    );
    assert_eq!(
        Some(Refusal::NotVoter),
        peer.refusal(now, &ask(4, 8, Some((5, 10))), &me)
    );
    me.leading = true;
    assert_eq!(
        Some(Refusal::Leading),
        peer.refusal(now, &ask(3, 8, Some((5, 10))), &me)
    );
}

#[test]
fn a_leader_never_asks_and_refuses_right_after_leading() {
    // Goal: the timer on a leader only records that a leader (itself) is heard.
    let t0 = start();
    let mut m = PreVote::new(config(1, 7), t0);
    let mut me = local(5, Some((5, 10)));
    me.leading = true;
    let at = m.poll_timeout();
    m.handle_timeout(at, &me);
    assert_eq!(Vec::<Action>::new(), m.take_actions());
    me.leading = false;
    assert_eq!(
        Some(Refusal::LeaderHeard),
        m.refusal(
            at + Duration::from_millis(1),
            &ask(2, 6, Some((5, 10))),
            &me
        )
    );
}

#[test]
fn a_single_voter_is_its_own_majority() {
    // Goal: a one-member group (waymark dev) elects itself at its first timeout.
    let t0 = start();
    let mut m = PreVote::new(config(1, 7), t0);
    let me = Local {
        voters: BTreeSet::from([1]),
        ..local(0, None)
    };
    m.handle_timeout(m.poll_timeout(), &me);
    assert_eq!(
        vec![
            Action::RoundEnded {
                round: 1,
                outcome: Outcome::Granted
            },
            Action::Elect {
                reason: ElectReason::PreVote
            },
        ],
        m.take_actions()
    );
}

#[test]
fn a_lone_voter_stands_at_start_and_a_member_of_three_waits() {
    // Goal: a one-member group needs no timeout to pass before it elects itself.
    let t0 = start();
    let mut alone = PreVote::new(config(1, 7), t0);
    alone.handle_start(
        t0,
        &Local {
            voters: BTreeSet::from([1]),
            ..local(3, Some((3, 9)))
        },
    );
    assert!(matches!(
        alone.take_actions().as_slice(),
        [
            Action::RoundEnded {
                outcome: Outcome::Granted,
                ..
            },
            Action::Elect {
                reason: ElectReason::PreVote
            }
        ]
    ));
    let mut three = PreVote::new(config(1, 7), t0);
    three.handle_start(t0, &local(3, Some((3, 9))));
    assert_eq!(Vec::<Action>::new(), three.take_actions());
}

#[test]
fn a_learner_never_asks() {
    // Goal: a member outside the voters stands for nothing.
    let t0 = start();
    let mut m = PreVote::new(config(4, 7), t0);
    m.handle_timeout(m.poll_timeout(), &local(5, None));
    assert_eq!(Vec::<Action>::new(), m.take_actions());
}

#[test]
fn a_transfer_target_stands_again_at_every_timeout_without_asking_until_it_leads() {
    // Goal: the leadership-transfer path bypasses pre-vote, as etcd's MoveLeader does,
    // and retries until a leader is heard at a higher term.
    let t0 = start();
    let mut m = PreVote::new(config(2, 7), t0);
    m.handle_heartbeat(t0, 1, 5);
    m.handle_stand(t0 + Duration::from_millis(10), 5);
    assert!(m.is_standing());
    // The old leader's heartbeat at the old term does not end it.
    m.handle_heartbeat(t0 + Duration::from_millis(20), 1, 5);
    let at = m.poll_timeout();
    m.handle_timeout(at, &local(6, Some((5, 10))));
    assert_eq!(
        vec![Action::Elect {
            reason: ElectReason::Transfer
        }],
        m.take_actions()
    );
    assert_eq!(
        at + MIN,
        m.poll_timeout(),
        "the retry comes at election_min"
    );
    m.handle_timeout(
        at + MIN,
        &Local {
            leading: true,
            ..local(7, Some((7, 11)))
        },
    );
    assert!(!m.is_standing());
    assert_eq!(Vec::<Action>::new(), m.take_actions());
}

#[test]
fn both_ends_of_a_transfer_refuse_pre_votes_while_it_runs() {
    // Goal: while the old leader hands over to its target, a third member that stops
    // hearing the old leader cannot gather a majority and take the term instead.
    let t0 = start();
    let now = t0 + MAX;
    let me = local(5, Some((5, 10)));
    let third = ask(3, 6, Some((5, 10)));
    let mut target = PreVote::new(config(2, 7), t0);
    target.handle_stand(t0, 5);
    assert_eq!(
        Some(Refusal::Transferring),
        target.refusal(now, &third, &me)
    );
    let mut old = PreVote::new(config(1, 7), t0);
    old.handle_suppress(true);
    assert_eq!(Some(Refusal::Transferring), old.refusal(now, &third, &me));
    // A longer log than its own: the target could not win against it anyway.
    let longer = ask(3, 6, Some((5, 12)));
    assert_eq!(None, target.refusal(now, &longer, &me));
    old.handle_suppress(false);
    assert_eq!(None, old.refusal(now, &third, &me));
}

#[test]
fn a_transfer_target_stops_standing_when_another_member_leads_a_later_term() {
    // Goal: a leader heard at a higher term ends the standing.
    let t0 = start();
    let mut m = PreVote::new(config(2, 7), t0);
    m.handle_stand(t0, 5);
    m.handle_heartbeat(t0 + Duration::from_millis(5), 3, 7);
    assert!(!m.is_standing());
}

#[test]
fn a_member_moving_its_leadership_away_stands_for_nothing() {
    // Goal: while suppressed, timeouts pass without a round or an election.
    let t0 = start();
    let mut m = PreVote::new(config(1, 7), t0);
    m.handle_suppress(true);
    m.handle_timeout(m.poll_timeout(), &local(5, None));
    assert_eq!(Vec::<Action>::new(), m.take_actions());
    m.handle_suppress(false);
    m.handle_timeout(m.poll_timeout(), &local(5, None));
    assert!(matches!(
        m.take_actions().as_slice(),
        [Action::RequestPreVotes { .. }]
    ));
}

#[test]
fn answers_from_non_voters_or_twice_count_once() {
    // Goal: a repeated yes is not a majority.
    let t0 = start();
    let mut m = PreVote::new(config(1, 7), t0);
    let five = Local {
        voters: BTreeSet::from([1, 2, 3, 4, 5]),
        ..local(5, None)
    };
    let at = m.poll_timeout();
    m.handle_timeout(at, &five);
    m.take_actions();
    m.handle_pre_vote_reply(at, 1, 2, true);
    m.handle_pre_vote_reply(at, 1, 2, true);
    m.handle_pre_vote_reply(at, 1, 9, true);
    assert_eq!(Vec::<Action>::new(), m.take_actions());
    m.handle_pre_vote_reply(at, 1, 3, true);
    assert!(matches!(
        m.take_actions().as_slice(),
        [
            Action::RoundEnded {
                outcome: Outcome::Granted,
                ..
            },
            Action::Elect { .. }
        ]
    ));
}
