//! The DNS table: the served `ClusterLoadAssignment`s as names and records. Pure: no I/O,
//! no clocks.
//!
//! Names, under the served domain (`waymark.` by default; matched without case):
//!
//! | name | answers |
//! | --- | --- |
//! | `<service>.service.waymark.` | A, AAAA, SRV of the service's answered endpoints |
//! | `<tag>.<service>.service.waymark.` | the same, only endpoints carrying `tag` |
//! | `<service>.service.<zone>.zone.waymark.` | the same, only endpoints in `zone` |
//! | `<tag>.<service>.service.<zone>.zone.waymark.` | both restrictions |
//! | `<hex>.addr.waymark.` | A or AAAA of the address spelled in hex (SRV targets) |
//! | `waymark.` | SOA |
//!
//! **Which endpoints.** Exactly those Envoy routes to from the same assignment: health
//! `HEALTHY`, `DEGRADED` or `UNKNOWN` and a weight above zero (absent = 1); never `DRAINING`,
//! `UNHEALTHY` or `TIMEOUT`. Under a zone's fraction guard (`health_disregarded`) the view
//! already carries the full set as `HEALTHY`, so the full set is answered. Of those, after the
//! tag and zone restrictions, only the lowest-numbered EDS priority that has any is answered:
//! priorities are failover tiers, and a DNS client cannot fail over by itself. (Envoy spills
//! over gradually, by the overprovisioning factor, once a tier is partly unhealthy; waymark
//! withdraws rather than marks unhealthy, so "all of the best tier" is the closest a
//! stateless answer gets.)
//!
//! **SRV**, as Consul answers it: one record per endpoint, priority = its EDS priority,
//! weight = its `load_balancing_weight` (scaled down proportionally when above 65 535), its
//! port, target `<hex>.addr.<domain>`; the targets' addresses ride in the additional section.
//!
//! **Negative answers.** An unknown service, or a name of no known form, is `NXDOMAIN`; a
//! known service with nothing to answer (no routable endpoint, none with the tag or in the
//! zone, or none of the asked type) is NODATA, as Consul does. Both carry the SOA, whose TTL
//! and minimum are the negative TTL. Names that exist only as ancestors of answered names
//! (`service.waymark.`, `b.service.waymark.` when `a.b` is a service) are NODATA too, never
//! `NXDOMAIN`, so resolvers that cut below an `NXDOMAIN` (RFC 8020) lose nothing.
//!
//! **Ambiguity.** Service names, tags and zones may contain dots. The longest service name
//! that is known wins: in `a.b.c.service.`, service `a.b.c` beats tag `a` on service `b.c`,
//! which beats tag `a.b` on service `c`. Names that differ only in case are one name.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Metadata};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, LbEndpoint};
use envoy_types::pb::google::protobuf::value::Kind;
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tracing::debug;
use waymark_xds::translate::{endpoint_socket, metadata_field};

use super::origin::{DnsOrigin, parse_hex_label};

/// Everything the DNS server answers, immutable once built. Build one per served view
/// change with [`DnsTable::build`]; ask it with [`DnsTable::answer`]. See the module
/// documentation for the names and the rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsTable {
    /// Lower-case service name → its routable endpoints.
    services: BTreeMap<String, ServiceEntry>,
    /// Proper label-suffixes of dotted service names (`b` for `a.b`): names that exist only
    /// as ancestors of answered names.
    ancestors: BTreeSet<String>,
    /// The SOA serial: the largest view version among the assignments (low 32 bits).
    serial: u32,
}

/// What [`DnsTable::answer`] says to one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// `NOERROR` with records: the answer section (in a stable order: priority, address,
    /// port), and records that help use it (the addresses of SRV targets).
    Records {
        /// The answer section.
        answers: Vec<Record>,
        /// The additional section.
        additionals: Vec<Record>,
    },
    /// `NOERROR` without records (NODATA): the name exists but has nothing of the asked type
    /// to answer, including a known service with no routable endpoint. `soa` belongs in the
    /// authority section.
    NoData {
        /// The domain's SOA (negative TTL).
        soa: Record,
    },
    /// `NXDOMAIN`: no such name (an unknown service, a name of no known form). `soa` belongs
    /// in the authority section.
    NxDomain {
        /// The domain's SOA (negative TTL).
        soa: Record,
    },
    /// The name is outside the served domain. The server refuses it (`REFUSED`): it is no
    /// recursive resolver.
    NotOurs,
}

