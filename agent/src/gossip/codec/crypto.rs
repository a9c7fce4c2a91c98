//! Region keys: 32-byte ChaCha20-Poly1305 keys and the keyring that lets them rotate.
//!
//! A [`Keyring`] seals with its primary key and opens with any of its keys, so a region
//! rotates without downtime in three rolling steps (as memberlist does):
//!
//! ```text
//! 1. install:  {A}    -> {A, B}   everyone still seals with A; everyone can open B
//! 2. promote:  {A, B} -> {B, A}   mixed pools open both
//! 3. retire:   {B, A} -> {B}      everyone already seals with B
//! ```
//!
//! Skipping step 1 breaks the pool for the rollout's duration: a `{B, A}` member seals with B
//! and a `{A}` member cannot open that. Key material is never logged; [`KeyId`] is.

use std::fmt;
use std::sync::Arc;

use ring::aead::{CHACHA20_POLY1305, LessSafeKey, UnboundKey};
use ring::digest;
use ring::rand::SecureRandom;

/// How long a region key is, in bytes.
pub const KEY_LEN: usize = 32;

/// Why a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The text was neither 64 hex digits nor base64. Nothing was created; fix the key.
    #[error("key is neither hex nor base64")]
    BadEncoding,
    /// The text decoded to the wrong number of bytes. Nothing was created; supply 32 bytes.
    #[error("key is {len} bytes long, expected {KEY_LEN}")]
    BadLength {
        /// How many bytes it decoded to.
        len: usize,
    },
    /// The system random source failed. Nothing was created; retry, or check the host.
    #[error("system random source failed")]
    Random,
    /// A keyring was given no key at all. Supply at least the primary.
    #[error("at least one region key is required")]
    Empty,
}

/// A key's public fingerprint: the first 8 bytes of a SHA-256 over a label and the key.
///
/// Safe to log and to compare; its first byte travels in every datagram as a hint.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId([u8; 8]);

/// One region key, ready to seal and open. Cloning is cheap; `Debug` shows only the [`KeyId`].
#[derive(Clone)]
pub struct Key {
    aead: Arc<LessSafeKey>,
    /// The raw key, kept for persisting a rotated keyring and for installing it on peers
    /// (ring does not give it back); never logged, never `Debug`.
    secret: Arc<[u8; KEY_LEN]>,
    id: KeyId,
}

/// The keys a member holds: seal with `primary`, open with any.
#[derive(Clone, Debug)]
pub struct Keyring {
    primary: Key,
    others: Vec<Key>,
}

const KEY_ID_LABEL: &[u8] = b"waymark gossip key id v1\0";

// === impl KeyId ===

/// How long a [`KeyId`] is, in bytes.
pub const KEY_ID_LEN: usize = 8;

impl KeyId {
    /// A key id from its bytes (as it travels on the wire).
    pub fn from_bytes(bytes: [u8; KEY_ID_LEN]) -> Self {
        Self(bytes)
    }

    /// A key id from its 16 hex digits (either case), as [`fmt::Display`] prints it.
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        if text.len() != 2 * KEY_ID_LEN {
            return Err(KeyError::BadEncoding);
        }
        let bytes = decode_hex(text)?;
        let array: [u8; KEY_ID_LEN] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::BadEncoding)?;
        Ok(Self(array))
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8; KEY_ID_LEN] {
        &self.0
    }

    /// The byte sent in each datagram so a receiver tries the right key first.
    pub fn hint(&self) -> u8 {
        self.0[0]
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

// === impl Key ===

impl Key {
    /// A key from its raw bytes.
    pub fn from_bytes(bytes: &[u8; KEY_LEN]) -> Self {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes)
            .expect("a 32-byte key is always valid for ChaCha20-Poly1305");
        let mut ctx = digest::Context::new(&digest::SHA256);
        ctx.update(KEY_ID_LABEL);
        ctx.update(bytes);
        let mut id = [0u8; 8];
        id.copy_from_slice(&ctx.finish().as_ref()[..8]);
        Self {
            aead: Arc::new(LessSafeKey::new(unbound)),
            secret: Arc::new(*bytes),
            id: KeyId(id),
        }
    }

    /// A key from a byte slice, which must be exactly [`KEY_LEN`] long.
    pub fn try_from_slice(bytes: &[u8]) -> Result<Self, KeyError> {
        let array: &[u8; KEY_LEN] = bytes
            .try_into()
            .map_err(|_| KeyError::BadLength { len: bytes.len() })?;
        Ok(Self::from_bytes(array))
    }

    /// A key from 64 hex digits (either case).
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        Self::try_from_slice(&decode_hex(text.trim())?)
    }

    /// A key from standard base64 (padding optional; `-`/`_` accepted for `+`/`/`).
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        Self::try_from_slice(&decode_base64(text.trim())?)
    }

    /// A key from configuration text: 64 hex digits, otherwise base64.
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        if text.len() == 2 * KEY_LEN && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            Self::from_hex(text)
        } else {
            Self::from_base64(text)
        }
    }

    /// A new random key, for `waymark keygen`-style tooling and tests.
    pub fn generate(rng: &dyn SecureRandom) -> Result<Self, KeyError> {
        let mut bytes = [0u8; KEY_LEN];
        rng.fill(&mut bytes).map_err(|_| KeyError::Random)?;
        Ok(Self::from_bytes(&bytes))
    }

    /// The key's public fingerprint.
    pub fn id(&self) -> KeyId {
        self.id
    }

    /// The raw key: for the keyring file and for installing the key on peers over an
    /// authenticated channel. Never log it.
    pub fn secret_bytes(&self) -> &[u8; KEY_LEN] {
        &self.secret
    }

    pub(super) fn aead(&self) -> &LessSafeKey {
        &self.aead
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Key {}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.id)
    }
}

