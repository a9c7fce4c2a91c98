//! Certificate lifetimes sized so that a control-plane outage never expires anyone.
//!
//! The rule: a node agent or workload must be able to ride out [`OUTAGE_WINDOW`] (60
//! minutes) without its certificate expiring. Leaves live [`LEAF_TTL_DEFAULT`] (24 h) and
//! are refreshed at half their lifetime, and never later than [`REFRESH_REMAINING_MIN`]
//! (2 h) before `not_after`; [`LEAF_TTL_MIN`] keeps that refresh point meaningful. So at
//! the moment a refresh falls due there are always at least 2 h left, twice the outage
//! window (checked at compile time below and by a property test).
//!
//! Pure: every function takes wall-clock time as data (`SystemTime` or unix seconds);
//! only shells read the clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const DAY: Duration = Duration::from_secs(24 * 3600);

/// The control-plane outage every certificate must survive.
pub const OUTAGE_WINDOW: Duration = Duration::from_secs(60 * 60);
/// Default lifetime of node, authority and workload leaves.
pub const LEAF_TTL_DEFAULT: Duration = DAY;
/// Default lifetime of operator leaves: a working day.
pub const OPERATOR_TTL_DEFAULT: Duration = Duration::from_secs(8 * 3600);
/// Shortest leaf lifetime the CA issues.
pub const LEAF_TTL_MIN: Duration = Duration::from_secs(4 * 3600);
/// Longest leaf lifetime the CA issues: leaves are meant to be short-lived.
pub const LEAF_TTL_MAX: Duration = Duration::from_secs(7 * 24 * 3600);
/// A leaf is refreshed once this fraction (per mille) of its lifetime has passed.
pub const REFRESH_AT_PERMILLE: u64 = 500;
/// A leaf is refreshed no later than this long before it expires.
pub const REFRESH_REMAINING_MIN: Duration = Duration::from_secs(2 * 3600);
/// Lifetime of a region intermediate.
pub const INTERMEDIATE_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
/// Lifetime of the estate root.
pub const ROOT_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// `not_before` is back-dated by this much so a peer whose clock is slightly behind the
/// issuer's accepts a fresh certificate.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(5 * 60);

// The outage guarantee, checked by the compiler.
const _: () = assert!(REFRESH_REMAINING_MIN.as_secs() >= 2 * OUTAGE_WINDOW.as_secs());
const _: () = assert!(LEAF_TTL_MIN.as_secs() >= 2 * REFRESH_REMAINING_MIN.as_secs());
const _: () = assert!(LEAF_TTL_DEFAULT.as_secs() >= LEAF_TTL_MIN.as_secs());
const _: () = assert!(OPERATOR_TTL_DEFAULT.as_secs() >= LEAF_TTL_MIN.as_secs());

/// A TTL the CA refuses to issue. Nothing was issued; pick a TTL inside the bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LifetimeError {
    /// Shorter than [`LEAF_TTL_MIN`]: the refresh point would leave less than the outage
    /// window. Nothing was issued; use a longer TTL.
    #[error("ttl {ttl_s}s is shorter than the minimum {min_s}s")]
    TooShort {
        /// Requested TTL in seconds.
        ttl_s: u64,
        /// Minimum in seconds.
        min_s: u64,
    },
    /// Longer than [`LEAF_TTL_MAX`]. Nothing was issued; use a shorter TTL.
    #[error("ttl {ttl_s}s is longer than the maximum {max_s}s")]
    TooLong {
        /// Requested TTL in seconds.
        ttl_s: u64,
        /// Maximum in seconds.
        max_s: u64,
    },
}

/// Where a certificate stands at a given instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiryStatus {
    /// `now` is before `not_before`.
    NotYetValid,
    /// `now` is at or after `not_after`.
    Expired,
    /// Valid, but it would expire inside the outage window.
    ExpiresWithinOutage {
        /// Time left until `not_after`.
        remaining: Duration,
    },
    /// Valid for longer than the outage window.
    Valid {
        /// Time left until `not_after`.
        remaining: Duration,
    },
}

/// Checks a requested leaf TTL against [`LEAF_TTL_MIN`] and [`LEAF_TTL_MAX`].
pub fn check_leaf_ttl(ttl: Duration) -> Result<(), LifetimeError> {
    if ttl < LEAF_TTL_MIN {
        return Err(LifetimeError::TooShort {
            ttl_s: ttl.as_secs(),
            min_s: LEAF_TTL_MIN.as_secs(),
        });
    }
    if ttl > LEAF_TTL_MAX {
        return Err(LifetimeError::TooLong {
            ttl_s: ttl.as_secs(),
            max_s: LEAF_TTL_MAX.as_secs(),
        });
    }
    Ok(())
}

