//! The xDS tier every member runs: it serves exactly the views the log committed.
//!
//! Views reach the tier only through committed `Publish` entries, so every member serves
//! the same content at the same versions, and a client that reconnects to another member
//! never sees its version go backwards (ADR-11). The builder refuses a view that is not
//! newer than the one held, as a second line of defence.
//!
//! Each committed view is stamped with when it was released and by which path, so the
//! xDS server can time every client's acknowledgement of it
//! (`waymark_xds_propagation_seconds{hop="authority_agent"}`): on the leader, the instant
//! its delta queues released it ([`ReleaseInstants`]); on a follower, which cannot read the
//! leader's clock, the instant it applied the committed entry. The path is judged from the
//! release itself ([`waymark_core::delta::release_path`]), so every member labels it alike.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use arc_swap::ArcSwap;
use tokio::sync::broadcast::error::RecvError;
use tracing::{debug, warn};
use waymark_core::delta::release_path;
use waymark_core::view::{Version, View, ViewKey};
use waymark_registry::state::{Applied, Command};
use waymark_xds::server::Publisher;
use waymark_xds::snapshot::{Released, SnapshotBuilder};

use super::authorize::{self, CallerPolicy};
use super::raft::{RaftNode, StateEvent};
use waymark_registry::machine::{published_views, registry_outcomes};

/// Release instants the leader's versions keep at most, waiting for their commit; past
/// this the oldest are forgotten (their clients' acknowledgements are then timed from
/// the commit, as on a follower).
pub const RELEASE_INSTANTS_MAX: usize = 65_536;

/// When this member, while leading, released each view version: written by the leader's
/// shell as it hands releases to the publisher, taken by this member's tier when the
/// version is committed. A follower's stays empty. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct ReleaseInstants(Arc<Mutex<BTreeMap<Version, Instant>>>);

impl ReleaseInstants {
    /// `versions` were released at `at`.
    pub fn record(&self, versions: impl IntoIterator<Item = Version>, at: Instant) {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for v in versions {
            held.insert(v, at);
        }
        while held.len() > RELEASE_INSTANTS_MAX {
            held.pop_first();
        }
    }

    /// When `version` was released here, if it was; forgotten once taken. (A version the
    /// publisher coalesced away is never taken: the bound forgets it in time.)
    pub fn take(&self, version: Version) -> Option<Instant> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&version)
    }
}

/// What the tier keeps to stamp each committed view: the instants the leader released
/// versions at, and each view's previous release (to judge the path of the next).
struct Stamper {
    releases: ReleaseInstants,
    previous: BTreeMap<ViewKey, View>,
}

impl Stamper {
    /// The stamp of `view`, committed and applied here at `now`.
    fn stamp(&mut self, view: &waymark_core::view::ReleasedView, now: Instant) -> Released {
        let key = &view.view.key;
        let path = release_path(self.previous.get(key), &view.view);
        self.previous.insert(key.clone(), view.view.clone());
        let at = self.releases.take(view.version).unwrap_or(now);
        Released {
            at,
            path,
            carried: None,
        }
    }
}

/// Follow the log and publish snapshots until the node's event channel closes; keep the
/// resolution-authorisation policy the xDS filter reads in step with the registry.
///
/// The committed views are published *before* this returns (the loop is the future it
/// returns), so an xDS server started afterwards never answers from an empty snapshot —
/// which a reconnecting client would read as every view it holds removed.
pub fn follow(
    raft: RaftNode,
    publisher: Publisher,
    callers: Arc<ArcSwap<CallerPolicy>>,
    releases: ReleaseInstants,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let events = raft.subscribe();
    let mut builder = SnapshotBuilder::new();
    let mut stamper = Stamper {
        releases,
        previous: BTreeMap::new(),
    };
    let applied = resync(&raft, &mut builder, &publisher, &mut stamper);
    refresh_callers(&raft, &callers, &publisher, &builder);
    follow_log(
        raft,
        publisher,
        callers,
        events,
        (builder, stamper),
        applied,
    )
}

