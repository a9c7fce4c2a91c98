//! A workload's self-report, through its node agent, over mutual TLS both hops: the
//! workload's certificate is the reporter; the agent refuses anything not about that
//! workload and relays the rest; the authority admits a relayed report only for an
//! instance on the relaying node, and `explain` attributes it to the instance. A workload
//! in Python, with stubs `grpc_tools.protoc` generates from `evidence.proto`, does the same
//! with stock grpcio (needs `WAYMARK_PYTHON`, see `scripts/install-test-peers`).
#![allow(clippy::unwrap_used)]
#![allow(clippy::disallowed_methods)] // waits on real processes by the wall clock; no paused time here

use crate::common;

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use http::Method;
use serde_json::json;
use tonic::transport::Endpoint;
use waymark_agent::authority::member::Authority;
use waymark_agent::authority::settings::TlsSettings;
use waymark_agent::evidence::{AgentMessage, AuthorityMessage, ClientSession, WireSample};
use waymark_agent::node::NodeAgent;
use waymark_agent::node::config::Tls;
use waymark_certs::ca::HostSan;
use waymark_certs::grpc::TlsConnector;
use waymark_certs::testing::TestPkiDir;
use waymark_certs::{IdentityKind, KindSet, TrustDomain};
use waymark_core::model::{Observation, SelfReport};
use waymark_testkit::until;

const TD: &str = "waymark.test";
const WAIT: Duration = Duration::from_secs(30);

/// A workload's evidence session to its node agent.
async fn workload_session(pki: &TestPkiDir, who: &str, agent: SocketAddr) -> ClientSession {
    let config = pki.client(who, pki.policy(KindSet::only(IdentityKind::Node)));
    let channel = Endpoint::from_shared(format!("http://{agent}"))
        .unwrap()
        .connect_with_connector(TlsConnector::new(config))
        .await
        .unwrap();
    ClientSession::open(channel).await.unwrap()
}

async fn ack(s: &mut ClientSession) -> (u64, Vec<String>) {
    loop {
        let msg = tokio::time::timeout(WAIT, s.inbound.next())
            .await
            .expect("an answer in time")
            .expect("stream open")
            .unwrap();
        if let AuthorityMessage::Ack { accepted, refused } = msg {
            return (accepted, refused.into_iter().map(|r| r.reason).collect());
        }
    }
}

/// A leading single-member authority in `eu` with service `pay` (every evidence class),
/// one instance on node n1 and one on n2, and n1's node agent over mutual TLS both hops.
struct Estate {
    _dir: tempfile::TempDir,
    pki: TestPkiDir,
    authority: Authority,
    api: waymark_agent::api_client::ApiClient,
    agent: NodeAgent,
    /// The instance on n1.
    on_n1: String,
    /// The instance on n2.
    on_n2: String,
}

impl Estate {
    async fn start() -> Self {
        waymark_certs::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let pki = TestPkiDir::init(&dir.path().join("pki"), TD, &["eu"]);

        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut config = common::plain(&dir.path().join("authority"), "eu", &["a"], any);
        config.ingest = Some(any);
        config.tls = Some(TlsSettings {
            trust_domain: TrustDomain::new(TD).unwrap(),
            paths: pki.issue("region/eu/authority/1"),
        });
        let authority = common::single_member(config).await;
        let api = common::operator(&authority, "test").await;
        let contract = json!({"owner": "payments", "contract": {
            "profile": {"probe": true, "self_report": true, "passive": true}
        }});
        let r = api
            .send(Method::PUT, "/v1/services/pay", Some(&contract))
            .await
            .unwrap();
        assert!(r.status.is_success(), "{r:?}");
        let mut ids = Vec::new();
        for (node, port) in [("n1", 8080), ("n2", 8081)] {
            let reg = json!({
                "service": "pay",
                "locality": {"region": "eu", "zone": "a", "node": node},
                "address": {"ip": "10.0.0.1", "port": port},
            });
            let v = api
                .send(Method::POST, "/v1/instances", Some(&reg))
                .await
                .unwrap()
                .json()
                .unwrap();
            ids.push(v["instance"].as_str().unwrap().to_owned());
        }
        let (on_n1, on_n2) = (ids[0].clone(), ids[1].clone());

        // Loopback names beside the identity, so that a stock gRPC client (which checks the
        // dialled name) accepts the agent; waymark's own peers admit by the identity alone.
        let node = pki.issue_with_hosts("region/eu/node/n1", &HostSan::loopback());
        let upstream = [authority.xds_addr()];
        let mut config =
            common::agent_on_loopback("n1", "eu", "a", &dir.path().join("agent"), &upstream);
        config.ingest = vec![authority.ingest_addr().unwrap().to_string()];
        config.tls = Some(Tls::new(TD, &node));
        let agent = NodeAgent::start(config).await.unwrap();
        Self {
            _dir: dir,
            pki,
            authority,
            api,
            agent,
            on_n1,
            on_n2,
        }
    }

    async fn shutdown(self) {
        self.agent.shutdown().await;
        self.authority.shutdown().await;
    }
}

