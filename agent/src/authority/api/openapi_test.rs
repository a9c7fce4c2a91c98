//! The document built from the table: every operation once, every reference resolving,
//! every path parameter typed as its template names it, every body described.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use serde_json::Value;

use super::*;

fn all() -> Vec<&'static Operation> {
    ROUTES.iter().map(|r| &r.op).chain(NON_API.iter()).collect()
}

#[test]
fn each_operation_is_listed_once_with_a_unique_id_and_a_known_tag() {
    let mut ids = BTreeSet::new();
    let mut routes = BTreeSet::new();
    let tags: BTreeSet<&str> = TAGS.iter().map(|(t, _)| *t).collect();
    for op in all() {
        assert!(ids.insert(op.id), "operation id {} twice", op.id);
        assert!(
            routes.insert((op.method, op.path)),
            "{} {} twice",
            op.method.as_str(),
            op.path
        );
        assert!(tags.contains(op.tag), "{}: unknown tag {}", op.id, op.tag);
        assert!(!op.summary.is_empty(), "{}: no summary", op.id);
        assert!(op.path.starts_with('/'), "{}: {}", op.id, op.path);
    }
    assert!(ids.len() > 40, "only {} operations", ids.len());
}

#[test]
fn every_operation_documents_a_success_and_every_body_its_schema() {
    for op in all() {
        let success: Vec<&Reply> = op
            .replies
            .iter()
            .filter(|r| (200..300).contains(&r.status))
            .collect();
        assert!(!success.is_empty(), "{}: no success reply", op.id);
        for reply in success {
            match (reply.status, &reply.body) {
                (204, None) => {}
                (204, Some(_)) => panic!("{}: a 204 with a body", op.id),
                (_, None) => panic!("{}: {} without a body", op.id, reply.status),
                (_, Some(body)) => assert!(
                    body.schema.is_some() || body.content_type != "application/json",
                    "{}: a JSON body without a schema",
                    op.id
                ),
            }
        }
        if let Some(body) = op.request {
            assert!(
                body.schema.is_some() || body.content_type != "application/json",
                "{}: a JSON request without a schema",
                op.id
            );
        }
    }
}

#[test]
fn path_types_name_exactly_the_templates_parameters() {
    let mut generator = generator();
    for op in all() {
        let Some(path) = op.path_params else {
            continue;
        };
        let schema = path(&mut generator).to_value();
        let mut named: Vec<&str> = schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        named.sort_unstable();
        let mut template = op.path_names();
        template.sort_unstable();
        assert_eq!(named, template, "{}: {}", op.id, op.path);
    }
}

#[test]
fn every_reference_in_the_document_resolves() {
    let doc = document();
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(refs.len() > 50, "{} references", refs.len());
    for reference in refs {
        let pointer = reference
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("{reference}: not local"));
        assert!(
            doc.pointer(pointer).is_some(),
            "{reference} does not resolve"
        );
    }
}

