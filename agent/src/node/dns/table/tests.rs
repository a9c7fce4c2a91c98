//! The DNS table answers what Envoy would route to, under every name form.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{Address as EnvoyAddress, SocketAddress};
use envoy_types::pb::envoy::config::endpoint::v3::Endpoint;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::google::protobuf::UInt32Value;
use hickory_proto::rr::RData;
use hickory_proto::rr::rdata::SOA;
use proptest::prelude::*;
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::{
    EndpointStatus, Markers, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey,
};
use waymark_xds::translate::load_assignment;

use super::*;
use crate::node::dns::DnsConfig;

// === fixtures ===

pub(crate) struct Ep {
    pub(crate) ip: IpAddr,
    pub(crate) zone: &'static str,
    pub(crate) priority: u32,
    pub(crate) weight: u32,
    pub(crate) status: EndpointStatus,
    pub(crate) tags: &'static [&'static str],
}

pub(crate) fn ep(ip: &str, zone: &'static str, priority: u32, status: EndpointStatus) -> Ep {
    Ep {
        ip: ip.parse().expect("test address"),
        zone,
        priority,
        weight: 100,
        status,
        tags: &[],
    }
}

impl Ep {
    pub(crate) fn tags(mut self, tags: &'static [&'static str]) -> Self {
        self.tags = tags;
        self
    }

    pub(crate) fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }
}

/// The EDS resource the xDS edge would serve for `eps` (ports 8000 + index).
pub(crate) fn assignment(
    service: &str,
    eps: Vec<Ep>,
    disregarded: &[&str],
) -> ClusterLoadAssignment {
    let endpoints: BTreeMap<_, _> = eps
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let instance = InstanceId::try_new(format!("{service}-{i}")).expect("test id");
            let view_endpoint = ViewEndpoint {
                instance: instance.clone(),
                address: Address {
                    ip: e.ip,
                    port: 8000 + u16::try_from(i).expect("few endpoints"),
                },
                region: RegionName::try_new("eu").expect("test region"),
                zone: ZoneName::try_new(e.zone).expect("test zone"),
                tier: if e.priority == 0 {
                    Tier::Local
                } else {
                    Tier::Region
                },
                priority: e.priority,
                weight: Weight::new(e.weight),
                status: e.status,
                verdict: Verdict::Eligible,
                tags: Arc::new(e.tags.iter().map(|t| (*t).to_owned()).collect()),
                metadata: Arc::default(),
                capability: None,
            };
            (instance, view_endpoint)
        })
        .collect();
    let markers = Markers {
        health_disregarded: disregarded
            .iter()
            .map(|z| ZoneName::try_new(z).expect("test zone"))
            .collect(),
        ..Markers::default()
    };
    load_assignment(&ReleasedView {
        version: Version(7),
        view: View {
            key: ViewKey {
                service: ServiceName::try_new(service).expect("test service"),
                zone: ZoneName::try_new("zone-a").expect("test zone"),
            },
            endpoints: endpoints.into(),
            markers,
        },
    })
}

fn origin() -> DnsOrigin {
    DnsOrigin::new(&DnsConfig::default()).expect("default origin")
}

fn name(s: &str) -> Name {
    Name::from_ascii(s).expect("test name")
}

/// The addresses an A/AAAA/ANY answer holds, sorted.
fn ips(answer: &Answer) -> Vec<IpAddr> {
    let Answer::Records { answers, .. } = answer else {
        panic!("expected records, got {answer:?}");
    };
    let mut out: Vec<IpAddr> = answers
        .iter()
        .map(|r| match &r.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            other => panic!("not an address: {other:?}"),
        })
        .collect();
    out.sort();
    out
}

