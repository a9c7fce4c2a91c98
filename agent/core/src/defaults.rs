//! The platform's budgets and defaults, as named constants.
//!
//! Every number here comes from the design's budgets table or is fitted to it; the fits
//! are stated beside each constant and checked by tests (`contract::tests`,
//! `evaluator::tests`). Change a number here and the tests tell you which budget moved.

use std::time::Duration;

use crate::units::Permille;

// --- Budgets (what the platform promises) ---

/// 99% of callers see an unplanned withdrawal within this.
pub const WITHDRAWAL_BUDGET_P99: Duration = Duration::from_secs(5);
/// 99.9% of callers see an unplanned withdrawal within this.
pub const WITHDRAWAL_BUDGET_P999: Duration = Duration::from_secs(15);
/// 99% of callers see an admission within this.
pub const ADMISSION_BUDGET_P99: Duration = Duration::from_secs(30);
/// A hard failure is removed within this, whatever the damping.
pub const HARD_FAILURE_BUDGET_P99: Duration = Duration::from_secs(10);
/// Damping may add at most this to the detection of a genuine soft failure.
pub const DAMPING_BUDGET: Duration = Duration::from_secs(5);
/// Callers keep routing from their last-known-good view for at least this long.
pub const STATIC_SERVING_MIN: Duration = Duration::from_secs(60 * 60);

// --- Evidence cadence ---

/// Default interval between probes of one target by one prober.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Default probe timeout (must stay below the interval).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(800);
/// Default interval at which instances self-report.
pub const SELF_REPORT_INTERVAL: Duration = Duration::from_secs(5);
/// Envoy's load-report interval we ask for (LRS `load_reporting_interval`).
pub const PASSIVE_INTERVAL: Duration = Duration::from_secs(1);
/// A class with no sample for this many of its intervals is silent, not failing.
pub const SILENCE_FACTOR: u32 = 3;

// --- Scoring (fitted to the damping budget) ---

/// Half-life of the failure score. With a 1 s probe interval each sample moves the score
/// half-way to its value, so three consecutive failures (0.5, 0.75, 0.875) cross
/// [`REMOVE_PERMILLE`]: a soft failure is withdrawn 2 s after its first failed sample,
/// inside the 5 s damping budget, while a lone failure among passes never crosses it.
pub const HALF_LIFE: Duration = Duration::from_secs(1);
/// Score at or above which a class is failing.
pub const REMOVE_PERMILLE: Permille = Permille::saturating(800);
/// Score at or below which a withdrawn instance may start its re-entry hold.
pub const READMIT_PERMILLE: Permille = Permille::saturating(200);
/// How long the score must stay at or below the re-entry level. Longer than the damping
/// budget, so re-entry is always slower than removal.
pub const READMIT_HOLD: Duration = Duration::from_secs(10);
/// A second class at or above this score corroborates another class's failure.
pub const CORROBORATE_PERMILLE: Permille = Permille::saturating(500);
/// Weight kept by an instance whose failure only one class reports.
pub const UNCORROBORATED_WEIGHT: Permille = Permille::saturating(500);
/// Weight kept by an instance reporting a degraded dependency (ADR-06 default authority).
pub const DEPENDENCY_WEIGHT: Permille = Permille::saturating(500);
/// A caller whose error rate reaches this counts as seeing the instance fail.
pub const PASSIVE_ERROR_PERMILLE: Permille = Permille::saturating(250);
/// A caller with fewer requests than this in a report is not evidence either way.
pub const PASSIVE_MIN_REQUESTS: u64 = 5;
/// Distinct callers remembered per instance; beyond it the oldest is forgotten. Caps any
/// one reporter's influence at one vote and bounds memory.
pub const PASSIVE_REPORTERS_MAX: usize = 64;
/// Passive-primary (ADR-04): requests per passive interval, summed over the callers
/// heard, at or above which callers' outcomes are sufficient evidence on their own.
pub const PASSIVE_PRIMARY_MIN_REQUESTS: u64 = 100;
/// Passive-primary: distinct callers that must have been heard, each above
/// [`PASSIVE_MIN_REQUESTS`], for callers' outcomes to be sufficient.
pub const PASSIVE_PRIMARY_MIN_CALLERS: u32 = 3;
/// The floor on `passive.primary.min_callers`: one caller, however loud, is never a
/// population (ADR-15), and two would let one broken caller be half of it.
pub const PASSIVE_PRIMARY_CALLERS_FLOOR: u32 = 3;
/// Passive-primary: the probe interval while callers' outcomes are primary. At the
/// default traffic threshold (100 requests a second) one probe every 30 s is about 0.03 %
/// of the instance's requests, inside the 0.5 % ADR-04 aims at.
pub const PASSIVE_PRIMARY_CONFIRM_INTERVAL: Duration = Duration::from_secs(30);

