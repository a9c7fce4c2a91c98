//! Small value types shared by every machine in the core: fractions and weights.
//!
//! Fractions are integer permille, never `f64`, so configurations compare exactly and
//! serialise without rounding surprises. Weights follow Envoy's `load_balancing_weight`:
//! a positive integer, where `1` is the smallest share an endpoint can be given.

use serde::{Deserialize, Serialize};

/// A fraction in thousandths: `Permille(500)` is one half.
///
/// Decoding refuses values above one thousand, so a fraction read from the wire or a log
/// is as valid as one built with [`Permille::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u16", into = "u16")]
pub struct Permille(u16);

impl Permille {
    /// Zero.
    pub const ZERO: Self = Self(0);
    /// The whole: one thousand thousandths.
    pub const ONE: Self = Self(1000);

    /// A fraction of `value` thousandths, or `None` above one thousand.
    pub const fn new(value: u16) -> Option<Self> {
        if value <= 1000 {
            Some(Self(value))
        } else {
            None
        }
    }

    /// A fraction of `value` thousandths, clamped to one.
    pub const fn saturating(value: u32) -> Self {
        if value >= 1000 {
            Self::ONE
        } else {
            Self(value as u16)
        }
    }

    /// Thousandths.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// `num / den` rounded down and clamped to one; a zero denominator gives zero. Exact
    /// for any counts (computed in 128 bits), so counts a reporter chose cannot overflow it.
    pub fn ratio(num: u64, den: u64) -> Self {
        if den == 0 {
            return Self::ZERO;
        }
        let permille = (u128::from(num) * 1000) / u128::from(den);
        Self::saturating(u32::try_from(permille).unwrap_or(u32::MAX))
    }

    /// This fraction of another (their product), rounded down.
    pub fn of(self, other: Self) -> Self {
        Self((u32::from(self.0) * u32::from(other.0) / 1000) as u16)
    }

    /// This fraction as a float, for scores and display only.
    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / 1000.0
    }

    /// A float in `[0, 1]` as permille, rounded to nearest.
    pub fn from_f64(value: f64) -> Self {
        Self::saturating((value.clamp(0.0, 1.0) * 1000.0).round() as u32)
    }
}

/// A decoded fraction above one thousand thousandths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{value} permille is more than one (1000)")]
pub struct PermilleError {
    value: u16,
}

impl TryFrom<u16> for Permille {
    type Error = PermilleError;
    fn try_from(value: u16) -> Result<Self, PermilleError> {
        Self::new(value).ok_or(PermilleError { value })
    }
}

impl From<Permille> for u16 {
    fn from(value: Permille) -> u16 {
        value.0
    }
}

impl schemars::JsonSchema for Permille {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Permille".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "integer",
            "minimum": 0,
            "maximum": 1000,
            "description": "A fraction in thousandths: 500 is one half, 1000 the whole.",
        })
    }
}

impl std::fmt::Display for Permille {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}%", self.0 / 10, self.0 % 10)
    }
}

/// An endpoint's share of traffic relative to its peers, as Envoy reads it (always ≥ 1).
///
/// Decoding clamps into `[MIN, MAX]` exactly as [`Weight::new`] does, so no weight from the
/// wire or a log can be zero (a withdrawal in disguise) or overflow a locality's sum.
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
#[serde(from = "u32", into = "u32")]
pub struct Weight(u32);

impl Weight {
    /// The weight an instance has when nothing reduces it.
    pub const DEFAULT: Self = Self(100);
    /// The smallest share; a weight is never zero (zero would be a withdrawal in disguise).
    pub const MIN: Self = Self(1);
    /// Envoy's `load_balancing_weight` is a `uint32` but the sum per locality must fit one
    /// too, so single weights are kept far below that.
    pub const MAX: Self = Self(1_000_000);

    /// A weight, clamped into `[MIN, MAX]`.
    pub fn new(value: u32) -> Self {
        Self(value.clamp(Self::MIN.0, Self::MAX.0))
    }

    /// The raw value.
    pub fn get(self) -> u32 {
        self.0
    }

    /// This weight scaled by a fraction, never below [`Weight::MIN`].
    pub fn scale(self, by: Permille) -> Self {
        Self::new((u64::from(self.0) * u64::from(by.get()) / 1000) as u32)
    }
}

impl From<u32> for Weight {
    fn from(value: u32) -> Self {
        Self::new(value)
    }
}

impl From<Weight> for u32 {
    fn from(value: Weight) -> u32 {
        value.0
    }
}

impl Default for Weight {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl std::fmt::Display for Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permille_rejects_more_than_one() {
        assert_eq!(Permille::new(1001), None);
        assert_eq!(Permille::new(1000), Some(Permille::ONE));
    }

    #[test]
    fn ratio_rounds_down_and_survives_zero_denominator() {
        assert_eq!(Permille::ratio(1, 3).get(), 333);
        assert_eq!(Permille::ratio(5, 0), Permille::ZERO);
    }

    #[test]
    fn ratio_of_counts_a_reporter_chose_never_overflows() {
        // Found by the `evidence` fuzz target: a passive sample with counts near u64::MAX
        // overflowed `num * 1000` inside the leader's evaluator.
        assert_eq!(Permille::ratio(u64::MAX, u64::MAX), Permille::ONE);
        assert_eq!(Permille::ratio(u64::MAX / 2, u64::MAX).get(), 499);
        assert_eq!(Permille::ratio(u64::MAX, 1), Permille::ONE);
    }

    #[test]
    fn decoded_weight_is_clamped_like_a_built_one() {
        let zero: Weight = serde_json::from_str("0").unwrap();
        let huge: Weight = serde_json::from_str("4294967295").unwrap();
        assert_eq!(zero, Weight::MIN);
        assert_eq!(huge, Weight::MAX);
        assert_eq!(serde_json::to_string(&Weight::DEFAULT).unwrap(), "100");
    }

    #[test]
    fn decoded_permille_above_one_is_refused() {
        assert!(serde_json::from_str::<Permille>("1001").is_err());
        assert!(serde_json::from_str::<Permille>("65535").is_err());
        assert_eq!(
            serde_json::from_str::<Permille>("1000").unwrap(),
            Permille::ONE
        );
        assert_eq!(serde_json::to_string(&Permille::ONE).unwrap(), "1000");
    }

    #[test]
    fn scaled_weight_never_reaches_zero() {
        assert_eq!(
            Weight::new(3).scale(Permille::new(100).unwrap()),
            Weight::MIN
        );
        assert_eq!(Weight::new(0), Weight::MIN);
        assert_eq!(Weight::DEFAULT.scale(Permille::new(500).unwrap()).get(), 50);
    }
}
