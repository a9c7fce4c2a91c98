//! What the certs integration tests share: the estate they run in and the identities they
//! use. The PKI, the bad certificates and the raw client come from `waymark_certs::testing`.
#![allow(dead_code, unreachable_pub, unused_imports, clippy::unwrap_used)]

use std::time::Duration;

pub use waymark_certs::testing::{TestPki, certified, forged, raw_client_config};
use waymark_certs::{IdentityKind, KindSet, PeerPolicy, TrustDomain};

pub const TD: &str = "mesh.test";
pub const NODE: &str = "spiffe://mesh.test/region/eu/node/n1";
pub const AUTHORITY: &str = "spiffe://mesh.test/region/eu/authority/a1";
pub const WORKLOAD: &str = "spiffe://mesh.test/region/eu/service/cart/instance/i1";

/// Waits at most this long for anything a test expects to happen.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// An estate root with two regions, `eu` (whose identities the tests use) and `us`.
pub fn estate() -> TestPki {
    TestPki::new(TD, &["eu", "us"])
}

/// A policy of [`TD`] admitting `accepted`.
pub fn policy(accepted: KindSet) -> PeerPolicy {
    waymark_certs::testing::policy(&TrustDomain::new(TD).unwrap(), accepted)
}

pub fn only(kind: IdentityKind) -> KindSet {
    KindSet::only(kind)
}
