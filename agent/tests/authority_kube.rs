//! Existence from Kubernetes through a real authority member: the stand-in API server adds
//! endpoints, marks one terminating and deletes one, and the views the authority publishes
//! follow. (No Kubernetes API server can run on this machine; the stand-in speaks the real
//! list/watch protocol to the real kube client — see docs/architecture.md.)
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::kube::standin::StandIn;
use waymark_agent::authority::settings::KubeSettings;
use waymark_testkit::until;

const WAIT: Duration = Duration::from_secs(20);

fn slice(endpoints: Vec<Endpoint>) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        endpoints,
        metadata: ObjectMeta {
            name: Some("web-abc".into()),
            namespace: Some("shop".into()),
            labels: Some([("kubernetes.io/service-name".to_owned(), "web".to_owned())].into()),
            ..ObjectMeta::default()
        },
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..EndpointPort::default()
        }]),
    }
}

fn ep(uid: &str, ip: &str, zone: &str, terminating: bool) -> Endpoint {
    Endpoint {
        addresses: vec![ip.into()],
        conditions: Some(EndpointConditions {
            ready: Some(!terminating),
            serving: Some(true),
            terminating: Some(terminating),
        }),
        node_name: Some(format!("node-{uid}")),
        zone: Some(zone.into()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            name: Some(format!("web-{uid}")),
            namespace: Some("shop".into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    }
}

/// The routed endpoints of web.shop's view for callers in zone `a`: id → status.
async fn routed(api: &ApiClient) -> BTreeMap<String, String> {
    let views = api.get_json("/v1/services/web.shop/view").await.unwrap();
    views
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["view"]["key"]["zone"] == "a")
        .map(|v| {
            v["view"]["endpoints"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(id, e)| (id.clone(), e["status"].as_str().unwrap().to_owned()))
                .filter(|(_, status)| status != "draining" && status != "withdrawn")
                .collect()
        })
        .unwrap_or_default()
}

async fn until_routed(api: &ApiClient, want: &[&str]) {
    until(
        &format!("the published view to route {want:?}"),
        WAIT,
        async || {
            let now = routed(api).await;
            let ids: Vec<&str> = now.keys().map(String::as_str).collect();
            if ids == want {
                Ok(())
            } else {
                Err(format!("routes {now:?}"))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_views_follow_the_orchestrator() {
    waymark_certs::install_crypto_provider();
    let (standin, _) = StandIn::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::plain(
        dir.path(),
        "eu",
        &["a", "b"],
        "127.0.0.1:0".parse().unwrap(),
    );
    config.kubernetes = Some(KubeSettings {
        api_url: Some(standin.url()),
        cluster: "test".into(),
        namespace: None,
        default_zone: None,
    });
    let a = common::single_member(config).await;
    let api = common::operator(&a, "test").await;
    until("the service to be accepted (a leader)", WAIT, async || {
        let r = api
            .send(
                Method::PUT,
                "/v1/services/web.shop",
                Some(&json!({"owner": "shop", "contract": {}})),
            )
            .await
            .unwrap();
        if r.status.is_success() {
            Ok(())
        } else {
            Err(r.status)
        }
    })
    .await;

    // Three pods appear: three instances with pod-UID ids, routed.
    standin.apply(slice(vec![
        ep("u1", "10.0.0.1", "a", false),
        ep("u2", "10.0.0.2", "a", false),
        ep("u3", "10.0.0.3", "b", false),
    ]));
    until_routed(&api, &["u1:8080", "u2:8080", "u3:8080"]).await;

    // One is terminating: it drains out of the view.
    standin.apply(slice(vec![
        ep("u1", "10.0.0.1", "a", false),
        ep("u2", "10.0.0.2", "a", true),
        ep("u3", "10.0.0.3", "b", false),
    ]));
    until_routed(&api, &["u1:8080", "u3:8080"]).await;

    // One is deleted (and u2 finished terminating): gone from the registry and the view.
    standin.apply(slice(vec![ep("u1", "10.0.0.1", "a", false)]));
    until_routed(&api, &["u1:8080"]).await;
    let instances = api
        .get_json("/v1/instances?service=web.shop")
        .await
        .unwrap();
    assert_eq!(instances.as_array().unwrap().len(), 1, "{instances}");

    // The reconciliation diff is served, in sync.
    let diff: Value = api.get_json("/v1/reconciliation").await.unwrap();
    assert_eq!(diff["synced"], true, "{diff}");
    a.shutdown().await;
}
