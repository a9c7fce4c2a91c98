//! A region's intermediate speaks only for its region (ADR-15): chains are checked for the
//! issuing CA's scope, peers and own material alike, and a policy can admit one region only.
// Helpers outside #[test] fns panic on purpose: a panic is how a test reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use waymark_certs::ca::{IssuedLeaf, RegionCa};
use waymark_certs::error::PemPart;
use waymark_certs::identity::CaScope;
use waymark_certs::layout::{LayoutError, PkiDir};
use waymark_certs::material::{MaterialPem, Usage, parse_certs, unix_time, validate_material};
use waymark_certs::metrics::RejectSource;
use waymark_certs::tls::{ALPN_H2, LiveMaterial, client_config, server_config};
use waymark_certs::verify::PeerVerifier;
use waymark_certs::{
    CertError, CertMetrics, Identity, IdentityKind, KindSet, Name, RejectReason, TrustDomain,
};

const EU_NODE: &str = "spiffe://mesh.test/region/eu/node/n1";
const EU_AUTHORITY: &str = "spiffe://mesh.test/region/eu/authority/a1";
const EU_WORKLOAD: &str = "spiffe://mesh.test/region/eu/service/cart/instance/i1";
const US_AUTHORITY: &str = "spiffe://mesh.test/region/us/authority/a1";
const OPERATOR: &str = "spiffe://mesh.test/operator/alice";

/// A verifier admitting every kind (the scope check is what is under test), and its counter.
fn verifier(pki: &TestPki, region: Option<&str>) -> (PeerVerifier, CertMetrics) {
    let mut policy = policy(KindSet::ALL);
    policy.region = region.map(|r| Name::new(r).unwrap());
    let metrics = CertMetrics::new();
    let live = pki.live(AUTHORITY);
    (PeerVerifier::new(live, policy, metrics.clone()), metrics)
}

/// Presents `leaf`'s full chain to `v`, as a TLS client would.
fn present(pki: &TestPki, v: &PeerVerifier, fullchain: &str) -> Result<Identity, CertError> {
    let chain = parse_certs(fullchain.as_bytes(), PemPart::Certificate).unwrap();
    let (leaf, intermediates) = chain.split_first().unwrap();
    v.check(leaf, intermediates, unix_time(pki.now), Usage::Client)
}

/// Loads `leaf` as this process's own material, admitting every kind and region.
fn load_own(pki: &TestPki, fullchain: &str, key: &str) -> Result<(), CertError> {
    let pem = MaterialPem {
        cert_chain: fullchain.as_bytes(),
        key: key.as_bytes(),
        bundle: pki.root.cert_pem().as_bytes(),
    };
    validate_material(pem, &policy(KindSet::ALL), pki.now).map(|_| ())
}

fn issued(ca: &RegionCa, pki: &TestPki, identity: &str) -> IssuedLeaf {
    ca.issue(
        &identity.parse().unwrap(),
        pki.now,
        Duration::from_secs(24 * 3600),
    )
    .unwrap()
}

fn out_of_scope(result: Result<impl std::fmt::Debug, CertError>) -> Option<Option<CaScope>> {
    match result {
        Err(CertError::OutsideIssuerScope { issuer, .. }) => Some(issuer.map(|s| *s)),
        _ => None,
    }
}

