//! The authority member's configuration file (TOML); [`ConfigFile::member_config`] turns it
//! into the member's [`AuthorityConfig`] (`settings.rs`). E.g.
//!
//! ```toml
//! [authority]
//! id = 1
//! region = "eu-west"
//! zones = ["a", "b", "c"]
//! data_dir = "/var/lib/waymark/authority"
//! http = "0.0.0.0:8500"
//! raft = "0.0.0.0:8501"
//! xds = "0.0.0.0:18000"
//! ingest = "0.0.0.0:8502"
//!
//! # The initial voters; every member of a new group lists the same set.
//! [[authority.members]]
//! id = 1
//! addr = "10.0.0.1:8500"
//! raft = "10.0.0.1:8501"
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
//!
//! # Cross-region aggregates over QUIC (needs [authority.tls]); one entry per peer member.
//! [authority.federation]
//! bind = "0.0.0.0:8503"
//!
//! [[authority.federation.peers]]
//! region = "us-east"
//! member = "1"
//! addr = "10.1.0.1:8503"
//!
//! # The out-of-band failover signal: the peer region's own front door, probed directly.
//! [[authority.federation.front_doors]]
//! region = "us-east"
//! addrs = ["10.1.9.1:443"]
//!
//! # The log (`crate::logging`): a tracing filter and text or json; `--log-level`,
//! # `--log-format`, WAYMARK_LOG, RUST_LOG and WAYMARK_LOG_FORMAT override it.
//! [log]
//! level = "info"
//! format = "json"
//! ```
//!
//! Member addresses and gossip seeds are `host:port` with an IP address or a DNS name
//! ([`HostPort`]); names are resolved at each use, so a member that comes back under a new IP
//! is still found.
//!
//! Raft has its own listener (`raft`, default `127.0.0.1:8501`), never the API's. With
//! `[authority.tls]` it is mutual TLS between the region's authority members; without, it is
//! plaintext and the check refuses any address but a loopback one (`authority.raft`).
//!
//! Environment overrides, read after the file (the settings that differ per member when one
//! file serves every member, as a ConfigMap does for a StatefulSet's pods):
//! `WAYMARK_AUTHORITY_ID` (a number, or a name ending in `-<number>` such as the pod name
//! `waymark-authority-0`, whose number becomes the id), `WAYMARK_AUTHORITY_GOSSIP_BIND`,
//! `WAYMARK_AUTHORITY_GOSSIP_ZONE`, `WAYMARK_AUTHORITY_GOSSIP_KEYS` (comma-separated;
//! whitespace around each is dropped, as a key read from a mounted secret ends in a newline),
//! `WAYMARK_AUTHORITY_TLS_CERT_CHAIN` and `WAYMARK_AUTHORITY_TLS_KEY` (these two need
//! `[authority.tls]` in the file for the trust domain and bundle). Any other
//! `WAYMARK_AUTHORITY_*` is refused by name.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark_certs::TrustDomain;
use waymark_certs::reload::MaterialPaths;
use waymark_core::model::{RegionName, ZoneName};
use waymark_federation::signal::SignalConfig;

use super::raft::Member;
use super::settings::{
    AuthorityConfig, FederationPeerEntry, FederationSettings, FrontDoorEntry, GossipSettings,
    KubeSettings, Limits, TlsSettings, plaintext_off_loopback,
};
use crate::gossip::Keyring;
use crate::logging::LogSection;
use crate::net::HostPort;
use crate::tls::TlsSection;
use waymark_core::units::Permille;

/// The prefix of the authority's environment overrides.
const ENV_PREFIX: &str = "WAYMARK_AUTHORITY_";

/// The zone an authority member gossips under when none is configured. Members are never
/// probers (prober assignment picks agents only), so the zone only labels it in membership.
pub const GOSSIP_ZONE_UNSET: &str = "none";

/// The file's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The authority role.
    pub authority: AuthoritySection,
    /// `[log]`: the log's filter and format (`crate::logging`); flags and the environment
    /// override it.
    #[serde(default, skip_serializing_if = "is_unset")]
    pub log: LogSection,
}

fn is_unset(log: &LogSection) -> bool {
    log == &LogSection::default()
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
    /// The HTTP API.
    #[serde(default = "default_http")]
    pub http: SocketAddr,
    /// Raft RPC between the members: mutual TLS with `tls`, else loopback only.
    #[serde(default = "default_raft")]
    pub raft: SocketAddr,
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
    /// Mutual TLS for Raft, xDS and ingest.
    #[serde(default)]
    pub tls: Option<TlsSection>,
    /// Existence from Kubernetes EndpointSlices.
    #[serde(default)]
    pub kubernetes: Option<KubeSettings>,
    /// The region's gossip pool (prober liveness).
    #[serde(default)]
    pub gossip: Option<GossipSection>,
    /// Cross-region federation (needs `tls`).
    #[serde(default)]
    pub federation: Option<FederationSection>,
    /// Load limits: reconnection admission and admission shedding.
    #[serde(default)]
    pub limits: LimitsSection,
    /// Access control.
    #[serde(default)]
    pub acl: AclSection,
}

