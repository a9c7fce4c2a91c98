//! The client's pure parts: what it asks for, what it applies, how long it waits and how
//! it reports its stream.

use std::collections::BTreeSet;

use envoy_types::pb::envoy::service::discovery::v3::Resource;

use super::*;
use crate::translate::{TYPE_CLUSTER, TYPE_ENDPOINT};

fn wildcard() -> Subscription {
    Subscription {
        wildcard: true,
        names: BTreeSet::new(),
    }
}

fn named(names: &[&str]) -> Subscription {
    Subscription {
        wildcard: false,
        names: names.iter().map(|n| (*n).to_owned()).collect(),
    }
}

fn state() -> ClientState {
    ClientState::new([
        (TYPE_ENDPOINT.to_owned(), named(&["pay"])),
        (TYPE_CLUSTER.to_owned(), wildcard()),
    ])
}

fn node() -> Node {
    Node {
        id: "node-a".to_owned(),
        ..Default::default()
    }
}

fn res(type_url: &str, name: &str, version: &str, payload: &[u8]) -> Resource {
    Resource {
        name: name.to_owned(),
        version: version.to_owned(),
        resource: Some(Any {
            type_url: type_url.to_owned(),
            value: payload.to_vec(),
        }),
        ..Default::default()
    }
}

fn response(
    type_url: &str,
    nonce: &str,
    resources: Vec<Resource>,
    removed: &[&str],
) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        system_version_info: format!("v-{nonce}"),
        type_url: type_url.to_owned(),
        resources,
        removed_resources: removed.iter().map(|n| (*n).to_owned()).collect(),
        nonce: nonce.to_owned(),
        ..Default::default()
    }
}

fn names(applied: &Applied, type_url: &str) -> Vec<String> {
    applied
        .resources(type_url)
        .map(|r| r.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn the_first_connect_subscribes_every_type_with_the_node_on_the_first_request_only() {
    let reqs = state().initial_requests(&node());
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].type_url, TYPE_CLUSTER, "clusters before endpoints");
    assert_eq!(reqs[0].node.as_ref().map(|n| n.id.as_str()), Some("node-a"));
    assert_eq!(reqs[0].resource_names_subscribe, ["*"]);
    assert_eq!(reqs[1].type_url, TYPE_ENDPOINT);
    assert_eq!(reqs[1].node, None);
    assert_eq!(reqs[1].resource_names_subscribe, ["pay"]);
    assert!(reqs.iter().all(|r| r.initial_resource_versions.is_empty()));
}

#[test]
fn a_reconnect_names_every_applied_version_so_nothing_unchanged_is_resent() {
    let mut s = state();
    s.handle_response(response(
        TYPE_CLUSTER,
        "1",
        vec![
            res(TYPE_CLUSTER, "pay", "c1", b"x"),
            res(TYPE_CLUSTER, "web", "c2", b"y"),
        ],
        &[],
    ))
    .unwrap();
    let reqs = s.initial_requests(&node());
    let versions = &reqs[0].initial_resource_versions;
    assert_eq!(versions.len(), 2);
    assert_eq!(versions["pay"], "c1");
    assert_eq!(versions["web"], "c2");
    assert!(reqs[1].initial_resource_versions.is_empty());
}

#[test]
fn an_accepted_response_applies_upserts_and_removals_and_acks_its_nonce() {
    let mut s = state();
    s.handle_response(response(
        TYPE_CLUSTER,
        "1",
        vec![
            res(TYPE_CLUSTER, "pay", "1", b"a"),
            res(TYPE_CLUSTER, "web", "1", b"b"),
        ],
        &[],
    ))
    .unwrap();
    let ack = s
        .handle_response(response(
            TYPE_CLUSTER,
            "2",
            vec![res(TYPE_CLUSTER, "pay", "2", b"c")],
            &["web", "never-held"],
        ))
        .unwrap();
    assert_eq!(ack.type_url, TYPE_CLUSTER);
    assert_eq!(ack.response_nonce, "2");
    assert_eq!(ack.error_detail, None);
    assert!(ack.resource_names_subscribe.is_empty() && ack.node.is_none());
    let applied = s.applied();
    assert_eq!(names(&applied, TYPE_CLUSTER), ["pay"]);
    let (version, any) = &applied.resources(TYPE_CLUSTER).unwrap()["pay"];
    assert_eq!((version.as_str(), any.value.as_slice()), ("2", &b"c"[..]));
    assert_eq!(applied.version(TYPE_CLUSTER), Some("v-2"));
    assert_eq!(applied.updates, 2);
}

