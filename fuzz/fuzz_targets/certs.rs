//! Certificates, keys and identities (`waymark-certs`): PEM and DER parsing, a certificate's
//! loggable facts and SPIFFE identity, a peer check against a real region CA, our own
//! material's validation, and the `spiffe://` and duration grammars.
//!
//! Input: byte 0 picks the path; the rest is the material.
//! - `0`: PEM certificates (a peer's chain): parsed, each one's facts and identity read, the
//!   first checked as a peer against the fixture's roots.
//! - `1`: one DER certificate.
//! - `2`: a PEM private key.
//! - `3`: `chain \0 key \0 bundle`, validated as our own material.
//! - otherwise: text, as an identity URI, a CA scope and a `--ttl` (the one duration
//!   grammar, `waymark_core::duration_str`, then the CA's lifetime bounds). An identity that
//!   parses prints back to the same identity.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use rustls::RootCertStore;
use waymark_certs::ca::RootCa;
use waymark_certs::error::PemPart;
use waymark_certs::identity::{CaScope, Identity, KindSet, Name, TrustDomain};
use waymark_certs::lifetime;
use waymark_certs::material::{
    MaterialPem, PeerPolicy, Usage, cert_info, check_peer, parse_certs, parse_key, root_store,
    unix_time, validate_material,
};
use waymark_core::duration_str;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let fx = fixture();
    match mode {
        0 => {
            let Ok(chain) = parse_certs(rest, PemPart::Certificate) else {
                return;
            };
            for der in chain.iter().take(8) {
                if let Ok(info) = cert_info(der) {
                    let _ = info.identity();
                    let _ = (info.not_before_time(), info.not_after_time());
                }
            }
            let (leaf, intermediates) = chain.split_first().expect("parse_certs refuses none");
            let intermediates = &intermediates[..intermediates.len().min(8)];
            let _ = check_peer(
                leaf,
                intermediates,
                &fx.roots,
                unix_time(fx.now),
                Usage::Server,
                &fx.policy,
            );
        }
        1 => {
            if let Ok(info) = cert_info(rest) {
                let _ = info.identity();
            }
        }
        2 => {
            let _ = parse_key(rest);
        }
        3 => {
            let mut parts = rest.splitn(3, |b| *b == 0);
            let (Some(cert_chain), Some(key), Some(bundle)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return;
            };
            let pem = MaterialPem {
                cert_chain,
                key,
                bundle,
            };
            let _ = validate_material(pem, &fx.policy, fx.now);
        }
        _ => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            if let Ok(identity) = Identity::parse(text) {
                let printed = identity.to_string();
                let again = Identity::parse(&printed).expect("a printed identity parses");
                assert_eq!(again, identity, "{text:?} printed as {printed:?}");
                let _ = (identity.kind(), identity.region(), identity.path_segments());
            }
            let _ = CaScope::parse(text);
            if let Ok(ttl) = duration_str::parse(text) {
                let _ = lifetime::check_leaf_ttl(ttl);
            }
        }
    }
});

struct Fixture {
    roots: RootCertStore,
    policy: PeerPolicy,
    now: SystemTime,
}

/// A real root and region CA, made once: peers' chains are checked against them.
fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        waymark_certs::install_crypto_provider();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let td = TrustDomain::new("example.org").expect("a valid trust domain");
        let root = RootCa::generate(td.clone(), now).expect("a root CA");
        let _region = root
            .issue_region(Name::new("eu").expect("a valid region"), now)
            .expect("a region CA");
        let bundle = parse_certs(root.cert_pem().as_bytes(), PemPart::Bundle).expect("the root");
        Fixture {
            roots: root_store(&bundle).expect("a root store"),
            policy: PeerPolicy {
                trust_domain: td,
                accepted: KindSet::ALL,
                region: None,
            },
            now: now + Duration::from_secs(3600),
        }
    })
}
