//! Health contracts: what a service promises to be observable by, and how to judge it.
//!
//! A [`HealthContract`] is written by a service's owner (or left at its defaults); only a
//! [`ValidContract`], produced by [`HealthContract::validate`], reaches the evaluator. The
//! validation enforces the design's hard lines at the door rather than at runtime:
//!
//! - unreadiness authority on a *shared* dependency is refused (ADR-06);
//! - a contract may not demand a signal its capability profile cannot supply (ADR-16);
//! - thresholds below the platform floors are refused, and the scoring must fit the
//!   damping budget (ADR-07): a soft failure at the contract's cadence must be detected
//!   within [`DAMPING_BUDGET`](crate::defaults::DAMPING_BUDGET).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::defaults as d;
use crate::model::EvidenceClass;
use crate::units::Permille;

/// Which evidence classes a service can supply at all (ADR-16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct CapabilityProfile {
    /// Can be probed from outside.
    pub probe: bool,
    /// Reports about itself.
    pub self_report: bool,
    /// Carries enough traffic for caller outcomes to mean something.
    pub passive: bool,
}

impl CapabilityProfile {
    /// Every class.
    pub const FULL: Self = Self {
        probe: true,
        self_report: true,
        passive: true,
    };
    /// Probes and caller outcomes; the workload does not self-report (the common case).
    pub const NO_SELF_REPORT: Self = Self {
        probe: true,
        self_report: false,
        passive: true,
    };
    /// A third party's endpoint: no readiness signal of any kind, caller outcomes only.
    pub const NO_READINESS: Self = Self {
        probe: false,
        self_report: false,
        passive: true,
    };
    /// Probes only (a low-traffic internal service).
    pub const PROBE_ONLY: Self = Self {
        probe: true,
        self_report: false,
        passive: false,
    };

    /// Whether the profile supplies `class`.
    pub const fn provides(self, class: EvidenceClass) -> bool {
        match class {
            EvidenceClass::Probe => self.probe,
            EvidenceClass::SelfReport => self.self_report,
            EvidenceClass::Passive => self.passive,
        }
    }

    /// How many classes the profile supplies.
    pub fn count(self) -> usize {
        EvidenceClass::ALL
            .iter()
            .filter(|c| self.provides(**c))
            .count()
    }
}

impl Default for CapabilityProfile {
    fn default() -> Self {
        Self::NO_SELF_REPORT
    }
}

/// What an active check does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ProbeKind {
    /// HTTP GET; 2xx passes.
    Http {
        /// The path to request, e.g. `/readyz`.
        path: String,
    },
    /// A TCP connect.
    Tcp,
    /// The gRPC health protocol (`grpc.health.v1.Health/Check`).
    Grpc {
        /// The service name to ask about; empty means the server as a whole.
        #[serde(default)]
        service: String,
    },
}

/// How to probe a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProbeSpec {
    /// The check.
    #[serde(flatten)]
    pub kind: ProbeKind,
    /// Time between checks of one target by one prober.
    #[schemars(with = "crate::schema::DurationString")]
    #[serde(with = "crate::duration_str", default = "default_probe_interval")]
    pub interval: Duration,
    /// How long a check may take.
    #[schemars(with = "crate::schema::DurationString")]
    #[serde(with = "crate::duration_str", default = "default_probe_timeout")]
    pub timeout: Duration,
}

fn default_probe_interval() -> Duration {
    d::PROBE_INTERVAL
}
fn default_probe_timeout() -> Duration {
    d::PROBE_TIMEOUT
}

/// How much a dependency's trouble may do to its dependents (ADR-06).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DependencyAuthority {
    /// Recorded and shown, changes nothing.
    Informational,
    /// Lowers the instance's weight (the default).
    #[default]
    WeightReduction,
    /// Makes the instance ineligible when the dependency is down. Only for non-shared
    /// dependencies (a local cache, an attached volume).
    Unreadiness,
}

