//! The authority's HTTP listener under hostile input, against a real single member: bodies
//! over their route's limit, free text and counts over their ceilings, a client that never
//! finishes its headers, and more connections than the cap. Each is refused with a clear
//! answer (a typed JSON error, a 503, or a closed connection), counted, and leaves the
//! member up and its state as it was — nothing proposed, nothing audited.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::api::{CONTRACT_BODY_MAX, INSTANCE_BODY_MAX};
use waymark_agent::authority::fields::{
    METADATA_VALUE_LEN_MAX, OVERRIDE_JUSTIFICATION_LEN_MAX, OWNER_LEN_MAX, REASON_LEN_MAX,
    TAG_LEN_MAX, TAGS_MAX,
};
use waymark_agent::authority::settings::Limits;
use waymark_agent::listener::HttpLimits;

/// How long a test waits for the member to do what it must; a failure, never a pace.
const GUARD: Duration = Duration::from_secs(30);

async fn call(api: &ApiClient, method: Method, path: &str, body: &Value) -> (StatusCode, Value) {
    let r = api.send(method, path, Some(body)).await.unwrap();
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

fn refusal(v: &Value) -> (&str, Option<&str>) {
    (
        v["error"]["reason"].as_str().unwrap_or_default(),
        v["error"]["field"].as_str(),
    )
}

fn registration(tags: Vec<String>, metadata: Value) -> Value {
    json!({
        "service": "pay",
        "locality": {"region": "eu", "zone": "a", "node": "n1"},
        "address": {"ip": "10.0.0.1", "port": 8080},
        "tags": tags,
        "metadata": metadata,
        "lease_ms": 30_000,
    })
}

/// Audit records of the member, as JSON lines.
async fn audit(api: &ApiClient) -> Vec<Value> {
    let r = api.send(Method::GET, "/v1/audit", None).await.unwrap();
    String::from_utf8_lossy(&r.body)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_and_fields_are_refused_before_anything_is_proposed() {
    let dir = tempfile::tempdir().unwrap();
    let any = "127.0.0.1:0".parse().unwrap();
    let a = common::single_member(common::plain(dir.path(), "eu", &["a"], any)).await;
    let api = common::operator(&a, "test").await;
    let ops = common::operator(&a, "alice").await;
    let anonymous = ApiClient::new(&a.http_addr().to_string(), None);
    let contract = json!({"profile": {"probe": true, "self_report": true, "passive": true}});

    // A body over its route's limit: 413 with the API's error shape, nothing stored.
    let huge = json!({"owner": "x".repeat(CONTRACT_BODY_MAX), "contract": contract});
    let (status, body) = call(&api, Method::PUT, "/v1/services/pay", &huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(refusal(&body).0, "body_too_large", "{body}");
    // A route without its own limit takes the small default.
    let (status, _) = call(
        &ops,
        Method::POST,
        "/v1/overrides",
        &json!({"instance": "x", "action": "maintenance_on", "justification": "j".repeat(INSTANCE_BODY_MAX)}),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    // Free text over its ceiling: 422 naming the field.
    let long_owner = json!({"owner": "o".repeat(OWNER_LEN_MAX + 1), "contract": contract});
    let (status, body) = call(&api, Method::PUT, "/v1/services/pay", &long_owner).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(refusal(&body), ("too_long", Some("owner")), "{body}");
    let (status, _) = call(&api, Method::GET, "/v1/services/pay", &Value::Null).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a refused declaration was stored"
    );

    let ok = json!({"owner": "payments", "contract": contract});
    let (status, body) = call(&api, Method::PUT, "/v1/services/pay", &ok).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    for (reg, field) in [
        (
            registration((0..=TAGS_MAX).map(|i| format!("t{i}")).collect(), json!({})),
            "tags",
        ),
        (
            registration(vec!["t".repeat(TAG_LEN_MAX + 1)], json!({})),
            "tags[0]",
        ),
        (
            registration(
                vec![],
                json!({"team": "v".repeat(METADATA_VALUE_LEN_MAX + 1)}),
            ),
            "metadata.team",
        ),
    ] {
        let (status, body) = call(&api, Method::POST, "/v1/instances", &reg).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{field}: {body}");
        assert_eq!(refusal(&body).1, Some(field), "{body}");
    }
    let (_, list) = call(&api, Method::GET, "/v1/instances", &Value::Null).await;
    assert_eq!(list, json!([]), "a refused registration was stored");

    // Refusals before the audit log: an anonymous request, an over-long justification
    // or reason. None of them is audited.
    let (status, body) = call(
        &anonymous,
        Method::POST,
        "/v1/overrides",
        &json!({"instance": "pay-r1", "action": "maintenance_on", "justification": "disk"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, body) = call(
        &ops,
        Method::POST,
        "/v1/overrides",
        &json!({"instance": "pay-r1", "action": "maintenance_on",
                "justification": "j".repeat(OVERRIDE_JUSTIFICATION_LEN_MAX + 1)}),
    )
    .await;
    assert_eq!(
        refusal(&body),
        ("too_long", Some("justification")),
        "{status} {body}"
    );
    let (status, body) = call(
        &ops,
        Method::POST,
        "/v1/federation/regions/us/failover",
        &json!({"action": "failover", "reason": "r".repeat(REASON_LEN_MAX + 1)}),
    )
    .await;
    assert_eq!(
        refusal(&body),
        ("too_long", Some("reason")),
        "{status} {body}"
    );
    assert!(
        audit(&api)
            .await
            .iter()
            .all(|e| e["kind"] != "override" && e["kind"] != "policy"),
        "a refused request was audited"
    );

    // Counted, and the member is up and serving: a good registration still commits.
    let text = String::from_utf8(
        api.send(Method::GET, "/metrics", None)
            .await
            .unwrap()
            .body
            .to_vec(),
    )
    .unwrap();
    for reason in ["body_too_large", "too_long", "too_many"] {
        assert!(
            text.contains(&format!(
                "waymark_api_refusals_total{{reason=\"{reason}\"}}"
            )),
            "{reason} not counted"
        );
    }
    let (status, _) = call(&api, Method::GET, "/readyz", &Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = call(
        &api,
        Method::POST,
        "/v1/instances",
        &registration(vec!["v2".into()], json!({"team": "payments"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    a.shutdown().await;
}

/// A member whose HTTP listener has `http` as its bounds.
async fn member_with(
    dir: &std::path::Path,
    http: HttpLimits,
) -> waymark_agent::authority::member::Authority {
    let any = "127.0.0.1:0".parse().unwrap();
    let mut config = common::plain(dir, "eu", &["a"], any);
    config.limits = Limits {
        http,
        ..Limits::default()
    };
    common::single_member(config).await
}

/// One request on a fresh connection: the whole answer.
async fn get(addr: SocketAddr, path: &str) -> String {
    get_as(addr, path, None).await
}

/// [`get`], presenting a bearer token.
async fn get_as(addr: SocketAddr, path: &str, token: Option<&str>) -> String {
    tokio::time::timeout(GUARD, try_get_as(addr, path, token))
        .await
        .expect("the member answers")
        .unwrap()
}

/// [`get_as`], with the connection's error (a refused connection may be reset before
/// its 503 is read).
async fn try_get_as(addr: SocketAddr, path: &str, token: Option<&str>) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    let auth = token.map_or_else(String::new, |t| format!("authorization: Bearer {t}\r\n"));
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n{auth}connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// Everything the member sends until it closes the connection.
async fn until_closed(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(GUARD, s.read_to_end(&mut out))
        .await
        .expect("the member closes the connection")
        .unwrap_or_default();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_cut_off_and_the_member_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let a = member_with(
        dir.path(),
        HttpLimits {
            header_read_timeout: Duration::from_millis(500),
            ..HttpLimits::AUTHORITY
        },
    )
    .await;
    let addr = a.http_addr();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"POST /v1/instances HTTP/1.1\r\nhost: x\r\ncontent-len")
        .await
        .unwrap();
    until_closed(&mut slow).await;
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_cap_is_refused_with_503_counted_and_the_member_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let a = member_with(
        dir.path(),
        HttpLimits {
            connections_max: 4,
            ..HttpLimits::AUTHORITY
        },
    )
    .await;
    let addr = a.http_addr();
    let token = common::operator_token(&a, "test").await;
    // Four keep-alive connections, each shown to be accepted by an answered request.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        held.push(s);
    }
    let mut refused = TcpStream::connect(addr).await.unwrap();
    let answer = until_closed(&mut refused).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("too_many_connections"), "{answer}");

    // A freed place is reused; the refusal was counted.
    drop(held.pop());
    let metrics = tokio::time::timeout(GUARD, async {
        loop {
            // Until the freed place is released, a try is refused (503, perhaps a reset).
            if let Ok(answer) = try_get_as(addr, "/metrics", Some(&token)).await
                && answer.starts_with("HTTP/1.1 200")
            {
                return answer;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("a freed place is reused");
    // At least the one above (the retries while the freed place was released may add more).
    let refused: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("waymark_http_connections_refused_total{listener=\"authority\"} ")
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(refused >= 1, "{metrics}");
    a.shutdown().await;
}
