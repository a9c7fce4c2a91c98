//! The LRS forwarder's pure parts (aggregation, attribution) and its driver under paused time.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant as StdInstant;

use proptest::prelude::*;
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, InstanceId, Observation, RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::{
    EndpointStatus, Markers, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey,
};
use waymark_xds::lrs::{AddressBook, EndpointLoad, LrsReporter};
use waymark_xds::translate::load_assignment;

use super::*;

const SEC: Duration = Duration::from_secs(1);
const FLUSH: Duration = Duration::from_secs(10);

/// One real instant to offset from; the pure parts under test read no clock.
#[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
fn t0() -> StdInstant {
    StdInstant::now()
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn id(s: &str) -> InstanceId {
    InstanceId::try_new(s).unwrap()
}

fn load(address: &str, requests: u64, errors: u64) -> EndpointLoad {
    EndpointLoad {
        cluster: "pay".to_owned(),
        address: addr(address),
        requests,
        errors,
        interval: SEC,
    }
}

fn report(node: &str, loads: Vec<EndpointLoad>) -> LoadReport {
    LoadReport {
        reporter: LrsReporter::Declared(node.to_owned()),
        node_id: node.to_owned(),
        zone: "a".to_owned(),
        loads,
    }
}

fn aggregator(now: StdInstant) -> LoadAggregator {
    LoadAggregator::new(
        AggregatorConfig {
            flush_interval: FLUSH,
            ..AggregatorConfig::default()
        },
        now,
    )
}

/// (address, requests, errors, loads) per total, for compact assertions.
fn totals(flush: &Flush) -> Vec<(String, u64, u64, u64)> {
    flush
        .totals
        .iter()
        .map(|t| (t.address.to_string(), t.requests, t.errors, t.loads))
        .collect()
}

fn passive(instance: &str, requests: u64, errors: u64) -> WireSample {
    WireSample {
        instance: id(instance),
        observation: Observation::Passive { requests, errors },
    }
}

fn endpoint(instance: &str, address: &str) -> ViewEndpoint {
    let address = addr(address);
    ViewEndpoint {
        instance: id(instance),
        address: Address {
            ip: address.ip(),
            port: address.port(),
        },
        region: RegionName::try_new("eu").unwrap(),
        zone: ZoneName::try_new("a").unwrap(),
        tier: Tier::Local,
        priority: 0,
        weight: Weight::new(100),
        status: EndpointStatus::Eligible,
        verdict: Verdict::Eligible,
        tags: Arc::default(),
        metadata: Arc::default(),
        capability: None,
    }
}

fn assignment(service: &str, eps: &[(&str, &str)]) -> ClusterLoadAssignment {
    let endpoints = eps
        .iter()
        .map(|(instance, address)| (id(instance), endpoint(instance, address)))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into();
    load_assignment(&ReleasedView {
        version: Version(1),
        view: View {
            key: ViewKey {
                service: ServiceName::try_new(service).unwrap(),
                zone: ZoneName::try_new("a").unwrap(),
            },
            endpoints,
            markers: Markers::default(),
        },
    })
}

fn book(entries: &[(&str, &str)]) -> AddressBook {
    let mut book = AddressBook::new();
    for (address, instance) in entries {
        book.insert(addr(address), &id(instance));
    }
    book
}

fn flush_of(entries: &[(&str, u64, u64)]) -> Flush {
    Flush {
        totals: entries
            .iter()
            .map(|(address, requests, errors)| EndpointTotal {
                address: addr(address),
                requests: *requests,
                errors: *errors,
                loads: 1,
            })
            .collect(),
        ..Flush::default()
    }
}

// === aggregation ===

#[test]
fn loads_for_one_address_are_summed_across_reports_and_reporters() {
    // Goal: totals are exact sums per address, whichever Envoy reported them.
    let t0 = t0();
    let mut agg = aggregator(t0);
    let a = agg.handle_report(
        t0,
        &report(
            "envoy-a",
            vec![load("10.0.0.1:80", 100, 10), load("10.0.0.2:80", 5, 0)],
        ),
    );
    let b = agg.handle_report(
        t0 + SEC,
        &report("envoy-b", vec![load("10.0.0.1:80", 40, 2)]),
    );
    let c = agg.handle_report(
        t0 + SEC,
        &report("envoy-a", vec![load("10.0.0.1:80", 1, 1)]),
    );
    assert_eq!(
        (a.folded, b.folded, c.folded, a.idle + a.overflow),
        (2, 1, 1, 0)
    );
    let flush = agg.flush(t0 + FLUSH);
    assert_eq!(
        totals(&flush),
        [
            ("10.0.0.1:80".to_owned(), 141, 13, 3),
            ("10.0.0.2:80".to_owned(), 5, 0, 1),
        ]
    );
    assert_eq!(
        (flush.reports, flush.reporters, flush.window),
        (3, 2, FLUSH)
    );
}

#[test]
fn a_load_without_requests_is_dropped_and_an_empty_window_flushes_nothing() {
    // Goal: zero requests is no evidence; it must not appear as a (clean) total.
    let t0 = t0();
    let mut agg = aggregator(t0);
    let handled = agg.handle_report(t0, &report("envoy-a", vec![load("10.0.0.1:80", 0, 0)]));
    assert_eq!(
        handled,
        Handled {
            idle: 1,
            ..Handled::default()
        }
    );
    assert!(agg.is_empty());
    let flush = agg.flush(t0 + FLUSH);
    assert!(flush.totals.is_empty());
    assert_eq!(
        flush.reports, 1,
        "the report itself still counts as received"
    );
}

#[test]
fn a_flush_empties_the_window_so_nothing_is_counted_twice() {
    let t0 = t0();
    let mut agg = aggregator(t0);
    agg.handle_report(t0, &report("envoy-a", vec![load("10.0.0.1:80", 7, 1)]));
    assert_eq!(agg.flush(t0 + FLUSH).totals.len(), 1);
    let second = agg.flush(t0 + 2 * FLUSH);
    assert_eq!(
        second,
        Flush {
            window: FLUSH,
            ..Flush::default()
        }
    );
}

#[test]
fn the_next_flush_is_due_one_interval_after_the_previous_one() {
    let t0 = t0();
    let mut agg = aggregator(t0);
    assert_eq!(agg.poll_timeout(), t0 + FLUSH);
    // An early flush (the driver may flush on its own schedule) restarts the window.
    let flush = agg.flush(t0 + 3 * SEC);
    assert_eq!(flush.window, 3 * SEC);
    assert_eq!(agg.poll_timeout(), t0 + 3 * SEC + FLUSH);
}

#[test]
fn a_zero_flush_interval_is_raised_to_the_minimum() {
    let t0 = t0();
    let agg = LoadAggregator::new(
        AggregatorConfig {
            flush_interval: Duration::ZERO,
            ..AggregatorConfig::default()
        },
        t0,
    );
    assert_eq!(agg.config().flush_interval, FLUSH_INTERVAL_MIN);
    assert_eq!(agg.poll_timeout(), t0 + FLUSH_INTERVAL_MIN);
}

#[test]
fn addresses_beyond_the_maximum_are_dropped_while_held_ones_still_add_up() {
    let t0 = t0();
    let mut agg = LoadAggregator::new(
        AggregatorConfig {
            endpoints_max: NonZeroUsize::new(1).unwrap(),
            ..AggregatorConfig::default()
        },
        t0,
    );
    agg.handle_report(t0, &report("envoy-a", vec![load("10.0.0.1:80", 1, 0)]));
    let handled = agg.handle_report(
        t0,
        &report(
            "envoy-a",
            vec![load("10.0.0.2:80", 5, 0), load("10.0.0.1:80", 2, 1)],
        ),
    );
    assert_eq!((handled.folded, handled.overflow), (1, 1));
    assert_eq!(
        totals(&agg.flush(t0 + FLUSH)),
        [("10.0.0.1:80".to_owned(), 3, 1, 2)]
    );
}

#[test]
fn absurd_counts_saturate_instead_of_wrapping() {
    // Goal: hostile or buggy counts never panic, wrap, or yield errors above requests,
    // even with no cap to stop them first.
    let t0 = t0();
    let mut agg = LoadAggregator::new(
        AggregatorConfig {
            flush_interval: FLUSH,
            reporter_endpoint_requests_max: NonZeroU64::MAX,
            ..AggregatorConfig::default()
        },
        t0,
    );
    let huge = load("10.0.0.1:80", u64::MAX, u64::MAX);
    agg.handle_report(t0, &report("envoy-a", vec![huge.clone(), huge]));
    let mut inverted = load("10.0.0.1:80", 1, 0);
    inverted.errors = 5; // impossible by construction in xds-edge, but the fields are public
    agg.handle_report(t0, &report("envoy-a", vec![inverted]));
    let flush = agg.flush(t0 + FLUSH);
    assert_eq!(flush.totals[0].requests, u64::MAX);
    assert!(flush.totals[0].errors <= flush.totals[0].requests);
}

#[test]
fn reporters_are_counted_once_each_per_window_up_to_the_cap() {
    // Goal: reporters beyond `reporters_max` are not tracked, so they could not be capped:
    // their loads are dropped and counted, not summed uncapped.
    let t0 = t0();
    let mut agg = LoadAggregator::new(
        AggregatorConfig {
            reporters_max: NonZeroUsize::new(2).unwrap(),
            ..AggregatorConfig::default()
        },
        t0,
    );
    let mut untracked = DroppedRequests::default();
    for node in ["envoy-a", "envoy-a", "envoy-b", "envoy-c"] {
        let handled = agg.handle_report(t0, &report(node, vec![load("10.0.0.1:80", 1, 0)]));
        untracked.reporters_full += handled.dropped.reporters_full;
    }
    let flush = agg.flush(t0 + FLUSH);
    assert_eq!((flush.reporters, flush.totals[0].requests), (2, 3));
    assert_eq!(untracked.reporters_full, 1);
    assert_eq!(agg.flush(t0 + 2 * FLUSH).reporters, 0);
}

#[derive(Debug, Clone)]
enum Op {
    Report {
        node: u8,
        loads: Vec<(u8, u32, u32)>,
    },
    Flush {
        after_ms: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let entry = (0u8..6, 0u32..1_000, 0u32..1_000);
    prop_oneof![
        3 => (0u8..4, proptest::collection::vec(entry, 0..6))
            .prop_map(|(node, loads)| Op::Report { node, loads }),
        1 => (0u16..20_000).prop_map(|after_ms| Op::Flush { after_ms }),
    ]
}

fn op_load(address: u8, ok: u32, err: u32) -> EndpointLoad {
    // requests = ok + err, as xds-edge computes them.
    load(
        &format!("10.0.0.{address}:80"),
        u64::from(ok) + u64::from(err),
        u64::from(err),
    )
}

proptest! {
    #[test]
    fn every_request_reported_is_flushed_exactly_once(
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        // Goal: over any sequence, the flushed totals per address equal the reported sums,
        // every total is a real one (requests > 0, errors <= requests), each address once
        // per flush, and every load lands in exactly one `Handled` count.
        // Uncapped, so sums are exact whatever the counts; the cap has its own property.
        let t0 = t0();
        let mut now = t0;
        let mut agg = LoadAggregator::new(
            AggregatorConfig {
                flush_interval: FLUSH,
                reporter_endpoint_requests_max: NonZeroU64::MAX,
                ..AggregatorConfig::default()
            },
            t0,
        );
        let mut reported: BTreeMap<SocketAddr, (u64, u64)> = BTreeMap::new();
        let mut flushed: BTreeMap<SocketAddr, (u64, u64)> = BTreeMap::new();
        let check = |flush: Flush, flushed: &mut BTreeMap<SocketAddr, (u64, u64)>| {
            let addresses: Vec<_> = flush.totals.iter().map(|t| t.address).collect();
            let mut sorted = addresses.clone();
            sorted.sort();
            sorted.dedup();
            prop_assert_eq!(addresses, sorted);
            for t in flush.totals {
                prop_assert!(t.requests > 0 && t.errors <= t.requests && t.loads > 0);
                let sum = flushed.entry(t.address).or_default();
                sum.0 += t.requests;
                sum.1 += t.errors;
            }
            Ok(())
        };
        for op in ops {
            match op {
                Op::Report { node, loads } => {
                    let loads: Vec<_> = loads.iter().map(|&(a, ok, err)| op_load(a, ok, err)).collect();
                    for l in loads.iter().filter(|l| l.requests > 0) {
                        let sum = reported.entry(l.address).or_default();
                        sum.0 += l.requests;
                        sum.1 += l.errors;
                    }
                    let handled = agg.handle_report(now, &report(&format!("envoy-{node}"), loads.clone()));
                    prop_assert_eq!(handled.folded + handled.idle + handled.overflow + handled.untracked, loads.len());
                    prop_assert_eq!((handled.overflow, handled.untracked, handled.capped), (0, 0, 0));
                }
                Op::Flush { after_ms } => {
                    now += Duration::from_millis(u64::from(after_ms));
                    check(agg.flush(now), &mut flushed)?;
                }
            }
        }
        check(agg.flush(now), &mut flushed)?;
        prop_assert_eq!(reported, flushed);
    }

    #[test]
    fn attribution_keeps_every_mapped_request_and_counts_every_unmapped_load(
        totals in proptest::collection::btree_map(0u8..8, (1u64..1_000, 0u64..1_000, 1u64..5), 0..8),
        owners in proptest::collection::vec(0u8..4, 8),
    ) {
        // Goal: samples sum exactly the totals whose address maps; one sample per instance;
        // the rest is counted as unmapped, never attributed.
        let book = {
            let mut b = AddressBook::new();
            // Addresses 0..6 belong to instances by `owners`; 6 and 7 are unknown.
            for (a, owner) in owners.iter().enumerate().take(6) {
                b.insert(addr(&format!("10.0.0.{a}:80")), &id(&format!("pay-{owner}")));
            }
            b
        };
        let flush = Flush {
            totals: totals
                .iter()
                .map(|(&a, &(requests, errors, loads))| EndpointTotal {
                    address: addr(&format!("10.0.0.{a}:80")),
                    requests,
                    errors: errors.min(requests),
                    loads,
                })
                .collect(),
            ..Flush::default()
        };
        let out = attribute(&book, &flush);
        let mut expected: BTreeMap<InstanceId, (u64, u64)> = BTreeMap::new();
        let mut unmapped = 0;
        for t in &flush.totals {
            match book.instance(&t.address) {
                Some(i) => {
                    let e = expected.entry(i.clone()).or_default();
                    e.0 += t.requests;
                    e.1 += t.errors;
                }
                None => unmapped += t.loads,
            }
        }
        let got: BTreeMap<InstanceId, (u64, u64)> = out
            .samples
            .iter()
            .map(|s| match s.observation {
                Observation::Passive { requests, errors } => (s.instance.clone(), (requests, errors)),
                _ => unreachable!("only passive samples are produced"),
            })
            .collect();
        prop_assert_eq!(got.len(), out.samples.len(), "one sample per instance");
        prop_assert_eq!(got, expected);
        prop_assert_eq!(out.unmapped_loads, unmapped);
    }
}

// === attribution ===

#[test]
fn assignments_map_each_address_to_the_instance_in_its_metadata() {
    // Goal: the book reads back exactly what translate wrote, across services.
    let pay = assignment(
        "pay",
        &[("pay-1", "127.0.0.1:8001"), ("pay-2", "127.0.0.2:8002")],
    );
    let cart = assignment("cart", &[("cart-1", "[::1]:9000")]);
    let book = addresses_from_assignments([&pay, &cart]);
    assert_eq!(book.len(), 3);
    assert_eq!(book.instance(&addr("127.0.0.1:8001")), Some(&id("pay-1")));
    assert_eq!(book.instance(&addr("127.0.0.2:8002")), Some(&id("pay-2")));
    assert_eq!(book.instance(&addr("[::1]:9000")), Some(&id("cart-1")));
    assert_eq!(book.instance(&addr("127.0.0.1:8002")), None);
}

#[test]
fn an_endpoint_without_a_valid_instance_in_its_metadata_is_left_out() {
    let mut pay = assignment(
        "pay",
        &[("pay-1", "127.0.0.1:8001"), ("pay-2", "127.0.0.2:8002")],
    );
    let lb = &mut pay.endpoints[0].lb_endpoints;
    lb[0].metadata = None;
    let fields = &mut lb[1]
        .metadata
        .as_mut()
        .unwrap()
        .filter_metadata
        .get_mut("waymark")
        .unwrap()
        .fields;
    fields.get_mut("instance").unwrap().kind = Some(
        envoy_types::pb::google::protobuf::value::Kind::StringValue("no spaces allowed".into()),
    );
    let (book, skipped) = book_of([&pay]);
    assert_eq!((book.len(), skipped), (0, 2));
}

#[test]
fn an_address_two_instances_claim_maps_to_neither() {
    let pay = assignment("pay", &[("pay-1", "127.0.0.1:8001")]);
    let cart = assignment("cart", &[("cart-1", "127.0.0.1:8001")]);
    let book = addresses_from_assignments([&pay, &cart]);
    assert_eq!(book.len(), 1);
    assert_eq!(book.instance(&addr("127.0.0.1:8001")), None);
    let out = attribute(&book, &flush_of(&[("127.0.0.1:8001", 10, 0)]));
    assert!(out.samples.is_empty());
    assert_eq!((out.unmapped_loads, out.unmapped_addresses), (1, 1));
}

#[test]
fn two_addresses_of_one_instance_make_one_sample() {
    let book = book(&[("10.0.0.1:80", "pay-1"), ("10.0.0.1:81", "pay-1")]);
    let out = attribute(
        &book,
        &flush_of(&[("10.0.0.1:80", 10, 1), ("10.0.0.1:81", 5, 5)]),
    );
    assert_eq!(out.samples, [passive("pay-1", 15, 6)]);
}

#[test]
fn a_reused_address_is_unmapped_until_the_old_instance_leaves_the_lookback() {
    // Goal: a report may cover time before the reassignment, so neither instance gets it
    // while either could be meant; afterwards the new one does.
    let mut books = WindowBook::new(NonZeroUsize::MIN);
    books.handle_book(book(&[("10.0.0.1:80", "pay-1")]));
    let flush = || flush_of(&[("10.0.0.1:80", 10, 0)]);
    assert_eq!(
        books.handle_flush(&flush()).samples,
        [passive("pay-1", 10, 0)]
    );
    books.handle_book(book(&[("10.0.0.1:80", "pay-9")]));
    // The window the book changed in, and the one after (its reports reach back into it).
    assert_eq!(books.handle_flush(&flush()).unmapped_loads, 1);
    assert_eq!(books.handle_flush(&flush()).unmapped_loads, 1);
    assert_eq!(
        books.handle_flush(&flush()).samples,
        [passive("pay-9", 10, 0)]
    );
    assert_eq!(
        books.current().instance(&addr("10.0.0.1:80")),
        Some(&id("pay-9"))
    );
}

#[test]
fn a_new_address_maps_at_once_and_a_removed_one_for_the_lookback() {
    let mut books = WindowBook::new(NonZeroUsize::MIN);
    books.handle_book(book(&[("10.0.0.1:80", "pay-1")]));
    books.handle_book(book(&[("10.0.0.2:80", "pay-2")]));
    let both = || flush_of(&[("10.0.0.1:80", 1, 0), ("10.0.0.2:80", 2, 0)]);
    let first = books.handle_flush(&both());
    assert_eq!(
        first.samples,
        [passive("pay-1", 1, 0), passive("pay-2", 2, 0)]
    );
    // pay-1's address was in force during the previous window: still attributable.
    assert_eq!(books.handle_flush(&both()).samples.len(), 2);
    let third = books.handle_flush(&both());
    assert_eq!(third.samples, [passive("pay-2", 2, 0)]);
    assert_eq!(third.unmapped_loads, 1);
}

#[test]
fn by_default_passive_evidence_arrives_before_the_evaluator_calls_it_silent() {
    // Envoy reports at the platform's passive interval and each window is forwarded as it
    // closes, so the oldest a forwarded outcome can be (one report interval plus one flush
    // window) stays inside the silence the evaluator allows the passive class. With a
    // slower cadence a grey failure's outcomes would be silent most of the time.
    use waymark_core::defaults::{PASSIVE_INTERVAL, SILENCE_FACTOR};
    let c = LrsForwardConfig::default().clamped();
    assert_eq!(c.report_interval, PASSIVE_INTERVAL);
    assert!(c.flush_interval <= PASSIVE_INTERVAL);
    assert!(c.report_interval + c.flush_interval < PASSIVE_INTERVAL * SILENCE_FACTOR);
}

#[test]
fn lookback_spans_one_reporting_interval() {
    let config = |flush_s: u64, report_s: u64| LrsForwardConfig {
        flush_interval: Duration::from_secs(flush_s),
        report_interval: Duration::from_secs(report_s),
        ..LrsForwardConfig::default()
    };
    assert_eq!(LrsForwardConfig::default().lookback().get(), 1);
    assert_eq!(config(10, 25).lookback().get(), 3);
    assert_eq!(config(30, 10).lookback().get(), 1);
    let extreme = LrsForwardConfig {
        flush_interval: Duration::ZERO,
        report_interval: Duration::MAX,
        ..LrsForwardConfig::default()
    };
    assert_eq!(extreme.lookback().get(), LOOKBACK_MAX);
    assert_eq!(
        (
            extreme.clamped().flush_interval,
            extreme.clamped().report_interval
        ),
        (FLUSH_INTERVAL_MIN, REPORT_INTERVAL_MAX)
    );
}

// === sending ===

fn samples(n: usize) -> Vec<WireSample> {
    (0..n).map(|i| passive(&format!("pay-{i}"), 1, 0)).collect()
}

#[test]
fn samples_go_out_in_batches_the_authority_accepts() {
    let (tx, mut rx) = mpsc::channel(4);
    let sent = send_batches(&tx, samples(BATCH_MAX + 3));
    assert_eq!(
        sent,
        Sent {
            forwarded: count(BATCH_MAX + 3),
            dropped: 0,
            closed: false
        }
    );
    assert_eq!(rx.try_recv().unwrap().len(), BATCH_MAX);
    assert_eq!(rx.try_recv().unwrap().len(), 3);
    assert!(rx.try_recv().is_err());
    assert_eq!(send_batches(&tx, Vec::new()), Sent::default());
    assert!(rx.try_recv().is_err(), "an empty flush sends nothing");
}

#[test]
fn a_full_session_drops_the_batch_and_a_closed_one_drops_the_rest() {
    let (tx, rx) = mpsc::channel(1);
    assert_eq!(send_batches(&tx, samples(2)).forwarded, 2);
    assert_eq!(
        send_batches(&tx, samples(3)),
        Sent {
            forwarded: 0,
            dropped: 3,
            closed: false
        }
    );
    drop(rx);
    assert_eq!(
        send_batches(&tx, samples(BATCH_MAX + 1)),
        Sent {
            forwarded: 0,
            dropped: count(BATCH_MAX + 1),
            closed: true
        }
    );
}

// === driver ===

struct Harness {
    reports: mpsc::Sender<LoadReport>,
    samples: mpsc::Receiver<Vec<WireSample>>,
    metrics: LrsForwardMetrics,
    driver: JoinHandle<()>,
}

fn harness(samples_capacity: usize) -> Harness {
    let config = LrsForwardConfig {
        flush_interval: FLUSH,
        report_interval: FLUSH,
        ..LrsForwardConfig::default()
    };
    let (reports, reports_rx) = mpsc::channel(8);
    let (samples_tx, samples) = mpsc::channel(samples_capacity);
    let mut books = WindowBook::new(config.lookback());
    books.handle_book(book(&[("10.0.0.1:80", "pay-1")]));
    let metrics = LrsForwardMetrics::default();
    let driver = LrsForwardDriver::new(
        &config,
        reports_rx,
        Arc::new(Mutex::new(books)),
        samples_tx,
        metrics.clone(),
    );
    Harness {
        reports,
        samples,
        metrics,
        driver: tokio::spawn(driver.run()),
    }
}

#[tokio::test(start_paused = true)]
async fn the_driver_forwards_each_window_once_at_its_flush_interval() {
    let start = Instant::now();
    let mut h = harness(4);
    let r = report(
        "envoy-a",
        vec![load("10.0.0.1:80", 10, 1), load("10.9.9.9:80", 3, 0)],
    );
    h.reports.send(r.clone()).await.unwrap();
    h.reports.send(r).await.unwrap();
    let batch = h.samples.recv().await.unwrap();
    assert_eq!(Instant::now() - start, FLUSH);
    assert_eq!(batch, [passive("pay-1", 20, 2)]);
    assert_eq!(h.metrics.samples_forwarded.get(), 1);
    assert_eq!(h.metrics.loads_unmapped.get(), 2);
    assert_eq!(h.metrics.reporters.get(), 1);

    h.reports
        .send(report("envoy-b", vec![load("10.0.0.1:80", 1, 0)]))
        .await
        .unwrap();
    let batch = h.samples.recv().await.unwrap();
    assert_eq!(Instant::now() - start, 2 * FLUSH);
    assert_eq!(
        batch,
        [passive("pay-1", 1, 0)],
        "the first window is not resent"
    );
}

#[tokio::test(start_paused = true)]
async fn the_driver_caps_a_flooding_reporter_sums_an_honest_one_and_counts_the_excess() {
    // Goal: through the driver, a sidecar claiming 10⁹ errors adds only its cap to the
    // instance's sample, the honest sidecar's reports are summed exactly, and the excess
    // shows in `waymark_lrs_requests_dropped_total{reason="reporter_cap"}`.
    let mut h = harness(4);
    let cap = LrsForwardConfig::default()
        .reporter_endpoint_requests_max
        .get();
    let flood = 1_000_000_000;
    for (ok, err) in [(40, 1), (2, 0)] {
        let honest = report("honest", vec![load("10.0.0.1:80", ok + err, err)]);
        h.reports.send(honest).await.unwrap();
    }
    let flooding = report("flood", vec![load("10.0.0.1:80", flood, flood)]);
    h.reports.send(flooding).await.unwrap();
    let batch = h.samples.recv().await.unwrap();
    assert_eq!(batch, [passive("pay-1", 43 + cap, 1 + cap)]);
    let dropped = |reason| h.metrics.requests_dropped(reason).get();
    assert_eq!(dropped(DropReason::ReporterCap), flood - cap);
    assert_eq!(dropped(DropReason::ReportersFull), 0);
    assert_eq!(h.metrics.reporters.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_driver_drops_a_window_the_session_cannot_take_and_stops_when_it_closes() {
    let start = Instant::now();
    let mut h = harness(1);
    let r = || report("envoy-a", vec![load("10.0.0.1:80", 1, 0)]);
    h.reports.send(r()).await.unwrap();
    // Stepping the paused clock past two flushes; the channel holds only the first.
    tokio::time::sleep_until(start + FLUSH + SEC).await;
    h.reports.send(r()).await.unwrap();
    tokio::time::sleep_until(start + 2 * FLUSH + SEC).await;
    assert_eq!(h.metrics.samples_forwarded.get(), 1);
    assert_eq!(h.metrics.samples_dropped.get(), 1);
    assert_eq!(h.samples.recv().await.unwrap(), [passive("pay-1", 1, 0)]);

    drop(h.samples);
    h.driver.await.unwrap();
}
