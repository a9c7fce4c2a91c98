//! Deterministic simulation (tier A) of one region's leader pipeline on virtual time.
//!
//! A seeded region of services × instances × zones, each instance with a hidden truth that
//! a seeded fault schedule changes (healthy, soft-failing, dead, flapping, or unobserved —
//! its probers and callers silent), drives probe and caller samples through the real
//! `RegionPipeline` once per simulated second, with a little noise. After every step an
//! invariant checker looks at everything released:
//!
//! - every view's versions strictly increase;
//! - no zone is released below its floor unless it is declared `health_disregarded`;
//! - a dead instance is out of every view within the hard-failure budget (10 s);
//! - an instance whose evidence merely went silent is never withdrawn for it.
//!
//! One seed reproduces a run exactly; the seed and fault parameters are printed first.

mod federation;
pub mod region;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use waymark_core::contract::HealthContract;
use waymark_core::defaults as d;
use waymark_core::delta::DeltaConfig;
use waymark_core::evaluator::EvaluatorConfig;
use waymark_core::model::*;
use waymark_core::units::Weight;
use waymark_core::view::{EndpointStatus, MonotonicCounter, Version, ViewKey};
use waymark_registry::pipeline::{Output, PipelineConfig, RegionPipeline};
use waymark_registry::state::{Command, DesiredState, Stamped};

use crate::rng::SplitMix64;

/// What an instance really is, hidden from the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truth {
    /// Serving well.
    Healthy,
    /// Answering, but failing its checks and its callers.
    SoftFail,
    /// Gone: connections refused.
    Dead,
    /// Healthy, but nobody observes it (prober and caller paths broken).
    Unobserved,
    /// Alternating healthy and failing every `period` seconds.
    Flapping {
        /// Half-period in seconds.
        period: u64,
    },
}

/// Simulation size and fault rates.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    /// The seed everything derives from.
    pub seed: u64,
    /// Services.
    pub services: usize,
    /// Instances per service (spread over zones).
    pub per_service: usize,
    /// Zones.
    pub zones: usize,
    /// Simulated seconds.
    pub seconds: u64,
    /// Chance per instance per second that its truth changes, permille.
    pub fault_permille: u64,
    /// Chance a sample is flipped by noise, permille.
    pub noise_permille: u64,
}

/// A broken invariant, with when and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Simulated second.
    pub second: u64,
    /// What broke.
    pub what: String,
}

/// What a run saw.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// Views released.
    pub releases: usize,
    /// Transitions recorded.
    pub transitions: usize,
    /// Guard engagements.
    pub guard_alarms: usize,
    /// Deaths injected.
    pub deaths: usize,
    /// Broken invariants (empty on a good run).
    pub violations: Vec<Violation>,
}

struct Inst {
    instance: Instance,
    truth: Truth,
    died_at: Option<u64>,
    /// Went unobserved while routed: silence alone must keep it routed.
    silenced_while_routed: bool,
}

/// Run one simulation; deterministic for its config.
pub fn run(config: SimConfig) -> SimReport {
    let mut rng = SplitMix64::new(config.seed);
    let mut insts = region(&config);
    let state = desired(&config, &insts);
    let start = Instant::now(); // the only clock read: every later time is start + offset
    let zones = (0..config.zones).map(zone).collect();
    let pc = PipelineConfig {
        region: RegionName::try_new("sim").expect("valid"),
        zones,
        evaluator: EvaluatorConfig::default(),
        delta: DeltaConfig::default(),
        fraction_guard: true,
    };
    let mut pipeline = RegionPipeline::rebuild(pc, &state, start);
    let mut versions = MonotonicCounter::default();
    let mut checker = Checker::default();
    let mut report = SimReport::default();
    for second in 0..config.seconds {
        let now = start + Duration::from_secs(second);
        for inst in insts.iter_mut() {
            let before = inst.truth;
            mutate(inst, second, &config, &mut rng, &mut report);
            if inst.truth != before {
                inst.silenced_while_routed =
                    inst.truth == Truth::Unobserved && checker.routed_everywhere(&inst.instance);
            }
            for sample in samples(inst, second, &config, &mut rng) {
                let _ = pipeline.handle_sample(now, sample);
            }
        }
        // Timers inside the second (withdraw windows, silence, holds), then the second's end.
        let end = now + Duration::from_secs(1);
        while let Some(due) = pipeline.poll_timeout().filter(|t| *t < end) {
            pipeline.handle_timeout(due.max(now), &mut versions);
            checker.absorb(second, pipeline.take_outputs(), &mut report);
        }
        checker.check_dead(second, &insts, &mut report);
        checker.check_silence(second, &insts, &mut report);
    }
    report
}

