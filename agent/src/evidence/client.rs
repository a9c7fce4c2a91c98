//! The client half of the evidence protocol, as a node agent (or a workload, to its node
//! agent) opens it.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::Status;
use tracing::warn;

use super::pb::evidence_client::EvidenceClient;
use super::{
    AGENT_MESSAGE_BYTES_MAX, AUTHORITY_MESSAGE_BYTES_MAX, AgentMessage, AuthorityMessage, pb,
};

/// A client session: send with [`ClientSession::send`], read the authority's messages from
/// [`ClientSession::inbound`].
pub struct ClientSession {
    outbound: mpsc::Sender<pb::AgentMessage>,
    /// The authority's messages, validated. A malformed one arrives as an
    /// `INVALID_ARGUMENT` status naming what is wrong; the session is unusable after it.
    pub inbound: Inbound,
}

/// The authority's side of a session, as [`ClientSession::inbound`] yields it. `Sync` so
/// that a session can be shared by reference across an `await` in a spawned task.
pub type Inbound = Pin<Box<dyn Stream<Item = Result<AuthorityMessage, Status>> + Send + Sync>>;

impl std::fmt::Debug for ClientSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSession").finish_non_exhaustive()
    }
}

impl ClientSession {
    /// Open a session over `channel` (build it with mutual TLS: the identity is the
    /// reporter).
    pub async fn open(mut channel: tonic::transport::Channel) -> Result<Self, Status> {
        // Readiness first, so that a channel that cannot connect says `UNAVAILABLE`.
        tower::ServiceExt::ready(&mut channel)
            .await
            .map_err(|e| Status::unavailable(format!("evidence channel not ready: {e}")))?;
        let mut client = EvidenceClient::new(channel)
            .max_decoding_message_size(AUTHORITY_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(AGENT_MESSAGE_BYTES_MAX);
        let (tx, rx) = mpsc::channel::<pb::AgentMessage>(64);
        let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
        let response = client.session(tonic::Request::new(outbound)).await?;
        let inbound = response.into_inner().map(|message| {
            let message = message?;
            AuthorityMessage::try_from(message).map_err(|e| {
                let error = e.chain();
                warn!(reason = e.label(), %error, "evidence session: malformed message from the authority");
                Status::invalid_argument(super::codec::malformed(&error))
            })
        });
        Ok(Self {
            outbound: tx,
            inbound: Box::pin(inbound),
        })
    }

    /// Send one message.
    pub async fn send(&self, message: AgentMessage) -> Result<(), Status> {
        self.outbound
            .send(message.into())
            .await
            .map_err(|_| Status::unavailable("evidence session closed"))
    }
}
