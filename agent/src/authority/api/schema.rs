//! The OpenAPI document's schemas for what operators write — a health contract, a policy —
//! generated from the types the handlers decode, so `openapi.json` cannot describe a body
//! the API would refuse (`agent/tests/schema_docs.rs` checks the document against this).

use serde_json::{Map, Value};
use waymark_core::contract::HealthContract;
use waymark_registry::state::ServicePolicyRecord;

/// `components.schemas` entries for [`HealthContract`], [`ServicePolicyRecord`] and every
/// type they use, referring to each other as `#/components/schemas/<name>`.
pub fn components() -> Map<String, Value> {
    let mut generator = super::openapi::generator();
    generator.subschema_for::<HealthContract>();
    generator.subschema_for::<ServicePolicyRecord>();
    generator.take_definitions(true)
}
