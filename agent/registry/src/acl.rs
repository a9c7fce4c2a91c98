//! Who may do what to a region (ADR-15): principals, grants and bearer tokens.
//!
//! A [`Principal`] is an identity a shell has *verified* — a client certificate's SPIFFE
//! URI, or a bearer token checked against [`Acl::authenticate`]. It is never a name a
//! client chose. An [`Action`] is what a request would do. [`Acl::authorize`] answers
//! whether any [`Grant`] covers the pair; nothing is allowed by default.
//!
//! Grants and tokens are replicated state: they change only through the commands in
//! [`AclCommand`], applied by [`Acl::apply`] on every replica alike. Only a token's
//! SHA-256 digest enters the log; the secret is shown once, to whoever minted it.
//!
//! The first grant comes from [`AclCommand::Bootstrap`], accepted once per region (as
//! `consul acl bootstrap` is): it gives the bootstrapping operator every capability and
//! every node agent of the region the two it needs to run (read; register on its own
//! node). Both are ordinary grants afterwards — listed, revocable, replaceable.
//!
//! Scope beyond grants — that a node registers only at its own addresses, a workload only
//! itself — needs facts a shell holds (the connection's address, gossip's view of the
//! node); the API checks those after `authorize`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use waymark_core::model::{NodeName, RegionName, ServiceName};

/// Most grants a region holds.
pub const GRANTS_MAX: usize = 10_000;
/// Most live tokens a region holds (expired ones are dropped as tokens change).
pub const TOKENS_MAX: usize = 10_000;
/// Longest principal or token name, in bytes.
pub const PRINCIPAL_NAME_LEN_MAX: usize = 128;
/// Longest token name, in bytes (`[a-z0-9-]`, so the bearer form parses unambiguously).
pub const TOKEN_NAME_LEN_MAX: usize = 64;
/// Longest token description, in bytes.
pub const TOKEN_DESCRIPTION_LEN_MAX: usize = 256;
/// Longest token lifetime: a year. Tokens are for browsers, CI and scrapers; people and
/// machines that act for longer hold certificates, which rotate.
pub const TOKEN_TTL_MS_MAX: u64 = 366 * 24 * 3600 * 1000;
/// The prefix of a bearer token: `wmt.<name>.<secret>`.
pub const TOKEN_PREFIX: &str = "wmt";

/// A verified identity making a request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Principal {
    /// A person or tool with an operator certificate (`spiffe://<td>/operator/<name>`).
    Operator {
        /// The operator's name.
        name: String,
    },
    /// A node agent (`…/region/<r>/node/<n>`).
    Node {
        /// Its region.
        region: RegionName,
        /// Its node.
        node: NodeName,
    },
    /// A workload instance (`…/region/<r>/service/<s>/instance/<i>`).
    Workload {
        /// Its region.
        region: RegionName,
        /// Its service.
        service: ServiceName,
        /// The instance its certificate names.
        instance: String,
    },
    /// An authority member (`…/region/<r>/authority/<id>`).
    Authority {
        /// Its region.
        region: RegionName,
        /// Its member id.
        member: String,
    },
    /// A bearer token, by name.
    Token {
        /// The token's name.
        name: String,
    },
}

/// Who a grant is for.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
pub enum Grantee {
    /// `operator/<name>`
    Operator(String),
    /// `token/<name>`
    Token(String),
    /// `node/<name>`
    Node(NodeName),
    /// `node/*`: every node agent of this region.
    AnyNode,
    /// `service/<name>`: every workload instance of a service, in this region.
    Service(ServiceName),
}

/// Which services a capability covers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceScope {
    /// `*`
    Any,
    /// One service.
    One(ServiceName),
}

/// Which nodes a registration capability covers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeScope {
    /// `own`: a node agent's own node; a workload's own instance.
    Own,
    /// `*`: any node (operators declaring or registering for others).
    Any,
    /// One node.
    One(NodeName),
}

