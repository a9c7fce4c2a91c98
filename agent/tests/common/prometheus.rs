//! The real Prometheus server (Debian's `prometheus`) as a test peer, judged only through its
//! own HTTP API.
//!
//! The binary is `PROMETHEUS_BIN`, else `prometheus` on the `PATH` (`./scripts/test`
//! installs Debian's `prometheus`). Without it a test fails saying how to install it, unless
//! `WAYMARK_SKIP_PROMETHEUS=1` asks it to skip.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::support;

/// The Prometheus server, or `None` when it is absent and `WAYMARK_SKIP_PROMETHEUS=1`.
pub fn bin(test: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PROMETHEUS_BIN").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        // A wrong PROMETHEUS_BIN is an error, not a reason to quietly use another binary.
        assert!(
            path.is_file(),
            "PROMETHEUS_BIN={} is not a file",
            path.display()
        );
        return Some(path);
    }
    let on_path = on_path("prometheus");
    if on_path.is_none() && std::env::var("WAYMARK_SKIP_PROMETHEUS").as_deref() == Ok("1") {
        eprintln!(
            "{test}: SKIPPED — no Prometheus server (PROMETHEUS_BIN unset, none on PATH) \
             and WAYMARK_SKIP_PROMETHEUS=1"
        );
        return None;
    }
    Some(on_path.unwrap_or_else(|| {
        panic!(
            "this test needs the Prometheus server and none was found (PROMETHEUS_BIN is not \
             set and there is no `prometheus` on PATH). Install Debian's `prometheus` \
             (`./scripts/test` does: apt-get install prometheus), or point PROMETHEUS_BIN at \
             one; WAYMARK_SKIP_PROMETHEUS=1 skips this test instead"
        )
    }))
}

/// `name` in a directory of the `PATH`.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// A running Prometheus; killed on drop, its log printed if the test failed.
pub struct Prometheus {
    child: Child,
    log: PathBuf,
    web: SocketAddr,
}

impl Prometheus {
    /// Starts `bin` with `config` written to `dir/prometheus.yml` (relative paths in it,
    /// such as `rule_files`, are read from `dir`).
    pub fn start(bin: &Path, dir: &Path, config: &str) -> Self {
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let web = format!("127.0.0.1:{}", super::free_port()).parse().unwrap();
        let log = dir.join("prometheus.log");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self { child, log, web }
    }

    /// `GET path` of its API, parsed; an error while it does not answer yet.
    async fn api(&self, path: &str) -> Result<Value, String> {
        let r = support::http::get(self.web, path)
            .await
            .map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&r.body).map_err(|e| format!("{e}: {}", r.body))?;
        Ok(v)
    }

    /// Its active targets of scrape pool `pool` (`/api/v1/targets`), once it answers.
    pub async fn targets(&self, pool: &str) -> Result<Vec<Value>, String> {
        let v = self.api("/api/v1/targets?state=active").await?;
        let targets = v["data"]["activeTargets"]
            .as_array()
            .ok_or_else(|| v.to_string())?;
        Ok(targets
            .iter()
            .filter(|t| t["scrapePool"] == pool)
            .cloned()
            .collect())
    }

    /// Whether every target of `pool` has been scraped successfully (and there is one).
    pub async fn pool_up(&self, pool: &str) -> bool {
        match self.targets(pool).await {
            Ok(t) => !t.is_empty() && t.iter().all(|t| t["health"] == "up"),
            Err(_) => false,
        }
    }

    /// An instant query: `Ok(result)` or Prometheus's error for it.
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let v = self
            .api(&format!("/api/v1/query?query={}", encode(expr)))
            .await?;
        if v["status"] != "success" {
            return Err(format!("{}: {}", v["errorType"], v["error"]));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Every metric name it holds a series of.
    pub async fn names(&self) -> Result<Vec<String>, String> {
        let v = self.api("/api/v1/label/__name__/values").await?;
        Ok(v["data"]
            .as_array()
            .ok_or_else(|| v.to_string())?
            .iter()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect())
    }

    /// Its alerts (`/api/v1/alerts`): each with `labels` and `state`.
    pub async fn alerts(&self) -> Result<Vec<Value>, String> {
        let v = self.api("/api/v1/alerts").await?;
        Ok(v["data"]["alerts"].as_array().cloned().unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- prometheus log ---\n{log}");
        }
    }
}

/// Percent-encodes a query parameter's value (every byte but the unreserved ones).
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
