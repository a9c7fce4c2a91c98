//! Region gossip: SWIM membership and failure detection of node agents, over encrypted UDP.
//!
//! foca (sans-IO SWIM) decides; the `driver` task owns it, the UDP socket and the
//! [`Keyring`], and turns foca's runtime requests into datagrams, timers and membership
//! snapshots. Every datagram is sealed with the region key (ADR-15); one that no key of the
//! ring authenticates is dropped and counted and never reaches foca.
//!
//! ```text
//! UDP ──open──► foca.handle_data ──► runtime ──seal──► UDP
//! timers ─────► foca.handle_timer ─┘        ├──► timer heap
//! Gossip ─────► announce / leave / keyring  └──► watch<Vec<MemberState>>, metrics
//! ```
//!
//! The keyring changes online ([`GossipKeyring`]: install, use, remove; decided by the pure
//! [`rotation`], persisted by [`keyring_file`]), so a region rotates its key without
//! restarts.
//!
//! Gossip carries membership only; views never travel here. The authority's prober
//! assignment consumes [`live_members_by_zone`] over [`Gossip::subscribe`].
//!
//! Both roles run it (node agents as probers, authority members to see which are alive),
//! so it sits beside them rather than inside either.

pub mod codec;
mod driver;
mod identity;
mod keyring;
pub mod keyring_file;
mod membership;
mod metrics;
pub mod rotation;
mod seeds;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::net::HostPort;

pub use codec::{Key, KeyError, KeyId, Keyring};
pub use identity::{GossipId, Role};
pub use keyring::{GossipKeyring, KeyringApplied, KeyringError};
pub use membership::{Liveness, MemberState, live_members_by_zone};
pub use metrics::{Direction, DropReason, GossipMetrics};
pub use seeds::{SEED_RESOLVE_TIMEOUT, SeedError};

use driver::{Command, Driver};

/// The cluster size [`GossipConfig::new`] tunes foca's LAN defaults for.
pub const CLUSTER_SIZE_HINT: NonZeroU32 = NonZeroU32::new(64).expect("64 is non-zero");

/// How often a member that has not joined yet announces itself to the seeds again.
pub const ANNOUNCE_PERIOD: Duration = Duration::from_secs(2);

/// Commands queued from the handle to the driver; they are rare (keyring, leave).
pub const COMMAND_CAPACITY: usize = 8;

/// The largest UDP payload over IPv4.
const UDP_PAYLOAD_MAX: usize = 65_507;