/// What a grant allows. Written `read`, `register:own`, `register:*`,
/// `register:<node>`, `own:<service>` / `own:*`, `override:<service>` / `override:*`,
/// `evacuate`, `raft`, `acl`.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
pub enum Capability {
    /// Read the registry, views, audit, alarms and status.
    Read,
    /// Register, renew and deregister instances (and declare external endpoints) on the
    /// nodes in scope.
    Register(NodeScope),
    /// Write a service's contract and policy, and remove it.
    Own(ServiceScope),
    /// Mark instances of a service in or out of maintenance by hand.
    Override(ServiceScope),
    /// Evacuate zones and fail over peer regions.
    Evacuate,
    /// Add and remove Raft members.
    Raft,
    /// Manage grants and tokens.
    Acl,
}

/// One grant: a grantee may do what a capability allows.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Grant {
    /// Who.
    pub to: Grantee,
    /// What.
    pub can: Capability,
}

/// What a request would do, as `authorize` judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<'a> {
    /// Any read.
    Read,
    /// Register, renew or deregister an instance on this node.
    Register {
        /// The node the instance runs on.
        node: &'a NodeName,
    },
    /// Write this service's contract or policy.
    WriteService {
        /// The service.
        service: &'a ServiceName,
    },
    /// Override an instance of this service.
    Override {
        /// The service.
        service: &'a ServiceName,
    },
    /// Evacuate a zone or fail over a region.
    Evacuate,
    /// Change Raft membership.
    Raft,
    /// Change grants or tokens.
    Acl,
}

/// A bearer token as the registry keeps it: its digest, never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Its name (the principal it authenticates as is `token/<name>`).
    pub name: String,
    /// Hex SHA-256 of the secret.
    pub secret_sha256: String,
    /// Who minted it (a principal's display form).
    pub created_by: String,
    /// When it was minted (unix ms, the leader's stamp).
    pub created_at_ms: u64,
    /// When it stops authenticating (unix ms).
    pub expires_at_ms: u64,
    /// What it is for.
    #[serde(default)]
    pub description: String,
}

/// A change to grants or tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "acl")]
pub enum AclCommand {
    /// Create the first grants; refused once the region has been bootstrapped.
    Bootstrap {
        /// The operator who gets every capability.
        operator: String,
        /// A token stored with the same capabilities in the same step (the configured
        /// initial management token), so it is never seen with only some of them.
        #[serde(default)]
        token: Option<TokenRecord>,
    },
    /// Add a grant (idempotent).
    Grant {
        /// The grant.
        grant: Grant,
    },
    /// Remove a grant.
    Revoke {
        /// The grant.
        grant: Grant,
    },
    /// Add a token (its name must be free).
    PutToken {
        /// The token.
        token: TokenRecord,
    },
    /// Remove a token and every grant to it.
    RemoveToken {
        /// Its name.
        name: String,
    },
}

/// What an applied ACL command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "acl_result")]
pub enum AclApplied {
    /// The region was bootstrapped; these grants were created.
    Bootstrapped {
        /// The grants.
        grants: Vec<Grant>,
    },
    /// A grant was added (or was there already).
    Granted,
    /// A grant was removed.
    Revoked,
    /// A token was stored.
    TokenPut,
    /// A token and its grants were removed.
    TokenRemoved {
        /// How many grants went with it.
        grants: usize,
    },
}

/// Why an ACL command or a check was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AclError {
    /// The region was bootstrapped already.
    #[error("the region's access control was bootstrapped already")]
    AlreadyBootstrapped,
    /// A name is malformed.
    #[error("{field}: {reason}")]
    BadName {
        /// Which.
        field: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A grant or capability could not be read.
    #[error("{0}")]
    Malformed(String),
    /// No such grant.
    #[error("no grant {0}")]
    UnknownGrant(String),
    /// No such token.
    #[error("no token {0}")]
    UnknownToken(String),
    /// The token name is taken.
    #[error("a token named {0} exists")]
    TokenExists(String),
    /// A token's lifetime is out of range.
    #[error("token {name} expires at {expires_at_ms}, not within (now, now + TOKEN_TTL_MS_MAX]")]
    BadExpiry {
        /// The token.
        name: String,
        /// Its expiry.
        expires_at_ms: u64,
    },
    /// A token's digest is not 64 hex digits.
    #[error("token {0}: secret_sha256 must be 64 lowercase hex digits")]
    BadDigest(String),
    /// A ceiling was reached.
    #[error("the region holds {max} {what} at most")]
    Full {
        /// What.
        what: &'static str,
        /// The ceiling.
        max: usize,
    },
}

