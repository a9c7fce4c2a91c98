use proptest::prelude::*;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn reads_what_go_and_envoy_users_write() {
    // Goal: every form the grammar promises, including Go's and the day.
    let cases = [
        ("0", Duration::ZERO),
        ("0s", Duration::ZERO),
        ("250ms", ms(250)),
        ("10s", ms(10_000)),
        ("1.5s", ms(1_500)),
        ("0.5s", ms(500)),
        ("1m30s", ms(90_000)),
        ("2h45m", ms(9_900_000)),
        ("1d", Duration::from_secs(86_400)),
        ("7d", Duration::from_secs(7 * 86_400)),
        ("1h0.5s", ms(3_600_500)),
        ("30s1m", ms(90_000)),
        ("1s1s", ms(2_000)),
        ("1ns", Duration::from_nanos(1)),
        ("1.5us", Duration::from_nanos(1_500)),
        ("1\u{b5}s", Duration::from_micros(1)),
        ("0.000000001s", Duration::from_nanos(1)),
        ("1.50000000000000000000000s", ms(1_500)),
        ("007s", ms(7_000)),
    ];
    for (text, want) in cases {
        assert_eq!(parse(text), Ok(want), "{text:?}");
    }
}

#[test]
fn refusals_say_what_is_wrong_and_where() {
    // Goal: each refusal names its kind and the byte where the fault starts.
    use DurationErrorKind as K;
    let unknown = |u: &str| K::UnknownUnit { unit: u.to_owned() };
    let cases = [
        ("", K::Empty, 0),
        ("-1s", K::Sign, 0),
        ("+1s", K::Sign, 0),
        ("1s-1s", K::Sign, 2),
        (" 1s", K::Whitespace, 0),
        ("1 s", K::Whitespace, 1),
        ("1s ", K::Whitespace, 2),
        ("s", K::ExpectedNumber, 0),
        ("1s!", K::ExpectedNumber, 2),
        ("1.s", K::BadFraction, 1),
        (".5s", K::ExpectedNumber, 0),
        ("1.", K::BadFraction, 1),
        ("10", K::MissingUnit, 0),
        ("1h30", K::MissingUnit, 2),
        ("00", K::MissingUnit, 0),
        ("10sec", unknown("sec"), 2),
        ("1m30x", unknown("x"), 4),
        ("1S", unknown("S"), 1),
        ("1\u{3bc}s", unknown("\u{3bc}s"), 1),
        ("1.5ns", K::TooPrecise, 0),
        ("1s0.0000000001s", K::TooPrecise, 2),
        ("0.1234567890123456789d", K::TooPrecise, 0),
        ("99999999999999999999999999999999999999999ns", K::TooLong, 0),
        ("213503982334602d", K::TooLong, 0),
    ];
    for (text, kind, at) in cases {
        let e = parse(text).expect_err(text);
        assert_eq!((e.kind(), e.at()), (&kind, at), "{text:?}: {e}");
    }
}

#[test]
fn the_message_quotes_the_input_and_counts_characters() {
    let e = parse("1µs2x").unwrap_err();
    assert_eq!(
        e.to_string(),
        "\"1µs2x\" is not a duration: unknown unit \"x\" at character 5 \
         (write e.g. 250ms, 1.5s, 1m30s, 2h45m or 1d)"
    );
    let long = "9".repeat(1_000);
    assert!(parse(&long).unwrap_err().to_string().len() < 250);
}

#[test]
fn formats_in_the_canonical_form() {
    let cases = [
        (Duration::ZERO, "0s"),
        (Duration::from_nanos(1), "1ns"),
        (Duration::from_nanos(1_500), "1.5us"),
        (Duration::from_nanos(1_000_001), "1.000001ms"),
        (ms(250), "250ms"),
        (ms(1_500), "1.5s"),
        (ms(10_000), "10s"),
        (ms(90_000), "1m30s"),
        (ms(3_600_001), "1h1ms"),
        (ms(3_601_500), "1h1.5s"),
        (Duration::from_secs(9_900), "2h45m"),
        (Duration::from_secs(86_400), "1d"),
        (Duration::from_secs(30 * 86_400), "30d"),
        (Duration::from_secs(90_061), "1d1h1m1s"),
        (MAX, "213503982334601d7h15.999999999s"),
    ];
    for (value, want) in cases {
        assert_eq!(format(value), want, "{value:?}");
    }
}