fn zone(z: usize) -> ZoneName {
    ZoneName::try_new(format!("z{z}")).expect("valid")
}

fn region(c: &SimConfig) -> Vec<Inst> {
    let mut out = Vec::new();
    for s in 0..c.services {
        for i in 0..c.per_service {
            let n = out.len();
            let instance = Instance {
                id: InstanceId::try_new(format!("s{s}-i{i}")).expect("valid"),
                service: ServiceName::try_new(format!("s{s}")).expect("valid"),
                locality: Locality {
                    region: RegionName::try_new("sim").expect("valid"),
                    zone: zone(i % c.zones),
                    node: NodeName::try_new(format!("n{}", n % 16)).expect("valid"),
                },
                address: Address {
                    ip: IpAddr::V4(Ipv4Addr::new(10, 9, (n >> 8) as u8, n as u8)),
                    port: 80,
                },
                origin: Origin::Orchestrator,
                weight: Weight::DEFAULT,
                tags: BTreeSet::new(),
                metadata: BTreeMap::new(),
            };
            out.push(Inst {
                instance,
                truth: Truth::Healthy,
                died_at: None,
                silenced_while_routed: false,
            });
        }
    }
    out
}

fn desired(c: &SimConfig, insts: &[Inst]) -> DesiredState {
    let mut state = DesiredState::new();
    for s in 0..c.services {
        let service = ServiceName::try_new(format!("s{s}")).expect("valid");
        let put = Command::PutService {
            service,
            owner: "sim".into(),
            contract: HealthContract::default(),
        };
        state
            .apply(Stamped {
                at_ms: 1,
                command: put,
            })
            .expect("valid service");
    }
    for i in insts {
        let observe = Command::Observe {
            instance: i.instance.clone(),
            draining: false,
        };
        state
            .apply(Stamped {
                at_ms: 2,
                command: observe,
            })
            .expect("valid instance");
    }
    state
}

fn mutate(
    inst: &mut Inst,
    second: u64,
    c: &SimConfig,
    rng: &mut SplitMix64,
    report: &mut SimReport,
) {
    if inst.truth == Truth::Dead || !rng.chance(c.fault_permille) {
        return; // the dead stay dead: a restart would be a new instance
    }
    inst.truth = match rng.below(5) {
        0 => Truth::Healthy,
        1 => Truth::SoftFail,
        2 => {
            report.deaths += 1;
            inst.died_at = Some(second);
            Truth::Dead
        }
        3 => Truth::Unobserved,
        _ => Truth::Flapping {
            period: 5 + rng.below(20),
        },
    };
}

fn samples(inst: &Inst, second: u64, c: &SimConfig, rng: &mut SplitMix64) -> Vec<Sample> {
    let failing = match inst.truth {
        Truth::Healthy => false,
        Truth::SoftFail => true,
        Truth::Dead => {
            let probe = Observation::Probe {
                health: Health::Refused,
                detail: None,
            };
            return vec![sample(inst, "prober", probe)];
        }
        Truth::Unobserved => return Vec::new(),
        Truth::Flapping { period } => (second / period) % 2 == 1,
    };
    let noisy = |rng: &mut SplitMix64| failing ^ rng.chance(c.noise_permille);
    let health = if noisy(rng) {
        Health::Fail
    } else {
        Health::Pass
    };
    let errors = if noisy(rng) { 80 } else { 0 };
    vec![
        sample(
            inst,
            "prober",
            Observation::Probe {
                health,
                detail: None,
            },
        ),
        sample(
            inst,
            "caller",
            Observation::Passive {
                requests: 100,
                errors,
            },
        ),
    ]
}

fn sample(inst: &Inst, who: &str, observation: Observation) -> Sample {
    Sample {
        instance: inst.instance.id.clone(),
        reporter: Reporter::Node(NodeName::try_new(who).expect("valid")),
        observation,
    }
}

#[derive(Default)]
struct Checker {
    last_version: BTreeMap<ViewKey, Version>,
    /// Which instances each service's latest releases route, per caller zone.
    routed: BTreeMap<ViewKey, BTreeSet<InstanceId>>,
    /// The same, counting only those routed on their own verdict (not restored by a guard).
    by_verdict: BTreeMap<ViewKey, BTreeSet<InstanceId>>,
}