impl AclError {
    /// A stable label for API refusals and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::AlreadyBootstrapped => "already_bootstrapped",
            Self::BadName { .. } => "bad_name",
            Self::Malformed(_) => "malformed",
            Self::UnknownGrant(_) => "unknown_grant",
            Self::UnknownToken(_) => "unknown_token",
            Self::TokenExists(_) => "token_exists",
            Self::BadExpiry { .. } => "bad_expiry",
            Self::BadDigest(_) => "bad_digest",
            Self::Full { .. } => "acl_full",
        }
    }

    /// The field the refusal names, when the error carries one: a malformed name's
    /// field, or for a ceiling what reached it (`grants`, `tokens`), as
    /// [`RegistryError::TooMany`](crate::state::RegistryError::TooMany) names its list.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Self::BadName { field, .. } => Some(field),
            Self::Full { what, .. } => Some(what),
            Self::AlreadyBootstrapped
            | Self::Malformed(_)
            | Self::UnknownGrant(_)
            | Self::UnknownToken(_)
            | Self::TokenExists(_)
            | Self::BadExpiry { .. }
            | Self::BadDigest(_) => None,
        }
    }
}

/// Why a bearer token did not authenticate. Deliberately coarse towards the client (the
/// API answers 401 for all of them); the reason is for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    /// Not of the form `wmt.<name>.<secret>`.
    #[error("malformed")]
    Malformed,
    /// No token of that name.
    #[error("unknown")]
    Unknown,
    /// The secret does not match.
    #[error("wrong_secret")]
    WrongSecret,
    /// Past its expiry.
    #[error("expired")]
    Expired,
}

impl TokenRefusal {
    /// A label for metrics.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Unknown => "unknown",
            Self::WrongSecret => "wrong_secret",
            Self::Expired => "expired",
        }
    }
}

/// A refusal by [`Acl::authorize`]: the principal holds no grant for the action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{principal} holds no grant for {needed}")]
pub struct Denied {
    /// Who asked (display form).
    pub principal: String,
    /// The capability that would have allowed it (display form).
    pub needed: String,
}

/// The region's grants and tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acl {
    #[serde(default)]
    bootstrapped: bool,
    #[serde(default)]
    grants: BTreeSet<Grant>,
    #[serde(default)]
    tokens: BTreeMap<String, TokenRecord>,
}

// === impl Acl ===

impl Acl {
    /// Whether the region was bootstrapped.
    pub fn is_bootstrapped(&self) -> bool {
        self.bootstrapped
    }

    /// Every grant, in order.
    pub fn grants(&self) -> impl Iterator<Item = &Grant> {
        self.grants.iter()
    }

    /// Every token (digests only), by name.
    pub fn tokens(&self) -> impl Iterator<Item = &TokenRecord> {
        self.tokens.values()
    }

