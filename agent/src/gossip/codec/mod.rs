//! The gossip wire envelope: every foca datagram sealed with the region key.
//!
//! ```text
//! +---------+----------+-------------+------------------------------+----------+
//! | version | key hint | nonce (12)  | ciphertext (foca, postcard)  | tag (16) |
//! +---------+----------+-------------+------------------------------+----------+
//!   1 byte    1 byte     random         ChaCha20-Poly1305               AAD = the first 2 bytes
//! ```
//!
//! Nonces are random (ring's `SystemRandom`), which is safe for far more datagrams than a key
//! lives for. The hint is the first byte of the sealing key's [`KeyId`]; a receiver tries the
//! matching keys first and then the rest, so a mismatched hint costs time, never correctness.
//! There is no replay window: SWIM tolerates replays (stale updates lose on incarnation), and
//! rotating the key bounds how long a captured datagram stays acceptable.

pub mod crypto;

#[cfg(test)]
mod tests;

use ring::aead::{Aad, NONCE_LEN, Nonce};
use ring::rand::SecureRandom;

pub use crypto::{KEY_LEN, Key, KeyError, KeyId, Keyring};

/// The envelope version this build writes and reads.
pub const VERSION: u8 = 1;

/// Bytes before the ciphertext: version, key hint and nonce.
pub const HEADER_LEN: usize = 2 + NONCE_LEN;

/// Bytes an envelope adds around foca's datagram.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;

const TAG_LEN: usize = 16;

/// Why a datagram could not be sealed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The system random source failed to make a nonce. Nothing was sent; the datagram is
    /// lost, as UDP may lose any datagram, and SWIM retries on its own schedule.
    #[error("system random source failed")]
    Random,
    /// Encryption failed (ring refused the input length). Nothing was sent.
    #[error("encryption failed")]
    Encrypt,
}

/// Why a received datagram was dropped before reaching foca.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Too short for an envelope, or an unknown version. Dropped and counted as `malformed`.
    #[error("datagram is not a gossip envelope")]
    Malformed,
    /// No key in the ring authenticates it: a foreign key, tampering or junk. Dropped and
    /// counted as `auth`.
    #[error("datagram failed authentication")]
    Auth,
}

/// Seals `plaintext` with the keyring's primary key into `out` (cleared first).
pub fn seal(
    keyring: &Keyring,
    rng: &dyn SecureRandom,
    plaintext: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), SealError> {
    let key = keyring.primary();
    let mut nonce = [0u8; NONCE_LEN];
    rng.fill(&mut nonce).map_err(|_| SealError::Random)?;
    let header = [VERSION, key.id().hint()];

    out.clear();
    out.reserve(OVERHEAD + plaintext.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(plaintext);
    let tag = key
        .aead()
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(header),
            &mut out[HEADER_LEN..],
        )
        .map_err(|_| SealError::Encrypt)?;
    out.extend_from_slice(tag.as_ref());
    Ok(())
}

/// Opens a sealed `datagram` with any key of the ring; the plaintext lands in `scratch`.
///
/// Never panics on any input; the returned slice borrows `scratch`.
pub fn open<'s>(
    keyring: &Keyring,
    datagram: &[u8],
    scratch: &'s mut Vec<u8>,
) -> Result<&'s [u8], OpenError> {
    if datagram.len() < OVERHEAD || datagram[0] != VERSION {
        return Err(OpenError::Malformed);
    }
    let header = [datagram[0], datagram[1]];
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&datagram[2..HEADER_LEN]);
    let sealed = &datagram[HEADER_LEN..];

    for key in keyring.candidates(header[1]) {
        // ring may scribble over a buffer it failed to authenticate, so each try starts
        // from a fresh copy of the ciphertext.
        scratch.clear();
        scratch.extend_from_slice(sealed);
        let opened = key.aead().open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(header),
            scratch.as_mut_slice(),
        );
        if let Ok(plaintext) = opened {
            let len = plaintext.len();
            scratch.truncate(len);
            return Ok(scratch.as_slice());
        }
    }
    scratch.clear();
    Err(OpenError::Auth)
}
