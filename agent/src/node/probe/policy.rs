//! Which addresses the prober may connect to.
//!
//! A probe target's address comes from the registry, and a registration (or an operator's
//! external endpoint) can name any address at all. Without a policy the prober would be a
//! tool for whoever registers: it would connect from inside the host to the host's own
//! loopback services, to link-local neighbours, and to the cloud's instance metadata
//! service (whose answer a failing check would quote back as its detail).
//!
//! So before a target is scheduled its address is classified, and these are refused unless
//! the agent's configuration allows them (`[agent.probe] allow_cidrs`):
//!
//! | class | addresses |
//! |---|---|
//! | `cloud_metadata` | `169.254.169.254`, `fd00:ec2::254`, `100.100.100.200` |
//! | `loopback` | `127.0.0.0/8`, `::1` |
//! | `link_local` | `169.254.0.0/16`, `fe80::/10` |
//! | `unspecified` | `0.0.0.0/8`, `::` |
//! | `multicast` | `224.0.0.0/4`, `ff00::/8` |
//! | `broadcast` | `255.255.255.255` |
//!
//! IPv4-mapped IPv6 addresses (`::ffff:127.0.0.1`) are judged as the IPv4 address they map.
//! A cloud metadata address is allowed only by an entry naming exactly that address (a
//! `/32` or `/128`), never by a wider range that happens to contain it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Instance metadata services of the clouds waymark runs in (AWS, GCP and Azure share the
/// IPv4 one; AWS's IPv6 one; Alibaba's).
const METADATA: [IpAddr; 3] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
];

/// An address range, `addr/prefix` (a bare address is the range of that address alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// Why a range was refused while parsing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an address range (addr/prefix, e.g. 127.0.0.0/8): {reason}")]
pub struct CidrError {
    text: String,
    reason: &'static str,
}

/// Why an address may not be probed. Nothing is probed; the target stays silent (which the
/// evaluator reads as `unknown`, not failing), and the refusal is counted and listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Denied {
    /// A cloud instance metadata service.
    CloudMetadata,
    /// The host itself.
    Loopback,
    /// A link-local neighbour.
    LinkLocal,
    /// An unspecified ("this host/network") address.
    Unspecified,
    /// A multicast group.
    Multicast,
    /// The limited broadcast address.
    Broadcast,
}

/// The address policy: every address is allowed except the classes of [`Denied`], which
/// are allowed only inside `allow`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    allow: Vec<Cidr>,
}

// === impl Cidr ===

impl Cidr {
    /// The range `addr/prefix`; `None` if the prefix is longer than the address. An
    /// IPv4-mapped IPv6 range of at least `/96` is kept as the IPv4 range it maps.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let bits = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix > bits {
            return None;
        }
        match (addr, addr.to_canonical()) {
            (IpAddr::V6(_), v4 @ IpAddr::V4(_)) if prefix >= 96 => Some(Self {
                addr: v4,
                prefix: prefix - 96,
            }),
            _ => Some(Self { addr, prefix }),
        }
    }

    /// Whether `ip` is inside the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }

    /// Whether the range is one address.
    fn is_single(&self) -> bool {
        match self.addr {
            IpAddr::V4(_) => self.prefix == 32,
            IpAddr::V6(_) => self.prefix == 128,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| CidrError {
            text: s.to_owned(),
            reason,
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad("not an IP address"))?;
        let full = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => full,
            Some(p) => p
                .parse::<u8>()
                .map_err(|_| bad("the prefix is not a number"))?,
        };
        Self::new(addr, prefix).ok_or_else(|| bad("the prefix is longer than the address"))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

// === impl Denied ===

impl Denied {
    /// The class of `ip`, if it is one the policy refuses by default.
    pub fn of(ip: IpAddr) -> Option<Self> {
        let ip = ip.to_canonical();
        if METADATA.contains(&ip) {
            return Some(Self::CloudMetadata);
        }
        match ip {
            IpAddr::V4(v4) => {
                if v4.is_loopback() {
                    Some(Self::Loopback)
                } else if v4.is_link_local() {
                    Some(Self::LinkLocal)
                } else if v4.octets()[0] == 0 {
                    Some(Self::Unspecified)
                } else if v4.is_multicast() {
                    Some(Self::Multicast)
                } else if v4.is_broadcast() {
                    Some(Self::Broadcast)
                } else {
                    None
                }
            }
            IpAddr::V6(v6) => {
                if v6.is_loopback() {
                    Some(Self::Loopback)
                } else if v6.segments()[0] & 0xffc0 == 0xfe80 {
                    Some(Self::LinkLocal)
                } else if v6.is_unspecified() {
                    Some(Self::Unspecified)
                } else if v6.is_multicast() {
                    Some(Self::Multicast)
                } else {
                    None
                }
            }
        }
    }

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CloudMetadata => "cloud_metadata",
            Self::Loopback => "loopback",
            Self::LinkLocal => "link_local",
            Self::Unspecified => "unspecified",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
        }
    }
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl AddressPolicy ===

impl AddressPolicy {
    /// Refuse the [`Denied`] classes except inside `allow`.
    pub fn new(allow: Vec<Cidr>) -> Self {
        Self { allow }
    }

    /// Allow everything, loopback and metadata included. Tests of the prober itself only.
    pub fn allow_all() -> Self {
        let mut allow = vec![
            Cidr {
                addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                prefix: 0,
            },
            Cidr {
                addr: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                prefix: 0,
            },
        ];
        allow.extend(METADATA.map(|addr| Cidr {
            addr,
            prefix: if addr.is_ipv4() { 32 } else { 128 },
        }));
        Self { allow }
    }

    /// The ranges allowed.
    pub fn allowed(&self) -> &[Cidr] {
        &self.allow
    }

    /// Whether `ip` may be probed.
    pub fn check(&self, ip: IpAddr) -> Result<(), Denied> {
        let Some(denied) = Denied::of(ip) else {
            return Ok(());
        };
        let allowed = self
            .allow
            .iter()
            .any(|c| c.contains(ip) && (denied != Denied::CloudMetadata || c.is_single()));
        if allowed { Ok(()) } else { Err(denied) }
    }
}

#[cfg(test)]
#[path = "policy_test.rs"]
mod tests;
