use std::time::{Duration, SystemTime};

use super::*;
use crate::identity::KindSet;
use crate::lifetime::LEAF_TTL_DEFAULT;
use crate::material::{MaterialPem, PeerPolicy, SanEntry, validate_material};

fn setup() -> (RootCa, RegionCa, SystemTime) {
    crate::install_crypto_provider();
    let now = SystemTime::now();
    let root = RootCa::generate(TrustDomain::new("mesh").unwrap(), now).unwrap();
    let eu = root.issue_region(Name::new("eu").unwrap(), now).unwrap();
    (root, eu, now)
}

fn id(s: &str) -> Identity {
    s.parse().unwrap()
}

#[test]
fn root_and_region_survive_a_round_trip_through_pem() {
    let (root, eu, _) = setup();
    let root2 = RootCa::from_pem(root.cert_pem(), &root.key_pem()).unwrap();
    assert_eq!(root2.trust_domain().as_str(), "mesh");
    let eu2 = RegionCa::from_pem(eu.cert_pem(), &eu.key_pem()).unwrap();
    assert_eq!(eu2.region().as_str(), "eu");
    assert!(eu2.info().is_ca);
    // A root is not a region and vice versa.
    assert!(matches!(
        RegionCa::from_pem(root.cert_pem(), &root.key_pem()),
        Err(CaError::NotOurCa { .. })
    ));
    assert!(matches!(
        RootCa::from_pem(eu.cert_pem(), &eu.key_pem()),
        Err(CaError::NotOurCa { .. })
    ));
    // A CA key that does not match its certificate is refused.
    assert!(matches!(
        RegionCa::from_pem(eu.cert_pem(), &root.key_pem()),
        Err(CaError::Cert(CertError::KeyMismatch))
    ));
}

#[test]
fn issued_leaf_has_one_uri_san_and_validates_as_material() {
    let (root, eu, now) = setup();
    let leaf = eu
        .issue(
            &id("spiffe://mesh/region/eu/node/n1"),
            now,
            LEAF_TTL_DEFAULT,
        )
        .unwrap();
    assert_eq!(
        leaf.info.identity().unwrap().to_string(),
        "spiffe://mesh/region/eu/node/n1"
    );
    assert_eq!(leaf.info.not_after - leaf.info.not_before, 24 * 3600 + 300);
    let chain = leaf.fullchain_pem();
    let policy = PeerPolicy {
        trust_domain: TrustDomain::new("mesh").unwrap(),
        accepted: KindSet::ALL,
        region: None,
    };
    let pem = MaterialPem {
        cert_chain: chain.as_bytes(),
        key: leaf.key_pem.as_bytes(),
        bundle: root.cert_pem().as_bytes(),
    };
    let material = validate_material(pem, &policy, now).unwrap();
    assert_eq!(material.leaf.serial, leaf.info.serial);
    // Debug never shows the key.
    assert!(!format!("{leaf:?}").contains("PRIVATE KEY"));
}

#[test]
fn host_sans_sit_beside_the_identity_and_never_replace_it() {
    let (root, eu, now) = setup();
    let identity = id("spiffe://mesh/region/eu/authority/1");
    let leaf = eu
        .issue_with_hosts(&identity, now, LEAF_TTL_DEFAULT, &HostSan::loopback())
        .unwrap();
    let sans = &leaf.info.sans;
    assert!(
        sans.contains(&SanEntry::Dns("localhost".into())),
        "{sans:?}"
    );
    assert!(
        sans.contains(&SanEntry::Ip(std::net::Ipv4Addr::LOCALHOST.into())),
        "{sans:?}"
    );
    assert!(
        sans.contains(&SanEntry::Ip(std::net::Ipv6Addr::LOCALHOST.into())),
        "{sans:?}"
    );
    // The identity is still the one URI SAN, and the leaf is valid material.
    assert_eq!(leaf.info.identity().unwrap(), identity);
    let policy = PeerPolicy {
        trust_domain: TrustDomain::new("mesh").unwrap(),
        accepted: KindSet::ALL,
        region: None,
    };
    let chain = leaf.fullchain_pem();
    let pem = MaterialPem {
        cert_chain: chain.as_bytes(),
        key: leaf.key_pem.as_bytes(),
        bundle: root.cert_pem().as_bytes(),
    };
    assert_eq!(
        validate_material(pem, &policy, now).unwrap().identity,
        identity
    );
    // A DNS name alone identifies no one.
    let dns_only = eu
        .issue_unchecked(LeafSpec {
            sans: vec![LeafSan::Dns("authority.mesh".into())],
            not_before: now,
            not_after: now + LEAF_TTL_DEFAULT,
        })
        .unwrap();
    assert!(matches!(
        dns_only.info.identity(),
        Err(CertError::SanNotUri)
    ));
    assert_eq!(
        HostSan::parse("10.0.0.7"),
        HostSan::Ip([10, 0, 0, 7].into())
    );
    assert_eq!(
        HostSan::parse("authority.mesh"),
        HostSan::Dns("authority.mesh".into())
    );
}

#[test]
fn issue_refuses_what_policy_forbids() {
    let (_, eu, now) = setup();
    let day = LEAF_TTL_DEFAULT;
    let refused = |identity: &str, ttl: Duration| eu.issue(&id(identity), now, ttl).unwrap_err();
    assert!(matches!(
        refused("spiffe://other/region/eu/node/n1", day),
        CaError::WrongTrustDomain { .. }
    ));
    assert!(matches!(
        refused("spiffe://mesh/region/us/node/n1", day),
        CaError::WrongRegion { .. }
    ));
    assert!(matches!(
        refused("spiffe://mesh/region/eu/node/n1", Duration::from_secs(600)),
        CaError::Lifetime(_)
    ));
    // Operators act estate-wide: no region may issue one.
    assert!(matches!(
        refused("spiffe://mesh/operator/alice", day),
        CaError::OperatorNeedsRoot { .. }
    ));
    // A leaf may not outlive its intermediate.
    let late = now + crate::lifetime::INTERMEDIATE_TTL;
    assert!(matches!(
        eu.issue(&id("spiffe://mesh/region/eu/node/n1"), late, day),
        Err(CaError::OutlivesIssuer { .. })
    ));
}
