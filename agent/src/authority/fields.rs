//! Ceilings on what an API request may write into Raft or the audit log, checked by the API
//! before anything is proposed or audited: free text (owners, tags, metadata, reasons,
//! justifications, the actor) and the counts of lists and maps.
//!
//! The replicated state machine checks the same ceilings again (`Command::check` before a
//! command is proposed, and `apply`: a log written by an older binary must still apply);
//! the ceilings are the registry's own, re-exported here, so the two never disagree. What
//! this module adds is the check *before the audit log*: policy changes, overrides,
//! evacuations and failovers are audited before their command is proposed, so their text
//! must be refused (a typed `422` naming the field) before it reaches every member's log.
//! The actor, which only the API sees, has its own ceiling here.
//!
//! Request bodies are bounded per route before any of this runs (see `api::router`).

use std::collections::{BTreeMap, BTreeSet};

use waymark_core::model::Instance;
use waymark_registry::state::{Registration, ServicePolicyRecord};

/// The registry's own ceilings: the ones its `apply` (and `Command::check`) enforce.
pub use waymark_registry::state::{
    ALLOWED_CALLERS_MAX, FAILOVER_ORDER_MAX, JUSTIFICATION_LEN_MAX, METADATA_ENTRIES_MAX,
    METADATA_KEY_LEN_MAX, METADATA_VALUE_LEN_MAX, OWNER_LEN_MAX, REASON_LEN_MAX, TAG_LEN_MAX,
    TAGS_MAX,
};

/// Longest actor (a verified principal's display form) the override path budgets for,
/// in bytes: the actor is written into audit records and maintenance reasons.
pub const ACTOR_LEN_MAX: usize = 256;
/// Most capabilities a token may be granted when it is minted.
pub const TOKEN_GRANTS_MAX: usize = 16;
/// Longest override justification, in bytes: the maintenance reason the override commits
/// is `<justification> by <actor>`, and must fit [`REASON_LEN_MAX`].
pub const OVERRIDE_JUSTIFICATION_LEN_MAX: usize = REASON_LEN_MAX - ACTOR_LEN_MAX - " by ".len();

/// A field over its ceiling. Nothing was proposed or audited; shorten the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldError {
    /// A text field is longer than its ceiling.
    #[error("{field}: {len} bytes, more than {max}")]
    TooLong {
        /// The field, as the request names it (`tags[3]`, `metadata.team`).
        field: String,
        /// Its length in bytes.
        len: usize,
        /// The ceiling.
        max: usize,
    },
    /// A list or map has more entries than its ceiling.
    #[error("{field}: {count} entries, more than {max}")]
    TooMany {
        /// The field.
        field: String,
        /// How many were given.
        count: usize,
        /// The ceiling.
        max: usize,
    },
}

impl FieldError {
    /// The field the refusal names.
    pub fn field(&self) -> &str {
        match self {
            Self::TooLong { field, .. } | Self::TooMany { field, .. } => field,
        }
    }

    /// A stable reason label: `too_long` or `too_many`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooLong { .. } => "too_long",
            Self::TooMany { .. } => "too_many",
        }
    }
}

/// `text` is at most `max` bytes.
pub fn text(field: &str, text: &str, max: usize) -> Result<(), FieldError> {
    if text.len() > max {
        return Err(FieldError::TooLong {
            field: field.to_owned(),
            len: text.len(),
            max,
        });
    }
    Ok(())
}

/// `count` entries are at most `max`.
pub fn count(field: &str, count: usize, max: usize) -> Result<(), FieldError> {
    if count > max {
        return Err(FieldError::TooMany {
            field: field.to_owned(),
            count,
            max,
        });
    }
    Ok(())
}

/// An instance's tags and metadata.
pub fn labels(
    tags: &BTreeSet<String>,
    metadata: &BTreeMap<String, String>,
) -> Result<(), FieldError> {
    count("tags", tags.len(), TAGS_MAX)?;
    for (i, tag) in tags.iter().enumerate() {
        text(&format!("tags[{i}]"), tag, TAG_LEN_MAX)?;
    }
    count("metadata", metadata.len(), METADATA_ENTRIES_MAX)?;
    for (key, value) in metadata {
        // The key is named only once it is known to be short enough to print.
        text("metadata (a key)", key, METADATA_KEY_LEN_MAX)?;
        text(&format!("metadata.{key}"), value, METADATA_VALUE_LEN_MAX)?;
    }
    Ok(())
}

/// A registration's free text.
pub fn registration(r: &Registration) -> Result<(), FieldError> {
    labels(&r.tags, &r.metadata)
}

/// A declared external endpoint's free text.
pub fn external(i: &Instance) -> Result<(), FieldError> {
    labels(&i.tags, &i.metadata)
}

/// A service policy's lists.
pub fn policy(p: &ServicePolicyRecord) -> Result<(), FieldError> {
    count("failover_zones", p.failover_zones.len(), FAILOVER_ORDER_MAX)?;
    count(
        "failover_regions",
        p.failover_regions.len(),
        FAILOVER_ORDER_MAX,
    )?;
    if let Some(callers) = &p.allowed_callers {
        count("allowed_callers", callers.len(), ALLOWED_CALLERS_MAX)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn labels_within_their_ceilings_pass_and_one_byte_over_is_refused_naming_it() {
        let tags: BTreeSet<String> = (0..TAGS_MAX).map(|i| format!("t{i}")).collect();
        let metadata: BTreeMap<String, String> = (0..METADATA_ENTRIES_MAX)
            .map(|i| (format!("k{i}"), "v".repeat(METADATA_VALUE_LEN_MAX)))
            .collect();
        labels(&tags, &metadata).unwrap();

        let mut more = tags.clone();
        more.insert("one-more".into());
        assert_eq!(labels(&more, &metadata).unwrap_err().field(), "tags");

        let long: BTreeSet<String> = ["x".repeat(TAG_LEN_MAX + 1)].into();
        let e = labels(&long, &BTreeMap::new()).unwrap_err();
        assert_eq!((e.field(), e.reason()), ("tags[0]", "too_long"));

        let value = BTreeMap::from([("team".into(), "v".repeat(METADATA_VALUE_LEN_MAX + 1))]);
        assert_eq!(
            labels(&BTreeSet::new(), &value).unwrap_err().field(),
            "metadata.team"
        );
        let key = BTreeMap::from([("k".repeat(METADATA_KEY_LEN_MAX + 1), String::new())]);
        assert_eq!(
            labels(&BTreeSet::new(), &key).unwrap_err().field(),
            "metadata (a key)"
        );
    }
}
