//! The OpenAPI document, built from the operation table ([`super::routes::ROUTES`]) that
//! also mounts the router, so the document cannot describe a route the API does not serve
//! or miss one it does.
//!
//! ```text
//! ROUTES ──► router()            (method, path, handler, body limit)
//!        └─► document() ──► GET /v1/openapi.json, agent/src/authority/openapi.json
//!            (operation id, summary, tag, permission, request, query and reply types)
//! ```
//!
//! Bodies and query strings are described by their Rust types (`schemars`): request and
//! reply bodies by `$ref` into `components.schemas`, a query type's properties as one
//! parameter each (the property's doc is the parameter's description). Path parameters
//! are strings unless the operation names a path type. What every operation shares — the
//! refusal body, `401`/`403`, the leader's `307`, `400` for a bad parameter, the blocking
//! and page headers — is added here from the operation's fields, not repeated in the
//! table. `scripts/update-schemas` writes the document to the checked-in copy; a test
//! fails while the two differ.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use axum::routing::MethodFilter;
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value, json};

use super::ErrorBody;
use super::routes::{NON_API, ROUTES};

/// The HTTP methods the API serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Method {
    /// `GET`
    Get,
    /// `PUT`
    Put,
    /// `POST`
    Post,
    /// `DELETE`
    Delete,
}

impl Method {
    /// Upper-case, as on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Put => "PUT",
            Self::Post => "POST",
            Self::Delete => "DELETE",
        }
    }

    /// The key of an OpenAPI path item.
    const fn key(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::Put => "put",
            Self::Post => "post",
            Self::Delete => "delete",
        }
    }

    pub(super) const fn filter(self) -> MethodFilter {
        match self {
            Self::Get => MethodFilter::GET,
            Self::Put => MethodFilter::PUT,
            Self::Post => MethodFilter::POST,
            Self::Delete => MethodFilter::DELETE,
        }
    }
}

/// What an operation needs of its caller (ADR-15). Reads are authorised before the
/// handler runs (`access::authenticate`, which reads this); writes by their handlers,
/// which know the scope (`own:<service>` names the service of the path or body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// No credentials: the probes, which say nothing but alive and ready.
    Anyone,
    /// Any verified principal, without a grant.
    Authenticated,
    /// The `read` grant (also for a `POST` that only reads).
    Read,
    /// The capability written, checked by the handler (`own:<service>`, `register:<node>`,
    /// `override:<service>`, `evacuate`, `raft`, `acl`, or the ownership the text names).
    Grant(&'static str),
}

impl Permission {
    fn label(self) -> &'static str {
        match self {
            Self::Anyone => "none",
            Self::Authenticated => "authenticated",
            Self::Read => "read",
            Self::Grant(capability) => capability,
        }
    }
}

/// A body's schema: `$ref` to the named type, or inline for an unnamed one.
pub(super) type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// A request or reply body.
#[derive(Debug, Clone, Copy)]
pub struct Body {
    /// Its media type.
    pub content_type: &'static str,
    /// Its schema; `None` for bytes the document does not describe field by field.
    pub(super) schema: Option<SchemaFn>,
}

impl Body {
    /// JSON of type `T`.
    pub const fn json<T: JsonSchema>() -> Self {
        Self {
            content_type: "application/json",
            schema: Some(schema_of::<T>),
        }
    }

    /// Opaque bytes of `content_type` (a backup, a text exposition).
    pub const fn bytes(content_type: &'static str) -> Self {
        Self {
            content_type,
            schema: None,
        }
    }

    /// `T` per line (JSON lines).
    pub const fn json_lines<T: JsonSchema>() -> Self {
        Self {
            content_type: "application/jsonl",
            schema: Some(schema_of::<T>),
        }
    }
}

/// One answer an operation gives on success (or a refusal with its own body).
#[derive(Debug, Clone, Copy)]
pub struct Reply {
    /// The status.
    pub status: u16,
    /// What it means.
    pub description: &'static str,
    /// Its body, if any.
    pub body: Option<Body>,
}

