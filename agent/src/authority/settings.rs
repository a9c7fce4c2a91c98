//! How to run one authority member, as the member takes it: addresses, TLS material,
//! gossip, Kubernetes, federation and the load guards' budgets.
//!
//! ```text
//! config.rs (the file, environment overrides) ──┐
//! waymark dev, tests (built in code) ───────────┴──► AuthorityConfig ──► member.rs
//!                                                       its parts ──► existence.rs, regions.rs
//! ```
//!
//! A leaf: it names no other authority module, so the file format, the member and the
//! tasks it starts can all depend on it without depending on each other. Three types are
//! also entries of the file as they stand ([`KubeSettings`], [`FederationPeerEntry`],
//! [`FrontDoorEntry`]): their shape in the file is the shape the member uses, so `config.rs`
//! embeds them rather than copying them field by field.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark_certs::TrustDomain;
use waymark_certs::grpc::GrpcLimits;
use waymark_certs::reload::MaterialPaths;
use waymark_core::model::{RegionName, ZoneName};
use waymark_core::units::Permille;
use waymark_federation::signal::SignalConfig;
use waymark_xds::admission::AdmissionConfig;

use crate::gossip::Keyring;
use crate::listener::HttpLimits;
use crate::net::HostPort;

/// How to run one member.
#[derive(Debug, Clone)]
pub struct AuthorityConfig {
    /// Raft member id (unique in the group, never reused).
    pub id: u64,
    /// This region.
    pub region: RegionName,
    /// Its zones (views are assembled for callers in each).
    pub zones: BTreeSet<ZoneName>,
    /// Where Raft and the views live.
    pub data_dir: PathBuf,
    /// The HTTP listener: the query/policy API (never Raft).
    pub http: SocketAddr,
    /// The Raft listener (`/raft/*` between members). With `tls` it is mutual TLS and
    /// admits only authority members of this region; without, it is plaintext and must be
    /// a loopback address ([`Authority::start`](super::member::Authority::start) refuses
    /// anything else).
    pub raft: SocketAddr,
    /// The xDS listener.
    pub xds: SocketAddr,
    /// The evidence ingest listener (needs `tls`).
    pub ingest: Option<SocketAddr>,
    /// Mutual TLS for Raft, xDS and ingest; without it Raft and xDS are served in
    /// plaintext (loopback development only) and ingest is off.
    pub tls: Option<TlsSettings>,
    /// Existence from Kubernetes EndpointSlices, reconciled while this member leads.
    pub kubernetes: Option<KubeSettings>,
    /// Gossip membership with the region's node agents (prober liveness).
    pub gossip: Option<GossipSettings>,
    /// Cross-region federation (needs `tls`).
    pub federation: Option<FederationSettings>,
    /// The load guards' budgets.
    pub limits: Limits,
}

/// Mutual-TLS material for the member's Raft, xDS and ingest listeners and its Raft client.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// The estate's trust domain.
    pub trust_domain: TrustDomain,
    /// This member's certificate, key and the trust bundle.
    pub paths: MaterialPaths,
}

/// The load guards' budgets (`[authority.limits]`); the defaults are the design's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// xDS streams admitted per reconnection window, as a share of the known population.
    pub reconnect: Permille,
    /// xDS streams always admitted per window.
    pub reconnect_floor: u32,
    /// The xDS client population assumed at least (see `AdmissionConfig::expected_clients`).
    pub reconnect_expected_clients: u32,
    /// Admission releases per second before admissions are shed.
    pub admit_releases_per_sec: u32,
    /// Shed admissions at all (under their rate budget or delivery pressure). Off only to
    /// show what shedding protects.
    pub shed_admissions: bool,
    /// A `Publish` commit slower than this reports delivery pressure.
    pub publish_pressure_after: Duration,
    /// The API listener's bounds.
    pub http: HttpLimits,
    /// The Raft listener's bounds.
    pub raft: HttpLimits,
    /// The gRPC listeners' bounds (xDS and evidence ingest).
    pub grpc: GrpcLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            reconnect: waymark_core::defaults::RECONNECT_PERMILLE,
            reconnect_floor: AdmissionConfig::default().floor,
            reconnect_expected_clients: AdmissionConfig::default().expected_clients,
            admit_releases_per_sec: waymark_core::defaults::ADMIT_RELEASES_PER_SEC,
            shed_admissions: true,
            publish_pressure_after: waymark_core::defaults::PUBLISH_PRESSURE_AFTER,
            http: HttpLimits::AUTHORITY,
            raft: HttpLimits::RAFT,
            grpc: GrpcLimits::default(),
        }
    }
}

