//! Peer addresses as operators write them: `host:port`, where the host is an IP address or a
//! DNS name.
//!
//! Orchestrators hand out stable *names* and unstable *addresses*: a StatefulSet pod keeps
//! `waymark-authority-0.waymark-authority.<ns>.svc.cluster.local` across restarts, but not
//! its IP. So a name is kept as written and resolved each time it is used (a gossip announce,
//! a Raft connection), never once at start-up. [`HostPort`] checks the shape when the
//! configuration is read; [`HostPort::resolve`] asks the system resolver when it is used.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest DNS name (RFC 1035, without the trailing dot).
const NAME_LEN_MAX: usize = 253;

/// The longest DNS label.
const LABEL_LEN_MAX: usize = 63;

/// A peer's `host:port`: an IP literal (`10.0.0.1:7946`, `[fd00::1]:7946`) or a DNS name
/// (`waymark-authority.waymark.svc.cluster.local:7946`) with a non-zero port.
///
/// Serialized as the string it was parsed from (IPv6 in brackets), so a configuration
/// printed with `--print-config` reads back the same.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPort {
    host: Host,
    port: u16,
}

/// The host part of a [`HostPort`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Host {
    /// An IP literal: used as is, never resolved.
    Ip(IpAddr),
    /// A DNS name (RFC 1123 labels), resolved at each use.
    Name(String),
}

/// Why a `host:port` was refused. Nothing is resolved while parsing, so every variant is about
/// the text alone: fix the configuration or the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostPortError {
    /// No `:port` after the host.
    #[error("no port: expected host:port")]
    MissingPort,
    /// The port is not a number in 1..=65535.
    #[error("port {0:?} is not in 1..=65535")]
    BadPort(String),
    /// The host is neither an IP address nor a DNS name.
    #[error("host {host:?} is not an IP address or a DNS name: {reason}")]
    BadHost {
        /// The host as written.
        host: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Why a name did not resolve. The caller keeps what it had and tries again at its next use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// The resolver failed (no such name, no server reachable, …).
    #[error("resolving {name}")]
    Lookup {
        /// The name asked for.
        name: String,
        /// The resolver's answer.
        #[source]
        source: std::io::Error,
    },
    /// The resolver answered with no address.
    #[error("{name} has no address")]
    NoAddress {
        /// The name asked for.
        name: String,
    },
}

// === impl HostPort ===

impl HostPort {
    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The socket address, when the host is an IP literal.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match self.host {
            Host::Ip(ip) => Some(SocketAddr::new(ip, self.port)),
            Host::Name(_) => None,
        }
    }

    /// Every address the host stands for now, sorted and without duplicates. An IP literal
    /// answers at once; a name asks the system resolver (`getaddrinfo` on a blocking
    /// thread), so callers that must not wait should bound this with a timeout.
    pub async fn resolve(&self) -> Result<Vec<SocketAddr>, ResolveError> {
        let name = match &self.host {
            Host::Ip(ip) => return Ok(vec![SocketAddr::new(*ip, self.port)]),
            Host::Name(name) => name,
        };
        let found = tokio::net::lookup_host((name.as_str(), self.port))
            .await
            .map_err(|source| ResolveError::Lookup {
                name: name.clone(),
                source,
            })?;
        let mut addrs: Vec<SocketAddr> = found.collect();
        addrs.sort_unstable();
        addrs.dedup();
        if addrs.is_empty() {
            return Err(ResolveError::NoAddress { name: name.clone() });
        }
        Ok(addrs)
    }
}

impl From<SocketAddr> for HostPort {
    fn from(addr: SocketAddr) -> Self {
        Self {
            host: Host::Ip(addr.ip()),
            port: addr.port(),
        }
    }
}

impl FromStr for HostPort {
    type Err = HostPortError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(addr) = s.parse::<SocketAddr>() {
            if addr.port() == 0 {
                return Err(HostPortError::BadPort("0".into()));
            }
            return Ok(addr.into());
        }
        let (host, port) = s.rsplit_once(':').ok_or(HostPortError::MissingPort)?;
        let port = match port.parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => return Err(HostPortError::BadPort(port.to_owned())),
        };
        let bad = |reason| HostPortError::BadHost {
            host: host.to_owned(),
            reason,
        };
        if host.starts_with('[') || host.contains(':') {
            return Err(bad("an IPv6 address goes in brackets: [addr]:port"));
        }
        check_name(host).map_err(bad)?;
        Ok(Self {
            host: Host::Name(host.to_owned()),
            port,
        })
    }
}

/// RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens, one
/// optional trailing dot; an all-digit last label is a mistyped IPv4 address, not a name.
fn check_name(host: &str) -> Result<(), &'static str> {
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > NAME_LEN_MAX {
        return Err("longer than 253 characters");
    }
    let mut last = "";
    for label in name.split('.') {
        if label.is_empty() || label.len() > LABEL_LEN_MAX {
            return Err("each label is 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err("letters, digits and hyphens only");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label neither starts nor ends with a hyphen");
        }
        last = label;
    }
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return Err("looks like an IPv4 address but is not one");
    }
    Ok(())
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(ip) => SocketAddr::new(*ip, self.port).fmt(f),
            Host::Name(name) => write!(f, "{name}:{}", self.port),
        }
    }
}

