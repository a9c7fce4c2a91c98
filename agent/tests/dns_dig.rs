//! The node agent's DNS server, asked by real `dig` over UDP and TCP: every answer must be
//! the set EDS callers route to, computed here from the same `ClusterLoadAssignment`s
//! (`HEALTHY`/`DEGRADED`/`UNKNOWN`, weight above zero, best priority that has any).
//!
//! Needs `dig` (Debian `dnsutils`); `./scripts/test` installs it. Without it the tests fail,
//! saying so; they never skip.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::google::protobuf::value::Kind;
use prometheus_client::registry::Registry;
use waymark_agent::node::dns::{DnsConfig, DnsServer, DnsTable};
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::EndpointStatus::{
    self, Degraded, Disregarded, Draining, Eligible, Unknown,
};
use waymark_core::view::{Markers, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey};
use waymark_xds::translate::{METADATA_NAMESPACE, load_assignment};

// === fixtures: views → the EDS resources the agent serves ===

struct Ep {
    ip: IpAddr,
    zone: &'static str,
    priority: u32,
    weight: u32,
    status: EndpointStatus,
    tags: &'static [&'static str],
}

fn ep(ip: &str, zone: &'static str, priority: u32, status: EndpointStatus) -> Ep {
    Ep {
        ip: ip.parse().expect("test address"),
        zone,
        priority,
        weight: 100,
        status,
        tags: &[],
    }
}

fn released(service: &str, eps: &[Ep], disregarded: &[&str]) -> ReleasedView {
    let endpoints: BTreeMap<_, _> = eps
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let instance = InstanceId::try_new(format!("{service}-{i}")).expect("test id");
            let endpoint = ViewEndpoint {
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
            (instance, endpoint)
        })
        .collect();
    ReleasedView {
        version: Version(42),
        view: View {
            key: ViewKey {
                service: ServiceName::try_new(service).expect("test service"),
                zone: ZoneName::try_new("zone-a").expect("test zone"),
            },
            endpoints: endpoints.into(),
            markers: Markers {
                health_disregarded: disregarded
                    .iter()
                    .map(|z| ZoneName::try_new(z).expect("test zone"))
                    .collect(),
                ..Markers::default()
            },
        },
    }
}

fn pay_endpoints() -> Vec<Ep> {
    vec![
        Ep {
            tags: &["v2", "canary"],
            ..ep("10.0.0.1", "zone-a", 0, Eligible)
        },
        Ep {
            tags: &["v2"],
            weight: 50,
            ..ep("10.0.0.2", "zone-a", 0, Degraded)
        },
        ep("10.0.0.3", "zone-a", 0, Unknown),
        Ep {
            tags: &["v2"],
            ..ep("10.0.0.4", "zone-a", 0, Draining)
        },
        ep("fd00::5", "zone-a", 0, Eligible),
        Ep {
            tags: &["v1"],
            ..ep("10.0.1.1", "zone-b", 1, Eligible)
        },
        ep("10.0.1.2", "zone-b", 1, Eligible),
    ]
}

/// Everything the agent would serve: a mix of statuses, tiers, tags, zones and a guard.
fn assignments() -> Vec<ClusterLoadAssignment> {
    let big: Vec<Ep> = (1..=100)
        .map(|h| ep(&format!("10.5.0.{h}"), "zone-a", 0, Eligible))
        .collect();
    [
        released("pay", &pay_endpoints(), &[]),
        released(
            "cart",
            &[
                ep("10.1.0.1", "zone-a", 0, Draining),
                ep("10.1.1.1", "zone-b", 1, Eligible),
                ep("fd00::1:2", "zone-b", 1, Eligible),
            ],
            &[],
        ),
        released(
            "search",
            &[
                ep("10.4.0.1", "zone-a", 0, Draining),
                ep("10.4.1.1", "zone-b", 1, Draining),
            ],
            &[],
        ),
        released(
            "legacy",
            &[
                ep("10.2.0.1", "zone-a", 0, Eligible),
                ep("10.2.0.2", "zone-a", 0, Disregarded),
                ep("10.2.0.3", "zone-a", 0, Disregarded),
            ],
            &["zone-a"],
        ),
        released("big", &big, &[]),
    ]
    .iter()
    .map(load_assignment)
    .collect()
}

