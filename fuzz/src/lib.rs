//! Shared pieces of waymark's fuzz targets (see `docs/fuzzing.md`).
//!
//! - [`Gen`]: a structured decoder that turns fuzz bytes into JSON values shaped like the
//!   project's wire and log types (registry commands, contracts, views, samples), drawing
//!   names and numbers from a small vocabulary so that commands in one input refer to the
//!   same services and instances and hit the edges (the longest names, `u64::MAX`
//!   durations, zero ports). Values are built as JSON and decoded with the crates' own
//!   `Deserialize`, so a field added with a default does not break the targets, and the
//!   decoder under test is the one the member runs.
//! - [`lines`]: the other input form, newline-separated JSON (the seed corpus is written
//!   this way, from the project's own test inputs).
//! - [`Limits`]: the per-input caps every target applies, so one input is always cheap.

use libfuzzer_sys::arbitrary::Unstructured;
use serde_json::{Map, Value, json};

/// Per-input caps shared by the targets.
#[derive(Debug, Clone, Copy)]
pub struct Limits;

impl Limits {
    /// Longest input a target reads; the rest is ignored.
    pub const INPUT_BYTES_MAX: usize = 64 * 1024;
    /// Most commands (or requests, messages, frames) one input applies.
    pub const STEPS_MAX: usize = 64;
    /// Longest generated free-text field, in bytes.
    pub const TEXT_BYTES_MAX: usize = 70_000;
}

/// Decode a generated value with the type's own `Deserialize`. With `WAYMARK_FUZZ_DEBUG`
/// set, a value that does not decode is printed with the reason: that is how to see that a
/// type changed shape and [`Gen`] needs to follow (see `docs/fuzzing.md`).
pub fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Option<T> {
    match serde_json::from_value::<T>(value.clone()) {
        Ok(v) => Some(v),
        Err(e) => {
            if std::env::var_os("WAYMARK_FUZZ_DEBUG").is_some() {
                eprintln!("undecodable {}: {e}: {value}", std::any::type_name::<T>());
            }
            None
        }
    }
}

/// The input cut to [`Limits::INPUT_BYTES_MAX`].
pub fn capped(data: &[u8]) -> &[u8] {
    &data[..data.len().min(Limits::INPUT_BYTES_MAX)]
}

/// Whether the input is in the JSON-lines form (its first byte opens an object or array).
pub fn is_json_lines(data: &[u8]) -> bool {
    matches!(data.first(), Some(b'{' | b'['))
}

/// The input's non-empty lines, at most [`Limits::STEPS_MAX`] of them.
pub fn lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.split(|b| *b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .take(Limits::STEPS_MAX)
}

/// Names every kind of name is drawn from: short valid ones that collide on purpose, the
/// longest valid one, and invalid ones (the decoder must refuse them, never panic).
const NAMES: &[&str] = &[
    "web",
    "api",
    "db",
    "eu-west-1a",
    "eu-west-1b",
    "node-1",
    "node-2",
    "i-1",
    "i-2",
    "a",
    "",
    "bad name",
    "web:8080",
    "x.y_z-1",
    "\u{e9}t\u{e9}",
    "*",
];
const IPS: &[&str] = &[
    "10.0.0.1",
    "10.0.0.2",
    "10.0.1.1",
    "127.0.0.1",
    "::1",
    "fe80::1",
    "169.254.169.254",
    "0.0.0.0",
    "255.255.255.255",
    "2001:db8::1",
    "not-an-ip",
];
const DURATIONS: &[&str] = &[
    "0s",
    "1ms",
    "250ms",
    "500ms",
    "1s",
    "2s",
    "5s",
    "10s",
    "30s",
    "1m",
    "5m",
    "1h",
    "18446744073709551615ms",
    "18446744073709551s",
    "307445734561825m",
    "5124095576030431h",
    "1000000h",
    "10",
    "s",
    "-1s",
    "1.5s",
    "0",
    ".5s",
    "1m30s",
    "2h45m",
    "1d",
    "1.5ns",
    "250us",
    "1\u{b5}s",
    "1h0.001s",
    "213503982334601d7h15.999999999s",
    "213503982334601d7h16s",
];
const PERMILLES: &[u64] = &[
    0, 1, 50, 100, 250, 500, 700, 900, 999, 1000, 1001, 65535, 65536,
];
const U32S: &[u64] = &[
    0,
    1,
    2,
    3,
    5,
    10,
    100,
    1000,
    u32::MAX as u64 - 1,
    u32::MAX as u64,
];
const U64S: &[u64] = &[
    0,
    1,
    1_000,
    5_000,
    30_000,
    600_000,
    600_001,
    1 << 32,
    (1 << 32) - 1,
    u64::MAX / 2,
    u64::MAX - 1,
    u64::MAX,
];
// Around the registry's caps (tag 128, owner 256, reason and metadata value 1024 bytes).
const TEXT_LENS: &[usize] = &[0, 1, 8, 128, 129, 256, 257, 1024, 1025, 4096, 65_536];

