//! The federation driver: carries the pure anti-entropy session,
//! `waymark_federation::session::Session`, over mutually authenticated QUIC, one link (and
//! one [`Session`]) per peer authority *member*, as quinn drives quinn-proto.
//!
//! ```text
//!            ┌── link task (eu→us/a1) ── Session ── 1 bidi stream ── QUIC ─┐
//!            ├── link task (eu→us/a2) ── Session ── …                      │
//! Endpoint ──┤                                                             ├── peer members
//!  (bind)    └── accept loop ── admit(region, member) ─► link (eu←ap/a1) ──┘
//!                      │ merges                          │ records
//!                      ▼                                 ▼
//!              SharedAggregates              take_reconciliations()
//! ```
//!
//! The Session decides what to send and when; this crate moves it. It depends on quinn and
//! tokio (endpoint, streams, tasks, timers), `waymark-certs` (the rustls configs and the
//! peer's identity), waymark-core's redial `Backoff` and prometheus-client. The
//! authority (`waymark-agent`) starts a [`FederationNode`] and shares its
//! [`SharedAggregates`]; how links are chosen, admitted and bounded is on [`FederationNode`].
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
#![deny(missing_docs)]

mod metrics;
mod peer;
mod wire;

pub use metrics::{FederationMetrics, RefusalReason};
pub use wire::FrameError;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::task::JoinSet;
use tracing::Instrument as _;
use waymark_certs::identity::IdentityError;
use waymark_certs::quic::{QuicConfigError, quic_client_config, quic_server_config};
use waymark_certs::tls::LiveMaterial;
use waymark_certs::{CertMetrics, IdentityKind, KindSet, Name, PeerPolicy, TrustDomain};
use waymark_core::backoff::BackoffConfig;
use waymark_core::model::{RegionName, ServiceName};
use waymark_federation::aggregate::{Digest, ReconciliationRecord, RegionAggregates};
use waymark_federation::session::{Session, SessionConfig};

/// This region's view of every region's aggregates, shared with the authority. The lock is
/// held only for a merge or a digest, never across an await.
pub type SharedAggregates = Arc<Mutex<RegionAggregates>>;

/// How a region federates.
#[derive(Debug, Clone)]
pub struct FederationConfig {
    /// This region.
    pub region: RegionName,
    /// The UDP address to serve and dial from (port 0 picks one; see
    /// [`FederationNode::local_addr`]).
    pub bind: SocketAddr,
    /// The peer authority members, one entry each; a region appears once per member.
    pub peers: Vec<PeerConfig>,
    /// Digest pacing and the per-message and outbox limits.
    pub session: SessionConfig,
    /// Redial backoff (full jitter).
    pub reconnect: BackoffConfig,
    /// Seeds the backoff jitter (mixed with each peer's region and member).
    pub seed: u64,
    /// A link silent this long is reported stale, and a region once all its links are (its
    /// entries are kept).
    pub stale_after: Duration,
    /// A link silent this long is dropped (keep-alives go at a third of it); also bounds a
    /// dial to an unreachable peer.
    pub idle_timeout: Duration,
    /// Largest frame accepted or sent, in bytes of JSON.
    pub message_bytes_max: NonZeroU32,
    /// Reconciliation records held until [`FederationNode::take_reconciliations`]; beyond
    /// it the oldest is dropped and counted.
    pub reconciliations_max: NonZeroUsize,
}

/// One member of a peer region's authority and where its federation endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// The peer region.
    pub region: RegionName,
    /// The member's name: the `<member>` of its identity
    /// `spiffe://<td>/region/<region>/authority/<member>`.
    pub member: String,
    /// Its federation endpoint (dialled only if our region name sorts lower).
    pub addr: SocketAddr,
}

/// The TLS material a federation endpoint presents and verifies with.
#[derive(Debug, Clone)]
pub struct FederationTls {
    /// Our authority certificate, key and trust bundle (reloaded in place).
    pub live: Arc<LiveMaterial>,
    /// The estate's trust domain: peers elsewhere are refused.
    pub trust_domain: TrustDomain,
    /// Where the verifier counts refused certificates (shared with the process's other
    /// TLS ports; the caller registers it).
    pub metrics: CertMetrics,
}

