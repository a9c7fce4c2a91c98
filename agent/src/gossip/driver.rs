//! The task that owns foca, the UDP socket and the keyring.
//!
//! One loop: wait for a command, a datagram or the next timer → feed foca → drain its
//! runtime (seal and send, schedule timers, handle notifications) → republish membership if
//! it changed.
//!
//! Until joined, every announce round resolves the seeds again on a task of its own (at most
//! one in flight), so a slow resolver never stalls the loop, and a seed name that moved to a
//! new address is followed.
//!
//! A seed declared down also starts the rounds again, until it is back: a group cut off
//! together (a zone's agents, which still see each other) is never idle, and without this
//! would only find its seeds again at foca's periodic announce, up to 30 s after the
//! partition heals — while the authority holds none of them as a live prober.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use foca::{AccumulatingRuntime, Foca, NoCustomBroadcast, OwnedNotification, PostcardCodec, Timer};
use rand::rngs::SmallRng;
use ring::rand::SystemRandom;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::{Instant, sleep_until};
use tracing::{Instrument as _, debug, info, trace, warn};

use super::codec::{self, Keyring, OpenError};
use super::identity::GossipId;
use super::membership::{ChangeDetector, Liveness, MemberState, counts, snapshot};
use super::metrics::{Direction, DropReason, GossipMetrics};
use super::seeds::{self, FailingSeeds, Resolved, SeedChange};
use crate::net::HostPort;

pub(super) type GossipFoca = Foca<GossipId, PostcardCodec, SmallRng, NoCustomBroadcast>;

/// What the [`super::Gossip`] handle asks of the driver.
pub(super) enum Command {
    /// Seal with and accept a new keyring from now on; acknowledged once in force.
    SetKeyring(Keyring, oneshot::Sender<()>),
    /// Tell the pool we are leaving, flush, stop; acknowledged after the flush.
    Leave(oneshot::Sender<()>),
    /// Stop without telling anyone; peers will find out by probing.
    Shutdown,
}

pub(super) struct Driver {
    pub(super) foca: GossipFoca,
    pub(super) runtime: AccumulatingRuntime<GossipId>,
    pub(super) socket: UdpSocket,
    pub(super) keyring: Keyring,
    pub(super) random: SystemRandom,
    pub(super) seeds: Vec<HostPort>,
    pub(super) announce_period: Duration,
    pub(super) seed_resolve_timeout: Duration,
    pub(super) commands: mpsc::Receiver<Command>,
    pub(super) members_tx: watch::Sender<Vec<MemberState>>,
    pub(super) metrics: GossipMetrics,
    /// Largest datagram we accept: foca's packet limit plus the envelope.
    pub(super) datagram_len_max: usize,
}

/// The driver's mutable loop state, kept apart from its wiring.
struct Loop {
    // A min-heap by deadline, then by foca's own timer order. Its size is bounded by foca:
    // one entry per periodic kind, per probe in flight and per suspect or down member.
    timers: BinaryHeap<Reverse<(Instant, Timer<GossipId>)>>,
    /// When to announce to the seeds again; `None` once joined.
    next_announce: Option<Instant>,
    /// The announce round whose seeds are being resolved, if any (one at a time).
    resolving: Option<JoinHandle<Vec<Resolved>>>,
    /// Seeds that did not resolve in the last round.
    failing: FailingSeeds,
    /// Every address the seeds resolved to so far.
    seed_addrs: BTreeSet<SocketAddr>,
    /// Seed addresses whose member is down; announcing goes on while there are any.
    down_seeds: BTreeSet<SocketAddr>,
    detector: ChangeDetector,
    recv_buf: Vec<u8>,
    plain_buf: Vec<u8>,
    seal_buf: Vec<u8>,
}

enum Wake {
    Command(Option<Command>),
    Datagram(io::Result<(usize, SocketAddr)>),
    Timers,
    Announce,
    Resolved(Result<Vec<Resolved>, JoinError>),
}

// === impl Driver ===

