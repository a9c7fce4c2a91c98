//! The authority's one wall clock: Unix milliseconds, read in the shells and stamped into
//! commands as data, so the state machines that apply them never read a clock.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix milliseconds now (0 before the epoch, saturating far after it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
