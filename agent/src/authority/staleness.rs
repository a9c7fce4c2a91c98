//! Propagation signals from the xDS tier's per-client sync state: a release that a client
//! has not acknowledged within the withdrawal budget counts as over budget (once per client
//! and version), and a client whose acknowledged view has lagged what it was sent for longer
//! than the staleness threshold counts as stale.
//!
//! The judgement is a pure function of (what was sent, what was acknowledged, when that
//! difference was first seen, now), so it is tested without a server. It lives with the
//! sync state in `waymark_xds::sync` ([`Lag`]), because the node agent judges its own
//! sidecars the same way; this module feeds the authority's tier into it.

use std::time::Duration;

pub use waymark_xds::sync::{Lag, LagReport, STALE_AFTER, holds_anything};

use super::metrics::AuthorityMetrics;

/// How often the tier is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Sample the tier every second into the alarm metrics and the tier's gauges (clients,
/// NACKs), until the task is aborted.
pub async fn run(xds: waymark_xds::server::XdsServer, metrics: AuthorityMetrics) {
    let mut lag = Lag::default();
    let mut refused = [0u64; 4];
    let mut nacks_seen = 0u64;
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tick.tick().await;
        let clients = xds.sync_state();
        // tokio's clock, as the tier stamps its own instants (`connected_since`).
        let report = lag.sample(
            &clients,
            tokio::time::Instant::now().into_std(),
            waymark_core::defaults::WITHDRAWAL_BUDGET_P99,
        );
        count_refusals(xds.stats(), &metrics, &mut refused);
        let nacks = xds.stats().nacks.load(std::sync::atomic::Ordering::Relaxed);
        metrics.xds_nacks.inc_by(nacks.saturating_sub(nacks_seen));
        nacks_seen = nacks;
        metrics
            .propagation
            .observe_view_ages(crate::metrics::HOP_AUTHORITY_AGENT, &report.view_ages);
        // A node agent's standby stream subscribes to nothing and is sent nothing: it is
        // not a subscribed client (a new stream counts from its first response).
        let subscribed = clients.iter().filter(|c| holds_anything(c)).count();
        metrics
            .xds_clients
            .set(i64::try_from(subscribed).unwrap_or(i64::MAX));
        metrics
            .withdrawal_over_budget
            .inc_by(report.newly_over_budget);
        metrics
            .clients_stale
            .set(i64::try_from(report.stale_clients).unwrap_or(i64::MAX));
    }
}

