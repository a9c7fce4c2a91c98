//! The budget constants are the ones `docs/budgets.md` states. Every test, the simulation
//! and the drills derive their limits from these constants, so this is the one place a
//! loosened budget is caught: change the page and the constant together, or this fails.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use waymark_core::defaults as d;

/// A value as the page writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    Duration(Duration),
    Percent(u32),
    Count(u64),
}

fn parse(text: &str) -> Value {
    let text = text.trim();
    let number = |s: &str| -> u64 {
        s.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{text:?}: not a number"))
    };
    if let Some(n) = text.strip_suffix('%') {
        return Value::Percent(u32::try_from(number(n)).unwrap());
    }
    for (unit, scale) in [(" ms", 1), (" s", 1_000), (" min", 60_000)] {
        if let Some(n) = text.strip_suffix(unit) {
            return Value::Duration(Duration::from_millis(number(n) * scale));
        }
    }
    Value::Count(number(text))
}

/// `constant → value` from the page's table rows (`| promise | value | `CONSTANT` |`).
fn page() -> BTreeMap<String, Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/budgets.md");
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
            let [_, value, constant] = cells.as_slice() else {
                return None;
            };
            let constant = constant.trim().strip_prefix('`')?.strip_suffix('`')?;
            Some((constant.to_owned(), parse(value)))
        })
        .collect()
}

/// What the code says, for every constant the page may name.
fn code() -> BTreeMap<String, Value> {
    let percent = |p: waymark_core::units::Permille| {
        assert_eq!(p.get() % 10, 0, "{p:?} is not a whole percent");
        Value::Percent(u32::from(p.get() / 10))
    };
    [
        (
            "WITHDRAWAL_BUDGET_P99",
            Value::Duration(d::WITHDRAWAL_BUDGET_P99),
        ),
        (
            "WITHDRAWAL_BUDGET_P999",
            Value::Duration(d::WITHDRAWAL_BUDGET_P999),
        ),
        (
            "ADMISSION_BUDGET_P99",
            Value::Duration(d::ADMISSION_BUDGET_P99),
        ),
        (
            "HARD_FAILURE_BUDGET_P99",
            Value::Duration(d::HARD_FAILURE_BUDGET_P99),
        ),
        ("DAMPING_BUDGET", Value::Duration(d::DAMPING_BUDGET)),
        ("STATIC_SERVING_MIN", Value::Duration(d::STATIC_SERVING_MIN)),
        ("MIN_HEALTHY", percent(d::MIN_HEALTHY)),
        (
            "FLAP_TRANSITIONS_MAX",
            Value::Count(u64::from(d::FLAP_TRANSITIONS_MAX)),
        ),
        ("FLAP_WINDOW", Value::Duration(d::FLAP_WINDOW)),
        ("QUARANTINE_FIRST", Value::Duration(d::QUARANTINE_FIRST)),
        ("QUARANTINE_MAX", Value::Duration(d::QUARANTINE_MAX)),
        ("SLOW_START", Value::Duration(d::SLOW_START)),
        ("RECONNECT_PERMILLE", percent(d::RECONNECT_PERMILLE)),
        ("RECONNECT_WINDOW", Value::Duration(d::RECONNECT_WINDOW)),
        ("LEASE", Value::Duration(d::LEASE)),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect()
}

#[test]
fn every_budget_constant_is_the_value_the_budgets_page_states() {
    let (page, code) = (page(), code());
    // The page names every budget the code holds, and nothing the code lacks.
    assert_eq!(
        page.keys().collect::<Vec<_>>(),
        code.keys().collect::<Vec<_>>(),
        "docs/budgets.md and the constants name different budgets"
    );
    for (name, stated) in &page {
        assert_eq!(
            &code[name], stated,
            "{name} differs from docs/budgets.md: change both, deliberately"
        );
    }
}

#[test]
fn the_page_is_read_as_written() {
    // The parser itself, so a misread page cannot pass for a matching one.
    assert_eq!(parse("5 s"), Value::Duration(Duration::from_secs(5)));
    assert_eq!(parse("10 min"), Value::Duration(Duration::from_secs(600)));
    assert_eq!(parse("50 ms"), Value::Duration(Duration::from_millis(50)));
    assert_eq!(parse("5%"), Value::Percent(5));
    assert_eq!(parse("4"), Value::Count(4));
    assert_ne!(parse("5 s"), parse("5 min"));
}
