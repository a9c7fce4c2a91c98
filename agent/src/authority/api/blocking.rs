//! Blocking queries, as Consul has them: the read routes over services, instances and views
//! answer with an index (`X-Waymark-Index`), and a request carrying `?index=N` is held until
//! that route's index is no longer `N`, or its `wait` has passed.
//!
//! The index is a Raft log index: the index of the last applied entry that changed what the
//! route reads, as Consul's `X-Consul-Index` is its tables' modify index. The applied log
//! index only grows on a member, every change to the state is an applied entry, and every
//! member applies the same log, so it is the one counter that covers registrations and
//! releases alike (a view's version moves only with releases, and a registration changes no
//! view until the leader releases one). Entries that change nothing a route reads (audit
//! records, observed-state snapshots, grants) wake nobody. When this member starts,
//! installs a snapshot or falls behind the log, every index restarts at the applied index:
//! higher than the truth, never lower, so a change is never missed.
//!
//! ```text
//! StateMachineStore::apply ──► StateEvent ──► follow() ──► watch<Indices> ──► held requests
//! ```
//!
//! A request is held while the route's index *equals* `N`: a higher index is a change; a
//! lower one (an index from another member that is ahead, or from before this member
//! restarted without its log) is answered at once, so the client resets instead of waiting
//! out its wait for the same answer. `index=0` (or none) never waits.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;
use tracing::Instrument as _;
use waymark_core::model::ServiceName;
use waymark_registry::machine::{Request, Response as Outcome, published_views, registry_applied};
use waymark_registry::state::Applied;

use super::ApiError;
use crate::authority::raft::{RaftNode, StateEvent};
use crate::listener::RequestDeadline;

/// How long a blocking query waits when it names no `wait` (Consul's default).
pub const WAIT_DEFAULT: Duration = Duration::from_secs(5 * 60);
/// The longest wait; a longer one is clamped to it (Consul's ceiling).
pub const WAIT_MAX: Duration = Duration::from_secs(10 * 60);
/// Up to `wait / JITTER_DIVISOR` is added to each wait, so clients that started together do
/// not all come back together (Consul's `JitterFraction`).
pub const JITTER_DIVISOR: u32 = 16;
/// The response header carrying the route's index.
pub const INDEX_HEADER: &str = "x-waymark-index";

// The listener lets a request be held this long at most: the longest wait and its jitter
// must fit.
const _: () = assert!(
    WAIT_MAX.as_millis() + WAIT_MAX.as_millis() / (JITTER_DIVISOR as u128)
        < crate::listener::HOLD_MAX.as_millis()
);

/// What a blocking route reads, which decides the index it answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reads<'a> {
    /// `GET /v1/services`: services, instance counts and every view.
    Services,
    /// `GET /v1/services/{service}`: the service records.
    Service,
    /// `GET /v1/instances` without a filter on verdicts or capabilities.
    Instances,
    /// `GET /v1/instances` filtered by what the views say (verdict, capability).
    InstancesAndViews,
    /// One service's views.
    Views(&'a ServiceName),
    /// Every view.
    AllViews,
}

/// The index of the last applied entry that changed each part of the state the blocking
/// routes read. Every index only grows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Indices {
    /// Where following began (start, snapshot, resync): below it, nothing is known per part.
    floor: u64,
    /// Service records (declared, changed, removed).
    services: u64,
    /// Instance records (registered, observed, maintenance, retired, leases restarted).
    instances: u64,
    /// Any view.
    views: u64,
    /// The last removal of a service, which removes its views without a release.
    removed: u64,
    /// Views per service, for releases since following began.
    by_service: BTreeMap<ServiceName, u64>,
}

impl Indices {
    /// Every part at `applied`, the index the state reflects.
    pub(crate) fn at(applied: u64) -> Self {
        Self {
            floor: applied,
            services: applied,
            instances: applied,
            views: applied,
            removed: applied,
            by_service: BTreeMap::new(),
        }
    }

