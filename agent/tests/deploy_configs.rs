//! Every example configuration in `deploy/` parses with the binary's own `--print-config`;
//! every Envoy bootstrap passes `envoy --mode validate`, and the sidecar bootstraps connect to
//! a real `waymark agent` over mutual TLS with certificates from `waymark certs`.
//! (The Kubernetes manifests and systemd units: `deploy_manifests.rs`.)
#![allow(clippy::unwrap_used)]
#![allow(clippy::disallowed_methods)] // waits on real processes by the wall clock; no paused time here

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde_json::json;
use waymark_agent::api_client::ApiClient;
use waymark_agent::cli::tls::{ClientFiles, api_client_config};
use waymark_agent::tls::TlsSection;
use waymark_testkit::until;

fn print_config(role: &str, file: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args([role, "--config"])
        .arg(file)
        .arg("--print-config")
        .env_remove("WAYMARK_AGENT_ZONE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_example_configuration_parses() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut checked = 0;
    for (role, dir) in [("agent", "agent"), ("authority", "authority")] {
        for entry in std::fs::read_dir(deploy.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let printed = print_config(role, &path);
                assert!(printed.contains(&format!("[{role}]")), "{printed}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 2, "no example configurations found");
}

#[test]
fn a_bad_configuration_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[agent]\nname = \"n1\"\nregion = \"eu\"\nzone = \"a\"\ndata_dir = \"/tmp/x\"\nupstream = []\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["agent", "--config"])
        .arg(&path)
        .arg("--print-config")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent.upstream"));
}

#[test]
fn example_service_definitions_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/agent/services.d");
    let defs = waymark_agent::node::registration::read_definitions(&dir).unwrap();
    assert!(!defs.is_empty(), "no example service definitions");
}

use crate::common::{agent_file, authority_file, free_port, members, write_agent, write_authority};
use crate::support;

/// Where the sidecar bootstraps expect their TLS material and SDS files.
const SIDECAR_DIR: &str = "/etc/envoy/waymark/";
const TRUST_DOMAIN: &str = "mesh.example.org";
const REGION: &str = "eu-west-1";

fn deploy_envoy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/envoy")
}

fn waymark(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "waymark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA for `REGION` and one leaf per identity path (`node/n1`, `service/s/instance/i`)
/// under `dir/issued/<path>/`, made by `waymark certs`.
fn pki(dir: &Path, leaves: &[&str]) -> PathBuf {
    let ca = dir.join("ca");
    let ca_s = ca.to_str().unwrap();
    waymark(&[
        "certs",
        "init",
        "--dir",
        ca_s,
        "--trust-domain",
        TRUST_DOMAIN,
        "--region",
        REGION,
    ]);
    for leaf in leaves {
        let identity = format!("spiffe://{TRUST_DOMAIN}/region/{REGION}/{leaf}");
        waymark(&["certs", "issue", "--dir", ca_s, "--identity", &identity]);
    }
    ca
}

/// Where [`pki`] issued `leaf` (`fullchain.pem`, `key.pem`).
fn issued(ca: &Path, leaf: &str) -> PathBuf {
    ca.join("issued/region").join(REGION).join(leaf)
}

/// The sidecar's folder as the bootstraps expect it, under `dir`: `sds/` from deploy/envoy
/// with its paths moved to `dir`, and `tls/` holding `workload`'s certificate and the bundle.
fn sidecar_dir(dir: &Path, ca: &Path, workload: &str) -> PathBuf {
    let sds = dir.join("sds");
    let tls = dir.join("tls");
    std::fs::create_dir_all(&sds).unwrap();
    std::fs::create_dir_all(&tls).unwrap();
    for entry in std::fs::read_dir(deploy_envoy().join("sds")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let moved = moved_to(&text, dir);
        std::fs::write(sds.join(path.file_name().unwrap()), moved).unwrap();
    }
    let issued = issued(ca, workload);
    for f in ["fullchain.pem", "key.pem"] {
        std::fs::copy(issued.join(f), tls.join(f)).unwrap();
    }
    std::fs::copy(ca.join("bundle.pem"), tls.join("bundle.pem")).unwrap();
    dir.to_owned()
}

/// `text` with every path under [`SIDECAR_DIR`] moved under `dir`.
fn moved_to(text: &str, dir: &Path) -> String {
    text.replace(SIDECAR_DIR, &format!("{}/", dir.display()))
}

/// `text` with `from` replaced, which must occur.
fn replaced(text: &str, from: &str, to: &str, file: &Path) -> String {
    assert!(
        text.contains(from),
        "{} no longer contains `{from}`: update this test",
        file.display()
    );
    text.replace(from, to)
}

#[test]
fn every_envoy_bootstrap_validates() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = pki(tmp.path(), &["service/billing/instance/b1"]);
    let sidecar = sidecar_dir(
        &tmp.path().join("sidecar"),
        &ca,
        "service/billing/instance/b1",
    );
    let mut checked = 0;
    for entry in std::fs::read_dir(deploy_envoy()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            // The files the bootstrap names exist (Envoy refuses a missing SDS file).
            let text = moved_to(&std::fs::read_to_string(&path).unwrap(), &sidecar);
            let copy = tmp.path().join(path.file_name().unwrap());
            std::fs::write(&copy, text).unwrap();
            let out = Command::new(support::envoy_bin())
                .args(["--mode", "validate", "-c"])
                .arg(&copy)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{} does not validate:\n{}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "Envoy bootstraps missing");
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `[*.tls]` naming the files [`pki`] issued for `leaf`.
fn issued_tls(ca: &Path, leaf: &str) -> TlsSection {
    let issued = issued(ca, leaf);
    TlsSection {
        trust_domain: TRUST_DOMAIN.to_owned(),
        cert_chain: issued.join("fullchain.pem"),
        key: issued.join("key.pem"),
        bundle: ca.join("bundle.pem"),
    }
}

/// A child process killed when dropped; its log is printed if the test is failing.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- {} (last lines)", self.log.display());
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

fn spawn(cmd: &mut Command, log: PathBuf) -> Running {
    let file = std::fs::File::create(&log).unwrap();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    Running { child, log }
}

/// An Envoy admin counter or gauge, or `None` while it does not exist.
async fn stat(admin: SocketAddr, name: &str) -> Option<u64> {
    // `^name$`, percent-encoded.
    let r = support::http::get(admin, &format!("/stats?filter=%5E{name}%24"))
        .await
        .ok()?;
    r.body
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
}

/// A real `waymark authority` (one member, mutual TLS on xDS) publishing one service,
/// `payments`, with one instance; returns the process and its xDS address.
async fn authority_publishing_payments(dir: &Path, ca: &Path) -> (Running, SocketAddr) {
    let (http, raft, xds) = (
        loopback(free_port()),
        loopback(free_port()),
        loopback(free_port()),
    );
    let token = waymark_agent::authority::credentials::generate("management").unwrap();
    let token_file = dir.join("management.token");
    std::fs::write(&token_file, &token).unwrap();
    let config = dir.join("authority.toml");
    let zone = format!("{REGION}a");
    let mut a = authority_file(1, REGION, &[&zone], &dir.join("authority-data"));
    a.http = http;
    a.raft = raft;
    a.xds = xds;
    a.members = members(&[(http, raft)]);
    a.tls = Some(issued_tls(ca, "authority/1"));
    a.acl.initial_management_token_file = Some(token_file);
    write_authority(&config, a);
    let process = spawn(
        Command::new(env!("CARGO_BIN_EXE_waymark"))
            .args(["authority", "--config"])
            .arg(&config)
            .env_clear(),
        dir.join("authority.log"),
    );
    // The API is TLS: the client checks the authority against the estate's bundle.
    let files = ClientFiles {
        bundle: ca.join("bundle.pem"),
        identity: None,
    };
    let tls = api_client_config(&files, std::time::SystemTime::now()).unwrap();
    until(
        "the authority to lead",
        Duration::from_secs(60),
        async || {
            // Led, and bootstrapped with the management token.
            ApiClient::new(&http.to_string(), Some(token.clone()))
                .with_tls(Arc::clone(&tls))
                .get_json("/v1/status")
                .await
                .is_ok_and(|v| v["is_leader"] == true)
        },
    )
    .await;
    let api = ApiClient::new(&http.to_string(), Some(token)).with_tls(tls);
    let put = api
        .send(
            Method::PUT,
            "/v1/services/payments",
            Some(&json!({"owner": "team-pay", "contract": {}})),
        )
        .await
        .unwrap();
    assert!(put.status.is_success(), "{put:?}");
    let registration = json!({
        "service": "payments",
        "locality": {"region": REGION, "zone": format!("{REGION}a"), "node": "ip-10-0-1-17"},
        "address": {"ip": "127.0.0.1", "port": free_port()},
        "lease_ms": 600_000,
    });
    let post = api
        .send(Method::POST, "/v1/instances", Some(&registration))
        .await
        .unwrap();
    assert!(post.status.is_success(), "{post:?}");
    (process, xds)
}

/// The sidecar bootstraps do what they say against a real agent: the agent's listener
/// admits the workload certificate Envoy loads over SDS, Envoy admits the agent's node
/// certificate (trust bundle over SDS, the SAN pinned to the region's node agents), TLS 1.3
/// with h2, and the agent's CDS reaches Envoy on the ADS stream (`payments`, published by a
/// real authority over mutual TLS). The Kubernetes bootstrap dials the node-local Service's
/// name, here 127.0.0.1.
#[tokio::test(flavor = "multi_thread")]
async fn sidecar_bootstraps_reach_a_real_agent_over_mutual_tls() {
    waymark_certs::install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let node = "node/ip-10-0-1-17";
    let workload = "service/billing/instance/b1";
    let ca = pki(tmp.path(), &[node, workload, "authority/1"]);
    let (_authority, upstream) = authority_publishing_payments(tmp.path(), &ca).await;
    let (xds, http) = (free_port(), free_port());
    let agent_config = tmp.path().join("agent.toml");
    let zone = format!("{REGION}a");
    let data = tmp.path().join("agent-data");
    let mut a = agent_file("ip-10-0-1-17", REGION, &zone, &data, &[upstream]);
    a.listen.xds = loopback(xds);
    a.listen.dns = loopback(free_port());
    a.listen.http = loopback(http);
    a.tls = Some(issued_tls(&ca, node));
    write_agent(&agent_config, a);
    let _agent = spawn(
        Command::new(env!("CARGO_BIN_EXE_waymark"))
            .args(["agent", "--config"])
            .arg(&agent_config)
            .env_clear(),
        tmp.path().join("agent.log"),
    );
    let agent_http = loopback(http);
    until(
        "the agent to serve a view (/readyz)",
        Duration::from_secs(30),
        async || {
            support::http::get(agent_http, "/readyz")
                .await
                .is_ok_and(|r| r.status == 200)
        },
    )
    .await;

    for (file, agent_address) in [
        ("sidecar-vm.yaml", "address: 127.0.0.1, port_value: 18000"),
        (
            "sidecar-kubernetes.yaml",
            "address: waymark-agent.waymark.svc.cluster.local, port_value: 18000",
        ),
    ] {
        let path = deploy_envoy().join(file);
        let dir = tmp.path().join(file.trim_end_matches(".yaml"));
        let sidecar = sidecar_dir(&dir, &ca, workload);
        let mut text = moved_to(&std::fs::read_to_string(&path).unwrap(), &sidecar);
        text = replaced(
            &text,
            agent_address,
            &format!("address: 127.0.0.1, port_value: {xds}"),
            &path,
        );
        text = replaced(&text, "port_value: 9901", "port_value: 0", &path);
        text = replaced(&text, "port_value: 10001", "port_value: 0", &path);
        let bootstrap = dir.join("envoy.yaml");
        std::fs::write(&bootstrap, text).unwrap();
        let admin_file = dir.join("admin.address");
        let _envoy = spawn(
            Command::new(support::envoy_bin())
                .arg("-c")
                .arg(&bootstrap)
                .arg("--admin-address-path")
                .arg(&admin_file)
                .args(["--disable-hot-restart", "--concurrency", "1"])
                .args([
                    "--service-node",
                    "billing-test",
                    "--service-cluster",
                    "billing",
                ]),
            dir.join("envoy.log"),
        );
        let what = format!("{file}: Envoy's admin address");
        let admin = until(&what, Duration::from_secs(30), async || {
            let written = std::fs::read_to_string(&admin_file).unwrap_or_default();
            written.trim().parse::<SocketAddr>().ok()
        })
        .await;
        until(
            &format!("{file}: the agent's `payments` cluster over mutual TLS"),
            Duration::from_secs(30),
            async || {
                support::http::get(admin, "/clusters")
                    .await
                    .is_ok_and(|r| r.body.contains("payments::"))
            },
        )
        .await;
        // The certificate Envoy presents is the workload's, loaded over SDS.
        let certs = support::http::get(admin, "/certs").await.unwrap().body;
        let identity = format!("spiffe://{TRUST_DOMAIN}/region/{REGION}/{workload}");
        assert!(
            certs.contains(&identity),
            "{file}: /certs lacks {identity}:\n{certs}"
        );
        let handshakes = stat(admin, "cluster.waymark_agent.ssl.handshake").await;
        assert!(handshakes.is_some_and(|n| n >= 1), "{file}: no handshake");
        assert_eq!(
            stat(admin, "cluster.waymark_agent.ssl.versions.TLSv1.3").await,
            handshakes,
            "{file}: every handshake is TLS 1.3"
        );
    }
}
