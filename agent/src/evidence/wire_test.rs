//! Round trips domain → wire → bytes → wire → domain for every variant, and a typed
//! refusal for each way a message that parses can still be malformed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use proptest::prelude::*;
use prost::Message;
use waymark_core::contract::{ProbeKind, ProbeSpec};
use waymark_core::defaults::{CONTRACT_TEXT_LEN_MAX, INTERVAL_MAX, PROBE_TIMEOUT_MAX};
use waymark_core::model::{
    Address, DependencyStatus, Health, NAME_LEN_MAX, Observation, SelfReport,
};

use super::super::pb;
use super::super::pb::{agent_message, authority_message, observation, probe_spec, self_report};
use super::*;

fn id(s: &str) -> InstanceId {
    InstanceId::try_new(s).unwrap()
}

fn sample(observation: Observation) -> WireSample {
    WireSample {
        instance: id("pod-1"),
        observation,
    }
}

/// Every observation the domain can hold, one of each shape.
fn every_observation() -> Vec<Observation> {
    let mut all = Vec::new();
    for health in [Health::Pass, Health::Fail, Health::Timeout, Health::Refused] {
        all.push(Observation::Probe {
            health,
            detail: None,
        });
        all.push(Observation::Probe {
            health,
            detail: Some("HTTP 503; said: down".into()),
        });
    }
    // Absent and empty details are different values and must stay so.
    all.push(Observation::Probe {
        health: Health::Fail,
        detail: Some(String::new()),
    });
    all.push(Observation::SelfReport(SelfReport::Ready));
    all.push(Observation::SelfReport(SelfReport::Draining));
    all.push(Observation::SelfReport(SelfReport::NotReady {
        detail: "warming caches".into(),
    }));
    all.push(Observation::SelfReport(SelfReport::NotReady {
        detail: String::new(),
    }));
    for status in [
        DependencyStatus::Ok,
        DependencyStatus::Degraded,
        DependencyStatus::Down,
    ] {
        all.push(Observation::SelfReport(SelfReport::Dependency {
            name: "db".into(),
            status,
        }));
    }
    all.push(Observation::Passive {
        requests: 0,
        errors: 0,
    });
    all.push(Observation::Passive {
        requests: u64::MAX,
        errors: u64::MAX,
    });
    all
}

fn target(ip: IpAddr, kind: ProbeKind) -> ProbeTarget {
    ProbeTarget {
        instance: id("pod-1"),
        service: ServiceName::try_new("pay").unwrap(),
        address: Address { ip, port: 8080 },
        probe: ProbeSpec {
            kind,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
        },
        // Set, so the round trips below carry it (false is the protobuf default).
        confirmation: true,
    }
}

/// Through the wire types and their bytes, as a session carries it.
fn agent_round_trip(message: AgentMessage) -> Result<AgentMessage, WireError> {
    let bytes = pb::AgentMessage::from(message).encode_to_vec();
    let decoded = pb::AgentMessage::decode(bytes.as_slice()).expect("our own encoding parses");
    AgentMessage::try_from(decoded)
}

fn authority_round_trip(message: AuthorityMessage) -> Result<AuthorityMessage, WireError> {
    let bytes = pb::AuthorityMessage::from(message).encode_to_vec();
    let decoded = pb::AuthorityMessage::decode(bytes.as_slice()).expect("our own encoding parses");
    AuthorityMessage::try_from(decoded)
}

#[test]
fn every_agent_message_survives_the_wire() {
    let zone = AgentMessage::Hello {
        zone: ZoneName::try_new("eu-west-1a").unwrap(),
    };
    assert_eq!(agent_round_trip(zone.clone()), Ok(zone));
    for observation in every_observation() {
        for message in [
            AgentMessage::Samples {
                samples: vec![sample(observation.clone())],
            },
            AgentMessage::Relayed {
                samples: vec![sample(observation.clone())],
            },
        ] {
            assert_eq!(agent_round_trip(message.clone()), Ok(message));
        }
    }
    let empty = AgentMessage::Samples { samples: vec![] };
    assert_eq!(agent_round_trip(empty.clone()), Ok(empty));
    let full = AgentMessage::Samples {
        samples: every_observation().into_iter().map(sample).collect(),
    };
    assert_eq!(agent_round_trip(full.clone()), Ok(full));
}

