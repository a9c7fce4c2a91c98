//! Resolution latency under concurrent table swaps, against a bare hash lookup of the same
//! data measured the same way in the same run (a ratio, never an absolute timed test).
//!
//! Two phases of `duration / 2` each, with the same `threads` reader threads cycling over
//! the same 40 service names:
//!
//! 1. **resolve**: readers call [`Resolver::resolve`] while a writer thread swaps in a new
//!    table (rebuilt with a bumped version) `updates_per_sec` times a second;
//! 2. **bare**: readers call `HashMap<String, Arc<ServiceEndpoints>>::get` and clone the
//!    `Arc`, with no swap — the floor any in-process lookup pays.
//!
//! Clock: `Instant::now()` costs ~20–40 ns, as much as a lookup, so each sample times a batch
//! of [`BATCH`] calls and records `elapsed / BATCH` ns. Percentiles are therefore over
//! batch means: a single slow call inside a batch is diluted 64×, so `p999_ns` understates
//! the worst single call. The budget is checked on `resolve`'s p99 against [`LIMIT_NS`].

use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use waymark_core::view::EndpointStatus;

use crate::resolver::Resolver;
use crate::table::{Endpoint, Resolution, ServiceEndpoints, Table};

/// Calls per timed sample.
pub const BATCH: u32 = 64;
/// The budget: resolution p99 under 1 µs (DESIGN: p99 ≤ 1 ms, "aim far lower").
pub const LIMIT_NS: u64 = 1_000;
/// Services in the table (the prototype's 40).
pub const SERVICES: usize = 40;
/// Endpoints per service (40 × 50 = the prototype's 2,000 instances).
pub const ENDPOINTS_PER_SERVICE: usize = 50;
/// Histogram resolution: 1 ns buckets up to this, one overflow bucket above.
const HISTOGRAM_NS_MAX: usize = 100_000;

/// Latency percentiles of one phase, in nanoseconds per call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Calls made (samples × [`BATCH`]).
    pub calls: u64,
}

/// The result of [`run`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    /// Reader threads.
    pub threads: usize,
    /// Table swaps asked for per second.
    pub updates_per_sec: u64,
    /// Table swaps made during the resolve phase.
    pub swaps: u64,
    /// Total run time asked for (each phase gets half).
    pub duration_ms: u64,
    /// Services in the table.
    pub services: usize,
    /// `Resolver::resolve` under swaps.
    pub resolve: Percentiles,
    /// Bare `HashMap` lookup of the same data, no swaps.
    pub bare: Percentiles,
    /// `bare.p99_ns / resolve.p99_ns` (1.0 = no overhead; below 1 = resolve is slower).
    pub ratio: f64,
    /// The budget for `resolve.p99_ns`.
    pub limit_ns: u64,
    /// `resolve.p99_ns < limit_ns`.
    pub within_budget: bool,
    /// How latency was taken.
    pub method: &'static str,
}

/// Run the benchmark (see the module documentation). Blocks for about `duration`.
pub fn run(threads: usize, updates_per_sec: u64, duration: Duration) -> BenchReport {
    let threads = threads.max(1);
    let phase = duration / 2;
    let names: Arc<Vec<String>> = Arc::new((0..SERVICES).map(service_name).collect());

    let resolver = Arc::new(Resolver::from_table(table(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let writer = {
        let (resolver, stop, swaps) = (resolver.clone(), stop.clone(), swaps.clone());
        std::thread::spawn(move || swap_loop(&resolver, updates_per_sec, &stop, &swaps))
    };
    let resolve = measure(threads, phase, &names, {
        let resolver = resolver.clone();
        move |name: &str| matches!(resolver.resolve(name), Resolution::Endpoints(_))
    });
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the swap thread does not panic");

    let bare_map: Arc<HashMap<String, Arc<ServiceEndpoints>>> = Arc::new(
        table(0)
            .services()
            .into_iter()
            .map(|(e, _)| (e.service.clone(), e))
            .collect(),
    );
    let bare = measure(threads, phase, &names, move |name: &str| {
        bare_map.get(name).cloned().is_some()
    });

    let ratio = bare.p99_ns as f64 / resolve.p99_ns.max(1) as f64;
    BenchReport {
        threads,
        updates_per_sec,
        swaps: swaps.load(Ordering::Relaxed),
        duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
        services: SERVICES,
        resolve,
        bare,
        ratio,
        limit_ns: LIMIT_NS,
        within_budget: resolve.p99_ns < LIMIT_NS,
        method: "Instant around batches of 64 calls; each sample is the batch mean in ns",
    }
}

/// Swap a freshly built table in `rate` times a second until `stop`.
#[allow(clippy::disallowed_methods)] // its own OS thread, paced by the real clock: no runtime here
fn swap_loop(resolver: &Resolver, rate: u64, stop: &AtomicBool, swaps: &AtomicU64) {
    if rate == 0 {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        return;
    }
    let interval = Duration::from_secs(1) / u32::try_from(rate).unwrap_or(u32::MAX);
    let mut next = Instant::now();
    let mut version = 0u64;
    while !stop.load(Ordering::Relaxed) {
        version += 1;
        let fresh = table(version);
        resolver.replace_table(fresh);
        swaps.fetch_add(1, Ordering::Relaxed);
        next += interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now; // behind: do not burst to catch up
        }
    }
}

/// Run `threads` readers for `phase` calling `call` in batches; merge their histograms.
fn measure<F>(threads: usize, phase: Duration, names: &Arc<Vec<String>>, call: F) -> Percentiles
where
    F: Fn(&str) -> bool + Send + Sync + Clone + 'static,
{
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (names, call) = (names.clone(), call.clone());
            std::thread::spawn(move || reader(t, phase, &names, &call))
        })
        .collect();
    let mut total = vec![0u64; HISTOGRAM_NS_MAX + 1];
    for h in handles {
        let hist = h.join().expect("reader threads do not panic");
        for (t, c) in total.iter_mut().zip(hist) {
            *t += c;
        }
    }
    percentiles(&total)
}

