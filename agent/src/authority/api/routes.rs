//! The API's operations, once: each entry is what `router()` mounts (method, path, handler,
//! body limit) and what the OpenAPI document says of it ([`super::openapi`]). Add a route
//! here and both follow; there is no other list.
//!
//! Conventions: the summary is one line; the reply types are the handler's own body types
//! (a handler that answers another type is a bug this table cannot see, so each resource
//! file keeps its body types beside the handler that builds them); refusals, `401`/`403`,
//! the leader's `307` and a bad parameter's `400` are added by the document builder from
//! `permission`, `leader` and `checked_query`.

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{MethodFilter, MethodRouter, on};
use serde_json::Value;
use waymark_core::model::{Instance, RegionName};
use waymark_core::view::ReleasedView;
use waymark_registry::machine::AuditEntry;
use waymark_registry::state::{
    EvacuationIntent, InstanceRecord, Registration, ServicePolicyRecord,
};

use super::openapi::Method::{Delete, Get, Post, Put};
use super::openapi::Permission::{Anyone, Authenticated, Grant};
use super::openapi::{Body, Operation, Reply, inline};
use super::params::{
    ClientPath, DiscoveryParams, InstancePath, InstancesParams, MemberPath, RegionPath, SeqPath,
    ServiceParams, ServicePath, ServicesParams, TokenPath, ViewParams, ZonePath,
};
use super::{
    ApiState, CONTRACT_BODY_MAX, ErrorBody, INSTANCE_BODY_MAX, POLICY_BODY_MAX, acl, audit,
    discovery, instances, keyring, operator, overrides, proxy, routing, services, status,
};
use crate::authority::keyring::KeyringReport;
use crate::authority::raft::PeerStatus;
use crate::authority::raft::backup::{BODY_MAX as BACKUP_BODY_MAX, SNAPSHOT_CONTENT_TYPE};

/// An operation and the handler that serves it.
pub struct Route {
    /// What it is.
    pub op: Operation,
    /// Its handler on the operation's method.
    pub mount: fn(MethodFilter) -> MethodRouter<ApiState>,
}

/// The refusal body, for replies whose refusal the operation names.
const fn refusal(status: u16, description: &'static str) -> Reply {
    Reply::json::<ErrorBody>(status, description)
}

const COMMITTED: &str = "Committed";
const TEXT: &str = "text/plain; charset=utf-8";
const METRICS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Mount every operation of [`ROUTES`], each with its body limit, and the `read` check
/// on those whose permission is [`Read`](super::openapi::Permission::Read): the permission
/// the document states is the one enforced. Other permissions are the handlers' to check
/// (they know the scope), `Authenticated` needs nothing beyond `access::authenticate`.
pub(super) fn mount(mut router: Router<ApiState>, state: &ApiState) -> Router<ApiState> {
    for route in ROUTES {
        let mut handler = (route.mount)(route.op.method.filter())
            .layer(DefaultBodyLimit::max(route.op.body_limit));
        if route.op.permission == super::openapi::Permission::Read {
            handler = handler.layer(axum::middleware::from_fn_with_state(
                state.clone(),
                super::access::require_read,
            ));
        }
        router = router.route(route.op.path, handler);
    }
    router
}

/// Mount the operations of [`NON_API`]: the probes, which need no credentials.
pub(super) fn mount_probes(router: Router<ApiState>) -> Router<ApiState> {
    router
        .route("/livez", on(MethodFilter::GET, status::livez))
        .route("/readyz", on(MethodFilter::GET, status::readyz))
}

