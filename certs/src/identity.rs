//! Workload identities: SVID-shaped `spiffe://` URIs parsed strictly into types.
//!
//! Every control-plane signal in waymark is attributed to one of four kinds of identity:
//!
//! ```text
//! spiffe://<td>/region/<r>/node/<n>                     node agent
//! spiffe://<td>/region/<r>/authority/<id>               authority member
//! spiffe://<td>/region/<r>/service/<s>/instance/<id>    workload instance
//! spiffe://<td>/operator/<name>                         person or tool using the policy API
//! ```
//!
//! Pure: no IO, no clock. Parsing accepts only the canonical spelling, so
//! `parse(display(x)) == x` and `display(parse(s)) == s` for every accepted `s`; anything
//! else is a typed [`IdentityError`]. CA certificates carry a [`CaScope`] URI instead
//! (`spiffe://<td>` for the estate root, `spiffe://<td>/region/<r>` for an intermediate).

use std::fmt;
use std::str::FromStr;

/// Longest identity URI accepted, in bytes (the SPIFFE ID limit).
pub const IDENTITY_LEN_MAX: usize = 2048;
/// Longest trust domain accepted, in bytes.
pub const TRUST_DOMAIN_LEN_MAX: usize = 255;
/// Longest single path segment (region, node, service, … name) accepted, in bytes.
pub const NAME_LEN_MAX: usize = 128;

const SCHEME: &str = "spiffe://";

/// Why a string is not a waymark identity. Parsing changes nothing; the caller should
/// refuse the input (a certificate carrying it, a CLI argument) and report the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The input was empty. Nothing changed; supply an identity.
    #[error("identity is empty")]
    Empty,
    /// The input is longer than [`IDENTITY_LEN_MAX`]. Nothing changed; shorten the names.
    #[error("identity is {len} bytes, longer than the {IDENTITY_LEN_MAX} allowed")]
    TooLong {
        /// Length of the refused input.
        len: usize,
    },
    /// The input does not start with `spiffe://`. Nothing changed; use a spiffe URI.
    #[error("identity must start with \"spiffe://\"")]
    NotSpiffe,
    /// The input has a query, fragment, port, user info or percent-encoding. Nothing
    /// changed; identities are plain paths.
    #[error("identity must not contain '?', '#', '%', '@' or ':' after the scheme")]
    ExtraUriParts,
    /// The trust domain is empty, too long or has a character outside `[a-z0-9._-]`.
    /// Nothing changed; fix the trust domain.
    #[error(
        "trust domain {trust_domain:?} is not valid (lower-case letters, digits, '.', '-', '_')"
    )]
    BadTrustDomain {
        /// The refused trust domain.
        trust_domain: String,
    },
    /// A path segment is empty, `.`/`..`, too long or has a character outside
    /// `[A-Za-z0-9._-]`. Nothing changed; fix the name.
    #[error("name {name:?} is not valid (letters, digits, '.', '-', '_'; not '.' or '..')")]
    BadName {
        /// The refused segment.
        name: String,
    },
    /// The path does not match any of the four identity shapes. Nothing changed; use one of
    /// the documented forms.
    #[error("path {path:?} is not a node, authority, workload or operator identity")]
    UnknownShape {
        /// The path after the trust domain.
        path: String,
    },
}

/// A SPIFFE trust domain: the estate's name, e.g. `mesh.example.org`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TrustDomain(String);

/// One validated path segment: a region, node, authority member, service, instance or
/// operator name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(String);

/// The four kinds of identity. A port accepts a [`KindSet`] of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IdentityKind {
    /// A node agent: probes, gossips and serves local xDS.
    Node,
    /// A member of a region's authority group.
    Authority,
    /// A workload instance of a service.
    Workload,
    /// A person or tool using the policy API.
    Operator,
}

/// Who an identity names, beneath its trust domain.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Subject {
    /// `region/<region>/node/<node>`
    Node {
        /// Region the node lives in.
        region: Name,
        /// Node name.
        node: Name,
    },
    /// `region/<region>/authority/<member>`
    Authority {
        /// Region the authority group serves.
        region: Name,
        /// Member id.
        member: Name,
    },
    /// `region/<region>/service/<service>/instance/<instance>`
    Workload {
        /// Region the instance runs in.
        region: Name,
        /// Service name.
        service: Name,
        /// Instance id.
        instance: Name,
    },
    /// `operator/<name>`
    Operator {
        /// Operator name.
        name: Name,
    },
}

