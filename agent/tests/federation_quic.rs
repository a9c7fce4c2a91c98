//! Federation over real QUIC on loopback: three regions (ap, eu, us), each a
//! `FederationNode` with its own authority certificate from one PKI, converge; a region cut
//! off (its endpoint stopped) is kept and marked stale by the others, and on restart the
//! links recover with a reconciliation record; two regions of two members each keep one link
//! per pair of members, and a region is stale only once all its members are silent;
//! connections from certificates of the wrong kind or trust domain, and authorities of the
//! wrong region or an unconfigured member, are refused and counted; on an admitted link a
//! peer speaks only for its own region (direct links only: nothing is relayed, and a batch
//! naming a third region or ours is refused whole and counted).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use waymark_certs::ca::IssuedLeaf;
use waymark_certs::metrics::RejectSource;
use waymark_certs::quic::{ALPN_WAYMARK, quic_client_config};
use waymark_certs::testing::{TestPkiDir, certified, raw_client_config};
use waymark_certs::tls::LiveMaterial;
use waymark_certs::{CertMetrics, IdentityKind, KindSet, PeerPolicy, RejectReason, TrustDomain};
use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::EndpointStatus;
use waymark_federation::aggregate::{
    AggregateEndpoint, Entry, Outcome, ReconciliationRecord, RegionAggregates, ServiceAggregate,
};
use waymark_federation::session::{Message, SessionConfig};
use waymark_federation_quic::{
    FederationConfig, FederationError, FederationMetrics, FederationNode, FederationTls,
    PeerConfig, PeerStatus, RefusalReason, RegionStatus, SharedAggregates,
};
use waymark_testkit::until;
use waymark_xds::client::BackoffConfig;

const TD: &str = "waymark.test";
/// The longest any expected state may take to appear.
const WAIT: Duration = Duration::from_secs(30);
/// A peer this silent is stale (short, so the test sees it).
const STALE_AFTER: Duration = Duration::from_secs(1);
/// Acceptors never dial, so the address they are configured with for a dialling peer is
/// only reported; the dialling peer may not be bound yet when they start.
const NOT_DIALLED: &str = "127.0.0.1:9";

// === the PKI ===

fn authorities() -> PeerPolicy {
    PeerPolicy {
        trust_domain: TrustDomain::new(TD).unwrap(),
        accepted: KindSet::only(IdentityKind::Authority),
        region: None,
    }
}

// === aggregates ===

fn region(s: &str) -> RegionName {
    RegionName::try_new(s).unwrap()
}

fn service(s: &str) -> ServiceName {
    ServiceName::try_new(s).unwrap()
}

/// `region`'s aggregate of `svc` at `version`: one endpoint whose port encodes the version.
fn entry(r: &str, svc: &str, version: u64) -> Entry {
    let port = 8_000 + u16::try_from(version).unwrap();
    let endpoint = AggregateEndpoint {
        instance: InstanceId::try_new(format!("{r}-{svc}-1")).unwrap(),
        address: Address {
            ip: "10.0.0.1".parse().unwrap(),
            port,
        },
        zone: ZoneName::try_new(format!("{r}-a")).unwrap(),
        weight: Weight::DEFAULT,
        status: EndpointStatus::Eligible,
        verdict: Verdict::Eligible,
    };
    Entry {
        region: region(r),
        service: service(svc),
        version,
        aggregate: Arc::new(ServiceAggregate {
            endpoints: vec![endpoint],
        }),
    }
}

type Versions = BTreeMap<(RegionName, ServiceName), u64>;

fn versions(list: &[(&str, &str, u64)]) -> Versions {
    list.iter()
        .map(|(r, s, v)| ((region(r), service(s)), *v))
        .collect()
}

// === one authority member ===

struct Fed {
    /// The region.
    name: &'static str,
    member: &'static str,
    aggregates: SharedAggregates,
    metrics: FederationMetrics,
    certs: CertMetrics,
    config: FederationConfig,
    live: Arc<LiveMaterial>,
    node: Option<FederationNode>,
}

