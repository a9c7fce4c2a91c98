//! `waymark certs init` / `issue` / `inspect` as a user runs them, checked with openssl.
// Helpers outside #[test] fns panic on purpose: a panic is how a test reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};
use std::time::SystemTime;

use waymark_certs::material::{MaterialPem, validate_material};
use waymark_certs::{IdentityKind, KindSet, PeerPolicy, TrustDomain};

const WAYMARK: &str = env!("CARGO_BIN_EXE_waymark");
const NODE: &str = "spiffe://mesh.test/region/eu/node/n1";
const OPERATOR: &str = "spiffe://mesh.test/operator/alice";

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("command runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn waymark(args: &[&str]) -> Output {
    run(Command::new(WAYMARK).args(args))
}

fn openssl(args: &[&str]) -> String {
    let found = Command::new("openssl").arg("version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "openssl is not on PATH; install it with `apt-get install openssl`"
    );
    String::from_utf8(run(Command::new("openssl").args(args)).stdout).unwrap()
}

/// `waymark args…` expected to fail; its stderr.
fn waymark_fails(args: &[&str]) -> String {
    let out = Command::new(WAYMARK).args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn init(d: &str) {
    waymark(&[
        "certs",
        "init",
        "--dir",
        d,
        "--trust-domain",
        "mesh.test",
        "--region",
        "eu",
    ]);
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn init_then_issue_produces_a_chain_openssl_accepts_with_the_uri_san() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    let d = dir.to_str().unwrap();
    waymark(&[
        "certs",
        "init",
        "--dir",
        d,
        "--trust-domain",
        "mesh.test",
        "--region",
        "eu",
    ]);
    let issued = waymark(&[
        "certs",
        "issue",
        "--dir",
        d,
        "--identity",
        NODE,
        "--ttl",
        "24h",
    ]);
    let text = String::from_utf8(issued.stdout).unwrap();
    assert!(text.contains(&format!("identity:    {NODE}")), "{text}");

    let leaf_dir = dir.join("issued/region/eu/node/n1");
    let (leaf, chain, key) = (
        leaf_dir.join("cert.pem"),
        leaf_dir.join("chain.pem"),
        leaf_dir.join("key.pem"),
    );
    let bundle = dir.join("bundle.pem");
    let verified = openssl(&[
        "verify",
        "-CAfile",
        bundle.to_str().unwrap(),
        "-untrusted",
        chain.to_str().unwrap(),
        leaf.to_str().unwrap(),
    ]);
    assert!(verified.trim_end().ends_with(": OK"), "{verified}");
    let shown = openssl(&["x509", "-in", leaf.to_str().unwrap(), "-noout", "-text"]);
    assert!(shown.contains(&format!("URI:{NODE}")), "{shown}");

    // Private keys are 0600; certificates are world-readable.
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(&dir.join("root.key")), 0o600);
    assert_eq!(mode(&dir.join("region-eu.key")), 0o600);
    assert_eq!(mode(&leaf), 0o644);
}

