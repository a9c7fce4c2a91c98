use super::*;
use proptest::prelude::*;

fn id(s: &str) -> Identity {
    Identity::parse(s).unwrap()
}

#[test]
fn each_shape_parses_into_its_kind() {
    let cases = [
        (
            "spiffe://mesh.example/region/eu-1/node/n1",
            IdentityKind::Node,
        ),
        (
            "spiffe://mesh.example/region/eu-1/authority/a2",
            IdentityKind::Authority,
        ),
        (
            "spiffe://mesh.example/region/eu-1/service/cart/instance/i-9",
            IdentityKind::Workload,
        ),
        (
            "spiffe://mesh.example/operator/alice",
            IdentityKind::Operator,
        ),
    ];
    for (s, kind) in cases {
        let parsed = id(s);
        assert_eq!(parsed.kind(), kind, "{s}");
        assert_eq!(parsed.to_string(), s);
        assert_eq!(parsed.trust_domain().as_str(), "mesh.example");
    }
}

#[test]
fn only_an_authority_has_a_member() {
    let authority = id("spiffe://mesh.example/region/eu-1/authority/a2");
    assert_eq!(authority.member().map(Name::as_str), Some("a2"));
    assert_eq!(authority.region().map(Name::as_str), Some("eu-1"));
    for s in [
        "spiffe://mesh.example/region/eu-1/node/a2",
        "spiffe://mesh.example/region/eu-1/service/a2/instance/a2",
        "spiffe://mesh.example/operator/a2",
    ] {
        assert_eq!(id(s).member(), None, "{s}");
    }
}

#[test]
fn malformed_identities_are_typed_errors() {
    use IdentityError as E;
    let long = format!("spiffe://td/operator/{}", "a".repeat(IDENTITY_LEN_MAX));
    type Check = fn(&IdentityError) -> bool;
    let cases: Vec<(&str, Check)> = vec![
        ("", |e| matches!(e, E::Empty)),
        (&long, |e| matches!(e, E::TooLong { .. })),
        ("https://td/operator/a", |e| matches!(e, E::NotSpiffe)),
        ("SPIFFE://td/operator/a", |e| matches!(e, E::NotSpiffe)),
        ("spiffe://td/operator/a?x=1", |e| {
            matches!(e, E::ExtraUriParts)
        }),
        ("spiffe://td/operator/a#f", |e| {
            matches!(e, E::ExtraUriParts)
        }),
        ("spiffe://td:443/operator/a", |e| {
            matches!(e, E::ExtraUriParts)
        }),
        ("spiffe://u@td/operator/a", |e| {
            matches!(e, E::ExtraUriParts)
        }),
        ("spiffe://td/operator/a%2Fb", |e| {
            matches!(e, E::ExtraUriParts)
        }),
        ("spiffe://TD/operator/a", |e| {
            matches!(e, E::BadTrustDomain { .. })
        }),
        ("spiffe:///operator/a", |e| {
            matches!(e, E::BadTrustDomain { .. })
        }),
        ("spiffe://td/operator/a/", |e| {
            matches!(e, E::BadName { .. })
        }),
        ("spiffe://td//operator/a", |e| {
            matches!(e, E::BadName { .. })
        }),
        ("spiffe://td/operator/..", |e| {
            matches!(e, E::BadName { .. })
        }),
        ("spiffe://td/operator/a b", |e| {
            matches!(e, E::BadName { .. })
        }),
        ("spiffe://td/region/eu/node", |e| {
            matches!(e, E::UnknownShape { .. })
        }),
        ("spiffe://td/region/eu/pod/p1", |e| {
            matches!(e, E::UnknownShape { .. })
        }),
        ("spiffe://td", |e| matches!(e, E::UnknownShape { .. })),
        ("spiffe://td/region/eu", |e| {
            matches!(e, E::UnknownShape { .. })
        }),
    ];
    for (input, check) in cases {
        let err = Identity::parse(input).unwrap_err();
        assert!(check(&err), "{input:?} gave {err:?}");
        // Messages are lower-case and carry no trailing period.
        let msg = err.to_string();
        assert!(!msg.ends_with('.'), "{msg}");
        assert!(msg.chars().next().unwrap().is_lowercase(), "{msg}");
    }
}

#[test]
fn ca_scope_parses_estate_and_region_uris() {
    let td = TrustDomain::new("mesh.example").unwrap();
    assert_eq!(
        CaScope::parse("spiffe://mesh.example").unwrap(),
        CaScope::Estate(td.clone())
    );
    let region = CaScope::parse("spiffe://mesh.example/region/eu").unwrap();
    assert_eq!(region, CaScope::Region(td, Name::new("eu").unwrap()));
    assert_eq!(region.to_string(), "spiffe://mesh.example/region/eu");
    assert!(CaScope::parse("spiffe://mesh.example/operator/x").is_err());
}

#[test]
fn kind_set_lists_members_in_fixed_order() {
    let set = KindSet::only(IdentityKind::Workload).with(IdentityKind::Node);
    assert!(set.contains(IdentityKind::Node));
    assert!(!set.contains(IdentityKind::Operator));
    assert_eq!(set.to_string(), "node, workload");
    assert_eq!(KindSet::EMPTY.to_string(), "none");
}

fn name_strategy() -> impl Strategy<Value = Name> {
    "[A-Za-z0-9._-]{1,20}"
        .prop_filter("not a dot segment", |s| s != "." && s != "..")
        .prop_map(|s| Name::new(&s).unwrap())
}

fn identity_strategy() -> impl Strategy<Value = Identity> {
    let td = "[a-z0-9._-]{1,30}".prop_map(|s| TrustDomain::new(&s).unwrap());
    let subject = prop_oneof![
        (name_strategy(), name_strategy())
            .prop_map(|(region, node)| Subject::Node { region, node }),
        (name_strategy(), name_strategy())
            .prop_map(|(region, member)| Subject::Authority { region, member }),
        (name_strategy(), name_strategy(), name_strategy()).prop_map(
            |(region, service, instance)| Subject::Workload {
                region,
                service,
                instance
            }
        ),
        name_strategy().prop_map(|name| Subject::Operator { name }),
    ];
    (td, subject).prop_map(|(td, subject)| Identity::new(td, subject))
}

proptest! {
    #[test]
    fn parse_of_display_is_identity(x in identity_strategy()) {
        prop_assert_eq!(Identity::parse(&x.to_string()), Ok(x));
    }

    #[test]
    fn accepted_strings_are_already_canonical(s in "spiffe://[a-z.]{1,5}(/[a-z.]{0,4}){0,7}") {
        if let Ok(x) = Identity::parse(&s) {
            prop_assert_eq!(x.to_string(), s);
        }
    }

    #[test]
    fn parsing_arbitrary_text_never_panics(s in "\\PC{0,80}") {
        let _ = Identity::parse(&s);
        let _ = CaScope::parse(&s);
    }
}