impl Fed {
    /// Starts member `a1` of region `name`, its peers each their region's member `a1`.
    fn start(pki: &TestPkiDir, name: &'static str, peers: &[(&str, SocketAddr)]) -> Self {
        let peers: Vec<_> = peers.iter().map(|(r, addr)| (*r, "a1", *addr)).collect();
        Self::member(pki, name, "a1", &peers)
    }

    /// Starts `member` of region `name` on 127.0.0.1:0 with its own authority certificate,
    /// having published version 1 of `cart` and `pay`; `peers` are (region, member, addr).
    fn member(
        pki: &TestPkiDir,
        name: &'static str,
        member: &'static str,
        peers: &[(&str, &str, SocketAddr)],
    ) -> Self {
        let mut aggregates = RegionAggregates::new();
        for svc in ["cart", "pay"] {
            aggregates.publish_local(entry(name, svc, 1)).unwrap();
        }
        let peers = peers
            .iter()
            .map(|(r, m, addr)| PeerConfig {
                region: region(r),
                member: (*m).to_owned(),
                addr: *addr,
            })
            .collect();
        let mut config = FederationConfig::new(region(name), "127.0.0.1:0".parse().unwrap(), peers);
        config.session = SessionConfig {
            digest_interval: Duration::from_millis(100),
            // One entry per message, so every sync takes several bounded messages.
            entries_per_message: 1,
            outbox_max: 16,
        };
        config.reconnect = BackoffConfig {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(500),
            healthy_after: Duration::from_secs(1),
        };
        config.seed = 7;
        config.stale_after = STALE_AFTER;
        config.idle_timeout = Duration::from_secs(3);
        config.message_bytes_max = NonZeroU32::new(64 * 1024).unwrap();
        let mut fed = Self {
            name,
            member,
            aggregates: Arc::new(Mutex::new(aggregates)),
            metrics: FederationMetrics::new(),
            certs: CertMetrics::new(),
            config,
            live: pki.live(&format!("region/{name}/authority/{member}")),
            node: None,
        };
        fed.node = Some(fed.try_start().unwrap());
        fed
    }

    fn try_start(&self) -> Result<FederationNode, FederationError> {
        let tls = FederationTls {
            live: self.live.clone(),
            trust_domain: TrustDomain::new(TD).unwrap(),
            metrics: self.certs.clone(),
        };
        FederationNode::start(
            self.config.clone(),
            tls,
            self.aggregates.clone(),
            self.metrics.clone(),
        )
    }

    fn node(&self) -> &FederationNode {
        self.node.as_ref().expect("running")
    }

    fn addr(&self) -> SocketAddr {
        self.node().local_addr()
    }

    fn digest(&self) -> Versions {
        self.aggregates.lock().unwrap().digest()
    }

    fn publish(&self, svc: &str, version: u64) {
        self.aggregates
            .lock()
            .unwrap()
            .publish_local(entry(self.name, svc, version))
            .unwrap();
    }

    /// Stops the endpoint (a partition, as the peers see it); the aggregates stay.
    async fn stop(&mut self) -> SocketAddr {
        let node = self.node.take().expect("running");
        let addr = node.local_addr();
        node.shutdown().await;
        addr
    }

    /// Starts again on `addr` (the port is free once `shutdown` returned; retried briefly
    /// in case the kernel has not released it yet).
    async fn restart(&mut self, addr: SocketAddr) {
        self.config.bind = addr;
        let what = format!("{}/{} to restart on {addr}", self.name, self.member);
        let node = until(&what, WAIT, async || match self.try_start() {
            Ok(node) => Ok(node),
            Err(e @ FederationError::Bind { .. }) => Err(e),
            Err(e) => panic!("{}/{} did not restart: {e}", self.name, self.member),
        })
        .await;
        self.node = Some(node);
    }

    /// The link to member `a1` of region `peer`.
    fn peer(&self, peer: &str) -> PeerStatus {
        self.link(peer, "a1")
    }

    /// The link to `member` of region `peer`.
    fn link(&self, peer: &str, member: &str) -> PeerStatus {
        self.node()
            .status()
            .into_iter()
            .find(|s| s.region == region(peer) && s.member == member)
            .expect("configured peer member")
    }

