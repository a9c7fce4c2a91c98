//! The simulated region's federation: one peer region and, per authority member, the real
//! anti-entropy [`Session`] pair of its link (ours and the peer's end) over the simulated
//! network, each member holding its own [`RegionAggregates`] in memory as the product's
//! members do (a crash loses it; the link re-learns it).
//!
//! The peer region is synthetic: it publishes a new aggregate of one of the services now
//! and then, always with at least one endpoint. This region's members publish their own
//! aggregates from the views they applied ([`local_aggregate`]) and the peer merges them,
//! so a member that would send two contents under one version is refused there.
//!
//! Checked: a member never goes back to an older version of a peer's entry; no two members
//! send different contents under one version; and, once the region's published views route
//! a service to the peer region, they keep doing so while the peer is silent — a stale peer
//! is reported, never dropped (ADR-14).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use waymark_core::assembler::RemoteEndpoint;
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::{EndpointStatus, ReleasedView};
use waymark_federation::aggregate::{AggregateEndpoint, Entry, RegionAggregates, ServiceAggregate};
use waymark_federation::local::local_aggregate;
use waymark_federation::session::{Message, Session, SessionConfig};

use crate::rng::SplitMix64;

/// How often each end of a link sends its digest.
const DIGEST_INTERVAL: Duration = Duration::from_secs(2);
/// How long after a new version of a peer's entry its endpoints may be missing from the
/// views (the hard-failure budget's worth of admission damping and delivery).
const UPDATE_GRACE: Duration = Duration::from_secs(15);
/// A peer silent this long is stale.
const STALE_AFTER: Duration = Duration::from_secs(6);

/// Which way a message travels on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Toward {
    Member,
    Peer,
}

struct Link {
    /// This member's replica of every region's aggregates.
    aggregates: RegionAggregates,
    ours: Session,
    theirs: Session,
    up: bool,
    wire: VecDeque<(Instant, Toward, Message)>,
}

impl Link {
    fn new(local: &RegionName, peer: &RegionName) -> Self {
        let config = SessionConfig {
            digest_interval: DIGEST_INTERVAL,
            ..SessionConfig::default()
        };
        Self {
            aggregates: RegionAggregates::new(),
            ours: Session::new(config.clone(), local.clone(), peer.clone()),
            theirs: Session::new(config, peer.clone(), local.clone()),
            up: false,
            wire: VecDeque::new(),
        }
    }
}

/// See the module documentation.
pub(super) struct Federation {
    local: RegionName,
    peer: RegionName,
    /// The peer region's replica: its own entries, and ours as it merged them.
    peer_state: RegionAggregates,
    peer_version: u64,
    links: Vec<Link>,
    /// The newest version of each peer entry each member has held.
    seen: Vec<BTreeMap<ServiceName, u64>>,
    /// Services whose published views have routed to the peer region.
    routed: BTreeSet<ServiceName>,
    /// When a member last learned a new version of the peer's entry, by service.
    learned_at: BTreeMap<ServiceName, Instant>,
    /// Batches of the peer's entries received, over every member (a figure).
    pub(super) merged: usize,
    /// Services the published views ever routed to the peer (a figure: the ADR-14 check
    /// has something to hold).
    pub(super) routed_ever: BTreeSet<ServiceName>,
}

impl Federation {
    pub(super) fn new(members: usize, local: RegionName) -> Self {
        let peer = RegionName::try_new("peer").expect("valid");
        Self {
            links: (0..members).map(|_| Link::new(&local, &peer)).collect(),
            seen: vec![BTreeMap::new(); members],
            local,
            peer,
            peer_state: RegionAggregates::new(),
            peer_version: 0,
            routed: BTreeSet::new(),
            learned_at: BTreeMap::new(),
            merged: 0,
            routed_ever: BTreeSet::new(),
        }
    }

    /// The peer region publishes a new aggregate of one of `services`: one to three
    /// endpoints, never none.
    pub(super) fn peer_publishes(&mut self, rng: &mut SplitMix64, services: &[ServiceName]) {
        if services.is_empty() {
            return;
        }
        let service = services[rng.below(services.len() as u64) as usize].clone();
        self.peer_version += 1;
        let zone = ZoneName::try_new("peer-a").expect("valid");
        let count = 1 + rng.below(3);
        let mut endpoints: Vec<_> = (0..count)
            .map(|i| AggregateEndpoint {
                instance: InstanceId::try_new(format!("{service}-p{}", rng.below(4) + i * 4))
                    .expect("valid"),
                address: Address {
                    ip: IpAddr::V4(Ipv4Addr::new(10, 200, 0, (i + 1) as u8)),
                    port: 8080,
                },
                zone: zone.clone(),
                weight: Weight::DEFAULT,
                status: EndpointStatus::Eligible,
                verdict: Verdict::Eligible,
            })
            .collect();
        // Sorted by instance, as a region publishes them.
        endpoints.sort();
        let entry = Entry {
            region: self.peer.clone(),
            service,
            version: self.peer_version,
            aggregate: Arc::new(ServiceAggregate { endpoints }),
        };
        self.peer_state
            .publish_local(entry)
            .expect("the peer's version only grows");
    }

