//! What callers route to, recorded over time: each real Envoy's admin `/clusters` page,
//! and synthetic callers — Delta xDS subscriptions (the xds-edge protocol, as a sidecar
//! opens them) to a node agent's local xDS — decoded into the same shape. A drill reads the
//! logs afterwards with pure functions ([`stop_time`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use prost::Message as _;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use waymark_xds::translate::TYPE_ENDPOINT;

use crate::traffic::{self, ms};

/// One endpoint as a caller holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Seen {
    /// Its load-balancing weight (1 when the caller states none).
    pub weight: u32,
    /// Whether the caller's view routes to it (healthy, degraded or unknown; not
    /// unhealthy or draining). Envoy's own outlier ejection is not counted: it is the
    /// caller's local guard, not the plane's view.
    pub usable: bool,
}

/// Endpoint address (`ip:port`) → how the caller holds it.
pub type CallerView = BTreeMap<String, Seen>;

/// A caller's view each time it changed: (ms since the drill's epoch, the view).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ViewLog {
    pub caller: String,
    pub changes: Vec<(u64, CallerView)>,
}

impl ViewLog {
    /// Records `view` at `t_ms` if it differs from the last one.
    pub fn record(&mut self, t_ms: u64, view: CallerView) {
        if self.changes.last().map(|(_, v)| v) != Some(&view) {
            self.changes.push((t_ms, view));
        }
    }

    /// The view in force at `t_ms` (empty before the first record).
    pub fn at(&self, t_ms: u64) -> CallerView {
        self.changes
            .iter()
            .take_while(|(t, _)| *t <= t_ms)
            .last()
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }
}

/// What counts as "no longer using" an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// Gone from the view or not routed.
    Removed,
    /// Removed, or its weight lowered below what it was at the fault.
    Shifted,
}

/// The first time at or after `fault_ms` when `log`'s caller stopped using `addr` in the
/// sense of `stop`, as ms after the fault; `None` if it never did (or never held it).
pub fn stop_time(log: &ViewLog, addr: &str, fault_ms: u64, stop: Stop) -> Option<u64> {
    let before = log.at(fault_ms).get(addr).copied()?;
    if !before.usable {
        return None;
    }
    let stopped = |v: &CallerView| match (v.get(addr), stop) {
        (None, _) => true,
        (Some(s), _) if !s.usable => true,
        (Some(s), Stop::Shifted) => s.weight < before.weight,
        (Some(_), Stop::Removed) => false,
    };
    let at_fault = log.at(fault_ms);
    if stopped(&at_fault) {
        return Some(0);
    }
    log.changes
        .iter()
        .filter(|(t, _)| *t > fault_ms)
        .find(|(_, v)| stopped(v))
        .map(|(t, _)| t - fault_ms)
}

/// The endpoints of `cluster` in an Envoy admin `/clusters` page.
pub fn envoy_view(page: &str, cluster: &str) -> CallerView {
    let mut weights: BTreeMap<String, u32> = BTreeMap::new();
    let mut flags: BTreeMap<String, String> = BTreeMap::new();
    for line in page.lines() {
        let parts: Vec<&str> = line.split("::").collect();
        let [name, addr, stat, value] = parts[..] else {
            continue;
        };
        if name != cluster || addr.parse::<SocketAddr>().is_err() {
            continue;
        }
        match stat {
            "weight" => {
                weights.insert(addr.to_owned(), value.trim().parse().unwrap_or(1));
            }
            "health_flags" => {
                flags.insert(addr.to_owned(), value.trim().to_owned());
            }
            _ => {}
        }
    }
    flags
        .into_iter()
        .map(|(addr, f)| {
            let usable = !(f.contains("failed_eds_health")
                || f.contains("eds_status_draining")
                || f.contains("pending_dynamic_removal"));
            let weight = weights.get(&addr).copied().unwrap_or(1);
            (addr, Seen { weight, usable })
        })
        .collect()
}

/// The endpoints of a load assignment.
pub fn assignment_view(cla: &ClusterLoadAssignment) -> CallerView {
    let mut out = CallerView::new();
    for locality in &cla.endpoints {
        for lb in &locality.lb_endpoints {
            let Some(HostIdentifier::Endpoint(e)) = &lb.host_identifier else {
                continue;
            };
            let Some(AddressKind::SocketAddress(sa)) =
                e.address.as_ref().and_then(|a| a.address.as_ref())
            else {
                continue;
            };
            let Some(PortSpecifier::PortValue(port)) = sa.port_specifier else {
                continue;
            };
            // UNKNOWN 0, HEALTHY 1, DEGRADED 5 are routed; UNHEALTHY, DRAINING, TIMEOUT not.
            let usable = matches!(lb.health_status, 0 | 1 | 5);
            let weight = lb.load_balancing_weight.map_or(1, |w| w.value);
            out.insert(format!("{}:{port}", sa.address), Seen { weight, usable });
        }
    }
    out
}

/// Logs filled by background watchers until [`Watchers::stop`].
pub struct Watchers {
    logs: Vec<Arc<Mutex<ViewLog>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Default for Watchers {
    fn default() -> Self {
        Self::new()
    }
}

impl Watchers {
    /// No watchers yet.
    pub fn new() -> Self {
        Self {
            logs: Vec::new(),
            tasks: Vec::new(),
        }
    }

    fn log(&mut self, caller: String) -> Arc<Mutex<ViewLog>> {
        let log = Arc::new(Mutex::new(ViewLog {
            caller,
            changes: Vec::new(),
        }));
        self.logs.push(Arc::clone(&log));
        log
    }