/// When a certificate valid over `[not_before, not_after]` should be refreshed: at
/// [`REFRESH_AT_PERMILLE`] of its lifetime, but never later than [`REFRESH_REMAINING_MIN`]
/// before `not_after` (and never before `not_before`).
pub fn refresh_at(not_before: SystemTime, not_after: SystemTime) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    let by_fraction = not_before + lifetime.mul_f64(REFRESH_AT_PERMILLE as f64 / 1000.0);
    let by_floor = not_after
        .checked_sub(REFRESH_REMAINING_MIN)
        .unwrap_or(not_before)
        .max(not_before);
    by_fraction.min(by_floor)
}

/// Whether a certificate valid over `[not_before, not_after]` is due for refresh at `now`.
pub fn needs_refresh(now: SystemTime, not_before: SystemTime, not_after: SystemTime) -> bool {
    now >= refresh_at(not_before, not_after)
}

/// Classifies a certificate at `now` against an outage window.
pub fn expiry_status(
    now: SystemTime,
    not_before: SystemTime,
    not_after: SystemTime,
    outage_window: Duration,
) -> ExpiryStatus {
    if now < not_before {
        return ExpiryStatus::NotYetValid;
    }
    match not_after.duration_since(now) {
        Err(_) => ExpiryStatus::Expired,
        Ok(remaining) if remaining.is_zero() => ExpiryStatus::Expired,
        Ok(remaining) if remaining <= outage_window => {
            ExpiryStatus::ExpiresWithinOutage { remaining }
        }
        Ok(remaining) => ExpiryStatus::Valid { remaining },
    }
}

/// Seconds since the unix epoch (negative before it).
pub fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// The instant `secs` seconds after the unix epoch.
pub fn from_unix_seconds(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// RFC 3339 text for a unix timestamp, e.g. `2026-01-02T03:04:05Z`.
pub fn format_unix_seconds(secs: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("@{secs}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn default_leaf_refreshes_at_half_life() {
        let nb = at(1_000_000);
        let na = nb + LEAF_TTL_DEFAULT;
        assert_eq!(refresh_at(nb, na), nb + Duration::from_secs(12 * 3600));
        assert!(!needs_refresh(nb + Duration::from_secs(11 * 3600), nb, na));
        assert!(needs_refresh(nb + Duration::from_secs(12 * 3600), nb, na));
    }

    #[test]
    fn short_leaf_refreshes_two_hours_before_expiry() {
        let nb = at(1_000_000);
        // 4h lifetime: half is 2h, and the floor is also 2h before expiry.
        assert_eq!(
            refresh_at(nb, nb + LEAF_TTL_MIN),
            nb + Duration::from_secs(7200)
        );
        // 3h lifetime (not issuable, but loaded from elsewhere): floor wins.
        let three = nb + Duration::from_secs(3 * 3600);
        assert_eq!(refresh_at(nb, three), nb + Duration::from_secs(3600));
    }

    #[test]
    fn expiry_status_warns_inside_the_outage_window() {
        let nb = at(1_000);
        let na = at(10_000);
        let w = Duration::from_secs(3600);
        assert_eq!(expiry_status(at(999), nb, na, w), ExpiryStatus::NotYetValid);
        assert_eq!(expiry_status(at(10_000), nb, na, w), ExpiryStatus::Expired);
        assert_eq!(
            expiry_status(at(9_000), nb, na, w),
            ExpiryStatus::ExpiresWithinOutage {
                remaining: Duration::from_secs(1000)
            }
        );
        assert!(matches!(
            expiry_status(at(2_000), nb, na, w),
            ExpiryStatus::Valid { .. }
        ));
    }

    #[test]
    fn ttl_bounds_are_enforced() {
        assert!(check_leaf_ttl(LEAF_TTL_DEFAULT).is_ok());
        assert!(check_leaf_ttl(OPERATOR_TTL_DEFAULT).is_ok());
        assert!(matches!(
            check_leaf_ttl(Duration::from_secs(3600)),
            Err(LifetimeError::TooShort { .. })
        ));
        assert!(matches!(
            check_leaf_ttl(Duration::from_secs(30 * 86_400)),
            Err(LifetimeError::TooLong { .. })
        ));
    }

    #[test]
    fn unix_seconds_round_trip_and_format() {
        assert_eq!(unix_seconds(from_unix_seconds(-5)), -5);
        assert_eq!(
            unix_seconds(from_unix_seconds(1_700_000_000)),
            1_700_000_000
        );
        assert_eq!(format_unix_seconds(0), "1970-01-01T00:00:00Z");
    }

    proptest! {
        #[test]
        fn an_outage_starting_at_refresh_time_never_outlives_an_issuable_leaf(
            start in 0u64..4_000_000_000,
            ttl_s in LEAF_TTL_MIN.as_secs()..=LEAF_TTL_MAX.as_secs(),
        ) {
            let nb = at(start);
            let na = nb + Duration::from_secs(ttl_s);
            let due = refresh_at(nb, na);
            prop_assert!(due >= nb && due <= na);
            let left = na.duration_since(due).unwrap();
            prop_assert!(left >= REFRESH_REMAINING_MIN);
            prop_assert!(left > OUTAGE_WINDOW);
        }
    }
}
