//! The query and policy API of a real single-member authority: what it answers, how it
//! refuses bad input (a status, a JSON body naming the field, a metric, an audit record
//! for denials, and no change to state), its OpenAPI document, its Prometheus exposition
//! (linted by `promtool`), and the CLI wrappers.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::call;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::member::Authority;
use waymark_testkit::until;

const WAIT: Duration = Duration::from_secs(20);

async fn single_member(dir: &std::path::Path) -> Authority {
    let any = "127.0.0.1:0".parse().unwrap();
    common::single_member(common::plain(dir, "eu", &["a", "b"], any)).await
}

async fn raw(api: &ApiClient, method: Method, path: &str, body: &str) -> (StatusCode, Value) {
    let r = api
        .send_bytes(method, path, Some(bytes::Bytes::from(body.to_owned())))
        .await
        .unwrap();
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

fn refusal(v: &Value) -> (String, Option<String>) {
    (
        v["error"]["reason"].as_str().unwrap_or_default().to_owned(),
        v["error"]["field"].as_str().map(str::to_owned),
    )
}

fn registration(ip: &str, lease_ms: u64) -> Value {
    json!({
        "service": "pay",
        "locality": {"region": "eu", "zone": "a", "node": "n1"},
        "address": {"ip": ip, "port": 8080},
        "lease_ms": lease_ms,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_refuses_bad_input_without_changing_state_and_documents_itself() {
    let dir = tempfile::tempdir().unwrap();
    let a = single_member(dir.path()).await;
    let api = common::operator(&a, "test").await;
    let anonymous = ApiClient::new(&a.http_addr().to_string(), None);

    // A contract that breaks a rule is refused naming the field, and not stored.
    let bad =
        json!({"owner": "payments", "contract": {"probe": {"kind": "tcp", "interval": "10ms"}}});
    let (status, body) = call(&api, Method::PUT, "/v1/services/pay", Some(bad)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        refusal(&body).1.as_deref(),
        Some("contract.probe.interval"),
        "{body}"
    );
    let (status, _) = call(&api, Method::GET, "/v1/services/pay", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Malformed and mistyped bodies name what is wrong.
    let (status, body) = raw(&api, Method::PUT, "/v1/services/pay", "{not json").await;
    assert_eq!(
        (status, refusal(&body).0.as_str()),
        (StatusCode::BAD_REQUEST, "malformed_body")
    );
    let (status, body) = raw(&api, Method::PUT, "/v1/services/pay", r#"{"contract": {}}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(refusal(&body).1.as_deref(), Some("owner"), "{body}");
    let (status, body) = raw(
        &api,
        Method::PUT,
        "/v1/services/pay",
        r#"{"owner": "x", "contract": {}, "colour": 1}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(refusal(&body).1.as_deref(), Some("colour"), "{body}");

    let ok = json!({"owner": "payments", "contract": {}});
    let (status, _) = call(&api, Method::PUT, "/v1/services/pay", Some(ok)).await;
    assert_eq!(status, StatusCode::OK);

    // Registration: issued ids, and refusals that change nothing.
    let (status, body) = call(
        &api,
        Method::POST,
        "/v1/instances",
        Some(registration("10.0.0.1", 0)),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["instance"].as_str().unwrap().to_owned();
    for (reg, want_status, want_field) in [
        (registration("10.0.0.1", 0), StatusCode::CONFLICT, "address"),
        (
            registration("0.0.0.0", 0),
            StatusCode::UNPROCESSABLE_ENTITY,
            "address",
        ),
        (
            registration("10.0.0.2", 10),
            StatusCode::UNPROCESSABLE_ENTITY,
            "lease",
        ),
    ] {
        let (status, body) = call(&api, Method::POST, "/v1/instances", Some(reg)).await;
        assert_eq!(status, want_status, "{body}");
        assert_eq!(refusal(&body).1.as_deref(), Some(want_field), "{body}");
    }
    let (status, body) = call(&api, Method::PUT, "/v1/instances/pay-r77/renew", None).await;
    assert_eq!(
        (status, refusal(&body).0.as_str()),
        (StatusCode::NOT_FOUND, "unknown_instance")
    );
    let (_, list) = call(&api, Method::GET, "/v1/instances", None).await;
    assert_eq!(
        list.as_array().unwrap().len(),
        1,
        "a refusal changed state: {list}"
    );
    let (status, _) = call(
        &api,
        Method::PUT,
        &format!("/v1/instances/{id}/renew"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    // Three more instances in its zone, published: the zone holds four routed instances
    // and a floor of two, so one override is within the disruption budget (ADR-15).
    for ip in ["10.0.0.3", "10.0.0.4", "10.0.0.5"] {
        let (status, body) = call(
            &api,
            Method::POST,
            "/v1/instances",
            Some(registration(ip, 0)),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    until("the four instances published", WAIT, async || {
        let (_, views) = call(&api, Method::GET, "/v1/services/pay/view", None).await;
        let endpoints = &views[0]["view"]["endpoints"];
        let n = endpoints
            .as_object()
            .map(|e| e.len())
            .or_else(|| endpoints.as_array().map(Vec::len))
            .unwrap_or(0);
        if n == 4 { Ok(()) } else { Err(views) }
    })
    .await;

    // Overrides: privileged, justified, rate-limited, audited either way once named.
    let o =
        |j: Option<&str>| json!({"instance": id, "action": "maintenance_on", "justification": j});
    let (status, _) = call(
        &anonymous,
        Method::POST,
        "/v1/overrides",
        Some(o(Some("disk"))),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "no principal");
    let alice = common::operator_token(&a, "alice").await;
    let ops = ApiClient::new(&a.http_addr().to_string(), Some(alice.clone()));
    let (status, body) = call(&ops, Method::POST, "/v1/overrides", Some(o(None))).await;
    assert_eq!(
        (status, refusal(&body).1.as_deref()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("justification"))
    );
    let mut granted = 0;
    let mut limited = 0;
    for _ in 0..7 {
        let (status, _) = call(
            &ops,
            Method::POST,
            "/v1/overrides",
            Some(o(Some("disk failing"))),
        )
        .await;
        match status {
            StatusCode::OK => granted += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((granted, limited), (5, 2));
    let audit = api
        .send(Method::GET, "/v1/audit?kind=override", None)
        .await
        .unwrap();
    let lines: Vec<Value> = String::from_utf8_lossy(&audit.body)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let outcomes: Vec<&str> = lines
        .iter()
        .map(|l| l["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes.iter().filter(|o| **o == "granted").count(), 5);
    // The anonymous attempt is refused before the audit log: only a named operator's
    // attempts on a live instance (no justification, rate-limited twice) are recorded.
    assert_eq!(
        outcomes.iter().filter(|o| **o == "refused").count(),
        3,
        "{outcomes:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["actor"].as_str().unwrap().starts_with("token/alice")),
        "the verified principal is the actor"
    );

    // The maintenance override takes it out of rotation; explain says why.
    let e = until("the override to apply", WAIT, async || {
        let (_, e) = call(
            &api,
            Method::GET,
            &format!("/v1/instances/{id}/explain"),
            None,
        )
        .await;
        if e["verdict"] == "draining" {
            Ok(e)
        } else {
            Err(e)
        }
    })
    .await;
    assert_eq!(e["eligibility"]["drain_cause"], "maintenance", "{e}");
    assert_eq!(e["rule"]["rule"], "maintenance", "{e}");
    assert!(e["text"].as_str().unwrap().contains(&id), "{e}");

    // Services and views: counts per verdict, a view per caller zone with its markers.
    let views = until("a view per caller zone", WAIT, async || {
        let (_, views) = call(&api, Method::GET, "/v1/services/pay/view", None).await;
        let zones: BTreeSet<String> = views
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["view"]["key"]["zone"].as_str().unwrap().to_owned())
            .collect();
        if zones.len() == 2 {
            Ok(views)
        } else {
            Err(views)
        }
    })
    .await;
    assert!(views[0]["view"]["markers"].is_object());
    let (_, services) = call(&api, Method::GET, "/v1/services", None).await;
    assert_eq!(services[0]["service"], "pay");
    assert_eq!(services[0]["instances"], 4);

    // Routing policy and zone evacuation: privileged, checked before commit, audited.
    let policy = json!({"min_healthy_override": 700, "failover_zones": ["b", "a"]});
    let (status, _) = call(
        &anonymous,
        Method::PUT,
        "/v1/services/pay/policy",
        Some(policy.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = call(&ops, Method::PUT, "/v1/services/pay/policy", Some(policy)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, held) = call(&api, Method::GET, "/v1/services/pay/policy", None).await;
    assert_eq!(held["min_healthy_override"], 700);
    let bad = json!({"min_healthy_override": 0});
    let (status, body) = call(&ops, Method::PUT, "/v1/services/pay/policy", Some(bad)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let evacuate = json!({"action": "evacuate", "manual": true});
    let (status, body) = call(
        &ops,
        Method::POST,
        "/v1/zones/a/evacuation",
        Some(evacuate.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(&ops, Method::POST, "/v1/zones/b/evacuation", Some(evacuate)).await;
    assert_eq!(
        (status, refusal(&body).0.as_str()),
        (StatusCode::CONFLICT, "evacuation"),
        "evacuating the last zone must be refused: {body}"
    );
    let (status, _) = call(
        &ops,
        Method::POST,
        "/v1/zones/a/evacuation",
        Some(json!({"action": "complete_shift_back"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "nothing awaits completion");
    until("evacuation progress recorded", WAIT, async || {
        let (_, zones) = call(&api, Method::GET, "/v1/zones", None).await;
        if zones["evacuations"]["a"]["moved"].as_u64().unwrap_or(0) > 0 {
            Ok(())
        } else {
            Err(zones)
        }
    })
    .await;
    let policy_audit = api
        .send(Method::GET, "/v1/audit?kind=policy", None)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&policy_audit.body).into_owned();
    assert!(
        text.contains("\"refused\"") && text.contains("\"granted\""),
        "{text}"
    );

    // Liveness and readiness are the member's own business.
    for route in ["/livez", "/readyz"] {
        let r = api.send(Method::GET, route, None).await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{route}: {r:?}");
    }
    // A member that has applied nothing yet (never initialised) is alive but not ready.
    let fresh_dir = tempfile::tempdir().unwrap();
    let any = "127.0.0.1:0".parse().unwrap();
    let fresh = waymark_agent::authority::member::Authority::start(common::plain(
        fresh_dir.path(),
        "eu",
        &["a"],
        any,
    ))
    .await
    .unwrap();
    let fresh_api = ApiClient::new(&fresh.http_addr().to_string(), None);
    let live = fresh_api.send(Method::GET, "/livez", None).await.unwrap();
    assert_eq!(live.status, StatusCode::OK);
    let ready = fresh_api.send(Method::GET, "/readyz", None).await.unwrap();
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE, "{ready:?}");
    fresh.shutdown().await;

    // The OpenAPI document is served and parses (that it documents every route the router
    // serves, method by method: cli_coverage::every_operation_in_the_table_is_mounted).
    let (status, doc) = call(&api, Method::GET, "/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        doc["paths"].as_object().is_some_and(|p| p.len() > 30),
        "{doc}"
    );

    // The exposition passes promtool and carries the alarms and signals.
    // Verdict counts are refreshed every couple of seconds: wait for the first.
    let text = until("verdict counts", WAIT, async || {
        let metrics = api.send(Method::GET, "/metrics", None).await.unwrap();
        let text = String::from_utf8(metrics.body.to_vec()).unwrap();
        text.contains("waymark_instances{").then_some(text)
    })
    .await;
    for name in [
        "waymark_api_refusals_total",
        "waymark_overrides_total",
        "waymark_leader",
        "waymark_instances",
    ] {
        assert!(text.contains(name), "{name} missing");
    }
    common::promtool_check(&text);

    // The CLI wrappers read the same API.
    let bin = env!("CARGO_BIN_EXE_waymark");
    let base = a.http_addr().to_string();
    let run = |args: &[&str]| {
        let out = Command::new(bin)
            .args(args)
            .args(["--api", &base, "--token", &alice])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let peers = run(&["operator", "raft", "list-peers"]);
    assert!(peers.contains("leader"), "{peers}");
    assert!(run(&["services"]).contains("pay"));
    assert!(run(&["explain", &id]).contains(&id));
    assert!(run(&["audit", "--kind", "override"]).contains("alice"));
    let _ = run(&["proxy-status"]);
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_under_a_dns_name_and_an_address_that_is_not_host_port_is_refused() {
    // Goal: StatefulSet members are known by name, not IP; Raft resolves the name when it
    // connects. What is not host:port is refused naming the field, the group unchanged.
    let dir = tempfile::tempdir().unwrap();
    let leader = single_member(dir.path()).await;
    let api = common::operator(&leader, "test").await;
    for bad in [
        "waymark-authority-1",
        "bad_name.example:8500",
        "localhost:0",
    ] {
        let (status, v) = call(
            &api,
            Method::POST,
            "/v1/operator/raft/members",
            Some(json!({"id": 2, "addr": bad, "raft": "127.0.0.1:1"})),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert_eq!(
            refusal(&v),
            ("bad_address".to_owned(), Some("addr".to_owned()))
        );
    }
    let (_, peers) = call(&api, Method::GET, "/v1/operator/raft/peers", None).await;
    assert_eq!(peers.as_array().map(Vec::len), Some(1), "{peers}");

    // A second member, reached as localhost:<port>: it catches up and becomes a voter.
    let second_dir = tempfile::tempdir().unwrap();
    let mut config = common::plain(
        second_dir.path(),
        "eu",
        &["a", "b"],
        "127.0.0.1:0".parse().unwrap(),
    );
    config.id = 2;
    let second = Authority::start(config).await.unwrap();
    let addr = format!("localhost:{}", second.http_addr().port());
    let raft = format!("localhost:{}", second.raft_addr().port());
    let (status, v) = call(
        &api,
        Method::POST,
        "/v1/operator/raft/members",
        Some(json!({"id": 2, "addr": addr, "raft": raft})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let joined = v
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == 2)
        .unwrap_or_else(|| panic!("member 2 missing: {v}"));
    assert_eq!(joined["member"]["raft_addr"], raft.as_str(), "{joined}");
    assert_eq!(joined["member"]["api_addr"], addr.as_str(), "{joined}");
    assert_eq!(joined["role"], "follower", "{joined}");
    second.shutdown().await;
    leader.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_registrations_share_log_entries_and_each_gets_its_own_answer() {
    // Group commit: registrations that arrive while others commit are proposed as one log
    // entry, yet every caller is answered with its own command's outcome, after it
    // committed: a refusal in a batch refuses only its own caller.
    let dir = tempfile::tempdir().unwrap();
    let a = single_member(dir.path()).await;
    let api = common::operator(&a, "test").await;
    let ok = json!({"owner": "payments", "contract": {}});
    let (status, _) = call(&api, Method::PUT, "/v1/services/pay", Some(ok)).await;
    assert_eq!(status, StatusCode::OK);
    let ghost = |ip: &str| {
        let mut r = registration(ip, 0);
        r["service"] = json!("ghost");
        r
    };
    // What a lone registration of an unknown service gets.
    let (alone, body) = call(&api, Method::POST, "/v1/instances", Some(ghost("10.9.0.1"))).await;
    assert!(alone.is_client_error(), "{alone} {body}");

    const N: usize = 96;
    let before = a
        .raft()
        .watch_metrics()
        .borrow()
        .last_log_index
        .unwrap_or(0);
    let calls: Vec<_> = (0..N)
        .map(|i| {
            let api = api.clone();
            let ip = format!("10.1.{}.{}", i / 200, i % 200 + 1);
            let body = if i % 4 == 0 {
                ghost(&ip)
            } else {
                registration(&ip, 0)
            };
            tokio::spawn(async move { call(&api, Method::POST, "/v1/instances", Some(body)).await })
        })
        .collect();
    let mut created = BTreeSet::new();
    for (i, c) in calls.into_iter().enumerate() {
        let (status, body) = c.await.unwrap();
        if i % 4 == 0 {
            assert_eq!(status, alone, "call {i}: {body}");
        } else {
            assert_eq!(status, StatusCode::CREATED, "call {i}: {body}");
            assert!(created.insert(body["instance"].as_str().unwrap().to_owned()));
        }
    }
    let after = a
        .raft()
        .watch_metrics()
        .borrow()
        .last_log_index
        .unwrap_or(0);
    // Fewer entries than commands (the leader's own publish and audit entries included):
    // they were batched.
    assert!(
        after - before < N as u64 / 2,
        "{} log entries for {N} registrations",
        after - before
    );
    // Every acknowledged registration is in the committed state.
    let (_, list) = call(&api, Method::GET, "/v1/instances", None).await;
    let listed: BTreeSet<String> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["instance"]["id"].as_str().map(str::to_owned))
        .collect();
    assert!(created.is_subset(&listed), "{list}");
    // And the leader followed every batched command as it follows a lone one: each
    // registration reaches the published view.
    until("every batched registration in the view", WAIT, async || {
        let (_, views) = call(&api, Method::GET, "/v1/services/pay/view", None).await;
        let in_view: BTreeSet<String> = views
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["view"]["endpoints"].as_object())
            .flat_map(|e| e.keys().cloned())
            .collect();
        if created.is_subset(&in_view) {
            Ok(())
        } else {
            Err(format!(
                "{} of {} in the view",
                created.intersection(&in_view).count(),
                created.len()
            ))
        }
    })
    .await;
}
