//! How every server role logs: the filter and the format, from flags, the environment and
//! the configuration file's `[log]`, installed once at start.
//!
//! ```text
//! filter:  --log-level ─► WAYMARK_LOG ─► RUST_LOG ─► [log] level ─► "info"     (first set wins)
//! format:  --log-format ─► WAYMARK_LOG_FORMAT ─► [log] format ─► text
//! ```
//!
//! The filter is a `tracing` `EnvFilter` directive (`info`, `debug`,
//! `info,waymark::access=debug,openraft=warn`), checked before anything starts: a bad one is
//! refused naming where it came from. `text` is for a terminal. `json` is for a collector:
//! every line a server role writes, on stdout and stderr, is one JSON object with
//! `timestamp`, `level`, `target`, `fields` (the message is `fields.message`) and the spans
//! it happened in — `waymark dev`'s guide is then the `dev region ready` event, and a panic
//! is an event too (target `waymark::panic`). One line is not: an error that ends the
//! process is printed by `main` as Rust prints it (`Error: …`), the last line of a failed
//! start. What the CLI prints is its product, not a log, and is left alone. The authority
//! API's access log is target `waymark::access` (`authority::api::access_log`).

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

/// The filter when nothing sets one.
pub const DEFAULT_FILTER: &str = "info";

