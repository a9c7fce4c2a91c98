//! The disruption budget on overrides (ADR-15), through a real single-member authority:
//! a manual withdrawal that would take a zone below its floor, or past the service's
//! budget of concurrent manual withdrawals, is refused with `409 disruption_budget`,
//! audited as awaiting approval, and applied only when a *second* principal approves it
//! within the window; node maintenance (every instance on a node) is checked the same way.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::{call, reason};

use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use waymark_testkit::until;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_refuses_what_would_break_a_zone_and_a_second_principal_can_approve_it() {
    let dir = tempfile::tempdir().unwrap();
    let any = "127.0.0.1:0".parse().unwrap();
    let a = common::single_member(common::plain(dir.path(), "eu", &["a", "b"], any)).await;
    let api = common::operator(&a, "admin").await;
    let (status, _) = call(
        &api,
        Method::PUT,
        "/v1/services/pay",
        Some(json!({"owner": "payments", "contract": {}})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // Zone a: four instances on nodes n1 (three) and n2 (one); its floor is two.
    let mut ids = Vec::new();
    for (i, node) in ["n1", "n1", "n1", "n2"].into_iter().enumerate() {
        let reg = json!({
            "service": "pay",
            "locality": {"region": "eu", "zone": "a", "node": node},
            "address": {"ip": format!("10.0.0.{}", i + 1), "port": 8080},
            "lease_ms": 600_000,
        });
        let (status, body) = call(&api, Method::POST, "/v1/instances", Some(reg)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.push(body["instance"].as_str().unwrap().to_owned());
    }
    until("the four instances published", WAIT, async || {
        let (_, views) = call(&api, Method::GET, "/v1/services/pay/view", None).await;
        let n = views[0]["view"]["endpoints"]
            .as_object()
            .map_or(0, |e| e.len());
        if n == 4 { Ok(()) } else { Err(views) }
    })
    .await;
    let alice = common::operator(&a, "alice").await;
    let bob = common::operator(&a, "bob").await;
    let maintenance = |target: Value| {
        let mut body = json!({"action": "maintenance_on", "justification": "disk failing"});
        body.as_object_mut()
            .unwrap()
            .extend(target.as_object().unwrap().clone());
        body
    };

    // Node n1 holds three of zone a's four: taking it out would leave one, below two.
    let (status, body) = call(
        &alice,
        Method::POST,
        "/v1/overrides",
        Some(maintenance(json!({"node": "n1"}))),
    )
    .await;
    assert_eq!(
        (status, reason(&body)),
        (StatusCode::CONFLICT, "disruption_budget"),
        "{body}"
    );
    assert_eq!(body["budget"], "zone_floor", "{body}");
    let node_seq = body["approval"]["seq"].as_u64().unwrap();

    // One instance is within the budget; a second is past the service's manual budget
    // (a quarter of four) even though the zone could spare it.
    let (status, body) = call(
        &alice,
        Method::POST,
        "/v1/overrides",
        Some(maintenance(json!({"instance": ids[0]}))),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(
        &alice,
        Method::POST,
        "/v1/overrides",
        Some(maintenance(json!({"instance": ids[3]}))),
    )
    .await;
    assert_eq!(
        (status, reason(&body)),
        (StatusCode::CONFLICT, "disruption_budget"),
        "{body}"
    );
    assert_eq!(body["budget"], "manual_withdrawals", "{body}");
    let seq = body["approval"]["seq"].as_u64().unwrap();
    let approve = |seq: u64| format!("/v1/overrides/{seq}/approve");
    let why = json!({"justification": "incident 42: the replica corrupts writes"});

    // Nothing was applied by the refusal.
    let (_, e) = call(
        &api,
        Method::GET,
        &format!("/v1/instances/{}/explain", ids[3]),
        None,
    )
    .await;
    assert_ne!(e["verdict"], "draining", "{e}");
    // The asker cannot approve their own request; a second principal can, once.
    let (status, body) = call(&alice, Method::POST, &approve(seq), Some(why.clone())).await;
    assert_eq!(
        (status, reason(&body)),
        (StatusCode::CONFLICT, "same_principal"),
        "{body}"
    );
    let (status, body) = call(&bob, Method::POST, &approve(seq), Some(json!({}))).await;
    assert_eq!(
        (status, reason(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "no_justification")
    );
    let (status, body) = call(&bob, Method::POST, &approve(seq), Some(why.clone())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["applied"], 1, "{body}");
    let (status, body) = call(&api, Method::POST, &approve(seq), Some(why.clone())).await;
    assert_eq!(
        (status, reason(&body)),
        (StatusCode::CONFLICT, "already_approved"),
        "{body}"
    );
    let (status, body) = call(&bob, Method::POST, &approve(9_999), Some(why.clone())).await;
    assert_eq!(
        (status, reason(&body)),
        (StatusCode::NOT_FOUND, "not_awaiting_approval"),
        "{body}"
    );
    // A principal that may not read the audit log learns nothing from an approval's
    // refusal: whether a number awaits approval, or was approved, is refused as a read.
    let (status, minted) = call(
        &api,
        Method::POST,
        "/v1/acl/tokens",
        Some(json!({"name": "nobody", "ttl_s": 3600, "grants": []})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{minted}");
    let nobody = a.api_client(Some(minted["token"].as_str().unwrap().to_owned()));
    for n in [seq, 9_999] {
        let (status, body) = call(&nobody, Method::POST, &approve(n), Some(why.clone())).await;
        assert_eq!(
            (status, reason(&body)),
            (StatusCode::FORBIDDEN, "forbidden"),
            "{n}: {body}"
        );
    }
    until("the approved override applied", WAIT, async || {
        let (_, e) = call(
            &api,
            Method::GET,
            &format!("/v1/instances/{}/explain", ids[3]),
            None,
        )
        .await;
        if e["verdict"] == "draining" {
            Ok(())
        } else {
            Err(e)
        }
    })
    .await;
    // The node request is still approvable: the window is ten minutes.
    assert!(node_seq < seq);

    // Exactly one of instance and node.
    let (status, body) = call(
        &alice,
        Method::POST,
        "/v1/overrides",
        Some(maintenance(json!({"instance": ids[1], "node": "n1"}))),
    )
    .await;
    assert_eq!(
        (status, reason(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "bad_target"),
        "{body}"
    );

    // The audit log tells the story: asked, refused awaiting approval, approved by bob.
    let audit = api
        .send(Method::GET, "/v1/audit?kind=override", None)
        .await
        .unwrap();
    let lines: Vec<Value> = String::from_utf8_lossy(&audit.body)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let awaiting = lines
        .iter()
        .filter(|l| l["outcome"] == "awaiting_approval")
        .count();
    assert_eq!(awaiting, 2, "{lines:?}");
    let approved = lines.iter().find(|l| l["outcome"] == "approved").unwrap();
    assert_eq!(approved["detail"]["approves"], seq);
    assert!(
        approved["actor"].as_str().unwrap().contains("bob"),
        "{approved}"
    );
    assert!(
        approved["detail"]["requested_by"]
            .as_str()
            .unwrap()
            .contains("alice"),
        "{approved}"
    );
}