/// One service's routable endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ServiceEntry {
    /// Every routable endpoint of every priority, sorted (priority first), without
    /// duplicates.
    pub(super) endpoints: Vec<DnsEndpoint>,
}

/// One routable endpoint, as DNS needs it. Field order is sort order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct DnsEndpoint {
    /// EDS priority (failover tier), 0 = best.
    pub(super) priority: u32,
    pub(super) ip: IpAddr,
    pub(super) port: u16,
    /// `load_balancing_weight`, never zero.
    pub(super) weight: u32,
    /// Lower-case zone of its locality.
    pub(super) zone: String,
    /// Lower-case tags, sorted, without duplicates.
    pub(super) tags: Vec<String>,
}

/// What a name below the domain asks for.
#[derive(Debug)]
enum Target<'t> {
    /// The domain itself.
    Apex,
    /// A name that exists only as an ancestor of answered names: no records of its own.
    Ancestor,
    /// A service, possibly restricted to a tag and a zone.
    Service {
        entry: &'t ServiceEntry,
        tag: Option<String>,
        zone: Option<String>,
    },
    /// An address spelled in hex.
    Addr(IpAddr),
    /// Nothing by that name.
    NxDomain,
}

// === impl DnsTable ===

impl DnsTable {
    /// The table for the assignments the agent serves (one per service; the service's name
    /// is the `cluster_name`). Endpoints DNS cannot express (no IP socket address, port 0)
    /// are left out, logged at debug. If two assignments name the same service (ignoring
    /// case), the later one wins.
    pub fn build<'a>(assignments: impl IntoIterator<Item = &'a ClusterLoadAssignment>) -> Self {
        let mut services = BTreeMap::new();
        let mut serial = 0u64;
        for cla in assignments {
            let service = cla.cluster_name.to_ascii_lowercase();
            if service.is_empty() {
                debug!("dns skips an assignment without a cluster name");
                continue;
            }
            let mut endpoints = Vec::new();
            for locality in &cla.endpoints {
                serial = serial.max(view_version(locality.metadata.as_ref()));
                let zone = locality
                    .locality
                    .as_ref()
                    .map(|l| l.zone.to_ascii_lowercase())
                    .unwrap_or_default();
                for lb in locality.lb_endpoints.iter().filter(|lb| is_routed(lb)) {
                    match endpoint_socket(lb) {
                        Ok((ip, port)) => endpoints.push(DnsEndpoint {
                            priority: locality.priority,
                            ip,
                            port,
                            weight: weight(lb),
                            zone: zone.clone(),
                            tags: tags(lb.metadata.as_ref()),
                        }),
                        Err(reason) => {
                            debug!(%service, reason, "dns skips an endpoint it cannot express");
                        }
                    }
                }
            }
            endpoints.sort();
            endpoints.dedup();
            if services
                .insert(service.clone(), ServiceEntry { endpoints })
                .is_some()
            {
                debug!(%service, "dns table: a later assignment replaced the service");
            }
        }
        let ancestors = services
            .keys()
            .flat_map(|name| {
                name.match_indices('.')
                    .map(|(i, _)| name[i + 1..].to_owned())
                    .collect::<Vec<_>>()
            })
            .filter(|suffix| !suffix.is_empty())
            .collect();
        Self {
            services,
            ancestors,
            serial: u32::try_from(serial & u64::from(u32::MAX)).unwrap_or(0),
        }
    }

    /// How many services the table knows (including those with nothing routable).
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// Whether the table knows no service.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// The answer to `qtype` questions about `name` (class IN), for the domain `origin`
    /// serves. Records are owned by `name` as asked (its case kept) and carry the origin's
    /// TTLs.
    pub fn answer(&self, origin: &DnsOrigin, name: &Name, qtype: RecordType) -> Answer {
        let Some(labels) = origin.relative_labels(name) else {
            return Answer::NotOurs;
        };
        let records = match self.target(&labels) {
            Target::NxDomain => {
                return Answer::NxDomain {
                    soa: origin.soa(self.serial),
                };
            }
            Target::Ancestor => (Vec::new(), Vec::new()),
            Target::Apex => match qtype {
                RecordType::SOA | RecordType::ANY => (vec![origin.soa(self.serial)], Vec::new()),
                _ => (Vec::new(), Vec::new()),
            },
            Target::Addr(ip) => (address_records(origin, name, qtype, [ip]), Vec::new()),
            Target::Service { entry, tag, zone } => {
                let selected = entry.select(tag.as_deref(), zone.as_deref());
                match qtype {
                    RecordType::SRV => srv_records(origin, name, &selected),
                    _ => {
                        let ips = selected.iter().map(|e| e.ip);
                        (address_records(origin, name, qtype, ips), Vec::new())
                    }
                }
            }
        };
        match records {
            (answers, _) if answers.is_empty() => Answer::NoData {
                soa: origin.soa(self.serial),
            },
            (answers, additionals) => Answer::Records {
                answers,
                additionals,
            },
        }
    }

    /// What the labels below the domain (leftmost first, lower-case) name.
    fn target(&self, labels: &[String]) -> Target<'_> {
        let Some((last, rest)) = labels.split_last() else {
            return Target::Apex;
        };
        match last.as_str() {
            "addr" => match rest {
                [] => Target::Ancestor,
                [hex] => parse_hex_label(hex).map_or(Target::NxDomain, Target::Addr),
                _ => Target::NxDomain,
            },
            "service" => self.service_target(rest, None),
            "zone" => {
                // `<prefix>.service.<zone>.zone`; zones may hold dots, so try every
                // `service` label, rightmost (shortest zone) first.
                let (mut splits, mut ancestor) = (0, false);
                for i in (0..rest.len()).rev() {
                    if rest[i] != "service" || i + 1 == rest.len() {
                        continue;
                    }
                    splits += 1;
                    let zone = rest[i + 1..].join(".");
                    match self.service_target(&rest[..i], Some(zone)) {
                        found @ Target::Service { .. } => return found,
                        Target::Ancestor => ancestor = true,
                        _ => {}
                    }
                }
                // No split at all (`zone.`, `<zone>.zone.`): an ancestor of every zone-scoped
                // name. Otherwise an unknown service.
                if ancestor || splits == 0 {
                    Target::Ancestor
                } else {
                    Target::NxDomain
                }
            }
            _ => Target::NxDomain,
        }
    }

    /// `<prefix>.service` (restricted to `zone`): the longest known service name ending the
    /// prefix, the labels before it being the tag.
    fn service_target(&self, prefix: &[String], zone: Option<String>) -> Target<'_> {
        if prefix.is_empty() {
            return Target::Ancestor;
        }
        for split in 0..prefix.len() {
            if let Some(entry) = self.services.get(&prefix[split..].join(".")) {
                let tag = (split > 0).then(|| prefix[..split].join("."));
                return Target::Service { entry, tag, zone };
            }
        }
        if self.ancestors.contains(&prefix.join(".")) {
            Target::Ancestor
        } else {
            Target::NxDomain
        }
    }
}

