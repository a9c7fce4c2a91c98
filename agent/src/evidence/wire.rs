//! Conversions between the generated protobuf messages ([`pb`](super::pb)) and the evidence
//! protocol's validated types ([`AgentMessage`], [`AuthorityMessage`] and what they carry).
//!
//! ```text
//! domain ──From──► pb ──encode──► bytes ──decode──► pb ──TryFrom──► domain | WireError
//! ```
//!
//! `From` is total: every domain value has a wire form. `TryFrom` is total on input too: a
//! message that parsed is refused with a typed [`WireError`] when a required field or
//! `oneof` is unset, an enum holds `*_UNSPECIFIED` or a value this build does not know, a
//! number is out of range, a string or list is over its bound (see the consts in
//! [`super`]), or a name is not a valid name. Nothing is applied on a refusal; the session
//! ends with `INVALID_ARGUMENT` naming the field.
//!
//! Durations travel as whole milliseconds: a sub-millisecond part would be dropped on the
//! way out, but every domain duration is whole milliseconds, since a contract with a finer
//! one is refused by `HealthContract::validate`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use waymark_core::contract::{ProbeKind, ProbeSpec};
use waymark_core::defaults::{CONTRACT_TEXT_LEN_MAX, INTERVAL_MAX, PROBE_TIMEOUT_MAX};
use waymark_core::model::{
    Address, DependencyStatus, Health, InstanceId, NameError, Observation, SelfReport, ServiceName,
    ZoneName,
};

use super::pb;
use super::{
    AgentMessage, AuthorityMessage, BATCH_MAX, DETAIL_BYTES_MAX, ProbeTarget, REASON_BYTES_MAX,
    RefusedSample, WireSample,
};

/// Why a decoded message was refused. Nothing it carried was applied; the session ends
/// with `INVALID_ARGUMENT` carrying the message (with its source), and the sender should
/// fix the named field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// A required message field or `oneof` was not set.
    #[error("{field}: missing")]
    Missing {
        /// The field, as a dotted path in the message.
        field: &'static str,
    },
    /// An enum field held its `*_UNSPECIFIED` value or one this build does not know.
    #[error("{field}: {value} is not a known value")]
    UnknownEnum {
        /// The field.
        field: &'static str,
        /// What was sent.
        value: i32,
    },
    /// A number was outside its field's range.
    #[error("{field}: {value} is out of range, at most {max}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// What was sent.
        value: u64,
        /// The largest value accepted.
        max: u64,
    },
    /// An IP address was neither 4 nor 16 bytes.
    #[error("{field}: {len} bytes, expected 4 (IPv4) or 16 (IPv6)")]
    BadAddress {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
    },
    /// A string was longer than its bound, or empty where it must not be.
    #[error("{field}: {len} bytes, expected {min} to {max}")]
    BadLength {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The shortest accepted.
        min: usize,
        /// The longest accepted.
        max: usize,
    },
    /// A list held more entries than its bound.
    #[error("{field}: {len} entries, at most {max}")]
    TooMany {
        /// The field.
        field: &'static str,
        /// How many were sent.
        len: usize,
        /// The most accepted.
        max: usize,
    },
    /// Bytes that should hold a JSON object do not.
    #[error("{field}: not a JSON object")]
    NotJson {
        /// The field.
        field: &'static str,
    },
    /// A name (instance, service, zone) was not a valid name.
    #[error("{field}: not a valid name")]
    Name {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        #[source]
        source: NameError,
    },
    /// One entry of a list was refused.
    #[error("{field}[{index}]")]
    Entry {
        /// The list.
        field: &'static str,
        /// The entry's position.
        index: usize,
        /// What is wrong with it.
        #[source]
        source: Box<WireError>,
    },
}

