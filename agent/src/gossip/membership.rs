//! Membership snapshots: what the driver publishes after foca's view changes.
//!
//! Pure functions over foca's member list, so they are tested without sockets.

use std::collections::BTreeMap;

use foca::{Incarnation, Member, State};
use waymark_core::model::{NodeName, ZoneName};

use super::identity::GossipId;

/// SWIM liveness of a member (foca's words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Liveness {
    /// Answering probes.
    Alive,
    /// Someone failed to reach it; it is treated as alive until declared down.
    Suspect,
    /// Declared down, or left.
    Down,
}

/// One member as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberState {
    /// Its identity (the newest life of that name this node knows).
    pub id: GossipId,
    /// Its liveness.
    pub state: Liveness,
    /// Whether it is this node.
    pub local: bool,
}

/// Live members (alive or suspect, as SWIM treats suspects) grouped by zone, sorted by name;
/// the input of the authority's prober assignment.
pub fn live_members_by_zone(members: &[MemberState]) -> BTreeMap<ZoneName, Vec<GossipId>> {
    let mut zones: BTreeMap<ZoneName, Vec<GossipId>> = BTreeMap::new();
    for member in members.iter().filter(|m| m.state != Liveness::Down) {
        zones
            .entry(member.id.zone.clone())
            .or_default()
            .push(member.id.clone());
    }
    for ids in zones.values_mut() {
        ids.sort_by(|a, b| a.name.cmp(&b.name));
    }
    zones
}

/// The published snapshot: this node (alive while running) plus foca's members, one entry per
/// name — the largest `bump` wins, and this node wins a tie — sorted by name.
pub(super) fn snapshot<'a>(
    local: &GossipId,
    members: impl Iterator<Item = &'a Member<GossipId>>,
) -> Vec<MemberState> {
    let mut by_name: BTreeMap<NodeName, MemberState> = BTreeMap::new();
    by_name.insert(
        local.name.clone(),
        MemberState {
            id: local.clone(),
            state: Liveness::Alive,
            local: true,
        },
    );
    for member in members {
        let candidate = MemberState {
            id: member.id().clone(),
            state: liveness(member.state()),
            local: false,
        };
        match by_name.get(&candidate.id.name) {
            Some(kept) if kept.id.bump >= candidate.id.bump => {}
            _ => {
                by_name.insert(candidate.id.name.clone(), candidate);
            }
        }
    }
    by_name.into_values().collect()
}

/// Counts per liveness: (alive, suspect, down).
pub(super) fn counts(members: &[MemberState]) -> (usize, usize, usize) {
    members
        .iter()
        .fold((0, 0, 0), |(a, s, d), m| match m.state {
            Liveness::Alive => (a + 1, s, d),
            Liveness::Suspect => (a, s + 1, d),
            Liveness::Down => (a, s, d + 1),
        })
}

fn liveness(state: State) -> Liveness {
    match state {
        State::Alive => Liveness::Alive,
        State::Suspect => Liveness::Suspect,
        State::Down => Liveness::Down,
    }
}

/// What foca's member list looked like last time, to republish only on change without
/// allocating per datagram.
#[derive(Debug, Default)]
pub(super) struct ChangeDetector {
    local: Option<GossipId>,
    seen: Vec<(GossipId, Incarnation, State)>,
}

// === impl ChangeDetector ===

impl ChangeDetector {
    /// Records the current state in one pass; true if it differs from the last call.
    pub(super) fn update<'a>(
        &mut self,
        local: &GossipId,
        members: impl Iterator<Item = &'a Member<GossipId>>,
    ) -> bool {
        let mut changed = self.local.as_ref() != Some(local);
        if changed {
            self.local = Some(local.clone());
        }
        let mut len = 0;
        for m in members {
            let same = matches!(
                self.seen.get(len),
                Some((id, inc, st)) if id == m.id() && *inc == m.incarnation() && *st == m.state()
            );
            if !same {
                changed = true;
                self.seen.truncate(len);
                self.seen.push((m.id().clone(), m.incarnation(), m.state()));
            }
            len += 1;
        }
        if self.seen.len() > len {
            changed = true;
            self.seen.truncate(len);
        }
        changed
    }
}
