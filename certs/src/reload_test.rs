use super::*;
use crate::identity::KindSet;
use crate::testing::TestPki;

fn fixture() -> TestPki {
    TestPki::new("mesh", &["eu"])
}

/// A fresh leaf for `identity` as material admitting every kind.
fn material(pki: &TestPki, identity: &str) -> Material {
    pki.material(&pki.leaf(identity), KindSet::ALL)
}

const NODE: &str = "spiffe://mesh/region/eu/node/n1";

#[test]
fn a_new_certificate_for_the_same_identity_is_swapped_in() {
    let f = fixture();
    let current = material(&f, NODE);
    let next = material(&f, NODE);
    let serial = next.leaf.serial.clone();
    match decide(&current, Ok(next)) {
        Decision::Swap(m) => assert_eq!(m.leaf.serial, serial),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_same_files_again_are_unchanged() {
    let f = fixture();
    let current = material(&f, NODE);
    let again = Material {
        identity: current.identity.clone(),
        leaf: current.leaf.clone(),
        certified_key: Arc::clone(&current.certified_key),
        roots: Arc::clone(&current.roots),
        bundle_digest: current.bundle_digest.clone(),
    };
    assert!(matches!(decide(&current, Ok(again)), Decision::Unchanged));
}

#[test]
fn a_refused_candidate_is_rejected_with_its_error() {
    let f = fixture();
    let current = material(&f, NODE);
    assert!(matches!(
        decide(&current, Err(CertError::KeyMismatch)),
        Decision::Reject(CertError::KeyMismatch)
    ));
}

#[test]
fn a_different_identity_is_rejected() {
    let f = fixture();
    let current = material(&f, NODE);
    let other = material(&f, "spiffe://mesh/region/eu/node/n2");
    match decide(&current, Ok(other)) {
        Decision::Reject(err) => assert_eq!(err.reason(), RejectReason::IdentityChanged),
        other => panic!("{other:?}"),
    }
}
