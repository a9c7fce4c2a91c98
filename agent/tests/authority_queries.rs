//! Consul-grade reads on a real single-member authority, over real sockets: blocking
//! queries (`?index=&wait=`, answered with `X-Waymark-Index`) return on a change and not
//! before, time out at their wait with the same index, and return at once for an index the
//! member does not hold; pages (`?limit=&cursor=`) walk every instance once while instances
//! are registered between them; filters select; bad parameters are refused with `400`
//! naming the parameter, counted, and change nothing.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::call;

use std::collections::BTreeSet;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;
use waymark_agent::api_client::{ApiClient, ApiResponse};
use waymark_agent::authority::api::{INDEX_HEADER, JITTER_DIVISOR, NEXT_CURSOR_HEADER};
use waymark_agent::authority::member::Authority;

/// Longer than any wait a test here asks for, so a held request is never cut by the client.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// A lease that outlives every test here (no expiry moves an index mid-test).
const LEASE_MS: u64 = 600_000;

async fn single_member(dir: &std::path::Path) -> Authority {
    let any = "127.0.0.1:0".parse().unwrap();
    common::single_member(common::plain(dir, "eu", &["a", "b"], any)).await
}

fn registration(ip: &str, zone: &str, tags: &[&str]) -> Value {
    json!({
        "service": "pay",
        "locality": {"region": "eu", "zone": zone, "node": "n1"},
        "address": {"ip": ip, "port": 8080},
        "tags": tags,
        "lease_ms": LEASE_MS,
    })
}

