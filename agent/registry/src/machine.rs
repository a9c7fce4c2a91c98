//! What the authority replicates: the registry's desired state, the views the leader
//! published, and the audit log. Pure and deterministic: every member applying the same log
//! reaches the same state (openraft's state machine calls [`AuthorityState::apply`]).
//!
//! Published views ride the log so that every member's xDS tier serves the same versions,
//! and so a new leader starts from exactly what clients already hold (ADR-02, ADR-11). A
//! view's version is `term << 32 | sequence`: the Raft term strictly increases across
//! leader changes, so a new leader's versions are above anything an old one released, even
//! one of its entries committed after the election.

use std::collections::BTreeMap;

use crate::release::{Release, apply_patch};
use crate::state::{Applied, DesiredState, RegistryError, Stamped};
use serde::{Deserialize, Serialize};
use waymark_core::evaluator::ObservedInstance;
use waymark_core::model::{InstanceId, ServiceName};
use waymark_core::view::{ReleasedView, Version, VersionSource, ViewKey};

/// Audit entries kept in the replicated state; older ones remain in each member's export.
pub const AUDIT_RETAINED: usize = 1_000_000;

/// One entry of the authority's log.
// Entries live serialized in the log; the in-memory size of one variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Request {
    /// A change to the desired state.
    Registry(Stamped),
    /// Changes to the desired state proposed together (group commit, `batch`), applied in
    /// order as if each were its own entry; each caller gets its own outcome.
    Batch {
        /// The commands, in arrival order.
        commands: Vec<Stamped>,
    },
    /// Views the leader released, in order, each whole (the log's first encoding: still
    /// applied when replayed, no longer written).
    Publish {
        /// The views.
        views: Vec<ReleasedView>,
    },
    /// Views the leader released, in order, each whole or as a patch against the version
    /// every member holds ([`crate::release`]).
    Release {
        /// The releases.
        releases: Vec<Release>,
    },
    /// The leader's observed-state snapshot (scores, hard latches, quarantines), replacing
    /// the previous one; a new leader resumes from it (ADR-02).
    Observed {
        /// Unix milliseconds when it was taken.
        at_ms: u64,
        /// Per instance.
        instances: BTreeMap<InstanceId, ObservedInstance>,
    },
    /// One part of the leader's observed-state snapshot, for a region too large to carry
    /// it in one bounded entry. Parts of one snapshot share its `at_ms`; it replaces the
    /// snapshot in force once every part is held, whatever order they committed in, so a
    /// leader lost half-way leaves the previous snapshot in force, never half of each.
    ObservedPart {
        /// Unix milliseconds when the snapshot was taken; names the snapshot.
        at_ms: u64,
        /// Which part this is, from 0.
        part: u32,
        /// How many parts the snapshot has (at most [`OBSERVED_PARTS_MAX`]).
        parts: u32,
        /// This part's instances.
        instances: BTreeMap<InstanceId, ObservedInstance>,
    },
    /// Audit records (transitions, overrides granted or refused, denials, policy changes).
    Audit {
        /// The records; sequence numbers are assigned on apply.
        entries: Vec<AuditEntry>,
    },
    /// An operator's restore: the whole state replaced by a verified backup's
    /// (`PUT /v1/operator/snapshot`). Versions and audit sequence numbers never go back:
    /// the floors of the state it replaces are kept where they are higher. Every lease's
    /// clock restarts at `at_ms`, as at a new term: nobody could renew into the backup.
    Restore {
        /// Unix milliseconds, stamped by the leader that proposed it.
        at_ms: u64,
        /// The state to put in force.
        state: Box<AuthorityState>,
    },
}

/// The registry commands an applied entry carried and each one's outcome, in order: one for
/// a `registry` entry, every command of a `batch`, none for anything else (or for a
/// response that does not belong to the request). Whoever follows the registry's changes
/// reads them through this, so a batched command is seen exactly as a lone one.
pub fn registry_outcomes<'a>(
    request: &'a Request,
    response: &'a Response,
) -> impl Iterator<Item = (&'a Stamped, &'a Result<Applied, Refusal>)> + 'a {
    let pairs: Box<dyn Iterator<Item = _> + 'a> = match (request, response) {
        (Request::Registry(stamped), Response::Registry { outcome }) => {
            Box::new(std::iter::once((stamped, outcome)))
        }
        (Request::Batch { commands }, Response::Batch { outcomes })
            if commands.len() == outcomes.len() =>
        {
            Box::new(commands.iter().zip(outcomes))
        }
        _ => Box::new(std::iter::empty()),
    };
    pairs
}

