#![allow(clippy::unwrap_used)]

use super::*;
use crate::gossip::codec::{KEY_LEN, Key};

fn id(b: u8) -> KeyId {
    Key::from_bytes(&[b; KEY_LEN]).id()
}

fn held(name: &str, primary: u8, others: &[u8]) -> TargetResult {
    let mut keys = vec![id(primary)];
    keys.extend(others.iter().map(|b| id(*b)));
    TargetResult {
        name: name.into(),
        kind: TargetKind::Agent,
        outcome: TargetOutcome::Held {
            status: KeyringStatus {
                primary: id(primary),
                keys,
            },
            changed: false,
        },
    }
}

fn failed(name: &str) -> TargetResult {
    TargetResult {
        name: name.into(),
        kind: TargetKind::Agent,
        outcome: TargetOutcome::Failed {
            reason: "timeout".into(),
            message: "no answer".into(),
        },
    }
}

#[test]
fn counts_say_who_holds_each_key_and_where_it_is_primary() {
    // Goal: the answer reads like `consul keyring -list`: N of M hold X, primary on P.
    let report = PoolReport::new(
        &KeyringOp::List,
        vec![held("n2", 1, &[2]), held("n1", 2, &[1]), failed("n3")],
    );
    let counts = report.counts();
    assert_eq!(
        counts[&id(1)],
        KeyCount {
            held_by: 2,
            primary_on: 1
        }
    );
    assert_eq!(
        counts[&id(2)],
        KeyCount {
            held_by: 2,
            primary_on: 1
        }
    );
    assert_eq!(report.answered(), 2);
    assert!(!report.complete());
    let v = report.to_json();
    assert_eq!(v["total"], 3);
    assert_eq!(v["keys"][0]["of"], 3);
    let names: Vec<&str> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["n1", "n2", "n3"], "sorted");
    assert_eq!(v["nodes"][2]["result"], "failed");
    let text = v.to_string();
    assert!(!text.contains(&hex_of(1)), "no key material: {text}");
}

fn hex_of(b: u8) -> String {
    format!("{b:02x}").repeat(KEY_LEN)
}

#[test]
fn use_is_refused_until_every_target_holds_the_key() {
    // Goal: no target ever seals with a key a peer cannot open.
    let listed = [held("n1", 1, &[2]), held("n2", 1, &[])];
    let e = precheck(&KeyringOp::Use(id(2)), &listed, false).unwrap_err();
    assert_eq!(
        e,
        PoolRefusal::NotInstalled {
            key: id(2),
            on: vec!["n2".into()]
        }
    );
    assert_eq!(e.reason(), "key_not_installed");
    assert!(e.to_string().contains("n2"), "{e}");
    // `force` skips only the targets that did not answer, never one that lacks the key.
    assert!(precheck(&KeyringOp::Use(id(2)), &listed, true).is_err());
    let all = [held("n1", 1, &[2]), held("n2", 1, &[2])];
    assert!(precheck(&KeyringOp::Use(id(2)), &all, false).is_ok());
}

#[test]
fn remove_is_refused_while_any_target_seals_with_the_key() {
    // Goal: retiring a key never shuts out a target that has not switched yet.
    let listed = [held("n1", 2, &[1]), held("n2", 1, &[2])];
    let e = precheck(&KeyringOp::Remove(id(1)), &listed, false).unwrap_err();
    assert_eq!(
        e,
        PoolRefusal::Primary {
            key: id(1),
            on: vec!["n2".into()]
        }
    );
    let switched = [held("n1", 2, &[1]), held("n2", 2, &[1])];
    assert!(precheck(&KeyringOp::Remove(id(1)), &switched, false).is_ok());
}

#[test]
fn a_silent_target_blocks_use_and_remove_unless_forced() {
    // Goal: an unknown keyring is not assumed ready; the operator may choose to leave
    // an offline node behind (docs/operations.md says how it comes back).
    let listed = [held("n1", 1, &[2]), failed("n2")];
    let e = precheck(&KeyringOp::Use(id(2)), &listed, false).unwrap_err();
    assert_eq!(e.reason(), "unconfirmed");
    assert!(precheck(&KeyringOp::Use(id(2)), &listed, true).is_ok());
    assert!(
        precheck(
            &KeyringOp::Install(Key::from_bytes(&[2; KEY_LEN])),
            &listed,
            false
        )
        .is_ok()
    );
}

#[test]
fn a_long_list_of_names_is_cut_in_the_message() {
    // Goal: a refusal's message stays readable (and bounded) on a large pool.
    let on: Vec<String> = (0..25).map(|i| format!("n{i}")).collect();
    let e = PoolRefusal::Unconfirmed { key: id(1), on };
    let text = e.to_string();
    assert!(
        text.contains("n9") && !text.contains("n10,") && text.contains("15 more"),
        "{text}"
    );
}