/// One dependency a service declares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DependencyDecl {
    /// The name self-reports use for it.
    pub name: String,
    /// Whether every replica shares it (a database) or each has its own (a local cache).
    pub shared: bool,
    /// What its trouble may do.
    #[serde(default)]
    pub authority: DependencyAuthority,
}

/// Scoring parameters (ADR-07).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Scoring {
    /// Half-life of the decaying failure score.
    #[schemars(with = "crate::schema::DurationString")]
    #[serde(with = "crate::duration_str")]
    pub half_life: Duration,
    /// A class at or above this score is failing.
    pub remove: Permille,
    /// A withdrawn instance's classes must all be at or below this to start re-entry.
    pub readmit: Permille,
    /// ... and stay there this long.
    #[schemars(with = "crate::schema::DurationString")]
    #[serde(with = "crate::duration_str")]
    pub readmit_hold: Duration,
    /// A second class at or above this corroborates a failure.
    pub corroborate: Permille,
    /// Missed intervals before a class is silent.
    pub silence_factor: u32,
}

impl Default for Scoring {
    fn default() -> Self {
        Self {
            half_life: d::HALF_LIFE,
            remove: d::REMOVE_PERMILLE,
            readmit: d::READMIT_PERMILLE,
            readmit_hold: d::READMIT_HOLD,
            corroborate: d::CORROBORATE_PERMILLE,
            silence_factor: d::SILENCE_FACTOR,
        }
    }
}

/// How caller outcomes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PassiveSpec {
    /// The load-report interval.
    #[schemars(with = "crate::schema::DurationString")]
    #[serde(with = "crate::duration_str")]
    pub interval: Duration,
    /// A report with fewer requests says nothing.
    pub min_requests: u64,
    /// A caller at or above this error rate sees the instance failing.
    pub error_rate: Permille,
    /// Callers' outcomes as the primary evidence where traffic allows (ADR-04). Absent:
    /// probes (and self-reports) stay primary at any traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<PassivePrimary>,
}

impl Default for PassiveSpec {
    fn default() -> Self {
        Self {
            interval: d::PASSIVE_INTERVAL,
            min_requests: d::PASSIVE_MIN_REQUESTS,
            error_rate: d::PASSIVE_ERROR_PERMILLE,
            primary: None,
        }
    }
}

/// The traffic threshold above which callers' outcomes are the primary evidence for an
/// instance (ADR-04), and the probe cadence kept meanwhile.
///
/// Callers' outcomes are *sufficient* for an instance while at least `min_callers`
/// distinct callers have reported on it within the passive silence window (each report
/// above `passive.min_requests`) and their latest reports add up to at least
/// `min_requests`. While sufficient, failing outcomes from enough of those callers withdraw
/// the instance on their own — many independent callers failing is the corroboration —
/// and probes drop to `confirm_interval`. One caller is one vote however much it sends, so
/// no single caller can ever withdraw anything. Below the threshold nothing changes: the
/// active classes stay primary and the instance is reported as such.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PassivePrimary {
    /// Requests per passive interval, summed over the callers heard.
    #[serde(default = "default_primary_requests")]
    pub min_requests: u64,
    /// Distinct callers heard (at least 3).
    #[serde(default = "default_primary_callers")]
    pub min_callers: u32,
    /// The probe interval while callers' outcomes are primary (a confirmation cadence).
    #[schemars(with = "crate::schema::DurationString")]
    #[serde(
        with = "crate::duration_str",
        default = "default_primary_confirm_interval"
    )]
    pub confirm_interval: Duration,
}

impl Default for PassivePrimary {
    fn default() -> Self {
        Self {
            min_requests: d::PASSIVE_PRIMARY_MIN_REQUESTS,
            min_callers: d::PASSIVE_PRIMARY_MIN_CALLERS,
            confirm_interval: d::PASSIVE_PRIMARY_CONFIRM_INTERVAL,
        }
    }
}

