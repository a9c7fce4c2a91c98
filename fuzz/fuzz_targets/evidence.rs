//! Evidence, from the wire to released views: the evidence stream's protobuf messages
//! (`pb::AgentMessage`, `pb::AuthorityMessage` decoded by prost, then validated by their
//! `TryFrom` into `AgentMessage` / `AuthorityMessage`), identity → reporter
//! (`reporter_of`), admission (`waymark_registry::ingest::admit`) against a registry the
//! input builds, and the leader's pipeline (`RegionPipeline`: evaluator, assembler, delta
//! queues) fed the admitted samples, registry changes and timeouts with a virtual clock.
//!
//! Input: JSON lines (each a `Stamped` command, `{"agent_message": "<hex protobuf>"}`,
//! `{"authority_message": "<hex protobuf>"}` or a `"spiffe://…"` identity string naming the
//! session), or bytes for the structured decoder, which builds messages from the
//! vocabulary (invalid names, unknown enum values, unset oneofs included) or takes raw
//! bytes as protobuf. Checked: nothing panics; a message that validates survives its own
//! encoding unchanged; every released view's version is above the last one released for
//! its key.
#![no_main]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use serde_json::Value;
use waymark_agent::evidence::{AgentMessage, AuthorityMessage, BATCH_MAX, pb, reporter_of};
use waymark_certs::identity::Identity;
use waymark_core::delta::DeltaConfig;
use waymark_core::evaluator::EvaluatorConfig;
use waymark_core::model::{
    EvidenceClass, NodeName, Observation, RegionName, Reporter, Sample, ZoneName,
};
use waymark_core::view::{MonotonicCounter, Version, ViewKey};
use waymark_fuzz::{Gen, Limits, capped, is_json_lines, lines};
use waymark_registry::ingest::admit;
use waymark_registry::pipeline::{Output, PipelineConfig, RegionPipeline};
use waymark_registry::state::{Applied, DesiredState, Stamped};

fuzz_target!(|data: &[u8]| run(capped(data)));

/// One step of the input.
enum Step {
    Command(Stamped),
    Message(AgentMessage),
    Identity(String),
    Advance(Duration),
}

fn run(data: &[u8]) {
    let mut region = Region::new();
    for step in steps(data) {
        region.step(step);
    }
}

struct Region {
    state: DesiredState,
    pipeline: RegionPipeline,
    versions: MonotonicCounter,
    now: Instant,
    session: Reporter,
    released: BTreeMap<ViewKey, Version>,
}

impl Region {
    fn new() -> Self {
        let zone = |z: &str| ZoneName::try_new(z).expect("a valid zone");
        let config = PipelineConfig {
            region: RegionName::try_new("web").expect("a valid region"),
            zones: [zone("eu-west-1a"), zone("eu-west-1b")]
                .into_iter()
                .collect(),
            evaluator: EvaluatorConfig::default(),
            delta: DeltaConfig::default(),
            fraction_guard: true,
        };
        let state = DesiredState::new();
        let now = Instant::now();
        Self {
            pipeline: RegionPipeline::rebuild(config, &state, now),
            state,
            versions: MonotonicCounter::default(),
            now,
            session: Reporter::Node(NodeName::try_new("node-1").expect("a valid node")),
            released: BTreeMap::new(),
        }
    }

    fn step(&mut self, step: Step) {
        match step {
            Step::Command(stamped) => {
                if let Ok(applied) = self.state.apply(stamped) {
                    self.pipeline
                        .handle_applied(self.now, &applied, &self.state);
                }
            }
            Step::Identity(uri) => {
                if let Ok(identity) = Identity::parse(&uri) {
                    let region = RegionName::try_new("web").expect("a valid region");
                    if let Some(reporter) = reporter_of(&identity, &region) {
                        self.session = reporter;
                    }
                }
            }
            Step::Message(message) => self.ingest(message),
            Step::Advance(by) => {
                self.now += by;
                // Fire what is due, as the leader's loop does, a bounded number of times.
                for _ in 0..16 {
                    match self.pipeline.poll_timeout() {
                        Some(due) if due <= self.now => {
                            self.pipeline.handle_timeout(self.now, &mut self.versions);
                        }
                        _ => break,
                    }
                }
            }
        }
        self.check_outputs();
    }

