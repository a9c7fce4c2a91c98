//! The member's view of a withdrawal's trace past the commit: each committed entry that
//! carries views, as this member's xDS tier receives it to send to its subscribers.
//!
//! It follows the same applied-entry stream as the tier (`super::tier`), beside it rather
//! than inside it, so tracing never sits on the path that serves views. One span per
//! entry (`waymark.xds.publish`, hop `authority_agent`), with counts and the version
//! range; on the member that led the release it is a child of the release's span (see
//! `crate::otel` for how versions join a trace), elsewhere a root span carrying the
//! same `waymark.view.version`.

use opentelemetry::KeyValue;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use waymark_registry::machine::published_views;

use super::raft::StateEvent;
use crate::otel::Telemetry;

/// Span every committed entry that carries views until the event stream closes.
pub(crate) async fn follow_commits(
    mut events: broadcast::Receiver<StateEvent>,
    telemetry: Telemetry,
) {
    loop {
        match events.recv().await {
            Ok(StateEvent::Applied(entry)) => {
                let views = published_views(&entry.request, &entry.response);
                if views.is_empty() {
                    continue;
                }
                let versions: Vec<u64> = views.iter().map(|v| v.version.0).collect();
                let contexts = telemetry.recall_all(versions.iter().copied());
                let endpoints: usize = views.iter().map(|v| v.view.endpoints.len()).sum();
                let services: std::collections::BTreeSet<&str> =
                    views.iter().map(|v| v.view.key.service.as_str()).collect();
                let named: Vec<&str> = services.iter().take(8).copied().collect();
                telemetry
                    .span(
                        "waymark.xds.publish",
                        contexts.first(),
                        contexts.get(1..).unwrap_or_default(),
                        vec![
                            KeyValue::new("waymark.xds.hop", "authority_agent"),
                            KeyValue::new("waymark.raft.index", entry.index as i64),
                            KeyValue::new("waymark.views", views.len() as i64),
                            KeyValue::new("waymark.services", services.len() as i64),
                            KeyValue::new("waymark.service", named.join(",")),
                            KeyValue::new("waymark.endpoints", endpoints as i64),
                            KeyValue::new(
                                "waymark.view.version",
                                versions.iter().copied().max().unwrap_or(0) as i64,
                            ),
                        ],
                    )
                    .end();
            }
            Ok(StateEvent::SnapshotInstalled { .. }) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
    }
}
