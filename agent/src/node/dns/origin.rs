//! The served domain: its name, TTLs, SOA and the names of address records. Pure.

use std::fmt::Write as _;
use std::net::IpAddr;

use hickory_proto::rr::rdata::SOA;
use hickory_proto::rr::{Name, RData, Record};

use super::{DnsConfig, DnsError};

/// SOA refresh, retry and expire: meaningless without zone transfers (none are served), set
/// to common values so tools that read them are not surprised.
const SOA_REFRESH_S: i32 = 3_600;
const SOA_RETRY_S: i32 = 600;
const SOA_EXPIRE_S: i32 = 86_400;

/// The domain the server is authoritative for, with its TTLs: what [`super::DnsTable`] needs
/// to turn a question into records. Built once from a [`DnsConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsOrigin {
    /// The domain, lower-case, fully qualified.
    domain: Name,
    /// `addr.<domain>`.
    addr_domain: Name,
    /// `ns.<domain>` (the SOA's primary name server).
    mname: Name,
    /// `hostmaster.<domain>` (the SOA's mailbox).
    rname: Name,
    ttl_s: u32,
    negative_ttl_s: u32,
}

impl DnsOrigin {
    /// The origin `config` describes. `Err` if its domain is not a usable DNS name (empty, the
    /// root, or so long that `<address>.addr.<domain>` would not fit in 255 bytes).
    pub fn new(config: &DnsConfig) -> Result<Self, DnsError> {
        let invalid = |reason| DnsError::Domain {
            domain: config.domain.clone(),
            reason,
        };
        let mut domain = Name::from_ascii(config.domain.trim())
            .map_err(|_| invalid("not a domain name"))?
            .to_lowercase();
        domain.set_fqdn(true);
        if domain.is_root() {
            return Err(invalid("the root cannot be served"));
        }
        let sub = |label: &str| {
            Name::from_labels([label.as_bytes()])
                .and_then(|n| n.append_domain(&domain))
                .map_err(|_| invalid("too long"))
        };
        let addr_domain = sub("addr")?;
        // The longest name answered: an IPv6 address in hex under `addr.`.
        Name::from_labels([[b'0'; 32].as_slice()])
            .and_then(|n| n.append_domain(&addr_domain))
            .map_err(|_| invalid("too long"))?;
        Ok(Self {
            mname: sub("ns")?,
            rname: sub("hostmaster")?,
            addr_domain,
            domain,
            ttl_s: seconds(config.ttl),
            negative_ttl_s: seconds(config.negative_ttl),
        })
    }

    /// The served domain, lower-case and fully qualified.
    pub fn domain(&self) -> &Name {
        &self.domain
    }

    /// TTL of positive answers, in seconds.
    pub fn ttl_s(&self) -> u32 {
        self.ttl_s
    }

    /// TTL of negative answers, in seconds.
    pub fn negative_ttl_s(&self) -> u32 {
        self.negative_ttl_s
    }

    /// The labels of `name` below the domain, lower-case, leftmost first; `None` if `name` is
    /// not the domain or below it.
    pub(super) fn relative_labels(&self, name: &Name) -> Option<Vec<String>> {
        if !self.domain.zone_of(name) {
            return None;
        }
        let below = name.iter().len() - self.domain.iter().len();
        let labels = name
            .iter()
            .take(below)
            .map(|label| String::from_utf8_lossy(label).to_ascii_lowercase())
            .collect();
        Some(labels)
    }

    /// The SOA record, for the answer to an SOA question and the authority section of
    /// negative answers (RFC 2308: the negative TTL is the smaller of its TTL and minimum).
    pub(super) fn soa(&self, serial: u32) -> Record {
        let soa = SOA::new(
            self.mname.clone(),
            self.rname.clone(),
            serial,
            SOA_REFRESH_S,
            SOA_RETRY_S,
            SOA_EXPIRE_S,
            self.negative_ttl_s,
        );
        Record::from_rdata(self.domain.clone(), self.negative_ttl_s, RData::SOA(soa))
    }

    /// `<hex>.addr.<domain>`: the name an SRV answer targets for `ip` (Consul's form: 8 hex
    /// digits for IPv4, 32 for IPv6). `None` only if the name cannot be built, which
    /// [`DnsOrigin::new`] rules out.
    pub(super) fn addr_name(&self, ip: IpAddr) -> Option<Name> {
        Name::from_labels([hex_label(ip).as_bytes()])
            .and_then(|n| n.append_domain(&self.addr_domain))
            .ok()
    }
}

/// An address as Consul spells it in `addr` names: its bytes in lower-case hex.
pub(super) fn hex_label(ip: IpAddr) -> String {
    let bytes: Vec<u8> = match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _infallible = write!(out, "{b:02x}");
    }
    out
}

/// The address an `addr` label spells: 8 hex digits for IPv4, 32 for IPv6 (either case).
pub(super) fn parse_hex_label(label: &str) -> Option<IpAddr> {
    fn octets<const N: usize>(label: &str) -> Option<[u8; N]> {
        let mut out = [0u8; N];
        for (i, byte) in out.iter_mut().enumerate() {
            let pair = label.get(2 * i..2 * i + 2)?;
            *byte = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(out)
    }
    if !label.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    match label.len() {
        8 => octets::<4>(label).map(IpAddr::from),
        32 => octets::<16>(label).map(IpAddr::from),
        _ => None,
    }
}

/// Whole seconds, saturating at `u32::MAX`.
fn seconds(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}