#[test]
fn every_path_parameter_is_declared_and_every_route_is_in_the_document() {
    let doc = document();
    for op in all() {
        let item = &doc["paths"][op.path][op.method.as_str().to_lowercase()];
        assert!(item.is_object(), "{} {}", op.method.as_str(), op.path);
        let declared: BTreeSet<&str> = item["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "path")
            .filter_map(|p| p["name"].as_str())
            .collect();
        let template: BTreeSet<&str> = op.path_names().into_iter().collect();
        assert_eq!(declared, template, "{}", op.id);
        assert_eq!(item["operationId"], op.id);
    }
}

#[test]
fn the_blocking_and_paged_reads_document_their_headers_and_parameters() {
    let doc = document();
    let services = &doc["paths"]["/v1/services"]["get"];
    let names: BTreeSet<&str> = services["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["index", "wait", "limit", "cursor"]),
        "{services:#}"
    );
    let headers = &services["responses"]["200"]["headers"];
    assert!(headers["X-Waymark-Index"].is_object(), "{services:#}");
    assert!(headers["X-Waymark-Next-Cursor"].is_object(), "{services:#}");
    assert_eq!(
        services["responses"]["400"]["$ref"],
        "#/components/responses/BadParameter"
    );
    let limit = services["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap();
    assert_eq!(limit["schema"]["maximum"], 1000, "{limit:#}");
    assert_eq!(limit["required"], false);
    assert!(limit["description"].as_str().is_some(), "{limit:#}");
    // The probes need nothing; everything else a principal.
    assert_eq!(
        doc["paths"]["/livez"]["get"]["security"],
        serde_json::json!([])
    );
    assert!(
        doc["paths"]["/v1/status"]["get"]["responses"]["401"].is_object(),
        "{doc:#}"
    );
}

/// Replies whose body may stay free-form JSON, each with the reason. Everything else the
/// API answers has a type, so the document describes it field by field.
const FREE_FORM_REPLIES: &[(&str, &str)] = &[(
    "getOpenApi",
    "the OpenAPI document itself: its schema is the OpenAPI 3.1 specification's",
)];

#[test]
fn no_reply_is_free_form_json_unless_listed_with_a_reason() {
    let doc = document();
    let mut free = BTreeSet::new();
    for op in all() {
        for reply in op.replies {
            let Some(Body {
                schema: Some(schema),
                ..
            }) = reply.body
            else {
                continue;
            };
            let mut generator = generator();
            let schema = schema(&mut generator).to_value();
            if free_form(&schema, &doc, 0) {
                free.insert(op.id);
            }
        }
    }
    let listed: BTreeSet<&str> = FREE_FORM_REPLIES.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        free, listed,
        "replies described as free-form JSON (serde_json::Value or a map of it): give the \
         body a type deriving JsonSchema, or list the operation in FREE_FORM_REPLIES with \
         the reason"
    );
}

#[test]
fn the_free_form_check_sees_a_value_and_a_map_of_values() {
    let doc = document();
    let mut generator = generator();
    for schema in [
        schema_of::<Value>(&mut generator),
        schema_of::<serde_json::Map<String, Value>>(&mut generator),
        schema_of::<Option<Value>>(&mut generator),
        schema_of::<Vec<Value>>(&mut generator),
    ] {
        let schema = schema.to_value();
        assert!(free_form(&schema, &doc, 0), "{schema}");
    }
    let typed = schema_of::<ErrorBody>(&mut generator).to_value();
    assert!(!free_form(&typed, &doc, 0), "{typed:#}");
}

/// Whether `schema` says nothing of its fields: any JSON (`true`, `{}`), an object of
/// anything, or a list, an option or a reference of those. `$ref`s resolve in `doc`.
fn free_form(schema: &Value, doc: &Value, depth: usize) -> bool {
    assert!(depth < 16, "a reference cycle at {schema}");
    let Some(object) = schema.as_object() else {
        return schema == &Value::Bool(true);
    };
    if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
        let target = reference
            .strip_prefix('#')
            .and_then(|p| doc.pointer(p))
            .unwrap_or_else(|| panic!("{reference} does not resolve"));
        return free_form(target, doc, depth + 1);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(variants) = object.get(key).and_then(Value::as_array) {
            return variants
                .iter()
                .filter(|v| v["type"] != "null")
                .any(|v| free_form(v, doc, depth + 1));
        }
    }
    let types: Vec<&str> = match object.get("type") {
        None => Vec::new(),
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        Some(_) => return false,
    };
    let described = ["properties", "enum", "const", "allOf", "patternProperties"]
        .iter()
        .any(|k| object.contains_key(*k));
    if types.contains(&"array") {
        return object
            .get("items")
            .is_none_or(|items| free_form(items, doc, depth + 1));
    }
    let open = match object.get("additionalProperties") {
        None => true,
        Some(additional) => free_form(additional, doc, depth + 1),
    };
    let object_or_any = types.is_empty() || types.iter().all(|t| *t == "object" || *t == "null");
    object_or_any && !described && open
}

fn collect_refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if key == "$ref"
                    && let Some(r) = v.as_str()
                {
                    out.push(r);
                }
                collect_refs(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}