fn default_primary_requests() -> u64 {
    d::PASSIVE_PRIMARY_MIN_REQUESTS
}
fn default_primary_callers() -> u32 {
    d::PASSIVE_PRIMARY_MIN_CALLERS
}
fn default_primary_confirm_interval() -> Duration {
    d::PASSIVE_PRIMARY_CONFIRM_INTERVAL
}

/// A service's health contract as its owner writes it. Validate it before use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct HealthContract {
    /// The classes the service can supply.
    pub profile: CapabilityProfile,
    /// The active check, required when the profile provides probes.
    pub probe: Option<ProbeSpec>,
    /// Expected self-report cadence.
    #[schemars(with = "crate::schema::DurationString")]
    #[serde(with = "crate::duration_str")]
    pub self_report_interval: Duration,
    /// How caller outcomes are read.
    pub passive: PassiveSpec,
    /// Scoring and hysteresis.
    pub scoring: Scoring,
    /// Declared dependencies.
    pub dependencies: Vec<DependencyDecl>,
    /// Slow-start ramp length; zero declares a stateless service with no ramp.
    #[schemars(with = "crate::schema::DurationString")]
    #[serde(with = "crate::duration_str")]
    pub slow_start: Duration,
    /// Minimum healthy fraction per zone (ADR-08).
    pub min_healthy: Permille,
    /// Weight kept when a single class reports failure and nothing corroborates it.
    pub uncorroborated_weight: Permille,
    /// Weight kept while a dependency is degraded (weight-reduction authority).
    pub dependency_weight: Permille,
    /// Treat silence as failure: an instance whose every class has gone silent is
    /// `ineligible(soft_failure)` instead of `unknown`. Off by default, and it should stay
    /// off: it turns an observer's outage (a prober partition, an ingest outage) into
    /// withdrawals (ADR-05). It exists for the rare service where serving a dead endpoint
    /// is worse than serving none (ADR-05, "choose differently when"), and so the
    /// `prober-partition` drill can show its verdict fail with it on. The fraction guard
    /// still applies downstream.
    pub silence_withdraws: bool,
}

impl Default for HealthContract {
    fn default() -> Self {
        Self {
            profile: CapabilityProfile::default(),
            probe: Some(ProbeSpec {
                kind: ProbeKind::Http {
                    path: "/readyz".into(),
                },
                interval: d::PROBE_INTERVAL,
                timeout: d::PROBE_TIMEOUT,
            }),
            self_report_interval: d::SELF_REPORT_INTERVAL,
            passive: PassiveSpec::default(),
            scoring: Scoring::default(),
            dependencies: Vec::new(),
            slow_start: d::SLOW_START,
            min_healthy: d::MIN_HEALTHY,
            uncorroborated_weight: d::UNCORROBORATED_WEIGHT,
            dependency_weight: d::DEPENDENCY_WEIGHT,
            silence_withdraws: false,
        }
    }
}

