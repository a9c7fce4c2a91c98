//! The workspace's one stable hash and one seeded generator.
//!
//! std's hashers are not stable across releases and `rand` is not a dependency of the
//! cores, yet several parts need a hash that never changes (on-disk checksums, resource
//! versions, rendezvous scores every replica must agree on) or a tiny seeded stream
//! (jitter, start offsets, simulations). Both are here, once.

/// FNV-1a, 64 bit, over `bytes`. Stable for ever: checksums written to disk and scores
/// every member computes depend on it.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    Fnv1a::new().chain(bytes).finish()
}

/// FNV-1a over several parts fed one after another (the caller separates them if their
/// boundaries matter).
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;

    /// The empty hash.
    pub const fn new() -> Self {
        Self(Self::OFFSET)
    }

    /// Feed `bytes`.
    #[must_use]
    pub fn chain(self, bytes: &[u8]) -> Self {
        Self(
            bytes
                .iter()
                .fold(self.0, |h, b| (h ^ u64::from(*b)).wrapping_mul(Self::PRIME)),
        )
    }

    /// The hash so far.
    pub const fn finish(self) -> u64 {
        self.0
    }
}

impl Default for Fnv1a {
    fn default() -> Self {
        Self::new()
    }
}

/// SplitMix64's finaliser: spreads a hash whose inputs were short or similar.
pub const fn mix64(mut h: u64) -> u64 {
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// SplitMix64: a tiny seeded generator, the same stream for the same seed everywhere —
/// good for jitter, spreading start times and simulations, not for secrets.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// A number in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64().checked_rem(n).unwrap_or(0)
    }

    /// `true` with probability `permille / 1000`.
    pub fn chance(&mut self, permille: u64) -> bool {
        self.below(1000) < permille
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_its_published_test_vectors() {
        // From the FNV reference (draft-eastlake-fnv): the hash written to disk never moves.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(
            Fnv1a::new().chain(b"foo").chain(b"bar").finish(),
            fnv1a(b"foobar")
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_stream() {
        let (mut a, mut b) = (SplitMix64::new(7), SplitMix64::new(7));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        assert_ne!(SplitMix64::new(8).next_u64(), SplitMix64::new(7).next_u64());
        // SplitMix64's reference output for seed 0.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(SplitMix64::new(3).below(0), 0);
    }
}