/// The registry changes an applied entry made: [`registry_outcomes`] without the commands
/// and the refusals, which changed nothing.
pub fn registry_applied<'a>(
    request: &'a Request,
    response: &'a Response,
) -> impl Iterator<Item = &'a Applied> + 'a {
    registry_outcomes(request, response).filter_map(|(_, outcome)| outcome.as_ref().ok())
}

/// The views an applied entry put in force, whole, in the entry's order: what the xDS tier
/// and the region's aggregates follow. For the log's first encoding (whole views, without
/// saying which were newer) every view of an entry that accepted any; a follower refuses
/// the ones it already holds newer.
pub fn published_views<'a>(request: &'a Request, response: &'a Response) -> &'a [ReleasedView] {
    match (request, response) {
        (Request::Publish { views }, Response::Published { accepted }) if *accepted > 0 => views,
        (Request::Release { .. }, Response::Released { views, .. }) => views,
        _ => &[],
    }
}

/// What applying an entry produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Response {
    /// The registry applied or refused the command.
    Registry {
        /// The outcome.
        outcome: Result<Applied, Refusal>,
    },
    /// A batch's commands applied or refused, one outcome per command, in order.
    Batch {
        /// The outcomes.
        outcomes: Vec<Result<Applied, Refusal>>,
    },
    /// Views were recorded; stale ones (at or below the held version) were skipped.
    Published {
        /// How many were newer than what was held.
        accepted: usize,
    },
    /// Releases were applied: the views they put in force (sharing the state's endpoint
    /// maps), and how many were skipped (a whole view not newer than the one held, a patch
    /// whose base is not the version held).
    Released {
        /// The views now in force, in the entry's order.
        views: Vec<ReleasedView>,
        /// Releases that changed nothing.
        skipped: usize,
    },
    /// Audit records were appended, ending at this sequence number.
    Audited {
        /// The last sequence number.
        last_seq: u64,
    },
    /// The observed-state snapshot was replaced.
    ObservedSaved,
    /// A part of an observed-state snapshot: `held` unless it was refused (a part number
    /// outside its count, a count of none or over [`OBSERVED_PARTS_MAX`]) and changed
    /// nothing; `complete` when it was the last part missing and the snapshot it completes
    /// replaced the one in force.
    ObservedPart {
        /// Taken.
        held: bool,
        /// Put the snapshot in force.
        complete: bool,
    },
    /// The state was replaced by a restore; every follower of the state resyncs.
    Restored,
    /// Raft's own entries (blank, membership) carry no request.
    Empty,
    /// Applying the entry failed unexpectedly (a bug, caught by the store): nothing is
    /// promised about what it changed. Never produced by [`AuthorityState::apply`] itself.
    ApplyFailed {
        /// What failed.
        message: String,
    },
}

/// A refused registry command, in a form that survives the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// A stable machine-readable reason (`unknown_instance`, `bad_lease`, …).
    pub reason: String,
    /// The request field at fault, when one is; for a ceiling on what the region holds,
    /// what reached it (`instances`, `grants`, …).
    pub field: Option<String>,
    /// What is wrong, for people.
    pub message: String,
}

impl Refusal {
    /// Every reason [`Refusal::from`] gives a [`RegistryError`], so that a table keyed by
    /// reason (the API's statuses) can be checked to cover them all. `machine/tests.rs`
    /// holds this list to one error of every kind.
    pub const REASONS: &'static [&'static str] = &[
        "contract",
        "unknown_service",
        "service_in_use",
        "unknown_instance",
        "retired",
        "not_leased",
        "bad_address",
        "duplicate_address",
        "bad_lease",
        "origin_mismatch",
        "service_mismatch",
        "bad_policy",
        "bad_justification",
        "too_long",
        "too_many",
        "region_full",
        "id_unavailable",
        // Access control (`AclError::reason`).
        "already_bootstrapped",
        "bad_name",
        "malformed",
        "unknown_grant",
        "unknown_token",
        "token_exists",
        "bad_expiry",
        "bad_digest",
        "acl_full",
    ];
}

