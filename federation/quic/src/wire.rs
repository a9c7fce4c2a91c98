//! Length-prefixed JSON frames on the one bidirectional stream of a federation link.
//!
//! ```text
//! ┌──────────────────────┬──────────────────────────────────────┐
//! │ length: u32, big end │ JSON of one session::Message         │
//! └──────────────────────┴──────────────────────────────────────┘
//! ```
//!
//! The reader refuses a length above `message_bytes_max` before reading the body, so a peer
//! cannot make us buffer more than that. The writer splits an `Entries` message that
//! encodes above the limit into halves (entries are independent), and refuses only a
//! single entry or a digest that alone exceeds it.

use quinn::VarInt;
use tokio::io::{AsyncRead, AsyncReadExt as _};
use waymark_federation::session::Message;

/// Application close code: the node is shutting down.
pub(crate) const CLOSE_SHUTDOWN: VarInt = VarInt::from_u32(0);
/// Application close code: the peer's identity is not admitted on this link.
pub(crate) const CLOSE_REFUSED: VarInt = VarInt::from_u32(1);
/// Application close code: the peer broke the framing (too large, not a message).
pub(crate) const CLOSE_PROTOCOL: VarInt = VarInt::from_u32(2);
/// Application close code: a newer connection from the same peer replaced this one.
pub(crate) const CLOSE_REPLACED: VarInt = VarInt::from_u32(3);
/// Application close code: the link ended for another reason (stream error, local bug).
pub(crate) const CLOSE_LINK_ENDED: VarInt = VarInt::from_u32(4);

/// Why a frame could not be read or written. The link that produced it is closed with an
/// application error and redialled after backoff; the aggregates are unchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame is longer than `message_bytes_max`. Inbound: nothing past the length was
    /// read and the link is closed. Outbound: that message is not sent (the next digest
    /// round asks again); raise `message_bytes_max` or lower `entries_per_message`.
    #[error("frame of {len} bytes exceeds the {max} allowed")]
    TooLarge {
        /// The frame's length.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// The frame is not a federation message. The link is closed.
    #[error("frame is not a federation message")]
    Decode(#[source] serde_json::Error),
    /// The stream failed or ended mid-frame. The link is closed.
    #[error("federation stream read failed")]
    Read(#[source] std::io::Error),
}

/// One encoded frame, ready to write.
#[derive(Debug)]
pub(crate) struct Frame {
    /// `digest` or `entries`, for the messages metric.
    pub(crate) kind: &'static str,
    /// Length prefix and body.
    pub(crate) bytes: Vec<u8>,
}

/// The metric label of a message.
pub(crate) fn kind_of(message: &Message) -> &'static str {
    match message {
        Message::Digest { .. } => "digest",
        Message::Entries { .. } => "entries",
    }
}

/// Encodes a message into one frame, or several when an `Entries` message is too large;
/// the errors are the parts that cannot fit even alone.
pub(crate) fn encode(message: Message, max: u32) -> Vec<Result<Frame, FrameError>> {
    let mut out = Vec::new();
    encode_into(message, max, &mut out);
    out
}

fn encode_into(message: Message, max: u32, out: &mut Vec<Result<Frame, FrameError>>) {
    let kind = kind_of(&message);
    let body = serde_json::to_vec(&message)
        .expect("a Message has only string map keys, so it always encodes as JSON");
    let len = body.len() as u64;
    if let Ok(len32) = u32::try_from(body.len())
        && len32 <= max
    {
        let mut bytes = Vec::with_capacity(4 + body.len());
        bytes.extend_from_slice(&len32.to_be_bytes());
        bytes.extend_from_slice(&body);
        out.push(Ok(Frame { kind, bytes }));
        return;
    }
    match message {
        Message::Entries { mut entries } if entries.len() > 1 => {
            let tail = entries.split_off(entries.len() / 2);
            encode_into(Message::Entries { entries }, max, out);
            encode_into(Message::Entries { entries: tail }, max, out);
        }
        _ => out.push(Err(FrameError::TooLarge { len, max })),
    }
}

/// Reads one frame. Not cancel-safe: the caller keeps the future alive until it returns
/// (the link's reader loop does).
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: u32,
) -> Result<Message, FrameError> {
    let mut prefix = [0u8; 4];
    reader
        .read_exact(&mut prefix)
        .await
        .map_err(FrameError::Read)?;
    let len = u32::from_be_bytes(prefix);
    if len > max {
        return Err(FrameError::TooLarge {
            len: u64::from(len),
            max,
        });
    }
    let mut body = vec![0u8; len as usize];
    reader
        .read_exact(&mut body)
        .await
        .map_err(FrameError::Read)?;
    serde_json::from_slice(&body).map_err(FrameError::Decode)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use waymark_core::model::{RegionName, ServiceName};
    use waymark_federation::aggregate::{Entry, ServiceAggregate};

    use super::*;

    fn entries(n: usize) -> Message {
        Message::Entries {
            entries: (0..n)
                .map(|i| Entry {
                    region: RegionName::try_new("eu").unwrap(),
                    service: ServiceName::try_new(format!("service-{i}")).unwrap(),
                    version: 1,
                    aggregate: Arc::new(ServiceAggregate::default()),
                })
                .collect(),
        }
    }

    #[tokio::test]
    async fn a_frame_round_trips() {
        let message = entries(3);
        let frames = encode(message.clone(), 1 << 20);
        assert_eq!(frames.len(), 1);
        let bytes = frames.into_iter().next().unwrap().unwrap().bytes;
        let back = read_frame(&mut bytes.as_slice(), 1 << 20).await.unwrap();
        assert_eq!(back, message);
    }

    #[tokio::test]
    async fn an_oversized_length_is_refused_before_the_body_is_read() {
        let mut bytes = 5_000u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[b'x'; 16]);
        let err = read_frame(&mut bytes.as_slice(), 4_096).await.unwrap_err();
        assert!(matches!(
            err,
            FrameError::TooLarge {
                len: 5_000,
                max: 4_096
            }
        ));
    }

    #[tokio::test]
    async fn garbage_is_a_decode_error_not_a_panic() {
        let mut bytes = 3u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(b"{x]");
        let err = read_frame(&mut bytes.as_slice(), 4_096).await.unwrap_err();
        assert!(matches!(err, FrameError::Decode(_)));
    }

    #[tokio::test]
    async fn an_entries_message_too_large_for_one_frame_is_split_losslessly() {
        let one = encode(entries(1), u32::MAX)
            .pop()
            .unwrap()
            .unwrap()
            .bytes
            .len();
        let max = u32::try_from(one * 3).unwrap();
        let frames = encode(entries(16), max);
        assert!(frames.len() > 1);
        let mut received = Vec::new();
        for frame in frames {
            let bytes = frame.unwrap().bytes;
            match read_frame(&mut bytes.as_slice(), max).await.unwrap() {
                Message::Entries { entries } => received.extend(entries),
                Message::Digest { .. } => panic!("digest out of entries"),
            }
        }
        let Message::Entries { entries: sent } = entries(16) else {
            unreachable!()
        };
        assert_eq!(received, sent);
    }

    #[test]
    fn a_single_entry_above_the_limit_is_a_typed_error() {
        let frames = encode(entries(1), 8);
        assert!(matches!(
            frames.as_slice(),
            [Err(FrameError::TooLarge { max: 8, .. })]
        ));
    }
}