async fn register(api: &ApiClient, ip: &str, zone: &str, tags: &[&str]) -> String {
    let (status, body) = call(
        api,
        Method::POST,
        "/v1/instances",
        Some(registration(ip, zone, tags)),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["instance"].as_str().unwrap().to_owned()
}

async fn get(api: &ApiClient, path: &str) -> ApiResponse {
    let r = api.send(Method::GET, path, None).await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{path}: {r:?}");
    r
}

fn index(r: &ApiResponse) -> u64 {
    r.headers[INDEX_HEADER].to_str().unwrap().parse().unwrap()
}

fn ids(r: &ApiResponse) -> Vec<String> {
    let list: Value = serde_json::from_slice(&r.body).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|i| i["instance"]["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_query_returns_on_a_registration_not_before_and_times_out_at_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    let a = single_member(dir.path()).await;
    let api = common::operator(&a, "test")
        .await
        .with_timeout(CLIENT_TIMEOUT);
    let service = json!({"owner": "payments", "contract": {}});
    let (status, _) = call(&api, Method::PUT, "/v1/services/pay", Some(service)).await;
    assert_eq!(status, StatusCode::OK);

    // Held on the current index of the instance list.
    let start = get(&api, "/v1/instances").await;
    let at = index(&start);
    assert!(at >= 1);
    let held = tokio::spawn({
        let api = api.clone();
        async move {
            let r = get(&api, &format!("/v1/instances?index={at}&wait=60s")).await;
            (r, Instant::now())
        }
    });
    // Writes to what the list does not read — a policy (audited), the service itself —
    // do not release it: the list's index stays where it was.
    let policy = json!({"allowed_callers": ["web"]});
    let (status, body) = call(&api, Method::PUT, "/v1/services/pay/policy", Some(policy)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let service = json!({"owner": "team-pay", "contract": {}});
    let (status, _) = call(&api, Method::PUT, "/v1/services/pay", Some(service)).await;
    assert_eq!(status, StatusCode::OK);
    let unmoved = get(&api, "/v1/instances").await;
    assert_eq!(index(&unmoved), at);
    assert!(
        !held.is_finished(),
        "returned although nothing it reads changed"
    );

    // A registration releases it, with the new index and the new instance.
    let sent = Instant::now();
    let id = register(&api, "10.0.0.1", "a", &[]).await;
    let acked = Instant::now();
    let (r, returned) = held.await.unwrap();
    assert!(index(&r) > at, "{:?}", r.headers);
    assert_eq!(ids(&r), [id]);
    let from_ack = returned.saturating_duration_since(acked);
    eprintln!(
        "blocking query returned {:?} after the registration was sent, {:?} after it was acknowledged",
        returned - sent,
        from_ack
    );
    // Far above what it takes (see docs/cli.md, "Blocking queries"); a miss here is a poll, not a slow machine.
    assert!(from_ack < Duration::from_secs(1), "{from_ack:?}");

    // Nothing changes what a service's record reads: held for its wait (plus at most a
    // sixteenth), then answered with the same index.
    let record = get(&api, "/v1/services/pay").await;
    let at = index(&record);
    let wait = Duration::from_secs(2);
    let start = Instant::now();
    let timed_out = get(&api, &format!("/v1/services/pay?index={at}&wait=2s")).await;
    let waited = start.elapsed();
    assert_eq!(index(&timed_out), at);
    assert!(waited >= wait, "{waited:?}");
    assert!(
        waited < wait + wait / JITTER_DIVISOR + Duration::from_secs(1),
        "{waited:?}"
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&timed_out.body).unwrap()["owner"],
        "team-pay"
    );

    // An index this member does not hold (from the future, or from before a restart that
    // lost its log) is answered at once with the current one, so the client resets.
    let now = index(&get(&api, "/v1/instances").await);
    for asked in [now + 1_000_000, u64::MAX] {
        let start = Instant::now();
        let r = get(&api, &format!("/v1/instances?index={asked}&wait=60s")).await;
        assert_eq!(index(&r), now);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }
    // Index 0 never waits.
    let start = Instant::now();
    let r = get(&api, "/v1/instances?index=0&wait=60s").await;
    assert_eq!(index(&r), now);
    assert!(start.elapsed() < Duration::from_secs(5));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_walk_every_instance_once_while_instances_are_registered() {
    let dir = tempfile::tempdir().unwrap();
    let a = single_member(dir.path()).await;
    let api = common::operator(&a, "test").await;
    let service = json!({"owner": "payments", "contract": {}});
    let (status, _) = call(&api, Method::PUT, "/v1/services/pay", Some(service)).await;
    assert_eq!(status, StatusCode::OK);
    let mut present = BTreeSet::new();
    for i in 1..=30 {
        present.insert(register(&api, &format!("10.0.1.{i}"), "a", &[]).await);
    }

    let mut seen = Vec::new();
    let mut path = "/v1/instances?limit=7".to_owned();
    let mut added = 0;
    loop {
        let r = get(&api, &path).await;
        let page = ids(&r);
        assert!(page.len() <= 7, "{page:?}");
        seen.extend(page);
        // One more instance between every two pages; issued ids sort before and after
        // the cursor alike (`pay-r31` sorts before `pay-r4`).
        added += 1;
        register(&api, &format!("10.0.2.{added}"), "b", &[]).await;
        let Some(next) = r.headers.get(NEXT_CURSOR_HEADER) else {
            break;
        };
        path = format!("/v1/instances?limit=7&cursor={}", next.to_str().unwrap());
        assert!(added < 50, "the walk does not end");
    }
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(
        unique.len(),
        seen.len(),
        "an instance was listed twice: {seen:?}"
    );
    for id in &present {
        assert!(unique.contains(id), "{id} was skipped");
    }
    // The pages were in id order, as the unpaged list is.
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted);

    // The services list pages too.
    let (status, _) = call(
        &api,
        Method::PUT,
        "/v1/services/web",
        Some(json!({"owner": "web", "contract": {}})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let first = get(&api, "/v1/services?limit=1").await;
    let name = |r: &ApiResponse| {
        let list: Value = serde_json::from_slice(&r.body).unwrap();
        list[0]["service"].as_str().unwrap().to_owned()
    };
    assert_eq!(name(&first), "pay");
    let cursor = first.headers[NEXT_CURSOR_HEADER]
        .to_str()
        .unwrap()
        .to_owned();
    let second = get(&api, &format!("/v1/services?limit=1&cursor={cursor}")).await;
    assert_eq!(name(&second), "web");
    assert!(second.headers.get(NEXT_CURSOR_HEADER).is_none());
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_select_and_bad_parameters_are_refused_changing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = single_member(dir.path()).await;
    let api = common::operator(&a, "test").await;
    for service in ["pay", "web"] {
        let body = json!({"owner": "team", "contract": {}});
        let path = format!("/v1/services/{service}");
        let (status, _) = call(&api, Method::PUT, &path, Some(body)).await;
        assert_eq!(status, StatusCode::OK);
    }
    let canary = register(&api, "10.0.0.1", "a", &["canary", "v2"]).await;
    let v2 = register(&api, "10.0.0.2", "b", &["v2"]).await;
    let plain = register(&api, "10.0.0.3", "b", &[]).await;
    let web = json!({
        "service": "web",
        "locality": {"region": "eu", "zone": "a", "node": "n1"},
        "address": {"ip": "10.0.0.4", "port": 80},
        "lease_ms": LEASE_MS,
    });
    let (status, body) = call(&api, Method::POST, "/v1/instances", Some(web)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let web = body["instance"].as_str().unwrap().to_owned();

    let listed = async |query: &str| -> BTreeSet<String> {
        ids(&get(&api, &format!("/v1/instances?{query}")).await)
            .into_iter()
            .collect()
    };
    let set = |ids: &[&String]| -> BTreeSet<String> { ids.iter().map(|s| (*s).clone()).collect() };
    assert_eq!(listed("service=pay").await, set(&[&canary, &v2, &plain]));
    assert_eq!(listed("tag=v2").await, set(&[&canary, &v2]));
    assert_eq!(listed("tag=v2&tag=canary").await, set(&[&canary]));
    assert_eq!(listed("zone=a").await, set(&[&canary, &web]));
    assert_eq!(listed("service=pay&zone=b").await, set(&[&v2, &plain]));
    assert_eq!(listed("zone=c").await, set(&[]));

    // Refusals: 400 naming the parameter, counted, and nothing changed.
    let before = get(&api, "/v1/instances").await;
    let text = common::metrics_text(&api).await;
    let refused_before = |reason: &str| {
        common::series_value(
            &text,
            &format!("waymark_api_refusals_total{{reason=\"{reason}\"}}"),
        )
    };
    let (unknown_before, wait_before) = (
        refused_before("unknown_parameter"),
        refused_before("bad_wait"),
    );
    for (path, reason, field) in [
        ("/v1/instances?colour=red", "unknown_parameter", "colour"),
        ("/v1/instances?verdict=healthy", "unknown_value", "verdict"),
        (
            "/v1/instances?capability=magic",
            "unknown_value",
            "capability",
        ),
        ("/v1/instances?passing=maybe", "unknown_value", "passing"),
        ("/v1/instances?index=1&wait=forever", "bad_wait", "wait"),
        ("/v1/instances?index=soon", "bad_index", "index"),
        ("/v1/instances?limit=0", "bad_limit", "limit"),
        ("/v1/instances?limit=1001", "bad_limit", "limit"),
        ("/v1/instances?limit=5&cursor=nope", "bad_cursor", "cursor"),
        ("/v1/services?tag=v2", "unknown_parameter", "tag"),
        ("/v1/services/pay?limit=5", "unknown_parameter", "limit"),
        (
            "/v1/services/pay/view?verdict=healthy",
            "unknown_value",
            "verdict",
        ),
        ("/v1/prometheus/sd?service=a%20b", "bad_name", "service"),
        ("/v1/prometheus/sd?cursor=x", "unknown_parameter", "cursor"),
    ] {
        let (status, body) = call(&api, Method::GET, path, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(common::reason(&body), reason, "{path}: {body}");
        assert_eq!(body["error"]["field"], field, "{path}: {body}");
    }
    let after = get(&api, "/v1/instances").await;
    assert_eq!(index(&after), index(&before));
    assert_eq!(ids(&after), ids(&before));
    common::counted(
        &api,
        "waymark_api_refusals_total{reason=\"unknown_parameter\"}",
        unknown_before + 4,
    )
    .await;
    common::counted(
        &api,
        "waymark_api_refusals_total{reason=\"bad_wait\"}",
        wait_before + 1,
    )
    .await;
    a.shutdown().await;
}
