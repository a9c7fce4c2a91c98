//! The operator commands: `waymark operator raft …`, `services`, `explain`, `audit`,
//! `override`, `federation …`; the registry's resources in [`resources`], access control
//! in [`acl`], `proxy-status` and `proxy-config` in [`proxy`]. Each prints a table or the
//! API's answer (`-o`).

use http::Method;
use serde_json::{Value, json};

use crate::api_client::ApiClient;
use crate::cli::output::Output;

pub mod acl;
pub mod proxy;
pub mod resources;

/// Print `rows` as aligned columns under `header`.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.len());
            }
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = line(header.iter().map(|h| (*h).to_owned()).collect());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The path with its query, the parameters given.
pub(super) fn with_query(path: &str, query: &[(&str, Option<&str>)]) -> String {
    let q: Vec<String> = query
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode(v))))
        .collect();
    if q.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", q.join("&"))
    }
}

/// Percent-encodes what is not unreserved in a query value.
pub(super) fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/' | b':') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `waymark operator raft list-peers`.
pub async fn list_peers(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let peers = api.get_json("/v1/operator/raft/peers").await?;
    if let Some(printed) = out.structured(&peers) {
        return printed;
    }
    let rows = peers
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    vec![
                        s(&p["id"]),
                        s(&p["member"]["raft_addr"]),
                        s(&p["role"]),
                        s(&p["matched_index"]),
                        s(&p["lag"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(table(&["ID", "ADDRESS", "ROLE", "MATCHED", "LAG"], rows))
}

/// `waymark operator raft join`.
pub async fn join(api: &ApiClient, id: u64, addr: &str, raft: &str) -> anyhow::Result<String> {
    let body = json!({"id": id, "addr": addr, "raft": raft});
    api.send(Method::POST, "/v1/operator/raft/members", Some(&body))
        .await?
        .json()?;
    Ok(format!("member {id} at {addr} joined\n"))
}

/// `waymark operator raft remove`.
pub async fn remove(api: &ApiClient, id: u64) -> anyhow::Result<String> {
    api.send(
        Method::DELETE,
        &format!("/v1/operator/raft/members/{id}"),
        None,
    )
    .await?
    .json()?;
    Ok(format!("member {id} removed\n"))
}

/// `waymark services`.
pub async fn services(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let list = api.get_json("/v1/services").await?;
    if let Some(printed) = out.structured(&list) {
        return printed;
    }
    let rows = list
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| {
                    let verdicts = v["verdicts"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, n)| format!("{k}={n}"))
                                .collect::<Vec<_>>()
                                .join(" ")
                        })
                        .unwrap_or_default();
                    let guard = v["health_disregarded"]
                        .as_array()
                        .filter(|z| !z.is_empty())
                        .map(|z| {
                            format!(
                                "health disregarded in {}",
                                z.iter().map(s).collect::<Vec<_>>().join(",")
                            )
                        })
                        .unwrap_or_else(|| "ok".into());
                    vec![
                        s(&v["service"]),
                        s(&v["instances"]),
                        verdicts,
                        guard,
                        s(&v["version"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(table(
        &["SERVICE", "INSTANCES", "VERDICTS", "GUARD", "VERSION"],
        rows,
    ))
}

/// `waymark explain`.
pub async fn explain(api: &ApiClient, instance: &str, out: Output) -> anyhow::Result<String> {
    let e = api
        .get_json(&format!("/v1/instances/{instance}/explain"))
        .await?;
    if let Some(printed) = out.structured(&e) {
        return printed;
    }
    Ok(e["text"].as_str().unwrap_or_default().to_owned())
}

/// `waymark audit`: a table, or the records as the API gives them (JSON lines) with
/// `-o json`, or a YAML list.
pub async fn audit(
    api: &ApiClient,
    query: &[(&str, Option<String>)],
    out: Output,
) -> anyhow::Result<String> {
    let query: Vec<(&str, Option<&str>)> = query.iter().map(|(k, v)| (*k, v.as_deref())).collect();
    let r = api
        .send(Method::GET, &with_query("/v1/audit", &query), None)
        .await?;
    if !r.status.is_success() {
        r.json()?;
    }
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let records = json_lines(&text)?;
    match out {
        Output::Json => return Ok(text),
        Output::Yaml => return out.document(&Value::Array(records)),
        Output::Table | Output::Wide => {}
    }
    let mut header = vec![
        "SEQ", "AT_MS", "KIND", "ACTOR", "SERVICE", "INSTANCE", "OUTCOME",
    ];
    if out.wide() {
        header.push("DETAIL");
    }
    let rows = records
        .iter()
        .map(|e| {
            let mut row = vec![
                s(&e["seq"]),
                s(&e["at_ms"]),
                s(&e["kind"]),
                s(&e["actor"]),
                s(&e["service"]),
                s(&e["instance"]),
                s(&e["outcome"]),
            ];
            if out.wide() {
                row.push(e["detail"].to_string());
            }
            row
        })
        .collect();
    Ok(table(&header, rows))
}

/// The records of a JSON-lines answer.
fn json_lines(text: &str) -> anyhow::Result<Vec<Value>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(anyhow::Error::from))
        .collect()
}

/// What `waymark override` acts on.
#[derive(Debug, Clone)]
pub enum OverrideTarget {
    /// One instance.
    Instance(String),
    /// Every instance of a node.
    Node(String),
    /// Approve the override the disruption budget refused under this audit number.
    Approve(u64),
}

/// `waymark override`. A refusal by the disruption budget says how a second principal
/// approves it.
pub async fn override_instance(
    api: &ApiClient,
    target: &OverrideTarget,
    action: &str,
    justification: Option<&str>,
) -> anyhow::Result<String> {
    let (path, body) = match target {
        OverrideTarget::Instance(id) => (
            "/v1/overrides".to_owned(),
            json!({"instance": id, "action": action, "justification": justification}),
        ),
        OverrideTarget::Node(node) => (
            "/v1/overrides".to_owned(),
            json!({"node": node, "action": action, "justification": justification}),
        ),
        OverrideTarget::Approve(seq) => (
            format!("/v1/overrides/{seq}/approve"),
            json!({"justification": justification}),
        ),
    };
    let r = api.send(Method::POST, &path, Some(&body)).await?;
    if r.status == http::StatusCode::CONFLICT
        && let Ok(v) = serde_json::from_slice::<Value>(&r.body)
        && let Some(seq) = v["approval"]["seq"].as_u64()
    {
        anyhow::bail!(
            "refused by the disruption budget ({}): {}\nnothing was applied; a different \
             authorised principal may approve it within {} s:\n  waymark override --approve {seq} \
             --justification '...'",
            s(&v["budget"]),
            s(&v["error"]["message"]),
            v["approval"]["window_s"],
        );
    }
    let r = r.json()?;
    let verb = if matches!(target, OverrideTarget::Approve(_)) {
        "approved"
    } else {
        "granted"
    };
    Ok(format!("{verb}: {r}\n"))
}

/// `waymark members`: the gossip pool as a node agent sees it.
pub async fn members(agent: &ApiClient, out: Output) -> anyhow::Result<String> {
    let body = agent.get_json("/v1/members").await?;
    if let Some(printed) = out.structured(&body) {
        return printed;
    }
    let rows = body["members"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    let name = if m["local"].as_bool() == Some(true) {
                        format!("{} (this node)", s(&m["name"]))
                    } else {
                        s(&m["name"])
                    };
                    vec![
                        name,
                        s(&m["addr"]),
                        s(&m["zone"]),
                        s(&m["role"]),
                        s(&m["state"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(table(&["NAME", "ADDRESS", "ZONE", "ROLE", "STATE"], rows))
}

/// `waymark federation status`: per peer region, then per link, then the front doors.
pub async fn federation_status(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let st = api.get_json("/v1/federation/status").await?;
    if let Some(printed) = out.structured(&st) {
        return printed;
    }
    if st["enabled"].as_bool() != Some(true) {
        return Ok(format!(
            "region {} does not federate (no [authority.federation])\n",
            s(&st["region"])
        ));
    }
    let regions = st["regions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let versions = r["versions"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(svc, v)| format!("{svc}@{v}"))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            vec![
                s(&r["region"]),
                format!("{}/{}", s(&r["links_up"]), s(&r["links"])),
                age(&r["age_ms"]),
                if r["stale"].as_bool() == Some(true) {
                    "STALE".into()
                } else {
                    "fresh".into()
                },
                front_door(&st["front_doors"], &r["region"]),
                if versions.is_empty() {
                    "-".into()
                } else {
                    versions
                },
            ]
        })
        .collect();
    let links = st["links"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            vec![
                s(&l["region"]),
                s(&l["member"]),
                s(&l["addr"]),
                s(&l["role"]),
                if l["connected"].as_bool() == Some(true) {
                    "up".into()
                } else {
                    "down".into()
                },
                age(&l["age_ms"]),
                s(&l["last_error"]),
            ]
        })
        .collect();
    let mut out = format!(
        "region {} federating on {}\n\n",
        s(&st["region"]),
        s(&st["endpoint"])
    );
    out.push_str(&table(
        &[
            "PEER REGION",
            "LINKS",
            "AGE",
            "STATE",
            "FRONT DOOR",
            "VERSIONS",
        ],
        regions,
    ));
    out.push('\n');
    out.push_str(&table(
        &[
            "REGION",
            "MEMBER",
            "ADDRESS",
            "ROLE",
            "LINK",
            "AGE",
            "LAST ERROR",
        ],
        links,
    ));
    Ok(out)
}

fn age(ms: &Value) -> String {
    ms.as_u64().map_or_else(
        || "never".into(),
        |ms| format!("{:.1}s", ms as f64 / 1000.0),
    )
}

fn front_door(doors: &Value, region: &Value) -> String {
    match region.as_str().map(|r| &doors[r]) {
        Some(Value::Object(d)) if d.get("up").and_then(Value::as_bool) == Some(true) => "up".into(),
        Some(Value::Object(_)) => "DOWN".into(),
        _ => "-".into(),
    }
}

/// `waymark federation reconcile-log`: the audit log's federation reconciliations, one per
/// line with what each side held.
pub async fn reconcile_log(
    api: &ApiClient,
    since_seq: Option<u64>,
    out: Output,
) -> anyhow::Result<String> {
    let mut path = format!(
        "/v1/audit?kind=reconciliation&actor={}",
        crate::authority::regions::FEDERATION_ACTOR
    );
    if let Some(seq) = since_seq {
        path.push_str(&format!("&since_seq={seq}"));
    }
    let r = api.send(Method::GET, &path, None).await?;
    if !r.status.is_success() {
        r.json()?;
    }
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let records = json_lines(&text)?;
    match out {
        Output::Json => return Ok(text),
        Output::Yaml => return out.document(&Value::Array(records)),
        Output::Table | Output::Wide => {}
    }
    let mut rows = Vec::new();
    for e in &records {
        for entry in e["detail"]["entries"].as_array().into_iter().flatten() {
            rows.push(vec![
                s(&e["seq"]),
                s(&e["detail"]["peer_region"]),
                format!("{}/{}", s(&entry["region"]), s(&entry["service"])),
                s(&entry["ours"]),
                s(&entry["theirs"]),
                s(&entry["outcome"]),
            ]);
        }
    }
    Ok(table(
        &["SEQ", "FROM", "ENTRY", "OURS", "THEIRS", "OUTCOME"],
        rows,
    ))
}

/// `waymark federation failover|shift-back|complete-shift-back`.
pub async fn region_failover(
    api: &ApiClient,
    region: &str,
    action: &str,
    reason: &str,
) -> anyhow::Result<String> {
    let body = json!({"action": action, "reason": reason});
    api.send(
        Method::POST,
        &format!("/v1/federation/regions/{region}/failover"),
        Some(&body),
    )
    .await?
    .json()?;
    Ok(format!("{action} of region {region}: committed\n"))
}

/// `waymark federation failovers`.
pub async fn region_failovers(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let all = api.get_json("/v1/federation/failovers").await?;
    if let Some(printed) = out.structured(&all) {
        return printed;
    }
    let rows = all
        .as_object()
        .into_iter()
        .flatten()
        .map(|(region, f)| {
            vec![
                region.clone(),
                format!("{}‰", s(&f["moved"])),
                s(&f["direction"]),
                if f["manual"].as_bool() == Some(true) {
                    "manual".into()
                } else {
                    "automatic".into()
                },
                if f["awaiting_completion"].as_bool() == Some(true) {
                    "AWAITING COMPLETION".into()
                } else {
                    "-".into()
                },
                s(&f["actor"]),
                s(&f["reason"]),
            ]
        })
        .collect();
    Ok(table(
        &[
            "PEER REGION",
            "MOVED",
            "DIRECTION",
            "KIND",
            "STATE",
            "ACTOR",
            "REASON",
        ],
        rows,
    ))
}