    /// The grants that apply to `principal` in `region` (the region the registry serves).
    pub fn grants_of<'a>(
        &'a self,
        principal: &'a Principal,
        region: &'a RegionName,
    ) -> impl Iterator<Item = &'a Grant> + 'a {
        self.grants
            .iter()
            .filter(move |g| g.to.covers(principal, region))
    }

    /// Whether `principal`, acting on the registry of `region`, may do `action`.
    /// Default deny: only a grant allows.
    pub fn authorize(
        &self,
        principal: &Principal,
        region: &RegionName,
        action: Action<'_>,
    ) -> Result<(), Denied> {
        if self
            .grants_of(principal, region)
            .any(|g| g.can.allows(principal, action))
        {
            return Ok(());
        }
        Err(Denied {
            principal: principal.to_string(),
            needed: action.needed(principal).to_string(),
        })
    }

    /// The principal a bearer token authenticates as, at `now_ms`.
    pub fn authenticate(&self, bearer: &str, now_ms: u64) -> Result<Principal, TokenRefusal> {
        let (name, secret) = parse_bearer(bearer).ok_or(TokenRefusal::Malformed)?;
        let record = self.tokens.get(name).ok_or(TokenRefusal::Unknown)?;
        if !digest_matches(&record.secret_sha256, secret) {
            return Err(TokenRefusal::WrongSecret);
        }
        if now_ms >= record.expires_at_ms {
            return Err(TokenRefusal::Expired);
        }
        Ok(Principal::Token {
            name: name.to_owned(),
        })
    }

    /// The checks that need no state.
    pub fn check(command: &AclCommand) -> Result<(), AclError> {
        match command {
            AclCommand::Bootstrap { operator, token } => {
                principal_name("operator", operator)?;
                token.as_ref().map_or(Ok(()), check_token)
            }
            AclCommand::Grant { grant } | AclCommand::Revoke { grant } => grant.to.check(),
            AclCommand::PutToken { token } => check_token(token),
            AclCommand::RemoveToken { name } => token_name(name),
        }
    }

    /// Apply one command at the registry clock `now_ms`. Total: a refusal changes
    /// nothing. Expired tokens are dropped whenever tokens change, so the table holds
    /// live tokens only.
    pub fn apply(&mut self, command: AclCommand, now_ms: u64) -> Result<AclApplied, AclError> {
        Self::check(&command)?;
        match command {
            AclCommand::Bootstrap { operator, token } => {
                if self.bootstrapped {
                    return Err(AclError::AlreadyBootstrapped);
                }
                let mut grants = bootstrap_grants(&operator);
                if let Some(t) = &token {
                    live_for(t, now_ms)?;
                    let own: Vec<Grant> = grants
                        .iter()
                        .filter(|g| g.to == Grantee::Operator(operator.clone()))
                        .map(|g| Grant {
                            to: Grantee::Token(t.name.clone()),
                            can: g.can.clone(),
                        })
                        .collect();
                    grants.extend(own);
                }
                if self.grants.len().saturating_add(grants.len()) > GRANTS_MAX {
                    return Err(AclError::Full {
                        what: "grants",
                        max: GRANTS_MAX,
                    });
                }
                if let Some(t) = token {
                    // Bootstrapping is the first change, so the token table is empty.
                    self.tokens.insert(t.name.clone(), t);
                }
                self.bootstrapped = true;
                self.grants.extend(grants.iter().cloned());
                Ok(AclApplied::Bootstrapped { grants })
            }
            other => self.apply_change(other, now_ms),
        }
    }

    fn apply_change(&mut self, command: AclCommand, now_ms: u64) -> Result<AclApplied, AclError> {
        match command {
            AclCommand::Bootstrap { .. } => Err(AclError::AlreadyBootstrapped),
            AclCommand::Grant { grant } => {
                if !self.grants.contains(&grant) && self.grants.len() >= GRANTS_MAX {
                    return Err(AclError::Full {
                        what: "grants",
                        max: GRANTS_MAX,
                    });
                }
                if let Grantee::Token(name) = &grant.to
                    && !self.tokens.contains_key(name)
                {
                    return Err(AclError::UnknownToken(name.clone()));
                }
                self.grants.insert(grant);
                Ok(AclApplied::Granted)
            }
            AclCommand::Revoke { grant } => {
                if !self.grants.remove(&grant) {
                    return Err(AclError::UnknownGrant(grant.to_string()));
                }
                Ok(AclApplied::Revoked)
            }
            AclCommand::PutToken { token } => {
                live_for(&token, now_ms)?;
                if self.tokens.contains_key(&token.name) {
                    return Err(AclError::TokenExists(token.name));
                }
                let live = self
                    .tokens
                    .values()
                    .filter(|t| t.expires_at_ms > now_ms)
                    .count();
                if live >= TOKENS_MAX {
                    return Err(AclError::Full {
                        what: "tokens",
                        max: TOKENS_MAX,
                    });
                }
                self.drop_expired(now_ms);
                self.tokens.insert(token.name.clone(), token);
                Ok(AclApplied::TokenPut)
            }
            AclCommand::RemoveToken { name } => {
                if self.tokens.remove(&name).is_none() {
                    return Err(AclError::UnknownToken(name));
                }
                let before = self.grants.len();
                self.grants
                    .retain(|g| !matches!(&g.to, Grantee::Token(t) if *t == name));
                let grants = before - self.grants.len();
                self.drop_expired(now_ms);
                Ok(AclApplied::TokenRemoved { grants })
            }
        }
    }
}

