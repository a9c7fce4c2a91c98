//! Per-class evidence: the decaying failure score, silence, and caller aggregation.
//!
//! The score is an exponentially weighted failure rate in continuous time: each sample
//! moves it toward its value (1 = failed, 0 = passed) by `alpha = 1 - 2^(-dt / half_life)`,
//! where `dt` is the time since the class's previous sample, capped at the class interval.
//! Samples arriving faster than the interval (two probers, many callers) therefore each
//! count for less, so the rate of evidence, not its volume, sets the pace, and a sample
//! after a long silence counts as one interval's worth, never more.
//!
//! Passive evidence is aggregated per caller first: the class's value is the share of
//! recent, informative callers that saw the instance fail. One caller is one vote however
//! many requests it sent (ADR-04, ADR-15).

use std::time::{Duration, Instant};

use crate::audit::truncate_detail;
use crate::contract::alpha;
use crate::model::{Health, Reporter, SelfReport};

/// The evidence held for one class of one instance.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClassState {
    /// Decaying failure score in `[0, 1]`.
    pub(crate) score: f64,
    /// When the last informative sample arrived.
    pub(crate) last_at: Option<Instant>,
    /// Who sent it.
    pub(crate) last_reporter: Option<Reporter>,
    /// What it said, kept as data and rendered only when someone asks.
    pub(crate) last_seen: Option<LastSeen>,
}

/// The last observation of a class, stored without formatting (the hot path never
/// allocates for it; `explain` renders it).
#[derive(Debug, Clone)]
pub(crate) enum LastSeen {
    Probe {
        health: Health,
        detail: Option<String>,
    },
    SelfReport(SelfReport),
    Passive {
        requests: u64,
        errors: u64,
        share: f64,
        callers: usize,
    },
}

impl LastSeen {
    /// One line for operators, with any free text truncated.
    pub(crate) fn summary(&self) -> String {
        match self {
            Self::Probe {
                health,
                detail: Some(text),
            } => format!("{health:?}: {}", truncate_detail(text)),
            Self::Probe {
                health,
                detail: None,
            } => format!("{health:?}"),
            Self::SelfReport(SelfReport::Ready) => "ready".to_owned(),
            Self::SelfReport(SelfReport::NotReady { detail }) => {
                format!("not ready: {}", truncate_detail(detail))
            }
            Self::SelfReport(SelfReport::Draining) => "draining".to_owned(),
            Self::SelfReport(SelfReport::Dependency { name, status }) => {
                format!("dependency {name}: {status:?}")
            }
            Self::Passive {
                requests,
                errors,
                share,
                callers,
            } => {
                format!("{errors}/{requests} errors; {share:.2} of {callers} callers failing")
            }
        }
    }
}

/// Keep at most a little more than what will be shown of a free-text detail.
pub(crate) fn bounded(mut text: String) -> String {
    if text.len() > 2 * crate::audit::DETAIL_LEN_MAX {
        text = truncate_detail(&text);
    }
    text
}

impl ClassState {
    /// Fold one sample of value `failed` in.
    pub(crate) fn push(
        &mut self,
        now: Instant,
        failed: f64,
        interval: Duration,
        half_life: Duration,
    ) {
        let elapsed = self
            .last_at
            .map_or(interval, |at| now.saturating_duration_since(at));
        let a = alpha(elapsed, interval, half_life);
        self.score += a * (failed - self.score);
        self.score = self.score.clamp(0.0, 1.0);
        self.last_at = Some(now);
    }

    /// Whether no sample arrived within `silence_after` of `now`.
    pub(crate) fn is_silent(&self, now: Instant, silence_after: Duration) -> bool {
        self.last_at
            .is_none_or(|at| now.saturating_duration_since(at) > silence_after)
    }

    /// When this class falls silent, if it has spoken.
    pub(crate) fn silence_deadline(&self, silence_after: Duration) -> Option<Instant> {
        self.last_at.map(|at| at + silence_after)
    }
}