impl Driver {
    pub(super) async fn run(mut self) {
        let mut state = Loop {
            timers: BinaryHeap::new(),
            next_announce: None,
            resolving: None,
            failing: FailingSeeds::default(),
            seed_addrs: BTreeSet::new(),
            down_seeds: BTreeSet::new(),
            detector: ChangeDetector::default(),
            // One spare byte tells an oversized datagram from one that just fits.
            recv_buf: vec![0; self.datagram_len_max + 1],
            plain_buf: Vec::with_capacity(self.datagram_len_max),
            seal_buf: Vec::with_capacity(self.datagram_len_max),
        };
        info!(seeds = self.seeds.len(), "gossip started");
        self.announce_to_seeds(&mut state, Instant::now());
        self.drain(&mut state).await;
        loop {
            let wake = self.wait(&mut state).await;
            let now = Instant::now();
            match wake {
                Wake::Command(None | Some(Command::Shutdown)) => {
                    self.mark_local_down();
                    abort_resolution(&mut state);
                    info!("gossip stopped");
                    return;
                }
                Wake::Command(Some(Command::Leave(done))) => {
                    if let Err(error) = self.foca.leave_cluster(&mut self.runtime) {
                        warn!(%error, "gossip leave failed");
                    }
                    self.drain(&mut state).await;
                    self.mark_local_down();
                    abort_resolution(&mut state);
                    info!("gossip left the pool");
                    let _ignored = done.send(());
                    return;
                }
                Wake::Command(Some(Command::SetKeyring(keyring, done))) => {
                    info!(
                        primary = %keyring.primary().id(),
                        keys = keyring.keys().count(),
                        "gossip keyring replaced"
                    );
                    self.keyring = keyring;
                    let _ignored = done.send(());
                }
                Wake::Datagram(Ok((len, from))) => self.handle_datagram(&mut state, len, from),
                Wake::Datagram(Err(error)) => debug!(%error, "gossip receive failed"),
                Wake::Timers => self.handle_timers(&mut state, now),
                Wake::Announce => self.announce_to_seeds(&mut state, now),
                Wake::Resolved(round) => self.handle_resolved(&mut state, round),
            }
            self.drain(&mut state).await;
        }
    }

    async fn wait(&mut self, state: &mut Loop) -> Wake {
        let timer_at = state.timers.peek().map(|Reverse((at, _))| *at);
        tokio::select! {
            command = self.commands.recv() => Wake::Command(command),
            received = self.socket.recv_from(&mut state.recv_buf) => Wake::Datagram(received),
            () = sleep_until_some(timer_at) => Wake::Timers,
            () = sleep_until_some(state.next_announce) => Wake::Announce,
            round = resolution(&mut state.resolving) => Wake::Resolved(round),
        }
    }

    fn handle_datagram(&mut self, state: &mut Loop, len: usize, from: SocketAddr) {
        self.metrics.count_packet(Direction::In);
        if len > self.datagram_len_max {
            self.drop_datagram(DropReason::Malformed, from);
            return;
        }
        let opened = codec::open(&self.keyring, &state.recv_buf[..len], &mut state.plain_buf);
        let plaintext = match opened {
            Ok(plaintext) => plaintext,
            Err(OpenError::Auth) => return self.drop_datagram(DropReason::Auth, from),
            Err(OpenError::Malformed) => return self.drop_datagram(DropReason::Malformed, from),
        };
        match self.foca.handle_data(plaintext, &mut self.runtime) {
            Ok(()) => {}
            Err(
                foca::Error::Decode(_) | foca::Error::MalformedPacket | foca::Error::DataTooBig,
            ) => {
                self.drop_datagram(DropReason::Malformed, from);
            }
            Err(error) => debug!(peer = %from, %error, "gossip datagram refused by foca"),
        }
    }

    fn drop_datagram(&self, reason: DropReason, from: SocketAddr) {
        self.metrics.count_dropped(reason);
        debug!(peer = %from, ?reason, "gossip datagram dropped");
    }

