#![allow(clippy::unwrap_used)]

use super::*;
use waymark_core::audit::DETAIL_LEN_MAX;

#[test]
fn http_2xx_passes_without_detail() {
    assert_eq!(Outcome::of_http(200, b"", None), Outcome::pass());
    assert_eq!(Outcome::of_http(204, b"ignored", None), Outcome::pass());
}

#[test]
fn http_503_fails_with_status_and_body() {
    let o = Outcome::of_http(503, b"database down\n", None);
    assert_eq!(o.health, Health::Fail);
    assert_eq!(o.detail.as_deref(), Some("HTTP 503; said: database down"));
    let o = Outcome::of_http(301, b"", None);
    assert_eq!(o.detail.as_deref(), Some("HTTP 301"));
}

#[test]
fn http_long_body_is_truncated_in_detail() {
    let body = "x".repeat(4 * DETAIL_LEN_MAX);
    let o = Outcome::of_http(500, body.as_bytes(), None);
    let detail = o.detail.unwrap();
    assert!(detail.len() <= DETAIL_LEN_MAX + '…'.len_utf8());
    assert!(detail.starts_with("HTTP 500; said: xxx"));
    let said = detail.split_once(TARGET_TEXT_MARKER).unwrap().1;
    assert_eq!(said, format!("{}…", "x".repeat(TARGET_TEXT_LEN_MAX)));
}

#[test]
fn a_body_cannot_forge_lines_in_a_detail() {
    let o = Outcome::of_http(500, b"down\nINFO forged line\r\x1b[2J", None);
    let detail = o.detail.unwrap();
    assert!(!detail.chars().any(char::is_control), "{detail:?}");
    assert!(
        detail.starts_with("HTTP 500; said: down INFO forged line"),
        "{detail:?}"
    );
}

#[test]
fn http_body_match_decides_a_2xx() {
    assert_eq!(
        Outcome::of_http(200, b"status: ok", Some("ok")),
        Outcome::pass()
    );
    let o = Outcome::of_http(200, b"status: degraded", Some("status: ok"));
    assert_eq!(o.health, Health::Fail);
    assert!(o.detail.unwrap().contains("does not contain"));
    // A non-2xx fails whatever the body says.
    assert_eq!(
        Outcome::of_http(503, b"ok", Some("ok")).health,
        Health::Fail
    );
}

#[test]
fn grpc_serving_passes_and_the_rest_fail_by_name() {
    assert_eq!(Outcome::of_grpc_status(1), Outcome::pass());
    for (raw, name) in [(0, "UNKNOWN"), (2, "NOT_SERVING"), (3, "SERVICE_UNKNOWN")] {
        let o = Outcome::of_grpc_status(raw);
        assert_eq!(o.health, Health::Fail);
        assert_eq!(o.detail.as_deref(), Some(name));
    }
    assert_eq!(Outcome::of_grpc_status(42).health, Health::Fail);
}

#[test]
fn refused_connect_is_hard() {
    let e = ProbeError::Connect(io::Error::from(io::ErrorKind::ConnectionRefused));
    assert_eq!(Outcome::of_error(&e).health, Health::Refused);
}

#[test]
fn refused_under_a_wrapping_io_error_is_still_hard() {
    let inner = io::Error::from(io::ErrorKind::ConnectionRefused);
    let e = ProbeError::Connect(io::Error::other(inner));
    assert_eq!(Outcome::of_error(&e).health, Health::Refused);
}

#[test]
fn io_timeout_is_soft() {
    let e = ProbeError::Connect(io::Error::from(io::ErrorKind::TimedOut));
    assert_eq!(Outcome::of_error(&e).health, Health::Timeout);
    assert_eq!(
        Outcome::timed_out(Duration::from_millis(200)),
        Outcome::with_detail(Health::Timeout, "no answer within 200ms")
    );
}

#[test]
fn other_errors_fail_with_the_chain_as_detail() {
    let e = ProbeError::Connect(io::Error::from(io::ErrorKind::ConnectionReset));
    let o = Outcome::of_error(&e);
    assert_eq!(o.health, Health::Fail);
    assert!(o.detail.unwrap().starts_with("connect failed: "));
}

#[test]
fn grpc_statuses_map_by_code() {
    let o = Outcome::of_error(&ProbeError::Status(tonic::Status::not_found("no")));
    assert_eq!(o, Outcome::with_detail(Health::Fail, "SERVICE_UNKNOWN"));
    let o = Outcome::of_error(&ProbeError::Status(tonic::Status::deadline_exceeded("")));
    assert_eq!(o.health, Health::Timeout);
    let o = Outcome::of_error(&ProbeError::Status(tonic::Status::unimplemented("")));
    assert_eq!(o.health, Health::Fail);
    assert!(o.detail.unwrap().starts_with("gRPC Unimplemented"));
}

#[test]
fn checks_follow_the_contract_kind() {
    let http = Check::from_kind(&ProbeKind::Http {
        path: "/readyz".into(),
    });
    assert_eq!(
        http,
        Check::Http(HttpCheck {
            path: "/readyz".into(),
            expect_body: None
        })
    );
    assert_eq!(Check::from_kind(&ProbeKind::Tcp).kind_label(), "tcp");
}
