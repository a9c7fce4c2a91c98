//! Prometheus HTTP service discovery against the real Prometheus server (Debian's
//! `prometheus`): a dev region's `web` endpoints become Prometheus targets through
//! `http_sd_configs` over the region's HTTPS API, with the operator's bearer token and the
//! dev CA, as docs/cli.md's snippet configures it; a hard-failed backend leaves the targets.
//! Prometheus is judged only by its own HTTP API (`/api/v1/targets`).
//!
//! The same region shows the filters and blocking queries on real verdicts: `passing`,
//! `zone`, `capability` and `verdict` on `/v1/instances` and the view, and a blocking view
//! query released by the withdrawal.
//!
//! Prometheus is `common::prometheus` (`PROMETHEUS_BIN`, else `prometheus` on the `PATH`).
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::prometheus::{self, Prometheus};

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::dev::WAIT;
use http::Method;
use serde_json::{Value, json};
use waymark_agent::api_client::{ApiClient, ApiResponse};
use waymark_agent::authority::api::INDEX_HEADER;
use waymark_testkit::until;

/// The web backends of the dev region (2 per zone, 3 zones).
const WEB: usize = 6;

/// The `http_sd_configs` job docs/cli.md shows, for the dev region's API.
fn config(api: std::net::SocketAddr, token: &Path, ca: &Path) -> String {
    format!(
        r#"global:
  scrape_interval: 1m
scrape_configs:
  - job_name: waymark-web
    http_sd_configs:
      - url: https://{api}/v1/prometheus/sd?service=web
        refresh_interval: 1s
        authorization:
          type: Bearer
          credentials_file: {token}
        tls_config:
          ca_file: {ca}
    relabel_configs:
      - source_labels: [__meta_waymark_service]
        target_label: service
      - source_labels: [__meta_waymark_zone]
        target_label: zone
      - source_labels: [__meta_waymark_instance]
        target_label: instance
"#,
        token = token.display(),
        ca = ca.display(),
    )
}

async fn get(api: &ApiClient, path: &str) -> ApiResponse {
    let r = api.send(Method::GET, path, None).await.unwrap();
    assert!(r.status.is_success(), "{path}: {r:?}");
    r
}

fn json_of(r: &ApiResponse) -> Value {
    serde_json::from_slice(&r.body).unwrap()
}

