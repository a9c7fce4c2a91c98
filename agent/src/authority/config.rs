//! The authority member's configuration file (TOML), e.g.
//!
//! ```toml
//! [authority]
//! id = 1
//! region = "eu-west"
//! zones = ["a", "b", "c"]
//! data_dir = "/var/lib/waymark/authority"
//! http = "0.0.0.0:8500"
//! xds = "0.0.0.0:18000"
//! ingest = "0.0.0.0:8502"
//!
//! # The initial voters; every member of a new group lists the same set.
//! [[authority.members]]
//! id = 1
//! addr = "10.0.0.1:8500"
//!
//! # Existence from Kubernetes (omit api_url inside a cluster).
//! [authority.kubernetes]
//! cluster = "eks-eu-west-1"
//!
//! # Prober liveness from the region's gossip pool.
//! [authority.gossip]
//! bind = "10.0.0.1:7946"
//! zone = "a"
//! seeds = ["10.0.0.2:7946"]
//! keys = ["<64 hex characters>"]
//!
//! [authority.tls]
//! trust_domain = "example.org"
//! cert_chain = "/etc/waymark/tls/fullchain.pem"
//! key = "/etc/waymark/tls/key.pem"
//! bundle = "/etc/waymark/tls/bundle.pem"
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use waymark_certs::TrustDomain;
use waymark_certs::reload::MaterialPaths;
use waymark_core::model::{RegionName, ZoneName};

use super::existence::KubeSettings;
use super::member::{AuthorityConfig, GossipSettings, TlsSettings};
use super::raft::Member;
use crate::node::gossip::Keyring;

/// The file's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The authority role.
    pub authority: AuthoritySection,
}

/// `[authority]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthoritySection {
    /// Raft member id, unique in the group and never reused.
    pub id: u64,
    /// This region.
    pub region: RegionName,
    /// Its zones.
    pub zones: BTreeSet<ZoneName>,
    /// Where Raft and its snapshots live.
    pub data_dir: PathBuf,
    /// Raft RPC and the HTTP API.
    #[serde(default = "default_http")]
    pub http: SocketAddr,
    /// The xDS tier.
    #[serde(default = "default_xds")]
    pub xds: SocketAddr,
    /// Evidence ingest (needs `tls`).
    #[serde(default)]
    pub ingest: Option<SocketAddr>,
    /// Initial voters of a new group (the same list on every member); empty to join an
    /// existing group with `waymark operator raft join`.
    #[serde(default)]
    pub members: Vec<MemberEntry>,
    /// Mutual TLS for xDS and ingest.
    #[serde(default)]
    pub tls: Option<TlsSection>,
    /// Existence from Kubernetes EndpointSlices.
    #[serde(default)]
    pub kubernetes: Option<KubeSettings>,
    /// The region's gossip pool (prober liveness).
    #[serde(default)]
    pub gossip: Option<GossipSection>,
}

/// `[authority.gossip]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GossipSection {
    /// UDP address to bind and advertise.
    pub bind: SocketAddr,
    /// This member's zone.
    pub zone: ZoneName,
    /// Members to join through.
    #[serde(default)]
    pub seeds: Vec<SocketAddr>,
    /// Region keys (hex or base64, 32 bytes); the first seals, every one opens.
    pub keys: Vec<String>,
}

/// One initial voter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberEntry {
    /// Its id.
    pub id: u64,
    /// Its HTTP listener, `host:port`.
    pub addr: String,
}

/// `[authority.tls]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The estate's trust domain.
    pub trust_domain: String,
    /// Leaf + intermediates.
    pub cert_chain: PathBuf,
    /// Private key.
    pub key: PathBuf,
    /// Trust bundle.
    pub bundle: PathBuf,
}

fn default_http() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8500))
}

fn default_xds() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 18000))
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape (the message names the key).
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A value is wrong.
    #[error("{field}: {message}")]
    Invalid {
        /// The key.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl ConfigFile {
    /// Read and check a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })
    }

    /// Parse and check TOML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let file: Self = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        file.check()?;
        Ok(file)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let a = &self.authority;
        if a.zones.is_empty() {
            return Err(ConfigError::Invalid {
                field: "authority.zones",
                message: "at least one zone".into(),
            });
        }
        if a.ingest.is_some() && a.tls.is_none() {
            return Err(ConfigError::Invalid {
                field: "authority.ingest",
                message: "evidence ingest needs [authority.tls]: samples are attributed by the peer's certificate".into(),
            });
        }
        let mut ids = BTreeSet::new();
        for m in &a.members {
            if !ids.insert(m.id) {
                return Err(ConfigError::Invalid {
                    field: "authority.members",
                    message: format!("id {} listed twice", m.id),
                });
            }
            if m.addr.parse::<SocketAddr>().is_err() {
                return Err(ConfigError::Invalid {
                    field: "authority.members",
                    message: format!("{}: not host:port", m.addr),
                });
            }
        }
        if !a.members.is_empty() && !ids.contains(&a.id) {
            return Err(ConfigError::Invalid {
                field: "authority.members",
                message: format!("the initial voters must include this member ({})", a.id),
            });
        }
        if let Some(t) = &a.tls {
            TrustDomain::new(&t.trust_domain).map_err(|e| ConfigError::Invalid {
                field: "authority.tls.trust_domain",
                message: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// The member configuration.
    pub fn member_config(&self) -> Result<AuthorityConfig, ConfigError> {
        let a = &self.authority;
        let tls = match &a.tls {
            Some(t) => Some(TlsSettings {
                trust_domain: TrustDomain::new(&t.trust_domain).map_err(|e| {
                    ConfigError::Invalid {
                        field: "authority.tls.trust_domain",
                        message: e.to_string(),
                    }
                })?,
                paths: MaterialPaths {
                    cert_chain: t.cert_chain.clone(),
                    key: t.key.clone(),
                    bundle: t.bundle.clone(),
                },
            }),
            None => None,
        };
        let gossip = match &a.gossip {
            None => None,
            Some(g) => {
                let keyring = Keyring::parse(&g.keys).map_err(|e| ConfigError::Invalid {
                    field: "authority.gossip.keys",
                    message: e.to_string(),
                })?;
                Some(GossipSettings {
                    bind: g.bind,
                    zone: g.zone.clone(),
                    seeds: g.seeds.clone(),
                    keyring,
                })
            }
        };
        Ok(AuthorityConfig {
            id: a.id,
            region: a.region.clone(),
            zones: a.zones.clone(),
            data_dir: a.data_dir.clone(),
            http: a.http,
            xds: a.xds,
            ingest: a.ingest,
            tls,
            kubernetes: a.kubernetes.clone(),
            gossip,
        })
    }

    /// The initial voters.
    pub fn initial_members(&self) -> BTreeMap<u64, Member> {
        self.authority
            .members
            .iter()
            .map(|m| {
                (
                    m.id,
                    Member {
                        raft_addr: m.addr.clone(),
                        api_addr: m.addr.clone(),
                    },
                )
            })
            .collect()
    }
}
