//! The operator commands' surface: every resource of the authority API has a command
//! here, each a thin client of the route it names (see [`ROUTES`]).
//!
//! ```text
//! waymark instances [list|show|register|deregister|renew]   /v1/instances…
//! waymark services  [list|get|apply|delete|view|validate]   /v1/services…, /v1/contracts/validate
//! waymark policy    get|set                                 /v1/services/{s}/policy
//! waymark zones     [list]|evacuate|shift-back|complete-shift-back   /v1/zones…
//! waymark external  declare|remove                          /v1/external…
//! waymark explain, override, audit, alarms, status, openapi
//! waymark proxy-status, proxy-config                        /v1/proxy-status…, /v1/proxy-config…
//! waymark federation …, acl …, operator raft …, members
//! waymark keyring   list|install|use|remove                 /v1/operator/keyring
//! ```
//!
//! Output is a table, a wider table, or the API's answer as JSON or YAML
//! (`-o table|wide|json|yaml`; `--json` is `-o json`).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context as _;
use waymark_registry::machine::AuditKind;

use super::ops;
use super::output::Output;
use super::tls::{ClientFiles, api_client_config};
use crate::api_client::ApiClient;

/// Where the operator commands find an authority member, with what credential, and how
/// they print.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// Any authority member's API, `https://host:port` (or `host:port` for a plaintext
    /// loopback API); followers redirect to the leader.
    #[arg(
        long,
        env = "WAYMARK_API",
        default_value = "127.0.0.1:8500",
        global = true
    )]
    pub api: String,
    /// The estate's trust bundle: the API is then spoken over TLS and the server must be
    /// an authority of the bundle's trust domain.
    #[arg(long, env = "WAYMARK_CA_BUNDLE", global = true)]
    pub ca_bundle: Option<PathBuf>,
    /// A client certificate chain to present (an operator's, from
    /// `waymark certs issue --identity spiffe://<td>/operator/<name>`); needs `--key` and
    /// `--ca-bundle`. The certificate is then the principal, instead of a token.
    #[arg(long, env = "WAYMARK_CLIENT_CERT", global = true, requires = "key")]
    pub cert: Option<PathBuf>,
    /// The key of `--cert`.
    #[arg(long, env = "WAYMARK_CLIENT_KEY", global = true, requires = "cert")]
    pub key: Option<PathBuf>,
    /// A bearer token (`wmt.<name>.<secret>`), as `waymark dev` prints it or
    /// `waymark acl token-create` mints it.
    #[arg(long, env = "WAYMARK_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the bearer token (read at start; takes the place of `--token`).
    #[arg(long, env = "WAYMARK_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// How to print: a table, a wider table, or the API's answer as JSON or YAML.
    #[arg(
        short = 'o',
        long,
        value_enum,
        default_value_t = Output::Table,
        global = true
    )]
    pub output: Output,
    /// Print JSON (the same as `-o json`).
    #[arg(long, global = true, conflicts_with = "output")]
    pub json: bool,
}

impl ApiArgs {
    /// A client for the API with the credential given.
    pub fn client(&self) -> anyhow::Result<ApiClient> {
        let token = match (&self.token, &self.token_file) {
            (_, Some(path)) => Some(read_token_file(path)?),
            (Some(token), None) => Some(token.trim().to_owned()),
            (None, None) => None,
        };
        let client = ApiClient::new(&self.api, token);
        let identity = self.cert.clone().zip(self.key.clone());
        match (&self.ca_bundle, identity) {
            (Some(bundle), identity) => {
                let files = ClientFiles {
                    bundle: bundle.clone(),
                    identity,
                };
                Ok(client.with_tls(api_client_config(&files, SystemTime::now())?))
            }
            (None, Some(_)) => {
                anyhow::bail!("--cert needs --ca-bundle (WAYMARK_CA_BUNDLE) to check the server")
            }
            (None, None) => Ok(client),
        }
    }

    /// How to print.
    pub fn out(&self) -> Output {
        if self.json { Output::Json } else { self.output }
    }
}

/// The bearer token in `path` (surrounding whitespace is not token).
fn read_token_file(path: &Path) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("reading the token file {}", path.display()))?
        .trim()
        .to_owned())
}

