//! The API's one mapping of registry refusals to statuses.

use axum::http::StatusCode;
use waymark_registry::acl::AclError;
use waymark_registry::machine::Refusal;
use waymark_registry::state::RegistryError;

use super::{ApiError, refusal_status};

/// Every reason a registry refusal carries, and the status the API answers it with.
const REFUSAL_STATUSES: &[(&str, StatusCode)] = &[
    ("unknown_service", StatusCode::NOT_FOUND),
    ("unknown_instance", StatusCode::NOT_FOUND),
    ("duplicate_address", StatusCode::CONFLICT),
    ("retired", StatusCode::CONFLICT),
    ("service_in_use", StatusCode::CONFLICT),
    ("origin_mismatch", StatusCode::CONFLICT),
    ("service_mismatch", StatusCode::CONFLICT),
    ("contract", StatusCode::UNPROCESSABLE_ENTITY),
    ("not_leased", StatusCode::UNPROCESSABLE_ENTITY),
    ("bad_address", StatusCode::UNPROCESSABLE_ENTITY),
    ("bad_lease", StatusCode::UNPROCESSABLE_ENTITY),
    ("bad_policy", StatusCode::UNPROCESSABLE_ENTITY),
    ("bad_justification", StatusCode::UNPROCESSABLE_ENTITY),
    ("too_long", StatusCode::UNPROCESSABLE_ENTITY),
    ("too_many", StatusCode::UNPROCESSABLE_ENTITY),
    ("region_full", StatusCode::UNPROCESSABLE_ENTITY),
    ("id_unavailable", StatusCode::UNPROCESSABLE_ENTITY),
    ("already_bootstrapped", StatusCode::UNPROCESSABLE_ENTITY),
    ("bad_name", StatusCode::UNPROCESSABLE_ENTITY),
    ("malformed", StatusCode::UNPROCESSABLE_ENTITY),
    ("unknown_grant", StatusCode::UNPROCESSABLE_ENTITY),
    ("unknown_token", StatusCode::UNPROCESSABLE_ENTITY),
    ("token_exists", StatusCode::UNPROCESSABLE_ENTITY),
    ("bad_expiry", StatusCode::UNPROCESSABLE_ENTITY),
    ("bad_digest", StatusCode::UNPROCESSABLE_ENTITY),
    ("acl_full", StatusCode::UNPROCESSABLE_ENTITY),
];

#[test]
fn every_registry_refusal_reason_has_its_status() {
    // Goal: a registry refusal added without a status fails here, instead of reaching
    // clients with whatever the fallback says.
    let table: std::collections::BTreeSet<&str> =
        REFUSAL_STATUSES.iter().map(|(reason, _)| *reason).collect();
    let reasons: std::collections::BTreeSet<&str> = Refusal::REASONS.iter().copied().collect();
    assert_eq!(
        table, reasons,
        "the table and the registry's reasons differ"
    );
    for (reason, status) in REFUSAL_STATUSES {
        assert_eq!(refusal_status(reason), Some(*status), "{reason}");
    }
    assert_eq!(refusal_status("no_such_reason"), None);
}

#[test]
fn a_registry_refusal_reaches_the_client_with_its_field() {
    // Goal: region_full and the access-control refusals reached clients without the
    // field their error knew; every refusal keeps reason, field and message.
    let instance = "pay-r1".parse().unwrap_or_else(|e| panic!("{e}"));
    let cases = [
        (
            RegistryError::Acl(AclError::BadName {
                field: "token",
                reason: "lowercase letters, digits and '-' only",
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("token"),
        ),
        (
            RegistryError::Full {
                what: "instances",
                max: 1,
            },
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("instances"),
        ),
        (
            RegistryError::UnknownInstance { instance },
            StatusCode::NOT_FOUND,
            Some("instance"),
        ),
        (
            RegistryError::Acl(AclError::AlreadyBootstrapped),
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
        ),
    ];
    for (error, status, field) in cases {
        let refusal = Refusal::from(&error);
        let e = ApiError::from(refusal.clone());
        assert_eq!(e.status, status, "{error}");
        assert_eq!(e.reason, refusal.reason);
        assert_eq!(e.field.as_deref(), field, "{error}");
        assert_eq!(e.message, error.to_string());
    }
}