/// Add what the tier's refusal counters gained since `seen` to
/// `waymark_xds_streams_refused_total{reason}`.
fn count_refusals(
    stats: &waymark_xds::server::XdsStats,
    metrics: &AuthorityMetrics,
    seen: &mut [u64; 4],
) {
    use std::sync::atomic::Ordering::Relaxed;
    let now = [
        ("admission", stats.refused_streams.load(Relaxed)),
        ("resource_names", stats.oversubscribed_streams.load(Relaxed)),
        ("slow_consumer", stats.slow_consumers.load(Relaxed)),
        ("bad_request", stats.bad_streams.load(Relaxed)),
    ];
    for ((reason, count), last) in now.into_iter().zip(seen.iter_mut()) {
        let gained = count.saturating_sub(*last);
        if gained > 0 {
            metrics
                .xds_streams_refused
                .get_or_create(&super::metrics::ReasonLabels {
                    reason: reason.to_owned(),
                })
                .inc_by(gained);
        }
        *last = count;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Instant;

    use waymark_xds::sync::{ClientSync, TypeSync};

    use super::*;

    #[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn a_standby_stream_is_not_a_subscribed_client_and_is_never_stale() {
        // Goal: a node agent's standby (a stream that subscribed to nothing) neither counts
        // as a subscribed client nor lags: it was never sent anything.
        let now = t0();
        let mut standby = client(1, "1", None, now);
        let eds = standby.types.get_mut("eds").unwrap();
        eds.sent = None;
        assert!(!holds_anything(&standby));
        assert!(holds_anything(&client(2, "1", None, now)));
        let mut lag = Lag::default();
        let later = now + STALE_AFTER + Duration::from_secs(1);
        lag.sample(std::slice::from_ref(&standby), now, Duration::from_secs(5));
        let report = lag.sample(&[standby], later, Duration::from_secs(5));
        assert_eq!(report, LagReport::default());
    }

    fn client(stream: u64, sent: &str, acked: Option<&str>, now: Instant) -> ClientSync {
        ClientSync {
            node_id: format!("n{stream}"),
            zone: "a".into(),
            cluster: String::new(),
            stream_id: stream,
            protocol: "delta",
            identity: None,
            connected_since: now,
            types: BTreeMap::from([(
                "eds".to_owned(),
                TypeSync {
                    sent: Some(sent.into()),
                    acked: acked.map(Into::into),
                    ..TypeSync::default()
                },
            )]),
        }
    }

    #[test]
    fn an_unacknowledged_release_is_over_budget_once_and_stale_later() {
        let t0 = t0();
        let budget = Duration::from_secs(5);
        let mut lag = Lag::default();
        let fine = client(1, "7", Some("7"), t0);
        let slow = |sent: &str| client(2, sent, Some("6"), t0);
        let r = lag.sample(&[fine.clone(), slow("7")], t0, budget);
        assert_eq!((r.newly_over_budget, r.stale_clients), (0, 0));
        let r = lag.sample(&[fine.clone(), slow("7")], t0 + budget, budget);
        assert_eq!(r.newly_over_budget, 1);
        // Each client's view age: the one in sync is 0, the slow one behind since t0.
        assert_eq!(r.view_ages, vec![Duration::ZERO, budget]);
        // Counted once per release: a newer one gets its own budget.
        let r = lag.sample(
            &[fine.clone(), slow("7")],
            t0 + Duration::from_secs(6),
            budget,
        );
        assert_eq!(r.newly_over_budget, 0);
        let t8 = t0 + Duration::from_secs(7);
        let r = lag.sample(&[fine.clone(), slow("8")], t8, budget);
        assert_eq!(r.newly_over_budget, 0);
        let r = lag.sample(&[fine.clone(), slow("8")], t8 + budget, budget);
        assert_eq!(r.newly_over_budget, 1);
        // Behind since t0: stale once the episode passes the threshold.
        let r = lag.sample(&[fine.clone(), slow("9")], t0 + STALE_AFTER, budget);
        assert_eq!(r.stale_clients, 1);
        // It catches up: nothing pending, nothing stale.
        let caught = client(2, "9", Some("9"), t0);
        let r = lag.sample(&[fine, caught], t0 + STALE_AFTER + budget, budget);
        assert_eq!((r.newly_over_budget, r.stale_clients), (0, 0));
        assert_eq!(r.view_ages, vec![Duration::ZERO; 2]);
    }

    #[test]
    fn stream_refusals_are_exported_as_they_grow_and_never_twice() {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = waymark_xds::server::XdsStats::default();
        let metrics = AuthorityMetrics::default();
        let mut seen = [0; 4];
        let get = |reason: &str| {
            metrics
                .xds_streams_refused
                .get_or_create(&super::super::metrics::ReasonLabels {
                    reason: reason.to_owned(),
                })
                .get()
        };
        stats.refused_streams.store(3, Relaxed);
        stats.oversubscribed_streams.store(1, Relaxed);
        count_refusals(&stats, &metrics, &mut seen);
        count_refusals(&stats, &metrics, &mut seen);
        assert_eq!((get("admission"), get("resource_names")), (3, 1));
        stats.refused_streams.store(5, Relaxed);
        count_refusals(&stats, &metrics, &mut seen);
        assert_eq!((get("admission"), get("slow_consumer")), (5, 0));
    }
}