/// A token record's form: name, creator, description, digest.
fn check_token(token: &TokenRecord) -> Result<(), AclError> {
    token_name(&token.name)?;
    principal_like("created_by", &token.created_by)?;
    if token.description.len() > TOKEN_DESCRIPTION_LEN_MAX {
        return Err(AclError::BadName {
            field: "description",
            reason: "longer than TOKEN_DESCRIPTION_LEN_MAX bytes",
        });
    }
    let hex = &token.secret_sha256;
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(AclError::BadDigest(token.name.clone()));
    }
    Ok(())
}

/// A token's expiry is after `now_ms` and at most [`TOKEN_TTL_MS_MAX`] away.
fn live_for(token: &TokenRecord, now_ms: u64) -> Result<(), AclError> {
    let ttl = token.expires_at_ms.checked_sub(now_ms);
    if !ttl.is_some_and(|t| t > 0 && t <= TOKEN_TTL_MS_MAX) {
        return Err(AclError::BadExpiry {
            name: token.name.clone(),
            expires_at_ms: token.expires_at_ms,
        });
    }
    Ok(())
}

impl Acl {
    /// Expired tokens and the grants to them go.
    fn drop_expired(&mut self, now_ms: u64) {
        let expired: BTreeSet<String> = self
            .tokens
            .values()
            .filter(|t| t.expires_at_ms <= now_ms)
            .map(|t| t.name.clone())
            .collect();
        if expired.is_empty() {
            return;
        }
        self.tokens.retain(|name, _| !expired.contains(name));
        self.grants
            .retain(|g| !matches!(&g.to, Grantee::Token(t) if expired.contains(t)));
    }
}

/// The grants bootstrap creates: everything for the operator; read and own-node
/// registration for the region's node agents.
pub fn bootstrap_grants(operator: &str) -> Vec<Grant> {
    let op = Grantee::Operator(operator.to_owned());
    let everything = [
        Capability::Read,
        Capability::Register(NodeScope::Any),
        Capability::Own(ServiceScope::Any),
        Capability::Override(ServiceScope::Any),
        Capability::Evacuate,
        Capability::Raft,
        Capability::Acl,
    ];
    everything
        .into_iter()
        .map(|can| Grant {
            to: op.clone(),
            can,
        })
        .chain([
            Grant {
                to: Grantee::AnyNode,
                can: Capability::Read,
            },
            Grant {
                to: Grantee::AnyNode,
                can: Capability::Register(NodeScope::Own),
            },
        ])
        .collect()
}

/// The hex SHA-256 of a token secret, as [`TokenRecord::secret_sha256`] holds it.
pub fn secret_digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The bearer form of a token: `wmt.<name>.<secret>`.
pub fn bearer(name: &str, secret: &str) -> String {
    format!("{TOKEN_PREFIX}.{name}.{secret}")
}

/// Splits `wmt.<name>.<secret>`; `None` if it is not that form.
pub fn parse_bearer(bearer: &str) -> Option<(&str, &str)> {
    let rest = bearer.strip_prefix(TOKEN_PREFIX)?.strip_prefix('.')?;
    let (name, secret) = rest.split_once('.')?;
    (token_name(name).is_ok() && !secret.is_empty() && secret.len() <= 256)
        .then_some((name, secret))
}

