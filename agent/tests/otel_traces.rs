//! Trace export against a small OTLP/gRPC receiver run in the test (opentelemetry-proto's
//! collector service on tonic): a dev region started with `OTEL_*` settings passed as a
//! value exports the spans of a withdrawal — evaluation, release, Raft commit, the
//! authority's xDS publish, the node agent's apply, its send to sidecars and a real
//! Envoy's acknowledgement — with their parent/child links and versions, and an evidence batch's send and admission. With
//! nothing configured nothing is exported, and a bad `OTEL_*` value stops `waymark dev`
//! naming the variable.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use waymark_agent::api_client::ApiClient;
use waymark_agent::dev::{DevArgs, DevRegion};
use waymark_agent::otel::{OtelSettings, Telemetry};
use waymark_testkit::until;

use crate::common;
use common::dev::WAIT;

/// One span as the receiver got it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    links: Vec<Vec<u8>>,
    start_ns: u64,
    /// The span's status said it failed.
    failed: bool,
    attributes: BTreeMap<String, String>,
}

impl Received {
    fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map_or("", String::as_str)
    }

    fn int(&self, key: &str) -> i64 {
        self.attr(key).parse().unwrap_or(-1)
    }
}

/// A trace collector that keeps what it is sent.
#[derive(Debug, Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
}

