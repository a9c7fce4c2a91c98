//! One DNS message in, one out: decoding, the question to [`DnsTable::answer`], error codes,
//! EDNS and truncation. Pure: the shell only moves bytes.
//!
//! - Not a query at all (shorter than a header, or a response): nothing is sent, so the
//!   server never reflects traffic. Undecodable, or not exactly one question: `FORMERR`.
//!   Both are counted as malformed.
//! - Opcode other than QUERY: `NOTIMP`. EDNS version above 0: `BADVERS`. Class other than
//!   IN (or ANY), zone transfers, names outside the domain: `REFUSED`.
//! - UDP answers fit the requester's EDNS buffer, at most [`UDP_PAYLOAD_MAX`] (the DNS Flag
//!   Day 2020 size, which avoids fragmentation), 512 bytes without EDNS. Too big: the
//!   additional section goes first (it is optional); still too big: the answer is sent
//!   empty with TC set, and the client retries over TCP.
//! - Answers are rotated by a counter the shell passes in, so clients that take the first
//!   address spread over the set (round robin, as BIND's cyclic order).

use hickory_proto::op::{Edns, Header, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

use super::origin::DnsOrigin;
use super::table::{Answer, DnsTable};

/// The largest UDP response, and the EDNS buffer size advertised.
pub(super) const UDP_PAYLOAD_MAX: u16 = 1232;
/// The largest response without EDNS (RFC 1035).
const UDP_PAYLOAD_PLAIN: u16 = 512;

/// How a message arrived, which bounds the size of the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Transport {
    /// One datagram each way.
    Udp,
    /// Length-prefixed messages on a stream (up to 64 KiB each).
    Tcp,
}

impl Transport {
    /// `udp` or `tcp`.
    pub(super) const fn as_str(self) -> &'static str {
        match self {
            Self::Udp => "udp",
            Self::Tcp => "tcp",
        }
    }
}

/// What became of one received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// A query, answered.
    Answered {
        /// The response to send; `None` only if not even `SERVFAIL` could be encoded.
        reply: Option<Vec<u8>>,
        /// The question's type.
        qtype: RecordType,
        /// The response code sent.
        rcode: ResponseCode,
        /// Whether the answer was cut to fit (TC set).
        truncated: bool,
    },
    /// Not a well-formed single-question query.
    Malformed {
        /// `FORMERR`, when the header could be read and the message was a query; else
        /// nothing is sent.
        reply: Option<Vec<u8>>,
        /// What was wrong, for the debug log.
        reason: &'static str,
    },
}

/// The response to `request` from `table`. `rotation` picks which answer comes first.
pub(super) fn respond(
    table: &DnsTable,
    origin: &DnsOrigin,
    request: &[u8],
    transport: Transport,
    rotation: usize,
) -> Outcome {
    let Ok(header) = Header::read(&mut BinDecoder::new(request)) else {
        return malformed(None, "shorter than a header");
    };
    let meta = header.metadata;
    if meta.message_type == MessageType::Response {
        return malformed(None, "a response, not a query");
    }
    let formerr = || {
        Message::error_msg(meta.id, meta.op_code, ResponseCode::FormErr)
            .to_vec()
            .ok()
    };
    // Checked before decoding: the decoder reserves room for as many questions as claimed.
    if header.counts.queries != 1 {
        return malformed(formerr(), "not exactly one question");
    }
    let Ok(request) = Message::from_vec(request) else {
        return malformed(formerr(), "undecodable");
    };
    let Some(query) = request.queries.first() else {
        return malformed(formerr(), "not exactly one question");
    };
    let qtype = query.query_type();

    let mut response = Message::response(meta.id, meta.op_code);
    response.metadata.recursion_desired = meta.recursion_desired;
    response.metadata.checking_disabled = meta.checking_disabled;
    response.add_query(query.clone());
    if request.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(UDP_PAYLOAD_MAX);
        response.set_edns(edns);
    }
    let rcode = if meta.op_code != OpCode::Query {
        ResponseCode::NotImp
    } else if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
        ResponseCode::BADVERS
    } else if !matches!(query.query_class(), DNSClass::IN | DNSClass::ANY)
        || matches!(qtype, RecordType::AXFR | RecordType::IXFR)
    {
        ResponseCode::Refused
    } else {
        match table.answer(origin, query.name(), qtype) {
            Answer::Records {
                mut answers,
                additionals,
            } => {
                if !answers.is_empty() {
                    let first = rotation % answers.len();
                    answers.rotate_left(first);
                }
                response.metadata.authoritative = true;
                response.insert_answers(answers);
                response.insert_additionals(additionals);
                ResponseCode::NoError
            }
            Answer::NoData { soa } => {
                response.metadata.authoritative = true;
                response.add_authority(soa);
                ResponseCode::NoError
            }
            Answer::NxDomain { soa } => {
                response.metadata.authoritative = true;
                response.add_authority(soa);
                ResponseCode::NXDomain
            }
            Answer::NotOurs => ResponseCode::Refused,
        }
    };
    response.metadata.response_code = rcode;

    let limit = match transport {
        Transport::Udp => request
            .edns
            .as_ref()
            .map_or(UDP_PAYLOAD_PLAIN, |e| {
                e.max_payload().max(UDP_PAYLOAD_PLAIN)
            })
            .min(UDP_PAYLOAD_MAX),
        Transport::Tcp => u16::MAX,
    };
    match encode(response, usize::from(limit)) {
        Some((reply, truncated)) => Outcome::Answered {
            reply: Some(reply),
            qtype,
            rcode,
            truncated,
        },
        None => Outcome::Answered {
            reply: Message::error_msg(meta.id, meta.op_code, ResponseCode::ServFail)
                .to_vec()
                .ok(),
            qtype,
            rcode: ResponseCode::ServFail,
            truncated: false,
        },
    }
}

fn malformed(reply: Option<Vec<u8>>, reason: &'static str) -> Outcome {
    Outcome::Malformed { reply, reason }
}

/// `response` in at most `limit` bytes, and whether it had to be truncated. `None` if it
/// cannot be encoded at all.
fn encode(mut response: Message, limit: usize) -> Option<(Vec<u8>, bool)> {
    let bytes = response.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some((bytes, false));
    }
    // The additional section is optional (RFC 2181 §9): drop it before truncating.
    if !response.additionals.is_empty() {
        response.additionals.clear();
        let bytes = response.to_vec().ok()?;
        if bytes.len() <= limit {
            return Some((bytes, false));
        }
    }
    let bytes = response.truncate().to_vec().ok()?;
    Some((bytes, true))
}

#[cfg(test)]
mod tests;
