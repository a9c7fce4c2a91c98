//! The driver of [`PreVote`]: this member's election timer, in place of openraft's.
//!
//! ```text
//! /raft/append accepted ──► Elections::heard ─┐
//! /raft/elect (transfer) ──► Elections::stood ─┤
//! transfer (leader)      ──► Elections::suppress ─► PreVote (one Mutex) ◄── run: sleep_until(poll_timeout)
//! /raft/pre-vote         ──► Elections::answer ─┘          │ actions
//!                                                           ▼
//!                        POST /raft/pre-vote to each voter, raft.trigger().elect()
//! ```
//!
//! The core sits behind one mutex because the Raft listener's handlers feed it (every
//! accepted AppendEntries, every pre-vote question) while [`run`] owns its timer; each
//! holder keeps it for one call, never across an await. Questions go to the peers over
//! their Raft listeners as this member (the Raft client TLS), each bounded by
//! [`ASK_TIMEOUT`]; an unanswered one counts as no answer, and the round is lost at the
//! next timeout.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::{Raft, ServerState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tracing::Instrument as _;

use super::TypeConfig;
use super::prevote::{
    Action, ElectReason, LastLog, Local, Outcome, PreVote, PreVoteAnswer, PreVoteRequest,
};

/// How long one pre-vote question may take.
const ASK_TIMEOUT: Duration = Duration::from_millis(500);
/// Answers waiting for the driver; more are dropped (counted as unanswered). A round asks
/// each other voter once, and there are at most a handful.
const ANSWERS_CAPACITY: usize = 32;

/// `outcome` of a pre-vote round.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `granted`, `refused` or `lost` ([`Outcome::as_str`]).
    pub outcome: &'static str,
}

/// `reason` an election was started.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `pre_vote` or `transfer` ([`ElectReason::as_str`]).
    pub reason: &'static str,
}

/// `answer` this member gave to a peer's pre-vote.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AnswerLabels {
    /// `granted`, or the refusal ([`super::prevote::Refusal::as_str`]).
    pub answer: &'static str,
}

/// What the election timer counts. Clones share series.
#[derive(Debug, Clone, Default)]
pub struct ElectionMetrics {
    /// Pre-vote rounds this member ran, by outcome.
    pub pre_votes: Family<OutcomeLabels, Counter>,
    /// Elections this member started, by reason.
    pub elections: Family<ReasonLabels, Counter>,
    /// Pre-vote questions this member answered, by answer.
    pub answers: Family<AnswerLabels, Counter>,
}

impl ElectionMetrics {
    /// Register under `waymark_raft_`.
    pub fn register(&self, registry: &mut Registry) {
        let raft = registry.sub_registry_with_prefix("waymark_raft");
        raft.register(
            "pre_votes",
            "Pre-vote rounds this member ran: granted (it stood), refused (a majority said no), lost (no majority answered)",
            self.pre_votes.clone(),
        );
        raft.register(
            "elections_started",
            "Elections this member started: after a granted pre-vote, or at the leader's request (transfer)",
            self.elections.clone(),
        );
        raft.register(
            "pre_vote_answers",
            "Pre-vote questions this member answered, granted or why not",
            self.answers.clone(),
        );
    }

    /// Rounds that ended with `outcome`.
    pub fn pre_votes(&self, outcome: Outcome) -> u64 {
        let outcome = outcome.as_str();
        self.pre_votes
            .get_or_create(&OutcomeLabels { outcome })
            .get()
    }

    /// Elections started for `reason`.
    pub fn elections(&self, reason: ElectReason) -> u64 {
        let reason = reason.as_str();
        self.elections.get_or_create(&ReasonLabels { reason }).get()
    }
}

/// Handle to this member's election timer. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Elections {
    core: Arc<Mutex<PreVote>>,
    metrics: ElectionMetrics,
}

impl Elections {
    pub(crate) fn new(core: PreVote) -> Self {
        Self {
            core: Arc::new(Mutex::new(core)),
            metrics: ElectionMetrics::default(),
        }
    }

    pub(crate) fn metrics(&self) -> &ElectionMetrics {
        &self.metrics
    }

