//! waymark's cross-region federation.
//!
//! Will hold: each region's read-only aggregate as a CRDT (pure merge), the anti-entropy
//! session (pure), and its driver over mutually authenticated QUIC, plus the
//! reconciliation log written after a partition heals. A peer region's aggregate only
//! feeds tier 2 of the views (`waymark_core::assembler::RemoteEndpoint`).
//!
//! Nothing is built here yet.
#![forbid(unsafe_code)]
