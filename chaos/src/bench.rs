//! Benchmarks of the pure core, each against a limit measured in the same run.
//!
//! - `evaluator`: a realistic sample stream (instances × 3 classes, a few per cent failing,
//!   simulated time advancing at one sample per class per instance per second) through the
//!   evaluator on one thread, against the same stream through a bare per-instance EWMA
//!   update — the least work any evaluator must do per sample.
//! - `assemble`: one eligibility change, then re-assembly of the affected service's views
//!   and their diffs, against a plain clone of the same views — the least work any
//!   copy-on-write publication must do per change.
//!
//! Times are read here, in the shell; the cores receive them as values.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use serde::Serialize;
use waymark_core::assembler::{AssemblerConfig, Effect as AsmEffect, ViewAssembler};
use waymark_core::contract::{CapabilityProfile, HealthContract, ValidContract};
use waymark_core::eligibility::{Eligibility, IneligibleReason};
use waymark_core::evaluator::{Admission, Evaluator, EvaluatorConfig};
use waymark_core::model::*;
use waymark_core::units::Weight;
use waymark_core::view::{View, ViewKey, diff};

use crate::rng::SplitMix64;

/// The reference estate's regional ingest the evaluator should sustain on one core.
pub const EVALUATOR_TARGET_SAMPLES_PER_SEC: f64 = 1_200_000.0;

/// Shape of a synthetic region.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Services.
    pub services: usize,
    /// Instances in total, spread evenly over services and zones.
    pub instances: usize,
    /// Zones.
    pub zones: usize,
    /// Seed for every random choice.
    pub seed: u64,
}

impl Default for Shape {
    /// The prototype scale: 40 services, 2,000 instances, 3 zones.
    fn default() -> Self {
        Self {
            services: 40,
            instances: 2_000,
            zones: 3,
            seed: 42,
        }
    }
}

/// The evaluator benchmark's figures.
#[derive(Debug, Clone, Serialize)]
pub struct EvaluatorReport {
    /// Always `"evaluator"`.
    pub bench: &'static str,
    /// Samples fed.
    pub samples: usize,
    /// Instances evaluated.
    pub instances: usize,
    /// Share of instances failing, in permille.
    pub failing_permille: u64,
    /// Samples the evaluator applied per second (one thread).
    pub samples_per_sec: f64,
    /// The same stream through a bare per-instance EWMA update.
    pub limit_samples_per_sec: f64,
    /// `samples_per_sec / limit_samples_per_sec`.
    pub ratio: f64,
    /// The target from the reference estate.
    pub target_samples_per_sec: f64,
    /// Whether `samples_per_sec` meets it.
    pub meets_target: bool,
    /// Transitions the stream produced (a sanity check that the work was real).
    pub transitions: u64,
    /// The seed.
    pub seed: u64,
}

/// The assembly benchmark's figures.
#[derive(Debug, Clone, Serialize)]
pub struct AssembleReport {
    /// Always `"assemble"`.
    pub bench: &'static str,
    /// Services.
    pub services: usize,
    /// Instances in total.
    pub instances: usize,
    /// Zones.
    pub zones: usize,
    /// Changes applied.
    pub changes: usize,
    /// Changes re-assembled and diffed per second.
    pub changes_per_sec: f64,
    /// Median time per change, microseconds.
    pub p50_us: f64,
    /// 99th percentile time per change, microseconds.
    pub p99_us: f64,
    /// The same number of plain clones of the affected views per second.
    pub limit_changes_per_sec: f64,
    /// `changes_per_sec / limit_changes_per_sec`.
    pub ratio: f64,
    /// Target views emitted (one per caller zone of the changed service).
    pub views_emitted: usize,
    /// The seed.
    pub seed: u64,
}

fn name<T: std::str::FromStr>(s: String) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().expect("generated names are valid")
}

/// The synthetic region's instances, in a fixed order.
pub fn instances(shape: Shape) -> Vec<Instance> {
    let region: RegionName = name("bench".into());
    (0..shape.instances)
        .map(|i| {
            let svc = i % shape.services;
            let zone = (i / shape.services) % shape.zones;
            let ip = Ipv4Addr::new(10, (i >> 16) as u8, (i >> 8) as u8, i as u8);
            Instance {
                id: name(format!("svc{svc}-inst{i}")),
                service: name(format!("svc{svc}")),
                locality: Locality {
                    region: region.clone(),
                    zone: name(format!("zone-{zone}")),
                    node: name(format!("node-{}", i % 500)),
                },
                address: Address {
                    ip: IpAddr::V4(ip),
                    port: 8080,
                },
                origin: Origin::Orchestrator,
                weight: Weight::DEFAULT,
                tags: BTreeSet::new(),
                metadata: Default::default(),
            }
        })
        .collect()
}