/// This member's place in the region's gossip pool.
#[derive(Debug, Clone)]
pub struct GossipSettings {
    /// UDP address to bind and advertise.
    pub bind: SocketAddr,
    /// The member's zone.
    pub zone: ZoneName,
    /// Members to join through (IP or DNS name, resolved at each join attempt).
    pub seeds: Vec<HostPort>,
    /// The region keyring.
    pub keyring: Keyring,
}

/// Where the Kubernetes API is and what to reconcile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeSettings {
    /// The API server's URL; absent inside a cluster (the service account is used).
    #[serde(default)]
    pub api_url: Option<String>,
    /// This cluster's name (scopes which instances this reconciler may forget).
    pub cluster: String,
    /// One namespace only; absent for all.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Zone for endpoints that carry none (default `unknown`).
    #[serde(default)]
    pub default_zone: Option<ZoneName>,
}

/// How a member federates (from `[authority.federation]`).
#[derive(Debug, Clone)]
pub struct FederationSettings {
    /// UDP address of this member's QUIC endpoint.
    pub bind: SocketAddr,
    /// Every member of every peer region.
    pub peers: Vec<FederationPeerEntry>,
    /// Peer regions' front doors.
    pub front_doors: Vec<FrontDoorEntry>,
    /// A peer region silent this long is reported stale.
    pub stale_after: Duration,
    /// Digest pacing per link.
    pub digest_interval: Duration,
    /// How often the front doors are probed.
    pub probe_interval: Duration,
    /// One connection attempt's limit.
    pub probe_timeout: Duration,
    /// The signal's thresholds.
    pub signal: SignalConfig,
    /// Drop a stale peer region's endpoints from tier 2 (breaks ADR-14; for drills only,
    /// see `FederationSection::drop_stale_peers`).
    pub drop_stale_peers: bool,
}

/// One member of a peer region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FederationPeerEntry {
    /// Its region.
    pub region: RegionName,
    /// Its member name, as in its certificate (`region/<r>/authority/<member>`).
    pub member: String,
    /// Its federation endpoint (UDP).
    pub addr: SocketAddr,
}

/// A peer region's front door.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontDoorEntry {
    /// The region.
    pub region: RegionName,
    /// `host:port` endpoints; a round is good when any accepts a connection.
    pub addrs: Vec<String>,
}

/// Whether a listener may be served in plaintext on `addr`: only on a loopback address,
/// where only this host's processes reach it.
pub fn plaintext_allowed(addr: SocketAddr) -> bool {
    addr.ip().to_canonical().is_loopback()
}

/// A listener that would be plaintext off loopback: the key, and why that is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffLoopback {
    /// The configuration key, e.g. `authority.http`.
    pub key: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Without `[authority.tls]` the API, Raft and xDS are plaintext: each must then be bound
/// to a loopback address. Names the first that is not, and what anyone reaching it could
/// do.
pub fn plaintext_off_loopback(
    http: SocketAddr,
    raft: SocketAddr,
    xds: SocketAddr,
) -> Option<OffLoopback> {
    let listeners = [
        (
            "authority.http",
            http,
            "anyone reaching it could read the registry, and write with a stolen token",
        ),
        (
            "authority.raft",
            raft,
            "anyone reaching it could depose the leader or commit entries",
        ),
        (
            "authority.xds",
            xds,
            "anyone reaching it could read every view and pose as any caller",
        ),
    ];
    listeners
        .into_iter()
        .find(|(_, addr, _)| !plaintext_allowed(*addr))
        .map(|(key, addr, risk)| OffLoopback {
            key,
            message: format!(
                "{addr} is not a loopback address, and without [authority.tls] it is served in \
                 plaintext ({risk}): configure [authority.tls], or bind {key} to a loopback \
                 address"
            ),
        })
}
