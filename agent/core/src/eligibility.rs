//! Eligibility: the evaluator's verdict per instance, and the rule that produced it.
//!
//! Three verdicts keep an instance in rotation (`Eligible`, `Degraded`, `Unknown`); three
//! take it out (`Ineligible`, `Quarantined`, `Draining`). `Unknown` is never reported as
//! verified-healthy: it is routed because silence is a fact about the observer, not the
//! instance (ADR-05). `Draining` covers the deliberate exits (terminating, maintenance,
//! self-declared) that Envoy knows as `DRAINING`.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::model::EvidenceClass;
use crate::units::Weight;

/// The verdict for one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eligibility {
    /// Routed at `weight`.
    Eligible {
        /// The published weight (slow start included).
        weight: Weight,
    },
    /// Routed at a reduced weight, for the stated cause.
    Degraded {
        /// The published, reduced weight.
        weight: Weight,
        /// Why it is reduced.
        cause: DegradeCause,
    },
    /// Routed, but no class has spoken within its interval.
    Unknown {
        /// The published weight.
        weight: Weight,
    },
    /// Withdrawn, for the stated reason.
    Ineligible {
        /// Why.
        reason: IneligibleReason,
    },
    /// Withdrawn for flapping until `until`.
    Quarantined {
        /// When the quarantine ends.
        until: Instant,
    },
    /// Leaving deliberately: no new traffic.
    Draining {
        /// Who asked.
        cause: DrainCause,
    },
}

/// An [`Eligibility`] as data: what audit records and `explain` carry, so that tools read
/// fields rather than parse text. Only the field that qualifies the verdict is present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EligibilityRecord {
    /// The coarse verdict.
    pub verdict: Verdict,
    /// The published weight, when routed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<Weight>,
    /// Why the weight is reduced, when degraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degrade_cause: Option<DegradeCause>,
    /// Why it is withdrawn, when ineligible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ineligible_reason: Option<IneligibleReason>,
    /// Who asked, when draining.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_cause: Option<DrainCause>,
    /// How long the quarantine had left, when quarantined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined_for_ms: Option<u64>,
}

/// Why an instance is routed at reduced weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DegradeCause {
    /// One class reports failure and no other class agrees.
    Uncorroborated,
    /// A declared dependency is degraded (weight-reduction authority).
    Dependency,
}

/// Why an instance is withdrawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IneligibleReason {
    /// Connection refused or process gone: the fast path, no decay.
    HardFailure,
    /// A soft failure, corroborated (or from the only class the profile provides).
    SoftFailure,
    /// A non-shared dependency with unreadiness authority is down.
    Dependency,
    /// Lease expired, deleted, or deregistered: it will not come back under this id.
    Retired,
}

/// Why an instance is draining.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DrainCause {
    /// The orchestrator is terminating it.
    Terminating,
    /// The instance said it is shutting down.
    SelfReported,
    /// An operator put it in maintenance.
    Maintenance,
}

/// The coarse verdict, without weights or times: what transitions are counted between.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// See [`Eligibility::Eligible`].
    Eligible,
    /// See [`Eligibility::Degraded`].
    Degraded,
    /// See [`Eligibility::Unknown`].
    Unknown,
    /// See [`Eligibility::Ineligible`].
    Ineligible,
    /// See [`Eligibility::Quarantined`].
    Quarantined,
    /// See [`Eligibility::Draining`].
    Draining,
}

impl Verdict {
    /// Every verdict, in order.
    pub const ALL: [Self; 6] = [
        Self::Eligible,
        Self::Degraded,
        Self::Unknown,
        Self::Ineligible,
        Self::Quarantined,
        Self::Draining,
    ];