#[test]
fn every_authority_message_survives_the_wire() {
    let v4 = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let v6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1));
    let kinds = [
        ProbeKind::Http {
            path: "/readyz".into(),
        },
        ProbeKind::Tcp,
        ProbeKind::Grpc {
            service: String::new(),
        },
        ProbeKind::Grpc {
            service: "pay.v1.Pay".into(),
        },
    ];
    let targets: Vec<ProbeTarget> = kinds
        .iter()
        .flat_map(|k| [target(v4, k.clone()), target(v6, k.clone())])
        .collect();
    for message in [
        AuthorityMessage::Assignment { targets },
        AuthorityMessage::Assignment { targets: vec![] },
        AuthorityMessage::Ack {
            accepted: 3,
            refused: vec![RefusedSample {
                instance: id("pod-9"),
                reason: "unknown_target".into(),
            }],
        },
        AuthorityMessage::Ack {
            accepted: u64::MAX,
            refused: vec![],
        },
    ] {
        assert_eq!(authority_round_trip(message.clone()), Ok(message));
    }
}

#[test]
fn values_at_their_bounds_are_accepted() {
    let longest = "a".repeat(NAME_LEN_MAX);
    let hello = AgentMessage::Hello {
        zone: ZoneName::try_new(&longest).unwrap(),
    };
    assert_eq!(agent_round_trip(hello.clone()), Ok(hello));
    let detail = AgentMessage::Samples {
        samples: vec![
            sample(Observation::Probe {
                health: Health::Fail,
                detail: Some("x".repeat(DETAIL_BYTES_MAX)),
            }),
            sample(Observation::SelfReport(SelfReport::Dependency {
                name: "d".repeat(CONTRACT_TEXT_LEN_MAX),
                status: DependencyStatus::Down,
            })),
        ],
    };
    assert_eq!(agent_round_trip(detail.clone()), Ok(detail));
    let batch = AgentMessage::Relayed {
        samples: vec![sample(Observation::SelfReport(SelfReport::Ready)); BATCH_MAX],
    };
    assert_eq!(agent_round_trip(batch.clone()), Ok(batch));
    let mut t = target(IpAddr::V4(Ipv4Addr::LOCALHOST), ProbeKind::Tcp);
    t.address.port = u16::MAX;
    t.probe.interval = INTERVAL_MAX;
    t.probe.timeout = PROBE_TIMEOUT_MAX;
    let assignment = AuthorityMessage::Assignment { targets: vec![t] };
    assert_eq!(authority_round_trip(assignment.clone()), Ok(assignment));
}

// === refusals ===

fn wire_sample(observation: observation::Class) -> pb::Sample {
    pb::Sample {
        instance: "pod-1".into(),
        observation: Some(pb::Observation {
            class: Some(observation),
        }),
    }
}

fn samples_msg(samples: Vec<pb::Sample>) -> pb::AgentMessage {
    pb::AgentMessage {
        message: Some(agent_message::Message::Samples(pb::Samples { samples })),
    }
}

fn probe(health: i32, detail: Option<String>) -> observation::Class {
    observation::Class::Probe(pb::ProbeResult { health, detail })
}

fn report(kind: self_report::Kind) -> observation::Class {
    observation::Class::SelfReport(pb::SelfReport { kind: Some(kind) })
}

fn dependency(name: &str, status: i32) -> observation::Class {
    report(self_report::Kind::Dependency(pb::Dependency {
        name: name.into(),
        status,
    }))
}

/// The refusal of `message`: its label and its whole chain.
fn refused(message: pb::AgentMessage) -> (&'static str, String) {
    let e = AgentMessage::try_from(message).expect_err("a malformed message is refused");
    (e.label(), e.chain())
}

