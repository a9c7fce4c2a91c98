//! What `deploy/prometheus` and `deploy/grafana` ship, checked the way an operator would
//! find out they were wrong — by the tools that read them:
//!
//! - the rules pass `promtool check rules` and their unit tests (`promtool test rules`), and
//!   the scrape configuration passes `promtool check config`;
//! - every alert's runbook names a section of `docs/alerts.md` that exists;
//! - the dashboards are what `deploy/grafana/generate.py` writes, fit the dashboard schema
//!   (Python `jsonschema`), and lay their panels out without overlap;
//! - a real Prometheus scrapes a dev region's authority (HTTPS, bearer token, the dev CA) and
//!   node agent with the shipped rules loaded, and runs every dashboard query and every rule
//!   expression without an error; every metric they name is one a role exposes;
//! - with the shipped rules, cutting a node agent's upstream fires
//!   `WaymarkAgentsAllDisconnected` in that real Prometheus.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::prometheus::{self, Prometheus};

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use waymark_agent::node::agent::NodeAgent;
use waymark_testkit::until;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn deploy(path: &str) -> PathBuf {
    root().join("deploy").join(path)
}

fn promtool(args: &[&str], dir: &Path) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool (Debian `prometheus`) is installed by scripts/test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}: {text}");
    text
}

/// The rules file, parsed.
fn rules() -> Value {
    let text = std::fs::read_to_string(deploy("prometheus/waymark.rules.yaml")).unwrap();
    serde_norway::from_str(&text).unwrap()
}

/// Every rule's `(name, expr)`: alerts by `alert`, recordings by `record`.
fn rule_exprs() -> Vec<(String, String)> {
    let rules = rules();
    let mut out = Vec::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap();
            out.push((name.to_owned(), rule["expr"].as_str().unwrap().to_owned()));
        }
    }
    out
}

#[test]
fn the_shipped_rules_pass_their_unit_tests_and_the_scrape_configuration_checks() {
    let dir = deploy("prometheus");
    let checked = promtool(&["check", "rules", "waymark.rules.yaml"], &dir);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "waymark.rules.test.yaml"], &dir);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // The file names credentials this machine has no copy of: syntax only.
    promtool(
        &["check", "config", "--syntax-only", "prometheus.yml"],
        &dir,
    );

    // Every alert has a unit test that expects it to fire, and one that expects silence.
    let tests: Value = serde_norway::from_str(
        &std::fs::read_to_string(dir.join("waymark.rules.test.yaml")).unwrap(),
    )
    .unwrap();
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for test in tests["tests"].as_array().unwrap() {
        for case in test["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().unwrap().to_owned();
            if case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                firing.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    let alerts: BTreeSet<String> = rules()["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(firing, alerts, "every alert has a test where it fires");
    let untested_quiet: Vec<_> = alerts.difference(&quiet).collect();
    assert!(
        untested_quiet.is_empty(),
        "alerts without a near miss that must stay quiet: {untested_quiet:?}"
    );
}

#[test]
fn every_alert_names_a_severity_and_a_runbook_section_that_exists() {
    let alerts_doc = std::fs::read_to_string(root().join("docs/alerts.md")).unwrap();
    let sections: BTreeSet<String> = alerts_doc
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    for group in rules()["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let Some(alert) = rule["alert"].as_str() else {
                continue;
            };
            let severity = rule["labels"]["severity"].as_str();
            assert!(
                matches!(severity, Some("page" | "ticket")),
                "{alert}: severity {severity:?}"
            );
            let runbook = rule["annotations"]["runbook"].as_str().unwrap();
            let anchor = runbook
                .strip_prefix("docs/alerts.md#")
                .unwrap_or_else(|| panic!("{alert}: runbook {runbook} is not in docs/alerts.md"));
            assert!(
                sections.contains(anchor),
                "{alert}: docs/alerts.md has no section #{anchor}"
            );
            assert!(
                alerts_doc.contains(&format!("| `{alert}` |")),
                "{alert} is missing from docs/alerts.md's table"
            );
        }
    }
}

/// The checked-in dashboards, by file name.
fn dashboards() -> BTreeMap<String, Value> {
    std::fs::read_dir(deploy("grafana/dashboards"))
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let v = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            (name, v)
        })
        .collect()
}