    /// Region `peer`, summed over its links.
    fn region(&self, peer: &str) -> RegionStatus {
        self.node()
            .regions()
            .into_iter()
            .find(|s| s.region == region(peer))
            .expect("configured peer region")
    }
}

/// ap < eu < us: the lower name dials, so `us` starts first, then `eu`, then `ap`.
fn three_regions(pki: &TestPkiDir) -> (Fed, Fed, Fed) {
    let unused: SocketAddr = NOT_DIALLED.parse().unwrap();
    let us = Fed::start(pki, "us", &[("ap", unused), ("eu", unused)]);
    let eu = Fed::start(pki, "eu", &[("ap", unused), ("us", us.addr())]);
    let ap = Fed::start(pki, "ap", &[("eu", eu.addr()), ("us", us.addr())]);
    (ap, eu, us)
}

/// The Prometheus text exposition of one node's federation metrics, as the authority
/// serves it.
fn exposition(metrics: &FederationMetrics) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    waymark_agent::metrics::to_prometheus_text(&text)
}

async fn converge(feds: &[&Fed], expected: &Versions) {
    until(
        "every region holds every region's entries",
        WAIT,
        async || feds.iter().all(|f| f.digest() == *expected),
    )
    .await;
}

fn all_v1() -> Versions {
    versions(&[
        ("ap", "cart", 1),
        ("ap", "pay", 1),
        ("eu", "cart", 1),
        ("eu", "pay", 1),
        ("us", "cart", 1),
        ("us", "pay", 1),
    ])
}

// === tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_regions_converge_over_mutually_authenticated_quic() {
    // Goal: each region's own entries reach the other two over real QUIC links.
    let pki = TestPkiDir::new(TD, &["ap", "eu", "us"]);
    let (ap, eu, us) = three_regions(&pki);
    converge(&[&ap, &eu, &us], &all_v1()).await;
    until("every link reports connected and fresh", WAIT, async || {
        [
            (&ap, ["eu", "us"]),
            (&eu, ["ap", "us"]),
            (&us, ["ap", "eu"]),
        ]
        .iter()
        .all(|(f, peers)| {
            peers.iter().all(|p| {
                let s = f.peer(p);
                s.connected && !s.stale && s.age.is_some()
            })
        })
    })
    .await;
    let status = eu.peer("ap");
    assert_eq!(
        status.versions,
        BTreeMap::from([(service("cart"), 1), (service("pay"), 1)])
    );
    assert!(serde_json::to_value(&status).unwrap()["age_ms"].is_u64());
    for f in [&ap, &eu, &us] {
        assert_eq!(f.metrics.refused(RefusalReason::Tls), 0, "{}", f.name);
    }
    until(
        "eu's gauges show ap connected, fresh and aged",
        WAIT,
        async || {
            let text = exposition(&eu.metrics);
            text.contains(
                "waymark_federation_peer_connected{peer_region=\"ap\",peer_member=\"a1\"} 1",
            ) && text
                .contains("waymark_federation_peer_stale{peer_region=\"ap\",peer_member=\"a1\"} 0")
                && text.contains(
                    "waymark_federation_peer_age_seconds{peer_region=\"ap\",peer_member=\"a1\"}",
                )
                && text.contains("waymark_federation_region_stale{peer_region=\"ap\"} 0")
                && text.contains("waymark_federation_region_age_seconds{peer_region=\"ap\"}")
        },
    )
    .await;
    let text = exposition(&eu.metrics);
    for series in [
        "waymark_federation_messages_total{peer_region=\"ap\",peer_member=\"a1\",direction=\"received\",kind=\"entries\"}",
        "waymark_federation_messages_total{peer_region=\"us\",peer_member=\"a1\",direction=\"sent\",kind=\"digest\"}",
        "waymark_federation_reconciliations_total{peer_region=\"ap\",peer_member=\"a1\"}",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
    common::promtool_check(&text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_region_is_kept_stale_and_reconciled_when_it_returns() {
    // Goal: stopping ap's endpoint leaves every region's own entries alone, keeps ap's
    // entries (stale) in eu and us; on restart the divergence is reconciled and recorded.
    let pki = TestPkiDir::new(TD, &["ap", "eu", "us"]);
    let (mut ap, eu, us) = three_regions(&pki);
    converge(&[&ap, &eu, &us], &all_v1()).await;
    for f in [&ap, &eu, &us] {
        f.node().take_reconciliations();
    }

    let ap_addr = ap.stop().await;
    until(
        "eu and us report ap disconnected and stale",
        WAIT,
        async || {
            [&eu, &us].iter().all(|f| {
                let s = f.peer("ap");
                let r = f.region("ap");
                !s.connected && s.stale && s.last_error.is_some() && r.stale && r.links_up == 0
            })
        },
    )
    .await;
    until("eu's gauges show ap stale", WAIT, async || {
        let text = exposition(&eu.metrics);
        text.contains("waymark_federation_peer_stale{peer_region=\"ap\",peer_member=\"a1\"} 1")
            && text.contains("waymark_federation_region_stale{peer_region=\"ap\"} 1")
    })
    .await;
    for f in [&eu, &us] {
        assert_eq!(f.digest(), all_v1(), "{}: kept, not dropped", f.name);
        assert!(!f.peer(if f.name == "eu" { "us" } else { "eu" }).stale);
    }

    // While partitioned both sides move on: eu publishes cart v2 (reaching us), and ap,
    // its aggregates still in memory, publishes its own cart v2.
    eu.publish("cart", 2);
    ap.publish("cart", 2);
    let mut eu_us = all_v1();
    eu_us.insert((region("eu"), service("cart")), 2);
    converge(&[&eu, &us], &eu_us).await;
    assert_eq!(ap.digest()[&(region("eu"), service("cart"))], 1);

    ap.restart(ap_addr).await;
    let mut healed = eu_us.clone();
    healed.insert((region("ap"), service("cart")), 2);
    converge(&[&ap, &eu, &us], &healed).await;
    until(
        "eu and us report ap connected and fresh again",
        WAIT,
        async || {
            [&eu, &us].iter().all(|f| {
                let s = f.peer("ap");
                s.connected && !s.stale && !f.region("ap").stale
            })
        },
    )
    .await;

    // ap took eu's newer cart and eu took ap's: both recorded, with both versions, each
    // from the region itself (nothing is relayed through us).
    let ap_records = ap.node().take_reconciliations();
    let eu_records = eu.node().take_reconciliations();
    let took = |records: &[ReconciliationRecord], r: &str| {
        records.iter().any(|rec| {
            rec.peer == Some(region(r))
                && rec.changed().any(|e| {
                    e.region == region(r)
                        && e.service == service("cart")
                        && e.ours == Some(1)
                        && e.theirs == 2
                        && e.outcome == Outcome::TookTheirs
                })
        })
    };
    assert!(
        took(&ap_records, "eu"),
        "ap's record of eu's cart 1 → 2: {ap_records:#?}"
    );
    assert!(
        took(&eu_records, "ap"),
        "eu's record of ap's cart 1 → 2: {eu_records:#?}"
    );
    assert!(eu.metrics.reconciliations("ap", "a1") >= 1);
}

/// A raw client presenting `leaf` (any kind, any CA), trusting servers of our estate.
fn raw_client(pki: &TestPkiDir, leaf: &IssuedLeaf) -> quinn::ClientConfig {
    let verifier = pki.verifier(KindSet::only(IdentityKind::Authority));
    let tls = raw_client_config(Some(certified(leaf)), verifier, ALPN_WAYMARK);
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    quinn::ClientConfig::new(Arc::new(crypto))
}

/// Dials `addr`, opens the stream, sends a digest frame and waits for the first byte back.
async fn try_federate(addr: SocketAddr, config: quinn::ClientConfig) -> anyhow::Result<()> {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    endpoint.set_default_client_config(config);
    let conn = endpoint.connect(addr, "federation.invalid")?.await?;
    let (mut send, mut recv) = conn.open_bi().await?;
    let body = br#"{"kind":"digest","versions":[]}"#;
    send.write_all(&u32::try_from(body.len())?.to_be_bytes())
        .await?;
    send.write_all(body).await?;
    let mut prefix = [0u8; 4];
    recv.read_exact(&mut prefix).await?;
    conn.close(0u32.into(), b"done");
    endpoint.wait_idle().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_of_the_wrong_kind_or_trust_domain_are_refused() {
    // Goal: only authority certificates of our trust domain complete a federation link.
    let pki = TestPkiDir::new(TD, &["ap", "eu", "us"]);
    let other = TestPkiDir::new("elsewhere.test", &["ap"]);
    let unused: SocketAddr = NOT_DIALLED.parse().unwrap();
    let eu = Fed::start(&pki, "eu", &[("ap", unused)]);
    let foreign_san = pki.forge("ap", "spiffe://elsewhere.test/region/ap/authority/a1");
    let cases = [
        (
            "node",
            pki.leaf("region/ap/node/n1"),
            Some(RejectReason::WrongKind),
        ),
        (
            "workload",
            pki.leaf("region/ap/service/cart/instance/i1"),
            Some(RejectReason::WrongKind),
        ),
        (
            "authority of another trust domain, signed by our CA",
            foreign_san,
            Some(RejectReason::WrongTrustDomain),
        ),
        (
            "authority of another estate's CA",
            other.leaf("region/ap/authority/a1"),
            None,
        ),
    ];
    for (name, leaf, reason) in cases {
        let refused_before = eu.metrics.refused(RefusalReason::Tls);
        let rejected_before = reason.map(|r| eu.certs.rejected(r, RejectSource::Peer));
        let result = tokio::time::timeout(WAIT, try_federate(eu.addr(), raw_client(&pki, &leaf)))
            .await
            .expect("refused in time, not hung");
        assert!(result.is_err(), "{name}: a link was established");
        until(
            &format!("{name}: the refusal is counted"),
            WAIT,
            async || eu.metrics.refused(RefusalReason::Tls) == refused_before + 1,
        )
        .await;
        if let (Some(reason), Some(before)) = (reason, rejected_before) {
            assert_eq!(
                eu.certs.rejected(reason, RejectSource::Peer),
                before + 1,
                "{name}: counted as {reason}"
            );
        }
    }
    assert!(
        eu.peer("ap").age.is_none(),
        "no rogue client was heard as ap"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorities_of_our_own_an_unknown_or_the_dialled_region_are_refused() {
    // Goal: a valid authority certificate is not enough; its region must be a peer that
    // dials us. Each refusal closes the connection with an application error and counts.
    let pki = TestPkiDir::new(TD, &["ap", "eu", "sa", "us"]);
    let unused: SocketAddr = NOT_DIALLED.parse().unwrap();
    let eu = Fed::start(&pki, "eu", &[("ap", unused), ("us", unused)]);
    let cases = [
        ("region/eu/authority/a2", RefusalReason::OwnRegion),
        ("region/sa/authority/a1", RefusalReason::UnknownRegion),
        ("region/us/authority/a1", RefusalReason::WrongDirection),
    ];
    for (path, reason) in cases {
        let config =
            quic_client_config(&pki.live(path), authorities(), CertMetrics::new()).unwrap();
        let result = tokio::time::timeout(WAIT, try_federate(eu.addr(), config))
            .await
            .expect("refused in time, not hung");
        let err = format!("{:#}", result.expect_err(path));
        let close = format!("closed by peer: {} (code 1)", reason.as_str());
        assert!(err.contains(&close), "{path}: not closed as refused: {err}");
        assert_eq!(eu.metrics.refused(reason), 1, "{path}: counted as {reason}");
    }
    assert_eq!(eu.metrics.refused(RefusalReason::Tls), 0);
}

/// eu < us, so eu's members dial: us's two members start first, then eu's two, each
/// configured with both members of the other region. Returns (eu/a1, eu/a2, us/a1, us/a2).
fn two_regions_of_two_members(pki: &TestPkiDir) -> (Fed, Fed, Fed, Fed) {
    let unused: SocketAddr = NOT_DIALLED.parse().unwrap();
    let eu_members = [("eu", "a1", unused), ("eu", "a2", unused)];
    let us_a1 = Fed::member(pki, "us", "a1", &eu_members);
    let us_a2 = Fed::member(pki, "us", "a2", &eu_members);
    let us_members = [("us", "a1", us_a1.addr()), ("us", "a2", us_a2.addr())];
    let eu_a1 = Fed::member(pki, "eu", "a1", &us_members);
    let eu_a2 = Fed::member(pki, "eu", "a2", &us_members);
    (eu_a1, eu_a2, us_a1, us_a2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_links_to_every_peer_member_and_a_region_goes_stale_only_when_all_are_silent()
{
    // Goal: with two authority members per region, each member keeps its own link to each
    // peer member (none replaces another), and a peer region stays fresh while any of its
    // members speaks; once all are silent it is stale and its entries are kept.
    let pki = TestPkiDir::new(TD, &["eu", "us"]);
    let (eu_a1, eu_a2, mut us_a1, mut us_a2) = two_regions_of_two_members(&pki);
    let all = [&eu_a1, &eu_a2, &us_a1, &us_a2];
    let other = |f: &Fed| if f.name == "eu" { "us" } else { "eu" };
    let v1 = versions(&[
        ("eu", "cart", 1),
        ("eu", "pay", 1),
        ("us", "cart", 1),
        ("us", "pay", 1),
    ]);
    converge(&all, &v1).await;
    until(
        "every member has both links to the other region up and fresh",
        WAIT,
        async || {
            all.iter().all(|f| {
                let r = f.region(other(f));
                r.links == 2 && r.links_up == 2 && !r.stale
            })
        },
    )
    .await;
    for f in all {
        for link in f.node().status() {
            assert!(
                link.connected && link.last_error.is_none(),
                "{}/{}: link to {}/{} was not steady: {link:?}",
                f.name,
                f.member,
                link.region,
                link.member
            );
        }
        let region = f.region(other(f));
        assert_eq!(
            region.versions,
            BTreeMap::from([(service("cart"), 1), (service("pay"), 1)])
        );
        let json = serde_json::to_value(&region).unwrap();
        assert!(json["age_ms"].is_u64() && json["links_up"] == 2, "{json}");
    }
    until(
        "eu/a1's gauges show both us links and the us region",
        WAIT,
        async || {
            let text = exposition(&eu_a1.metrics);
            ["a1", "a2"].iter().all(|m| {
                text.contains(&format!(
                    "waymark_federation_peer_connected{{peer_region=\"us\",peer_member=\"{m}\"}} 1"
                ))
            }) && text.contains("waymark_federation_region_stale{peer_region=\"us\"} 0")
        },
    )
    .await;
    common::promtool_check(&exposition(&eu_a1.metrics));

    // us/a1 goes away; us/a2 alone publishes cart v2, which reaches both eu members over
    // their links to us/a2.
    us_a1.stop().await;
    us_a2.publish("cart", 2);
    let mut v2 = v1.clone();
    v2.insert((region("us"), service("cart")), 2);
    converge(&[&eu_a1, &eu_a2, &us_a2], &v2).await;
    until("eu's links to us/a1 are down and stale", WAIT, async || {
        [&eu_a1, &eu_a2].iter().all(|f| {
            let link = f.link("us", "a1");
            !link.connected && link.stale
        })
    })
    .await;
    for f in [&eu_a1, &eu_a2] {
        let r = f.region("us");
        assert!(
            !r.stale,
            "{}/{}: us is fresh through a2: {r:?}",
            f.name, f.member
        );
        assert_eq!((r.links_up, r.links), (1, 2));
        assert!(r.age.unwrap() <= STALE_AFTER, "{r:?}");
    }
    until(
        "eu/a1's gauges show the us/a1 link stale",
        WAIT,
        async || {
            exposition(&eu_a1.metrics)
                .contains("waymark_federation_peer_stale{peer_region=\"us\",peer_member=\"a1\"} 1")
        },
    )
    .await;
    // Written in the same refresh as the link's gauge above, or a later one.
    let text = exposition(&eu_a1.metrics);
    assert!(
        text.contains("waymark_federation_region_stale{peer_region=\"us\"} 0"),
        "{text}"
    );

    // us/a2 goes away too: now the region is stale, and what it published is kept.
    us_a2.stop().await;
    until("eu reports us stale with no link up", WAIT, async || {
        [&eu_a1, &eu_a2].iter().all(|f| {
            let r = f.region("us");
            r.stale && r.links_up == 0
        })
    })
    .await;
    until(
        "eu/a1's gauge shows the us region stale",
        WAIT,
        async || {
            exposition(&eu_a1.metrics)
                .contains("waymark_federation_region_stale{peer_region=\"us\"} 1")
        },
    )
    .await;
    for f in [&eu_a1, &eu_a2] {
        assert_eq!(f.digest(), v2, "{}/{}: kept, not dropped", f.name, f.member);
        assert_eq!(
            f.region("us").versions,
            BTreeMap::from([(service("cart"), 2), (service("pay"), 1)])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfigured_member_of_a_peer_region_is_refused_and_the_configured_one_kept() {
    // Goal: a valid authority of a peer region that is not one of its configured members is
    // refused as `unknown_member`, and does not disturb the configured member's link.
    let pki = TestPkiDir::new(TD, &["ap", "eu"]);
    let unused: SocketAddr = NOT_DIALLED.parse().unwrap();
    let eu = Fed::start(&pki, "eu", &[("ap", unused)]);
    let ap = Fed::start(&pki, "ap", &[("eu", eu.addr())]);
    let v1 = versions(&[
        ("ap", "cart", 1),
        ("ap", "pay", 1),
        ("eu", "cart", 1),
        ("eu", "pay", 1),
    ]);
    converge(&[&ap, &eu], &v1).await;
    until("eu's link to ap/a1 is up", WAIT, async || {
        eu.peer("ap").connected
    })
    .await;

    let config = quic_client_config(
        &pki.live("region/ap/authority/a9"),
        authorities(),
        CertMetrics::new(),
    )
    .unwrap();
    let result = tokio::time::timeout(WAIT, try_federate(eu.addr(), config))
        .await
        .expect("refused in time, not hung");
    let err = format!("{:#}", result.expect_err("ap/a9 was admitted"));
    assert!(
        err.contains("closed by peer: unknown_member (code 1)"),
        "not closed as refused: {err}"
    );
    assert_eq!(eu.metrics.refused(RefusalReason::UnknownMember), 1);
    let text = exposition(&eu.metrics);
    assert!(
        text.contains("waymark_federation_refused_total{reason=\"unknown_member\"} 1"),
        "{text}"
    );
    let link = eu.peer("ap");
    assert!(
        link.connected && link.last_error.is_none(),
        "ap/a1's link was disturbed: {link:?}"
    );
    assert_eq!(eu.node().status().len(), 1, "no link was made for ap/a9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialled_server_of_the_right_region_but_another_member_is_refused() {
    // Goal: the dialer checks the member as well as the region: ap is told eu/a1 listens
    // where eu/a2 does, and refuses that server every time it dials, learning nothing.
    let pki = TestPkiDir::new(TD, &["ap", "eu"]);
    let unused: SocketAddr = NOT_DIALLED.parse().unwrap();
    let eu_a2 = Fed::member(&pki, "eu", "a2", &[("ap", "a1", unused)]);
    let ap = Fed::start(&pki, "ap", &[("eu", eu_a2.addr())]);
    until("ap has refused eu/a2 on two dials", WAIT, async || {
        ap.metrics.refused(RefusalReason::UnexpectedMember) >= 2
    })
    .await;
    assert_eq!(ap.metrics.refused(RefusalReason::UnexpectedRegion), 0);
    let link = ap.peer("eu");
    assert!(!link.connected && link.age.is_none(), "{link:?}");
    let error = link.last_error.unwrap_or_default();
    assert!(
        error.contains("dialled member a1 of region eu but reached")
            && error.contains("/region/eu/authority/a2"),
        "{error}"
    );
    assert!(
        ap.digest().keys().all(|(r, _)| *r == region("ap")),
        "nothing of eu's reached ap"
    );
}

/// Writes one federation frame (length prefix, JSON), as a link's writer does.
async fn write_message(send: &mut quinn::SendStream, message: &Message) {
    let body = serde_json::to_vec(message).unwrap();
    send.write_all(&u32::try_from(body.len()).unwrap().to_be_bytes())
        .await
        .unwrap();
    send.write_all(&body).await.unwrap();
}

/// Reads one federation frame.
async fn read_message(recv: &mut quinn::RecvStream) -> Message {
    let mut prefix = [0u8; 4];
    recv.read_exact(&mut prefix).await.unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(prefix) as usize];
    recv.read_exact(&mut body).await.unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_speaks_only_for_its_own_region_on_its_link() {
    // Goal: on ap's admitted link, eu asks only about ap and answers only with eu's own
    // entries (not us's, which it holds); a batch from ap naming us (a third region) or eu
    // is refused whole, counted as foreign_entry, and changes nothing; ap's own batch is
    // then merged on the same link.
    let pki = TestPkiDir::new(TD, &["ap", "eu", "us"]);
    let unused: SocketAddr = NOT_DIALLED.parse().unwrap();
    let eu = Fed::start(&pki, "eu", &[("ap", unused), ("us", unused)]);
    eu.aggregates
        .lock()
        .unwrap()
        .merge_from(&region("eu"), &region("us"), vec![entry("us", "cart", 3)])
        .unwrap();
    let before = eu.digest();

    // ap/a1, a configured peer that dials eu, speaking the link protocol by hand.
    let config = quic_client_config(
        &pki.live("region/ap/authority/a1"),
        authorities(),
        CertMetrics::new(),
    )
    .unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(config);
    let conn = endpoint
        .connect(eu.addr(), "federation.invalid")
        .unwrap()
        .await
        .unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    write_message(&mut send, &Message::Digest { versions: vec![] }).await;
    let mut answered = Vec::new();
    while answered.len() < 2 {
        match tokio::time::timeout(WAIT, read_message(&mut recv))
            .await
            .unwrap()
        {
            Message::Digest { versions } => assert!(
                versions.iter().all(|((r, _), _)| *r == region("ap")),
                "eu's digest to ap names other regions: {versions:?}"
            ),
            Message::Entries { entries } => answered.extend(entries),
        }
    }
    let answered: Vec<_> = answered
        .iter()
        .map(|e| (e.region.as_str(), e.service.as_str()))
        .collect();
    assert_eq!(answered, [("eu", "cart"), ("eu", "pay")]);

    for (n, claimed) in [entry("us", "pay", 9), entry("eu", "cart", 9)]
        .into_iter()
        .enumerate()
    {
        let batch = Message::Entries {
            entries: vec![entry("ap", "cart", 1), claimed],
        };
        write_message(&mut send, &batch).await;
        until("the foreign batch is counted", WAIT, async || {
            eu.metrics.refused(RefusalReason::ForeignEntry) == n as u64 + 1
        })
        .await;
        assert_eq!(eu.digest(), before, "the refused batch changed nothing");
    }
    write_message(
        &mut send,
        &Message::Entries {
            entries: vec![entry("ap", "cart", 1)],
        },
    )
    .await;
    let mut merged = before.clone();
    merged.insert((region("ap"), service("cart")), 1);
    until("ap's own batch is merged", WAIT, async || {
        eu.digest() == merged
    })
    .await;
    assert!(eu.peer("ap").connected, "the link stayed up");
    assert_eq!(eu.metrics.refused(RefusalReason::ForeignEntry), 2);
    let text = exposition(&eu.metrics);
    assert!(
        text.contains("waymark_federation_refused_total{reason=\"foreign_entry\"} 2"),
        "{text}"
    );
    conn.close(0u32.into(), b"done");
    endpoint.wait_idle().await;
}
