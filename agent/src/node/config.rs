//! The node agent's configuration: a TOML file, then environment variables, then flags
//! (each later source wins), checked as a whole before anything starts. Durations are
//! strings in the one grammar of [`waymark_core::duration_str`] (`"30s"`, `"250ms"`,
//! `"1m30s"`; docs/configuration.md, "Durations"). `waymark agent --config FILE --print-config` prints
//! the effective result, durations in their canonical form.
//!
//! Environment overrides use the `WAYMARK_AGENT_` prefix and the key's path in capitals:
//! `WAYMARK_AGENT_NAME`, `WAYMARK_AGENT_ZONE`, `WAYMARK_AGENT_DATA_DIR`,
//! `WAYMARK_AGENT_UPSTREAM` (comma-separated), `WAYMARK_AGENT_LISTEN_XDS`,
//! `WAYMARK_AGENT_LISTEN_DNS`, `WAYMARK_AGENT_LISTEN_HTTP`,
//! `WAYMARK_AGENT_LISTEN_HTTP_TOKENS_FILE`, `WAYMARK_AGENT_GOSSIP_BIND`,
//! `WAYMARK_AGENT_GOSSIP_KEYS` (comma-separated; whitespace around each is dropped, as a
//! key read from a mounted secret ends in a newline). `WAYMARK_AGENT_CONFIG` and
//! `WAYMARK_AGENT_API` belong to the command line and are left alone; any other
//! `WAYMARK_AGENT_*` is refused by name.
//!
//! Beside `[agent]`, `[log]` (`level`, a tracing filter; `format`, `text` or `json`) sets the
//! log; `--log-level`, `--log-format` and their environment variables override it
//! ([`crate::logging`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark_core::model::{NodeName, RegionName, ZoneName};

use super::probe::Cidr;
use crate::logging::LogSection;
use crate::net::HostPort;

/// The file's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentFile {
    /// The node agent role.
    pub agent: AgentConfig,
    /// `[log]`: the log's filter and format (`crate::logging`); flags and the environment
    /// override it.
    #[serde(default, skip_serializing_if = "is_unset")]
    pub log: LogSection,
}

fn is_unset(log: &LogSection) -> bool {
    log == &LogSection::default()
}

/// `[agent]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// This node's name (its identity is `spiffe://<td>/region/<region>/node/<name>`).
    pub name: NodeName,
    /// Its region.
    pub region: RegionName,
    /// Its zone.
    pub zone: ZoneName,
    /// Where the last-known-good cache (sled) lives.
    pub data_dir: PathBuf,
    /// Authority members' xDS listeners; any one will do (jittered reconnect).
    pub upstream: Vec<String>,
    /// With more than one `upstream`, hold an idle standby stream at a second member, so
    /// that when the member serving this agent dies its next stream opens at once beside
    /// the standby instead of queueing behind the survivors' reconnection admission
    /// (default true; it costs each member one idle stream per agent it stands by for).
    #[serde(default = "default_upstream_standby")]
    pub upstream_standby: bool,
    /// Authority members' evidence-ingest listeners.
    #[serde(default)]
    pub ingest: Vec<String>,
    /// Authority members' HTTP API (for the registrations of `services_dir`).
    #[serde(default)]
    pub api: Vec<String>,
    /// A bearer token the registrations of `services_dir` present to the API, read at
    /// start (a grant of `register:<this node>` is all it needs). For an API served
    /// without TLS, on loopback; over mutual TLS the agent's node certificate is its
    /// credential and the region's grants for `node/*` apply.
    #[serde(default)]
    pub api_token_file: Option<PathBuf>,
    /// Local listeners.
    #[serde(default)]
    pub listen: Listen,
    /// Client-side bounds applied before serving.
    #[serde(default)]
    pub bounds: Bounds,
    /// Folder of service definitions for runtimes nothing watches (registered with a lease,
    /// renewed, deregistered on SIGTERM).
    #[serde(default)]
    pub services_dir: Option<PathBuf>,
    /// The region's gossip pool.
    #[serde(default)]
    pub gossip: Option<Gossip>,
    /// Mutual TLS material.
    #[serde(default)]
    pub tls: Option<Tls>,
    /// The prober's address policy.
    #[serde(default)]
    pub probe: ProbeSection,
}