/// Why a federation node could not start. Nothing is running; fix the cause and start again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FederationError {
    /// A peer member is in this region, or is listed twice. Fix the configuration.
    #[error("peer {member} of region {region} is in this region or is listed twice")]
    BadPeer {
        /// The offending peer's region.
        region: RegionName,
        /// The offending peer's member.
        member: String,
    },
    /// A peer's member is not a valid identity name, so no certificate could ever carry
    /// it. Fix the configuration.
    #[error("peer member {member:?} of region {region} is not a valid name")]
    BadMember {
        /// The peer's region.
        region: RegionName,
        /// The refused member.
        member: String,
        /// Why it is not a name.
        #[source]
        source: IdentityError,
    },
    /// The idle timeout cannot be expressed in QUIC. Use a shorter one.
    #[error("idle timeout {idle_timeout:?} is out of range")]
    IdleTimeout {
        /// The configured value.
        idle_timeout: Duration,
    },
    /// The TLS material could not be turned into QUIC configs (a programming error in how
    /// the rustls config was assembled).
    #[error("cannot build the quic tls configs")]
    Tls(#[from] QuicConfigError),
    /// The UDP socket could not be bound. Check the address (and that a previous node on
    /// the same port has shut down).
    #[error("cannot bind the federation endpoint to {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
}

/// Whether we dial a peer or wait for it to dial us.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LinkRole {
    /// Our region name sorts lower: we dial.
    Dial,
    /// Our region name sorts higher: the peer dials us.
    Accept,
}

/// One peer member's link as the authority reports it (`waymark federation status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[schemars(rename = "FederationLink")] // the Raft peers' `PeerStatus` has the name
pub struct PeerStatus {
    /// The peer region.
    pub region: RegionName,
    /// The peer authority member.
    pub member: String,
    /// Its configured address.
    pub addr: SocketAddr,
    /// Who dials.
    pub role: LinkRole,
    /// Whether the link is up now.
    pub connected: bool,
    /// Time since the peer member last spoke, in ms; `null` (`None`) if it has not since
    /// this node started.
    #[serde(rename = "age_ms", serialize_with = "as_millis")]
    #[schemars(with = "Option<u64>")]
    pub age: Option<Duration>,
    /// Silent longer than `stale_after` (or never heard). The region may still be fresh
    /// through another member; see [`RegionStatus`].
    pub stale: bool,
    /// Why the link last ended or was refused, if it did.
    pub last_error: Option<String>,
    /// The versions we hold of the peer region's aggregates, by service.
    pub versions: BTreeMap<ServiceName, u64>,
}

/// One peer region, summed over its members' links: what tier 2 of the views depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[schemars(rename = "FederationRegion")]
pub struct RegionStatus {
    /// The peer region.
    pub region: RegionName,
    /// Links to its members that are up now.
    pub links_up: usize,
    /// Links configured to its members.
    pub links: usize,
    /// Time since the region last spoke through any of its links (the youngest link's
    /// age), in ms; `null` (`None`) if none has since this node started.
    #[serde(rename = "age_ms", serialize_with = "as_millis")]
    #[schemars(with = "Option<u64>")]
    pub age: Option<Duration>,
    /// Every link is stale: the region's entries are kept, marked stale.
    pub stale: bool,
    /// The versions we hold of the region's aggregates, by service.
    pub versions: BTreeMap<ServiceName, u64>,
}

