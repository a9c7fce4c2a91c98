//! The authority API's request bodies and path names, decoded as the handlers decode them
//! (`serde_json::from_slice` into the route's type, `FromStr` for path names), then turned
//! into the registry command the handler proposes and applied to a small region — so a
//! body that would halt the state machine is found here as well as in `registry_apply`.
//!
//! The handlers' own body structs are private to `api.rs` (`PutService`, `ValidateBody`,
//! `FailoverBody`, `OverrideBody`, `AddMember`); their fields are decoded here with the
//! same public types they wrap (`HealthContract`, `InstanceId`, …) from the same JSON.
//!
//! Input: byte 0 picks the route; for routes with a path name, the first line of the rest
//! is that name and the remainder the body; otherwise the rest is the body.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use waymark_agent::net::HostPort;
use waymark_core::contract::HealthContract;
use waymark_core::model::{Instance, InstanceId, RegionName, ServiceName, ZoneName};
use waymark_fuzz::capped;
use waymark_registry::state::{
    Command, DesiredState, EvacuationIntent, RegionFailoverIntent, Registration,
    ServicePolicyRecord, Stamped,
};

/// Every route that takes a body or a path name, in the order of `api.rs`'s router.
const ROUTES: &[&str] = &[
    "POST /v1/operator/raft/members",
    "DELETE /v1/operator/raft/members/{id}",
    "PUT /v1/services/{service}",
    "DELETE /v1/services/{service}",
    "GET /v1/services/{service}/view",
    "PUT /v1/services/{service}/policy",
    "POST /v1/zones/{zone}/evacuation",
    "POST /v1/contracts/validate",
    "POST /v1/instances",
    "DELETE /v1/instances/{id}",
    "PUT /v1/instances/{id}/renew",
    "GET /v1/instances/{id}/explain",
    "POST /v1/external",
    "DELETE /v1/external/{id}",
    "POST /v1/overrides",
    "POST /v1/federation/regions/{region}/failover",
];

fuzz_target!(|data: &[u8]| {
    let data = capped(data);
    let Some((&route, rest)) = data.split_first() else {
        return;
    };
    let route = ROUTES[usize::from(route) % ROUTES.len()];
    let (name, body) = if route.contains('{') {
        let cut = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
        let name = String::from_utf8_lossy(&rest[..cut]).into_owned();
        (name, rest.get(cut + 1..).unwrap_or(&[]))
    } else {
        (String::new(), rest)
    };
    if let Some(command) = command(route, &name, body) {
        static REGION: OnceLock<DesiredState> = OnceLock::new();
        let mut state = REGION.get_or_init(region).clone();
        let _ = state.apply(Stamped {
            at_ms: 1_700_000_010_000,
            command,
        });
        serde_json::to_vec(&state).expect("the desired state serializes");
    }
});

fn decode<T: DeserializeOwned>(body: &[u8]) -> Option<T> {
    serde_json::from_slice(body).ok()
}

/// A field of a JSON object body, decoded as its handler's struct field would be.
fn field<T: DeserializeOwned>(body: &Value, key: &str) -> Option<T> {
    serde_json::from_value(body.get(key)?.clone()).ok()
}

