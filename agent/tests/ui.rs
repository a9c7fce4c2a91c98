//! The authority's web UI (`/ui/`) in a real browser: Debian's headless Chromium, driven by
//! `playwright-core` (`tests/ui/ui.spec.mjs`), against a running dev region over its HTTPS
//! API. Chromium trusts exactly the certificate the region serves — named by the SHA-256 of
//! its public key, `--ignore-certificate-errors-spki-list` — and no other.
//!
//! The region here is the dev region with two things beside it: a real Envoy on its node
//! agent's local xDS, and a second region, `peer` (one in-process member with a certificate
//! of the dev CA), federated with it over QUIC. The script checks every page against the
//! region's real data (the three demo services and their instances, explain, audit, zones,
//! alarms, the peer region fresh and then stale, the Envoy in sync and what it holds, as
//! Envoy's admin API says) with no console error; that an override made in the page changes
//! the verdict the CLI sees, and that the API's refusals (no justification, the disruption
//! budget, approving one's own request, a wrong token) show as the API gives them; that a
//! second principal approves in the page what the budget refused; and that a backend
//! switched to fail-hard shows as ineligible without a reload. It asks this test, on stdin
//! and stdout, for what only the test can do: run the CLI, mint a token, switch a demo
//! backend's mode, read Envoy's admin API, stop the peer region. Screenshots of the main
//! pages land in `target/ui-screenshots/`.
//!
//! Needs `node`, Chromium (`CHROMIUM_BIN`, else `/usr/bin/chromium`; `./scripts/test`
//! installs Debian's `chromium`), playwright-core in `tests/ui/node_modules`
//! (`WAYMARK_UI_MODULES` names another directory; `./scripts/install-test-peers` runs
//! `npm ci` there) and Envoy (`ENVOY_BIN`, `./scripts/install-envoy`). Without them the test
//! fails saying how to install them; it never skips.

use crate::common;
use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::dev::WAIT;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use support::Envoy;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::member::Authority;
use waymark_agent::authority::settings::{FederationPeerEntry, FederationSettings, TlsSettings};
use waymark_agent::cli::tls::{ClientFiles, api_client_config};
use waymark_agent::dev::{self, DevArgs, DevRegion};
use waymark_certs::ca::HostSan;
use waymark_certs::reload::MaterialPaths;
use waymark_certs::{Identity, Name, TrustDomain};
use waymark_testkit::until;

/// The longest the script may run (nextest stops this group's tests at 5 minutes); a
/// healthy run takes about a minute.
const SCRIPT_MAX: Duration = Duration::from_secs(240);

/// The demo backends (`web` 6, `checkout` 3, `inventory` 3).
const BACKENDS: usize = 12;

/// The Envoy on the dev node agent: its xDS node id and the cluster it declares.
const SIDECAR: &str = "ui-sidecar";
const SIDECAR_CLUSTER: &str = "web-client";

/// The region federated with the dev region.
const PEER: &str = "peer";
/// How long the dev member lets the peer region be silent before it reports it stale; its
/// digests go every 200 ms, so only a silent peer gets there.
const PEER_STALE_AFTER: Duration = Duration::from_secs(2);

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate lives inside the workspace")
        .to_path_buf()
}

fn install_hint(what: &str) -> String {
    format!(
        "this test drives the web UI in Chromium with playwright-core, and {what}. Install \
         them from the workspace root: Debian's chromium (`apt-get install chromium \
         chromium-driver`, as ./scripts/test does) and the test's npm package \
         (`./scripts/install-test-peers`, which runs npm ci in agent/tests/ui/). \
         CHROMIUM_BIN and WAYMARK_UI_MODULES point at others"
    )
}

/// Chromium: `CHROMIUM_BIN`, else Debian's `/usr/bin/chromium`.
fn chromium() -> PathBuf {
    let path = std::env::var_os("CHROMIUM_BIN")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.is_file(),
        "{}",
        install_hint(&format!("there is no Chromium at {}", path.display()))
    );
    path
}

/// The directory whose `node_modules` holds playwright-core, checked to load under `node`.
async fn playwright() -> PathBuf {
    let dir = std::env::var_os("WAYMARK_UI_MODULES")
        .filter(|p| !p.is_empty())
        .map_or_else(|| workspace_root().join("agent/tests/ui"), PathBuf::from);
    let out = tokio::process::Command::new("node")
        .current_dir(&dir)
        .args(["-e", "require('playwright-core')"])
        .output()
        .await
        .unwrap_or_else(|e| panic!("{}", install_hint(&format!("`node` does not run: {e}"))));
    assert!(
        out.status.success(),
        "{}",
        install_hint(&format!(
            "playwright-core does not load from {}: {}",
            dir.join("node_modules").display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    );
    dir
}

/// Where the screenshots go: `target/ui-screenshots/` of the build running this test.
fn screenshots() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            // target/debug/deps/integration-…: three levels up.
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.parent()?.to_path_buf())
        })
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("ui-screenshots")
}