fn python() -> PathBuf {
    std::env::var_os("WAYMARK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"))
}

#[test]
fn the_dashboards_are_generated_fit_their_schema_and_do_not_overlap() {
    // What the generator writes now is what is checked in.
    let out = tempfile::tempdir().unwrap();
    let generated = Command::new(python())
        .arg(deploy("grafana/generate.py"))
        .arg(out.path())
        .output()
        .expect("Python runs the generator (WAYMARK_PYTHON or ./.venv)");
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let checked_in = dashboards();
    assert_eq!(checked_in.len(), 4, "{:?}", checked_in.keys());
    for name in checked_in.keys() {
        let fresh = std::fs::read_to_string(out.path().join(name)).unwrap();
        let kept = std::fs::read_to_string(deploy("grafana/dashboards").join(name)).unwrap();
        assert!(
            fresh == kept,
            "deploy/grafana/dashboards/{name} differs from what generate.py writes: run \
             python3 deploy/grafana/generate.py"
        );
    }

    // Each fits the schema (draft 2020-12, the validator the contract guide uses).
    let check = "import json, sys, jsonschema\n\
                 schema = json.load(open(sys.argv[1]))\n\
                 for path in sys.argv[2:]:\n    \
                     jsonschema.validate(json.load(open(path)), schema, cls=jsonschema.Draft202012Validator)\n";
    let mut validate = Command::new(python());
    validate
        .args(["-c", check])
        .arg(deploy("grafana/dashboard.schema.json"));
    for name in checked_in.keys() {
        validate.arg(deploy("grafana/dashboards").join(name));
    }
    let validated = validate.output().unwrap();
    assert!(
        validated.status.success(),
        "{}",
        String::from_utf8_lossy(&validated.stderr)
    );

    // Unique panel ids and uids; no two panels on the same grid cell.
    let mut uids = BTreeSet::new();
    for (name, d) in &checked_in {
        assert!(
            uids.insert(d["uid"].as_str().unwrap().to_owned()),
            "{name}: uid repeated"
        );
        let mut ids = BTreeSet::new();
        let mut cells = BTreeSet::new();
        for p in d["panels"].as_array().unwrap() {
            assert!(
                ids.insert(p["id"].as_u64().unwrap()),
                "{name}: panel id repeated"
            );
            let g = &p["gridPos"];
            let (x, y, w, h) = (
                g["x"].as_u64().unwrap(),
                g["y"].as_u64().unwrap(),
                g["w"].as_u64().unwrap(),
                g["h"].as_u64().unwrap(),
            );
            assert!(
                x + w <= 24,
                "{name}: panel {} runs off the grid",
                p["title"]
            );
            for cx in x..x + w {
                for cy in y..y + h {
                    assert!(
                        cells.insert((cx, cy)),
                        "{name}: panel {} overlaps another at ({cx}, {cy})",
                        p["title"]
                    );
                }
            }
        }
    }
}

/// Every dashboard query, with its variables given values a dev region has.
fn dashboard_exprs() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, d) in dashboards() {
        for p in d["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$region", ".*")
                    .replace("$service", "web");
                out.push((format!("{name}: {}", p["title"]), expr));
            }
        }
        for v in d["templating"]["list"].as_array().unwrap() {
            if let Some(def) = v["definition"].as_str() {
                // label_values(metric{…}, label) is Grafana's, not PromQL: query its series.
                let inner = def
                    .strip_prefix("label_values(")
                    .and_then(|s| s.rsplit_once(','))
                    .map(|(series, _)| series.replace("$region", ".*"))
                    .unwrap();
                out.push((format!("{name}: variable {}", v["name"]), inner));
            }
        }
    }
    out
}

/// The `waymark_…` metric names an expression reads (histogram suffixes dropped).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("waymark_") {
        let start = i + at;
        // A recording rule (`region:waymark_…:ratio`) is not a metric a role exposes.
        let in_recording = start > 0 && bytes[start - 1] == b':';
        let end = expr[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(expr.len(), |e| start + e);
        if !in_recording {
            let name = &expr[start..end];
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            names.insert(base.to_owned());
        }
        i = end;
    }
    names
}