impl Serialize for HostPort {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HostPort {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Test peers for the project's HTTP clients.
#[cfg(test)]
pub(crate) mod test_support {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A loopback server that reads one request per connection and answers it with the raw
    /// bytes `answer` (or never, for `None`); returns its address.
    pub(crate) async fn answering_server(answer: Option<Vec<u8>>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let _ = s.read(&mut buf).await;
                    match answer {
                        Some(bytes) => {
                            let _ = s.write_all(&bytes).await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                });
            }
        });
        addr.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_literals_and_dns_names_parse_and_print_back_the_same() {
        for text in [
            "10.0.0.1:7946",
            "[fd00::1]:7946",
            "localhost:8500",
            "waymark-authority-0.waymark-authority.waymark.svc.cluster.local:8500",
            "ip-10-0-1-17.eu-west-1.compute.internal:7946",
            "example.org.:53",
        ] {
            let parsed: HostPort = text.parse().unwrap();
            assert_eq!(parsed.to_string(), text);
        }
        let ip: HostPort = "10.0.0.1:7946".parse().unwrap();
        assert_eq!(ip.socket_addr(), Some("10.0.0.1:7946".parse().unwrap()));
        let name: HostPort = "localhost:8500".parse().unwrap();
        assert_eq!(name.host(), &Host::Name("localhost".into()));
        assert_eq!((name.port(), name.socket_addr()), (8500, None));
    }

    /// Whether a refusal is the expected one.
    type Expected = fn(&HostPortError) -> bool;

    #[test]
    fn malformed_addresses_are_refused_with_the_reason() {
        let cases: [(&str, Expected); 11] = [
            ("localhost", |e| *e == HostPortError::MissingPort),
            ("localhost:", |e| matches!(e, HostPortError::BadPort(_))),
            ("localhost:0", |e| matches!(e, HostPortError::BadPort(_))),
            ("10.0.0.1:0", |e| matches!(e, HostPortError::BadPort(_))),
            ("localhost:65536", |e| {
                matches!(e, HostPortError::BadPort(_))
            }),
            (":8500", |e| matches!(e, HostPortError::BadHost { .. })),
            ("fd00::1:8500", |e| {
                matches!(e, HostPortError::BadHost { .. })
            }),
            (
                "10.0.0.300:8500",
                |e| matches!(e, HostPortError::BadHost { reason, .. } if reason.contains("IPv4")),
            ),
            ("under_score.example:80", |e| {
                matches!(e, HostPortError::BadHost { .. })
            }),
            ("-lead.example:80", |e| {
                matches!(e, HostPortError::BadHost { .. })
            }),
            ("a..b:80", |e| matches!(e, HostPortError::BadHost { .. })),
        ];
        for (text, expected) in cases {
            let e = text.parse::<HostPort>().unwrap_err();
            assert!(expected(&e), "{text}: {e}");
        }
        let long = format!("{}.example:80", "a".repeat(64));
        assert!(long.parse::<HostPort>().is_err(), "a 64-character label");
    }

    #[test]
    fn serde_round_trips_through_the_string_form_and_refuses_bad_text() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Wrap {
            seeds: Vec<HostPort>,
        }
        let w: Wrap = toml::from_str(r#"seeds = ["10.0.0.1:7946", "seed.example:7946"]"#).unwrap();
        let printed = toml::to_string(&w).unwrap();
        assert_eq!(toml::from_str::<Wrap>(&printed).unwrap(), w);
        let e = toml::from_str::<Wrap>(r#"seeds = ["seed.example"]"#).unwrap_err();
        assert!(e.to_string().contains("no port"), "{e}");
    }

    #[tokio::test]
    async fn an_ip_literal_resolves_to_itself_and_a_name_through_the_system_resolver() {
        let ip: HostPort = "127.0.0.1:7946".parse().unwrap();
        assert_eq!(
            ip.resolve().await.unwrap(),
            vec!["127.0.0.1:7946".parse::<SocketAddr>().unwrap()]
        );
        // `localhost` comes from the hosts file, so this needs no network.
        let name: HostPort = "localhost:7946".parse().unwrap();
        let addrs = name.resolve().await.unwrap();
        assert!(!addrs.is_empty());
        assert!(
            addrs
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 7946),
            "{addrs:?}"
        );
        // `.invalid` never resolves (RFC 6761).
        let nowhere: HostPort = "seed.invalid:7946".parse().unwrap();
        let e = nowhere.resolve().await.unwrap_err();
        assert!(e.to_string().contains("seed.invalid"), "{e}");
    }
}
