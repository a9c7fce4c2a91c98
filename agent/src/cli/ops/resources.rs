//! `waymark instances`, `services get|apply|delete|view|validate`, `policy`, `zones`,
//! `external`, `alarms`, `status`: the registry's resources, read and written through the
//! API.

use std::path::Path;

use http::Method;
use serde_json::{Value, json};
use waymark_core::contract::HealthContract;

use super::{encode, s, table, with_query};
use crate::api_client::ApiClient;
use crate::cli::commands::InstanceFilter;
use crate::cli::output::{Output, read_document};

/// `host:port` of an `{ip, port}` address.
fn address(v: &Value) -> String {
    match (v["ip"].as_str(), v["port"].as_u64()) {
        (Some(ip), Some(port)) if ip.contains(':') => format!("[{ip}]:{port}"),
        (Some(ip), Some(port)) => format!("{ip}:{port}"),
        _ => s(v),
    }
}

/// `waymark instances [list]`.
pub async fn instances(
    api: &ApiClient,
    filter: &InstanceFilter,
    out: Output,
) -> anyhow::Result<String> {
    let path = with_query("/v1/instances", &[("service", filter.service.as_deref())]);
    let list = api.get_json(&path).await?;
    if let Some(printed) = out.structured(&list) {
        return printed;
    }
    let mut header = vec![
        "ID", "SERVICE", "ADDRESS", "ZONE", "NODE", "ORIGIN", "STATE",
    ];
    if out.wide() {
        header.extend(["REGION", "WEIGHT", "LEASE_MS", "TAGS"]);
    }
    let rows = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let i = &r["instance"];
            let state = if let Some(reason) = r["maintenance"].as_str() {
                format!("maintenance ({reason})")
            } else if r["draining"].as_bool() == Some(true) {
                "draining".to_owned()
            } else {
                "-".to_owned()
            };
            let mut row = vec![
                s(&i["id"]),
                s(&i["service"]),
                address(&i["address"]),
                s(&i["locality"]["zone"]),
                s(&i["locality"]["node"]),
                s(&i["origin"]),
                state,
            ];
            if out.wide() {
                let tags: Vec<String> = i["tags"].as_array().into_iter().flatten().map(s).collect();
                row.extend([
                    s(&i["locality"]["region"]),
                    s(&i["weight"]),
                    s(&r["lease_ms"]),
                    if tags.is_empty() {
                        "-".into()
                    } else {
                        tags.join(",")
                    },
                ]);
            }
            row
        })
        .collect();
    Ok(table(&header, rows))
}

/// `waymark instances register -f FILE`.
pub async fn register(api: &ApiClient, file: &Path, out: Output) -> anyhow::Result<String> {
    let body = read_document(file, "the registration")?;
    let r = api
        .send(Method::POST, "/v1/instances", Some(&body))
        .await?
        .json()?;
    if let Some(printed) = out.structured(&r) {
        return printed;
    }
    Ok(format!(
        "registered {} (lease ends at {} ms)\n",
        s(&r["instance"]),
        s(&r["expires_at_ms"])
    ))
}

/// `waymark instances deregister ID`.
pub async fn deregister(api: &ApiClient, instance: &str) -> anyhow::Result<String> {
    let path = format!("/v1/instances/{}", encode(instance));
    api.send(Method::DELETE, &path, None).await?.json()?;
    Ok(format!("deregistered {instance}\n"))
}

/// `waymark instances renew ID`.
pub async fn renew(api: &ApiClient, instance: &str, out: Output) -> anyhow::Result<String> {
    let path = format!("/v1/instances/{}/renew", encode(instance));
    let r = api.send(Method::PUT, &path, None).await?.json()?;
    if let Some(printed) = out.structured(&r) {
        return printed;
    }
    Ok(format!(
        "renewed {instance} (lease ends at {} ms)\n",
        s(&r["expires_at_ms"])
    ))
}

/// `waymark services get NAME`.
pub async fn service(api: &ApiClient, service: &str, out: Output) -> anyhow::Result<String> {
    let r = api
        .get_json(&format!("/v1/services/{}", encode(service)))
        .await?;
    if let Some(printed) = out.structured(&r) {
        return printed;
    }
    // A contract is a document, not a row: the table form prints it as YAML, the way an
    // operator writes it for `services apply`.
    Output::Yaml.document(&r)
}