#[test]
fn a_region_intermediate_cannot_speak_for_another_region_of_any_kind() {
    // Goal: the us intermediate's leaves naming eu (every regional kind) and operators are
    // refused as peers and as our own material, and counted as outside_issuer_scope.
    let pki = estate();
    let (v, metrics) = verifier(&pki, None);
    let us_scope = CaScope::parse("spiffe://mesh.test/region/us").unwrap();
    let forgeries = [EU_NODE, EU_AUTHORITY, EU_WORKLOAD, OPERATOR];
    for identity in forgeries {
        let leaf = forged(pki.region("us"), identity, pki.now);
        let fullchain = leaf.fullchain_pem();
        assert_eq!(
            out_of_scope(present(&pki, &v, &fullchain)),
            Some(Some(us_scope.clone())),
            "{identity} from the us intermediate was admitted as a peer"
        );
        assert_eq!(
            out_of_scope(load_own(&pki, &fullchain, &leaf.key_pem)),
            Some(Some(us_scope.clone())),
            "{identity} from the us intermediate was loaded as own material"
        );
    }
    assert_eq!(
        metrics.rejected(RejectReason::OutsideIssuerScope, RejectSource::Peer),
        4
    );
    let err = present(
        &pki,
        &v,
        &forged(pki.region("us"), EU_NODE, pki.now).fullchain_pem(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "identity spiffe://mesh.test/region/eu/node/n1 is outside the scope of its issuing ca \
         (spiffe://mesh.test/region/us)"
    );
}

#[test]
fn the_regions_own_intermediate_and_the_estate_root_speak_for_their_leaves() {
    // Goal: what the CA issues by policy passes every chain check.
    let pki = estate();
    let (v, metrics) = verifier(&pki, None);
    for identity in [EU_NODE, EU_AUTHORITY, EU_WORKLOAD] {
        let leaf = issued(pki.region("eu"), &pki, identity);
        let fullchain = leaf.fullchain_pem();
        assert_eq!(present(&pki, &v, &fullchain).unwrap().to_string(), identity);
        load_own(&pki, &fullchain, &leaf.key_pem).unwrap();
    }
    for identity in [EU_NODE, US_AUTHORITY, OPERATOR] {
        let leaf = pki
            .root
            .issue(
                &identity.parse().unwrap(),
                pki.now,
                Duration::from_secs(8 * 3600),
            )
            .unwrap();
        assert!(leaf.chain_pem.is_empty());
        let fullchain = leaf.fullchain_pem();
        assert_eq!(present(&pki, &v, &fullchain).unwrap().to_string(), identity);
        load_own(&pki, &fullchain, &leaf.key_pem).unwrap();
    }
    for reason in RejectReason::ALL {
        assert_eq!(metrics.rejected(reason, RejectSource::Peer), 0, "{reason}");
    }
}

#[test]
fn an_intermediate_without_its_leafs_region_scope_speaks_for_nobody() {
    // Goal: a CA the root signed without a region scope (none, the estate's, another trust
    // domain's eu) cannot vouch for an eu leaf, even though the chain itself verifies.
    let pki = estate();
    let (v, metrics) = verifier(&pki, None);
    let cases = [
        (None, None),
        (
            Some("spiffe://mesh.test"),
            CaScope::parse("spiffe://mesh.test").ok(),
        ),
        (
            Some("spiffe://elsewhere.test/region/eu"),
            CaScope::parse("spiffe://elsewhere.test/region/eu").ok(),
        ),
    ];
    for (san, scope) in cases {
        let fullchain = odd_intermediate_leaf(&pki, san, EU_NODE);
        assert_eq!(
            out_of_scope(present(&pki, &v, &fullchain)),
            Some(scope),
            "an eu node under an intermediate with scope {san:?} was admitted"
        );
    }
    assert_eq!(
        metrics.rejected(RejectReason::OutsideIssuerScope, RejectSource::Peer),
        3
    );
}

#[test]
fn a_region_restricted_policy_refuses_other_regions_and_counts_them() {
    // Goal: with `region: eu`, a genuine us authority is refused as wrong_region; eu
    // identities pass; operators, which name no region and come only from the root, pass.
    let pki = estate();
    let (v, metrics) = verifier(&pki, Some("eu"));
    let us = issued(pki.region("us"), &pki, US_AUTHORITY);
    let err = present(&pki, &v, &us.fullchain_pem()).unwrap_err();
    assert!(
        matches!(&err, CertError::WrongRegion { expected, .. } if expected.as_str() == "eu"),
        "{err:?}"
    );
    assert_eq!(err.reason().as_str(), "wrong_region");
    assert_eq!(
        metrics.rejected(RejectReason::WrongRegion, RejectSource::Peer),
        1
    );
    let eu = issued(pki.region("eu"), &pki, EU_AUTHORITY);
    present(&pki, &v, &eu.fullchain_pem()).unwrap();
    let operator = pki
        .root
        .issue(
            &OPERATOR.parse().unwrap(),
            pki.now,
            Duration::from_secs(8 * 3600),
        )
        .unwrap();
    present(&pki, &v, &operator.fullchain_pem()).unwrap();
    assert_eq!(
        metrics.rejected(RejectReason::WrongRegion, RejectSource::Peer),
        1
    );
}

#[test]
fn a_region_intermediate_distributed_as_the_trust_bundle_is_refused() {
    // Goal: a bundle holding the eu intermediate (alone, or next to the root) is refused as
    // our own material, typed and with its own reason: as an anchor it would end the path
    // of anything it signed, so an operator it forged would pass the issuer-scope check.
    let pki = estate();
    let leaf = issued(pki.region("eu"), &pki, EU_NODE);
    let fullchain = leaf.fullchain_pem();
    let eu_scope = CaScope::parse("spiffe://mesh.test/region/eu").unwrap();
    let forged_operator = forged(pki.region("eu"), OPERATOR, pki.now);
    let load = |chain: &str, key: &str, bundle: &str| {
        let pem = MaterialPem {
            cert_chain: chain.as_bytes(),
            key: key.as_bytes(),
            bundle: bundle.as_bytes(),
        };
        validate_material(pem, &policy(KindSet::ALL), pki.now)
    };
    let both = format!("{}{}", pki.root.cert_pem(), pki.region("eu").cert_pem());
    for bundle in [pki.region("eu").cert_pem(), both.as_str()] {
        for (chain, key) in [
            (fullchain.as_str(), leaf.key_pem.as_str()),
            (
                forged_operator.cert_pem.as_str(),
                forged_operator.key_pem.as_str(),
            ),
        ] {
            let err = load(chain, key, bundle).unwrap_err();
            assert!(
                matches!(&err, CertError::RegionScopedAnchor { scope, .. } if **scope == eu_scope),
                "{err:?}"
            );
            assert_eq!(err.reason(), RejectReason::RegionScopedAnchor);
            assert_eq!(err.reason().as_str(), "region_scoped_anchor");
        }
    }
    // The estate root alone is the bundle the CA writes, and it still loads.
    load(&fullchain, &leaf.key_pem, pki.root.cert_pem()).unwrap();
}

#[tokio::test]
async fn a_client_held_to_its_region_refuses_another_regions_server_in_the_handshake() {
    // Goal: a node agent's upstream config (authorities of its own region only) ends the
    // handshake with a us authority, with a typed, counted error, and completes it with eu.
    let pki = estate();
    let client_live = pki.live(NODE);
    let mut authorities = policy(KindSet::only(IdentityKind::Authority));
    authorities.region = client_live.current().identity.region().cloned();
    let metrics = CertMetrics::new();
    let client = client_config(&client_live, authorities, metrics.clone(), &[ALPN_H2]).unwrap();
    let client = tokio_rustls::TlsConnector::from(Arc::new(client));

    let us = pki.material(&issued(pki.region("us"), &pki, US_AUTHORITY), KindSet::ALL);
    let addr = tls_server(LiveMaterial::new(us)).await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let err = client
        .connect(ServerName::try_from("authority.invalid").unwrap(), tcp)
        .await
        .unwrap_err();
    let typed = CertError::from_tls(&err).expect("a CertError in the chain");
    assert!(matches!(typed, CertError::WrongRegion { .. }), "{typed:?}");
    assert_eq!(
        metrics.rejected(RejectReason::WrongRegion, RejectSource::Peer),
        1
    );

    let addr = tls_server(pki.live(AUTHORITY)).await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    client
        .connect(ServerName::try_from("authority.invalid").unwrap(), tcp)
        .await
        .unwrap();
}

/// A TLS server presenting `live`, admitting node agents, for one connection.
async fn tls_server(live: Arc<LiveMaterial>) -> std::net::SocketAddr {
    let config = server_config(
        &live,
        policy(KindSet::only(IdentityKind::Node)),
        CertMetrics::new(),
        &[ALPN_H2],
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        // The outcome is the client's to assert.
        let _ = acceptor.accept(tcp).await;
    });
    addr
}

