use std::time::SystemTime;

use super::*;
use crate::ca::RootCa;
use crate::identity::{KindSet, Name, TrustDomain};
use crate::lifetime::LEAF_TTL_DEFAULT;

struct Fixture {
    root: RootCa,
    eu: crate::ca::RegionCa,
    now: SystemTime,
    policy: PeerPolicy,
}

fn fixture() -> Fixture {
    crate::install_crypto_provider();
    let now = SystemTime::now();
    let td = TrustDomain::new("mesh").unwrap();
    let root = RootCa::generate(td.clone(), now).unwrap();
    let eu = root.issue_region(Name::new("eu").unwrap(), now).unwrap();
    let policy = PeerPolicy {
        trust_domain: td,
        accepted: KindSet::ALL,
        region: None,
    };
    Fixture {
        root,
        eu,
        now,
        policy,
    }
}

impl Fixture {
    fn material(&self, identity: &str) -> Material {
        let leaf = self
            .eu
            .issue(&identity.parse().unwrap(), self.now, LEAF_TTL_DEFAULT)
            .unwrap();
        let chain = leaf.fullchain_pem();
        let pem = MaterialPem {
            cert_chain: chain.as_bytes(),
            key: leaf.key_pem.as_bytes(),
            bundle: self.root.cert_pem().as_bytes(),
        };
        validate_material(pem, &self.policy, self.now).unwrap()
    }
}

const NODE: &str = "spiffe://mesh/region/eu/node/n1";

#[test]
fn a_new_certificate_for_the_same_identity_is_swapped_in() {
    let f = fixture();
    let current = f.material(NODE);
    let next = f.material(NODE);
    let serial = next.leaf.serial.clone();
    match decide(&current, Ok(next)) {
        Decision::Swap(m) => assert_eq!(m.leaf.serial, serial),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_same_files_again_are_unchanged() {
    let f = fixture();
    let current = f.material(NODE);
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
    let current = f.material(NODE);
    assert!(matches!(
        decide(&current, Err(CertError::KeyMismatch)),
        Decision::Reject(CertError::KeyMismatch)
    ));
}

#[test]
fn a_different_identity_is_rejected() {
    let f = fixture();
    let current = f.material(NODE);
    let other = f.material("spiffe://mesh/region/eu/node/n2");
    match decide(&current, Ok(other)) {
        Decision::Reject(err) => assert_eq!(err.reason(), RejectReason::IdentityChanged),
        other => panic!("{other:?}"),
    }
}