/// The service a `services apply` file names, and the body its route takes.
fn service_body(doc: &Value) -> anyhow::Result<(String, Value)> {
    let name = doc["service"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| anyhow::anyhow!("the file names no `service`"))?
        .to_owned();
    let mut body = doc.clone();
    if let Some(fields) = body.as_object_mut() {
        fields.remove("service");
    }
    Ok((name, body))
}

/// `waymark services apply -f FILE`.
pub async fn apply_service(api: &ApiClient, file: &Path) -> anyhow::Result<String> {
    let doc = read_document(file, "the service")?;
    let (name, body) = service_body(&doc)?;
    api.send(
        Method::PUT,
        &format!("/v1/services/{}", encode(&name)),
        Some(&body),
    )
    .await?
    .json()?;
    Ok(format!("service {name} applied\n"))
}

/// `waymark services delete NAME`.
pub async fn delete_service(api: &ApiClient, service: &str) -> anyhow::Result<String> {
    let path = format!("/v1/services/{}", encode(service));
    let r = api.send(Method::DELETE, &path, None).await?;
    if !r.status.is_success() {
        r.json()?;
    }
    Ok(format!("service {service} removed\n"))
}

/// `waymark services view NAME`: one row per endpoint of each zone's view.
pub async fn view(api: &ApiClient, service: &str, out: Output) -> anyhow::Result<String> {
    let views = api
        .get_json(&format!("/v1/services/{}/view", encode(service)))
        .await?;
    if let Some(printed) = out.structured(&views) {
        return printed;
    }
    let mut header = vec![
        "ZONE", "VERSION", "INSTANCE", "ADDRESS", "VERDICT", "WEIGHT",
    ];
    if out.wide() {
        header.extend(["REGION", "TIER", "EVIDENCE", "VERIFIED"]);
    }
    let mut rows = Vec::new();
    for v in views.as_array().into_iter().flatten() {
        let endpoints = v["view"]["endpoints"]
            .as_object()
            .map(|m| m.values().cloned().collect::<Vec<_>>())
            .or_else(|| v["view"]["endpoints"].as_array().cloned())
            .unwrap_or_default();
        for e in endpoints {
            let mut row = vec![
                s(&v["view"]["key"]["zone"]),
                s(&v["version"]),
                s(&e["instance"]),
                address(&e["address"]),
                s(&e["verdict"]),
                s(&e["weight"]),
            ];
            if out.wide() {
                row.extend([
                    s(&e["region"]),
                    s(&e["tier"]),
                    s(&e["capability"]["evidence"]),
                    s(&e["capability"]["verified"]),
                ]);
            }
            rows.push(row);
        }
    }
    Ok(table(&header, rows))
}

/// `waymark services validate -f FILE [--remote]`: a service file or a bare contract,
/// checked here with the authority's own validation, or by the authority.
pub async fn validate(api: Option<&ApiClient>, file: &Path) -> anyhow::Result<String> {
    let doc = read_document(file, "the contract")?;
    let contract = if doc.get("contract").is_some() {
        doc["contract"].clone()
    } else {
        doc
    };
    match api {
        Some(api) => {
            api.send(
                Method::POST,
                "/v1/contracts/validate",
                Some(&json!({"contract": contract})),
            )
            .await?
            .json()?;
            Ok("valid (checked by the authority)\n".to_owned())
        }
        None => {
            let parsed: HealthContract =
                serde_json::from_value(contract).map_err(|e| anyhow::anyhow!("contract: {e}"))?;
            parsed
                .validate()
                .map_err(|e| anyhow::anyhow!("contract.{}: {e}", e.field()))?;
            Ok("valid\n".to_owned())
        }
    }
}

/// `waymark policy get NAME`.
pub async fn policy(api: &ApiClient, service: &str, out: Output) -> anyhow::Result<String> {
    let r = api
        .get_json(&format!("/v1/services/{}/policy", encode(service)))
        .await?;
    if let Some(printed) = out.structured(&r) {
        return printed;
    }
    Output::Yaml.document(&r)
}

/// `waymark policy set NAME -f FILE`.
pub async fn set_policy(api: &ApiClient, service: &str, file: &Path) -> anyhow::Result<String> {
    let body = read_document(file, "the policy")?;
    api.send(
        Method::PUT,
        &format!("/v1/services/{}/policy", encode(service)),
        Some(&body),
    )
    .await?
    .json()?;
    Ok(format!("policy of {service} applied\n"))
}

