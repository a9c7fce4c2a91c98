//! Delta queues: target views in, versioned releases out, withdrawals first (ADR-11).
//!
//! Pure state machine; no I/O. Each view (service × caller zone) is a lane holding what was
//! last *released* and the latest *target* from the assembler. Two deadlines per lane:
//!
//! - **withdrawal** (short window): anything routed in the released view that the target
//!   no longer routes, and any zone whose fraction guard just engaged, leaves at once. The
//!   partial release keeps every zone at or above its floor (the `zone_floor` marker the
//!   assembler computed); a zone that would fall below is released whole, admissions
//!   included, so a fast path can never undercut the guard.
//! - **admission** (longer window): everything else — new endpoints, weight steps, markers —
//!   is batched. When admissions exceed their rate budget, or the driver reports pressure,
//!   the admission window doubles (up to a cap inside the 30 s budget) and a shed episode is
//!   declared; withdrawals are never slowed.
//!
//! Versions are stamped at release from the caller's [`VersionSource`]; each lane's versions
//! strictly increase, so a subscriber never receives an older version after a newer one.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::defaults as d;
use crate::model::ServiceName;
use crate::view::{ReleasedView, Version, VersionSource, View, ViewDelta, ViewKey, changed, diff};

/// Pacing and limits.
#[derive(Debug, Clone)]
pub struct DeltaConfig {
    /// Withdrawals wait at most this to batch.
    pub withdraw_window: Duration,
    /// Admissions batch over this while unsaturated.
    pub admit_window: Duration,
    /// The longest the admission window grows under saturation.
    pub admit_window_max: Duration,
    /// Admission releases allowed per second before saturation is declared.
    pub admit_releases_per_sec: u32,
}

impl Default for DeltaConfig {
    fn default() -> Self {
        Self {
            withdraw_window: d::WITHDRAW_WINDOW,
            admit_window: d::ADMIT_WINDOW,
            admit_window_max: d::ADMIT_WINDOW_MAX,
            admit_releases_per_sec: d::ADMIT_RELEASES_PER_SEC,
        }
    }
}

/// Which path a release took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Path {
    /// The fast path: withdrawals and guard engagements.
    Withdrawal,
    /// The batched path: everything else.
    Admission,
}

impl Path {
    /// Its label in metrics: `withdrawal` or `admission`.
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Withdrawal => "withdrawal",
            Path::Admission => "admission",
        }
    }
}

/// What the delta queues ask their driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send this release to the view's subscribers.
    Release {
        /// The view as released (boxed: views are large next to the other effects).
        view: Box<ReleasedView>,
        /// The version subscribers at the previous release hold, if any.
        previous: Option<Version>,
        /// The change from the previous release.
        delta: ViewDelta,
        /// Which path it took.
        path: Path,
    },
    /// Admissions are being shed: their window lengthened to `window`.
    ShedStarted {
        /// The admission window now in force.
        window: Duration,
    },
    /// The version source is exhausted: `view` was not released. Nothing more can be
    /// released until the driver gives the queues a fresh source (the authority ends its
    /// leadership term; the next leader rebuilds every view from the desired state).
    VersionsExhausted {
        /// The view that could not be released.
        view: ViewKey,
    },
    /// Shedding is over.
    ShedEnded {
        /// How long the episode lasted.
        lasted: Duration,
        /// Admission releases deferred during it.
        deferred: u64,
    },
}

#[derive(Debug, Clone)]
struct Lane {
    released: Option<ReleasedView>,
    target: View,
    withdraw_due: Option<Instant>,
    admit_due: Option<Instant>,
}

/// Which lanes fall due when, so a timeout visits only the lanes due rather than every
/// lane of the region (one per service and callers' zone: thousands at the reference
/// estate), and the next deadline is the first entry rather than a scan. Each lane's
/// `withdraw_due`/`admit_due` is in its set exactly when it is `Some`
/// ([`DeltaQueues::set_withdraw_due`], [`DeltaQueues::set_admit_due`] keep them so).
#[derive(Debug, Default)]
struct Deadlines {
    withdraw: BTreeSet<(Instant, ViewKey)>,
    admit: BTreeSet<(Instant, ViewKey)>,
}

impl Deadlines {
    /// The lanes of `set` due at `now`, in key order (the order releases are stamped in).
    fn due(set: &BTreeSet<(Instant, ViewKey)>, now: Instant) -> BTreeSet<ViewKey> {
        set.iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, key)| key.clone())
            .collect()
    }

    fn first(&self) -> Option<Instant> {
        let first = |set: &BTreeSet<(Instant, ViewKey)>| set.first().map(|(at, _)| *at);
        [first(&self.withdraw), first(&self.admit)]
            .into_iter()
            .flatten()
            .min()
    }
}

