//! Every API route but the probes needs a verified principal, and every principal only
//! what its grants allow (ADR-15): a real single-member authority, called over HTTP.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::{call, reason};

use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::credentials;
use waymark_agent::authority::member::Authority;
use waymark_registry::acl::Capability;

const DAY: Duration = Duration::from_secs(86_400);

async fn member(dir: &std::path::Path) -> Authority {
    let any = "127.0.0.1:0".parse().unwrap();
    common::single_member(common::plain(dir, "eu", &["a"], any)).await
}

fn client(a: &Authority, token: Option<&str>) -> ApiClient {
    a.api_client(token.map(str::to_owned))
}

fn contract() -> Value {
    json!({"owner": "team-pay", "contract": {}})
}

async fn refusals(api: &ApiClient, reason: &str) -> f64 {
    let r = api.send(Method::GET, "/metrics", None).await.unwrap();
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let series = format!("waymark_api_refusals_total{{reason=\"{reason}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_but_the_probes_refuses_anonymous_and_bad_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let a = member(dir.path()).await;
    let anonymous = client(&a, None);
    for probe in ["/livez", "/readyz"] {
        let (status, _) = call(&anonymous, Method::GET, probe, None).await;
        assert_eq!(status, StatusCode::OK, "{probe}");
    }
    // Every documented route, with every method it documents.
    let spec: Value = serde_json::from_str(waymark_agent::authority::api::OPENAPI).unwrap();
    let mut checked = 0;
    for (path, ops) in spec["paths"].as_object().unwrap() {
        if path == "/livez" || path == "/readyz" {
            continue;
        }
        let concrete = path
            .replace("{service}", "pay")
            .replace("{id}", "pay-r1")
            .replace("{zone}", "a")
            .replace("{region}", "us")
            .replace("{name}", "ci");
        for method in ops.as_object().unwrap().keys() {
            let method: Method = method.to_uppercase().parse().unwrap();
            let r = anonymous
                .send(method.clone(), &concrete, Some(&json!({})))
                .await
                .unwrap();
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{method} {path}");
            assert!(
                r.body.starts_with(b"{\"error\""),
                "{method} {path}: the refusal is the API's error shape"
            );
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} routes documented");

    // A token that does not exist, a guess at a real one's secret, and a malformed one.
    let operator = credentials::operator_token(a.raft(), "alice", "alice", DAY)
        .await
        .unwrap();
    // The real secret with its last digit changed (to another digit: never itself).
    let last = if operator.ends_with('0') { '1' } else { '0' };
    let guessed = format!("{}{last}", &operator[..operator.len() - 1]);
    assert_ne!(guessed, operator);
    for bad in ["wmt.nobody.0000", guessed.as_str(), "alice"] {
        let (status, v) = call(&client(&a, Some(bad)), Method::GET, "/v1/services", None).await;
        assert_eq!(
            (status, reason(&v)),
            (StatusCode::UNAUTHORIZED, "bad_token"),
            "{bad}"
        );
    }
    let ops = client(&a, Some(&operator));
    assert!(refusals(&ops, "unauthenticated").await >= checked as f64);
    assert!(refusals(&ops, "bad_token").await >= 3.0);
    // Nothing an anonymous caller sent was written: no service, no audit record of it.
    let (_, services) = call(&ops, Method::GET, "/v1/services", None).await;
    assert_eq!(services, json!([]));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permission_the_document_states_is_the_one_enforced() {
    // Goal: the OpenAPI document says what each operation needs (x-waymark-permission);
    // a principal holding no grant at all is refused every operation that needs `read`,
    // before its handler runs, and let through to every one that needs only a principal.
    let dir = tempfile::tempdir().unwrap();
    let a = member(dir.path()).await;
    let _operator = credentials::operator_token(a.raft(), "alice", "alice", DAY)
        .await
        .unwrap();
    let nothing = credentials::token_with(a.raft(), "nothing", &[], DAY)
        .await
        .unwrap();
    let api = client(&a, Some(&nothing));
    let spec: Value = serde_json::from_str(waymark_agent::authority::api::OPENAPI).unwrap();
    let (mut reads, mut open) = (0, 0);
    for (path, ops) in spec["paths"].as_object().unwrap() {
        let concrete = path
            .replace("{service}", "pay")
            .replace("{id}", "pay-r1")
            .replace("{zone}", "a")
            .replace("{region}", "us")
            .replace("{name}", "ci")
            .replace("{node}", "n1")
            .replace("{client}", "c1")
            .replace("{seq}", "1")
            .replace("{member}", "2");
        for (method, op) in ops.as_object().unwrap() {
            let permission = op["x-waymark-permission"].as_str().unwrap();
            let method: Method = method.to_uppercase().parse().unwrap();
            let r = api
                .send(method.clone(), &concrete, Some(&json!({})))
                .await
                .unwrap();
            match permission {
                "read" => {
                    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                    assert_eq!(
                        (r.status, reason(&v)),
                        (StatusCode::FORBIDDEN, "forbidden"),
                        "{method} {path} needs read: {v}"
                    );
                    reads += 1;
                }
                "authenticated" | "none" => {
                    assert!(
                        r.status != StatusCode::FORBIDDEN && r.status != StatusCode::UNAUTHORIZED,
                        "{method} {path} needs only a principal: {}",
                        r.status
                    );
                    open += 1;
                }
                _ => {}
            }
        }
    }
    assert!(
        reads >= 15 && open >= 1,
        "{reads} reads, {open} open operations checked"
    );
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_decide_what_a_principal_may_do_and_refusals_are_audited() {
    let dir = tempfile::tempdir().unwrap();
    let a = member(dir.path()).await;
    let operator = credentials::operator_token(a.raft(), "alice", "alice", DAY)
        .await
        .unwrap();
    let ops = client(&a, Some(&operator));
    let reader = credentials::token_with(a.raft(), "reader", &[Capability::Read], DAY)
        .await
        .unwrap();
    let reader = client(&a, Some(&reader));
    let pay_owner =
        credentials::token_with(a.raft(), "pay-owner", &["own:pay".parse().unwrap()], DAY)
            .await
            .unwrap();
    let pay_owner = client(&a, Some(&pay_owner));

    // A reader reads and writes nothing.
    let (status, _) = call(&reader, Method::GET, "/v1/services", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, v) = call(&reader, Method::PUT, "/v1/services/pay", Some(contract())).await;
    assert_eq!((status, reason(&v)), (StatusCode::FORBIDDEN, "forbidden"));
    assert!(
        v["error"]["message"].as_str().unwrap().contains("own:pay"),
        "the refusal names the capability: {v}"
    );
    // An owner of pay writes pay, not web, and may not read without `read`.
    let (status, _) = call(
        &pay_owner,
        Method::PUT,
        "/v1/services/pay",
        Some(contract()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(
        &pay_owner,
        Method::PUT,
        "/v1/services/web",
        Some(contract()),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call(&pay_owner, Method::GET, "/v1/services", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Nor manage grants or evacuate.
    let (status, _) = call(
        &pay_owner,
        Method::POST,
        "/v1/acl/grants",
        Some(json!({"to": "token/pay-owner", "can": "acl"})),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "no one grants themselves more"
    );
    let (status, _) = call(
        &reader,
        Method::POST,
        "/v1/zones/a/evacuation",
        Some(json!({"action": "evacuate"})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // whoami answers any principal with its grants.
    let (status, me) = call(&pay_owner, Method::GET, "/v1/acl/whoami", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me["principal"], "token/pay-owner");
    assert_eq!(
        me["grants"],
        json!([{"to": "token/pay-owner", "can": "own:pay"}])
    );

    // The refusals reach the audit log, folded per principal and capability, with the
    // verified principal as the actor.
    let audit = waymark_testkit::until("the refusals audited", common::dev::WAIT, async || {
        let r = ops
            .send(Method::GET, "/v1/audit?kind=denial", None)
            .await
            .ok()?;
        let lines: Vec<Value> = String::from_utf8_lossy(&r.body)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (lines.len() >= 4).then_some(lines)
    })
    .await;
    let actors: Vec<(&str, &str)> = audit
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap(),
                e["detail"]["needed"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    for want in [
        ("token/reader", "own:pay"),
        ("token/pay-owner", "own:web"),
        ("token/pay-owner", "read"),
        ("token/pay-owner", "acl"),
        ("token/reader", "evacuate"),
    ] {
        assert!(actors.contains(&want), "{want:?} in {actors:?}");
    }
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_minted_shown_once_and_revoked_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let a = member(dir.path()).await;
    let operator = credentials::operator_token(a.raft(), "alice", "alice", DAY)
        .await
        .unwrap();
    let ops = client(&a, Some(&operator));
    let (status, minted) = call(
        &ops,
        Method::POST,
        "/v1/acl/tokens",
        Some(json!({"name": "scrape", "ttl_s": 3600, "description": "prometheus", "grants": ["read"]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{minted}");
    let token = minted["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("wmt.scrape."));
    let scrape = client(&a, Some(&token));
    let (status, _) = call(&scrape, Method::GET, "/metrics", None).await;
    assert_eq!(status, StatusCode::OK, "a scrape token reads metrics");
    // The listing never shows a secret or its digest.
    let (_, listed) = call(&ops, Method::GET, "/v1/acl/tokens", None).await;
    let text = listed.to_string();
    assert!(
        text.contains("\"scrape\"") && text.contains("prometheus"),
        "{text}"
    );
    assert!(!text.contains(token.rsplit('.').next().unwrap()), "{text}");
    assert!(!text.contains("sha256"), "{text}");
    // A name is minted once; a lifetime beyond the ceiling is refused.
    let (status, v) = call(
        &ops,
        Method::POST,
        "/v1/acl/tokens",
        Some(json!({"name": "scrape", "ttl_s": 60})),
    )
    .await;
    assert_eq!(
        (status, reason(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "token_exists")
    );
    // A malformed name is refused naming the field the registry checked.
    let (status, v) = call(
        &ops,
        Method::POST,
        "/v1/acl/tokens",
        Some(json!({"name": "Not-A-Name", "ttl_s": 60})),
    )
    .await;
    assert_eq!(
        (status, reason(&v), v["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "bad_name", Some("token")),
        "{v}"
    );
    let (status, v) = call(
        &ops,
        Method::POST,
        "/v1/acl/tokens",
        Some(json!({"name": "forever", "ttl_s": u64::MAX})),
    )
    .await;
    assert_eq!(
        (status, reason(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "bad_ttl")
    );
    // Revoked: it authenticates no more.
    let (status, _) = call(&ops, Method::DELETE, "/v1/acl/tokens/scrape", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, v) = call(&scrape, Method::GET, "/metrics", None).await;
    assert_eq!(
        (status, reason(&v)),
        (StatusCode::UNAUTHORIZED, "bad_token")
    );
    // Bootstrap needs an operator's certificate: a token, even the operator's, is refused.
    let (status, v) = call(&ops, Method::POST, "/v1/acl/bootstrap", None).await;
    assert_eq!((status, reason(&v)), (StatusCode::FORBIDDEN, "not_owner"));
    // Every change is audited with the verified principal as the actor.
    let (_, audit) = (
        (),
        ops.send(Method::GET, "/v1/audit?kind=acl", None)
            .await
            .unwrap(),
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&audit.body)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let actions: Vec<(&str, &str, &str)> = lines
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap(),
                e["detail"]["action"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    for want in [
        ("token/alice", "mint_token", "applied"),
        ("token/alice", "grant", "applied"),
        ("token/alice", "mint_token", "refused"),
        ("token/alice", "remove_token", "applied"),
    ] {
        assert!(actions.contains(&want), "{want:?} in {actions:?}");
    }
    a.shutdown().await;
}
