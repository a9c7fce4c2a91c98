//! Rotation without restart: the reloader swaps good files in, refuses bad ones with a
//! typed reason and keeps the old material serving. Tests wait on reload events, never on
//! sleeps.
// Helpers outside #[test] fns panic on purpose: a panic is how a test reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::sync::broadcast;
use waymark_certs::ca::{IssuedLeaf, LeafSan};
use waymark_certs::layout::{write_public, write_secret};
use waymark_certs::metrics::{RejectSource, ReloadOutcome};
use waymark_certs::reload::{MaterialPaths, ReloadEvent, Reloader, load_material};
use waymark_certs::testing::TestPkiDir;
use waymark_certs::tls::{ALPN_H2, LiveMaterial, server_config};
use waymark_certs::verify::PeerVerifier;
use waymark_certs::{CertMetrics, IdentityKind, Name, RejectReason};

struct Setup {
    pki: TestPkiDir,
    paths: MaterialPaths,
    live: Arc<LiveMaterial>,
    reloader: Arc<Reloader>,
    metrics: CertMetrics,
}

/// A PKI on disk, an authority leaf issued into it, and a reloader over that leaf.
async fn setup() -> Setup {
    let pki = TestPkiDir::new(TD, &["eu"]);
    let paths = pki.issue(AUTHORITY);
    let own = policy(only(IdentityKind::Authority));
    let now = std::time::SystemTime::now();
    let live = LiveMaterial::new(load_material(&paths, &own, now).await.unwrap());
    let metrics = CertMetrics::new();
    let reloader = Reloader::new(paths.clone(), Arc::clone(&live), own, metrics.clone());
    Setup {
        pki,
        paths,
        live,
        reloader,
        metrics,
    }
}

fn write_leaf(paths: &MaterialPaths, leaf: &IssuedLeaf) {
    write_secret(&paths.key, leaf.key_pem.as_bytes()).unwrap();
    write_public(&paths.cert_chain, leaf.fullchain_pem().as_bytes()).unwrap();
}

async fn next_event(rx: &mut broadcast::Receiver<ReloadEvent>) -> ReloadEvent {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("a reload event")
        .unwrap()
}

/// Serial of the certificate a fresh TLS connection to a server over `live` presents.
async fn served_serial(live: &Arc<LiveMaterial>) -> String {
    let tls = server_config(
        live,
        policy(only(IdentityKind::Node)),
        CertMetrics::new(),
        &[ALPN_H2],
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let _ = tokio_rustls::TlsAcceptor::from(Arc::new(tls))
            .accept(tcp)
            .await;
    });
    let pki = estate();
    // The client trusts the on-disk bundle (same as the server's) and presents a node leaf.
    let trusting_live = PeerVerifier::new(
        Arc::clone(live),
        policy(only(IdentityKind::Authority)),
        CertMetrics::new(),
    );
    let client = raw_client_config(Some(certified(&pki.leaf(NODE))), trusting_live, ALPN_H2);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(name, tcp)
        .await
        .unwrap();
    let leaf = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
    waymark_certs::material::cert_info(&leaf).unwrap().serial
}

