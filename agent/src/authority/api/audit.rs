//! The replicated audit log, read: `GET /v1/audit` (filtered, paged, as JSON lines) and
//! `GET /v1/alarms` (the alarms still raised). Any member answers. The read path redacts
//! what a probed target said; `explain` alone relays it.

use std::collections::BTreeMap;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use waymark_registry::machine::{AuditEntry, AuditKind};

use super::params::QueryParams;
use super::{AUDIT_PAGE_MAX, ApiState, ok};
use crate::evidence::TARGET_TEXT_MARKER;

/// `GET /v1/audit`'s query: every filter given must hold.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(super) struct AuditQuery {
    /// Only records of this kind.
    kind: Option<AuditKind>,
    /// Only records of this actor (`operator/alice`, `waymark`, …).
    actor: Option<String>,
    /// Only records about this service.
    service: Option<String>,
    /// Only records about this instance.
    instance: Option<String>,
    /// Only records after this sequence number.
    since_seq: Option<u64>,
    /// At most this many records (default 1000, at most 10000).
    #[schemars(range(min = 0, max = AUDIT_PAGE_MAX))]
    limit: Option<usize>,
}

impl QueryParams for AuditQuery {
    const NAMES: &'static [&'static str] =
        &["kind", "actor", "service", "instance", "since_seq", "limit"];
}

/// One alarm still raised (`GET /v1/alarms`).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(super) struct Alarm {
    service: String,
    /// `fraction_guard`, `last_eligible_withdrawn` or `publish_refused` (the leader's
    /// term ran out of view versions with no voter to hand over to).
    alarm: String,
    /// The zone it concerns, for the fraction guard.
    zone: Option<String>,
    /// When it was raised, Unix ms.
    since_ms: u64,
    /// The audit record that raised it.
    seq: u64,
    /// That record's detail.
    detail: Value,
}