/// The structured decoder: bytes in, JSON values shaped like waymark's types out.
pub struct Gen<'a> {
    u: Unstructured<'a>,
    /// The leader's clock as the commands so far stamped it.
    pub at_ms: u64,
    /// Instance ids seen so far (issued by the registry, or chosen by a command), so later
    /// commands can name them.
    pub ids: Vec<String>,
}

impl<'a> Gen<'a> {
    /// A decoder over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self {
            u: Unstructured::new(data),
            at_ms: 1_700_000_000_000,
            ids: Vec::new(),
        }
    }

    /// Whether the input is used up.
    pub fn is_empty(&self) -> bool {
        self.u.is_empty()
    }

    /// A byte (0 once the input is used up).
    pub fn byte(&mut self) -> u8 {
        self.u.arbitrary().unwrap_or(0)
    }

    /// A number below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.u.choose_index(n).unwrap_or(0)
    }

    /// One of `choices` (non-empty).
    pub fn pick<'c>(&mut self, choices: &[&'c str]) -> &'c str {
        choices[self.below(choices.len())]
    }

    /// True one time in `n`.
    pub fn one_in(&mut self, n: u8) -> bool {
        self.u.ratio(1, n).unwrap_or(false)
    }

    /// Any `u64`, from the edges most of the time.
    pub fn u64(&mut self) -> u64 {
        if self.one_in(4) {
            self.u.arbitrary().unwrap_or(0)
        } else {
            U64S[self.below(U64S.len())]
        }
    }

    /// A `u32`-sized count, from the edges most of the time.
    pub fn u32(&mut self) -> u64 {
        if self.one_in(4) {
            u64::from(self.u.arbitrary::<u32>().unwrap_or(0))
        } else {
            U32S[self.below(U32S.len())]
        }
    }

    /// A permille (sometimes out of range, which must be refused).
    pub fn permille(&mut self) -> u64 {
        PERMILLES[self.below(PERMILLES.len())]
    }

    /// A name from the vocabulary, or now and then the longest names a check allows and
    /// one past them, or raw bytes.
    pub fn name(&mut self) -> String {
        match self.below(10) {
            0 => {
                // Around the longest service name (231: room for an issued id's suffix)
                // and the longest name (253).
                let len = [1, 231, 232, 240, 251, 252, 253, 254, 300][self.below(9)];
                "n".repeat(len)
            }
            1 => self.raw_text(32),
            _ => NAMES[self.below(NAMES.len())].to_owned(),
        }
    }

    /// A name drawn from the first few (valid) names only: commands in one input then
    /// keep meeting each other.
    pub fn valid_name(&mut self) -> String {
        if self.one_in(12) {
            return self.name();
        }
        NAMES[self.below(4)].to_owned()
    }

    /// An instance id: one seen before, a vocabulary name, or a fresh one.
    pub fn instance_id(&mut self) -> String {
        if !self.ids.is_empty() && !self.one_in(4) {
            let i = self.below(self.ids.len());
            return self.ids[i].clone();
        }
        match self.below(4) {
            0 => self.name(),
            _ => format!("pod-{}", self.below(4)),
        }
    }

    /// Text of a length from the edges (empty, the caps and one past them).
    pub fn text(&mut self) -> String {
        let len = TEXT_LENS[self.below(TEXT_LENS.len())].min(Limits::TEXT_BYTES_MAX);
        match self.below(3) {
            0 => self.raw_text(len.min(64)),
            1 => "\u{1F600}".repeat(len / 4),
            _ => "r".repeat(len),
        }
    }

    /// Up to `max` bytes of the input, as they are.
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let len = self.below(max + 1);
        self.u.bytes(len).unwrap_or(&[])
    }

    /// Up to `max` bytes of the input as (lossy) text.
    pub fn raw_text(&mut self, max: usize) -> String {
        let len = self.below(max + 1);
        let bytes = self.u.bytes(len).unwrap_or(&[]);
        String::from_utf8_lossy(bytes).into_owned()
    }

    /// A duration string in the one grammar (and some that are not).
    pub fn duration(&mut self) -> String {
        if self.one_in(6) {
            // One to three parts of the grammar, some with a fraction.
            let mut text = String::new();
            for _ in 0..=self.below(3) {
                let n: u64 = self.u.arbitrary().unwrap_or(0);
                let unit = self.pick(&["ns", "us", "ms", "s", "m", "h", "d"]);
                if self.one_in(3) {
                    let fraction: u32 = self.u.arbitrary().unwrap_or(0);
                    text.push_str(&format!("{n}.{fraction}{unit}"));
                } else {
                    text.push_str(&format!("{n}{unit}"));
                }
            }
            return text;
        }
        DURATIONS[self.below(DURATIONS.len())].to_owned()
    }

    /// An IP address string.
    pub fn ip(&mut self) -> String {
        IPS[self.below(IPS.len())].to_owned()
    }

    /// `{"ip", "port"}`.
    pub fn address(&mut self) -> Value {
        let port = [0u64, 80, 8080, 9090, 65535, 65536][self.below(6)];
        json!({"ip": self.ip(), "port": port})
    }

    /// `{"region", "zone", "node"}`.
    pub fn locality(&mut self) -> Value {
        json!({
            "region": self.valid_name(),
            "zone": self.pick(&["eu-west-1a", "eu-west-1b", "zone-c"]),
            "node": self.pick(&["node-1", "node-2", "node-3"]),
        })
    }

    /// Tags: a few short ones, or many, or long ones.
    pub fn tags(&mut self) -> Value {
        let long = self.one_in(8);
        // Many labels, or long ones, but not both: one input stays cheap.
        let n = [0, 1, 2, 3, 64, 65, 1000][self.below(7)];
        let n = if long { n.min(3) } else { n };
        let tags: Vec<String> = (0..n)
            .map(|i| if long { self.text() } else { format!("t{i}") })
            .collect();
        json!(tags)
    }

    /// Metadata: like [`Self::tags`], as a map.
    pub fn metadata(&mut self) -> Value {
        let long = self.one_in(8);
        let n = [0, 1, 2, 64, 65, 1000][self.below(6)];
        let n = if long { n.min(3) } else { n };
        let mut map = Map::new();
        for i in 0..n {
            let v = if long { self.text() } else { format!("v{i}") };
            map.insert(format!("k{i}"), Value::String(v));
        }
        Value::Object(map)
    }

    /// A `HealthContract`: often `{}` (all defaults), otherwise a random subset of its
    /// fields with values from the edges.
    pub fn contract(&mut self) -> Value {
        let mut c = Map::new();
        if self.one_in(3) {
            return Value::Object(c);
        }
        let profiles = [
            json!({"probe": true, "self_report": true, "passive": true}),
            json!({"probe": false, "self_report": false, "passive": true}),
            json!({"probe": false, "self_report": true, "passive": true}),
            json!({"probe": false, "self_report": false, "passive": false}),
        ];
        let mut set = |g: &mut Self, key: &str, v: Value| {
            if g.one_in(2) {
                c.insert(key.to_owned(), v);
            }
        };
        let profile = profiles[self.below(profiles.len())].clone();
        set(self, "profile", profile);
        let probe = match self.below(4) {
            0 => Value::Null,
            1 => json!({"kind": "tcp", "interval": self.duration(), "timeout": self.duration()}),
            2 => json!({"kind": "grpc", "service": self.valid_name()}),
            _ => {
                json!({"kind": "http", "path": "/readyz", "interval": self.duration(), "timeout": self.duration()})
            }
        };
        set(self, "probe", probe);
        let d = json!(self.duration());
        set(self, "self_report_interval", d);
        let passive = json!({
            "interval": self.duration(),
            "min_requests": self.u64(),
            "error_rate": self.permille(),
        });
        set(self, "passive", passive);
        let scoring = json!({
            "half_life": self.duration(),
            "remove": self.permille(),
            "readmit": self.permille(),
            "readmit_hold": self.duration(),
            "corroborate": self.permille(),
            "silence_factor": self.u32(),
        });
        set(self, "scoring", scoring);
        let n = [0, 1, 2, 100][self.below(4)];
        let deps: Vec<Value> = (0..n)
            .map(|i| {
                json!({
                    "name": if self.one_in(3) { "db".to_owned() } else { format!("dep{i}") },
                    "shared": self.one_in(2),
                    "authority": self.pick(&["informational", "weight_reduction", "unreadiness"]),
                })
            })
            .collect();
        set(self, "dependencies", json!(deps));
        let d = json!(self.duration());
        set(self, "slow_start", d);
        for key in ["min_healthy", "uncorroborated_weight", "dependency_weight"] {
            let p = self.permille();
            set(self, key, json!(p));
        }
        let b = self.one_in(2);
        set(self, "silence_withdraws", json!(b));
        Value::Object(c)
    }

    /// An `Instance` (orchestrated or declared; the command decides the origin it keeps).
    pub fn instance(&mut self) -> Value {
        let id = if self.one_in(2) {
            self.instance_id()
        } else {
            format!("pod-{}", self.below(6))
        };
        if !self.ids.contains(&id) && self.ids.len() < 32 {
            self.ids.push(id.clone());
        }
        json!({
            "id": id,
            "service": self.valid_name(),
            "locality": self.locality(),
            "address": self.address(),
            "origin": self.pick(&["orchestrator", "registered", "external"]),
            "weight": self.u32(),
            "tags": self.tags(),
            "metadata": self.metadata(),
        })
    }

    /// A `ServicePolicyRecord`.
    pub fn policy(&mut self) -> Value {
        let mut p = Map::new();
        if self.one_in(2) {
            p.insert("min_healthy_override".into(), json!(self.permille()));
        }
        if self.one_in(2) {
            let n = [0, 1, 3, 500][self.below(4)];
            let zones: Vec<String> = (0..n).map(|i| format!("zone-{i}")).collect();
            p.insert("failover_zones".into(), json!(zones));
        }
        if self.one_in(2) {
            let regions: Vec<String> = (0..self.below(4)).map(|_| self.valid_name()).collect();
            p.insert("failover_regions".into(), json!(regions));
        }
        if self.one_in(2) {
            let callers: Vec<String> = (0..self.below(4)).map(|_| self.valid_name()).collect();
            p.insert("allowed_callers".into(), json!(callers));
        }
        Value::Object(p)
    }

    /// One registry `Command`, as JSON.
    pub fn command(&mut self) -> Value {
        match self.below(18) {
            0 | 1 => json!({
                "op": "put_service",
                "service": self.valid_name(),
                "owner": if self.one_in(4) { self.text() } else { "team".to_owned() },
                "contract": self.contract(),
            }),
            2 => json!({"op": "remove_service", "service": self.valid_name()}),
            3 | 4 => {
                let mut r = json!({
                    "op": "register",
                    "service": self.valid_name(),
                    "locality": self.locality(),
                    "address": self.address(),
                });
                let m = r.as_object_mut().expect("an object literal");
                if self.one_in(2) {
                    m.insert("lease_ms".into(), json!(self.u64()));
                }
                if self.one_in(3) {
                    m.insert("weight".into(), json!(self.u32()));
                }
                if self.one_in(3) {
                    m.insert("tags".into(), self.tags());
                }
                if self.one_in(3) {
                    m.insert("metadata".into(), self.metadata());
                }
                if self.one_in(4) {
                    m.insert("draining".into(), json!(true));
                }
                if self.one_in(4) {
                    m.insert("maintenance".into(), json!(self.text()));
                }
                r
            }
            5 => json!({"op": "renew", "instance": self.instance_id()}),
            6 => json!({"op": "deregister", "instance": self.instance_id()}),
            7 => json!({"op": "expire_leases"}),
            8 => json!({"op": "restart_leases"}),
            9 | 10 => {
                json!({"op": "observe", "instance": self.instance(), "draining": self.one_in(3)})
            }
            11 => json!({"op": "declare_external", "instance": self.instance()}),
            12 => json!({
                "op": self.pick(&["remove_external", "forget"]),
                "instance": self.instance_id(),
            }),
            13 => json!({
                "op": "maintenance",
                "instance": self.instance_id(),
                "reason": if self.one_in(2) { Value::Null } else { json!(self.text()) },
            }),
            14 => {
                json!({"op": "set_policy", "service": self.valid_name(), "policy": self.policy()})
            }
            15 => self.evacuation(),
            16 => self.region_failover(),
            _ => {
                let mut a = Map::new();
                for _ in 0..self.below(4) {
                    let probers: Vec<String> =
                        (0..self.below(4)).map(|_| self.valid_name()).collect();
                    a.insert(self.instance_id(), json!(probers));
                }
                json!({"op": "set_assignment", "assignment": a})
            }
        }
    }

    fn evacuation(&mut self) -> Value {
        let zone = self.pick(&["eu-west-1a", "eu-west-1b"]);
        if self.one_in(2) {
            let intent = match self.below(3) {
                0 => json!({"action": "evacuate", "manual": self.one_in(2)}),
                1 => json!({"action": "shift_back"}),
                _ => json!({"action": "complete_shift_back"}),
            };
            return json!({"op": "evacuation", "zone": zone, "intent": intent});
        }
        let progress = if self.one_in(3) {
            Value::Null
        } else {
            json!({
                "moved": self.permille(),
                "back": self.one_in(2),
                "manual": self.one_in(2),
                "awaiting_completion": self.one_in(2),
            })
        };
        json!({"op": "evacuation_progress", "zone": zone, "progress": progress})
    }

    fn region_failover(&mut self) -> Value {
        let region = self.valid_name();
        if self.one_in(2) {
            let intent = match self.below(3) {
                0 => json!({"action": "failover", "manual": self.one_in(2)}),
                1 => json!({"action": "shift_back"}),
                _ => json!({"action": "complete_shift_back"}),
            };
            return json!({
                "op": "region_failover",
                "region": region,
                "intent": intent,
                "actor": self.text(),
                "reason": self.text(),
            });
        }
        let progress = if self.one_in(3) {
            Value::Null
        } else {
            json!({
                "moved": self.permille(),
                "back": self.one_in(2),
                "manual": self.one_in(2),
                "awaiting_completion": self.one_in(2),
                "actor": self.text(),
                "reason": self.text(),
            })
        };
        json!({"op": "region_failover_progress", "region": region, "progress": progress})
    }

    /// The next stamp: usually a little after the last one, now and then from the edges
    /// (zero, far in the future, `u64::MAX`, backwards).
    pub fn stamp(&mut self) -> u64 {
        self.at_ms = match self.below(8) {
            0 => self.u64(),
            1 => self.at_ms.saturating_sub(1_000),
            2 => self.at_ms.saturating_add(700_000),
            _ => self.at_ms.saturating_add(self.below(10_000) as u64),
        };
        self.at_ms
    }

    /// A `Stamped` registry command, as JSON.
    pub fn stamped(&mut self) -> Value {
        let command = self.command();
        json!({"at_ms": self.stamp(), "command": command})
    }

    /// A `ViewEndpoint`.
    pub fn view_endpoint(&mut self, id: &str) -> Value {
        // Views carry many endpoints: their labels stay few, so one input stays cheap.
        let tags = &["canary", "v1"][..self.below(3)];
        let metadata = if self.one_in(2) {
            json!({})
        } else {
            json!({"version": "7"})
        };
        json!({
            "instance": id,
            "address": self.address(),
            "region": self.valid_name(),
            "zone": self.pick(&["eu-west-1a", "eu-west-1b"]),
            "tier": self.pick(&["local", "region", "remote"]),
            "priority": self.u32(),
            "weight": self.u32(),
            "status": self.pick(&["eligible", "degraded", "unknown", "disregarded", "draining"]),
            "verdict": self.pick(&["eligible", "degraded", "unknown", "ineligible", "quarantined", "draining"]),
            "tags": tags,
            "metadata": metadata,
        })
    }

    /// A `ReleasedView` of `service` in `zone`, at `version`.
    pub fn released_view(&mut self, service: &str, zone: &str, version: u64) -> Value {
        let n = [0, 1, 2, 3, 8, 64][self.below(6)];
        let mut endpoints = Map::new();
        for i in 0..n {
            let id = if i < 3 && self.one_in(2) {
                self.instance_id()
            } else {
                format!("{service}-{i}")
            };
            let e = self.view_endpoint(&id);
            endpoints.insert(id, e);
        }
        json!({
            "version": version,
            "view": {
                "key": {"service": service, "zone": zone},
                "endpoints": endpoints,
                "markers": self.markers(zone),
            }
        })
    }

    fn markers(&mut self, zone: &str) -> Value {
        let disregarded: Vec<&str> = if self.one_in(4) { vec![zone] } else { vec![] };
        let mut evacuating = Map::new();
        if self.one_in(4) {
            evacuating.insert(zone.to_owned(), json!(self.permille()));
        }
        let mut floor = Map::new();
        if self.one_in(4) {
            floor.insert(zone.to_owned(), json!(self.u32()));
        }
        json!({
            "health_disregarded": disregarded,
            "evacuating": evacuating,
            "no_eligible_in_region": self.one_in(4),
            "zone_floor": floor,
        })
    }

    /// A `Sample`'s `Observation`.
    pub fn observation(&mut self) -> Value {
        match self.below(8) {
            0 | 1 => json!({
                "class": "probe",
                "health": self.pick(&["pass", "fail", "timeout", "refused"]),
                "detail": if self.one_in(2) { Value::Null } else { json!(self.text()) },
            }),
            2 => json!({"class": "self_report", "kind": "ready"}),
            3 => json!({"class": "self_report", "kind": "draining"}),
            4 => json!({"class": "self_report", "kind": "not_ready", "detail": self.text()}),
            5 => json!({
                "class": "self_report",
                "kind": "dependency",
                "name": self.pick(&["db", "cache", "dep0"]),
                "status": self.pick(&["ok", "degraded", "down"]),
            }),
            _ => json!({"class": "passive", "requests": self.u64(), "errors": self.u64()}),
        }
    }

    /// A `Reporter`.
    pub fn reporter(&mut self) -> Value {
        if self.one_in(2) {
            json!({"kind": "node", "name": self.pick(&["node-1", "node-2", "node-3"])})
        } else {
            json!({"kind": "instance", "name": self.instance_id()})
        }
    }
}