impl WireError {
    /// A stable label for metrics: what kind of fault, not which field.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Missing { .. } => "missing",
            Self::UnknownEnum { .. } => "unknown_enum",
            Self::OutOfRange { .. } => "out_of_range",
            Self::BadAddress { .. } => "bad_address",
            Self::BadLength { .. } => "bad_length",
            Self::TooMany { .. } => "too_many",
            Self::Name { .. } => "bad_name",
            Self::NotJson { .. } => "not_json",
            Self::Entry { source, .. } => source.label(),
        }
    }

    /// The error and its sources on one line (`samples[2]: instance: not a valid name:
    /// instance id is empty`), for the status a refused sender reads.
    pub fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(e) = source {
            out.push_str(": ");
            out.push_str(&e.to_string());
            source = e.source();
        }
        out
    }
}

// === agent → serving side ===

impl From<AgentMessage> for pb::AgentMessage {
    fn from(value: AgentMessage) -> Self {
        use pb::agent_message::Message;
        let message = match value {
            AgentMessage::Hello { zone } => Message::Hello(pb::Hello { zone: zone.into() }),
            AgentMessage::Samples { samples } => Message::Samples(pb::Samples {
                samples: samples.into_iter().map(Into::into).collect(),
            }),
            AgentMessage::Relayed { samples } => Message::Relayed(pb::Relayed {
                samples: samples.into_iter().map(Into::into).collect(),
            }),
            AgentMessage::Sidecars { report } => Message::Sidecars(report.into()),
            AgentMessage::ClientConfig(answer) => Message::ClientConfig(answer.into()),
            AgentMessage::KeyringAnswer(answer) => Message::KeyringAnswer(answer.into()),
        };
        Self {
            message: Some(message),
        }
    }
}

impl TryFrom<pb::AgentMessage> for AgentMessage {
    type Error = WireError;

    fn try_from(value: pb::AgentMessage) -> Result<Self, WireError> {
        use pb::agent_message::Message;
        match value.message {
            None => Err(WireError::Missing { field: "message" }),
            Some(Message::Hello(hello)) => Ok(Self::Hello {
                zone: name::<ZoneName>("hello.zone", hello.zone)?,
            }),
            Some(Message::Samples(batch)) => Ok(Self::Samples {
                samples: samples("samples.samples", batch.samples)?,
            }),
            Some(Message::Relayed(batch)) => Ok(Self::Relayed {
                samples: samples("relayed.samples", batch.samples)?,
            }),
            Some(Message::Sidecars(report)) => Ok(Self::Sidecars {
                report: report.try_into()?,
            }),
            Some(Message::ClientConfig(answer)) => Ok(Self::ClientConfig(answer.try_into()?)),
            Some(Message::KeyringAnswer(answer)) => Ok(Self::KeyringAnswer(answer.try_into()?)),
        }
    }
}

impl From<WireSample> for pb::Sample {
    fn from(value: WireSample) -> Self {
        Self {
            instance: value.instance.into(),
            observation: Some(value.observation.into()),
        }
    }
}

impl TryFrom<pb::Sample> for WireSample {
    type Error = WireError;

    fn try_from(value: pb::Sample) -> Result<Self, WireError> {
        let observation = value.observation.ok_or(WireError::Missing {
            field: "observation",
        })?;
        Ok(Self {
            instance: name::<InstanceId>("instance", value.instance)?,
            observation: observation.try_into()?,
        })
    }
}

impl From<Observation> for pb::Observation {
    fn from(value: Observation) -> Self {
        use pb::observation::Class;
        let class = match value {
            Observation::Probe { health, detail } => Class::Probe(pb::ProbeResult {
                health: pb::Health::from(health).into(),
                detail,
            }),
            Observation::SelfReport(report) => Class::SelfReport(report.into()),
            Observation::Passive { requests, errors } => {
                Class::Passive(pb::PassiveOutcomes { requests, errors })
            }
        };
        Self { class: Some(class) }
    }
}

impl TryFrom<pb::Observation> for Observation {
    type Error = WireError;

