//! `waymark`: one binary, roles chosen by configuration.
//!
//! The node agent (probing, gossip, last-known-good cache, local xDS/DNS/LRS), the authority
//! member (replicated registry, evaluator, xDS tier, policy API) and the operator CLI. The
//! roles live in the `waymark_agent` library; this file is the command surface.
#![forbid(unsafe_code)]

mod certs_cmd;

use std::path::PathBuf;
use std::time::SystemTime;

use anyhow::Context as _;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use waymark_agent::api_client::ApiClient;
use waymark_agent::authority::config::ConfigFile;
use waymark_agent::authority::member::Authority;
use waymark_agent::cli::ops;
use waymark_agent::cli::tls::{ClientFiles, api_client_config};
use waymark_agent::node::NodeAgent;
use waymark_agent::node::config::{AgentFile, Overrides};

/// A health-check and service-discovery plane for Envoy/xDS meshes.
#[derive(Debug, Parser)]
#[command(name = "waymark", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the operator commands find an authority member.
#[derive(Debug, clap::Args)]
struct ApiArgs {
    /// Any authority member's API, `https://host:port` (or `host:port` for a plaintext
    /// loopback API); followers redirect to the leader.
    #[arg(
        long,
        env = "WAYMARK_API",
        default_value = "127.0.0.1:8500",
        global = true
    )]
    api: String,
    /// The estate's trust bundle: the API is then spoken over TLS and the server must be
    /// an authority of the bundle's trust domain.
    #[arg(long, env = "WAYMARK_CA_BUNDLE", global = true)]
    ca_bundle: Option<PathBuf>,
    /// A client certificate chain to present (an operator's, from
    /// `waymark certs issue --identity spiffe://<td>/operator/<name>`); needs `--key` and
    /// `--ca-bundle`. The certificate is then the principal, instead of a token.
    #[arg(long, env = "WAYMARK_CLIENT_CERT", global = true, requires = "key")]
    cert: Option<PathBuf>,
    /// The key of `--cert`.
    #[arg(long, env = "WAYMARK_CLIENT_KEY", global = true, requires = "cert")]
    key: Option<PathBuf>,
    /// A bearer token (`wmt.<name>.<secret>`), as `waymark dev` prints it or
    /// `waymark acl token-create` mints it.
    #[arg(long, env = "WAYMARK_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// A file holding the bearer token (read at start; takes the place of `--token`).
    #[arg(long, env = "WAYMARK_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