/// Compares the digest of `secret` with `expected_hex` without stopping at the first
/// differing byte.
fn digest_matches(expected_hex: &str, secret: &str) -> bool {
    let Ok(expected) = hex::decode(expected_hex) else {
        return false;
    };
    let actual = Sha256::digest(secret.as_bytes());
    expected.len() == actual.len()
        && expected
            .iter()
            .zip(actual.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn principal_name(field: &'static str, name: &str) -> Result<(), AclError> {
    if name.is_empty() {
        return Err(AclError::BadName {
            field,
            reason: "must not be empty",
        });
    }
    if name.len() > PRINCIPAL_NAME_LEN_MAX {
        return Err(AclError::BadName {
            field,
            reason: "longer than PRINCIPAL_NAME_LEN_MAX bytes",
        });
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(AclError::BadName {
            field,
            reason: "letters, digits, '.', '_' and '-' only",
        });
    }
    Ok(())
}

/// A principal's display form (`operator/alice`), bounded and printable.
fn principal_like(field: &'static str, text: &str) -> Result<(), AclError> {
    if text.is_empty() || text.len() > 2 * PRINCIPAL_NAME_LEN_MAX + 16 {
        return Err(AclError::BadName {
            field,
            reason: "empty or too long",
        });
    }
    if text.chars().any(char::is_control) {
        return Err(AclError::BadName {
            field,
            reason: "control characters",
        });
    }
    Ok(())
}

fn token_name(name: &str) -> Result<(), AclError> {
    if name.is_empty() || name.len() > TOKEN_NAME_LEN_MAX {
        return Err(AclError::BadName {
            field: "token",
            reason: "1..=TOKEN_NAME_LEN_MAX bytes",
        });
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(AclError::BadName {
            field: "token",
            reason: "lowercase letters, digits and '-' only",
        });
    }
    Ok(())
}

// === impl Grantee ===

impl Grantee {
    /// Whether this grantee is `principal`, for a registry serving `region`. Node and
    /// workload grantees cover only identities of that region.
    pub fn covers(&self, principal: &Principal, region: &RegionName) -> bool {
        match (self, principal) {
            (Self::Operator(a), Principal::Operator { name }) => a == name,
            (Self::Token(a), Principal::Token { name }) => a == name,
            (Self::Node(a), Principal::Node { region: r, node }) => r == region && a == node,
            (Self::AnyNode, Principal::Node { region: r, .. }) => r == region,
            (
                Self::Service(a),
                Principal::Workload {
                    region: r, service, ..
                },
            ) => r == region && a == service,
            _ => false,
        }
    }

    fn check(&self) -> Result<(), AclError> {
        match self {
            Self::Operator(name) => principal_name("operator", name),
            Self::Token(name) => token_name(name),
            Self::Node(_) | Self::AnyNode | Self::Service(_) => Ok(()),
        }
    }
}

impl fmt::Display for Grantee {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Operator(n) => write!(f, "operator/{n}"),
            Self::Token(n) => write!(f, "token/{n}"),
            Self::Node(n) => write!(f, "node/{n}"),
            Self::AnyNode => f.write_str("node/*"),
            Self::Service(s) => write!(f, "service/{s}"),
        }
    }
}

impl FromStr for Grantee {
    type Err = AclError;

    fn from_str(s: &str) -> Result<Self, AclError> {
        let bad = || {
            AclError::Malformed(format!(
                "grantee {s:?}: operator/<name>, token/<name>, node/<name>, node/* or service/<name>"
            ))
        };
        let (kind, name) = s.split_once('/').ok_or_else(bad)?;
        let grantee = match (kind, name) {
            ("operator", n) => Self::Operator(n.to_owned()),
            ("token", n) => Self::Token(n.to_owned()),
            ("node", "*") => Self::AnyNode,
            ("node", n) => Self::Node(NodeName::try_new(n).map_err(|_| bad())?),
            ("service", n) => Self::Service(ServiceName::try_new(n).map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        grantee.check()?;
        Ok(grantee)
    }
}

impl TryFrom<String> for Grantee {
    type Error = AclError;
    fn try_from(s: String) -> Result<Self, AclError> {
        s.parse()
    }
}

impl From<Grantee> for String {
    fn from(g: Grantee) -> String {
        g.to_string()
    }
}

// === impl Capability ===

impl Capability {
    /// Whether this capability, held by `principal`, allows `action`.
    pub fn allows(&self, principal: &Principal, action: Action<'_>) -> bool {
        match (self, action) {
            (Self::Read, Action::Read)
            | (Self::Evacuate, Action::Evacuate)
            | (Self::Raft, Action::Raft)
            | (Self::Acl, Action::Acl) => true,
            (Self::Register(scope), Action::Register { node }) => match scope {
                NodeScope::Any => true,
                NodeScope::One(n) => n == node,
                // A node agent's own node; a workload acts on itself, which the API checks
                // against its certificate's service and the connection's address.
                NodeScope::Own => match principal {
                    Principal::Node { node: own, .. } => own == node,
                    Principal::Workload { .. } => true,
                    _ => false,
                },
            },
            (Self::Own(scope), Action::WriteService { service })
            | (Self::Override(scope), Action::Override { service }) => scope.covers(service),
            _ => false,
        }
    }
}

impl ServiceScope {
    fn covers(&self, service: &ServiceName) -> bool {
        match self {
            Self::Any => true,
            Self::One(s) => s == service,
        }
    }
}

impl fmt::Display for ServiceScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::One(s) => write!(f, "{s}"),
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read => f.write_str("read"),
            Self::Register(NodeScope::Own) => f.write_str("register:own"),
            Self::Register(NodeScope::Any) => f.write_str("register:*"),
            Self::Register(NodeScope::One(n)) => write!(f, "register:{n}"),
            Self::Own(s) => write!(f, "own:{s}"),
            Self::Override(s) => write!(f, "override:{s}"),
            Self::Evacuate => f.write_str("evacuate"),
            Self::Raft => f.write_str("raft"),
            Self::Acl => f.write_str("acl"),
        }
    }
}