/// A client of a node agent's local HTTP API at `addr`: over TLS when it is `https://`
/// (checked against `bundle`, which must then be given), presenting the token in
/// `token_file` when one is given.
fn agent_client(
    addr: &str,
    token_file: Option<&Path>,
    bundle: Option<&Path>,
) -> anyhow::Result<ApiClient> {
    let token = token_file.map(read_token_file).transpose()?;
    let client = ApiClient::new(addr, token);
    if !addr.starts_with("https://") {
        return Ok(client);
    }
    let bundle = bundle.with_context(|| {
        format!("{addr}: an https agent API needs --ca-bundle (WAYMARK_CA_BUNDLE) to check it")
    })?;
    Ok(client.with_tls(super::tls::agent_api_client_config(bundle)?))
}

/// The operator commands, each a client of one or more API routes.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Registered and orchestrated instances: list (the default), show, register,
    /// deregister, renew.
    Instances {
        #[command(subcommand)]
        command: Option<InstancesCommand>,
        #[command(flatten)]
        filter: InstanceFilter,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Services and their health contracts: list (the default) with counts per verdict
    /// and guard state, get, apply, delete, view, validate.
    Services {
        #[command(subcommand)]
        command: Option<ServicesCommand>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// A service's policy: fraction guard, failover order, allowed callers, disruption
    /// budget.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Zones: evacuations in force (the default), evacuate a zone, shift back.
    Zones {
        #[command(subcommand)]
        command: Option<ZonesCommand>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Third-party endpoints the region routes to without running them.
    External {
        #[command(subcommand)]
        command: ExternalCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Why an instance is where it is (the same as `instances show`).
    Explain {
        /// The instance id.
        instance: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// The audit log: a table, or the records as JSON lines with `-o json`.
    Audit {
        /// Only this kind.
        #[arg(long, value_parser = audit_kind())]
        kind: Option<AuditKind>,
        /// Only this actor (`operator/<name>`, `token/<name>`, `node/<name>`, …).
        #[arg(long)]
        actor: Option<String>,
        /// Only this service.
        #[arg(long)]
        service: Option<String>,
        /// Only this instance.
        #[arg(long)]
        instance: Option<String>,
        /// Only records after this sequence number.
        #[arg(long)]
        since_seq: Option<u64>,
        /// At most this many records.
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Alarms still raised: a service draining, a fraction guard engaged, no eligible
    /// instance in the region, ….
    Alarms {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// The member answering: its role, term, leader, applied index, region.
    Status {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Take an instance (or a node's every instance) out of rotation by hand, or return
    /// it; privileged, checked against the disruption budget, audited. A budget refusal
    /// may be approved by a second principal with `--approve`.
    Override {
        /// The instance id.
        #[arg(required_unless_present_any = ["node", "approve"], conflicts_with_all = ["node", "approve"])]
        instance: Option<String>,
        /// Every instance of this node instead (node maintenance).
        #[arg(long, conflicts_with = "approve")]
        node: Option<String>,
        /// Approve the override refused under this number (from the refusal), as a
        /// principal other than the one who asked.
        #[arg(long)]
        approve: Option<u64>,
        /// Out of rotation, or back into it.
        #[arg(long, value_enum, default_value_t = OverrideAction::MaintenanceOn)]
        action: OverrideAction,
        /// Why (required).
        #[arg(long)]
        justification: Option<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Every node agent this member serves and, under each, the sidecars its node reports:
    /// versions sent and acknowledged, SYNCED/STALE/NACK, connected for, the view's age.
    ProxyStatus {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// What one sidecar holds: its clusters and endpoints with weights, health and
    /// markers, as its node agent sent them.
    ProxyConfig {
        /// The sidecar's xDS node id (its `CLIENT` in `proxy-status`).
        client: String,
        /// Its node (found from the sidecar reports when not given).
        #[arg(long, conflicts_with = "agent")]
        node: Option<String>,
        /// Ask the node agent's own HTTP API (`127.0.0.1:8400` on this host, or
        /// `https://host:port` off loopback, checked against `--ca-bundle`) instead of
        /// the authority.
        #[arg(long)]
        agent: Option<String>,
        /// A file holding a bearer token of the agent's `[agent.listen] http_tokens_file`.
        #[arg(long, env = "WAYMARK_AGENT_TOKEN_FILE", requires = "agent")]
        agent_token_file: Option<PathBuf>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// The orchestrator reconciliation's last pass (Kubernetes existence): what it
    /// added, removed and left, and why.
    Reconciliation {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// The API's OpenAPI document, as the member serves it.
    Openapi {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// JSON Schema of what operators write, generated from the types the authority
    /// decodes: a health contract, a policy, or both as OpenAPI components. Offline.
    Schema {
        /// Which.
        #[arg(value_enum)]
        which: SchemaKind,
    },
    /// The gossip pool as a node agent sees it.
    Members {
        /// The agent's HTTP API: `host:port` on loopback, `https://host:port` off it.
        #[arg(long, env = "WAYMARK_AGENT_API", default_value = "127.0.0.1:8400")]
        agent: String,
        /// The estate's trust bundle, for an `https://` agent API (the server must be a
        /// node agent of the bundle's trust domain).
        #[arg(long, env = "WAYMARK_CA_BUNDLE")]
        ca_bundle: Option<PathBuf>,
        /// A file holding a bearer token of the agent's `[agent.listen] http_tokens_file`.
        #[arg(long, env = "WAYMARK_AGENT_TOKEN_FILE")]
        token_file: Option<PathBuf>,
        /// How to print.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Print JSON (the same as `-o json`).
        #[arg(long, conflicts_with = "output")]
        json: bool,
    },
    /// The region's gossip keyring, rotated online across every authority member and
    /// node agent: list, install, use, remove (docs/operations.md).
    Keyring {
        #[command(subcommand)]
        command: KeyringCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Operate the authority group.
    Operator {
        #[command(subcommand)]
        command: OperatorCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Cross-region federation: peer regions, links, reconciliations, failover.
    Federation {
        #[command(subcommand)]
        command: FederationCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Access control: who you are, grants, tokens, the region's bootstrap.
    Acl {
        #[command(subcommand)]
        command: AclCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// Filters of `waymark instances` (applied by the authority).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct InstanceFilter {
    /// Only this service's instances.
    #[arg(long)]
    pub service: Option<String>,
}

#[derive(Debug, clap::Subcommand)]
pub enum InstancesCommand {
    /// Every instance (the default).
    List,
    /// Why an instance is where it is: evidence per class, the rule that fired,
    /// transitions.
    Show {
        /// The instance id.
        instance: String,
    },
    /// Register an instance from a file (JSON or YAML; `-` reads standard input).
    Register {
        /// The registration: service, address, locality, lease_ms, tags, metadata.
        #[arg(short = 'f', long)]
        file: PathBuf,
    },
    /// Deregister an instance.
    Deregister {
        /// The instance id.
        instance: String,
    },
    /// Renew an instance's lease.
    Renew {
        /// The instance id.
        instance: String,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum ServicesCommand {
    /// Every service with counts per verdict and guard state (the default).
    List,
    /// A service's owner and health contract.
    Get {
        /// The service.
        service: String,
    },
    /// Create or replace a service from a file (JSON or YAML; `-` reads standard input):
    /// `{service, owner, contract}`. The contract is validated by the authority first.
    Apply {
        /// The file.
        #[arg(short = 'f', long)]
        file: PathBuf,
    },
    /// Remove a service (its instances leave the views).
    Delete {
        /// The service.
        service: String,
    },
    /// The views the region publishes for a service, per zone, with every endpoint.
    View {
        /// The service.
        service: String,
    },
    /// Check a service file or a bare contract without applying it: offline with the
    /// same validation the authority runs, or `--remote` against the authority.
    Validate {
        /// The file: `{service, owner, contract}` or a bare contract.
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// Ask the authority instead of checking here.
        #[arg(long)]
        remote: bool,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum PolicyCommand {
    /// A service's policy.
    Get {
        /// The service.
        service: String,
    },
    /// Replace a service's policy from a file (JSON or YAML; `-` reads standard input).
    /// Checked against the region before commit; audited whether applied or refused.
    Set {
        /// The service.
        service: String,
        /// The file.
        #[arg(short = 'f', long)]
        file: PathBuf,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum ZonesCommand {
    /// Evacuations in force (the default).
    List,
    /// Move traffic away from a zone, in capped steps. Privileged, audited.
    Evacuate {
        /// The zone.
        zone: String,
        /// An operator's evacuation: its shift-back waits for `complete-shift-back`.
        #[arg(long)]
        manual: bool,
    },
    /// Bring traffic back to a zone, in capped steps. Privileged, audited.
    ShiftBack {
        /// The zone.
        zone: String,
    },
    /// Finish a manual evacuation's shift-back, holding at its last step.
    CompleteShiftBack {
        /// The zone.
        zone: String,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum ExternalCommand {
    /// Declare a third-party endpoint from a file (JSON or YAML; `-` reads standard
    /// input).
    Declare {
        /// The declaration.
        #[arg(short = 'f', long)]
        file: PathBuf,
    },
    /// Remove a declared endpoint.
    Remove {
        /// Its id.
        id: String,
    },
}

/// Which schema `waymark schema` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemaKind {
    /// A health contract (`docs/schema/contract.schema.json`).
    Contract,
    /// A service policy (`docs/schema/policy.schema.json`).
    Policy,
    /// The authority API's OpenAPI document, generated from its operation table
    /// (`agent/src/authority/openapi.json`).
    Openapi,
}

/// What an override does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OverrideAction {
    /// Out of rotation (maintenance).
    MaintenanceOn,
    /// Back into rotation.
    MaintenanceOff,
}

impl OverrideAction {
    /// The API's name for it.
    pub fn as_api(self) -> &'static str {
        match self {
            Self::MaintenanceOn => "maintenance_on",
            Self::MaintenanceOff => "maintenance_off",
        }
    }
}

/// `--kind`: one of the registry's audit kinds, listed with `--help`.
fn audit_kind() -> impl clap::builder::TypedValueParser<Value = AuditKind> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(AuditKind::ALL.map(AuditKind::as_str)).map(|name| {
        AuditKind::ALL
            .into_iter()
            .find(|k| k.as_str() == name)
            .unwrap_or(AuditKind::Transition) // unreachable: the parser admits listed names only
    })
}

#[derive(Debug, clap::Subcommand)]
pub enum AclCommand {
    /// The principal your credential proves, and the grants it holds.
    Whoami,
    /// Create the region's first grants, once (needs an operator certificate).
    Bootstrap,
    /// Every grant.
    Grants,
    /// Grant a capability: `read`, `register:own|*|<node>`, `own:<service>|*`,
    /// `override:<service>|*`, `evacuate`, `raft`, `acl`.
    Grant {
        /// Who: `operator/<name>`, `token/<name>`, `node/<name>`, `node/*`, `service/<name>`.
        #[arg(long)]
        to: String,
        /// The capability.
        #[arg(long)]
        can: String,
    },
    /// Remove a grant.
    Revoke {
        /// Who.
        #[arg(long)]
        to: String,
        /// The capability.
        #[arg(long)]
        can: String,
    },
    /// Tokens (names, owners, expiry; never secrets).
    Tokens,
    /// Mint a token; its secret is printed once.
    TokenCreate {
        /// Its name (`[a-z0-9-]`).
        #[arg(long)]
        name: String,
        /// Its lifetime (`720h`, `30m`; at most a year).
        #[arg(long, default_value = "720h", value_parser = waymark_core::duration_str::parse)]
        ttl: std::time::Duration,
        /// What it is for.
        #[arg(long, default_value = "")]
        description: String,
        /// Capabilities to grant it (repeatable).
        #[arg(long = "grant")]
        grants: Vec<String>,
    },
    /// Revoke a token and every grant to it.
    TokenDelete {
        /// Its name.
        name: String,
    },
    /// Print a fresh token without contacting any member: for
    /// `authority.acl.initial_management_token_file`.
    GenerateToken {
        /// Its name (`[a-z0-9-]`); the region is bootstrapped for operator `<name>`.
        #[arg(long, default_value = "management")]
        name: String,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum FederationCommand {
    /// Peer regions (links up, age, staleness, versions held), each link, front doors.
    Status,
    /// Every reconciliation after a partition: per entry, what each side held and what won.
    ReconcileLog {
        /// Only records after this audit sequence number.
        #[arg(long)]
        since_seq: Option<u64>,
    },
    /// Region failovers in force: share moved, direction, who asked, awaiting completion.
    Failovers,
    /// Shift this region's preference away from a peer region, in capped steps (manual:
    /// its shift-back waits for `complete-shift-back`). Privileged, audited.
    Failover(RegionControl),
    /// Bring preference back to a peer region, in capped steps. Privileged, audited.
    ShiftBack(RegionControl),
    /// Finish a manual failover's shift-back, holding at its last step. Privileged, audited.
    CompleteShiftBack(RegionControl),
}

#[derive(Debug, clap::Args)]
pub struct RegionControl {
    /// The peer region.
    #[arg(long)]
    pub region: String,
    /// Why (required; kept with the failover and in the audit log).
    #[arg(long)]
    pub reason: String,
}

#[derive(Debug, clap::Subcommand)]
pub enum KeyringCommand {
    /// Every pool member's key ids (never keys): how many hold each key, and on how many
    /// it is primary.
    List,
    /// Step 1: every member opens with KEY too (it still seals with the primary).
    Install(KeyArgs),
    /// Step 2, once every member holds KEY: seal with it. Refused while any does not.
    Use(KeyArgs),
    /// Step 3, once KEY is primary nowhere: stop opening with it.
    Remove(KeyArgs),
}

/// The key of `keyring install|use|remove`.
#[derive(Debug, clap::Args)]
pub struct KeyArgs {
    /// The key: 64 hex digits or base64 of 32 bytes (`use` and `remove` also take the
    /// key id `keyring list` prints). Prefer `--key-file`: a command line is visible to
    /// other users and kept in shell history.
    #[arg(conflicts_with = "key_file", required_unless_present = "key_file")]
    pub key: Option<String>,
    /// Read the key from this file (its first line).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// `use`/`remove`: go on when some members did not answer the check (they are left
    /// behind; see docs/operations.md for bringing them back).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum OperatorCommand {
    /// The Raft group.
    Raft {
        #[command(subcommand)]
        command: RaftCommand,
    },
    /// Backups of the replicated state (docs/operations.md).
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// Write a consistent backup of the region's state, taken on the leader, to FILE.
    Save {
        /// Where to write it.
        file: std::path::PathBuf,
    },
    /// Verify a backup of this region and put it in force on every member.
    Restore {
        /// The backup.
        file: std::path::PathBuf,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum RaftCommand {
    /// Each member, its role and how far it trails the leader.
    ListPeers,
    /// Add a member (learner first, voter once caught up).
    Join {
        /// Its id (never reused).
        #[arg(long)]
        id: u64,
        /// Its API listener, host:port.
        #[arg(long)]
        addr: String,
        /// Its Raft listener, host:port.
        #[arg(long)]
        raft: String,
    },
    /// Remove a member.
    Remove {
        /// Its id.
        #[arg(long)]
        id: u64,
    },
    /// Move leadership to a caught-up voter (before restarting the leader).
    TransferLeader {
        /// The voter to lead; without it, the most caught-up one.
        #[arg(long)]
        to: Option<u64>,
    },
    /// Offline, on a stopped member whose peers are lost for good: make it the only voter,
    /// keeping its whole log (docs/operations.md, "Quorum loss"). Speaks to no API.
    Recover(RecoverArgs),
}

/// Which stopped member `operator raft recover` rewrites.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("member").required(true).args(["config", "data_dir"])))]
pub struct RecoverArgs {
    /// The member's configuration file: its id, data_dir and addresses (environment
    /// overrides apply, as for `waymark authority`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The member's data directory (`authority.data_dir`) instead of its configuration;
    /// needs `--id`. The membership keeps the addresses the group knew it by.
    #[arg(long, requires = "id")]
    pub data_dir: Option<PathBuf>,
    /// The member's id (with `--data-dir`).
    #[arg(long, requires = "data_dir")]
    pub id: Option<u64>,
}

/// Every route of the authority API and the command that speaks it; the routes no command
/// speaks say why. `agent/tests/cli_coverage.rs` checks this table against the API's
/// operation table (which mounts the router and generates the OpenAPI document) and runs
/// every command.
pub const ROUTES: &[(&str, &str, &str)] = &[
    ("GET", "/v1/openapi.json", "openapi"),
    ("GET", "/v1/status", "status"),
    ("GET", "/v1/operator/raft/peers", "operator raft list-peers"),
    ("POST", "/v1/operator/raft/members", "operator raft join"),
    (
        "DELETE",
        "/v1/operator/raft/members/{id}",
        "operator raft remove",
    ),
    (
        "POST",
        "/v1/operator/raft/transfer-leader",
        "operator raft transfer-leader",
    ),
    ("GET", "/v1/operator/keyring", "keyring list"),
    ("POST", "/v1/operator/keyring", "keyring install|use|remove"),
    ("GET", "/v1/operator/snapshot", "operator snapshot save"),
    ("PUT", "/v1/operator/snapshot", "operator snapshot restore"),
    ("GET", "/v1/services", "services list"),
    ("GET", "/v1/services/{service}", "services get"),
    ("PUT", "/v1/services/{service}", "services apply"),
    ("DELETE", "/v1/services/{service}", "services delete"),
    ("GET", "/v1/services/{service}/view", "services view"),
    (
        "GET",
        "/v1/prometheus/sd",
        "(none: read by Prometheus's http_sd_configs)",
    ),
    ("GET", "/v1/services/{service}/policy", "policy get"),
    ("PUT", "/v1/services/{service}/policy", "policy set"),
    (
        "POST",
        "/v1/contracts/validate",
        "services validate --remote",
    ),
    ("GET", "/v1/zones", "zones list"),
    (
        "POST",
        "/v1/zones/{zone}/evacuation",
        "zones evacuate|shift-back|complete-shift-back",
    ),
    ("GET", "/v1/instances", "instances list"),
    ("POST", "/v1/instances", "instances register"),
    ("DELETE", "/v1/instances/{id}", "instances deregister"),
    ("PUT", "/v1/instances/{id}/renew", "instances renew"),
    (
        "GET",
        "/v1/instances/{id}/explain",
        "instances show, explain",
    ),
    ("POST", "/v1/external", "external declare"),
    ("DELETE", "/v1/external/{id}", "external remove"),
    ("POST", "/v1/overrides", "override"),
    ("POST", "/v1/overrides/{seq}/approve", "override --approve"),
    ("GET", "/v1/audit", "audit"),
    ("GET", "/v1/alarms", "alarms"),
    ("GET", "/v1/reconciliation", "reconciliation"),
    ("GET", "/v1/proxy-status", "proxy-status"),
    ("GET", "/v1/proxy-status/sidecars", "proxy-status"),
    ("GET", "/v1/proxy-config/{node}/{client}", "proxy-config"),
    ("GET", "/v1/federation/status", "federation status"),
    ("GET", "/v1/federation/failovers", "federation failovers"),
    (
        "POST",
        "/v1/federation/regions/{region}/failover",
        "federation failover|shift-back|complete-shift-back",
    ),
    ("GET", "/v1/acl/whoami", "acl whoami"),
    ("POST", "/v1/acl/bootstrap", "acl bootstrap"),
    ("GET", "/v1/acl/grants", "acl grants"),
    ("POST", "/v1/acl/grants", "acl grant"),
    ("POST", "/v1/acl/grants/revoke", "acl revoke"),
    ("GET", "/v1/acl/tokens", "acl tokens"),
    ("POST", "/v1/acl/tokens", "acl token-create"),
    ("DELETE", "/v1/acl/tokens/{name}", "acl token-delete"),
    (
        "GET",
        "/metrics",
        "(none: for Prometheus, which scrapes it with the same credential)",
    ),
    ("GET", "/livez", "(none: for the orchestrator's probes)"),
    ("GET", "/readyz", "(none: for the orchestrator's probes)"),
];

/// Runs an operator command; returns what it prints.
pub async fn run(command: ClientCommand) -> anyhow::Result<String> {
    match command {
        ClientCommand::Instances {
            command,
            filter,
            api,
        } => {
            let (client, out) = (api.client()?, api.out());
            match command.unwrap_or(InstancesCommand::List) {
                InstancesCommand::List => ops::resources::instances(&client, &filter, out).await,
                InstancesCommand::Show { instance } => ops::explain(&client, &instance, out).await,
                InstancesCommand::Register { file } => {
                    ops::resources::register(&client, &file, out).await
                }
                InstancesCommand::Deregister { instance } => {
                    ops::resources::deregister(&client, &instance).await
                }
                InstancesCommand::Renew { instance } => {
                    ops::resources::renew(&client, &instance, out).await
                }
            }
        }
        ClientCommand::Services { command, api } => {
            let (client, out) = (api.client()?, api.out());
            match command.unwrap_or(ServicesCommand::List) {
                ServicesCommand::List => ops::services(&client, out).await,
                ServicesCommand::Get { service } => {
                    ops::resources::service(&client, &service, out).await
                }
                ServicesCommand::Apply { file } => {
                    ops::resources::apply_service(&client, &file).await
                }
                ServicesCommand::Delete { service } => {
                    ops::resources::delete_service(&client, &service).await
                }
                ServicesCommand::View { service } => {
                    ops::resources::view(&client, &service, out).await
                }
                ServicesCommand::Validate { file, remote } => {
                    let client = remote.then_some(&client);
                    ops::resources::validate(client, &file).await
                }
            }
        }
        ClientCommand::Policy { command, api } => {
            let (client, out) = (api.client()?, api.out());
            match command {
                PolicyCommand::Get { service } => {
                    ops::resources::policy(&client, &service, out).await
                }
                PolicyCommand::Set { service, file } => {
                    ops::resources::set_policy(&client, &service, &file).await
                }
            }
        }
        ClientCommand::Zones { command, api } => {
            let (client, out) = (api.client()?, api.out());
            let intent = |action: &str, manual: bool| serde_json::json!({"action": action, "manual": manual});
            match command.unwrap_or(ZonesCommand::List) {
                ZonesCommand::List => ops::resources::zones(&client, out).await,
                ZonesCommand::Evacuate { zone, manual } => {
                    ops::resources::evacuation(&client, &zone, intent("evacuate", manual)).await
                }
                ZonesCommand::ShiftBack { zone } => {
                    ops::resources::evacuation(&client, &zone, intent("shift_back", false)).await
                }
                ZonesCommand::CompleteShiftBack { zone } => {
                    let body = intent("complete_shift_back", false);
                    ops::resources::evacuation(&client, &zone, body).await
                }
            }
        }
        ClientCommand::External { command, api } => {
            let client = api.client()?;
            match command {
                ExternalCommand::Declare { file } => {
                    ops::resources::declare_external(&client, &file, api.out()).await
                }
                ExternalCommand::Remove { id } => {
                    ops::resources::remove_external(&client, &id).await
                }
            }
        }
        ClientCommand::Explain { instance, api } => {
            ops::explain(&api.client()?, &instance, api.out()).await
        }
        ClientCommand::Audit {
            kind,
            actor,
            service,
            instance,
            since_seq,
            limit,
            api,
        } => {
            let query = [
                ("kind", kind.map(|k| k.as_str().to_owned())),
                ("actor", actor),
                ("service", service),
                ("instance", instance),
                ("since_seq", since_seq.map(|s| s.to_string())),
                ("limit", limit.map(|l| l.to_string())),
            ];
            ops::audit(&api.client()?, &query, api.out()).await
        }
        ClientCommand::Alarms { api } => ops::resources::alarms(&api.client()?, api.out()).await,
        ClientCommand::Status { api } => ops::resources::status(&api.client()?, api.out()).await,
        ClientCommand::Override {
            instance,
            node,
            approve,
            action,
            justification,
            api,
        } => {
            let client = api.client()?;
            let target = match (instance, node, approve) {
                (_, _, Some(seq)) => ops::OverrideTarget::Approve(seq),
                (_, Some(node), None) => ops::OverrideTarget::Node(node),
                (Some(id), None, None) => ops::OverrideTarget::Instance(id),
                (None, None, None) => anyhow::bail!("name an instance, --node or --approve"),
            };
            let action = action.as_api();
            ops::override_instance(&client, &target, action, justification.as_deref()).await
        }
        ClientCommand::ProxyStatus { api } => ops::proxy::status(&api.client()?, api.out()).await,
        ClientCommand::ProxyConfig {
            client,
            node,
            agent,
            agent_token_file,
            api,
        } => {
            let agent = match &agent {
                Some(addr) => Some(agent_client(
                    addr,
                    agent_token_file.as_deref(),
                    api.ca_bundle.as_deref(),
                )?),
                None => None,
            };
            let node = node.as_deref();
            ops::proxy::config(&api.client()?, &client, node, agent.as_ref(), api.out()).await
        }
        ClientCommand::Reconciliation { api } => {
            let diff = api.client()?.get_json("/v1/reconciliation").await?;
            api.out().document(&diff)
        }
        ClientCommand::Openapi { api } => {
            let doc = api.client()?.get_json("/v1/openapi.json").await?;
            api.out().document(&doc)
        }
        ClientCommand::Schema { which } => {
            let schema = match which {
                SchemaKind::Contract => serde_json::to_value(waymark_core::schema::contract())?,
                SchemaKind::Policy => {
                    serde_json::to_value(waymark_registry::state::policy_schema())?
                }
                SchemaKind::Openapi => {
                    return Ok(crate::authority::api::document_text().to_owned());
                }
            };
            Ok(format!("{schema:#}\n"))
        }
        ClientCommand::Members {
            agent,
            ca_bundle,
            token_file,
            output,
            json,
        } => {
            let out = if json { Output::Json } else { output };
            let client = agent_client(&agent, token_file.as_deref(), ca_bundle.as_deref())?;
            ops::members(&client, out).await
        }
        ClientCommand::Keyring { command, api } => {
            let (client, out) = (api.client()?, api.out());
            let (op, args) = match command {
                KeyringCommand::List => return super::keyring::list(&client, out).await,
                KeyringCommand::Install(args) => ("install", args),
                KeyringCommand::Use(args) => ("use", args),
                KeyringCommand::Remove(args) => ("remove", args),
            };
            let key = super::keyring::KeySource::of(args.key, args.key_file)?;
            super::keyring::change(&client, op, &key, args.force, out).await
        }
        ClientCommand::Operator { command, api } => {
            // Offline: it reads the stopped member's files and needs no API or credential.
            if let OperatorCommand::Raft {
                command: RaftCommand::Recover(args),
            } = &command
            {
                return super::operator::recover(args).await;
            }
            let client = api.client()?;
            match command {
                OperatorCommand::Raft { command } => match command {
                    RaftCommand::ListPeers => ops::list_peers(&client, api.out()).await,
                    RaftCommand::Join { id, addr, raft } => {
                        ops::join(&client, id, &addr, &raft).await
                    }
                    RaftCommand::Remove { id } => ops::remove(&client, id).await,
                    RaftCommand::TransferLeader { to } => {
                        super::operator::transfer_leader(&client, to).await
                    }
                    RaftCommand::Recover(args) => super::operator::recover(&args).await,
                },
                OperatorCommand::Snapshot { command } => match command {
                    SnapshotCommand::Save { file } => super::operator::save(&client, &file).await,
                    SnapshotCommand::Restore { file } => {
                        super::operator::restore(&client, &file).await
                    }
                },
            }
        }
        ClientCommand::Acl { command, api } => {
            let (client, out) = (api.client()?, api.out());
            match command {
                AclCommand::Whoami => ops::acl::whoami(&client, out).await,
                AclCommand::Bootstrap => ops::acl::bootstrap(&client).await,
                AclCommand::Grants => ops::acl::grants(&client, out).await,
                AclCommand::Grant { to, can } => ops::acl::grant(&client, &to, &can, true).await,
                AclCommand::Revoke { to, can } => ops::acl::grant(&client, &to, &can, false).await,
                AclCommand::Tokens => ops::acl::tokens(&client, out).await,
                AclCommand::TokenCreate {
                    name,
                    ttl,
                    description,
                    grants,
                } => ops::acl::token_create(&client, &name, ttl, &description, &grants).await,
                AclCommand::TokenDelete { name } => ops::acl::token_delete(&client, &name).await,
                AclCommand::GenerateToken { name } => Ok(format!(
                    "{}\n",
                    crate::authority::credentials::generate(&name)?
                )),
            }
        }
        ClientCommand::Federation { command, api } => {
            let (client, out) = (api.client()?, api.out());
            let control = |c: RegionControl, action: &'static str| {
                let client = client.clone();
                async move { ops::region_failover(&client, &c.region, action, &c.reason).await }
            };
            match command {
                FederationCommand::Status => ops::federation_status(&client, out).await,
                FederationCommand::ReconcileLog { since_seq } => {
                    ops::reconcile_log(&client, since_seq, out).await
                }
                FederationCommand::Failovers => ops::region_failovers(&client, out).await,
                FederationCommand::Failover(c) => control(c, "failover").await,
                FederationCommand::ShiftBack(c) => control(c, "shift_back").await,
                FederationCommand::CompleteShiftBack(c) => control(c, "complete_shift_back").await,
            }
        }
    }
}
