//! The evidence protocol both roles speak: one gRPC stream per reporter carrying probe
//! results, self-reports and forwarded load reports, each attributed by the connection's
//! mutual-TLS identity (ADR-15).
//!
//! ```text
//! node agent ──ClientSession──► authority member: EvidenceService ──► EvidenceHub (leader)
//! workload   ──ClientSession──► its node agent:   EvidenceService ──► LocalRelay ──► Relayed
//! ```
//!
//! The wire never names the reporter: the serving side takes it from the verified peer
//! certificate, so a sample cannot claim to come from someone else. What the reporter may
//! say is then checked by [`waymark_registry::ingest::admit`] on the leader (a probe only
//! about an assigned target, a self-report only about itself). Refusals are counted and
//! returned in the acknowledgement; they are never applied.
//!
//! The service is `waymark.evidence.v1.Evidence/Session`, bidirectional, with protobuf
//! messages defined in `agent/proto/waymark/evidence/v1/evidence.proto` (generated into
//! [`pb`] by `build.rs`), so a workload in any language can self-report with stock gRPC
//! tooling. The agent sends `hello` and `samples`; the authority answers with the node's
//! probe `assignment` whenever it changes and an `ack` per batch. A node agent also reports
//! its own xDS clients and answers the authority's config requests (`sidecars.rs`) and
//! keyring requests (`keyring.rs`). The types below are the
//! validated form the roles work with; `wire.rs` converts, refusing a malformed message
//! with a typed [`WireError`]. Neither role owns the protocol, so it sits beside both (the
//! authority's sink is `authority/hub.rs`, the node's `node/selfreport.rs` and
//! `node/session.rs`).

mod client;
mod codec;
mod keyring;
mod server;
mod sidecars;
mod wire;

use waymark_core::contract::ProbeSpec;
use waymark_core::model::{Address, InstanceId, Observation, ServiceName, ZoneName};

pub use client::{ClientSession, Inbound};
pub use codec::{ProtoCodec, ProtoDecoder, ProtoEncoder};
pub use keyring::{
    KEYRING_MESSAGE_BYTES_MAX, KEYRING_REASON_BYTES_MAX, KeyringAnswer, KeyringOutcome,
    KeyringRequest,
};
pub use server::{
    Ack, EvidenceService, EvidenceSink, MalformedLabels, SessionMetrics, SessionStream, reporter_of,
};
pub use sidecars::{
    CLIENT_CONFIG_BYTES_MAX, CLIENT_ID_BYTES_MAX, ClientConfig, ClientConfigBody, ConfigRequest,
    HeldAssignment, HeldCluster, HeldEndpoint, IDENTITY_BYTES_MAX, LABEL_BYTES_MAX, Marker,
    NACK_ERROR_BYTES_MAX, Nack, SIDECAR_CLIENTS_MAX, SIDECAR_REPORT_BYTES_MAX, SIDECAR_TYPES_MAX,
    SidecarBody, SidecarClient, SidecarReport, SidecarReportBody, TYPE_URL_BYTES_MAX, TypeSync,
    TypeSyncBody, VERSION_BYTES_MAX, XdsProtocol, clipped,
};
pub use wire::WireError;

/// The messages and service stubs generated from `evidence.proto` (package
/// `waymark.evidence.v1`). Speak the validated types above; convert at the edge with
/// `From` / `TryFrom` (see [`WireError`]).
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/waymark.evidence.v1.rs"));
}

/// The gRPC service name.
pub const SERVICE: &str = "waymark.evidence.v1.Evidence";
/// The one method's path.
pub const SESSION_PATH: &str = "/waymark.evidence.v1.Evidence/Session";
/// Samples accepted in one message; larger batches are refused whole.
pub const BATCH_MAX: usize = 4096;
/// Largest message an agent may send (a full batch of probe results or self-reports with
/// every detail at [`DETAIL_BYTES_MAX`] does not fit: such a batch is split by its sender);
/// a larger one ends the session with `OUT_OF_RANGE` before it is decoded.
pub const AGENT_MESSAGE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Largest message the authority sends (a node's whole probe assignment).
pub const AUTHORITY_MESSAGE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Longest detail (a probe's output, a workload's not-ready explanation) a sample may
/// carry. The core keeps [`waymark_core::audit::DETAIL_LEN_MAX`] of it; the wire admits
/// more so that a reporter that does not cut its own words is not refused for it.
pub const DETAIL_BYTES_MAX: usize = 4096;
/// Longest refusal reason label in an acknowledgement.
pub const REASON_BYTES_MAX: usize = 64;

/// What an agent sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentMessage {
    /// First message of a node agent: its zone, so it can be assigned probe targets there.
    Hello {
        /// The node's zone.
        zone: ZoneName,
    },
    /// Evidence; the reporter is the connection's identity.
    Samples {
        /// The samples.
        samples: Vec<WireSample>,
    },
    /// Self-reports a node agent received from workloads on its host, each verified by the
    /// agent against the workload's own mutual-TLS identity and about that workload only.
    /// The authority admits one only if the instance runs on the relaying node.
    Relayed {
        /// The self-reports.
        samples: Vec<WireSample>,
    },
    /// A node agent's own xDS clients and their sync state, whole (see [`SidecarReport`]).
    Sidecars {
        /// The report.
        report: SidecarReport,
    },
    /// A node agent's answer to an [`AuthorityMessage::ConfigRequest`].
    ClientConfig(ClientConfig),
    /// A node agent's answer to an [`AuthorityMessage::KeyringRequest`].
    KeyringAnswer(KeyringAnswer),
}

/// Separates a check's own words from text the target chose (an HTTP body, a gRPC status
/// message) in an observation's detail: `HTTP 503; said: database down`. The prober writes
/// it; the target may be anything the registry names, so read paths that must not relay its
/// words cut a detail here (the authority's audit read path does; `explain` shows it).
pub const TARGET_TEXT_MARKER: &str = "; said: ";

/// One sample as sent: about which instance, and what was observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireSample {
    /// The instance it is about.
    pub instance: InstanceId,
    /// What was observed.
    pub observation: Observation,
}

/// What the authority sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorityMessage {
    /// The node's probe targets, whole, whenever they change.
    Assignment {
        /// What to probe.
        targets: Vec<ProbeTarget>,
    },
    /// The outcome of one `samples` message.
    Ack {
        /// Samples admitted to the evaluator.
        accepted: u64,
        /// Samples refused, with the reason label.
        refused: Vec<RefusedSample>,
    },
    /// What one of the node's xDS clients holds; answered with
    /// [`AgentMessage::ClientConfig`].
    ConfigRequest(ConfigRequest),
    /// List or change the node's gossip keyring; answered with
    /// [`AgentMessage::KeyringAnswer`].
    KeyringRequest(KeyringRequest),
}

/// One target a node must probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    /// The instance.
    pub instance: InstanceId,
    /// Its service.
    pub service: ServiceName,
    /// Where to probe it.
    pub address: Address,
    /// How. While `confirmation` holds, its interval is the contract's confirmation
    /// cadence.
    pub probe: ProbeSpec,
    /// Callers' outcomes are this instance's primary evidence (ADR-04): the probe only
    /// confirms them, at the slower cadence.
    pub confirmation: bool,
}

/// A refused sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedSample {
    /// The instance it was about.
    pub instance: InstanceId,
    /// A stable reason label (`not_assigned`, `not_attributable`, `unknown_target`, …).
    pub reason: String,
}
