//! Evidence ingest over mutual TLS against a real single-member authority: every sample is
//! attributed by the connection's certificate; a probe about a target the node is not
//! assigned, a self-report about another instance, and anything from an identity that may
//! not report are refused, counted and audited — never applied.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use http::Method;
use serde_json::json;
use tonic::transport::Endpoint;
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::member::Authority;
use waymark_agent::authority::settings::TlsSettings;
use waymark_agent::evidence::{AgentMessage, AuthorityMessage, ClientSession, WireSample};
use waymark_certs::grpc::TlsConnector;
use waymark_certs::testing::TestPkiDir;
use waymark_certs::{IdentityKind, KindSet, TrustDomain};
use waymark_core::model::{Health, Observation, SelfReport};
use waymark_testkit::until;

const TD: &str = "waymark.test";
const WAIT: Duration = Duration::from_secs(20);

async fn session(
    pki: &TestPkiDir,
    who: &str,
    addr: SocketAddr,
) -> Result<ClientSession, tonic::Status> {
    ClientSession::open(channel(pki, who, addr).await?).await
}

/// A mutual-TLS channel to the ingest listener as `who`.
async fn channel(
    pki: &TestPkiDir,
    who: &str,
    addr: SocketAddr,
) -> Result<tonic::transport::Channel, tonic::Status> {
    let config = pki.client(who, pki.policy(KindSet::only(IdentityKind::Authority)));
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(TlsConnector::new(config))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    Ok(channel)
}

async fn next_message(s: &mut ClientSession) -> Result<AuthorityMessage, tonic::Status> {
    tokio::time::timeout(WAIT, s.inbound.next())
        .await
        .expect("no message in time")
        .expect("stream ended")
}

/// Sends one batch and returns (accepted, refusal reasons).
async fn report(s: &mut ClientSession, samples: Vec<WireSample>) -> (u64, Vec<String>) {
    s.send(AgentMessage::Samples { samples }).await.unwrap();
    loop {
        match next_message(s).await.unwrap() {
            AuthorityMessage::Ack { accepted, refused } => {
                return (accepted, refused.into_iter().map(|r| r.reason).collect());
            }
            AuthorityMessage::Assignment { .. }
            | AuthorityMessage::ConfigRequest(_)
            | AuthorityMessage::KeyringRequest(_) => continue,
        }
    }
}

fn probe(instance: &str, health: Health) -> WireSample {
    WireSample {
        instance: instance.parse().unwrap(),
        observation: Observation::Probe {
            health,
            detail: Some("HTTP 200".into()),
        },
    }
}

fn ready(instance: &str) -> WireSample {
    WireSample {
        instance: instance.parse().unwrap(),
        observation: Observation::SelfReport(SelfReport::Ready),
    }
}

/// A single-member authority with evidence ingest over mutual TLS, leading, with service
/// `pay` registered.
async fn leading_authority(
    pki: &TestPkiDir,
    data: &std::path::Path,
    gossip: Option<waymark_agent::authority::settings::GossipSettings>,
) -> (Authority, ApiClient) {
    waymark_certs::install_crypto_provider();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = common::plain(data, "eu", &["a"], any);
    config.ingest = Some(any);
    config.tls = Some(TlsSettings {
        trust_domain: TrustDomain::new(TD).unwrap(),
        paths: pki.issue("region/eu/authority/1"),
    });
    config.gossip = gossip;
    let authority = common::single_member(config).await;
    let api = common::operator(&authority, "test").await;
    api.send(
        Method::PUT,
        "/v1/services/pay",
        Some(&json!({"owner": "payments", "contract": {}})),
    )
    .await
    .unwrap()
    .json()
    .unwrap();
    (authority, api)
}