// === impl ServiceEntry ===

impl ServiceEntry {
    /// The endpoints answered for a question restricted to `tag` and `zone` (lower-case):
    /// those of the lowest priority that has any.
    pub(super) fn select(&self, tag: Option<&str>, zone: Option<&str>) -> Vec<&DnsEndpoint> {
        let matching = self.endpoints.iter().filter(|e| {
            tag.is_none_or(|t| e.tags.binary_search_by(|x| x.as_str().cmp(t)).is_ok())
                && zone.is_none_or(|z| e.zone == z)
        });
        let mut best = None;
        let mut out = Vec::new();
        // Sorted by priority: the first match fixes the tier.
        for e in matching {
            match best {
                None => best = Some(e.priority),
                Some(p) if p != e.priority => break,
                Some(_) => {}
            }
            out.push(e);
        }
        out
    }
}

// === records ===

/// A and AAAA records (as `qtype` asks; ANY gets both) for `ips`, one per address.
fn address_records(
    origin: &DnsOrigin,
    owner: &Name,
    qtype: RecordType,
    ips: impl IntoIterator<Item = IpAddr>,
) -> Vec<Record> {
    let mut seen = BTreeSet::new();
    ips.into_iter()
        .filter(|ip| seen.insert(*ip))
        .filter_map(|ip| address_rdata(ip, qtype))
        .map(|rdata| Record::from_rdata(owner.clone(), origin.ttl_s(), rdata))
        .collect()
}

