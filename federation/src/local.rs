//! This region's aggregate of a service, derived from the views its authority published.
//!
//! Every authority member holds the same committed views, so every member derives the same
//! content at the same version — which is what lets each member publish independently
//! without ever sending two contents under one version (a conflict
//! [`RegionAggregates::merge_from`](crate::aggregate::RegionAggregates::merge_from) refuses).
//!
//! Each endpoint is taken from the view of its own zone, where it is tier 0 and carries its
//! published weight and status; endpoints of peer regions (tier 2) are never re-exported,
//! so aggregates cannot loop between regions. The version is the highest version among
//! the service's views: the region's counter is monotonic, so it advances whenever any of
//! them changes.

use waymark_core::view::{ReleasedView, Tier};

use crate::aggregate::{AggregateEndpoint, ServiceAggregate};

/// The aggregate of one service from its released views (one per caller zone), with its
/// version; `None` when there is no view.
pub fn local_aggregate<'a>(
    views: impl IntoIterator<Item = &'a ReleasedView>,
) -> Option<(u64, ServiceAggregate)> {
    let mut version = None;
    let mut endpoints = Vec::new();
    for released in views {
        version = version.max(Some(released.version.0));
        let zone = &released.view.key.zone;
        endpoints.extend(
            released
                .view
                .endpoints
                .values()
                .filter(|e| e.tier == Tier::Local && &e.zone == zone)
                .map(|e| AggregateEndpoint {
                    instance: e.instance.clone(),
                    address: e.address,
                    zone: e.zone.clone(),
                    weight: e.weight,
                    status: e.status,
                    verdict: e.verdict,
                }),
        );
    }
    endpoints.sort();
    endpoints.dedup_by(|a, b| a.instance == b.instance);
    version.map(|v| (v, ServiceAggregate { endpoints }))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    use waymark_core::eligibility::Verdict;
    use waymark_core::model::{Address, InstanceId, RegionName, ServiceName, ZoneName};
    use waymark_core::units::Weight;
    use waymark_core::view::{EndpointStatus, Markers, Version, View, ViewEndpoint, ViewKey};

    use super::*;

    fn endpoint(id: &str, region: &str, zone: &str, tier: Tier) -> ViewEndpoint {
        ViewEndpoint {
            instance: InstanceId::try_new(id).unwrap(),
            address: Address {
                ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, id.len() as u8)),
                port: 80,
            },
            region: RegionName::try_new(region).unwrap(),
            zone: ZoneName::try_new(zone).unwrap(),
            tier,
            priority: tier.number().into(),
            weight: Weight::DEFAULT,
            status: EndpointStatus::Eligible,
            verdict: Verdict::Eligible,
            tags: Arc::default(),
            metadata: Arc::default(),
            capability: None,
        }
    }

    fn view(zone: &str, version: u64, endpoints: Vec<ViewEndpoint>) -> ReleasedView {
        ReleasedView {
            version: Version(version),
            view: View {
                key: ViewKey {
                    service: ServiceName::try_new("web").unwrap(),
                    zone: ZoneName::try_new(zone).unwrap(),
                },
                endpoints: endpoints
                    .into_iter()
                    .map(|e| (e.instance.clone(), e))
                    .collect::<BTreeMap<_, _>>()
                    .into(),
                markers: Markers::default(),
            },
        }
    }

    #[test]
    fn each_endpoint_comes_from_its_own_zone_and_peers_are_not_reexported() {
        let a = view(
            "a",
            7,
            vec![
                endpoint("a-1", "eu", "a", Tier::Local),
                endpoint("b-1", "eu", "b", Tier::Region),
                endpoint("us-1", "us", "x", Tier::Remote),
            ],
        );
        let b = view(
            "b",
            9,
            vec![
                endpoint("a-1", "eu", "a", Tier::Region),
                endpoint("b-1", "eu", "b", Tier::Local),
                endpoint("us-1", "us", "x", Tier::Remote),
            ],
        );
        let (version, aggregate) = local_aggregate([&a, &b]).unwrap();
        assert_eq!(version, 9, "the newest view's version");
        let ids: Vec<_> = aggregate
            .endpoints
            .iter()
            .map(|e| e.instance.as_str())
            .collect();
        assert_eq!(ids, ["a-1", "b-1"]);
    }

    #[test]
    fn the_same_views_in_any_order_give_the_same_aggregate() {
        let a = view("a", 3, vec![endpoint("a-1", "eu", "a", Tier::Local)]);
        let b = view("b", 4, vec![endpoint("b-1", "eu", "b", Tier::Local)]);
        assert_eq!(local_aggregate([&a, &b]), local_aggregate([&b, &a]));
        assert_eq!(local_aggregate(std::iter::empty()), None);
    }
}
