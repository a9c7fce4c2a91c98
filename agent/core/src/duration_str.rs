//! The one duration grammar: every duration waymark reads — configuration files, health
//! contracts, command-line flags, certificate lifetimes, drill flags — goes through [`parse`],
//! and every duration it writes back through [`format`].
//!
//! ```text
//! duration = "0" | part { part }          parts add up, in any order
//! part     = number unit
//! number   = digits [ "." digits ]
//! unit     = "ns" | "us" | "µs" | "ms" | "s" | "m" | "h" | "d"     (a day is 24 h)
//! ```
//!
//! That is Go's `time.ParseDuration` plus `d`: `250ms`, `10s`, `1.5s`, `1m30s`, `2h45m`,
//! `1d`. Left out of Go's: the sign, and the forms nobody writes (`.5s`, the Greek-mu `μs`),
//! so that a schema's pattern says the same. Refused, with a [`DurationError`] saying what
//! is wrong and where: the empty string, a sign, whitespace, a bare number other than `0`
//! (as Go refuses it: seconds or milliseconds?), an unknown unit, a part finer than a
//! nanosecond (`1.5ns` is refused, never rounded, so what a file says is what runs), and a
//! total above [`MAX`] (refused, never saturated).
//!
//! [`format`] writes the canonical form, which [`parse`] reads back exactly for every
//! `Duration`: days, hours and minutes as whole parts, then what is left below a minute in
//! the largest unit of `s`, `ms`, `us`, `ns` that it reaches, with a decimal fraction if
//! needed; zero parts are left out (`90s` → `1m30s`, `1500ms` → `1.5s`, `24h` → `1d`,
//! zero → `0s`). Serde: `#[serde(with = "waymark_core::duration_str")]`; clap:
//! `value_parser = waymark_core::duration_str::parse`. For operators, docs/configuration.md
//! ("Durations") says the same with examples.

use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// The longest duration [`parse`] accepts: `Duration::MAX`, so that every `Duration`
/// [`format`] writes parses back.
pub const MAX: Duration = Duration::MAX;

const MAX_NANOS: u128 = MAX.as_nanos();
const NANOS_PER_SEC: u128 = 1_000_000_000;
const MINUTE: u128 = 60 * NANOS_PER_SEC;
const HOUR: u128 = 60 * MINUTE;
const DAY: u128 = 24 * HOUR;

/// Every unit, with its length in nanoseconds. `µs` is the micro sign (U+00B5, what
/// keyboards type); [`format`] writes the ASCII `us`.
const UNITS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("\u{b5}s", 1_000),
    ("ms", 1_000_000),
    ("s", NANOS_PER_SEC),
    ("m", MINUTE),
    ("h", HOUR),
    ("d", DAY),
];

/// A fraction with more significant digits than this cannot be a whole number of
/// nanoseconds in any unit (a day is 2^16·3^3·5^11 ns), and below it the arithmetic fits a
/// `u128`.
const FRACTION_DIGITS_MAX: usize = 18;

/// Longest part of a refused input quoted back in the error message.
const QUOTED_CHARS_MAX: usize = 64;

/// Why a duration string was refused, and where. Nothing was parsed; the caller reports it
/// (naming the key or flag) and the writer fixes the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError {
    input: String,
    at: usize,
    kind: DurationErrorKind,
}

/// What is wrong with a refused duration string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationErrorKind {
    /// Nothing at all.
    #[error("it is empty")]
    Empty,
    /// A `+` or `-`: durations are never negative, and `+` adds nothing.
    #[error("a duration has no sign")]
    Sign,
    /// A space, tab or newline.
    #[error("it contains whitespace")]
    Whitespace,
    /// Something other than a number where a number must start.
    #[error("expected a number")]
    ExpectedNumber,
    /// A decimal point with no digit after it (`1.s`).
    #[error("a decimal point must be followed by a digit")]
    BadFraction,
    /// A number without a unit; only `0` may stand alone.
    #[error("the number has no unit (only 0 may stand alone)")]
    MissingUnit,
    /// A unit that is not one of the grammar's.
    #[error("unknown unit {unit:?}")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
    },
    /// A part that is not a whole number of nanoseconds (`1.5ns`, `0.0000000001s`).
    #[error("finer than a nanosecond")]
    TooPrecise,
    /// The total is above [`MAX`].
    #[error("longer than the longest duration")]
    TooLong,
}

// === impl DurationError ===

impl DurationError {
    fn new(input: &str, at: usize, kind: DurationErrorKind) -> Self {
        Self {
            input: input.to_owned(),
            at,
            kind,
        }
    }

    /// What is wrong.
    pub fn kind(&self) -> &DurationErrorKind {
        &self.kind
    }

    /// Where: the byte offset in the input of the part at fault.
    pub fn at(&self) -> usize {
        self.at
    }
}

impl std::fmt::Display for DurationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let quoted: String = self.input.chars().take(QUOTED_CHARS_MAX).collect();
        let ellipsis = if quoted.len() < self.input.len() {
            "…"
        } else {
            ""
        };
        write!(f, "{quoted:?}{ellipsis} is not a duration: {}", self.kind)?;
        if !matches!(
            self.kind,
            DurationErrorKind::Empty | DurationErrorKind::TooLong
        ) {
            // Characters, counted from 1, as an editor shows a column.
            let column = self.input.get(..self.at).map_or(0, |s| s.chars().count()) + 1;
            write!(f, " at character {column}")?;
        }
        f.write_str(" (write e.g. 250ms, 1.5s, 1m30s, 2h45m or 1d)")
    }
}

impl std::error::Error for DurationError {}

