//! Views for tests: one endpoint builder and one released-view builder for service `pay`,
//! with only the fields tests vary as arguments.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use waymark_core::eligibility::Verdict;
use waymark_core::model::{Address, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_core::units::Weight;
use waymark_core::view::{
    EndpointStatus, Markers, ReleasedView, Tier, Version, View, ViewEndpoint, ViewKey,
};

/// An endpoint of region `eu`: tier follows the priority (0 local, else region).
pub fn endpoint(
    instance: &str,
    addr: SocketAddr,
    zone: &str,
    priority: u32,
    weight: u32,
    status: EndpointStatus,
) -> ViewEndpoint {
    ViewEndpoint {
        instance: InstanceId::try_new(instance).expect("test instance names are valid"),
        address: Address {
            ip: addr.ip(),
            port: addr.port(),
        },
        region: RegionName::try_new("eu").expect("valid"),
        zone: ZoneName::try_new(zone).expect("test zone names are valid"),
        tier: if priority == 0 {
            Tier::Local
        } else {
            Tier::Region
        },
        priority,
        weight: Weight::new(weight),
        status,
        verdict: Verdict::Eligible,
        tags: Arc::default(),
        metadata: Arc::default(),
        capability: None,
    }
}

/// The view of `pay` for callers in `zone`, at `version`.
pub fn released(
    version: u64,
    zone: &str,
    endpoints: impl IntoIterator<Item = ViewEndpoint>,
    markers: Markers,
) -> ReleasedView {
    let key = ViewKey {
        service: ServiceName::try_new("pay").expect("valid"),
        zone: ZoneName::try_new(zone).expect("test zone names are valid"),
    };
    let endpoints: BTreeMap<_, _> = endpoints
        .into_iter()
        .map(|e| (e.instance.clone(), e))
        .collect();
    ReleasedView {
        version: Version(version),
        view: View {
            key,
            endpoints: endpoints.into(),
            markers,
        },
    }
}