impl AgentConfig {
    /// Node `name` in `region`/`zone` subscribing to `upstream`, with every optional section
    /// absent and every default filled in: what a file naming only the required keys says.
    /// Tests and drills build their files from this and [`AgentFile::to_toml`].
    pub fn new(
        name: NodeName,
        region: RegionName,
        zone: ZoneName,
        data_dir: PathBuf,
        upstream: Vec<String>,
    ) -> Self {
        Self {
            name,
            region,
            zone,
            data_dir,
            upstream,
            upstream_standby: true,
            ingest: Vec::new(),
            api: Vec::new(),
            api_token_file: None,
            listen: Listen::default(),
            bounds: Bounds::default(),
            services_dir: None,
            gossip: None,
            tls: None,
            probe: ProbeSection::default(),
        }
    }
}

/// `[agent.probe]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeSection {
    /// Address ranges the prober may connect to although they are loopback, link-local,
    /// unspecified, multicast or broadcast (`"127.0.0.0/8"`). A cloud metadata address is
    /// allowed only by an entry naming exactly it (`"169.254.169.254/32"`). Empty (the
    /// default): none of them is ever probed.
    pub allow_cidrs: Vec<Cidr>,
}

/// `[agent.listen]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Listen {
    /// xDS and LRS for the host's sidecars.
    pub xds: SocketAddr,
    /// DNS (UDP and TCP).
    pub dns: SocketAddr,
    /// The local HTTP API, `/livez`, `/readyz`, `/metrics`, `/v1/*`. Off loopback it is
    /// served over TLS with the node's certificate, and `http_tokens_file` is required.
    pub http: SocketAddr,
    /// Bearer tokens that may read the local HTTP API (`/metrics`, `/v1/*`; `/livez` and
    /// `/readyz` answer anyone), one per line, `#` comments allowed, reread when the file
    /// changes (rotate by adding the new token, moving readers over, removing the old).
    /// Required when `http` is off loopback; on loopback, unset leaves the API to the
    /// host's own processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_tokens_file: Option<PathBuf>,
    /// Serve the host's sidecars in plain text even with `[agent.tls]` (loopback
    /// development only; upstream stays mutual TLS).
    pub local_plaintext: bool,
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            xds: SocketAddr::from(([127, 0, 0, 1], 18000)),
            dns: SocketAddr::from(([127, 0, 0, 1], 8600)),
            http: SocketAddr::from(([127, 0, 0, 1], 8400)),
            http_tokens_file: None,
            local_plaintext: false,
        }
    }
}

/// `[agent.bounds]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Bounds {
    /// Share of a service's endpoints that may be removed per window, in permille.
    pub shrink_max_permille: u16,
    /// The window.
    #[serde(with = "waymark_core::duration_str")]
    pub shrink_window: Duration,
    /// Envoy's `max_ejection_percent` in the served clusters.
    pub max_ejection_percent: u8,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            shrink_max_permille: 300,
            shrink_window: Duration::from_secs(10),
            max_ejection_percent: 30,
        }
    }
}

/// `[agent.gossip]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gossip {
    /// UDP address to bind and advertise.
    pub bind: SocketAddr,
    /// Members to join through, `host:port` (IP or DNS name; a name may stand for several
    /// members, as a headless Service's does), resolved at each join attempt.
    #[serde(default)]
    pub seeds: Vec<HostPort>,
    /// Region keys (hex or base64); the first seals, every one opens.
    pub keys: Vec<String>,
}

/// `[agent.tls]`: the same files as the authority's.
pub use crate::tls::TlsSection as Tls;