impl From<&RegistryError> for Refusal {
    fn from(e: &RegistryError) -> Self {
        let (reason, field) = match e {
            RegistryError::Contract { source, .. } => {
                ("contract", Some(format!("contract.{}", source.field())))
            }
            RegistryError::UnknownService { .. } => ("unknown_service", Some("service".into())),
            RegistryError::ServiceInUse { .. } => ("service_in_use", Some("service".into())),
            RegistryError::UnknownInstance { .. } => ("unknown_instance", Some("instance".into())),
            RegistryError::Retired { .. } => ("retired", Some("instance".into())),
            RegistryError::NotLeased { .. } => ("not_leased", Some("instance".into())),
            RegistryError::BadAddress { .. } => ("bad_address", Some("address".into())),
            RegistryError::DuplicateAddress { .. } => ("duplicate_address", Some("address".into())),
            RegistryError::BadLease { .. } => ("bad_lease", Some("lease".into())),
            RegistryError::OriginMismatch { .. } => ("origin_mismatch", Some("instance".into())),
            RegistryError::ServiceMismatch { .. } => ("service_mismatch", Some("service".into())),
            RegistryError::BadPolicy { field, .. } => ("bad_policy", Some((*field).to_owned())),
            RegistryError::BadJustification { field, .. } => {
                ("bad_justification", Some((*field).to_owned()))
            }
            RegistryError::TooLong { field, .. } => ("too_long", Some((*field).to_owned())),
            RegistryError::TooMany { field, .. } => ("too_many", Some((*field).to_owned())),
            RegistryError::Full { what, .. } => ("region_full", Some((*what).to_owned())),
            RegistryError::IdUnavailable { .. } => ("id_unavailable", Some("service".into())),
            RegistryError::Acl(a) => (a.reason(), a.field().map(str::to_owned)),
        };
        Self {
            reason: reason.to_owned(),
            field,
            message: e.to_string(),
        }
    }
}

/// What an audit record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    /// An instance changed verdict.
    Transition,
    /// An operator override, granted or refused.
    Override,
    /// A request or sample was refused (forged evidence, bad registration, …).
    Denial,
    /// A service, contract or policy changed.
    Policy,
    /// An instance came or went (registration, lease expiry, orchestrator).
    Existence,
    /// An alarm was raised or cleared.
    Alarm,
    /// A reconciliation (orchestrator diff, peer region merge).
    Reconciliation,
    /// Access control changed: bootstrap, a grant, a token.
    Acl,
}

impl AuditKind {
    /// Every kind.
    pub const ALL: [Self; 8] = [
        Self::Transition,
        Self::Override,
        Self::Denial,
        Self::Policy,
        Self::Existence,
        Self::Alarm,
        Self::Reconciliation,
        Self::Acl,
    ];

    /// Its name as records and queries spell it (`transition`, `override`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transition => "transition",
            Self::Override => "override",
            Self::Denial => "denial",
            Self::Policy => "policy",
            Self::Existence => "existence",
            Self::Alarm => "alarm",
            Self::Reconciliation => "reconciliation",
            Self::Acl => "acl",
        }
    }
}

/// The retained audit log, oldest first: a persistent vector, so copying the state (for a
/// snapshot, up to [`AUDIT_RETAINED`] records) shares it instead of copying every record.
/// It serializes as the list it holds.
pub type AuditLog = imbl::Vector<AuditEntry>;

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditEntry {
    /// Position in the log; assigned on apply (0 before).
    #[serde(default)]
    pub seq: u64,
    /// Unix milliseconds, stamped by the member that proposed it.
    pub at_ms: u64,
    /// What it is about.
    pub kind: AuditKind,
    /// Who did it: an identity (`spiffe://…`), an operator, or `waymark` itself.
    pub actor: String,
    /// The service concerned.
    #[serde(default)]
    pub service: Option<ServiceName>,
    /// The instance concerned.
    #[serde(default)]
    pub instance: Option<InstanceId>,
    /// `granted`, `refused`, `applied`, or the new verdict.
    pub outcome: String,
    /// Everything else (evidence, justification, error), as JSON.
    #[serde(default)]
    pub detail: serde_json::Value,
}

/// The replicated state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorityState {
    registry: DesiredState,
    /// Keyed by view; serialized as a list (JSON map keys must be strings).
    #[serde(with = "published_as_list")]
    published: BTreeMap<ViewKey, ReleasedView>,
    audit: AuditLog,
    audit_seq: u64,
    #[serde(default)]
    observed: Option<(u64, BTreeMap<InstanceId, ObservedInstance>)>,
    /// The highest version ever published, kept when the view holding it is removed with
    /// its service, so versions never go back.
    #[serde(default)]
    version_floor: Version,
    /// An observed-state snapshot arriving in parts, until every part is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observed_pending: Option<ObservedPending>,
}

/// Parts an observed-state snapshot may be split into at most: far more than the largest
/// region needs at the leader's part size, and a bound on what a pending snapshot holds.
pub const OBSERVED_PARTS_MAX: u32 = 4_096;

/// The parts of one observed-state snapshot held so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ObservedPending {
    at_ms: u64,
    parts: u32,
    received: std::collections::BTreeSet<u32>,
    instances: BTreeMap<InstanceId, ObservedInstance>,
}

