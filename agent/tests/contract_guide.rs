//! The health-contract guide (`docs/contracts.md`) keeps its promises, and the published
//! schemas are the ones the types generate.
//!
//! - Every example in `docs/contracts/` is valid by the JSON Schema and by the authority's
//!   own checks, except the one the guide shows being refused, which is refused naming the
//!   field.
//! - `docs/schema/{contract,policy}.schema.json` and the OpenAPI document's components are
//!   what `waymark schema` generates now (`scripts/update-schemas` rewrites them).
//! - Applied to a dev region, the HTTP, TCP and self-report examples give the verdicts the
//!   guide promises when a demo backend fails in the way each example describes.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use http::Method;
use serde_json::{Value, json};
use waymark_agent::api_client::ApiClient;
use waymark_core::contract::HealthContract;
use waymark_testkit::until;

use crate::common::dev::{self, WAIT, set_mode};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `(file name, document)` for every example of the guide.
fn examples() -> Vec<(String, Value)> {
    let dir = root().join("docs/contracts");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let doc: Value =
                serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), doc)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 6, "the guide's examples: {out:?}");
    out
}

#[test]
fn every_example_passes_the_authority_s_checks_but_the_one_shown_refused() {
    let guide = std::fs::read_to_string(root().join("docs/contracts.md")).unwrap();
    for (name, doc) in examples() {
        assert!(
            guide.contains(&name),
            "docs/contracts.md does not show {name}"
        );
        let contract: HealthContract = serde_json::from_value(doc["contract"].clone())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let verdict = contract.validate();
        if name.starts_with("refused-") {
            let e = verdict.expect_err(&name);
            assert!(e.field().starts_with("dependencies"), "{name}: {e}");
        } else if let Err(e) = verdict {
            panic!("{name}: {}: {e}", e.field());
        }
    }
}

#[test]
fn every_example_is_valid_by_the_published_schema() {
    // The Python `jsonschema` package (installed with kubernetes-validate by
    // scripts/install-test-peers) validates against draft 2020-12 as editors do.
    let python = std::env::var_os("WAYMARK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"));
    let contracts: Vec<Value> = examples()
        .into_iter()
        .map(|(name, doc)| json!({"name": name, "contract": doc["contract"]}))
        .collect();
    let script = r#"
import json, sys, jsonschema
schema = json.load(open(sys.argv[1], encoding="utf-8"))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
failed = []
for e in json.load(sys.stdin):
    for error in validator.iter_errors(e["contract"]):
        failed.append("%s: %s at %s" % (e["name"], error.message, list(error.path)))
    if validator.is_valid({"probe": {"kind": "smoke"}}):
        failed.append("the schema accepts an unknown probe kind")