/// Why a contract was refused. Validation changes nothing; fix the named field and retry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContractError {
    /// A shared dependency was given unreadiness authority: one wobble would withdraw
    /// every replica at once (ADR-06). Use `weight_reduction`, or declare it non-shared.
    #[error("dependencies.{name}: unreadiness authority is refused on a shared dependency")]
    SharedDependencyUnreadiness {
        /// The dependency.
        name: String,
    },
    /// The same dependency was declared twice.
    #[error("dependencies.{name}: declared twice")]
    DuplicateDependency {
        /// The dependency.
        name: String,
    },
    /// The contract asks for a signal its profile says the service cannot supply.
    #[error("{field}: needs {class} evidence, which the capability profile does not provide")]
    SignalNotProvided {
        /// The offending field.
        field: &'static str,
        /// The class it needs.
        class: EvidenceClass,
    },
    /// The profile provides probes but no probe is described.
    #[error("probe: the profile provides probes but no probe is described")]
    ProbeMissing,
    /// The profile provides no evidence class at all.
    #[error("profile: provides no evidence class; at least one is required")]
    NoEvidence,
    /// A value is below its platform floor.
    #[error("{field}: {value} is below the platform floor of {floor}")]
    BelowFloor {
        /// The offending field.
        field: &'static str,
        /// What was given.
        value: String,
        /// The floor.
        floor: String,
    },
    /// A value is above the platform ceiling (durations, counts and lengths are all
    /// bounded). Nothing was accepted; lower the value.
    #[error("{field}: {value} is above the platform ceiling of {ceiling}")]
    AboveCeiling {
        /// The field.
        field: &'static str,
        /// What was given.
        value: String,
        /// The ceiling.
        ceiling: String,
    },
    /// A value is out of its valid range for another reason.
    #[error("{field}: {reason}")]
    Invalid {
        /// The offending field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The scoring would take longer than the damping budget to detect a soft failure.
    #[error(
        "scoring: a steady {class} failure would take {detection_ms} ms to cross the removal \
         score, more than the {budget_ms} ms damping budget"
    )]
    DampingOverBudget {
        /// The class whose cadence is too slow for the scoring.
        class: EvidenceClass,
        /// Computed detection time.
        detection_ms: u64,
        /// The budget.
        budget_ms: u64,
    },
}

impl ContractError {
    /// The contract field at fault, as a dotted path (`dependencies.db`, `probe`, …).
    pub fn field(&self) -> String {
        match self {
            Self::SharedDependencyUnreadiness { name } | Self::DuplicateDependency { name } => {
                format!("dependencies.{name}")
            }
            Self::SignalNotProvided { field, .. }
            | Self::BelowFloor { field, .. }
            | Self::AboveCeiling { field, .. }
            | Self::Invalid { field, .. } => (*field).to_owned(),
            Self::ProbeMissing => "probe".to_owned(),
            Self::NoEvidence => "profile".to_owned(),
            Self::DampingOverBudget { .. } => "scoring".to_owned(),
        }
    }
}

/// A contract that passed validation. Cheap to clone; per-class cadences are precomputed
/// because the evaluator consults them on every sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidContract {
    contract: Arc<HealthContract>,
    interval: [Duration; 3],
    silence: [Duration; 3],
}

impl ValidContract {
    /// The expected interval between samples of `class`.
    pub fn interval_of(&self, class: EvidenceClass) -> Duration {
        self.interval[class.index()]
    }

    /// How long `class` may go without a sample before it is silent.
    pub fn silence_of(&self, class: EvidenceClass) -> Duration {
        self.silence[class.index()]
    }
}

impl std::ops::Deref for ValidContract {
    type Target = HealthContract;
    fn deref(&self) -> &HealthContract {
        &self.contract
    }
}

impl Default for ValidContract {
    fn default() -> Self {
        HealthContract::default()
            .validate()
            .expect("the default contract is valid")
    }
}

// === impl HealthContract ===

impl HealthContract {
    /// Check every rule; the first broken one is returned.
    pub fn validate(self) -> Result<ValidContract, ContractError> {
        // Ceilings first: every later check does arithmetic on these values.
        self.check_ceilings()?;
        self.check_profile()?;
        self.check_dependencies()?;
        self.check_floors()?;
        self.check_damping()?;
        let interval = EvidenceClass::ALL.map(|c| self.interval(c));
        let silence = EvidenceClass::ALL.map(|c| self.silence_after(c));
        Ok(ValidContract {
            contract: Arc::new(self),
            interval,
            silence,
        })
    }

    /// The expected interval between samples of `class`.
    pub fn interval(&self, class: EvidenceClass) -> Duration {
        match class {
            EvidenceClass::Probe => self
                .probe
                .as_ref()
                .map_or(d::PROBE_INTERVAL, |p| p.interval),
            EvidenceClass::SelfReport => self.self_report_interval,
            EvidenceClass::Passive => self.passive.interval,
        }
    }