/// A running federation endpoint: one QUIC endpoint, one task per peer member, an accept
/// loop.
/// Dropping it stops the tasks; [`FederationNode::shutdown`] also waits for the endpoint to
/// close, so the port can be bound again.
///
/// - **Why per member.** Every authority member (3 or 5 per region) runs this endpoint. With
///   one link per region, our members dialling one peer member would keep replacing each
///   other's link, and losing that one peer member would silence the region. So each member
///   keeps a link (and a [`Session`]) to every member of every peer region, and a region is
///   fresh while any of its links speaks ([`FederationNode::regions`]).
/// - **Who dials.** Of two regions, the one whose name sorts lower dials: each of its
///   members dials each member of the other. So there is one link per pair of members and
///   no duplicate to resolve. An acceptor replaces a link only when the same peer member
///   connects again (it restarted).
/// - **Who is admitted.** Both directions require an authority identity of our trust
///   domain (rustls verifier, [`PeerPolicy`]); then the peer's region and member must be a
///   configured peer that dials us (acceptor) or the ones configured at the dialled address
///   (dialer). Anything else is closed with an application error and counted by
///   [`RefusalReason`].
/// - **What a link carries: direct links only.** A peer speaks only for its own region,
///   the one its certificate names (and which must be the configured peer region). The
///   driver hands that region to the [`Session`], which answers digests with our own
///   entries only and merges a batch only if every entry is the peer's own: a batch naming
///   a third region, or ours, is refused whole, changes nothing, and is counted as
///   `foreign_entry` and logged with the peer and the entry it claimed. So a compromised
///   region can write only its own aggregates. The cost: nothing is relayed, so every
///   region must link directly to every region whose aggregates it wants (a full mesh of
///   peers); a region we do not link to is simply absent from tier 2. Relaying would need
///   entries signed by their own region, which the one-hop rule makes unnecessary.
/// - **Bounded bandwidth.** A message carries at most `entries_per_message` entries and at
///   most `message_bytes_max` bytes; the Session queues at most `outbox_max` messages
///   (dropping the oldest, which the next digest round recomputes); the driver holds one
///   message, hands one to the writer and the writer has one on the wire.
/// - **Staleness.** A link's age is [`Session::age`]; beyond `stale_after` it is reported
///   stale. A region's age is its youngest link's, and it is stale only when every link is.
///   Its entries stay in the aggregates: losing a link never removes anything.
/// - **Reconnects** use full-jitter backoff (250 ms doubling to [`RECONNECT_CAP`]), seeded.
#[derive(Debug)]
pub struct FederationNode {
    ctx: Arc<peer::Ctx>,
    peers: Vec<peer::PeerHandle>,
    local_addr: SocketAddr,
    tasks: JoinSet<()>,
}

// === impl FederationConfig ===

/// The longest wait between redials of a peer member. A region cut off for longer than a
/// few doublings would otherwise wait up to the xDS clients' 30 s after the heal before it
/// is heard again; at this cap a healed link is back within seconds, well inside the 15 s
/// the partition drill allows for reconciling, and dialling a handful of peer members at
/// most every 5 s during a partition costs nothing.
pub const RECONNECT_CAP: Duration = Duration::from_secs(5);

impl FederationConfig {
    /// Defaults: 5 s digests of at most 256 entries, 60 s staleness, 10 s idle timeout,
    /// redials at most [`RECONNECT_CAP`] apart, 1 MiB frames, 1,024 held reconciliation
    /// records.
    pub fn new(region: RegionName, bind: SocketAddr, peers: Vec<PeerConfig>) -> Self {
        Self {
            region,
            bind,
            peers,
            session: SessionConfig::default(),
            reconnect: BackoffConfig {
                cap: RECONNECT_CAP,
                ..BackoffConfig::default()
            },
            seed: 0,
            stale_after: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(10),
            message_bytes_max: NonZeroU32::new(1 << 20).expect("1 MiB is not zero"),
            reconciliations_max: NonZeroUsize::new(1_024).expect("1024 is not zero"),
        }
    }

    fn validate(&self) -> Result<(), FederationError> {
        let mut seen = BTreeSet::new();
        for p in &self.peers {
            if let Err(source) = Name::new(&p.member) {
                return Err(FederationError::BadMember {
                    region: p.region.clone(),
                    member: p.member.clone(),
                    source,
                });
            }
            if p.region == self.region || !seen.insert((&p.region, &p.member)) {
                return Err(FederationError::BadPeer {
                    region: p.region.clone(),
                    member: p.member.clone(),
                });
            }
        }
        Ok(())
    }
}

// === impl FederationNode ===