    fn with_core<T>(&self, f: impl FnOnce(&mut PreVote) -> T) -> T {
        let mut core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut core)
    }

    /// An AppendEntries from `leader` at `term` was accepted.
    pub(crate) fn heard(&self, leader: u64, term: u64) {
        let now = now();
        self.with_core(|c| c.handle_heartbeat(now, leader, term));
    }

    /// This member started an election because the leader asked (`term`: before it).
    pub(crate) fn stood(&self, term: u64) {
        let now = now();
        self.with_core(|c| c.handle_stand(now, term));
        self.count_election(ElectReason::Transfer);
    }

    /// While `suppressed`, this member stands for no election.
    pub(crate) fn suppress(&self, suppressed: bool) {
        self.with_core(|c| c.handle_suppress(suppressed));
    }

    /// Answer a peer's pre-vote; changes nothing but the answers counter.
    pub(crate) fn answer(
        &self,
        raft: &Raft<TypeConfig>,
        request: &PreVoteRequest,
    ) -> PreVoteAnswer {
        let local = local_of(raft);
        let now = now();
        let (answer, refusal) = self.with_core(|c| {
            (
                c.answer(now, request, &local),
                c.refusal(now, request, &local),
            )
        });
        let label = refusal.map_or("granted", |r| r.as_str());
        self.metrics
            .answers
            .get_or_create(&AnswerLabels { answer: label })
            .inc();
        tracing::debug!(
            from = request.from,
            term = request.term,
            last_log = ?request.last_log,
            answer = label,
            "pre-vote answered"
        );
        answer
    }

    fn count_election(&self, reason: ElectReason) {
        let reason = reason.as_str();
        self.metrics
            .elections
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// This member as Raft has it now (its last log id as openraft holds it in memory:
/// appended, not necessarily durable yet, which only makes it stricter as a voter).
fn local_of(raft: &Raft<TypeConfig>) -> Local {
    let (term, leading, voters) = {
        let m = raft.metrics();
        let m = m.borrow();
        let voters: BTreeSet<u64> = m.membership_config.membership().voter_ids().collect();
        (m.current_term, m.state == ServerState::Leader, voters)
    };
    let last_log = raft.data_metrics().borrow().last_log.map(|l| LastLog {
        term: l.leader_id.term,
        index: l.index,
    });
    Local {
        term,
        last_log,
        voters,
        leading,
    }
}

/// One answer to a round.
struct Reply {
    round: u64,
    from: u64,
    granted: bool,
}

/// Run the election timer until Raft stops.
pub(crate) async fn run(
    id: u64,
    raft: Raft<TypeConfig>,
    elections: Elections,
    tls: Option<Arc<rustls::ClientConfig>>,
) {
    let (replies, mut inbox) = mpsc::channel::<Reply>(ANSWERS_CAPACITY);
    let local = local_of(&raft);
    let started = now();
    elections.with_core(|c| c.handle_start(started, &local));
    loop {
        let actions = elections.with_core(PreVote::take_actions);
        for action in actions {
            execute(id, &raft, &elections, tls.as_ref(), &replies, action).await;
        }
        let deadline = elections.with_core(|c| c.poll_timeout());
        tokio::select! {
            () = tokio::time::sleep_until(deadline.into()) => {
                let metrics = raft.metrics();
                // The core gone (its metrics sender dropped) or stopped: nothing to time.
                if metrics.has_changed().is_err() || metrics.borrow().running_state.is_err() {
                    return;
                }
                let local = local_of(&raft);
                let now = now();
                elections.with_core(|c| c.handle_timeout(now, &local));
            }
            Some(reply) = inbox.recv() => {
                let now = now();
                elections.with_core(|c| {
                    c.handle_pre_vote_reply(now, reply.round, reply.from, reply.granted);
                });
            }
        }
    }
}

async fn execute(
    id: u64,
    raft: &Raft<TypeConfig>,
    elections: &Elections,
    tls: Option<&Arc<rustls::ClientConfig>>,
    replies: &mpsc::Sender<Reply>,
    action: Action,
) {
    match action {
        Action::RequestPreVotes { round, request, to } => {
            let span = tracing::info_span!(
                "pre_vote_round",
                node_id = id,
                round,
                term = request.term,
                last_log = ?request.last_log,
            );
            tracing::debug!(parent: &span, voters = ?to, "no leader heard: asking for pre-votes");
            let members = raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .clone();
            for peer in to {
                let Some(member) = members.get_node(&peer) else {
                    continue;
                };
                let ask = ask(
                    peer,
                    member.raft_addr.clone(),
                    tls.cloned(),
                    request.clone(),
                );
                let replies = replies.clone();
                tokio::spawn(
                    async move {
                        let granted = ask.await;
                        if let Some(granted) = granted {
                            // Full: the driver is far behind; this answer is dropped.
                            let _ = replies.try_send(Reply {
                                round,
                                from: peer,
                                granted,
                            });
                        }
                    }
                    .instrument(span.clone()),
                );
            }
        }
        Action::RoundEnded { round, outcome } => {
            elections
                .metrics
                .pre_votes
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.as_str(),
                })
                .inc();
            tracing::debug!(
                node_id = id,
                round,
                outcome = outcome.as_str(),
                "pre-vote round ended"
            );
        }
        Action::Elect { reason } => {
            let term = raft.metrics().borrow().current_term;
            let span = tracing::info_span!(
                "election",
                node_id = id,
                reason = reason.as_str(),
                term = term + 1
            );
            async {
                tracing::info!("standing for election");
                elections.count_election(reason);
                if let Err(error) = raft.trigger().elect().await {
                    tracing::warn!(%error, "election not started: raft stopped");
                }
            }
            .instrument(span)
            .await;
        }
    }
}

/// Ask `peer` at `addr`; `None` when it did not answer (unreachable, refused the RPC,
/// or too slow).
async fn ask(
    peer: u64,
    addr: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    request: PreVoteRequest,
) -> Option<bool> {
    let mut client = crate::api_client::ApiClient::new(&addr, None).with_timeout(ASK_TIMEOUT);
    if let Some(tls) = tls {
        client = client.with_tls(tls);
    }
    let body = serde_json::to_value(&request).ok()?;
    let answer = match client
        .send(
            http::Method::POST,
            super::network::PRE_VOTE_PATH,
            Some(&body),
        )
        .await
    {
        Ok(answer) => answer,
        Err(error) => {
            tracing::debug!(peer, error = %format!("{error:#}"), "pre-vote unanswered");
            return None;
        }
    };
    if !answer.status.is_success() {
        tracing::debug!(peer, status = %answer.status, "pre-vote refused at the listener");
        return None;
    }
    let answer: PreVoteAnswer = match serde_json::from_slice(&answer.body) {
        Ok(a) => a,
        Err(error) => {
            tracing::debug!(peer, %error, "pre-vote answer does not decode");
            return None;
        }
    };
    tracing::debug!(peer, granted = answer.granted, refusal = ?answer.refusal, peer_term = answer.term, "pre-vote answer");
    Some(answer.granted)
}