    /// How long `class` may go without a sample before it is silent. Saturates, so an
    /// unvalidated contract cannot make it panic; a validated one is far below the limit.
    ///
    /// A contract that lets callers' outcomes become primary gives probes the
    /// confirmation cadence's silence: probes slow down whenever the traffic threshold is
    /// met, and a probe at its slower cadence is not silent. (Silence never withdraws; it
    /// only decides when an instance nobody speaks about is `unknown`.)
    pub fn silence_after(&self, class: EvidenceClass) -> Duration {
        let interval = match (class, &self.passive.primary) {
            (EvidenceClass::Probe, Some(p)) => self.interval(class).max(p.confirm_interval),
            _ => self.interval(class),
        };
        interval
            .checked_mul(self.scoring.silence_factor)
            .unwrap_or(Duration::MAX)
    }

    /// Time from a steady failure's first sample to the score crossing `threshold`, for
    /// one class sampled at its interval. Used for the damping check and in tests.
    pub fn detection_time(&self, class: EvidenceClass, threshold: Permille) -> Duration {
        let interval = self.interval(class);
        let alpha = alpha(interval, interval, self.scoring.half_life);
        let target = threshold.as_f64();
        let mut score = 0.0;
        let mut samples = 0u32;
        // Bounded: alpha ≥ 1 - 2^(-floor ratio) so this ends well before the cap.
        while score < target && samples < 10_000 {
            score += alpha * (1.0 - score);
            samples += 1;
        }
        interval
            .checked_mul(samples.saturating_sub(1))
            .unwrap_or(Duration::MAX)
    }

    fn check_ceilings(&self) -> Result<(), ContractError> {
        if let Some(probe) = &self.probe {
            ceiling_duration("probe.interval", probe.interval, d::INTERVAL_MAX)?;
            ceiling_duration("probe.timeout", probe.timeout, d::PROBE_TIMEOUT_MAX)?;
            match &probe.kind {
                ProbeKind::Http { path } => {
                    ceiling_text("probe.path", path)?;
                    if !path.starts_with('/') || path.chars().any(|c| c.is_ascii_control()) {
                        return Err(ContractError::Invalid {
                            field: "probe.path",
                            reason:
                                "an absolute path starting with '/', without control characters"
                                    .into(),
                        });
                    }
                }
                ProbeKind::Grpc { service } => ceiling_text("probe.service", service)?,
                ProbeKind::Tcp => {}
            }
        }
        let s = &self.scoring;
        ceiling_duration(
            "self_report_interval",
            self.self_report_interval,
            d::INTERVAL_MAX,
        )?;
        ceiling_duration("passive.interval", self.passive.interval, d::INTERVAL_MAX)?;
        ceiling_duration("scoring.half_life", s.half_life, d::HALF_LIFE_MAX)?;
        ceiling_duration("scoring.readmit_hold", s.readmit_hold, d::READMIT_HOLD_MAX)?;
        ceiling_duration("slow_start", self.slow_start, d::SLOW_START_MAX)?;
        ceiling_count(
            "scoring.silence_factor",
            u64::from(s.silence_factor),
            u64::from(d::SILENCE_FACTOR_MAX),
        )?;
        ceiling_count(
            "passive.min_requests",
            self.passive.min_requests,
            d::PASSIVE_MIN_REQUESTS_MAX,
        )?;
        if let Some(p) = &self.passive.primary {
            ceiling_count(
                "passive.primary.min_requests",
                p.min_requests,
                d::PASSIVE_MIN_REQUESTS_MAX,
            )?;
            // The panel remembers this many callers; a threshold above it is unreachable.
            ceiling_count(
                "passive.primary.min_callers",
                u64::from(p.min_callers),
                d::PASSIVE_REPORTERS_MAX as u64,
            )?;
            ceiling_duration(
                "passive.primary.confirm_interval",
                p.confirm_interval,
                d::INTERVAL_MAX,
            )?;
        }
        ceiling_count(
            "dependencies",
            self.dependencies.len() as u64,
            d::DEPENDENCIES_MAX as u64,
        )?;
        for dep in &self.dependencies {
            ceiling_text("dependencies.name", &dep.name)?;
            if dep.name.is_empty() {
                return Err(ContractError::Invalid {
                    field: "dependencies.name",
                    reason: "must not be empty".into(),
                });
            }
        }
        Ok(())
    }

