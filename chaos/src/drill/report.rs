//! What every drill's report shares: the plotted series (verdict counts over time, the
//! callers' error rate, propagation-time distributions, the drill's own events), progress
//! lines while it runs, and writing `report.json` + `report.html` into the run folder.
//!
//! A drill's report is its own struct (its figures differ) with a `plots: Plots` field;
//! [`finish`] writes both files and `waymark-drill report DIR` rebuilds the page from the
//! JSON alone.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

pub use crate::harness::evidence::counts_from_services;
use crate::traffic::{Answer, Outcome, ms};

/// How often [`StateSampler`] asks the authority.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// Everything a report page plots; times are ms since the drill's epoch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Plots {
    /// Instances by verdict (`eligible`, `degraded`, `unknown`, `ineligible`,
    /// `quarantined`, `draining`, `withdrawn`) as the authority published them.
    pub states: Vec<StateSample>,
    /// The callers' requests and errors per [`ERROR_BUCKET_MS`].
    pub errors: Vec<RateSample>,
    /// Distributions of times (propagation, recovery…), each plotted as a CDF.
    pub distributions: Vec<Distribution>,
    /// What the drill did, and when.
    pub events: Vec<Event>,
}

/// The width of one error-rate bucket.
pub const ERROR_BUCKET_MS: u64 = 1_000;

/// Verdict counts at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateSample {
    pub t_ms: u64,
    pub counts: BTreeMap<String, u64>,
}

/// Requests sent in `[t_ms, t_ms + ERROR_BUCKET_MS)` and how many failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateSample {
    pub t_ms: u64,
    pub requests: u64,
    pub errors: u64,
}

/// Named values in one unit (e.g. per-caller propagation times in ms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    pub name: String,
    pub unit: String,
    pub values: Vec<f64>,
}

/// One thing the drill did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub t_ms: u64,
    pub what: String,
}

/// Outcomes → requests and errors per second of send time, every bucket from the first to
/// the last request present (empty buckets as zeros, so a stall shows).
pub fn error_series(outcomes: &[Outcome]) -> Vec<RateSample> {
    let Some(last) = outcomes.iter().map(|o| o.at_ms).max() else {
        return Vec::new();
    };
    let buckets = (last / ERROR_BUCKET_MS + 1) as usize;
    let mut out: Vec<RateSample> = (0..buckets)
        .map(|i| RateSample {
            t_ms: i as u64 * ERROR_BUCKET_MS,
            requests: 0,
            errors: 0,
        })
        .collect();
    for o in outcomes {
        let b = &mut out[(o.at_ms / ERROR_BUCKET_MS) as usize];
        b.requests += 1;
        if !matches!(o.result, Answer::Ok { .. }) {
            b.errors += 1;
        }
    }
    out
}

