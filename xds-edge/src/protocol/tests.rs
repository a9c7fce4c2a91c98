//! Protocol edge cases, each a test (the list in the xDS issue, item 8).

use envoy_types::pb::envoy::service::discovery::v3::Resource;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message as _;

use super::*;
use crate::snapshot::{Encoded, Payload};
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
                    resource: Payload::new(any),
                },
            )
        })
        .collect()
}

/// The protocol's responses as a client decodes them, so every case here also checks
/// the wire form a response is written in.
trait NextMessage {
    type Message;
    fn next_message(
        &mut self,
        type_url: &str,
        resources: &Resources,
        version: &str,
        nonce: String,
    ) -> Option<Self::Message>;
}

impl NextMessage for DeltaState {
    type Message = DeltaDiscoveryResponse;
    fn next_message(
        &mut self,
        type_url: &str,
        resources: &Resources,
        version: &str,
        nonce: String,
    ) -> Option<Self::Message> {
        let out = self.next_response(type_url, resources, version, nonce)?;
        Some(out.message().expect("a response decodes"))
    }
}

impl NextMessage for SotwState {
    type Message = DiscoveryResponse;
    fn next_message(
        &mut self,
        type_url: &str,
        resources: &Resources,
        version: &str,
        nonce: String,
    ) -> Option<Self::Message> {
        let out = self.next_response(type_url, resources, version, nonce)?;
        Some(out.message().expect("a response decodes"))
    }
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
        .next_message(
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
        s.next_message(
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
    s.next_message(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n1".into())
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
        s.next_message(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n2".into())
            .is_none(),
        "no NACK storm"
    );
    let r = s
        .next_message(TYPE_ENDPOINT, &res(&[("a", "2")]), "2", "n3".into())
        .unwrap();
    assert_eq!(r.resources[0].version, "2", "a newer version goes out");
}

#[test]
fn delta_a_stale_nonce_is_neither_ack_nor_nack_but_subscriptions_still_apply() {
    let mut s = DeltaState::default();
    s.handle_request(&delta_req(&["a"], ""));
    s.next_message(
        TYPE_ENDPOINT,
        &res(&[("a", "1"), ("b", "1")]),
        "1",
        "n1".into(),
    )
    .unwrap();
    s.next_message(
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
        .next_message(
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
        .next_message(
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
        s.next_message(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n1".into())
            .is_none()
    );
    let r = s
        .next_message(
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
    s.next_message(
        TYPE_ENDPOINT,
        &res(&[("a", "1"), ("b", "1")]),
        "1",
        "n1".into(),
    )
    .unwrap();
    let r = s
        .next_message(TYPE_ENDPOINT, &res(&[("a", "1")]), "2", "n2".into())
        .unwrap();
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, vec!["b".to_owned()]);
    let mut unsub = delta_req(&[], "n2");
    unsub.resource_names_unsubscribe = vec!["never-heard-of".into(), "a".into()];
    assert_eq!(s.handle_request(&unsub), Ack::Acked { nonce: "n2".into() });
    assert!(s.known.is_empty(), "unsubscribed a is forgotten");
    assert!(
        s.next_message(TYPE_ENDPOINT, &res(&[("a", "3")]), "3", "n3".into())
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
        .next_message(
            TYPE_CLUSTER,
            &res(&[("a", "1"), ("b", "1")]),
            "1",
            "n1".into(),
        )
        .unwrap();
    assert_eq!(r.resources.len(), 2);
    let r = cds
        .next_message(TYPE_CLUSTER, &res(&[("a", "1")]), "2", "n2".into())
        .unwrap();
    assert_eq!(
        r.resources.len(),
        1,
        "the full set, without b: b is deleted"
    );
    let mut eds = SotwState::default();
    eds.handle_request(&sotw_req(TYPE_ENDPOINT, &["a"], "", ""));
    let r = eds
        .next_message(
            TYPE_ENDPOINT,
            &res(&[("a", "1"), ("b", "1")]),
            "1",
            "n1".into(),
        )
        .unwrap();
    assert_eq!(r.resources.len(), 1, "only what was named");
}

#[test]
fn sotw_the_versions_sent_are_what_the_last_response_carried() {
    // What `proxy-config` reads of a SotW client: the names it asked for, at the versions
    // of the last response, not everything the server holds.
    let mut s = SotwState::default();
    assert_eq!(s.sent_versions(), None);
    s.handle_request(&sotw_req(TYPE_ENDPOINT, &["a", "c"], "", ""));
    let all = res(&[("a", "1"), ("b", "1"), ("c", "4")]);
    s.next_message(TYPE_ENDPOINT, &all, "4", "n1".into())
        .unwrap();
    let sent = |s: &SotwState| -> Vec<(String, String)> {
        s.sent_versions()
            .unwrap()
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect()
    };
    let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
    assert_eq!(sent(&s), [pair("a", "1"), pair("c", "4")]);
    let later = res(&[("a", "5"), ("b", "1")]);
    s.next_message(TYPE_ENDPOINT, &later, "5", "n2".into())
        .unwrap();
    assert_eq!(sent(&s), [pair("a", "5")]);
}

#[test]
fn sotw_ack_nack_and_stale_nonces() {
    let mut s = SotwState::default();
    s.handle_request(&sotw_req(TYPE_ENDPOINT, &["a"], "", ""));
    s.next_message(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n1".into())
        .unwrap();
    assert_eq!(
        s.handle_request(&sotw_req(TYPE_ENDPOINT, &["a"], "1", "n1")),
        Ack::Acked { nonce: "n1".into() }
    );
    assert!(
        s.next_message(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n2".into())
            .is_none()
    );
    s.next_message(TYPE_ENDPOINT, &res(&[("a", "2")]), "2", "n3".into())
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
    s.next_message(TYPE_ENDPOINT, &res(&[("a", "1")]), "1", "n1".into())
        .unwrap();
    s.handle_request(&sotw_req(TYPE_ENDPOINT, &["a"], "1", "n1"));
    let r = s.next_message(TYPE_ENDPOINT, &res(&[("a", "2")]), "2", "n2".into());
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
        .next_message(
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
        .next_message(
            TYPE_ENDPOINT,
            &res(&[("a", "11"), ("b", "5"), ("new", "12")]),
            "2",
            "n2".into(),
        )
        .unwrap();
    assert_eq!(names(&r), vec!["a"]);
    // A resource really gone (the server is past the client's copy) is removed.
    let r = s
        .next_message(
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
            .next_message(TYPE_ENDPOINT, &empty, "0", "n1".into())
            .is_none(),
        "a server that has seen no version yet is behind, not empty"
    );
    // A server that held the client's version or later and has none now removed it.
    let r = held()
        .next_message(TYPE_ENDPOINT, &empty, "9", "n1".into())
        .unwrap();
    assert_eq!(r.removed_resources, vec!["a".to_owned()]);
}

// === The wire form ===

/// The gRPC frame a response is written as, whole: its 5-byte header and its message.
fn framed<M: prost::Message + Default>(out: Outgoing<M>) -> (u8, usize, Vec<u8>) {
    let chunks = out.into_grpc_chunks().expect("fits a gRPC frame");
    let bytes: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
    (bytes[0], len, bytes[5..].to_vec())
}

#[test]
fn every_stream_sends_the_snapshots_own_bytes_of_a_resource_never_a_copy() {
    let snapshot = res(&[("a", "1"), ("b", "1")]);
    let shared = snapshot["b"].resource.wire().as_ptr();
    for _ in 0..2 {
        let mut s = DeltaState::default();
        s.handle_request(&delta_req(&["b"], ""));
        let out = s
            .next_response(TYPE_ENDPOINT, &snapshot, "1", "n1".into())
            .unwrap();
        let chunks = out.into_grpc_chunks().unwrap();
        assert_eq!(chunks.len(), 2, "the stream's own bytes, then the resource");
        assert_eq!(chunks[1].as_ptr(), shared);
    }
    let mut s = SotwState::default();
    s.handle_request(&DiscoveryRequest {
        type_url: TYPE_ENDPOINT.into(),
        resource_names: vec!["a".into(), "b".into()],
        ..Default::default()
    });
    let chunks = s
        .next_response(TYPE_ENDPOINT, &snapshot, "1", "n1".into())
        .unwrap()
        .into_grpc_chunks()
        .unwrap();
    assert_eq!(chunks.len(), 4);
    assert_eq!(chunks[3].as_ptr(), shared);
}

proptest::proptest! {
    /// Whatever the names, versions and payloads, the frame's header states the message's
    /// length, and the message decodes to the response prost would have built whole.
    #[test]
    fn a_framed_response_is_the_whole_message(
        entries in proptest::collection::btree_map(
            "[a-z0-9.-]{0,12}",
            ("[0-9]{0,6}", proptest::collection::vec(proptest::num::u8::ANY, 0..300)),
            0..6,
        ),
        removed in proptest::collection::vec("[a-z]{1,8}", 0..3),
        nonce in "[0-9-]{0,10}",
    ) {
        let resources: Resources = entries
            .iter()
            .map(|(name, (version, value))| {
                let any = Any { type_url: TYPE_ENDPOINT.into(), value: value.clone() };
                (name.clone(), Encoded { version: version.clone(), resource: Payload::new(any) })
            })
            .collect();
        // Delta, with known names the snapshot lacks so removals are carried too.
        let mut s = DeltaState::default();
        let mut first = delta_req(&[], "");
        first.initial_resource_versions =
            removed.iter().map(|n| (format!("gone-{n}"), "0".to_owned())).collect();
        s.handle_request(&first);
        if let Some(out) = s.next_response(TYPE_ENDPOINT, &resources, "7", nonce.clone()) {
            let whole = out.message().unwrap();
            let (compressed, len, message) = framed(out);
            proptest::prop_assert_eq!(compressed, 0);
            proptest::prop_assert_eq!(len, message.len());
            let decoded = DeltaDiscoveryResponse::decode(message.as_slice()).unwrap();
            proptest::prop_assert_eq!(&decoded, &whole);
            let expected: Vec<Resource> = resources
                .iter()
                .map(|(name, e)| Resource {
                    name: name.clone(),
                    version: e.version.clone(),
                    resource: Some((*e.resource).clone()),
                    ..Default::default()
                })
                .collect();
            proptest::prop_assert_eq!(&decoded.resources, &expected);
            proptest::prop_assert_eq!(&decoded.nonce, &nonce);
        }
        // State of the World, every name asked for.
        let mut s = SotwState::default();
        s.handle_request(&DiscoveryRequest {
            type_url: TYPE_ENDPOINT.into(),
            resource_names: resources.keys().cloned().collect(),
            ..Default::default()
        });
        if let Some(out) = s.next_response(TYPE_ENDPOINT, &resources, "7", nonce.clone()) {
            let (_, len, message) = framed(out);
            proptest::prop_assert_eq!(len, message.len());
            let decoded = DiscoveryResponse::decode(message.as_slice()).unwrap();
            let expected: Vec<Any> = resources.values().map(|e| (*e.resource).clone()).collect();
            proptest::prop_assert_eq!(decoded.resources, expected);
            proptest::prop_assert_eq!(decoded.version_info, "7");
        }
    }

    /// A stream subscribed by name is sent exactly the named resources that exist and are
    /// newer than what it holds, in name order — what filtering the whole map would give —
    /// and removals only of names it held that are gone.
    #[test]
    fn a_stream_subscribed_by_name_gets_what_it_names_and_nothing_else(
        present in proptest::collection::btree_map("[a-f]{1,2}", "[1-9]", 0..12),
        subscribed in proptest::collection::btree_set("[a-f]{1,2}", 1..8),
        held in proptest::collection::btree_map("[a-f]{1,2}", "[1-9]", 0..6),
    ) {
        let resources: Resources = present
            .iter()
            .map(|(name, version)| {
                let any = Any { type_url: TYPE_ENDPOINT.into(), value: name.as_bytes().to_vec() };
                (name.clone(), Encoded { version: version.clone(), resource: Payload::new(any) })
            })
            .collect();
        let mut s = DeltaState::default();
        let names: Vec<&str> = subscribed.iter().map(String::as_str).collect();
        let mut first = delta_req(&names, "");
        first.initial_resource_versions = held.clone().into_iter().collect();
        s.handle_request(&first);
        let sent = s
            .next_response(TYPE_ENDPOINT, &resources, "9", "n".into())
            .map(|out| out.message().unwrap());
        let wanted = |n: &String| subscribed.contains(n);
        let expected: Vec<(String, String)> = present
            .iter()
            // Sent unless the client holds this version or a newer one (never backwards).
            .filter(|(n, v)| wanted(n) && held.get(*n).is_none_or(|h| h < *v))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        let gone: Vec<String> = held
            .keys()
            .filter(|n| !present.contains_key(*n))
            .cloned()
            .collect();
        let got: Vec<(String, String)> = sent
            .as_ref()
            .map(|m| m.resources.iter().map(|r| (r.name.clone(), r.version.clone())).collect())
            .unwrap_or_default();
        proptest::prop_assert_eq!(got, expected);
        let removed = sent.map(|m| m.removed_resources).unwrap_or_default();
        proptest::prop_assert_eq!(removed, gone);
    }
}

/// Stamps for `(name, version)` pairs, each released at `at` on `path`.
fn stamps(
    entries: &[(&str, &str)],
    at: std::time::Instant,
    path: waymark_core::delta::Path,
) -> Stamps {
    let mut out = Stamps::new();
    for (n, v) in entries {
        let mut versions = out.get(*n).cloned().unwrap_or_default();
        versions.insert(
            (*v).to_owned(),
            Released {
                at,
                path,
                carried: None,
            },
        );
        out.insert((*n).to_owned(), versions);
    }
    out
}

#[test]
fn a_delta_response_carries_the_release_stamps_of_exactly_what_it_sends() {
    // Goal: the stamps a response carries are those of the versions it brings the
    // client, never of what it already holds, and never on the wire.
    use waymark_core::delta::Path;
    #[allow(clippy::disallowed_methods)] // the one anchor instant of this test
    let t0 = std::time::Instant::now();
    let mut s = DeltaState::default();
    s.handle_request(&DeltaDiscoveryRequest::default());
    let r1 = res(&[("pay", "1"), ("web", "2")]);
    let st = stamps(&[("pay", "1")], t0, Path::Admission);
    let out = s
        .next_response_stamped(TYPE_ENDPOINT, &r1, "2", "n1".into(), &st)
        .unwrap();
    assert_eq!(
        out.released(),
        [Released {
            at: t0,
            path: Path::Admission,
            carried: None,
        }]
    );
    let plain = s_fresh_message(&r1);
    assert_eq!(out.message().unwrap(), plain, "stamps never reach the wire");
    // Only `web` changes: `pay`'s stamp (still in the snapshot) is not carried again.
    let r2 = res(&[("pay", "1"), ("web", "3")]);
    let later = t0 + std::time::Duration::from_secs(1);
    let mut st2 = stamps(&[("web", "3")], later, Path::Withdrawal);
    st2.insert("pay".into(), st.get("pay").unwrap().clone());
    let out = s
        .next_response_stamped(TYPE_ENDPOINT, &r2, "3", "n2".into(), &st2)
        .unwrap();
    assert_eq!(
        out.released(),
        [Released {
            at: later,
            path: Path::Withdrawal,
            carried: None,
        }]
    );
}

/// The first response of a fresh wildcard Delta stream for `r`, unstamped.
fn s_fresh_message(r: &Resources) -> DeltaDiscoveryResponse {
    let mut s = DeltaState::default();
    s.handle_request(&DeltaDiscoveryRequest::default());
    s.next_response(TYPE_ENDPOINT, r, "2", "n1".into())
        .unwrap()
        .message()
        .unwrap()
}

#[test]
fn a_sotw_response_carries_only_the_stamps_of_versions_new_to_the_client() {
    // Goal: State of the World repeats every resource; only the changed ones were
    // released to the client now.
    use waymark_core::delta::Path;
    #[allow(clippy::disallowed_methods)] // the one anchor instant of this test
    let t0 = std::time::Instant::now();
    let mut s = SotwState::default();
    s.handle_request(&DiscoveryRequest {
        type_url: TYPE_ENDPOINT.into(),
        resource_names: vec!["pay".into(), "web".into()],
        ..Default::default()
    });
    let st = stamps(&[("pay", "1"), ("web", "2")], t0, Path::Admission);
    let out = s
        .next_response_stamped(
            TYPE_ENDPOINT,
            &res(&[("pay", "1"), ("web", "2")]),
            "2",
            "n1".into(),
            &st,
        )
        .unwrap();
    assert_eq!(out.released().len(), 2);
    let mut st2 = st.clone();
    st2.insert(
        "web".into(),
        stamps(&[("web", "3")], t0, Path::Withdrawal)["web"].clone(),
    );
    let out = s
        .next_response_stamped(
            TYPE_ENDPOINT,
            &res(&[("pay", "1"), ("web", "3")]),
            "3",
            "n2".into(),
            &st2,
        )
        .unwrap();
    assert_eq!(
        out.released(),
        [Released {
            at: t0,
            path: Path::Withdrawal,
            carried: None,
        }]
    );
}

#[test]
fn a_delta_response_carries_each_stamped_release_age_in_the_resource_metadata() {
    // Goal: with a clock, a stamped resource made since the stream opened carries its
    // release's age at sending (as Resource.metadata, which a client decodes like any
    // field); one released before the stream opened, an unstamped one, or a response
    // made without a clock carry nothing.
    use crate::release_age::{Carried, parse};
    use std::time::Duration;
    use waymark_core::delta::Path;
    #[allow(clippy::disallowed_methods)] // the one anchor instant of this test
    let t0 = std::time::Instant::now();
    let s = Duration::from_secs(1);
    let r = res(&[("old", "1"), ("pay", "2"), ("web", "3")]);
    let mut st = stamps(&[("pay", "2")], t0 + 2 * s, Path::Withdrawal);
    st.insert(
        "old".into(),
        stamps(&[("old", "1")], t0, Path::Admission)["old"].clone(),
    );
    let clock = AgeClock {
        now: t0 + 2 * s + Duration::from_millis(250),
        since: t0 + s,
    };
    let mut d = DeltaState::default();
    d.handle_request(&DeltaDiscoveryRequest::default());
    let out = d
        .next_response_carrying(TYPE_ENDPOINT, &r, "2", "n1".into(), &st, Some(clock))
        .unwrap();
    let msg = out.message().unwrap();
    let carried: Vec<(&str, Carried)> = msg
        .resources
        .iter()
        .map(|r| (r.name.as_str(), parse(r.metadata.as_ref())))
        .collect();
    assert_eq!(
        carried,
        [
            ("old", Carried::Absent),
            ("pay", Carried::Age(Duration::from_millis(250))),
            ("web", Carried::Absent),
        ]
    );
    // Everything else on the wire is what a plain response says.
    let mut bare = msg.clone();
    for r in &mut bare.resources {
        r.metadata = None;
    }
    assert_eq!(bare, s_fresh_message(&r));
    // The framed form is the same message.
    let (_, len, body) = framed(out);
    assert_eq!(len, body.len());
    assert_eq!(
        DeltaDiscoveryResponse::decode(body.as_slice()).unwrap(),
        msg
    );
    // Without a clock, nothing is carried.
    let mut d = DeltaState::default();
    d.handle_request(&DeltaDiscoveryRequest::default());
    let out = d
        .next_response_carrying(TYPE_ENDPOINT, &r, "2", "n1".into(), &st, None)
        .unwrap();
    assert!(
        out.message()
            .unwrap()
            .resources
            .iter()
            .all(|r| r.metadata.is_none())
    );
}