impl AuthoritySection {
    /// Member `id` of `region` with every optional section absent and every default
    /// filled in: what a file naming only the four required keys says. Tests and drills
    /// build their files from this and [`ConfigFile::to_toml`], never by formatting TOML.
    pub fn new(id: u64, region: RegionName, zones: BTreeSet<ZoneName>, data_dir: PathBuf) -> Self {
        Self {
            id,
            region,
            zones,
            data_dir,
            http: default_http(),
            raft: default_raft(),
            xds: default_xds(),
            ingest: None,
            members: Vec::new(),
            tls: None,
            kubernetes: None,
            gossip: None,
            federation: None,
            limits: LimitsSection::default(),
            acl: AclSection::default(),
        }
    }
}

/// `[authority.acl]`: how the region's access control starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclSection {
    /// A file holding a bearer token (`wmt.<name>.<secret>`, as `waymark acl
    /// generate-token` prints one). While the region has not been bootstrapped, the
    /// leader bootstraps it for operator `<name>` and stores this token (its digest) with
    /// every grant — so a region started from configuration alone (a StatefulSet, a
    /// systemd unit) can be administered at once, as Consul's initial management token
    /// allows. Once bootstrapped it is never recreated: revoke it, and it stays revoked.
    #[serde(default)]
    pub initial_management_token_file: Option<PathBuf>,
}

/// `[authority.limits]`: the load guards' budgets. The defaults are the design's; the
/// drills change them to show what each guard protects (e.g. `reconnect_permille = 1000`
/// lets every reconnecting client in at once). Change them in production only with a
/// measurement that says why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// xDS streams admitted per reconnection window, in thousandths of the known client
    /// population (default 50: 5 % per 10 s). 1000 admits everyone at once.
    #[serde(default = "default_reconnect_permille")]
    pub reconnect_permille: u32,
    /// xDS streams always admitted per window, whatever the population (default 10).
    #[serde(default = "default_reconnect_floor")]
    pub reconnect_floor: u32,
    /// The client population assumed before clients are seen, and the least it is ever
    /// taken to be (default 0: the clients seen). Clients are counted by certificate
    /// identity, or by IP address without one — never by the node id they write — so many
    /// plaintext clients on one address (a loopback drill) count once: say how many there
    /// are here.
    #[serde(default)]
    pub reconnect_expected_clients: u32,
    /// Admission releases per second before the delta queues declare saturation and shed
    /// (default [`waymark_core::defaults::ADMIT_RELEASES_PER_SEC`]).
    #[serde(default = "default_admit_releases_per_sec")]
    pub admit_releases_per_sec: u32,
    /// Shed admissions under their rate budget or delivery pressure (default true). `false`
    /// turns the guard off, only to show what it protects: withdrawals then queue behind
    /// admissions under a burst.
    #[serde(default = "default_true")]
    pub shed_admissions: bool,
    /// A `Publish` commit slower than this reports delivery pressure, and admissions are
    /// shed until a quicker one clears it (default
    /// [`waymark_core::defaults::PUBLISH_PRESSURE_AFTER`]). `"0ms"` sheds whenever a
    /// commit is under way: the strictest priority for withdrawals.
    #[serde(
        default = "default_publish_pressure_after",
        with = "waymark_core::duration_str"
    )]
    pub publish_pressure_after: Duration,
}

fn default_true() -> bool {
    true
}

fn default_publish_pressure_after() -> Duration {
    waymark_core::defaults::PUBLISH_PRESSURE_AFTER
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            reconnect_permille: default_reconnect_permille(),
            reconnect_floor: default_reconnect_floor(),
            reconnect_expected_clients: 0,
            admit_releases_per_sec: default_admit_releases_per_sec(),
            shed_admissions: true,
            publish_pressure_after: default_publish_pressure_after(),
        }
    }
}

fn default_reconnect_permille() -> u32 {
    u32::from(waymark_core::defaults::RECONNECT_PERMILLE.get())
}

fn default_reconnect_floor() -> u32 {
    waymark_xds::admission::AdmissionConfig::default().floor
}

fn default_admit_releases_per_sec() -> u32 {
    waymark_core::defaults::ADMIT_RELEASES_PER_SEC
}

/// `[authority.federation]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FederationSection {
    /// UDP address of this member's QUIC endpoint.
    pub bind: SocketAddr,
    /// Every member of every peer region.
    #[serde(default)]
    pub peers: Vec<FederationPeerEntry>,
    /// Peer regions' front doors, probed for the failover signal.
    #[serde(default)]
    pub front_doors: Vec<FrontDoorEntry>,
    /// A peer region silent this long is reported stale (its endpoints are kept).
    #[serde(default = "default_stale_after", with = "waymark_core::duration_str")]
    pub stale_after: Duration,
    /// How often each link sends its digest.
    #[serde(
        default = "default_digest_interval",
        with = "waymark_core::duration_str"
    )]
    pub digest_interval: Duration,
    /// How often the front doors are probed.
    #[serde(
        default = "default_probe_interval",
        with = "waymark_core::duration_str"
    )]
    pub probe_interval: Duration,
    /// How long one front-door connection attempt may take.
    #[serde(default = "default_probe_timeout", with = "waymark_core::duration_str")]
    pub probe_timeout: Duration,
    /// Consecutive failed rounds before a region's front door is down.
    #[serde(default = "default_fail_after")]
    pub fail_after: u32,
    /// Consecutive good rounds before it is up again.
    #[serde(default = "default_recover_after")]
    pub recover_after: u32,
    /// **Breaks ADR-14; never set it in production.** Drop a stale peer region's endpoints
    /// from tier 2 (taken back when it is fresh again), so that losing replication removes
    /// cross-region capacity instead of only ageing it. Off by default; it exists so the
    /// `region-partition` drill can show its verdict fail when the property is broken.
    #[serde(default)]
    pub drop_stale_peers: bool,
}

