//! The gossip keyring a member persists in its data directory (`gossip::keyring_file`), and
//! the rotation step applied to what it decodes (`gossip::rotation::rotate`), as a restart
//! followed by an operator's keyring operation runs them.
//!
//! Input: byte 0 picks the path.
//! - even: the rest is the file as the disk holds it, torn, altered or foreign. A file that
//!   decodes re-encodes to exactly itself (a decoded keyring is exactly what was written).
//! - odd: byte 1 picks an operation and byte 2 a key, the rest is the file; every operation
//!   on a decoded ring ends in a ring that holds its primary, within the bound, and
//!   survives the file's encoding, or in a refusal that changed nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use waymark_agent::gossip::codec::{KEY_LEN, Key};
use waymark_agent::gossip::keyring_file::{decode, encode};
use waymark_agent::gossip::rotation::{KEYS_MAX, KeyringOp, rotate};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        if let Ok(ring) = decode(rest) {
            assert_eq!(
                encode(&ring),
                rest,
                "a decoded keyring re-encodes to the file"
            );
        }
        return;
    }
    let [op, key, file @ ..] = rest else {
        return;
    };
    let Ok(ring) = decode(file) else {
        return;
    };
    let ids: Vec<_> = ring.keys().map(Key::id).collect();
    // A key the ring holds (even bytes), or a new one.
    let held = ring.keys().nth(usize::from(*key / 2) % ids.len()).cloned();
    let key = match held {
        Some(k) if *key % 2 == 0 => k,
        _ => Key::from_bytes(&[*key; KEY_LEN]),
    };
    let op = match op % 4 {
        0 => KeyringOp::List,
        1 => KeyringOp::Install(key),
        2 => KeyringOp::Use(key.id()),
        _ => KeyringOp::Remove(key.id()),
    };
    match rotate(&ring, &op) {
        Ok(out) => {
            let after: Vec<_> = out.keyring.keys().map(Key::id).collect();
            assert_eq!(out.changed, after != ids, "changed says whether it changed");
            assert!(after.len() <= KEYS_MAX);
            let back = decode(&encode(&out.keyring)).expect("a rotated ring persists");
            assert_eq!(back.keys().map(Key::id).collect::<Vec<_>>(), after);
        }
        Err(_) => {
            let still: Vec<_> = ring.keys().map(Key::id).collect();
            assert_eq!(still, ids, "a refusal changes nothing");
        }
    }
});