/// A parsed, validated workload identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Identity {
    trust_domain: TrustDomain,
    subject: Subject,
}

/// What a CA certificate may sign for: the whole estate (root) or one region (intermediate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaScope {
    /// `spiffe://<td>`: the estate root.
    Estate(TrustDomain),
    /// `spiffe://<td>/region/<r>`: a region intermediate.
    Region(TrustDomain, Name),
}

/// A small set of [`IdentityKind`]s: what a port accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KindSet(u8);

// === impl TrustDomain ===

impl TrustDomain {
    /// Validates a trust domain.
    pub fn new(s: &str) -> Result<Self, IdentityError> {
        let ok = !s.is_empty()
            && s.len() <= TRUST_DOMAIN_LEN_MAX
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(IdentityError::BadTrustDomain {
                trust_domain: s.to_owned(),
            })
        }
    }

    /// The trust domain as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for TrustDomain {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

// === impl Name ===

impl Name {
    /// Validates one path segment.
    pub fn new(s: &str) -> Result<Self, IdentityError> {
        let ok = !s.is_empty()
            && s.len() <= NAME_LEN_MAX
            && s != "."
            && s != ".."
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(IdentityError::BadName { name: s.to_owned() })
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Name {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

// === impl Identity ===

impl Identity {
    /// Builds an identity from already-validated parts.
    pub fn new(trust_domain: TrustDomain, subject: Subject) -> Self {
        Self {
            trust_domain,
            subject,
        }
    }

    /// Parses the canonical `spiffe://` form; see the module doc for the shapes.
    pub fn parse(s: &str) -> Result<Self, IdentityError> {
        let (trust_domain, segments) = split_uri(s)?;
        // split_uri validated every segment already.
        let n = |s: &str| Name(s.to_owned());
        let subject = match segments.as_slice() {
            ["region", r, "node", node] => Subject::Node {
                region: n(r),
                node: n(node),
            },
            ["region", r, "authority", m] => Subject::Authority {
                region: n(r),
                member: n(m),
            },
            ["region", r, "service", svc, "instance", i] => Subject::Workload {
                region: n(r),
                service: n(svc),
                instance: n(i),
            },
            ["operator", name] => Subject::Operator { name: n(name) },
            _ => {
                return Err(IdentityError::UnknownShape {
                    path: segments.join("/"),
                });
            }
        };
        Ok(Self::new(trust_domain, subject))
    }

    /// The trust domain this identity belongs to.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// Who the identity names.
    pub fn subject(&self) -> &Subject {
        &self.subject
    }

    /// The identity's kind.
    pub fn kind(&self) -> IdentityKind {
        match self.subject {
            Subject::Node { .. } => IdentityKind::Node,
            Subject::Authority { .. } => IdentityKind::Authority,
            Subject::Workload { .. } => IdentityKind::Workload,
            Subject::Operator { .. } => IdentityKind::Operator,
        }
    }

    /// The region, for every kind except operators.
    pub fn region(&self) -> Option<&Name> {
        match &self.subject {
            Subject::Node { region, .. }
            | Subject::Authority { region, .. }
            | Subject::Workload { region, .. } => Some(region),
            Subject::Operator { .. } => None,
        }
    }

    /// The member name, for authority identities only: `<member>` of
    /// `region/<r>/authority/<member>`. Federation links are per member, so a peer is
    /// recognised by its region and this name together.
    pub fn member(&self) -> Option<&Name> {
        match &self.subject {
            Subject::Authority { member, .. } => Some(member),
            Subject::Node { .. } | Subject::Workload { .. } | Subject::Operator { .. } => None,
        }
    }

    /// The path segments after the trust domain, e.g. `["region", "eu", "node", "n1"]`.
    /// Each is a validated [`Name`] or a fixed keyword, so they are safe as file names.
    pub fn path_segments(&self) -> Vec<&str> {
        match &self.subject {
            Subject::Node { region, node } => {
                vec!["region", region.as_str(), "node", node.as_str()]
            }
            Subject::Authority { region, member } => {
                vec!["region", region.as_str(), "authority", member.as_str()]
            }
            Subject::Workload {
                region,
                service,
                instance,
            } => vec![
                "region",
                region.as_str(),
                "service",
                service.as_str(),
                "instance",
                instance.as_str(),
            ],
            Subject::Operator { name } => vec!["operator", name.as_str()],
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}", self.trust_domain)?;
        for segment in self.path_segments() {
            write!(f, "/{segment}")?;
        }
        Ok(())
    }
}

impl FromStr for Identity {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

// === impl CaScope ===

impl CaScope {
    /// Parses `spiffe://<td>` or `spiffe://<td>/region/<r>`.
    pub fn parse(s: &str) -> Result<Self, IdentityError> {
        let (trust_domain, segments) = split_uri(s)?;
        match segments.as_slice() {
            [] => Ok(Self::Estate(trust_domain)),
            ["region", r] => Ok(Self::Region(trust_domain, Name::new(r)?)),
            _ => Err(IdentityError::UnknownShape {
                path: segments.join("/"),
            }),
        }
    }

    /// The trust domain of the scope.
    pub fn trust_domain(&self) -> &TrustDomain {
        match self {
            Self::Estate(td) | Self::Region(td, _) => td,
        }
    }
}

impl fmt::Display for CaScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Estate(td) => write!(f, "{SCHEME}{td}"),
            Self::Region(td, r) => write!(f, "{SCHEME}{td}/region/{r}"),
        }
    }
}

// === impl IdentityKind / KindSet ===

impl IdentityKind {
    /// Every kind, in a fixed order.
    pub const ALL: [IdentityKind; 4] =
        [Self::Node, Self::Authority, Self::Workload, Self::Operator];