/// One caller's latest load report about an instance.
#[derive(Debug, Clone)]
struct CallerReport {
    reporter: Reporter,
    at: Instant,
    failing: bool,
    requests: u64,
}

/// The callers heard about one instance within a window: how many, how many of them saw
/// it fail, and how many requests their latest reports carried together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Population {
    pub(crate) callers: u32,
    pub(crate) failing: u32,
    pub(crate) requests: u64,
}

impl Population {
    /// The share of callers that saw failure (zero when nobody was heard).
    pub(crate) fn failing_share(self) -> f64 {
        if self.callers == 0 {
            0.0
        } else {
            f64::from(self.failing) / f64::from(self.callers)
        }
    }
}

/// Recent callers' verdicts about one instance, one vote each.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallerPanel {
    reports: Vec<CallerReport>,
}

impl CallerPanel {
    /// Record one caller's report, forgetting the oldest caller beyond `max`.
    /// Reports below `min_requests` are not evidence and leave the panel untouched.
    pub(crate) fn record(
        &mut self,
        now: Instant,
        reporter: &Reporter,
        requests: u64,
        failing: bool,
        max: usize,
    ) {
        if let Some(r) = self.reports.iter_mut().find(|r| &r.reporter == reporter) {
            r.at = now;
            r.failing = failing;
            r.requests = requests;
            return;
        }
        if self.reports.len() >= max {
            let oldest = self
                .reports
                .iter()
                .enumerate()
                .min_by_key(|(_, r)| r.at)
                .map(|(i, _)| i)
                .expect("a full panel is not empty");
            self.reports.swap_remove(oldest);
        }
        self.reports.push(CallerReport {
            reporter: reporter.clone(),
            at: now,
            failing,
            requests,
        });
    }

    /// The callers heard within `window` of `now`.
    pub(crate) fn population(&self, now: Instant, window: Duration) -> Population {
        self.reports
            .iter()
            .filter(|r| now.saturating_duration_since(r.at) <= window)
            .fold(Population::default(), |p, r| Population {
                callers: p.callers.saturating_add(1),
                failing: p.failing.saturating_add(u32::from(r.failing)),
                requests: p.requests.saturating_add(r.requests),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NodeName;

    #[allow(clippy::disallowed_methods)] // tests need one real anchor instant
    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn one_interval_of_half_life_moves_the_score_half_way() {
        let s = Duration::from_secs(1);
        assert!((alpha(s, s, s) - 0.5).abs() < 1e-9);
        // A long silence counts as one interval, never more.
        assert!((alpha(Duration::from_secs(600), s, s) - 0.5).abs() < 1e-9);
        assert_eq!(alpha(Duration::ZERO, s, s), 0.0);
    }

    #[test]
    fn a_caller_has_one_vote_however_often_it_reports() {
        let now = t0();
        let mut panel = CallerPanel::default();
        let loud = Reporter::Node(NodeName::try_new("loud").unwrap());
        let quiet = Reporter::Node(NodeName::try_new("quiet").unwrap());
        for _ in 0..100 {
            panel.record(now, &loud, 1_000_000, true, 8);
        }
        panel.record(now, &quiet, 10, false, 8);
        let heard = panel.population(now, Duration::from_secs(3));
        assert_eq!((heard.failing_share(), heard.callers), (0.5, 2));
        // A caller's requests are its latest report's, not the sum of its reports.
        assert_eq!(heard.requests, 1_000_010);
    }

    #[test]
    fn the_panel_forgets_the_oldest_caller_when_full() {
        let now = t0();
        let mut panel = CallerPanel::default();
        for i in 0..3u64 {
            let r = Reporter::Node(NodeName::try_new(format!("n{i}")).unwrap());
            panel.record(now + Duration::from_secs(i), &r, 10, i == 0, 2);
        }
        // n0 (the only failing one) was the oldest and is gone.
        let heard = panel.population(now + Duration::from_secs(3), Duration::from_secs(10));
        assert_eq!((heard.failing, heard.callers), (0, 2));
    }
}