impl AuthorityState {
    /// One registry command, as its own entry or as one of a batch's.
    fn apply_registry(&mut self, stamped: Stamped) -> Result<Applied, Refusal> {
        let outcome = self.registry.apply(stamped).map_err(|e| Refusal::from(&e));
        if let Ok(Applied::ServiceRemoved { service }) = &outcome {
            self.remove_views(service);
        }
        outcome
    }

    /// Apply one entry. Deterministic and total: every request ends in a response, a
    /// refused registry command in a typed [`Refusal`] that changed nothing.
    pub fn apply(&mut self, request: Request) -> Response {
        match request {
            Request::Registry(stamped) => Response::Registry {
                outcome: self.apply_registry(stamped),
            },
            Request::Batch { commands } => Response::Batch {
                outcomes: commands
                    .into_iter()
                    .map(|stamped| self.apply_registry(stamped))
                    .collect(),
            },
            Request::Publish { views } => {
                let accepted = views
                    .into_iter()
                    .filter_map(|view| self.release(Release::Whole(view)).map(|_| ()))
                    .count();
                Response::Published { accepted }
            }
            Request::Release { releases } => {
                let mut views = Vec::with_capacity(releases.len());
                let mut skipped = 0;
                for release in releases {
                    match self.release(release) {
                        Some(view) => views.push(view.clone()),
                        None => skipped += 1,
                    }
                }
                Response::Released { views, skipped }
            }
            Request::Observed { at_ms, instances } => {
                self.observed = Some((at_ms, instances));
                Response::ObservedSaved
            }
            Request::ObservedPart {
                at_ms,
                part,
                parts,
                instances,
            } => self.observed_part(at_ms, part, parts, instances),
            Request::Audit { entries } => {
                for mut e in entries {
                    self.audit_seq = self.audit_seq.saturating_add(1);
                    e.seq = self.audit_seq;
                    self.audit.push_back(e);
                }
                while self.audit.len() > AUDIT_RETAINED {
                    self.audit.pop_front();
                }
                Response::Audited {
                    last_seq: self.audit_seq,
                }
            }
            Request::Restore { at_ms, state } => self.restore(at_ms, *state),
        }
    }

    /// Put a backup's state in force. Total: any state that decoded is accepted (it was
    /// applied once by the region that saved it). The highest version and audit sequence
    /// number held stay floors, so a view version or an audit `seq` is never issued twice;
    /// every lease restarts at `at_ms`, so the leader retires no instance for the time
    /// between the backup and the restore.
    fn restore(&mut self, at_ms: u64, state: AuthorityState) -> Response {
        let version_floor = self.max_version().max(state.max_version());
        let audit_seq = self.audit_seq.max(state.audit_seq);
        *self = state;
        self.version_floor = version_floor;
        self.audit_seq = audit_seq;
        let restarted = self.registry.apply(Stamped {
            at_ms,
            command: crate::state::Command::RestartLeases,
        });
        debug_assert!(restarted.is_ok(), "restarting leases is never refused");
        Response::Restored
    }

    /// Hold one part of an observed-state snapshot; the last one missing puts the whole
    /// snapshot in force. A part of another snapshot than the one pending (another
    /// `at_ms`, or another count) starts that snapshot afresh: a new leader's snapshot
    /// replaces a lost leader's unfinished one.
    fn observed_part(
        &mut self,
        at_ms: u64,
        part: u32,
        parts: u32,
        instances: BTreeMap<InstanceId, ObservedInstance>,
    ) -> Response {
        if parts == 0 || parts > OBSERVED_PARTS_MAX || part >= parts {
            return Response::ObservedPart {
                held: false,
                complete: false,
            };
        }
        let pending = match &mut self.observed_pending {
            Some(p) if p.at_ms == at_ms && p.parts == parts => p,
            other => other.insert(ObservedPending {
                at_ms,
                parts,
                ..ObservedPending::default()
            }),
        };
        if pending.received.insert(part) {
            pending.instances.extend(instances);
        }
        let complete = u32::try_from(pending.received.len()).is_ok_and(|n| n == parts);
        if complete && let Some(done) = self.observed_pending.take() {
            self.observed = Some((done.at_ms, done.instances));
        }
        Response::ObservedPart {
            held: true,
            complete,
        }
    }