/// Series that exist only in conditions a quiet dev region never reaches: raised alarms,
/// peer regions, a Kubernetes reconciler, refusals, a follower, a timed release. Each must
/// still be one a role registers (checked against the source below).
const CONDITIONAL: &[&str] = &[
    "waymark_alarm_fraction_guard_engaged",
    "waymark_alarm_last_eligible_withdrawn",
    "waymark_quarantine_events_total",
    "waymark_xds_streams_refused_total",
    "waymark_api_refusals_total",
    "waymark_ingest_samples_refused_total",
    "waymark_agent_views_refused_total",
    "waymark_agent_evidence_refused_total",
    "waymark_agent_evidence_dropped_total",
    "waymark_lrs_samples_dropped_total",
    "waymark_lrs_samples_forwarded_total",
    "waymark_dns_queries_total",
    "waymark_federation_region_age_seconds",
    "waymark_federation_region_stale",
    "waymark_federation_peer_connected",
    "waymark_federation_front_door_up",
    "waymark_federation_replicated_entries_total",
    "waymark_federation_reconciliations_audited_total",
    "waymark_federation_refused_total",
    "waymark_region_failover_moved_ratio",
    // Timed only once a release reaches a client connected before it; a lone member has no
    // follower to lag.
    "waymark_xds_propagation_seconds",
    "waymark_raft_follower_lag_entries",
    "waymark_raft_follower_lag_seconds",
];

