//! Pre-vote (Raft thesis §9.6) for the authority's Raft group: the election timer that
//! decides when this member stands, in place of openraft 0.9's own (turned off with
//! `Config::enable_elect = false`; openraft 0.10 brings pre-vote, but only as alphas).
//!
//! Pure state machine; no IO. Time arrives as `now`, randomness as a seed; wake-ups are
//! asked for with [`PreVote::poll_timeout`], outputs are [`Action`]s. The driver is
//! [`super::elections`].
//!
//! ```text
//! AppendEntries from a leader ──► handle_heartbeat ──► timer reset
//! timer expired, no leader    ──► handle_timeout   ──► Action::RequestPreVotes (term + 1, last log)
//! pre-vote answers            ──► handle_pre_vote_reply ──► majority yes: Action::Elect
//! peer asks                   ──► answer (changes nothing)
//! ```
//!
//! Invariants (checked by `prevote_tests.rs`):
//! - no `Elect` for a pre-vote round without a majority of yes, this member's own included
//! - answering a pre-vote changes nothing (no term, no vote, no timer)
//! - a member that heard a leader within `election_min`, or leads, answers no
//! - a leadership-transfer target stands at once and again at every timeout, without
//!   asking (etcd's `MoveLeader`); a member moving its leadership away never stands;
//!   both refuse every pre-vote meanwhile, so no third member takes the term

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How long a transfer target keeps standing without asking (the transfer's own wait).
pub const STANDING_MAX: Duration = super::transfer::TRANSFER_WAIT;

/// How to run the election timer.
#[derive(Debug, Clone)]
pub struct PreVoteConfig {
    /// This member's id.
    pub id: u64,
    /// Shortest election timeout; also how long a member that heard a leader refuses
    /// pre-votes (leader stickiness).
    pub election_min: Duration,
    /// Longest election timeout; each timeout is drawn from `[election_min, election_max)`.
    pub election_max: Duration,
    /// Seed of the timeout jitter.
    pub seed: u64,
}

/// The id of a member's last log entry, compared as Raft's "at least as up to date":
/// by term, then index; no log at all is the least.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LastLog {
    /// Term of the leader that wrote the entry.
    pub term: u64,
    /// Its index.
    pub index: u64,
}

/// What this member knows of itself, read from Raft when a timer fires or a peer asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    /// Its current term.
    pub term: u64,
    /// Its last log entry.
    pub last_log: Option<LastLog>,
    /// The voters of the effective membership.
    pub voters: BTreeSet<u64>,
    /// Whether it leads.
    pub leading: bool,
}

/// "Would you vote for me at `term` with last log `last_log`?" (the `pre-vote` RPC body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteRequest {
    /// The asking member: its certificate must name it.
    pub from: u64,
    /// The term it would stand at: its current term plus one.
    pub term: u64,
    /// Its last log entry.
    pub last_log: Option<LastLog>,
}

/// The answer to a [`PreVoteRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteAnswer {
    /// Whether the member would vote for the asker.
    pub granted: bool,
    /// Why not, when not ([`Refusal::as_str`]).
    pub refusal: Option<String>,
    /// The answering member's current term.
    pub term: u64,
}

/// Why a member answers a pre-vote with no.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The asker is not a voter here.
    NotVoter,
    /// This member leads.
    Leading,
    /// This member heard a leader within its `election_min`.
    LeaderHeard,
    /// A leadership transfer runs here: this member hands its leadership over, or is
    /// the member it is handed to; only the target stands (unless the asker's log is
    /// longer than this member's).
    Transferring,
    /// The asker's term would be below this member's.
    StaleTerm,
    /// The asker's log is less up to date than this member's.
    LogBehind,
}

impl Refusal {
    /// The metric label and wire reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotVoter => "not_voter",
            Self::Leading => "leading",
            Self::LeaderHeard => "leader_heard",
            Self::Transferring => "transferring",
            Self::StaleTerm => "stale_term",
            Self::LogBehind => "log_behind",
        }
    }
}

/// How a pre-vote round ended (`waymark_raft_pre_votes_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A majority said yes: this member stands.
    Granted,
    /// Enough voters said no that no majority can say yes.
    Refused,
    /// Neither before the next timeout (peers unreachable), or a leader was heard.
    Lost,
}

impl Outcome {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Granted => "granted",
            Self::Refused => "refused",
            Self::Lost => "lost",
        }
    }
}

/// Why this member starts an election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElectReason {
    /// A majority granted its pre-vote.
    PreVote,
    /// The leader asked it to stand (leadership transfer).
    Transfer,
}