impl ApiArgs {
    /// A client for the API with the credential given.
    fn client(&self) -> anyhow::Result<ApiClient> {
        let token = match (&self.token, &self.token_file) {
            (_, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading the token file {}", path.display()))?
                    .trim()
                    .to_owned(),
            ),
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
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Print the platform defaults the evaluator and assembler start from.
    Defaults,
    /// Run the estate's CA: init, issue, inspect.
    Certs(certs_cmd::CertsArgs),
    /// Run an authority member.
    Authority {
        /// The configuration file (TOML).
        #[arg(long, env = "WAYMARK_CONFIG")]
        config: PathBuf,
        /// Print the effective configuration (file, then `WAYMARK_AUTHORITY_*` environment)
        /// and exit.
        #[arg(long)]
        print_config: bool,
    },
    /// The node agent: probes, gossip, the last-known-good cache, and local xDS, LRS, DNS
    /// and HTTP for this host's sidecars.
    Agent {
        /// The configuration file (TOML).
        #[arg(long, env = "WAYMARK_AGENT_CONFIG")]
        config: PathBuf,
        /// Print the effective configuration (file, then environment, then flags) and exit.
        #[arg(long)]
        print_config: bool,
        /// Override the node name.
        #[arg(long)]
        name: Option<String>,
        /// Override the zone.
        #[arg(long)]
        zone: Option<String>,
        /// Override the data directory.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Override the upstream authority xDS addresses (repeatable).
        #[arg(long)]
        upstream: Vec<String>,
    },
    /// A whole region in one process: a single-member authority, a node agent and demo
    /// backends, state in a local folder. Prints every listener and what to try.
    Dev(waymark_agent::dev::DevArgs),
    /// The gossip pool as a node agent sees it.
    Members {
        /// The agent's HTTP API.
        #[arg(long, env = "WAYMARK_AGENT_API", default_value = "127.0.0.1:8400")]
        agent: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Operate the authority group.
    Operator {
        #[command(subcommand)]
        command: OperatorCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Services with counts per verdict and guard state.
    Services {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Why an instance is where it is.
    Explain {
        /// The instance id.
        instance: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// The audit log, as JSON lines.
    Audit {
        /// Only this kind (transition, override, denial, policy, existence, alarm,
        /// reconciliation).
        #[arg(long)]
        kind: Option<String>,
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
        /// `maintenance_on` or `maintenance_off`.
        #[arg(long, default_value = "maintenance_on")]
        action: String,
        /// Why (required).
        #[arg(long)]
        justification: Option<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Every xDS client's sync state: versions sent and acknowledged, NACKs.
    ProxyStatus {
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

#[derive(Debug, clap::Subcommand)]
enum AclCommand {
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
enum FederationCommand {
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
struct RegionControl {
    /// The peer region.
    #[arg(long)]
    region: String,
    /// Why (required; kept with the failover and in the audit log).
    #[arg(long)]
    reason: String,
}

#[derive(Debug, clap::Subcommand)]
enum OperatorCommand {
    /// The Raft group.
    Raft {
        #[command(subcommand)]
        command: RaftCommand,
    },
}

#[derive(Debug, clap::Subcommand)]
enum RaftCommand {
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
}

fn main() -> anyhow::Result<()> {
    waymark_certs::install_crypto_provider();
    let cli = Cli::parse();
    match cli.command {
        Command::Defaults => {
            print!("{}", waymark_core::defaults::describe());
            Ok(())
        }
        Command::Certs(args) => certs_cmd::run(args),
        Command::Authority {
            config,
            print_config,
        } => {
            let file = ConfigFile::load(&config, std::env::vars())?;
            if print_config {
                print!("{}", toml::to_string_pretty(&file)?);
                return Ok(());
            }
            init_tracing();
            runtime()?.block_on(run_authority(file))
        }
        Command::Agent {
            config,
            print_config,
            name,
            zone,
            data_dir,
            upstream,
        } => {
            let flags = Overrides {
                name,
                zone,
                data_dir,
                upstream,
            };
            let file = AgentFile::load(&config, std::env::vars(), &flags)?;
            if print_config {
                print!("{}", file.to_toml()?);
                return Ok(());
            }
            init_tracing();
            runtime()?.block_on(run_agent(file))
        }
        Command::Dev(args) => {
            init_tracing();
            runtime()?.block_on(waymark_agent::dev::run(args, shutdown_signal()))
        }
        other => {
            let out = runtime()?.block_on(client_command(other))?;
            print!("{out}");
            Ok(())
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("WAYMARK_LOG_FORMAT").is_ok_and(|f| f == "json");
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn run_authority(file: ConfigFile) -> anyhow::Result<()> {
    // Read before anything starts, so a bad path is an error at once.
    let management = match &file.authority.acl.initial_management_token_file {
        Some(path) => Some(std::fs::read_to_string(path).with_context(|| {
            format!(
                "authority.acl.initial_management_token_file: reading {}",
                path.display()
            )
        })?),
        None => None,
    };
    let member = Authority::start(file.member_config()?).await?;
    let initial = file.initial_members();
    if !initial.is_empty() {
        member.bootstrap(initial).await?;
    }
    if let Some(token) = management {
        tokio::spawn(
            waymark_agent::authority::credentials::ensure_initial_management(
                member.raft().clone(),
                token,
            ),
        );
    }
    println!(
        "authority member {} serving: http {} xds {} ingest {}",
        file.authority.id,
        member.http_addr(),
        member.xds_addr(),
        member
            .ingest_addr()
            .map_or_else(|| "off".to_owned(), |a| a.to_string())
    );
    serve_until_stopped("certificates", async || {
        member.reload().await;
    })
    .await?;
    tracing::info!("stopping");
    member.shutdown().await;
    Ok(())
}

async fn run_agent(file: AgentFile) -> anyhow::Result<()> {
    let agent = NodeAgent::start(file.agent).await?;
    let b = agent.bound();
    println!(
        "node agent serving: xds {} dns {} http {}{}",
        b.xds,
        b.dns,
        b.http,
        b.gossip.map(|g| format!(" gossip {g}")).unwrap_or_default()
    );
    serve_until_stopped("service definitions and certificates", async || {
        if let Err(e) = agent.reload().await {
            tracing::error!(error = %format!("{e:#}"), "reload refused; nothing changed");
        }
    })
    .await?;
    tracing::info!("stopping: deregistering, leaving gossip, closing listeners");
    agent.shutdown().await;
    Ok(())
}

/// Runs `reload` on every SIGHUP (naming `what` it reloads) until SIGINT or SIGTERM.
async fn serve_until_stopped(what: &str, mut reload: impl AsyncFnMut()) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("installing the SIGHUP handler")?;
        let stop = shutdown_signal();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return Ok(()),
                _ = hup.recv() => {
                    tracing::info!("SIGHUP: reloading {what}");
                    reload().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (what, &mut reload);
        shutdown_signal().await;
        Ok(())
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

async fn client_command(command: Command) -> anyhow::Result<String> {
    match command {
        Command::Operator { command, api } => {
            let client = api.client()?;
            match command {
                OperatorCommand::Raft { command } => match command {
                    RaftCommand::ListPeers => ops::list_peers(&client, api.json).await,
                    RaftCommand::Join { id, addr, raft } => {
                        ops::join(&client, id, &addr, &raft).await
                    }
                    RaftCommand::Remove { id } => ops::remove(&client, id).await,
                },
            }
        }
        Command::Members { agent, json } => ops::members(&ApiClient::new(&agent, None), json).await,
        Command::Services { api } => ops::services(&api.client()?, api.json).await,
        Command::Explain { instance, api } => {
            ops::explain(&api.client()?, &instance, api.json).await
        }
        Command::Audit {
            kind,
            service,
            instance,
            since_seq,
            limit,
            api,
        } => {
            let query = [
                ("kind", kind),
                ("service", service),
                ("instance", instance),
                ("since_seq", since_seq.map(|s| s.to_string())),
                ("limit", limit.map(|l| l.to_string())),
            ];
            ops::audit(&api.client()?, &query).await
        }
        Command::Override {
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
            ops::override_instance(&client, &target, &action, justification.as_deref()).await
        }
        Command::ProxyStatus { api } => ops::proxy_status(&api.client()?, api.json).await,
        Command::Acl { command, api } => {
            let client = api.client()?;
            match command {
                AclCommand::Whoami => ops::acl::whoami(&client, api.json).await,
                AclCommand::Bootstrap => ops::acl::bootstrap(&client).await,
                AclCommand::Grants => ops::acl::grants(&client, api.json).await,
                AclCommand::Grant { to, can } => ops::acl::grant(&client, &to, &can, true).await,
                AclCommand::Revoke { to, can } => ops::acl::grant(&client, &to, &can, false).await,
                AclCommand::Tokens => ops::acl::tokens(&client, api.json).await,
                AclCommand::TokenCreate {
                    name,
                    ttl,
                    description,
                    grants,
                } => ops::acl::token_create(&client, &name, ttl, &description, &grants).await,
                AclCommand::TokenDelete { name } => ops::acl::token_delete(&client, &name).await,
                AclCommand::GenerateToken { name } => Ok(format!(
                    "{}\n",
                    waymark_agent::authority::credentials::generate(&name)?
                )),
            }
        }
        Command::Federation { command, api } => {
            let client = api.client()?;
            let control = |c: RegionControl, action: &'static str| {
                let client = client.clone();
                async move { ops::region_failover(&client, &c.region, action, &c.reason).await }
            };
            match command {
                FederationCommand::Status => ops::federation_status(&client, api.json).await,
                FederationCommand::ReconcileLog { since_seq } => {
                    ops::reconcile_log(&client, since_seq, api.json).await
                }
                FederationCommand::Failovers => ops::region_failovers(&client, api.json).await,
                FederationCommand::Failover(c) => control(c, "failover").await,
                FederationCommand::ShiftBack(c) => control(c, "shift_back").await,
                FederationCommand::CompleteShiftBack(c) => control(c, "complete_shift_back").await,
            }
        }
        Command::Defaults
        | Command::Certs(_)
        | Command::Authority { .. }
        | Command::Dev(_)
        | Command::Agent { .. } => {
            anyhow::bail!("not a client command")
        }
    }
}
