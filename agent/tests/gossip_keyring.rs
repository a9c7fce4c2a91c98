//! Online gossip key rotation over real UDP on loopback: an authority member and two node
//! agents (mutual TLS evidence sessions, sealed gossip) rotate from key A to key B through
//! the API and the CLI while membership stays converged; a member holding only A is then
//! shut out (its datagrams refused and counted); a restarted agent comes back with B from
//! its data directory although its configuration still names A.
//!
//! Every wait is on a membership snapshot, a metric or an API answer with a deadline.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::Method;
use serde_json::{Value, json};
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::member::Authority;
use waymark_agent::authority::settings::{GossipSettings, TlsSettings};
use waymark_agent::gossip::{
    DropReason, Gossip, GossipConfig, GossipId, Key, Keyring, Liveness, Role, keyring_file,
};
use waymark_agent::node::agent::NodeAgent;
use waymark_agent::node::config::Tls;
use waymark_certs::identity::TrustDomain;
use waymark_certs::testing::TestPkiDir;
use waymark_testkit::until;

use crate::common;

const TD: &str = "keyring.test";
const WAIT: Duration = Duration::from_secs(60);
const KEY_A: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const KEY_B: &str = "2222222222222222222222222222222222222222222222222222222222222222";

fn id_of(hex: &str) -> String {
    Key::parse(hex).unwrap().id().to_string()
}

/// The names every member of `gossip` holds alive, itself included.
fn alive(gossip: &Gossip) -> Vec<String> {
    gossip
        .members()
        .iter()
        .filter(|m| m.state == Liveness::Alive)
        .map(|m| m.id.name.to_string())
        .collect()
}

