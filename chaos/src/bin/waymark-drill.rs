//! `waymark-drill`: benchmarks today; drills against real processes with their issue.
//!
//! Every benchmark prints its progress to stderr and, as the last line of stdout, one JSON
//! object with its figures, the limit it was measured against, and the ratio.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use waymark_chaos::bench::{self, Shape};

#[derive(Debug, Parser)]
#[command(
    name = "waymark-drill",
    version,
    about = "waymark's drills and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one benchmark; the last line printed is its JSON report.
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
}

#[derive(Debug, clap::Args)]
struct ShapeArgs {
    /// Services in the synthetic region.
    #[arg(long, default_value_t = 40)]
    services: usize,
    /// Instances in total.
    #[arg(long, default_value_t = 2_000)]
    instances: usize,
    /// Zones.
    #[arg(long, default_value_t = 3)]
    zones: usize,
    /// Seed for the synthetic stream.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

impl ShapeArgs {
    fn shape(&self) -> anyhow::Result<Shape> {
        anyhow::ensure!(
            self.services > 0 && self.zones > 0,
            "--services and --zones must be positive"
        );
        anyhow::ensure!(
            self.instances >= self.services,
            "--instances must be at least --services"
        );
        Ok(Shape {
            services: self.services,
            instances: self.instances,
            zones: self.zones,
            seed: self.seed,
        })
    }
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Samples through the evaluator on one thread, against a bare EWMA update.
    Evaluator {
        #[command(flatten)]
        shape: ShapeArgs,
        /// Samples to feed.
        #[arg(long, default_value_t = 6_000_000)]
        samples: usize,
        /// Share of instances failing, in permille.
        #[arg(long, default_value_t = 30)]
        failing_permille: u64,
    },
    /// Withdrawals through the real ADS server to N Delta streams, against plain HTTP/2.
    Fanout {
        /// Delta streams to open (one connection each).
        #[arg(long, default_value_t = 2_000)]
        subscriptions: usize,
        /// Withdrawals to publish, one after another.
        #[arg(long, default_value_t = 50)]
        withdrawals: usize,
        /// Endpoints in the view.
        #[arg(long, default_value_t = 50)]
        endpoints: usize,
    },
    /// A new leader rebuilding computed state from desired state and publishing every view.
    Rebuild {
        #[command(flatten)]
        shape: ShapeArgs,
    },
    /// One change, then re-assembly and diff of the affected views, against a plain clone.
    Assemble {
        #[command(flatten)]
        shape: ShapeArgs,
        /// Changes to apply.
        #[arg(long, default_value_t = 20_000)]
        changes: usize,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let Command::Bench { which } = cli.command;
    let json = match which {
        Bench::Evaluator { shape, samples, failing_permille } => {
            let shape = shape.shape()?;
            anyhow::ensure!(samples > 0, "--samples must be positive");
            eprintln!("bench evaluator: {samples} samples over {} instances, seed {}", shape.instances, shape.seed);
            serde_json::to_string(&bench::evaluator(shape, samples, failing_permille))
        }
        Bench::Fanout { subscriptions, withdrawals, endpoints } => {
            anyhow::ensure!(subscriptions > 0 && withdrawals > 0 && endpoints > 1, "counts must be positive");
            eprintln!("bench fanout: {subscriptions} Delta streams, {withdrawals} withdrawals of {endpoints} endpoints");
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            serde_json::to_string(&runtime.block_on(waymark_chaos::fanout::run(subscriptions, withdrawals, endpoints))?)
        }
        Bench::Rebuild { shape } => {
            let shape = shape.shape()?;
            eprintln!("bench rebuild: {} services, {} instances, {} zones", shape.services, shape.instances, shape.zones);
            serde_json::to_string(&bench::rebuild(shape))
        }
        Bench::Assemble { shape, changes } => {
            let shape = shape.shape()?;
            anyhow::ensure!(changes > 0, "--changes must be positive");
            eprintln!(
                "bench assemble: {changes} changes at {} services x {} instances x {} zones, seed {}",
                shape.services, shape.instances, shape.zones, shape.seed
            );
            serde_json::to_string(&bench::assemble(shape, changes))
        }
    }
    .context("encoding the report")?;
    println!("{json}");
    Ok(())
}
