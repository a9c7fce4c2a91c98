//! Durations as human strings in configuration: `"250ms"`, `"10s"`, `"5m"`, `"1h"`.
//!
//! Used with `#[serde(with = "crate::duration_str")]`. Parsing is strict: one number and
//! one unit, no spaces, no sign; anything else is an error naming what was expected.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a duration; expected a whole number followed by ms, s, m or h")]
pub struct DurationError {
    input: String,
}

/// Parse `"<n>ms" | "<n>s" | "<n>m" | "<n>h"`.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        input: input.to_owned(),
    };
    let split = input.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
    let (digits, unit) = input.split_at(split);
    if digits.is_empty() {
        return Err(err());
    }
    let n: u64 = digits.parse().map_err(|_| err())?;
    let ms_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(err()),
    };
    n.checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(err)
}

/// Format in the largest unit that represents the duration exactly.
pub fn format(value: Duration) -> String {
    let ms = value.as_millis();
    match ms {
        0 => "0s".to_owned(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

/// Serde serializer.
pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(*value))
}

/// Serde deserializer.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(deserializer)?;
    parse(&s).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_unit() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        for bad in [
            "",
            "s",
            "10",
            "10 s",
            "-1s",
            "1.5s",
            "10sec",
            "99999999999999999999h",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn format_round_trips() {
        for ms in [0u64, 1, 999, 1000, 60_000, 90_000, 3_600_000] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse(&format(d)), Ok(d));
        }
    }
}