    /// What `EvidenceHub::ingest` / `ingest_relayed` do with a decoded message, minus the
    /// channels: the batch cap, the relay's self-report-only rule, `admit`, the pipeline.
    fn ingest(&mut self, message: AgentMessage) {
        let (samples, relayed) = match message {
            AgentMessage::Hello { .. }
            | AgentMessage::Sidecars { .. }
            | AgentMessage::ClientConfig(_)
            | AgentMessage::KeyringAnswer(_) => return,
            AgentMessage::Samples { samples } => (samples, false),
            AgentMessage::Relayed { samples } => (samples, true),
        };
        // The wire refuses larger batches before a message gets here.
        assert!(samples.len() <= BATCH_MAX, "a batch of {}", samples.len());
        for wire in samples {
            let reporter = if relayed {
                if wire.observation.class() != EvidenceClass::SelfReport {
                    continue;
                }
                Reporter::Instance(wire.instance.clone())
            } else {
                self.session.clone()
            };
            let sample = Sample {
                instance: wire.instance,
                reporter,
                observation: wire.observation,
            };
            if admit(&self.state, &sample).is_ok() {
                let _ = self.pipeline.handle_sample(self.now, sample);
            }
        }
    }

    fn check_outputs(&mut self) {
        for output in self.pipeline.take_outputs() {
            if let Output::Release(view) = output {
                let key = view.view.key.clone();
                if let Some(last) = self.released.get(&key) {
                    assert!(
                        view.version > *last,
                        "{key} released at {:?} after {last:?}",
                        view.version
                    );
                }
                self.released.insert(key, view.version);
            }
        }
    }
}

/// What the serving side does with a message's bytes: decode, validate. A message that
/// validates must survive its own encoding.
fn agent_message(bytes: &[u8]) -> Option<AgentMessage> {
    let wire = pb::AgentMessage::decode(bytes).ok()?;
    let message = AgentMessage::try_from(wire).ok()?;
    let again = pb::AgentMessage::decode(
        pb::AgentMessage::from(message.clone())
            .encode_to_vec()
            .as_slice(),
    )
    .expect("our own encoding parses");
    assert_eq!(
        AgentMessage::try_from(again).as_ref(),
        Ok(&message),
        "round trip"
    );
    Some(message)
}

/// What the agent's client does with the authority's bytes.
fn authority_message(bytes: &[u8]) {
    let Ok(wire) = pb::AuthorityMessage::decode(bytes) else {
        return;
    };
    let Ok(message) = AuthorityMessage::try_from(wire) else {
        return;
    };
    let again = pb::AuthorityMessage::decode(
        pb::AuthorityMessage::from(message.clone())
            .encode_to_vec()
            .as_slice(),
    )
    .expect("our own encoding parses");
    assert_eq!(
        AuthorityMessage::try_from(again).as_ref(),
        Ok(&message),
        "round trip"
    );
}

