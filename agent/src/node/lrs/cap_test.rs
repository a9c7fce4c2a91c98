//! One reporter, one bounded voice: the per-reporter cap of [`LoadAggregator`], pure.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use proptest::prelude::*;
use waymark_certs::Identity;
use waymark_core::defaults::{PASSIVE_ERROR_PERMILLE, PASSIVE_INTERVAL};
use waymark_core::units::Permille;
use waymark_xds::lrs::{EndpointLoad, LoadReport, LrsReporter};

use super::*;

const WINDOW: Duration = Duration::from_secs(1);
const CAP: u64 = 1_000;

/// One real instant to offset from; the pure parts under test read no clock.
#[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
fn t0() -> Instant {
    Instant::now()
}

fn addr(n: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, n], 80))
}

fn load(address: u8, requests: u64, errors: u64) -> EndpointLoad {
    EndpointLoad {
        cluster: "pay".to_owned(),
        address: addr(address),
        requests,
        errors,
        interval: WINDOW,
    }
}

fn declared(node: &str) -> LrsReporter {
    LrsReporter::Declared(node.to_owned())
}

fn workload(instance: &str) -> LrsReporter {
    let uri = format!("spiffe://mesh.test/region/eu/service/cart/instance/{instance}");
    LrsReporter::Verified(Identity::parse(&uri).unwrap())
}

fn report(reporter: LrsReporter, node_id: &str, loads: Vec<EndpointLoad>) -> LoadReport {
    LoadReport {
        reporter,
        node_id: node_id.to_owned(),
        zone: "a".to_owned(),
        loads,
    }
}

fn capped(cap: u64, now: Instant) -> LoadAggregator {
    LoadAggregator::new(
        AggregatorConfig {
            flush_interval: WINDOW,
            reporter_endpoint_requests_max: NonZeroU64::new(cap).unwrap(),
            ..AggregatorConfig::default()
        },
        now,
    )
}

/// (requests, errors) per address.
fn totals(flush: &Flush) -> BTreeMap<SocketAddr, (u64, u64)> {
    flush
        .totals
        .iter()
        .map(|t| (t.address, (t.requests, t.errors)))
        .collect()
}

#[test]
fn a_flooding_reporter_counts_up_to_its_cap_while_an_honest_one_is_summed_exactly() {
    // Goal: 10⁹ claimed errors count as the cap's worth; the honest sidecar's three loads
    // on the same endpoint are summed to the request, and the excess is counted by reason.
    let t0 = t0();
    let mut agg = capped(CAP, t0);
    let mut dropped = DroppedRequests::default();
    for _ in 0..3 {
        let h = agg.handle_report(
            t0,
            &report(declared("honest"), "honest", vec![load(1, 300, 3)]),
        );
        assert_eq!(
            (h.folded, h.capped, h.dropped),
            (1, 0, DroppedRequests::default())
        );
    }
    let flood = report(
        declared("flood"),
        "flood",
        vec![load(1, 1_000_000_000, 1_000_000_000)],
    );
    let h = agg.handle_report(t0, &flood);
    assert_eq!((h.folded, h.capped), (1, 1));
    dropped.reporter_cap += h.dropped.reporter_cap;
    // Once at its cap, more from the flooder adds nothing.
    let h = agg.handle_report(t0, &flood);
    assert_eq!((h.folded, h.capped), (1, 1));
    dropped.reporter_cap += h.dropped.reporter_cap;

    assert_eq!(
        totals(&agg.flush(t0 + WINDOW))[&addr(1)],
        (900 + CAP, 9 + CAP)
    );
    assert_eq!(dropped.reporter_cap, 2 * 1_000_000_000 - CAP);
    assert_eq!(dropped.get(DropReason::ReporterCap), dropped.reporter_cap);
}