impl Reply {
    /// `status` with a JSON body of type `T`.
    pub const fn json<T: JsonSchema>(status: u16, description: &'static str) -> Self {
        Self {
            status,
            description,
            body: Some(Body::json::<T>()),
        }
    }

    /// `status` with no body.
    pub const fn empty(status: u16, description: &'static str) -> Self {
        Self {
            status,
            description,
            body: None,
        }
    }

    /// `status` with `body`.
    pub const fn with(status: u16, description: &'static str, body: Body) -> Self {
        Self {
            status,
            description,
            body: Some(body),
        }
    }
}

/// The groups operations are listed under.
pub(super) const TAGS: &[(&str, &str)] = &[
    (
        "services",
        "Services, their health contracts, views and policies",
    ),
    (
        "instances",
        "Registrations, leases, external endpoints and explain",
    ),
    (
        "overrides",
        "Taking instances out of rotation by hand, within the disruption budget",
    ),
    ("routing", "Zone evacuation and region failover"),
    ("audit", "The replicated audit log and the alarms raised"),
    (
        "status",
        "This member, its xDS clients and the sidecars behind them",
    ),
    ("operator", "Raft membership, leadership and backups"),
    ("acl", "Grants and tokens"),
    ("discovery", "Prometheus HTTP service discovery"),
    ("meta", "This document, probes and metrics"),
];

/// One operation of the API: a method on a path, what it takes and answers, and what it
/// needs. Its handler is in [`super::routes::Route`].
#[derive(Debug, Clone, Copy)]
pub struct Operation {
    /// The method.
    pub method: Method,
    /// The path template, `{name}` for a parameter (axum's syntax and OpenAPI's).
    pub path: &'static str,
    /// A unique id, camelCase.
    pub id: &'static str,
    /// One of [`TAGS`].
    pub tag: &'static str,
    /// One line.
    pub summary: &'static str,
    /// More, where the summary is not enough; empty for none.
    pub description: &'static str,
    /// What the caller needs.
    pub permission: Permission,
    /// Answered by the leader: a follower replies `307` to the leader's same path.
    pub leader: bool,
    /// The body limit (`413 body_too_large` beyond it).
    pub body_limit: usize,
    /// The request body, if it takes one.
    pub request: Option<Body>,
    /// Whether the request body may be left out.
    pub request_optional: bool,
    /// The query string's type (its properties are the parameters), inline.
    pub(super) query: Option<SchemaFn>,
    /// Whether the query string is parsed by [`super::query`] (a `400` names a bad one).
    pub checked_query: bool,
    /// The path parameters' type; `None`: every parameter a string.
    pub(super) path_params: Option<SchemaFn>,
    /// The answers, success first.
    pub replies: &'static [Reply],
}

impl Operation {
    /// An operation with no body, query or path type, answered by any member, needing
    /// `read`: the fields every entry of the table starts from.
    pub const DEFAULT: Self = Self {
        method: Method::Get,
        path: "",
        id: "",
        tag: "",
        summary: "",
        description: "",
        permission: Permission::Read,
        leader: false,
        body_limit: super::BODY_MAX,
        request: None,
        request_optional: false,
        query: None,
        checked_query: false,
        path_params: None,
        replies: &[],
    };

    /// The path parameters' names, in the order the template has them.
    pub fn path_names(&self) -> Vec<&'static str> {
        self.path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .collect()
    }

    /// Whether its query type names `parameter`.
    fn takes(&self, generator: &mut SchemaGenerator, parameter: &str) -> bool {
        self.query
            .map(|q| q(generator))
            .and_then(|s| s.get("properties").cloned())
            .is_some_and(|p| p.get(parameter).is_some())
    }
}

/// `$ref` to `T` in `components.schemas` (or `T` inline when it has no name of its own).
pub(super) fn schema_of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// `T`'s own schema, inline: a query string's or path's properties.
pub(super) fn inline<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    T::json_schema(generator)
}

