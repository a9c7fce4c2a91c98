//! The xDS tier every member runs: it serves exactly the views the log committed.
//!
//! Views reach the tier only through committed `Publish` entries, so every member serves
//! the same content at the same versions, and a client that reconnects to another member
//! never sees its version go backwards (ADR-11). The builder refuses a view that is not
//! newer than the one held, as a second line of defence.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::broadcast::error::RecvError;
use tracing::{debug, warn};
use waymark_registry::state::{Applied, Command};
use waymark_xds::server::Publisher;
use waymark_xds::snapshot::SnapshotBuilder;

use super::authorize::{self, CallerPolicy};
use super::raft::{RaftNode, StateEvent};
use waymark_registry::machine::{published_views, registry_outcomes};

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
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let events = raft.subscribe();
    let mut builder = SnapshotBuilder::new();
    let applied = resync(&raft, &mut builder, &publisher);
    refresh_callers(&raft, &callers, &publisher, &builder);
    follow_log(raft, publisher, callers, events, builder, applied)
}

async fn follow_log(
    raft: RaftNode,
    publisher: Publisher,
    callers: Arc<ArcSwap<CallerPolicy>>,
    mut events: tokio::sync::broadcast::Receiver<StateEvent>,
    mut builder: SnapshotBuilder,
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
                    for view in views {
                        changed |= builder.handle_release(view);
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
                applied = resync(&raft, &mut builder, &publisher);
                refresh_callers(&raft, &callers, &publisher, &builder);
            }
            Err(RecvError::Lagged(missed)) => {
                warn!(missed, "xds tier fell behind the log; resyncing from state");
                applied = resync(&raft, &mut builder, &publisher);
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
/// returns the index it reflects.
fn resync(raft: &RaftNode, builder: &mut SnapshotBuilder, publisher: &Publisher) -> Option<u64> {
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
        for view in state.published().values() {
            changed |= builder.handle_release(view);
        }
        if changed {
            publisher.publish(builder.build());
        }
        applied
    })
}