// --- Guard, flapping, recovery ---

/// Minimum healthy fraction per service per zone (ADR-08).
pub const MIN_HEALTHY: Permille = Permille::saturating(500);
/// More transitions than this inside [`FLAP_WINDOW`] quarantines an instance.
pub const FLAP_TRANSITIONS_MAX: u32 = 4;
/// The window transitions are counted over.
pub const FLAP_WINDOW: Duration = Duration::from_secs(10 * 60);
/// First quarantine; each further one doubles.
pub const QUARANTINE_FIRST: Duration = Duration::from_secs(60);
/// Longest quarantine.
pub const QUARANTINE_MAX: Duration = Duration::from_secs(30 * 60);
/// After this long without a quarantine, the next one starts again from the first step.
pub const QUARANTINE_RESET_AFTER: Duration = Duration::from_secs(60 * 60);
/// Slow start: the least time from admission to full weight (ADR-12).
pub const SLOW_START: Duration = Duration::from_secs(60);
/// The ramp is published in this many steps (it is a staircase, by design).
pub const SLOW_START_STEPS: u32 = 6;
/// The first step's share of full weight.
pub const SLOW_START_FIRST: Permille = Permille::saturating(100);
/// Slow-start steps fall on a grid this fine, shared by every instance: steps are
/// admissions, released at most once per admission window anyway, and on a shared grid the
/// steps of every ramping instance of a service land together and are assembled as one
/// change (60,000 instances admitted over half a minute otherwise step at 6,000 different
/// instants a second). A step is only ever later, by less than this, never earlier.
pub const SLOW_START_STEP_GRID: Duration = ADMIT_WINDOW;
/// Reconnections admitted per window, as a share of the known client population.
pub const RECONNECT_PERMILLE: Permille = Permille::saturating(50);
/// The window the reconnection cap is counted over.
pub const RECONNECT_WINDOW: Duration = Duration::from_secs(10);
/// Lease for registered instances.
pub const LEASE: Duration = Duration::from_secs(30);

// --- Propagation ---

/// Withdrawals wait at most this to be batched with others.
pub const WITHDRAW_WINDOW: Duration = Duration::from_millis(50);
/// Admissions and weight steps are batched over this while unsaturated.
pub const ADMIT_WINDOW: Duration = Duration::from_secs(1);
/// Under saturation the admission window doubles up to this; the admission budget (30 s)
/// still holds with room for delivery.
pub const ADMIT_WINDOW_MAX: Duration = Duration::from_secs(16);
/// Admission releases per second the queues allow before declaring saturation.
pub const ADMIT_RELEASES_PER_SEC: u32 = 2_000;
/// A batch of releases whose commit (the authority's `Publish` entry) takes longer than
/// this reports delivery pressure to the delta queues, which then shed admissions: a tenth
/// of the withdrawal budget, so the withdrawals waiting behind it still fit.
pub const PUBLISH_PRESSURE_AFTER: Duration = Duration::from_millis(500);
/// Zone evacuation moves traffic in steps of this share.
pub const EVACUATION_STEP: Permille = Permille::saturating(250);
/// ... one step per this interval.
pub const EVACUATION_STEP_INTERVAL: Duration = Duration::from_secs(30);
/// Region failover moves a peer region's tier-2 share in steps of this. The same as a
/// zone's until drills show a region's recovery needs a gentler ramp; kept apart so it can.
pub const REGION_FAILOVER_STEP: Permille = EVACUATION_STEP;
/// ... one step per this interval.
pub const REGION_FAILOVER_STEP_INTERVAL: Duration = EVACUATION_STEP_INTERVAL;

// --- Platform floors (contracts below them are rejected) ---

