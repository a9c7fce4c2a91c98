//! `waymark dev` as a newcomer meets its security model: the guide's `export` lines make
//! the CLI and curl work from another terminal, over TLS with the operator's token, and
//! the same commands without them are refused. What is refused changes nothing.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::process::{Command, Output};

use http::Method;

const WAYMARK: &str = env!("CARGO_BIN_EXE_waymark");

/// The `export K=V` lines of the guide.
fn exports(guide: &str) -> BTreeMap<String, String> {
    guide
        .lines()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `waymark args…` in a shell that has exactly `env` of waymark's variables.
fn waymark(env: &BTreeMap<String, String>, args: &[&str]) -> Output {
    let mut cmd = Command::new(WAYMARK);
    cmd.args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("WAYMARK_")) {
        cmd.env_remove(k);
    }
    cmd.envs(env).output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl is installed")
}

/// The override records of `instance` in the audit log.
async fn overrides(
    api: &waymark_agent::api_client::ApiClient,
    instance: &str,
) -> Vec<serde_json::Value> {
    let r = api
        .send(
            Method::GET,
            &format!("/v1/audit?kind=override&instance={instance}"),
            None,
        )
        .await
        .unwrap();
    assert!(r.status.is_success(), "{r:?}");
    String::from_utf8_lossy(&r.body)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_exports_make_the_cli_and_curl_work_and_nothing_works_without_them() {
    let dir = tempfile::tempdir().unwrap();
    let dev = common::dev::start(dir.path()).await;
    let guide = dev.guide();
    let env = exports(&guide);
    let api = &env["WAYMARK_API"];
    assert!(api.starts_with("https://"), "the API is TLS: {guide}");
    assert_eq!(
        env["WAYMARK_CA_BUNDLE"],
        dev.ca_bundle().display().to_string()
    );
    assert_eq!(
        env["WAYMARK_TOKEN_FILE"],
        dev.token_file().display().to_string()
    );

    // With the exports: services are listed, whoami names the dev operator.
    let services = waymark(&env, &["services"]);
    assert!(services.status.success(), "{}", text(&services));
    assert!(text(&services).contains("checkout"), "{}", text(&services));
    let whoami = waymark(&env, &["acl", "whoami"]);
    assert!(whoami.status.success(), "{}", text(&whoami));
    assert!(text(&whoami).contains("dev"), "{}", text(&whoami));

    // curl, as the guide shows it: checks the certificate by name, sends the token.
    let bundle = &env["WAYMARK_CA_BUNDLE"];
    let token = std::fs::read_to_string(&env["WAYMARK_TOKEN_FILE"]).unwrap();
    let bearer = format!("Authorization: Bearer {}", token.trim());
    let url = format!("{api}/v1/services");
    let ok = curl(&["--fail", "--cacert", bundle, "-H", &bearer, &url]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).contains("\"service\":\"web\""), "{}", text(&ok));
    // localhost is in the certificate too, so the name curl checks can be either.
    let port = api.rsplit(':').next().unwrap();
    let by_name = format!("https://localhost:{port}/v1/services");
    let ok = curl(&["--fail", "--cacert", bundle, "-H", &bearer, &by_name]);
    assert!(ok.status.success(), "{}", text(&ok));

    // Without the token: refused with 401, by curl and by the CLI.
    let anonymous = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--cacert",
        bundle,
        &url,
    ]);
    assert_eq!(text(&anonymous), "401", "{}", text(&anonymous));
    let mut no_token = env.clone();
    no_token.remove("WAYMARK_TOKEN_FILE");
    let refused = waymark(&no_token, &["services"]);
    assert!(!refused.status.success());
    assert!(text(&refused).contains("401"), "{}", text(&refused));
    // Without the bundle, curl cannot trust the server, and the CLI will not speak
    // plaintext to a TLS port (nor send its token there).
    let untrusted = curl(&["-H", &bearer, &url]);
    assert!(!untrusted.status.success(), "{}", text(&untrusted));
    let mut no_bundle = env.clone();
    no_bundle.remove("WAYMARK_CA_BUNDLE");
    let refused = waymark(&no_bundle, &["services"]);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("WAYMARK_CA_BUNDLE"),
        "{}",
        text(&refused)
    );
    let plain = format!("http://{}", api.trim_start_matches("https://"));
    let mut plaintext = env.clone();
    plaintext.insert("WAYMARK_API".into(), plain);
    plaintext.remove("WAYMARK_CA_BUNDLE");
    let refused = waymark(&plaintext, &["services"]);
    assert!(!refused.status.success(), "{}", text(&refused));

    // An override: refused without the token (nothing changes), done with it.
    let (name, id) = dev
        .instances()
        .into_iter()
        .find(|(n, _)| n.starts_with("web"))
        .unwrap();
    let id = id.to_string();
    let args = ["override", id.as_str(), "--justification", "trying it"];
    let operator = dev.api_client();
    let refused = waymark(&no_token, &args);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        overrides(&operator, &id).await.is_empty(),
        "{name}: the refused override changed nothing"
    );
    let done = waymark(&env, &args);
    assert!(done.status.success(), "{}", text(&done));
    // Granted, and the audit log records the verified principal (the token's name).
    let records = overrides(&operator, &id).await;
    let granted: Vec<_> = records
        .iter()
        .filter(|r| r["outcome"] == "granted")
        .collect();
    assert_eq!(granted.len(), 1, "{records:?}");
    assert_eq!(granted[0]["actor"], "token/dev", "{records:?}");
    dev.stop().await;
}
