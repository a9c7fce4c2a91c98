//! `waymark proxy-status` and `waymark proxy-config`: the node agents an authority member
//! serves, the sidecars behind each of them, and what one sidecar holds (what
//! `istioctl proxy-status` / `proxy-config` show an Istio user).
//!
//! `proxy-status` reads two routes: `GET /v1/proxy-status` (the agents this member's xDS
//! tier serves; member-local) and `GET /v1/proxy-status/sidecars` (every node's report of
//! its own clients; the leader's, which the client reaches through the redirect). With
//! `-o json|yaml` it prints both answers unchanged, as `{"agents": …, "sidecars": …}`.
//! `proxy-config` asks the leader (`GET /v1/proxy-config/{node}/{client}`), which asks the
//! node agent; with `--agent` it asks a node agent's own local API on the host instead.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{s, table};
use crate::api_client::ApiClient;
use crate::cli::output::Output;

/// The types in the order a table lists them, with their short names.
const TYPES: [(&str, &str); 4] = [
    ("Cluster", "CDS"),
    ("ClusterLoadAssignment", "EDS"),
    ("Listener", "LDS"),
    ("RouteConfiguration", "RDS"),
];

/// `waymark proxy-status`.
pub async fn status(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let agents = api.get_json("/v1/proxy-status").await?;
    // The agents still print when the sidecars cannot be read (no leader, an older
    // authority): the reason goes under the table.
    let sidecars = api.get_json("/v1/proxy-status/sidecars").await;
    if let Some(printed) = out.structured(&json!({
        "agents": agents,
        "sidecars": sidecars.as_ref().ok(),
    })) {
        return printed;
    }
    let mut text = status_table(&agents, sidecars.as_ref().ok(), out.wide());
    if let Err(e) = sidecars {
        text.push_str(&format!("sidecars: not read ({e:#})\n"));
    }
    Ok(text)
}

/// `waymark proxy-config <client>`: from the leader (finding the client's node in the
/// sidecar reports unless `node` names it), or from the node agent at `agent`.
pub async fn config(
    api: &ApiClient,
    client: &str,
    node: Option<&str>,
    agent: Option<&ApiClient>,
    out: Output,
) -> anyhow::Result<String> {
    let doc = match agent {
        Some(agent) => {
            let path = format!("/v1/clients/{}/config", segment(client));
            agent.get_json(&path).await?
        }
        None => {
            let node = match node {
                Some(n) => n.to_owned(),
                None => node_of(api, client).await?,
            };
            let path = format!("/v1/proxy-config/{}/{}", segment(&node), segment(client));
            api.get_json(&path).await?
        }
    };
    if let Some(printed) = out.structured(&doc) {
        return printed;
    }
    Ok(config_table(&doc, out.wide()))
}

/// The one node whose report lists `client`.
async fn node_of(api: &ApiClient, client: &str) -> anyhow::Result<String> {
    let reports = api.get_json("/v1/proxy-status/sidecars").await?;
    let nodes: Vec<String> = reports["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| {
            n["sidecars"]
                .as_array()
                .is_some_and(|list| list.iter().any(|c| c["client"] == client))
        })
        .map(|n| s(&n["node"]))
        .collect();
    match nodes.as_slice() {
        [one] => Ok(one.clone()),
        [] => anyhow::bail!(
            "no node agent reports an xDS client {client}; name its node with --node, or ask the agent on its host with --agent"
        ),
        many => anyhow::bail!(
            "xDS clients named {client} are on several nodes ({}); name one with --node",
            many.join(", ")
        ),
    }
}

/// One row per agent this member serves and, under each, one per sidecar its node
/// reports; nodes that report sidecars but stream xDS from another member come last.
pub fn status_table(agents: &Value, sidecars: Option<&Value>, wide: bool) -> String {
    let mut by_node: BTreeMap<String, &Value> = sidecars
        .and_then(|v| v["nodes"].as_array())
        .into_iter()
        .flatten()
        .map(|n| (s(&n["node"]), n))
        .collect();
    let mut rows = Vec::new();
    let mut agents: Vec<&Value> = agents.as_array().into_iter().flatten().collect();
    agents.sort_by_key(|a| s(&a["node"]));
    for agent in agents {
        let node = s(&agent["node"]);
        rows.push(agent_row(agent, wide));
        if let Some(report) = by_node.remove(&node) {
            rows.extend(sidecar_rows(&node, report, wide));
        }
    }
    for (node, report) in by_node {
        let state = if report["session_open"] == true {
            "ELSEWHERE"
        } else {
            "SILENT"
        };
        let mut row = vec![node.clone(), "(agent)".into()];
        row.extend(["-", "-", "-", "-", "-", state, "-", "-"].map(String::from));
        if wide {
            row.extend(["-", "-", "-"].map(String::from));
        }
        rows.push(row);
        rows.extend(sidecar_rows(&node, report, wide));
    }
    let mut header = vec![
        "NODE",
        "CLIENT",
        "CLUSTER",
        "ZONE",
        "PROTOCOL",
        "SENT",
        "ACKED",
        "STATE",
        "CONNECTED",
        "VIEW AGE",
    ];
    if wide {
        header.extend(["TYPES (sent/acked)", "IDENTITY", "LAST NACK"]);
    }
    table(&header, rows)
}