/// The format installed by [`init`], read by the roles that print for a person in text
/// mode (`waymark dev`'s guide).
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// `--log-level` and `--log-format`, accepted after any subcommand.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// What to log: a tracing filter directive, e.g. `info`, `debug` or
    /// `info,waymark::access=debug`. Unset: RUST_LOG, then the file's `[log] level`, then
    /// `info`.
    #[arg(
        long,
        env = "WAYMARK_LOG",
        global = true,
        value_name = "FILTER",
        value_parser = LogFilter::parse
    )]
    pub log_level: Option<LogFilter>,
    /// `text` for a terminal, `json` (one object per line) for a collector. Unset: the
    /// file's `[log] format`, then `text`.
    #[arg(long, env = "WAYMARK_LOG_FORMAT", global = true, value_enum)]
    pub log_format: Option<LogFormat>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]` in the agent's and the authority's configuration file; flags and the
/// environment override each key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// The filter directive (default `info`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<LogFilter>,
    /// `text` or `json` (default `text`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<LogFormat>,
}

/// A filter directive that `EnvFilter` accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LogFilter(String);

/// The filter and format in force, once every source has been read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// The filter directive.
    pub filter: LogFilter,
    /// The format.
    pub format: LogFormat,
}

/// Why logging could not start. Nothing was installed; the process should stop with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// A filter directive `EnvFilter` refuses; fix the source named.
    #[error("{source_name}: {directive:?} is not a log filter: {reason}")]
    BadFilter {
        /// Where it came from (`--log-level`, `RUST_LOG`, `log.level`).
        source_name: &'static str,
        /// The directive.
        directive: String,
        /// What `EnvFilter` said.
        reason: String,
    },
    /// A global subscriber was installed already (a bug: `init` runs once per process).
    #[error("a log subscriber is installed already")]
    Installed(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Install the settings `args`, the environment and `file` (the role's `[log]`, if it
/// has a file) resolve to. Call once, before the role starts; returns the format in force.
pub fn init(args: &LogArgs, file: Option<&LogSection>) -> Result<LogFormat, LogError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let settings = args.resolve(file.unwrap_or(&LogSection::default()), rust_log)?;
    let filter = EnvFilter::builder()
        .parse(settings.filter.as_str())
        .expect("a LogFilter is a directive EnvFilter accepts");
    // Colour only for a person at a terminal: escape codes in a file or a log shipper's
    // input are noise (the text format's writer is stdout).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match settings.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    }
    .map_err(LogError::Installed)?;
    if settings.format == LogFormat::Json {
        // The default hook writes plain text to stderr; in JSON mode a panic is an event.
        std::panic::set_hook(Box::new(|info| {
            let backtrace = std::backtrace::Backtrace::capture();
            tracing::error!(target: "waymark::panic", panic = %info, %backtrace, "panicked");
        }));
    }
    let _ = FORMAT.set(settings.format);
    Ok(settings.format)
}

/// Whether [`init`] installed the JSON format: a role then says as an event what it
/// would print for a person.
pub fn json_in_force() -> bool {
    FORMAT.get() == Some(&LogFormat::Json)
}

// === impl LogArgs ===

impl LogArgs {
    /// The settings in force, by the precedence in the module doc. `WAYMARK_LOG` and
    /// `WAYMARK_LOG_FORMAT` arrive in `self` (clap reads them); `rust_log` is `RUST_LOG`.
    pub fn resolve(
        &self,
        file: &LogSection,
        rust_log: Option<String>,
    ) -> Result<LogSettings, LogError> {
        // An empty value counts as unset (`RUST_LOG=` in a unit file, say).
        let set = |f: &&LogFilter| !f.0.is_empty();
        let rust_log = rust_log.filter(|v| !v.is_empty());
        let filter = match (
            self.log_level.as_ref().filter(set),
            rust_log,
            file.level.as_ref().filter(set),
        ) {
            (Some(flag), _, _) => flag.clone(),
            (None, Some(env), _) => LogFilter::parse_from("RUST_LOG", &env)?,
            (None, None, Some(level)) => level.clone(),
            (None, None, None) => LogFilter(DEFAULT_FILTER.to_owned()),
        };
        let format = self.log_format.or(file.format).unwrap_or_default();
        Ok(LogSettings { filter, format })
    }
}

// === impl LogFilter ===

impl LogFilter {
    /// A `--log-level` value (clap's value parser).
    pub fn parse(directive: &str) -> Result<Self, LogError> {
        Self::parse_from("--log-level", directive)
    }

    fn parse_from(source_name: &'static str, directive: &str) -> Result<Self, LogError> {
        match EnvFilter::builder().parse(directive) {
            Ok(_) => Ok(Self(directive.to_owned())),
            Err(e) => Err(LogError::BadFilter {
                source_name,
                directive: directive.to_owned(),
                reason: e.to_string(),
            }),
        }
    }

    /// The directive.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for LogFilter {
    type Error = LogError;

    fn try_from(directive: String) -> Result<Self, LogError> {
        Self::parse_from("log.level", &directive)
    }
}

impl From<LogFilter> for String {
    fn from(filter: LogFilter) -> Self {
        filter.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(s: &str) -> LogFilter {
        LogFilter::parse(s).unwrap()
    }

    #[test]
    fn flags_then_environment_then_the_file_then_info() {
        // Goal: each source wins over the ones after it, key by key.
        let file = LogSection {
            level: Some(filter("warn")),
            format: Some(LogFormat::Json),
        };
        let none = LogArgs::default();
        let flags = LogArgs {
            log_level: Some(filter("debug")),
            log_format: Some(LogFormat::Text),
        };
        let resolved = |args: &LogArgs, file: &LogSection, env: Option<&str>| {
            let s = args.resolve(file, env.map(str::to_owned)).unwrap();
            (s.filter.as_str().to_owned(), s.format)
        };
        assert_eq!(
            resolved(&none, &LogSection::default(), None),
            ("info".into(), LogFormat::Text)
        );
        assert_eq!(
            resolved(&none, &file, None),
            ("warn".into(), LogFormat::Json)
        );
        assert_eq!(
            resolved(&none, &file, Some("trace")),
            ("trace".into(), LogFormat::Json)
        );
        assert_eq!(
            resolved(&flags, &file, Some("trace")),
            ("debug".into(), LogFormat::Text)
        );
        let empty = LogArgs {
            log_level: Some(filter("")),
            log_format: None,
        };
        assert_eq!(
            resolved(&empty, &file, Some("")),
            ("warn".into(), LogFormat::Json)
        );
    }

    #[test]
    fn a_bad_filter_is_refused_naming_its_source() {
        let e = LogFilter::parse("info,waymark=loud").unwrap_err();
        assert!(e.to_string().starts_with("--log-level: "), "{e}");
        let e = LogArgs::default()
            .resolve(&LogSection::default(), Some("waymark=loud".into()))
            .unwrap_err();
        assert!(e.to_string().starts_with("RUST_LOG: "), "{e}");
        let e = toml::from_str::<LogSection>("level = \"info,x=loud\"").unwrap_err();
        assert!(e.to_string().contains("log.level"), "{e}");
        let e = toml::from_str::<LogSection>("format = \"xml\"").unwrap_err();
        assert!(e.to_string().contains("xml"), "{e}");
    }

    #[test]
    fn the_section_round_trips_and_an_empty_one_prints_nothing() {
        let section = LogSection {
            level: Some(filter("info,waymark::access=debug")),
            format: Some(LogFormat::Json),
        };
        let text = toml::to_string(&section).unwrap();
        assert_eq!(toml::from_str::<LogSection>(&text).unwrap(), section);
        assert_eq!(toml::to_string(&LogSection::default()).unwrap(), "");
    }
}
