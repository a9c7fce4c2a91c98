//! Online gossip keyring rotation across the region's pool, led by the authority leader
//! (`waymark keyring list|install|use|remove`, `GET`/`POST /v1/operator/keyring`).
//!
//! ```text
//! operator ──► API (raft grant, leader) ──► KeyringPool ──► this member's gossip keyring
//!                                               ├──► other members: POST /raft/keyring
//!                                               └──► node agents: KeyringBroker over their
//!                                                    evidence sessions
//! ```
//!
//! Each member and agent decides its own step with the pure `gossip::rotation` and
//! persists the result before it is in force (`gossip::keyring_file`); [`report`] is the
//! pure part of the leader's side (counts per key, the checks that refuse a `use` or a
//! `remove` that would strand a target). The procedure is in docs/operations.md.

pub mod broker;
pub mod pool;
pub mod report;

pub use broker::KeyringBroker;
pub use pool::{KeyringPool, member_router};
pub use report::{KeyringReport, PoolRefusal, PoolReport};