impl Checker {
    fn absorb(&mut self, second: u64, outputs: Vec<Output>, report: &mut SimReport) {
        for o in outputs {
            match o {
                Output::Release(r) => {
                    report.releases += 1;
                    let key = r.view.key.clone();
                    if self.last_version.get(&key).is_some_and(|v| *v >= r.version) {
                        report.violations.push(Violation {
                            second,
                            what: format!("{key}: version went back to {}", r.version),
                        });
                    }
                    self.last_version.insert(key.clone(), r.version);
                    for (z, floor) in &r.view.markers.zone_floor {
                        let declared = r.view.markers.health_disregarded.contains(z);
                        if !declared && r.view.routed_in(z) < *floor as usize {
                            let what = format!(
                                "{key}: zone {z} routes {} < floor {floor}, undeclared",
                                r.view.routed_in(z)
                            );
                            report.violations.push(Violation { second, what });
                        }
                    }
                    let routed: Vec<_> = r
                        .view
                        .endpoints
                        .values()
                        .filter(|e| e.status.is_routed())
                        .collect();
                    let own: BTreeSet<InstanceId> = routed
                        .iter()
                        .filter(|e| e.status != EndpointStatus::Disregarded)
                        .map(|e| e.instance.clone())
                        .collect();
                    self.routed.insert(
                        key.clone(),
                        routed.iter().map(|e| e.instance.clone()).collect(),
                    );
                    self.by_verdict.insert(key, own);
                }
                Output::Transition(_) => report.transitions += 1,
                Output::Alarm(waymark_core::assembler::Effect::GuardEngaged { .. }) => {
                    report.guard_alarms += 1
                }
                _ => {}
            }
        }
    }

    /// Routed on its own verdict (not restored by a guard) in every view of its service.
    fn routed_everywhere(&self, inst: &Instance) -> bool {
        let mut views = self
            .by_verdict
            .iter()
            .filter(|(k, _)| k.service == inst.service)
            .peekable();
        views.peek().is_some() && views.all(|(_, r)| r.contains(&inst.id))
    }

    fn check_silence(&self, second: u64, insts: &[Inst], report: &mut SimReport) {
        for inst in insts
            .iter()
            .filter(|i| i.truth == Truth::Unobserved && i.silenced_while_routed)
        {
            if !self.routed_everywhere(&inst.instance) {
                let what = format!("{} was withdrawn while merely unobserved", inst.instance.id);
                report.violations.push(Violation { second, what });
            }
        }
    }

    fn check_dead(&self, second: u64, insts: &[Inst], report: &mut SimReport) {
        let budget = d::HARD_FAILURE_BUDGET_P99.as_secs();
        for inst in insts {
            let Some(died) = inst.died_at else { continue };
            if second < died + budget {
                continue;
            }
            for (key, routed) in &self.routed {
                if key.service == inst.instance.service && routed.contains(&inst.instance.id) {
                    let what = format!(
                        "{} dead since {died}s still routed in {key}",
                        inst.instance.id
                    );
                    report.violations.push(Violation { second, what });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use waymark_core::view::{Markers, ReleasedView, View, ViewEndpoint};

    use super::*;

    fn release(version: u64, routed: usize, floor: u32) -> Output {
        let key = ViewKey {
            service: ServiceName::try_new("s").unwrap(),
            zone: zone(0),
        };
        let endpoints = (0..routed)
            .map(|i| {
                let e = ViewEndpoint::eligible(
                    InstanceId::try_new(format!("i{i}")).unwrap(),
                    Address {
                        ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
                        port: 1000 + i as u16,
                    },
                    RegionName::try_new("sim").unwrap(),
                    zone(0),
                );
                (e.instance.clone(), e)
            })
            .collect::<std::collections::BTreeMap<_, _>>()
            .into();
        let mut markers = Markers::default();
        markers.zone_floor.insert(zone(0), floor);
        Output::Release(Box::new(ReleasedView {
            version: Version(version),
            view: View {
                key,
                endpoints,
                markers,
            },
        }))
    }

    #[test]
    fn the_checker_catches_a_version_regression_and_an_undeclared_breach() {
        // Goal: the invariants can fail; a checker that never fires proves nothing.
        let mut checker = Checker::default();
        let mut report = SimReport::default();
        checker.absorb(1, vec![release(5, 3, 2)], &mut report);
        assert!(report.violations.is_empty());
        checker.absorb(2, vec![release(4, 3, 2)], &mut report);
        checker.absorb(3, vec![release(6, 1, 2)], &mut report);
        let whats: Vec<&str> = report.violations.iter().map(|v| v.what.as_str()).collect();
        assert_eq!(whats.len(), 2, "{whats:?}");
        assert!(
            whats[0].contains("version went back") && whats[1].contains("floor"),
            "{whats:?}"
        );
    }
}