/// Waits until the authority attributes a self-report about `instance` to the instance
/// itself, and returns that class's explanation.
async fn attributed_to_itself(
    api: &waymark_agent::api_client::ApiClient,
    instance: &str,
) -> serde_json::Value {
    until("the report attributed to the instance", WAIT, async || {
        let e = api
            .get_json(&format!("/v1/instances/{instance}/explain"))
            .await
            .unwrap();
        let sr = e["classes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["class"] == "self_report")
            .cloned()
            .unwrap();
        if sr["reporter"] == format!("instance/{instance}") {
            Ok(sr)
        } else {
            Err(e)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_reports_about_itself_through_its_agent() {
    let estate = Estate::start().await;
    let Estate {
        pki,
        api,
        agent,
        on_n1,
        on_n2,
        ..
    } = &estate;
    let (on_n1, on_n2) = (on_n1.clone(), on_n2.clone());

    // The workload on n1 reports; a report about another instance is refused at the agent.
    let mut s = workload_session(
        pki,
        &format!("region/eu/service/pay/instance/{on_n1}"),
        agent.bound().xds,
    )
    .await;
    let not_ready = Observation::SelfReport(SelfReport::NotReady {
        detail: "warming caches".into(),
    });
    let about = |id: &str| WireSample {
        instance: id.parse().unwrap(),
        observation: not_ready.clone(),
    };
    s.send(AgentMessage::Samples {
        samples: vec![about(&on_n1), about(&on_n2)],
    })
    .await
    .unwrap();
    let (accepted, refused) = ack(&mut s).await;
    assert_eq!(accepted, 1);
    assert_eq!(refused, vec!["not_about_itself".to_owned()]);

    // The authority attributes the relayed report to the instance itself.
    let sr = attributed_to_itself(api, &on_n1).await;
    assert!(sr["last"].to_string().contains("warming caches"), "{sr}");

    // A workload on another node, relayed through n1, is refused by the authority: the
    // agent relays it (the identity is the instance's), the authority checks the node.
    let mut far = workload_session(
        pki,
        &format!("region/eu/service/pay/instance/{on_n2}"),
        agent.bound().xds,
    )
    .await;
    far.send(AgentMessage::Samples {
        samples: vec![about(&on_n2)],
    })
    .await
    .unwrap();
    assert_eq!(
        ack(&mut far).await.0,
        1,
        "the agent relays what is about the sender"
    );
    until("the denial audited", WAIT, async || {
        let audit = api
            .get_json("/v1/audit?kind=denial")
            .await
            .unwrap()
            .to_string();
        if audit.contains("not_on_relaying_node") {
            Ok(())
        } else {
            Err(audit)
        }
    })
    .await;
    estate.shutdown().await;
}

/// The python with grpcio and grpcio-tools (`WAYMARK_PYTHON`, else the workspace's
/// `.venv/bin/python`); fails, saying how to install them, when it cannot import them.
fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = std::env::var_os("WAYMARK_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    let how = "run ./scripts/install-test-peers at the workspace root and export \
               WAYMARK_PYTHON=$(./scripts/install-test-peers | tail -1)";
    match Command::new(&path)
        .args(["-c", "import grpc, grpc_tools.protoc"])
        .output()
    {
        Ok(o) if o.status.success() => path,
        Ok(o) => panic!(
            "{} cannot import grpcio and grpcio-tools ({}); {how}",
            path.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("{} does not run ({e}); {how}", path.display()),
    }
}

/// Runs `python` with `args`, returning its stdout; fails with its stderr.
fn run_python(python: &Path, args: &[&OsStr], pythonpath: Option<&Path>) -> String {
    let mut cmd = Command::new(python);
    cmd.args(args);
    if let Some(p) = pythonpath {
        cmd.env("PYTHONPATH", p);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}\n{}",
        python.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_workload_self_reports_with_stock_grpc_tooling() {
    // Goal: a workload in another language, with nothing of ours but evidence.proto and its
    // certificate, reports about itself; the agent relays it, refuses a report about
    // another instance and a malformed message.
    let python = python();
    let estate = Estate::start().await;
    let stubs = tempfile::tempdir().unwrap();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto = manifest.join("proto");
    let out = stubs.path().as_os_str();
    run_python(
        &python,
        &[
            OsStr::new("-m"),
            OsStr::new("grpc_tools.protoc"),
            &OsString::from(format!("-I{}", proto.display())),
            &OsString::from(format!("--python_out={}", out.display())),
            &OsString::from(format!("--grpc_python_out={}", out.display())),
            proto.join("waymark/evidence/v1/evidence.proto").as_os_str(),
        ],
        None,
    );

    let me = &estate.on_n1;
    let paths = estate
        .pki
        .issue(&format!("region/eu/service/pay/instance/{me}"));
    let target = format!("localhost:{}", estate.agent.bound().xds.port());
    let script = manifest.join("tests/python/selfreport.py");
    let python_run = python.clone();
    let args: Vec<OsString> = vec![
        script.into(),
        target.into(),
        paths.cert_chain.into(),
        paths.key.into(),
        paths.bundle.into(),
        me.into(),
        estate.on_n2.clone().into(),
    ];
    let pythonpath = stubs.path().to_path_buf();
    let stdout = tokio::task::spawn_blocking(move || {
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        run_python(&python_run, &args, Some(&pythonpath))
    })
    .await
    .unwrap();
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();

    assert_eq!(result["accepted"], 1, "{result}");
    assert_eq!(
        result["refused"],
        json!([[estate.on_n2, "not_about_itself"]]),
        "{result}"
    );
    let sr = attributed_to_itself(&estate.api, me).await;
    assert!(sr["last"].to_string().contains("from python"), "{sr}");

    // The malformed report ended its session naming the field, and was counted.
    assert_eq!(result["malformed"]["code"], "INVALID_ARGUMENT", "{result}");
    let details = result["malformed"]["details"].as_str().unwrap();
    assert!(details.contains("dependency.status"), "{details}");
    let agent_api =
        waymark_agent::api_client::ApiClient::new(&estate.agent.bound().http.to_string(), None);
    let metrics = agent_api.send(Method::GET, "/metrics", None).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains(
            "waymark_agent_self_report_messages_malformed_total{reason=\"unknown_enum\"} 1"
        ),
        "{text}"
    );
    estate.shutdown().await;
}
