//! Messages: error codes, EDNS, truncation and rotation, on bytes as they travel.

use std::net::IpAddr;

use hickory_proto::op::Query;
use hickory_proto::rr::{Name, RData};

use super::*;
use crate::node::dns::DnsConfig;
use crate::node::dns::table::tests::{assignment, ep};
use waymark_core::view::EndpointStatus::{Draining, Eligible};

fn origin() -> DnsOrigin {
    DnsOrigin::new(&DnsConfig::default()).expect("default origin")
}

fn pay_table(hosts: u8) -> DnsTable {
    let eps = (1..=hosts)
        .map(|h| ep(&format!("10.0.0.{h}"), "zone-a", 0, Eligible))
        .chain([ep("10.0.9.9", "zone-a", 0, Draining)])
        .collect();
    DnsTable::build([&assignment("pay", eps, &[])])
}

fn query(name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(
        Name::from_ascii(name).expect("test name"),
        qtype,
    ));
    m
}

fn with_edns(mut m: Message, payload: u16, version: u8) -> Message {
    let mut edns = Edns::new();
    edns.set_max_payload(payload).set_version(version);
    m.set_edns(edns);
    m
}

fn send(table: &DnsTable, request: &Message, transport: Transport) -> (Message, Outcome) {
    let bytes = request.to_vec().expect("encodable request");
    let outcome = respond(table, &origin(), &bytes, transport, 0);
    let reply = match &outcome {
        Outcome::Answered {
            reply: Some(reply), ..
        }
        | Outcome::Malformed {
            reply: Some(reply), ..
        } => reply.clone(),
        other => panic!("no reply: {other:?}"),
    };
    (Message::from_vec(&reply).expect("decodable reply"), outcome)
}

fn answered_ips(m: &Message) -> Vec<IpAddr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_query_is_answered_authoritatively_with_its_question_echoed() {
    let table = pay_table(2);
    let request = query("Pay.Service.Waymark.", RecordType::A);
    let (reply, outcome) = send(&table, &request, Transport::Udp);
    assert_eq!(reply.metadata.id, 0x1234);
    assert_eq!(reply.metadata.message_type, MessageType::Response);
    assert!(reply.metadata.authoritative);
    assert!(reply.metadata.recursion_desired, "copied from the query");
    assert!(!reply.metadata.recursion_available);
    assert_eq!(reply.queries, request.queries, "0x20 case kept");
    assert_eq!(answered_ips(&reply).len(), 2);
    assert!(matches!(
        outcome,
        Outcome::Answered {
            rcode: ResponseCode::NoError,
            qtype: RecordType::A,
            truncated: false,
            ..
        }
    ));
}

#[test]
fn negative_answers_carry_the_soa_in_the_authority_section() {
    let table = pay_table(1);
    let (nx, _) = send(
        &table,
        &query("nope.service.waymark.", RecordType::A),
        Transport::Udp,
    );
    assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);
    assert!(nx.metadata.authoritative);
    assert!(nx.answers.is_empty());
    assert_eq!(nx.authorities.len(), 1);
    assert_eq!(nx.authorities[0].record_type(), RecordType::SOA);
    assert_eq!(nx.authorities[0].ttl, 2);

    let (nodata, _) = send(
        &table,
        &query("pay.service.waymark.", RecordType::AAAA),
        Transport::Udp,
    );
    assert_eq!(nodata.metadata.response_code, ResponseCode::NoError);
    assert!(nodata.answers.is_empty());
    assert_eq!(nodata.authorities.len(), 1);
}

#[test]
fn names_outside_the_domain_and_other_classes_are_refused() {
    let table = pay_table(1);
    let (reply, _) = send(
        &table,
        &query("example.com.", RecordType::A),
        Transport::Udp,
    );
    assert_eq!(reply.metadata.response_code, ResponseCode::Refused);
    assert!(!reply.metadata.authoritative);

    let mut chaos = query("version.bind.", RecordType::TXT);
    chaos.queries[0].set_query_class(DNSClass::CH);
    let (reply, _) = send(&table, &chaos, Transport::Udp);
    assert_eq!(reply.metadata.response_code, ResponseCode::Refused);

    let (reply, _) = send(&table, &query("waymark.", RecordType::AXFR), Transport::Tcp);
    assert_eq!(reply.metadata.response_code, ResponseCode::Refused);
}

#[test]
fn other_opcodes_are_not_implemented_and_newer_edns_is_badvers() {
    let table = pay_table(1);
    let mut notify = query("pay.service.waymark.", RecordType::SOA);
    notify.metadata.op_code = OpCode::Notify;
    let (reply, _) = send(&table, &notify, Transport::Udp);
    assert_eq!(reply.metadata.response_code, ResponseCode::NotImp);

    let v1 = with_edns(query("pay.service.waymark.", RecordType::A), 1232, 1);
    let (reply, outcome) = send(&table, &v1, Transport::Udp);
    // 16 on the wire; decoders read it back as BADSIG, which shares the code.
    assert_eq!(u16::from(reply.metadata.response_code), 16);
    assert_eq!(reply.edns.map(|e| e.version()), Some(0));
    assert!(matches!(
        outcome,
        Outcome::Answered {
            rcode: ResponseCode::BADVERS,
            ..
        }
    ));
}