/// Move `key`'s deadline in `set` from `slot` to `due`.
fn reschedule(
    set: &mut BTreeSet<(Instant, ViewKey)>,
    slot: &mut Option<Instant>,
    key: &ViewKey,
    due: Option<Instant>,
) {
    if *slot == due {
        return;
    }
    if let Some(old) = slot.take() {
        set.remove(&(old, key.clone()));
    }
    if let Some(at) = due {
        set.insert((at, key.clone()));
    }
    *slot = due;
}

#[derive(Debug, Clone)]
struct Episode {
    started: Instant,
    last_saturated: Instant,
    deferred: u64,
}

/// The delta queues of a region. See the module documentation.
#[derive(Debug)]
pub struct DeltaQueues {
    config: DeltaConfig,
    lanes: BTreeMap<ViewKey, Lane>,
    deadlines: Deadlines,
    window: Duration,
    rate_window_start: Option<Instant>,
    releases_in_window: u32,
    /// Reported pressure lasts until then (see [`PRESSURE_HOLD`]).
    pressure_until: Option<Instant>,
    episode: Option<Episode>,
    effects: Vec<Effect>,
    last_now: Option<Instant>,
}

/// How long one report of delivery pressure saturates admissions. A slow commit is an
/// event, not a level: the commit after it may be quick again before any admission falls
/// due, and a report that ended before anything looked at it would shed nothing.
pub const PRESSURE_HOLD: Duration = Duration::from_secs(2);

// === impl DeltaQueues ===

impl DeltaQueues {
    /// Empty queues.
    pub fn new(config: DeltaConfig) -> Self {
        let window = config.admit_window;
        Self {
            config,
            lanes: BTreeMap::new(),
            deadlines: Deadlines::default(),
            window,
            rate_window_start: None,
            releases_in_window: 0,
            pressure_until: None,
            episode: None,
            effects: Vec::new(),
            last_now: None,
        }
    }

    /// A new target for one view.
    pub fn handle_target(&mut self, now: Instant, target: View) {
        self.advance(now);
        let (withdraw_window, admit_window) = (self.config.withdraw_window, self.window);
        let lane = self
            .lanes
            .entry(target.key.clone())
            .or_insert_with(|| Lane {
                released: None,
                target: View::empty(target.key.clone()),
                withdraw_due: None,
                admit_due: None,
            });
        lane.target = target;
        let (urgent, admit) = match &lane.released {
            None => (false, true),
            Some(released) => (
                is_urgent(&released.view, &lane.target),
                released.view != lane.target,
            ),
        };
        // The lane is at hand: its deadlines move here, without looking it up again.
        let key = &lane.target.key;
        if urgent && lane.withdraw_due.is_none() {
            let due = Some(now + withdraw_window);
            reschedule(
                &mut self.deadlines.withdraw,
                &mut lane.withdraw_due,
                key,
                due,
            );
        }
        if admit && lane.admit_due.is_none() {
            let due = Some(now + admit_window);
            reschedule(&mut self.deadlines.admit, &mut lane.admit_due, key, due);
        }
    }

    /// A service left the registry: drop its lanes, so none of its views is released
    /// again (subscribers learn of the removal from the driver, not from a release).
    pub fn handle_service_removed(&mut self, service: &ServiceName) {
        let keys: Vec<ViewKey> = self
            .lanes
            .keys()
            .filter(|key| &key.service == service)
            .cloned()
            .collect();
        for key in keys {
            self.set_withdraw_due(&key, None);
            self.set_admit_due(&key, None);
            self.lanes.remove(&key);
        }
    }

    /// The driver's report of delivery pressure (a slow commit, send queues backing up):
    /// admissions are saturated for [`PRESSURE_HOLD`] from `now`, or again at once when
    /// `saturated` is `false` (the driver says the pressure is over).
    pub fn handle_pressure(&mut self, now: Instant, saturated: bool) {
        self.advance(now);
        self.pressure_until = saturated.then(|| now + PRESSURE_HOLD);
    }

    /// Release what is due at `now`, stamping versions from `versions`.
    pub fn handle_timeout(&mut self, now: Instant, versions: &mut dyn VersionSource) {
        self.advance(now);
        self.roll_rate_window(now);
        // Withdrawals first, for every lane due, before any admission is considered.
        for key in &Deadlines::due(&self.deadlines.withdraw, now) {
            self.set_withdraw_due(key, None);
            let lane = self.lanes.get(key).expect("deadlines name held lanes");
            let partial = fast_view(lane.released.as_ref().map(|r| &r.view), &lane.target);
            self.release(key, partial, Path::Withdrawal, versions);
        }
        // Read after the withdrawals: a release that reached its target settled its lane.
        for key in &Deadlines::due(&self.deadlines.admit, now) {
            if self.is_saturated(now) {
                self.defer(now, key);
                continue;
            }
            self.set_admit_due(key, None);
            let target = self.lanes[key].target.clone();
            self.releases_in_window += 1;
            self.release(key, target, Path::Admission, versions);
        }
        self.maybe_end_episode(now);
    }

