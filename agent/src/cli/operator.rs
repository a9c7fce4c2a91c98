//! `waymark operator snapshot save|restore` and `waymark operator raft transfer-leader`:
//! clients of `GET`/`PUT /v1/operator/snapshot` and `POST /v1/operator/raft/transfer-leader`;
//! and `waymark operator raft recover`, which speaks to no API: it rewrites a stopped
//! member's Raft files ([`crate::authority::raft::recover`]).
//!
//! `save` checks the answer's SHA-256 against its header before it writes anything, and
//! writes the file whole (a temporary file renamed over the target), so a file that exists
//! is a complete backup.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use http::Method;
use serde_json::json;

use super::commands::RecoverArgs;
use crate::api_client::ApiClient;
use crate::authority::config::ConfigFile;
use crate::authority::raft::Member;
use crate::authority::raft::backup::{
    self, BODY_MAX, SNAPSHOT_INDEX_HEADER, SNAPSHOT_SHA256_HEADER, SNAPSHOT_TERM_HEADER,
};
use crate::authority::raft::recover::{self, RAFT_DIR};

/// How long a backup or a restore of a large region may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a transfer may take: the leader's bounds and a margin.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(30);

/// `waymark operator snapshot save FILE`.
pub async fn save(api: &ApiClient, file: &Path) -> anyhow::Result<String> {
    let client = api
        .clone()
        .with_timeout(SNAPSHOT_TIMEOUT)
        .with_response_limit(BODY_MAX);
    let answer = client
        .send(Method::GET, "/v1/operator/snapshot", None)
        .await?;
    if !answer.status.is_success() {
        answer.json()?;
        bail!("{}", answer.status);
    }
    let header = |name: &str| {
        answer
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let stated = header(SNAPSHOT_SHA256_HEADER).context("the answer names no checksum")?;
    let computed = backup::sha256_hex(&answer.body);
    if stated != computed {
        bail!("the backup was damaged in transit: sha256 {computed}, the server said {stated}");
    }
    let temp = file.with_extension("partial");
    std::fs::write(&temp, &answer.body).with_context(|| format!("writing {}", temp.display()))?;
    std::fs::rename(&temp, file).with_context(|| format!("writing {}", file.display()))?;
    Ok(format!(
        "saved {} bytes to {} (index {}, term {}, sha256 {computed})\n",
        answer.body.len(),
        file.display(),
        header(SNAPSHOT_INDEX_HEADER).unwrap_or_else(|| "-".into()),
        header(SNAPSHOT_TERM_HEADER).unwrap_or_else(|| "-".into()),
    ))
}

/// `waymark operator snapshot restore FILE`.
pub async fn restore(api: &ApiClient, file: &Path) -> anyhow::Result<String> {
    let body = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let client = api.clone().with_timeout(SNAPSHOT_TIMEOUT);
    let answer = client
        .send_bytes(Method::PUT, "/v1/operator/snapshot", Some(body.into()))
        .await?
        .json()?;
    let r = &answer["restored"];
    Ok(format!(
        "restored {} (index {}, term {}) on every member\n",
        file.display(),
        r["index"],
        r["term"]
    ))
}

/// `waymark operator raft transfer-leader [--to ID]`.
pub async fn transfer_leader(api: &ApiClient, to: Option<u64>) -> anyhow::Result<String> {
    let body = json!({"to": to});
    // The leader holds writes for at most the catch-up bound plus the election bound.
    let client = api.clone().with_timeout(TRANSFER_TIMEOUT);
    let answer = client
        .send(
            Method::POST,
            "/v1/operator/raft/transfer-leader",
            Some(&body),
        )
        .await?
        .json()?;
    let t = &answer["transferred"];
    Ok(format!(
        "leadership moved from member {} to member {} (term {}, {} ms)\n",
        t["from"], t["leader"], t["term"], t["duration_ms"]
    ))
}

/// `waymark operator raft recover --config FILE | --data-dir DIR --id ID`, on the stopped
/// member: prints what was rewritten, or why nothing was.
pub async fn recover(args: &RecoverArgs) -> anyhow::Result<String> {
    let (dir, id, member) = match (&args.config, &args.data_dir, args.id) {
        (Some(path), _, _) => {
            let file = ConfigFile::load(path, std::env::vars())?;
            let a = &file.authority;
            // The addresses it will serve at, unless the ports are picked at start.
            let member = (a.http.port() != 0 && a.raft.port() != 0).then(|| Member {
                raft_addr: a.raft.to_string(),
                api_addr: a.http.to_string(),
            });
            (a.data_dir.join(RAFT_DIR), a.id, member)
        }
        (None, Some(dir), Some(id)) => (dir.join(RAFT_DIR), id, None),
        _ => bail!("name the member: --config FILE, or --data-dir DIR with --id ID"),
    };
    let done = tokio::task::spawn_blocking(move || recover::recover(&dir, id, member))
        .await
        .context("the recovery task")??;
    Ok(done.to_string())
}
