//! Envoy's load reports, end to end through the pure code: protobuf `LoadStatsRequest`
//! decode, `waymark_xds::lrs::endpoint_loads`, attribution by address (`AddressBook::resolve`),
//! and the node agent's forwarder core (`LoadAggregator` windows, `WindowBook` attribution
//! over the assignments in force) with a virtual clock.
//!
//! Input: frames `advance (u8, ×100 ms) · len (u16, big end) · LoadStatsRequest bytes`.
//! The first request's node names the reporter, as on a stream. Checked: nothing panics;
//! every endpoint is either loaded or skipped with a reason; counts stay consistent
//! (requests ≥ errors) through conversion, windows and attribution.
#![no_main]

use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::load_stats::v3::LoadStatsRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use serde_json::json;
use waymark_agent::node::lrs::{
    AggregatorConfig, LoadAggregator, WindowBook, addresses_from_assignments,
};
use waymark_core::model::Observation;
use waymark_core::view::ReleasedView;
use waymark_fuzz::{Limits, capped};
use waymark_xds::lrs::{LoadReport, LrsReporter, endpoint_loads};
use waymark_xds::translate::load_assignment;

fuzz_target!(|data: &[u8]| run(capped(data)));

fn run(mut data: &[u8]) {
    let mut now = Instant::now();
    let config = AggregatorConfig {
        flush_interval: Duration::from_secs(1),
        endpoints_max: NonZeroUsize::new(64).expect("non-zero"),
        reporters_max: NonZeroUsize::new(8).expect("non-zero"),
        reporter_endpoints_max: NonZeroUsize::new(128).expect("non-zero"),
        // Small, so the cap is reached by ordinary counts too.
        reporter_endpoint_requests_max: NonZeroU64::new(1_000).expect("non-zero"),
    };
    let mut aggregator = LoadAggregator::new(config, now);
    let mut book = WindowBook::new(NonZeroUsize::new(3).expect("non-zero"));
    book.handle_book(addresses_from_assignments(assignments()));
    let mut node: Option<(String, String)> = None;

    for _ in 0..Limits::STEPS_MAX {
        let [advance, hi, lo, rest @ ..] = data else {
            break;
        };
        let len = usize::from(u16::from_be_bytes([*hi, *lo])).min(rest.len());
        let (frame, tail) = rest.split_at(len);
        data = tail;
        now += Duration::from_millis(u64::from(*advance) * 100);
        let Ok(req) = LoadStatsRequest::decode(frame) else {
            continue;
        };
        if node.is_none() {
            let n = req.node.clone().unwrap_or_default();
            let zone = n.locality.map(|l| l.zone).unwrap_or_default();
            node = Some((n.id, zone));
        }
        let (node_id, zone) = node.clone().unwrap_or_default();

        let endpoints: usize = req
            .cluster_stats
            .iter()
            .flat_map(|c| &c.upstream_locality_stats)
            .map(|l| l.upstream_endpoint_stats.len())
            .sum();
        let converted = endpoint_loads(&req, Duration::from_secs(1));
        assert_eq!(
            converted.loads.len() + converted.skipped.len(),
            endpoints,
            "every endpoint is loaded or skipped"
        );
        for load in &converted.loads {
            assert!(load.requests >= load.errors, "{load:?}");
        }
        let report = LoadReport {
            // As on a plaintext loopback stream: keyed by what the first request declared.
            reporter: LrsReporter::Declared(node_id.clone()),
            node_id,
            zone,
            loads: converted.loads,
        };
        if let Ok(reporter) = report.node_name() {
            let (samples, _unmapped) = book.current().resolve(&reporter, &report.loads);
            check_passive(samples.iter().map(|s| &s.observation));
        }
        let handled = aggregator.handle_report(now, &report);
        assert_eq!(
            handled.folded + handled.idle + handled.overflow + handled.untracked,
            report.loads.len(),
            "every load is folded or dropped with a reason"
        );
        if aggregator.poll_timeout() <= now {
            let flush = aggregator.flush(now);
            for total in &flush.totals {
                assert!(total.requests >= total.errors, "{total:?}");
            }
            let attributed = book.handle_flush(&flush);
            check_passive(attributed.samples.iter().map(|s| &s.observation));
        }
    }
}

fn check_passive<'a>(observations: impl Iterator<Item = &'a Observation>) {
    for o in observations {
        match o {
            Observation::Passive { requests, errors } => {
                assert!(requests >= errors, "{requests} requests, {errors} errors");
            }
            other => panic!("an LRS sample that is not passive: {other:?}"),
        }
    }
}

/// The assignments in force: a few services whose endpoints the seeds report about.
fn assignments() -> &'static [ClusterLoadAssignment] {
    static ASSIGNMENTS: OnceLock<Vec<ClusterLoadAssignment>> = OnceLock::new();
    ASSIGNMENTS.get_or_init(|| {
        [("web", "10.0.0."), ("api", "10.0.1.")]
            .iter()
            .map(|(service, prefix)| {
                let mut endpoints = serde_json::Map::new();
                for i in 1..=4 {
                    let id = format!("{service}-{i}");
                    endpoints.insert(
                        id.clone(),
                        json!({
                            "instance": id,
                            "address": {"ip": format!("{prefix}{i}"), "port": 8080},
                            "region": "eu",
                            "zone": "zone-a",
                            "tier": "local",
                            "priority": 0,
                            "weight": 100,
                            "status": "eligible",
                            "verdict": "eligible",
                            "tags": [],
                            "metadata": {},
                        }),
                    );
                }
                let view: ReleasedView = serde_json::from_value(json!({
                    "version": 3,
                    "view": {
                        "key": {"service": service, "zone": "zone-a"},
                        "endpoints": endpoints,
                        "markers": {
                            "health_disregarded": [],
                            "evacuating": {},
                            "no_eligible_in_region": false,
                            "zone_floor": {},
                        },
                    },
                }))
                .expect("the fixture view decodes");
                load_assignment(&view)
            })
            .collect()
    })
}
