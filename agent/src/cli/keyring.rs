//! `waymark keyring list|install|use|remove`: clients of `GET`/`POST /v1/operator/keyring`,
//! the region's online gossip key rotation (docs/operations.md, "Rotating the gossip key").
//!
//! A key may come from `--key-file` instead of the command line, so it stays out of shell
//! history and process listings. `use` and `remove` also take the key's id, as `list`
//! prints it. A change that did not reach every pool member prints what it did and exits
//! non-zero, so a script does not go on to the next step.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use http::Method;
use serde_json::{Value, json};

use super::output::Output;
use crate::api_client::ApiClient;

/// How long an operation may take: the leader lists every member, then applies, each
/// bounded by its 5 s answer timeout; with a margin.
const KEYRING_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the key comes from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// Given on the command line.
    Text(String),
    /// Read from a file (its first line, trimmed).
    File(PathBuf),
}

impl KeySource {
    /// From `KEY` or `--key-file` (exactly one).
    pub fn of(key: Option<String>, file: Option<PathBuf>) -> anyhow::Result<Self> {
        match (key, file) {
            (Some(k), None) => Ok(Self::Text(k)),
            (None, Some(f)) => Ok(Self::File(f)),
            (Some(_), Some(_)) => bail!("give KEY or --key-file, not both"),
            (None, None) => bail!("name the key: KEY, or --key-file FILE"),
        }
    }

    fn read(&self) -> anyhow::Result<String> {
        match self {
            Self::Text(t) => Ok(t.trim().to_owned()),
            Self::File(path) => read_key_file(path),
        }
    }
}

/// `waymark keyring list`.
pub async fn list(api: &ApiClient, out: Output) -> anyhow::Result<String> {
    let client = api.clone().with_timeout(KEYRING_TIMEOUT);
    let report = client
        .send(Method::GET, "/v1/operator/keyring", None)
        .await?
        .json()?;
    render(&report, out)
}

/// `waymark keyring install|use|remove KEY`.
pub async fn change(
    api: &ApiClient,
    op: &str,
    key: &KeySource,
    force: bool,
    out: Output,
) -> anyhow::Result<String> {
    let body = json!({"op": op, "key": key.read()?, "force": force});
    let client = api.clone().with_timeout(KEYRING_TIMEOUT);
    let report = client
        .send(Method::POST, "/v1/operator/keyring", Some(&body))
        .await?
        .json()?;
    let text = render(&report, out)?;
    if report["complete"] != Value::Bool(true) {
        bail!(
            "{text}{op} reached {} of {} pool members; the others are listed above",
            report["answered"],
            report["total"]
        );
    }
    Ok(text)
}

/// The report as asked: JSON or YAML unchanged, else the counts per key and the members
/// that did not apply it (every member with `-o wide`).
fn render(report: &Value, out: Output) -> anyhow::Result<String> {
    if let Some(structured) = out.structured(report) {
        return structured;
    }
    let mut text = String::new();
    text.push_str(&format!(
        "{:<18} {:<10} {:<10}\n",
        "KEY ID", "HELD BY", "PRIMARY ON"
    ));
    for k in report["keys"].as_array().into_iter().flatten() {
        let of = &k["of"];
        text.push_str(&format!(
            "{:<18} {:<10} {:<10}\n",
            k["key_id"].as_str().unwrap_or("-"),
            format!("{}/{of}", k["held_by"]),
            format!("{}/{of}", k["primary_on"]),
        ));
    }
    let nodes: Vec<&Value> = report["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| out.wide() || !matches!(n["result"].as_str(), Some("applied" | "unchanged")))
        .collect();
    if !nodes.is_empty() {
        text.push('\n');
        text.push_str(&format!(
            "{:<24} {:<10} {:<10} {:<18} {}\n",
            "NODE", "KIND", "RESULT", "PRIMARY", "REASON"
        ));
        for n in nodes {
            let reason = match (n["reason"].as_str(), n["message"].as_str()) {
                (Some(r), Some(m)) => format!("{r}: {m}"),
                _ => format!("{} keys", n["keys"].as_array().map_or(0, Vec::len)),
            };
            text.push_str(&format!(
                "{:<24} {:<10} {:<10} {:<18} {reason}\n",
                n["name"].as_str().unwrap_or("-"),
                n["kind"].as_str().unwrap_or("-"),
                n["result"].as_str().unwrap_or("-"),
                n["primary"].as_str().unwrap_or("-"),
            ));
        }
    }
    Ok(text)
}

fn read_key_file(path: &Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let key = text.lines().next().unwrap_or_default().trim();
    if key.is_empty() {
        bail!("{} holds no key", path.display());
    }
    Ok(key.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_table_counts_each_key_and_names_the_members_that_did_not_apply() {
        // Goal: `keyring list` reads like Consul's: N/M hold a key, primary on P/M.
        let report = json!({
            "op": "list", "complete": false, "total": 3, "answered": 2,
            "keys": [{"key_id": "aaaaaaaaaaaaaaaa", "held_by": 2, "primary_on": 2, "of": 3}],
            "nodes": [
                {"name": "authority-1", "kind": "authority", "result": "unchanged", "primary": "aaaaaaaaaaaaaaaa", "keys": ["aaaaaaaaaaaaaaaa"]},
                {"name": "n1", "kind": "agent", "result": "unchanged", "primary": "aaaaaaaaaaaaaaaa", "keys": ["aaaaaaaaaaaaaaaa"]},
                {"name": "n2", "kind": "agent", "result": "failed", "reason": "timeout", "message": "no answer"},
            ],
        });
        let table = render(&report, Output::Table).unwrap();
        assert!(
            table.contains("aaaaaaaaaaaaaaaa   2/3        2/3"),
            "{table}"
        );
        assert!(
            table.contains("n2") && table.contains("timeout: no answer"),
            "{table}"
        );
        assert!(!table.contains("authority-1"), "{table}");
        let wide = render(&report, Output::Wide).unwrap();
        assert!(wide.contains("authority-1"), "{wide}");
        let json: Value = serde_json::from_str(&render(&report, Output::Json).unwrap()).unwrap();
        assert_eq!(json, report);
    }

    #[test]
    fn a_key_file_gives_its_first_line() {
        // Goal: the key need not appear on the command line.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, "  abcd  \nignored\n").unwrap();
        assert_eq!(
            KeySource::of(None, Some(path.clone()))
                .unwrap()
                .read()
                .unwrap(),
            "abcd"
        );
        std::fs::write(&path, "\n").unwrap();
        assert!(KeySource::File(path).read().is_err());
        assert!(KeySource::of(None, None).is_err());
    }
}
