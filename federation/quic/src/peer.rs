//! Per-link tasks: dial or await the link to one peer member, run the Session over it,
//! reconnect; the accept loop that routes admitted connections by (region, member); and the
//! refresh loop that sums links into regions.
//!
//! One task owns one peer member's link. The [`Session`] itself sits behind a mutex shared
//! with [`super::FederationNode::status`], which reads its age; every critical section is
//! one call into the pure core. Lock order: a peer's `shared` before the aggregates.
//!
//! A link is three futures raced in one task: the reader (frames → bounded channel), the
//! writer (bounded channel → stream) and the driver (Session in, Session out, timers).
//! Whichever ends first ends the link; the connection is closed with a code saying why.
//!
//! The region a link speaks for is the one its peer's certificate names, read from the
//! connection once it is admitted (dialer: the configured region at that address;
//! acceptor: routed by it) and handed to the Session, which merges only that region's
//! entries. A batch naming any other region is refused whole, counted as `foreign_entry`
//! and logged; the link stays up.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::{Connection, ConnectionError, Endpoint, Incoming, RecvStream, SendStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use waymark_certs::quic::peer_identity;
use waymark_certs::{Identity, IdentityKind, Name, TrustDomain};
use waymark_core::backoff::Backoff;
use waymark_core::model::RegionName;
use waymark_federation::aggregate::{AggregateError, ReconciliationRecord};
use waymark_federation::session::{Message, Session};

use super::metrics::{FederationMetrics, LinkLabels, RefusalReason, link_labels, region_labels};
use super::wire::{self, Frame, FrameError};
use super::{FederationConfig, LinkRole, PeerConfig, SharedAggregates, lock, new_session};

/// Most handshakes in progress at once; beyond it new connections are refused.
const HANDSHAKES_MAX: usize = 64;
/// Connections from one peer queued for its task (a reconnecting peer needs one).
const QUEUED_CONNECTIONS_MAX: usize = 2;
/// How often age and staleness gauges are refreshed (status() and regions() compute them
/// fresh).
const REFRESH_INTERVAL: Duration = Duration::from_millis(500);
/// The name we dial; ignored by the verifier, which admits servers by identity.
const SERVER_NAME: &str = "federation.waymark.invalid";

/// What every task of one node shares.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) local: RegionName,
    pub(crate) trust_domain: TrustDomain,
    pub(crate) endpoint: Endpoint,
    pub(crate) aggregates: SharedAggregates,
    pub(crate) metrics: FederationMetrics,
    pub(crate) records: Mutex<VecDeque<ReconciliationRecord>>,
    pub(crate) config: FederationConfig,
}

/// One link's state, shared between its task and `status()`.
#[derive(Debug)]
pub(crate) struct PeerShared {
    pub(crate) session: Session,
    pub(crate) connected: bool,
    pub(crate) stale: bool,
    pub(crate) last_error: Option<String>,
}

/// What the node keeps of a peer member's link.
#[derive(Debug, Clone)]
pub(crate) struct PeerHandle {
    pub(crate) region: RegionName,
    pub(crate) member: String,
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) role: LinkRole,
    pub(crate) shared: Arc<Mutex<PeerShared>>,
    /// Where the accept loop hands this peer member's connections (acceptors only).
    pub(crate) incoming: Option<mpsc::Sender<Connection>>,
}

/// Where the accept loop routes an admitted connection: by the peer's region and member.
pub(crate) type Acceptors = BTreeMap<(RegionName, String), mpsc::Sender<Connection>>;

/// One peer region summed over its links (see [`summarise`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RegionSummary {
    pub(crate) links: usize,
    pub(crate) links_up: usize,
    /// The youngest link's age.
    pub(crate) age: Option<Duration>,
    /// Every link is stale.
    pub(crate) stale: bool,
}

/// How a peer task gets its connections.
#[derive(Debug)]
pub(crate) enum Role {
    Dial,
    Accept(mpsc::Receiver<Connection>),
}