    /// The earliest time [`DeltaQueues::handle_timeout`] should be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let episode = self
            .episode
            .as_ref()
            .map(|e| e.last_saturated + self.window);
        self.deadlines.first().into_iter().chain(episode).min()
    }

    /// Drain the effects produced so far, in order.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// The last release of a view.
    pub fn released(&self, key: &ViewKey) -> Option<&ReleasedView> {
        self.lanes.get(key)?.released.as_ref()
    }

    /// Every view's last release, in key order (for a new subscriber's first response).
    pub fn released_views(&self) -> impl Iterator<Item = &ReleasedView> {
        self.lanes.values().filter_map(|l| l.released.as_ref())
    }

    /// The admission window in force.
    pub fn admit_window(&self) -> Duration {
        self.window
    }

    /// Whether a shed episode is in progress.
    pub fn is_shedding(&self) -> bool {
        self.episode.is_some()
    }

    /// Whether every lane's deadlines are in [`Deadlines`] and nothing else is (tests).
    #[cfg(test)]
    fn deadlines_match_lanes(&self) -> bool {
        let held = |pick: fn(&Lane) -> Option<Instant>| -> BTreeSet<(Instant, ViewKey)> {
            self.lanes
                .iter()
                .filter_map(|(key, lane)| pick(lane).map(|at| (at, key.clone())))
                .collect()
        };
        held(|l| l.withdraw_due) == self.deadlines.withdraw
            && held(|l| l.admit_due) == self.deadlines.admit
    }

    // --- internals ---

    /// Set `key`'s withdrawal deadline, keeping [`Deadlines`] in step.
    fn set_withdraw_due(&mut self, key: &ViewKey, due: Option<Instant>) {
        if let Some(lane) = self.lanes.get_mut(key) {
            reschedule(
                &mut self.deadlines.withdraw,
                &mut lane.withdraw_due,
                key,
                due,
            );
        }
    }

    /// Set `key`'s admission deadline, keeping [`Deadlines`] in step.
    fn set_admit_due(&mut self, key: &ViewKey, due: Option<Instant>) {
        if let Some(lane) = self.lanes.get_mut(key) {
            reschedule(&mut self.deadlines.admit, &mut lane.admit_due, key, due);
        }
    }

    fn release(&mut self, key: &ViewKey, view: View, path: Path, versions: &mut dyn VersionSource) {
        let lane = self.lanes.get_mut(key).expect("caller holds a lane key");
        let previous = lane.released.as_ref().map(|r| r.version);
        let empty = View::empty(key.clone());
        let old = lane.released.as_ref().map_or(&empty, |r| &r.view);
        if lane.released.is_some() && old == &view {
            return; // nothing changed (a later target undid an earlier one)
        }
        let Some(version) = versions.next_version() else {
            tracing::error!(view = %key, "version source exhausted: view not released");
            self.effects
                .push(Effect::VersionsExhausted { view: key.clone() });
            return;
        };
        let delta = diff(old, &view);
        assert!(
            previous.is_none_or(|p| version > p),
            "version source went backwards for {key}"
        );
        let released = ReleasedView { version, view };
        let settled = released.view == lane.target;
        lane.released = Some(released.clone());
        if settled {
            self.set_admit_due(key, None);
        }
        tracing::debug!(view = %key, xds.version = %version, ?path, upserted = delta.upserted.len(), removed = delta.removed.len(), "view released");
        self.effects.push(Effect::Release {
            view: Box::new(released),
            previous,
            delta,
            path,
        });
    }

    fn is_saturated(&self, now: Instant) -> bool {
        self.pressure_until.is_some_and(|until| now < until)
            || self.releases_in_window >= self.config.admit_releases_per_sec
    }

    fn defer(&mut self, now: Instant, key: &ViewKey) {
        match &mut self.episode {
            Some(e) => {
                e.deferred += 1;
                if e.last_saturated + self.window <= now {
                    self.window = (self.window * 2).min(self.config.admit_window_max);
                }
                e.last_saturated = now;
            }
            None => {
                self.window = (self.window * 2).min(self.config.admit_window_max);
                self.episode = Some(Episode {
                    started: now,
                    last_saturated: now,
                    deferred: 1,
                });
                tracing::warn!(
                    window_ms = self.window.as_millis() as u64,
                    "admissions shed: window lengthened"
                );
                self.effects.push(Effect::ShedStarted {
                    window: self.window,
                });
            }
        }
        self.set_admit_due(key, Some(now + self.window));
    }

    fn maybe_end_episode(&mut self, now: Instant) {
        let saturated = self.is_saturated(now);
        let Some(e) = &mut self.episode else { return };
        if saturated {
            // Still saturated: the episode's end is at least one window away.
            e.last_saturated = now;
            return;
        }
        if e.last_saturated + self.window > now {
            return;
        }
        let (lasted, deferred) = (now.saturating_duration_since(e.started), e.deferred);
        self.episode = None;
        self.window = self.config.admit_window;
        tracing::info!(
            lasted_ms = lasted.as_millis() as u64,
            deferred,
            "admission shedding ended"
        );
        self.effects.push(Effect::ShedEnded { lasted, deferred });
    }

    fn roll_rate_window(&mut self, now: Instant) {
        let start = *self.rate_window_start.get_or_insert(now);
        if now.saturating_duration_since(start) >= Duration::from_secs(1) {
            self.rate_window_start = Some(now);
            self.releases_in_window = 0;
        }
    }

    fn advance(&mut self, now: Instant) {
        debug_assert!(
            self.last_now.is_none_or(|last| now >= last),
            "time went backwards"
        );
        self.last_now = Some(now);
    }
}

