#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;
use crate::gossip::codec::KEY_LEN;

fn key(byte: u8) -> Key {
    Key::from_bytes(&[byte; KEY_LEN])
}

fn ids(ring: &Keyring) -> Vec<KeyId> {
    ring.keys().map(Key::id).collect()
}

#[test]
fn install_use_remove_rotates_the_primary_without_a_gap() {
    // Goal: the three steps take {A} to {B}, and at every step the ring opens what both
    // the old and the new primary seal until the old one is retired.
    let (a, b) = (key(1), key(2));
    let ring = Keyring::single(a.clone());

    let installed = rotate(&ring, &KeyringOp::Install(b.clone())).unwrap();
    assert!(installed.changed);
    assert_eq!(
        installed.keyring.primary().id(),
        a.id(),
        "still seals with A"
    );
    assert_eq!(ids(&installed.keyring), [a.id(), b.id()]);

    let used = rotate(&installed.keyring, &KeyringOp::Use(b.id())).unwrap();
    assert!(used.changed);
    assert_eq!(used.keyring.primary().id(), b.id());
    assert_eq!(ids(&used.keyring), [b.id(), a.id()], "A still opens");

    let removed = rotate(&used.keyring, &KeyringOp::Remove(a.id())).unwrap();
    assert!(removed.changed);
    assert_eq!(ids(&removed.keyring), [b.id()]);
}

#[test]
fn use_of_a_key_not_installed_is_refused() {
    // Goal: a member never seals with a key its peers may not hold: install comes first.
    let ring = Keyring::single(key(1));
    let e = rotate(&ring, &KeyringOp::Use(key(2).id())).unwrap_err();
    assert_eq!(e, KeyringRefusal::NotInstalled(key(2).id()));
    assert_eq!(e.reason(), "key_not_installed");
}

#[test]
fn removing_the_primary_is_refused() {
    // Goal: a member is never left with nothing to seal with.
    let ring = Keyring::new(key(1), vec![key(2)]);
    let e = rotate(&ring, &KeyringOp::Remove(key(1).id())).unwrap_err();
    assert_eq!(e, KeyringRefusal::RemovePrimary(key(1).id()));
    assert_eq!(e.reason(), "remove_primary");
}

#[test]
fn an_operation_already_in_force_succeeds_and_changes_nothing() {
    // Goal: a rotation step repeated across the pool after a partial failure is safe.
    let ring = Keyring::new(key(1), vec![key(2)]);
    for op in [
        KeyringOp::List,
        KeyringOp::Install(key(2)),
        KeyringOp::Install(key(1)),
        KeyringOp::Use(key(1).id()),
        KeyringOp::Remove(key(3).id()),
    ] {
        let out = rotate(&ring, &op).unwrap();
        assert!(!out.changed, "{op:?}");
        assert_eq!(ids(&out.keyring), ids(&ring), "{op:?}");
    }
}

#[test]
fn a_full_ring_refuses_one_more_key() {
    // Goal: the ring is bounded; a refusal names the bound and changes nothing.
    let others = (2..=KEYS_MAX as u8).map(key).collect();
    let ring = Keyring::new(key(1), others);
    assert_eq!(ring.keys().count(), KEYS_MAX);
    let e = rotate(&ring, &KeyringOp::Install(key(200))).unwrap_err();
    assert_eq!(e, KeyringRefusal::Full { max: KEYS_MAX });
}

#[test]
fn status_lists_ids_primary_first() {
    // Goal: what the API shows is ids in the ring's order, never keys.
    let ring = Keyring::new(key(1), vec![key(2), key(3)]);
    let status = KeyringStatus::of(&ring);
    assert_eq!(status.primary, key(1).id());
    assert_eq!(status.keys, [key(1).id(), key(2).id(), key(3).id()]);
}

#[test]
fn key_ids_parse_back_from_their_display() {
    // Goal: an operator may name a key by the id `keyring list` printed.
    let id = key(7).id();
    assert_eq!(KeyId::parse(&id.to_string()).unwrap(), id);
    assert_eq!(
        KeyId::parse(&id.to_string().to_uppercase()).unwrap(),
        id,
        "either case"
    );
    for bad in ["", "abc", "zz00000000000000", &format!("{id}00")] {
        assert!(KeyId::parse(bad).is_err(), "{bad:?}");
    }
}

fn op() -> impl Strategy<Value = KeyringOp> {
    // Few keys, so that operations keep meeting the keys held.
    prop_oneof![
        Just(KeyringOp::List),
        (0u8..12).prop_map(|b| KeyringOp::Install(key(b))),
        (0u8..12).prop_map(|b| KeyringOp::Use(key(b).id())),
        (0u8..12).prop_map(|b| KeyringOp::Remove(key(b).id())),
    ]
}

proptest! {
    #[test]
    fn any_sequence_keeps_a_bounded_ring_with_its_primary(ops in proptest::collection::vec(op(), 0..64)) {
        // Goal: whatever operators send, a refusal changes nothing, the ring never holds
        // a key twice or more than KEYS_MAX, and `changed` says whether it changed.
        let mut ring = Keyring::single(key(0));
        for op in &ops {
            match rotate(&ring, op) {
                Ok(out) => {
                    prop_assert_eq!(out.changed, ids(&out.keyring) != ids(&ring));
                    if let KeyringOp::Use(id) = op {
                        prop_assert_eq!(out.keyring.primary().id(), *id);
                    }
                    if let KeyringOp::Remove(id) = op {
                        prop_assert!(!ids(&out.keyring).contains(id));
                    }
                    ring = out.keyring;
                }
                Err(KeyringRefusal::RemovePrimary(id)) => prop_assert_eq!(ring.primary().id(), id),
                Err(KeyringRefusal::NotInstalled(id)) => prop_assert!(!ids(&ring).contains(&id)),
                Err(KeyringRefusal::Full { max }) => prop_assert_eq!(ring.keys().count(), max),
            }
            let held = ids(&ring);
            let unique: std::collections::BTreeSet<_> = held.iter().collect();
            prop_assert_eq!(unique.len(), held.len());
            prop_assert!(held.len() <= KEYS_MAX);
            prop_assert_eq!(held[0], ring.primary().id());
        }
    }
}