/// The value below which `q` (0..=1) of `values` fall (nearest rank); `None` when empty.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// Samples the authority's verdict counts every [`SAMPLE_EVERY`] until stopped. It asks
/// each address in turn until one answers (any member serves the committed views), and
/// records nothing while none does — a gap in the plot is an authority that was down.
pub struct StateSampler {
    samples: Arc<Mutex<Vec<StateSample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StateSampler {
    /// Starts sampling `services` (all when empty) from `apis`.
    pub fn start(apis: Vec<SocketAddr>, services: Vec<String>, epoch: Instant) -> Self {
        let samples: Arc<Mutex<Vec<StateSample>>> = Arc::default();
        let sink = Arc::clone(&samples);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                for api in &apis {
                    let Ok(r) =
                        crate::harness::get_api(*api, "/v1/services", Duration::from_millis(400))
                            .await
                    else {
                        continue;
                    };
                    let Ok(body) = serde_json::from_str::<serde_json::Value>(&r.body) else {
                        continue;
                    };
                    if r.status != 200 {
                        continue;
                    }
                    let sample = StateSample {
                        t_ms: ms(epoch.elapsed()),
                        counts: counts_from_services(&body, &services),
                    };
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(sample);
                    break;
                }
            }
        });
        Self { samples, task }
    }

    /// Stops and returns what was sampled.
    pub fn stop(self) -> Vec<StateSample> {
        self.task.abort();
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Progress lines on stderr, stamped with the run time, and the same lines kept as the
/// report's events.
#[derive(Debug, Clone)]
pub struct Progress {
    drill: &'static str,
    epoch: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Progress {
    /// Progress of `drill`, timed from `epoch`.
    pub fn new(drill: &'static str, epoch: Instant) -> Self {
        Self {
            drill,
            epoch,
            events: Arc::default(),
        }
    }

    /// The epoch all times are measured from.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        ms(self.epoch.elapsed())
    }

    /// Prints a progress line (not kept as an event).
    pub fn say(&self, what: &str) {
        eprintln!(
            "[{:>7.1}s] {}: {what}",
            self.epoch.elapsed().as_secs_f64(),
            self.drill
        );
    }

    /// Prints a line and keeps it as an event of the report.
    pub fn event(&self, what: &str) {
        self.say(what);
        let e = Event {
            t_ms: self.now_ms(),
            what: what.to_owned(),
        };
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e);
    }

    /// Prints `line()` every `period` until the returned guard is dropped: a long phase
    /// (a 60-minute outage) shows it is alive and how the callers fare.
    pub fn heartbeat(
        &self,
        period: Duration,
        line: impl Fn() -> String + Send + 'static,
    ) -> Heartbeat {
        let me = self.clone();
        Heartbeat(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(Instant::now() + period, period);
            loop {
                tick.tick().await;
                me.say(&line());
            }
        }))
    }

    /// The events kept so far.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Stops its heartbeat when dropped.
#[derive(Debug)]
pub struct Heartbeat(tokio::task::JoinHandle<()>);

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Writes `report.json` and `report.html` into `run_dir`.
pub fn finish<R: Serialize>(run_dir: &Path, report: &R) -> anyhow::Result<()> {
    let value = serde_json::to_value(report).context("encoding the report")?;
    std::fs::write(
        run_dir.join("report.json"),
        serde_json::to_string_pretty(&value)?,
    )
    .with_context(|| format!("writing {}/report.json", run_dir.display()))?;
    let page = super::html::render(&value);
    std::fs::write(run_dir.join("report.html"), page)
        .with_context(|| format!("writing {}/report.html", run_dir.display()))?;
    Ok(())
}

/// Every outcome, one JSON object a line, in `<run dir>/outcomes.jsonl`.
pub fn write_outcomes(run_dir: &Path, outcomes: &[Outcome]) -> anyhow::Result<()> {
    let mut text = String::new();
    for o in outcomes {
        text.push_str(&serde_json::to_string(o)?);
        text.push('\n');
    }
    std::fs::write(run_dir.join("outcomes.jsonl"), text)
        .with_context(|| format!("writing {}/outcomes.jsonl", run_dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(at_ms: u64, ok: bool) -> Outcome {
        Outcome {
            at_ms,
            latency_ms: 1,
            result: if ok {
                Answer::Ok { instance: None }
            } else {
                Answer::Refused
            },
        }
    }

    #[test]
    fn error_series_buckets_by_second_and_keeps_empty_seconds() {
        let s = error_series(&[o(10, true), o(900, false), o(3_100, true)]);
        assert_eq!(s.len(), 4);
        assert_eq!((s[0].requests, s[0].errors), (2, 1));
        assert_eq!((s[1].requests, s[2].requests), (0, 0));
        assert_eq!((s[3].t_ms, s[3].requests, s[3].errors), (3_000, 1, 0));
        assert!(error_series(&[]).is_empty());
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.99), Some(99.0));
        assert_eq!(quantile(&v, 1.0), Some(100.0));
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn counts_sum_the_chosen_services() {
        let body = serde_json::json!([
            {"service": "a", "verdicts": {"eligible": 2, "unknown": 1}},
            {"service": "b", "verdicts": {"eligible": 3}},
        ]);
        let all = counts_from_services(&body, &[]);
        assert_eq!(all["eligible"], 5);
        assert_eq!(all["unknown"], 1);
        let only_b = counts_from_services(&body, &["b".into()]);
        assert_eq!(only_b.get("unknown"), None);
        assert_eq!(only_b["eligible"], 3);
    }
}