    fn handle_timers(&mut self, state: &mut Loop, now: Instant) {
        while let Some(Reverse((at, _))) = state.timers.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, timer))) = state.timers.pop() else {
                break;
            };
            if let Err(error) = self.foca.handle_timer(timer, &mut self.runtime) {
                warn!(%error, "gossip timer failed");
            }
        }
    }

    /// Starts an announce round: schedules the next one while announcing can reach anyone,
    /// and resolves the seeds on a task unless the last round's resolution is still running.
    fn announce_to_seeds(&mut self, state: &mut Loop, now: Instant) {
        let local = self.foca.identity().addr;
        let worth = seeds::worth_announcing(&self.seeds, local);
        state.next_announce = worth.then(|| now + self.announce_period);
        if !worth || state.resolving.is_some() {
            return;
        }
        let round = seeds::resolve_all(self.seeds.clone(), self.seed_resolve_timeout);
        state.resolving = Some(tokio::spawn(round.in_current_span()));
    }

    /// Announces to what the seeds resolved to, unless we joined meanwhile; logs and counts
    /// the seeds that did not resolve (they are tried again next round).
    fn handle_resolved(&mut self, state: &mut Loop, round: Result<Vec<Resolved>, JoinError>) {
        let round = match round {
            Ok(round) => round,
            Err(error) => {
                // The next round starts a new task; nothing else depends on this one.
                warn!(%error, "gossip seed resolution task failed");
                return;
            }
        };
        for r in &round {
            let change = state.failing.record(&r.seed, r.outcome.is_err());
            match (&r.outcome, change) {
                (Err(error), change) => {
                    self.metrics.count_seed_failure(error.reason());
                    let error = error_chain(error);
                    if change == SeedChange::StartedFailing {
                        warn!(seed_addr = %r.seed, %error, "gossip seed does not resolve; retrying every announce");
                    } else {
                        debug!(seed_addr = %r.seed, %error, "gossip seed still does not resolve");
                    }
                }
                (Ok(addrs), SeedChange::Recovered) => {
                    info!(seed_addr = %r.seed, addrs = addrs.len(), "gossip seed resolves again");
                }
                (Ok(addrs), _) => trace!(seed_addr = %r.seed, ?addrs, "gossip seed resolved"),
            }
        }
        let local = self.foca.identity().addr;
        let targets = seeds::targets(&round, local);
        state.seed_addrs.extend(targets.iter().copied());
        if state.next_announce.is_none() {
            // Joined while resolving: announcing now would only add noise.
            return;
        }
        for seed in targets {
            trace!(%seed, "gossip announce");
            if let Err(error) = self.foca.announce(GossipId::seed(seed), &mut self.runtime) {
                debug!(%seed, %error, "gossip announce failed");
            }
        }
    }

    /// Executes everything foca asked for during the last interaction.
    async fn drain(&mut self, state: &mut Loop) {
        while let Some((to, data)) = self.runtime.to_send() {
            self.send(state, to.addr, &data).await;
        }
        let now = Instant::now();
        while let Some((after, timer)) = self.runtime.to_schedule() {
            state.timers.push(Reverse((now + after, timer)));
        }
        while let Some(notification) = self.runtime.to_notify() {
            self.handle_notification(state, notification, now);
        }
        debug_assert_eq!(self.runtime.backlog(), 0, "notifications never call foca");
        let local = self.foca.identity();
        if state
            .detector
            .update(local, self.foca.iter_membership_state())
        {
            let members = snapshot(local, self.foca.iter_membership_state());
            let (alive, suspect, down) = counts(&members);
            self.metrics.set_members(alive, suspect, down);
            debug!(alive, suspect, down, "gossip membership changed");
            self.members_tx.send_replace(members);
        }
    }

    async fn send(&self, state: &mut Loop, to: SocketAddr, data: &[u8]) {
        if let Err(error) = codec::seal(&self.keyring, &self.random, data, &mut state.seal_buf) {
            warn!(peer = %to, %error, "gossip seal failed");
            return;
        }
        match self.socket.send_to(&state.seal_buf, to).await {
            Ok(_) => self.metrics.count_packet(Direction::Out),
            Err(error) => debug!(peer = %to, %error, "gossip send failed"),
        }
    }

    fn handle_notification(
        &self,
        state: &mut Loop,
        notification: OwnedNotification<GossipId>,
        now: Instant,
    ) {
        match notification {
            OwnedNotification::MemberUp(member) => {
                info!(%member, "gossip member up");
                if state.down_seeds.remove(&member.addr) && state.down_seeds.is_empty() {
                    state.next_announce = None;
                }
            }
            OwnedNotification::MemberDown(member) => {
                info!(%member, "gossip member down");
                if state.seed_addrs.contains(&member.addr) {
                    // Back to the seed until it answers: a partition that healed is found
                    // within one announce period.
                    state.down_seeds.insert(member.addr);
                    state.next_announce.get_or_insert(now);
                }
            }
            OwnedNotification::Rename(old, new) => debug!(%old, %new, "gossip member renamed"),
            OwnedNotification::Active => {
                // Rounds go on while a seed is still down (see `down_seeds`).
                if state.down_seeds.is_empty() {
                    state.next_announce = None;
                }
                info!("gossip joined");
            }
            OwnedNotification::Idle => {
                // Everyone else is gone: go back to the seeds until someone answers.
                state.next_announce = Some(now);
                warn!("gossip pool idle");
            }
            OwnedNotification::Defunct => warn!("gossip identity declared down"),
            OwnedNotification::Rejoin(identity) => info!(%identity, "gossip rejoined"),
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }

    fn mark_local_down(&self) {
        self.members_tx.send_modify(|members| {
            for member in members.iter_mut().filter(|m| m.local) {
                member.state = Liveness::Down;
            }
        });
    }
}

/// Waits for the announce round being resolved, if any, and clears it once done.
async fn resolution(
    task: &mut Option<JoinHandle<Vec<Resolved>>>,
) -> Result<Vec<Resolved>, JoinError> {
    match task {
        Some(handle) => {
            let round = handle.await;
            *task = None;
            round
        }
        None => std::future::pending().await,
    }
}

fn abort_resolution(state: &mut Loop) {
    if let Some(task) = state.resolving.take() {
        task.abort();
    }
}

/// An error and its sources, `outer: inner: …`, for a log field.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}