async fn follow_log(
    raft: RaftNode,
    publisher: Publisher,
    callers: Arc<ArcSwap<CallerPolicy>>,
    mut events: tokio::sync::broadcast::Receiver<StateEvent>,
    (mut builder, mut stamper): (SnapshotBuilder, Stamper),
    mut applied: Option<u64>,
) {
    loop {
        match events.recv().await {
            Ok(StateEvent::Applied(entry)) => {
                if applied.is_some_and(|a| entry.index <= a) {
                    continue;
                }
                applied = Some(entry.index);
                let mut policy = false;
                let mut removed = false;
                for (stamped, outcome) in registry_outcomes(&entry.request, &entry.response) {
                    policy |= matches!(stamped.command, Command::SetPolicy { .. });
                    if let Ok(Applied::ServiceRemoved { service }) = outcome
                        && builder.handle_service_removed(service)
                    {
                        debug!(index = entry.index, service = %service, "removing a deleted service's cluster and views");
                        removed = true;
                    }
                }
                if policy {
                    refresh_callers(&raft, &callers, &publisher, &builder);
                }
                if removed {
                    publisher.publish(builder.build());
                }
                let views = published_views(&entry.request, &entry.response);
                if !views.is_empty() {
                    let mut changed = false;
                    // tokio's clock, as the xDS server times acknowledgements on it.
                    let now = tokio::time::Instant::now().into_std();
                    for view in views {
                        let stamp = stamper.stamp(view, now);
                        changed |= builder.handle_release_stamped(view, Some(stamp));
                    }
                    if changed {
                        debug!(
                            index = entry.index,
                            views = views.len(),
                            "publishing committed views"
                        );
                        publisher.publish(builder.build());
                    }
                }
            }
            Ok(StateEvent::SnapshotInstalled { .. }) => {
                applied = resync(&raft, &mut builder, &publisher, &mut stamper);
                refresh_callers(&raft, &callers, &publisher, &builder);
            }
            Err(RecvError::Lagged(missed)) => {
                warn!(missed, "xds tier fell behind the log; resyncing from state");
                applied = resync(&raft, &mut builder, &publisher, &mut stamper);
                refresh_callers(&raft, &callers, &publisher, &builder);
            }
            Err(RecvError::Closed) => break,
        }
    }
}

/// Reload the caller policy; republish so open streams are filtered by the new one.
fn refresh_callers(
    raft: &RaftNode,
    callers: &ArcSwap<CallerPolicy>,
    publisher: &Publisher,
    builder: &SnapshotBuilder,
) {
    let policy = raft.with_state(|s, _| authorize::from_registry(s.registry()));
    if **callers.load() != policy {
        callers.store(Arc::new(policy));
        publisher.publish(builder.build());
    }
}

/// Load every published view from the state, and forget services it no longer holds;
/// returns the index it reflects. Views loaded here are not stamped: whoever lacked them
/// was not sent them at their release, so nothing times them.
fn resync(
    raft: &RaftNode,
    builder: &mut SnapshotBuilder,
    publisher: &Publisher,
    stamper: &mut Stamper,
) -> Option<u64> {
    raft.with_state(|state, applied| {
        let held: std::collections::BTreeSet<_> = state
            .published()
            .keys()
            .map(|k| k.service.clone())
            .collect();
        let gone: Vec<_> = builder
            .services()
            .filter(|s| !held.contains(*s))
            .cloned()
            .collect();
        let mut changed = false;
        for service in &gone {
            changed |= builder.handle_service_removed(service);
        }
        stamper.previous.clear();
        for view in state.published().values() {
            changed |= builder.handle_release(view);
            stamper
                .previous
                .insert(view.view.key.clone(), view.view.clone());
        }
        if changed {
            publisher.publish(builder.build());
        }
        applied
    })
}
