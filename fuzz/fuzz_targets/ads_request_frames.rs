//! The request side of an ADS stream served on HTTP/2 directly: the gRPC deframer
//! (`waymark_xds::server::http2::Deframer`) over a body cut into arbitrary chunks, and each
//! message it hands out decoded as both kinds of discovery request, as a stream does.
//!
//! Input: the first byte picks the message-size limit, the second how the rest (the body)
//! is cut into chunks. Checked: every message is within the limit; the messages handed out,
//! framed again, are exactly the start of the body; once the deframer refuses, the stream
//! is over; at the end of the body the deframer is empty exactly when all of it was handed
//! out.
#![no_main]

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use waymark_fuzz::capped;
use waymark_xds::server::http2::Deframer;

const LIMITS: [usize; 4] = [0, 5, 300, 1024 * 1024];

fuzz_target!(|data: &[u8]| run(capped(data)));

fn run(data: &[u8]) {
    let [limit, cut, body @ ..] = data else {
        return;
    };
    let max = LIMITS[usize::from(*limit) % LIMITS.len()];
    let cut = 1 + usize::from(*cut);
    let mut frames = Deframer::new(max);
    let mut framed_again = Vec::with_capacity(body.len());
    let mut refused = false;
    'body: for chunk in body.chunks(cut) {
        frames.push(Bytes::copy_from_slice(chunk));
        loop {
            match frames.next_message() {
                Ok(Some(message)) => {
                    assert!(message.len() <= max, "a message over the limit came out");
                    framed_again.push(0);
                    framed_again.extend_from_slice(&(message.len() as u32).to_be_bytes());
                    framed_again.extend_from_slice(&message);
                    let _ = DeltaDiscoveryRequest::decode(message.clone());
                    let _ = DiscoveryRequest::decode(message);
                }
                Ok(None) => break,
                Err(_) => {
                    refused = true;
                    break 'body;
                }
            }
        }
    }
    assert_eq!(
        framed_again[..],
        body[..framed_again.len()],
        "what came out is not what went in"
    );
    if !refused {
        assert_eq!(
            frames.is_empty(),
            framed_again.len() == body.len(),
            "empty exactly when everything was handed out"
        );
    }
}