/// Why a link ended. Formatted into `last_error`; every case is retried.
#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("cannot dial")]
    Connect(#[from] quinn::ConnectError),
    #[error("connection failed")]
    Connection(#[from] ConnectionError),
    #[error("peer identity unreadable")]
    Identity(#[from] waymark_certs::CertError),
    #[error("peer identity {identity} names no region we can federate with")]
    NoRegion { identity: String },
    #[error("dialled member {expected_member} of region {expected_region} but reached {found}")]
    UnexpectedPeer {
        expected_region: RegionName,
        expected_member: String,
        found: String,
    },
    #[error("frame")]
    Frame(#[from] FrameError),
    #[error("stream write failed")]
    Write(#[source] quinn::WriteError),
    #[error("replaced by a newer connection from the same peer")]
    Replaced,
}

// === impl PeerHandle ===

impl PeerHandle {
    pub(crate) fn new(ctx: &Ctx, peer: &PeerConfig) -> (Self, Role) {
        let (role, incoming, task_role) = if ctx.local < peer.region {
            (LinkRole::Dial, None, Role::Dial)
        } else {
            let (tx, rx) = mpsc::channel(QUEUED_CONNECTIONS_MAX);
            (LinkRole::Accept, Some(tx), Role::Accept(rx))
        };
        let shared = PeerShared {
            session: new_session(&ctx.config, &peer.region),
            connected: false,
            stale: false,
            last_error: None,
        };
        let handle = Self {
            region: peer.region.clone(),
            member: peer.member.clone(),
            addr: peer.addr,
            role,
            shared: Arc::new(Mutex::new(shared)),
            incoming,
        };
        (handle, task_role)
    }

    /// The labels of this link's series.
    pub(crate) fn labels(&self) -> LinkLabels {
        link_labels(self.region.as_str(), &self.member)
    }
}

/// The link's task: obtain a connection, run it, record why it ended, back off, again.
pub(crate) async fn run(ctx: Arc<Ctx>, peer: PeerHandle, mut role: Role) {
    // The separator cannot occur in a region or member name, so no two links share a seed.
    let seed = ctx.config.seed ^ fnv1a(&format!("{}/{}", peer.region, peer.member));
    let mut backoff = Backoff::new(ctx.config.reconnect.clone(), seed);
    let labels = peer.labels();
    let mut next = None;
    loop {
        let conn = match next.take() {
            Some(conn) => conn,
            None => match &mut role {
                Role::Dial => match dial(&ctx, &peer).await {
                    Ok(conn) => conn,
                    Err(error) => {
                        let delay = backoff.next_delay(Duration::ZERO, None);
                        debug!(error = %chain(&error), backoff_ms = delay.as_millis() as u64, "dial failed");
                        lock(&peer.shared).last_error = Some(chain(&error));
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                },
                Role::Accept(rx) => match rx.recv().await {
                    Some(conn) => conn,
                    None => return,
                },
            },
        };
        let opened = Instant::now();
        lock(&peer.shared).connected = true;
        ctx.metrics.connected.get_or_create(&labels).set(1);
        info!(remote = %conn.remote_address(), "federation link up");
        let (error, replacement) = run_link(&ctx, &peer, &conn, &mut role).await;
        ctx.metrics.connected.get_or_create(&labels).set(0);
        {
            let mut shared = lock(&peer.shared);
            shared.connected = false;
            shared.last_error = Some(chain(&error));
        }
        next = replacement;
        if matches!(role, Role::Dial) {
            let delay = backoff.next_delay(opened.elapsed(), None);
            info!(error = %chain(&error), backoff_ms = delay.as_millis() as u64, "federation link down; redialling");
            tokio::time::sleep(delay).await;
        } else {
            info!(error = %chain(&error), "federation link down; awaiting the peer");
        }
    }
}

/// Dials the peer member and checks the server is that member of that region.
async fn dial(ctx: &Ctx, peer: &PeerHandle) -> Result<Connection, LinkError> {
    let conn = match ctx.endpoint.connect(peer.addr, SERVER_NAME)?.await {
        Ok(conn) => conn,
        Err(e) => {
            if is_local_tls_refusal(&e) {
                ctx.metrics.count_refused(RefusalReason::Tls);
            }
            return Err(e.into());
        }
    };
    let identity = peer_identity(&conn)?;
    let region_ok = identity.region().map(Name::as_str) == Some(peer.region.as_str());
    let member_ok = identity.member().map(Name::as_str) == Some(peer.member.as_str());
    if !(region_ok && member_ok) {
        let reason = if region_ok {
            RefusalReason::UnexpectedMember
        } else {
            RefusalReason::UnexpectedRegion
        };
        refuse(ctx, &conn, &identity, reason);
        return Err(LinkError::UnexpectedPeer {
            expected_region: peer.region.clone(),
            expected_member: peer.member.clone(),
            found: identity.to_string(),
        });
    }
    Ok(conn)
}

/// Runs one link until it fails. Returns why, and a newer connection from the same peer if
/// that is what ended it.
async fn run_link(
    ctx: &Ctx,
    peer: &PeerHandle,
    conn: &Connection,
    role: &mut Role,
) -> (LinkError, Option<Connection>) {
    let dialer = matches!(role, Role::Dial);
    // An acceptor's peer that reconnects (it restarted) replaces this link at any point.
    let replaced = async {
        match role {
            Role::Accept(rx) => match rx.recv().await {
                Some(newer) => newer,
                None => std::future::pending().await,
            },
            Role::Dial => std::future::pending().await,
        }
    };
    tokio::pin!(replaced);
    let streams = async {
        if dialer {
            conn.open_bi().await
        } else {
            conn.accept_bi().await
        }
    };
    let sender = match verified_region(conn) {
        Ok(sender) => sender,
        Err(e) => return close(ctx, conn, e, None),
    };
    let (send, recv) = tokio::select! {
        streams = streams => match streams {
            Ok(streams) => streams,
            Err(e) => return close(ctx, conn, e.into(), None),
        },
        newer = &mut replaced => return close(ctx, conn, LinkError::Replaced, Some(newer)),
    };
    let (in_tx, in_rx) = mpsc::channel(1);
    let (out_tx, out_rx) = mpsc::channel(1);
    let max = ctx.config.message_bytes_max.get();
    let (error, replacement) = tokio::select! {
        e = read_loop(recv, max, in_tx) => (e, None),
        e = write_loop(send, out_rx) => (e, None),
        e = drive(ctx, peer, sender, in_rx, out_tx) => (e, None),
        newer = &mut replaced => (LinkError::Replaced, Some(newer)),
    };
    close(ctx, conn, error, replacement)
}

/// Closes the connection with a code saying why the link ended; counts framing refusals.
fn close(
    ctx: &Ctx,
    conn: &Connection,
    error: LinkError,
    replacement: Option<Connection>,
) -> (LinkError, Option<Connection>) {
    let code = match &error {
        LinkError::Frame(e) => {
            let reason = match e {
                FrameError::TooLarge { .. } => Some(RefusalReason::FrameTooLarge),
                FrameError::Decode(_) => Some(RefusalReason::BadFrame),
                FrameError::Read(_) => None,
            };
            if let Some(reason) = reason {
                ctx.metrics.count_refused(reason);
                warn!(%reason, error = %chain(&error), "peer broke the framing; closing the link");
            }
            wire::CLOSE_PROTOCOL
        }
        LinkError::Replaced => wire::CLOSE_REPLACED,
        _ => wire::CLOSE_LINK_ENDED,
    };
    conn.close(code, error.to_string().as_bytes());
    (error, replacement)
}

/// Reads frames into the driver's channel. Returns only on error.
async fn read_loop(mut recv: RecvStream, max: u32, tx: mpsc::Sender<Message>) -> LinkError {
    loop {
        match wire::read_frame(&mut recv, max).await {
            Ok(message) => {
                if tx.send(message).await.is_err() {
                    // The driver ended first; its error is the one reported.
                    return std::future::pending().await;
                }
            }
            Err(e) => return e.into(),
        }
    }
}

/// Writes frames from the driver's channel, one at a time. Returns only on error.
async fn write_loop(mut send: SendStream, mut rx: mpsc::Receiver<Frame>) -> LinkError {
    while let Some(frame) = rx.recv().await {
        if let Err(e) = send.write_all(&frame.bytes).await {
            return LinkError::Write(e);
        }
    }
    std::future::pending().await
}

/// The region an admitted connection's certificate names: what its entries may be about.
fn verified_region(conn: &Connection) -> Result<RegionName, LinkError> {
    let identity = peer_identity(conn)?;
    identity
        .region()
        .and_then(|r| RegionName::try_new(r.as_str()).ok())
        .ok_or_else(|| LinkError::NoRegion {
            identity: identity.to_string(),
        })
}

/// The Session's driver: inputs from the reader and the timer, outputs to the writer, at
/// most one message held here. `sender` is the region the peer's certificate names.
/// Returns only on error.
async fn drive(
    ctx: &Ctx,
    peer: &PeerHandle,
    sender: RegionName,
    mut inbound: mpsc::Receiver<Message>,
    outbound: mpsc::Sender<Frame>,
) -> LinkError {
    let labels = peer.labels();
    let max = ctx.config.message_bytes_max.get();
    {
        let mut shared = lock(&peer.shared);
        let aggregates = lock(&ctx.aggregates);
        shared
            .session
            .handle_authenticated(Instant::now().into_std(), sender, &aggregates);
    }
    let mut pending: VecDeque<Frame> = VecDeque::new();
    loop {
        if pending.is_empty() {
            let next = lock(&peer.shared).session.poll_transmit();
            if let Some(message) = next {
                pending.extend(encode(ctx, message, max));
            }
        }
        let wake = lock(&peer.shared).session.poll_timeout();
        let wake_at = wake.map_or_else(far_future, Instant::from_std);
        tokio::select! {
            permit = outbound.reserve(), if !pending.is_empty() => {
                let Ok(permit) = permit else { return std::future::pending().await };
                let frame = pending.pop_front().expect("the branch runs only when a frame is pending");
                ctx.metrics.count_message(&labels, "sent", frame.kind);
                permit.send(frame);
            }
            message = inbound.recv() => {
                let Some(message) = message else { return std::future::pending().await };
                handle_message(ctx, peer, &labels, message);
            }
            () = tokio::time::sleep_until(wake_at), if wake.is_some() => {
                let mut shared = lock(&peer.shared);
                let aggregates = lock(&ctx.aggregates);
                shared.session.handle_timeout(Instant::now().into_std(), &aggregates);
            }
        }
    }
}

fn encode(ctx: &Ctx, message: Message, max: u32) -> Vec<Frame> {
    let mut frames = Vec::new();
    for frame in wire::encode(message, max) {
        match frame {
            Ok(frame) => frames.push(frame),
            Err(error) => {
                ctx.metrics.count_refused(RefusalReason::FrameTooLarge);
                warn!(error = %error, "outbound message part exceeds message_bytes_max; not sent");
            }
        }
    }
    frames
}

fn handle_message(ctx: &Ctx, peer: &PeerHandle, labels: &LinkLabels, message: Message) {
    ctx.metrics
        .count_message(labels, "received", wire::kind_of(&message));
    let records = {
        let mut shared = lock(&peer.shared);
        let mut aggregates = lock(&ctx.aggregates);
        let now = Instant::now().into_std();
        if let Err(error) = shared.session.handle_message(now, message, &mut aggregates) {
            refused_batch(ctx, peer, &error);
            shared.last_error = Some(error.to_string());
        }
        shared.session.take_records()
    };
    if records.is_empty() {
        return;
    }
    let counter = ctx.metrics.reconciliations.get_or_create(labels);
    let mut held = lock(&ctx.records);
    for record in records {
        counter.inc();
        // The record names the region (the entries are its own); the member that sent
        // them is only in the log.
        info!(
            peer_region = %peer.region,
            peer_member = %peer.member,
            changed = record.changed().count(),
            entries = record.entries.len(),
            "reconciled entries from peer"
        );
        for e in record.changed() {
            debug!(region = %e.region, service = %e.service, ours = ?e.ours, theirs = e.theirs, "took the peer's version");
        }
        if held.len() >= ctx.config.reconciliations_max.get() {
            held.pop_front();
            ctx.metrics.reconciliations_dropped.inc();
        }
        held.push_back(record);
    }
}

/// Counts and logs a batch of entries the Session refused; nothing was merged.
fn refused_batch(ctx: &Ctx, peer: &PeerHandle, error: &AggregateError) {
    match error {
        AggregateError::ForeignEntry {
            region, service, ..
        } => {
            ctx.metrics.count_refused(RefusalReason::ForeignEntry);
            warn!(
                peer_region = %peer.region,
                peer_member = %peer.member,
                region = %region,
                service = %service,
                reason = %RefusalReason::ForeignEntry,
                "peer sent another region's entry; batch refused"
            );
        }
        // ConflictingVersion, and whatever a newer core refuses.
        _ => {
            ctx.metrics.count_refused(RefusalReason::ConflictingVersion);
            warn!(
                peer_region = %peer.region,
                peer_member = %peer.member,
                error = %error,
                reason = %RefusalReason::ConflictingVersion,
                "peer sent conflicting entries; batch refused"
            );
        }
    }
}

/// Accepts connections and hands each admitted one to its peer member's task.
pub(crate) async fn accept_loop(ctx: Arc<Ctx>, acceptors: Acceptors) {
    let acceptors = Arc::new(acceptors);
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            incoming = ctx.endpoint.accept() => {
                let Some(incoming) = incoming else { return };
                if handshakes.len() >= HANDSHAKES_MAX {
                    ctx.metrics.count_refused(RefusalReason::Busy);
                    incoming.refuse();
                    continue;
                }
                handshakes.spawn(admit(ctx.clone(), incoming, acceptors.clone()));
            }
            Some(_) = handshakes.join_next() => {}
        }
    }
}

/// Completes a handshake and routes the connection, or closes it with `CLOSE_REFUSED`.
async fn admit(ctx: Arc<Ctx>, incoming: Incoming, acceptors: Arc<Acceptors>) {
    let remote = incoming.remote_address();
    let conn = match incoming.await {
        Ok(conn) => conn,
        Err(error) => {
            if is_local_tls_refusal(&error) {
                ctx.metrics.count_refused(RefusalReason::Tls);
                warn!(%remote, error = %error, "federation handshake refused");
            } else {
                debug!(%remote, error = %error, "federation handshake failed");
            }
            return;
        }
    };
    let identity = match peer_identity(&conn) {
        Ok(identity) => identity,
        Err(error) => {
            // The verifier admitted the chain, so this cannot happen; refuse anyway.
            warn!(%remote, error = %error, "admitted peer has no readable identity");
            ctx.metrics.count_refused(RefusalReason::Tls);
            conn.close(wire::CLOSE_REFUSED, b"no identity");
            return;
        }
    };
    let region = identity.region().map(|r| RegionName::try_new(r.as_str()));
    let key = match (region, identity.member()) {
        (Some(Ok(region)), Some(member))
            if identity.kind() == IdentityKind::Authority
                && identity.trust_domain() == &ctx.trust_domain =>
        {
            (region, member.as_str().to_owned())
        }
        // The policy admits only authorities of our trust domain; defence in depth.
        _ => return refuse(&ctx, &conn, &identity, RefusalReason::Tls),
    };
    if key.0 == ctx.local {
        return refuse(&ctx, &conn, &identity, RefusalReason::OwnRegion);
    }
    let Some(tx) = acceptors.get(&key) else {
        let reason = unrouted(&ctx, &key.0);
        return refuse(&ctx, &conn, &identity, reason);
    };
    debug!(%remote, peer = %identity, "federation peer admitted");
    if tx.try_send(conn.clone()).is_err() {
        refuse(&ctx, &conn, &identity, RefusalReason::Busy);
    }
}

/// Why an admitted authority of another region has no link to take its connection.
fn unrouted(ctx: &Ctx, region: &RegionName) -> RefusalReason {
    if !ctx.config.peers.iter().any(|p| p.region == *region) {
        RefusalReason::UnknownRegion
    } else if ctx.local < *region {
        // Direction is decided per region, so this holds for every member of it.
        RefusalReason::WrongDirection
    } else {
        RefusalReason::UnknownMember
    }
}

fn refuse(ctx: &Ctx, conn: &Connection, identity: &Identity, reason: RefusalReason) {
    ctx.metrics.count_refused(reason);
    warn!(peer = %identity, remote = %conn.remote_address(), %reason, "federation connection refused");
    conn.close(wire::CLOSE_REFUSED, reason.as_str().as_bytes());
}

/// Refreshes the per-link and per-region age and staleness gauges, and logs staleness
/// transitions: a region's at `warn`/`info` (the event operators act on), a link's at
/// `debug` (one member going quiet is routine while another speaks).
pub(crate) async fn refresh_loop(ctx: Arc<Ctx>, peers: Vec<PeerHandle>) {
    let mut tick = tokio::time::interval(REFRESH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut region_stale: BTreeMap<RegionName, bool> = BTreeMap::new();
    let started = Instant::now();
    loop {
        tick.tick().await;
        let now = Instant::now().into_std();
        for peer in &peers {
            refresh_link(&ctx, peer, now);
        }
        for (region, summary) in summarise(&peers, now, ctx.config.stale_after) {
            let labels = region_labels(region.as_str());
            match summary.age {
                Some(age) => {
                    ctx.metrics
                        .region_age_seconds
                        .get_or_create(&labels)
                        .set(age.as_secs_f64());
                }
                None => {
                    ctx.metrics.region_age_seconds.remove(&labels);
                }
            }
            ctx.metrics
                .region_stale
                .get_or_create(&labels)
                .set(i64::from(summary.stale));
            // A region not heard since start is stale from the first tick; say so only
            // once it has had `stale_after` to speak, not while its links are dialling.
            if summary.age.is_none()
                && !region_stale.contains_key(&region)
                && started.elapsed() < ctx.config.stale_after
            {
                continue;
            }
            let was = region_stale.insert(region.clone(), summary.stale);
            if was.unwrap_or(false) == summary.stale {
                continue;
            }
            let (links_up, links) = (summary.links_up, summary.links);
            if summary.stale {
                warn!(peer_region = %region, links_up, links, "peer region aggregate is stale; entries kept");
            } else {
                info!(peer_region = %region, links_up, links, "peer region aggregate is fresh again");
            }
        }
    }
}

/// Refreshes one link's gauges.
fn refresh_link(ctx: &Ctx, peer: &PeerHandle, now: std::time::Instant) {
    let labels = peer.labels();
    let mut shared = lock(&peer.shared);
    match shared.session.age(now) {
        Some(age) => {
            ctx.metrics
                .age_seconds
                .get_or_create(&labels)
                .set(age.as_secs_f64());
        }
        None => {
            ctx.metrics.age_seconds.remove(&labels);
        }
    }
    let stale = shared.session.is_stale(now, ctx.config.stale_after);
    ctx.metrics
        .stale
        .get_or_create(&labels)
        .set(i64::from(stale));
    if stale != shared.stale {
        shared.stale = stale;
        debug!(peer_region = %peer.region, peer_member = %peer.member, stale, "peer member's link staleness changed");
    }
}

/// Sums the links into their regions, by region name: a region is aged by its youngest
/// link (it last spoke through that one) and stale only when every link is.
pub(crate) fn summarise(
    peers: &[PeerHandle],
    now: std::time::Instant,
    stale_after: Duration,
) -> BTreeMap<RegionName, RegionSummary> {
    let links = peers.iter().map(|p| {
        let shared = lock(&p.shared);
        (p.region.clone(), shared.connected, shared.session.age(now))
    });
    sum_links(links, stale_after)
}

/// [`summarise`] over plain (region, connected, age) triples.
fn sum_links(
    links: impl IntoIterator<Item = (RegionName, bool, Option<Duration>)>,
    stale_after: Duration,
) -> BTreeMap<RegionName, RegionSummary> {
    let mut regions: BTreeMap<RegionName, RegionSummary> = BTreeMap::new();
    for (region, connected, age) in links {
        let summary = regions.entry(region).or_insert(RegionSummary {
            links: 0,
            links_up: 0,
            age: None,
            stale: true,
        });
        summary.links += 1;
        summary.links_up += usize::from(connected);
        summary.age = match (summary.age, age) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // The same rule as `Session::is_stale`, so a region is stale iff every link is.
        summary.stale &= age.is_none_or(|a| a > stale_after);
    }
    regions
}

/// Whether a failed handshake was refused by our own verifier (a locally raised TLS
/// alert), as opposed to a timeout or the peer refusing us.
fn is_local_tls_refusal(error: &ConnectionError) -> bool {
    matches!(error, ConnectionError::TransportError(e) if (0x100..0x200).contains(&u64::from(e.code)))
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}

/// The error and its sources, joined, for logs and `last_error`.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// To give each link's backoff its own stream from one seed.
fn fnv1a(s: &str) -> u64 {
    waymark_core::hash::fnv1a(s.as_bytes())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn region(s: &str) -> RegionName {
        RegionName::try_new(s).unwrap()
    }

    const STALE_AFTER: Duration = Duration::from_secs(60);

    #[test]
    fn a_region_is_as_young_as_its_youngest_link_and_fresh_while_one_is() {
        let secs = |s| Some(Duration::from_secs(s));
        let regions = sum_links(
            [
                (region("us"), false, secs(90)),
                (region("ap"), true, secs(5)),
                (region("us"), true, secs(3)),
                (region("us"), false, None),
            ],
            STALE_AFTER,
        );
        let summary = |links, links_up, age, stale| RegionSummary {
            links,
            links_up,
            age,
            stale,
        };
        assert_eq!(
            regions,
            BTreeMap::from([
                (region("ap"), summary(1, 1, secs(5), false)),
                (region("us"), summary(3, 1, secs(3), false)),
            ])
        );
    }

    #[test]
    fn a_region_is_stale_only_when_every_link_is() {
        let secs = |s| Some(Duration::from_secs(s));
        let regions = sum_links(
            [
                (region("us"), false, secs(61)),
                (region("us"), false, None),
                (region("eu"), false, None),
            ],
            STALE_AFTER,
        );
        assert!(regions[&region("us")].stale);
        assert_eq!(regions[&region("us")].age, secs(61));
        assert!(regions[&region("eu")].stale);
        assert_eq!(regions[&region("eu")].age, None);
        let at_threshold = sum_links([(region("us"), false, secs(60))], STALE_AFTER);
        assert!(
            !at_threshold[&region("us")].stale,
            "stale is strictly beyond"
        );
    }
}
