//! `waymark`: one binary, roles chosen by configuration.
//!
//! The node agent (probing, gossip, last-known-good cache, local xDS/DNS/LRS), the authority
//! member (replicated registry, evaluator, xDS tier, policy API) and the operator CLI. The
//! roles live in the `waymark_agent` library; this file is the command surface.
#![forbid(unsafe_code)]

mod certs_cmd;

use clap::Parser;

/// A health-check and service-discovery plane for Envoy/xDS meshes.
#[derive(Debug, Parser)]
#[command(name = "waymark", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Print the platform defaults the evaluator and assembler start from.
    Defaults,
    /// Run the estate's CA: init, issue, inspect.
    Certs(certs_cmd::CertsArgs),
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
    }
}
