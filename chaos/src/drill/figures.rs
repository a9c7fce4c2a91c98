//! Outcomes → figures → verdict, as plain functions (no clock, no I/O).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::traffic::{Answer, Outcome};

/// A half-open span of run time, `[start_ms, end_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Window {
    pub start_ms: u64,
    pub end_ms: u64,
}

impl Window {
    /// Whether a request sent at `at` and answered `latency` later was alive at any point
    /// of this window.
    fn overlaps(&self, o: &Outcome) -> bool {
        o.at_ms < self.end_ms && o.at_ms.saturating_add(o.latency_ms) >= self.start_ms
    }

    /// Whether a request was sent inside this window.
    fn sent_in(&self, o: &Outcome) -> bool {
        (self.start_ms..self.end_ms).contains(&o.at_ms)
    }
}

/// Requests sent in one phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PhaseFigures {
    pub requests: u64,
    pub errors: u64,
    /// errors / requests (0 when there were none).
    pub error_rate: f64,
    /// Errors by kind: `status_503`, `refused`, `failed`.
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Successful answers by the backend instance that gave them.
    pub answered_by: BTreeMap<String, u64>,
}

/// Figures for the requests sent in `window`, leaving out those alive during any of
/// `excluded` (they are counted by a separate call on that window).
pub fn phase(outcomes: &[Outcome], window: Window, excluded: &[Window]) -> PhaseFigures {
    let mut f = PhaseFigures::default();
    for o in outcomes
        .iter()
        .filter(|o| window.sent_in(o) && !excluded.iter().any(|x| x.overlaps(o)))
    {
        f.requests += 1;
        match &o.result {
            Answer::Ok { instance } => {
                let who = instance.clone().unwrap_or_else(|| "unnamed".to_owned());
                *f.answered_by.entry(who).or_default() += 1;
            }
            other => {
                f.errors += 1;
                let kind = match other {
                    Answer::Status { status } => format!("status_{status}"),
                    Answer::Refused => "refused".to_owned(),
                    _ => "failed".to_owned(),
                };
                *f.errors_by_kind.entry(kind).or_default() += 1;
            }
        }
    }
    f.error_rate = if f.requests == 0 {
        0.0
    } else {
        f.errors as f64 / f.requests as f64
    };
    f
}

/// Requests alive while `window` lasted (sent before it, or during it), wherever they
/// were sent from: what a restart cost the callers.
pub fn affected(outcomes: &[Outcome], window: Window) -> PhaseFigures {
    let everything = Window {
        start_ms: 0,
        end_ms: u64::MAX,
    };
    let inside: Vec<Outcome> = outcomes
        .iter()
        .filter(|o| window.overlaps(o))
        .cloned()
        .collect();
    phase(&inside, everything, &[])
}

/// What the outage drill must hold to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Budget {
    /// How much the error rate may rise over the pre-outage baseline (absolute, 0.01 = 1
    /// point).
    pub error_rate_margin: f64,
    /// Each phase must have at least this many requests for its rate to mean anything.
    pub min_requests: u64,
    /// A restarted agent must be ready, and a restarted Envoy routing, within this.
    pub restart_to_serving_ms: u64,
}

/// Pass, or fail with every reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub pass: bool,
    pub failures: Vec<String>,
}