/// The generator every schema of the document comes from: JSON Schema 2020-12, as OpenAPI
/// 3.1 has it, with definitions under `#/components/schemas/`.
pub(super) fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "#/components/schemas/".into())
        .into_generator()
}

/// The document, generated once per process.
pub fn document_text() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
        text.push('\n');
        text
    })
}

/// The OpenAPI 3.1 document of every operation in the table and the routes outside it.
pub fn document() -> Value {
    let mut generator = generator();
    let mut paths: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    let operations = ROUTES.iter().map(|r| &r.op).chain(NON_API.iter());
    for op in operations {
        let item = operation(op, &mut generator);
        paths
            .entry(op.path)
            .or_default()
            .insert(op.method.key().to_owned(), item);
    }
    let schemas: Map<String, Value> = generator.take_definitions(true);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "waymark authority API",
            "version": "1",
            "description": "Query and policy API of a waymark authority member. Reads are \
                served by every member from the replicated state; writes and explain are \
                served by the leader (followers answer 307 to the leader). Refusals carry \
                {error:{reason,field,message}}. Every route but /livez and /readyz needs a \
                verified principal (a client certificate on the mutual-TLS listener, or a \
                bearer token) and a grant: reads need read; each write names the capability \
                it needs (x-waymark-permission).",
        },
        "tags": TAGS.iter().map(|(name, description)| json!({"name": name, "description": description})).collect::<Vec<_>>(),
        "security": [{"bearer": []}, {"mutualTLS": []}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token minted by an operator: wmt.<name>.<secret>",
                },
                "mutualTLS": {
                    "type": "mutualTLS",
                    "description": "A client certificate whose SPIFFE URI is an operator, node \
                        or workload identity of this trust domain",
                },
            },
            "headers": {
                "Index": {
                    "description": "The log index of the last applied entry that changed what \
                        this route reads; never 0. Echo it as `index` to wait for the next change.",
                    "schema": {"type": "integer", "minimum": 1},
                },
                "NextCursor": {
                    "description": "Present when another page follows: pass it as `cursor`.",
                    "schema": {"type": "string"},
                },
            },
            "responses": {
                "BadParameter": {
                    "description": "A parameter this route does not take, repeated where it may \
                        not be, or a malformed or unknown value: the error names the parameter \
                        (`unknown_parameter`, `repeated_parameter`, `unknown_value`, `bad_name`, \
                        `bad_index`, `bad_wait`, `bad_limit`, `bad_cursor`, `too_many`, `bad_query`)",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                },
            },
        },
    })
}

/// One operation object.
fn operation(op: &Operation, generator: &mut SchemaGenerator) -> Value {
    let mut out = Map::new();
    out.insert("operationId".into(), op.id.into());
    out.insert("summary".into(), op.summary.into());
    if !op.description.is_empty() {
        out.insert("description".into(), op.description.into());
    }
    out.insert("tags".into(), json!([op.tag]));
    let parameters = parameters(op, generator);
    if !parameters.is_empty() {
        out.insert("parameters".into(), parameters.into());
    }
    if let Some(body) = op.request {
        out.insert(
            "requestBody".into(),
            json!({"required": !op.request_optional, "content": content(&body, generator)}),
        );
    }
    out.insert("responses".into(), responses(op, generator).into());
    if op.permission == Permission::Anyone {
        out.insert("security".into(), json!([]));
    }
    out.insert("x-waymark-permission".into(), op.permission.label().into());
    out.insert("x-waymark-body-limit".into(), op.body_limit.into());
    out.into()
}

fn content(body: &Body, generator: &mut SchemaGenerator) -> Value {
    let schema = match body.schema {
        Some(schema) => schema(generator).to_value(),
        None => json!({"type": "string", "contentMediaType": body.content_type}),
    };
    json!({body.content_type: {"schema": schema}})
}