fn steps(data: &[u8]) -> Vec<Step> {
    if is_json_lines(data) || data.first() == Some(&b'"') {
        let mut out = Vec::new();
        for line in lines(data) {
            if let Ok(s) = serde_json::from_slice::<Stamped>(line) {
                out.push(Step::Command(s));
            } else if let Ok(uri) = serde_json::from_slice::<String>(line) {
                out.push(Step::Identity(uri));
            } else if let Ok(v) = serde_json::from_slice::<Value>(line) {
                if let Some(bytes) = v["agent_message"].as_str().and_then(unhex) {
                    if let Some(m) = agent_message(&bytes) {
                        out.push(Step::Message(m));
                    }
                } else if let Some(bytes) = v["authority_message"].as_str().and_then(unhex) {
                    authority_message(&bytes);
                }
            }
            out.push(Step::Advance(Duration::from_secs(1)));
        }
        return out;
    }
    let mut g = Gen::new(data);
    let mut probe = DesiredState::new();
    let mut out = Vec::new();
    while !g.is_empty() && out.len() < Limits::STEPS_MAX * 2 {
        let step = match g.below(9) {
            0..=2 => {
                let Some(s) = waymark_fuzz::decode::<Stamped>(g.stamped()) else {
                    continue;
                };
                if let Ok(Applied::Registered { instance, .. }) = probe.apply(s.clone()) {
                    g.ids.push(instance.to_string());
                }
                Step::Command(s)
            }
            3..=5 => {
                let Some(m) = agent_message(&message(&mut g).encode_to_vec()) else {
                    continue;
                };
                Step::Message(m)
            }
            6 => {
                // Raw bytes as protobuf, for both halves.
                let raw = g.bytes(4096);
                authority_message(raw);
                let Some(m) = agent_message(raw) else {
                    continue;
                };
                Step::Message(m)
            }
            7 => Step::Identity(identity(&mut g)),
            _ => Step::Advance(Duration::from_millis(
                [1, 100, 1_000, 5_000, 30_000, 600_000][g.below(6)],
            )),
        };
        out.push(step);
    }
    out
}

/// A message built from the vocabulary: the names may be invalid, and sometimes a oneof is
/// unset, an enum holds a value no version knows, or a batch is over its cap.
fn message(g: &mut Gen<'_>) -> pb::AgentMessage {
    use pb::agent_message::Message;
    if g.one_in(16) {
        return pb::AgentMessage { message: None };
    }
    if g.one_in(8) {
        return pb::AgentMessage {
            message: Some(Message::Hello(pb::Hello {
                zone: g.valid_name(),
            })),
        };
    }
    let n = if g.one_in(64) {
        BATCH_MAX + 1
    } else {
        [1, 2, 4, 16][g.below(4)]
    };
    let mut samples: Vec<pb::Sample> = Vec::with_capacity(n);
    for i in 0..n {
        if i >= 16 {
            // Past the few the vocabulary varies, copies: the cap is what is under test.
            samples.push(samples[i % 16].clone());
            continue;
        }
        samples.push(sample(g));
    }
    if g.one_in(3) {
        pb::AgentMessage {
            message: Some(Message::Relayed(pb::Relayed { samples })),
        }
    } else {
        pb::AgentMessage {
            message: Some(Message::Samples(pb::Samples { samples })),
        }
    }
}

fn sample(g: &mut Gen<'_>) -> pb::Sample {
    use pb::observation::Class;
    use pb::self_report::Kind;
    let mut observation = waymark_fuzz::decode::<Observation>(g.observation())
        .map(pb::Observation::from)
        .unwrap_or_default();
    match (g.below(8), observation.class.as_mut()) {
        (0, _) => observation.class = None,
        (1, Some(Class::Probe(p))) => p.health = [0, 5, 99, -1][g.below(4)],
        (1, Some(Class::SelfReport(r))) => match r.kind.as_mut() {
            Some(Kind::Dependency(d)) => d.status = [0, 4, 99, -1][g.below(4)],
            _ => r.kind = None,
        },
        _ => {}
    }
    pb::Sample {
        instance: g.instance_id(),
        observation: (!g.one_in(16)).then_some(observation),
    }
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn identity(g: &mut Gen<'_>) -> String {
    let id = g.instance_id();
    match g.below(5) {
        0 => "spiffe://example.org/region/web/node/node-2".to_owned(),
        1 => format!("spiffe://example.org/region/web/service/web/instance/{id}"),
        2 => format!("spiffe://example.org/region/eu/service/web/instance/{id}"),
        3 => "spiffe://example.org/region/web/authority/m1".to_owned(),
        _ => format!("spiffe://{}", g.raw_text(48)),
    }
}
