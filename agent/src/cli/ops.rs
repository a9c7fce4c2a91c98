//! The operator commands: `waymark operator raft …`, `services`, `explain`, `audit`,
//! `override`, `proxy-status`. Each prints a table (or `--json`).

use http::Method;
use serde_json::{Value, json};

use super::http::ApiClient;

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

/// `waymark operator raft list-peers`.
pub async fn list_peers(api: &ApiClient, as_json: bool) -> anyhow::Result<String> {
    let peers = api.get_json("/v1/operator/raft/peers").await?;
    if as_json {
        return Ok(format!("{peers:#}\n"));
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
pub async fn join(api: &ApiClient, id: u64, addr: &str) -> anyhow::Result<String> {
    let body = json!({"id": id, "addr": addr});
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
pub async fn services(api: &ApiClient, as_json: bool) -> anyhow::Result<String> {
    let list = api.get_json("/v1/services").await?;
    if as_json {
        return Ok(format!("{list:#}\n"));
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
pub async fn explain(api: &ApiClient, instance: &str, as_json: bool) -> anyhow::Result<String> {
    let e = api
        .get_json(&format!("/v1/instances/{instance}/explain"))
        .await?;
    if as_json {
        return Ok(format!("{e:#}\n"));
    }
    Ok(e["text"].as_str().unwrap_or_default().to_owned())
}

/// `waymark audit`.
pub async fn audit(api: &ApiClient, query: &[(&str, Option<String>)]) -> anyhow::Result<String> {
    let q: Vec<String> = query
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
        .collect();
    let path = if q.is_empty() {
        "/v1/audit".to_owned()
    } else {
        format!("/v1/audit?{}", q.join("&"))
    };
    let r = api.send(Method::GET, &path, None).await?;
    if !r.status.is_success() {
        r.json()?;
    }
    Ok(String::from_utf8_lossy(&r.body).into_owned())
}

/// `waymark override`.
pub async fn override_instance(
    api: &ApiClient,
    instance: &str,
    action: &str,
    justification: Option<&str>,
) -> anyhow::Result<String> {
    let body = json!({"instance": instance, "action": action, "justification": justification});
    let r = api
        .send(Method::POST, "/v1/overrides", Some(&body))
        .await?
        .json()?;
    Ok(format!("granted: {r}\n"))
}

/// `waymark proxy-status`.
pub async fn proxy_status(api: &ApiClient, as_json: bool) -> anyhow::Result<String> {
    let list = api.get_json("/v1/proxy-status").await?;
    if as_json {
        return Ok(format!("{list:#}\n"));
    }
    let mut rows = Vec::new();
    for c in list.as_array().into_iter().flatten() {
        for (ty, t) in c["types"].as_object().into_iter().flatten() {
            rows.push(vec![
                s(&c["node"]),
                s(&c["zone"]),
                s(&c["protocol"]),
                ty.clone(),
                s(&t["sent"]),
                s(&t["acked"]),
                if t["in_sync"].as_bool().unwrap_or(false) {
                    "SYNCED".into()
                } else {
                    "STALE".into()
                },
                s(&t["nacks"]),
            ]);
        }
    }
    Ok(table(
        &[
            "NODE", "ZONE", "PROTOCOL", "TYPE", "SENT", "ACKED", "STATE", "NACKS",
        ],
        rows,
    ))
}

/// `waymark members`: the gossip pool as a node agent sees it.
pub async fn members(agent: &ApiClient, as_json: bool) -> anyhow::Result<String> {
    let body = agent.get_json("/v1/members").await?;
    if as_json {
        return Ok(format!("{body:#}\n"));
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
