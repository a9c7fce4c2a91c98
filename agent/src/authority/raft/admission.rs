//! Who may send a Raft RPC: the member its client certificate names, and only as itself.
//!
//! Mutual TLS on the Raft listener already admits only authority members of this trust
//! domain and region (the verifier's `PeerPolicy`). What TLS cannot say is *which* member
//! an RPC speaks for: AppendEntries and InstallSnapshot carry the leader's id in
//! `vote.leader_id`, RequestVote the candidate's. [`Senders::check`] compares that id with
//! the member named in the certificate (`…/region/<r>/authority/<member>`, the member being
//! the decimal Raft id), before openraft sees the RPC:
//!
//! ```text
//! request ─► PeerInfo (TLS) ─► Senders::check(claimed id) ──refused──► 403 + reason, counted
//!                                        │ admitted                     (waymark_raft_rpc_refused_total)
//!                                        ▼
//!                                openraft (append / vote / install_snapshot)
//! ```
//!
//! A refused RPC changes nothing in Raft: it never reaches openraft. Without TLS
//! ([`Senders::Unchecked`]) there is no identity to compare; the member serves Raft in
//! plaintext only on a loopback address (`Authority::start` refuses anything else).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use waymark_certs::grpc::PeerInfo;
use waymark_certs::identity::Subject;

/// Whose word the Raft routes take for who sent an RPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Senders {
    /// Plaintext on loopback (development, tests): every RPC is served as it claims.
    Unchecked,
    /// Mutual TLS: an RPC is served only when its claimed sender is the member its client
    /// certificate names.
    Certified,
}

/// Why an RPC was refused before reaching Raft. Raft is unchanged by every one of them;
/// the sending member should be given a certificate for its own Raft id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The RPC claims to come from another member than its certificate names.
    #[error("the client certificate names authority member {certified}; the rpc claims {}", claimed_text(*.claimed))]
    SenderMismatch {
        /// The member id in the certificate.
        certified: u64,
        /// The id the RPC claims, if any.
        claimed: Option<u64>,
    },
    /// The certificate's member is not a decimal Raft id, so it can speak for no member.
    #[error("the client certificate's authority member {member:?} is not a raft id")]
    MemberNotAnId {
        /// The member name in the certificate.
        member: String,
    },
    /// No verified authority identity came with the request (a listener misconfigured to
    /// serve certified routes without mutual TLS).
    #[error("no verified authority certificate came with the rpc")]
    NoIdentity,
}

fn claimed_text(claimed: Option<u64>) -> String {
    claimed.map_or_else(|| "no member".to_owned(), |id| format!("member {id}"))
}

// === impl Senders ===

impl Senders {
    /// Whether an RPC claiming to come from `claimed`, arriving with `peer`, may be served.
    pub fn check(self, peer: Option<&PeerInfo>, claimed: Option<u64>) -> Result<(), Refusal> {
        match self {
            Self::Unchecked => Ok(()),
            Self::Certified => {
                let certified = certified_member(peer)?;
                if claimed == Some(certified) {
                    Ok(())
                } else {
                    Err(Refusal::SenderMismatch { certified, claimed })
                }
            }
        }
    }
}

/// The Raft id the certificate names.
fn certified_member(peer: Option<&PeerInfo>) -> Result<u64, Refusal> {
    let Some(peer) = peer else {
        return Err(Refusal::NoIdentity);
    };
    let Subject::Authority { member, .. } = peer.identity.subject() else {
        return Err(Refusal::NoIdentity);
    };
    member_id(member.as_str()).ok_or_else(|| Refusal::MemberNotAnId {
        member: member.as_str().to_owned(),
    })
}

/// A member name as a Raft id: decimal digits only, in canonical form (no sign, no leading
/// zero), so one id has one spelling and `01` never passes for `1`.
pub fn member_id(member: &str) -> Option<u64> {
    let canonical = member.bytes().all(|b| b.is_ascii_digit())
        && !member.is_empty()
        && (member == "0" || !member.starts_with('0'));
    canonical.then(|| member.parse().ok()).flatten()
}

// === impl Refusal ===

impl Refusal {
    /// The `reason` label and the error's `reason` field.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SenderMismatch { .. } => "sender_mismatch",
            Self::MemberNotAnId { .. } => "member_not_an_id",
            Self::NoIdentity => "no_identity",
        }
    }
}

/// `reason`: why an RPC was refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefusedLabels {
    /// [`Refusal::reason`], or `busy` (the large-RPC in-flight cap).
    pub reason: &'static str,
}

/// What the Raft routes count (`waymark_raft_rpc_refused_total{reason}`). Clones share
/// series.
#[derive(Debug, Clone, Default)]
pub struct RaftRpcMetrics {
    /// RPCs answered with a refusal instead of reaching Raft.
    pub refused: Family<RefusedLabels, Counter>,
}

impl RaftRpcMetrics {
    /// Register under `waymark_raft_`.
    pub fn register(&self, registry: &mut Registry) {
        registry.sub_registry_with_prefix("waymark_raft").register(
            "rpc_refused",
            "Raft RPCs refused before reaching Raft: sender not the certificate's member, or too many in flight",
            self.refused.clone(),
        );
    }

    /// Count one refusal.
    pub fn count(&self, reason: &'static str) {
        self.refused.get_or_create(&RefusedLabels { reason }).inc();
    }

    /// How many RPCs were refused for `reason`.
    pub fn refused(&self, reason: &'static str) -> u64 {
        self.refused.get_or_create(&RefusedLabels { reason }).get()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use waymark_certs::Identity;

    use super::*;

    fn peer(uri: &str) -> PeerInfo {
        PeerInfo {
            identity: Identity::parse(uri).unwrap(),
            serial: "01".into(),
            remote_addr: None,
        }
    }

    #[test]
    fn a_member_is_admitted_only_as_the_id_its_certificate_names() {
        let three = peer("spiffe://td/region/eu/authority/3");
        assert_eq!(Senders::Certified.check(Some(&three), Some(3)), Ok(()));
        assert_eq!(
            Senders::Certified.check(Some(&three), Some(2)),
            Err(Refusal::SenderMismatch {
                certified: 3,
                claimed: Some(2)
            })
        );
        assert_eq!(
            Senders::Certified
                .check(Some(&three), None)
                .unwrap_err()
                .reason(),
            "sender_mismatch"
        );
    }

    #[test]
    fn a_certificate_without_a_decimal_member_id_speaks_for_no_member() {
        for member in ["a1", "01", "+1", "", "18446744073709551616"] {
            let uri = format!("spiffe://td/region/eu/authority/{member}");
            let Ok(identity) = Identity::parse(&uri) else {
                continue; // not even an identity; the verifier refuses it at the handshake
            };
            let p = PeerInfo {
                identity,
                serial: "01".into(),
                remote_addr: None,
            };
            let e = Senders::Certified.check(Some(&p), Some(1)).unwrap_err();
            assert_eq!(e.reason(), "member_not_an_id", "{member:?}");
        }
        assert_eq!(member_id("0"), Some(0));
        assert_eq!(member_id("42"), Some(42));
    }

    #[test]
    fn without_a_verified_authority_identity_nothing_is_admitted_unless_unchecked() {
        let node = peer("spiffe://td/region/eu/node/n1");
        assert_eq!(
            Senders::Certified.check(Some(&node), Some(1)),
            Err(Refusal::NoIdentity)
        );
        assert_eq!(
            Senders::Certified.check(None, Some(1)),
            Err(Refusal::NoIdentity)
        );
        assert_eq!(Senders::Unchecked.check(None, Some(1)), Ok(()));
    }
}
