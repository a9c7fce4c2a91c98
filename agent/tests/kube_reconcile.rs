//! The Kubernetes reconciler end to end: the stand-in API server, the real kube-rs client
//! and watcher, the reconciler, and an in-memory authority state as the proposer.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, WatchEvent, WatchParams};
use waymark_agent::authority::kube::diff::{AddressFamily, SERVICE_NAME_LABEL};
use waymark_agent::authority::kube::standin::StandIn;
use waymark_agent::authority::kube::{
    DiffConfig, KubeMetrics, KubeReconciler, KubeReconcilerConfig, Propose, ProposeError,
    ReconcileStatus,
};
use waymark_core::contract::HealthContract;
use waymark_core::model::InstanceId;
use waymark_registry::machine::{AuthorityState, Request, Response};
use waymark_registry::state::{Applied, Command, DesiredState, Stamped};

/// The authority state behind a mutex, as the leader's Raft would hold it.
#[derive(Default)]
struct Memory {
    state: Mutex<AuthorityState>,
}

impl Propose for Memory {
    fn read_registry<R>(&self, read: impl FnOnce(&DesiredState) -> R) -> R {
        read(self.state.lock().unwrap().registry())
    }

    fn propose(
        &self,
        command: Command,
    ) -> impl Future<Output = Result<Applied, ProposeError>> + Send {
        let response = self
            .state
            .lock()
            .unwrap()
            .apply(Request::Registry(Stamped { at_ms: 1, command }));
        async move {
            match response {
                Response::Registry { outcome } => outcome.map_err(ProposeError::Refused),
                other => panic!("unexpected response {other:?}"),
            }
        }
    }
}

impl Memory {
    fn registry(&self) -> DesiredState {
        self.state.lock().unwrap().registry().clone()
    }
}

fn slice(name: &str, svc: &str, endpoints: Vec<Endpoint>) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        endpoints,
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            labels: Some([(SERVICE_NAME_LABEL.to_owned(), svc.to_owned())].into()),
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