/// Flag overrides (the last source).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--name`.
    pub name: Option<String>,
    /// `--zone`.
    pub zone: Option<String>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--upstream` (repeatable).
    pub upstream: Vec<String>,
}

/// Why a configuration was refused; the message names the key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not TOML of the expected shape.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong (names the key).
        message: String,
    },
    /// A value is wrong.
    #[error("{key}: {message}")]
    Invalid {
        /// The key (or environment variable).
        key: String,
        /// What is wrong.
        message: String,
    },
}

impl AgentFile {
    /// A file holding `agent`, with no `[log]`.
    pub fn new(agent: AgentConfig) -> Self {
        Self {
            agent,
            log: LogSection::default(),
        }
    }

    /// Read `path`, apply `env` (e.g. `std::env::vars()`), then `flags`, and check.
    pub fn load(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &Overrides,
    ) -> Result<Self, AgentConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| AgentConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, env, flags).map_err(|e| match e {
            AgentConfigError::Parse { message, .. } => AgentConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })
    }

    /// Parse TOML text, apply `env`, then `flags`, and check.
    pub fn parse(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &Overrides,
    ) -> Result<Self, AgentConfigError> {
        let mut file: Self = toml::from_str(text).map_err(|e| AgentConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        file.apply_env(env)?;
        file.apply_flags(flags)?;
        file.check()?;
        Ok(file)
    }

    fn apply_env(
        &mut self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), AgentConfigError> {
        let vars: BTreeMap<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("WAYMARK_AGENT_"))
            .collect();
        let a = &mut self.agent;
        for (key, value) in &vars {
            let bad = |message: String| AgentConfigError::Invalid {
                key: key.clone(),
                message,
            };
            match key.as_str() {
                "WAYMARK_AGENT_NAME" => a.name = value.parse().map_err(|e| bad(format!("{e}")))?,
                "WAYMARK_AGENT_ZONE" => a.zone = value.parse().map_err(|e| bad(format!("{e}")))?,
                "WAYMARK_AGENT_DATA_DIR" => a.data_dir = PathBuf::from(value),
                "WAYMARK_AGENT_UPSTREAM" => {
                    a.upstream = value.split(',').map(|s| s.trim().to_owned()).collect();
                }
                "WAYMARK_AGENT_LISTEN_XDS" => {
                    a.listen.xds = value.parse().map_err(|e| bad(format!("{e}")))?;
                }
                "WAYMARK_AGENT_LISTEN_DNS" => {
                    a.listen.dns = value.parse().map_err(|e| bad(format!("{e}")))?;
                }
                "WAYMARK_AGENT_LISTEN_HTTP" => {
                    a.listen.http = value.parse().map_err(|e| bad(format!("{e}")))?;
                }
                "WAYMARK_AGENT_LISTEN_HTTP_TOKENS_FILE" => {
                    a.listen.http_tokens_file = Some(PathBuf::from(value));
                }
                "WAYMARK_AGENT_GOSSIP_BIND" => {
                    let bind = value.parse().map_err(|e| bad(format!("{e}")))?;
                    gossip_section(a).bind = bind;
                }
                "WAYMARK_AGENT_GOSSIP_KEYS" => {
                    // Often read from a mounted secret: surrounding whitespace is not key.
                    gossip_section(a).keys = value
                        .split(',')
                        .map(str::trim)
                        .filter(|k| !k.is_empty())
                        .map(str::to_owned)
                        .collect();
                }
                // The command line's own variables (`--config`, `waymark members --agent`).
                "WAYMARK_AGENT_CONFIG" | "WAYMARK_AGENT_API" => {}
                _ => return Err(bad("not a setting the agent knows".into())),
            }
        }
        Ok(())
    }

    fn apply_flags(&mut self, flags: &Overrides) -> Result<(), AgentConfigError> {
        let a = &mut self.agent;
        let bad = |key: &str, e: String| AgentConfigError::Invalid {
            key: key.to_owned(),
            message: e,
        };
        if let Some(n) = &flags.name {
            a.name = n.parse().map_err(|e| bad("--name", format!("{e}")))?;
        }
        if let Some(z) = &flags.zone {
            a.zone = z.parse().map_err(|e| bad("--zone", format!("{e}")))?;
        }
        if let Some(d) = &flags.data_dir {
            a.data_dir = d.clone();
        }
        if !flags.upstream.is_empty() {
            a.upstream = flags.upstream.clone();
        }
        Ok(())
    }

    fn check(&self) -> Result<(), AgentConfigError> {
        let a = &self.agent;
        let bad = |key: &str, message: &str| AgentConfigError::Invalid {
            key: key.to_owned(),
            message: message.to_owned(),
        };
        if a.upstream.is_empty() {
            return Err(bad("agent.upstream", "at least one authority xDS address"));
        }
        for u in a.upstream.iter().chain(&a.ingest) {
            if u.parse::<SocketAddr>().is_err() && !u.contains(':') {
                return Err(bad("agent.upstream", "host:port"));
            }
        }
        if !(1..=1000).contains(&a.bounds.shrink_max_permille) {
            return Err(bad("agent.bounds.shrink_max_permille", "1..=1000"));
        }
        if a.bounds.shrink_window.is_zero() {
            return Err(bad("agent.bounds.shrink_window", "must be positive"));
        }
        if a.bounds.max_ejection_percent > 100 {
            return Err(bad("agent.bounds.max_ejection_percent", "0..=100"));
        }
        if let Some(g) = &a.gossip {
            crate::gossip::Keyring::parse(&g.keys).map_err(|e| AgentConfigError::Invalid {
                key: "agent.gossip.keys".into(),
                message: e.to_string(),
            })?;
        }
        // Views and load reports are what a sidecar's routing rests on: served in plain
        // text (no [agent.tls], or local_plaintext) they go to loopback callers only.
        if (a.tls.is_none() || a.listen.local_plaintext) && !a.listen.xds.ip().is_loopback() {
            return Err(bad(
                "agent.listen.xds",
                "xDS and LRS in plain text are served on loopback only: bind a loopback \
                 address, or configure [agent.tls] (and leave local_plaintext off) to serve \
                 the host's sidecars over mutual TLS",
            ));
        }
        // The local API carries the views, the gossip pool and the sidecars' configs: across
        // a network it is read over TLS, by a bearer of a token, never in plain text.
        if !a.listen.http.ip().is_loopback() {
            if a.tls.is_none() {
                return Err(bad(
                    "agent.listen.http",
                    "off loopback the local API is served over TLS with the node's \
                     certificate: configure [agent.tls], or bind a loopback address",
                ));
            }
            if a.listen.http_tokens_file.is_none() {
                return Err(bad(
                    "agent.listen.http_tokens_file",
                    "required when agent.listen.http is off loopback: the bearer tokens \
                     that may read /metrics and /v1/* (/livez and /readyz stay open)",
                ));
            }
        }
        if !a.ingest.is_empty() && a.tls.is_none() {
            return Err(bad(
                "agent.ingest",
                "evidence is attributed by certificate: [agent.tls] is required",
            ));
        }
        Ok(())
    }

    /// The effective configuration as TOML (what `--print-config` prints).
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string_pretty(self)
    }
}

fn default_upstream_standby() -> bool {
    true
}

/// `[agent.gossip]`, created empty when the environment is the first to name it (the
/// check afterwards refuses it unless bind and keys were both given).
fn gossip_section(a: &mut AgentConfig) -> &mut Gossip {
    a.gossip.get_or_insert_with(|| Gossip {
        bind: SocketAddr::from(([0, 0, 0, 0], 7946)),
        seeds: Vec::new(),
        keys: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[agent]
name = "n1"
region = "eu"
zone = "a"
data_dir = "/var/lib/waymark/agent"
upstream = ["10.0.0.1:18000"]
"#;

    fn load(
        text: &str,
        env: &[(&str, &str)],
        flags: &Overrides,
    ) -> Result<AgentFile, AgentConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, text).unwrap();
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        AgentFile::load(&path, env, flags)
    }

    #[test]
    fn the_minimal_file_is_what_new_builds() {
        let file = load(MINIMAL, &[], &Overrides::default()).unwrap();
        let built = AgentConfig::new(
            "n1".parse().unwrap(),
            "eu".parse().unwrap(),
            "a".parse().unwrap(),
            "/var/lib/waymark/agent".into(),
            vec!["10.0.0.1:18000".into()],
        );
        assert_eq!(file.agent, built);
    }

    #[test]
    fn every_section_survives_to_toml_and_back() {
        let mut a = AgentConfig::new(
            "n1".parse().unwrap(),
            "eu".parse().unwrap(),
            "a".parse().unwrap(),
            "/var/lib/waymark/agent".into(),
            vec!["10.0.0.1:18000".into(), "auth-1.example:18000".into()],
        );
        a.ingest = vec!["10.0.0.1:8502".into()];
        a.api = vec!["10.0.0.1:8500".into()];
        a.api_token_file = Some("/etc/waymark/token".into());
        a.listen = Listen {
            xds: "127.0.0.1:19000".parse().unwrap(),
            dns: "127.0.0.1:8653".parse().unwrap(),
            http: "127.0.0.1:8401".parse().unwrap(),
            http_tokens_file: Some("/etc/waymark/api-tokens".into()),
            local_plaintext: true,
        };
        a.bounds = Bounds {
            shrink_max_permille: 250,
            shrink_window: Duration::from_millis(1500),
            max_ejection_percent: 20,
        };
        a.services_dir = Some("/etc/waymark/services".into());
        a.gossip = Some(Gossip {
            bind: "10.0.0.7:7946".parse().unwrap(),
            seeds: vec!["seed.example:7946".parse().unwrap()],
            keys: vec!["ab".repeat(32)],
        });
        a.tls = Some(Tls {
            trust_domain: "example.org".into(),
            cert_chain: "/tls/chain.pem".into(),
            key: "/tls/key.pem".into(),
            bundle: "/tls/bundle.pem".into(),
        });
        a.probe.allow_cidrs = vec!["127.0.0.0/8".parse().unwrap()];
        let file = AgentFile::new(a);
        let text = file.to_toml().unwrap();
        let back = AgentFile::parse(&text, [], &Overrides::default()).unwrap();
        assert_eq!(back, file, "{text}");
    }

    #[test]
    fn plain_text_xds_off_loopback_is_refused_naming_the_key() {
        let open = format!("{MINIMAL}\n[agent.listen]\nxds = \"0.0.0.0:18000\"\n");
        let err = load(&open, &[], &Overrides::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("agent.listen.xds: xDS and LRS in plain text"),
            "{err}"
        );
        let err = load(
            MINIMAL,
            &[("WAYMARK_AGENT_LISTEN_XDS", "10.1.2.3:18000")],
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("agent.listen.xds"), "{err}");
        // On loopback, plain text is the development default.
        assert!(load(MINIMAL, &[], &Overrides::default()).is_ok());
    }

    #[test]
    fn the_local_api_off_loopback_needs_tls_and_tokens_naming_the_key() {
        const TLS: &str = "[agent.tls]\ntrust_domain = \"example.org\"\n\
                           cert_chain = \"/c.pem\"\nkey = \"/k.pem\"\nbundle = \"/b.pem\"\n";
        let off = [("WAYMARK_AGENT_LISTEN_HTTP", "10.0.1.17:8400")];
        let err = load(MINIMAL, &off, &Overrides::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("agent.listen.http: off loopback"),
            "{err}"
        );
        let with_tls = format!("{MINIMAL}{TLS}");
        let err = load(&with_tls, &off, &Overrides::default()).unwrap_err();
        assert!(
            err.to_string().starts_with("agent.listen.http_tokens_file"),
            "{err}"
        );
        let tokens = [
            off[0],
            (
                "WAYMARK_AGENT_LISTEN_HTTP_TOKENS_FILE",
                "/etc/waymark/api-tokens",
            ),
        ];
        let f = load(&with_tls, &tokens, &Overrides::default()).unwrap();
        assert_eq!(
            f.agent.listen.http_tokens_file.as_deref(),
            Some(Path::new("/etc/waymark/api-tokens"))
        );
        // A wildcard address is off loopback too.
        let any = [("WAYMARK_AGENT_LISTEN_HTTP", "0.0.0.0:8400")];
        assert!(load(&with_tls, &any, &Overrides::default()).is_err());
        // On loopback neither is needed.
        assert!(load(MINIMAL, &[], &Overrides::default()).is_ok());
    }

    #[test]
    fn defaults_then_environment_then_flags() {
        let f = load(MINIMAL, &[], &Overrides::default()).unwrap();
        assert_eq!(f.agent.bounds, Bounds::default());
        assert_eq!(f.agent.listen, Listen::default());
        let flags = Overrides {
            zone: Some("c".into()),
            ..Overrides::default()
        };
        let env = [
            ("WAYMARK_AGENT_ZONE", "b"),
            ("WAYMARK_AGENT_NAME", "n9"),
            ("PATH", "/bin"),
        ];
        let f = load(MINIMAL, &env, &flags).unwrap();
        assert_eq!(f.agent.name.as_str(), "n9", "environment over the file");
        assert_eq!(f.agent.zone.as_str(), "c", "flags over the environment");
        // What --print-config prints parses back to the same configuration.
        let again: AgentFile = toml::from_str(&f.to_toml().unwrap()).unwrap();
        assert_eq!(again, f);
    }

    #[test]
    fn bad_input_names_the_key() {
        let cases = [
            (
                MINIMAL.replace("upstream = [\"10.0.0.1:18000\"]", "upstream = []"),
                "agent.upstream",
            ),
            (format!("{MINIMAL}colour = 1\n"), "colour"),
            (
                format!("{MINIMAL}[agent.bounds]\nshrink_window = \"ten\"\n"),
                "shrink_window",
            ),
            (
                format!("{MINIMAL}[agent.bounds]\nshrink_max_permille = 0\n"),
                "shrink_max_permille",
            ),
            (
                format!("{MINIMAL}[agent.gossip]\nbind = \"127.0.0.1:7946\"\nkeys = [\"zz\"]\n"),
                "agent.gossip.keys",
            ),
            (
                format!("{MINIMAL}ingest = [\"10.0.0.1:8502\"]\n"),
                "agent.ingest",
            ),
        ];
        for (text, key) in cases {
            let e = load(&text, &[], &Overrides::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{e} should name {key}");
        }
        let e = load(
            MINIMAL,
            &[("WAYMARK_AGENT_COLOUR", "x")],
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("WAYMARK_AGENT_COLOUR"), "{e}");
    }

    #[test]
    fn gossip_seeds_take_dns_names_and_refuse_what_is_not_host_port() {
        let with_seeds = |seeds: &str| {
            format!(
                "{MINIMAL}[agent.gossip]\nbind = \"10.0.1.17:7946\"\nseeds = {seeds}\nkeys = [\"{}\"]\n",
                "0e6f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7"
            )
        };
        let f = load(
            &with_seeds(r#"["waymark-authority.waymark.svc.cluster.local:7946", "10.0.0.2:7946"]"#),
            &[],
            &Overrides::default(),
        )
        .unwrap();
        let seeds: Vec<String> = f
            .agent
            .gossip
            .as_ref()
            .unwrap()
            .seeds
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            seeds,
            [
                "waymark-authority.waymark.svc.cluster.local:7946",
                "10.0.0.2:7946"
            ]
        );
        let again: AgentFile = toml::from_str(&f.to_toml().unwrap()).unwrap();
        assert_eq!(again, f, "printed names read back the same");
        for bad in [r#"["waymark-authority"]"#, r#"["seed_1.example:7946"]"#] {
            let e = load(&with_seeds(bad), &[], &Overrides::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains("seeds"), "{bad}: {e}");
        }
    }

    #[test]
    fn gossip_from_the_environment_and_the_command_lines_own_variables() {
        let key = "0e6f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7";
        let keys = format!(" {key}\n");
        let env = [
            ("WAYMARK_AGENT_GOSSIP_BIND", "10.0.1.17:7946"),
            ("WAYMARK_AGENT_GOSSIP_KEYS", keys.as_str()),
            ("WAYMARK_AGENT_CONFIG", "/etc/waymark/agent.toml"),
            ("WAYMARK_AGENT_API", "127.0.0.1:8400"),
        ];
        let f = load(MINIMAL, &env, &Overrides::default()).unwrap();
        let g = f.agent.gossip.unwrap();
        assert_eq!(g.bind, "10.0.1.17:7946".parse().unwrap());
        assert_eq!(g.keys, vec![key.to_owned()]);
        // A bind without keys is a gossip section that cannot open a packet: refused.
        let e = load(
            MINIMAL,
            &[("WAYMARK_AGENT_GOSSIP_BIND", "10.0.1.17:7946")],
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("agent.gossip.keys"), "{e}");
    }
}
