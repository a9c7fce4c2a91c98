//! The pipeline end to end, on virtual time: rebuild, withdrawal, and claim 3.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use waymark_core::contract::HealthContract;
use waymark_core::defaults as d;
use waymark_core::model::{
    Address, Health, InstanceId, Locality, NodeName, Observation, Origin, Reporter, ServiceName,
};
use waymark_core::units::{Permille, Weight};
use waymark_core::view::{EndpointStatus, MonotonicCounter, Tier, ViewKey};

use super::*;
use crate::state::{Command, RegionFailoverIntent, Stamped};

#[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
fn t0() -> Instant {
    Instant::now()
}

fn zone(z: &str) -> ZoneName {
    ZoneName::try_new(z).unwrap()
}

fn pod(i: u8, z: &str) -> Instance {
    Instance {
        id: InstanceId::try_new(format!("pay-{z}-{i}")).unwrap(),
        service: ServiceName::try_new("pay").unwrap(),
        locality: Locality {
            region: RegionName::try_new("eu").unwrap(),
            zone: zone(z),
            node: NodeName::try_new("n").unwrap(),
        },
        address: Address {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, i, 1)),
            port: 8080,
        },
        origin: Origin::Orchestrator,
        weight: Weight::DEFAULT,
        tags: BTreeSet::new(),
        metadata: BTreeMap::new(),
    }
}

fn region_state() -> DesiredState {
    let mut s = DesiredState::new();
    let put = Command::PutService {
        service: ServiceName::try_new("pay").unwrap(),
        owner: "team-pay".into(),
        contract: HealthContract::default(),
    };
    s.apply(Stamped {
        at_ms: 1,
        command: put,
    })
    .unwrap();
    for (i, z) in [(1, "a"), (2, "a"), (3, "b"), (4, "b")] {
        s.apply(Stamped {
            at_ms: 2,
            command: Command::Observe {
                instance: pod(i, z),
                draining: false,
            },
        })
        .unwrap();
    }
    s
}

fn config() -> PipelineConfig {
    PipelineConfig {
        region: RegionName::try_new("eu").unwrap(),
        zones: [zone("a"), zone("b")].into_iter().collect(),
        evaluator: EvaluatorConfig::default(),
        delta: DeltaConfig::default(),
        fraction_guard: true,
    }
}

struct Fx {
    p: RegionPipeline,
    versions: MonotonicCounter,
    start: Instant,
    now: Instant,
}

impl Fx {
    fn new() -> Self {
        let start = t0();
        let p = RegionPipeline::rebuild(config(), &region_state(), start);
        Self {
            p,
            versions: MonotonicCounter::default(),
            start,
            now: start,
        }
    }

    /// Run every timer up to `at` (from the start); return the outputs with their times.
    fn run_to(&mut self, at: Duration) -> Vec<(Duration, Output)> {
        let target = self.start + at;
        let mut out = Vec::new();
        while let Some(due) = self.p.poll_timeout().filter(|t| *t <= target) {
            self.now = due.max(self.now);
            self.p.handle_timeout(self.now, &mut self.versions);
            out.extend(
                self.p
                    .take_outputs()
                    .into_iter()
                    .map(|o| (self.now - self.start, o)),
            );
        }
        self.now = target;
        out
    }

    fn sample(&mut self, id: &str, observation: Observation) {
        let sample = Sample {
            instance: InstanceId::try_new(id).unwrap(),
            reporter: Reporter::Node(NodeName::try_new("n").unwrap()),
            observation,
        };
        self.p.handle_sample(self.now, sample).unwrap();
    }
}

