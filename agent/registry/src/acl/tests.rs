//! Grants and tokens: default deny, scopes hold, refusals change nothing.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;

fn eu() -> RegionName {
    RegionName::try_new("eu").unwrap()
}

fn node(n: &str) -> Principal {
    Principal::Node {
        region: eu(),
        node: NodeName::try_new(n).unwrap(),
    }
}

fn operator(n: &str) -> Principal {
    Principal::Operator { name: n.into() }
}

fn svc(s: &str) -> ServiceName {
    ServiceName::try_new(s).unwrap()
}

fn bootstrapped() -> Acl {
    let mut acl = Acl::default();
    acl.apply(
        AclCommand::Bootstrap {
            operator: "alice".into(),
            token: None,
        },
        1_000,
    )
    .unwrap();
    acl
}

fn token(name: &str, secret: &str, expires_at_ms: u64) -> AclCommand {
    AclCommand::PutToken {
        token: TokenRecord {
            name: name.into(),
            secret_sha256: secret_digest(secret),
            created_by: "operator/alice".into(),
            created_at_ms: 1_000,
            expires_at_ms,
            description: "ci".into(),
        },
    }
}

#[test]
fn nothing_is_allowed_before_bootstrap() {
    let acl = Acl::default();
    let n1 = NodeName::try_new("n1").unwrap();
    for (who, action) in [
        (operator("alice"), Action::Read),
        (operator("alice"), Action::Acl),
        (node("n1"), Action::Register { node: &n1 }),
    ] {
        let denied = acl.authorize(&who, &eu(), action).unwrap_err();
        assert_eq!(denied.principal, who.to_string());
    }
}

#[test]
fn bootstrap_gives_the_operator_everything_and_nodes_their_own_node() {
    let acl = bootstrapped();
    let (n1, n2) = (
        NodeName::try_new("n1").unwrap(),
        NodeName::try_new("n2").unwrap(),
    );
    let pay = svc("pay");
    for action in [
        Action::Read,
        Action::Register { node: &n2 },
        Action::WriteService { service: &pay },
        Action::Override { service: &pay },
        Action::Evacuate,
        Action::Raft,
        Action::Acl,
    ] {
        acl.authorize(&operator("alice"), &eu(), action).unwrap();
        assert!(acl.authorize(&operator("mallory"), &eu(), action).is_err());
    }
    acl.authorize(&node("n1"), &eu(), Action::Read).unwrap();
    acl.authorize(&node("n1"), &eu(), Action::Register { node: &n1 })
        .unwrap();
    let denied = acl
        .authorize(&node("n1"), &eu(), Action::Register { node: &n2 })
        .unwrap_err();
    assert_eq!(denied.needed, "register:n2");
    let denied = acl
        .authorize(&node("n1"), &eu(), Action::WriteService { service: &pay })
        .unwrap_err();
    assert_eq!(denied.needed, "own:pay");
    // A node of another region is not one of this region's nodes.
    let us_node = Principal::Node {
        region: RegionName::try_new("us").unwrap(),
        node: n1.clone(),
    };
    assert!(acl.authorize(&us_node, &eu(), Action::Read).is_err());
}

#[test]
fn bootstrap_is_accepted_once() {
    let mut acl = bootstrapped();
    let before = acl.clone();
    assert_eq!(
        acl.apply(
            AclCommand::Bootstrap {
                operator: "mallory".into(),
                token: None
            },
            2_000
        ),
        Err(AclError::AlreadyBootstrapped)
    );
    assert_eq!(acl, before);
}

#[test]
fn a_service_grant_covers_that_service_only() {
    let mut acl = bootstrapped();
    let grant = Grant {
        to: "operator/bob".parse().unwrap(),
        can: "own:pay".parse().unwrap(),
    };
    acl.apply(
        AclCommand::Grant {
            grant: grant.clone(),
        },
        2_000,
    )
    .unwrap();
    let (pay, web) = (svc("pay"), svc("web"));
    acl.authorize(
        &operator("bob"),
        &eu(),
        Action::WriteService { service: &pay },
    )
    .unwrap();
    assert!(
        acl.authorize(
            &operator("bob"),
            &eu(),
            Action::WriteService { service: &web }
        )
        .is_err()
    );
    assert!(
        acl.authorize(&operator("bob"), &eu(), Action::Override { service: &pay })
            .is_err(),
        "owning is not overriding"
    );
    acl.apply(
        AclCommand::Revoke {
            grant: grant.clone(),
        },
        3_000,
    )
    .unwrap();
    assert!(
        acl.authorize(
            &operator("bob"),
            &eu(),
            Action::WriteService { service: &pay }
        )
        .is_err()
    );
    assert_eq!(
        acl.apply(AclCommand::Revoke { grant }, 3_000),
        Err(AclError::UnknownGrant("operator/bob own:pay".into()))
    );
}