fn v4(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn ask(table: &DnsTable, q: &str, qtype: RecordType) -> Answer {
    table.answer(&origin(), &name(q), qtype)
}

fn is_nodata(answer: &Answer) -> bool {
    matches!(answer, Answer::NoData { .. })
}

fn is_nxdomain(answer: &Answer) -> bool {
    matches!(answer, Answer::NxDomain { .. })
}

use EndpointStatus::{Degraded, Disregarded, Draining, Eligible, Unknown};

fn pay() -> ClusterLoadAssignment {
    assignment(
        "pay",
        vec![
            ep("10.0.0.1", "zone-a", 0, Eligible).tags(&["v2", "Canary"]),
            ep("10.0.0.2", "zone-a", 0, Degraded).tags(&["v2"]),
            ep("10.0.0.3", "zone-a", 0, Unknown),
            ep("10.0.0.4", "zone-a", 0, Draining).tags(&["v2"]),
            ep("fd00::5", "zone-a", 0, Eligible),
            ep("10.0.1.1", "zone-b", 1, Eligible).tags(&["v1"]),
            ep("10.0.1.2", "zone-b", 1, Eligible),
        ],
        &[],
    )
}

// === which endpoints ===

#[test]
fn a_service_answers_what_envoy_routes_to_in_its_best_priority() {
    // Goal: eligible, degraded and unknown are answered; draining and lower tiers are not.
    let table = DnsTable::build([&pay()]);
    assert_eq!(
        ips(&ask(&table, "pay.service.waymark.", RecordType::A)),
        vec![v4("10.0.0.1"), v4("10.0.0.2"), v4("10.0.0.3")]
    );
    assert_eq!(
        ips(&ask(&table, "pay.service.waymark.", RecordType::AAAA)),
        vec!["fd00::5".parse::<IpAddr>().expect("v6")]
    );
    assert_eq!(
        ips(&ask(&table, "pay.service.waymark.", RecordType::ANY)).len(),
        4
    );
}

#[test]
fn a_tier_without_routable_endpoints_fails_over_to_the_next() {
    // Goal: priority 0 all draining → priority 1 is answered, as Envoy fails over.
    let cart = assignment(
        "cart",
        vec![
            ep("10.1.0.1", "zone-a", 0, Draining),
            ep("10.1.1.1", "zone-b", 1, Eligible),
            ep("10.1.2.1", "zone-c", 2, Eligible),
        ],
        &[],
    );
    let table = DnsTable::build([&cart]);
    assert_eq!(
        ips(&ask(&table, "cart.service.waymark.", RecordType::A)),
        vec![v4("10.1.1.1")]
    );
}

#[test]
fn zero_weight_and_unhealthy_endpoints_are_never_answered() {
    // Goal: what Envoy would not route to stays out, whatever the assignment's source.
    let mut cla = assignment(
        "pay",
        vec![
            ep("10.0.0.1", "zone-a", 0, Eligible),
            ep("10.0.0.2", "zone-a", 0, Eligible),
            ep("10.0.0.3", "zone-a", 0, Eligible),
            ep("10.0.0.4", "zone-a", 0, Eligible),
        ],
        &[],
    );
    let lbs = &mut cla.endpoints[0].lb_endpoints;
    lbs[0].load_balancing_weight = Some(UInt32Value { value: 0 });
    lbs[1].health_status = HealthStatus::Unhealthy as i32;
    lbs[2].health_status = HealthStatus::Timeout as i32;
    lbs[3].load_balancing_weight = None; // Envoy's default weight is 1: routed
    let table = DnsTable::build([&cla]);
    assert_eq!(
        ips(&ask(&table, "pay.service.waymark.", RecordType::A)),
        vec![v4("10.0.0.4")]
    );
}

#[test]
fn under_the_fraction_guard_the_full_set_is_answered() {
    // Goal: a zone whose health is disregarded publishes its full set as HEALTHY, and DNS
    // answers all of it, exactly as EDS callers route to it.
    let legacy = assignment(
        "legacy",
        vec![
            ep("10.2.0.1", "zone-a", 0, Eligible),
            ep("10.2.0.2", "zone-a", 0, Disregarded),
            ep("10.2.0.3", "zone-a", 0, Disregarded),
        ],
        &["zone-a"],
    );
    let health: Vec<_> = legacy.endpoints[0]
        .lb_endpoints
        .iter()
        .map(|lb| lb.health_status)
        .collect();
    assert_eq!(health, vec![HealthStatus::Healthy as i32; 3]);
    let table = DnsTable::build([&legacy]);
    assert_eq!(
        ips(&ask(&table, "legacy.service.waymark.", RecordType::A)),
        vec![v4("10.2.0.1"), v4("10.2.0.2"), v4("10.2.0.3")]
    );
}

// === name forms ===

#[test]
fn tag_scoped_names_answer_only_endpoints_carrying_the_tag() {
    // Goal: `<tag>.<service>.service` filters by tag, without case, and fails over within it.
    let table = DnsTable::build([&pay()]);
    assert_eq!(
        ips(&ask(&table, "v2.pay.service.waymark.", RecordType::A)),
        vec![v4("10.0.0.1"), v4("10.0.0.2")]
    );
    assert_eq!(
        ips(&ask(&table, "CANARY.pay.service.waymark.", RecordType::A)),
        vec![v4("10.0.0.1")]
    );
    // Only priority 1 carries v1: the tag's best tier is answered.
    assert_eq!(
        ips(&ask(&table, "v1.pay.service.waymark.", RecordType::A)),
        vec![v4("10.0.1.1")]
    );
    assert!(is_nodata(&ask(
        &table,
        "nope.pay.service.waymark.",
        RecordType::A
    )));
    assert!(is_nxdomain(&ask(
        &table,
        "v2.nope.service.waymark.",
        RecordType::A
    )));
}

#[test]
fn zone_scoped_names_answer_only_endpoints_in_the_zone() {
    // Goal: `<service>.service.<zone>.zone` filters by zone, and combines with a tag.
    let table = DnsTable::build([&pay()]);
    assert_eq!(
        ips(&ask(
            &table,
            "pay.service.zone-b.zone.waymark.",
            RecordType::A
        )),
        vec![v4("10.0.1.1"), v4("10.0.1.2")]
    );
    assert_eq!(
        ips(&ask(
            &table,
            "v1.pay.service.ZONE-B.zone.waymark.",
            RecordType::A
        )),
        vec![v4("10.0.1.1")]
    );
    assert!(is_nodata(&ask(
        &table,
        "pay.service.zone-z.zone.waymark.",
        RecordType::A
    )));
    assert!(is_nxdomain(&ask(
        &table,
        "nope.service.zone-b.zone.waymark.",
        RecordType::A
    )));
}

#[test]
fn names_match_without_case_and_records_keep_the_asked_case() {
    let table = DnsTable::build([&pay()]);
    let answer = ask(&table, "PAY.Service.WayMark.", RecordType::A);
    assert_eq!(
        ips(&answer),
        ips(&ask(&table, "pay.service.waymark.", RecordType::A))
    );
    let Answer::Records { answers, .. } = answer else {
        panic!("records expected");
    };
    assert!(
        answers
            .iter()
            .all(|r| r.name.eq_case(&name("PAY.Service.WayMark.")))
    );
}

#[test]
fn dotted_service_names_win_over_tags_and_their_ancestors_exist() {
    // Goal: the longest known service wins; names above a dotted service are NODATA, never
    // NXDOMAIN (RFC 8020).
    let dotted = assignment("pay.eu", vec![ep("10.3.0.1", "zone-a", 0, Eligible)], &[]);
    let eu = assignment(
        "eu",
        vec![ep("10.3.1.1", "zone-a", 0, Eligible).tags(&["pay"])],
        &[],
    );
    let table = DnsTable::build([&dotted, &eu]);
    assert_eq!(
        ips(&ask(&table, "pay.eu.service.waymark.", RecordType::A)),
        vec![v4("10.3.0.1")]
    );
    let only_dotted = DnsTable::build([&dotted]);
    assert!(is_nodata(&ask(
        &only_dotted,
        "eu.service.waymark.",
        RecordType::A
    )));
    assert!(is_nxdomain(&ask(
        &only_dotted,
        "x.eu.service.waymark.",
        RecordType::A
    )));
}

#[test]
fn names_of_no_known_form_are_nxdomain_and_structural_names_exist() {
    let table = DnsTable::build([&pay()]);
    for nx in [
        "foo.waymark.",
        "pay.waymark.",
        "a.b.addr.waymark.",
        "zzzz.addr.waymark.",
        "0a00000.addr.waymark.",
    ] {
        assert!(is_nxdomain(&ask(&table, nx, RecordType::A)), "{nx}");
    }
    for ancestor in [
        "service.waymark.",
        "addr.waymark.",
        "zone.waymark.",
        "zone-a.zone.waymark.",
        "service.zone-a.zone.waymark.",
    ] {
        assert!(
            is_nodata(&ask(&table, ancestor, RecordType::A)),
            "{ancestor}"
        );
    }
}

#[test]
fn the_apex_answers_its_soa() {
    let table = DnsTable::build([&pay()]);
    let Answer::Records { answers, .. } = ask(&table, "waymark.", RecordType::SOA) else {
        panic!("SOA expected");
    };
    assert_eq!(answers, vec![origin().soa(7)]);
    assert!(is_nodata(&ask(&table, "waymark.", RecordType::A)));
}

#[test]
fn names_outside_the_domain_are_not_ours() {
    let table = DnsTable::build([&pay()]);
    assert_eq!(
        ask(&table, "pay.service.consul.", RecordType::A),
        Answer::NotOurs
    );
    assert_eq!(ask(&table, ".", RecordType::NS), Answer::NotOurs);
    // Another domain serves the same table under its own name.
    let mesh = DnsOrigin::new(&DnsConfig {
        domain: "Mesh.Internal".to_owned(),
        ..DnsConfig::default()
    })
    .expect("valid domain");
    assert_eq!(
        ips(&table.answer(&mesh, &name("pay.service.mesh.internal."), RecordType::A)).len(),
        3
    );
    assert_eq!(
        table.answer(&mesh, &name("pay.service.waymark."), RecordType::A),
        Answer::NotOurs
    );
}

// === negative answers ===

#[test]
fn an_unknown_service_is_nxdomain_with_the_soa_and_negative_ttl() {
    let table = DnsTable::build([&pay()]);
    let Answer::NxDomain { soa } = ask(&table, "nope.service.waymark.", RecordType::A) else {
        panic!("NXDOMAIN expected");
    };
    assert_eq!(soa.ttl, 2);
    assert_eq!(soa.name, name("waymark."));
    let RData::SOA(data) = &soa.data else {
        panic!("SOA expected");
    };
    assert_eq!(data.minimum, 2);
    assert_eq!(data.serial, 7, "the view version");
}

#[test]
fn a_known_service_with_nothing_routable_is_nodata() {
    // Goal: Consul-like "resolved to empty" (NOERROR, no answers), never NXDOMAIN.
    let search = assignment(
        "search",
        vec![
            ep("10.4.0.1", "zone-a", 0, Draining),
            ep("10.4.1.1", "zone-b", 1, Draining),
        ],
        &[],
    );
    let empty = ClusterLoadAssignment {
        cluster_name: "empty".to_owned(),
        ..ClusterLoadAssignment::default()
    };
    let table = DnsTable::build([&search, &empty]);
    for q in ["search.service.waymark.", "empty.service.waymark."] {
        for qtype in [RecordType::A, RecordType::AAAA, RecordType::SRV] {
            let answer = ask(&table, q, qtype);
            let Answer::NoData { soa } = &answer else {
                panic!("NODATA expected for {q} {qtype}, got {answer:?}");
            };
            assert_eq!(soa.ttl, 2);
        }
    }
    // A v4-only service has no AAAA: NODATA too; other types likewise.
    assert!(is_nodata(&ask(
        &DnsTable::build([&pay()]),
        "v1.pay.service.waymark.",
        RecordType::AAAA
    )));
    assert!(is_nodata(&ask(
        &DnsTable::build([&pay()]),
        "pay.service.waymark.",
        RecordType::TXT
    )));
}

// === SRV and addresses ===

#[test]
fn srv_answers_carry_priority_weight_port_and_an_addr_target_with_its_address() {
    let cart = assignment(
        "cart",
        vec![
            ep("10.1.0.1", "zone-a", 0, Draining),
            ep("10.1.1.1", "zone-b", 1, Eligible).weight(30),
            ep("fd00::1:2", "zone-b", 1, Degraded).weight(10),
        ],
        &[],
    );
    let table = DnsTable::build([&cart]);
    let Answer::Records {
        answers,
        additionals,
    } = ask(&table, "cart.service.waymark.", RecordType::SRV)
    else {
        panic!("records expected");
    };
    let srvs: Vec<_> = answers
        .iter()
        .map(|r| match &r.data {
            RData::SRV(s) => (s.priority, s.weight, s.port, s.target.to_string()),
            other => panic!("not SRV: {other:?}"),
        })
        .collect();
    assert_eq!(
        srvs,
        vec![
            (1, 30, 8001, "0a010101.addr.waymark.".to_owned()),
            (
                1,
                10,
                8002,
                "fd000000000000000000000000010002.addr.waymark.".to_owned()
            ),
        ]
    );
    assert!(answers.iter().all(|r| r.ttl == 5));
    let extra: Vec<_> = additionals
        .iter()
        .map(|r| (r.name.to_string(), r.data.clone()))
        .collect();
    assert_eq!(
        extra,
        vec![
            (
                "0a010101.addr.waymark.".to_owned(),
                RData::A(A(Ipv4Addr::new(10, 1, 1, 1)))
            ),
            (
                "fd000000000000000000000000010002.addr.waymark.".to_owned(),
                RData::AAAA(AAAA("fd00::1:2".parse::<Ipv6Addr>().expect("v6")))
            ),
        ]
    );
    // The targets resolve on their own too, case aside.
    assert_eq!(
        ips(&ask(&table, "0A010101.addr.waymark.", RecordType::A)),
        vec![v4("10.1.1.1")]
    );
    assert!(is_nodata(&ask(
        &table,
        "0a010101.addr.waymark.",
        RecordType::AAAA
    )));
}

#[test]
fn srv_weights_above_16_bits_are_scaled_keeping_their_ratio() {
    assert_eq!(srv_weight(100, 100), 100);
    assert_eq!(srv_weight(1_000_000, 1_000_000), u16::MAX);
    assert_eq!(srv_weight(500_000, 1_000_000), 32_767);
    assert_eq!(srv_weight(1, 1_000_000), 1, "never zero");
}

#[test]
fn endpoints_dns_cannot_express_are_skipped_without_harm() {
    // Goal: bad input never panics; the rest of the service is still answered.
    let mut cla = assignment(
        "pay",
        vec![
            ep("10.0.0.1", "zone-a", 0, Eligible),
            ep("10.0.0.2", "zone-a", 0, Eligible),
            ep("10.0.0.3", "zone-a", 0, Eligible),
        ],
        &[],
    );
    let lbs = &mut cla.endpoints[0].lb_endpoints;
    lbs[0].host_identifier = Some(HostIdentifier::Endpoint(Endpoint {
        address: Some(EnvoyAddress {
            address: Some(AddressKind::SocketAddress(SocketAddress {
                address: "pay.example.com".to_owned(),
                port_specifier: Some(PortSpecifier::PortValue(80)),
                ..SocketAddress::default()
            })),
        }),
        ..Endpoint::default()
    }));
    lbs[1].host_identifier = None;
    lbs[2].health_status = 99; // not a health status at all
    let table = DnsTable::build([&cla]);
    assert!(is_nodata(&ask(
        &table,
        "pay.service.waymark.",
        RecordType::A
    )));
    assert_eq!(table.len(), 1);
}

#[test]
fn a_soa_record_states_the_negative_ttl() {
    let soa = origin().soa(1);
    let RData::SOA(data) = soa.data else {
        panic!("SOA expected");
    };
    let expected = SOA::new(
        name("ns.waymark."),
        name("hostmaster.waymark."),
        1,
        3_600,
        600,
        86_400,
        2,
    );
    assert_eq!(data, expected);
}

#[test]
fn invalid_domains_are_refused_at_configuration() {
    for domain in [".", "", "a..b", &"x".repeat(300)] {
        let config = DnsConfig {
            domain: domain.to_owned(),
            ..DnsConfig::default()
        };
        assert!(
            matches!(
                DnsOrigin::new(&config),
                Err(crate::node::dns::DnsError::Domain { .. })
            ),
            "{domain:?}"
        );
    }
}

// === the rule, as a property ===

fn status() -> impl Strategy<Value = EndpointStatus> {
    prop_oneof![
        Just(Eligible),
        Just(Degraded),
        Just(Unknown),
        Just(Disregarded),
        Just(Draining)
    ]
}

proptest! {
    /// Goal: for any view, the A answer is exactly the reference rule applied to the view:
    /// routed endpoints of the lowest priority that has any.
    #[test]
    fn a_answers_are_the_routed_endpoints_of_the_best_priority(
        eps in prop::collection::vec((0u8..40, 0u32..3, status(), prop::bool::ANY), 0..12),
    ) {
        let mut seen = BTreeSet::new();
        let eps: Vec<_> = eps
            .into_iter()
            .filter(|(host, ..)| seen.insert(*host))
            .map(|(host, priority, status, zone_b)| Ep {
                ip: IpAddr::V4(Ipv4Addr::new(10, 9, 0, host)),
                zone: if zone_b { "zone-b" } else { "zone-a" },
                priority,
                weight: 100,
                status,
                tags: &[],
            })
            .collect();
        let routed: Vec<_> = eps.iter().filter(|e| e.status.is_routed()).collect();
        let best = routed.iter().map(|e| e.priority).min();
        let mut expected: Vec<IpAddr> = routed
            .iter()
            .filter(|e| Some(e.priority) == best)
            .map(|e| e.ip)
            .collect();
        expected.sort();
        let table = DnsTable::build([&assignment("prop", eps, &[])]);
        let answer = ask(&table, "prop.service.waymark.", RecordType::A);
        if expected.is_empty() {
            prop_assert!(is_nodata(&answer));
        } else {
            prop_assert_eq!(ips(&answer), expected);
        }
    }

    /// Goal: no question, however odd, makes the table panic.
    #[test]
    fn any_name_gets_an_answer(labels in prop::collection::vec("[a-zA-Z0-9._-]{1,12}", 0..6)) {
        let table = DnsTable::build([&pay()]);
        let joined = labels.join(".");
        if let Ok(q) = Name::from_ascii(format!("{joined}.waymark.")) {
            for qtype in [RecordType::A, RecordType::AAAA, RecordType::SRV, RecordType::ANY] {
                let _answer = table.answer(&origin(), &q, qtype);
            }
        }
    }
}