/// Run the evaluator benchmark.
pub fn evaluator(shape: Shape, samples: usize, failing_permille: u64) -> EvaluatorReport {
    let insts = instances(shape);
    let mut rng = SplitMix64::new(shape.seed);
    let failing: Vec<bool> = insts.iter().map(|_| rng.chance(failing_permille)).collect();
    let stream = sample_stream(&insts, &failing, samples, &mut rng);
    let contract: ValidContract = HealthContract {
        profile: CapabilityProfile::FULL,
        ..HealthContract::default()
    }
    .validate()
    .expect("valid");
    let start = Instant::now();
    let mut ev = Evaluator::new(EvaluatorConfig::default());
    for s in 0..shape.services {
        ev.handle_service(
            start,
            name(format!("svc{s}")),
            "bench".into(),
            contract.clone(),
        );
    }
    for i in &insts {
        ev.handle_instance(start, i, Admission::Established)
            .expect("fresh instance");
    }
    // Simulated time: every instance gets one sample per class per second.
    let step = Duration::from_secs(1).div_f64((insts.len() * 3) as f64);
    let samples_for_limit: Vec<(usize, usize, f64)> = stream
        .iter()
        .map(|(i, c, s)| (*i, c.index(), failed(s)))
        .collect();
    let timed = Instant::now();
    let mut now = start;
    for (_, _, sample) in stream {
        now += step;
        if ev.poll_timeout().is_some_and(|t| t <= now) {
            ev.handle_timeout(now);
        }
        let _ = ev.handle_sample(now, sample);
        if ev.stats().samples_applied.is_multiple_of(4096) {
            ev.take_effects();
        }
    }
    let elapsed = timed.elapsed();
    let limit = bare_ewma(&samples_for_limit, insts.len());
    let samples_per_sec = samples as f64 / elapsed.as_secs_f64();
    let limit_samples_per_sec = samples as f64 / limit.as_secs_f64();
    EvaluatorReport {
        bench: "evaluator",
        samples,
        instances: insts.len(),
        failing_permille,
        samples_per_sec,
        limit_samples_per_sec,
        ratio: samples_per_sec / limit_samples_per_sec,
        target_samples_per_sec: EVALUATOR_TARGET_SAMPLES_PER_SEC,
        meets_target: samples_per_sec >= EVALUATOR_TARGET_SAMPLES_PER_SEC,
        transitions: ev.stats().transitions,
        seed: shape.seed,
    }
}

fn failed(s: &Sample) -> f64 {
    match &s.observation {
        Observation::Probe {
            health: Health::Pass,
            ..
        }
        | Observation::SelfReport(SelfReport::Ready) => 0.0,
        Observation::Passive { requests, errors } => *errors as f64 / *requests as f64,
        _ => 1.0,
    }
}

/// Samples cycling probe → self-report → passive per instance, instances in random order.
fn sample_stream(
    insts: &[Instance],
    failing: &[bool],
    samples: usize,
    rng: &mut SplitMix64,
) -> Vec<(usize, EvidenceClass, Sample)> {
    let probers: Vec<Reporter> = (0..16)
        .map(|n| Reporter::Node(name(format!("prober-{n}"))))
        .collect();
    let callers: Vec<Reporter> = (0..64)
        .map(|n| Reporter::Node(name(format!("caller-{n}"))))
        .collect();
    (0..samples)
        .map(|k| {
            let i = rng.below(insts.len() as u64) as usize;
            let bad = failing[i];
            let id = insts[i].id.clone();
            let class = EvidenceClass::ALL[k % 3];
            let (reporter, observation) = match class {
                EvidenceClass::Probe => {
                    let health = if bad { Health::Fail } else { Health::Pass };
                    (
                        probers[i % probers.len()].clone(),
                        Observation::Probe {
                            health,
                            detail: None,
                        },
                    )
                }
                EvidenceClass::SelfReport => {
                    let report = if bad {
                        SelfReport::NotReady {
                            detail: "pool exhausted".into(),
                        }
                    } else {
                        SelfReport::Ready
                    };
                    (
                        Reporter::Instance(id.clone()),
                        Observation::SelfReport(report),
                    )
                }
                EvidenceClass::Passive => {
                    let errors = if bad { 40 } else { rng.below(2) };
                    let caller = callers[rng.below(callers.len() as u64) as usize].clone();
                    (
                        caller,
                        Observation::Passive {
                            requests: 100,
                            errors,
                        },
                    )
                }
            };
            (
                i,
                class,
                Sample {
                    instance: id,
                    reporter,
                    observation,
                },
            )
        })
        .collect()
}