/// Whether the target withdraws something the released view routes, or engages a guard.
/// Which path a release from `previous` (none: the view's first) to `released` belongs
/// to, judged by what it does — the rule the queues use to pick the fast path: it takes a
/// routed endpoint away, or engages a zone's fraction guard. Lets anyone who sees only
/// the releases (every member's xDS tier) label them.
pub fn release_path(previous: Option<&View>, released: &View) -> Path {
    match previous {
        Some(previous) if is_urgent(previous, released) => Path::Withdrawal,
        _ => Path::Admission,
    }
}

fn is_urgent(released: &View, target: &View) -> bool {
    let withdraws = changed(&released.endpoints, &target.endpoints).any(|(was, is)| {
        was.is_some_and(|e| e.status.is_routed()) && !is.is_some_and(|e| e.status.is_routed())
    });
    let guards = target
        .markers
        .health_disregarded
        .iter()
        .any(|z| !released.markers.health_disregarded.contains(z));
    withdraws || guards
}

/// The released view with only the urgent part of the target applied, widened per zone so
/// that no zone routes fewer endpoints than its floor (or the target, if that is fewer).
fn fast_view(released: Option<&View>, target: &View) -> View {
    let Some(released) = released else {
        return target.clone();
    };
    let mut view = released.clone();
    for (id, e) in released.endpoints.iter() {
        if e.status.is_routed() && !target.routes_to(id) {
            match target.endpoints.get(id) {
                Some(t) => view.endpoints.insert(id.clone(), t.clone()),
                None => view.endpoints.remove(id),
            };
        }
    }
    let zones: BTreeSet<&crate::model::ZoneName> = released
        .endpoints
        .values()
        .chain(target.endpoints.values())
        .map(|e| &e.zone)
        .collect();
    for zone in zones {
        let newly_guarded = target.markers.health_disregarded.contains(zone)
            && !released.markers.health_disregarded.contains(zone);
        let floor = target.markers.zone_floor.get(zone).copied().unwrap_or(0) as usize;
        if newly_guarded || view.routed_in(zone) < floor.min(target.routed_in(zone)) {
            let in_zone: Vec<crate::model::InstanceId> = view
                .endpoints
                .iter()
                .filter(|(_, e)| &e.zone == zone)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &in_zone {
                view.endpoints.remove(id);
            }
            let whole = target.endpoints.iter().filter(|(_, e)| &e.zone == zone);
            view.endpoints
                .extend(whole.map(|(id, e)| (id.clone(), e.clone())));
        }
    }
    view.markers = target.markers.clone();
    view
}

/// Tracks the versions delivered to one subscriber, refusing to go backwards.
#[derive(Debug, Clone, Default)]
pub struct SubscriberLedger {
    delivered: BTreeMap<ViewKey, Version>,
}

/// A delivery that would send a subscriber backwards. Nothing was recorded; do not send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("view {key} at version {offered} is not newer than delivered version {delivered}")]
pub struct Regression {
    /// The view.
    pub key: ViewKey,
    /// The version offered.
    pub offered: Version,
    /// The version already delivered.
    pub delivered: Version,
}

impl SubscriberLedger {
    /// Record that `version` of `key` is being delivered, if it is newer than the last.
    pub fn deliver(&mut self, key: &ViewKey, version: Version) -> Result<(), Regression> {
        match self.delivered.get(key) {
            Some(&delivered) if delivered >= version => Err(Regression {
                key: key.clone(),
                offered: version,
                delivered,
            }),
            _ => {
                self.delivered.insert(key.clone(), version);
                Ok(())
            }
        }
    }

    /// The last version delivered for `key`.
    pub fn delivered(&self, key: &ViewKey) -> Option<Version> {
        self.delivered.get(key).copied()
    }
}

#[cfg(test)]
mod tests;