/// Probing faster than this costs more than it tells.
pub const PROBE_INTERVAL_MIN: Duration = Duration::from_millis(250);
/// A half-life shorter than this is no damping at all.
pub const HALF_LIFE_MIN: Duration = Duration::from_millis(250);
/// Removal must need at least a majority failure score.
pub const REMOVE_PERMILLE_MIN: Permille = Permille::saturating(500);
/// Re-entry hold floor: never shorter than the damping budget.
pub const READMIT_HOLD_MIN: Duration = DAMPING_BUDGET;
/// The fraction guard cannot be set below this (it can be lowered, not removed).
pub const MIN_HEALTHY_FLOOR: Permille = Permille::saturating(100);
/// Silence must be at least this many missed intervals.
pub const SILENCE_FACTOR_MIN: u32 = 2;

// --- Platform ceilings (contracts above them are rejected) ---
//
// Every duration and count a contract carries is bounded, so no value an owner writes can
// overflow the evaluator's clock arithmetic (`now + silence`) or the validator's own.

/// The longest interval any evidence class may declare (probe, self-report, passive).
pub const INTERVAL_MAX: Duration = Duration::from_secs(60 * 60);
/// The longest probe timeout (it must also stay below the probe interval).
pub const PROBE_TIMEOUT_MAX: Duration = Duration::from_secs(60);
/// The longest half-life (the damping budget refuses long ones anyway; this bounds the
/// arithmetic that checks it).
pub const HALF_LIFE_MAX: Duration = Duration::from_secs(60 * 60);
/// The longest re-entry hold.
pub const READMIT_HOLD_MAX: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest slow start.
pub const SLOW_START_MAX: Duration = Duration::from_secs(60 * 60);
/// Silence may be at most this many missed intervals.
pub const SILENCE_FACTOR_MAX: u32 = 100;
/// The most requests a passive verdict may wait for per caller and interval.
pub const PASSIVE_MIN_REQUESTS_MAX: u64 = 1_000_000;
/// The most dependencies a contract may declare.
pub const DEPENDENCIES_MAX: usize = 64;
/// The longest dependency name, HTTP probe path or gRPC health service name, in bytes.
pub const CONTRACT_TEXT_LEN_MAX: usize = 256;

/// A human-readable table of the defaults, for `waymark defaults`.
pub fn describe() -> String {
    let rows: &[(&str, String)] = &[
        (
            "withdrawal budget p99 / p99.9",
            format!("{WITHDRAWAL_BUDGET_P99:?} / {WITHDRAWAL_BUDGET_P999:?}"),
        ),
        ("admission budget p99", format!("{ADMISSION_BUDGET_P99:?}")),
        (
            "hard failure removed (p99)",
            format!("{HARD_FAILURE_BUDGET_P99:?}"),
        ),
        ("damping budget", format!("{DAMPING_BUDGET:?}")),
        (
            "probe interval / timeout",
            format!("{PROBE_INTERVAL:?} / {PROBE_TIMEOUT:?}"),
        ),
        (
            "silence after",
            format!("{SILENCE_FACTOR} missed intervals"),
        ),
        ("score half-life", format!("{HALF_LIFE:?}")),
        (
            "remove / readmit score",
            format!("{REMOVE_PERMILLE} / {READMIT_PERMILLE}"),
        ),
        ("readmit hold", format!("{READMIT_HOLD:?}")),
        ("minimum healthy fraction", format!("{MIN_HEALTHY}")),
        (
            "flap quarantine",
            format!(
                "> {FLAP_TRANSITIONS_MAX} transitions in {FLAP_WINDOW:?}; {QUARANTINE_FIRST:?} doubling to {QUARANTINE_MAX:?}"
            ),
        ),
        (
            "slow start",
            format!("{SLOW_START:?} in {SLOW_START_STEPS} steps from {SLOW_START_FIRST}"),
        ),
        (
            "reconnection cap",
            format!("{RECONNECT_PERMILLE} of clients per {RECONNECT_WINDOW:?}"),
        ),
        ("lease", format!("{LEASE:?}")),
        (
            "withdraw / admit window",
            format!("{WITHDRAW_WINDOW:?} / {ADMIT_WINDOW:?} (max {ADMIT_WINDOW_MAX:?})"),
        ),
        ("static serving from LKG", format!("{STATIC_SERVING_MIN:?}")),
    ];
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{k:<width$}  {v}\n"))
        .collect()
}
