//! Region aggregates as CRDTs: what each region publishes about its services, merged the
//! same whatever the order, duplication or delay of delivery.
//!
//! Each (region, service) entry is a last-writer-wins register (`crdts::LWWReg`) whose
//! marker is the **publishing region's view version** — a monotonic counter that region
//! alone advances — never a wall-clock time. A map of such registers merged key by key is
//! itself a join semilattice, so merge is commutative, associative and idempotent, and a
//! stale delivery can never overwrite newer state. Each region is the only writer of its
//! own entries, and two different contents under one version (which a correct region never
//! produces) are refused whole.
//!
//! **Direct links only.** A peer speaks only for itself: [`RegionAggregates::merge_from`]
//! admits a batch only if every entry is the *sender's* own region (the region its
//! certificate names, passed in by the driver), so a compromised region can write its own
//! aggregates and nobody else's — neither ours nor a third region's. A batch naming any
//! other region is refused whole and changes nothing. The cost: no transitive relay, so
//! a region holds exactly the aggregates of the regions it links to directly (a full mesh
//! to read every region). Relaying would need each entry signed by its own region, which
//! this design does without.
//!
//! Anti-entropy is by digest: each side sends its versions of the peer's region and
//! receives only the entries of that region it lacks ([`RegionAggregates::digest_of`],
//! [`RegionAggregates::missing_of`]). A merge after divergence yields a
//! [`ReconciliationRecord`]: per service, what each side held and which version won.
//!
//! Pure: no I/O, no clocks. The QUIC driver and the ages of peer aggregates live in shells.

use std::collections::BTreeMap;
use std::sync::Arc;

use crdts::{CvRDT, LWWReg};
use serde::{Deserialize, Serialize};
use waymark_core::assembler::RemoteEndpoint;
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::EndpointStatus;

/// One routable endpoint as its region publishes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AggregateEndpoint {
    /// The instance.
    pub instance: InstanceId,
    /// Where to dial it.
    pub address: Address,
    /// Its zone in its region.
    pub zone: ZoneName,
    /// Published weight.
    pub weight: Weight,
    /// Published status.
    pub status: EndpointStatus,
    /// The evaluator's verdict in its region.
    pub verdict: Verdict,
}

/// What a region publishes about one service at one of its view versions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceAggregate {
    /// Endpoints, sorted by instance.
    pub endpoints: Vec<AggregateEndpoint>,
}

/// One replicated entry: a region's aggregate of a service at a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The publishing region (the only writer of this entry).
    pub region: RegionName,
    /// The service.
    pub service: ServiceName,
    /// The region's view version this content belongs to.
    pub version: u64,
    /// The content.
    pub aggregate: Arc<ServiceAggregate>,
}

/// Versions held, by (region, service): what anti-entropy exchanges first.
pub type Digest = BTreeMap<(RegionName, ServiceName), u64>;

/// Why a delivery was refused. Nothing was merged; count it and keep the link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AggregateError {
    /// Two different contents were sent under one version of one entry: the publisher is
    /// broken or the delivery forged. The whole delivery is refused.
    #[error("region {region} sent two different aggregates of {service} at version {version}")]
    ConflictingVersion {
        /// The region.
        region: RegionName,
        /// The service.
        service: ServiceName,
        /// The version.
        version: u64,
    },
    /// A peer sent an entry of another region than its own (a third region's, or ours).
    /// A link carries only its sender's own region, so the peer is compromised, broken or
    /// misconfigured. The whole batch is refused and nothing changed; count it, keep the
    /// link (the peer's own entries arrive in its next, honest batch).
    #[error(
        "region {sender} sent {region}'s aggregate of {service}; a link carries only its sender's own region"
    )]
    ForeignEntry {
        /// The region the sending link is authenticated as.
        sender: RegionName,
        /// The region the entry claimed.
        region: RegionName,
        /// The entry's service.
        service: ServiceName,
    },
    /// A local publication did not advance the version. Nothing changed.
    #[error("version {offered} of {service} is not newer than {held}")]
    NotNewer {
        /// The service.
        service: ServiceName,
        /// The version offered.
        offered: u64,
        /// The version held.
        held: u64,
    },
}