    /// Take one applied entry; whether anything a blocking route reads changed.
    pub(crate) fn handle_entry(
        &mut self,
        index: u64,
        request: &Request,
        response: &Outcome,
    ) -> bool {
        let mut changed = false;
        let mut bump = |part: &mut u64| {
            if index > *part {
                *part = index;
                changed = true;
            }
        };
        for applied in registry_applied(request, response) {
            match applied {
                Applied::ServicePut => bump(&mut self.services),
                Applied::ServiceRemoved { service } => {
                    bump(&mut self.services);
                    bump(&mut self.views);
                    bump(&mut self.removed);
                    self.by_service.remove(service);
                }
                // A lease restart that extended none, or an expiry that retired none,
                // changed no record (a new term restarts leases before any registration).
                Applied::LeasesRestarted { extended: 0 } => {}
                Applied::Retired { instances } if instances.is_empty() => {}
                Applied::Registered { .. }
                | Applied::Renewed { .. }
                | Applied::Observed { .. }
                | Applied::Maintenance { .. }
                | Applied::Retired { .. }
                | Applied::LeasesRestarted { .. } => bump(&mut self.instances),
                // None of these is read by a blocking route.
                Applied::AssignmentSet
                | Applied::PolicySet { .. }
                | Applied::Evacuation { .. }
                | Applied::EvacuationProgress
                | Applied::RegionFailover { .. }
                | Applied::RegionFailoverProgress
                | Applied::Acl { .. } => {}
            }
        }
        for view in published_views(request, response) {
            bump(&mut self.views);
            let service = self.by_service.entry(view.view.key.service.clone());
            let at = service.or_insert(0);
            if index > *at {
                *at = index;
            }
        }
        changed
    }

    /// Start again from `applied` (a snapshot was installed, or events were missed): every
    /// part rises to it; whether anything moved.
    pub(crate) fn handle_resync(&mut self, applied: u64) -> bool {
        if applied <= self.floor {
            return false;
        }
        *self = Self::at(applied);
        true
    }

    /// The index a route reading `reads` answers with: never 0, as in Consul, so that a
    /// client echoing it always blocks.
    pub(super) fn index(&self, reads: Reads<'_>) -> u64 {
        let index = match reads {
            Reads::Services => self.services.max(self.instances).max(self.views),
            Reads::Service => self.services,
            Reads::Instances => self.instances,
            Reads::InstancesAndViews => self.instances.max(self.views),
            Reads::Views(service) => {
                let released = self.by_service.get(service).copied().unwrap_or(0);
                self.floor.max(self.removed).max(released)
            }
            Reads::AllViews => self.views,
        };
        index.max(1)
    }
}

/// Follow `raft`'s applied entries into the indices the blocking routes read; the task ends
/// once every receiver is gone.
pub(crate) fn follow(raft: RaftNode) -> watch::Receiver<Indices> {
    // Subscribe before reading the state, so no entry falls between the two.
    let events = raft.subscribe();
    let applied = raft.with_state(|_, applied| applied.unwrap_or(0));
    let (tx, rx) = watch::channel(Indices::at(applied));
    let span = tracing::debug_span!("api_indices");
    tokio::spawn(run(raft, events, tx).instrument(span));
    rx
}

async fn run(
    raft: RaftNode,
    mut events: tokio::sync::broadcast::Receiver<StateEvent>,
    tx: watch::Sender<Indices>,
) {
    loop {
        let event = tokio::select! {
            () = tx.closed() => return,
            event = events.recv() => event,
        };
        match event {
            Ok(StateEvent::Applied(entry)) => {
                tx.send_if_modified(|i| {
                    i.handle_entry(entry.index, &entry.request, &entry.response)
                });
            }
            Ok(StateEvent::SnapshotInstalled { .. }) => resync(&raft, &tx),
            Err(RecvError::Lagged(missed)) => {
                tracing::debug!(
                    missed,
                    "blocking-query indices fell behind the log; resyncing"
                );
                resync(&raft, &tx);
            }
            Err(RecvError::Closed) => return,
        }
    }
}