    /// The name used in logs, metrics and the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Eligible => "eligible",
            Self::Degraded => "degraded",
            Self::Unknown => "unknown",
            Self::Ineligible => "ineligible",
            Self::Quarantined => "quarantined",
            Self::Draining => "draining",
        }
    }

    /// Whether callers route to it.
    pub const fn is_routed(self) -> bool {
        matches!(self, Self::Eligible | Self::Degraded | Self::Unknown)
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl Eligibility ===

impl Eligibility {
    /// The coarse verdict.
    pub const fn verdict(&self) -> Verdict {
        match self {
            Self::Eligible { .. } => Verdict::Eligible,
            Self::Degraded { .. } => Verdict::Degraded,
            Self::Unknown { .. } => Verdict::Unknown,
            Self::Ineligible { .. } => Verdict::Ineligible,
            Self::Quarantined { .. } => Verdict::Quarantined,
            Self::Draining { .. } => Verdict::Draining,
        }
    }

    /// Whether callers route to it.
    pub const fn is_routed(&self) -> bool {
        self.verdict().is_routed()
    }

    /// This verdict as data, for audit records and the API; a quarantine's end is given
    /// as the time left after `at`.
    pub fn record(&self, at: Instant) -> EligibilityRecord {
        let mut r = EligibilityRecord {
            verdict: self.verdict(),
            weight: self.weight(),
            degrade_cause: None,
            ineligible_reason: None,
            drain_cause: None,
            quarantined_for_ms: None,
        };
        match *self {
            Self::Degraded { cause, .. } => r.degrade_cause = Some(cause),
            Self::Ineligible { reason } => r.ineligible_reason = Some(reason),
            Self::Draining { cause } => r.drain_cause = Some(cause),
            Self::Quarantined { until } => {
                let left = until.saturating_duration_since(at).as_millis();
                r.quarantined_for_ms = Some(u64::try_from(left).unwrap_or(u64::MAX));
            }
            Self::Eligible { .. } | Self::Unknown { .. } => {}
        }
        r
    }

    /// The published weight of a routed instance; `None` when withdrawn.
    pub const fn weight(&self) -> Option<Weight> {
        match self {
            Self::Eligible { weight }
            | Self::Degraded { weight, .. }
            | Self::Unknown { weight } => Some(*weight),
            _ => None,
        }
    }
}

/// Which evidence an instance's verdict currently rests on (ADR-04), reported per instance
/// and per service in the API, `explain`, metrics and the view.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceMode {
    /// Callers' outcomes are sufficient (the contract's `passive.primary` threshold is met):
    /// many callers failing withdraws on its own, probes run at the confirmation cadence.
    PassivePrimary,
    /// The active classes are primary and a second class is speaking that can corroborate
    /// a failure (or refute it: an uncorroborated failure only lowers the weight).
    ProbePrimary,
    /// At most one class is speaking: a verdict rests on that class alone.
    SingleClass,
}

impl EvidenceMode {
    /// Every mode, strongest first.
    pub const ALL: [Self; 3] = [Self::PassivePrimary, Self::ProbePrimary, Self::SingleClass];

    /// The stable label used in metrics and the API.
    pub const fn label(self) -> &'static str {
        match self {
            Self::PassivePrimary => "passive_primary",
            Self::ProbePrimary => "probe_primary",
            Self::SingleClass => "single_class",
        }
    }
}

