//! Every route of the authority API has an operator command, and every command runs against
//! a real authority (a dev region over TLS) and prints what the API answered.
//!
//! The router and the OpenAPI document are both built from one operation table
//! (`waymark_agent::authority::api::ROUTES`), so they cannot disagree; what is checked here
//! is that every operation of the table is mounted (asked of a running member, with its
//! method, it is neither 404 nor 405), that every operation documents its answers, and that
//! `waymark_agent::cli::commands::ROUTES`, which maps each route to its command, names
//! exactly the table's operations. The commands run as `waymark` processes, the way an
//! operator runs them.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use waymark_agent::authority::api::{NON_API, Operation, ROUTES as OPERATIONS};
use waymark_agent::cli::commands::ROUTES;
use waymark_testkit::until;

use crate::common::dev::{self, WAIT};

/// Every operation: the table's, and the probes outside it.
fn operations() -> Vec<&'static Operation> {
    OPERATIONS.iter().map(|r| &r.op).chain(NON_API).collect()
}

/// The (method, path) pairs of the operation table.
fn operated() -> BTreeSet<(String, String)> {
    operations()
        .into_iter()
        .map(|op| (op.method.as_str().to_owned(), op.path.to_owned()))
        .collect()
}

/// `template` with a value for each parameter.
fn concrete(template: &str) -> String {
    template
        .replace("{service}", "pay")
        .replace("{id}", "7")
        .replace("{seq}", "7")
        .replace("{zone}", "a")
        .replace("{region}", "us")
        .replace("{name}", "ci")
        .replace("{node}", "n1")
        .replace("{client}", "c1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_in_the_table_is_mounted() {
    let dir = tempfile::tempdir().unwrap();
    let any = "127.0.0.1:0".parse().unwrap();
    let member =
        crate::common::single_member(crate::common::plain(dir.path(), "eu", &["a"], any)).await;
    // No credentials: a mounted route answers 401 (the probes 200/503) before its handler
    // runs; a path the router does not know is 404, a method it does not route 405.
    let anonymous = member.api_client(None);
    let mut asked = 0;
    for op in operations() {
        let method: Method = op.method.as_str().parse().unwrap();
        let path = concrete(op.path);
        let r = anonymous
            .send(method.clone(), &path, Some(&json!({})))
            .await
            .unwrap();
        assert!(
            r.status != StatusCode::NOT_FOUND && r.status != StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path} ({}) is not mounted: {r:?}",
            op.id
        );
        asked += 1;
    }
    assert!(asked > 40, "only {asked} operations");
    member.shutdown().await;
}

#[test]
fn every_operation_documents_its_answers() {
    let doc = waymark_agent::authority::api::document();
    for op in operations() {
        let item = &doc["paths"][op.path][op.method.as_str().to_lowercase()];
        let responses = item["responses"].as_object().unwrap();
        let documented = responses.iter().any(|(status, r)| {
            status.starts_with('2') && (status == "204" || r["content"].is_object())
        });
        assert!(
            documented,
            "{} {}: no success body: {item:#}",
            op.method.as_str(),
            op.path
        );
        if op.path.starts_with("/v1/") {
            assert!(
                responses["default"]["content"]["application/json"]["schema"]["$ref"]
                    == "#/components/schemas/Error",
                "{}: refusals undocumented",
                op.id
            );
        }
    }
}

#[test]
fn every_operation_has_a_command_and_every_command_an_operation() {
    let mapped: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p, _)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    let operated = operated();
    let unmapped: Vec<_> = operated.difference(&mapped).collect();
    assert!(
        unmapped.is_empty(),
        "operations without a command (add one, or say in ROUTES why none): {unmapped:?}"
    );
    let stale: Vec<_> = mapped.difference(&operated).collect();
    assert!(
        stale.is_empty(),
        "ROUTES names routes the operation table does not have: {stale:?}"
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