/// The command the route's handler would propose for this request, if it gets that far.
fn command(route: &str, name: &str, body: &[u8]) -> Option<Command> {
    match route {
        "POST /v1/operator/raft/members" => {
            let v: Value = decode(body)?;
            let _: u64 = field(&v, "id")?;
            let addr: String = field(&v, "addr")?;
            let _ = addr.parse::<HostPort>();
            None
        }
        "DELETE /v1/operator/raft/members/{id}" => {
            let _ = name.parse::<u64>();
            None
        }
        "PUT /v1/services/{service}" => {
            let service: ServiceName = name.parse().ok()?;
            let v: Value = decode(body)?;
            let owner: String = field(&v, "owner")?;
            let contract: HealthContract = field(&v, "contract")?;
            (!owner.trim().is_empty()).then_some(Command::PutService {
                service,
                owner,
                contract,
            })
        }
        "DELETE /v1/services/{service}" => Some(Command::RemoveService {
            service: name.parse().ok()?,
        }),
        "GET /v1/services/{service}/view" => {
            let _ = name.parse::<ServiceName>();
            None
        }
        "PUT /v1/services/{service}/policy" => Some(Command::SetPolicy {
            service: name.parse().ok()?,
            policy: decode::<ServicePolicyRecord>(body)?,
        }),
        "POST /v1/zones/{zone}/evacuation" => Some(Command::Evacuation {
            zone: name.parse::<ZoneName>().ok()?,
            intent: decode::<EvacuationIntent>(body)?,
        }),
        "POST /v1/contracts/validate" => {
            let v: Value = decode(body)?;
            let contract: HealthContract = field(&v, "contract")?;
            if let Err(e) = contract.validate() {
                let _ = (e.field(), e.to_string());
            }
            None
        }
        "POST /v1/instances" => {
            let mut registration: Registration = decode(body)?;
            if registration.lease_ms == 0 {
                registration.lease_ms = waymark_core::defaults::LEASE.as_millis() as u64;
            }
            Some(Command::Register(registration))
        }
        "DELETE /v1/instances/{id}" => Some(Command::Deregister {
            instance: name.parse().ok()?,
        }),
        "PUT /v1/instances/{id}/renew" => Some(Command::Renew {
            instance: name.parse().ok()?,
        }),
        "GET /v1/instances/{id}/explain" => {
            let _ = name.parse::<InstanceId>();
            None
        }
        "POST /v1/external" => Some(Command::DeclareExternal {
            instance: decode::<Instance>(body)?,
        }),
        "DELETE /v1/external/{id}" => Some(Command::RemoveExternal {
            instance: name.parse().ok()?,
        }),
        "POST /v1/overrides" => {
            let v: Value = decode(body)?;
            let instance: InstanceId = field(&v, "instance")?;
            let action: String = field(&v, "action")?;
            let justification: String = field::<Option<String>>(&v, "justification").flatten()?;
            if justification.trim().is_empty() {
                return None;
            }
            let reason = match action.as_str() {
                "maintenance_on" => Some(format!("{justification} by operator@example.org")),
                "maintenance_off" => None,
                _ => return None,
            };
            Some(Command::Maintenance { instance, reason })
        }
        "POST /v1/federation/regions/{region}/failover" => {
            let region: RegionName = name.parse().ok()?;
            let v: Value = decode(body)?;
            let action: String = field(&v, "action")?;
            let reason: String = field(&v, "reason")?;
            let intent = match action.as_str() {
                "failover" => RegionFailoverIntent::Failover { manual: true },
                "shift_back" => RegionFailoverIntent::ShiftBack,
                "complete_shift_back" => RegionFailoverIntent::CompleteShiftBack,
                _ => return None,
            };
            Some(Command::RegionFailover {
                region,
                intent,
                actor: "operator@example.org".into(),
                reason,
            })
        }
        _ => None,
    }
}

/// A small region: a probed service with one registered instance, and an external one.
fn region() -> DesiredState {
    let mut state = DesiredState::new();
    let commands = [
        json!({"op": "put_service", "service": "web", "owner": "team", "contract": {}}),
        json!({"op": "put_service", "service": "ext", "owner": "team", "contract": {
            "profile": {"probe": false, "self_report": false, "passive": true},
            "probe": null,
        }}),
        json!({"op": "register", "service": "web",
            "locality": {"region": "eu", "zone": "eu-west-1a", "node": "node-1"},
            "address": {"ip": "10.0.0.1", "port": 8080}, "lease_ms": 30_000}),
    ];
    for command in commands {
        let stamped: Stamped =
            serde_json::from_value(json!({"at_ms": 1_700_000_000_000u64, "command": command}))
                .expect("the fixture commands decode");
        state.apply(stamped).expect("the fixture commands apply");
    }
    state
}