/// Routes outside the API's authentication, mounted by [`mount_probes`], documented here.
pub static NON_API: &[Operation] = &[
    Operation {
        method: Get,
        path: "/livez",
        id: "livez",
        tag: "meta",
        summary: "Liveness, process-internal only (never consults peers)",
        permission: Anyone,
        replies: &[
            Reply::with(200, "Alive", Body::bytes(TEXT)),
            Reply::with(503, "The Raft core has stopped", Body::bytes(TEXT)),
        ],
        ..Operation::DEFAULT
    },
    Operation {
        method: Get,
        path: "/readyz",
        id: "readyz",
        tag: "meta",
        summary: "Readiness, member-local only: committed state applied and served (no leader \
                  or quorum required)",
        permission: Anyone,
        replies: &[
            Reply::with(200, "Ready", Body::bytes(TEXT)),
            Reply::with(
                503,
                "Not initialised, still joining, a committed entry failed to apply, or the \
                 Raft core has stopped",
                Body::bytes(TEXT),
            ),
        ],
        ..Operation::DEFAULT
    },
];

/// Every operation of the API, behind authentication.
pub static ROUTES: &[Route] = &[
    // === meta ===
    Route {
        mount: |m| on(m, super::openapi_json),
        op: Operation {
            method: Get,
            path: "/v1/openapi.json",
            id: "getOpenApi",
            tag: "meta",
            summary: "This document",
            replies: &[Reply::json::<Value>(200, "The OpenAPI 3.1 document")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, status::metrics),
        op: Operation {
            method: Get,
            path: "/metrics",
            id: "getMetrics",
            tag: "meta",
            summary: "Prometheus metrics (waymark_*)",
            description: "The Prometheus text format; OpenMetrics when the Accept header asks \
                          for application/openmetrics-text.",
            replies: &[Reply::with(200, "The exposition", Body::bytes(METRICS))],
            ..Operation::DEFAULT
        },
    },
    // === status ===
    Route {
        mount: |m| on(m, status::status),
        op: Operation {
            method: Get,
            path: "/v1/status",
            id: "getStatus",
            tag: "status",
            summary: "This member: region, leader, term",
            replies: &[Reply::json::<status::Status>(200, "This member")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, status::reconciliation),
        op: Operation {
            method: Get,
            path: "/v1/reconciliation",
            id: "getReconciliation",
            tag: "status",
            summary: "The orchestrator-vs-registry reconciliation diff",
            description: "The Kubernetes reconciler's latest diff, as it published it; `null` \
                          until it has run (or without Kubernetes).",
            replies: &[Reply::json::<status::Reconciliation>(
                200,
                "The reconciler's latest pass and the diff it found",
            )],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, status::proxy_status),
        op: Operation {
            method: Get,
            path: "/v1/proxy-status",
            id: "getProxyStatus",
            tag: "status",
            summary: "Per-client xDS sync state of this member's xDS tier (the node agents it \
                      serves): versions sent and acknowledged, NACKs",
            description: "The sidecars behind them: /v1/proxy-status/sidecars.",
            replies: &[Reply::json::<Vec<status::ProxyClient>>(200, "Every client")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, proxy::sidecars),
        op: Operation {
            method: Get,
            path: "/v1/proxy-status/sidecars",
            id: "getSidecars",
            tag: "status",
            summary: "The sidecars behind every node agent: each node's latest report of its \
                      own xDS clients",
            description: "Leader-observed: node agents report over their evidence session, \
                          which the leader holds; a follower answers 307. A node reports when \
                          its clients change and every 30 s; a node silent for 90 s is \
                          dropped. A report holds at most 256 clients and 128 KiB \
                          (clients_left_out counts the rest) and NACK text of at most 1024 \
                          bytes.",
            leader: true,
            replies: &[Reply::json::<proxy::SidecarNodes>(
                200,
                "Every node's report",
            )],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, proxy::proxy_config),
        op: Operation {
            method: Get,
            path: "/v1/proxy-config/{node}/{client}",
            id: "getProxyConfig",
            tag: "status",
            summary: "What one xDS client of a node agent holds: clusters and load assignments \
                      by version, endpoints with weights, health and waymark's markers",
            description: "Asked of the node agent over its evidence session (authenticated as \
                          that node) and answered within 5 s; the document is the one the \
                          agent's own GET /v1/clients/{client}/config serves. Each cluster and \
                          load assignment the client was sent carries its version, the version \
                          served now and whether they are the same (current); endpoints are \
                          listed for the current ones, at most 2048 in all \
                          (endpoints_left_out counts the rest). Leader-only (307 from a \
                          follower).",
            leader: true,
            path_params: Some(inline::<ClientPath>),
            replies: &[
                Reply::json::<proxy::ProxyConfig>(200, "What the client holds"),
                refusal(
                    404,
                    "unknown_node: the node holds no session with the leader; unknown_client: \
                     the node has no such client",
                ),
                refusal(504, "node_timeout: the node did not answer within 5 s"),
            ],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, status::federation_status),
        op: Operation {
            method: Get,
            path: "/v1/federation/status",
            id: "getFederationStatus",
            tag: "status",
            summary: "This member's federation: per peer region, per link, the front-door \
                      signal, and this region's own aggregate versions",
            description: "Member-local: each member has its own links.",
            replies: &[Reply::json::<status::FederationStatus>(
                200,
                "This member's links",
            )],
            ..Operation::DEFAULT
        },
    },
    // === operator ===
    Route {
        mount: |m| on(m, status::peers),
        op: Operation {
            method: Get,
            path: "/v1/operator/raft/peers",
            id: "listRaftPeers",
            tag: "operator",
            summary: "Raft members, their roles and how far each trails the leader",
            replies: &[Reply::json::<Vec<PeerStatus>>(200, "Every member")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, status::add_member),
        op: Operation {
            method: Post,
            path: "/v1/operator/raft/members",
            id: "addRaftMember",
            tag: "operator",
            summary: "Add a member (as learner, then voter once caught up)",
            permission: Grant("raft"),
            leader: true,
            request: Some(Body::json::<status::AddMember>()),
            replies: &[
                Reply::json::<Vec<PeerStatus>>(200, "Every member, after the change"),
                refusal(503, "membership: the change did not commit; retry"),
            ],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, status::remove_member),
        op: Operation {
            method: Delete,
            path: "/v1/operator/raft/members/{id}",
            id: "removeRaftMember",
            tag: "operator",
            summary: "Remove a member",
            permission: Grant("raft"),
            leader: true,
            path_params: Some(inline::<MemberPath>),
            replies: &[Reply::json::<Vec<PeerStatus>>(
                200,
                "Every member, after the change",
            )],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, operator::transfer_leader),
        op: Operation {
            method: Post,
            path: "/v1/operator/raft/transfer-leader",
            id: "transferLeader",
            tag: "operator",
            summary: "Move leadership to a caught-up voter",
            description: "The leader holds new writes, waits until the target matches its last \
                          log entry (at most 5 s), asks it to stand for election, and waits \
                          until it leads (at most 15 s); held writes then go to the new leader \
                          (a redirect). Refusals: unknown_member (404), not_voter, no_target \
                          (422), transfer_in_progress (409), not_caught_up, \
                          target_unreachable, not_elected (503).",
            permission: Grant("raft"),
            leader: true,
            request: Some(Body::json::<operator::TransferLeader>()),
            request_optional: true,
            replies: &[Reply::json::<operator::TransferredBody>(
                200,
                "Leadership moved",
            )],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, keyring::list),
        op: Operation {
            method: Get,
            path: "/v1/operator/keyring",
            id: "listGossipKeyring",
            tag: "operator",
            summary: "The gossip keyring of every pool member, as key ids (never keys)",
            description: "This region's authority members and every node agent holding an \
                          evidence session with the leader, asked at once (each within 5 s), \
                          plus agents gossip holds alive that hold no session (failed, \
                          no_session).",
            permission: Grant("raft"),
            leader: true,
            replies: &[Reply::json::<KeyringReport>(200, "The pool's key ids")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, keyring::operate),
        op: Operation {
            method: Post,
            path: "/v1/operator/keyring",
            id: "rotateGossipKeyring",
            tag: "operator",
            summary: "Rotate the region's gossip key online: install, use or remove a key \
                      (audited with the key's id)",
            description: "install adds a key every member opens with (sealing stays on the \
                          primary); use makes an installed key primary; remove retires a key \
                          that is primary nowhere. use and remove first list every member and \
                          are refused, with nothing changed, when the key is not installed \
                          everywhere (key_not_installed), still primary somewhere \
                          (remove_primary) or a member did not answer (unconfirmed; force: \
                          true leaves it behind), all 409. Bad input is 400: unknown_op, \
                          missing_key, bad_key, key_required (install needs the key, not its \
                          id), key_and_key_id.",
            permission: Grant("raft"),
            leader: true,
            request: Some(Body::json::<keyring::KeyringBody>()),
            replies: &[
                Reply::json::<KeyringReport>(
                    200,
                    "Applied where it could be; complete is false when a member refused or \
                     did not answer",
                ),
                refusal(409, "The pool would be stranded; nothing changed"),
            ],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, operator::save),
        op: Operation {
            method: Get,
            path: "/v1/operator/snapshot",
            id: "saveSnapshot",
            tag: "operator",
            summary: "A consistent backup of the region's replicated state, taken on the \
                      leader after a read barrier (audited)",
            description: "The body is WMBACKUP, a 4-byte little-endian header length, a JSON \
                          header {format, region, index, term, data_len, sha256} and the \
                          encoded state; headers X-Waymark-Snapshot-Index, -Term and -Sha256 \
                          (over the whole body).",
            permission: Grant("raft"),
            leader: true,
            body_limit: BACKUP_BODY_MAX,
            replies: &[Reply::with(
                200,
                "The backup",
                Body::bytes(SNAPSHOT_CONTENT_TYPE),
            )],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, operator::restore),
        op: Operation {
            method: Put,
            path: "/v1/operator/snapshot",
            id: "restoreSnapshot",
            tag: "operator",
            summary: "Restore a backup of this region on every member (audited)",
            description: "Verified whole first: not_a_snapshot, truncated, bad_header, \
                          checksum_mismatch (400), unknown_format, wrong_region, \
                          undecodable_state (422), body_too_large over 48 MiB (413); a refusal \
                          changes nothing. Committed as one log entry that restarts every \
                          lease; every member ends with the same state, and the leader \
                          rebuilds its computed state from it.",
            permission: Grant("raft"),
            leader: true,
            body_limit: BACKUP_BODY_MAX,
            request: Some(Body::bytes(SNAPSHOT_CONTENT_TYPE)),
            replies: &[Reply::json::<operator::Restored>(200, "Restored")],
            ..Operation::DEFAULT
        },
    },
    // === services ===
    Route {
        mount: |m| on(m, services::services),
        op: Operation {
            method: Get,
            path: "/v1/services",
            id: "listServices",
            tag: "services",
            summary: "Services with instance counts per verdict, guard state and view version",
            query: Some(inline::<ServicesParams>),
            checked_query: true,
            replies: &[Reply::json::<Vec<services::ServiceSummary>>(
                200,
                "Every service, or one page",
            )],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, services::get_service),
        op: Operation {
            method: Get,
            path: "/v1/services/{service}",
            id: "getService",
            tag: "services",
            summary: "A service's owner and contract",
            body_limit: CONTRACT_BODY_MAX,
            path_params: Some(inline::<ServicePath>),
            query: Some(inline::<ServiceParams>),
            checked_query: true,
            replies: &[
                Reply::json::<services::ServiceBody>(200, "The service"),
                refusal(404, "unknown_service"),
            ],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, services::put_service),
        op: Operation {
            method: Put,
            path: "/v1/services/{service}",
            id: "putService",
            tag: "services",
            summary: "Create or update a service and its health contract (validated)",
            permission: Grant("own:<service>"),
            leader: true,
            body_limit: CONTRACT_BODY_MAX,
            path_params: Some(inline::<ServicePath>),
            request: Some(Body::json::<services::PutService>()),
            replies: &[Reply::json::<services::ServiceWritten>(200, COMMITTED)],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, services::remove_service),
        op: Operation {
            method: Delete,
            path: "/v1/services/{service}",
            id: "deleteService",
            tag: "services",
            summary: "Remove a service with no instances",
            permission: Grant("own:<service>"),
            leader: true,
            body_limit: CONTRACT_BODY_MAX,
            path_params: Some(inline::<ServicePath>),
            replies: &[Reply::empty(204, COMMITTED)],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, services::service_view),
        op: Operation {
            method: Get,
            path: "/v1/services/{service}/view",
            id: "getServiceView",
            tag: "services",
            summary: "The published view per caller zone, with markers and version",
            description: "The filters keep the endpoints they match; each view keeps its \
                          version and markers, which describe the whole view.",
            path_params: Some(inline::<ServicePath>),
            query: Some(inline::<ViewParams>),
            checked_query: true,
            replies: &[Reply::json::<Vec<ReleasedView>>(
                200,
                "One view per caller zone",
            )],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, services::get_policy),
        op: Operation {
            method: Get,
            path: "/v1/services/{service}/policy",
            id: "getServicePolicy",
            tag: "services",
            summary: "A service's routing policy",
            body_limit: POLICY_BODY_MAX,
            path_params: Some(inline::<ServicePath>),
            replies: &[
                Reply::json::<ServicePolicyRecord>(200, "The policy (the default when unset)"),
                refusal(404, "unknown_service"),
            ],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, services::put_policy),
        op: Operation {
            method: Put,
            path: "/v1/services/{service}/policy",
            id: "putServicePolicy",
            tag: "services",
            summary: "Set a service's routing policy (fraction override, failover order, \
                      allowed callers); audited",
            permission: Grant("own:<service>"),
            leader: true,
            body_limit: POLICY_BODY_MAX,
            path_params: Some(inline::<ServicePath>),
            request: Some(Body::json::<ServicePolicyRecord>()),
            replies: &[Reply::json::<services::ServiceWritten>(200, COMMITTED)],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, services::validate_contract),
        op: Operation {
            method: Post,
            path: "/v1/contracts/validate",
            id: "validateContract",
            tag: "services",
            summary: "Validate a contract without storing it",
            body_limit: CONTRACT_BODY_MAX,
            request: Some(Body::json::<services::ValidateBody>()),
            replies: &[
                Reply::json::<services::Validity>(200, "Valid"),
                refusal(422, "contract: the field at fault is named"),
            ],
            ..Operation::DEFAULT
        },
    },
    // === discovery ===
    Route {
        mount: |m| on(m, discovery::prometheus_sd),
        op: Operation {
            method: Get,
            path: "/v1/prometheus/sd",
            id: "prometheusServiceDiscovery",
            tag: "discovery",
            summary: "Prometheus HTTP service discovery (http_sd_configs): one target group per \
                      endpoint in this region's published views",
            description: "Eligible endpoints only unless verdicts are named; the filters narrow \
                          further; blocking like the view. Labels __meta_waymark_service, \
                          _instance, _region, _zone, _verdict, _status, _weight, _tags, \
                          _evidence, _verified, _metadata_<key>. Prometheus authenticates with \
                          the same credential as every route: in http_sd_configs, \
                          `authorization: {type: Bearer, credentials_file: …}` and \
                          `tls_config: {ca_file: …}`.",
            query: Some(inline::<DiscoveryParams>),
            checked_query: true,
            replies: &[Reply::json::<Vec<discovery::TargetGroup>>(
                200,
                "One target group per endpoint",
            )],
            ..Operation::DEFAULT
        },
    },
    // === instances ===
    Route {
        mount: |m| on(m, instances::instances),
        op: Operation {
            method: Get,
            path: "/v1/instances",
            id: "listInstances",
            tag: "instances",
            summary: "Registered, orchestrated and declared instances",
            description: "A filter on verdicts or capabilities reads this region's views (an \
                          instance in none is `withdrawn`).",
            body_limit: INSTANCE_BODY_MAX,
            query: Some(inline::<InstancesParams>),
            checked_query: true,
            replies: &[Reply::json::<Vec<InstanceRecord>>(
                200,
                "Every instance, or one page",
            )],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, instances::register),
        op: Operation {
            method: Post,
            path: "/v1/instances",
            id: "registerInstance",
            tag: "instances",
            summary: "Register an instance of an unwatched runtime with a lease (default 30 s); \
                      the id is issued here and never reused",
            description: "A node agent registers only on its own node, in this region, at the \
                          address its connection comes from; a workload only itself.",
            permission: Grant("register:<node>"),
            leader: true,
            body_limit: INSTANCE_BODY_MAX,
            request: Some(Body::json::<Registration>()),
            replies: &[Reply::json::<instances::Registered>(201, "Registered")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, instances::deregister),
        op: Operation {
            method: Delete,
            path: "/v1/instances/{id}",
            id: "deregisterInstance",
            tag: "instances",
            summary: "Deregister (graceful shutdown): retired for good",
            permission: Grant("register:<node>"),
            leader: true,
            path_params: Some(inline::<InstancePath>),
            replies: &[Reply::empty(204, COMMITTED)],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, instances::renew),
        op: Operation {
            method: Put,
            path: "/v1/instances/{id}/renew",
            id: "renewInstance",
            tag: "instances",
            summary: "Renew a lease",
            description: "Answered by the leader's term without a log entry: the body's \
                          applied.expires_at_ms is the lease's new end. Only the leader judges \
                          expiry; a new leader restarts every lease at full length first.",
            permission: Grant("register:<node>"),
            leader: true,
            path_params: Some(inline::<InstancePath>),
            replies: &[
                Reply::json::<instances::AppliedBody>(200, "Renewed"),
                refusal(503, "renewals_busy: too many renewals are waiting; retry"),
            ],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, instances::explain),
        op: Operation {
            method: Get,
            path: "/v1/instances/{id}/explain",
            id: "explainInstance",
            tag: "instances",
            summary: "Why an instance is where it is: evidence per class, check output, \
                      transitions, the rule that fired",
            leader: true,
            path_params: Some(inline::<InstancePath>),
            replies: &[
                Reply::json::<instances::Explanation>(200, "The evaluator's account"),
                refusal(404, "unknown_instance"),
            ],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, instances::declare_external),
        op: Operation {
            method: Post,
            path: "/v1/external",
            id: "declareExternal",
            tag: "instances",
            summary: "Declare an external endpoint (profile no_readiness; governed by passive \
                      outcomes)",
            permission: Grant("register:<node>, by an operator"),
            leader: true,
            body_limit: INSTANCE_BODY_MAX,
            request: Some(Body::json::<Instance>()),
            replies: &[Reply::json::<instances::Declared>(201, "Declared")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, instances::remove_external),
        op: Operation {
            method: Delete,
            path: "/v1/external/{id}",
            id: "removeExternal",
            tag: "instances",
            summary: "Stop declaring an external endpoint",
            permission: Grant("register:<node>, by an operator"),
            leader: true,
            path_params: Some(inline::<InstancePath>),
            replies: &[Reply::empty(204, COMMITTED)],
            ..Operation::DEFAULT
        },
    },
    // === overrides ===
    Route {
        mount: |m| on(m, overrides::override_instance),
        op: Operation {
            method: Post,
            path: "/v1/overrides",
            id: "overrideInstances",
            tag: "overrides",
            summary: "Take an instance, or every instance of a node, out of rotation by hand \
                      (maintenance_on) or return it (maintenance_off)",
            description: "Needs override:<service> for every service touched and a \
                          justification; rate-limited per principal per service; checked \
                          against the disruption budget (no zone of a service below its \
                          floor, at most max_manual_withdrawals of a service at once); \
                          audited whether granted or refused.",
            permission: Grant("override:<service>"),
            leader: true,
            request: Some(Body::json::<overrides::OverrideBody>()),
            replies: &[
                Reply::json::<overrides::OverrideApplied>(200, "Applied"),
                Reply::json::<overrides::BudgetRefused>(
                    409,
                    "disruption_budget: recorded as awaiting approval; a different principal \
                     may approve it",
                ),
                refusal(
                    429,
                    "rate_limited: the actor's overrides on a service are spent",
                ),
            ],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, overrides::approve_override),
        op: Operation {
            method: Post,
            path: "/v1/overrides/{seq}/approve",
            id: "approveOverride",
            tag: "overrides",
            summary: "Break-glass: approve an override the disruption budget refused",
            description: "As a principal other than the one who asked, within its window; \
                          applies it and is audited naming both.",
            permission: Grant("override:<service>"),
            leader: true,
            path_params: Some(inline::<SeqPath>),
            request: Some(Body::json::<overrides::ApproveBody>()),
            replies: &[
                Reply::json::<overrides::ApprovalApplied>(200, "Approved and applied"),
                refusal(404, "No override awaits approval under this number"),
                refusal(
                    409,
                    "Approved already, expired, or asked by the same principal",
                ),
                refusal(429, "rate_limited"),
            ],
            ..Operation::DEFAULT
        },
    },
    // === routing ===
    Route {
        mount: |m| on(m, routing::zones),
        op: Operation {
            method: Get,
            path: "/v1/zones",
            id: "listZoneEvacuations",
            tag: "routing",
            summary: "Zone evacuations in progress",
            replies: &[Reply::json::<routing::Zones>(200, "Every evacuation")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, routing::evacuation),
        op: Operation {
            method: Post,
            path: "/v1/zones/{zone}/evacuation",
            id: "evacuateZone",
            tag: "routing",
            summary: "Evacuate a zone, shift it back, or complete a manual shift-back (stepped, \
                      reversible, audited)",
            permission: Grant("evacuate"),
            leader: true,
            path_params: Some(inline::<ZonePath>),
            request: Some(Body::json::<EvacuationIntent>()),
            replies: &[
                Reply::json::<instances::AppliedBody>(200, COMMITTED),
                refusal(
                    409,
                    "evacuation: the assembler refused it (the message says why)",
                ),
            ],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, routing::region_failovers),
        op: Operation {
            method: Get,
            path: "/v1/federation/failovers",
            id: "listRegionFailovers",
            tag: "routing",
            summary: "Region failovers in force: per peer region, the share of preference \
                      moved away, direction, whether manual, and whether a shift-back awaits \
                      completion",
            replies: &[
                Reply::json::<BTreeMap<RegionName, routing::RegionFailover>>(200, "By peer region"),
            ],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, routing::region_failover),
        op: Operation {
            method: Post,
            path: "/v1/federation/regions/{region}/failover",
            id: "failoverRegion",
            tag: "routing",
            summary: "Shift preference away from a peer region, shift it back, or complete a \
                      manual shift-back (stepped, reversible, audited)",
            permission: Grant("evacuate"),
            leader: true,
            path_params: Some(inline::<RegionPath>),
            request: Some(Body::json::<routing::FailoverBody>()),
            replies: &[
                Reply::json::<instances::AppliedBody>(200, COMMITTED),
                refusal(
                    409,
                    "region_failover: the assembler refused it (the message says why)",
                ),
            ],
            ..Operation::DEFAULT
        },
    },
    // === audit ===
    Route {
        mount: |m| on(m, audit::audit),
        op: Operation {
            method: Get,
            path: "/v1/audit",
            id: "readAudit",
            tag: "audit",
            summary: "The audit log as JSON lines, filtered",
            description: "One AuditEntry per line, oldest first. What a probed target said is \
                          redacted; explain alone relays it.",
            query: Some(inline::<audit::AuditQuery>),
            replies: &[Reply::with(
                200,
                "Matching records",
                Body::json_lines::<AuditEntry>(),
            )],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, audit::alarms),
        op: Operation {
            method: Get,
            path: "/v1/alarms",
            id: "listAlarms",
            tag: "audit",
            summary: "Alarms currently raised (fraction guard, last eligible withdrawn)",
            replies: &[Reply::json::<Vec<audit::Alarm>>(200, "Every alarm raised")],
            ..Operation::DEFAULT
        },
    },
    // === acl ===
    Route {
        mount: |m| on(m, acl::whoami),
        op: Operation {
            method: Get,
            path: "/v1/acl/whoami",
            id: "whoami",
            tag: "acl",
            summary: "The verified principal of this request, how it proved it, and the grants \
                      that apply to it (any principal)",
            permission: Authenticated,
            replies: &[Reply::json::<acl::Whoami>(200, "The caller")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, acl::acl_bootstrap),
        op: Operation {
            method: Post,
            path: "/v1/acl/bootstrap",
            id: "bootstrapAcl",
            tag: "acl",
            summary: "Create the region's first grants, once: every capability for the \
                      operator presenting its client certificate; read and register:own for \
                      node/*",
            permission: Grant("an operator's client certificate"),
            leader: true,
            replies: &[
                Reply::json::<acl::AclAppliedBody>(200, "Bootstrapped"),
                refusal(422, "already_bootstrapped"),
            ],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, acl::list_grants),
        op: Operation {
            method: Get,
            path: "/v1/acl/grants",
            id: "listGrants",
            tag: "acl",
            summary: "Every grant",
            permission: Grant("acl"),
            replies: &[Reply::json::<acl::Grants>(200, "Every grant")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, acl::add_grant),
        op: Operation {
            method: Post,
            path: "/v1/acl/grants",
            id: "addGrant",
            tag: "acl",
            summary: "Add a grant (audited)",
            permission: Grant("acl"),
            leader: true,
            request: Some(Body::json::<acl::GrantBody>()),
            replies: &[Reply::json::<acl::AclAppliedBody>(200, COMMITTED)],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, acl::revoke_grant),
        op: Operation {
            method: Post,
            path: "/v1/acl/grants/revoke",
            id: "revokeGrant",
            tag: "acl",
            summary: "Remove a grant (audited)",
            permission: Grant("acl"),
            leader: true,
            request: Some(Body::json::<acl::GrantBody>()),
            replies: &[Reply::json::<acl::AclAppliedBody>(200, COMMITTED)],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, acl::list_tokens),
        op: Operation {
            method: Get,
            path: "/v1/acl/tokens",
            id: "listTokens",
            tag: "acl",
            summary: "Tokens: name, creator, expiry, description; never a secret or its digest",
            permission: Grant("acl"),
            replies: &[Reply::json::<Vec<acl::TokenSummary>>(200, "Every token")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, acl::mint_token),
        op: Operation {
            method: Post,
            path: "/v1/acl/tokens",
            id: "mintToken",
            tag: "acl",
            summary: "Mint a token (audited)",
            description: "The secret is generated by the server and returned once; only its \
                          SHA-256 is stored.",
            permission: Grant("acl"),
            leader: true,
            request: Some(Body::json::<acl::MintToken>()),
            replies: &[Reply::json::<acl::MintedToken>(201, "Minted")],
            ..Operation::DEFAULT
        },
    },
    Route {
        mount: |m| on(m, acl::remove_token),
        op: Operation {
            method: Delete,
            path: "/v1/acl/tokens/{name}",
            id: "removeToken",
            tag: "acl",
            summary: "Remove a token and every grant to it (audited)",
            permission: Grant("acl"),
            leader: true,
            path_params: Some(inline::<TokenPath>),
            replies: &[Reply::json::<acl::AclAppliedBody>(200, COMMITTED)],
            ..Operation::DEFAULT
        },
    },
];
