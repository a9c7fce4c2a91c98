//! `leader-churn`'s pure parts: the attempts, the members' registries and the version
//! series → figures → the verdict (no clock, no I/O; wall-clock moments come in as data).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Serialize;

use super::Params;
use crate::drill::figures::Verdict;
use crate::drill::report;
use crate::harness::registrar::{Attempt, Op, Reply};
use crate::harness::xds_watch::WatchLog;
use crate::traffic::{Answer, Outcome};

/// A lease ending within this of a moment may have expired by then (the members' clocks
/// are this machine's, but leases are checked on a timer).
pub const EXPIRY_MARGIN_MS: u64 = 30_000;

/// One kill and what followed, ms since the epoch or from the kill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kill {
    pub at_ms: u64,
    pub killed: u64,
    /// Until a live member said it leads.
    pub leader_known_ms: Option<u64>,
    /// Until a new leader acknowledged a write.
    pub write_accepted_ms: Option<u64>,
    pub new_leader: Option<u64>,
    /// From the restart until the member was ready.
    pub restart_ready_ms: Option<u64>,
    /// Whether its data directory was deleted first (`--break-wipe-on-restart`).
    pub wiped: bool,
}

/// The writes the drill made.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WriteFigures {
    pub operations: u64,
    pub attempts: u64,
    pub acknowledged: u64,
    pub acknowledged_by_op: BTreeMap<String, u64>,
    /// Attempts with no acknowledgement (elections, a dead member): a figure, not a
    /// failure.
    pub unacknowledged_attempts: u64,
    /// Operations every attempt of which failed: their outcome is unknown.
    pub operations_given_up: u64,
    /// A retry told the earlier unacknowledged attempt had been committed after all
    /// (`duplicate_address` on a registration, `unknown_instance` on a deregistration).
    pub committed_unacknowledged: u64,
    pub ack_latency_p50_ms: Option<f64>,
    pub ack_latency_p99_ms: Option<f64>,
}

/// What the acknowledged writes say about one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Registered (and maybe renewed): present with at least this lease end.
    Present { lease_at_least: u64 },
    /// Deregistered, acknowledged.
    Absent,
    /// Unknown: an unacknowledged deregistration, or a lease that may have run out.
    Either,
}

/// What the acknowledged writes require, from the attempts in the order they finished.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expectations {
    pub by_instance: BTreeMap<String, Expect>,
    /// Acknowledged instances the leader later answered `unknown_instance` for: a lost
    /// registration seen by the client itself.
    pub refused_as_unknown: Vec<String>,
    /// Present leases that end before the check (+ margin): not judged.
    pub expired: u64,
}

/// Folds the attempts (grouped by operation, in order) into what must hold at wall time
/// `now_wall_ms`.
pub fn expectations(attempts: &[Attempt], now_wall_ms: u64) -> Expectations {
    let mut ops: Vec<(u64, Vec<&Attempt>)> = Vec::new();
    for a in attempts {
        match ops.last_mut() {
            Some((id, list)) if *id == a.op_id => list.push(a),
            _ => ops.push((a.op_id, vec![a])),
        }
    }
    let mut out = Expectations::default();
    for (_, tries) in &ops {
        let op = tries[0].op;
        let acked = tries.iter().find(|a| a.acked());
        let unknown_at = tries.iter().position(
            |a| matches!(&a.result, Reply::Refused { reason, .. } if reason == "unknown_instance"),
        );
        match op {
            Op::Register => {
                if let Some(a) = acked
                    && let (Some(id), Reply::Acked { expires_at_ms, .. }) = (&a.instance, &a.result)
                {
                    out.by_instance.insert(
                        id.clone(),
                        Expect::Present {
                            lease_at_least: expires_at_ms.unwrap_or(0),
                        },
                    );
                }
            }
            Op::Renew => {
                let Some(id) = tries[0].instance.clone() else {
                    continue;
                };
                if let Some(i) = unknown_at {
                    if live_at(&out, &id, tries[i].wall_ms) {
                        out.refused_as_unknown.push(id.clone());
                    } else {
                        out.by_instance.insert(id.clone(), Expect::Either);
                    }
                }
                // An acknowledged renewal is the leader term's memory, never a log entry, so
                // it promises no member a later committed lease end.
            }
            Op::Deregister => {
                let Some(id) = tries[0].instance.clone() else {
                    continue;
                };
                let expect = if acked.is_some() {
                    Expect::Absent
                } else if unknown_at == Some(0) {
                    // Refused at the first try: nothing of ours removed it before.
                    if live_at(&out, &id, tries[0].wall_ms) {
                        out.refused_as_unknown.push(id.clone());
                    }
                    Expect::Absent
                } else {
                    Expect::Either
                };
                out.by_instance.insert(id, expect);
            }
        }
    }
    out.refused_as_unknown.sort();
    out.refused_as_unknown.dedup();
    for e in out.by_instance.values_mut() {
        if let Expect::Present { lease_at_least } = *e
            && lease_at_least < now_wall_ms + EXPIRY_MARGIN_MS
        {
            *e = Expect::Either;
            out.expired += 1;
        }
    }
    out
}