#[test]
fn what_is_not_a_query_is_dropped_and_what_is_undecodable_is_formerr() {
    // Goal: malformed input never panics; nothing is reflected to a forged source.
    let table = pay_table(1);
    let origin = origin();
    for short in [&b""[..], &[0u8; 11][..]] {
        assert_eq!(
            respond(&table, &origin, short, Transport::Udp, 0),
            Outcome::Malformed {
                reply: None,
                reason: "shorter than a header"
            }
        );
    }

    let mut response = query("pay.service.waymark.", RecordType::A);
    response.metadata.message_type = MessageType::Response;
    let bytes = response.to_vec().expect("encodable");
    assert!(matches!(
        respond(&table, &origin, &bytes, Transport::Udp, 0),
        Outcome::Malformed { reply: None, .. }
    ));

    let mut garbage = query("pay.service.waymark.", RecordType::A)
        .to_vec()
        .expect("encodable");
    garbage.truncate(20);
    let Outcome::Malformed {
        reply: Some(reply), ..
    } = respond(&table, &origin, &garbage, Transport::Udp, 0)
    else {
        panic!("FORMERR expected");
    };
    let reply = Message::from_vec(&reply).expect("decodable");
    assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
    assert_eq!(reply.metadata.id, 0x1234);

    let mut two = query("pay.service.waymark.", RecordType::A);
    two.add_query(Query::query(
        Name::from_ascii("pay.service.waymark.").expect("name"),
        RecordType::AAAA,
    ));
    let (reply, outcome) = send(&table, &two, Transport::Udp);
    assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
    assert!(matches!(outcome, Outcome::Malformed { .. }));

    // A header claiming 65 535 questions is refused before anything is decoded.
    let mut huge = query("pay.service.waymark.", RecordType::A)
        .to_vec()
        .expect("encodable");
    huge[4] = 0xff;
    huge[5] = 0xff;
    assert!(matches!(
        respond(&table, &origin, &huge, Transport::Udp, 0),
        Outcome::Malformed { reply: Some(_), .. }
    ));
}

#[test]
fn udp_answers_too_big_are_truncated_and_tcp_answers_are_whole() {
    // 40 A records (~650 bytes): over 512, under the EDNS buffer.
    let table = pay_table(40);
    let plain = query("pay.service.waymark.", RecordType::A);
    let (reply, outcome) = send(&table, &plain, Transport::Udp);
    assert!(reply.metadata.truncation);
    assert!(reply.answers.is_empty());
    assert_eq!(reply.queries, plain.queries);
    assert!(matches!(
        outcome,
        Outcome::Answered {
            truncated: true,
            ..
        }
    ));

    let edns = with_edns(plain.clone(), 4096, 0);
    let (reply, _) = send(&table, &edns, Transport::Udp);
    assert!(!reply.metadata.truncation);
    assert_eq!(answered_ips(&reply).len(), 40);
    assert_eq!(reply.edns.map(|e| e.max_payload()), Some(UDP_PAYLOAD_MAX));

    let (reply, _) = send(&table, &plain, Transport::Tcp);
    assert!(!reply.metadata.truncation);
    assert_eq!(answered_ips(&reply).len(), 40);

    // 100 records exceed even the largest UDP payload we send.
    let (reply, _) = send(&pay_table(100), &edns, Transport::Udp);
    assert!(reply.metadata.truncation);
}

#[test]
fn srv_additionals_are_dropped_before_the_answer_is_truncated() {
    // 10 SRV records (targets uncompressed, RFC 2782: ~450 bytes) fit in 512 bytes; with
    // their 10 addresses they do not.
    let table = pay_table(10);
    let srv = query("pay.service.waymark.", RecordType::SRV);
    let (full, _) = send(&table, &with_edns(srv.clone(), 1232, 0), Transport::Udp);
    assert_eq!(full.answers.len(), 10);
    assert_eq!(full.additionals.len(), 10);
    assert!(full.to_vec().expect("encodable").len() > 512);

    let (cut, outcome) = send(&table, &srv, Transport::Udp);
    assert!(!cut.metadata.truncation, "SRV answers still fit");
    assert_eq!(cut.answers.len(), 10);
    assert!(cut.additionals.is_empty());
    assert!(matches!(
        outcome,
        Outcome::Answered {
            truncated: false,
            ..
        }
    ));
}

#[test]
fn answers_rotate_so_first_addresses_spread() {
    let table = pay_table(3);
    let bytes = query("pay.service.waymark.", RecordType::A)
        .to_vec()
        .expect("encodable");
    let firsts: Vec<_> = (0..3)
        .map(|rotation| {
            let Outcome::Answered {
                reply: Some(reply), ..
            } = respond(&table, &origin(), &bytes, Transport::Udp, rotation)
            else {
                panic!("answer expected");
            };
            let reply = Message::from_vec(&reply).expect("decodable");
            answered_ips(&reply)[0]
        })
        .collect();
    let distinct: std::collections::BTreeSet<_> = firsts.iter().collect();
    assert_eq!(distinct.len(), 3, "{firsts:?}");
}
