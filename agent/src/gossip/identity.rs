//! Who a gossip member is: [`GossipId`], the identity foca gossips about.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use waymark_core::model::{NodeName, ZoneName};

/// What a member does in the region; the authority's prober assignment only picks agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// A node agent: probes its assigned targets, serves its host's sidecars.
    Agent,
    /// An authority member: holds the region's desired state.
    Authority,
}

/// A member's identity in the region's gossip pool.
///
/// foca 2 keys members by [`foca::Identity::addr`] (the successor of `has_same_prefix`), and it
/// accepts an `Announce` only when the destination's `addr()` equals its own. Seeds are known
/// by socket address alone, so the socket address is the foca address; two identities with the
/// same address are the same member, and the larger `bump` wins (a restart, or a rejoin after
/// being declared down). Several identities with one *name* are collapsed by the membership
/// snapshot instead (the largest `bump` is shown), see [`super::MemberState`].
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GossipId {
    /// The node's name, unique in the region.
    pub name: NodeName,
    /// Where the node's gossip socket can be reached.
    pub addr: SocketAddr,
    /// The node's failure domain.
    pub zone: ZoneName,
    /// What the node does.
    pub role: Role,
    /// Distinguishes successive lives of one member: a fresh start takes the wall clock in
    /// milliseconds, and [`foca::Identity::renew`] adds one, so the newer life always wins.
    pub bump: u64,
}

// === impl GossipId ===

impl GossipId {
    /// A fresh identity whose `bump` is the wall clock in milliseconds.
    ///
    /// The clock here is data, not an ordering between nodes: it only has to grow across
    /// restarts of the same node so the new life wins over what peers remember of the old one.
    pub fn new(name: NodeName, addr: SocketAddr, zone: ZoneName, role: Role) -> Self {
        let bump = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(1);
        Self::with_bump(name, addr, zone, role, bump)
    }

    /// An identity with an explicit `bump` (tests, simulations, restored state).
    pub fn with_bump(
        name: NodeName,
        addr: SocketAddr,
        zone: ZoneName,
        role: Role,
        bump: u64,
    ) -> Self {
        Self {
            name,
            addr,
            zone,
            role,
            bump,
        }
    }

    /// A stand-in for a seed we know only by address: foca accepts an `Announce` whose
    /// destination has the right address whatever the other fields say.
    pub(crate) fn seed(addr: SocketAddr) -> Self {
        // "seed" is a valid name and zone; the expect states that invariant.
        let name = NodeName::try_new("seed").expect("'seed' is a valid node name");
        let zone = ZoneName::try_new("seed").expect("'seed' is a valid zone name");
        Self::with_bump(name, addr, zone, Role::Agent, 0)
    }
}

impl foca::Identity for GossipId {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        // Opting in to automatic rejoin: a member wrongly declared down comes back at once.
        Some(Self {
            bump: self.bump.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.bump > adversary.bump
    }
}

impl std::fmt::Debug for GossipId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Compact, because foca's tracing prints identities in every span.
        write!(
            f,
            "{}@{}/{}#{}",
            self.name.as_str(),
            self.addr,
            self.zone.as_str(),
            self.bump
        )
    }
}

impl std::fmt::Display for GossipId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}