impl std::fmt::Display for EvidenceMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// The rule of the decision path that produced a verdict, for audit and `explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "rule")]
pub enum Rule {
    /// New, with no evidence yet: routed as unknown.
    Admitted,
    /// Lease expired, deleted or deregistered.
    Retired,
    /// An operator's maintenance mode.
    Maintenance,
    /// Orchestrator terminating, or the instance draining itself.
    Draining,
    /// Held out for flapping.
    FlapQuarantine,
    /// Connection refused or process gone.
    HardFailure {
        /// The class that saw it (`None` for orchestrator/agent lifecycle facts).
        class: Option<EvidenceClass>,
    },
    /// A non-shared dependency with unreadiness authority is down.
    DependencyUnreadiness,
    /// The score crossed removal and a second class agreed.
    Corroborated {
        /// The class that crossed removal.
        failing: EvidenceClass,
        /// The class that agreed.
        by: EvidenceClass,
    },
    /// Callers' outcomes are primary for this instance (its traffic is above the
    /// contract's `passive.primary` threshold) and enough distinct callers see it fail:
    /// the population is the corroboration (ADR-04).
    CallerPopulation {
        /// Callers that saw it fail.
        failing: u32,
        /// Callers heard.
        callers: u32,
    },
    /// The score crossed removal in the only class the profile provides.
    SingleClassProfile {
        /// That class.
        failing: EvidenceClass,
    },
    /// The score crossed removal but nothing corroborates it: weight reduced.
    Uncorroborated {
        /// The class that crossed removal.
        failing: EvidenceClass,
    },
    /// Still withdrawn: re-entry needs a low score held for the re-entry hold.
    AwaitingReentry,
    /// All classes silent while routed: unknown, kept in rotation.
    Silence,
    /// A degraded dependency lowers the weight.
    DependencyWeight,
    /// The evidence is good.
    Passing,
}

impl std::fmt::Display for Rule {
    /// The rule as operators read it: its name, then what qualifies it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let class = |c: Option<EvidenceClass>| c.map_or("lifecycle", EvidenceClass::as_str);
        match self {
            Self::Admitted => f.write_str("admitted"),
            Self::Retired => f.write_str("retired"),
            Self::Maintenance => f.write_str("maintenance"),
            Self::Draining => f.write_str("draining"),
            Self::FlapQuarantine => f.write_str("flap_quarantine"),
            Self::HardFailure { class: c } => write!(f, "hard_failure ({})", class(*c)),
            Self::DependencyUnreadiness => f.write_str("dependency_unreadiness"),
            Self::CallerPopulation { failing, callers } => {
                write!(
                    f,
                    "caller_population ({failing} of {callers} callers failing)"
                )
            }
            Self::Corroborated { failing, by } => {
                write!(
                    f,
                    "corroborated ({} failing, by {})",
                    failing.as_str(),
                    by.as_str()
                )
            }
            Self::SingleClassProfile { failing } => {
                write!(f, "single_class_profile ({} failing)", failing.as_str())
            }
            Self::Uncorroborated { failing } => {
                write!(f, "uncorroborated ({} failing)", failing.as_str())
            }
            Self::AwaitingReentry => f.write_str("awaiting_reentry"),
            Self::Silence => f.write_str("silence"),
            Self::DependencyWeight => f.write_str("dependency_weight"),
            Self::Passing => f.write_str("passing"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[allow(clippy::disallowed_methods)] // the one anchor instant of these tests
    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn an_eligibility_record_carries_only_the_field_that_qualifies_its_verdict() {
        // Goal: tools read a withdrawal's reason as a field, never from Debug text.
        let at = t0();
        let out = Eligibility::Ineligible {
            reason: IneligibleReason::HardFailure,
        }
        .record(at);
        let json = serde_json::to_value(out).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"verdict": "ineligible", "ineligible_reason": "hard_failure"})
        );
        assert_eq!(
            serde_json::from_value::<EligibilityRecord>(json).unwrap(),
            out
        );
        let degraded = Eligibility::Degraded {
            weight: Weight::DEFAULT,
            cause: DegradeCause::Dependency,
        }
        .record(at);
        assert_eq!(degraded.weight, Some(Weight::DEFAULT));
        assert_eq!(degraded.degrade_cause, Some(DegradeCause::Dependency));
        assert_eq!(degraded.ineligible_reason, None);
    }

    #[test]
    fn a_quarantine_record_says_how_long_it_had_left_when_recorded() {
        let at = t0();
        let until = at + Duration::from_secs(60);
        let r = Eligibility::Quarantined { until }.record(at + Duration::from_secs(15));
        assert_eq!(r.quarantined_for_ms, Some(45_000));
        let r = Eligibility::Quarantined { until }.record(until + Duration::from_secs(1));
        assert_eq!(
            r.quarantined_for_ms,
            Some(0),
            "an ended quarantine has none left"
        );
    }
}
