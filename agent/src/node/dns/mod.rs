//! The node agent's DNS server: the compatibility surface for callers that cannot speak xDS.
//!
//! It answers from the same `ClusterLoadAssignment`s the agent serves its host over EDS, with
//! the same eligibility: an endpoint is answered when Envoy would route to it (`HEALTHY`,
//! `DEGRADED` or `UNKNOWN`, weight above zero; never `DRAINING`), from the lowest-numbered
//! EDS priority (failover tier) that has one. See [`DnsTable`] for the names and the answers.
//!
//! - [`DnsTable`] (pure): assignments → an immutable table; [`DnsTable::answer`] maps a
//!   question to records, `NXDOMAIN`, NODATA or "not ours" with no I/O.
//! - `message` (pure): request bytes → response bytes (EDNS, truncation, error codes).
//! - [`DnsServer`] (shell): UDP and TCP on one port, reading the table through an
//!   [`arc_swap::ArcSwap`] the agent swaps whenever its served view changes.
//!
//! **The weaker guarantee.** DNS callers see withdrawals up to a TTL ([`DnsConfig::ttl`],
//! 5 s by default) later than xDS callers, and often later still:
//!
//! - clients and resolvers cache answers for the TTL, and some ignore short TTLs or clamp
//!   them upwards (JVMs, nscd, stub resolvers with a minimum), so withdrawals can take longer;
//! - there are no versions, no acknowledgements and no push: a client learns of a change only
//!   when its cached answer expires and it asks again;
//! - A/AAAA answers carry no weights and no priorities; SRV carries them only as far as a
//!   client honours SRV priority and weight;
//! - the client-side bounds of ADR-01 (never route to an empty set because of an error, cap
//!   how fast the set shrinks) are not enforced at the client: a DNS client that receives an
//!   empty answer, or no answer, acts on that.
//!
//! Callers that need the 5 s withdrawal bound must use xDS or the resolver library.

mod message;
mod metrics;
mod origin;
mod server;
mod table;

use std::net::SocketAddr;
use std::time::Duration;

pub use origin::DnsOrigin;
pub use server::DnsServer;
pub use table::{Answer, DnsTable};

/// Where and how the DNS server answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    /// UDP and TCP listen address (the same port for both); port 0 picks a free port.
    pub bind: SocketAddr,
    /// TTL of positive answers. Short on purpose: it is how late DNS callers may see a
    /// withdrawal.
    pub ttl: Duration,
    /// TTL of negative answers (`NXDOMAIN`, NODATA), carried as the SOA's minimum and TTL
    /// (RFC 2308).
    pub negative_ttl: Duration,
    /// The domain served, e.g. `waymark.` (a trailing dot is optional; matched without case).
    pub domain: String,
    /// Concurrent TCP connections; further connections are closed at once and counted.
    pub tcp_connections_max: usize,
    /// A TCP connection that sends no complete query for this long is closed.
    pub tcp_idle_timeout: Duration,
}

impl DnsConfig {
    /// Default positive TTL.
    pub const TTL_DEFAULT: Duration = Duration::from_secs(5);
    /// Default negative TTL.
    pub const NEGATIVE_TTL_DEFAULT: Duration = Duration::from_secs(2);
    /// Default domain.
    pub const DOMAIN_DEFAULT: &'static str = "waymark.";
    /// Default limit on concurrent TCP connections.
    pub const TCP_CONNECTIONS_MAX_DEFAULT: usize = 128;
    /// Default TCP idle timeout.
    pub const TCP_IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
}

impl Default for DnsConfig {
    /// Loopback port 8600 (Consul's DNS port), 5 s TTL, 2 s negative TTL, `waymark.`.
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8600)),
            ttl: Self::TTL_DEFAULT,
            negative_ttl: Self::NEGATIVE_TTL_DEFAULT,
            domain: Self::DOMAIN_DEFAULT.to_owned(),
            tcp_connections_max: Self::TCP_CONNECTIONS_MAX_DEFAULT,
            tcp_idle_timeout: Self::TCP_IDLE_TIMEOUT_DEFAULT,
        }
    }
}

/// Why the DNS server could not start. Nothing is left running after any of them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DnsError {
    /// The configured domain is not a usable DNS name. Fix the configuration; retrying
    /// cannot help.
    #[error("dns domain {domain:?} is invalid: {reason}")]
    Domain {
        /// The configured domain.
        domain: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A listening socket could not be bound (address in use, not permitted, no such
    /// address). An operator must free the port or choose another one.
    #[error("dns cannot bind {transport} on {addr}")]
    Bind {
        /// `udp` or `tcp`.
        transport: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// Started outside a tokio runtime: a bug in the caller, which must call
    /// [`DnsServer::start`] from within one.
    #[error("dns server started outside a tokio runtime")]
    NoRuntime,
}

/// The pure message path, otherwise private, for the fuzz targets (`fuzz/`) only.
#[doc(hidden)]
pub mod fuzzing {
    use super::message::{self, Outcome, Transport};
    use super::{DnsOrigin, DnsTable};

    /// The bytes the server would send back for `request` (`None`: nothing is sent).
    pub fn respond(
        table: &DnsTable,
        origin: &DnsOrigin,
        request: &[u8],
        tcp: bool,
        rotation: usize,
    ) -> Option<Vec<u8>> {
        let transport = if tcp { Transport::Tcp } else { Transport::Udp };
        match message::respond(table, origin, request, transport, rotation) {
            Outcome::Answered { reply, .. } | Outcome::Malformed { reply, .. } => reply,
        }
    }
}
