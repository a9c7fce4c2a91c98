//! Fixtures shared by the core's tests: names, instances and a clock anchor.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use crate::contract::{CapabilityProfile, HealthContract, ValidContract};
use crate::model::*;
use crate::units::Weight;

/// One real instant to offset from; tests only ever add to it.
#[allow(clippy::disallowed_methods)] // the single clock read in the core's tests
pub(crate) fn t0() -> Instant {
    Instant::now()
}

pub(crate) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub(crate) fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

pub(crate) fn svc(name: &str) -> ServiceName {
    ServiceName::try_new(name).unwrap()
}

pub(crate) fn iid(name: &str) -> InstanceId {
    InstanceId::try_new(name).unwrap()
}

pub(crate) fn zone(name: &str) -> ZoneName {
    ZoneName::try_new(name).unwrap()
}

pub(crate) fn node(name: &str) -> NodeName {
    NodeName::try_new(name).unwrap()
}

pub(crate) fn region() -> RegionName {
    RegionName::try_new("eu-west").unwrap()
}

pub(crate) fn instance(service: &str, id: &str, zone_name: &str, n: u8) -> Instance {
    Instance {
        id: iid(id),
        service: svc(service),
        locality: Locality {
            region: region(),
            zone: zone(zone_name),
            node: node(&format!("node-{zone_name}")),
        },
        address: Address {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)),
            port: 8080,
        },
        origin: Origin::Orchestrator,
        weight: Weight::DEFAULT,
        tags: BTreeSet::new(),
        metadata: BTreeMap::new(),
    }
}

pub(crate) fn contract_with(profile: CapabilityProfile) -> ValidContract {
    let mut c = HealthContract {
        profile,
        ..HealthContract::default()
    };
    if !profile.probe {
        c.probe = None;
    }
    c.validate().unwrap()
}

/// [`contract_with`] `profile`, with callers' outcomes primary at the default threshold
/// (three callers, 100 requests an interval, probes every 30 s meanwhile).
pub(crate) fn passive_primary(profile: CapabilityProfile) -> ValidContract {
    let mut c = HealthContract {
        profile,
        ..HealthContract::default()
    };
    if !profile.probe {
        c.probe = None;
    }
    c.passive.primary = Some(crate::contract::PassivePrimary::default());
    c.validate().unwrap()
}

pub(crate) fn prober() -> Reporter {
    Reporter::Node(node("prober-a"))
}

pub(crate) fn caller(n: u32) -> Reporter {
    Reporter::Node(node(&format!("caller-{n}")))
}

pub(crate) fn probe(id: &InstanceId, health: Health) -> Sample {
    Sample {
        instance: id.clone(),
        reporter: prober(),
        observation: Observation::Probe {
            health,
            detail: None,
        },
    }
}

pub(crate) fn passive(id: &InstanceId, from: u32, requests: u64, errors: u64) -> Sample {
    Sample {
        instance: id.clone(),
        reporter: caller(from),
        observation: Observation::Passive { requests, errors },
    }
}

pub(crate) fn self_report(id: &InstanceId, report: SelfReport) -> Sample {
    Sample {
        instance: id.clone(),
        reporter: Reporter::Instance(id.clone()),
        observation: Observation::SelfReport(report),
    }
}