    fn check_profile(&self) -> Result<(), ContractError> {
        if self.profile.count() == 0 {
            return Err(ContractError::NoEvidence);
        }
        match (&self.probe, self.profile.probe) {
            (Some(_), false) => Err(ContractError::SignalNotProvided {
                field: "probe",
                class: EvidenceClass::Probe,
            }),
            (None, true) => Err(ContractError::ProbeMissing),
            _ if self.passive.primary.is_some() && !self.profile.passive => {
                Err(ContractError::SignalNotProvided {
                    field: "passive.primary",
                    class: EvidenceClass::Passive,
                })
            }
            _ => Ok(()),
        }
    }

    fn check_dependencies(&self) -> Result<(), ContractError> {
        let mut seen = BTreeSet::new();
        for dep in &self.dependencies {
            if !seen.insert(dep.name.as_str()) {
                return Err(ContractError::DuplicateDependency {
                    name: dep.name.clone(),
                });
            }
            if dep.shared && dep.authority == DependencyAuthority::Unreadiness {
                return Err(ContractError::SharedDependencyUnreadiness {
                    name: dep.name.clone(),
                });
            }
            // Dependency health arrives only by self-report.
            if dep.authority != DependencyAuthority::Informational && !self.profile.self_report {
                return Err(ContractError::SignalNotProvided {
                    field: "dependencies",
                    class: EvidenceClass::SelfReport,
                });
            }
        }
        Ok(())
    }

    fn check_floors(&self) -> Result<(), ContractError> {
        let s = &self.scoring;
        if let Some(probe) = &self.probe {
            floor_duration("probe.interval", probe.interval, d::PROBE_INTERVAL_MIN)?;
            if probe.timeout.is_zero() || probe.timeout >= probe.interval {
                return Err(ContractError::Invalid {
                    field: "probe.timeout",
                    reason: format!(
                        "{:?} must be above zero and below the interval {:?}",
                        probe.timeout, probe.interval
                    ),
                });
            }
        }
        floor_duration("scoring.half_life", s.half_life, d::HALF_LIFE_MIN)?;
        floor_duration("scoring.readmit_hold", s.readmit_hold, d::READMIT_HOLD_MIN)?;
        floor_permille("scoring.remove", s.remove, d::REMOVE_PERMILLE_MIN)?;
        floor_permille("min_healthy", self.min_healthy, d::MIN_HEALTHY_FLOOR)?;
        if s.readmit >= s.remove {
            return Err(ContractError::Invalid {
                field: "scoring.readmit",
                reason: format!("{} must be below the removal score {}", s.readmit, s.remove),
            });
        }
        if s.silence_factor < d::SILENCE_FACTOR_MIN {
            return Err(ContractError::BelowFloor {
                field: "scoring.silence_factor",
                value: s.silence_factor.to_string(),
                floor: d::SILENCE_FACTOR_MIN.to_string(),
            });
        }
        if !self.slow_start.is_zero() {
            floor_duration("slow_start", self.slow_start, d::SLOW_START)?;
        }
        if self.passive.min_requests == 0 {
            return Err(ContractError::BelowFloor {
                field: "passive.min_requests",
                value: "0".into(),
                floor: "1".into(),
            });
        }
        if let Some(p) = &self.passive.primary {
            if p.min_callers < d::PASSIVE_PRIMARY_CALLERS_FLOOR {
                return Err(ContractError::BelowFloor {
                    field: "passive.primary.min_callers",
                    value: p.min_callers.to_string(),
                    floor: d::PASSIVE_PRIMARY_CALLERS_FLOOR.to_string(),
                });
            }
            if p.min_requests == 0 {
                return Err(ContractError::BelowFloor {
                    field: "passive.primary.min_requests",
                    value: "0".into(),
                    floor: "1".into(),
                });
            }
            // Confirmation is a slower cadence, never a faster one.
            let normal = self.interval(EvidenceClass::Probe);
            floor_duration(
                "passive.primary.confirm_interval",
                p.confirm_interval,
                normal,
            )?;
        }
        for (field, interval) in [
            ("self_report_interval", self.self_report_interval),
            ("passive.interval", self.passive.interval),
        ] {
            floor_duration(field, interval, d::PROBE_INTERVAL_MIN)?;
        }
        Ok(())
    }

