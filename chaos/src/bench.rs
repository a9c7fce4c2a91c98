//! Benchmarks of the pure core, each against a limit measured in the same run.
//!
//! - `evaluator`: a realistic sample stream (instances × 3 classes, a few per cent failing,
//!   simulated time advancing at one sample per class per instance per second) through the
//!   evaluator on one thread, at the prototype's and the reference estate's size, against
//!   the same stream through a plain hash map keyed by instance id with one time-decayed
//!   score per class — the lookup and update any evaluator must do per sample. The rate
//!   counts samples the evaluator applied, not samples offered.
//! - `assemble`: one eligibility change, then re-assembly of the affected service's views
//!   and their diffs, against a plain clone of the same views — the least work any
//!   copy-on-write publication must do per change.
//! - `rebuild`: a new authority leader taking over a region — snapshot decode, pipeline
//!   rebuild, release of every view, the `Publish` entry's encoding and an xDS snapshot
//!   build — against cloning every instance record once. This is in-memory work only; the
//!   real recovery time (election, hold, commit and every subscriber current again) is
//!   `bench failover`'s, which uses this as part of its limit.
//!
//! Times are read here, in the shell; the cores receive them as values.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use serde::Serialize;
use waymark_agent::authority::raft::codec;
use waymark_core::assembler::{AssemblerConfig, Effect as AsmEffect, ViewAssembler};
use waymark_core::contract::{CapabilityProfile, HealthContract, ValidContract};
use waymark_core::eligibility::{Eligibility, IneligibleReason};
use waymark_core::evaluator::{Admission, Evaluator, EvaluatorConfig};
use waymark_core::model::*;
use waymark_core::units::Weight;
use waymark_core::view::{View, ViewKey, diff};

use crate::rng::SplitMix64;
use crate::writes::Spread;

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

// === impl Shape ===

impl Shape {
    /// The prototype's scale: 40 services, 2,000 instances, 3 zones.
    pub const PROTOTYPE: Self = Self {
        services: 40,
        instances: 2_000,
        zones: 3,
        seed: 42,
    };

    /// The reference estate's region: 450 services, 60,000 instances, 3 zones.
    pub const REFERENCE: Self = Self {
        services: 450,
        instances: 60_000,
        zones: 3,
        seed: 42,
    };
}

impl Default for Shape {
    /// [`Shape::PROTOTYPE`].
    fn default() -> Self {
        Self::PROTOTYPE
    }
}

/// The evaluator benchmark's figures: one entry per size.
#[derive(Debug, Clone, Serialize)]
pub struct EvaluatorReport {
    /// Always `"evaluator"`.
    pub bench: &'static str,
    /// Each size measured, smallest first.
    pub sizes: Vec<EvaluatorSize>,
    /// The largest size's `ratio.median`: the headline.
    pub ratio: f64,
    /// Whether the largest size's median applied rate meets
    /// [`EVALUATOR_TARGET_SAMPLES_PER_SEC`].
    pub meets_target: bool,
}