    /// Member `m` publishes this region's aggregate of every service whose views it holds
    /// at a newer version than it published.
    pub(super) fn publish_local<'a>(
        &mut self,
        m: usize,
        views: impl IntoIterator<Item = &'a ReleasedView>,
    ) {
        let mut by_service: BTreeMap<&ServiceName, Vec<&ReleasedView>> = BTreeMap::new();
        for v in views {
            by_service.entry(&v.view.key.service).or_default().push(v);
        }
        let link = &mut self.links[m];
        for (service, views) in by_service {
            let Some((version, aggregate)) = local_aggregate(views) else {
                continue;
            };
            if link
                .aggregates
                .version(&self.local, service)
                .is_some_and(|held| held >= version)
            {
                continue;
            }
            let entry = Entry {
                region: self.local.clone(),
                service: service.clone(),
                version,
                aggregate: Arc::new(aggregate),
            };
            let _ = link.aggregates.publish_local(entry);
        }
    }

    /// Member `m` crashed: its in-memory aggregates and sessions are gone.
    pub(super) fn crashed(&mut self, m: usize) {
        self.links[m] = Link::new(&self.local, &self.peer);
    }

    /// One tick of member `m`'s link: (dis)connection, timers, sends, deliveries. `up`
    /// says whether the member and the peer can reach each other; `delay` draws a one-way
    /// delay. Returns what broke.
    pub(super) fn step(
        &mut self,
        m: usize,
        now: Instant,
        up: bool,
        mut delay: impl FnMut() -> Duration,
    ) -> Vec<String> {
        let mut broke = Vec::new();
        let link = &mut self.links[m];
        let was_up = std::mem::replace(&mut link.up, up);
        if !up {
            link.wire.clear();
            return broke;
        }
        if !was_up {
            link.ours.handle_connected(now, &link.aggregates);
            link.theirs.handle_connected(now, &self.peer_state);
        }
        link.ours.handle_timeout(now, &link.aggregates);
        link.theirs.handle_timeout(now, &self.peer_state);
        while let Some(msg) = link.ours.poll_transmit() {
            link.wire.push_back((now + delay(), Toward::Peer, msg));
        }
        while let Some(msg) = link.theirs.poll_transmit() {
            link.wire.push_back((now + delay(), Toward::Member, msg));
        }
        let mut later = VecDeque::new();
        while let Some((at, toward, msg)) = link.wire.pop_front() {
            if at > now {
                later.push_back((at, toward, msg));
                continue;
            }
            let result = match toward {
                Toward::Member => {
                    if matches!(msg, Message::Entries { .. }) {
                        self.merged += 1;
                    }
                    link.ours.handle_message(now, msg, &mut link.aggregates)
                }
                Toward::Peer => link.theirs.handle_message(now, msg, &mut self.peer_state),
            };
            if let Err(e) = result {
                broke.push(format!("m{m}'s link to {} refused a batch: {e}", self.peer));
            }
        }
        link.wire = later;
        let _ = link.ours.take_records();
        let _ = link.theirs.take_records();
        for (key, version) in link.aggregates.digest_of(&self.peer) {
            let held = self.seen[m].entry(key.1.clone()).or_insert(version);
            if version < *held {
                broke.push(format!(
                    "m{m} went back from version {held} to {version} of {}/{}",
                    key.0, key.1
                ));
            }
            if version > *held || !self.learned_at.contains_key(&key.1) {
                self.learned_at.insert(key.1.clone(), now);
            }
            *held = (*held).max(version);
        }
        broke
    }

    /// What member `m` knows of peer regions, as the leader core reads it.
    pub(super) fn digest(&self, m: usize) -> Vec<((RegionName, ServiceName), u64)> {
        self.links[m]
            .aggregates
            .digest_of(&self.peer)
            .into_iter()
            .collect()
    }

    /// A peer region's endpoints of `service` in member `m`'s replica.
    pub(super) fn endpoints(
        &self,
        m: usize,
        region: &RegionName,
        service: &ServiceName,
    ) -> Vec<RemoteEndpoint> {
        self.links[m].aggregates.remote_endpoints(region, service)
    }

    /// The peers member `m` has not heard from within [`STALE_AFTER`].
    pub(super) fn stale(&self, m: usize, now: Instant) -> BTreeSet<RegionName> {
        let link = &self.links[m];
        if link.ours.is_stale(now, STALE_AFTER) {
            BTreeSet::from([self.peer.clone()])
        } else {
            BTreeSet::new()
        }
    }

    /// ADR-14 over the region's published views: a service once routed to the peer region
    /// keeps its peer endpoints (the peer always publishes at least one). A new version of
    /// the peer's entry may replace every endpoint, and the region withdraws the old ones
    /// at once but admits the new ones behind damping, so tier 2 may be empty for a while
    /// after the region learned one: only a gap [`UPDATE_GRACE`] after the last version
    /// learned counts — a silent peer's endpoints are never dropped.
    pub(super) fn check_published<'a>(
        &mut self,
        now: Instant,
        views: impl IntoIterator<Item = &'a ReleasedView>,
    ) -> Vec<String> {
        let mut with_peer: BTreeMap<&ServiceName, bool> = BTreeMap::new();
        for v in views {
            let has = v.view.endpoints.values().any(|e| e.region == self.peer);
            let any = with_peer.entry(&v.view.key.service).or_insert(false);
            *any |= has;
        }
        let mut broke = Vec::new();
        for (service, has) in with_peer {
            if has {
                self.routed.insert(service.clone());
                self.routed_ever.insert(service.clone());
            } else if self.routed.contains(service)
                && self
                    .learned_at
                    .get(service)
                    .is_none_or(|t| now.saturating_duration_since(*t) > UPDATE_GRACE)
            {
                broke.push(format!(
                    "the published views of {service} dropped the endpoints of region {}",
                    self.peer
                ));
                self.routed.remove(service);
            }
        }
        broke
    }
}