    fn check_damping(&self) -> Result<(), ContractError> {
        for class in [EvidenceClass::Probe, EvidenceClass::Passive] {
            if !self.profile.provides(class) {
                continue;
            }
            let detection = self.detection_time(class, self.scoring.remove);
            if detection > d::DAMPING_BUDGET {
                return Err(ContractError::DampingOverBudget {
                    class,
                    detection_ms: detection.as_millis() as u64,
                    budget_ms: d::DAMPING_BUDGET.as_millis() as u64,
                });
            }
        }
        Ok(())
    }
}

fn floor_duration(
    field: &'static str,
    value: Duration,
    floor: Duration,
) -> Result<(), ContractError> {
    if value < floor {
        return Err(ContractError::BelowFloor {
            field,
            value: format!("{value:?}"),
            floor: format!("{floor:?}"),
        });
    }
    Ok(())
}

/// A contract duration is at most `ceiling`, and a whole number of milliseconds: the
/// evidence protocol carries probe cadences in milliseconds, and a finer part would be
/// dropped on the way to the prober (a `500us` timeout would arrive as zero).
fn ceiling_duration(
    field: &'static str,
    value: Duration,
    ceiling: Duration,
) -> Result<(), ContractError> {
    if !value.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(ContractError::Invalid {
            field,
            reason: format!(
                "{} is not a whole number of milliseconds",
                crate::duration_str::format(value)
            ),
        });
    }
    if value > ceiling {
        return Err(ContractError::AboveCeiling {
            field,
            value: crate::duration_str::format(value),
            ceiling: crate::duration_str::format(ceiling),
        });
    }
    Ok(())
}

fn ceiling_count(field: &'static str, value: u64, ceiling: u64) -> Result<(), ContractError> {
    if value > ceiling {
        return Err(ContractError::AboveCeiling {
            field,
            value: value.to_string(),
            ceiling: ceiling.to_string(),
        });
    }
    Ok(())
}

fn ceiling_text(field: &'static str, value: &str) -> Result<(), ContractError> {
    if value.len() > d::CONTRACT_TEXT_LEN_MAX {
        return Err(ContractError::AboveCeiling {
            field,
            value: format!("{} bytes", value.len()),
            ceiling: format!("{} bytes", d::CONTRACT_TEXT_LEN_MAX),
        });
    }
    Ok(())
}

fn floor_permille(
    field: &'static str,
    value: Permille,
    floor: Permille,
) -> Result<(), ContractError> {
    if value < floor {
        return Err(ContractError::BelowFloor {
            field,
            value: value.to_string(),
            floor: floor.to_string(),
        });
    }
    Ok(())
}

/// The score's smoothing factor for a sample `elapsed` after the previous one of its class:
/// `1 - 2^(-dt / half_life)`, with `dt` capped at the class interval. The contract's
/// scoring defines it; the evaluator applies it to each sample.
pub(crate) fn alpha(elapsed: Duration, interval: Duration, half_life: Duration) -> f64 {
    let dt = elapsed.min(interval).as_secs_f64();
    1.0 - (-dt / half_life.as_secs_f64()).exp2()
}

#[cfg(test)]
mod tests;