print("\n".join(failed))
sys.exit(1 if failed else 0)
"#;
    let mut child = Command::new(&python)
        .args(["-c", script])
        .arg(root().join("docs/schema/contract.schema.json"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{} does not run ({e}): run scripts/install-test-peers, or set WAYMARK_PYTHON \
                 to a python with jsonschema",
                python.display()
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&contracts).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_published_schemas_are_what_the_types_generate() {
    let fix = "run scripts/update-schemas after changing a contract or policy type";
    for (file, schema) in [
        (
            "docs/schema/contract.schema.json",
            serde_json::to_value(waymark_core::schema::contract()).unwrap(),
        ),
        (
            "docs/schema/policy.schema.json",
            serde_json::to_value(waymark_registry::state::policy_schema()).unwrap(),
        ),
    ] {
        let published: Value =
            serde_json::from_str(&std::fs::read_to_string(root().join(file)).unwrap()).unwrap();
        assert!(published == schema, "{file} differs from the types: {fix}");
    }
    // The document is generated from the operation table; the checked-in copy is it.
    let openapi: Value = serde_json::from_str(waymark_agent::authority::api::OPENAPI).unwrap();
    assert!(
        openapi == waymark_agent::authority::api::document(),
        "agent/src/authority/openapi.json differs from the document the routes generate: \
         run scripts/update-schemas after changing a route or a body type"
    );
    // The bodies that carry a contract and a policy refer to their schemas, which the
    // document generates from the same types (its components are the only copy).
    let text = waymark_agent::authority::api::OPENAPI;
    for name in ["HealthContract", "ServicePolicyRecord"] {
        assert!(
            text.contains(&format!("\"#/components/schemas/{name}\"")),
            "no body of openapi.json refers to {name}"
        );
    }
}

#[test]
fn the_generated_openapi_document_passes_an_openapi_validator() {
    let python = std::env::var_os("WAYMARK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"));
    let script = "import json, sys\n\
        from openapi_spec_validator import validate\n\
        validate(json.load(sys.stdin))\n\
        print('valid')\n";
    let mut child = Command::new(&python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{} does not run ({e}): run scripts/install-test-peers, or set WAYMARK_PYTHON \
                 to a python with openapi-spec-validator",
                python.display()
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(waymark_agent::authority::api::document_text().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenAPI document does not validate (scripts/install-test-peers installs the \
         validator):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn put_service(api: &ApiClient, example: &str) {
    let (_, doc) = examples()
        .into_iter()
        .find(|(name, _)| name == example)
        .unwrap();
    let service = doc["service"].as_str().unwrap().to_owned();
    let body = json!({"owner": doc["owner"], "contract": doc["contract"]});
    let r = api
        .send(Method::PUT, &format!("/v1/services/{service}"), Some(&body))
        .await
        .unwrap();
    assert!(r.status.is_success(), "{example}: {r:?}");
}

/// Waits until `backend`'s instance has `verdict`; returns its explanation.
async fn verdict_of(api: &ApiClient, id: &str, backend: &str, verdict: &str) -> Value {
    until(&format!("{backend} {verdict}"), WAIT, async || {
        let e = api
            .get_json(&format!("/v1/instances/{id}/explain"))
            .await
            .map_err(|e| e.to_string())?;
        if e["verdict"] == verdict {
            Ok(e)
        } else {
            Err(format!("{}: {}", e["verdict"], e["text"]))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guide_s_examples_give_the_verdicts_it_promises_on_a_dev_region() {
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let dev = dev::start(dir.path()).await;
    let api = dev.api_client();
    let control = ApiClient::new(&dev.backends_api().to_string(), None);
    let ids = dev.instances();
    let id = |backend: &str| ids[backend].to_string();

    // HTTP: a replica whose /readyz answers 503, with no caller to agree, keeps a reduced
    // weight (one class alone never withdraws); a refused connection withdraws at once.
    put_service(&api, "http.yaml").await;
    verdict_of(&api, &id("web-az1-2"), "web-az1-2", "eligible").await;
    set_mode(&control, "web-az1-1", "not-ready").await;
    let e = verdict_of(&api, &id("web-az1-1"), "web-az1-1", "degraded").await;
    assert!(
        e["text"].as_str().unwrap().contains("uncorroborated"),
        "{e}"
    );
    set_mode(&control, "web-az2-1", "fail-hard").await;
    verdict_of(&api, &id("web-az2-1"), "web-az2-1", "ineligible").await;
    verdict_of(&api, &id("web-az1-2"), "web-az1-2", "eligible").await;

    // TCP: a replica that refuses connections is withdrawn as a hard failure.
    put_service(&api, "tcp.yaml").await;
    set_mode(&control, "inventory-az1-1", "fail-hard").await;
    let e = verdict_of(
        &api,
        &id("inventory-az1-1"),
        "inventory-az1-1",
        "ineligible",
    )
    .await;
    assert!(e.to_string().contains("hard"), "a hard failure: {e}");
    verdict_of(&api, &id("inventory-az2-1"), "inventory-az2-1", "eligible").await;

    // Self-report: a shared dependency degraded lowers weight and keeps the replica routed;
    // a replica that says it is not ready (and fails its probe) is withdrawn.
    put_service(&api, "self-report.yaml").await;
    set_mode(&control, "checkout-az2-1", "degraded-dependency").await;
    verdict_of(&api, &id("checkout-az2-1"), "checkout-az2-1", "degraded").await;
    set_mode(&control, "checkout-az3-1", "not-ready").await;
    verdict_of(&api, &id("checkout-az3-1"), "checkout-az3-1", "ineligible").await;
    dev.stop().await;
}