/// The metric names registered anywhere in the workspace's sources (`"name"` after a
/// `register(` with the prefix its sub-registry adds): a coarse net under [`CONDITIONAL`].
fn registered_in_source() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut stack = vec![
        root().join("agent/src"),
        root().join("federation"),
        root().join("certs/src"),
    ];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (i, _) in text.match_indices(".register(") {
                    if let Some(q) = text[i..].find('"') {
                        let rest = &text[i + q + 1..];
                        if let Some(end) = rest.find('"') {
                            names.insert(rest[..end].to_owned());
                        }
                    }
                }
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_both_roles_and_runs_every_shipped_query() {
    let Some(bin) = prometheus::bin("deploy_monitoring") else {
        return;
    };
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let dev = common::dev::start(&dir.path().join("dev")).await;
    let prom_dir = dir.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    std::fs::copy(
        deploy("prometheus/waymark.rules.yaml"),
        prom_dir.join("waymark.rules.yaml"),
    )
    .unwrap();
    let config = format!(
        r#"global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [waymark.rules.yaml]
scrape_configs:
  - job_name: waymark-authority
    scheme: https
    authorization:
      type: Bearer
      credentials_file: {token}
    tls_config:
      ca_file: {ca}
    static_configs:
      - targets: ["{api}"]
        labels: {{region: eu}}
  - job_name: waymark-agent
    static_configs:
      - targets: ["{agent}"]
        labels: {{region: eu}}
"#,
        token = dev.token_file().display(),
        ca = dev.ca_bundle().display(),
        api = dev.authority().http_addr(),
        agent = dev.agent().bound().http,
    );
    let prometheus = Prometheus::start(&bin, &prom_dir, &config);
    until("both roles scraped", common::dev::WAIT, async || {
        prometheus.pool_up("waymark-authority").await && prometheus.pool_up("waymark-agent").await
    })
    .await;
    // The recordings are evaluated over what was scraped: the agent is connected.
    until("the rules evaluated", common::dev::WAIT, async || {
        prometheus
            .query("region:waymark_agent_upstream_connected:ratio")
            .await
            .is_ok_and(|r| r.len() == 1 && r[0]["value"][1] == "1")
    })
    .await;
    // Probes and instances have reached the exposition.
    until("probe and verdict series", common::dev::WAIT, async || {
        prometheus
            .names()
            .await
            .is_ok_and(|n| n.iter().any(|n| n == "waymark_probes_total"))
    })
    .await;

    let mut exprs = dashboard_exprs();
    exprs.extend(rule_exprs());
    let mut failures = Vec::new();
    let mut named = BTreeSet::new();
    for (what, expr) in &exprs {
        if let Err(e) = prometheus.query(expr).await {
            failures.push(format!("{what}: {expr}: {e}"));
        }
        named.extend(metric_names(expr));
    }
    assert!(
        failures.is_empty(),
        "queries Prometheus refused:\n{}",
        failures.join("\n")
    );

    let scraped: BTreeSet<String> = prometheus.names().await.unwrap().into_iter().collect();
    let registered = registered_in_source();
    let mut unknown = Vec::new();
    for name in &named {
        if scraped.contains(name) || scraped.contains(&format!("{name}_bucket")) {
            continue;
        }
        if CONDITIONAL.contains(&name.as_str()) {
            // Not scraped here: it must at least be registered somewhere.
            let stem = name
                .strip_suffix("_total")
                .unwrap_or(name)
                .trim_start_matches("waymark_");
            let known = registered
                .iter()
                .any(|r| stem == r || stem.ends_with(&format!("_{r}")));
            if !known {
                unknown.push(format!("{name} (conditional, but registered nowhere)"));
            }
            continue;
        }
        unknown.push(name.clone());
    }
    assert!(
        unknown.is_empty(),
        "dashboards or rules name metrics neither role exposes: {unknown:?}\nscraped: {scraped:?}"
    );
    // The net catches what it should: a made-up name is neither scraped nor registered.
    assert!(!scraped.contains("waymark_agent_upstream_connectd"));
    drop(prometheus);
    dev.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutting_the_agents_upstream_fires_the_shipped_alert() {
    let Some(bin) = prometheus::bin("deploy_monitoring") else {
        return;
    };
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let authority = common::single_member(common::plain(
        &dir.path().join("authority"),
        "eu",
        &["a"],
        any,
    ))
    .await;
    let agent = NodeAgent::start(common::agent_on_loopback(
        "n1",
        "eu",
        "a",
        &dir.path().join("agent"),
        &[authority.xds_addr()],
    ))
    .await
    .unwrap();
    let prom_dir = dir.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    std::fs::copy(
        deploy("prometheus/waymark.rules.yaml"),
        prom_dir.join("waymark.rules.yaml"),
    )
    .unwrap();
    let config = format!(
        r#"global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [waymark.rules.yaml]
scrape_configs:
  - job_name: waymark-agent
    static_configs:
      - targets: ["{agent}"]
        labels: {{region: eu}}
"#,
        agent = agent.bound().http,
    );
    let prometheus = Prometheus::start(&bin, &prom_dir, &config);
    let state = async |p: &Prometheus| -> Option<String> {
        p.alerts()
            .await
            .ok()?
            .into_iter()
            .find(|a| a["labels"]["alertname"] == "WaymarkAgentsAllDisconnected")
            .map(|a| a["state"].as_str().unwrap_or_default().to_owned())
    };
    until(
        "the agent scraped while connected",
        common::dev::WAIT,
        async || {
            prometheus
                .query("waymark_agent_upstream_connected")
                .await
                .is_ok_and(|r| r.len() == 1 && r[0]["value"][1] == "1")
        },
    )
    .await;
    assert_eq!(state(&prometheus).await, None, "quiet while connected");

    authority.shutdown().await;
    // Pending first (the rule waits a minute), then firing, with the region's labels.
    until("the alert pending", common::dev::WAIT, async || {
        state(&prometheus).await.is_some()
    })
    .await;
    until("the alert firing", Duration::from_secs(180), async || {
        state(&prometheus).await.as_deref() == Some("firing")
    })
    .await;
    let firing = prometheus.alerts().await.unwrap();
    let alert = firing
        .iter()
        .find(|a| a["labels"]["alertname"] == "WaymarkAgentsAllDisconnected")
        .unwrap();
    assert_eq!(alert["labels"]["severity"], "page", "{alert}");
    assert_eq!(alert["labels"]["region"], "eu", "{alert}");
    // The single-agent ticket stays quiet: the region page covers it.
    assert!(
        !firing
            .iter()
            .any(|a| a["labels"]["alertname"] == "WaymarkAgentDisconnected"),
        "{firing:?}"
    );
    drop(prometheus);
    agent.shutdown().await;
}

/// The shipped `waymark-agent` scrape job, as written, with its file paths and targets
/// replaced: the test fails if the job's shape changes under it.
fn shipped_agent_job(token: &Path, bundle: &Path, target: SocketAddr) -> String {
    let shipped = std::fs::read_to_string(deploy("prometheus/prometheus.yml")).unwrap();
    let start = shipped
        .find("  - job_name: waymark-agent")
        .expect("prometheus.yml scrapes the node agents");
    let job = &shipped[start..];
    let job = job[2..]
        .find("\n  - job_name:")
        .map_or(job, |end| &job[..end + 3]);
    let mut job = job.to_owned();
    for (from, to) in [
        (
            "/etc/prometheus/waymark-agent.token".to_owned(),
            token.display().to_string(),
        ),
        (
            "/etc/prometheus/waymark-bundle.pem".to_owned(),
            bundle.display().to_string(),
        ),
        (
            r#"["10.0.1.17:8400", "10.0.2.17:8400", "10.0.3.17:8400"]"#.to_owned(),
            format!(r#"["{target}"]"#),
        ),
    ] {
        assert!(
            job.contains(&from),
            "the shipped agent job no longer has {from}:\n{job}"
        );
        job = job.replace(&from, &to);
    }
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_agent_job_scrapes_an_agent_off_loopback_with_its_token() {
    // Goal: an agent on a host's address serves /metrics over TLS to token bearers only, and
    // the shipped scrape job — https, the bundle, the token file — is what gets through.
    let Some(bin) = prometheus::bin("deploy_monitoring") else {
        return;
    };
    waymark_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki =
        waymark_certs::testing::TestPkiDir::init(&dir.path().join("pki"), "waymark.test", &["eu"]);
    // Prometheus checks the name it dials: the node's certificate carries it (`--host`).
    let hosts = [waymark_certs::ca::HostSan::Ip([127, 0, 0, 1].into())];
    let tokens = dir.path().join("api-tokens");
    let token = "0123456789abcdef0123456789abcdef";
    std::fs::write(&tokens, format!("{token}\n")).unwrap();
    let nowhere: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut config =
        common::agent_on_loopback("n1", "eu", "a", &dir.path().join("agent"), &[nowhere]);
    config.tls = Some(waymark_agent::node::config::Tls::new(
        "waymark.test",
        &pki.issue_with_hosts("region/eu/node/n1", &hosts),
    ));
    config.listen.http = "0.0.0.0:0".parse().unwrap();
    config.listen.http_tokens_file = Some(tokens.clone());
    let agent = NodeAgent::start(config).await.unwrap();
    let target = SocketAddr::from(([127, 0, 0, 1], agent.bound().http.port()));

    let prom_dir = dir.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let scraper_token = prom_dir.join("waymark-agent.token");
    std::fs::write(&scraper_token, format!("{token}\n")).unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n{}",
        shipped_agent_job(&scraper_token, &pki.bundle(), target)
    );
    let prometheus = Prometheus::start(&bin, &prom_dir, &config);
    until(
        "Prometheus to scrape the agent over TLS with its token",
        Duration::from_secs(30),
        async || prometheus.pool_up("waymark-agent").await,
    )
    .await;
    let up = prometheus
        .query(r#"waymark_agent_lkg_loaded_records{job="waymark-agent"}"#)
        .await
        .unwrap();
    assert_eq!(up.len(), 1, "the agent's own series arrived: {up:?}");

    // Without the token the same job is refused, and the agent counts it.
    std::fs::write(&scraper_token, "not-the-token-at-all-0000\n").unwrap();
    until(
        "the agent to count Prometheus's refused scrape",
        Duration::from_secs(30),
        async || {
            let targets = prometheus.targets("waymark-agent").await.ok()?;
            let error = targets.first()?["lastError"].as_str()?.to_owned();
            error.contains("401").then_some(error)
        },
    )
    .await;
    let reader = waymark_agent::api_client::ApiClient::new(&target.to_string(), Some(token.into()))
        .with_tls(waymark_agent::cli::tls::agent_api_client_config(&pki.bundle()).unwrap());
    let metrics = reader
        .send(http::Method::GET, "/metrics", None)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.lines()
            .any(|l| l.starts_with(r#"waymark_agent_http_refused_total{reason="unknown_token"}"#)),
        "{text}"
    );
    agent.shutdown().await;
}