impl FederationSection {
    /// Federation on `bind` with no peers and every interval at its default.
    pub fn new(bind: SocketAddr) -> Self {
        Self {
            bind,
            peers: Vec::new(),
            front_doors: Vec::new(),
            stale_after: default_stale_after(),
            digest_interval: default_digest_interval(),
            probe_interval: default_probe_interval(),
            probe_timeout: default_probe_timeout(),
            fail_after: default_fail_after(),
            recover_after: default_recover_after(),
            drop_stale_peers: false,
        }
    }
}

fn default_stale_after() -> Duration {
    Duration::from_secs(60)
}

fn default_digest_interval() -> Duration {
    Duration::from_secs(5)
}

fn default_probe_interval() -> Duration {
    Duration::from_secs(5)
}

fn default_probe_timeout() -> Duration {
    Duration::from_secs(2)
}

fn default_fail_after() -> u32 {
    3
}

fn default_recover_after() -> u32 {
    5
}

/// `[authority.gossip]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GossipSection {
    /// UDP address to bind and advertise.
    pub bind: SocketAddr,
    /// This member's zone; optional, as a pod cannot read its node's zone. Without it the
    /// member gossips under [`GOSSIP_ZONE_UNSET`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<ZoneName>,
    /// Members to join through, `host:port` (IP or DNS name; a name may stand for several
    /// members, as a headless Service's does), resolved at each join attempt.
    #[serde(default)]
    pub seeds: Vec<HostPort>,
    /// Region keys (hex or base64, 32 bytes); the first seals, every one opens.
    pub keys: Vec<String>,
}

/// One initial voter. Both addresses are `host:port` (IP or DNS name; a name is resolved
/// at each connection, so it may move).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberEntry {
    /// Its id.
    pub id: u64,
    /// Its HTTP API listener (where followers redirect writes).
    pub addr: String,
    /// Its Raft listener (where the other members send Raft RPC).
    pub raft: String,
}

fn default_http() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8500))
}

/// Beside the API's 8500, below ingest's 8502 and federation's 8503.
fn default_raft() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8501))
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
        /// The key (or environment variable).
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A `WAYMARK_AUTHORITY_*` variable that names no setting (a typo would otherwise be
    /// ignored silently).
    #[error("{name}: not a setting the authority knows")]
    UnknownEnv {
        /// The variable.
        name: String,
    },
}

impl ConfigFile {
    /// A file holding `authority`, with no `[log]`.
    pub fn new(authority: AuthoritySection) -> Self {
        Self {
            authority,
            log: LogSection::default(),
        }
    }