/// `waymark zones [list]`.
pub async fn zones(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let r = api.get_json("/v1/zones").await?;
    if let Some(printed) = out.structured(&r) {
        return printed;
    }
    let rows = r["evacuations"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(zone, e)| {
            let detail = match e {
                Value::Object(fields) => fields
                    .iter()
                    .map(|(k, v)| format!("{k}={}", s(v)))
                    .collect::<Vec<_>>()
                    .join(" "),
                other => s(other),
            };
            vec![zone.clone(), detail]
        })
        .collect();
    Ok(table(&["ZONE", "EVACUATION"], rows))
}

/// `waymark zones evacuate|shift-back|complete-shift-back ZONE`.
pub async fn evacuation(api: &ApiClient, zone: &str, intent: Value) -> anyhow::Result<String> {
    let path = format!("/v1/zones/{}/evacuation", encode(zone));
    api.send(Method::POST, &path, Some(&intent)).await?.json()?;
    Ok(format!(
        "{} of zone {zone}: committed\n",
        s(&intent["action"])
    ))
}

/// `waymark external declare -f FILE`.
pub async fn declare_external(api: &ApiClient, file: &Path, out: Output) -> anyhow::Result<String> {
    let body = read_document(file, "the declaration")?;
    let r = api
        .send(Method::POST, "/v1/external", Some(&body))
        .await?
        .json()?;
    if let Some(printed) = out.structured(&r) {
        return printed;
    }
    Ok(format!("declared {}\n", s(&r["instance"])))
}

/// `waymark external remove ID`.
pub async fn remove_external(api: &ApiClient, id: &str) -> anyhow::Result<String> {
    let path = format!("/v1/external/{}", encode(id));
    let r = api.send(Method::DELETE, &path, None).await?;
    if !r.status.is_success() {
        r.json()?;
    }
    Ok(format!("removed {id}\n"))
}

/// `waymark alarms`.
pub async fn alarms(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let list = api.get_json("/v1/alarms").await?;
    if let Some(printed) = out.structured(&list) {
        return printed;
    }
    let rows = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            vec![
                s(&a["service"]),
                s(&a["alarm"]),
                s(&a["zone"]),
                s(&a["since_ms"]),
                s(&a["seq"]),
            ]
        })
        .collect();
    Ok(table(
        &["SERVICE", "ALARM", "ZONE", "SINCE_MS", "SEQ"],
        rows,
    ))
}

/// `waymark status`.
pub async fn status(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let r = api.get_json("/v1/status").await?;
    if let Some(printed) = out.structured(&r) {
        return printed;
    }
    let leader = match (&r["leader"]["id"], &r["leader"]["api"]) {
        (Value::Null, _) => "none".to_owned(),
        (id, api) => format!("{} ({})", s(id), s(api)),
    };
    Ok(format!(
        "region     {}\nleader     {leader}\nthis one   {}\nterm       {}\n",
        s(&r["region"]),
        if r["is_leader"].as_bool() == Some(true) {
            "leader"
        } else {
            "follower"
        },
        s(&r["term"]),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_queries_are_written_as_callers_dial_and_servers_read_them() {
        assert_eq!(
            address(&json!({"ip": "10.0.0.1", "port": 80})),
            "10.0.0.1:80"
        );
        assert_eq!(address(&json!({"ip": "::1", "port": 80})), "[::1]:80");
        assert_eq!(
            with_query(
                "/v1/instances",
                &[("service", Some("a b&c")), ("zone", None)]
            ),
            "/v1/instances?service=a%20b%26c"
        );
        assert_eq!(
            with_query("/v1/instances", &[("service", None)]),
            "/v1/instances"
        );
    }

    #[test]
    fn a_service_file_names_its_service_and_the_body_leaves_it_out() {
        let (name, body) =
            service_body(&json!({"service": "web", "owner": "t", "contract": {}})).unwrap();
        assert_eq!(name, "web");
        assert_eq!(body, json!({"owner": "t", "contract": {}}));
        let e = service_body(&json!({"owner": "t"})).unwrap_err();
        assert!(e.to_string().contains("names no `service`"), "{e}");
    }
}
