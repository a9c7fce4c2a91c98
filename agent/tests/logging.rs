//! `--log-format json` on a real process: `waymark dev` writes nothing but JSON objects on
//! stdout and stderr, from start to SIGTERM, and its API's access log names the verified
//! principal, the status and the request id it echoes.

use std::process::{Child, Command, Stdio};
use std::time::SystemTime;

use http::Method;
use serde_json::Value;
use waymark_agent::api_client::{ApiClient, ApiResponse};
use waymark_agent::cli::tls::{ClientFiles, api_client_config};
use waymark_testkit::until;

use crate::common::dev::WAIT;

/// `waymark dev` as a child process, every listener on a free loopback port, stdout and
/// stderr in files of its state folder. Killed on drop.
struct DevProcess {
    child: Child,
    dir: tempfile::TempDir,
}

impl DevProcess {
    fn start(format_args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str| std::fs::File::create(dir.path().join(name)).unwrap();
        let any = "127.0.0.1:0";
        let child = Command::new(env!("CARGO_BIN_EXE_waymark"))
            .arg("dev")
            .arg("--dir")
            .arg(dir.path().join("state"))
            .args(["--api", any, "--xds", any, "--dns", any])
            .args(["--agent-api", any, "--backends-api", any])
            .args(format_args)
            .env_remove("RUST_LOG")
            .env_remove("WAYMARK_LOG")
            .env_remove("WAYMARK_LOG_FORMAT")
            .stdin(Stdio::null())
            .stdout(file("stdout"))
            .stderr(file("stderr"))
            .spawn()
            .unwrap();
        Self { child, dir }
    }

    /// The complete lines written to `stream` so far (a line still being written waits).
    fn lines(&self, stream: &str) -> Vec<String> {
        let text = std::fs::read_to_string(self.dir.path().join(stream)).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete.lines().map(str::to_owned).collect()
    }

    /// Every complete stdout line that is a JSON object (a stray one is caught at the end).
    fn events(&self) -> Vec<Value> {
        self.lines("stdout")
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn stop(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success());
        self.child.wait().unwrap()
    }
}

impl Drop for DevProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The access-log events so far.
fn access(dev: &DevProcess) -> Vec<Value> {
    dev.events()
        .into_iter()
        .filter(|e| e["target"] == "waymark::access")
        .collect()
}

/// The access event of the request `response` answered, found by its echoed id.
async fn logged(dev: &DevProcess, response: &ApiResponse) -> Value {
    let id = response.headers["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    until(
        &format!("the access line of request {id}"),
        WAIT,
        async || {
            access(dev)
                .into_iter()
                .find(|e| e["fields"]["request_id"] == id.as_str())
        },
    )
    .await
}

#[tokio::test]
async fn json_mode_writes_only_json_lines_and_logs_each_api_request_with_its_principal() {
    // Goal: an operator's collector can parse every line, and an API request with a token,
    // one without, and a probe each leave an access line saying who, what and how it ended.
    let mut dev = DevProcess::start(&[
        "--log-format",
        "json",
        "--log-level",
        "info,waymark::access=debug",
    ]);
    let ready = until("the dev region's ready event", WAIT, async || {
        dev.events()
            .into_iter()
            .find(|e| e["fields"]["message"] == "dev region ready")
    })
    .await;
    let fields = &ready["fields"];
    let api = fields["api"].as_str().unwrap();
    let token_file = fields["token_file"].as_str().unwrap();
    let token = std::fs::read_to_string(token_file)
        .unwrap()
        .trim()
        .to_owned();
    let bundle = fields["ca_bundle"].as_str().unwrap();
    let tls = api_client_config(
        &ClientFiles {
            bundle: bundle.into(),
            identity: None,
        },
        SystemTime::now(),
    )
    .unwrap();
    let operator = ApiClient::new(api, Some(token)).with_tls(tls.clone());
    let nobody = ApiClient::new(api, None).with_tls(tls);

    let read_ok = operator
        .send(Method::GET, "/v1/services", None)
        .await
        .unwrap();
    let refused = nobody
        .send(Method::GET, "/v1/services", None)
        .await
        .unwrap();
    let probe = nobody.send(Method::GET, "/livez", None).await.unwrap();
    let line = |e: &Value| {
        let f = &e["fields"];
        (
            f["method"].as_str().unwrap_or_default().to_owned(),
            f["route"].as_str().unwrap_or_default().to_owned(),
            f["status"].as_u64().unwrap_or_default(),
            f["principal"].as_str().unwrap_or_default().to_owned(),
            f["reason"].as_str().map(str::to_owned),
        )
    };
    let want = |route: &str, status, principal: &str, reason: Option<&str>| {
        let reason = reason.map(str::to_owned);
        (
            "GET".to_owned(),
            route.to_owned(),
            status,
            principal.to_owned(),
            reason,
        )
    };
    assert_eq!(
        line(&logged(&dev, &read_ok).await),
        want("/v1/services", 200, "token/dev", None)
    );
    assert_eq!(
        line(&logged(&dev, &refused).await),
        want("/v1/services", 401, "anonymous", Some("unauthenticated"))
    );
    assert_eq!(
        line(&logged(&dev, &probe).await),
        want("/livez", 200, "anonymous", None)
    );

    let exited = dev.stop();
    assert!(exited.success(), "dev stops cleanly on SIGTERM: {exited:?}");
    for stream in ["stdout", "stderr"] {
        for l in dev.lines(stream) {
            let e: Value = serde_json::from_str(&l)
                .unwrap_or_else(|err| panic!("{stream}: not JSON ({err}): {l}"));
            assert!(e["level"].is_string(), "{stream}: no level: {l}");
            assert!(e["target"].is_string(), "{stream}: no target: {l}");
            assert!(e["fields"].is_object(), "{stream}: no fields: {l}");
        }
    }
    let messages: Vec<_> = dev
        .events()
        .iter()
        .filter_map(|e| e["fields"]["message"].as_str().map(str::to_owned))
        .collect();
    assert!(
        messages.iter().any(|m| m == "stopping the dev region"),
        "{messages:?}"
    );
}