    fn try_from(value: pb::Observation) -> Result<Self, WireError> {
        use pb::observation::Class;
        match value.class {
            None => Err(WireError::Missing {
                field: "observation.class",
            }),
            Some(Class::Probe(probe)) => {
                let field = "observation.probe.health";
                let health = match pb::Health::try_from(probe.health) {
                    Ok(pb::Health::Pass) => Health::Pass,
                    Ok(pb::Health::Fail) => Health::Fail,
                    Ok(pb::Health::Timeout) => Health::Timeout,
                    Ok(pb::Health::Refused) => Health::Refused,
                    Ok(pb::Health::Unspecified) | Err(_) => {
                        return Err(WireError::UnknownEnum {
                            field,
                            value: probe.health,
                        });
                    }
                };
                let detail = match probe.detail {
                    Some(d) => Some(text("observation.probe.detail", d, 0, DETAIL_BYTES_MAX)?),
                    None => None,
                };
                Ok(Self::Probe { health, detail })
            }
            Some(Class::SelfReport(report)) => Ok(Self::SelfReport(report.try_into()?)),
            Some(Class::Passive(p)) => Ok(Self::Passive {
                requests: p.requests,
                errors: p.errors,
            }),
        }
    }
}

impl From<SelfReport> for pb::SelfReport {
    fn from(value: SelfReport) -> Self {
        use pb::self_report::Kind;
        let kind = match value {
            SelfReport::Ready => Kind::Ready(pb::Ready {}),
            SelfReport::NotReady { detail } => Kind::NotReady(pb::NotReady { detail }),
            SelfReport::Draining => Kind::Draining(pb::Draining {}),
            SelfReport::Dependency { name, status } => Kind::Dependency(pb::Dependency {
                name,
                status: pb::DependencyStatus::from(status).into(),
            }),
        };
        Self { kind: Some(kind) }
    }
}

impl TryFrom<pb::SelfReport> for SelfReport {
    type Error = WireError;

    fn try_from(value: pb::SelfReport) -> Result<Self, WireError> {
        use pb::self_report::Kind;
        match value.kind {
            None => Err(WireError::Missing {
                field: "observation.self_report.kind",
            }),
            Some(Kind::Ready(_)) => Ok(Self::Ready),
            Some(Kind::Draining(_)) => Ok(Self::Draining),
            Some(Kind::NotReady(n)) => Ok(Self::NotReady {
                detail: text(
                    "observation.self_report.not_ready.detail",
                    n.detail,
                    0,
                    DETAIL_BYTES_MAX,
                )?,
            }),
            Some(Kind::Dependency(d)) => {
                let field = "observation.self_report.dependency.status";
                let status = match pb::DependencyStatus::try_from(d.status) {
                    Ok(pb::DependencyStatus::Ok) => DependencyStatus::Ok,
                    Ok(pb::DependencyStatus::Degraded) => DependencyStatus::Degraded,
                    Ok(pb::DependencyStatus::Down) => DependencyStatus::Down,
                    Ok(pb::DependencyStatus::Unspecified) | Err(_) => {
                        return Err(WireError::UnknownEnum {
                            field,
                            value: d.status,
                        });
                    }
                };
                Ok(Self::Dependency {
                    name: text(
                        "observation.self_report.dependency.name",
                        d.name,
                        1,
                        CONTRACT_TEXT_LEN_MAX,
                    )?,
                    status,
                })
            }
        }
    }
}

impl From<Health> for pb::Health {
    fn from(value: Health) -> Self {
        match value {
            Health::Pass => Self::Pass,
            Health::Fail => Self::Fail,
            Health::Timeout => Self::Timeout,
            Health::Refused => Self::Refused,
        }
    }
}

impl From<DependencyStatus> for pb::DependencyStatus {
    fn from(value: DependencyStatus) -> Self {
        match value {
            DependencyStatus::Ok => Self::Ok,
            DependencyStatus::Degraded => Self::Degraded,
            DependencyStatus::Down => Self::Down,
        }
    }
}

// === serving side → agent ===

