//! `waymark`: one binary, roles chosen by configuration.
//!
//! The node agent (probing, gossip, last-known-good cache, local xDS/DNS/LRS), the authority
//! member (replicated registry, evaluator, xDS tier, policy API) and the operator CLI. The
//! roles live in the `waymark_agent` library; this file is the command surface.
#![forbid(unsafe_code)]

mod certs_cmd;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser};
use waymark_agent::authority::config::ConfigFile;
use waymark_agent::authority::member::Authority;
use waymark_agent::cli::commands::{self, ClientCommand};
use waymark_agent::node::NodeAgent;
use waymark_agent::node::config::{AgentFile, Overrides};

/// A health-check and service-discovery plane for Envoy/xDS meshes.
#[derive(Debug, Parser)]
#[command(name = "waymark", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: waymark_agent::logging::LogArgs,
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
    /// Shell completions for bash, zsh, fish, elvish or PowerShell, on standard output
    /// (e.g. `waymark completions bash > /etc/bash_completion.d/waymark`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Man pages for `waymark` and every subcommand, written into a directory.
    Man {
        /// Where to write `waymark.1`, `waymark-services.1`, ….
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    #[command(flatten)]
    Client(ClientCommand),
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
            waymark_agent::logging::init(&cli.log, Some(&file.log))?;
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
            waymark_agent::logging::init(&cli.log, Some(&file.log))?;
            runtime()?.block_on(run_agent(file))
        }
        Command::Dev(args) => {
            waymark_agent::logging::init(&cli.log, None)?;
            runtime()?.block_on(waymark_agent::dev::run(args, shutdown_signal()))
        }
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "waymark", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
            Ok(())
        }
        Command::Client(command) => {
            let out = runtime()?.block_on(commands::run(command))?;
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
    let otel = waymark_agent::otel::OtelSettings::from_env(std::env::vars())?;
    let member = Authority::start_traced(file.member_config()?, otel.as_ref()).await?;
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
    serve_until_stopped("certificates", async || {
        member.reload().await;
    })
    .await?;
    tracing::info!("stopping");
    member.shutdown().await;
    Ok(())
}

async fn run_agent(file: AgentFile) -> anyhow::Result<()> {
    let otel = waymark_agent::otel::OtelSettings::from_env(std::env::vars())?;
    let agent = NodeAgent::start_traced(file.agent, otel.as_ref()).await?;
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