// === the reference: what EDS callers route to ===

/// One endpoint as an EDS caller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Routed {
    ip: IpAddr,
    port: u16,
    weight: u32,
    priority: u32,
}

/// The endpoints Envoy routes new requests to, restricted to `tag` and `zone`, of the best
/// priority that has any.
fn eds_set(
    assignments: &[ClusterLoadAssignment],
    service: &str,
    tag: Option<&str>,
    zone: Option<&str>,
) -> Vec<Routed> {
    let cla = assignments
        .iter()
        .find(|c| c.cluster_name == service)
        .expect("known service");
    let mut routed = Vec::new();
    for locality in &cla.endpoints {
        let locality_zone = locality.locality.as_ref().map_or("", |l| l.zone.as_str());
        if zone.is_some_and(|z| z != locality_zone) {
            continue;
        }
        for lb in &locality.lb_endpoints {
            let health = HealthStatus::try_from(lb.health_status).expect("known status");
            let weight = lb.load_balancing_weight.map_or(1, |w| w.value);
            let routable = matches!(
                health,
                HealthStatus::Healthy | HealthStatus::Degraded | HealthStatus::Unknown
            ) && weight > 0;
            let tags: Vec<String> = match lb
                .metadata
                .as_ref()
                .and_then(|m| m.filter_metadata.get(METADATA_NAMESPACE))
                .and_then(|s| s.fields.get("tags"))
                .and_then(|v| v.kind.as_ref())
            {
                Some(Kind::ListValue(list)) => list
                    .values
                    .iter()
                    .filter_map(|v| match &v.kind {
                        Some(Kind::StringValue(s)) => Some(s.clone()),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            if !routable || tag.is_some_and(|t| !tags.iter().any(|x| x == t)) {
                continue;
            }
            let Some(HostIdentifier::Endpoint(endpoint)) = &lb.host_identifier else {
                panic!("endpoint expected");
            };
            let Some(AddressKind::SocketAddress(sa)) =
                endpoint.address.as_ref().and_then(|a| a.address.as_ref())
            else {
                panic!("socket address expected");
            };
            let Some(PortSpecifier::PortValue(port)) = sa.port_specifier else {
                panic!("port expected");
            };
            routed.push(Routed {
                ip: sa.address.parse().expect("IP"),
                port: u16::try_from(port).expect("port"),
                weight,
                priority: locality.priority,
            });
        }
    }
    let best = routed.iter().map(|r| r.priority).min();
    routed.retain(|r| Some(r.priority) == best);
    routed.sort();
    routed
}

fn ips(set: &[Routed], v6: bool) -> Vec<IpAddr> {
    let mut out: Vec<_> = set
        .iter()
        .map(|r| r.ip)
        .filter(|ip| ip.is_ipv6() == v6)
        .collect();
    out.sort();
    out.dedup();
    out
}

fn hex(ip: IpAddr) -> String {
    let octets = match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    octets.iter().map(|b| format!("{b:02x}")).collect()
}

// === dig ===

struct Dig {
    port: u16,
}

impl Dig {
    fn run(&self, args: &[&str]) -> String {
        let output = Command::new("dig")
            .arg("@127.0.0.1")
            .args(["-p", &self.port.to_string(), "+time=2", "+tries=1"])
            .args(args)
            .output();
        let output = output.unwrap_or_else(|e| cannot_run_dig(&e));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `+short` lines, sorted.
    fn short(&self, name: &str, qtype: &str, tcp: bool) -> Vec<String> {
        let mut args = vec!["+short", name, qtype];
        if tcp {
            args.push("+tcp");
        }
        let mut lines: Vec<String> = self
            .run(&args)
            .lines()
            .map(str::to_owned)
            .filter(|l| !l.is_empty())
            .collect();
        lines.sort();
        lines
    }

    fn addresses(&self, name: &str, qtype: &str, tcp: bool) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = self
            .short(name, qtype, tcp)
            .iter()
            .map(|l| {
                l.parse()
                    .unwrap_or_else(|_| panic!("not an address: {l:?}"))
            })
            .collect();
        out.sort();
        out
    }

    /// The response's status (`NOERROR`, `NXDOMAIN`, …) and flags.
    fn status(&self, name: &str, qtype: &str, extra: &[&str]) -> (String, String) {
        let mut args = vec!["+noall", "+comments", name, qtype];
        args.extend_from_slice(extra);
        let out = self.run(&args);
        let header = out
            .lines()
            .find(|l| l.contains("status:"))
            .unwrap_or_else(|| panic!("no status in dig output:\n{out}"));
        let status = header
            .split("status: ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap_or_default()
            .to_owned();
        let flags = out
            .lines()
            .find_map(|l| l.split(";; flags: ").nth(1))
            .and_then(|s| s.split(';').next())
            .unwrap_or_default()
            .to_owned();
        (status, flags)
    }
}

fn dig_is_installed() {
    if let Err(e) = Command::new("dig").arg("-v").output() {
        cannot_run_dig(&e);
    }
}

fn cannot_run_dig(e: &std::io::Error) -> ! {
    if e.kind() == ErrorKind::NotFound {
        panic!(
            "`dig` is not installed. Run ./scripts/test (it installs Debian's dnsutils), \
             or `apt-get install dnsutils`, then run this test again"
        );
    }
    panic!("cannot run dig: {e}");
}

/// A runtime, a server on a free loopback port, and the handles to swap and inspect it.
/// Fields drop in order: the server before its runtime.
struct Harness {
    server: Option<DnsServer>,
    table: Arc<ArcSwap<DnsTable>>,
    registry: Registry,
    dig: Dig,
    runtime: tokio::runtime::Runtime,
}

impl Harness {
    fn start(assignments: &[ClusterLoadAssignment]) -> Self {
        dig_is_installed();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let table = Arc::new(ArcSwap::from_pointee(DnsTable::build(assignments)));
        let mut registry = Registry::default();
        let config = DnsConfig {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            ..DnsConfig::default()
        };
        let server = {
            let _entered = runtime.enter();
            DnsServer::start(config, table.clone(), &mut registry).expect("dns server starts")
        };
        assert_eq!(
            server.udp_local_addr().port(),
            server.tcp_local_addr().port()
        );
        let dig = Dig {
            port: server.local_addr().port(),
        };
        Self {
            server: Some(server),
            table,
            registry,
            dig,
            runtime,
        }
    }

    /// The registry in the text exposition format.
    fn metrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("encodable");
        out
    }
}

/// The value of one series (name with labels, exactly as exposed); 0 when absent.
fn metric(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

// === tests ===

#[test]
fn dig_sees_exactly_the_eds_set_under_every_name_form() {
    let cla = assignments();
    let h = Harness::start(&cla);
    let dig = &h.dig;

    for tcp in [false, true] {
        // Plain: A and AAAA of the best tier.
        let pay = eds_set(&cla, "pay", None, None);
        assert_eq!(
            dig.addresses("pay.service.waymark.", "A", tcp),
            ips(&pay, false)
        );
        assert_eq!(
            dig.addresses("pay.service.waymark.", "AAAA", tcp),
            ips(&pay, true)
        );
        // Hand-checked once, so the reference cannot drift with the implementation.
        assert_eq!(
            ips(&pay, false),
            ["10.0.0.1", "10.0.0.2", "10.0.0.3"].map(|s| s.parse::<IpAddr>().expect("ip"))
        );

        // Tag-scoped, and case does not matter.
        for (tag, name) in [
            ("v2", "v2.pay.service.waymark."),
            ("canary", "CANARY.Pay.service.waymark."),
            ("v1", "v1.pay.service.waymark."),
        ] {
            assert_eq!(
                dig.addresses(name, "A", tcp),
                ips(&eds_set(&cla, "pay", Some(tag), None), false),
                "{name}"
            );
        }

        // Zone-scoped.
        assert_eq!(
            dig.addresses("pay.service.zone-b.zone.waymark.", "A", tcp),
            ips(&eds_set(&cla, "pay", None, Some("zone-b")), false)
        );

        // Failover: cart's best tier is all draining.
        let cart = eds_set(&cla, "cart", None, None);
        assert_eq!(
            dig.addresses("cart.service.waymark.", "A", tcp),
            ips(&cart, false)
        );
        assert_eq!(
            dig.addresses("cart.service.waymark.", "AAAA", tcp),
            ips(&cart, true)
        );

        // SRV: priority, weight, port, addr target; the targets resolve.
        let mut expected_srv: Vec<String> = cart
            .iter()
            .map(|r| {
                format!(
                    "{} {} {} {}.addr.waymark.",
                    r.priority,
                    r.weight,
                    r.port,
                    hex(r.ip)
                )
            })
            .collect();
        expected_srv.sort();
        assert_eq!(dig.short("cart.service.waymark.", "SRV", tcp), expected_srv);
        for r in &cart {
            let qtype = if r.ip.is_ipv6() { "AAAA" } else { "A" };
            assert_eq!(
                dig.addresses(&format!("{}.addr.waymark.", hex(r.ip)), qtype, tcp),
                vec![r.ip]
            );
        }

        // Under the fraction guard the full set is answered.
        let legacy = eds_set(&cla, "legacy", None, None);
        assert_eq!(legacy.len(), 3, "the guard keeps the full set in EDS");
        assert_eq!(
            dig.addresses("legacy.service.waymark.", "A", tcp),
            ips(&legacy, false)
        );

        // Unknown service: NXDOMAIN with the SOA; known but empty: NOERROR, nothing.
        let tcp_flag: &[&str] = if tcp { &["+tcp"] } else { &[] };
        assert_eq!(
            dig.status("nope.service.waymark.", "A", tcp_flag).0,
            "NXDOMAIN"
        );
        assert!(eds_set(&cla, "search", None, None).is_empty());
        assert_eq!(
            dig.status("search.service.waymark.", "A", tcp_flag).0,
            "NOERROR"
        );
        assert!(dig.short("search.service.waymark.", "A", tcp).is_empty());
    }

    let authority = dig.run(&["+noall", "+authority", "nope.service.waymark.", "A"]);
    let soa: Vec<&str> = authority.split_whitespace().collect();
    assert_eq!(
        soa,
        [
            "waymark.",
            "2",
            "IN",
            "SOA",
            "ns.waymark.",
            "hostmaster.waymark.",
            "42",
            "3600",
            "600",
            "86400",
            "2"
        ],
        "{authority}"
    );
    let answer = dig.run(&["+noall", "+answer", "pay.service.waymark.", "A"]);
    assert!(
        answer
            .lines()
            .all(|l| l.split_whitespace().nth(1) == Some("5")),
        "positive TTL is 5 s:\n{answer}"
    );

    let metrics = h.metrics();
    for series in [
        r#"waymark_dns_queries_total{transport="udp",qtype="a",rcode="noerror"}"#,
        r#"waymark_dns_queries_total{transport="tcp",qtype="srv",rcode="noerror"}"#,
        r#"waymark_dns_queries_total{transport="udp",qtype="a",rcode="nxdomain"}"#,
    ] {
        assert!(
            metrics.contains(series),
            "{series} missing from:\n{metrics}"
        );
    }
}

#[test]
fn answers_too_big_for_udp_are_truncated_and_dig_retries_over_tcp() {
    let cla = assignments();
    let h = Harness::start(&cla);
    let big = eds_set(&cla, "big", None, None);
    assert_eq!(big.len(), 100);
    let (status, flags) = h
        .dig
        .status("big.service.waymark.", "A", &["+ignore", "+noedns"]);
    assert_eq!(status, "NOERROR");
    assert!(
        flags.split_whitespace().any(|f| f == "tc"),
        "flags: {flags}"
    );
    // Without +ignore, dig retries over TCP and gets the whole set.
    assert_eq!(
        h.dig.addresses("big.service.waymark.", "A", false),
        ips(&big, false)
    );
    let truncated = metric(&h.metrics(), "waymark_dns_truncated_total");
    assert!(truncated >= 1.0, "truncated: {truncated}");
}

#[test]
fn a_swapped_table_is_answered_from_the_next_query_on() {
    let mut cla = assignments();
    let h = Harness::start(&cla);
    let before = h.dig.addresses("pay.service.waymark.", "A", false);
    assert!(before.contains(&"10.0.0.1".parse().expect("ip")));

    // 10.0.0.1 is withdrawn, 10.0.0.3 starts draining.
    let mut eps = pay_endpoints();
    eps.remove(0);
    eps[1].status = Draining;
    cla[0] = load_assignment(&released("pay", &eps, &[]));
    h.table.store(Arc::new(DnsTable::build(&cla)));

    let after = h.dig.addresses("pay.service.waymark.", "A", false);
    assert_eq!(after, ips(&eds_set(&cla, "pay", None, None), false));
    assert_eq!(after, vec!["10.0.0.2".parse::<IpAddr>().expect("ip")]);
    assert_eq!(h.dig.addresses("pay.service.waymark.", "A", true), after);

    // Everything withdrawn from the agent's view: the service is unknown now.
    h.table.store(Arc::new(DnsTable::default()));
    assert_eq!(h.dig.status("pay.service.waymark.", "A", &[]).0, "NXDOMAIN");
}

#[test]
fn malformed_packets_are_counted_and_do_not_stop_the_server() {
    let cla = assignments();
    let h = Harness::start(&cla);
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("client socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let server = SocketAddr::from((Ipv4Addr::LOCALHOST, h.dig.port));

    // Too short for a header: dropped, no reply.
    socket.send_to(&[0xab, 0xcd, 0x01], server).expect("send");
    // A header claiming one question, then garbage: FORMERR with the same id.
    let garbage = [
        0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff,
    ];
    socket.send_to(&garbage, server).expect("send");
    let mut buf = [0u8; 512];
    let (len, _) = socket.recv_from(&mut buf).expect("FORMERR reply");
    assert!(len >= 12);
    assert_eq!(&buf[..2], &[0xab, 0xcd], "same id");
    assert_eq!(buf[2] & 0x80, 0x80, "a response");
    assert_eq!(buf[3] & 0x0f, 1, "FORMERR");

    assert_eq!(
        h.dig.addresses("pay.service.waymark.", "A", false),
        ips(&eds_set(&cla, "pay", None, None), false),
        "still serving"
    );
    let malformed = metric(
        &h.metrics(),
        r#"waymark_dns_malformed_total{transport="udp"}"#,
    );
    assert_eq!(malformed, 2.0);
}

#[test]
fn a_shut_down_server_answers_nothing() {
    let cla = assignments();
    let mut h = Harness::start(&cla);
    assert!(!h.dig.short("pay.service.waymark.", "A", false).is_empty());
    let server = h.server.take().expect("running");
    h.runtime.block_on(server.shutdown());
    for transport in ["+notcp", "+tcp"] {
        let out = h
            .dig
            .run(&["+time=1", transport, "pay.service.waymark.", "A"]);
        assert!(!out.contains("status:"), "{transport}: {out}");
    }
}
