//! Mutual TLS for Raft between members: who is admitted.
//!
//! Both directions use one [`peer_policy`]: authority identities of this trust domain and
//! of this member's own region, nothing else (no node agent, no workload, no operator, no
//! other region's authority). The server side is `crate::listener::serve_tls` with
//! `waymark_certs::tls::server_config`; the client side is [`crate::dial::TlsConnector`]
//! (scheme `https`), which presents this member's certificate and admits the server by
//! identity, not by the dialled name.
//!
//! ```text
//! HttpPeer ─► hyper client ─► TlsConnector: TCP (connect timeout) ─► TLS 1.3 (handshake timeout)
//!                                                                      │ verifier: peer_policy
//! peer's Raft listener ◄───────────────────────────────────────────────┘ ALPN http/1.1
//! ```

use waymark_certs::PeerPolicy;
use waymark_certs::identity::{IdentityKind, KindSet, Name, TrustDomain};

pub use crate::dial::TlsConnector;

/// Who may be on the other end of a Raft connection, in either direction: an authority
/// member of `trust_domain` and `region` (this member's own).
pub fn peer_policy(trust_domain: TrustDomain, region: Name) -> PeerPolicy {
    PeerPolicy {
        trust_domain,
        accepted: KindSet::only(IdentityKind::Authority),
        region: Some(region),
    }
}