#[test]
fn a_token_authenticates_until_it_expires_or_is_removed() {
    let mut acl = bootstrapped();
    acl.apply(token("ci", "s3cret", 10_000), 2_000).unwrap();
    let ci = bearer("ci", "s3cret");
    let who = acl.authenticate(&ci, 5_000).unwrap();
    assert_eq!(who, Principal::Token { name: "ci".into() });
    assert!(
        acl.authorize(&who, &eu(), Action::Read).is_err(),
        "no grant yet"
    );
    acl.apply(
        AclCommand::Grant {
            grant: Grant {
                to: Grantee::Token("ci".into()),
                can: Capability::Read,
            },
        },
        3_000,
    )
    .unwrap();
    acl.authorize(&who, &eu(), Action::Read).unwrap();
    assert_eq!(
        acl.authenticate(&bearer("ci", "guess"), 5_000),
        Err(TokenRefusal::WrongSecret)
    );
    assert_eq!(
        acl.authenticate(&bearer("cd", "s3cret"), 5_000),
        Err(TokenRefusal::Unknown)
    );
    assert_eq!(
        acl.authenticate("Bearer ci s3cret", 5_000),
        Err(TokenRefusal::Malformed)
    );
    assert_eq!(acl.authenticate(&ci, 10_000), Err(TokenRefusal::Expired));
    assert_eq!(
        acl.apply(AclCommand::RemoveToken { name: "ci".into() }, 6_000),
        Ok(AclApplied::TokenRemoved { grants: 1 })
    );
    assert_eq!(acl.authenticate(&ci, 7_000), Err(TokenRefusal::Unknown));
    assert!(acl.grants().all(|g| g.to != Grantee::Token("ci".into())));
}

#[test]
fn token_lifetimes_names_and_digests_are_checked() {
    let mut acl = bootstrapped();
    let before = acl.clone();
    for (command, what) in [
        (token("ci", "x", 2_000), "expiry not after now"),
        (
            token("ci", "x", 2_000 + TOKEN_TTL_MS_MAX + 1),
            "longer than the ceiling",
        ),
        (token("CI", "x", 10_000), "uppercase name"),
        (
            token("c.i", "x", 10_000),
            "a dot would make the bearer ambiguous",
        ),
    ] {
        assert!(acl.apply(command, 2_000).is_err(), "{what}");
    }
    let mut bad_digest = token("ci", "x", 10_000);
    if let AclCommand::PutToken { token } = &mut bad_digest {
        token.secret_sha256 = "not-hex".into();
    }
    assert_eq!(
        acl.apply(bad_digest, 2_000),
        Err(AclError::BadDigest("ci".into()))
    );
    assert_eq!(
        acl.apply(
            AclCommand::Grant {
                grant: Grant {
                    to: Grantee::Token("nobody".into()),
                    can: Capability::Read
                }
            },
            2_000
        ),
        Err(AclError::UnknownToken("nobody".into()))
    );
    assert_eq!(acl, before, "refusals change nothing");
    acl.apply(token("ci", "x", 10_000), 2_000).unwrap();
    assert_eq!(
        acl.apply(token("ci", "y", 10_000), 2_000),
        Err(AclError::TokenExists("ci".into()))
    );
}

#[test]
fn expired_tokens_and_their_grants_are_dropped_when_tokens_change() {
    let mut acl = bootstrapped();
    acl.apply(token("old", "a", 5_000), 2_000).unwrap();
    acl.apply(
        AclCommand::Grant {
            grant: Grant {
                to: Grantee::Token("old".into()),
                can: Capability::Read,
            },
        },
        2_000,
    )
    .unwrap();
    acl.apply(token("new", "b", 20_000), 6_000).unwrap();
    let names: Vec<_> = acl.tokens().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["new"]);
    assert!(acl.grants().all(|g| g.to != Grantee::Token("old".into())));
}