fn address_rdata(ip: IpAddr, qtype: RecordType) -> Option<RData> {
    match (ip, qtype) {
        (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => Some(RData::A(A(v4))),
        (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => Some(RData::AAAA(AAAA(v6))),
        _ => None,
    }
}

/// SRV records for `selected`, with the targets' addresses as additionals.
fn srv_records(
    origin: &DnsOrigin,
    owner: &Name,
    selected: &[&DnsEndpoint],
) -> (Vec<Record>, Vec<Record>) {
    let weight_max = selected.iter().map(|e| e.weight).max().unwrap_or(1);
    let mut answers = Vec::with_capacity(selected.len());
    let mut additionals = Vec::new();
    let mut seen = BTreeSet::new();
    for e in selected {
        let Some(target) = origin.addr_name(e.ip) else {
            continue;
        };
        let srv = SRV::new(
            u16::try_from(e.priority).unwrap_or(u16::MAX),
            srv_weight(e.weight, weight_max),
            e.port,
            target.clone(),
        );
        answers.push(Record::from_rdata(
            owner.clone(),
            origin.ttl_s(),
            RData::SRV(srv),
        ));
        if seen.insert(e.ip) {
            additionals.extend(address_records(origin, &target, RecordType::ANY, [e.ip]));
        }
    }
    (answers, additionals)
}

/// A weight as SRV carries it (16 bits): unchanged when every weight fits, otherwise scaled
/// so the largest is 65 535, never below 1 (0 means "no traffic" to SRV clients).
fn srv_weight(weight: u32, weight_max: u32) -> u16 {
    match u16::try_from(weight_max) {
        Ok(_) => u16::try_from(weight).unwrap_or(u16::MAX),
        Err(_) => {
            let scaled = u64::from(weight) * u64::from(u16::MAX) / u64::from(weight_max);
            u16::try_from(scaled).unwrap_or(u16::MAX).max(1)
        }
    }
}

// === reading assignments ===

/// Whether Envoy routes to the endpoint: healthy, degraded or unknown, weight above zero.
fn is_routed(lb: &LbEndpoint) -> bool {
    let routed_health = matches!(
        HealthStatus::try_from(lb.health_status),
        Ok(HealthStatus::Healthy | HealthStatus::Degraded | HealthStatus::Unknown)
    );
    routed_health && weight(lb) > 0
}

/// `load_balancing_weight`; Envoy's default of 1 when absent.
fn weight(lb: &LbEndpoint) -> u32 {
    lb.load_balancing_weight.map_or(1, |w| w.value)
}

/// waymark's `tags` label: lower-case, sorted, without duplicates; none when absent.
fn tags(metadata: Option<&Metadata>) -> Vec<String> {
    let Some(Kind::ListValue(list)) = metadata_field(metadata, "tags") else {
        return Vec::new();
    };
    let tags: BTreeSet<String> = list
        .values
        .iter()
        .filter_map(|v| match &v.kind {
            Some(Kind::StringValue(s)) => Some(s.to_ascii_lowercase()),
            _ => None,
        })
        .collect();
    tags.into_iter().collect()
}

/// A locality's `view_version` label; 0 when absent or not a number.
fn view_version(metadata: Option<&Metadata>) -> u64 {
    match metadata_field(metadata, "view_version") {
        Some(Kind::StringValue(s)) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
pub(super) mod tests;