/// An agent as this member's xDS tier sees it.
fn agent_row(agent: &Value, wide: bool) -> Vec<String> {
    let types = &agent["types"];
    let state = if agent["standby"] == true {
        "STANDBY".to_owned()
    } else {
        state_of(types)
    };
    let (sent, acked) = versions(types);
    let mut row = vec![
        s(&agent["node"]),
        "(agent)".into(),
        "-".into(),
        s(&agent["zone"]),
        s(&agent["protocol"]),
        sent,
        acked,
        state,
        duration(&agent["connected_for_ms"]),
        "-".into(),
    ];
    if wide {
        row.extend([
            type_versions(types),
            s(&agent["identity"]),
            last_nack(types),
        ]);
    }
    row
}

/// A node's sidecars, as its report says (durations brought up to now by the API).
fn sidecar_rows(node: &str, report: &Value, wide: bool) -> Vec<Vec<String>> {
    let mut clients: Vec<&Value> = report["sidecars"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    clients.sort_by_key(|c| s(&c["client"]));
    let mut rows: Vec<Vec<String>> = clients
        .into_iter()
        .map(|c| {
            let (sent, acked) = versions(&c["types"]);
            let mut row = vec![
                node.to_owned(),
                s(&c["client"]),
                s(&c["cluster"]),
                s(&c["zone"]),
                s(&c["protocol"]),
                sent,
                acked,
                s(&c["state"]),
                duration(&c["connected_for_ms"]),
                duration(&report["view_age_ms"]),
            ];
            if wide {
                row.extend([
                    type_versions(&c["types"]),
                    s(&c["identity"]),
                    last_nack(&c["types"]),
                ]);
            }
            row
        })
        .collect();
    if let Some(n) = report["clients_left_out"].as_u64().filter(|n| *n > 0) {
        let mut row = vec![node.to_owned(), format!("(+{n} not reported)")];
        row.extend(std::iter::repeat_n(
            "-".to_owned(),
            if wide { 11 } else { 8 },
        ));
        rows.push(row);
    }
    rows
}

/// `SYNCED`, `NACK` or `STALE` from an agent's per-type state.
fn state_of(types: &Value) -> String {
    let all: Vec<&Value> = types
        .as_object()
        .into_iter()
        .flatten()
        .map(|(_, t)| t)
        .collect();
    let rejected = all.iter().any(|t| {
        t["in_sync"] == false && !t["last_nack"].is_null() && t["last_nack"]["version"] == t["sent"]
    });
    if rejected {
        "NACK".into()
    } else if all.iter().all(|t| t["in_sync"] != false) {
        "SYNCED".into()
    } else {
        "STALE".into()
    }
}

/// The endpoints' versions (what routing follows), else the first type's.
fn versions(types: &Value) -> (String, String) {
    let t = if types["ClusterLoadAssignment"].is_object() {
        &types["ClusterLoadAssignment"]
    } else {
        types
            .as_object()
            .and_then(|m| m.values().next())
            .unwrap_or(&Value::Null)
    };
    (s(&t["sent"]), s(&t["acked"]))
}

/// `CDS 3/3 EDS 14/12`.
fn type_versions(types: &Value) -> String {
    TYPES
        .iter()
        .filter(|(name, _)| types[*name].is_object())
        .map(|(name, short)| {
            let t = &types[*name];
            format!("{short} {}/{}", s(&t["sent"]), s(&t["acked"]))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last NACK's error, of any type.
fn last_nack(types: &Value) -> String {
    types
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(_, t)| t["last_nack"]["error"].as_str())
        .next()
        .unwrap_or("-")
        .to_owned()
}

/// A client's configuration: a head, its clusters, then every endpoint.
pub fn config_table(doc: &Value, wide: bool) -> String {
    let mut out = format!(
        "client {} on node {}: cluster {}, zone {}, {}, {}; snapshot {}, view age {}\n",
        s(&doc["client"]),
        s(&doc["node"]),
        s(&doc["cluster"]),
        s(&doc["zone"]),
        s(&doc["protocol"]),
        s(&doc["state"]),
        s(&doc["snapshot_version"]),
        duration(&doc["view_age_ms"]),
    );
    let yes = |v: &Value| match v.as_bool() {
        Some(true) => "yes".to_owned(),
        Some(false) => "no".to_owned(),
        None => "-".to_owned(),
    };
    let mut clusters = Vec::new();
    let mut endpoints = Vec::new();
    for la in doc["endpoints"].as_array().into_iter().flatten() {
        let cluster = s(&la["cluster"]);
        let listed = la["endpoints"].as_array();
        clusters.push(vec![
            cluster.clone(),
            s(&la["version"]),
            s(&la["served_version"]),
            yes(&la["current"]),
            listed.map_or_else(|| s(&la["endpoints_left_out"]), |l| l.len().to_string()),
            if la["health_disregarded"] == true {
                "HEALTH DISREGARDED".into()
            } else {
                "-".into()
            },
        ]);
        for e in listed.into_iter().flatten() {
            let mut row = vec![
                cluster.clone(),
                s(&e["address"]),
                s(&e["instance"]),
                s(&e["zone"]),
                s(&e["priority"]),
                s(&e["weight"]),
                s(&e["health"]),
                s(&e["status"]),
                yes(&e["verified"]),
            ];
            if wide {
                row.extend([s(&e["verdict"]), yes(&e["health_disregarded"])]);
            }
            endpoints.push(row);
        }
    }
    out.push('\n');
    out.push_str(&table(
        &[
            "CLUSTER",
            "HELD",
            "SERVED",
            "CURRENT",
            "ENDPOINTS",
            "MARKERS",
        ],
        clusters,
    ));
    out.push('\n');
    let mut header = vec![
        "CLUSTER", "ADDRESS", "INSTANCE", "ZONE", "PRIORITY", "WEIGHT", "HEALTH", "STATUS",
        "VERIFIED",
    ];
    if wide {
        header.extend(["VERDICT", "DISREGARDED"]);
    }
    out.push_str(&table(&header, endpoints));
    if let Some(n) = doc["endpoints_left_out"].as_u64().filter(|n| *n > 0) {
        out.push_str(&format!("({n} endpoints left out: the answer's bound)\n"));
    }
    out
}

/// `850ms`, `12s`, `5m3s`, `2h4m`; `-` when absent.
fn duration(ms: &Value) -> String {
    let Some(ms) = ms.as_u64() else {
        return "-".into();
    };
    let secs = ms / 1000;
    match secs {
        0 => format!("{ms}ms"),
        1..60 => format!("{secs}s"),
        60..3600 => format!("{}m{}s", secs / 60, secs % 60),
        _ => format!("{}h{}m", secs / 3600, (secs % 3600) / 60),
    }
}

/// Percent-encodes everything but unreserved characters: a path segment.
fn segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn sidecars_are_listed_under_their_agent_and_nodes_elsewhere_last() {
        let agents = json!([{"node": "n1", "zone": "a", "protocol": "delta", "standby": false,
            "connected_for_ms": 65_000, "types": {"ClusterLoadAssignment": {"sent": "9", "acked": "9", "in_sync": true}}}]);
        let sidecars = json!({"nodes": [
            {"node": "n2", "session_open": true, "view_age_ms": 0, "clients_left_out": 0, "sidecars": []},
            {"node": "n1", "session_open": true, "view_age_ms": 1500, "clients_left_out": 3, "sidecars": [
                {"client": "envoy-1", "cluster": "web", "zone": "a", "protocol": "delta", "state": "NACK",
                 "connected_for_ms": 2_000, "types": {"ClusterLoadAssignment": {"sent": "9", "acked": "8", "in_sync": false,
                 "last_nack": {"version": "9", "error": "bad weight"}}}}]}]});
        let text = status_table(&agents, Some(&sidecars), false);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NODE"), "{text}");
        assert!(
            lines[1].starts_with("n1")
                && lines[1].contains("(agent)")
                && lines[1].contains("SYNCED")
                && lines[1].contains("1m5s"),
            "{text}"
        );
        assert!(
            lines[2].contains("envoy-1")
                && lines[2].contains("NACK")
                && lines[2].contains(" 9 ")
                && lines[2].contains("1s"),
            "{text}"
        );
        assert!(lines[3].contains("(+3 not reported)"), "{text}");
        assert!(
            lines[4].starts_with("n2") && lines[4].contains("ELSEWHERE"),
            "{text}"
        );
        let wide = status_table(&agents, Some(&sidecars), true);
        assert!(
            wide.contains("EDS 9/8") && wide.contains("bad weight"),
            "{wide}"
        );
    }

    #[test]
    fn a_config_lists_its_clusters_then_every_endpoint() {
        let doc = json!({"client": "envoy-1", "node": "n1", "cluster": "web", "zone": "a", "protocol": "delta",
            "state": "SYNCED", "snapshot_version": 9, "view_age_ms": 0, "endpoints_left_out": 0,
            "endpoints": [{"cluster": "web", "version": "9", "served_version": "9", "current": true, "health_disregarded": false,
                "endpoints": [{"address": "10.0.0.1:80", "instance": "web-1", "zone": "a", "priority": 0, "weight": 100,
                    "health": "HEALTHY", "status": "eligible", "verdict": "eligible", "verified": true, "health_disregarded": false}]}]});
        let text = config_table(&doc, false);
        assert!(text.starts_with("client envoy-1 on node n1"), "{text}");
        assert!(
            text.contains("10.0.0.1:80") && text.contains("HEALTHY") && text.contains("web-1"),
            "{text}"
        );
        assert_eq!(segment("sidecar~10.0.0.1~a/b"), "sidecar~10.0.0.1~a%2Fb");
        assert_eq!(duration(&json!(7_384_000)), "2h3m");
    }
}