impl From<AuthorityMessage> for pb::AuthorityMessage {
    fn from(value: AuthorityMessage) -> Self {
        use pb::authority_message::Message;
        let message = match value {
            AuthorityMessage::Assignment { targets } => Message::Assignment(pb::Assignment {
                targets: targets.into_iter().map(Into::into).collect(),
            }),
            AuthorityMessage::Ack { accepted, refused } => Message::Ack(pb::Ack {
                accepted,
                refused: refused.into_iter().map(Into::into).collect(),
            }),
            AuthorityMessage::ConfigRequest(request) => Message::ConfigRequest(request.into()),
            AuthorityMessage::KeyringRequest(request) => Message::KeyringRequest(request.into()),
        };
        Self {
            message: Some(message),
        }
    }
}

impl TryFrom<pb::AuthorityMessage> for AuthorityMessage {
    type Error = WireError;

    fn try_from(value: pb::AuthorityMessage) -> Result<Self, WireError> {
        use pb::authority_message::Message;
        match value.message {
            None => Err(WireError::Missing { field: "message" }),
            // No count bound on the assignment: it is whatever the registry assigned this
            // node, bounded by the message size cap (AUTHORITY_MESSAGE_BYTES_MAX).
            Some(Message::Assignment(a)) => Ok(Self::Assignment {
                targets: entries("assignment.targets", a.targets, usize::MAX)?,
            }),
            Some(Message::Ack(ack)) => Ok(Self::Ack {
                accepted: ack.accepted,
                refused: entries("ack.refused", ack.refused, BATCH_MAX)?,
            }),
            Some(Message::ConfigRequest(request)) => Ok(Self::ConfigRequest(request.try_into()?)),
            Some(Message::KeyringRequest(request)) => Ok(Self::KeyringRequest(request.try_into()?)),
        }
    }
}

impl From<ProbeTarget> for pb::ProbeTarget {
    fn from(value: ProbeTarget) -> Self {
        Self {
            instance: value.instance.into(),
            service: value.service.into(),
            address: Some(value.address.into()),
            probe: Some(value.probe.into()),
            confirmation: value.confirmation,
        }
    }
}

impl TryFrom<pb::ProbeTarget> for ProbeTarget {
    type Error = WireError;

    fn try_from(value: pb::ProbeTarget) -> Result<Self, WireError> {
        let address = value
            .address
            .ok_or(WireError::Missing { field: "address" })?;
        let probe = value.probe.ok_or(WireError::Missing { field: "probe" })?;
        Ok(Self {
            instance: name::<InstanceId>("instance", value.instance)?,
            service: name::<ServiceName>("service", value.service)?,
            address: address.try_into()?,
            probe: probe.try_into()?,
            confirmation: value.confirmation,
        })
    }
}

impl From<Address> for pb::Address {
    fn from(value: Address) -> Self {
        let ip = match value.ip {
            IpAddr::V4(v4) => v4.octets().to_vec(),
            IpAddr::V6(v6) => v6.octets().to_vec(),
        };
        Self {
            ip,
            port: u32::from(value.port),
        }
    }
}

impl TryFrom<pb::Address> for Address {
    type Error = WireError;

    fn try_from(value: pb::Address) -> Result<Self, WireError> {
        let ip = if let Ok(v4) = <[u8; 4]>::try_from(value.ip.as_slice()) {
            IpAddr::V4(Ipv4Addr::from(v4))
        } else if let Ok(v6) = <[u8; 16]>::try_from(value.ip.as_slice()) {
            IpAddr::V6(Ipv6Addr::from(v6))
        } else {
            return Err(WireError::BadAddress {
                field: "address.ip",
                len: value.ip.len(),
            });
        };
        let port = u16::try_from(value.port).map_err(|_| WireError::OutOfRange {
            field: "address.port",
            value: u64::from(value.port),
            max: u64::from(u16::MAX),
        })?;
        Ok(Self { ip, port })
    }
}