/// Registers an instance of `pay` at 10.0.0.`host`; returns its id.
async fn register(api: &ApiClient, host: u8) -> String {
    let r = api
        .send(
            Method::POST,
            "/v1/instances",
            Some(&json!({
                "service": "pay",
                "locality": {"region": "eu", "zone": "a", "node": "n1"},
                "address": {"ip": format!("10.0.0.{host}"), "port": 8080},
            })),
        )
        .await
        .unwrap()
        .json()
        .unwrap();
    r["instance"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_is_attributed_by_certificate_and_forgeries_are_refused_counted_and_audited() {
    let pki = TestPkiDir::new(TD, &["eu", "us"]);
    let data = tempfile::tempdir().unwrap();
    let (authority, api) = leading_authority(&pki, data.path(), None).await;
    let ids = [register(&api, 1).await, register(&api, 2).await];
    let ingest = authority.ingest_addr().unwrap();

    // n1 says hello and is assigned both targets (it is the only prober in its zone).
    let mut n1 = session(&pki, "region/eu/node/n1", ingest).await.unwrap();
    n1.send(AgentMessage::Hello {
        zone: "a".parse().unwrap(),
    })
    .await
    .unwrap();
    loop {
        if let AuthorityMessage::Assignment { targets } = next_message(&mut n1).await.unwrap()
            && targets.len() == 2
        {
            assert!(targets.iter().all(|t| t.service.as_str() == "pay"));
            break;
        }
    }
    let (accepted, refused) = report(&mut n1, vec![probe(&ids[0], Health::Pass)]).await;
    assert_eq!((accepted, refused), (1, vec![]));
    // A probe of nothing the registry holds.
    let (_, refused) = report(&mut n1, vec![probe("pay-r99", Health::Fail)]).await;
    assert_eq!(refused, ["unknown_target"]);
    // A node may not speak for a workload.
    let (_, refused) = report(&mut n1, vec![ready(&ids[0])]).await;
    assert_eq!(refused, ["not_attributable"]);

    // n2 is a valid node of the region but not assigned: its probe is refused.
    let mut n2 = session(&pki, "region/eu/node/n2", ingest).await.unwrap();
    let (accepted, refused) = report(&mut n2, vec![probe(&ids[1], Health::Refused)]).await;
    assert_eq!((accepted, refused), (0, vec!["not_assigned".to_owned()]));

    // A workload speaks only about itself.
    let mut w = session(
        &pki,
        &format!("region/eu/service/pay/instance/{}", ids[0]),
        ingest,
    )
    .await
    .unwrap();
    let (accepted, refused) = report(&mut w, vec![ready(&ids[1]), ready(&ids[0])]).await;
    assert_eq!(
        (accepted, refused),
        (1, vec!["not_attributable".to_owned()])
    );

    // A node of another region is refused at the door: the listener admits only this
    // region's node agents and workloads.
    let mut far = session(&pki, "region/us/node/n9", ingest).await;
    let refused_far = match &mut far {
        Ok(s) => {
            s.send(AgentMessage::Samples {
                samples: vec![probe(&ids[0], Health::Fail)],
            })
            .await
            .ok();
            next_message(s).await.err()
        }
        Err(e) => Some(e.clone()),
    };
    assert!(
        refused_far.is_some(),
        "a foreign region's node was admitted"
    );

    // A certificate from another trust domain never completes the handshake.
    let other = TestPkiDir::new("elsewhere.test", &["eu", "us"]);
    assert!(session(&other, "region/eu/node/n1", ingest).await.is_err());

    // Counted by reason, and the denials are in the audit log with the reporter.
    let metrics = api.send(Method::GET, "/metrics", None).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    for (reason, n) in [
        ("not_assigned", 1),
        ("not_attributable", 2),
        ("unknown_target", 1),
    ] {
        let line = format!("waymark_ingest_samples_refused_total{{reason=\"{reason}\"}} {n}");
        assert!(text.contains(&line), "missing `{line}` in\n{text}");
    }
    assert!(
        text.contains("waymark_ingest_samples_accepted_total 2"),
        "{text}"
    );
    // The foreign node never reached a session: it was refused in the handshake (counted
    // as the server's handshake task ends, which may be just after the client saw it; a
    // channel may dial more than once). The other trust domain's client refused the
    // server first; `listener_refusals.rs` tries each reason from the server's side.
    let series =
        "waymark_grpc_tls_handshakes_failed_total{listener=\"ingest\",reason=\"wrong_region\"} ";
    until(&format!("`{series}` counted"), WAIT, async || {
        let metrics = api.send(Method::GET, "/metrics", None).await.unwrap();
        let text = String::from_utf8_lossy(&metrics.body).into_owned();
        let refused: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0);
        if refused >= 1 { Ok(()) } else { Err(text) }
    })
    .await;
    assert!(
        text.contains("waymark_ingest_sessions_unattributed_total 0"),
        "{text}"
    );
    let lines = until("the denials audited", WAIT, async || {
        let r = api
            .send(Method::GET, "/v1/audit?kind=denial", None)
            .await
            .unwrap();
        let lines = String::from_utf8_lossy(&r.body).into_owned();
        if lines.lines().count() >= 4 {
            Ok(lines)
        } else {
            Err(lines)
        }
    })
    .await;
    assert!(lines.contains("node/n2"), "{lines}");
    assert!(lines.contains("not_assigned"), "{lines}");
    authority.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_contract_reaches_the_probers_at_once() {
    // A new probe (another path, another protocol) must be what the probers check next,
    // not whatever they were told before; otherwise a pushed contract is silently ignored.
    let pki = TestPkiDir::new(TD, &["eu", "us"]);
    let data = tempfile::tempdir().unwrap();
    let (authority, api) = leading_authority(&pki, data.path(), None).await;
    register(&api, 1).await;
    let ingest = authority.ingest_addr().unwrap();
    let mut n1 = session(&pki, "region/eu/node/n1", ingest).await.unwrap();
    n1.send(AgentMessage::Hello {
        zone: "a".parse().unwrap(),
    })
    .await
    .unwrap();
    let probe_of = |targets: &[waymark_agent::evidence::ProbeTarget]| {
        serde_json::to_value(&targets[0].probe).unwrap()
    };
    loop {
        if let AuthorityMessage::Assignment { targets } = next_message(&mut n1).await.unwrap()
            && targets.len() == 1
        {
            assert_eq!(probe_of(&targets)["path"], "/readyz");
            break;
        }
    }
    let contract = json!({"probe": {"kind": "grpc", "interval": "1s", "timeout": "500ms"}});
    let r = api
        .send(
            Method::PUT,
            "/v1/services/pay",
            Some(&json!({"owner": "payments", "contract": contract})),
        )
        .await
        .unwrap();
    assert!(r.status.is_success(), "{r:?}");
    let targets = tokio::time::timeout(WAIT, async {
        loop {
            if let AuthorityMessage::Assignment { targets } = next_message(&mut n1).await.unwrap() {
                return targets;
            }
        }
    })
    .await
    .expect("the new contract never reached the prober");
    assert_eq!(targets.len(), 1);
    assert_eq!(probe_of(&targets)["kind"], "grpc");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_membership_decides_which_connected_nodes_probe() {
    use waymark_agent::authority::settings::GossipSettings;
    use waymark_agent::gossip::{Gossip, GossipConfig, GossipId, Key, Keyring, Role};
    let pki = TestPkiDir::new(TD, &["eu", "us"]);
    let data = tempfile::tempdir().unwrap();
    let keyring = Keyring::single(Key::from_bytes(&[9; 32]));
    let gossip_addr = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let gossip = GossipSettings {
        bind: gossip_addr,
        zone: "a".parse().unwrap(),
        seeds: vec![],
        keyring: keyring.clone(),
    };
    let (authority, api) = leading_authority(&pki, data.path(), Some(gossip)).await;
    register(&api, 1).await;
    let ingest = authority.ingest_addr().unwrap();

    // n1 joins the region's gossip pool; n2 connects to ingest but never gossips.
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let n1_addr = socket.local_addr().unwrap();
    let id = GossipId::new(
        "n1".parse().unwrap(),
        n1_addr,
        "a".parse().unwrap(),
        Role::Agent,
    );
    let mut gc = GossipConfig::new(n1_addr, id, keyring);
    gc.seeds = vec![gossip_addr.into()];
    let n1_gossip = Gossip::start_with_socket(gc, socket).unwrap();
    let mut seen = authority.gossip().unwrap().subscribe();
    tokio::time::timeout(
        WAIT,
        seen.wait_for(|m| m.iter().any(|m| m.id.name.as_str() == "n1")),
    )
    .await
    .unwrap()
    .unwrap();

    let hello = AgentMessage::Hello {
        zone: "a".parse().unwrap(),
    };
    let mut n1 = session(&pki, "region/eu/node/n1", ingest).await.unwrap();
    n1.send(hello.clone()).await.unwrap();
    let mut n2 = session(&pki, "region/eu/node/n2", ingest).await.unwrap();
    n2.send(hello).await.unwrap();
    // n1 (alive in gossip) is assigned the target; n2 (connected, not a member) is not.
    loop {
        if let AuthorityMessage::Assignment { targets } = next_message(&mut n1).await.unwrap()
            && targets.len() == 1
        {
            break;
        }
    }
    match next_message(&mut n2).await.unwrap() {
        AuthorityMessage::Assignment { targets } => assert!(targets.is_empty()),
        other => panic!("unexpected {other:?}"),
    }
    // n1 leaves the pool: its targets are taken away while its session stays open.
    n1_gossip.leave().await.unwrap();
    loop {
        if let AuthorityMessage::Assignment { targets } = next_message(&mut n1).await.unwrap()
            && targets.is_empty()
        {
            break;
        }
    }
    authority.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_hello_ends_the_session_and_leaves_no_phantom_prober() {
    // Goal: one connection cannot count its node as connected more often than it leaves.
    let pki = TestPkiDir::new(TD, &["eu", "us"]);
    let data = tempfile::tempdir().unwrap();
    let (authority, api) = leading_authority(&pki, data.path(), None).await;
    let _id = register(&api, 1).await;
    let ingest = authority.ingest_addr().unwrap();
    let hello = || AgentMessage::Hello {
        zone: "a".parse().unwrap(),
    };

    let mut n1 = session(&pki, "region/eu/node/n1", ingest).await.unwrap();
    n1.send(hello()).await.unwrap();
    while !matches!(
        next_message(&mut n1).await.unwrap(),
        AuthorityMessage::Assignment { .. }
    ) {}
    assert_eq!(authority.hub().probers().len(), 1);
    n1.send(hello()).await.unwrap();
    let ended = loop {
        match next_message(&mut n1).await {
            Ok(_) => continue,
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), tonic::Code::FailedPrecondition, "{ended:?}");
    assert!(ended.message().contains("hello"), "{ended:?}");

    // The session is over, and with it the node's only place among the probers.
    let hub = authority.hub();
    let mut changes = hub.membership();
    tokio::time::timeout(WAIT, async {
        while !hub.probers().is_empty() {
            changes.changed().await.unwrap();
        }
    })
    .await
    .expect("the node leaves the probers when its session ends");

    // The member serves on: the node comes back with one hello and is a prober again.
    let mut again = session(&pki, "region/eu/node/n1", ingest).await.unwrap();
    again.send(hello()).await.unwrap();
    while !matches!(
        next_message(&mut again).await.unwrap(),
        AuthorityMessage::Assignment { .. }
    ) {}
    assert_eq!(authority.hub().probers().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_size_cap_ends_the_session_before_it_is_decoded() {
    use waymark_agent::evidence::AGENT_MESSAGE_BYTES_MAX;
    use waymark_agent::evidence::pb::{self, authority_message, evidence_client::EvidenceClient};
    let pki = TestPkiDir::new(TD, &["eu", "us"]);
    let data = tempfile::tempdir().unwrap();
    let (authority, api) = leading_authority(&pki, data.path(), None).await;
    let id = register(&api, 1).await;
    let ingest = authority.ingest_addr().unwrap();

    // A client without the agent's own encoding cap (the generated client's default has
    // none), sending one sample whose detail alone is over the server's decoding cap.
    let channel = channel(&pki, "region/eu/node/n1", ingest).await.unwrap();
    let mut client = EvidenceClient::new(channel);
    let huge = AgentMessage::Samples {
        samples: vec![WireSample {
            instance: id.parse().unwrap(),
            observation: Observation::Probe {
                health: Health::Fail,
                detail: Some("x".repeat(AGENT_MESSAGE_BYTES_MAX)),
            },
        }],
    };
    let outbound = futures::stream::iter([pb::AgentMessage::from(huge)]);
    let response = client.session(tonic::Request::new(outbound)).await;
    let status = match response {
        Err(status) => status,
        Ok(r) => {
            let mut inbound = r.into_inner();
            loop {
                match tokio::time::timeout(WAIT, inbound.next()).await.unwrap() {
                    Some(Ok(m))
                        if matches!(m.message, Some(authority_message::Message::Ack(_))) =>
                    {
                        panic!("an oversized batch was read")
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(status)) => break status,
                    None => panic!("the session ended without a status"),
                }
            }
        }
    };
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");

    // The member serves on: a normal session reports and is answered.
    let mut n1 = session(&pki, "region/eu/node/n1", ingest).await.unwrap();
    let (_, refused) = report(&mut n1, vec![probe(&id, Health::Pass)]).await;
    assert_eq!(refused, ["not_assigned"]);
}

/// Sends raw bytes as the session's messages: what a client with a broken encoder sends.
#[derive(Debug, Default)]
struct RawCodec;

#[derive(Debug)]
struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = waymark_agent::evidence::pb::AuthorityMessage;
    type Encoder = RawEncoder;
    type Decoder = waymark_agent::evidence::ProtoDecoder<Self::Decode>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        waymark_agent::evidence::ProtoCodec::<Vec<u8>, Self::Decode>::default().decoder()
    }
}

/// The status a session of one raw `message` ends with.
async fn refusal_of(channel: tonic::transport::Channel, message: Vec<u8>) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let response = grpc
        .streaming(
            tonic::Request::new(futures::stream::iter([message])),
            http::uri::PathAndQuery::from_static(waymark_agent::evidence::SESSION_PATH),
            RawCodec,
        )
        .await;
    let mut inbound = match response {
        Err(status) => return status,
        Ok(r) => r.into_inner(),
    };
    match tokio::time::timeout(WAIT, inbound.next()).await.unwrap() {
        Some(Ok(m)) => panic!("a malformed message was answered: {m:?}"),
        Some(Err(status)) => status,
        None => panic!("the session ended without a status"),
    }
}

/// The value of the `series` line (name and labels, then a space) in `/metrics`.
async fn counter(api: &ApiClient, series: &str) -> u64 {
    let metrics = api.send(Method::GET, "/metrics", None).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_message_ends_its_session_is_counted_and_changes_nothing() {
    // Goal: a message that does not parse, or parses but breaks a bound, is the sender's
    // fault (INVALID_ARGUMENT naming what is wrong), is counted by fault, and nothing it
    // carried is admitted, not even its valid samples.
    use prost::Message;
    use waymark_agent::evidence::pb;
    let pki = TestPkiDir::new(TD, &["eu", "us"]);
    let data = tempfile::tempdir().unwrap();
    let (authority, api) = leading_authority(&pki, data.path(), None).await;
    let id = register(&api, 1).await;
    let ingest = authority.ingest_addr().unwrap();
    let mut n1 = session(&pki, "region/eu/node/n1", ingest).await.unwrap();
    n1.send(AgentMessage::Hello {
        zone: "a".parse().unwrap(),
    })
    .await
    .unwrap();
    while !matches!(
        next_message(&mut n1).await.unwrap(),
        AuthorityMessage::Assignment { targets } if targets.len() == 1
    ) {}
    let accepted = "waymark_ingest_samples_accepted_total ";
    let before = counter(&api, accepted).await;

    // A valid probe result beside one whose health is from no version we know.
    let mut message = pb::AgentMessage::from(AgentMessage::Samples {
        samples: vec![probe(&id, Health::Pass), probe(&id, Health::Fail)],
    });
    let Some(pb::agent_message::Message::Samples(batch)) = &mut message.message else {
        unreachable!("a samples message")
    };
    let Some(pb::observation::Class::Probe(p)) = batch.samples[1]
        .observation
        .as_mut()
        .and_then(|o| o.class.as_mut())
    else {
        unreachable!("a probe result")
    };
    p.health = 99;
    let channel = || channel(&pki, "region/eu/node/n1", ingest);
    let status = refusal_of(channel().await.unwrap(), message.encode_to_vec()).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("samples.samples[1]: observation.probe.health: 99"),
        "{status:?}"
    );

    // Bytes that are not protobuf at all: still the sender's fault, not INTERNAL.
    let status = refusal_of(channel().await.unwrap(), vec![0xff; 8]).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with("malformed message: "),
        "{status:?}"
    );

    for reason in ["unknown_enum", "undecodable"] {
        let series = format!("waymark_ingest_messages_malformed_total{{reason=\"{reason}\"}} ");
        assert_eq!(counter(&api, &series).await, 1, "{series}");
    }
    assert_eq!(
        counter(&api, accepted).await,
        before,
        "the malformed batch's valid sample was admitted"
    );

    // The member serves on, and the counter that stayed put does move.
    let (n, refused) = report(&mut n1, vec![probe(&id, Health::Pass)]).await;
    assert_eq!((n, refused), (1, vec![]));
    assert_eq!(counter(&api, accepted).await, before + 1);
    authority.shutdown().await;
}