/// Why gossip could not start or a request could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GossipError {
    /// The UDP socket could not be bound. Nothing started; fix the address or free the port.
    #[error("cannot bind gossip socket {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The socket's local address could not be read. Nothing started.
    #[error("cannot read the gossip socket's address")]
    Socket(#[source] std::io::Error),
    /// The configuration is unusable. Nothing started; fix the configuration.
    #[error("invalid gossip config: {reason}")]
    Config {
        /// What is wrong.
        reason: &'static str,
    },
    /// The system random source failed while seeding. Nothing started; retry.
    #[error("system random source failed")]
    Random,
    /// The driver has already stopped; this handle is inert. Start a new [`Gossip`].
    #[error("gossip driver has stopped")]
    Stopped,
    /// The driver task panicked or was cancelled. The membership is gone; start again.
    #[error("gossip driver task failed")]
    Join(#[source] tokio::task::JoinError),
}

/// How to run gossip. [`GossipConfig::new`] gives LAN defaults; fields are public to tune.
#[derive(Debug, Clone)]
pub struct GossipConfig {
    /// Where [`Gossip::start`] binds (ignored by [`Gossip::start_with_socket`]).
    pub bind: SocketAddr,
    /// Who we are; `identity.addr` is where peers send to, so it must be reachable.
    pub identity: GossipId,
    /// Members to announce to until we have joined (our own address is skipped): IP
    /// addresses or DNS names, resolved again for every announce round.
    pub seeds: Vec<HostPort>,
    /// Region keys: seal with the primary, open with any.
    pub keyring: Keyring,
    /// Where a keyring changed online is persisted (see [`keyring_file`]); `None` keeps
    /// changes in memory only.
    pub keyring_file: Option<std::path::PathBuf>,
    /// foca's SWIM timings and limits (probe period, suspicion timeout, packet size, …).
    pub protocol: foca::Config,
    /// How often to announce to the seeds again while not joined.
    pub announce_period: Duration,
    /// How long one seed's name may take to resolve in a round.
    pub seed_resolve_timeout: Duration,
    /// Capacity of the handle-to-driver command channel.
    pub command_capacity: usize,
    /// Where to count; clones share state.
    pub metrics: GossipMetrics,
}

/// A running gossip member. Dropping it stops the driver abruptly (no leave message).
#[derive(Debug)]
pub struct Gossip {
    local_addr: SocketAddr,
    commands: mpsc::Sender<Command>,
    members: watch::Receiver<Vec<MemberState>>,
    metrics: GossipMetrics,
    keyring: GossipKeyring,
    task: Option<JoinHandle<()>>,
}

// === impl GossipConfig ===

impl GossipConfig {
    /// LAN defaults: `foca::Config::new_lan(CLUSTER_SIZE_HINT)`, no seeds.
    pub fn new(bind: SocketAddr, identity: GossipId, keyring: Keyring) -> Self {
        Self {
            bind,
            identity,
            seeds: Vec::new(),
            keyring,
            keyring_file: None,
            protocol: foca::Config::new_lan(CLUSTER_SIZE_HINT),
            announce_period: ANNOUNCE_PERIOD,
            seed_resolve_timeout: SEED_RESOLVE_TIMEOUT,
            command_capacity: COMMAND_CAPACITY,
            metrics: GossipMetrics::new(),
        }
    }

    fn validate(&self) -> Result<(), GossipError> {
        let reason = if self.identity.addr.ip().is_unspecified() || self.identity.addr.port() == 0 {
            "identity address must be a reachable ip and port"
        } else if self.protocol.max_packet_size.get() + codec::OVERHEAD > UDP_PAYLOAD_MAX {
            "protocol.max_packet_size does not fit a UDP datagram"
        } else if self.announce_period.is_zero() {
            "announce_period must be positive"
        } else if self.seed_resolve_timeout.is_zero() {
            "seed_resolve_timeout must be positive"
        } else if self.command_capacity == 0 {
            "command_capacity must be positive"
        } else {
            return Ok(());
        };
        Err(GossipError::Config { reason })
    }
}

// === impl Gossip ===

impl Gossip {
    /// Binds `config.bind` and starts the driver; see [`Gossip::start_with_socket`].
    pub async fn start(config: GossipConfig) -> Result<Self, GossipError> {
        config.validate()?;
        let socket = UdpSocket::bind(config.bind)
            .await
            .map_err(|source| GossipError::Bind {
                addr: config.bind,
                source,
            })?;
        Self::start_with_socket(config, socket)
    }

    /// Starts the driver on a bound socket and announces to the seeds.
    ///
    /// Must be called inside a tokio runtime. Membership starts as just this node.
    pub fn start_with_socket(config: GossipConfig, socket: UdpSocket) -> Result<Self, GossipError> {
        config.validate()?;
        let local_addr = socket.local_addr().map_err(GossipError::Socket)?;
        let random = SystemRandom::new();
        let mut seed = [0u8; 8];
        random.fill(&mut seed).map_err(|_| GossipError::Random)?;
        let rng = SmallRng::seed_from_u64(u64::from_le_bytes(seed));

        let span = tracing::info_span!(
            "gossip",
            node_id = %config.identity.name,
            zone = %config.identity.zone,
            addr = %config.identity.addr,
        );
        let initial = membership::snapshot(&config.identity, std::iter::empty());
        let (members_tx, members) = watch::channel(initial);
        let (commands, commands_rx) = mpsc::channel(config.command_capacity);
        let datagram_len_max = config.protocol.max_packet_size.get() + codec::OVERHEAD;
        let keyring = GossipKeyring::new(
            config.keyring.clone(),
            commands.clone(),
            config.keyring_file,
            config.metrics.clone(),
        );
        let driver = Driver {
            foca: foca::Foca::new(config.identity, config.protocol, rng, foca::PostcardCodec),
            runtime: foca::AccumulatingRuntime::new(),
            socket,
            keyring: config.keyring,
            random,
            seeds: config.seeds,
            announce_period: config.announce_period,
            seed_resolve_timeout: config.seed_resolve_timeout,
            commands: commands_rx,
            members_tx,
            metrics: config.metrics.clone(),
            datagram_len_max,
        };
        let task = tokio::spawn(driver.run().instrument(span));
        Ok(Self {
            local_addr,
            commands,
            members,
            metrics: config.metrics,
            keyring,
            task: Some(task),
        })
    }

    /// The socket's bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Our current identity (it changes if we are declared down and rejoin).
    pub fn identity(&self) -> GossipId {
        self.members
            .borrow()
            .iter()
            .find(|m| m.local)
            .map(|m| m.id.clone())
            .expect("every snapshot holds the local member")
    }

    /// The latest membership snapshot, this node included, sorted by name.
    pub fn members(&self) -> Vec<MemberState> {
        self.members.borrow().clone()
    }

    /// A receiver that changes whenever membership or liveness changes.
    pub fn subscribe(&self) -> watch::Receiver<Vec<MemberState>> {
        self.members.clone()
    }

    /// This member's metrics.
    pub fn metrics(&self) -> &GossipMetrics {
        &self.metrics
    }

    /// Seals with `keyring` from now on; returns once the driver uses it. Not persisted:
    /// operators rotate through [`Gossip::keyring`].
    pub async fn set_keyring(&self, keyring: Keyring) -> Result<(), GossipError> {
        self.keyring
            .replace(keyring)
            .await
            .map_err(|_| GossipError::Stopped)
    }

    /// The live keyring, to rotate online (install, use, remove); clones share it.
    pub fn keyring(&self) -> GossipKeyring {
        self.keyring.clone()
    }

    /// Leaves gracefully: tells a few members we are down, flushes, stops the driver.
    pub async fn leave(mut self) -> Result<(), GossipError> {
        let (done, ack) = oneshot::channel();
        self.commands
            .send(Command::Leave(done))
            .await
            .map_err(|_| GossipError::Stopped)?;
        ack.await.map_err(|_| GossipError::Stopped)?;
        self.join().await
    }

    /// Stops the driver without telling the pool; peers detect it by probing.
    pub async fn shutdown(mut self) -> Result<(), GossipError> {
        self.commands
            .send(Command::Shutdown)
            .await
            .map_err(|_| GossipError::Stopped)?;
        self.join().await
    }

    async fn join(&mut self) -> Result<(), GossipError> {
        match self.task.take() {
            Some(task) => task.await.map_err(GossipError::Join),
            None => Ok(()),
        }
    }
}

impl Drop for Gossip {
    fn drop(&mut self) {
        // Abrupt stop: the socket closes with the task, and peers find out by probing.
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
