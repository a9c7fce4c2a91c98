//! How an operator command prints what it read: a table (the default), a wider table, or
//! the API's answer itself as JSON or YAML (`-o table|wide|json|yaml`).
//!
//! JSON and YAML print the API's answer unchanged, so a script reads the same fields the
//! HTTP API documents; the tables are for people and may change between releases.

use serde_json::Value;

/// `-o`/`--output`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns, the fields that matter most.
    #[default]
    Table,
    /// Aligned columns with every field the command knows how to show.
    Wide,
    /// The API's answer as pretty-printed JSON.
    Json,
    /// The API's answer as YAML.
    Yaml,
}

impl Output {
    /// The API's answer printed as JSON or YAML, or `None` for the tables (the command
    /// then builds its own).
    pub fn structured(self, value: &Value) -> Option<anyhow::Result<String>> {
        match self {
            Self::Table | Self::Wide => None,
            Self::Json => Some(Ok(format!("{value:#}\n"))),
            Self::Yaml => Some(serde_norway::to_string(value).map_err(anyhow::Error::from)),
        }
    }

    /// A document that has no table (an OpenAPI document, a reconciliation diff): JSON
    /// unless YAML is asked for.
    pub fn document(self, value: &Value) -> anyhow::Result<String> {
        match self {
            Self::Yaml => serde_norway::to_string(value).map_err(anyhow::Error::from),
            Self::Table | Self::Wide | Self::Json => Ok(format!("{value:#}\n")),
        }
    }

    /// Whether the table shows every column it knows.
    pub fn wide(self) -> bool {
        self == Self::Wide
    }
}

/// A document an operator wrote (a contract, a policy, a registration), as JSON or YAML:
/// JSON first, for its exact errors, then YAML, of which JSON is nearly a subset.
pub fn parse_document(text: &str, what: &str) -> anyhow::Result<Value> {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => Ok(v),
        Err(json_error) => serde_norway::from_str::<Value>(text).map_err(|yaml_error| {
            anyhow::anyhow!("{what} is neither JSON ({json_error}) nor YAML ({yaml_error})")
        }),
    }
}

/// Reads `path` (`-` for standard input) and parses it with [`parse_document`].
pub fn read_document(path: &std::path::Path, what: &str) -> anyhow::Result<Value> {
    use anyhow::Context as _;
    use std::io::Read as _;
    let text = if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
        text
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    parse_document(&text, what)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn yaml_and_json_print_the_same_answer() {
        let v = json!({"service": "web", "verdicts": {"eligible": 3}, "tags": ["a", "true"]});
        let yaml = Output::Yaml.structured(&v).unwrap().unwrap();
        assert_eq!(parse_document(&yaml, "it").unwrap(), v, "{yaml}");
        let json = Output::Json.structured(&v).unwrap().unwrap();
        assert_eq!(parse_document(&json, "it").unwrap(), v);
        assert!(Output::Table.structured(&v).is_none());
        assert!(Output::Wide.wide() && !Output::Table.wide());
    }

    #[test]
    fn a_document_that_is_neither_says_both_errors() {
        let e = parse_document("{: [", "the contract")
            .unwrap_err()
            .to_string();
        assert!(e.contains("the contract is neither JSON"), "{e}");
        assert!(e.contains("nor YAML"), "{e}");
    }
}