impl FromStr for Capability {
    type Err = AclError;

    fn from_str(s: &str) -> Result<Self, AclError> {
        let bad = || {
            AclError::Malformed(format!(
                "capability {s:?}: read, register:own|*|<node>, own:<service>|*, \
                 override:<service>|*, evacuate, raft or acl"
            ))
        };
        let service = |v: &str| match v {
            "*" => Ok(ServiceScope::Any),
            v => ServiceName::try_new(v)
                .map(ServiceScope::One)
                .map_err(|_| bad()),
        };
        Ok(match s.split_once(':') {
            None => match s {
                "read" => Self::Read,
                "evacuate" => Self::Evacuate,
                "raft" => Self::Raft,
                "acl" => Self::Acl,
                _ => return Err(bad()),
            },
            Some(("register", "own")) => Self::Register(NodeScope::Own),
            Some(("register", "*")) => Self::Register(NodeScope::Any),
            Some(("register", n)) => {
                Self::Register(NodeScope::One(NodeName::try_new(n).map_err(|_| bad())?))
            }
            Some(("own", v)) => Self::Own(service(v)?),
            Some(("override", v)) => Self::Override(service(v)?),
            Some(_) => return Err(bad()),
        })
    }
}

impl TryFrom<String> for Capability {
    type Error = AclError;
    fn try_from(s: String) -> Result<Self, AclError> {
        s.parse()
    }
}

impl From<Capability> for String {
    fn from(c: Capability) -> String {
        c.to_string()
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.to, self.can)
    }
}

// === impl Action ===

impl Action<'_> {
    /// The narrowest capability that allows this action, for a refusal's message.
    fn needed(&self, principal: &Principal) -> Capability {
        match *self {
            Action::Read => Capability::Read,
            Action::Register { node } => match principal {
                Principal::Node { node: own, .. } if own == node => {
                    Capability::Register(NodeScope::Own)
                }
                _ => Capability::Register(NodeScope::One(node.clone())),
            },
            Action::WriteService { service } => Capability::Own(ServiceScope::One(service.clone())),
            Action::Override { service } => {
                Capability::Override(ServiceScope::One(service.clone()))
            }
            Action::Evacuate => Capability::Evacuate,
            Action::Raft => Capability::Raft,
            Action::Acl => Capability::Acl,
        }
    }
}

// === impl Principal ===

impl Principal {
    /// The grantee that names exactly this principal, where one does (not authority
    /// members, not single workload instances).
    pub fn grantee(&self) -> Option<Grantee> {
        match self {
            Self::Operator { name } => Some(Grantee::Operator(name.clone())),
            Self::Token { name } => Some(Grantee::Token(name.clone())),
            Self::Node { node, .. } => Some(Grantee::Node(node.clone())),
            Self::Workload { .. } | Self::Authority { .. } => None,
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Operator { name } => write!(f, "operator/{name}"),
            Self::Node { region, node } => write!(f, "region/{region}/node/{node}"),
            Self::Workload {
                region,
                service,
                instance,
            } => write!(f, "region/{region}/service/{service}/instance/{instance}"),
            Self::Authority { region, member } => write!(f, "region/{region}/authority/{member}"),
            Self::Token { name } => write!(f, "token/{name}"),
        }
    }
}

#[cfg(test)]
mod tests;