/// Whether `id`'s acknowledged lease surely still ran at `wall_ms`.
fn live_at(e: &Expectations, id: &str, wall_ms: u64) -> bool {
    matches!(e.by_instance.get(id), Some(Expect::Present { lease_at_least }) if *lease_at_least > wall_ms + EXPIRY_MARGIN_MS)
}

/// What one member holds against the expectations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MemberCheck {
    pub id: u64,
    /// It answered `/v1/instances`.
    pub answered: bool,
    pub held: u64,
    /// Acknowledged registrations it lacks.
    pub missing: u64,
    /// Instances it holds with a lease shorter than an acknowledged renewal gave.
    pub lease_behind: u64,
    /// Acknowledged deregistrations it still holds.
    pub resurrected: u64,
    /// A few of the ids above, for the reader.
    pub examples: Vec<String>,
}

impl MemberCheck {
    /// Nothing acknowledged is missing.
    pub fn holds(&self) -> bool {
        self.answered && self.missing == 0 && self.lease_behind == 0 && self.resurrected == 0
    }
}

/// Checks one member's instances (id → lease end) against the expectations.
pub fn check_member(
    id: u64,
    expect: &Expectations,
    held: Option<&BTreeMap<String, u64>>,
) -> MemberCheck {
    let Some(held) = held else {
        return MemberCheck {
            id,
            ..MemberCheck::default()
        };
    };
    let mut c = MemberCheck {
        id,
        answered: true,
        held: held.len() as u64,
        ..MemberCheck::default()
    };
    for (instance, e) in &expect.by_instance {
        let bad = match (e, held.get(instance)) {
            (Expect::Present { .. }, None) => {
                c.missing += 1;
                true
            }
            (Expect::Present { lease_at_least }, Some(lease)) if lease < lease_at_least => {
                c.lease_behind += 1;
                true
            }
            (Expect::Absent, Some(_)) => {
                c.resurrected += 1;
                true
            }
            _ => false,
        };
        if bad && c.examples.len() < 5 {
            c.examples.push(instance.clone());
        }
    }
    c
}

/// One version that went backwards (or vanished: `to` is `None`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Regression {
    pub t_ms: u64,
    pub from: u64,
    pub to: Option<u64>,
}

/// Every point of a version series below the highest seen before it, or absent after one
/// was seen. Equal versions (a re-send) are fine.
pub fn regressions(series: &[(u64, Option<u64>)]) -> Vec<Regression> {
    let mut highest: Option<u64> = None;
    let mut out = Vec::new();
    for (t_ms, v) in series {
        match (highest, *v) {
            (Some(h), Some(v)) if v < h => out.push(Regression {
                t_ms: *t_ms,
                from: h,
                to: Some(v),
            }),
            (Some(h), None) => out.push(Regression {
                t_ms: *t_ms,
                from: h,
                to: None,
            }),
            (_, Some(v)) => highest = Some(highest.map_or(v, |h| h.max(v))),
            (None, None) => {}
        }
    }
    out
}

/// One series of versions and what went wrong in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeriesFigures {
    /// `watch:<subscriber>:eds:<resource>` or `member:<id>:/v1/services`.
    pub series: String,
    pub points: u64,
    pub distinct: u64,
    pub last: Option<u64>,
    pub regressions: Vec<Regression>,
}

