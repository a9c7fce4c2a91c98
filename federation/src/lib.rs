//! waymark's cross-region federation.
//!
//! Built: [`aggregate`], each region's read-only aggregate as a CRDT with pure merge,
//! digest-based anti-entropy and reconciliation records; [`session`], the sans-I/O
//! anti-entropy session with one peer (digests, bounded entry messages, peer age). To
//! come: the session's driver over mutually authenticated QUIC (authority identities only), peer
//! ages and staleness, the out-of-band region signal and failover controls. A peer
//! region's aggregate only feeds tier 2 of the views
//! (`waymark_core::assembler::RemoteEndpoint`).
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod aggregate;
pub mod session;