    /// Put one release in force, or `None` if it changes nothing here.
    fn release(&mut self, release: Release) -> Option<&ReleasedView> {
        let key = release.key().clone();
        let version = release.version();
        match release {
            Release::Whole(view) => {
                let newer = self
                    .published
                    .get(&key)
                    .is_none_or(|held| held.version < version);
                if !newer {
                    return None;
                }
                self.published.insert(key.clone(), view);
            }
            Release::Patch(patch) => {
                if patch.delta.key != key {
                    return None;
                }
                apply_patch(self.published.get_mut(&key), patch).ok()?;
            }
        }
        self.version_floor = self.version_floor.max(version);
        self.published.get(&key)
    }

    /// The registry.
    pub fn registry(&self) -> &DesiredState {
        &self.registry
    }

    /// The last published view per (service, caller zone).
    pub fn published(&self) -> &BTreeMap<ViewKey, ReleasedView> {
        &self.published
    }

    /// The last observed-state snapshot and when it was taken (unix ms).
    pub fn observed(&self) -> Option<&(u64, BTreeMap<InstanceId, ObservedInstance>)> {
        self.observed.as_ref()
    }

    /// The retained audit log, oldest first.
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// The highest version published so far (including views since removed).
    pub fn max_version(&self) -> Version {
        self.published
            .values()
            .map(|v| v.version)
            .max()
            .unwrap_or(Version(0))
            .max(self.version_floor)
    }

    fn remove_views(&mut self, service: &ServiceName) {
        let before = self.published.len();
        self.published.retain(|key, _| &key.service != service);
        tracing::debug!(service = %service, views = before - self.published.len(), "views of a removed service dropped");
    }
}

mod published_as_list {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};
    use waymark_core::view::{ReleasedView, ViewKey};

    pub(super) fn serialize<S: Serializer>(
        map: &BTreeMap<ViewKey, ReleasedView>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(map.values())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<ViewKey, ReleasedView>, D::Error> {
        let list = Vec::<ReleasedView>::deserialize(d)?;
        Ok(list.into_iter().map(|v| (v.view.key.clone(), v)).collect())
    }
}

/// When a restarted member's xDS tier may answer. Until the log the member knew to be
/// committed when it stopped is re-applied, its state is the last snapshot (or empty),
/// and a tier serving from it would tell a reconnecting client that views it holds were
/// removed. The gate opens once that log is applied, or once `wait` has passed, so a
/// member that cannot catch up still serves what it has (and says so).
#[derive(Debug, Clone)]
pub struct ReplayGate {
    target: Option<u64>,
    deadline: std::time::Instant,
}

impl ReplayGate {
    /// A gate for a member that knew `committed` to be committed when it stopped.
    pub fn new(committed: Option<u64>, now: std::time::Instant, wait: std::time::Duration) -> Self {
        Self {
            target: committed,
            deadline: now + wait,
        }
    }

    /// Whether the log is re-applied, given the last applied index.
    pub fn is_replayed(&self, applied: Option<u64>) -> bool {
        self.target.is_none_or(|t| applied.is_some_and(|a| a >= t))
    }

    /// Whether the tier may answer at `now`.
    pub fn is_open(&self, now: std::time::Instant, applied: Option<u64>) -> bool {
        self.is_replayed(applied) || now >= self.deadline
    }

    /// The index to wait for, if any.
    pub fn target(&self) -> Option<u64> {
        self.target
    }

    /// When the gate opens whatever is applied.
    pub fn deadline(&self) -> std::time::Instant {
        self.deadline
    }
}

/// Versions for a leader in `term`: `term << 32 | n`, so every term's versions are above
/// every earlier term's. Neither half may spill into the other: a term above
/// [`TERM_VERSIONS_MAX_TERM`] has no version space at all, and a term that has issued
/// `u32::MAX` versions issues no more (its leader must hand over; the next term starts a
/// fresh space). Either way the source answers `None` rather than wrap.
#[derive(Debug, Clone)]
pub struct TermVersions {
    term: u64,
    seq: u64,
}

/// The highest Raft term whose versions fit the `term << 32 | n` layout.
pub const TERM_VERSIONS_MAX_TERM: u64 = u32::MAX as u64;

impl TermVersions {
    /// Versions for this leadership term, starting after `floor` if it is in the same term.
    pub fn new(term: u64, floor: Version) -> Self {
        let seq = if floor.0 >> 32 == term {
            floor.0 & 0xFFFF_FFFF
        } else {
            0
        };
        Self { term, seq }
    }

    /// Whether this term can issue no more versions.
    pub fn is_exhausted(&self) -> bool {
        self.term > TERM_VERSIONS_MAX_TERM || self.seq >= u64::from(u32::MAX)
    }
}

impl VersionSource for TermVersions {
    fn next_version(&mut self) -> Option<Version> {
        if self.is_exhausted() {
            return None;
        }
        self.seq += 1;
        Some(Version(self.term << 32 | self.seq))
    }
}

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