#[test]
fn a_rejected_response_applies_nothing_and_nacks_with_invalid_argument() {
    // Goal: every kind of bad response leaves the applied resources exactly as they were.
    let mut s = state();
    s.handle_response(response(
        TYPE_CLUSTER,
        "1",
        vec![res(TYPE_CLUSTER, "pay", "1", b"a")],
        &[],
    ))
    .unwrap();
    let before = s.applied().types;
    let mut no_payload = res(TYPE_CLUSTER, "web", "2", b"");
    no_payload.resource = None;
    let bad = [
        response("type.googleapis.com/other", "2", vec![], &[]),
        response(
            TYPE_CLUSTER,
            "3",
            vec![res(TYPE_CLUSTER, "", "2", b"")],
            &["pay"],
        ),
        response(TYPE_CLUSTER, "4", vec![no_payload], &["pay"]),
        response(
            TYPE_CLUSTER,
            "5",
            vec![res(TYPE_ENDPOINT, "web", "2", b"")],
            &["pay"],
        ),
    ];
    for (i, resp) in bad.into_iter().enumerate() {
        let nonce = resp.nonce.clone();
        let nack = s.handle_response(resp).unwrap_err();
        assert_eq!(nack.request.response_nonce, nonce);
        let detail = nack.request.error_detail.as_ref().unwrap();
        assert_eq!(detail.code, 3);
        assert_eq!(detail.message, nack.error.to_string());
        assert_eq!(s.applied().types, before, "response {i} changed the state");
        assert_eq!(s.applied().nacks, i as u64 + 1);
    }
    assert_eq!(s.applied().updates, 1);
}

#[test]
fn the_validator_refuses_the_whole_response_when_one_resource_is_undecodable() {
    let validator: Validator = Arc::new(|_type_url: &str, any: &Any| {
        if any.value == b"bad" {
            Err("cannot decode".to_owned())
        } else {
            Ok(())
        }
    });
    let mut s = state().with_validator(validator);
    let nack = s
        .handle_response(response(
            TYPE_ENDPOINT,
            "1",
            vec![
                res(TYPE_ENDPOINT, "pay", "1", b"ok"),
                res(TYPE_ENDPOINT, "web", "1", b"bad"),
            ],
            &[],
        ))
        .unwrap_err();
    assert_eq!(
        nack.error,
        ResponseError::Refused {
            name: "web".to_owned(),
            reason: "cannot decode".to_owned()
        }
    );
    assert_eq!(s.applied().resources(TYPE_ENDPOINT), None);
    assert_eq!(
        s.applied().last_nack,
        Some((TYPE_ENDPOINT.to_owned(), nack.error.to_string()))
    );
}

#[test]
fn subscribing_sends_only_what_is_new() {
    let mut s = state();
    assert_eq!(s.subscribe(TYPE_ENDPOINT, named(&["pay"])), None);
    let req = s.subscribe(TYPE_ENDPOINT, named(&["pay", "web"])).unwrap();
    assert_eq!(req.resource_names_subscribe, ["web"]);
    assert_eq!(req.node, None);
    let req = s.subscribe(TYPE_ENDPOINT, wildcard()).unwrap();
    assert_eq!(req.resource_names_subscribe, ["*"]);
    let reqs = s.initial_requests(&node());
    assert_eq!(reqs[1].resource_names_subscribe, ["*", "pay", "web"]);
}

#[test]
fn a_type_subscribed_to_nothing_is_not_requested_since_empty_would_mean_wildcard() {
    let s = ClientState::new([(TYPE_ENDPOINT.to_owned(), named(&[]))]);
    assert!(s.initial_requests(&node()).is_empty());
}

#[test]
fn the_retry_hint_is_read_only_from_unavailable() {
    let mut status = tonic::Status::unavailable("later");
    status
        .metadata_mut()
        .insert(RETRY_PUSHBACK, "1500".parse().unwrap());
    assert_eq!(retry_hint(&status), Some(Duration::from_millis(1_500)));
    let mut other = tonic::Status::internal("boom");
    other
        .metadata_mut()
        .insert(RETRY_PUSHBACK, "1500".parse().unwrap());
    assert_eq!(retry_hint(&other), None);
    let mut negative = tonic::Status::unavailable("never");
    negative
        .metadata_mut()
        .insert(RETRY_PUSHBACK, "-1".parse().unwrap());
    assert_eq!(retry_hint(&negative), None);
    assert_eq!(retry_hint(&tonic::Status::unavailable("no hint")), None);
}