pub(super) async fn audit(
    State(s): State<ApiState>,
    Query(q): Query<AuditQuery>,
) -> impl IntoResponse {
    let limit = q.limit.unwrap_or(1000).min(AUDIT_PAGE_MAX);
    let lines: String = s.raft.with_state(|state, _| {
        let mut out = String::new();
        for e in state
            .audit()
            .iter()
            .filter(|e| q.since_seq.is_none_or(|s| e.seq > s))
            .filter(|e| q.kind.is_none_or(|k| e.kind == k))
            .filter(|e| q.actor.as_deref().is_none_or(|a| e.actor == a))
            .filter(|e| {
                q.service
                    .as_deref()
                    .is_none_or(|svc| e.service.as_ref().is_some_and(|x| x.as_str() == svc))
            })
            .filter(|e| {
                q.instance
                    .as_deref()
                    .is_none_or(|i| e.instance.as_ref().is_some_and(|x| x.as_str() == i))
            })
            .take(limit)
        {
            if let Ok(line) = serde_json::to_string(&redacted(e)) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    });
    ([(header::CONTENT_TYPE, "application/jsonl")], lines)
}

/// What the audit read path shows of a check's detail in place of the target's own words.
pub const REDACTED: &str = "[redacted: the target's answer is shown by explain]";

/// An audit record as the audit read path shows it. Transition evidence keeps the check's
/// own words (`Fail: HTTP 503`) but not what the probed target said: the target may be
/// anything the registry names, and its answer is relayed only by `explain` (truncated).
/// The record in the log is unchanged.
fn redacted(e: &AuditEntry) -> std::borrow::Cow<'_, AuditEntry> {
    if e.kind != AuditKind::Transition {
        return std::borrow::Cow::Borrowed(e);
    }
    let mut out = e.clone();
    if let Some(evidence) = out.detail.get_mut("evidence").and_then(Value::as_array_mut) {
        for class in evidence {
            if let Some(Value::String(last)) = class.get_mut("last")
                && let Some(head) = check_words(last)
            {
                *last = format!("{head}{TARGET_TEXT_MARKER}{REDACTED}");
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The check's own words of a detail that carries a target's text, if it does: up to the
/// marker, or — in records written before the marker — up to the text after an HTTP
/// status or a gRPC code.
fn check_words(last: &str) -> Option<&str> {
    if let Some((head, _)) = last.split_once(TARGET_TEXT_MARKER) {
        return Some(head);
    }
    let (_health, rest) = last.split_once(": ")?;
    let offset = last.len() - rest.len();
    let said_at = if let Some(status) = rest.strip_prefix("HTTP ") {
        let code = status
            .get(..3)
            .filter(|c| c.bytes().all(|b| b.is_ascii_digit()))?;
        status[code.len()..]
            .starts_with(": ")
            .then_some(5 + code.len())?
    } else if let Some(grpc) = rest.strip_prefix("gRPC ") {
        5 + grpc.find(": ")?
    } else {
        return None;
    };
    Some(&last[..offset + said_at])
}

/// Current alarms: the latest alarm record per (service, alarm, zone) that is still raised.
pub(super) async fn alarms(State(s): State<ApiState>) -> Response {
    let term = s.raft.current_term();
    let raised = s
        .raft
        .with_state(|state, _| raised_alarms(state.audit().iter(), term));
    ok(&raised)
}

/// The alarms `audit` still holds raised while `term` is the current Raft term: the
/// fraction guard and the last eligible instance until their release records, and a
/// refusal to publish (its term out of view versions) for as long as that term lasts.
fn raised_alarms<'a>(audit: impl Iterator<Item = &'a AuditEntry>, term: u64) -> Vec<Alarm> {
    let mut latest: BTreeMap<(String, String, String), &AuditEntry> = BTreeMap::new();
    for e in audit.filter(|e| e.kind == AuditKind::Alarm) {
        let family = match e.outcome.as_str() {
            "guard_engaged" | "guard_released" => "fraction_guard",
            "last_eligible_withdrawn" | "eligible_restored" => "last_eligible_withdrawn",
            "publish_refused" => "publish_refused",
            _ => continue,
        };
        let zone = e
            .detail
            .get("zone")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let service = e
            .service
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        latest.insert((service, family.to_owned(), zone), e);
    }
    latest
        .into_iter()
        .filter(|(_, e)| match e.outcome.as_str() {
            "guard_engaged" | "last_eligible_withdrawn" => true,
            // Ends with its term: the next leader starts with a fresh version space.
            "publish_refused" => e.detail.get("term").and_then(Value::as_u64) == Some(term),
            _ => false,
        })
        .map(|((service, alarm, zone), e)| Alarm {
            service,
            alarm,
            zone: (!zone.is_empty()).then_some(zone),
            since_ms: e.at_ms,
            seq: e.seq,
            detail: e.detail.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_audit_read_path_keeps_the_checks_words_and_drops_what_the_target_said() {
        for (last, head) in [
            ("Fail: HTTP 503; said: secret-token", Some("Fail: HTTP 503")),
            (
                "Fail: gRPC Unavailable; said: x",
                Some("Fail: gRPC Unavailable"),
            ),
            // Records written before the marker existed.
            ("Fail: HTTP 500: ami-id i-0abc", Some("Fail: HTTP 500")),
            ("Fail: gRPC Internal: boom", Some("Fail: gRPC Internal")),
            ("Fail: HTTP 503", None),
            ("Refused: connection refused", None),
            ("Timeout: no answer within 500ms", None),
            ("not ready: warming up", None),
        ] {
            assert_eq!(check_words(last), head, "{last}");
        }
        let entry = AuditEntry {
            seq: 1,
            at_ms: 0,
            kind: AuditKind::Transition,
            actor: "waymark".into(),
            service: None,
            instance: None,
            outcome: "ineligible".into(),
            detail: json!({"evidence": [
                {"class": "probe", "last": "Fail: HTTP 500; said: {\"AccessKeyId\": \"AKIA\"}"},
                {"class": "self_report", "last": "ready"},
            ]}),
        };
        let shown = serde_json::to_string(&redacted(&entry)).unwrap_or_default();
        assert!(!shown.contains("AKIA"), "{shown}");
        assert!(shown.contains("Fail: HTTP 500; said: [redacted"), "{shown}");
        assert!(shown.contains("\"ready\""), "{shown}");
    }

    fn alarm(seq: u64, outcome: &str, service: Option<&str>, detail: Value) -> AuditEntry {
        AuditEntry {
            seq,
            at_ms: seq * 1000,
            kind: AuditKind::Alarm,
            actor: "waymark".into(),
            service: service.map(|s| s.parse().unwrap_or_else(|e| panic!("{e}"))),
            instance: None,
            outcome: outcome.into(),
            detail,
        }
    }

    #[test]
    fn an_alarm_is_raised_until_its_release_and_a_publish_refusal_until_its_term_ends() {
        let log = [
            alarm(1, "guard_engaged", Some("web"), json!({"zone": "a"})),
            alarm(2, "guard_engaged", Some("web"), json!({"zone": "b"})),
            alarm(3, "guard_released", Some("web"), json!({"zone": "a"})),
            alarm(4, "last_eligible_withdrawn", Some("pay"), json!({})),
            alarm(
                5,
                "publish_refused",
                None,
                json!({"term": 7, "reason": "versions_exhausted"}),
            ),
        ];
        let names = |term| {
            raised_alarms(log.iter(), term)
                .into_iter()
                .map(|a| (a.service, a.alarm, a.zone))
                .collect::<Vec<_>>()
        };
        let web_b = (
            "web".to_owned(),
            "fraction_guard".to_owned(),
            Some("b".to_owned()),
        );
        let pay = ("pay".to_owned(), "last_eligible_withdrawn".to_owned(), None);
        let refused = (String::new(), "publish_refused".to_owned(), None);
        assert_eq!(names(7), vec![refused, pay.clone(), web_b.clone()]);
        // A new term: the refusal is over; the others stand until released.
        assert_eq!(names(8), vec![pay, web_b]);
    }
}