#[test]
fn grants_read_and_print_the_same() {
    for text in [
        "read",
        "register:own",
        "register:*",
        "register:n1",
        "own:pay",
        "own:*",
        "override:pay",
        "override:*",
        "evacuate",
        "raft",
        "acl",
    ] {
        let c: Capability = text.parse().unwrap();
        assert_eq!(c.to_string(), text);
    }
    for text in [
        "operator/alice",
        "token/ci",
        "node/n1",
        "node/*",
        "service/pay",
    ] {
        let g: Grantee = text.parse().unwrap();
        assert_eq!(g.to_string(), text);
    }
    for bad in ["write", "own:", "register:", "override:bad name", "root"] {
        assert!(bad.parse::<Capability>().is_err(), "{bad}");
    }
    for bad in ["alice", "operator/", "token/UP", "cluster/x", "node/a b"] {
        assert!(bad.parse::<Grantee>().is_err(), "{bad}");
    }
    let grant = Grant {
        to: Grantee::AnyNode,
        can: Capability::Register(NodeScope::Own),
    };
    let json = serde_json::to_string(&grant).unwrap();
    assert_eq!(json, r#"{"to":"node/*","can":"register:own"}"#);
    assert_eq!(serde_json::from_str::<Grant>(&json).unwrap(), grant);
}

fn command() -> impl Strategy<Value = AclCommand> {
    let name = prop_oneof![
        Just("ci".to_owned()),
        Just("scrape".to_owned()),
        Just(String::new()),
        Just("X".repeat(70)),
    ];
    let grantee = prop_oneof![
        Just("operator/alice"),
        Just("operator/bob"),
        Just("token/ci"),
        Just("token/scrape"),
        Just("node/*"),
        Just("node/n1"),
        Just("service/pay"),
    ]
    .prop_map(|g| g.parse::<Grantee>().unwrap());
    let capability = prop_oneof![
        Just("read"),
        Just("acl"),
        Just("own:pay"),
        Just("register:own"),
        Just("override:*"),
    ]
    .prop_map(|c| c.parse::<Capability>().unwrap());
    let grant = (grantee, capability).prop_map(|(to, can)| Grant { to, can });
    prop_oneof![
        Just(AclCommand::Bootstrap {
            operator: "alice".into(),
            token: None
        }),
        grant.clone().prop_map(|grant| AclCommand::Grant { grant }),
        grant.prop_map(|grant| AclCommand::Revoke { grant }),
        (name.clone(), 0u64..50_000).prop_map(|(name, expires_at_ms)| AclCommand::PutToken {
            token: TokenRecord {
                name,
                secret_sha256: secret_digest("s"),
                created_by: "operator/alice".into(),
                created_at_ms: 0,
                expires_at_ms,
                description: String::new(),
            }
        }),
        name.prop_map(|name| AclCommand::RemoveToken { name }),
    ]
}

proptest! {
    #[test]
    fn apply_is_total_and_a_refusal_changes_nothing(
        log in prop::collection::vec((0u64..40_000, command()), 1..40)
    ) {
        let mut acl = Acl::default();
        let mut now = 0;
        for (at, command) in log {
            now = now.max(at);
            let before = acl.clone();
            if acl.apply(command, now).is_err() {
                prop_assert_eq!(&acl, &before);
            }
            // Every grant to a token names a token that exists.
            for g in acl.grants() {
                if let Grantee::Token(t) = &g.to {
                    prop_assert!(acl.tokens().any(|r| &r.name == t), "grant to missing token {}", t);
                }
            }
        }
        let bytes = serde_json::to_vec(&acl).unwrap();
        let back: Acl = serde_json::from_slice(&bytes).unwrap();
        prop_assert_eq!(back, acl);
    }
}

#[test]
fn bootstrap_with_a_token_stores_it_with_every_grant_in_one_step() {
    // Goal: the configured management token was stored, then granted one capability at
    // a time, so a client could see it holding `read` but not yet `own:*`.
    let mut acl = Acl::default();
    let record = |expires_at_ms| TokenRecord {
        name: "management".into(),
        secret_sha256: secret_digest("s"),
        created_by: "configuration".into(),
        created_at_ms: 1_000,
        expires_at_ms,
        description: String::new(),
    };
    let before = acl.clone();
    assert!(matches!(
        acl.apply(
            AclCommand::Bootstrap {
                operator: "management".into(),
                token: Some(record(1_000)),
            },
            1_000
        ),
        Err(AclError::BadExpiry { .. })
    ));
    assert_eq!(acl, before, "a refused bootstrap changes nothing");
    acl.apply(
        AclCommand::Bootstrap {
            operator: "management".into(),
            token: Some(record(10_000)),
        },
        1_000,
    )
    .unwrap();
    let who = acl.authenticate(&bearer("management", "s"), 2_000).unwrap();
    let pay = svc("pay");
    for action in [
        Action::Read,
        Action::WriteService { service: &pay },
        Action::Acl,
    ] {
        acl.authorize(&who, &eu(), action).unwrap();
    }
}