impl FederationNode {
    /// Binds the endpoint and starts a link to every peer member. Must run inside a tokio
    /// runtime.
    pub fn start(
        config: FederationConfig,
        tls: FederationTls,
        aggregates: SharedAggregates,
        metrics: FederationMetrics,
    ) -> Result<Self, FederationError> {
        config.validate()?;
        let endpoint = bind(&config, &tls)?;
        let local_addr = endpoint
            .local_addr()
            .map_err(|source| FederationError::Bind {
                addr: config.bind,
                source,
            })?;
        let ctx = Arc::new(peer::Ctx {
            local: config.region.clone(),
            trust_domain: tls.trust_domain,
            endpoint,
            aggregates,
            metrics,
            records: Mutex::new(VecDeque::new()),
            config: config.clone(),
        });
        let mut tasks = JoinSet::new();
        let mut peers = Vec::new();
        let mut acceptors = BTreeMap::new();
        for p in &config.peers {
            let (handle, role) = peer::PeerHandle::new(&ctx, p);
            // Every configured link has a series from the start, down until it is up.
            ctx.metrics.connected.get_or_create(&handle.labels()).set(0);
            if let Some(tx) = handle.incoming.clone() {
                acceptors.insert((p.region.clone(), p.member.clone()), tx);
            }
            let span = tracing::info_span!(
                "fed_session",
                region = %config.region,
                peer_region = %p.region,
                peer_member = %p.member,
            );
            tasks.spawn(peer::run(ctx.clone(), handle.clone(), role).instrument(span));
            peers.push(handle);
        }
        let span = tracing::info_span!("fed_accept", region = %config.region, %local_addr);
        tasks.spawn(peer::accept_loop(ctx.clone(), acceptors).instrument(span.clone()));
        tasks.spawn(peer::refresh_loop(ctx.clone(), peers.clone()).instrument(span));
        tracing::info!(region = %config.region, %local_addr, peers = config.peers.len(), "federation endpoint started");
        Ok(Self {
            ctx,
            peers,
            local_addr,
            tasks,
        })
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Every peer member's link, in configuration order.
    pub fn status(&self) -> Vec<PeerStatus> {
        let digest = lock(&self.ctx.aggregates).digest();
        let now = tokio::time::Instant::now().into_std();
        self.peers
            .iter()
            .map(|h| {
                let shared = lock(&h.shared);
                PeerStatus {
                    region: h.region.clone(),
                    member: h.member.clone(),
                    addr: h.addr,
                    role: h.role,
                    connected: shared.connected,
                    age: shared.session.age(now),
                    stale: shared.session.is_stale(now, self.ctx.config.stale_after),
                    last_error: shared.last_error.clone(),
                    versions: region_versions(&digest, &h.region),
                }
            })
            .collect()
    }

    /// Every peer region, by name, summed over its members' links: up while any link is,
    /// aged by its youngest link, stale only when every link is.
    pub fn regions(&self) -> Vec<RegionStatus> {
        let digest = lock(&self.ctx.aggregates).digest();
        let now = tokio::time::Instant::now().into_std();
        peer::summarise(&self.peers, now, self.ctx.config.stale_after)
            .into_iter()
            .map(|(region, s)| RegionStatus {
                versions: region_versions(&digest, &region),
                region,
                links_up: s.links_up,
                links: s.links,
                age: s.age,
                stale: s.stale,
            })
            .collect()
    }

    /// Reconciliation records produced since the last call, oldest first: every merge
    /// from a peer that changed our aggregates, with what each side held.
    pub fn take_reconciliations(&self) -> Vec<ReconciliationRecord> {
        lock(&self.ctx.records).drain(..).collect()
    }

    /// Stops every link (peers see an application close), closes the endpoint and waits
    /// until it is idle, so the same port can be bound by a new node.
    pub async fn shutdown(mut self) {
        self.tasks.shutdown().await;
        self.ctx
            .endpoint
            .close(wire::CLOSE_SHUTDOWN, b"federation node shutting down");
        self.ctx.endpoint.wait_idle().await;
        for h in &self.peers {
            lock(&h.shared).connected = false;
            self.ctx.metrics.connected.get_or_create(&h.labels()).set(0);
        }
        tracing::info!(region = %self.ctx.local, "federation endpoint stopped");
    }
}

fn bind(
    config: &FederationConfig,
    tls: &FederationTls,
) -> Result<quinn::Endpoint, FederationError> {
    let policy = PeerPolicy {
        trust_domain: tls.trust_domain.clone(),
        accepted: KindSet::only(IdentityKind::Authority),
        region: None,
    };
    let idle = quinn::IdleTimeout::try_from(config.idle_timeout).map_err(|_| {
        FederationError::IdleTimeout {
            idle_timeout: config.idle_timeout,
        }
    })?;
    // Peers dial us and open the one stream; we never let a peer open a stream on a link
    // we dialled, nor more than one on a link it dialled.
    let transport = |bidi: u32| {
        let mut t = quinn::TransportConfig::default();
        t.max_idle_timeout(Some(idle))
            .keep_alive_interval(Some(config.idle_timeout / 3))
            .max_concurrent_bidi_streams(bidi.into())
            .max_concurrent_uni_streams(0u32.into());
        Arc::new(t)
    };
    let mut server = quic_server_config(&tls.live, policy.clone(), tls.metrics.clone())?;
    server.transport_config(transport(1));
    let mut client = quic_client_config(&tls.live, policy, tls.metrics.clone())?;
    client.transport_config(transport(0));
    let mut endpoint =
        quinn::Endpoint::server(server, config.bind).map_err(|source| FederationError::Bind {
            addr: config.bind,
            source,
        })?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

/// Locks a mutex whose holders never panic mid-update (each critical section is a single
/// call into a pure core), so a poisoned lock still holds consistent data.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn as_millis<S: serde::Serializer>(age: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match age {
        Some(d) => s.serialize_some(&u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        None => s.serialize_none(),
    }
}

/// The versions `digest` holds of `region`'s aggregates, by service.
fn region_versions(digest: &Digest, region: &RegionName) -> BTreeMap<ServiceName, u64> {
    digest
        .iter()
        .filter(|((r, _), _)| r == region)
        .map(|((_, service), v)| (service.clone(), *v))
        .collect()
}

/// A new session for a peer member's link, not yet connected. Its records name the
/// region: a link carries only its region's own entries, whichever member sends them.
fn new_session(config: &FederationConfig, peer: &RegionName) -> Session {
    Session::new(config.session.clone(), config.region.clone(), peer.clone())
}

/// The link's frame codec, otherwise private, for the fuzz targets (`fuzz/`) only.
#[doc(hidden)]
pub mod fuzzing {
    use waymark_federation::session::Message;