/// How one entry fared in a merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Both sides held the same version.
    Same,
    /// Ours was newer (or theirs absent): kept ours.
    KeptOurs,
    /// Theirs was newer (or ours absent): took theirs.
    TookTheirs,
}

/// One line of a reconciliation record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconciledEntry {
    /// Publishing region.
    pub region: RegionName,
    /// Service.
    pub service: ServiceName,
    /// Version we held before the merge.
    pub ours: Option<u64>,
    /// Version the peer sent.
    pub theirs: u64,
    /// What the merge did.
    pub outcome: Outcome,
}

/// What a merge with a peer changed, for the audit log and `reconcile-log`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconciliationRecord {
    /// The peer the entries came from.
    pub peer: Option<RegionName>,
    /// One line per entry received.
    pub entries: Vec<ReconciledEntry>,
}

impl ReconciliationRecord {
    /// Entries that changed our state.
    pub fn changed(&self) -> impl Iterator<Item = &ReconciledEntry> {
        self.entries
            .iter()
            .filter(|e| e.outcome == Outcome::TookTheirs)
    }
}

/// Every region's aggregates as this region knows them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegionAggregates {
    entries: BTreeMap<(RegionName, ServiceName), LWWReg<Arc<ServiceAggregate>, u64>>,
}

impl RegionAggregates {
    /// Nothing known.
    pub fn new() -> Self {
        Self::default()
    }

    /// Publish this region's aggregate of a service; the version must advance.
    pub fn publish_local(&mut self, entry: Entry) -> Result<(), AggregateError> {
        let key = (entry.region.clone(), entry.service.clone());
        if let Some(held) = self.entries.get(&key)
            && held.marker >= entry.version
        {
            return Err(AggregateError::NotNewer {
                service: entry.service,
                offered: entry.version,
                held: held.marker,
            });
        }
        self.entries.insert(
            key,
            LWWReg {
                val: entry.aggregate,
                marker: entry.version,
            },
        );
        Ok(())
    }

    /// Merge entries that `peer` sent about itself into `local`'s replica. `peer` is the
    /// region the sender's certificate names. Validated first, and refused whole: an entry
    /// of any region but `peer` (ours included), or a conflicting one.
    pub fn merge_from(
        &mut self,
        local: &RegionName,
        peer: &RegionName,
        entries: Vec<Entry>,
    ) -> Result<ReconciliationRecord, AggregateError> {
        for e in &entries {
            // `peer == local` cannot come from a correct driver; refusing keeps ours ours.
            if &e.region != peer || &e.region == local {
                return Err(AggregateError::ForeignEntry {
                    sender: peer.clone(),
                    region: e.region.clone(),
                    service: e.service.clone(),
                });
            }
            if let Some(held) = self.entries.get(&(e.region.clone(), e.service.clone())) {
                let theirs = LWWReg {
                    val: e.aggregate.clone(),
                    marker: e.version,
                };
                if held.validate_merge(&theirs).is_err() {
                    return Err(AggregateError::ConflictingVersion {
                        region: e.region.clone(),
                        service: e.service.clone(),
                        version: e.version,
                    });
                }
            }
        }
        let mut record = ReconciliationRecord {
            peer: Some(peer.clone()),
            entries: Vec::new(),
        };
        for e in entries {
            let key = (e.region.clone(), e.service.clone());
            let ours = self.entries.get(&key).map(|r| r.marker);
            let outcome = match ours {
                Some(v) if v == e.version => Outcome::Same,
                Some(v) if v > e.version => Outcome::KeptOurs,
                _ => Outcome::TookTheirs,
            };
            if outcome == Outcome::TookTheirs {
                self.absorb(
                    key,
                    LWWReg {
                        val: e.aggregate,
                        marker: e.version,
                    },
                );
            }
            record.entries.push(ReconciledEntry {
                region: e.region,
                service: e.service,
                ours,
                theirs: e.version,
                outcome,
            });
        }
        Ok(record)
    }