fn refused_by_node(message: pb::AuthorityMessage) -> (&'static str, String) {
    let e = AuthorityMessage::try_from(message).expect_err("a malformed message is refused");
    (e.label(), e.chain())
}

#[test]
fn each_malformed_agent_message_is_refused_naming_its_field() {
    let fail = pb::Health::Fail as i32;
    let ok = pb::DependencyStatus::Ok as i32;
    let too_long = "x".repeat(DETAIL_BYTES_MAX + 1);
    let cases: Vec<(&str, pb::AgentMessage, &str, &str)> = vec![
        (
            "no message",
            pb::AgentMessage { message: None },
            "missing",
            "message: missing",
        ),
        (
            "hello without a zone",
            pb::AgentMessage {
                message: Some(agent_message::Message::Hello(pb::Hello::default())),
            },
            "bad_name",
            "hello.zone: not a valid name: zone name is empty",
        ),
        (
            "a zone one byte too long",
            pb::AgentMessage {
                message: Some(agent_message::Message::Hello(pb::Hello {
                    zone: "a".repeat(NAME_LEN_MAX + 1),
                })),
            },
            "bad_name",
            "hello.zone: not a valid name: zone name is 254 bytes long",
        ),
        (
            "an instance with a space",
            samples_msg(vec![
                wire_sample(probe(fail, None)),
                pb::Sample {
                    instance: "pod 2".into(),
                    ..wire_sample(probe(fail, None))
                },
            ]),
            "bad_name",
            "samples.samples[1]: instance: not a valid name: instance id contains ' '",
        ),
        (
            "a sample without an observation",
            samples_msg(vec![pb::Sample {
                instance: "pod-1".into(),
                observation: None,
            }]),
            "missing",
            "samples.samples[0]: observation: missing",
        ),
        (
            "an observation without a class",
            samples_msg(vec![pb::Sample {
                instance: "pod-1".into(),
                observation: Some(pb::Observation { class: None }),
            }]),
            "missing",
            "observation.class: missing",
        ),
        (
            "health unspecified",
            samples_msg(vec![wire_sample(probe(0, None))]),
            "unknown_enum",
            "observation.probe.health: 0 is not a known value",
        ),
        (
            "health from a later version",
            samples_msg(vec![wire_sample(probe(99, None))]),
            "unknown_enum",
            "observation.probe.health: 99 is not a known value",
        ),
        (
            "a probe detail over its bound",
            samples_msg(vec![wire_sample(probe(fail, Some(too_long.clone())))]),
            "bad_length",
            "observation.probe.detail: 4097 bytes, expected 0 to 4096",
        ),
        (
            "a self-report without a kind",
            samples_msg(vec![wire_sample(observation::Class::SelfReport(
                pb::SelfReport { kind: None },
            ))]),
            "missing",
            "observation.self_report.kind: missing",
        ),
        (
            "a not-ready detail over its bound",
            samples_msg(vec![wire_sample(report(self_report::Kind::NotReady(
                pb::NotReady { detail: too_long },
            )))]),
            "bad_length",
            "observation.self_report.not_ready.detail: 4097 bytes",
        ),
        (
            "a dependency status unspecified",
            samples_msg(vec![wire_sample(dependency("db", 0))]),
            "unknown_enum",
            "observation.self_report.dependency.status: 0 is not a known value",
        ),
        (
            "a dependency status from a later version",
            samples_msg(vec![wire_sample(dependency("db", 7))]),
            "unknown_enum",
            "observation.self_report.dependency.status: 7",
        ),
        (
            "a dependency without a name",
            samples_msg(vec![wire_sample(dependency("", ok))]),
            "bad_length",
            "observation.self_report.dependency.name: 0 bytes, expected 1 to 256",
        ),
        (
            "a dependency name over its bound",
            samples_msg(vec![wire_sample(dependency(
                &"d".repeat(CONTRACT_TEXT_LEN_MAX + 1),
                ok,
            ))]),
            "bad_length",
            "observation.self_report.dependency.name: 257 bytes",
        ),
        (
            "a batch over BATCH_MAX",
            samples_msg(vec![wire_sample(probe(fail, None)); BATCH_MAX + 1]),
            "too_many",
            "samples.samples: 4097 entries, at most 4096",
        ),
        (
            "a relayed batch over BATCH_MAX",
            pb::AgentMessage {
                message: Some(agent_message::Message::Relayed(pb::Relayed {
                    samples: vec![
                        wire_sample(report(self_report::Kind::Ready(pb::Ready {})));
                        BATCH_MAX + 1
                    ],
                })),
            },
            "too_many",
            "relayed.samples: 4097 entries",
        ),
    ];
    for (case, message, label, says) in cases {
        let (got_label, chain) = refused(message);
        assert_eq!(got_label, label, "{case}: {chain}");
        assert!(
            chain.contains(says),
            "{case}: {chain:?} should say {says:?}"
        );
    }
}

