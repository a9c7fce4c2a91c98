//! Every route of the authority API has an operator command, and every command runs against
//! a real authority (a dev region over TLS) and prints what the API answered.
//!
//! `waymark_agent::cli::commands::ROUTES` maps each route to its command; it is checked
//! here against the OpenAPI document, both ways, and the OpenAPI document against the
//! routes `router()` serves, method by method. The commands run as `waymark` processes, the way an
//! operator runs them.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use waymark_agent::cli::commands::ROUTES;
use waymark_testkit::until;

use crate::common::dev::{self, WAIT};

/// The (method, path) pairs the OpenAPI document describes.
fn documented() -> BTreeSet<(String, String)> {
    let doc: Value = serde_json::from_str(include_str!("../src/authority/openapi.json")).unwrap();
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if matches!(method.as_str(), "get" | "put" | "post" | "delete" | "patch") {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

/// The (method, path) pairs the router serves, read from its source: every `.route(` in
/// `router()` with the methods chained on its handler (`get(..).post(..)`).
fn served() -> BTreeSet<(String, String)> {
    let source = include_str!("../src/authority/api/mod.rs");
    let body = source
        .split("pub fn router(")
        .nth(1)
        .expect("router() in api/mod.rs");
    let mut out = BTreeSet::new();
    for route in body.split(".route(").skip(1) {
        // The route's own arguments: up to the parenthesis that closes `.route(`.
        let mut depth = 1;
        let end = route
            .char_indices()
            .find(|(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map_or(route.len(), |(i, _)| i);
        let args = &route[..end];
        let path = args.split('"').nth(1).expect("a path literal").to_owned();
        for method in ["get", "put", "post", "delete", "patch"] {
            let called = args.match_indices(&format!("{method}(")).any(|(i, _)| {
                i == 0 || !args[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
            });
            if called {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

#[test]
fn the_openapi_document_describes_every_route() {
    let served = served();
    assert!(served.len() > 30, "the parse found {served:?}");
    assert!(served.contains(&("PUT".to_owned(), "/v1/services/{service}".to_owned())));
    assert!(served.contains(&("DELETE".to_owned(), "/v1/services/{service}".to_owned())));
    let documented = documented();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "served but not documented: {undocumented:?}"
    );
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        unserved.is_empty(),
        "documented but not served: {unserved:?}"
    );
}

#[test]
fn every_documented_route_has_a_command_and_every_command_a_route() {
    let mapped: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p, _)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    let documented = documented();
    let unmapped: Vec<_> = documented.difference(&mapped).collect();
    assert!(
        unmapped.is_empty(),
        "routes without a command (add one, or say in ROUTES why none): {unmapped:?}"
    );
    let stale: Vec<_> = mapped.difference(&documented).collect();
    assert!(
        stale.is_empty(),
        "ROUTES names routes the API does not document: {stale:?}"
    );
    // Each command named is a real subcommand path of the binary.
    let bin = env!("CARGO_BIN_EXE_waymark");
    for (_, _, command) in ROUTES {
        if command.starts_with("(none") {
            continue;
        }
        for alternative in command.split(", ") {
            let words: Vec<&str> = alternative
                .split_whitespace()
                .take_while(|w| !w.starts_with("--"))
                .collect();
            let mut path: Vec<&str> = words[..words.len() - 1].to_vec();
            // `zones evacuate|shift-back`: every alternative of the last word.
            for last in words[words.len() - 1].split('|') {
                path.push(last);
                let out = Command::new(bin)
                    .args(&path)
                    .arg("--help")
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "`waymark {} --help`: {}",
                    path.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                );
                path.pop();
            }
        }
    }
}

/// Runs `waymark <args>` against the dev region as its operator; panics with stderr when
/// the command fails.
fn waymark(dev: &waymark_agent::dev::DevRegion, args: &[&str]) -> String {
    let out = dev::operator_command(dev, args);
    assert!(
        out.status.success(),
        "waymark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Like [`waymark`], expecting a refusal; returns stderr.
fn waymark_refused(dev: &waymark_agent::dev::DevRegion, args: &[&str]) -> String {
    let out = dev::operator_command(dev, args);
    assert!(!out.status.success(), "waymark {args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_resource_command_reads_and_writes_a_real_authority() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let dev = dev::start(&dir.path().join("dev")).await;
    let files = dir.path();
    let api = dev.api_client();
    until("web has eligible instances", WAIT, async || {
        let list = api.get_json("/v1/services").await.ok()?;
        list.as_array()?
            .iter()
            .any(|s| s["service"] == "web" && s["verdicts"]["eligible"].as_u64() > Some(0))
            .then_some(())
    })
    .await;
    let run = |args: &[&str]| waymark(&dev, args);

    // Status and services, as a table, as JSON and as YAML: the same answer.
    let status = run(&["status"]);
    assert!(
        status.contains("leader") && status.contains("dev"),
        "{status}"
    );
    let table = run(&["services"]);
    assert!(
        table.starts_with("SERVICE") && table.contains("web"),
        "{table}"
    );
    let as_json: Value = serde_json::from_str(&run(&["services", "-o", "json"])).unwrap();
    let as_yaml: Value = serde_norway::from_str(&run(&["services", "-o", "yaml"])).unwrap();
    let names = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s["service"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&as_json), names(&as_yaml));
    assert_eq!(
        serde_json::from_str::<Value>(&run(&["services", "list", "--json"])).unwrap(),
        as_json.clone(),
        "--json is -o json"
    );

    // A service applied from a YAML file, read back, validated here and remotely, removed.
    let service = write(
        files,
        "svc.yaml",
        "service: cli-demo\nowner: team-cli\ncontract:\n  min_healthy: 500\n  slow_start: 1m30s\n",
    );
    let bad = write(
        files,
        "bad.json",
        r#"{"service": "cli-demo", "owner": "t", "contract": {"min_healthy": 10}}"#,
    );
    assert!(run(&["services", "validate", "-f", &service]).contains("valid"));
    assert!(run(&["services", "validate", "--remote", "-f", &service]).contains("valid"));
    let offline = waymark_refused(&dev, &["services", "validate", "-f", &bad]);
    let remote = waymark_refused(&dev, &["services", "validate", "--remote", "-f", &bad]);
    assert!(offline.contains("min_healthy"), "{offline}");
    assert!(remote.contains("min_healthy"), "{remote}");
    assert!(run(&["services", "apply", "-f", &service]).contains("applied"));
    let got: Value = serde_norway::from_str(&run(&["services", "get", "cli-demo"])).unwrap();
    assert_eq!(got["owner"], "team-cli", "{got}");
    let got: Value =
        serde_json::from_str(&run(&["services", "get", "cli-demo", "-o", "json"])).unwrap();
    assert_eq!(got["service"], "cli-demo", "{got}");

    // Its policy, set from a file and read back.
    let policy = write(files, "policy.json", r#"{"max_manual_withdrawals": 2}"#);
    assert!(run(&["policy", "set", "cli-demo", "-f", &policy]).contains("applied"));
    let read: Value =
        serde_json::from_str(&run(&["policy", "get", "cli-demo", "-o", "json"])).unwrap();
    assert_eq!(read["max_manual_withdrawals"], 2, "{read}");

    // An instance registered from a file, listed (narrow, wide, filtered), shown, renewed,
    // deregistered.
    let registration = json!({
        "service": "cli-demo",
        "address": {"ip": "127.0.0.1", "port": 9},
        "locality": {"region": "dev", "zone": "az1", "node": "cli-node"},
        "lease_ms": 30_000,
    });
    let reg = write(files, "reg.json", &registration.to_string());
    let registered: Value =
        serde_json::from_str(&run(&["instances", "register", "-f", &reg, "-o", "json"])).unwrap();
    let id = registered["instance"].as_str().unwrap().to_owned();
    let listed = run(&["instances", "--service", "cli-demo"]);
    assert!(
        listed.contains(&id) && listed.contains("cli-node"),
        "{listed}"
    );
    assert!(!listed.contains("web"), "filtered to cli-demo: {listed}");
    let wide = run(&["instances", "-o", "wide"]);
    assert!(wide.lines().next().unwrap().contains("LEASE_MS"), "{wide}");
    assert!(wide.contains(&id) && wide.contains("web"), "{wide}");
    assert!(run(&["instances", "show", &id]).contains(&id));
    assert!(run(&["explain", &id]).contains(&id));
    assert!(run(&["instances", "renew", &id]).contains("renewed"));
    assert!(run(&["instances", "deregister", &id]).contains("deregistered"));
    let after = run(&["instances", "--service", "cli-demo", "-o", "json"]);
    assert!(!after.contains(&id), "{after}");

    // The view, as a table per endpoint.
    let view = run(&["services", "view", "web", "-o", "wide"]);
    assert!(
        view.starts_with("ZONE") && view.contains("EVIDENCE"),
        "{view}"
    );
    assert!(view.contains("eligible"), "{view}");

    // Zones: evacuate, see it, shift back.
    assert!(run(&["zones", "evacuate", "az2"]).contains("committed"));
    let zones = run(&["zones"]);
    assert!(zones.contains("az2"), "{zones}");
    assert!(run(&["zones", "shift-back", "az2"]).contains("committed"));

    // An external endpoint (of a passive-only service) declared and removed.
    let partner = write(
        files,
        "partner.json",
        r#"{"service": "cli-partner", "owner": "team-cli",
            "contract": {"profile": {"probe": false, "self_report": false, "passive": true},
                         "probe": null}}"#,
    );
    assert!(run(&["services", "apply", "-f", &partner]).contains("applied"));
    let external = write(
        files,
        "ext.json",
        &json!({
            "id": "cli-ext-1",
            "service": "cli-partner",
            "address": {"ip": "127.0.0.1", "port": 10},
            "locality": {"region": "dev", "zone": "az1", "node": "third-party"},
            "origin": "external",
            "weight": 100,
            "tags": [],
            "metadata": {},
        })
        .to_string(),
    );
    let declared: Value = serde_json::from_str(&run(&[
        "external", "declare", "-f", &external, "-o", "json",
    ]))
    .unwrap();
    assert_eq!(declared["instance"], "cli-ext-1", "{declared}");
    assert!(run(&["external", "remove", "cli-ext-1"]).contains("removed"));

    // The audit log saw all of it; alarms, proxy status, the OpenAPI document, the Raft
    // group, ACLs, federation and reconciliation answer.
    let audit = run(&["audit", "--kind", "policy"]);
    assert!(
        audit.starts_with("SEQ") && audit.contains("cli-demo"),
        "{audit}"
    );
    for line in run(&["audit", "--kind", "existence", "-o", "json"]).lines() {
        serde_json::from_str::<Value>(line).unwrap();
    }
    let _ = run(&["alarms"]);
    assert!(run(&["proxy-status"]).starts_with("NODE"));
    let openapi: Value = serde_json::from_str(&run(&["openapi"])).unwrap();
    assert!(openapi["paths"]["/v1/services"].is_object());
    assert!(run(&["operator", "raft", "list-peers"]).contains("leader"));
    assert!(run(&["acl", "whoami"]).contains("principal"));
    let _ = run(&["acl", "grants"]);
    let _ = run(&["acl", "tokens"]);
    let _ = run(&["federation", "status"]);
    let _ = run(&["federation", "failovers"]);
    let _ = run(&["reconciliation"]);

    assert!(run(&["services", "delete", "cli-demo"]).contains("removed"));
    let refused = waymark_refused(&dev, &["services", "get", "cli-demo"]);
    assert!(refused.contains("not registered"), "{refused}");
    dev.stop().await;
}

#[test]
fn completions_and_man_pages_come_from_the_command_definitions() {
    let bin = env!("CARGO_BIN_EXE_waymark");
    let bash = Command::new(bin)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(bash.status.success());
    let bash = String::from_utf8(bash.stdout).unwrap();
    for word in ["instances", "services", "zones", "evacuate", "--output"] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }
    let dir = tempfile::tempdir().unwrap();
    let man = Command::new(bin)
        .args(["man", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        man.status.success(),
        "{}",
        String::from_utf8_lossy(&man.stderr)
    );
    for page in [
        "waymark.1",
        "waymark-services.1",
        "waymark-zones-evacuate.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page} is not a man page");
    }
    // Enums are listed with their values in --help.
    let help = Command::new(bin)
        .args(["override", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(
        help.contains("maintenance-on") && help.contains("maintenance-off"),
        "{help}"
    );
}