    /// Read `path`, apply the `WAYMARK_AUTHORITY_*` variables of `env` (e.g.
    /// `std::env::vars()`), and check the result.
    pub fn load(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, env).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })
    }

    /// The file as TOML, which [`ConfigFile::parse`] reads back to the same value.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string_pretty(self)
    }

    /// Parse TOML text, apply the `WAYMARK_AUTHORITY_*` variables of `env`, and check.
    pub fn parse(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut file: Self = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        file.apply_env(env)?;
        file.check()?;
        Ok(file)
    }

    fn apply_env(
        &mut self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        let vars: BTreeMap<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX))
            .collect();
        let a = &mut self.authority;
        for (key, value) in &vars {
            match key.as_str() {
                "WAYMARK_AUTHORITY_ID" => {
                    a.id = parse_member_id(value).map_err(|message| ConfigError::Invalid {
                        field: "WAYMARK_AUTHORITY_ID",
                        message,
                    })?;
                }
                "WAYMARK_AUTHORITY_GOSSIP_BIND" => {
                    let bind = value
                        .trim()
                        .parse()
                        .map_err(|e: std::net::AddrParseError| ConfigError::Invalid {
                            field: "WAYMARK_AUTHORITY_GOSSIP_BIND",
                            message: format!("{value:?}: {e}"),
                        })?;
                    gossip_section(a).bind = bind;
                }
                "WAYMARK_AUTHORITY_GOSSIP_ZONE" => {
                    let zone = value.trim().parse().map_err(|e| ConfigError::Invalid {
                        field: "WAYMARK_AUTHORITY_GOSSIP_ZONE",
                        message: format!("{e}"),
                    })?;
                    gossip_section(a).zone = Some(zone);
                }
                "WAYMARK_AUTHORITY_GOSSIP_KEYS" => {
                    // Often read from a mounted secret: surrounding whitespace is not key.
                    gossip_section(a).keys = value
                        .split(',')
                        .map(str::trim)
                        .filter(|k| !k.is_empty())
                        .map(str::to_owned)
                        .collect();
                }
                "WAYMARK_AUTHORITY_TLS_CERT_CHAIN" => {
                    tls_section(a, "WAYMARK_AUTHORITY_TLS_CERT_CHAIN")?.cert_chain =
                        PathBuf::from(value);
                }
                "WAYMARK_AUTHORITY_TLS_KEY" => {
                    tls_section(a, "WAYMARK_AUTHORITY_TLS_KEY")?.key = PathBuf::from(value);
                }
                _ => return Err(ConfigError::UnknownEnv { name: key.clone() }),
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<(), ConfigError> {
        let a = &self.authority;
        if a.zones.is_empty() {
            return Err(ConfigError::Invalid {
                field: "authority.zones",
                message: "at least one zone".into(),
            });
        }
        if !(1..=1000).contains(&a.limits.reconnect_permille) {
            return Err(ConfigError::Invalid {
                field: "authority.limits.reconnect_permille",
                message: "between 1 and 1000 (thousandths of the known clients per window)".into(),
            });
        }
        if a.limits.admit_releases_per_sec == 0 {
            return Err(ConfigError::Invalid {
                field: "authority.limits.admit_releases_per_sec",
                message: "at least 1".into(),
            });
        }
        if a.ingest.is_some() && a.tls.is_none() {
            return Err(ConfigError::Invalid {
                field: "authority.ingest",
                message: "evidence ingest needs [authority.tls]: samples are attributed by the peer's certificate".into(),
            });
        }
        check_raft_listener(a)?;
        let mut ids = BTreeSet::new();
        for m in &a.members {
            if !ids.insert(m.id) {
                return Err(ConfigError::Invalid {
                    field: "authority.members",
                    message: format!("id {} listed twice", m.id),
                });
            }
            for (key, addr) in [("addr", &m.addr), ("raft", &m.raft)] {
                if let Err(e) = addr.parse::<HostPort>() {
                    return Err(ConfigError::Invalid {
                        field: "authority.members",
                        message: format!("member {} {key} {addr}: {e}", m.id),
                    });
                }
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
        if let Some(g) = &a.gossip {
            Keyring::parse(&g.keys).map_err(|e| ConfigError::Invalid {
                field: "authority.gossip.keys",
                message: e.to_string(),
            })?;
        }
        if let Some(f) = &a.federation {
            check_federation(f, a)?;
        }
        Ok(())
    }

    /// The member configuration: the file's sections as the member's settings.
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
                let zone = match &g.zone {
                    Some(zone) => zone.clone(),
                    None => ZoneName::try_new(GOSSIP_ZONE_UNSET)
                        .expect("GOSSIP_ZONE_UNSET is a valid zone name"),
                };
                Some(GossipSettings {
                    bind: g.bind,
                    zone,
                    seeds: g.seeds.clone(),
                    keyring,
                })
            }
        };
        let federation = a.federation.as_ref().map(|f| FederationSettings {
            bind: f.bind,
            peers: f.peers.clone(),
            front_doors: f.front_doors.clone(),
            stale_after: f.stale_after,
            digest_interval: f.digest_interval,
            probe_interval: f.probe_interval,
            probe_timeout: f.probe_timeout,
            signal: SignalConfig {
                fail_after: f.fail_after,
                recover_after: f.recover_after,
            },
            drop_stale_peers: f.drop_stale_peers,
        });
        Ok(AuthorityConfig {
            id: a.id,
            region: a.region.clone(),
            zones: a.zones.clone(),
            data_dir: a.data_dir.clone(),
            http: a.http,
            raft: a.raft,
            xds: a.xds,
            ingest: a.ingest,
            tls,
            kubernetes: a.kubernetes.clone(),
            gossip,
            federation,
            limits: Limits {
                reconnect: Permille::saturating(a.limits.reconnect_permille),
                reconnect_floor: a.limits.reconnect_floor,
                reconnect_expected_clients: a.limits.reconnect_expected_clients,
                admit_releases_per_sec: a.limits.admit_releases_per_sec,
                shed_admissions: a.limits.shed_admissions,
                publish_pressure_after: a.limits.publish_pressure_after,
                ..Limits::default()
            },
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
                        raft_addr: m.raft.clone(),
                        api_addr: m.addr.clone(),
                    },
                )
            })
            .collect()
    }
}

/// `[authority.gossip]`, created when the environment is the first to name it (the check
/// afterwards refuses it unless keys were given too).
fn gossip_section(a: &mut AuthoritySection) -> &mut GossipSection {
    a.gossip.get_or_insert_with(|| GossipSection {
        bind: SocketAddr::from(([0, 0, 0, 0], 7946)),
        zone: None,
        seeds: Vec::new(),
        keys: Vec::new(),
    })
}

/// `[authority.tls]`, which must come from the file: the environment only names this
/// member's own certificate and key, not the trust domain or the bundle.
fn tls_section<'a>(
    a: &'a mut AuthoritySection,
    var: &'static str,
) -> Result<&'a mut TlsSection, ConfigError> {
    a.tls.as_mut().ok_or(ConfigError::Invalid {
        field: var,
        message: "needs [authority.tls] in the file (trust_domain and bundle)".into(),
    })
}

/// A member id from `WAYMARK_AUTHORITY_ID`: a number, or a name ending in `-<number>` (a
/// StatefulSet pod's name or hostname, `waymark-authority-2` → 2), so that the pod-index
/// label and `metadata.name` both work.
fn parse_member_id(value: &str) -> Result<u64, String> {
    let value = value.trim();
    if let Ok(id) = value.parse::<u64>() {
        return Ok(id);
    }
    match value.rsplit_once('-') {
        Some((name, index)) if !name.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => {
            index
                .parse::<u64>()
                .map_err(|e| format!("{value:?}: the index after the last '-': {e}"))
        }
        _ => Err(format!(
            "{value:?}: a member id (a number, or a pod name ending in -<number>)"
        )),
    }
}