#[test]
fn the_longest_duration_round_trips_and_one_more_nanosecond_is_refused() {
    assert_eq!(parse(&format(MAX)), Ok(MAX));
    let over = format!("{}1ns", format(MAX));
    assert_eq!(
        parse(&over).unwrap_err().kind(),
        &DurationErrorKind::TooLong
    );
}

#[test]
fn serde_reads_and_writes_the_grammar() {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Config {
        #[serde(with = "crate::duration_str")]
        window: Duration,
    }
    let c: Config = serde_json::from_str(r#"{"window": "1m30s"}"#).unwrap();
    assert_eq!(c.window, ms(90_000));
    assert_eq!(serde_json::to_string(&c).unwrap(), r#"{"window":"1m30s"}"#);
    let e = serde_json::from_str::<Config>(r#"{"window": "90"}"#).unwrap_err();
    assert!(e.to_string().contains("has no unit"), "{e}");
}

const UNIT_NAMES: [&str; 8] = ["ns", "us", "\u{b5}s", "ms", "s", "m", "h", "d"];

/// One generated part: the whole number, the fraction's digits (maybe none), the unit.
fn part() -> impl Strategy<Value = (u64, Option<String>, usize)> {
    (
        0u64..1_000_000,
        proptest::option::of("[0-9]{1,10}"),
        0..UNIT_NAMES.len(),
    )
}

/// The reference: a part's exact length in nanoseconds, `None` if it is not whole.
fn part_nanos(whole: u64, fraction: Option<&str>, unit: usize) -> Option<u128> {
    let unit_nanos = UNITS
        .iter()
        .find(|(name, _)| *name == UNIT_NAMES[unit])
        .map(|(_, n)| *n)
        .expect("every generated unit is a unit");
    let mut nanos = u128::from(whole) * unit_nanos;
    if let Some(digits) = fraction {
        let scale = 10u128.pow(digits.len() as u32);
        let scaled = digits.parse::<u128>().expect("digits") * unit_nanos;
        if scaled % scale != 0 {
            return None;
        }
        nanos += scaled / scale;
    }
    Some(nanos)
}

proptest! {
    #[test]
    fn parse_of_format_is_the_identity(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
        let d = Duration::new(secs, nanos);
        let text = format(d);
        prop_assert_eq!(parse(&text), Ok(d), "{}", text);
    }

    #[test]
    fn format_of_parse_is_canonical(secs in 0u64..10_000_000, nanos in 0u32..1_000_000_000) {
        // A canonical string parses to a duration that formats to the same string.
        let text = format(Duration::new(secs, nanos));
        prop_assert_eq!(format(parse(&text).unwrap()), text);
    }

    #[test]
    fn a_sequence_of_parts_parses_to_their_sum(parts in proptest::collection::vec(part(), 1..6)) {
        let text: String = parts
            .iter()
            .map(|(whole, fraction, unit)| match fraction {
                Some(f) => format!("{whole}.{f}{}", UNIT_NAMES[*unit]),
                None => format!("{whole}{}", UNIT_NAMES[*unit]),
            })
            .collect();
        let want: Option<u128> = parts
            .iter()
            .map(|(w, f, u)| part_nanos(*w, f.as_deref(), *u))
            .sum();
        match (parse(&text), want) {
            (Ok(d), Some(nanos)) => prop_assert_eq!(d.as_nanos(), nanos, "{}", text),
            (Err(e), None) => prop_assert_eq!(e.kind(), &DurationErrorKind::TooPrecise),
            (got, want) => prop_assert!(false, "{text:?}: got {got:?}, want {want:?} ns"),
        }
    }

    #[test]
    fn no_string_makes_parse_panic(text in "\\PC{0,24}") {
        if let Ok(d) = parse(&text) {
            prop_assert_eq!(parse(&format(d)), Ok(d));
        }
    }
}
