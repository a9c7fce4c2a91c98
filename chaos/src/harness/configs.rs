//! The roles' configuration files, built from the agent's own configuration types and
//! written with their `to_toml`: a drill's file is always one the role reads, and a key
//! renamed in the agent breaks the drill's build instead of its run.

use std::fmt::Display;
use std::path::Path;
use std::str::FromStr;

use anyhow::Context as _;
use waymark_agent::authority::config::{AclSection, AuthoritySection, ConfigFile, MemberEntry};
use waymark_agent::node::config::{AgentConfig, AgentFile};

use super::authority::Voter;

/// `text` parsed as `T` (a region, zone or node name), or an error naming it.
pub fn name<T>(text: &str) -> anyhow::Result<T>
where
    T: FromStr,
    T::Err: Display,
{
    text.parse()
        .map_err(|e| anyhow::anyhow!("{text:?} is not a valid name: {e}"))
}

/// Member `id` of `region` with `zones`, keeping its Raft state in `data_dir`; every other
/// key at its default.
pub fn authority(
    id: u64,
    region: &str,
    zones: &[&str],
    data_dir: &Path,
) -> anyhow::Result<AuthoritySection> {
    let zones = zones
        .iter()
        .map(|z| name(z))
        .collect::<anyhow::Result<_>>()?;
    Ok(AuthoritySection::new(
        id,
        name(region)?,
        zones,
        data_dir.to_path_buf(),
    ))
}

/// `[[authority.members]]` for `voters`.
pub fn members(voters: &[Voter]) -> Vec<MemberEntry> {
    voters
        .iter()
        .map(|v| MemberEntry {
            id: v.id,
            addr: v.http.to_string(),
            raft: v.raft.to_string(),
        })
        .collect()
}

/// Node `name` in `region`/`zone` subscribing to `upstream`, with its sled cache in
/// `data_dir`. Its prober may reach loopback, where the drills' backends listen (the
/// prober refuses it unless allowed).
pub fn agent(
    node: &str,
    region: &str,
    zone: &str,
    data_dir: &Path,
    upstream: &[String],
) -> anyhow::Result<AgentConfig> {
    let mut config = AgentConfig::new(
        name(node)?,
        name(region)?,
        name(zone)?,
        data_dir.to_path_buf(),
        upstream.to_vec(),
    );
    config.probe.allow_cidrs = vec![name("127.0.0.0/8")?];
    Ok(config)
}

/// Writes [`super::management_token`] under `dir` and returns the `[authority.acl]` that
/// names it.
pub fn drill_acl(dir: &Path) -> anyhow::Result<AclSection> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("management.token");
    std::fs::write(&path, super::management_token())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(AclSection {
        initial_management_token_file: Some(path),
    })
}

/// Writes `authority` to `path` as an authority's configuration file.
pub fn write_authority(path: &Path, authority: AuthoritySection) -> anyhow::Result<()> {
    let text = ConfigFile::new(authority).to_toml()?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Writes `agent` to `path` as a node agent's configuration file.
pub fn write_agent(path: &Path, agent: AgentConfig) -> anyhow::Result<()> {
    let text = AgentFile::new(agent).to_toml()?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
