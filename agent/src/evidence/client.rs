//! The client half of the evidence protocol, as a node agent (or a workload, to its node
//! agent) opens it.

use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::codec::JsonCodec;
use super::{
    AGENT_MESSAGE_BYTES_MAX, AUTHORITY_MESSAGE_BYTES_MAX, AgentMessage, AuthorityMessage,
    SESSION_PATH,
};

/// A client session: send with [`ClientSession::send`], read the authority's messages from
/// [`ClientSession::inbound`].
#[derive(Debug)]
pub struct ClientSession {
    outbound: mpsc::Sender<AgentMessage>,
    /// The authority's messages.
    pub inbound: Streaming<AuthorityMessage>,
}

impl ClientSession {
    /// Open a session over `channel` (build it with mutual TLS: the identity is the
    /// reporter).
    pub async fn open(channel: tonic::transport::Channel) -> Result<Self, Status> {
        let mut grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(AUTHORITY_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(AGENT_MESSAGE_BYTES_MAX);
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("evidence channel not ready: {e}")))?;
        let (tx, rx) = mpsc::channel::<AgentMessage>(64);
        let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
        let response = grpc
            .streaming(
                tonic::Request::new(outbound),
                http::uri::PathAndQuery::from_static(SESSION_PATH),
                JsonCodec::<AgentMessage, AuthorityMessage>::default(),
            )
            .await?;
        Ok(Self {
            outbound: tx,
            inbound: response.into_inner(),
        })
    }

    /// Send one message.
    pub async fn send(&self, message: AgentMessage) -> Result<(), Status> {
        self.outbound
            .send(message)
            .await
            .map_err(|_| Status::unavailable("evidence session closed"))
    }
}