/// Instance ids listed by `GET /v1/instances?{query}`.
async fn instances(api: &ApiClient, query: &str) -> BTreeSet<String> {
    let r = get(api, &format!("/v1/instances?{query}")).await;
    json_of(&r)
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["instance"]["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The addresses Prometheus discovery lists for `web`.
async fn sd_targets(api: &ApiClient) -> BTreeSet<String> {
    let groups = json_of(&get(api, "/v1/prometheus/sd?service=web").await);
    groups
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["targets"][0].as_str().unwrap().to_owned())
        .collect()
}

fn addresses(targets: &[Value]) -> BTreeSet<String> {
    targets
        .iter()
        .map(|t| {
            t["discoveredLabels"]["__address__"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_discovers_the_dev_regions_eligible_web_endpoints() {
    let Some(bin) = prometheus::bin("prometheus_sd") else {
        return;
    };
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let dev = common::dev::start(&dir.path().join("dev")).await;
    let api = dev.api_client();
    let control = ApiClient::new(&dev.backends_api().to_string(), None);
    until("every web backend eligible", WAIT, async || {
        instances(&api, "service=web&passing").await.len() == WEB
    })
    .await;

    // The discovery document: one group per eligible endpoint, with its labels.
    let groups = json_of(&get(&api, "/v1/prometheus/sd?service=web").await);
    let groups = groups.as_array().unwrap();
    assert_eq!(groups.len(), WEB, "{groups:?}");
    let zones: BTreeSet<&str> = groups
        .iter()
        .map(|g| {
            let labels = &g["labels"];
            assert_eq!(labels["__meta_waymark_service"], "web", "{g}");
            assert_eq!(labels["__meta_waymark_verdict"], "eligible", "{g}");
            assert_eq!(labels["__meta_waymark_verified"], "true", "{g}");
            labels["__meta_waymark_zone"].as_str().unwrap()
        })
        .collect();
    assert_eq!(zones, BTreeSet::from(["az1", "az2", "az3"]));
    let discovered = sd_targets(&api).await;
    // Every service's, when none is named (web, checkout and inventory: 12 backends).
    until("every service's endpoints discovered", WAIT, async || {
        let all = json_of(&get(&api, "/v1/prometheus/sd").await);
        let n = all.as_array().unwrap().len();
        if n == 12 { Ok(()) } else { Err(n) }
    })
    .await;

    // Filters on real verdicts.
    let ids = dev.instances();
    let web_az1: BTreeSet<String> = ["web-az1-1", "web-az1-2"]
        .iter()
        .map(|b| ids[*b].to_string())
        .collect();
    assert_eq!(
        instances(&api, "service=web&zone=az1&passing").await,
        web_az1
    );
    assert_eq!(
        instances(&api, "service=web&capability=verified")
            .await
            .len(),
        WEB
    );
    assert!(
        instances(&api, "service=web&verdict=ineligible")
            .await
            .is_empty()
    );

    // The real Prometheus finds the same endpoints, over TLS, with the bearer token.
    let prometheus = Prometheus::start(
        &bin,
        dir.path(),
        &config(
            dev.authority().http_addr(),
            dev.token_file(),
            dev.ca_bundle(),
        ),
    );
    let targets = until(
        "Prometheus discovers the web endpoints",
        WAIT,
        async || match prometheus.targets("waymark-web").await {
            Ok(t) if addresses(&t) == discovered => Ok(t),
            Ok(t) => Err(format!("{:?}", addresses(&t))),
            Err(e) => Err(e),
        },
    )
    .await;
    for t in &targets {
        assert_eq!(t["labels"]["service"], "web", "{t}");
        let instance = t["labels"]["instance"].as_str().unwrap();
        assert!(
            ids.values().any(|id| id.as_str() == instance),
            "{instance} is not a demo instance"
        );
    }

    // A client following web's view with blocking queries, as consul-template does: each
    // answer comes with a higher index, and the hard failure reaches it.
    let failed = ids["web-az1-1"].to_string();
    let view = get(&api, "/v1/services/web/view").await;
    let first: u64 = view.headers[INDEX_HEADER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let follower = tokio::spawn({
        let api = api.clone().with_timeout(Duration::from_secs(120));
        let failed = failed.clone();
        async move {
            let mut seen = vec![first];
            loop {
                let at = *seen.last().unwrap();
                let r = get(&api, &format!("/v1/services/web/view?index={at}&wait=90s")).await;
                let index: u64 = r.headers[INDEX_HEADER].to_str().unwrap().parse().unwrap();
                seen.push(index);
                let views = json_of(&r);
                // Endpoints are keyed by instance id.
                let routed = views
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["view"]["endpoints"][failed.as_str()]["verdict"] == "eligible");
                if !routed {
                    return seen;
                }
            }
        }
    });
    let r = control
        .send(
            Method::PUT,
            "/v1/dev/backends/web-az1-1/mode",
            Some(&json!({"mode": "fail-hard"})),
        )
        .await
        .unwrap();
    assert!(r.status.is_success(), "{r:?}");
    let seen = follower.await.unwrap();
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    until("web-az1-1 out of passing", WAIT, async || {
        !instances(&api, "service=web&passing")
            .await
            .contains(&failed)
    })
    .await;
    assert!(
        instances(&api, "service=web&verdict=ineligible&verdict=withdrawn")
            .await
            .contains(&failed)
    );
    let remaining = sd_targets(&api).await;
    assert_eq!(remaining.len(), WEB - 1, "{remaining:?}");
    until(
        "Prometheus drops the failed endpoint",
        WAIT,
        async || match prometheus.targets("waymark-web").await {
            Ok(t) if addresses(&t) == remaining => Ok(()),
            Ok(t) => Err(format!("{:?}", addresses(&t))),
            Err(e) => Err(e),
        },
    )
    .await;
    drop(prometheus);
    dev.stop().await;
}
