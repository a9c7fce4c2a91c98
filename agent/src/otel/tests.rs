use super::*;

fn parse(vars: &[(&str, &str)]) -> Result<Option<OtelSettings>, OtelError> {
    OtelSettings::from_env(vars.iter().map(|(k, v)| (*k, *v)))
}

fn refused(vars: &[(&str, &str)]) -> String {
    parse(vars).expect_err("refused").to_string()
}

#[test]
fn nothing_configured_means_no_export() {
    // Goal: export is off by default, and the explicit ways to turn it off win.
    assert_eq!(parse(&[]).unwrap(), None);
    assert_eq!(
        parse(&[("PATH", "/bin"), ("OTEL_SERVICE_NAME", "x")]).unwrap(),
        None
    );
    assert_eq!(
        parse(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "  ")]).unwrap(),
        None
    );
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
    assert_eq!(
        parse(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]).unwrap(),
        None
    );
    assert_eq!(
        parse(&[endpoint, ("OTEL_SDK_DISABLED", "true")]).unwrap(),
        None
    );
}

#[test]
fn an_endpoint_or_the_exporter_turns_export_on_with_the_defaults() {
    let s = parse(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")])
        .unwrap()
        .unwrap();
    assert_eq!(s.protocol, OtelProtocol::Grpc);
    assert_eq!(s.endpoint, "http://collector:4317");
    assert_eq!(s.service_name, None);
    assert_eq!(s.sampler, OtelSampler::ParentAlwaysOn);
    assert_eq!((s.queue_max, s.batch_max), (2048, 512));
    assert_eq!(s.timeout, Duration::from_secs(10));
    let s = parse(&[("OTEL_TRACES_EXPORTER", "otlp")]).unwrap().unwrap();
    assert_eq!(s.endpoint, "http://localhost:4317");
}

#[test]
fn http_protobuf_appends_the_traces_path_to_the_base_endpoint_only() {
    let http = ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
    let s = parse(&[http, ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")])
        .unwrap()
        .unwrap();
    assert_eq!(s.protocol, OtelProtocol::HttpProtobuf);
    assert_eq!(s.endpoint, "http://c:4318/v1/traces");
    let s = parse(&[
        http,
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9/custom"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(s.endpoint, "http://t:9/custom");
}

#[test]
fn every_variable_is_read() {
    let s = parse(&[
        ("OTEL_TRACES_EXPORTER", "otlp"),
        ("OTEL_SERVICE_NAME", "auth-eu"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=prod,team=a%20b",
        ),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20x,a=1"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a=2"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(s.service_name.as_deref(), Some("auth-eu"));
    assert_eq!(
        s.resource,
        vec![
            ("deployment.environment".into(), "prod".into()),
            ("team".into(), "a b".into())
        ]
    );
    assert_eq!(s.sampler, OtelSampler::ParentRatio(0.25));
    assert_eq!(
        s.headers.get("authorization").map(String::as_str),
        Some("Bearer x")
    );
    assert_eq!(s.headers.get("a").map(String::as_str), Some("2"));
    assert_eq!(s.timeout, Duration::from_millis(2500));
    assert_eq!((s.queue_max, s.batch_max), (100, 100));
    assert_eq!(s.schedule_delay, Duration::from_millis(50));
}

#[test]
fn an_https_collector_is_verified_against_the_named_roots_and_may_take_a_client_certificate() {
    let s = parse(&[
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://collector.example:4317",
        ),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/otel/ca.pem"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "/etc/otel/traces-ca.pem",
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "/etc/otel/client.pem",
        ),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/etc/otel/client.key"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(s.endpoint, "https://collector.example:4317");
    assert_eq!(
        s.tls,
        Some(OtelTls {
            ca: "/etc/otel/traces-ca.pem".into(),
            client: Some(("/etc/otel/client.pem".into(), "/etc/otel/client.key".into())),
        }),
        "the traces variable wins over the general one"
    );
    let plain = parse(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4317"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/otel/ca.pem"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        plain.tls, None,
        "TLS settings apply to an https:// endpoint only"
    );
    let e = refused(&[(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "https://collector.example:4317",
    )]);
    assert!(e.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{e}");
}

#[tokio::test]
async fn an_unreadable_ca_stops_the_start_naming_its_variable() {
    let s = parse(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4317"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem"),
    ])
    .unwrap();
    let e = Telemetry::start(s.as_ref(), AGENT_SERVICE)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("OTEL_EXPORTER_OTLP_CERTIFICATE: "), "{e}");
}

#[test]
fn a_bad_value_is_refused_naming_its_variable() {
    // Goal: each refusal starts with the variable's name, so the operator knows what to fix.
    let on = ("OTEL_TRACES_EXPORTER", "otlp");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("OTEL_TRACES_EXPORTER", "jaeger")],
            "OTEL_TRACES_EXPORTER",
        ),
        (
            &[on, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")],
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c")],
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ),
        (
            &[on, ("OTEL_TRACES_SAMPLER", "sometimes")],
            "OTEL_TRACES_SAMPLER",
        ),
        (
            &[
                on,
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "2"),
            ],
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        (
            &[on, ("OTEL_RESOURCE_ATTRIBUTES", "novalue")],
            "OTEL_RESOURCE_ATTRIBUTES",
        ),
        (
            &[on, ("OTEL_EXPORTER_OTLP_HEADERS", "a=%zz")],
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        (
            &[on, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")],
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ),
        (
            &[on, ("OTEL_BSP_MAX_QUEUE_SIZE", "0")],
            "OTEL_BSP_MAX_QUEUE_SIZE",
        ),
        (
            &[
                on,
                ("OTEL_BSP_MAX_QUEUE_SIZE", "10"),
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "20"),
            ],
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        ),
        (&[on, ("OTEL_SDK_DISABLED", "yes")], "OTEL_SDK_DISABLED"),
        (
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem"),
            ],
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4317"),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem"),
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/client.pem"),
            ],
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        ),
    ];
    for (vars, variable) in cases {
        let e = refused(vars);
        assert!(e.starts_with(&format!("{variable}: ")), "{vars:?}: {e}");
    }
}

#[tokio::test]
async fn off_telemetry_does_nothing_and_remembers_nothing() {
    let t = Telemetry::start(None, AGENT_SERVICE).unwrap();
    assert!(!t.is_on());
    let span = t.span("waymark.test", None, &[], vec![]);
    assert!(!span.context().is_valid());
    t.remember([1], &span.context());
    assert!(t.recall(1).is_none());
    span.end();
}

#[tokio::test]
async fn an_unreachable_collector_drops_and_counts_without_blocking() {
    // Goal: spans ended against a dead collector and a full queue never wait; each is counted.
    let s = parse(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "200"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "4"),
        ("OTEL_BSP_SCHEDULE_DELAY", "10"),
    ])
    .unwrap()
    .unwrap();
    let t = Telemetry::start(Some(&s), AGENT_SERVICE).unwrap();
    let started = tokio::time::Instant::now();
    for _ in 0..100 {
        t.span("waymark.test", None, &[], vec![]).end();
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "ending spans waited"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while t.dropped_spans() < 100 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(t.dropped_spans(), 100);
}

#[tokio::test]
async fn remembered_versions_are_bounded_and_the_oldest_forgotten() {
    // Goal: the version → span map the stages join by never grows past its bound.
    let s = parse(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")])
        .unwrap()
        .unwrap();
    let t = Telemetry::start(Some(&s), AUTHORITY_SERVICE).unwrap();
    let span = t.span("waymark.test", None, &[], vec![]);
    let context = span.context();
    assert!(context.is_valid());
    let n = REMEMBERED_MAX as u64;
    t.remember(0..n + 10, &context);
    assert!(t.recall(0).is_none());
    assert!(t.recall(9).is_none());
    assert_eq!(t.recall(10), Some(context.clone()));
    assert_eq!(t.recall(n + 9), Some(context.clone()));
    assert_eq!(t.recall_all([10, 11, 5]).len(), 1, "one distinct context");
    span.end();
}
