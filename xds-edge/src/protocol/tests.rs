//! Protocol edge cases, each a test (the list in the xDS issue, item 8).

use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;

use super::*;
use crate::snapshot::Encoded;
use crate::translate::TYPE_ENDPOINT;

fn res(entries: &[(&str, &str)]) -> Resources {
    entries
        .iter()
        .map(|(n, v)| {
            let any = Any {
                type_url: TYPE_ENDPOINT.into(),
                value: format!("{n}@{v}").into_bytes(),
            };
            (
                (*n).to_owned(),
                Encoded {
                    version: (*v).to_owned(),
                    resource: Arc::new(any),
                },
            )
        })
        .collect()
}

fn delta_req(subscribe: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: TYPE_ENDPOINT.into(),
        resource_names_subscribe: subscribe.iter().map(|s| (*s).to_owned()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
    r.resources.iter().map(|r| r.name.as_str()).collect()
}

#[test]
fn delta_first_empty_request_is_wildcard_and_an_ack_is_recognised() {
    let mut s = DeltaState::default();
    assert_eq!(s.handle_request(&delta_req(&[], "")), Ack::None);
    let r = s
        .next_response(
            TYPE_ENDPOINT,
            &res(&[("a", "1"), ("b", "1")]),
            "1",
            "n1".into(),
        )
        .unwrap();
    assert_eq!(names(&r), vec!["a", "b"]);
    assert_eq!(
        s.handle_request(&delta_req(&[], "n1")),
        Ack::Acked { nonce: "n1".into() }
    );
    // Nothing changed: nothing to send.
    assert!(
        s.next_response(
            TYPE_ENDPOINT,
            &res(&[("a", "1"), ("b", "1")]),
            "1",
            "n2".into()
        )
        .is_none()
    );
}

#[test]
fn delta_nack_carries_the_error_and_the_rejected_version_is_not_resent() {
    let mut s = DeltaState::default();
    s.handle_request(&delta_req(&["a"], ""));
    s.next_response(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n1".into())
        .unwrap();
    let mut nack = delta_req(&[], "n1");
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "bad weight".into(),
        details: vec![],
    });
    assert_eq!(
        s.handle_request(&nack),
        Ack::Nacked {
            nonce: "n1".into(),
            error: "bad weight".into()
        }
    );
    assert!(
        s.next_response(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n2".into())
            .is_none(),
        "no NACK storm"
    );
    let r = s
        .next_response(TYPE_ENDPOINT, &res(&[("a", "2")]), "2", "n3".into())
        .unwrap();
    assert_eq!(r.resources[0].version, "2", "a newer version goes out");
}

#[test]
fn delta_a_stale_nonce_is_neither_ack_nor_nack_but_subscriptions_still_apply() {
    let mut s = DeltaState::default();
    s.handle_request(&delta_req(&["a"], ""));
    s.next_response(
        TYPE_ENDPOINT,
        &res(&[("a", "1"), ("b", "1")]),
        "1",
        "n1".into(),
    )
    .unwrap();
    s.next_response(
        TYPE_ENDPOINT,
        &res(&[("a", "2"), ("b", "1")]),
        "2",
        "n2".into(),
    )
    .unwrap();
    assert_eq!(
        s.handle_request(&delta_req(&["b"], "n1")),
        Ack::Stale { nonce: "n1".into() }
    );
    let r = s
        .next_response(
            TYPE_ENDPOINT,
            &res(&[("a", "2"), ("b", "1")]),
            "2",
            "n3".into(),
        )
        .unwrap();
    assert_eq!(names(&r), vec!["b"]);
}

#[test]
fn delta_reconnect_skips_unchanged_and_removes_what_was_deleted_while_away() {
    // Istio #41494, java-control-plane #463: versions the client still holds for deleted
    // resources must come back as removed.
    let mut s = DeltaState::default();
    let mut req = delta_req(&["a", "b", "gone"], "");
    req.initial_resource_versions = [("a", "1"), ("b", "1"), ("gone", "1")]
        .iter()
        .map(|(n, v)| ((*n).into(), (*v).into()))
        .collect();
    s.handle_request(&req);
    let r = s
        .next_response(
            TYPE_ENDPOINT,
            &res(&[("a", "1"), ("b", "2")]),
            "2",
            "n1".into(),
        )
        .unwrap();
    assert_eq!(names(&r), vec!["b"], "unchanged a is not resent");
    assert_eq!(r.removed_resources, vec!["gone".to_owned()]);
}

#[test]
fn delta_a_subscription_to_a_missing_resource_delivers_it_when_it_appears() {
    // go-control-plane #488.
    let mut s = DeltaState::default();
    s.handle_request(&delta_req(&["later"], ""));
    assert!(
        s.next_response(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n1".into())
            .is_none()
    );
    let r = s
        .next_response(
            TYPE_ENDPOINT,
            &res(&[("a", "1"), ("later", "1")]),
            "2",
            "n2".into(),
        )
        .unwrap();
    assert_eq!(names(&r), vec!["later"]);
}

#[test]
fn delta_removal_is_sent_and_unsubscribing_an_unknown_name_is_a_no_op() {
    let mut s = DeltaState::default();
    s.handle_request(&delta_req(&["a", "b"], ""));
    s.next_response(
        TYPE_ENDPOINT,
        &res(&[("a", "1"), ("b", "1")]),
        "1",
        "n1".into(),
    )
    .unwrap();
    let r = s
        .next_response(TYPE_ENDPOINT, &res(&[("a", "1")]), "2", "n2".into())
        .unwrap();
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, vec!["b".to_owned()]);
    let mut unsub = delta_req(&[], "n2");
    unsub.resource_names_unsubscribe = vec!["never-heard-of".into(), "a".into()];
    assert_eq!(s.handle_request(&unsub), Ack::Acked { nonce: "n2".into() });
    assert!(s.known.is_empty(), "unsubscribed a is forgotten");
    assert!(
        s.next_response(TYPE_ENDPOINT, &res(&[("a", "3")]), "3", "n3".into())
            .is_none()
    );
}

fn sotw_req(type_url: &str, names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url.into(),
        resource_names: names.iter().map(|s| (*s).to_owned()).collect(),
        version_info: version.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

#[test]
fn sotw_cds_absence_means_delete_but_eds_absence_does_not() {
    let mut cds = SotwState::default();
    cds.handle_request(&sotw_req(TYPE_CLUSTER, &[], "", ""));
    let r = cds
        .next_response(
            TYPE_CLUSTER,
            &res(&[("a", "1"), ("b", "1")]),
            "1",
            "n1".into(),
        )
        .unwrap();
    assert_eq!(r.resources.len(), 2);
    let r = cds
        .next_response(TYPE_CLUSTER, &res(&[("a", "1")]), "2", "n2".into())
        .unwrap();
    assert_eq!(
        r.resources.len(),
        1,
        "the full set, without b: b is deleted"
    );
    let mut eds = SotwState::default();
    eds.handle_request(&sotw_req(TYPE_ENDPOINT, &["a"], "", ""));
    let r = eds
        .next_response(
            TYPE_ENDPOINT,
            &res(&[("a", "1"), ("b", "1")]),
            "1",
            "n1".into(),
        )
        .unwrap();
    assert_eq!(r.resources.len(), 1, "only what was named");
}

#[test]
fn sotw_ack_nack_and_stale_nonces() {
    let mut s = SotwState::default();
    s.handle_request(&sotw_req(TYPE_ENDPOINT, &["a"], "", ""));
    s.next_response(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n1".into())
        .unwrap();
    assert_eq!(
        s.handle_request(&sotw_req(TYPE_ENDPOINT, &["a"], "1", "n1")),
        Ack::Acked { nonce: "n1".into() }
    );
    assert!(
        s.next_response(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n2".into())
            .is_none()
    );
    s.next_response(TYPE_ENDPOINT, &res(&[("a", "2")]), "2", "n3".into())
        .unwrap();
    // A stale nonce is ignored entirely, names included.
    assert_eq!(
        s.handle_request(&sotw_req(TYPE_ENDPOINT, &["a", "b"], "1", "n1")),
        Ack::Stale { nonce: "n1".into() }
    );
    assert_eq!(s.subscription.names.len(), 1);
    let mut nack = sotw_req(TYPE_ENDPOINT, &["a"], "1", "n3");
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "no".into(),
        details: vec![],
    });
    assert_eq!(
        s.handle_request(&nack),
        Ack::Nacked {
            nonce: "n3".into(),
            error: "no".into()
        }
    );
}

#[test]
fn sotw_a_watch_stays_registered_after_an_immediate_response() {
    // go-control-plane #458: answering at once must not drop the watch.
    let mut s = SotwState::default();
    s.handle_request(&sotw_req(TYPE_ENDPOINT, &["a"], "", ""));
    s.next_response(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n1".into())
        .unwrap();
    s.handle_request(&sotw_req(TYPE_ENDPOINT, &["a"], "1", "n1"));
    let r = s.next_response(TYPE_ENDPOINT, &res(&[("a", "2")]), "2", "n2".into());
    assert!(r.is_some(), "a later change is still delivered");
}

#[test]
fn delta_never_sends_a_reconnecting_client_backwards_from_a_lagging_server() {
    // The client held versions from a member further ahead than this one.
    let mut s = DeltaState::default();
    let mut req = delta_req(&[], "");
    req.initial_resource_versions = [
        ("a".to_owned(), "10".to_owned()),
        ("b".to_owned(), "4".to_owned()),
        ("new".to_owned(), "12".to_owned()),
    ]
    .into();
    s.handle_request(&req);
    // This server has a older than the client, b newer, and lacks `new` (not yet applied).
    let r = s
        .next_response(
            TYPE_ENDPOINT,
            &res(&[("a", "9"), ("b", "5")]),
            "1",
            "n1".into(),
        )
        .unwrap();
    assert_eq!(
        names(&r),
        vec!["b"],
        "only what is newer than the client's copy"
    );
    assert!(
        r.removed_resources.is_empty(),
        "a lagging server removes nothing it lacks"
    );
    // Once the server catches up, it sends again.
    let r = s
        .next_response(
            TYPE_ENDPOINT,
            &res(&[("a", "11"), ("b", "5"), ("new", "12")]),
            "2",
            "n2".into(),
        )
        .unwrap();
    assert_eq!(names(&r), vec!["a"]);
    // A resource really gone (the server is past the client's copy) is removed.
    let r = s
        .next_response(
            TYPE_ENDPOINT,
            &res(&[("a", "13"), ("b", "5")]),
            "3",
            "n3".into(),
        )
        .unwrap();
    assert_eq!(r.removed_resources, vec!["new".to_owned()]);
}

#[test]
fn delta_a_server_that_has_applied_nothing_removes_nothing() {
    // Found by the region simulation: a member still catching up on the log, with no
    // views yet, told a reconnecting client that every view it held was removed.
    let held = || {
        let mut s = DeltaState::default();
        let mut req = delta_req(&[], "");
        req.initial_resource_versions = [("a".to_owned(), "7".to_owned())].into();
        s.handle_request(&req);
        s
    };
    let empty = res(&[]);
    assert!(
        held()
            .next_response(TYPE_ENDPOINT, &empty, "0", "n1".into())
            .is_none(),
        "a server that has seen no version yet is behind, not empty"
    );
    // A server that held the client's version or later and has none now removed it.
    let r = held()
        .next_response(TYPE_ENDPOINT, &empty, "9", "n1".into())
        .unwrap();
    assert_eq!(r.removed_resources, vec!["a".to_owned()]);
}