/// The evaluator's figures at one size, over the repeats.
#[derive(Debug, Clone, Serialize)]
pub struct EvaluatorSize {
    /// Services.
    pub services: usize,
    /// Instances evaluated.
    pub instances: usize,
    /// Share of instances failing, in permille.
    pub failing_permille: u64,
    /// Samples fed per repeat.
    pub samples: usize,
    /// Samples the evaluator applied per repeat (fed minus refused); the rate counts these.
    pub samples_applied: u64,
    /// Samples the evaluator applied per second, on one thread.
    pub samples_per_sec: Spread,
    /// The same samples through a plain map: the instance looked up by id, the class's
    /// time-decayed score updated, nothing else.
    pub limit_samples_per_sec: Spread,
    /// `samples_per_sec / limit_samples_per_sec` of each repeat.
    pub ratio: Spread,
    /// The target from the reference estate.
    pub target_samples_per_sec: f64,
    /// Transitions the first repeat produced (a sanity check that the work was real).
    pub transitions: u64,
    /// Repeats measured.
    pub repeats: usize,
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

/// Run the evaluator benchmark at each of `shapes`, `repeats` times each.
pub fn evaluator(
    shapes: &[Shape],
    samples: usize,
    failing_permille: u64,
    repeats: usize,
) -> EvaluatorReport {
    let sizes: Vec<EvaluatorSize> = shapes
        .iter()
        .map(|&shape| evaluator_size(shape, samples, failing_permille, repeats.max(1)))
        .collect();
    let last = sizes.last();
    EvaluatorReport {
        bench: "evaluator",
        ratio: last.map_or(0.0, |s| s.ratio.median),
        meets_target: last
            .is_some_and(|s| s.samples_per_sec.median >= EVALUATOR_TARGET_SAMPLES_PER_SEC),
        sizes,
    }
}

fn evaluator_size(
    shape: Shape,
    samples: usize,
    failing_permille: u64,
    repeats: usize,
) -> EvaluatorSize {
    let insts = instances(shape);
    let mut rng = SplitMix64::new(shape.seed);
    let failing: Vec<bool> = insts.iter().map(|_| rng.chance(failing_permille)).collect();
    let contract: ValidContract = HealthContract {
        profile: CapabilityProfile::FULL,
        ..HealthContract::default()
    }
    .validate()
    .expect("valid");
    let (mut rates, mut limits, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut applied, mut transitions) = (0, 0);
    for repeat in 0..repeats {
        // A fresh stream per repeat (the evaluator consumes its samples); the limit reads
        // the same stream first.
        let stream = sample_stream(&insts, &failing, samples, &mut rng);
        let limit = plain_map(&insts, &stream, &contract);
        let run = evaluate(shape, &insts, &contract, stream);
        let rate = run.applied as f64 / run.elapsed.as_secs_f64();
        let limit_rate = samples as f64 / limit.as_secs_f64();
        rates.push(rate);
        limits.push(limit_rate);
        ratios.push(rate / limit_rate);
        applied = run.applied;
        if repeat == 0 {
            transitions = run.transitions;
        }
    }
    EvaluatorSize {
        services: shape.services,
        instances: insts.len(),
        failing_permille,
        samples,
        samples_applied: applied,
        samples_per_sec: Spread::of(&rates),
        limit_samples_per_sec: Spread::of(&limits),
        ratio: Spread::of(&ratios),
        target_samples_per_sec: EVALUATOR_TARGET_SAMPLES_PER_SEC,
        transitions,
        repeats,
        seed: shape.seed,
    }
}

struct EvaluatorRun {
    applied: u64,
    elapsed: Duration,
    transitions: u64,
}

/// The stream through a fresh evaluator holding every service and instance.
fn evaluate(
    shape: Shape,
    insts: &[Instance],
    contract: &ValidContract,
    stream: Vec<(usize, EvidenceClass, Sample)>,
) -> EvaluatorRun {
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
    for i in insts {
        ev.handle_instance(start, i, Admission::Established)
            .expect("fresh instance");
    }
    let step = sample_step(insts.len());
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
    EvaluatorRun {
        elapsed: timed.elapsed(),
        applied: ev.stats().samples_applied,
        transitions: ev.stats().transitions,
    }
}

/// Simulated time between samples: every instance gets one sample per class per second.
fn sample_step(instances: usize) -> Duration {
    Duration::from_secs(1).div_f64((instances * 3) as f64)
}

/// The limit: what any evaluator keyed by instance id must do per sample — find the
/// instance in a hash map by the sample's id, and fold the sample's value into its class's
/// score with the same time-decayed EWMA (`alpha = 1 - 2^(-dt / half_life)`, `dt` capped at
/// the class interval). No verdict, no silence, no timers, no effects.
fn plain_map(
    insts: &[Instance],
    stream: &[(usize, EvidenceClass, Sample)],
    contract: &ValidContract,
) -> Duration {
    #[derive(Clone, Copy)]
    struct Class {
        score: f64,
        last: Option<Instant>,
    }
    let start = Instant::now();
    let mut map: std::collections::HashMap<&InstanceId, [Class; 3]> = insts
        .iter()
        .map(|i| {
            (
                &i.id,
                [Class {
                    score: 0.0,
                    last: None,
                }; 3],
            )
        })
        .collect();
    let half_life = contract.scoring.half_life.as_secs_f64();
    let intervals = EvidenceClass::ALL.map(|c| contract.interval_of(c));
    let step = sample_step(insts.len());
    let timed = Instant::now();
    let mut now = start;
    for (_, class, sample) in stream {
        now += step;
        let Some(classes) = map.get_mut(&sample.instance) else {
            continue;
        };
        let c = class.index();
        let slot = &mut classes[c];
        let dt = slot
            .last
            .map_or(intervals[c], |at| now.saturating_duration_since(at))
            .min(intervals[c]);
        let alpha = 1.0 - (-dt.as_secs_f64() / half_life).exp2();
        slot.score = (slot.score + alpha * (failed(sample) - slot.score)).clamp(0.0, 1.0);
        slot.last = Some(now);
    }
    let elapsed = timed.elapsed();
    std::hint::black_box(&map);
    elapsed
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

/// The rebuild benchmark's figures at one size: what a new authority leader does, stage by
/// stage, each timed on its own (see [`rebuild`]).
#[derive(Debug, Clone, Serialize)]
pub struct RebuildReport {
    /// Always `"rebuild"`.
    pub bench: &'static str,
    /// Services.
    pub services: usize,
    /// Instances.
    pub instances: usize,
    /// Zones.
    pub zones: usize,
    /// Views released (one per service and caller zone).
    pub views: usize,
    /// The replicated state's encoding (the Raft snapshot, `raft::codec`), in bytes.
    pub snapshot_bytes: usize,
    /// Stage 1: decoding that snapshot into an `AuthorityState`.
    pub snapshot_decode_ms: f64,
    /// Stage 2: recomputing evaluator and assembler state from the decoded registry.
    pub rebuild_ms: f64,
    /// Stage 3: releasing every view.
    pub publish_ms: f64,
    /// The encoding of the `Publish` log entry carrying every view, in bytes.
    pub commit_bytes: usize,
    /// Stage 4: encoding that entry.
    pub commit_encode_ms: f64,
    /// Stage 5: one xDS tier taking every released view and building its snapshot.
    pub xds_build_ms: f64,
    /// The sum of the five stages.
    pub total_ms: f64,
    /// The floor: cloning every instance record once.
    pub limit_ms: f64,
    /// `limit_ms / total_ms`.
    pub ratio: f64,
}

/// The rebuild benchmark over several sizes: what `waymark-drill bench rebuild` prints.
#[derive(Debug, Clone, Serialize)]
pub struct RebuildSummary {
    /// Always `"rebuild"`.
    pub bench: &'static str,
    /// One report per size, in the order run.
    pub sizes: Vec<RebuildReport>,
    /// The largest size's `ratio` (0 when no size ran).
    pub ratio: f64,
}

// === impl RebuildSummary ===

impl RebuildSummary {
    /// Summarise reports; the headline figures are the largest size's (most instances).
    pub fn new(sizes: Vec<RebuildReport>) -> Self {
        let largest = sizes.iter().max_by_key(|r| (r.instances, r.services));
        let ratio = largest.map_or(0.0, |r| r.ratio);
        Self {
            bench: "rebuild",
            sizes,
            ratio,
        }
    }
}

/// The term of the leader whose views the snapshot holds; the new leader's is the next.
const OLD_TERM: u64 = 1;

/// Run the rebuild benchmark: what a new authority leader does, at one size.
///
/// Untimed setup: an `AuthorityState` whose registry holds the shape's services and
/// instances (applied as `Request::Registry` entries) and whose published views come from
/// a first pipeline run (applied as one `Request::Publish`), encoded once as a member
/// encodes its snapshots (`raft::codec`). Timed, stage by stage, as `authority::leader` and `authority::tier` do it: decode the snapshot;
/// rebuild the pipeline from its registry; release every view; encode them as one
/// `Publish` entry; feed them to an xDS `SnapshotBuilder` and build. Releases are not
/// rate-limited here, so the figure is compute, not admission pacing; every view is
/// committed, the worst case of the leader's hold (which commits only views that differ).
pub fn rebuild(shape: Shape) -> RebuildReport {
    let run = rebuild_run(shape);
    debug_assert!(run.decoded == run.state, "the snapshot round-trips");
    run.report
}

/// One run of the rebuild benchmark, with the state before encoding and after decoding.
struct RebuildRun {
    report: RebuildReport,
    state: waymark_registry::machine::AuthorityState,
    decoded: waymark_registry::machine::AuthorityState,
}

fn rebuild_run(shape: Shape) -> RebuildRun {
    use waymark_registry::machine::{AuthorityState, TermVersions};
    use waymark_registry::pipeline::RegionPipeline;

    let config = rebuild_config(shape);
    let state = replicated_state(shape, &config);
    let snapshot = codec::encode(&state).expect("the replicated state encodes");
    let (decoded, snapshot_decode_ms) = timed(|| {
        codec::decode::<AuthorityState>(&snapshot).expect("the snapshot just encoded decodes")
    });
    let snapshot_bytes = snapshot.len();
    drop(snapshot);
    let now = Instant::now();
    let (mut pipeline, rebuild_ms) =
        timed(|| RegionPipeline::rebuild(config, decoded.registry(), now));
    let mut versions = TermVersions::new(OLD_TERM + 1, decoded.max_version());
    let (views, publish_ms) = timed(|| release_all(&mut pipeline, now, &mut versions));
    drop(pipeline);
    let released = views.len();
    let (commit_bytes, commit_encode_ms, xds_build_ms) = commit_and_serve(views);
    let (copies, limit_ms) = timed(|| {
        decoded
            .registry()
            .instances()
            .map(|r| r.instance.clone())
            .collect::<Vec<Instance>>()
    });
    drop(copies);
    let total_ms = snapshot_decode_ms + rebuild_ms + publish_ms + commit_encode_ms + xds_build_ms;
    let report = RebuildReport {
        bench: "rebuild",
        services: shape.services,
        instances: decoded.registry().instances().count(),
        zones: shape.zones,
        views: released,
        snapshot_bytes,
        snapshot_decode_ms,
        rebuild_ms,
        publish_ms,
        commit_bytes,
        commit_encode_ms,
        xds_build_ms,
        total_ms,
        limit_ms,
        ratio: limit_ms / total_ms,
    };
    RebuildRun {
        report,
        state,
        decoded,
    }
}

/// Stages 4 and 5: encode the views as one `Publish` entry, then build one member's xDS
/// snapshot from them. Returns the entry's size and the two stages' times.
fn commit_and_serve(views: Vec<waymark_core::view::ReleasedView>) -> (usize, f64, f64) {
    use waymark_registry::machine::Request;
    use waymark_xds::snapshot::SnapshotBuilder;

    let commit = Request::Publish { views };
    let (entry, commit_encode_ms) =
        timed(|| codec::encode(&commit).expect("a publish entry encodes"));
    let commit_bytes = entry.len();
    drop(entry);
    let Request::Publish { views } = &commit else {
        unreachable!("built as a publish entry above")
    };
    let (xds, xds_build_ms) = timed(|| {
        let mut builder = SnapshotBuilder::new();
        for view in views {
            builder.handle_release(view);
        }
        builder.build()
    });
    drop(xds);
    (commit_bytes, commit_encode_ms, xds_build_ms)
}

/// The pipeline as the leader runs it, except that releases are not rate-limited.
fn rebuild_config(shape: Shape) -> waymark_registry::pipeline::PipelineConfig {
    use waymark_core::delta::DeltaConfig;
    let zones = (0..shape.zones)
        .map(|z| name::<ZoneName>(format!("zone-{z}")))
        .collect();
    waymark_registry::pipeline::PipelineConfig {
        region: name("bench".into()),
        zones,
        evaluator: EvaluatorConfig::default(),
        delta: DeltaConfig {
            admit_releases_per_sec: u32::MAX,
            ..DeltaConfig::default()
        },
        fraction_guard: true,
    }
}

/// The authority's replicated state as a new leader finds it: the registry built through
/// the log, and the views the previous leader (term [`OLD_TERM`]) published.
fn replicated_state(
    shape: Shape,
    config: &waymark_registry::pipeline::PipelineConfig,
) -> waymark_registry::machine::AuthorityState {
    use waymark_core::view::Version;
    use waymark_registry::machine::{AuthorityState, Request, Response, TermVersions};
    use waymark_registry::pipeline::RegionPipeline;
    use waymark_registry::state::{Command, Stamped};

    let services = (0..shape.services).map(|s| Stamped {
        at_ms: 1,
        command: Command::PutService {
            service: name(format!("svc{s}")),
            owner: "bench".into(),
            contract: HealthContract::default(),
        },
    });
    let observed = instances(shape).into_iter().map(|instance| Stamped {
        at_ms: 2,
        command: Command::Observe {
            instance,
            draining: false,
        },
    });
    let mut state = AuthorityState::default();
    for stamped in services.chain(observed) {
        let response = state.apply(Request::Registry(stamped));
        assert!(
            matches!(response, Response::Registry { outcome: Ok(_) }),
            "generated registry entries are valid: {response:?}"
        );
    }
    let now = Instant::now();
    let mut pipeline = RegionPipeline::rebuild(config.clone(), state.registry(), now);
    let mut versions = TermVersions::new(OLD_TERM, Version(0));
    let views = release_all(&mut pipeline, now, &mut versions);
    state.apply(Request::Publish { views });
    state
}

/// Release every view a freshly rebuilt pipeline holds, as the leader's first timer does.
fn release_all(
    pipeline: &mut waymark_registry::pipeline::RegionPipeline,
    now: Instant,
    versions: &mut dyn waymark_core::view::VersionSource,
) -> Vec<waymark_core::view::ReleasedView> {
    use waymark_registry::pipeline::Output;
    pipeline.handle_timeout(now + waymark_core::defaults::ADMIT_WINDOW, versions);
    pipeline
        .take_outputs()
        .into_iter()
        .filter_map(|o| match o {
            Output::Release(view) => Some(*view),
            _ => None,
        })
        .collect()
}

/// Run `f`; return its result and the milliseconds it took. The result is dropped by the
/// caller, outside the measurement.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let start = Instant::now();
    let out = std::hint::black_box(f());
    (out, start.elapsed().as_secs_f64() * 1e3)
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
        let r = evaluator(&[shape], 30_000, 100, 2);
        let [size] = r.sizes.as_slice() else {
            panic!("one size asked, {} measured", r.sizes.len());
        };
        assert_eq!((size.samples, size.repeats), (30_000, 2));
        assert_eq!(
            size.samples_applied, 30_000,
            "every sample names a known instance, so every one is applied"
        );
        assert!(
            size.transitions > 40,
            "failing instances produced transitions: {}",
            size.transitions
        );
        assert!(size.samples_per_sec.min > 0.0 && size.limit_samples_per_sec.min > 0.0);
        assert_eq!(r.ratio, size.ratio.median);
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
    fn a_small_rebuild_times_every_stage_and_its_snapshot_round_trips() {
        let shape = Shape {
            services: 4,
            instances: 40,
            zones: 2,
            seed: 1,
        };
        let run = rebuild_run(shape);
        assert_eq!(run.decoded, run.state);
        assert_eq!(run.state.published().len(), 4 * 2, "the old leader's views");
        let r = run.report;
        let stages = [
            ("snapshot_decode_ms", r.snapshot_decode_ms),
            ("rebuild_ms", r.rebuild_ms),
            ("publish_ms", r.publish_ms),
            ("commit_encode_ms", r.commit_encode_ms),
            ("xds_build_ms", r.xds_build_ms),
        ];
        for (stage, ms) in stages {
            assert!(ms > 0.0, "{stage} was timed: {ms}");
        }
        let sum: f64 = stages.iter().map(|(_, ms)| ms).sum();
        assert!(
            (r.total_ms - sum).abs() < 1e-9,
            "total is the sum of the stages"
        );
        assert!(r.snapshot_bytes > 0 && r.commit_bytes > 0);
        assert!(r.limit_ms > 0.0 && r.ratio > 0.0);
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