    /// Lower-case name, used in messages and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Authority => "authority",
            Self::Workload => "workload",
            Self::Operator => "operator",
        }
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for IdentityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl KindSet {
    /// Accepts nothing.
    pub const EMPTY: KindSet = KindSet(0);
    /// Accepts every kind.
    pub const ALL: KindSet = KindSet(0b1111);

    /// A set holding exactly `kind`.
    pub const fn only(kind: IdentityKind) -> Self {
        Self(kind.bit())
    }

    /// This set plus `kind`.
    pub const fn with(self, kind: IdentityKind) -> Self {
        Self(self.0 | kind.bit())
    }

    /// Whether `kind` is in the set.
    pub const fn contains(self, kind: IdentityKind) -> bool {
        self.0 & kind.bit() != 0
    }
}

impl fmt::Display for KindSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kinds: Vec<&str> = IdentityKind::ALL
            .iter()
            .filter(|k| self.contains(**k))
            .map(|k| k.as_str())
            .collect();
        if kinds.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&kinds.join(", "))
        }
    }
}

// === helpers ===

/// Splits `spiffe://<td>/<a>/<b>…` into a validated trust domain and raw segments.
fn split_uri(s: &str) -> Result<(TrustDomain, Vec<&str>), IdentityError> {
    if s.is_empty() {
        return Err(IdentityError::Empty);
    }
    if s.len() > IDENTITY_LEN_MAX {
        return Err(IdentityError::TooLong { len: s.len() });
    }
    let rest = s.strip_prefix(SCHEME).ok_or(IdentityError::NotSpiffe)?;
    if rest.bytes().any(|b| b"?#%@:".contains(&b)) {
        return Err(IdentityError::ExtraUriParts);
    }
    let (td, path) = match rest.split_once('/') {
        Some((td, path)) => (td, Some(path)),
        None => (rest, None),
    };
    let trust_domain = TrustDomain::new(td)?;
    let segments = match path {
        None => Vec::new(),
        // "spiffe://td/" has one empty segment, which Name::new refuses below.
        Some(path) => path.split('/').collect(),
    };
    if let Some(bad) = segments.iter().find(|seg| Name::new(seg).is_err()) {
        return Err(IdentityError::BadName {
            name: (*bad).to_owned(),
        });
    }
    Ok((trust_domain, segments))
}

#[cfg(test)]
#[path = "identity_test.rs"]
mod tests;
