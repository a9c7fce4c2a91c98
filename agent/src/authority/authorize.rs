//! Resolution authorisation (ADR-15): a service's policy may name the services whose
//! workloads may resolve it; the xDS tier then leaves it out of every other client's
//! responses.
//!
//! Workload identities are judged by their service. Node agents and authority members see
//! everything — a node agent serves many workloads and applies the same policy to each of
//! its sidecars — and operators may read. A client without a verified identity (plaintext
//! xDS, loopback development) sees only unrestricted services.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arc_swap::ArcSwap;
use waymark_certs::identity::{Identity, Subject};
use waymark_registry::state::DesiredState;
use waymark_xds::server::{ClientRef, ResourceFilter};

/// Restricted services and who may resolve each.
pub type CallerPolicy = BTreeMap<String, BTreeSet<String>>;

/// The policy as the registry holds it.
pub fn from_registry(registry: &DesiredState) -> CallerPolicy {
    registry
        .policies()
        .filter_map(|(service, p)| {
            let allowed = p.allowed_callers.as_ref()?;
            Some((
                service.to_string(),
                allowed.iter().map(ToString::to_string).collect(),
            ))
        })
        .collect()
}

/// Whether `client` may see resource `name` (named after its service).
pub fn allows(policy: &CallerPolicy, client: &ClientRef<'_>, name: &str) -> bool {
    let Some(allowed) = policy.get(name) else {
        return true;
    };
    let Some(identity) = client.identity.and_then(|i| Identity::parse(i).ok()) else {
        return false;
    };
    match identity.subject() {
        Subject::Workload { service, .. } => allowed.contains(service.as_str()),
        Subject::Node { .. } | Subject::Authority { .. } | Subject::Operator { .. } => true,
    }
}

/// A filter for the xDS server reading the live policy.
pub fn filter(policy: Arc<ArcSwap<CallerPolicy>>) -> ResourceFilter {
    ResourceFilter::new(move |client, _type_url, name| allows(&policy.load(), client, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(identity: Option<&str>) -> ClientRef<'_> {
        ClientRef {
            identity,
            node_id: "n",
        }
    }

    #[test]
    fn only_named_callers_and_infrastructure_see_a_restricted_service() {
        let policy: CallerPolicy = [("pay".to_owned(), ["web".to_owned()].into())].into();
        let web = "spiffe://m.test/region/eu/service/web/instance/web-1";
        let batch = "spiffe://m.test/region/eu/service/batch/instance/batch-1";
        let node = "spiffe://m.test/region/eu/node/n1";
        assert!(allows(&policy, &client(Some(web)), "pay"));
        assert!(!allows(&policy, &client(Some(batch)), "pay"));
        assert!(allows(&policy, &client(Some(node)), "pay"));
        assert!(!allows(&policy, &client(None), "pay"), "unidentified");
        assert!(
            allows(&policy, &client(Some(batch)), "ledger"),
            "unrestricted"
        );
        assert!(allows(&policy, &client(None), "ledger"));
    }
}