#[test]
fn the_stream_status_keeps_the_time_of_loss_through_failed_reconnects() {
    // Goal: `Lost { since }` is when the open stream ended, not the latest failed attempt,
    // and the counters count every open and every failed attempt.
    let start = Instant::now();
    let mut status = StreamStatus::new();
    assert!(matches!(
        status.state,
        StreamState::Connecting { error: None }
    ));
    status.handle_attempt_failed(StreamError::Closed);
    assert!(status.error().is_some() && status.lost_since().is_none());
    assert_eq!((status.opened, status.failed_attempts), (0, 1));

    status.handle_opened(start);
    assert!(status.is_connected() && status.error().is_none());
    let lost_at = start + Duration::from_secs(5);
    status.handle_lost(lost_at, StreamError::Closed);
    assert!(!status.is_connected());
    assert_eq!(status.lost_since(), Some(lost_at));

    let refused = tonic::Status::unavailable("admission");
    status.handle_attempt_failed(StreamError::Status(refused));
    assert_eq!(
        status.lost_since(),
        Some(lost_at),
        "a failed attempt keeps the loss time"
    );
    assert!(matches!(
        status.error().map(|e| &**e),
        Some(StreamError::Status(_))
    ));
    assert_eq!((status.opened, status.failed_attempts), (1, 2));

    status.handle_opened(lost_at + Duration::from_secs(1));
    assert!(status.is_connected() && status.lost_since().is_none());
    assert_eq!(status.opened, 2);
}

#[test]
fn a_release_age_is_kept_with_its_version_and_a_malformed_one_counted() {
    // Goal: the age a resource carries is kept with the version and the arrival instant
    // passed in; a later version without one drops it, a removal forgets it, and an age
    // that is filed but unusable is ignored and counted.
    use crate::release_age::{AGE_FIELD, METADATA_KEY, metadata};
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
    #[allow(clippy::disallowed_methods)] // the one anchor instant of this test
    let t0 = std::time::Instant::now();
    let aged = |version: &str, age: Option<Duration>| Resource {
        metadata: age.and_then(metadata),
        ..res(TYPE_ENDPOINT, "pay", version, b"p")
    };
    let mut s = state();
    s.handle_response_at(
        response(
            TYPE_ENDPOINT,
            "1",
            vec![aged("1", Some(Duration::from_millis(300)))],
            &[],
        ),
        t0,
    )
    .unwrap();
    let arrival = s.applied().types[TYPE_ENDPOINT].carried["pay"].clone();
    assert_eq!(
        arrival,
        Arrival {
            version: "1".into(),
            at: t0,
            age: Duration::from_millis(300)
        }
    );
    assert_eq!(
        arrival.age_at(t0 + Duration::from_secs(2)),
        Duration::from_millis(2300)
    );
    // A version without an age: the old arrival no longer describes it.
    s.handle_response_at(response(TYPE_ENDPOINT, "2", vec![aged("2", None)], &[]), t0)
        .unwrap();
    assert!(s.applied().types[TYPE_ENDPOINT].carried.is_empty());
    assert_eq!(s.applied().ages_ignored, 0);
    // A malformed age: applied all the same, the age ignored and counted.
    let fields = [(
        AGE_FIELD.to_owned(),
        Value {
            kind: Some(Kind::StringValue("soon".into())),
        },
    )]
    .into_iter()
    .collect();
    let mut bad = aged("3", None);
    bad.metadata = Some(envoy_types::pb::envoy::config::core::v3::Metadata {
        filter_metadata: [(METADATA_KEY.to_owned(), Struct { fields })]
            .into_iter()
            .collect(),
        ..Default::default()
    });
    s.handle_response_at(response(TYPE_ENDPOINT, "3", vec![bad], &[]), t0)
        .unwrap();
    let applied = s.applied();
    assert_eq!(applied.resources(TYPE_ENDPOINT).unwrap()["pay"].0, "3");
    assert!(applied.types[TYPE_ENDPOINT].carried.is_empty());
    assert_eq!(applied.ages_ignored, 1);
    // A removal forgets the arrival.
    s.handle_response_at(
        response(
            TYPE_ENDPOINT,
            "4",
            vec![aged("4", Some(Duration::from_millis(1)))],
            &[],
        ),
        t0,
    )
    .unwrap();
    assert_eq!(s.applied().types[TYPE_ENDPOINT].carried.len(), 1);
    s.handle_response_at(response(TYPE_ENDPOINT, "5", vec![], &["pay"]), t0)
        .unwrap();
    assert!(s.applied().types[TYPE_ENDPOINT].carried.is_empty());
}