impl From<ProbeSpec> for pb::ProbeSpec {
    fn from(value: ProbeSpec) -> Self {
        use pb::probe_spec::Kind;
        let kind = match value.kind {
            ProbeKind::Http { path } => Kind::Http(pb::HttpProbe { path }),
            ProbeKind::Tcp => Kind::Tcp(pb::TcpProbe {}),
            ProbeKind::Grpc { service } => Kind::Grpc(pb::GrpcProbe { service }),
        };
        Self {
            kind: Some(kind),
            interval_ms: millis(value.interval),
            timeout_ms: millis(value.timeout),
        }
    }
}

impl TryFrom<pb::ProbeSpec> for ProbeSpec {
    type Error = WireError;

    fn try_from(value: pb::ProbeSpec) -> Result<Self, WireError> {
        use pb::probe_spec::Kind;
        let max = CONTRACT_TEXT_LEN_MAX;
        let kind = match value.kind {
            None => {
                return Err(WireError::Missing {
                    field: "probe.kind",
                });
            }
            Some(Kind::Http(h)) => ProbeKind::Http {
                path: text("probe.http.path", h.path, 0, max)?,
            },
            Some(Kind::Tcp(_)) => ProbeKind::Tcp,
            Some(Kind::Grpc(g)) => ProbeKind::Grpc {
                service: text("probe.grpc.service", g.service, 0, max)?,
            },
        };
        Ok(Self {
            kind,
            // The contract's own ceilings: a validated contract never exceeds them, so
            // nothing the authority may legitimately send is refused.
            interval: duration("probe.interval_ms", value.interval_ms, INTERVAL_MAX)?,
            timeout: duration("probe.timeout_ms", value.timeout_ms, PROBE_TIMEOUT_MAX)?,
        })
    }
}

impl From<RefusedSample> for pb::RefusedSample {
    fn from(value: RefusedSample) -> Self {
        Self {
            instance: value.instance.into(),
            reason: value.reason,
        }
    }
}

impl TryFrom<pb::RefusedSample> for RefusedSample {
    type Error = WireError;

    fn try_from(value: pb::RefusedSample) -> Result<Self, WireError> {
        Ok(Self {
            instance: name::<InstanceId>("instance", value.instance)?,
            reason: text("reason", value.reason, 1, REASON_BYTES_MAX)?,
        })
    }
}

// === helpers ===

/// A batch of samples, at most [`BATCH_MAX`] of them.
fn samples(field: &'static str, wire: Vec<pb::Sample>) -> Result<Vec<WireSample>, WireError> {
    entries(field, wire, BATCH_MAX)
}

/// Every entry of a list of at most `max`, converted; the first refused one is named by its
/// position.
pub(super) fn entries<W, T>(
    field: &'static str,
    wire: Vec<W>,
    max: usize,
) -> Result<Vec<T>, WireError>
where
    T: TryFrom<W, Error = WireError>,
{
    if wire.len() > max {
        return Err(WireError::TooMany {
            field,
            len: wire.len(),
            max,
        });
    }
    wire.into_iter()
        .enumerate()
        .map(|(index, w)| {
            T::try_from(w).map_err(|e| WireError::Entry {
                field,
                index,
                source: Box::new(e),
            })
        })
        .collect()
}

fn name<N>(field: &'static str, value: String) -> Result<N, WireError>
where
    N: TryFrom<String, Error = NameError>,
{
    N::try_from(value).map_err(|source| WireError::Name { field, source })
}

pub(super) fn text(
    field: &'static str,
    value: String,
    min: usize,
    max: usize,
) -> Result<String, WireError> {
    if (min..=max).contains(&value.len()) {
        Ok(value)
    } else {
        Err(WireError::BadLength {
            field,
            len: value.len(),
            min,
            max,
        })
    }
}

fn millis(value: Duration) -> u64 {
    u64::try_from(value.as_millis()).unwrap_or(u64::MAX)
}

fn duration(field: &'static str, ms: u64, max: Duration) -> Result<Duration, WireError> {
    let max_ms = millis(max);
    if ms > max_ms {
        return Err(WireError::OutOfRange {
            field,
            value: ms,
            max: max_ms,
        });
    }
    Ok(Duration::from_millis(ms))
}

#[cfg(test)]
#[path = "wire_test.rs"]
mod tests;
