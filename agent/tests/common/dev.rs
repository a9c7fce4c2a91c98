//! A dev region on free loopback ports, and how long its tests wait for any one state.

use std::path::Path;
use std::time::Duration;

use http::Method;
use serde_json::json;
use waymark_agent::api_client::ApiClient;
use waymark_agent::dev::{DevArgs, DevRegion};

/// How long a dev-region test waits for any one state.
pub const WAIT: Duration = Duration::from_secs(60);

/// `waymark dev` with its state in `dir`, every listener on a free loopback port.
pub async fn start(dir: &Path) -> DevRegion {
    let any = "127.0.0.1:0".parse().expect("a socket address");
    DevRegion::start(DevArgs {
        dir: dir.to_path_buf(),
        api: any,
        xds: any,
        dns: any,
        agent_api: any,
        backends_api: any,
    })
    .await
    .expect("the dev region starts")
}

/// A real Envoy (`ENVOY_BIN`) on the dev node agent's local xDS, Delta ADS as the dev
/// guide's, as node `node_id` of cluster `node_cluster` in az1, routing `/` to web; returned
/// once it is live and holds web's six endpoints.
pub async fn envoy_on_web(
    dev: &DevRegion,
    node_id: &str,
    node_cluster: &str,
) -> crate::support::Envoy {
    use crate::support::{Envoy, EnvoyConfig, Route, Xds, XdsMode};
    let envoy = Envoy::start(EnvoyConfig {
        node_id: node_id.into(),
        node_cluster: node_cluster.into(),
        region: "dev".into(),
        zone: "az1".into(),
        xds: Some(Xds {
            addr: dev.agent().bound().xds,
            mode: XdsMode::Delta,
        }),
        routes: vec![Route::new("/", "web")],
        ..EnvoyConfig::default()
    })
    .await;
    envoy.wait_live(WAIT).await;
    envoy
        .wait_until("Envoy holds web's 6 endpoints", WAIT, async || {
            envoy.cluster_endpoints("web").await.map(|e| e.len()) == Some(6)
        })
        .await;
    envoy
}

/// One API call: the status and the JSON body (`Null` when it is not JSON).
pub use super::call;

/// `waymark <args>` as the dev region's operator, over TLS, as an operator runs it. The
/// process blocks this thread, which the region's own tasks then leave to the runtime's
/// other worker (so call it from a multi-threaded runtime).
pub fn operator_command(dev: &DevRegion, args: &[&str]) -> std::process::Output {
    tokio::task::block_in_place(|| {
        std::process::Command::new(env!("CARGO_BIN_EXE_waymark"))
            .args(args)
            .arg("--api")
            .arg(dev.authority().http_addr().to_string())
            .arg("--ca-bundle")
            .arg(dev.ca_bundle())
            .arg("--token-file")
            .arg(dev.token_file())
            .output()
            .expect("the waymark binary runs")
    })
}

/// Puts a demo backend into `mode` (`healthy`, `fail-hard`, `not-ready`, …) through the
/// backends' control API.
pub async fn set_mode(control: &ApiClient, backend: &str, mode: &str) {
    let r = control
        .send(
            Method::PUT,
            &format!("/v1/dev/backends/{backend}/mode"),
            Some(&json!({ "mode": mode })),
        )
        .await
        .unwrap();
    assert!(r.status.is_success(), "{r:?}");
}