    /// Merge another replica's whole state, for tests and for replicas this process trusts;
    /// never for what a peer sent (that is [`RegionAggregates::merge_from`], which admits
    /// only the sender's own region). Refuses conflicting versions like `merge_from`.
    pub fn merge(&mut self, other: &RegionAggregates) -> Result<(), AggregateError> {
        for (key, theirs) in &other.entries {
            if let Some(ours) = self.entries.get(key)
                && ours.validate_merge(theirs).is_err()
            {
                let (region, service) = key.clone();
                return Err(AggregateError::ConflictingVersion {
                    region,
                    service,
                    version: theirs.marker,
                });
            }
        }
        for (key, theirs) in &other.entries {
            self.absorb(key.clone(), theirs.clone());
        }
        Ok(())
    }

    fn absorb(
        &mut self,
        key: (RegionName, ServiceName),
        theirs: LWWReg<Arc<ServiceAggregate>, u64>,
    ) {
        match self.entries.get_mut(&key) {
            Some(ours) => ours.merge(theirs),
            None => {
                self.entries.insert(key, theirs);
            }
        }
    }

    /// The versions held.
    pub fn digest(&self) -> Digest {
        self.entries
            .iter()
            .map(|(k, r)| (k.clone(), r.marker))
            .collect()
    }

    /// The versions held of `region`'s entries only: what a session sends the peer that
    /// is `region` (the only entries that peer may send us).
    pub fn digest_of(&self, region: &RegionName) -> Digest {
        self.digest()
            .into_iter()
            .filter(|((r, _), _)| r == region)
            .collect()
    }

    /// What a peer with `digest` lacks: entries of any region it has not seen or holds
    /// older. A session answers with [`RegionAggregates::missing_of`] instead.
    pub fn missing_for(&self, digest: &Digest) -> Vec<Entry> {
        self.missing_where(digest, |_| true)
    }

    /// What a peer with `digest` lacks of `region`'s entries: what a session sends, with
    /// `region` its own, since a link carries only its sender's region.
    pub fn missing_of(&self, region: &RegionName, digest: &Digest) -> Vec<Entry> {
        self.missing_where(digest, |r| r == region)
    }

    fn missing_where(&self, digest: &Digest, keep: impl Fn(&RegionName) -> bool) -> Vec<Entry> {
        self.entries
            .iter()
            .filter(|((region, _), _)| keep(region))
            .filter(|(k, r)| digest.get(*k).is_none_or(|v| *v < r.marker))
            .map(|((region, service), r)| Entry {
                region: region.clone(),
                service: service.clone(),
                version: r.marker,
                aggregate: r.val.clone(),
            })
            .collect()
    }

    /// A peer region's endpoints for a service, as tier-2 input to the view assembler.
    ///
    /// Instance ids are unique within a region, not across regions (each region numbers its
    /// own registrations), so each is qualified with its region — `<region>:<id>` — before
    /// it enters a view keyed by instance. An id too long to qualify keeps its own name.
    pub fn remote_endpoints(
        &self,
        region: &RegionName,
        service: &ServiceName,
    ) -> Vec<RemoteEndpoint> {
        let Some(reg) = self.entries.get(&(region.clone(), service.clone())) else {
            return Vec::new();
        };
        reg.val
            .endpoints
            .iter()
            .map(|e| RemoteEndpoint {
                instance: InstanceId::try_new(format!("{region}:{}", e.instance))
                    .unwrap_or_else(|_| e.instance.clone()),
                address: e.address,
                zone: e.zone.clone(),
                weight: e.weight,
                status: e.status,
                verdict: e.verdict,
            })
            .collect()
    }

    /// The version held for an entry.
    pub fn version(&self, region: &RegionName, service: &ServiceName) -> Option<u64> {
        self.entries
            .get(&(region.clone(), service.clone()))
            .map(|r| r.marker)
    }
}

#[cfg(test)]
mod tests;
