//! Sidecar reports and config requests round trip through the wire, and a report over a
//! bound is refused naming the field.

use std::time::Duration;

use prost::Message;
use serde_json::json;

use super::super::{AgentMessage, AuthorityMessage, pb};
use super::*;

fn client(n: usize) -> SidecarClient {
    SidecarClient {
        client: format!("sidecar-{n}"),
        cluster: "web".into(),
        zone: "dev-a".into(),
        identity: n
            .is_multiple_of(2)
            .then(|| format!("spiffe://td/r/workload/web/web-{n}")),
        protocol: if n.is_multiple_of(2) {
            XdsProtocol::Delta
        } else {
            XdsProtocol::Sotw
        },
        stream_id: n as u64,
        connected_for: Duration::from_millis(1_500),
        types: vec![
            TypeSync {
                type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
                sent: Some("7".into()),
                acked: Some("7".into()),
                resources: 3,
                ..TypeSync::default()
            },
            TypeSync {
                type_url: "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
                    .into(),
                sent: Some("8".into()),
                acked: Some("7".into()),
                nacks: 1,
                last_nack: Some(Nack {
                    version: "8".into(),
                    error: "bad weight".into(),
                }),
                resources: 3,
            },
        ],
    }
}

fn agent_round_trip(message: AgentMessage) -> Result<AgentMessage, WireError> {
    let bytes = pb::AgentMessage::from(message).encode_to_vec();
    AgentMessage::try_from(pb::AgentMessage::decode(bytes.as_slice()).unwrap())
}

#[test]
fn a_report_a_request_and_an_answer_survive_the_wire() {
    let report = SidecarReport {
        view_age: Some(Duration::from_millis(250)),
        clients: (0..3).map(client).collect(),
        clients_left_out: 2,
    };
    let sent = AgentMessage::Sidecars { report };
    assert_eq!(agent_round_trip(sent.clone()).unwrap(), sent);
    let empty = AgentMessage::Sidecars {
        report: SidecarReport::default(),
    };
    assert_eq!(agent_round_trip(empty.clone()).unwrap(), empty);

    let answer = AgentMessage::ClientConfig(ClientConfig {
        request_id: 9,
        document: Some(json!({"client": "sidecar-0", "clusters": [{"name": "web"}]})),
    });
    assert_eq!(agent_round_trip(answer.clone()).unwrap(), answer);
    let unknown = AgentMessage::ClientConfig(ClientConfig {
        request_id: 10,
        document: None,
    });
    assert_eq!(agent_round_trip(unknown.clone()).unwrap(), unknown);

    let request = AuthorityMessage::ConfigRequest(ConfigRequest {
        request_id: 9,
        client: "sidecar-0".into(),
    });
    let bytes = pb::AuthorityMessage::from(request.clone()).encode_to_vec();
    let back = AuthorityMessage::try_from(pb::AuthorityMessage::decode(bytes.as_slice()).unwrap());
    assert_eq!(back.unwrap(), request);
}

#[test]
fn a_report_over_a_bound_is_refused_naming_the_field() {
    let report = |clients: Vec<SidecarClient>| AgentMessage::Sidecars {
        report: SidecarReport {
            clients,
            ..SidecarReport::default()
        },
    };
    let too_many = agent_round_trip(report((0..=SIDECAR_CLIENTS_MAX).map(client).collect()));
    assert!(
        matches!(too_many, Err(WireError::TooMany { field: "sidecars.clients", len, .. }) if len == SIDECAR_CLIENTS_MAX + 1),
        "{too_many:?}"
    );
    let mut long_nack = client(1);
    long_nack.types[1].last_nack = Some(Nack {
        version: "8".into(),
        error: "x".repeat(NACK_ERROR_BYTES_MAX + 1),
    });
    let e = agent_round_trip(report(vec![long_nack])).unwrap_err();
    assert_eq!(e.label(), "bad_length");
    assert!(e.chain().contains("last_nack.error"), "{}", e.chain());
    let mut nameless = client(1);
    nameless.client = String::new();
    let e = agent_round_trip(report(vec![nameless])).unwrap_err();
    assert!(e.chain().contains("client: 0 bytes"), "{}", e.chain());

    // Within the count, over the bytes: refused whole.
    let mut wordy = client(1);
    wordy.types[1].last_nack.as_mut().unwrap().error = "x".repeat(NACK_ERROR_BYTES_MAX);
    let e = agent_round_trip(report(vec![wordy; SIDECAR_CLIENTS_MAX])).unwrap_err();
    assert_eq!(e.label(), "bad_length");
    assert!(e.chain().starts_with("sidecars: "), "{}", e.chain());

    // An unset protocol is refused, as every `*_UNSPECIFIED` is.
    let mut wire = pb::SidecarClient::from(client(1));
    wire.protocol = pb::XdsProtocol::Unspecified as i32;
    let e = SidecarClient::try_from(wire).unwrap_err();
    assert_eq!(e.label(), "unknown_enum");
}

#[test]
fn a_config_answer_must_be_a_json_object_within_its_bound() {
    let answer = |document: Vec<u8>| {
        ClientConfig::try_from(pb::ClientConfig {
            request_id: 1,
            document: Some(document),
        })
    };
    for bad in [&b"not json"[..], b"[1, 2]", b"\"text\""] {
        let e = answer(bad.to_vec()).unwrap_err();
        assert_eq!(e.label(), "not_json", "{bad:?}");
    }
    // Nested past serde_json's recursion limit: an error, not a stack overflow.
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    assert_eq!(answer(deep.into_bytes()).unwrap_err().label(), "not_json");
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(CLIENT_CONFIG_BYTES_MAX));
    assert_eq!(answer(big.into_bytes()).unwrap_err().label(), "bad_length");
}

#[test]
fn clipping_keeps_a_string_within_its_bound_on_a_character_boundary() {
    assert_eq!(clipped("short", 10), "short");
    assert_eq!(clipped("abcdef", 3), "abc");
    // 'é' is two bytes: a cut inside it falls back to before it.
    assert_eq!(clipped("aé", 2), "a");
    assert!(clipped(&"é".repeat(600), NACK_ERROR_BYTES_MAX).len() <= NACK_ERROR_BYTES_MAX);
}

#[test]
fn a_report_is_written_as_both_apis_always_wrote_it() {
    let report = SidecarReport {
        view_age: Some(Duration::from_secs(1)),
        clients: vec![SidecarClient {
            client: "c".into(),
            cluster: "svc".into(),
            zone: "z".into(),
            identity: None,
            protocol: XdsProtocol::Delta,
            stream_id: 7,
            connected_for: Duration::from_secs(2),
            types: vec![TypeSync {
                type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
                sent: Some("v2".into()),
                acked: Some("v1".into()),
                nacks: 1,
                last_nack: Some(Nack {
                    version: "v2".into(),
                    error: "bad".into(),
                }),
                resources: 3,
            }],
        }],
        clients_left_out: 0,
    };
    // The APIs write bodies through `Value` (keys in name order), as when this was json!.
    let body = serde_json::to_value(report.body(Duration::from_millis(500))).unwrap();
    assert_eq!(
        serde_json::to_string(&body).unwrap(),
        r#"{"clients_left_out":0,"sidecars":[{"client":"c","cluster":"svc","connected_for_ms":2500,"identity":null,"protocol":"delta","state":"NACK","stream_id":7,"types":{"Cluster":{"acked":"v1","in_sync":false,"last_nack":{"error":"bad","version":"v2"},"nacks":1,"resources":3,"sent":"v2"}},"zone":"z"}],"view_age_ms":1500}"#
    );
}