impl ElectReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PreVote => "pre_vote",
            Self::Transfer => "transfer",
        }
    }
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send `request` to each of `to`; feed each answer to
    /// [`PreVote::handle_pre_vote_reply`] with `round`.
    RequestPreVotes {
        /// The round the answers belong to.
        round: u64,
        /// What to ask.
        request: PreVoteRequest,
        /// The other voters.
        to: BTreeSet<u64>,
    },
    /// A pre-vote round ended (count it).
    RoundEnded {
        /// The round.
        round: u64,
        /// How.
        outcome: Outcome,
    },
    /// Start an election now (`raft.trigger().elect()`).
    Elect {
        /// Why.
        reason: ElectReason,
    },
}

/// The election timer with pre-vote. See the module doc.
#[derive(Debug)]
pub struct PreVote {
    config: PreVoteConfig,
    /// splitmix64 state of the jitter.
    rng: u64,
    /// When this member last heard a leader (or was one).
    heard: Option<Instant>,
    /// When the election timer fires next.
    deadline: Instant,
    /// The pre-vote round in flight.
    round: Option<Round>,
    /// The id the next round gets.
    next_round: u64,
    /// Moving its leadership away: stands for nothing.
    suppressed: bool,
    /// Asked to stand by the leader: stands at every timeout, without asking.
    standing: Option<Standing>,
    /// The latest `now` seen, to check time never goes back.
    last_now: Instant,
    actions: Vec<Action>,
}

#[derive(Debug)]
struct Round {
    id: u64,
    voters: BTreeSet<u64>,
    granted: BTreeSet<u64>,
    refused: BTreeSet<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Standing {
    /// The term when it was asked: a leader heard at a higher term ends the standing.
    term: u64,
    until: Instant,
}

// === impl PreVote ===

impl PreVote {
    /// A timer started at `now`, as if a leader had just been heard: a member (re)starting
    /// waits one election timeout before it asks.
    pub fn new(config: PreVoteConfig, now: Instant) -> Self {
        assert!(
            config.election_min <= config.election_max,
            "election_min above election_max"
        );
        let mut this = Self {
            rng: config.seed,
            config,
            heard: None,
            deadline: now,
            round: None,
            next_round: 1,
            suppressed: false,
            standing: None,
            last_now: now,
            actions: Vec::new(),
        };
        this.deadline = now + this.jitter();
        this
    }

    /// An AppendEntries (heartbeat or entries) from `leader` at `term` was accepted: the
    /// timer restarts with a new jitter, and a round in flight is abandoned.
    pub fn handle_heartbeat(&mut self, now: Instant, leader: u64, term: u64) {
        self.advance(now);
        tracing::trace!(leader, term, "leader heard");
        self.heard = Some(now);
        self.deadline = now + self.jitter();
        self.end_round(Outcome::Lost);
        if self
            .standing
            .is_some_and(|s| term > s.term || leader == self.config.id)
        {
            self.standing = None;
        }
    }

    /// This member just started; `local` is how Raft has it. A voter alone in its group
    /// (a one-member region, a member just recovered from quorum loss) stands at once: it
    /// needs nobody's vote, so there is nothing to wait for.
    pub fn handle_start(&mut self, now: Instant, local: &Local) {
        self.advance(now);
        let alone = local.voters.len() == 1 && local.voters.contains(&self.config.id);
        if alone && !local.leading {
            self.fire(now, local);
        }
    }

    /// The timer may have expired; `local` is this member as Raft has it now.
    pub fn handle_timeout(&mut self, now: Instant, local: &Local) {
        self.advance(now);
        if now < self.deadline {
            return;
        }
        self.fire(now, local);
    }

    /// The timer fired: lead on, ask, or stand.
    fn fire(&mut self, now: Instant, local: &Local) {
        self.deadline = now + self.jitter();
        if self.standing.is_some_and(|s| now >= s.until) {
            self.standing = None;
        }
        if local.leading {
            // A leader hears itself: it refuses pre-votes while it leads.
            self.heard = Some(now);
            self.standing = None;
            self.end_round(Outcome::Lost);
            return;
        }
        // Answers that did not come by now will not.
        self.end_round(Outcome::Lost);
        if !local.voters.contains(&self.config.id) || self.suppressed {
            return;
        }
        if self.standing.is_some() {
            // Retry soon: the members the old leader's lease held back are free now.
            self.deadline = now + self.config.election_min;
            self.actions.push(Action::Elect {
                reason: ElectReason::Transfer,
            });
            return;
        }
        self.start_round(local);
    }

    /// `from` answered round `round`. Answers to another round, from a non-voter or
    /// repeated, change nothing.
    pub fn handle_pre_vote_reply(&mut self, now: Instant, round: u64, from: u64, granted: bool) {
        self.advance(now);
        let Some(r) = self.round.as_mut().filter(|r| r.id == round) else {
            return;
        };
        if !r.voters.contains(&from) || r.granted.contains(&from) || r.refused.contains(&from) {
            return;
        }
        if granted {
            r.granted.insert(from);
        } else {
            r.refused.insert(from);
        }
        self.settle_round();
    }

