//! `DesiredState::apply` over arbitrary command sequences (the registry's Raft state machine).
//!
//! Input: JSON lines of `Stamped`, or bytes for the structured decoder (`Gen::stamped`).
//! After every apply: the state serializes, and a refused command changed nothing but the
//! clock (checked on every refusal that leaves the clock alone, and every eighth one that
//! moves it). At the end the state's snapshot decodes back equal, and a second replica that
//! applied the same log — restored from a snapshot part-way, as a restarted member is —
//! agrees on every outcome and on the final state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use waymark_fuzz::{Gen, Limits, capped, is_json_lines, lines};
use waymark_registry::state::{Applied, DesiredState, Stamped};

fuzz_target!(|data: &[u8]| run(capped(data)));

fn run(data: &[u8]) {
    let log = commands(data);
    if log.is_empty() {
        return;
    }
    let restore_at = data.last().map_or(0, |b| usize::from(*b) % log.len());

    let mut state = DesiredState::new();
    let mut outcomes = Vec::with_capacity(log.len());
    for (i, stamped) in log.iter().enumerate() {
        let before = state.clone();
        let outcome = state.apply(stamped.clone());
        serde_json::to_vec(&state).expect("the desired state always serializes");
        // A refusal may move the clock only; comparing without it means JSON, which is
        // dear, so it is done for every eighth refusal that moved the clock.
        let clock_moved = stamped.at_ms > before.clock_ms();
        if outcome.is_err() && before != state && (!clock_moved || i % 8 == 0) {
            assert_eq!(
                without_clock(&before),
                without_clock(&state),
                "a refused command changed the state: {stamped:?} -> {outcome:?}"
            );
        }
        outcomes.push(outcome);
    }
    let bytes = serde_json::to_vec(&state).expect("the desired state serializes");
    let back: DesiredState = serde_json::from_slice(&bytes).expect("its snapshot decodes");
    assert_eq!(back, state, "the snapshot round-trips");

    let mut replica = DesiredState::new();
    for (i, (stamped, outcome)) in log.iter().zip(&outcomes).enumerate() {
        if i == restore_at {
            let bytes = serde_json::to_vec(&replica).expect("the desired state serializes");
            replica = serde_json::from_slice(&bytes).expect("its snapshot decodes");
        }
        let again = replica.apply(stamped.clone());
        assert_eq!(&again, outcome, "replicas disagree on {stamped:?}");
    }
    assert_eq!(replica, state, "replicas applying one log diverged");
}

/// The log to apply: decoded JSON lines, or commands from the structured decoder (which
/// learns the ids the registry issues so that later commands name them).
fn commands(data: &[u8]) -> Vec<Stamped> {
    if is_json_lines(data) {
        return lines(data)
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
    }
    let mut g = Gen::new(data);
    let mut probe = DesiredState::new();
    let mut log = Vec::new();
    while !g.is_empty() && log.len() < Limits::STEPS_MAX {
        let Some(stamped) = waymark_fuzz::decode::<Stamped>(g.stamped()) else {
            continue;
        };
        if let Ok(Applied::Registered { instance, .. }) = probe.apply(stamped.clone())
            && g.ids.len() < 32
        {
            g.ids.push(instance.to_string());
        }
        log.push(stamped);
    }
    log
}

/// The state as JSON without its clock, which every command advances, refused or not.
fn without_clock(state: &DesiredState) -> serde_json::Value {
    let mut v = serde_json::to_value(state).expect("the desired state serializes");
    if let Some(m) = v.as_object_mut() {
        m.remove("clock_ms");
    }
    v
}
