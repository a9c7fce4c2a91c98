//! Properties of a term under arbitrary inputs: samples, time, proposal outcomes,
//! membership and the front-door signal in any order.

use proptest::prelude::*;
use waymark_core::model::{Health, Observation, Reporter, Sample};

use super::tests::{Fx, World, config, leased_state, node, pod, region, with_slow_probe, zone};
use super::*;
use crate::machine::Response;

#[derive(Debug, Clone)]
enum Op {
    Advance(u16),
    Sample { pod: usize, health: u8 },
    Written { pick: usize, outcome: u8 },
    Membership { probers: bool },
    Door { up: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u16..3_000).prop_map(Op::Advance),
        4 => (0usize..5, 0u8..4).prop_map(|(pod, health)| Op::Sample { pod, health }),
        3 => (any::<usize>(), 0u8..3).prop_map(|(pick, outcome)| Op::Written { pick, outcome }),
        1 => any::<bool>().prop_map(|probers| Op::Membership { probers }),
        1 => any::<bool>().prop_map(|up| Op::Door { up }),
    ]
}

const PODS: [(u8, &str); 4] = [(1, "a"), (2, "a"), (3, "b"), (4, "b")];

/// What a run produced, for comparing runs and checking invariants.
#[derive(Debug, PartialEq)]
struct Run {
    /// Each command with its time after the start, in ms.
    commands: Vec<(u64, LeaderCommand)>,
}

fn timed(fx: &Fx, commands: Vec<LeaderCommand>) -> Vec<(Duration, LeaderCommand)> {
    let at = fx.now - fx.start;
    commands.into_iter().map(|c| (at, c)).collect()
}

/// The invariants, checked on every command as it is taken.
struct Checker {
    hold: Duration,
    /// Proposals not yet reported back, oldest first.
    outstanding: Vec<(Purpose, Request)>,
    restart_committed: bool,
    out: Vec<(u64, LeaderCommand)>,
}

impl Checker {
    fn check(&mut self, commands: Vec<(Duration, LeaderCommand)>) -> Result<(), TestCaseError> {
        let lease = |p: &Purpose| matches!(p, Purpose::RestartLeases | Purpose::ExpireLeases);
        for (at, c) in commands {
            match &c {
                LeaderCommand::Publish(_) => {
                    prop_assert!(
                        at >= self.hold,
                        "published {at:?} into a hold of {:?}",
                        self.hold
                    );
                }
                LeaderCommand::Propose { purpose, request } => {
                    if *purpose == Purpose::ExpireLeases {
                        prop_assert!(self.restart_committed, "lease expiry before the restart");
                    }
                    if lease(purpose) {
                        prop_assert!(
                            !self.outstanding.iter().any(|(p, _)| lease(p)),
                            "two lease proposals in flight"
                        );
                    }
                    if let Purpose::Failover { region, .. } = purpose {
                        let same = |p: &Purpose| matches!(p, Purpose::Failover { region: r, .. } if r == region);
                        prop_assert!(
                            !self.outstanding.iter().any(|(p, _)| same(p)),
                            "two failovers of {region} in flight"
                        );
                    }
                    self.outstanding.push((purpose.clone(), request.clone()));
                }
                _ => {}
            }
            self.out.push((u64::try_from(at.as_millis()).unwrap(), c));
        }
        Ok(())
    }
}

/// Drive a term through `ops`, committing what it proposes when an op says so, and check
/// the invariants after every step.
fn run(ops: &[Op]) -> Result<Run, TestCaseError> {
    let mut world = World::new(with_slow_probe(leased_state()));
    let mut fx = Fx::new(config(1), &world);
    let mut c = Checker {
        hold: hold_for(world.state.registry()),
        outstanding: Vec::new(),
        restart_committed: false,
        out: Vec::new(),
    };
    let first = fx.run_to_timed(&world, Duration::ZERO);
    c.check(first)?;
    for op in ops {
        let commands = match op {
            Op::Advance(ms) => {
                let at = fx.now - fx.start + Duration::from_millis(u64::from(*ms));
                fx.run_to_timed(&world, at)
            }
            Op::Sample { pod: i, health } => {
                let instance = PODS
                    .get(*i)
                    .map_or_else(|| "pay-a-9".parse().unwrap(), |(n, z)| pod(*n, z).id);
                let health = [Health::Pass, Health::Fail, Health::Timeout, Health::Refused]
                    [usize::from(*health)];
                let sample = Sample {
                    instance,
                    reporter: Reporter::Node(node("n1")),
                    observation: Observation::Probe {
                        health,
                        detail: None,
                    },
                };
                // An unknown instance is refused, and the refusal changes nothing.
                let _ = fx.term.handle_sample(fx.now, sample);
                {
                    let taken = fx.term.take_commands();
                    timed(&fx, taken)
                }
            }
            Op::Written { pick, outcome } => {
                if c.outstanding.is_empty() {
                    continue;
                }
                let i = pick % c.outstanding.len();
                let (purpose, request) = c.outstanding.remove(i);
                let written =
                    [Written::Applied, Written::Refused, Written::Failed][usize::from(*outcome)];
                let mut commands = Vec::new();
                if written.committed() {
                    if purpose == Purpose::RestartLeases {
                        c.restart_committed = true;
                    }
                    let response = world.state.apply(request);
                    fx.term.handle_written(fx.now, purpose, written);
                    if let Response::Registry { outcome: Ok(done) } = response {
                        commands.extend(fx.term.take_commands());
                        fx.term.handle_applied(fx.now, &done, &world);
                    }
                } else {
                    fx.term.handle_written(fx.now, purpose, written);
                }
                commands.extend(fx.term.take_commands());
                timed(&fx, commands)
            }
            Op::Membership { probers } => {
                world.probers = if *probers {
                    vec![(node("pa"), zone("a")), (node("pb"), zone("b"))]
                } else {
                    Vec::new()
                };
                fx.term.handle_membership_changed();
                {
                    let taken = fx.term.take_commands();
                    timed(&fx, taken)
                }
            }
            Op::Door { up } => {
                world.doors = vec![(region("us"), *up)];
                Vec::new()
            }
        };
        c.check(commands)?;
    }
    Ok(Run { commands: c.out })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The hold, the lease order and one-in-flight hold whatever arrives when.
    #[test]
    fn a_terms_invariants_hold_under_any_inputs(ops in prop::collection::vec(op(), 1..120)) {
        run(&ops)?;
    }

    /// The same inputs give the same whole command sequence.
    #[test]
    fn a_term_is_deterministic(ops in prop::collection::vec(op(), 1..60)) {
        let a = run(&ops)?;
        let b = run(&ops)?;
        prop_assert_eq!(a, b);
    }
}