    /// The leader asked this member to stand, and it has just started an election at
    /// `term + 1` (`term` its term before): until it leads, hears a leader at a higher
    /// term, or [`STANDING_MAX`] passes, it stands again at every timeout without asking.
    pub fn handle_stand(&mut self, now: Instant, term: u64) {
        self.advance(now);
        self.end_round(Outcome::Lost);
        self.standing = Some(Standing {
            term,
            until: now + STANDING_MAX,
        });
        self.deadline = now + self.config.election_min;
    }

    /// While `suppressed`, this member stands for no election (it is moving its
    /// leadership away, and would otherwise win the term back).
    pub fn handle_suppress(&mut self, suppressed: bool) {
        self.suppressed = suppressed;
        if suppressed {
            self.end_round(Outcome::Lost);
        }
    }

    /// When to call [`PreVote::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Instant {
        self.deadline
    }

    /// The actions decided since the last call, in order.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// The answer to `request` from this member as `local` describes it. Changes nothing.
    pub fn answer(&self, now: Instant, request: &PreVoteRequest, local: &Local) -> PreVoteAnswer {
        let refusal = self.refusal(now, request, local);
        PreVoteAnswer {
            granted: refusal.is_none(),
            refusal: refusal.map(|r| r.as_str().to_owned()),
            term: local.term,
        }
    }

    /// Why this member would refuse `request`, if it would.
    pub fn refusal(
        &self,
        now: Instant,
        request: &PreVoteRequest,
        local: &Local,
    ) -> Option<Refusal> {
        if !local.voters.contains(&request.from) {
            return Some(Refusal::NotVoter);
        }
        if local.leading {
            return Some(Refusal::Leading);
        }
        let heard_recently = self
            .heard
            .is_some_and(|h| now.saturating_duration_since(h) < self.config.election_min);
        if heard_recently {
            return Some(Refusal::LeaderHeard);
        }
        // The target cannot win against a member with a longer log: such a member may
        // have its yes, so the region is not left without a leader for the transfer's
        // whole wait when a write slipped in after the target was found caught up.
        if (self.suppressed || self.standing.is_some()) && request.last_log <= local.last_log {
            return Some(Refusal::Transferring);
        }
        if request.term < local.term {
            return Some(Refusal::StaleTerm);
        }
        if request.last_log < local.last_log {
            return Some(Refusal::LogBehind);
        }
        None
    }

    /// Whether this member is standing at the leader's request.
    pub fn is_standing(&self) -> bool {
        self.standing.is_some()
    }

    fn start_round(&mut self, local: &Local) {
        let id = self.next_round;
        self.next_round += 1;
        let me = self.config.id;
        let request = PreVoteRequest {
            from: me,
            term: local.term.saturating_add(1),
            last_log: local.last_log,
        };
        self.round = Some(Round {
            id,
            voters: local.voters.clone(),
            granted: BTreeSet::from([me]),
            refused: BTreeSet::new(),
        });
        let to: BTreeSet<u64> = local.voters.iter().copied().filter(|&v| v != me).collect();
        if !to.is_empty() {
            self.actions.push(Action::RequestPreVotes {
                round: id,
                request,
                to,
            });
        }
        // A single voter is its own majority.
        self.settle_round();
    }

    /// End the round in flight if its outcome is decided.
    fn settle_round(&mut self) {
        let Some(r) = &self.round else { return };
        let majority = r.voters.len() / 2 + 1;
        if r.granted.len() >= majority {
            self.end_round(Outcome::Granted);
            self.actions.push(Action::Elect {
                reason: ElectReason::PreVote,
            });
        } else if r.voters.len() - r.refused.len() < majority {
            self.end_round(Outcome::Refused);
        }
    }

    fn end_round(&mut self, outcome: Outcome) {
        if let Some(r) = self.round.take() {
            self.actions.push(Action::RoundEnded {
                round: r.id,
                outcome,
            });
        }
    }

    fn advance(&mut self, now: Instant) {
        debug_assert!(now >= self.last_now, "time went backwards");
        self.last_now = self.last_now.max(now);
    }

    /// A timeout drawn from `[election_min, election_max)`.
    fn jitter(&mut self) -> Duration {
        let span = self
            .config
            .election_max
            .saturating_sub(self.config.election_min);
        let span_ms = u64::try_from(span.as_millis()).unwrap_or(u64::MAX);
        let extra = match span_ms {
            0 => 0,
            n => self.next_u64() % n,
        };
        self.config.election_min + Duration::from_millis(extra)
    }

    /// splitmix64: small, seeded, good enough to spread timeouts.
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
#[path = "prevote_tests.rs"]
mod tests;