pub fn series_figures(series: String, points: &[(u64, Option<u64>)]) -> SeriesFigures {
    let mut distinct: Vec<u64> = points.iter().filter_map(|p| p.1).collect();
    distinct.sort_unstable();
    distinct.dedup();
    SeriesFigures {
        series,
        points: points.len() as u64,
        distinct: distinct.len() as u64,
        last: points.iter().rev().find_map(|p| p.1),
        regressions: regressions(points),
    }
}

/// One subscriber's log → one series per resource.
pub fn watch_figures(log: &WatchLog) -> Vec<SeriesFigures> {
    let mut by: BTreeMap<String, Vec<(u64, Option<u64>)>> = BTreeMap::new();
    for s in &log.seen {
        by.entry(s.resource.clone())
            .or_default()
            .push((s.t_ms, s.version));
    }
    by.into_iter()
        .map(|(resource, points)| {
            series_figures(format!("watch:{}:eds:{resource}", log.name), &points)
        })
        .collect()
}

/// Everything about versions.
#[derive(Debug, Clone, Serialize)]
pub struct VersionFigures {
    /// The newest version of each zone's view any member committed after the load.
    pub newest: BTreeMap<String, u64>,
    /// From the end of the load until every subscriber held it.
    pub subscribers_caught_up_ms: Option<u64>,
    /// Subscribers that did not within the limit.
    pub subscribers_behind: Vec<String>,
    pub series: Vec<SeriesFigures>,
    pub regressions: u64,
    /// Subscribers that never applied the service's load assignment.
    pub watchers_without_endpoints: Vec<String>,
    pub watchers: Vec<WatcherSummary>,
}

/// A subscriber's own counters.
#[derive(Debug, Clone, Serialize)]
pub struct WatcherSummary {
    pub name: String,
    pub servers: Vec<SocketAddr>,
    pub updates: u64,
    pub nacks: u64,
    pub streams: u64,
    pub cluster_changes: u64,
    pub unparsable: u64,
}

/// The registry after the churn.
#[derive(Debug, Clone, Serialize)]
pub struct RegistryFigures {
    pub expected_present: u64,
    pub expected_absent: u64,
    pub undetermined: u64,
    pub expired: u64,
    pub refused_as_unknown: Vec<String>,
    pub members: Vec<MemberCheck>,
    /// Every member holds the same instance ids.
    pub members_agree: bool,
    /// From the end of the load until every member held every acknowledged write and
    /// they agreed; `None` if that never happened within the budget.
    pub converged_ms: Option<u64>,
}

/// The verdict: nothing acknowledged lost on any member, members agree, no version went
/// backwards, every kill was followed by a new leader accepting writes and a ready
/// restart within budget, and enough was acknowledged to mean something.
pub fn verdict(
    params: &Params,
    kills: &[Kill],
    writes: &WriteFigures,
    registry: &RegistryFigures,
    versions: &VersionFigures,
) -> Verdict {
    let b = &params.budget;
    let mut failures = Vec::new();
    if kills.len() < params.kills {
        failures.push(format!(
            "only {} of {} kills happened (no leader to kill, or none took writes after one)",
            kills.len(),
            params.kills
        ));
    }
    for (i, k) in kills.iter().enumerate() {
        match k.write_accepted_ms {
            None => failures.push(format!(
                "kill {} (member {}): no new leader accepted a write",
                i + 1,
                k.killed
            )),
            Some(t) if t > b.election_ms => failures.push(format!(
                "kill {} (member {}): a write was accepted after {t} ms, budget {} ms",
                i + 1,
                k.killed,
                b.election_ms
            )),
            Some(_) => {}
        }
        match k.restart_ready_ms {
            None => failures.push(format!(
                "kill {}: member {} did not come back ready",
                i + 1,
                k.killed
            )),
            Some(t) if t > b.restart_ready_ms => failures.push(format!(
                "kill {}: member {} ready after {t} ms, budget {} ms",
                i + 1,
                k.killed,
                b.restart_ready_ms
            )),
            Some(_) => {}
        }
    }
    if (writes.acknowledged as usize) < b.min_acked {
        failures.push(format!(
            "{} writes acknowledged, fewer than {}",
            writes.acknowledged, b.min_acked
        ));
    }
    for m in &registry.members {
        if !m.answered {
            failures.push(format!("member {}: did not answer /v1/instances", m.id));
        } else if !m.holds() {
            failures.push(format!(
                "member {}: {} acknowledged registrations missing, {} renewals behind, {} \
                 deregistrations undone (e.g. {:?})",
                m.id, m.missing, m.lease_behind, m.resurrected, m.examples
            ));
        }
    }
    if !registry.refused_as_unknown.is_empty() {
        failures.push(format!(
            "{} acknowledged instances were later refused as unknown (e.g. {:?})",
            registry.refused_as_unknown.len(),
            &registry.refused_as_unknown[..registry.refused_as_unknown.len().min(5)]
        ));
    }
    if !registry.members_agree {
        failures.push("the members do not hold the same instances".to_owned());
    }
    for s in versions.series.iter().filter(|s| !s.regressions.is_empty()) {
        failures.push(format!(
            "{}: {} versions went backwards, first {:?}",
            s.series,
            s.regressions.len(),
            s.regressions[0]
        ));
    }
    if !versions.subscribers_behind.is_empty() {
        failures.push(format!(
            "subscribers {:?} never caught up with their zone's newest version ({:?})",
            versions.subscribers_behind, versions.newest
        ));
    }
    for w in versions.watchers.iter().filter(|w| w.unparsable > 0) {
        failures.push(format!(
            "{}: {} load-assignment versions were not numbers",
            w.name, w.unparsable
        ));
    }
    if !versions.watchers_without_endpoints.is_empty() {
        failures.push(format!(
            "subscribers {:?} never applied the service's endpoints",
            versions.watchers_without_endpoints
        ));
    }
    Verdict {
        pass: failures.is_empty(),
        failures,
    }
}