fn assignment(t: pb::ProbeTarget) -> pb::AuthorityMessage {
    pb::AuthorityMessage {
        message: Some(authority_message::Message::Assignment(pb::Assignment {
            targets: vec![t],
        })),
    }
}

fn good_target() -> pb::ProbeTarget {
    target(IpAddr::V4(Ipv4Addr::LOCALHOST), ProbeKind::Tcp).into()
}

fn with_probe(f: impl FnOnce(&mut pb::ProbeSpec)) -> pb::AuthorityMessage {
    let mut t = good_target();
    f(t.probe.as_mut().unwrap());
    assignment(t)
}

fn ack(refused: Vec<pb::RefusedSample>) -> pb::AuthorityMessage {
    pb::AuthorityMessage {
        message: Some(authority_message::Message::Ack(pb::Ack {
            accepted: 0,
            refused,
        })),
    }
}

fn refusal(instance: &str, reason: &str) -> pb::RefusedSample {
    pb::RefusedSample {
        instance: instance.into(),
        reason: reason.into(),
    }
}

#[test]
fn each_malformed_authority_message_is_refused_naming_its_field() {
    let over = |d: Duration| u64::try_from(d.as_millis()).unwrap() + 1;
    let cases: Vec<(&str, pb::AuthorityMessage, &str, &str)> = vec![
        (
            "no message",
            pb::AuthorityMessage { message: None },
            "missing",
            "message: missing",
        ),
        (
            "a target without an address",
            assignment(pb::ProbeTarget {
                address: None,
                ..good_target()
            }),
            "missing",
            "assignment.targets[0]: address: missing",
        ),
        (
            "a target without a probe",
            assignment(pb::ProbeTarget {
                probe: None,
                ..good_target()
            }),
            "missing",
            "probe: missing",
        ),
        (
            "a target's service not a name",
            assignment(pb::ProbeTarget {
                service: "pay/v1".into(),
                ..good_target()
            }),
            "bad_name",
            "service: not a valid name: service name contains '/'",
        ),
        (
            "an address of five bytes",
            assignment(pb::ProbeTarget {
                address: Some(pb::Address {
                    ip: vec![10, 0, 0, 1, 0],
                    port: 80,
                }),
                ..good_target()
            }),
            "bad_address",
            "address.ip: 5 bytes, expected 4 (IPv4) or 16 (IPv6)",
        ),
        (
            "a port past u16",
            assignment(pb::ProbeTarget {
                address: Some(pb::Address {
                    ip: vec![10, 0, 0, 1],
                    port: 65_536,
                }),
                ..good_target()
            }),
            "out_of_range",
            "address.port: 65536 is out of range, at most 65535",
        ),
        (
            "a probe without a kind",
            with_probe(|p| p.kind = None),
            "missing",
            "probe.kind: missing",
        ),
        (
            "an interval over the contract ceiling",
            with_probe(|p| p.interval_ms = over(INTERVAL_MAX)),
            "out_of_range",
            "probe.interval_ms: 3600001 is out of range, at most 3600000",
        ),
        (
            "an interval of u64::MAX",
            with_probe(|p| p.interval_ms = u64::MAX),
            "out_of_range",
            "probe.interval_ms",
        ),
        (
            "a timeout over the contract ceiling",
            with_probe(|p| p.timeout_ms = over(PROBE_TIMEOUT_MAX)),
            "out_of_range",
            "probe.timeout_ms: 60001",
        ),
        (
            "an HTTP path over its bound",
            with_probe(|p| {
                p.kind = Some(probe_spec::Kind::Http(pb::HttpProbe {
                    path: format!("/{}", "p".repeat(CONTRACT_TEXT_LEN_MAX)),
                }));
            }),
            "bad_length",
            "probe.http.path: 257 bytes",
        ),
        (
            "a gRPC service over its bound",
            with_probe(|p| {
                p.kind = Some(probe_spec::Kind::Grpc(pb::GrpcProbe {
                    service: "s".repeat(CONTRACT_TEXT_LEN_MAX + 1),
                }));
            }),
            "bad_length",
            "probe.grpc.service: 257 bytes",
        ),
        (
            "an ack refusing more than a batch holds",
            ack(vec![refusal("pod-1", "not_assigned"); BATCH_MAX + 1]),
            "too_many",
            "ack.refused: 4097 entries, at most 4096",
        ),
        (
            "a refusal without a reason",
            ack(vec![refusal("pod-1", "")]),
            "bad_length",
            "ack.refused[0]: reason: 0 bytes, expected 1 to 64",
        ),
        (
            "a reason over its bound",
            ack(vec![refusal("pod-1", &"r".repeat(REASON_BYTES_MAX + 1))]),
            "bad_length",
            "reason: 65 bytes",
        ),
        (
            "a refusal about no valid instance",
            ack(vec![refusal("", "unknown_target")]),
            "bad_name",
            "ack.refused[0]: instance: not a valid name: instance id is empty",
        ),
    ];
    for (case, message, label, says) in cases {
        let (got_label, chain) = refused_by_node(message);
        assert_eq!(got_label, label, "{case}: {chain}");
        assert!(
            chain.contains(says),
            "{case}: {chain:?} should say {says:?}"
        );
    }
}

