//! The node's sidecar report stays within its bounds (clients clipped and counted, strings
//! cut) and is sent again only when it says something new.

use std::time::Duration;

use prost::Message as _;
use waymark_xds::sync::{ClientSync, TypeSync as XdsTypeSync};

use super::*;
use crate::evidence::{AgentMessage, pb};

fn sync(stream: u64, node_id: &str, acked: &str) -> ClientSync {
    let mut c = ClientSync::new(
        stream,
        node_id.into(),
        "a".into(),
        "delta",
        tokio::time::Instant::now().into_std(),
    );
    c.cluster = "web".into();
    c.types.insert(
        TYPE_CLUSTER.to_owned(),
        XdsTypeSync {
            sent: Some("7".into()),
            acked: Some(acked.into()),
            resources: 1,
            ..XdsTypeSync::default()
        },
    );
    c
}

/// Through the wire and back, as the authority reads it.
fn over_the_wire(report: SidecarReport) -> SidecarReport {
    let bytes = pb::AgentMessage::from(AgentMessage::Sidecars { report }).encode_to_vec();
    let back = pb::AgentMessage::decode(bytes.as_slice()).unwrap();
    match AgentMessage::try_from(back) {
        Ok(AgentMessage::Sidecars { report }) => report,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_report_with_too_many_clients_is_clipped_and_counted() {
    // Goal: a host with more sidecars than a report holds sends the bound, says how many
    // it left out, and never leaves out one that is not in sync.
    let now = tokio::time::Instant::now().into_std();
    let clients: Vec<SidecarClient> = (0..SIDECAR_CLIENTS_MAX as u64 + 44)
        .map(|n| {
            let acked = if n == 290 { "6" } else { "7" };
            client_of(&sync(n, &format!("sidecar-{n}"), acked), now)
        })
        .collect();
    let report = report_of(clients, Some(Duration::from_secs(2)), SIDECAR_CLIENTS_MAX);
    assert_eq!(report.clients.len(), SIDECAR_CLIENTS_MAX);
    assert_eq!(report.clients_left_out, 44);
    assert_eq!(
        report.clients[0].client, "sidecar-290",
        "the unsynced first"
    );
    assert_eq!(report.clients[0].state(), "STALE");
    assert_eq!(report.clients[1].client, "sidecar-0");
    // The authority reads it as sent.
    assert_eq!(over_the_wire(report.clone()), report);
}

#[test]
fn a_report_of_clients_with_long_nacks_is_clipped_to_its_byte_bound() {
    // Goal: clients that all carry the longest NACK text cannot push a report past what
    // the authority keeps of one node: whole clients are left out, and counted.
    let now = tokio::time::Instant::now().into_std();
    let clients: Vec<SidecarClient> = (0..SIDECAR_CLIENTS_MAX as u64)
        .map(|n| {
            let mut c = sync(n, &format!("sidecar-{n}"), "6");
            let t = c.types.get_mut(TYPE_CLUSTER).unwrap();
            t.last_nack = Some(("7".into(), "x".repeat(NACK_ERROR_BYTES_MAX)));
            client_of(&c, now)
        })
        .collect();
    let report = report_of(clients, None, SIDECAR_CLIENTS_MAX);
    let kept = report.clients.len();
    assert!(kept > 64 && kept < SIDECAR_CLIENTS_MAX, "{kept}");
    assert_eq!(report.clients_left_out as usize, SIDECAR_CLIENTS_MAX - kept);
    let len = pb::SidecarReport::from(report.clone()).encoded_len();
    assert!(len <= SIDECAR_REPORT_BYTES_MAX, "{len}");
    assert_eq!(over_the_wire(report.clone()), report);
}

#[test]
fn every_string_a_client_chose_is_cut_to_its_bound() {
    // Goal: whatever a sidecar declares or answers, the report passes the wire's checks
    // (a refused report would end the node's evidence session).
    let mut c = sync(1, &"n".repeat(CLIENT_ID_BYTES_MAX * 4), "7");
    c.cluster = "é".repeat(LABEL_BYTES_MAX);
    c.zone = "z".repeat(LABEL_BYTES_MAX * 2);
    c.identity = Some(format!("spiffe://{}", "i".repeat(IDENTITY_BYTES_MAX)));
    let t = c.types.get_mut(TYPE_CLUSTER).unwrap();
    t.sent = Some("8".repeat(VERSION_BYTES_MAX + 1));
    t.last_nack = Some(("9".repeat(100), "bad ".repeat(NACK_ERROR_BYTES_MAX)));
    t.nacks = 3;
    // Whole milliseconds, as the wire carries them.
    let client = client_of(&c, c.connected_since + Duration::from_millis(1_500));
    assert_eq!(client.client.len(), CLIENT_ID_BYTES_MAX);
    assert!(client.cluster.len() <= LABEL_BYTES_MAX);
    let nack = client.types[0].last_nack.as_ref().unwrap();
    assert_eq!(nack.error.len(), NACK_ERROR_BYTES_MAX);
    assert_eq!(nack.version.len(), VERSION_BYTES_MAX);
    let mut unnamed = sync(2, "", "7");
    unnamed.protocol = "sotw";
    let unnamed = client_of(&unnamed, unnamed.connected_since);
    assert_eq!(unnamed.client, UNNAMED);
    assert_eq!(unnamed.protocol, XdsProtocol::Sotw);
    let report = report_of(vec![client, unnamed], None, SIDECAR_CLIENTS_MAX);
    assert_eq!(over_the_wire(report.clone()), report);
}

#[test]
fn a_report_is_new_only_when_it_says_something_new() {
    // Goal: the session carries a report when a version moves or the view's age jumps, not
    // every second because streams grow older.
    let t0 = tokio::time::Instant::now().into_std();
    let at = |secs: u64, acked: &str, age: u64| {
        let now = t0 + Duration::from_secs(secs);
        let clients = vec![client_of(&sync(1, "sidecar-1", acked), now)];
        report_of(clients, Some(Duration::from_secs(age)), SIDECAR_CLIENTS_MAX)
    };
    let first = at(0, "7", 1);
    let s = Duration::from_secs;
    assert!(
        !differs(&first, &at(10, "7", 11), s(10)),
        "only time passed"
    );
    assert!(
        differs(&first, &at(10, "6", 11), s(10)),
        "an acknowledgement moved"
    );
    assert!(
        differs(&first, &at(10, "7", 0), s(10)),
        "the view was confirmed again"
    );
    assert!(
        !differs(&first, &at(10, "7", 14), s(10)),
        "within the drift"
    );
    let none = report_of(Vec::new(), Some(s(1)), SIDECAR_CLIENTS_MAX);
    assert!(differs(&first, &none, s(1)), "a client went away");
}
