//! LRS conversion, address book and sink: pure, exact, and never panicking on bad input.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{Pipe, SocketAddress};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterStats, UpstreamLocalityStats};
use waymark_core::model::{Address as WmAddress, RegionName, ServiceName, ZoneName};
use waymark_core::view::{Markers, ViewEndpoint, ViewKey};

use super::*;

fn sock(ip: &str, port: u32) -> Option<Address> {
    Some(Address {
        address: Some(AddressKind::SocketAddress(SocketAddress {
            address: ip.to_owned(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    })
}

fn stats(address: Option<Address>, ok: u64, err: u64) -> UpstreamEndpointStats {
    UpstreamEndpointStats {
        address,
        total_successful_requests: ok,
        total_error_requests: err,
        total_issued_requests: ok + err,
        ..Default::default()
    }
}

fn cluster(
    name: &str,
    interval: Option<PbDuration>,
    eps: Vec<UpstreamEndpointStats>,
) -> ClusterStats {
    ClusterStats {
        cluster_name: name.to_owned(),
        upstream_locality_stats: vec![UpstreamLocalityStats {
            upstream_endpoint_stats: eps,
            ..Default::default()
        }],
        load_report_interval: interval,
        ..Default::default()
    }
}

fn pb_secs(seconds: i64) -> Option<PbDuration> {
    Some(PbDuration { seconds, nanos: 0 })
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn view_with(eps: &[(&str, u8)]) -> View {
    let endpoints = eps
        .iter()
        .map(|(id, n)| {
            let e = ViewEndpoint::eligible(
                InstanceId::try_new(*id).unwrap(),
                WmAddress {
                    ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, *n)),
                    port: 8080,
                },
                RegionName::try_new("eu").unwrap(),
                ZoneName::try_new("a").unwrap(),
            );
            (e.instance.clone(), e)
        })
        .collect::<BTreeMap<_, _>>();
    View {
        key: ViewKey {
            service: ServiceName::try_new("pay").unwrap(),
            zone: ZoneName::try_new("a").unwrap(),
        },
        endpoints: endpoints.into(),
        markers: Markers::default(),
    }
}

fn load(address: &str, requests: u64, errors: u64) -> EndpointLoad {
    EndpointLoad {
        cluster: "pay".to_owned(),
        address: addr(address),
        requests,
        errors,
        interval: Duration::from_secs(1),
    }
}

#[test]
fn successes_and_errors_add_up_to_requests_per_endpoint() {
    // Goal: each endpoint's counts become one typed load, with the cluster's interval.
    let req = LoadStatsRequest {
        cluster_stats: vec![cluster(
            "pay",
            pb_secs(2),
            vec![
                stats(sock("10.0.0.1", 8080), 90, 10),
                stats(sock("::1", 9000), 5, 0),
            ],
        )],
        ..Default::default()
    };
    let out = endpoint_loads(&req, DEFAULT_INTERVAL);
    assert!(out.skipped.is_empty());
    assert_eq!(
        out.loads,
        vec![
            EndpointLoad {
                cluster: "pay".to_owned(),
                address: addr("10.0.0.1:8080"),
                requests: 100,
                errors: 10,
                interval: Duration::from_secs(2),
            },
            EndpointLoad {
                cluster: "pay".to_owned(),
                address: addr("[::1]:9000"),
                requests: 5,
                errors: 0,
                interval: Duration::from_secs(2),
            },
        ]
    );
}

#[test]
fn a_cluster_without_an_interval_covers_the_one_we_asked_for() {
    let req = LoadStatsRequest {
        cluster_stats: vec![cluster("pay", None, vec![stats(sock("10.0.0.1", 1), 1, 0)])],
        ..Default::default()
    };
    let out = endpoint_loads(&req, Duration::from_millis(500));
    assert_eq!(out.loads[0].interval, Duration::from_millis(500));
}

#[test]
fn bad_addresses_are_skipped_and_counted_while_good_entries_stay() {
    // Goal: one odd endpoint never costs the evidence about the others.
    let pipe = Some(Address {
        address: Some(AddressKind::Pipe(Pipe {
            path: "/tmp/sock".to_owned(),
            mode: 0,
        })),
    });
    let named_port = Some(Address {
        address: Some(AddressKind::SocketAddress(SocketAddress {
            address: "10.0.0.9".to_owned(),
            port_specifier: Some(PortSpecifier::NamedPort("http".to_owned())),
            ..Default::default()
        })),
    });
    let req = LoadStatsRequest {
        cluster_stats: vec![cluster(
            "pay",
            pb_secs(1),
            vec![
                stats(None, 1, 0),
                stats(pipe, 1, 0),
                stats(sock("pay.example.com", 80), 1, 0),
                stats(sock("10.0.0.1", 70_000), 1, 0),
                stats(named_port, 1, 0),
                stats(sock("10.0.0.2", 8080), 3, 1),
            ],
        )],
        ..Default::default()
    };
    let out = endpoint_loads(&req, DEFAULT_INTERVAL);
    assert_eq!(out.loads, vec![load("10.0.0.2:8080", 4, 1)]);
    let not_ip = LoadError::NotIp {
        cluster: "pay".to_owned(),
    };
    assert_eq!(
        out.skipped,
        vec![
            LoadError::NoAddress {
                cluster: "pay".to_owned()
            },
            not_ip.clone(),
            not_ip.clone(),
            not_ip.clone(),
            not_ip,
        ]
    );
}

#[test]
fn counts_that_overflow_are_skipped_not_wrapped() {
    let s = stats(sock("10.0.0.1", 1), 0, 0);
    let s = UpstreamEndpointStats {
        total_successful_requests: u64::MAX,
        total_error_requests: 1,
        ..s
    };
    let err = endpoint_load("pay", DEFAULT_INTERVAL, &s).unwrap_err();
    assert_eq!(
        err,
        LoadError::BadCounts {
            cluster: "pay".to_owned(),
            address: addr("10.0.0.1:1"),
        }
    );
}

#[test]
fn a_negative_interval_skips_every_endpoint_of_its_cluster_only() {
    let bad = PbDuration {
        seconds: -1,
        nanos: 0,
    };
    let bad_nanos = PbDuration {
        seconds: 0,
        nanos: 2_000_000_000,
    };
    let req = LoadStatsRequest {
        cluster_stats: vec![
            cluster(
                "a",
                Some(bad),
                vec![
                    stats(sock("10.0.0.1", 1), 1, 0),
                    stats(sock("10.0.0.2", 1), 1, 0),
                ],
            ),
            cluster("b", Some(bad_nanos), vec![stats(sock("10.0.0.3", 1), 1, 0)]),
            cluster("pay", pb_secs(1), vec![stats(sock("10.0.0.4", 1), 1, 0)]),
        ],
        ..Default::default()
    };
    let out = endpoint_loads(&req, DEFAULT_INTERVAL);
    assert_eq!(out.loads, vec![load("10.0.0.4:1", 1, 0)]);
    assert_eq!(out.skipped.len(), 3);
}

#[test]
fn known_addresses_become_passive_samples_from_the_reporting_node() {
    // Goal: loads map to instances through the view in force; unknown ones are counted.
    let book = AddressBook::from_view(&view_with(&[("pay-1", 1), ("pay-2", 2)]));
    let node = NodeName::try_new("node-a").unwrap();
    let loads = [
        load("10.0.0.1:8080", 10, 2),
        load("10.0.0.7:8080", 5, 5),
        load("10.0.0.2:8080", 3, 0),
    ];
    let (samples, unmapped) = book.resolve(&node, &loads);
    assert_eq!(unmapped, 1);
    let want = |id: &str, requests, errors| Sample {
        instance: InstanceId::try_new(id).unwrap(),
        reporter: Reporter::Node(node.clone()),
        observation: Observation::Passive { requests, errors },
    };
    assert_eq!(samples, vec![want("pay-1", 10, 2), want("pay-2", 3, 0)]);
}

#[test]
fn an_address_held_by_two_instances_maps_to_neither() {
    let mut book = AddressBook::from_view(&view_with(&[("pay-1", 1)]));
    book.insert_view(&view_with(&[("pay-1", 1)])); // the same instance again: still fine
    assert_eq!(
        book.instance(&addr("10.0.0.1:8080")).map(|i| i.as_str()),
        Some("pay-1")
    );
    book.insert_view(&view_with(&[("pay-9", 1)]));
    assert_eq!(book.instance(&addr("10.0.0.1:8080")), None);
    let node = NodeName::try_new("node-a").unwrap();
    let (samples, unmapped) = book.resolve(&node, &[load("10.0.0.1:8080", 1, 0)]);
    assert!(samples.is_empty());
    assert_eq!(unmapped, 1);
}

#[test]
fn a_report_names_its_node_as_a_waymark_node_name() {
    let report = LoadReport {
        reporter: LrsReporter::Declared("node-a".to_owned()),
        node_id: "node-a".to_owned(),
        zone: String::new(),
        loads: Vec::new(),
    };
    assert_eq!(report.node_name().unwrap().as_str(), "node-a");
    let bad = LoadReport {
        node_id: "sidecar~10.0.0.1".to_owned(),
        ..report
    };
    assert!(bad.node_name().is_err());
}

#[test]
fn a_reporter_is_its_verified_identity_and_a_declared_node_only_on_loopback() {
    // Goal: over mutual TLS the node id a client writes never names the reporter; without
    // TLS only a loopback peer is keyed, by what it declared; anyone else is nobody.
    let workload: Identity = "spiffe://mesh.test/region/eu/service/cart/instance/i1"
        .parse()
        .unwrap();
    let lan = Some(addr("10.0.0.7:5000"));
    let local = Some(addr("127.0.0.1:5000"));
    let mapped = Some(addr("[::ffff:127.0.0.1]:5000"));
    let verified = reporter_of(Some(&workload), lan, "claims-to-be-someone-else").unwrap();
    assert_eq!(verified, LrsReporter::Verified(workload.clone()));
    assert_eq!(
        verified.to_string(),
        "spiffe://mesh.test/region/eu/service/cart/instance/i1"
    );
    for remote in [local, mapped, Some(addr("[::1]:5000"))] {
        let declared = reporter_of(None, remote, "sidecar-a").unwrap();
        assert_eq!(declared, LrsReporter::Declared("sidecar-a".to_owned()));
        assert_eq!(declared.to_string(), "node:sidecar-a");
    }
    assert_eq!(reporter_of(None, lan, "sidecar-a"), None);
    assert_eq!(reporter_of(None, None, "sidecar-a"), None);
}

#[test]
fn a_full_channel_sink_drops_and_counts_instead_of_blocking() {
    let (tx, mut rx) = mpsc::channel(1);
    let sink = ChannelSink::new(tx);
    let report = LoadReport {
        reporter: LrsReporter::Declared("node-a".to_owned()),
        node_id: "node-a".to_owned(),
        zone: "a".to_owned(),
        loads: vec![load("10.0.0.1:8080", 1, 0)],
    };
    sink.handle_report(report.clone());
    sink.handle_report(report.clone());
    assert_eq!(sink.dropped(), 1);
    assert_eq!(rx.try_recv().unwrap(), report);
    assert!(rx.try_recv().is_err());
}

#[test]
fn the_first_response_asks_for_every_cluster_per_endpoint_at_our_interval() {
    let (tx, _rx) = mpsc::channel(1);
    let config = LrsConfig {
        interval: Duration::from_millis(1_500),
        ..LrsConfig::default()
    };
    let server = LrsServer::new(config, Arc::new(ChannelSink::new(tx)));
    let r = server.first_response();
    assert!(r.send_all_clusters);
    assert!(r.report_endpoint_granularity);
    assert_eq!(
        r.load_reporting_interval,
        Some(PbDuration {
            seconds: 1,
            nanos: 500_000_000
        })
    );
}

#[test]
fn named_clusters_replace_send_all_in_the_response() {
    // Envoy fixes a send-all-clusters report's set when the response arrives, so clusters
    // CDS delivers later are only reported once they are named.
    let (tx, _rx) = mpsc::channel(1);
    let server = LrsServer::new(LrsConfig::default(), Arc::new(ChannelSink::new(tx)));
    server.set_clusters(vec!["pay".into(), "cart".into(), "pay".into()]);
    let r = server.first_response();
    assert!(!r.send_all_clusters);
    assert_eq!(r.clusters, vec!["cart".to_owned(), "pay".to_owned()]);
    server.set_clusters(Vec::new());
    assert!(server.first_response().send_all_clusters);
}