#[test]
fn the_generated_service_is_the_one_the_constants_name() {
    use tonic::server::NamedService;
    assert_eq!(
        <pb::evidence_server::EvidenceServer<crate::evidence::EvidenceService> as NamedService>::NAME,
        crate::evidence::SERVICE
    );
    assert_eq!(
        crate::evidence::SESSION_PATH,
        format!("/{}/Session", crate::evidence::SERVICE)
    );
}

proptest! {
    /// Any in-bound probe spec and passive outcome survives the wire exactly.
    #[test]
    fn in_bound_values_round_trip(
        interval_ms in 0..=u64::try_from(INTERVAL_MAX.as_millis()).unwrap(),
        timeout_ms in 0..=u64::try_from(PROBE_TIMEOUT_MAX.as_millis()).unwrap(),
        port: u16,
        v6: [u8; 16],
        requests: u64,
        errors: u64,
        detail in proptest::option::of("\\PC{0,64}"),
    ) {
        let mut t = target(IpAddr::V6(Ipv6Addr::from(v6)), ProbeKind::Tcp);
        t.address.port = port;
        t.probe.interval = Duration::from_millis(interval_ms);
        t.probe.timeout = Duration::from_millis(timeout_ms);
        let m = AuthorityMessage::Assignment { targets: vec![t] };
        prop_assert_eq!(authority_round_trip(m.clone()), Ok(m));
        let m = AgentMessage::Samples { samples: vec![
            sample(Observation::Passive { requests, errors }),
            sample(Observation::Probe { health: Health::Timeout, detail }),
        ]};
        prop_assert_eq!(agent_round_trip(m.clone()), Ok(m));
    }
}