#[allow(clippy::disallowed_methods)] // times nanosecond lookups in a busy loop: std's clock is the measure
fn reader(
    offset: usize,
    phase: Duration,
    names: &[String],
    call: &impl Fn(&str) -> bool,
) -> Vec<u64> {
    let mut hist = vec![0u64; HISTOGRAM_NS_MAX + 1];
    let mut i = offset * 7;
    let end = Instant::now() + phase;
    while Instant::now() < end {
        let start = Instant::now();
        for _ in 0..BATCH {
            i = (i + 1) % names.len();
            black_box(call(black_box(names[i].as_str())));
        }
        let per_call = start.elapsed().as_nanos() / u128::from(BATCH);
        let bucket = usize::try_from(per_call)
            .unwrap_or(usize::MAX)
            .min(HISTOGRAM_NS_MAX);
        hist[bucket] += 1;
    }
    hist
}

fn percentiles(hist: &[u64]) -> Percentiles {
    let samples: u64 = hist.iter().sum();
    let at = |q: f64| -> u64 {
        let rank = ((samples as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (ns, count) in hist.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return ns as u64;
            }
        }
        HISTOGRAM_NS_MAX as u64
    };
    if samples == 0 {
        return Percentiles::default();
    }
    Percentiles {
        p50_ns: at(0.50),
        p99_ns: at(0.99),
        p999_ns: at(0.999),
        calls: samples * u64::from(BATCH),
    }
}

fn service_name(i: usize) -> String {
    format!("service-{i:02}")
}

/// The prototype's table: 40 services of 50 endpoints over three zones, at `version`.
fn table(version: u64) -> Table {
    Table::from_services((0..SERVICES).map(|s| {
        let endpoints = (0..ENDPOINTS_PER_SERVICE)
            .map(|e| Endpoint {
                address: IpAddr::V4(Ipv4Addr::new(10, s as u8, (e / 250) as u8, (e % 250) as u8)),
                port: 8080,
                weight: 100,
                region: "eu".into(),
                zone: ["a", "b", "c"][e % 3].into(),
                priority: u32::from(e % 3 != 0),
                status: EndpointStatus::Eligible,
                health_disregarded: false,
                instance: Some(format!("{}-{e}", service_name(s))),
                capability: None,
            })
            .collect();
        let svc = ServiceEndpoints {
            service: service_name(s),
            version: version.to_string(),
            endpoints,
            withheld: 0,
            health_disregarded: false,
        };
        (svc, version)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_a_tiny_run_reports_both_phases() {
        // Goal: a short run fills both phases, swaps tables, and reports consistent figures.
        let report = run(2, 200, Duration::from_millis(200));
        eprintln!("{}", serde_json::to_string_pretty(&report).unwrap());
        assert!(report.resolve.calls > 0 && report.bare.calls > 0);
        assert!(report.swaps > 0, "the writer swapped tables");
        assert!(report.resolve.p50_ns <= report.resolve.p99_ns);
        assert!(report.resolve.p99_ns <= report.resolve.p999_ns);
        assert_eq!(report.limit_ns, LIMIT_NS);
        assert_eq!(report.within_budget, report.resolve.p99_ns < LIMIT_NS);
        assert!(report.ratio > 0.0);
    }

    #[test]
    fn percentiles_read_the_histogram_by_rank() {
        // Goal: p50/p99/p999 land on the right buckets of a known distribution.
        let mut hist = vec![0u64; HISTOGRAM_NS_MAX + 1];
        hist[10] = 989;
        hist[50] = 10;
        hist[900] = 1;
        let p = percentiles(&hist);
        assert_eq!((p.p50_ns, p.p99_ns, p.p999_ns), (10, 50, 50));
        assert_eq!(p.calls, 1000 * u64::from(BATCH));
    }
}