    use super::wire::{self, FrameError};

    /// Reads one frame as a link's reader loop does.
    pub async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
        reader: &mut R,
        max: u32,
    ) -> Result<Message, FrameError> {
        wire::read_frame(reader, max).await
    }

    /// Encodes a message into frames (length prefix and body) as a link's writer does.
    pub fn encode(message: Message, max: u32) -> Vec<Result<Vec<u8>, FrameError>> {
        wire::encode(message, max)
            .into_iter()
            .map(|frame| frame.map(|f| f.bytes))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn config(peers: &[(&str, &str)]) -> FederationConfig {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let peers = peers
            .iter()
            .map(|(region, member)| PeerConfig {
                region: RegionName::try_new(*region).unwrap(),
                member: (*member).to_owned(),
                addr,
            })
            .collect();
        FederationConfig::new(RegionName::try_new("eu").unwrap(), addr, peers)
    }

    #[test]
    fn a_region_may_be_listed_once_per_member() {
        config(&[("us", "a1"), ("us", "a2"), ("ap", "a1")])
            .validate()
            .unwrap();
    }

    #[test]
    fn a_member_listed_twice_or_in_our_region_is_refused() {
        for (peers, bad) in [
            (vec![("us", "a1"), ("us", "a1")], ("us", "a1")),
            (vec![("us", "a1"), ("eu", "a2")], ("eu", "a2")),
        ] {
            let err = config(&peers).validate().unwrap_err();
            assert!(
                matches!(&err, FederationError::BadPeer { region, member }
                    if region.as_str() == bad.0 && member == bad.1),
                "{peers:?}: {err:?}"
            );
        }
    }

    #[test]
    fn a_member_no_certificate_could_name_is_refused() {
        for member in ["", "a/1", ".."] {
            let err = config(&[("us", member)]).validate().unwrap_err();
            assert!(
                matches!(&err, FederationError::BadMember { member: m, .. } if m == member),
                "{member:?}: {err:?}"
            );
        }
    }
}