/// A full chain for `identity` under an intermediate the root signed with `san` as its
/// only SAN (or none): a CA `waymark certs` would never make.
fn odd_intermediate_leaf(pki: &TestPki, san: Option<&str>, identity: &str) -> String {
    let hour = Duration::from_secs(3600);
    let root_key = KeyPair::from_pem(&pki.root.key_pem()).unwrap();
    let root = Issuer::from_ca_cert_pem(pki.root.cert_pem(), root_key).unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "odd intermediate");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.subject_alt_names = san
        .map(|uri| SanType::URI(uri.try_into().unwrap()))
        .into_iter()
        .collect();
    ca.not_before = (pki.now - hour).into();
    ca.not_after = (pki.now + hour).into();
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.signed_by(&ca_key, &root).unwrap();
    let ca = Issuer::new(ca, ca_key);

    let mut leaf = CertificateParams::default();
    leaf.subject_alt_names = vec![SanType::URI(identity.try_into().unwrap())];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    leaf.not_before = (pki.now - hour).into();
    leaf.not_after = (pki.now + hour).into();
    let leaf = leaf.signed_by(&KeyPair::generate().unwrap(), &ca).unwrap();
    format!("{}{}", leaf.pem(), ca_cert.pem())
}

#[test]
fn the_pki_directory_issues_operators_from_the_root_and_never_from_a_region() {
    // Goal: `certs issue` for an operator signs with the estate root (empty chain) and
    // refuses to name an issuing region; regional identities still use their own region.
    let dir = tempfile::tempdir().unwrap();
    let pki = PkiDir::new(dir.path());
    let now = SystemTime::now();
    let regions = [Name::new("eu").unwrap()];
    pki.init(&TrustDomain::new(TD).unwrap(), &regions, now)
        .unwrap();
    let day = Duration::from_secs(24 * 3600);

    let operator: Identity = OPERATOR.parse().unwrap();
    let (leaf, paths) = pki.issue(&operator, None, day, None, now).unwrap();
    assert!(leaf.chain_pem.is_empty());
    assert_eq!(std::fs::read(&paths.chain).unwrap(), b"");
    let refused = pki.issue(&operator, Some(&regions[0]), day, None, now);
    assert!(
        matches!(refused, Err(LayoutError::OperatorRegion { .. })),
        "{refused:?}"
    );

    let node: Identity = EU_NODE.parse().unwrap();
    let (leaf, _) = pki.issue(&node, None, day, None, now).unwrap();
    assert!(!leaf.chain_pem.is_empty());
}