#[test]
fn one_sidecar_claiming_a_billion_errors_does_not_flip_the_hosts_passive_vote() {
    // Goal: with the default cap, four honest sidecars at 1 % errors outvote a liar
    // claiming 10⁹ errors: the host's sample stays under the evaluator's failing rate,
    // where uncapped it would read as all errors.
    assert_eq!(
        REPORTER_ENDPOINT_REQUESTS_MAX.get(),
        REPORTER_ENDPOINT_RATE_MAX * PASSIVE_INTERVAL.as_secs()
    );
    let t0 = t0();
    let mut agg = LoadAggregator::new(
        AggregatorConfig {
            flush_interval: PASSIVE_INTERVAL,
            reporter_endpoint_requests_max: REPORTER_ENDPOINT_REQUESTS_MAX,
            ..AggregatorConfig::default()
        },
        t0,
    );
    for sidecar in ["a", "b", "c", "d"] {
        agg.handle_report(
            t0,
            &report(workload(sidecar), sidecar, vec![load(1, 900, 9)]),
        );
    }
    let liar = report(
        workload("liar"),
        "liar",
        vec![load(1, 1_000_000_000, 1_000_000_000)],
    );
    agg.handle_report(t0, &liar);
    let (requests, errors) = totals(&agg.flush(t0 + PASSIVE_INTERVAL))[&addr(1)];
    assert_eq!((requests, errors), (3_600 + 1_000, 36 + 1_000));
    assert!(Permille::ratio(errors, requests) < PASSIVE_ERROR_PERMILLE);
    let uncapped = Permille::ratio(36 + 1_000_000_000, 3_600 + 1_000_000_000);
    assert!(
        uncapped >= PASSIVE_ERROR_PERMILLE,
        "the cap is what keeps the vote"
    );
}

#[test]
fn a_capped_load_keeps_its_error_ratio() {
    // Goal: the cap cuts weight, never what a reporter says: a quarter of errors stays a
    // quarter, all errors stay all, none stay none.
    let t0 = t0();
    let mut agg = capped(100, t0);
    let cases = [
        (1, 1_000, 250, (100, 25)),
        (2, 1_000, 1_000, (100, 100)),
        (3, 1_000, 0, (100, 0)),
    ];
    for (address, requests, errors, _) in cases {
        agg.handle_report(
            t0,
            &report(declared("a"), "a", vec![load(address, requests, errors)]),
        );
    }
    let flushed = totals(&agg.flush(t0 + WINDOW));
    for (address, _, _, expected) in cases {
        assert_eq!(flushed[&addr(address)], expected);
    }
}

#[test]
fn the_cap_is_per_reporter_and_endpoint_and_fresh_in_every_window() {
    // Goal: a reporter at its cap on one endpoint still counts on another, another
    // reporter still counts on the same one, and the next window starts from zero.
    let t0 = t0();
    let mut agg = capped(10, t0);
    let r = |who: &str, address: u8, requests: u64| {
        report(declared(who), who, vec![load(address, requests, 0)])
    };
    agg.handle_report(t0, &r("a", 1, 50));
    agg.handle_report(t0, &r("a", 2, 5));
    agg.handle_report(t0, &r("b", 1, 7));
    let first = totals(&agg.flush(t0 + WINDOW));
    assert_eq!((first[&addr(1)], first[&addr(2)]), ((17, 0), (5, 0)));
    agg.handle_report(t0 + WINDOW, &r("a", 1, 50));
    assert_eq!(totals(&agg.flush(t0 + 2 * WINDOW))[&addr(1)], (10, 0));
}

#[test]
fn a_verified_identity_is_one_reporter_whatever_node_ids_its_streams_declare() {
    // Goal: opening more streams under new node ids buys a certificate holder no more
    // weight; a declared node id is a reporter of its own, apart from any identity.
    let t0 = t0();
    let mut agg = capped(10, t0);
    for node_id in ["n-1", "n-2", "n-3"] {
        agg.handle_report(t0, &report(workload("i1"), node_id, vec![load(1, 10, 10)]));
    }
    agg.handle_report(t0, &report(declared("i1"), "i1", vec![load(1, 4, 0)]));
    let flush = agg.flush(t0 + WINDOW);
    assert_eq!(flush.reporters, 2);
    assert_eq!(totals(&flush)[&addr(1)], (14, 10));
}

#[test]
fn pairs_beyond_the_maximum_are_dropped_whole_and_counted() {
    // Goal: a (reporter, endpoint) pair the window cannot track could not be capped, so
    // its load is not counted at all; pairs already tracked still are.
    let t0 = t0();
    let mut agg = LoadAggregator::new(
        AggregatorConfig {
            reporter_endpoints_max: NonZeroUsize::MIN,
            ..AggregatorConfig::default()
        },
        t0,
    );
    agg.handle_report(t0, &report(declared("a"), "a", vec![load(1, 3, 0)]));
    let h = agg.handle_report(
        t0,
        &report(declared("a"), "a", vec![load(2, 5, 0), load(1, 2, 1)]),
    );
    assert_eq!(
        (h.folded, h.untracked, h.dropped.reporter_endpoints_full),
        (1, 1, 5)
    );
    let flushed = totals(&agg.flush(t0 + WINDOW));
    assert_eq!(flushed.into_iter().collect::<Vec<_>>(), [(addr(1), (5, 1))]);
}