/// The write figures from every attempt.
pub fn write_figures(attempts: &[Attempt]) -> WriteFigures {
    let mut f = WriteFigures::default();
    let mut latencies = Vec::new();
    let mut last_op = None;
    let mut op_acked = false;
    let mut op_failed_before = false;
    let finish = |f: &mut WriteFigures, acked: bool| {
        f.operations += 1;
        if !acked {
            f.operations_given_up += 1;
        }
    };
    for a in attempts {
        if last_op != Some(a.op_id) {
            if last_op.is_some() {
                finish(&mut f, op_acked);
            }
            last_op = Some(a.op_id);
            op_acked = false;
            op_failed_before = false;
        }
        f.attempts += 1;
        match &a.result {
            Reply::Acked { .. } => {
                op_acked = true;
                f.acknowledged += 1;
                *f.acknowledged_by_op
                    .entry(format!("{:?}", a.op).to_lowercase())
                    .or_default() += 1;
                latencies.push(a.latency_ms as f64);
            }
            Reply::Refused { reason, .. } => {
                f.unacknowledged_attempts += 1;
                let committed_before = op_failed_before
                    && ((a.op == Op::Register && reason == "duplicate_address")
                        || (a.op == Op::Deregister && reason == "unknown_instance"));
                if committed_before {
                    f.committed_unacknowledged += 1;
                    // The operation is settled: not given up.
                    op_acked = true;
                }
                op_failed_before = true;
            }
            Reply::Failed { .. } => {
                f.unacknowledged_attempts += 1;
                op_failed_before = true;
            }
        }
    }
    if last_op.is_some() {
        finish(&mut f, op_acked);
    }
    f.ack_latency_p50_ms = report::quantile(&latencies, 0.5);
    f.ack_latency_p99_ms = report::quantile(&latencies, 0.99);
    f
}