// === impl Keyring ===

impl Keyring {
    /// A keyring from configured key texts (hex or base64): the first seals, every one opens.
    pub fn parse(keys: &[impl AsRef<str>]) -> Result<Self, KeyError> {
        let mut parsed = keys.iter().map(|k| Key::parse(k.as_ref()));
        let primary = parsed.next().ok_or(KeyError::Empty)??;
        Ok(Self::new(primary, parsed.collect::<Result<_, _>>()?))
    }

    /// A keyring sealing with `primary` and also opening with `others` (duplicates dropped).
    pub fn new(primary: Key, others: Vec<Key>) -> Self {
        let mut kept: Vec<Key> = Vec::with_capacity(others.len());
        for key in others {
            if key != primary && !kept.contains(&key) {
                kept.push(key);
            }
        }
        Self {
            primary,
            others: kept,
        }
    }

    /// A keyring with one key.
    pub fn single(primary: Key) -> Self {
        Self::new(primary, Vec::new())
    }

    /// The key every datagram is sealed with.
    pub fn primary(&self) -> &Key {
        &self.primary
    }

    /// The keys accepted besides the primary, in the order given.
    pub fn others(&self) -> &[Key] {
        &self.others
    }

    /// Every key, primary first.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        std::iter::once(&self.primary).chain(self.others.iter())
    }

    /// Keys to try for a datagram carrying `hint`: those whose id starts with it, then the rest.
    pub(super) fn candidates(&self, hint: u8) -> impl Iterator<Item = &Key> {
        let hinted = self.keys().filter(move |k| k.id.hint() == hint);
        let rest = self.keys().filter(move |k| k.id.hint() != hint);
        hinted.chain(rest)
    }
}

// === decoding ===

fn decode_hex(text: &str) -> Result<Vec<u8>, KeyError> {
    fn nibble(c: u8) -> Result<u8, KeyError> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(KeyError::BadEncoding),
        }
    }
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return Err(KeyError::BadEncoding);
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Ok((nibble(pair[0])? << 4) | nibble(pair[1])?))
        .collect()
}

fn decode_base64(text: &str) -> Result<Vec<u8>, KeyError> {
    fn sextet(c: u8) -> Result<u32, KeyError> {
        match c {
            b'A'..=b'Z' => Ok(u32::from(c - b'A')),
            b'a'..=b'z' => Ok(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Ok(u32::from(c - b'0') + 52),
            b'+' | b'-' => Ok(62),
            b'/' | b'_' => Ok(63),
            _ => Err(KeyError::BadEncoding),
        }
    }
    let body = text.trim_end_matches('=').as_bytes();
    if body.is_empty() || body.len() % 4 == 1 || text.len() - body.len() > 2 {
        return Err(KeyError::BadEncoding);
    }
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    for chunk in body.chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            acc = (acc << 6) | sextet(c)?;
        }
        // A short final chunk carries 2 or 3 characters: 1 or 2 bytes, left-aligned.
        let bits = 6 * chunk.len();
        acc <<= 24 - bits;
        let n = bits / 8;
        out.extend_from_slice(&acc.to_be_bytes()[1..=n]);
    }
    Ok(out)
}