fn ep(uid: &str, ip: &str, zone: &str, node: &str, terminating: bool) -> Endpoint {
    Endpoint {
        addresses: vec![ip.into()],
        conditions: Some(EndpointConditions {
            ready: Some(!terminating),
            serving: Some(true),
            terminating: Some(terminating),
        }),
        node_name: Some(node.into()),
        zone: Some(zone.into()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            name: Some(format!("pay-{uid}")),
            namespace: Some("shop".into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    }
}

fn id(s: &str) -> InstanceId {
    s.parse().unwrap()
}

fn client(standin: &StandIn) -> kube::Client {
    let config = kube::Config::new(standin.url().parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

/// Waits (at most 10 s) until `done` holds, re-checking after every reconciler pass.
async fn until(
    status: &mut tokio::sync::watch::Receiver<Arc<ReconcileStatus>>,
    what: &str,
    mut done: impl FnMut(&ReconcileStatus) -> bool,
) {
    let outcome = tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| done(s)))
        .await
        .map(|r| r.is_ok());
    match outcome {
        Ok(true) => {}
        Ok(false) => panic!("reconciler stopped while waiting for: {what}"),
        Err(_) => panic!(
            "timed out waiting for: {what}; last status {:?}",
            status.borrow()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_become_instances_and_a_broken_watch_changes_nothing() {
    // Goal: the whole existence path against the real kube-rs client and watcher.
    waymark_certs::install_crypto_provider();
    let (mut standin, _) = StandIn::start().await.unwrap();
    let memory = Arc::new(Memory::default());
    memory
        .propose(Command::PutService {
            service: "pay.shop".parse().unwrap(),
            owner: "team-pay".into(),
            contract: HealthContract::default(),
        })
        .await
        .unwrap();
    let mut config = KubeReconcilerConfig::new(DiffConfig {
        region: "eu".parse().unwrap(),
        cluster: "test".into(),
        namespace: None,
        default_zone: "unknown".parse().unwrap(),
        unknown_node: "unknown".parse().unwrap(),
        address_family: AddressFamily::IPv4,
    });
    config.resync = Duration::from_millis(300);
    config.backoff_min = Duration::from_millis(50);
    config.backoff_max = Duration::from_millis(200);
    let metrics = KubeMetrics::new();
    let reconciler =
        KubeReconciler::spawn(client(&standin), memory.clone(), config, metrics.clone());
    let mut status = reconciler.status();
    let live = |m: &Memory, i: &str| m.registry().instance(&id(i)).cloned();

    // Three endpoints → three instances, zone/node locality, pod-UID ids.
    let three = vec![
        ep("u1", "10.0.0.1", "eu-a", "n1", false),
        ep("u2", "10.0.0.2", "eu-b", "n2", false),
        ep("u3", "10.0.0.3", "eu-c", "n3", false),
    ];
    standin.apply(slice("pay-1", "pay", three.clone()));
    until(&mut status, "three instances", |_| {
        memory.registry().instances().count() == 3
    })
    .await;
    let u2 = live(&memory, "u2:8080").unwrap();
    assert_eq!(u2.instance.locality.zone.as_str(), "eu-b");
    assert_eq!(u2.instance.locality.node.as_str(), "n2");
    assert_eq!(u2.instance.address.to_string(), "10.0.0.2:8080");
    assert!(!u2.draining);

    // Terminating → observed draining.
    let mut endpoints = three.clone();
    endpoints[1] = ep("u2", "10.0.0.2", "eu-b", "n2", true);
    standin.apply(slice("pay-1", "pay", endpoints.clone()));
    until(&mut status, "u2 draining", |_| {
        live(&memory, "u2:8080").is_some_and(|r| r.draining)
    })
    .await;

    // An endpoint gone → Forget (retired for good).
    endpoints.remove(2);
    standin.apply(slice("pay-1", "pay", endpoints.clone()));
    until(&mut status, "u3 forgotten", |_| {
        memory.registry().is_retired(&id("u3:8080"))
    })
    .await;

    // A replacement pod (new UID, same IP) → old forgotten, new observed, no refusal.
    endpoints[0] = ep("u4", "10.0.0.1", "eu-a", "n1", false);
    standin.apply(slice("pay-1", "pay", endpoints.clone()));
    until(&mut status, "u1 replaced by u4", |_| {
        memory.registry().is_retired(&id("u1:8080")) && live(&memory, "u4:8080").is_some()
    })
    .await;
    assert_eq!(metrics.refusals("duplicate_address"), 0);

    // An unmanaged service shows in the diff, never in the registry.
    standin.apply(slice(
        "cart-1",
        "cart",
        vec![ep("c1", "10.0.1.1", "eu-a", "n1", false)],
    ));
    until(&mut status, "cart unmanaged", |s| {
        s.diff.unmanaged.contains_key(&"cart.shop".parse().unwrap())
    })
    .await;
    assert!(
        memory
            .registry()
            .instances()
            .all(|r| r.instance.service.as_str() == "pay.shop")
    );
    until(&mut status, "converged", |s| {
        s.synced && s.diff.totals.converged()
    })
    .await;

    // The API server goes away: silence, not deletion.
    let before = memory.registry();
    standin.stop().await;
    standin.delete("shop", "pay-1"); // happens while nobody can see it
    until(&mut status, "watch broken", |s| !s.synced).await;
    let passes = status.borrow().passes;
    until(&mut status, "three held passes", |s| {
        s.passes >= passes + 3 && s.last_pass.held
    })
    .await;
    assert!(metrics.watch_errors() >= 1);
    assert_eq!(
        memory.registry(),
        before,
        "a broken watch must not change the registry"
    );

    // It comes back: a fresh list shows the deletion, and only now is it applied.
    standin.restart().await.unwrap();
    until(&mut status, "deletion applied after relist", |s| {
        s.synced && memory.registry().instances().count() == 0
    })
    .await;
    assert!(memory.registry().is_retired(&id("u2:8080")));

    // The real client spoke the protocol we serve.
    let requests = standin.requests();
    assert!(
        requests.iter().any(|r| r.contains("limit=")),
        "{requests:#?}"
    );
    assert!(
        requests.iter().any(|r| r.contains("watch=true")
            && r.contains("allowWatchBookmarks=true")
            && r.contains("resourceVersion=")),
        "{requests:#?}"
    );
    reconciler.shutdown();
}

#[tokio::test]
async fn the_stand_in_pages_lists_and_expires_old_resource_versions() {
    // Goal: the stand-in is honest about paging and 410, as seen by the real client.
    waymark_certs::install_crypto_provider();
    let (standin, _) = StandIn::start().await.unwrap();
    for i in 0..3 {
        standin.apply(slice(&format!("s{i}"), "pay", vec![]));
    }
    let api: kube::Api<EndpointSlice> = kube::Api::namespaced(client(&standin), "shop");
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().unwrap();
    let rest = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 1);
    assert!(rest.metadata.continue_.is_none_or(|c| c.is_empty()));

    standin.apply(slice("s3", "pay", vec![]));
    standin.compact();
    let mut stream = api
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    match stream.next().await {
        Some(Ok(WatchEvent::Error(status))) => assert_eq!(status.code, 410),
        other => panic!("expected a 410 error event, got {other:?}"),
    }
}

#[tokio::test]
async fn the_stand_in_streams_events_and_bookmarks_until_the_timeout() {
    // Goal: watch from 0 sends ADDED for what exists, then changes, bookmarks, and ends.
    waymark_certs::install_crypto_provider();
    let (standin, _) = StandIn::start().await.unwrap();
    standin.apply(slice("s0", "pay", vec![]));
    let api: kube::Api<EndpointSlice> = kube::Api::all(client(&standin));
    let params = WatchParams::default().timeout(3); // bookmarks are on by default
    let mut stream = api.watch(&params, "0").await.unwrap().boxed();
    assert!(matches!(
        stream.next().await,
        Some(Ok(WatchEvent::Added(_)))
    ));
    standin.delete("shop", "s0");
    assert!(matches!(
        stream.next().await,
        Some(Ok(WatchEvent::Deleted(_)))
    ));
    assert!(matches!(
        stream.next().await,
        Some(Ok(WatchEvent::Bookmark(_)))
    ));
    let rest = tokio::time::timeout(Duration::from_secs(10), stream.count()).await;
    assert!(rest.is_ok(), "the watch must end at timeoutSeconds");
}