/// Path parameters (from the path type, or strings), then the query type's properties.
fn parameters(op: &Operation, generator: &mut SchemaGenerator) -> Vec<Value> {
    let mut out = Vec::new();
    let path_schema = op.path_params.map(|p| p(generator).to_value());
    for name in op.path_names() {
        let property = path_schema
            .as_ref()
            .and_then(|s| s["properties"].get(name))
            .cloned()
            .unwrap_or_else(|| json!({"type": "string"}));
        out.push(parameter(name, "path", true, property));
    }
    if let Some(query) = op.query {
        let schema = query(generator).to_value();
        let required: Vec<&str> = schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if let Some(properties) = schema["properties"].as_object() {
            for (name, property) in properties {
                let is_required = required.contains(&name.as_str());
                out.push(parameter(name, "query", is_required, property.clone()));
            }
        }
    }
    out
}

/// A parameter from a property's schema: its description moves up to the parameter, and
/// `null` (an absent parameter) leaves its type.
fn parameter(name: &str, within: &str, required: bool, mut schema: Value) -> Value {
    let mut out = json!({"name": name, "in": within, "required": required});
    if let Some(object) = schema.as_object_mut() {
        if let Some(description) = object.remove("description") {
            out["description"] = description;
        }
        if let Some(Value::Array(types)) = object.get_mut("type") {
            types.retain(|t| t != "null");
            if types.len() == 1 {
                let only = types[0].clone();
                object.insert("type".into(), only);
            }
        }
        // `Option<Named>` is `anyOf: [{$ref}, {type: null}]`.
        if let Some(Value::Array(any)) = object.get("anyOf")
            && any.len() == 2
            && any.iter().any(|s| s["type"] == "null")
            && let Some(named) = any.iter().find(|s| s["type"] != "null").cloned()
        {
            object.remove("anyOf");
            if let Value::Object(named) = named {
                object.extend(named);
            }
        }
    }
    out["schema"] = schema;
    out
}

/// The operation's replies, then what every operation may answer.
fn responses(op: &Operation, generator: &mut SchemaGenerator) -> Map<String, Value> {
    let mut out = Map::new();
    for reply in op.replies {
        let mut response = json!({"description": reply.description});
        if let Some(body) = &reply.body {
            response["content"] = content(body, generator);
        }
        if (200..300).contains(&reply.status) {
            let mut headers = Map::new();
            if op.takes(generator, "index") {
                headers.insert(
                    "X-Waymark-Index".into(),
                    json!({"$ref": "#/components/headers/Index"}),
                );
            }
            if op.takes(generator, "cursor") {
                headers.insert(
                    "X-Waymark-Next-Cursor".into(),
                    json!({"$ref": "#/components/headers/NextCursor"}),
                );
            }
            if !headers.is_empty() {
                response["headers"] = headers.into();
            }
        }
        out.insert(reply.status.to_string(), response);
    }
    let error = json!({"application/json": {"schema": schema_of::<ErrorBody>(generator)}});
    if op.leader {
        out.entry("307").or_insert(json!({
            "description": "This member is not the leader; Location names the leader's same path",
            "content": error,
        }));
    }
    if op.checked_query {
        out.entry("400")
            .or_insert(json!({"$ref": "#/components/responses/BadParameter"}));
    }
    if op.permission != Permission::Anyone {
        out.entry("401").or_insert(json!({
            "description": "No verified principal: present a client certificate or a bearer token",
            "content": error,
        }));
    }
    if !matches!(
        op.permission,
        Permission::Anyone | Permission::Authenticated
    ) {
        out.entry("403").or_insert(json!({
            "description": "The principal holds no grant for this (the message names the capability)",
            "content": error,
        }));
    }
    if op.permission != Permission::Anyone {
        out.insert(
            "default".into(),
            json!({"description": "A refusal", "content": error}),
        );
    }
    out
}

#[cfg(test)]
#[path = "openapi_test.rs"]
mod tests;