#[test]
fn inspect_prints_identity_serial_fingerprint_and_validity() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("pki");
    let d = d.to_str().unwrap();
    waymark(&[
        "certs",
        "init",
        "--dir",
        d,
        "--trust-domain",
        "mesh.test",
        "--region",
        "eu",
    ]);
    waymark(&["certs", "issue", "--dir", d, "--identity", NODE]);
    let leaf = format!("{d}/issued/region/eu/node/n1/fullchain.pem");
    let out = waymark(&["certs", "inspect", &leaf]);
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "certificate 1 of 2",
        &format!("identity:    {NODE}"),
        "serial:",
        "fingerprint: sha256:",
        "not_before:",
        "not_after:",
        "certificate 2 of 2",
        "identity:    (ca) spiffe://mesh.test/region/eu",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    assert!(!text.contains("warning"), "{text}");

    // A 24h leaf expires inside a 2-day outage window: inspect says so.
    let out = waymark(&["certs", "inspect", &leaf, "--outage-window", "2d"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("warning: expires in"), "{text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("inside the 2d outage window"));
}

#[test]
fn issue_refuses_a_malformed_identity_and_a_too_short_ttl() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("pki");
    let d = d.to_str().unwrap();
    waymark(&[
        "certs",
        "init",
        "--dir",
        d,
        "--trust-domain",
        "mesh.test",
        "--region",
        "eu",
    ]);
    let bad = Command::new(WAYMARK)
        .args([
            "certs",
            "issue",
            "--dir",
            d,
            "--identity",
            "spiffe://mesh.test/region/eu/pod/p1",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("is not a node, authority, workload or operator identity")
    );
    let short = Command::new(WAYMARK)
        .args([
            "certs",
            "issue",
            "--dir",
            d,
            "--identity",
            NODE,
            "--ttl",
            "30m",
        ])
        .output()
        .unwrap();
    assert!(!short.status.success());
    assert!(String::from_utf8_lossy(&short.stderr).contains("shorter than the minimum"));
}

#[test]
fn issue_mints_an_operator_from_the_estate_root_that_loads_as_an_operator_identity() {
    // Goal: `certs issue` for operator/<name> end to end: signed by the root itself (no
    // chain), 8h by default, accepted by openssl and by the library as an operator's own
    // material; `--region` is refused for it, and a mismatched one for a regional identity.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    let d = dir.to_str().unwrap();
    init(d);
    let issued = waymark(&["certs", "issue", "--dir", d, "--identity", OPERATOR]);
    let text = String::from_utf8(issued.stdout).unwrap();
    for want in [
        &format!("identity:    {OPERATOR}"),
        "issued by:   estate root",
        "(ttl 8h)",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }

    let leaf_dir = dir.join("issued/operator/alice");
    let (leaf, fullchain, key) = (
        leaf_dir.join("cert.pem"),
        leaf_dir.join("fullchain.pem"),
        leaf_dir.join("key.pem"),
    );
    assert_eq!(std::fs::read(leaf_dir.join("chain.pem")).unwrap(), b"");
    assert_eq!(
        std::fs::read(&fullchain).unwrap(),
        std::fs::read(&leaf).unwrap()
    );
    assert_eq!(mode(&key), 0o600);
    let bundle = dir.join("bundle.pem");
    let verified = openssl(&[
        "verify",
        "-CAfile",
        bundle.to_str().unwrap(),
        "-purpose",
        "sslclient",
        leaf.to_str().unwrap(),
    ]);
    assert!(verified.trim_end().ends_with(": OK"), "{verified}");
    let shown = openssl(&["x509", "-in", leaf.to_str().unwrap(), "-noout", "-text"]);
    assert!(shown.contains(&format!("URI:{OPERATOR}")), "{shown}");

    // What an operator's client loads: its files, checked as its own material.
    let pem = |p: &Path| std::fs::read(p).unwrap();
    let (chain_pem, key_pem, bundle_pem) = (pem(&fullchain), pem(&key), pem(&bundle));
    let policy = PeerPolicy {
        trust_domain: TrustDomain::new("mesh.test").unwrap(),
        accepted: KindSet::only(IdentityKind::Operator),
        region: None,
    };
    let material = validate_material(
        MaterialPem {
            cert_chain: &chain_pem,
            key: &key_pem,
            bundle: &bundle_pem,
        },
        &policy,
        SystemTime::now(),
    )
    .unwrap();
    assert_eq!(material.identity.to_string(), OPERATOR);
    assert_eq!(material.identity.kind(), IdentityKind::Operator);

    let out = waymark(&["certs", "inspect", fullchain.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("certificate 1 of 1"), "{text}");
    assert!(text.contains(&format!("identity:    {OPERATOR}")), "{text}");

    let refused = waymark_fails(&[
        "certs",
        "issue",
        "--dir",
        d,
        "--identity",
        "spiffe://mesh.test/operator/bob",
        "--region",
        "eu",
    ]);
    assert!(
        refused.contains("operator identities are issued by the estate root"),
        "{refused}"
    );
    assert!(!dir.join("issued/operator/bob").exists());
    let mismatched = waymark_fails(&[
        "certs",
        "issue",
        "--dir",
        d,
        "--identity",
        NODE,
        "--region",
        "us",
    ]);
    assert!(
        mismatched.contains("is issued by its own region's intermediate (eu)"),
        "{mismatched}"
    );
}