/// Waits until each of `pool` holds exactly `names` alive.
async fn converged(pool: &[&Gossip], names: &[&str]) {
    let mut want: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    want.sort();
    until("the pool to converge", WAIT, async || {
        let seen: Vec<Vec<String>> = pool.iter().map(|g| alive(g)).collect();
        if seen.iter().all(|s| *s == want) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
}

fn auth_drops(pool: &[&Gossip]) -> u64 {
    pool.iter()
        .map(|g| g.metrics().packets_dropped(DropReason::Auth))
        .sum()
}

async fn start_agent(
    pki: &TestPkiDir,
    dir: &Path,
    name: &str,
    authority: &Authority,
    seed: SocketAddr,
) -> NodeAgent {
    let upstream = [authority.xds_addr()];
    let mut config = common::agent_on_loopback(name, "eu", "a", &dir.join(name), &upstream);
    config.ingest = vec![authority.ingest_addr().unwrap().to_string()];
    config.tls = Some(Tls::new(TD, &pki.issue(&format!("region/eu/node/{name}"))));
    config.gossip = Some(waymark_agent::node::config::Gossip {
        bind: "127.0.0.1:0".parse().unwrap(),
        seeds: vec![seed.into()],
        // The configuration keeps naming A for the whole test: a restart must still
        // come back with what the rotation left.
        keys: vec![KEY_A.to_owned()],
    });
    NodeAgent::start(config).await.unwrap()
}

async fn keyring(
    api: &ApiClient,
    method: Method,
    body: Option<Value>,
) -> (http::StatusCode, Value) {
    common::call(api, method, "/v1/operator/keyring", body).await
}

/// `waymark keyring <args> -o json` against `authority`, as an operator runs it.
fn cli(authority: &Authority, pki: &TestPkiDir, token: &str, args: &[&str]) -> Value {
    let out = tokio::task::block_in_place(|| {
        std::process::Command::new(env!("CARGO_BIN_EXE_waymark"))
            .arg("keyring")
            .args(args)
            .args(["-o", "json", "--api"])
            .arg(format!("https://{}", authority.http_addr()))
            .arg("--ca-bundle")
            .arg(pki.bundle())
            .args(["--token", token])
            .output()
            .unwrap()
    });
    assert!(
        out.status.success(),
        "waymark keyring {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Per key id, (held by, primary on), from a keyring report.
fn counts(report: &Value) -> Vec<(String, u64, u64)> {
    report["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["key_id"].as_str().unwrap().to_owned(),
                k["held_by"].as_u64().unwrap(),
                k["primary_on"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_rotates_its_key_online_and_shuts_out_the_old_one() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPkiDir::init(&dir.path().join("pki"), TD, &["eu"]);
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = common::plain(&dir.path().join("authority"), "eu", &["a"], any);
    config.ingest = Some(any);
    config.tls = Some(TlsSettings {
        trust_domain: TrustDomain::new(TD).unwrap(),
        paths: pki.issue("region/eu/authority/1"),
    });
    config.gossip = Some(GossipSettings {
        bind: any,
        zone: "a".parse().unwrap(),
        seeds: Vec::new(),
        keyring: Keyring::parse(&[KEY_A]).unwrap(),
    });
    let authority = common::single_member(config).await;
    let token = common::operator_token(&authority, "keys").await;
    let api = authority.api_client(Some(token.clone()));
    let seed = authority.gossip().unwrap().local_addr();
    let n1 = start_agent(&pki, dir.path(), "n1", &authority, seed).await;
    let mut n2 = start_agent(&pki, dir.path(), "n2", &authority, seed).await;
    let names = ["authority-1", "n1", "n2"];
    {
        let pool = [
            authority.gossip().unwrap(),
            n1.gossip().unwrap(),
            n2.gossip().unwrap(),
        ];
        converged(&pool, &names).await;
    }
    // Both agents hold their evidence session: the leader can ask all three.
    until("every pool member to answer", WAIT, async || {
        let (status, report) = keyring(&api, Method::GET, None).await;
        (status.is_success() && report["complete"] == true && report["total"] == 3)
            .then_some(())
            .ok_or(report)
    })
    .await;
    let (a, b) = (id_of(KEY_A), id_of(KEY_B));

    // Bad input and unsafe steps are refused, naming why; nothing changes.
    for (body, status, reason) in [
        (json!({"op": "rotate", "key": KEY_B}), 400, "unknown_op"),
        (json!({"op": "install", "key": "not a key"}), 400, "bad_key"),
        (json!({"op": "use", "key": KEY_B}), 409, "key_not_installed"),
        (json!({"op": "remove", "key_id": a}), 409, "remove_primary"),
    ] {
        let (got, answer) = keyring(&api, Method::POST, Some(body.clone())).await;
        assert_eq!(
            (got.as_u16(), common::reason(&answer)),
            (status, reason),
            "{body}: {answer}"
        );
    }
    let (_, listed) = keyring(&api, Method::GET, None).await;
    assert_eq!(counts(&listed), [(a.clone(), 3, 3)], "{listed}");

    // 1. install B, through the CLI with the key in a file.
    let key_file = dir.path().join("key-b");
    std::fs::write(&key_file, format!("{KEY_B}\n")).unwrap();
    let installed = cli(
        &authority,
        &pki,
        &token,
        &["install", "--key-file", key_file.to_str().unwrap()],
    );
    assert_eq!(installed["complete"], true, "{installed}");
    assert_eq!(
        counts(&installed),
        [(a.clone(), 3, 3), (b.clone(), 3, 0)],
        "{installed}"
    );
    assert!(
        !installed.to_string().contains(KEY_B),
        "no key material in an answer"
    );
    // 2. use B, by its id; 3. remove A.
    let (status, used) = keyring(&api, Method::POST, Some(json!({"op": "use", "key_id": b}))).await;
    assert!(status.is_success(), "{used}");
    assert_eq!(
        counts(&used),
        [(b.clone(), 3, 3), (a.clone(), 3, 0)],
        "{used}"
    );
    let (status, removed) = keyring(
        &api,
        Method::POST,
        Some(json!({"op": "remove", "key": KEY_A})),
    )
    .await;
    assert!(status.is_success(), "{removed}");
    assert_eq!(counts(&removed), [(b.clone(), 3, 3)], "{removed}");
    let listed = cli(&authority, &pki, &token, &["list"]);
    assert_eq!(counts(&listed), [(b.clone(), 3, 3)], "{listed}");

    // Membership never noticed: everyone still alive, and not one datagram was refused.
    {
        let pool = [
            authority.gossip().unwrap(),
            n1.gossip().unwrap(),
            n2.gossip().unwrap(),
        ];
        converged(&pool, &names).await;
        assert_eq!(
            auth_drops(&pool),
            0,
            "a rotation in three steps drops nothing"
        );
        for g in pool {
            assert_eq!(g.metrics().keyring_keys(), 1);
            assert_eq!(g.metrics().keyring_operations("install", "applied"), 1);
            assert_eq!(
                g.metrics().keyring_operations("use", "refused"),
                0,
                "refused at the leader"
            );
        }
    }
    let metrics = common::metrics_text(&api).await;
    assert_eq!(
        common::series_value(
            &metrics,
            r#"waymark_gossip_keyring_operations_total{op="remove",result="applied"}"#
        ),
        1,
        "{metrics}"
    );

    // A member that holds only A is shut out: what it sends is refused and counted.
    let stale = stale_member(seed).await;
    until(
        "the stale member's datagrams to be refused",
        WAIT,
        async || {
            let refused = authority
                .gossip()
                .unwrap()
                .metrics()
                .packets_dropped(DropReason::Auth);
            (refused > 0).then_some(()).ok_or(refused)
        },
    )
    .await;
    assert!(
        !alive(authority.gossip().unwrap()).contains(&"stale".to_owned()),
        "the stale member never joined"
    );
    assert_eq!(alive(&stale), ["stale"], "nobody answered it");
    stale.shutdown().await.unwrap();

    // A restarted agent comes back with B from its data directory, not A from its config.
    let file = dir.path().join("n2").join(keyring_file::FILE_NAME);
    assert_eq!(
        keyring_file::load(&file)
            .unwrap()
            .unwrap()
            .primary()
            .id()
            .to_string(),
        b
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    n2.shutdown().await;
    n2 = start_agent(&pki, dir.path(), "n2", &authority, seed).await;
    let restarted = n2.gossip().unwrap();
    assert_eq!(restarted.keyring().status().await.primary.to_string(), b);
    {
        let pool = [authority.gossip().unwrap(), n1.gossip().unwrap(), restarted];
        converged(&pool, &names).await;
    }
    until("the restarted agent to answer with B", WAIT, async || {
        let (_, report) = keyring(&api, Method::GET, None).await;
        (report["complete"] == true && counts(&report) == [(b.clone(), 3, 3)])
            .then_some(())
            .ok_or(report)
    })
    .await;

    n2.shutdown().await;
    n1.shutdown().await;
    authority.shutdown().await;
}

/// A gossip member that missed the rotation: it holds only key A.
async fn stale_member(seed: SocketAddr) -> Gossip {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let id = GossipId::new(
        "stale".parse().unwrap(),
        addr,
        "a".parse().unwrap(),
        Role::Agent,
    );
    let mut config = GossipConfig::new(addr, id, Keyring::parse(&[KEY_A]).unwrap());
    config.seeds = vec![seed.into()];
    config.announce_period = Duration::from_millis(100);
    Gossip::start_with_socket(config, socket).unwrap()
}