#[test]
fn the_cap_scales_with_the_window_and_is_never_zero() {
    assert_eq!(reporter_requests_for(Duration::from_secs(1)).get(), 1_000);
    assert_eq!(reporter_requests_for(Duration::from_millis(100)).get(), 100);
    assert_eq!(reporter_requests_for(Duration::from_secs(10)).get(), 10_000);
    assert_eq!(reporter_requests_for(Duration::from_micros(1)).get(), 1);
    assert_eq!(reporter_requests_for(Duration::ZERO).get(), 1);
    assert_eq!(reporter_requests_for(Duration::MAX).get(), u64::MAX);
    assert_eq!(
        AggregatorConfig::default().reporter_endpoint_requests_max,
        reporter_requests_for(AggregatorConfig::default().flush_interval)
    );
}

#[derive(Debug, Clone)]
enum Op {
    Report {
        reporter: u8,
        loads: Vec<(u8, u16, u16)>,
    },
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    let entry = (0u8..4, 0u16..700, 0u16..700);
    prop_oneof![
        4 => (0u8..4, proptest::collection::vec(entry, 0..5))
            .prop_map(|(reporter, loads)| Op::Report { reporter, loads }),
        1 => Just(Op::Flush),
    ]
}

/// What one window was told, per (reporter, address): requests and errors reported.
type Told = BTreeMap<(u8, SocketAddr), (u64, u64)>;

/// Checks one flush against what its window was told, under `cap`.
fn check_window(flush: &Flush, told: &Told, cap: u64) -> Result<(), TestCaseError> {
    let mut expected: BTreeMap<SocketAddr, (u64, u64, u64)> = BTreeMap::new();
    for (&(_, address), &(requests, errors)) in told {
        // requests counted; errors exact if the pair stayed under the cap; errors at most.
        let e = expected.entry(address).or_default();
        let counted = requests.min(cap);
        e.0 += counted;
        if requests <= cap {
            e.1 += errors;
            e.2 += errors;
        } else {
            e.2 += counted;
        }
    }
    expected.retain(|_, e| e.0 > 0);
    let got = totals(flush);
    prop_assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (address, (requests, errors)) in got {
        let (want, errors_min, errors_max) = expected[&address];
        prop_assert_eq!(requests, want, "requests at {}", address);
        prop_assert!(errors >= errors_min && errors <= errors_max && errors <= requests);
    }
    Ok(())
}

proptest! {
    #[test]
    fn a_reporters_requests_count_as_the_lesser_of_what_it_reported_and_its_cap(
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        // Goal: per window, every (reporter, address) counts min(reported, cap) requests,
        // exactly its errors below the cap and never more errors than it kept above it;
        // every request dropped is counted under `reporter_cap`; every load is accounted.
        let t0 = t0();
        let mut now = t0;
        let mut agg = capped(CAP, t0);
        let mut told = Told::new();
        let (mut reported, mut dropped) = (0u64, 0u64);
        let mut counted = 0u64;
        for op in ops {
            match op {
                Op::Report { reporter, loads } => {
                    let loads: Vec<_> = loads
                        .iter()
                        .map(|&(a, ok, err)| {
                            let (ok, err) = (u64::from(ok), u64::from(err));
                            load(a, ok + err, err)
                        })
                        .collect();
                    for l in &loads {
                        let t = told.entry((reporter, l.address)).or_default();
                        t.0 += l.requests;
                        t.1 += l.errors;
                        reported += l.requests;
                    }
                    let who = if reporter % 2 == 0 {
                        workload(&format!("i{reporter}"))
                    } else {
                        declared(&format!("n{reporter}"))
                    };
                    let h = agg.handle_report(now, &report(who, "any", loads.clone()));
                    prop_assert_eq!(h.folded + h.idle + h.overflow + h.untracked, loads.len());
                    prop_assert_eq!((h.overflow, h.untracked), (0, 0));
                    prop_assert!(h.capped <= h.folded);
                    prop_assert_eq!(h.dropped.reporters_full + h.dropped.reporter_endpoints_full, 0);
                    dropped += h.dropped.reporter_cap;
                }
                Op::Flush => {
                    now += WINDOW;
                    let flush = agg.flush(now);
                    check_window(&flush, &told, CAP)?;
                    counted += flush.totals.iter().map(|t| t.requests).sum::<u64>();
                    told.clear();
                }
            }
        }
        let flush = agg.flush(now + WINDOW);
        check_window(&flush, &told, CAP)?;
        counted += flush.totals.iter().map(|t| t.requests).sum::<u64>();
        prop_assert_eq!(counted + dropped, reported, "every request counted or dropped");
    }
}
