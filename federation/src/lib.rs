//! waymark's cross-region federation.
//!
//! Built: [`aggregate`], each region's read-only aggregate as a CRDT with pure merge,
//! digest-based anti-entropy and reconciliation records; [`session`], the sans-I/O
//! anti-entropy session with one peer (digests, bounded entry messages, peer age), which
//! admits only the peer's own region's entries (direct links only, no relay);
//! [`local`], this region's aggregate derived from its published views; [`signal`], the
//! out-of-band front-door signal that region failover follows. The QUIC driver is the
//! crate beside this one, `waymark-federation-quic` (`federation/quic/`), as quinn sits
//! beside quinn-proto. A peer region's aggregate only feeds tier 2 of the views
//! (`waymark_core::assembler::RemoteEndpoint`).
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod aggregate;
pub mod local;
pub mod session;
pub mod signal;