fn resync(raft: &RaftNode, tx: &watch::Sender<Indices>) {
    let applied = raft.with_state(|_, applied| applied.unwrap_or(0));
    tx.send_if_modified(|i| i.handle_resync(applied));
}

/// A blocking query's parameters: hold while the index is `index`, for at most `wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Blocking {
    /// The index the client holds.
    pub(super) index: u64,
    /// How long to hold at most (before jitter).
    pub(super) wait: Duration,
}

impl Blocking {
    /// From `index` and `wait` as the query gave them: `None` when there is nothing to wait
    /// for (no index, or 0). `wait` defaults to [`WAIT_DEFAULT`] (also for `0s`, as in
    /// Consul) and is clamped to [`WAIT_MAX`]. Either one malformed is a `400` naming it,
    /// even when the other makes it moot.
    pub(super) fn parse(index: Option<&str>, wait: Option<&str>) -> Result<Option<Self>, ApiError> {
        let wait = match wait {
            None => WAIT_DEFAULT,
            Some(text) => match waymark_core::duration_str::parse(text) {
                Ok(Duration::ZERO) => WAIT_DEFAULT,
                Ok(wait) => wait.min(WAIT_MAX),
                Err(e) => {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "bad_wait",
                        Some("wait"),
                        format!("wait: {e}"),
                    ));
                }
            },
        };
        let index = match index {
            None => return Ok(None),
            Some(text) => text.parse::<u64>().map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_index",
                    Some("index"),
                    format!(
                        "index: {text:?} is not an index (a whole number from X-Waymark-Index)"
                    ),
                )
            })?,
        };
        Ok((index > 0).then_some(Self { index, wait }))
    }

    /// How long this request is held at most: the wait plus up to 1/16 of it, drawn from
    /// `random`.
    pub(super) fn hold(&self, random: u64) -> Duration {
        let spread = u64::try_from((self.wait / JITTER_DIVISOR).as_millis()).unwrap_or(u64::MAX);
        let jitter = if spread == 0 { 0 } else { random % spread };
        self.wait + Duration::from_millis(jitter)
    }
}

/// Hold until `reads`' index differs from `blocking.index` or the hold (wait plus jitter)
/// has passed; the index to answer with. Without `blocking`, the current index at once.
/// The listener's request deadline is moved to cover the hold.
pub(super) async fn wait(
    indices: &watch::Receiver<Indices>,
    reads: Reads<'_>,
    blocking: Option<Blocking>,
    deadline: Option<&RequestDeadline>,
) -> u64 {
    let mut indices = indices.clone();
    let current = indices.borrow_and_update().index(reads);
    let Some(blocking) = blocking else {
        return current;
    };
    if current != blocking.index {
        return current;
    }
    let until = tokio::time::Instant::now() + blocking.hold(jitter_seed());
    if let Some(deadline) = deadline {
        deadline.hold_until(until);
    }
    held(&mut indices, reads, blocking.index, until).await
}

/// Wait for `reads`' index to differ from `index`, or for `until`; the index then.
async fn held(
    indices: &mut watch::Receiver<Indices>,
    reads: Reads<'_>,
    index: u64,
    until: tokio::time::Instant,
) -> u64 {
    loop {
        let current = indices.borrow_and_update().index(reads);
        if current != index {
            return current;
        }
        tokio::select! {
            changed = indices.changed() => if changed.is_err() { return current },
            () = tokio::time::sleep_until(until) => return current,
        }
    }
}

/// Randomness for the jitter: the system's, as the API's secrets use; a failure means no
/// jitter, never a refused request.
fn jitter_seed() -> u64 {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 8];
    match ring::rand::SystemRandom::new().fill(&mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => 0,
    }
}

/// `response` with `X-Waymark-Index: index`.
pub(super) fn with_index(mut response: Response, index: u64) -> Response {
    response
        .headers_mut()
        .insert(INDEX_HEADER, HeaderValue::from(index));
    response
}

#[cfg(test)]
#[path = "blocking_test.rs"]
mod tests;