/// `authority.raft`: its own port; and without `[authority.tls]`, the API, Raft and xDS
/// (all plaintext then) only on loopback.
fn check_raft_listener(a: &AuthoritySection) -> Result<(), ConfigError> {
    let invalid = |message: String| {
        Err(ConfigError::Invalid {
            field: "authority.raft",
            message,
        })
    };
    if a.raft == a.http && a.raft.port() != 0 {
        return invalid(format!(
            "{} is also authority.http: Raft has a listener of its own",
            a.raft
        ));
    }
    if a.tls.is_none()
        && let Some(refused) = plaintext_off_loopback(a.http, a.raft, a.xds)
    {
        return Err(ConfigError::Invalid {
            field: refused.key,
            message: refused.message,
        });
    }
    Ok(())
}

fn check_federation(f: &FederationSection, a: &AuthoritySection) -> Result<(), ConfigError> {
    let invalid = |field, message: String| Err(ConfigError::Invalid { field, message });
    if a.tls.is_none() {
        return invalid(
            "authority.federation",
            "federation needs [authority.tls]: peers are admitted by their authority certificate"
                .into(),
        );
    }
    let mut seen = BTreeSet::new();
    for p in &f.peers {
        if p.region == a.region {
            return invalid(
                "authority.federation.peers",
                format!("{} is this region; list only peer regions", p.region),
            );
        }
        if p.member.is_empty() || !seen.insert((&p.region, &p.member)) {
            return invalid(
                "authority.federation.peers",
                format!("{}/{}: empty or listed twice", p.region, p.member),
            );
        }
    }
    let mut doors = BTreeSet::new();
    for d in &f.front_doors {
        if d.region == a.region || !doors.insert(&d.region) {
            return invalid(
                "authority.federation.front_doors",
                format!("{}: this region, or listed twice", d.region),
            );
        }
        if d.addrs.is_empty() || d.addrs.iter().any(|addr| addr.parse::<HostPort>().is_err()) {
            return invalid(
                "authority.federation.front_doors",
                format!("{}: at least one address, each host:port", d.region),
            );
        }
    }
    if f.fail_after == 0 || f.recover_after == 0 {
        return invalid(
            "authority.federation.fail_after",
            "fail_after and recover_after are at least 1".into(),
        );
    }
    if f.probe_timeout.is_zero() || f.probe_timeout > f.probe_interval {
        return invalid(
            "authority.federation.probe_timeout",
            "above zero and at most probe_interval".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0e6f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7";

    fn zones(names: &[&str]) -> BTreeSet<ZoneName> {
        names.iter().map(|z| z.parse().unwrap()).collect()
    }

    #[test]
    fn the_four_required_keys_are_what_new_builds() {
        let text = "[authority]\nid = 3\nregion = \"eu\"\nzones = [\"a\", \"b\"]\n\
                    data_dir = \"/d\"\n";
        let file = ConfigFile::parse(text, []).unwrap();
        let built =
            AuthoritySection::new(3, "eu".parse().unwrap(), zones(&["a", "b"]), "/d".into());
        assert_eq!(file.authority, built);
    }

    #[test]
    fn every_section_survives_to_toml_and_back() {
        let mut a = AuthoritySection::new(
            1,
            "eu".parse().unwrap(),
            zones(&["a", "b"]),
            "/var/lib/waymark".into(),
        );
        a.http = "10.0.0.1:8500".parse().unwrap();
        a.raft = "10.0.0.1:8501".parse().unwrap();
        a.xds = "10.0.0.1:18000".parse().unwrap();
        a.ingest = Some("10.0.0.1:8502".parse().unwrap());
        a.members = vec![
            MemberEntry {
                id: 1,
                addr: "10.0.0.1:8500".into(),
                raft: "10.0.0.1:8501".into(),
            },
            MemberEntry {
                id: 2,
                addr: "auth-2.example:8500".into(),
                raft: "auth-2.example:8501".into(),
            },
        ];
        a.tls = Some(TlsSection {
            trust_domain: "example.org".into(),
            cert_chain: "/tls/chain.pem".into(),
            key: "/tls/key.pem".into(),
            bundle: "/tls/bundle.pem".into(),
        });
        a.kubernetes = Some(KubeSettings {
            api_url: Some("https://10.0.0.9:6443".into()),
            cluster: "eks-eu".into(),
            namespace: Some("shop".into()),
            default_zone: Some("a".parse().unwrap()),
        });
        a.gossip = Some(GossipSection {
            bind: "10.0.0.1:7946".parse().unwrap(),
            zone: Some("a".parse().unwrap()),
            seeds: vec!["seed.example:7946".parse().unwrap()],
            keys: vec![KEY.into()],
        });
        let mut federation = FederationSection::new("10.0.0.1:8503".parse().unwrap());
        federation.peers = vec![FederationPeerEntry {
            region: "us".parse().unwrap(),
            member: "1".into(),
            addr: "10.1.0.1:8503".parse().unwrap(),
        }];
        federation.front_doors = vec![FrontDoorEntry {
            region: "us".parse().unwrap(),
            addrs: vec!["10.1.9.1:443".into()],
        }];
        federation.stale_after = Duration::from_millis(1500);
        federation.drop_stale_peers = true;
        a.federation = Some(federation);
        a.limits = LimitsSection {
            reconnect_permille: 1000,
            reconnect_floor: 3,
            reconnect_expected_clients: 40,
            admit_releases_per_sec: 7,
            shed_admissions: false,
            publish_pressure_after: Duration::ZERO,
        };
        a.acl.initial_management_token_file = Some("/etc/waymark/token".into());
        let file = ConfigFile::new(a);
        let text = file.to_toml().unwrap();
        let back = ConfigFile::parse(&text, []).unwrap();
        assert_eq!(back, file, "{text}");
    }

    /// One file for every member of a StatefulSet: DNS names, per-member settings left to
    /// the environment.
    const SHARED: &str = r#"
[authority]
id = 0
region = "eu-west-1"
zones = ["eu-west-1a", "eu-west-1b"]
data_dir = "/var/lib/waymark/authority"
http = "0.0.0.0:8500"
raft = "0.0.0.0:8501"
ingest = "0.0.0.0:8502"

[[authority.members]]
id = 0
addr = "waymark-authority-0.waymark-authority.waymark.svc.cluster.local:8500"
raft = "waymark-authority-0.waymark-authority.waymark.svc.cluster.local:8501"
[[authority.members]]
id = 1
addr = "waymark-authority-1.waymark-authority.waymark.svc.cluster.local:8500"
raft = "waymark-authority-1.waymark-authority.waymark.svc.cluster.local:8501"
[[authority.members]]
id = 2
addr = "10.1.0.12:8500"
raft = "10.1.0.12:8501"

[authority.tls]
trust_domain = "mesh.example.org"
cert_chain = "/etc/waymark/tls/authority-0.fullchain.pem"
key = "/etc/waymark/tls/authority-0.key.pem"
bundle = "/etc/waymark/tls/bundle.pem"

[authority.gossip]
bind = "0.0.0.0:7946"
seeds = ["waymark-authority.waymark.svc.cluster.local:7946", "10.1.0.12:7946"]
keys = []
"#;

    fn parse(text: &str, env: &[(&str, &str)]) -> Result<ConfigFile, ConfigError> {
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        ConfigFile::parse(text, env)
    }

    fn member_env<'a>(id: &'a str, bind: &'a str, keys: &'a str) -> Vec<(&'a str, &'a str)> {
        vec![
            ("WAYMARK_AUTHORITY_ID", id),
            ("WAYMARK_AUTHORITY_GOSSIP_BIND", bind),
            ("WAYMARK_AUTHORITY_GOSSIP_KEYS", keys),
            (
                "WAYMARK_AUTHORITY_TLS_CERT_CHAIN",
                "/etc/waymark/tls/authority-1.fullchain.pem",
            ),
            (
                "WAYMARK_AUTHORITY_TLS_KEY",
                "/etc/waymark/tls/authority-1.key.pem",
            ),
            ("PATH", "/bin"),
        ]
    }

    #[test]
    fn limits_default_to_the_design_and_refuse_nonsense() {
        let base = "[authority]\nid = 1\nregion = \"r\"\nzones = [\"a\"]\ndata_dir = \"/tmp/x\"\n";
        let f = parse(base, &[]).unwrap();
        let m = f.member_config().unwrap();
        assert_eq!(m.limits, Limits::default());
        assert_eq!(
            m.limits.reconnect,
            waymark_core::defaults::RECONNECT_PERMILLE
        );
        let open = format!("{base}[authority.limits]\nreconnect_permille = 1000\n");
        let m = parse(&open, &[]).unwrap().member_config().unwrap();
        assert_eq!(m.limits.reconnect, Permille::ONE);
        let bad = format!("{base}[authority.limits]\nreconnect_permille = 0\n");
        assert!(matches!(
            parse(&bad, &[]),
            Err(ConfigError::Invalid {
                field: "authority.limits.reconnect_permille",
                ..
            })
        ));
        let off = format!("{base}[authority.limits]\nshed_admissions = false\n");
        assert!(
            !parse(&off, &[])
                .unwrap()
                .member_config()
                .unwrap()
                .limits
                .shed_admissions
        );
        let bad = format!("{base}[authority.limits]\nadmit_releases_per_sec = 0\n");
        assert!(parse(&bad, &[]).is_err());
        let strict = format!("{base}[authority.limits]\npublish_pressure_after = \"0ms\"\n");
        let limits = parse(&strict, &[]).unwrap().member_config().unwrap().limits;
        assert_eq!(limits.publish_pressure_after, Duration::ZERO);
        let default = parse(base, &[]).unwrap().member_config().unwrap().limits;
        assert_eq!(
            default.publish_pressure_after,
            waymark_core::defaults::PUBLISH_PRESSURE_AFTER
        );
        let unitless = format!("{base}[authority.limits]\npublish_pressure_after = \"5\"\n");
        assert!(parse(&unitless, &[]).is_err());
    }

    #[test]
    fn the_environment_sets_each_members_own_settings_over_the_shared_file() {
        let keys = format!("{KEY}\n");
        let f = parse(SHARED, &member_env("1", "10.1.0.11:7946", &keys)).unwrap();
        let a = &f.authority;
        assert_eq!(a.id, 1);
        let g = a.gossip.as_ref().unwrap();
        assert_eq!(g.bind, "10.1.0.11:7946".parse().unwrap());
        assert_eq!(g.keys, vec![KEY.to_owned()], "trimmed");
        let tls = a.tls.as_ref().unwrap();
        assert_eq!(
            tls.cert_chain,
            Path::new("/etc/waymark/tls/authority-1.fullchain.pem")
        );
        assert_eq!(tls.key, Path::new("/etc/waymark/tls/authority-1.key.pem"));
        assert_eq!(tls.bundle, Path::new("/etc/waymark/tls/bundle.pem"));
        // What --print-config prints parses back to the same configuration.
        let printed = toml::to_string_pretty(&f).unwrap();
        assert_eq!(ConfigFile::parse(&printed, []).unwrap(), f);
        let settings = f.member_config().unwrap();
        let gossip = settings.gossip.unwrap();
        assert_eq!(gossip.zone.as_str(), GOSSIP_ZONE_UNSET);
        assert_eq!(gossip.seeds.len(), 2);
        let initial = f.initial_members();
        assert_eq!(
            initial[&0].raft_addr,
            "waymark-authority-0.waymark-authority.waymark.svc.cluster.local:8501"
        );
        assert_eq!(
            initial[&0].api_addr,
            "waymark-authority-0.waymark-authority.waymark.svc.cluster.local:8500"
        );
        assert_eq!(settings.raft, "0.0.0.0:8501".parse().unwrap());
    }

    #[test]
    fn raft_has_its_own_listener_and_is_plaintext_only_on_loopback() {
        // Goal: without [authority.tls], Raft anywhere but loopback is refused naming the
        // key; with TLS any address is fine; Raft never shares the API's port.
        let base = "[authority]\nid = 1\nregion = \"r\"\nzones = [\"a\"]\ndata_dir = \"/tmp/x\"\n";
        let f = parse(base, &[]).unwrap();
        assert_eq!(f.authority.raft, "127.0.0.1:8501".parse().unwrap());
        assert_ne!(f.authority.raft, f.authority.http);
        for raft in ["0.0.0.0:8501", "10.0.0.1:8501", "[::]:8501"] {
            let open = format!("{base}raft = \"{raft}\"\n");
            assert_eq!(refused_field(&open), "authority.raft", "{raft}");
            let e = parse(&open, &[]).unwrap_err().to_string();
            assert!(e.contains("[authority.tls]") && e.contains(raft), "{e}");
        }
        for raft in ["127.0.0.1:9000", "[::1]:9000", "[::ffff:127.0.0.1]:9000"] {
            assert!(
                parse(&format!("{base}raft = \"{raft}\"\n"), &[]).is_ok(),
                "{raft}"
            );
        }
        let shared = format!("{base}http = \"127.0.0.1:9000\"\nraft = \"127.0.0.1:9000\"\n");
        assert_eq!(refused_field(&shared), "authority.raft");
        // With mutual TLS, Raft may listen on every address (SHARED binds 0.0.0.0).
        let keys = KEY.to_owned();
        assert!(parse(SHARED, &member_env("1", "10.1.0.11:7946", &keys)).is_ok());
        // An initial voter needs both addresses, each host:port.
        let no_raft = SHARED.replace("raft = \"10.1.0.12:8501\"\n", "");
        assert!(parse(&no_raft, &member_env("1", "10.1.0.11:7946", &keys)).is_err());
        let bad = SHARED.replace("raft = \"10.1.0.12:8501\"", "raft = \"10.1.0.12\"");
        let e = parse(&bad, &member_env("1", "10.1.0.11:7946", &keys))
            .unwrap_err()
            .to_string();
        assert!(e.contains("authority.members") && e.contains("raft"), "{e}");
    }

    #[test]
    fn the_member_id_comes_from_a_number_or_a_pod_name_and_zero_is_an_id() {
        for (value, id) in [
            ("0", 0),
            ("2", 2),
            (" 1\n", 1),
            ("waymark-authority-0", 0),
            ("waymark-authority-2", 2),
            ("authority-17", 17),
        ] {
            assert_eq!(parse_member_id(value), Ok(id), "{value:?}");
        }
        for value in [
            "",
            "waymark-authority",
            "waymark-authority-",
            "-3",
            "x-1a",
            "-1",
        ] {
            assert!(parse_member_id(value).is_err(), "{value:?}");
        }
        let keys = KEY.to_owned();
        let f = parse(
            SHARED,
            &member_env("waymark-authority-0", "10.1.0.10:7946", &keys),
        );
        assert_eq!(f.unwrap().authority.id, 0);
        // An id that is not among the initial voters is refused, as from the file.
        let e = parse(
            SHARED,
            &member_env("waymark-authority-7", "10.1.0.10:7946", &keys),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("authority.members") && e.contains('7'), "{e}");
        let e = parse(SHARED, &member_env("leader", "10.1.0.10:7946", &keys))
            .unwrap_err()
            .to_string();
        assert!(e.contains("WAYMARK_AUTHORITY_ID"), "{e}");
    }

    #[test]
    fn member_addresses_and_seeds_take_dns_names_and_refuse_what_is_not_host_port() {
        let keys = KEY.to_owned();
        let env = member_env("0", "10.1.0.10:7946", &keys);
        for (from, to, field) in [
            (
                "addr = \"10.1.0.12:8500\"",
                "addr = \"waymark-authority-2\"",
                "authority.members",
            ),
            (
                "addr = \"10.1.0.12:8500\"",
                "addr = \"bad_name.example:8500\"",
                "authority.members",
            ),
            ("\"10.1.0.12:7946\"]", "\"10.1.0.12\"]", "seeds"),
        ] {
            assert!(SHARED.contains(from));
            let e = parse(&SHARED.replace(from, to), &env)
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{to}: {e} should name {field}");
        }
    }

    #[test]
    fn bad_or_unknown_environment_is_refused_by_name() {
        let keys = KEY.to_owned();
        let mut env = member_env("0", "10.1.0.10:7946", &keys);
        env.push(("WAYMARK_AUTHORITY_COLOUR", "blue"));
        let e = parse(SHARED, &env).unwrap_err().to_string();
        assert!(e.contains("WAYMARK_AUTHORITY_COLOUR"), "{e}");

        let e = parse(SHARED, &member_env("0", "pod-ip:7946", &keys))
            .unwrap_err()
            .to_string();
        assert!(e.contains("WAYMARK_AUTHORITY_GOSSIP_BIND"), "{e}");

        // Empty keys (a missing Secret) leave a gossip section that cannot open a packet.
        let e = parse(SHARED, &member_env("0", "10.1.0.10:7946", " \n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("authority.gossip.keys"), "{e}");

        // The certificate paths need the file's [authority.tls] for the rest.
        let no_tls = r#"
[authority]
id = 0
region = "eu-west-1"
zones = ["eu-west-1a"]
data_dir = "/var/lib/waymark/authority"
"#;
        let e = parse(no_tls, &[("WAYMARK_AUTHORITY_TLS_KEY", "/k.pem")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("WAYMARK_AUTHORITY_TLS_KEY"), "{e}");
    }

    #[test]
    fn gossip_zone_is_optional_and_may_come_from_the_environment() {
        let keys = KEY.to_owned();
        let mut env = member_env("0", "10.1.0.10:7946", &keys);
        env.push(("WAYMARK_AUTHORITY_GOSSIP_ZONE", "eu-west-1b"));
        let f = parse(SHARED, &env).unwrap();
        let g = f.member_config().unwrap().gossip.unwrap();
        assert_eq!(g.zone.as_str(), "eu-west-1b");
        let with_zone = SHARED.replace(
            "bind = \"0.0.0.0:7946\"",
            "bind = \"0.0.0.0:7946\"\nzone = \"eu-west-1a\"",
        );
        let f = parse(&with_zone, &member_env("0", "10.1.0.10:7946", &keys)).unwrap();
        let printed = toml::to_string_pretty(&f).unwrap();
        assert!(printed.contains("zone = \"eu-west-1a\""), "{printed}");
    }

    const FEDERATED: &str = r#"
[authority]
id = 1
region = "eu"
zones = ["a"]
data_dir = "/var/lib/waymark/authority"

[authority.tls]
trust_domain = "mesh.example.org"
cert_chain = "/etc/waymark/tls/fullchain.pem"
key = "/etc/waymark/tls/key.pem"
bundle = "/etc/waymark/tls/bundle.pem"

[authority.federation]
bind = "0.0.0.0:8503"
stale_after = "30s"

[[authority.federation.peers]]
region = "us"
member = "1"
addr = "10.1.0.1:8503"

[[authority.federation.front_doors]]
region = "us"
addrs = ["ingress.us.example.net:443"]
"#;

    fn refused_field(text: &str) -> &'static str {
        match parse(text, &[]) {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn federation_is_read_with_its_defaults() {
        let f = parse(FEDERATED, &[]).unwrap();
        let settings = f.member_config().unwrap().federation.unwrap();
        assert_eq!(settings.stale_after, Duration::from_secs(30));
        assert_eq!(settings.digest_interval, Duration::from_secs(5));
        assert_eq!(settings.signal.fail_after, 3);
        assert_eq!(settings.peers[0].member, "1");
        assert_eq!(
            settings.front_doors[0].addrs,
            ["ingress.us.example.net:443"]
        );
    }

    #[test]
    fn bad_federation_settings_are_refused_naming_the_key() {
        let no_tls = FEDERATED.replace("[authority.tls]", "[authority.unused]");
        assert!(parse(&no_tls, &[]).is_err(), "federation without tls");
        let own = FEDERATED.replace("region = \"us\"\nmember", "region = \"eu\"\nmember");
        assert_eq!(refused_field(&own), "authority.federation.peers");
        let twice = FEDERATED.replace(
            "[[authority.federation.front_doors]]",
            "[[authority.federation.peers]]\nregion = \"us\"\nmember = \"1\"\naddr = \"10.1.0.2:8503\"\n\n[[authority.federation.front_doors]]",
        );
        assert_eq!(refused_field(&twice), "authority.federation.peers");
        let door = FEDERATED.replace("ingress.us.example.net:443", "ingress.us.example.net");
        assert_eq!(refused_field(&door), "authority.federation.front_doors");
        let timeout = FEDERATED.replace("stale_after = \"30s\"", "probe_timeout = \"10s\"");
        assert_eq!(
            refused_field(&timeout),
            "authority.federation.probe_timeout"
        );
        let never = FEDERATED.replace("stale_after = \"30s\"", "fail_after = 0");
        assert_eq!(refused_field(&never), "authority.federation.fail_after");
    }
}