/// The floor: one multiply-add per sample into a dense per-instance array.
fn bare_ewma(samples: &[(usize, usize, f64)], instances: usize) -> Duration {
    let mut scores = vec![[0.0f64; 3]; instances];
    let start = Instant::now();
    for (i, c, x) in samples {
        let s = &mut scores[*i][*c];
        *s += 0.5 * (x - *s);
    }
    let elapsed = start.elapsed();
    std::hint::black_box(&scores);
    elapsed
}

/// Run the assembly benchmark.
pub fn assemble(shape: Shape, changes: usize) -> AssembleReport {
    let insts = instances(shape);
    let zones = (0..shape.zones).map(|z| name::<ZoneName>(format!("zone-{z}")));
    let mut asm = ViewAssembler::new(AssemblerConfig::new(name("bench".into()), zones));
    let eligible = Eligibility::Eligible {
        weight: Weight::DEFAULT,
    };
    for i in &insts {
        asm.handle_instance(i);
        asm.handle_eligibility(&i.service, &i.id, eligible);
    }
    asm.assemble();
    let mut views: std::collections::BTreeMap<ViewKey, View> = std::collections::BTreeMap::new();
    for e in asm.take_effects() {
        if let AsmEffect::Target(v) = e {
            views.insert(v.key.clone(), v);
        }
    }
    let mut rng = SplitMix64::new(shape.seed);
    let picks: Vec<usize> = (0..changes)
        .map(|_| rng.below(insts.len() as u64) as usize)
        .collect();
    let soft = Eligibility::Ineligible {
        reason: IneligibleReason::SoftFailure,
    };
    let mut down = vec![false; insts.len()];
    let mut times = Vec::with_capacity(changes);
    let mut emitted = 0usize;
    let mut diffed = 0usize;
    let timed = Instant::now();
    for &p in &picks {
        let t = Instant::now();
        down[p] = !down[p];
        let i = &insts[p];
        asm.handle_eligibility(&i.service, &i.id, if down[p] { soft } else { eligible });
        asm.assemble();
        for e in asm.take_effects() {
            if let AsmEffect::Target(v) = e {
                emitted += 1;
                let old = views
                    .insert(v.key.clone(), v.clone())
                    .expect("view existed");
                diffed += diff(&old, &v).upserted.len();
            }
        }
        times.push(t.elapsed());
    }
    let elapsed = timed.elapsed();
    std::hint::black_box(diffed);
    let limit = clone_limit(&views, &insts, &picks);
    times.sort();
    let pct = |q: f64| times[((times.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1e6;
    let changes_per_sec = changes as f64 / elapsed.as_secs_f64();
    let limit_changes_per_sec = changes as f64 / limit.as_secs_f64();
    AssembleReport {
        bench: "assemble",
        services: shape.services,
        instances: insts.len(),
        zones: shape.zones,
        changes,
        changes_per_sec,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        limit_changes_per_sec,
        ratio: changes_per_sec / limit_changes_per_sec,
        views_emitted: emitted,
        seed: shape.seed,
    }
}

/// The floor: clone each affected service's views once per change.
fn clone_limit(
    views: &std::collections::BTreeMap<ViewKey, View>,
    insts: &[Instance],
    picks: &[usize],
) -> Duration {
    let start = Instant::now();
    for &p in picks {
        let service = &insts[p].service;
        for (_, v) in views.range(
            ViewKey {
                service: service.clone(),
                zone: name("0".into()),
            }..,
        ) {
            if &v.key.service != service {
                break;
            }
            std::hint::black_box(v.clone());
        }
    }
    start.elapsed()
}

/// The rebuild benchmark's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RebuildReport {
    /// Always `"rebuild"`.
    pub bench: &'static str,
    /// Services.
    pub services: usize,
    /// Instances.
    pub instances: usize,
    /// Time to recompute evaluator and assembler state from the desired state.
    pub rebuild_ms: f64,
    /// Time to release every view afterwards.
    pub publish_ms: f64,
    /// Views released.
    pub views: usize,
    /// The floor: cloning every instance record once.
    pub limit_ms: f64,
    /// `limit_ms / (rebuild_ms + publish_ms)`.
    pub ratio: f64,
    /// The reference recovery time objective (5 minutes at full scale).
    pub rto_ms: f64,
}

/// Run the rebuild benchmark: a new leader recomputing and publishing a whole region.
pub fn rebuild(shape: Shape) -> RebuildReport {
    use waymark_core::delta::DeltaConfig;
    use waymark_registry::pipeline::{Output, PipelineConfig, RegionPipeline};
    use waymark_registry::state::{Command, DesiredState, Stamped};
    let insts = instances(shape);
    let mut state = DesiredState::new();
    for s in 0..shape.services {
        let put = Command::PutService {
            service: name(format!("svc{s}")),
            owner: "bench".into(),
            contract: HealthContract::default(),
        };
        state
            .apply(Stamped {
                at_ms: 1,
                command: put,
            })
            .expect("valid service");
    }
    for i in &insts {
        state
            .apply(Stamped {
                at_ms: 2,
                command: Command::Observe {
                    instance: i.clone(),
                    draining: false,
                },
            })
            .expect("valid instance");
    }
    let zones = (0..shape.zones)
        .map(|z| name::<ZoneName>(format!("zone-{z}")))
        .collect();
    let config = PipelineConfig {
        region: name("bench".into()),
        zones,
        evaluator: EvaluatorConfig::default(),
        delta: DeltaConfig {
            admit_releases_per_sec: u32::MAX,
            ..DeltaConfig::default()
        },
    };
    let now = Instant::now();
    let timed = Instant::now();
    let mut pipeline = RegionPipeline::rebuild(config, &state, now);
    let rebuild_ms = timed.elapsed().as_secs_f64() * 1e3;
    let timed = Instant::now();
    let mut versions = waymark_core::view::MonotonicCounter::default();
    pipeline.handle_timeout(now + waymark_core::defaults::ADMIT_WINDOW, &mut versions);
    let views = pipeline
        .take_outputs()
        .iter()
        .filter(|o| matches!(o, Output::Release(_)))
        .count();
    let publish_ms = timed.elapsed().as_secs_f64() * 1e3;
    let timed = Instant::now();
    let copies: Vec<Instance> = state.instances().map(|r| r.instance.clone()).collect();
    std::hint::black_box(&copies);
    let limit_ms = timed.elapsed().as_secs_f64() * 1e3;
    RebuildReport {
        bench: "rebuild",
        services: shape.services,
        instances: insts.len(),
        rebuild_ms,
        publish_ms,
        views,
        limit_ms,
        ratio: limit_ms / (rebuild_ms + publish_ms),
        rto_ms: 300_000.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_evaluator_run_reports_real_work() {
        let shape = Shape {
            services: 4,
            instances: 40,
            zones: 2,
            seed: 1,
        };
        let r = evaluator(shape, 30_000, 100);
        assert_eq!(r.samples, 30_000);
        assert!(
            r.transitions > 40,
            "failing instances produced transitions: {}",
            r.transitions
        );
        assert!(r.samples_per_sec > 0.0 && r.limit_samples_per_sec > 0.0);
    }

    #[test]
    fn a_small_rebuild_releases_one_view_per_service_and_zone() {
        let shape = Shape {
            services: 4,
            instances: 40,
            zones: 2,
            seed: 1,
        };
        let r = rebuild(shape);
        assert_eq!(r.views, 4 * 2);
    }

    #[test]
    fn a_small_assembly_run_emits_one_view_per_zone_per_change() {
        let shape = Shape {
            services: 4,
            instances: 40,
            zones: 2,
            seed: 1,
        };
        let r = assemble(shape, 50);
        assert_eq!(r.views_emitted, 50 * 2);
        assert!(r.p50_us <= r.p99_us);
    }
}
