//! Health contracts and service policies: JSON decode, `validate()`, the derived cadences,
//! and the one duration grammar (`waymark_core::duration_str`).
//!
//! Input: a JSON contract (`{...}`, as `PUT /v1/services/{s}` and `POST
//! /v1/contracts/validate` carry it), or bytes for the structured decoder. Every line is
//! also tried as a duration string and a `ServicePolicyRecord`. Checked: nothing panics,
//! a valid contract re-encodes to one that validates the same, and durations round-trip
//! through `format`/`parse`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use waymark_core::contract::HealthContract;
use waymark_core::duration_str;
use waymark_core::model::EvidenceClass;
use waymark_core::units::Permille;
use waymark_fuzz::{Gen, capped, is_json_lines, lines};
use waymark_registry::state::ServicePolicyRecord;

fuzz_target!(|data: &[u8]| run(capped(data)));

fn run(data: &[u8]) {
    if is_json_lines(data) || data.first() == Some(&b'"') {
        for line in lines(data) {
            check_json(line);
        }
        return;
    }
    let mut g = Gen::new(data);
    for _ in 0..8 {
        if g.is_empty() {
            break;
        }
        let contract = serde_json::to_vec(&g.contract()).expect("JSON values encode");
        check_json(&contract);
        let policy = serde_json::to_vec(&g.policy()).expect("JSON values encode");
        check_json(&policy);
        let raw = g.raw_text(24);
        check_duration(&raw);
        check_duration(&g.duration());
    }
}

fn check_json(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        check_duration(text.trim().trim_matches('"'));
    }
    if let Ok(policy) = serde_json::from_slice::<ServicePolicyRecord>(bytes) {
        let again = serde_json::to_vec(&policy).expect("a policy encodes");
        let back: ServicePolicyRecord = serde_json::from_slice(&again).expect("and decodes");
        assert_eq!(back, policy);
    }
    let Ok(contract) = serde_json::from_slice::<HealthContract>(bytes) else {
        return;
    };
    let encoded = serde_json::to_vec(&contract).expect("a contract encodes");
    let decoded: HealthContract =
        serde_json::from_slice(&encoded).expect("an encoded contract decodes");
    assert_eq!(decoded, contract, "a contract round-trips through JSON");

    let verdict = contract.clone().validate();
    assert_eq!(
        decoded.validate().is_ok(),
        verdict.is_ok(),
        "validation depends on the contract alone"
    );
    match verdict {
        Ok(valid) => {
            for class in EvidenceClass::ALL {
                let _ = valid.interval_of(class);
                let _ = valid.silence_of(class);
                for threshold in [1, 500, 1000] {
                    let p = Permille::new(threshold).expect("in range");
                    let _ = valid.detection_time(class, p);
                }
            }
        }
        Err(e) => {
            // The refusal names a field and renders, as the API returns it.
            let _ = e.field();
            let _ = e.to_string();
        }
    }
}

fn check_duration(text: &str) {
    if text.len() > 64 {
        return;
    }
    if let Ok(d) = duration_str::parse(text) {
        let formatted = duration_str::format(d);
        assert_eq!(
            duration_str::parse(&formatted).ok(),
            Some(d),
            "{text:?} parsed to {d:?}, formatted as {formatted:?}, which does not parse back"
        );
    }
}