/// Attempts as traffic outcomes, for the report's error-rate plot.
pub fn as_outcomes(attempts: &[Attempt]) -> Vec<Outcome> {
    attempts
        .iter()
        .map(|a| Outcome {
            at_ms: a.t_ms,
            latency_ms: a.latency_ms,
            result: match &a.result {
                Reply::Acked { .. } => Answer::Ok { instance: None },
                Reply::Refused { status, .. } => Answer::Status { status: *status },
                Reply::Failed { .. } => Answer::Failed,
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drill::Scale;

    const NOW: u64 = 1_000_000_000;
    const LEASE: u64 = NOW + 600_000;

    fn a(op_id: u64, op: Op, instance: &str, result: Reply) -> Attempt {
        Attempt {
            t_ms: op_id * 100,
            wall_ms: NOW,
            latency_ms: 5,
            op_id,
            op,
            attempt: 1,
            member: SocketAddr::from(([127, 0, 0, 1], 1)),
            instance: (!instance.is_empty()).then(|| instance.to_owned()),
            result,
        }
    }

    fn ack(issued: Option<&str>, expires: Option<u64>) -> Reply {
        Reply::Acked {
            issued: issued.map(str::to_owned),
            expires_at_ms: expires,
        }
    }

    fn failed() -> Reply {
        Reply::Failed {
            error: "connection refused".to_owned(),
        }
    }

    fn refused(status: u16, reason: &str) -> Reply {
        Reply::Refused {
            status,
            reason: reason.to_owned(),
        }
    }

    fn held(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(i, l)| ((*i).to_owned(), *l)).collect()
    }

    #[test]
    fn acknowledged_writes_decide_what_must_be_present_or_absent() {
        let attempts = vec![
            a(1, Op::Register, "pay-r1", ack(Some("pay-r1"), Some(LEASE))),
            a(2, Op::Register, "pay-r2", ack(Some("pay-r2"), Some(LEASE))),
            a(3, Op::Renew, "pay-r1", ack(None, Some(LEASE + 5_000))),
            a(4, Op::Deregister, "pay-r2", ack(None, None)),
            // Never acknowledged: its outcome is unknown, nothing is expected.
            a(5, Op::Register, "", failed()),
            a(6, Op::Register, "pay-r3", ack(Some("pay-r3"), Some(LEASE))),
            // A deregistration that never got an answer: either way is fine.
            a(7, Op::Deregister, "pay-r3", failed()),
        ];
        let e = expectations(&attempts, NOW);
        // The renewal is acknowledged from the leader's memory: it promises presence, not a
        // later committed lease end.
        assert_eq!(
            e.by_instance["pay-r1"],
            Expect::Present {
                lease_at_least: LEASE
            }
        );
        assert_eq!(e.by_instance["pay-r2"], Expect::Absent);
        assert_eq!(e.by_instance["pay-r3"], Expect::Either);
        assert_eq!(e.by_instance.len(), 3);
        assert!(e.refused_as_unknown.is_empty());

        let fine = check_member(1, &e, Some(&held(&[("pay-r1", LEASE), ("pay-r9", 1)])));
        assert!(fine.holds(), "{fine:?}");
        let lost = check_member(2, &e, Some(&held(&[("pay-r2", LEASE)])));
        assert_eq!((lost.missing, lost.resurrected), (1, 1));
        assert!(!lost.holds());
        let behind = check_member(3, &e, Some(&held(&[("pay-r1", LEASE - 1)])));
        assert_eq!(behind.lease_behind, 1);
        assert!(!check_member(4, &e, None).holds());
    }

    #[test]
    fn an_unknown_instance_is_a_loss_unless_our_own_earlier_attempt_explains_it() {
        let mut retried = a(
            2,
            Op::Deregister,
            "pay-r1",
            refused(404, "unknown_instance"),
        );
        retried.attempt = 2;
        let attempts = vec![
            a(1, Op::Register, "pay-r1", ack(Some("pay-r1"), Some(LEASE))),
            a(2, Op::Deregister, "pay-r1", failed()),
            retried,
            a(3, Op::Register, "pay-r2", ack(Some("pay-r2"), Some(LEASE))),
            a(4, Op::Renew, "pay-r2", refused(404, "unknown_instance")),
        ];
        let e = expectations(&attempts, NOW);
        assert_eq!(e.refused_as_unknown, vec!["pay-r2".to_owned()]);
        assert_eq!(e.by_instance["pay-r1"], Expect::Either);

        // A lease that ran out explains it too.
        let mut late = a(2, Op::Renew, "pay-r1", refused(404, "unknown_instance"));
        late.wall_ms = LEASE + 1;
        let e = expectations(
            &[
                a(1, Op::Register, "pay-r1", ack(Some("pay-r1"), Some(LEASE))),
                late,
            ],
            NOW,
        );
        assert!(e.refused_as_unknown.is_empty());
        assert_eq!(e.by_instance["pay-r1"], Expect::Either);
    }

    #[test]
    fn a_lease_that_ends_before_the_check_is_not_judged() {
        let attempts = vec![a(
            1,
            Op::Register,
            "pay-r1",
            ack(Some("pay-r1"), Some(NOW + 10)),
        )];
        let e = expectations(&attempts, NOW);
        assert_eq!(e.by_instance["pay-r1"], Expect::Either);
        assert_eq!(e.expired, 1);
    }

    #[test]
    fn versions_going_back_or_vanishing_are_regressions_repeats_are_not() {
        let ok = [(0, None), (1, Some(5)), (2, Some(5)), (3, Some(9))];
        assert!(regressions(&ok).is_empty());
        let back = [
            (1, Some(5)),
            (2, Some(9)),
            (3, Some(7)),
            (4, Some(10)),
            (5, None),
        ];
        assert_eq!(
            regressions(&back),
            vec![
                Regression {
                    t_ms: 3,
                    from: 9,
                    to: Some(7)
                },
                Regression {
                    t_ms: 5,
                    from: 10,
                    to: None
                },
            ]
        );
    }

    #[test]
    fn write_figures_count_attempts_operations_and_commits_nobody_acknowledged() {
        let mut dup = a(2, Op::Register, "", refused(409, "duplicate_address"));
        dup.attempt = 2;
        let attempts = vec![
            a(1, Op::Register, "pay-r1", ack(Some("pay-r1"), Some(LEASE))),
            a(2, Op::Register, "", failed()),
            dup,
            a(3, Op::Renew, "pay-r1", failed()),
        ];
        let f = write_figures(&attempts);
        assert_eq!((f.operations, f.attempts, f.acknowledged), (3, 4, 1));
        assert_eq!(f.unacknowledged_attempts, 3);
        assert_eq!(f.committed_unacknowledged, 1);
        assert_eq!(f.operations_given_up, 1);
        assert_eq!(f.acknowledged_by_op["register"], 1);
    }

    fn kill(write_accepted_ms: Option<u64>, restart_ready_ms: Option<u64>) -> Kill {
        Kill {
            at_ms: 0,
            killed: 1,
            leader_known_ms: write_accepted_ms,
            write_accepted_ms,
            new_leader: Some(2),
            restart_ready_ms,
            wiped: false,
        }
    }

    fn clean() -> (Params, WriteFigures, RegistryFigures, VersionFigures) {
        let mut params = Params::for_scale(Scale::Short);
        params.kills = 1;
        let writes = WriteFigures {
            acknowledged: 500,
            ..WriteFigures::default()
        };
        let registry = RegistryFigures {
            expected_present: 10,
            expected_absent: 0,
            undetermined: 0,
            expired: 0,
            refused_as_unknown: Vec::new(),
            members: vec![MemberCheck {
                id: 1,
                answered: true,
                held: 10,
                ..MemberCheck::default()
            }],
            members_agree: true,
            converged_ms: Some(10),
        };
        let versions = VersionFigures {
            newest: BTreeMap::from([("a".to_owned(), 2)]),
            subscribers_caught_up_ms: Some(1),
            subscribers_behind: Vec::new(),
            series: vec![series_figures(
                "member:1".into(),
                &[(0, Some(1)), (1, Some(2))],
            )],
            regressions: 0,
            watchers_without_endpoints: Vec::new(),
            watchers: Vec::new(),
        };
        (params, writes, registry, versions)
    }

    #[test]
    fn the_verdict_passes_a_clean_run() {
        let (p, w, r, v) = clean();
        let found = verdict(&p, &[kill(Some(800), Some(900))], &w, &r, &v);
        assert!(found.pass, "{found:?}");
    }

    #[test]
    fn the_verdict_fails_on_loss_regression_disagreement_or_a_slow_election() {
        let (p, w, mut r, mut v) = clean();
        r.members[0].missing = 3;
        r.members_agree = false;
        v.series = vec![series_figures(
            "watch:x:eds:pay".into(),
            &[(0, Some(9)), (1, Some(2))],
        )];
        let found = verdict(
            &p,
            &[kill(Some(p.budget.election_ms + 1), None)],
            &w,
            &r,
            &v,
        );
        assert!(!found.pass);
        assert_eq!(found.failures.len(), 5, "{found:?}");

        let (p, mut w, r, v) = clean();
        w.acknowledged = 3;
        let found = verdict(&p, &[], &w, &r, &v);
        // Too few writes, and the kill never happened.
        assert_eq!(found.failures.len(), 2, "{found:?}");
    }
}
