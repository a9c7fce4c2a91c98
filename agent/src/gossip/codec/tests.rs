#![allow(clippy::unwrap_used)]

use ring::rand::SystemRandom;

use super::*;

fn key(byte: u8) -> Key {
    Key::from_bytes(&[byte; KEY_LEN])
}

fn sealed(ring: &Keyring, plaintext: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    seal(ring, &SystemRandom::new(), plaintext, &mut out).unwrap();
    out
}

#[test]
fn sealed_datagram_opens_to_the_same_bytes() {
    // Goal: the envelope round-trips and adds exactly OVERHEAD bytes.
    let ring = Keyring::single(key(1));
    let datagram = sealed(&ring, b"swim ping");
    assert_eq!(datagram.len(), b"swim ping".len() + OVERHEAD);
    assert_eq!(datagram[0], VERSION);
    assert_eq!(datagram[1], ring.primary().id().hint());
    let mut scratch = Vec::new();
    assert_eq!(open(&ring, &datagram, &mut scratch).unwrap(), b"swim ping");
}

#[test]
fn two_seals_of_one_message_differ() {
    // Goal: nonces are fresh, so equal plaintexts are not linkable on the wire.
    let ring = Keyring::single(key(1));
    assert_ne!(sealed(&ring, b"same"), sealed(&ring, b"same"));
}

#[test]
fn any_flipped_byte_is_rejected() {
    // Goal: version, hint, nonce, ciphertext and tag are all authenticated.
    let ring = Keyring::single(key(1));
    let datagram = sealed(&ring, b"membership update");
    let mut scratch = Vec::new();
    for i in 0..datagram.len() {
        let mut tampered = datagram.clone();
        tampered[i] ^= 0x01;
        let err = open(&ring, &tampered, &mut scratch).unwrap_err();
        let expected = if i == 0 {
            OpenError::Malformed
        } else {
            OpenError::Auth
        };
        assert_eq!(err, expected, "byte {i}");
    }
}

#[test]
fn wrong_key_is_rejected() {
    // Goal: a datagram from another region's key never opens.
    let datagram = sealed(&Keyring::single(key(1)), b"hello");
    let mut scratch = Vec::new();
    let err = open(&Keyring::single(key(2)), &datagram, &mut scratch).unwrap_err();
    assert_eq!(err, OpenError::Auth);
    assert!(scratch.is_empty());
}

#[test]
fn short_or_unknown_version_datagrams_are_malformed() {
    // Goal: junk is classified without touching a key, and never panics.
    let ring = Keyring::single(key(1));
    let mut scratch = Vec::new();
    for len in 0..OVERHEAD {
        let junk = vec![VERSION; len];
        assert_eq!(open(&ring, &junk, &mut scratch), Err(OpenError::Malformed));
    }
    let mut other_version = sealed(&ring, b"x");
    other_version[0] = VERSION + 1;
    assert_eq!(
        open(&ring, &other_version, &mut scratch),
        Err(OpenError::Malformed)
    );
}

#[test]
fn rotation_in_three_steps_keeps_every_pair_talking() {
    // Goal: install, promote, retire — at every step any two members of a rolling update
    // can open each other's datagrams.
    let (a, b) = (key(0xA), key(0xB));
    let steps = [
        (
            Keyring::single(a.clone()),
            Keyring::new(a.clone(), vec![b.clone()]),
        ),
        (
            Keyring::new(a.clone(), vec![b.clone()]),
            Keyring::new(b.clone(), vec![a.clone()]),
        ),
        (
            Keyring::new(b.clone(), vec![a.clone()]),
            Keyring::single(b.clone()),
        ),
    ];
    let mut scratch = Vec::new();
    for (step, (old, new)) in steps.iter().enumerate() {
        for (from, to) in [(old, new), (new, old)] {
            let datagram = sealed(from, b"ack");
            assert!(open(to, &datagram, &mut scratch).is_ok(), "step {step}");
        }
    }
}

#[test]
fn promoting_before_installing_is_one_way() {
    // Goal: document why rotation needs the install step: {B, A} seals with B, which a
    // member still on {A} cannot open, while the reverse direction works.
    let (a, b) = (key(0xA), key(0xB));
    let old = Keyring::single(a.clone());
    let promoted = Keyring::new(b, vec![a]);
    let mut scratch = Vec::new();
    assert!(open(&promoted, &sealed(&old, b"ping"), &mut scratch).is_ok());
    assert_eq!(
        open(&old, &sealed(&promoted, b"ack"), &mut scratch),
        Err(OpenError::Auth)
    );
}

#[test]
fn the_hinted_key_is_tried_first_and_no_key_is_skipped() {
    // Goal: the hint orders the search; it never excludes a key.
    let (a, b) = (key(0xA), key(0xB));
    let ring = Keyring::new(a.clone(), vec![b.clone()]);
    assert_eq!(ring.candidates(b.id().hint()).next(), Some(&b));
    let unused_hint = (0..=u8::MAX)
        .find(|h| *h != a.id().hint() && *h != b.id().hint())
        .unwrap();
    assert_eq!(ring.candidates(unused_hint).count(), 2);
    let datagram = sealed(&Keyring::single(b), b"x");
    let mut scratch = Vec::new();
    assert_eq!(open(&ring, &datagram, &mut scratch).unwrap(), b"x");
}

#[test]
fn keys_parse_from_hex_and_base64_alike() {
    // Goal: both configuration encodings give the same key; bad input is typed.
    let hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    let b64 = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let mut raw = [0u8; KEY_LEN];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::try_from(i).unwrap();
    }
    let expected = Key::from_bytes(&raw).id();
    assert_eq!(Key::from_hex(hex).unwrap().id(), expected);
    assert_eq!(Key::parse(&hex.to_uppercase()).unwrap().id(), expected);
    assert_eq!(Key::from_base64(b64).unwrap().id(), expected);
    assert_eq!(
        Key::parse(b64.trim_end_matches('=')).unwrap().id(),
        expected
    );
    assert_eq!(Key::parse("AAEC"), Err(KeyError::BadLength { len: 3 }));
    assert_eq!(Key::parse("not a key!"), Err(KeyError::BadEncoding));
    assert_eq!(Key::from_hex("0g"), Err(KeyError::BadEncoding));
}

#[test]
fn debug_output_never_shows_key_material() {
    // Goal: keys can be logged by accident without leaking.
    let key = Key::from_bytes(&[0x5a; KEY_LEN]);
    let shown = format!("{key:?} {:?}", Keyring::single(key.clone()));
    assert!(!shown.contains("5a5a5a5a"), "{shown}");
    assert!(shown.contains(&key.id().to_string()));
}

#[test]
fn keyring_drops_duplicate_keys() {
    // Goal: listing the primary again, or a key twice, does not double the work per datagram.
    let (a, b) = (key(0xA), key(0xB));
    let ring = Keyring::new(a.clone(), vec![a, b.clone(), b]);
    assert_eq!(ring.keys().count(), 2);
}