fn text(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(kv.value.as_ref()))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    spans.push(Received {
                        service: service.clone(),
                        name: s.name,
                        trace: s.trace_id,
                        id: s.span_id,
                        parent: s.parent_span_id,
                        links: s.links.into_iter().map(|l| l.span_id).collect(),
                        start_ns: s.start_time_unix_nano,
                        // StatusCode::Error
                        failed: s.status.as_ref().is_some_and(|st| st.code == 2),
                        attributes: s
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                            .collect(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    async fn start() -> (Self, SocketAddr) {
        let receiver = Self::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(receiver.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (receiver, addr)
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }
}

fn dev_args(dir: &std::path::Path) -> DevArgs {
    let any = "127.0.0.1:0".parse().unwrap();
    DevArgs {
        dir: dir.to_path_buf(),
        api: any,
        xds: any,
        dns: any,
        agent_api: any,
        backends_api: any,
    }
}

/// The withdrawal's chain, once the receiver holds all of it: a release of `web` begun
/// after `since_ns`, its evaluation, its commit and publish, the agent's apply of a
/// version it carried with the send to sidecars under it, and under the send the
/// sidecars' acknowledgement.
fn withdrawal_chain(spans: &[Received], since_ns: u64) -> Option<[Received; 7]> {
    fn named<'a>(spans: &'a [Received], name: &'a str) -> impl Iterator<Item = &'a Received> {
        spans.iter().filter(move |s| s.name == name)
    }
    named(spans, "waymark.release")
        .filter(|r| r.start_ns >= since_ns && r.attr("waymark.service").contains("web"))
        .find_map(|release| {
            let evaluate = named(spans, "waymark.evaluate").find(|e| e.id == release.parent)?;
            let child = |name: &str| {
                named(spans, name)
                    .find(|c| {
                        c.trace == release.trace
                            && (c.parent == release.id || c.links.contains(&release.id))
                    })
                    .cloned()
            };
            let commit = child("waymark.raft.commit")?;
            let publish = child("waymark.xds.publish")?;
            let (lo, hi) = (
                release.int("waymark.view.version_min"),
                release.int("waymark.view.version"),
            );
            let apply = named(spans, "waymark.xds.apply").find(|a| {
                let v = a.int("waymark.view.version");
                a.service == "waymark-agent" && lo <= v && v <= hi
            })?;
            let send = named(spans, "waymark.xds.send").find(|s| s.parent == apply.id)?;
            let ack = named(spans, "waymark.xds.ack").find(|a| a.parent == send.id)?;
            Some([
                evaluate.clone(),
                release.clone(),
                commit,
                publish,
                apply.clone(),
                send.clone(),
                ack.clone(),
            ])
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawal_and_an_evidence_batch_are_traced_end_to_end() {
    waymark_certs::install_crypto_provider();
    let (receiver, addr) = Receiver::start().await;
    let settings = OtelSettings::from_env([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=test".to_owned(),
        ),
    ])
    .unwrap()
    .expect("an endpoint turns export on");
    let dir = tempfile::tempdir().unwrap();
    let dev = DevRegion::start_traced(dev_args(&dir.path().join("dev")), Some(&settings))
        .await
        .unwrap();
    let api = dev.api_client();
    until("every web backend eligible", WAIT, async || {
        let r = api
            .send(http::Method::GET, "/v1/instances?service=web&passing", None)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        v.as_array().map_or(0, Vec::len) == 6
    })
    .await;

    // A real sidecar behind the dev agent, holding web: its acknowledgement closes the
    // withdrawal's last span.
    let envoy = common::dev::envoy_on_web(&dev, "sidecar-traced", "web-client").await;

    let since_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let control = ApiClient::new(&dev.backends_api().to_string(), None);
    common::dev::set_mode(&control, "web-az1-1", "fail-hard").await;

    let [evaluate, release, commit, publish, apply, send, ack] =
        until("the withdrawal's spans at the receiver", WAIT, async || {
            withdrawal_chain(&receiver.spans(), since_ns)
        })
        .await;
    // Inside the authority: one trace, parent to child.
    assert_eq!(evaluate.service, "waymark-authority");
    assert!(evaluate.parent.is_empty(), "{evaluate:?}");
    assert_eq!(release.parent, evaluate.id);
    assert_eq!(commit.service, "waymark-authority");
    assert!(release.int("waymark.views") >= 1, "{release:?}");
    assert!(release.int("waymark.endpoints") >= 1, "{release:?}");
    assert_eq!(publish.attr("waymark.xds.hop"), "authority_agent");
    assert!(
        publish.attr("waymark.service").contains("web"),
        "{publish:?}"
    );
    // Across the hop: joined by the view version (see agent/src/otel.rs).
    assert_eq!(apply.attr("waymark.xds.hop"), "authority_agent");
    assert!(apply.attr("waymark.service").contains("web"), "{apply:?}");
    assert_eq!(send.service, "waymark-agent");
    assert_eq!(send.trace, apply.trace);
    assert_eq!(send.attr("waymark.xds.hop"), "agent_sidecar");
    assert!(send.int("waymark.xds.served_version") > 0, "{send:?}");
    // The sidecar's acknowledgement: the one client holding web acknowledged the release.
    assert_eq!(ack.attr("waymark.xds.hop"), "agent_sidecar");
    assert_eq!(ack.int("waymark.xds.expected"), 1, "{ack:?}");
    assert_eq!(ack.int("waymark.xds.acked"), 1, "{ack:?}");
    assert!(!ack.failed, "{ack:?}");
    assert_eq!(
        ack.attr("waymark.view.version"),
        apply.attr("waymark.view.version")
    );

    // An evidence batch: sent by the agent, admitted by the authority, and a release's
    // evaluation links to the admissions since the release before it.
    let spans = until("an evidence batch's spans", WAIT, async || {
        let spans = receiver.spans();
        let sent = spans.iter().any(|s| {
            s.name == "waymark.evidence.send"
                && s.service == "waymark-agent"
                && s.int("waymark.samples") > 0
        });
        let admitted: Vec<&Received> = spans
            .iter()
            .filter(|s| s.name == "waymark.evidence.admit" && s.int("waymark.samples.accepted") > 0)
            .collect();
        let linked = spans.iter().any(|e| {
            e.name == "waymark.evaluate" && admitted.iter().any(|a| e.links.contains(&a.id))
        });
        (sent && linked).then_some(spans)
    })
    .await;
    let admit = spans
        .iter()
        .find(|s| s.name == "waymark.evidence.admit")
        .unwrap();
    assert_eq!(admit.service, "waymark-authority");
    assert!(!admit.attr("waymark.reporter").is_empty(), "{admit:?}");
    // Nothing was dropped, and the agent says so on its metrics.
    let metrics = ApiClient::new(&dev.agent().bound().http.to_string(), None)
        .send(http::Method::GET, "/metrics", None)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("waymark_otel_spans_dropped_total 0"),
        "{text}"
    );
    // Spans are per decision or batch: none is per endpoint.
    assert!(
        spans.iter().all(|s| s.name.starts_with("waymark.")),
        "{spans:?}"
    );
    drop(envoy);
    drop(dev);
}

#[tokio::test]
async fn nothing_configured_exports_nothing() {
    // Goal: an environment without OTEL_* (or with only a service name) starts no exporter.
    let env = [
        ("PATH", "/usr/bin"),
        ("RUST_LOG", "info"),
        ("OTEL_SERVICE_NAME", "checkout"),
    ];
    let settings = OtelSettings::from_env(env).unwrap();
    assert_eq!(settings, None);
    let telemetry = Telemetry::start(settings.as_ref(), "waymark-agent").unwrap();
    assert!(!telemetry.is_on());
}

#[test]
fn a_bad_otel_variable_stops_waymark_dev_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["dev", "--dir"])
        .arg(dir.path())
        .args([
            "--api",
            "127.0.0.1:0",
            "--xds",
            "127.0.0.1:0",
            "--dns",
            "127.0.0.1:0",
        ])
        .args([
            "--agent-api",
            "127.0.0.1:0",
            "--backends-api",
            "127.0.0.1:0",
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL: \"http/json\""),
        "{stderr}"
    );
    // Refused before anything started: no state was written.
    assert!(!dir.path().join("authority").exists());
}

#[tokio::test]
async fn spans_sent_over_http_protobuf_arrive_too() {
    // Goal: the other protocol reaches a collector, at `/v1/traces` under the base endpoint.
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let r = receiver.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: bytes::Bytes| {
            let r = r.clone();
            async move {
                use prost::Message as _;
                let request = ExportTraceServiceRequest::decode(body).unwrap();
                r.export(tonic::Request::new(request)).await.unwrap();
                let answer = ExportTraceServiceResponse::default().encode_to_vec();
                (
                    [(http::header::CONTENT_TYPE, "application/x-protobuf")],
                    answer,
                )
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let settings = OtelSettings::from_env([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_owned()),
        ("OTEL_SERVICE_NAME", "agent-eu-1".to_owned()),
        ("OTEL_BSP_SCHEDULE_DELAY", "10".to_owned()),
    ])
    .unwrap();
    let telemetry = Telemetry::start(settings.as_ref(), "waymark-agent").unwrap();
    let parent = telemetry.span("waymark.test.parent", None, &[], vec![]);
    telemetry
        .span(
            "waymark.test.child",
            Some(&parent.context()),
            &[],
            vec![opentelemetry::KeyValue::new("waymark.views", 3)],
        )
        .end();
    parent.end();
    let spans = until(
        "both spans at the receiver",
        Duration::from_secs(10),
        async || {
            let spans = receiver.spans();
            (spans.len() == 2).then_some(spans)
        },
    )
    .await;
    let child = spans
        .iter()
        .find(|s| s.name == "waymark.test.child")
        .unwrap();
    let parent = spans
        .iter()
        .find(|s| s.name == "waymark.test.parent")
        .unwrap();
    assert_eq!(child.parent, parent.id);
    assert_eq!(child.service, "agent-eu-1");
    assert_eq!(child.int("waymark.views"), 3);
    assert_eq!(telemetry.dropped_spans(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_https_collector_that_wants_mutual_tls() {
    // Goal: with OTEL_EXPORTER_OTLP_CERTIFICATE naming the collector's CA, and a client
    // certificate and key, spans reach a collector over TLS that admits only clients of
    // that CA; the collector is checked by the name dialled.
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki =
        waymark_certs::testing::TestPkiDir::init(&dir.path().join("pki"), "otel.test", &["eu"]);
    let loopback = [waymark_certs::ca::HostSan::Ip([127, 0, 0, 1].into())];
    let server = pki.issue_with_hosts("region/eu/authority/collector", &loopback);
    let client = pki.issue("region/eu/node/n1");
    let pem = |p: &std::path::Path| std::fs::read(p).unwrap();
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(
            pem(&server.cert_chain),
            pem(&server.key),
        ))
        .client_ca_root(tonic::transport::Certificate::from_pem(pem(&pki.bundle())));
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .tls_config(tls)
            .unwrap()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let settings = OtelSettings::from_env([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("https://{addr}")),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            pki.bundle().display().to_string(),
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            client.cert_chain.display().to_string(),
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            client.key.display().to_string(),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "10".to_owned()),
    ])
    .unwrap();
    assert!(settings.as_ref().unwrap().tls.is_some());
    let telemetry = Telemetry::start(settings.as_ref(), "waymark-agent").unwrap();
    telemetry.span("waymark.test.tls", None, &[], vec![]).end();
    until(
        "the span at the TLS collector",
        Duration::from_secs(10),
        async || {
            receiver
                .spans()
                .iter()
                .any(|s| s.name == "waymark.test.tls" && s.service == "waymark-agent")
        },
    )
    .await;
    assert_eq!(telemetry.dropped_spans(), 0);
}