    /// Polls an Envoy's admin `/clusters` every `every` for `cluster`.
    pub fn envoy(
        &mut self,
        caller: String,
        admin: SocketAddr,
        cluster: String,
        every: Duration,
        epoch: Instant,
    ) {
        let log = self.log(caller);
        self.tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Ok(r) = traffic::get(admin, "/clusters", Duration::from_secs(1)).await else {
                    continue;
                };
                if r.status != 200 {
                    continue;
                }
                let view = envoy_view(&r.body, &cluster);
                let t = ms(epoch.elapsed());
                log.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .record(t, view);
            }
        }));
    }

    /// Opens a Delta xDS subscription to `service`'s load assignment at `xds` as node
    /// `caller` in `zone`, ACKing every response, re-subscribing after a second if the
    /// stream ends.
    pub fn subscriber(
        &mut self,
        caller: String,
        xds: SocketAddr,
        zone: String,
        service: String,
        epoch: Instant,
    ) {
        let log = self.log(caller.clone());
        self.tasks.push(tokio::spawn(async move {
            loop {
                // A lost stream shows in the log as a gap; the drill's verdict reads the log.
                let _ = subscribe(&caller, xds, &zone, &service, &log, epoch).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
    }

    /// Stops every watcher and returns the logs, in the order they were added.
    pub fn stop(self) -> Vec<ViewLog> {
        for t in &self.tasks {
            t.abort();
        }
        self.logs
            .iter()
            .map(|l| l.lock().unwrap_or_else(PoisonError::into_inner).clone())
            .collect()
    }

    /// Logs so far (the watchers keep running).
    pub fn snapshot(&self) -> Vec<ViewLog> {
        self.logs
            .iter()
            .map(|l| l.lock().unwrap_or_else(PoisonError::into_inner).clone())
            .collect()
    }
}

impl Drop for Watchers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn subscribe(
    caller: &str,
    xds: SocketAddr,
    zone: &str,
    service: &str,
    log: &Mutex<ViewLog>,
    epoch: Instant,
) -> anyhow::Result<()> {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{xds}")).await?;
    let (tx, rx) = mpsc::channel(4);
    let node = Node {
        id: caller.to_owned(),
        cluster: "drill".into(),
        locality: Some(Locality {
            zone: zone.to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    };
    tx.send(DeltaDiscoveryRequest {
        node: Some(node),
        type_url: TYPE_ENDPOINT.into(),
        resource_names_subscribe: vec![service.to_owned()],
        ..Default::default()
    })
    .await?;
    let mut inbound = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(resp) = inbound.message().await? {
        let t = ms(epoch.elapsed());
        let mut view = None;
        for r in &resp.resources {
            if r.name != service {
                continue;
            }
            if let Some(any) = &r.resource
                && let Ok(cla) = ClusterLoadAssignment::decode(any.value.as_slice())
            {
                view = Some(assignment_view(&cla));
            }
        }
        if resp.removed_resources.iter().any(|n| n == service) {
            view = Some(CallerView::new());
        }
        if let Some(v) = view {
            log.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(t, v);
        }
        tx.send(DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce,
            ..Default::default()
        })
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(weight: u32, usable: bool) -> Seen {
        Seen { weight, usable }
    }

    fn log(changes: &[(u64, &[(&str, Seen)])]) -> ViewLog {
        let mut l = ViewLog::default();
        for (t, v) in changes {
            l.record(*t, v.iter().map(|(a, s)| ((*a).to_owned(), *s)).collect());
        }
        l
    }

    #[test]
    fn a_removal_is_timed_from_the_fault() {
        let l = log(&[
            (0, &[("a", seen(100, true)), ("b", seen(100, true))]),
            (1_500, &[("b", seen(100, true))]),
        ]);
        assert_eq!(stop_time(&l, "a", 1_000, Stop::Removed), Some(500));
        assert_eq!(stop_time(&l, "b", 1_000, Stop::Removed), None);
        // Not held at the fault: nothing to stop.
        assert_eq!(stop_time(&l, "c", 1_000, Stop::Removed), None);
    }

    #[test]
    fn a_lowered_weight_is_a_shift_but_not_a_removal() {
        let l = log(&[
            (0, &[("a", seen(100, true))]),
            (2_000, &[("a", seen(50, true))]),
            (4_000, &[("a", seen(50, false))]),
        ]);
        assert_eq!(stop_time(&l, "a", 1_000, Stop::Shifted), Some(1_000));
        assert_eq!(stop_time(&l, "a", 1_000, Stop::Removed), Some(3_000));
    }

    #[test]
    fn unchanged_views_are_not_recorded_twice() {
        let mut l = ViewLog::default();
        let v: CallerView = [("a".to_owned(), seen(1, true))].into_iter().collect();
        l.record(1, v.clone());
        l.record(2, v);
        assert_eq!(l.changes.len(), 1);
        assert!(l.at(0).is_empty());
        assert_eq!(l.at(5).len(), 1);
    }

    #[test]
    fn reads_envoys_clusters_page() {
        let page = "web::observability_name::web\n\
                    web::127.0.0.1:4001::weight::100\n\
                    web::127.0.0.1:4001::health_flags::healthy\n\
                    web::127.0.0.1:4002::weight::50\n\
                    web::127.0.0.1:4002::health_flags::/failed_outlier_check\n\
                    web::127.0.0.1:4003::weight::1\n\
                    web::127.0.0.1:4003::health_flags::/failed_eds_health\n\
                    other::127.0.0.1:9::health_flags::healthy\n";
        let v = envoy_view(page, "web");
        assert_eq!(v.len(), 3);
        assert_eq!(v["127.0.0.1:4001"], seen(100, true));
        // Envoy's own outlier ejection is not the plane's view.
        assert_eq!(v["127.0.0.1:4002"], seen(50, true));
        assert_eq!(v["127.0.0.1:4003"], seen(1, false));
    }
}
