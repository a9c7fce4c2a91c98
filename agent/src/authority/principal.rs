//! Who is asking the API: the verified principal behind a request, and the bounded record
//! of what was refused to whom.
//!
//! A listener that verified a client certificate puts its `PeerInfo` (identity, serial,
//! address) into each request's extensions (`crate::listener::serve_tls`); the API's authentication layer turns it, or a bearer token
//! checked against the replicated tokens, into a [`Caller`]. A header a client wrote is
//! never an identity.
//!
//! Refusals by an authenticated principal are audited — the audit log is replicated, so
//! they are folded per (principal, capability needed) between flushes ([`Denials`]),
//! as refused evidence is: a principal asking a thousand times a second grows the log by
//! one record per flush. Anonymous refusals are counted and logged only.

use std::net::{IpAddr, SocketAddr};

use waymark_certs::identity::{Identity, Subject};
use waymark_core::model::{NodeName, RegionName, ServiceName};
use waymark_registry::acl::Principal;

use waymark_registry::fold::Fold;
use waymark_registry::machine::{AuditEntry, AuditKind};

/// How a caller proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// A client certificate.
    Certificate,
    /// A bearer token.
    Token,
}

/// An authenticated request's principal.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Who.
    pub principal: Principal,
    /// How they proved it.
    pub credential: Credential,
    /// The connection's remote address, where the listener knows it.
    pub addr: Option<SocketAddr>,
}

impl Caller {
    /// The connection's remote IP, where known.
    pub fn ip(&self) -> Option<IpAddr> {
        self.addr.map(|a| a.ip())
    }

    /// The principal's display form, recorded as the actor in audit records.
    pub fn actor(&self) -> String {
        self.principal.to_string()
    }
}

/// The principal a verified certificate identity is. `None` for a name the registry's
/// name rules cannot hold (a certificate may carry a name longer than a service name).
pub fn principal_of(identity: &Identity) -> Option<Principal> {
    let region = |r: &waymark_certs::identity::Name| RegionName::try_new(r.as_str()).ok();
    Some(match identity.subject() {
        Subject::Operator { name } => Principal::Operator {
            name: name.as_str().to_owned(),
        },
        Subject::Node { region: r, node } => Principal::Node {
            region: region(r)?,
            node: NodeName::try_new(node.as_str()).ok()?,
        },
        Subject::Workload {
            region: r,
            service,
            instance,
        } => Principal::Workload {
            region: region(r)?,
            service: ServiceName::try_new(service.as_str()).ok()?,
            instance: instance.as_str().to_owned(),
        },
        Subject::Authority { region: r, member } => Principal::Authority {
            region: region(r)?,
            member: member.as_str().to_owned(),
        },
    })
}

/// Distinct (principal, capability) pairs held between flushes; more are counted only.
pub const DENIAL_KEYS_MAX: usize = waymark_registry::fold::KEYS_MAX;

/// Authorisation refusals folded between flushes. Pure: time comes in as data.
#[derive(Debug)]
pub struct Denials(Fold);

impl Default for Denials {
    fn default() -> Self {
        Self(Fold::new(256))
    }
}

impl Denials {
    /// Record that `actor` was refused an action needing `needed`; `example` is the
    /// request (`POST /v1/overrides`), `service` the service concerned, if any.
    pub fn handle_denial(
        &mut self,
        actor: String,
        needed: String,
        example: String,
        service: Option<ServiceName>,
    ) {
        self.0.add(actor, needed, example, service);
    }

    /// Whether anything waits to be flushed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The audit records for everything folded since the last flush.
    pub fn take_records(&mut self, at_ms: u64) -> Vec<AuditEntry> {
        let (folded, overflow) = self.0.drain();
        let mut records: Vec<AuditEntry> = folded
            .into_iter()
            .map(|((actor, needed), f)| AuditEntry {
                seq: 0,
                at_ms,
                kind: AuditKind::Denial,
                actor,
                service: f.service,
                instance: None,
                outcome: "refused".into(),
                detail: serde_json::json!({
                    "what": "api",
                    "reason": "forbidden",
                    "needed": needed,
                    "count": f.count,
                    "example": f.example,
                }),
            })
            .collect();
        if overflow > 0 {
            records.push(AuditEntry {
                seq: 0,
                at_ms,
                kind: AuditKind::Denial,
                actor: "waymark".into(),
                service: None,
                instance: None,
                outcome: "refused".into(),
                detail: serde_json::json!({
                    "what": "api",
                    "reason": "forbidden",
                    "count": overflow,
                    "note": "refusals beyond the distinct principals held per flush",
                }),
            });
        }
        records
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn certificate_identities_become_principals() {
        let cases = [
            (
                "spiffe://m.test/operator/alice",
                Principal::Operator {
                    name: "alice".into(),
                },
            ),
            (
                "spiffe://m.test/region/eu/node/n1",
                Principal::Node {
                    region: RegionName::try_new("eu").unwrap(),
                    node: NodeName::try_new("n1").unwrap(),
                },
            ),
            (
                "spiffe://m.test/region/eu/service/pay/instance/p1",
                Principal::Workload {
                    region: RegionName::try_new("eu").unwrap(),
                    service: ServiceName::try_new("pay").unwrap(),
                    instance: "p1".into(),
                },
            ),
        ];
        for (uri, want) in cases {
            let identity = Identity::parse(uri).unwrap();
            assert_eq!(principal_of(&identity), Some(want));
        }
    }

    #[test]
    fn refusals_fold_per_principal_and_capability() {
        let mut d = Denials::default();
        for _ in 0..1_000 {
            d.handle_denial(
                "operator/bob".into(),
                "override:pay".into(),
                "POST /v1/overrides".into(),
                None,
            );
        }
        d.handle_denial(
            "operator/bob".into(),
            "acl".into(),
            "POST /v1/acl/grants".into(),
            None,
        );
        let records = d.take_records(7);
        assert_eq!(records.len(), 2);
        let counts: Vec<u64> = records
            .iter()
            .map(|r| r.detail["count"].as_u64().unwrap())
            .collect();
        assert_eq!(counts, [1, 1_000]);
        assert!(d.is_empty());
        for i in 0..(DENIAL_KEYS_MAX + 5) {
            d.handle_denial(format!("token/t{i}"), "read".into(), "GET".into(), None);
        }
        let records = d.take_records(8);
        assert_eq!(records.len(), DENIAL_KEYS_MAX + 1);
        assert_eq!(records.last().unwrap().detail["count"], 5);
    }
}