#[tokio::test]
async fn watcher_swaps_in_a_reissued_certificate_and_new_connections_present_it() {
    let s = setup().await;
    let _watch = s.reloader.watch().unwrap();
    let mut events = s.reloader.subscribe();
    let old = s.live.current().leaf.serial.clone();
    assert_eq!(served_serial(&s.live).await, old);

    s.pki.issue(AUTHORITY);
    // Several file events may arrive; wait for the swap, skipping "unchanged" and the
    // brief key-without-certificate state an issue passes through.
    let new = loop {
        match next_event(&mut events).await {
            ReloadEvent::Swapped {
                serial, generation, ..
            } => {
                assert!(generation >= 1);
                break serial;
            }
            ReloadEvent::Unchanged
            | ReloadEvent::Rejected {
                reason: RejectReason::KeyMismatch,
                ..
            } => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_ne!(new, old);
    assert_eq!(s.live.current().leaf.serial, new);
    assert_eq!(served_serial(&s.live).await, new);
    assert!(s.metrics.reloads(ReloadOutcome::Swapped) >= 1);
}

#[tokio::test]
async fn watcher_refuses_a_truncated_certificate_and_the_old_one_keeps_serving() {
    let s = setup().await;
    let _watch = s.reloader.watch().unwrap();
    let mut events = s.reloader.subscribe();
    let old = s.live.current().leaf.serial.clone();
    let good = std::fs::read_to_string(&s.paths.cert_chain).unwrap();
    write_public(&s.paths.cert_chain, &good.as_bytes()[..good.len() / 2]).unwrap();
    match next_event(&mut events).await {
        ReloadEvent::Rejected { reason, error } => {
            assert_eq!(reason, RejectReason::TruncatedPem);
            assert_eq!(
                error.to_string(),
                "pem data in the certificate file is truncated or malformed"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(s.live.current().leaf.serial, old);
    assert_eq!(served_serial(&s.live).await, old);
    assert_eq!(
        s.metrics
            .rejected(RejectReason::TruncatedPem, RejectSource::Local),
        1
    );
}

#[tokio::test]
async fn each_bad_file_set_is_refused_with_its_reason_and_changes_nothing() {
    let s = setup().await;
    let pki_root = s.pki.dir().load_root().unwrap();
    let eu = s.pki.dir().load_region(&Name::new("eu").unwrap()).unwrap();
    let now = std::time::SystemTime::now();
    let hour = Duration::from_secs(3600);
    let custom = |sans: Vec<LeafSan>, nb, na| {
        eu.issue_unchecked(waymark_certs::ca::LeafSpec {
            sans,
            not_before: nb,
            not_after: na,
        })
        .unwrap()
    };
    let uri = |s: &str| vec![LeafSan::Uri(s.to_owned())];
    let issue = |id: &str| eu.issue(&id.parse().unwrap(), now, 24 * hour).unwrap();
    let good = std::fs::read(&s.paths.cert_chain).unwrap();
    let good_key = std::fs::read(&s.paths.key).unwrap();
    let bundle = std::fs::read(&s.paths.bundle).unwrap();
    let other = estate();
    assert_eq!(pki_root.cert_pem().as_bytes(), bundle.as_slice());

    type Files = (Vec<u8>, Vec<u8>, Vec<u8>);
    let leaf_files = |leaf: &IssuedLeaf| -> Files {
        (
            leaf.fullchain_pem().into_bytes(),
            leaf.key_pem.clone().into_bytes(),
            bundle.clone(),
        )
    };
    let cases: Vec<(&str, Files, RejectReason)> = vec![
        (
            "truncated certificate",
            (
                good[..good.len() - 40].to_vec(),
                good_key.clone(),
                bundle.clone(),
            ),
            RejectReason::TruncatedPem,
        ),
        (
            "truncated key",
            (
                good.clone(),
                good_key[..good_key.len() / 2].to_vec(),
                bundle.clone(),
            ),
            RejectReason::TruncatedPem,
        ),
        (
            "empty bundle",
            (good.clone(), good_key.clone(), Vec::new()),
            RejectReason::TruncatedPem,
        ),
        (
            "key of another certificate",
            (
                good.clone(),
                issue(AUTHORITY).key_pem.into_bytes(),
                bundle.clone(),
            ),
            RejectReason::KeyMismatch,
        ),
        (
            "expired",
            leaf_files(&custom(uri(AUTHORITY), now - 3 * hour, now - hour)),
            RejectReason::Expired,
        ),
        (
            "not yet valid",
            leaf_files(&custom(uri(AUTHORITY), now + hour, now + 3 * hour)),
            RejectReason::NotYetValid,
        ),
        (
            "wrong ca",
            leaf_files(&other.leaf(AUTHORITY)),
            RejectReason::WrongCa,
        ),
        (
            "wrong trust domain",
            leaf_files(&custom(
                uri("spiffe://elsewhere.test/region/eu/authority/a1"),
                now - hour,
                now + hour,
            )),
            RejectReason::WrongTrustDomain,
        ),
        (
            "missing san",
            leaf_files(&custom(vec![], now - hour, now + hour)),
            RejectReason::MissingSan,
        ),
        (
            "two sans",
            leaf_files(&custom(
                vec![LeafSan::Uri(AUTHORITY.into()), LeafSan::Uri(NODE.into())],
                now - hour,
                now + hour,
            )),
            RejectReason::MultipleSans,
        ),
        (
            "wrong kind for this process",
            leaf_files(&issue(WORKLOAD)),
            RejectReason::WrongKind,
        ),
        (
            "another identity",
            leaf_files(&issue("spiffe://mesh.test/region/eu/authority/a2")),
            RejectReason::IdentityChanged,
        ),
    ];
    let serving = s.live.current().leaf.serial.clone();
    for (name, (cert, key, bundle), reason) in cases {
        write_public(&s.paths.cert_chain, &cert).unwrap();
        write_secret(&s.paths.key, &key).unwrap();
        write_public(&s.paths.bundle, &bundle).unwrap();
        match s.reloader.reload_now().await {
            ReloadEvent::Rejected { reason: got, error } => {
                assert_eq!(got, reason, "{name}: {error}");
                let msg = error.to_string();
                assert!(
                    !msg.ends_with('.') && msg.starts_with(|c: char| c.is_lowercase()),
                    "{msg}"
                );
            }
            other => panic!("{name}: unexpected {other:?}"),
        }
        assert_eq!(
            s.live.current().leaf.serial,
            serving,
            "{name} changed what is served"
        );
        assert_eq!(s.live.generation(), 0, "{name}");
    }
    // A missing file is refused as unreadable.
    std::fs::remove_file(&s.paths.key).unwrap();
    assert!(matches!(
        s.reloader.reload_now().await,
        ReloadEvent::Rejected {
            reason: RejectReason::Unreadable,
            ..
        }
    ));
    // Putting the good files back is "unchanged"; a fresh leaf swaps.
    write_leaf_bytes(&s.paths, &good, &good_key);
    write_public(&s.paths.bundle, &bundle).unwrap();
    assert!(matches!(
        s.reloader.reload_now().await,
        ReloadEvent::Unchanged
    ));
    write_leaf(&s.paths, &issue(AUTHORITY));
    assert!(matches!(
        s.reloader.reload_now().await,
        ReloadEvent::Swapped { generation: 1, .. }
    ));
    assert_eq!(s.metrics.reloads(ReloadOutcome::Rejected), 13);
}

fn write_leaf_bytes(paths: &MaterialPaths, cert: &[u8], key: &[u8]) {
    write_secret(&paths.key, key).unwrap();
    write_public(&paths.cert_chain, cert).unwrap();
}