/// The base64 SHA-256 of the SubjectPublicKeyInfo of the certificate the region's API
/// serves (what `--ignore-certificate-errors-spki-list` takes), read from a real handshake
/// that checks it against the dev CA.
async fn served_spki(dev: &DevRegion) -> String {
    let config = api_client_config(
        &ClientFiles {
            bundle: dev.ca_bundle().to_path_buf(),
            identity: None,
        },
        SystemTime::now(),
    )
    .unwrap();
    let addr = dev.authority().http_addr();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(addr.ip().to_string())
        .unwrap()
        .to_owned();
    let tls = tokio_rustls::TlsConnector::from(Arc::clone(&config))
        .connect(name, tcp)
        .await
        .unwrap();
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let spki = der::spki(&leaf).expect("a certificate's SubjectPublicKeyInfo");
    der::base64(ring::digest::digest(&ring::digest::SHA256, spki).as_ref())
}

/// `/ui/` answers anyone (the assets carry no data) with its security headers; the data
/// it shows does not.
async fn pages_are_public_and_data_is_not(dev: &DevRegion) {
    let anonymous = ApiClient::new(&dev.authority().http_addr().to_string(), None).with_tls(
        api_client_config(
            &ClientFiles {
                bundle: dev.ca_bundle().to_path_buf(),
                identity: None,
            },
            SystemTime::now(),
        )
        .unwrap(),
    );
    let page = anonymous.send(Method::GET, "/ui/", None).await.unwrap();
    assert_eq!(page.status, StatusCode::OK, "{page:?}");
    assert_eq!(
        page.headers["content-security-policy"],
        waymark_agent::authority::ui::CONTENT_SECURITY_POLICY
    );
    assert_eq!(page.headers["x-frame-options"], "DENY");
    let data = anonymous
        .send(Method::GET, "/v1/services", None)
        .await
        .unwrap();
    assert_eq!(data.status, StatusCode::UNAUTHORIZED, "{data:?}");
    let missing = anonymous
        .send(Method::GET, "/ui/js/nothing.js", None)
        .await
        .unwrap();
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

/// The dev region and what the test runs beside it, for the script's questions.
struct Rig {
    dev: DevRegion,
    /// The demo backends' control API.
    control: ApiClient,
    envoy: Envoy,
    /// The federated peer region, until the script stops it.
    peer: Option<Authority>,
}

/// Answers one of the script's questions.
async fn answer(rig: &mut Rig, question: &Value) -> Value {
    let dev = &rig.dev;
    match question["what"].as_str() {
        Some("cli_verdict") => {
            let instance = question["instance"].as_str().unwrap();
            let want = question["want"].as_str().unwrap();
            let verdict = until(
                &format!("the CLI sees {instance} {want}"),
                WAIT,
                async || {
                    let out =
                        common::dev::operator_command(dev, &["explain", instance, "-o", "json"]);
                    assert!(
                        out.status.success(),
                        "waymark explain: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    let explained: Value = serde_json::from_slice(&out.stdout).unwrap();
                    let verdict = explained["verdict"].as_str().unwrap_or("").to_owned();
                    if verdict == want {
                        Ok(verdict)
                    } else {
                        Err(verdict)
                    }
                },
            )
            .await;
            json!({ "verdict": verdict })
        }
        Some("set_mode") => {
            let backend = question["backend"].as_str().unwrap();
            let mode = question["mode"].as_str().unwrap();
            common::dev::set_mode(&rig.control, backend, mode).await;
            json!({ "ok": true })
        }
        Some("mint_token") => {
            // As an operator mints one for a colleague: the CLI, with the grants named.
            let name = question["name"].as_str().unwrap();
            let mut args = vec!["acl", "token-create", "--name", name, "--ttl", "1h"];
            for grant in question["grants"].as_array().unwrap() {
                args.extend(["--grant", grant.as_str().unwrap()]);
            }
            let out = common::dev::operator_command(dev, &args);
            assert!(
                out.status.success(),
                "waymark acl token-create: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            let token = stdout.lines().next().unwrap_or_default().trim();
            assert!(token.starts_with(&format!("wmt.{name}.")), "{stdout}");
            json!({ "token": token })
        }
        Some("envoy_holds") => json!({
            "client": SIDECAR,
            "clusters": envoy_clusters(&rig.envoy).await,
        }),
        Some("stop_peer") => {
            rig.peer
                .take()
                .expect("the peer region runs until the script stops it, once")
                .shutdown()
                .await;
            json!({ "ok": true })
        }
        _ => panic!("the script asked something this test does not answer: {question}"),
    }
}

/// What Envoy's admin API says it holds: every cluster it was sent, with its endpoints'
/// addresses (`ip:port`, sorted).
async fn envoy_clusters(envoy: &Envoy) -> BTreeMap<String, Vec<String>> {
    let clusters = envoy.clusters_json().await;
    clusters["cluster_statuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["added_via_api"] == true)
        .map(|c| {
            let mut hosts: Vec<String> = c["host_statuses"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|h| {
                    let sa = &h["address"]["socket_address"];
                    format!("{}:{}", sa["address"].as_str().unwrap(), sa["port_value"])
                })
                .collect();
            hosts.sort();
            (c["name"].as_str().unwrap().to_owned(), hosts)
        })
        .collect()
}

/// A real Envoy on the dev node agent's local xDS, once it holds web's six endpoints.
async fn start_envoy(dev: &DevRegion) -> Envoy {
    common::dev::envoy_on_web(dev, SIDECAR, SIDECAR_CLUSTER).await
}

/// Federation on `bind` with one peer member, `region/<region>/authority/1` at `addr`,
/// digests every 200 ms, and the peer reported stale after [`PEER_STALE_AFTER`] of silence.
fn federation(bind: SocketAddr, region: &str, addr: SocketAddr) -> FederationSettings {
    FederationSettings {
        bind,
        peers: vec![FederationPeerEntry {
            region: region.parse().unwrap(),
            member: "1".into(),
            addr,
        }],
        front_doors: Vec::new(),
        stale_after: PEER_STALE_AFTER,
        digest_interval: Duration::from_millis(200),
        probe_interval: Duration::from_secs(5),
        probe_timeout: Duration::from_secs(2),
        signal: Default::default(),
        drop_stale_peers: false,
    }
}

/// Region [`PEER`]: one member storing in `dir`, federating on `bind` with the dev member,
/// with a certificate the dev CA issues it (a peer must be of the same estate).
async fn start_peer(dev: &DevRegion, dir: &Path, bind: SocketAddr) -> Authority {
    let pki = dev.pki();
    let td = TrustDomain::new(dev::TRUST_DOMAIN).unwrap();
    let now = SystemTime::now();
    pki.init(&td, &[Name::new(PEER).unwrap()], now).unwrap();
    let identity = Identity::parse(&format!(
        "spiffe://{}/region/{PEER}/authority/1",
        dev::TRUST_DOMAIN
    ))
    .unwrap();
    let (_, issued) = pki
        .issue_with_hosts(
            &identity,
            None,
            Duration::from_secs(86_400),
            Some(&dir.join("cert")),
            now,
            &HostSan::loopback(),
        )
        .unwrap();
    let mut config = common::plain(dir, PEER, &["z1"], "127.0.0.1:0".parse().unwrap());
    config.tls = Some(TlsSettings {
        trust_domain: td,
        paths: MaterialPaths {
            cert_chain: issued.fullchain,
            key: issued.key,
            bundle: pki.bundle(),
        },
    });
    let dev_endpoint = dev.authority().federation_addr().unwrap();
    config.federation = Some(federation(bind, "dev", dev_endpoint));
    common::single_member(config).await
}

/// The dev region (federating with [`PEER`], whose endpoint will be `peer`), its demo
/// instances all eligible; beside it the peer region and the Envoy.
async fn start_rig(dir: &Path) -> Rig {
    let peer_endpoint = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let any = "127.0.0.1:0".parse().unwrap();
    let dev = DevRegion::start_federated(
        DevArgs {
            dir: dir.join("dev"),
            api: any,
            xds: any,
            dns: any,
            agent_api: any,
            backends_api: any,
        },
        federation(any, PEER, peer_endpoint),
    )
    .await
    .expect("the dev region starts");
    let api = dev.api_client();
    let eligible = until("every demo instance eligible", WAIT, async || {
        let r = api
            .send(Method::GET, "/v1/instances?passing", None)
            .await
            .unwrap();
        let n = serde_json::from_slice::<Value>(&r.body)
            .ok()
            .and_then(|v| v.as_array().map(Vec::len))
            .unwrap_or(0);
        if n == BACKENDS { Ok(()) } else { Err(n) }
    });
    let peer_dir = dir.join(PEER);
    // Each waits on something else (probes, Envoy's start, a Raft bootstrap): at once.
    let ((), envoy, peer) = tokio::join!(
        eligible,
        start_envoy(&dev),
        start_peer(&dev, &peer_dir, peer_endpoint)
    );
    let control = ApiClient::new(&dev.backends_api().to_string(), None);
    Rig {
        dev,
        control,
        envoy,
        peer: Some(peer),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_ui_shows_the_dev_region_and_acts_on_it_in_chromium() {
    let chromium = chromium();
    let modules = playwright().await;
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut rig = start_rig(dir.path()).await;
    let dev = &rig.dev;
    pages_are_public_and_data_is_not(dev).await;
    let url = format!("https://{}/ui/", dev.authority().http_addr());
    assert!(dev.guide().contains(&url), "the guide names {url}");

    let ids: BTreeMap<String, String> = dev
        .instances()
        .into_iter()
        .map(|(backend, id)| (backend, id.to_string()))
        .collect();
    let shots = screenshots();
    let mut child = tokio::process::Command::new("node")
        .arg(workspace_root().join("agent/tests/ui/ui.spec.mjs"))
        .env(
            "WAYMARK_UI_URL",
            format!("https://{}", dev.authority().http_addr()),
        )
        .env("WAYMARK_UI_TOKEN", dev.operator_token())
        .env("WAYMARK_UI_SPKI", served_spki(dev).await)
        .env("WAYMARK_UI_SIDECAR", SIDECAR)
        .env("WAYMARK_UI_PEER", PEER)
        .env(
            "WAYMARK_UI_PEER_STALE_MS",
            PEER_STALE_AFTER.as_millis().to_string(),
        )
        .env("WAYMARK_UI_INSTANCES", serde_json::to_string(&ids).unwrap())
        .env("WAYMARK_UI_SHOTS", &shots)
        .env("WAYMARK_UI_MODULES", &modules)
        .env("CHROMIUM_BIN", &chromium)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let conversation = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            println!("ui.spec: {line}");
            if let Some(question) = line.strip_prefix("@ask ") {
                let question: Value = serde_json::from_str(question).unwrap();
                let reply = answer(&mut rig, &question).await;
                stdin
                    .write_all(format!("{reply}\n").as_bytes())
                    .await
                    .unwrap();
            }
        }
        child.wait().await.unwrap()
    };
    let status = tokio::time::timeout(SCRIPT_MAX, conversation)
        .await
        .expect("the browser script finishes in time");
    assert!(
        status.success(),
        "the browser script failed ({status}); its output is above, the page as it was in {}",
        shots.join("failure.png").display()
    );
    println!("screenshots: {}", shots.display());
    if let Some(peer) = rig.peer.take() {
        peer.shutdown().await;
    }
    drop(rig.envoy);
    rig.dev.stop().await;
}

/// Just enough DER to find a certificate's public key, and base64 to name its hash.
mod der {
    /// One element of `input`: (the whole element, its contents, what follows it).
    fn element(input: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
        let first = *input.get(1)?;
        let (len, header) = if first < 0x80 {
            (usize::from(first), 2)
        } else {
            let n = usize::from(first & 0x7f);
            let bytes = input.get(2..2 + n)?;
            let len = bytes
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, 2 + n)
        };
        let end = header.checked_add(len)?;
        Some((
            input.get(..end)?,
            input.get(header..end)?,
            input.get(end..)?,
        ))
    }

    /// The SubjectPublicKeyInfo of a DER certificate: the TBSCertificate's seventh field
    /// (after the optional `[0]` version, serial, signature, issuer, validity, subject).
    pub(super) fn spki(cert: &[u8]) -> Option<&[u8]> {
        let (_, certificate, _) = element(cert)?;
        let (_, tbs, _) = element(certificate)?;
        let mut rest = tbs;
        if rest.first() == Some(&0xa0) {
            rest = element(rest)?.2;
        }
        for _ in 0..5 {
            rest = element(rest)?.2;
        }
        Some(element(rest)?.0)
    }

    pub(super) fn base64(bytes: &[u8]) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) & 63]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[test]
    fn base64_pads_as_the_standard_does() {
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