fn releases(out: &[(Duration, Output)], z: &str) -> Vec<(Duration, ReleasedView)> {
    out.iter()
        .filter_map(|(t, o)| match o {
            Output::Release(v) if v.view.key.zone == zone(z) => Some((*t, (**v).clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_rebuilt_region_publishes_every_instance_at_full_weight() {
    // Goal: a failover alone moves no traffic: everything routed, unknown, full weight.
    let mut fx = Fx::new();
    let out = fx.run_to(d::ADMIT_WINDOW);
    let a = releases(&out, "a");
    assert_eq!(a.len(), 1);
    let view = &a[0].1.view;
    assert_eq!(
        view.key,
        ViewKey {
            service: ServiceName::try_new("pay").unwrap(),
            zone: zone("a")
        }
    );
    assert_eq!(view.endpoints.len(), 4);
    assert!(
        view.endpoints
            .values()
            .all(|e| e.status == EndpointStatus::Unknown && e.weight == Weight::DEFAULT)
    );
}

#[test]
fn a_refused_connection_is_released_as_a_withdrawal_within_its_window() {
    let mut fx = Fx::new();
    fx.run_to(d::ADMIT_WINDOW);
    let at = fx.now - fx.start;
    fx.sample(
        "pay-a-1",
        Observation::Probe {
            health: Health::Refused,
            detail: None,
        },
    );
    let out = fx.run_to(at + Duration::from_secs(1));
    let a = releases(&out, "a");
    assert!(!a.is_empty());
    let (t, first) = &a[0];
    assert!(*t - at <= d::WITHDRAW_WINDOW, "took {:?}", *t - at);
    assert!(
        !first
            .view
            .routes_to(&InstanceId::try_new("pay-a-1").unwrap())
    );
    assert!(out.iter().any(|(_, o)| matches!(o, Output::Transition(_))));
}

#[test]
fn a_check_failing_every_replica_degrades_the_service_declared_and_alarmed() {
    // Goal: claim 3, end to end through the pure pipeline.
    let mut fx = Fx::new();
    fx.run_to(d::ADMIT_WINDOW);
    let start = fx.now - fx.start;
    let mut out = Vec::new();
    for s in 0..10u64 {
        for (i, z) in [(1, "a"), (2, "a"), (3, "b"), (4, "b")] {
            let id = format!("pay-{z}-{i}");
            fx.sample(
                &id,
                Observation::Probe {
                    health: Health::Fail,
                    detail: Some("503".into()),
                },
            );
            fx.sample(
                &id,
                Observation::Passive {
                    requests: 100,
                    errors: 90,
                },
            );
        }
        out.extend(fx.run_to(start + Duration::from_secs(s + 1)));
    }
    let guard = out
        .iter()
        .filter(|(_, o)| matches!(o, Output::Alarm(assembler::Effect::GuardEngaged { .. })))
        .count();
    assert_eq!(guard, 2, "both zones alarmed");
    assert!(out.iter().any(|(_, o)| matches!(
        o,
        Output::Alarm(assembler::Effect::LastEligibleWithdrawn { .. })
    )));
    let last = releases(&out, "a").pop().expect("releases").1;
    assert_eq!(last.view.endpoints.len(), 4, "the full set is kept");
    assert!(
        last.view
            .endpoints
            .values()
            .all(|e| e.status == EndpointStatus::Disregarded)
    );
    assert_eq!(
        last.view.markers.health_disregarded,
        [zone("a"), zone("b")].into_iter().collect()
    );
    // Never, at any release, did a zone route nothing.
    for z in ["a", "b"] {
        for (_, r) in releases(&out, z) {
            for zz in ["a", "b"] {
                assert!(
                    r.view.routed_in(&zone(zz)) > 0,
                    "zone {zz} emptied in a release to {z}"
                );
            }
        }
    }
}

#[test]
fn an_evacuation_resumes_where_the_previous_leader_left_it() {
    let now = t0();
    let mut state = region_state();
    let mut old = RegionPipeline::rebuild(config(), &state, now);
    let intent = EvacuationIntent::Evacuate { manual: true };
    assert!(old.check_evacuation(&zone("a"), intent).is_ok());
    let applied = state
        .apply(Stamped {
            at_ms: 3,
            command: Command::Evacuation {
                zone: zone("a"),
                intent,
            },
        })
        .unwrap();
    old.handle_applied(now, &applied, &state);
    // Two steps out, recorded as the leader records them.
    let mut versions = MonotonicCounter::default();
    let later = now + d::EVACUATION_STEP_INTERVAL;
    old.handle_timeout(later, &mut versions);
    let record = old.evacuation_record(&zone("a")).unwrap();
    assert_eq!(
        u32::from(record.moved.get()),
        2 * u32::from(d::EVACUATION_STEP.get())
    );
    state
        .apply(Stamped {
            at_ms: 4,
            command: Command::EvacuationProgress {
                zone: zone("a"),
                progress: Some(record),
            },
        })
        .unwrap();
    // A new leader rebuilds: the share already moved stays moved.
    let new = RegionPipeline::rebuild(config(), &state, later);
    assert_eq!(new.evacuation_record(&zone("a")), Some(record));
    // Evacuating the other zone too would leave none: refused before commit.
    assert!(
        new.check_evacuation(&zone("b"), EvacuationIntent::Evacuate { manual: false })
            .is_err()
    );
    assert!(
        new.check_evacuation(&zone("a"), EvacuationIntent::CompleteShiftBack)
            .is_err(),
        "nothing is awaiting completion yet"
    );
}

#[test]
fn a_fraction_override_replaces_the_contracts_floor() {
    let now = t0();
    let mut state = region_state();
    let policy = crate::state::ServicePolicyRecord {
        min_healthy_override: Some(waymark_core::units::Permille::saturating(1000)),
        ..Default::default()
    };
    let mut p = RegionPipeline::rebuild(config(), &state, now);
    let applied = state
        .apply(Stamped {
            at_ms: 3,
            command: Command::SetPolicy {
                service: ServiceName::try_new("pay").unwrap(),
                policy,
            },
        })
        .unwrap();
    p.handle_applied(now, &applied, &state);
    let mut versions = MonotonicCounter::default();
    p.handle_timeout(now + d::ADMIT_WINDOW, &mut versions);
    let floors: Vec<u32> = p
        .take_outputs()
        .into_iter()
        .filter_map(|o| match o {
            Output::Release(v) => v.view.markers.zone_floor.get(&zone("a")).copied(),
            _ => None,
        })
        .collect();
    // With a floor of 100%, both instances of zone a are its floor.
    assert!(floors.contains(&2), "floors released: {floors:?}");
}

// --- tier 2 and region failover ---

const STEP: Duration = d::REGION_FAILOVER_STEP_INTERVAL;

fn peer(name: &str) -> RegionName {
    RegionName::try_new(name).unwrap()
}

fn pay() -> ServiceName {
    ServiceName::try_new("pay").unwrap()
}

fn remote(id: &str, last: u8) -> RemoteEndpoint {
    RemoteEndpoint {
        instance: InstanceId::try_new(id).unwrap(),
        address: Address {
            ip: IpAddr::V4(Ipv4Addr::new(10, 9, 0, last)),
            port: 8080,
        },
        zone: zone("z"),
        weight: Weight::DEFAULT,
        status: EndpointStatus::Eligible,
        verdict: waymark_core::eligibility::Verdict::Eligible,
    }
}

/// The pipeline with peer regions `us-east` (`pay-us`) and `ap-south` (`pay-ap`) fed in,
/// and the desired state it was built from.
fn with_peers() -> (Fx, DesiredState) {
    let mut fx = Fx::new();
    let now = fx.now;
    fx.p.handle_remote(now, &pay(), peer("us-east"), vec![remote("pay-us", 1)]);
    fx.p.handle_remote(now, &pay(), peer("ap-south"), vec![remote("pay-ap", 2)]);
    fx.run_to(d::ADMIT_WINDOW);
    (fx, region_state())
}

fn failover_command(intent: RegionFailoverIntent) -> Command {
    Command::RegionFailover {
        region: peer("us-east"),
        intent,
        actor: "ops@example".into(),
        reason: "us-east front door failing its probe".into(),
    }
}

/// Commit `command` and let the pipeline follow it, as the leader does.
fn commit(fx: &mut Fx, state: &mut DesiredState, command: Command) {
    let applied = state.apply(Stamped { at_ms: 10, command }).unwrap();
    let now = fx.now;
    fx.p.handle_applied(now, &applied, state);
}

/// (priority, weight) of an endpoint in each release to zone `a`, in order.
fn placements(out: &[(Duration, Output)], id: &str) -> Vec<(u32, u32)> {
    let id = InstanceId::try_new(id).unwrap();
    releases(out, "a")
        .iter()
        .filter_map(|(_, r)| r.view.endpoints.get(&id))
        .map(|e| (e.priority, e.weight.get()))
        .collect()
}

#[test]
fn peer_region_endpoints_reach_the_views_as_tier_two() {
    let mut fx = Fx::new();
    fx.run_to(d::ADMIT_WINDOW);
    let at = fx.now - fx.start;
    let now = fx.now;
    fx.p.handle_remote(now, &pay(), peer("us-east"), vec![remote("pay-us", 1)]);
    let out = fx.run_to(at + d::ADMIT_WINDOW);
    let a = releases(&out, "a");
    let last = &a.last().expect("the remote endpoint is released").1.view;
    let e = &last.endpoints[&InstanceId::try_new("pay-us").unwrap()];
    assert_eq!(
        (e.tier, e.priority, &e.region),
        (Tier::Remote, 2, &peer("us-east"))
    );
    // An empty list forgets the region again.
    let now = fx.now;
    fx.p.handle_remote(now, &pay(), peer("us-east"), vec![]);
    let out = fx.run_to(at + d::ADMIT_WINDOW * 3);
    let last = releases(&out, "a").pop().expect("released again").1;
    assert_eq!(last.view.endpoints.len(), 4);
}

#[test]
fn a_manual_region_failover_steps_weights_down_and_ranks_the_region_last() {
    // Goal: ADR-13/14 end to end — capped steps over time, never removed, last in the end.
    let (mut fx, mut state) = with_peers();
    let intent = RegionFailoverIntent::Failover { manual: true };
    assert_eq!(fx.p.check_region_failover(&peer("us-east"), intent), Ok(()));
    let at = fx.now - fx.start;
    commit(&mut fx, &mut state, failover_command(intent));
    let out = fx.run_to(at + STEP * 4);
    assert_eq!(
        placements(&out, "pay-us"),
        vec![(2, 75), (2, 50), (2, 25), (3, 100)]
    );
    assert!(placements(&out, "pay-ap").iter().all(|p| *p == (2, 100)));
    // Each step waited its interval.
    let times: Vec<Duration> = releases(&out, "a").iter().map(|(t, _)| *t).collect();
    assert!(times.windows(2).all(|w| w[1] - w[0] >= STEP), "{times:?}");
    let progress: Vec<u16> = out
        .iter()
        .filter_map(|(_, o)| match o {
            Output::Alarm(assembler::Effect::RegionFailoverProgress { moved, .. }) => {
                Some(moved.get())
            }
            _ => None,
        })
        .collect();
    assert_eq!(progress, vec![250, 500, 750, 1000]);
    let record = fx.p.region_failover_record(&peer("us-east")).unwrap();
    assert_eq!((record.moved, record.manual), (Permille::ONE, true));
    assert_eq!(record.actor, "ops@example");
}

#[test]
fn a_manual_region_shift_back_holds_one_step_short_until_completed() {
    let (mut fx, mut state) = with_peers();
    let at = fx.now - fx.start;
    let out_intent = RegionFailoverIntent::Failover { manual: true };
    commit(&mut fx, &mut state, failover_command(out_intent));
    fx.run_to(at + STEP * 4);
    let back = RegionFailoverIntent::ShiftBack;
    commit(&mut fx, &mut state, failover_command(back));
    let out = fx.run_to(at + STEP * 10);
    assert_eq!(placements(&out, "pay-us"), vec![(2, 25), (2, 50), (2, 75)]);
    let record = fx.p.region_failover_record(&peer("us-east")).unwrap();
    assert!(
        record.awaiting_completion && record.moved.get() == 250,
        "{record:?}"
    );
    assert_eq!(fx.p.poll_timeout(), None, "holding: nothing scheduled");
    let complete = RegionFailoverIntent::CompleteShiftBack;
    assert_eq!(
        fx.p.check_region_failover(&peer("us-east"), complete),
        Ok(())
    );
    commit(&mut fx, &mut state, failover_command(complete));
    let out = fx.run_to(at + STEP * 11);
    assert_eq!(placements(&out, "pay-us"), vec![(2, 100)]);
    assert_eq!(fx.p.region_failover_record(&peer("us-east")), None);
    assert_eq!(
        fx.p.check_region_failover(&peer("us-east"), complete),
        Err(EvacuationError::RegionNotFailedOver {
            region: "us-east".into()
        })
    );
}

#[test]
fn a_region_failover_resumes_where_the_previous_leader_left_it() {
    let now = t0();
    let mut state = region_state();
    let mut old = RegionPipeline::rebuild(config(), &state, now);
    let intent = RegionFailoverIntent::Failover { manual: true };
    let applied = state
        .apply(Stamped {
            at_ms: 3,
            command: failover_command(intent),
        })
        .unwrap();
    old.handle_applied(now, &applied, &state);
    let mut versions = MonotonicCounter::default();
    let later = now + STEP;
    old.handle_timeout(later, &mut versions);
    let record = old.region_failover_record(&peer("us-east")).unwrap();
    assert_eq!(record.moved.get(), 500);
    assert_eq!(record.reason, "us-east front door failing its probe");
    state
        .apply(Stamped {
            at_ms: 4,
            command: Command::RegionFailoverProgress {
                region: peer("us-east"),
                progress: Some(record.clone()),
            },
        })
        .unwrap();
    // A new leader rebuilds from the decoded state: the share already moved stays moved.
    let decoded: DesiredState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let mut new = RegionPipeline::rebuild(config(), &decoded, later);
    assert_eq!(new.region_failover_record(&peer("us-east")), Some(record));
    new.handle_remote(later, &pay(), peer("us-east"), vec![remote("pay-us", 1)]);
    new.handle_timeout(later + d::ADMIT_WINDOW, &mut versions);
    let out: Vec<(Duration, Output)> = new
        .take_outputs()
        .into_iter()
        .map(|o| (Duration::ZERO, o))
        .collect();
    assert_eq!(placements(&out, "pay-us").last(), Some(&(2, 50)));
    // And it keeps stepping from there, one interval after the rebuild.
    new.handle_timeout(later + STEP, &mut versions);
    let resumed = new.region_failover_record(&peer("us-east")).unwrap();
    assert_eq!(resumed.moved.get(), 750);
}

#[test]
fn this_region_cannot_be_failed_over() {
    let fx = Fx::new();
    let intent = RegionFailoverIntent::Failover { manual: false };
    assert_eq!(
        fx.p.check_region_failover(&peer("eu"), intent),
        Err(EvacuationError::OwnRegion {
            region: "eu".into()
        })
    );
}

#[test]
fn under_delivery_pressure_admissions_are_shed_declared_and_withdrawals_still_leave() {
    // Goal: claim 2 — the authority's driver reports slow delivery (a slow Publish commit);
    // admissions wait, the episode is declared, and a withdrawal still leaves in its window.
    let mut fx = Fx::new();
    fx.run_to(d::ADMIT_WINDOW);
    let at = fx.now - fx.start;
    fx.p.handle_pressure(fx.now, true);
    let pass = Observation::Probe {
        health: Health::Pass,
        detail: None,
    };
    fx.sample("pay-b-3", pass); // unknown → eligible: an admission-class change
    fx.sample(
        "pay-a-1",
        Observation::Probe {
            health: Health::Refused,
            detail: None,
        },
    );
    let out = fx.run_to(at + d::ADMIT_WINDOW * 3);
    let a = releases(&out, "a");
    let (t, first) = a.first().expect("the withdrawal was released");
    assert!(*t - at <= d::WITHDRAW_WINDOW, "took {:?}", *t - at);
    assert!(
        !first
            .view
            .routes_to(&InstanceId::try_new("pay-a-1").unwrap())
    );
    assert!(
        out.iter()
            .any(|(_, o)| matches!(o, Output::Shed(delta::Effect::ShedStarted { .. }))),
        "the shed episode is declared"
    );
    // Nothing but the withdrawal was released while the pressure lasted (one report holds
    // for PRESSURE_HOLD); the admission followed once it was over.
    let admitted = |v: &ReleasedView| {
        v.view
            .endpoints
            .values()
            .any(|e| e.instance.as_str() == "pay-b-3" && e.status != EndpointStatus::Unknown)
    };
    assert!(
        a.iter()
            .filter(|(t, _)| *t - at < delta::PRESSURE_HOLD)
            .all(|(_, v)| !admitted(v)),
        "the admission waited"
    );
    let late = fx.run_to(at + delta::PRESSURE_HOLD + d::ADMIT_WINDOW * 4);
    assert!(
        releases(&out, "b")
            .iter()
            .chain(releases(&late, "b").iter())
            .any(|(t, v)| *t - at >= delta::PRESSURE_HOLD && admitted(v)),
        "the admission left after the hold"
    );
}

#[test]
fn samples_handled_together_end_where_one_by_one_ends() {
    // Goal: assembling once per run of samples changes when views are built, never what
    // they hold: same transitions, same final views, the same refusals.
    let observations = [
        ("pay-a-1", Health::Refused),
        ("pay-a-2", Health::Pass),
        ("pay-b-3", Health::Fail),
        ("pay-gone", Health::Pass),
        ("pay-a-1", Health::Pass),
        ("pay-b-4", Health::Refused),
    ];
    let samples: Vec<Sample> = observations
        .iter()
        .map(|(id, health)| Sample {
            instance: InstanceId::try_new(*id).unwrap(),
            reporter: Reporter::Node(NodeName::try_new("n").unwrap()),
            observation: Observation::Probe {
                health: *health,
                detail: None,
            },
        })
        .collect();
    let (mut single, mut batched) = (Fx::new(), Fx::new());
    for fx in [&mut single, &mut batched] {
        fx.run_to(d::ADMIT_WINDOW);
    }
    let at = single.now - single.start;
    let one_by_one: Vec<String> = samples
        .iter()
        .filter_map(|s| single.p.handle_sample(single.now, s.clone()).err())
        .map(|e| e.to_string())
        .collect();
    let together: Vec<String> = batched
        .p
        .handle_samples(batched.now, samples)
        .into_iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(one_by_one.len(), 1, "the unregistered instance");
    assert_eq!(together, one_by_one);
    let transitions = |out: &[(Duration, Output)]| -> Vec<String> {
        out.iter()
            .filter_map(|(_, o)| match o {
                Output::Transition(t) => Some(format!(
                    "{} {:?} -> {:?} by {:?}",
                    t.instance, t.from, t.eligibility, t.rule
                )),
                _ => None,
            })
            .collect()
    };
    let mut single_out = single
        .p
        .take_outputs()
        .into_iter()
        .map(|o| (at, o))
        .collect::<Vec<_>>();
    let mut batched_out = batched
        .p
        .take_outputs()
        .into_iter()
        .map(|o| (at, o))
        .collect::<Vec<_>>();
    single_out.extend(single.run_to(at + Duration::from_secs(30)));
    batched_out.extend(batched.run_to(at + Duration::from_secs(30)));
    assert!(!transitions(&single_out).is_empty());
    assert_eq!(transitions(&single_out), transitions(&batched_out));
    for z in ["a", "b"] {
        let last =
            |out: &[(Duration, Output)]| releases(out, z).last().map(|(_, v)| v.view.clone());
        assert!(last(&single_out).is_some());
        assert_eq!(last(&single_out), last(&batched_out), "zone {z}");
    }
}
