//! Federation metrics (`waymark_federation_*`). Created once per process and registered
//! once, so a node can be shut down and started again with the same series.
//!
//! Per-link series (`peer_*`, `messages`, `reconciliations`) are labelled `peer_region` and
//! `peer_member`; per-region series (`region_*`) only `peer_region`. Alert on the region
//! series: one member of a peer region going quiet is not an outage while another speaks.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why a connection or message from a peer was refused (`reason` label of
/// `waymark_federation_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalReason {
    /// Our verifier refused the peer's certificate in the handshake (wrong kind, trust
    /// domain, CA, expiry …; the precise reason is in `waymark_certs_rejected_total`).
    Tls,
    /// An authority of our own region connected: federation is between regions only.
    OwnRegion,
    /// An authority of a region that is not a configured peer connected.
    UnknownRegion,
    /// An authority of a configured peer region connected, but its member is not one of
    /// that region's configured members.
    UnknownMember,
    /// A configured peer dialled us although, by the ordering rule, we dial it.
    WrongDirection,
    /// The server we dialled is an authority of another region than the one configured
    /// at that address.
    UnexpectedRegion,
    /// The server we dialled is an authority of the configured region but another member
    /// than the one configured at that address.
    UnexpectedMember,
    /// A frame above `message_bytes_max` arrived (or would have been sent).
    FrameTooLarge,
    /// A frame was not a federation message.
    BadFrame,
    /// A batch of entries contradicted what we hold (two contents under one version).
    ConflictingVersion,
    /// A batch of entries named another region than the sending peer's own (a third
    /// region's, or ours): refused whole, since a link carries only its sender's region.
    ForeignEntry,
    /// Too many handshakes or queued connections at once.
    Busy,
}

impl RefusalReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tls => "tls",
            Self::OwnRegion => "own_region",
            Self::UnknownRegion => "unknown_region",
            Self::UnknownMember => "unknown_member",
            Self::WrongDirection => "wrong_direction",
            Self::UnexpectedRegion => "unexpected_region",
            Self::UnexpectedMember => "unexpected_member",
            Self::FrameTooLarge => "frame_too_large",
            Self::BadFrame => "bad_frame",
            Self::ConflictingVersion => "conflicting_version",
            Self::ForeignEntry => "foreign_entry",
            Self::Busy => "busy",
        }
    }
}

impl std::fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `peer_region`, `peer_member`: one link.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct LinkLabels {
    pub(crate) peer_region: String,
    pub(crate) peer_member: String,
}

/// `peer_region`: one peer region, over all its links.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct RegionLabels {
    pub(crate) peer_region: String,
}

/// `peer_region`, `peer_member`, `direction` (`sent`/`received`), `kind`
/// (`digest`/`entries`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct MessageLabels {
    pub(crate) peer_region: String,
    pub(crate) peer_member: String,
    pub(crate) direction: &'static str,
    pub(crate) kind: &'static str,
}

/// `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub(crate) reason: &'static str,
}

/// Every federation metric. Cheap to clone (shared series).
#[derive(Debug, Clone, Default)]
pub struct FederationMetrics {
    pub(crate) connected: Family<LinkLabels, Gauge>,
    pub(crate) age_seconds: Family<LinkLabels, Gauge<f64, AtomicU64>>,
    pub(crate) stale: Family<LinkLabels, Gauge>,
    pub(crate) region_age_seconds: Family<RegionLabels, Gauge<f64, AtomicU64>>,
    pub(crate) region_stale: Family<RegionLabels, Gauge>,
    pub(crate) messages: Family<MessageLabels, Counter>,
    pub(crate) refused: Family<ReasonLabels, Counter>,
    pub(crate) reconciliations: Family<LinkLabels, Counter>,
    pub(crate) reconciliations_dropped: Counter,
}

impl FederationMetrics {
    /// Fresh, unregistered metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers every series under `waymark_federation_`. Call once per registry.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("waymark_federation");
        r.register(
            "peer_connected",
            "1 while the link to a peer region's member is up",
            self.connected.clone(),
        );
        r.register(
            "peer_age_seconds",
            "Time since the peer member last spoke on its link (absent until it first does)",
            self.age_seconds.clone(),
        );
        r.register(
            "peer_stale",
            "1 while the peer member has been silent longer than the staleness threshold",
            self.stale.clone(),
        );
        r.register(
            "region_age_seconds",
            "Time since the peer region last spoke through any link (absent until it first does)",
            self.region_age_seconds.clone(),
        );
        r.register(
            "region_stale",
            "1 while every link to the peer region is stale (its entries are kept)",
            self.region_stale.clone(),
        );
        r.register(
            "messages",
            "Anti-entropy messages by peer region and member, direction and kind",
            self.messages.clone(),
        );
        r.register(
            "refused",
            "Connections and messages from peers refused, by reason",
            self.refused.clone(),
        );
        r.register(
            "reconciliations",
            "Merges from a peer member that changed our aggregates (each yields a record)",
            self.reconciliations.clone(),
        );
        r.register(
            "reconciliations_dropped",
            "Reconciliation records dropped because nobody took them in time",
            self.reconciliations_dropped.clone(),
        );
    }

    /// Refusals counted for `reason` so far.
    pub fn refused(&self, reason: RefusalReason) -> u64 {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .get()
    }

    /// Reconciliation records produced so far from entries received on the link to
    /// `peer_member` of `peer_region`.
    pub fn reconciliations(&self, peer_region: &str, peer_member: &str) -> u64 {
        self.reconciliations
            .get_or_create(&link_labels(peer_region, peer_member))
            .get()
    }

    pub(crate) fn count_refused(&self, reason: RefusalReason) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    pub(crate) fn count_message(
        &self,
        link: &LinkLabels,
        direction: &'static str,
        kind: &'static str,
    ) {
        self.messages
            .get_or_create(&MessageLabels {
                peer_region: link.peer_region.clone(),
                peer_member: link.peer_member.clone(),
                direction,
                kind,
            })
            .inc();
    }
}

pub(crate) fn link_labels(peer_region: &str, peer_member: &str) -> LinkLabels {
    LinkLabels {
        peer_region: peer_region.to_owned(),
        peer_member: peer_member.to_owned(),
    }
}

pub(crate) fn region_labels(peer_region: &str) -> RegionLabels {
    RegionLabels {
        peer_region: peer_region.to_owned(),
    }
}
