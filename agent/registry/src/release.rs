//! How released views ride the log: as patches against the version every member holds.
//!
//! A view is the whole endpoint set of a service for one caller zone, and nearly every
//! release changes one or two of its endpoints. Committing the whole view each time made
//! every verdict cost the whole service in the log, on the wire to every follower, and in
//! every member's decode before apply. A [`Release::Patch`] names the version it applies
//! to (`base`) and carries only what changed; a member applies it only on exactly that
//! version, and refuses it otherwise (changing nothing), so a patch can never build a view
//! no leader released.
//!
//! [`ReleaseEncoder`] is the leader's side: it remembers what the log holds for each view
//! — learnt from committed entries' responses, never assumed — and falls back to the whole
//! view where it knows nothing, where a write's fate is unknown, or where the patch would
//! be no smaller.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use waymark_core::view::{ReleasedView, Version, ViewDelta, ViewKey, diff};

/// One view's release, as a log entry carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Release {
    /// The whole view, in force if newer than what is held.
    Whole(ReleasedView),
    /// What changed since `base`, in force only on a member holding exactly `base`.
    Patch(ViewPatch),
}

/// A view's changes from one released version to the next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewPatch {
    /// The version this patch applies to.
    pub base: Version,
    /// The version it makes.
    pub version: Version,
    /// What changed (its key names the view).
    pub delta: ViewDelta,
}

impl Release {
    /// The view it releases.
    pub fn key(&self) -> &ViewKey {
        match self {
            Release::Whole(v) => &v.view.key,
            Release::Patch(p) => &p.delta.key,
        }
    }

    /// The version it makes.
    pub fn version(&self) -> Version {
        match self {
            Release::Whole(v) => v.version,
            Release::Patch(p) => p.version,
        }
    }

    /// Endpoints it carries, the measure a log entry is bounded by.
    pub fn endpoints(&self) -> usize {
        match self {
            Release::Whole(v) => v.view.endpoints.len(),
            Release::Patch(p) => p.delta.upserted.len() + p.delta.removed.len(),
        }
    }
}

/// Why a patch was not applied (it changed nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchRefused {
    /// The member holds no release of the view.
    NothingHeld,
    /// The member holds another version than the patch's base.
    BaseMismatch,
    /// The patch does not move the version forward.
    NotNewer,
}

/// Apply `patch` to `held`, the member's release of the same view: total, and only on
/// exactly the base version. The endpoint map is copied only if another holder shares it.
pub fn apply_patch(
    held: Option<&mut ReleasedView>,
    patch: ViewPatch,
) -> Result<&ReleasedView, PatchRefused> {
    let held = held.ok_or(PatchRefused::NothingHeld)?;
    if held.version != patch.base {
        return Err(PatchRefused::BaseMismatch);
    }
    if patch.version <= patch.base {
        return Err(PatchRefused::NotNewer);
    }
    let ViewDelta {
        upserted,
        removed,
        markers,
        ..
    } = patch.delta;
    if !upserted.is_empty() || !removed.is_empty() {
        let map = &mut held.view.endpoints;
        for id in &removed {
            map.remove(id);
        }
        for e in upserted {
            map.insert(e.instance.clone(), e);
        }
    }
    held.view.markers = markers;
    held.version = patch.version;
    Ok(held)
}

/// The leader's memory of what the log holds per view, and the encoding it implies.
#[derive(Debug, Default, Clone)]
pub struct ReleaseEncoder {
    held: BTreeMap<ViewKey, ReleasedView>,
}

impl ReleaseEncoder {
    /// An encoder that knows nothing yet: its first release of each view is whole.
    pub fn new() -> Self {
        Self::default()
    }

    /// How to commit `view`: a patch against the held release when one is known and the
    /// patch is smaller than the view, the whole view otherwise.
    pub fn encode(&self, view: &ReleasedView) -> Release {
        let key = &view.view.key;
        match self.held.get(key) {
            Some(held) if held.version < view.version => {
                let delta = diff(&held.view, &view.view);
                if (delta.upserted.len() + delta.removed.len()) * 2 < view.view.endpoints.len() {
                    Release::Patch(ViewPatch {
                        base: held.version,
                        version: view.version,
                        delta,
                    })
                } else {
                    Release::Whole(view.clone())
                }
            }
            _ => Release::Whole(view.clone()),
        }
    }

    /// An entry carrying the releases `sent` (each view's key, and whether it went as a
    /// patch) committed and put `in_force` in force (what its response says each member
    /// now holds). A sent view missing from `in_force` was skipped, so what the log holds
    /// for it is no longer known here. Returns the skipped patches' views: they must go
    /// again, whole. (A skipped whole view was not newer than what the log holds.)
    pub fn handle_committed<'a>(
        &mut self,
        sent: impl IntoIterator<Item = (&'a ViewKey, bool)>,
        in_force: &[ReleasedView],
    ) -> Vec<ViewKey> {
        let put: std::collections::BTreeSet<&ViewKey> =
            in_force.iter().map(|v| &v.view.key).collect();
        let mut again = Vec::new();
        for (key, patch) in sent {
            self.held.remove(key);
            if patch && !put.contains(key) {
                again.push(key.clone());
            }
        }
        for view in in_force {
            self.held.insert(view.view.key.clone(), view.clone());
        }
        again
    }

    /// A write carrying releases of `sent` failed: it may or may not have committed, so
    /// the next release of each goes whole.
    pub fn handle_failed<'a>(&mut self, sent: impl IntoIterator<Item = &'a ViewKey>) {
        for key in sent {
            self.held.remove(key);
        }
    }

    /// The release held for a view, as far as this encoder knows.
    pub fn held(&self, key: &ViewKey) -> Option<&ReleasedView> {
        self.held.get(key)
    }
}

#[cfg(test)]
pub(crate) mod tests;