/// Parse a duration written in the grammar above.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    if input.is_empty() {
        return Err(DurationError::new(input, 0, DurationErrorKind::Empty));
    }
    if input == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total: u128 = 0;
    let mut at = 0;
    while at < input.len() {
        let (nanos, end) = parse_part(input, at)?;
        total = total
            .checked_add(nanos)
            .filter(|t| *t <= MAX_NANOS)
            .ok_or_else(|| DurationError::new(input, 0, DurationErrorKind::TooLong))?;
        at = end;
    }
    Ok(from_nanos(total))
}

/// The canonical form (see the module doc): `1m30s`, `1.5s`, `250ms`, `1d2h`, `0s`.
pub fn format(value: Duration) -> String {
    let mut rest = value.as_nanos();
    if rest == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (unit, name) in [(DAY, "d"), (HOUR, "h"), (MINUTE, "m")] {
        if rest >= unit {
            let _ = write!(out, "{}{name}", rest / unit);
            rest %= unit;
        }
    }
    if rest > 0 {
        let (unit, name) = [
            (NANOS_PER_SEC, "s"),
            (1_000_000, "ms"),
            (1_000, "us"),
            (1, "ns"),
        ]
        .into_iter()
        .find(|(unit, _)| rest >= *unit)
        .expect("rest is at least a nanosecond");
        let _ = write!(out, "{}", rest / unit);
        let fraction = rest % unit;
        if fraction > 0 {
            // `unit` is a power of ten: its digits after the leading 1 are the places.
            let places = unit.ilog10() as usize;
            let digits = format!("{fraction:0places$}");
            let _ = write!(out, ".{}", digits.trim_end_matches('0'));
        }
        out.push_str(name);
    }
    out
}

/// Serde serializer: the canonical form.
pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(*value))
}

/// Serde deserializer: a string in the grammar.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(deserializer)?;
    parse(&s).map_err(serde::de::Error::custom)
}

/// One `number unit` part starting at byte `start`: its length in nanoseconds (at most
/// [`MAX`]) and the byte offset after it.
fn parse_part(input: &str, start: usize) -> Result<(u128, usize), DurationError> {
    use DurationErrorKind as Kind;
    let err = |at, kind| DurationError::new(input, at, kind);
    let bytes = input.as_bytes();
    let mut at = start;
    let mut whole: u128 = 0;
    while let Some(digit) = bytes.get(at).filter(|b| b.is_ascii_digit()) {
        whole = whole * 10 + u128::from(digit - b'0');
        // Every unit is at least a nanosecond, so this bounds the part and the arithmetic.
        if whole > MAX_NANOS {
            return Err(err(start, Kind::TooLong));
        }
        at += 1;
    }
    let mut fraction = "";
    // A fraction only after a whole part: `0.5s`, never `.5s`.
    if at > start && bytes.get(at) == Some(&b'.') {
        let digits = bytes[at + 1..].iter().take_while(|b| b.is_ascii_digit());
        let end = at + 1 + digits.count();
        if end == at + 1 {
            return Err(err(at, Kind::BadFraction));
        }
        fraction = &input[at + 1..end];
        at = end;
    }
    let number_seen = at > start;
    let unit_len: usize = input[at..]
        .chars()
        .take_while(|c| c.is_alphabetic())
        .map(char::len_utf8)
        .sum();
    if unit_len == 0 || !number_seen {
        // Whatever stands where a number or a unit belongs.
        let kind = match input[at..].chars().next() {
            Some('+' | '-') => Kind::Sign,
            Some(c) if c.is_whitespace() => Kind::Whitespace,
            _ if number_seen => return Err(err(start, Kind::MissingUnit)),
            _ => Kind::ExpectedNumber,
        };
        return Err(err(at, kind));
    }
    let unit = &input[at..at + unit_len];
    let Some(&(_, unit_nanos)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(err(
            at,
            Kind::UnknownUnit {
                unit: unit.to_owned(),
            },
        ));
    };
    let whole_nanos = whole
        .checked_mul(unit_nanos)
        .filter(|n| *n <= MAX_NANOS)
        .ok_or_else(|| err(start, Kind::TooLong))?;
    let fraction_nanos =
        fraction_nanos(fraction, unit_nanos).ok_or_else(|| err(start, Kind::TooPrecise))?;
    // Both terms are at most MAX_NANOS < 2^95: the sum cannot overflow.
    let nanos = whole_nanos + fraction_nanos;
    if nanos > MAX_NANOS {
        return Err(err(start, Kind::TooLong));
    }
    Ok((nanos, at + unit_len))
}

/// `0.<digits>` of a unit in whole nanoseconds (below the unit); `None` if that is not a
/// whole number of nanoseconds.
fn fraction_nanos(digits: &str, unit_nanos: u128) -> Option<u128> {
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return Some(0);
    }
    if significant.len() > FRACTION_DIGITS_MAX {
        return None;
    }
    let numerator: u128 = significant.parse().ok()?;
    let scale = 10u128.pow(u32::try_from(significant.len()).ok()?);
    // numerator < 10^18 and a unit < 2^47: the product fits.
    let scaled = numerator * unit_nanos;
    scaled.is_multiple_of(scale).then_some(scaled / scale)
}

fn from_nanos(nanos: u128) -> Duration {
    let secs = u64::try_from(nanos / NANOS_PER_SEC).expect("at most MAX_NANOS, so it fits");
    let subsec = u32::try_from(nanos % NANOS_PER_SEC).expect("below a second");
    Duration::new(secs, subsec)
}

#[cfg(test)]
#[path = "duration_str_test.rs"]
mod tests;
