//! The authority member: replicated desired state (openraft on redb), the leader's
//! pipeline, the xDS tier, evidence ingest, reconcilers and the query/policy API.

pub mod machine;