/// The outage drill's verdict: the error rate during and after the outage stays within
/// the margin over the baseline, each phase saw enough traffic, the agent restarted from
/// its cache (not from the authority), and both restarts served within budget.
pub fn outage_verdict(
    before: &PhaseFigures,
    during: &PhaseFigures,
    after: &PhaseFigures,
    agent_from_cache: bool,
    restarts_ms: &[(&str, Option<u64>)],
    budget: &Budget,
) -> Verdict {
    let mut failures = Vec::new();
    for (name, f) in [("before", before), ("during", during), ("after", after)] {
        if f.requests < budget.min_requests {
            failures.push(format!(
                "{name}: {} requests, fewer than {}",
                f.requests, budget.min_requests
            ));
        }
    }
    let limit = before.error_rate + budget.error_rate_margin;
    for (name, f) in [("during", during), ("after", after)] {
        if f.error_rate > limit {
            failures.push(format!(
                "{name}: error rate {:.4} above the baseline {:.4} + margin {:.4}",
                f.error_rate, before.error_rate, budget.error_rate_margin
            ));
        }
    }
    if !agent_from_cache {
        failures.push("the restarted agent did not start from its cache".to_owned());
    }
    for (what, ms) in restarts_ms {
        match ms {
            None => failures.push(format!("{what}: never served again")),
            Some(ms) if *ms > budget.restart_to_serving_ms => failures.push(format!(
                "{what}: served after {ms} ms, budget {} ms",
                budget.restart_to_serving_ms
            )),
            Some(_) => {}
        }
    }
    Verdict {
        pass: failures.is_empty(),
        failures,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(at_ms: u64) -> Outcome {
        Outcome {
            at_ms,
            latency_ms: 5,
            result: Answer::Ok {
                instance: Some(format!("b{}", at_ms % 2)),
            },
        }
    }

    fn err(at_ms: u64, result: Answer) -> Outcome {
        Outcome {
            at_ms,
            latency_ms: 5,
            result,
        }
    }

    const BUDGET: Budget = Budget {
        error_rate_margin: 0.01,
        min_requests: 2,
        restart_to_serving_ms: 1_000,
    };

    #[test]
    fn phases_count_requests_errors_and_who_answered() {
        let outcomes = vec![ok(0), ok(1), err(2, Answer::Status { status: 503 }), ok(10)];
        let f = phase(
            &outcomes,
            Window {
                start_ms: 0,
                end_ms: 10,
            },
            &[],
        );
        assert_eq!(f.requests, 3);
        assert_eq!(f.errors, 1);
        assert!((f.error_rate - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(f.errors_by_kind["status_503"], 1);
        assert_eq!(f.answered_by["b0"], 1);
        assert_eq!(f.answered_by["b1"], 1);
        assert_eq!(
            phase(
                &[],
                Window {
                    start_ms: 0,
                    end_ms: 10
                },
                &[]
            )
            .error_rate,
            0.0
        );
    }

    #[test]
    fn a_restart_window_takes_requests_alive_in_it_out_of_the_phase() {
        // Sent at 95 and still waiting at 100 when Envoy was killed: the restart's, not
        // the phase's.
        let mut in_flight = err(95, Answer::Failed);
        in_flight.latency_ms = 10;
        let outcomes = vec![
            ok(50),
            in_flight,
            err(120, Answer::Refused),
            err(150, Answer::Refused),
            ok(250),
        ];
        let restart = Window {
            start_ms: 100,
            end_ms: 200,
        };
        let f = phase(
            &outcomes,
            Window {
                start_ms: 0,
                end_ms: 300,
            },
            &[restart],
        );
        assert_eq!((f.requests, f.errors), (2, 0));
        let r = affected(&outcomes, restart);
        assert_eq!((r.requests, r.errors), (3, 3));
        assert_eq!(r.errors_by_kind["refused"], 2);
    }

    #[test]
    fn the_verdict_holds_the_rate_to_the_baseline_plus_margin() {
        let clean = phase(
            &[ok(0), ok(1)],
            Window {
                start_ms: 0,
                end_ms: 2,
            },
            &[],
        );
        let fine = outage_verdict(
            &clean,
            &clean,
            &clean,
            true,
            &[("envoy", Some(500))],
            &BUDGET,
        );
        assert!(fine.pass, "{fine:?}");

        let worse = phase(
            &[ok(0), err(1, Answer::Status { status: 503 })],
            Window {
                start_ms: 0,
                end_ms: 2,
            },
            &[],
        );
        let v = outage_verdict(&clean, &worse, &clean, true, &[], &BUDGET);
        assert!(!v.pass);
        assert!(v.failures[0].starts_with("during: error rate"), "{v:?}");
    }

    #[test]
    fn the_verdict_fails_on_thin_traffic_a_cold_agent_or_a_slow_restart() {
        let clean = phase(
            &[ok(0), ok(1)],
            Window {
                start_ms: 0,
                end_ms: 2,
            },
            &[],
        );
        let thin = phase(
            &[ok(0)],
            Window {
                start_ms: 0,
                end_ms: 2,
            },
            &[],
        );
        let v = outage_verdict(
            &clean,
            &thin,
            &clean,
            false,
            &[("agent", Some(5_000)), ("envoy", None)],
            &BUDGET,
        );
        assert_eq!(v.failures.len(), 4, "{v:?}");
    }
}
