//! `waymark acl …`: who you are, grants and tokens.

use std::time::Duration;

use http::Method;
use serde_json::{Value, json};

use super::{s, table};
use crate::api_client::ApiClient;
use crate::cli::output::Output;

/// `waymark acl whoami`.
pub async fn whoami(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let me = api.get_json("/v1/acl/whoami").await?;
    if let Some(printed) = out.structured(&me) {
        return printed;
    }
    let grants: Vec<String> = me["grants"]
        .as_array()
        .map(|g| g.iter().map(|g| s(&g["can"])).collect())
        .unwrap_or_default();
    Ok(format!(
        "principal  {}\ncredential {}\ngrants     {}\n",
        s(&me["principal"]),
        s(&me["credential"]),
        if grants.is_empty() {
            "(none)".to_owned()
        } else {
            grants.join(", ")
        }
    ))
}

/// `waymark acl bootstrap`.
pub async fn bootstrap(api: &ApiClient) -> anyhow::Result<String> {
    let r = api
        .send(Method::POST, "/v1/acl/bootstrap", None)
        .await?
        .json()?;
    let grants = r["applied"]["grants"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut out = String::from("bootstrapped; grants created:\n");
    for g in grants {
        out.push_str(&format!("  {} {}\n", s(&g["to"]), s(&g["can"])));
    }
    Ok(out)
}

/// `waymark acl grants`.
pub async fn grants(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let r = api.get_json("/v1/acl/grants").await?;
    if let Some(printed) = out.structured(&r) {
        return printed;
    }
    let rows = r["grants"]
        .as_array()
        .map(|g| g.iter().map(|g| vec![s(&g["to"]), s(&g["can"])]).collect())
        .unwrap_or_default();
    Ok(table(&["TO", "CAN"], rows))
}

/// `waymark acl grant` (or `revoke` when `add` is false).
pub async fn grant(api: &ApiClient, to: &str, can: &str, add: bool) -> anyhow::Result<String> {
    let path = if add {
        "/v1/acl/grants"
    } else {
        "/v1/acl/grants/revoke"
    };
    api.send(Method::POST, path, Some(&json!({"to": to, "can": can})))
        .await?
        .json()?;
    Ok(format!(
        "{} {to} {can}\n",
        if add { "granted" } else { "revoked" }
    ))
}

/// `waymark acl tokens`.
pub async fn tokens(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let list = api.get_json("/v1/acl/tokens").await?;
    if let Some(printed) = out.structured(&list) {
        return printed;
    }
    let rows = list
        .as_array()
        .map(|l| {
            l.iter()
                .map(|t| {
                    vec![
                        s(&t["name"]),
                        s(&t["created_by"]),
                        s(&t["expires_at_ms"]),
                        if t["expired"] == Value::Bool(true) {
                            "expired".into()
                        } else {
                            "live".into()
                        },
                        s(&t["description"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(table(
        &[
            "NAME",
            "CREATED BY",
            "EXPIRES AT (ms)",
            "STATE",
            "DESCRIPTION",
        ],
        rows,
    ))
}

/// `waymark acl token-create`: prints the bearer token once.
pub async fn token_create(
    api: &ApiClient,
    name: &str,
    ttl: Duration,
    description: &str,
    grants: &[String],
) -> anyhow::Result<String> {
    let body = json!({
        "name": name,
        "ttl_s": ttl.as_secs(),
        "description": description,
        "grants": grants,
    });
    let r = api
        .send(Method::POST, "/v1/acl/tokens", Some(&body))
        .await?
        .json()?;
    Ok(format!(
        "{}\n(shown once; keep it like a password. `export WAYMARK_TOKEN=...` to use it)\n",
        s(&r["token"])
    ))
}

/// `waymark acl token-delete`.
pub async fn token_delete(api: &ApiClient, name: &str) -> anyhow::Result<String> {
    api.send(Method::DELETE, &format!("/v1/acl/tokens/{name}"), None)
        .await?
        .json()?;
    Ok(format!("removed token {name} and its grants\n"))
}
