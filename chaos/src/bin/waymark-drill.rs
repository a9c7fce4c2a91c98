//! `waymark-drill`: benchmarks of the pure core, and drills against real processes.
//!
//! Every benchmark and drill prints its progress to stderr and, as the last line of stdout,
//! one JSON object: a benchmark's figures, the limit and the ratio; a drill's figures,
//! parameters and verdict (a failed verdict also exits non-zero).

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use waymark_chaos::bench::{self, Shape};
use waymark_chaos::drill::{self, Scale, leader_churn, outage};

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
    /// Run one drill against real processes; the last line printed is its JSON report.
    Run {
        #[command(subcommand)]
        which: Drill,
    },
}

#[derive(Debug, Subcommand)]
enum Drill {
    /// The whole authority killed under steady traffic; the node agent and Envoy restarted
    /// mid-outage; the error rate must not move.
    Outage {
        /// `short` (60 s outage) or `full` (the claim's 60 minutes).
        #[arg(long, value_enum, default_value = "full")]
        scale: Scale,
        /// Override the outage length (`30s`, `10m`, `1h`).
        #[arg(long, value_parser = drill::parse_duration)]
        duration: Option<std::time::Duration>,
        /// Override the steady traffic before and after the outage.
        #[arg(long, value_parser = drill::parse_duration)]
        steady: Option<std::time::Duration>,
        /// Requests per second through Envoy.
        #[arg(long)]
        rate: Option<u32>,
        /// Where the processes keep state and logs (default: a new folder under the
        /// system temp dir).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Break the property on purpose: delete the agent's cache before its restart
        /// (the verdict must then fail).
        #[arg(long)]
        break_cache: bool,
    },
    /// The leader of a three-member authority SIGKILLed again and again under registration
    /// load: nothing acknowledged is lost, versions never go backwards.
    LeaderChurn {
        /// `short` (5 kills in 50 s) or `full` (30 kills over 10 minutes).
        #[arg(long, value_enum, default_value = "full")]
        scale: Scale,
        /// Override the number of kills.
        #[arg(long)]
        kills: Option<usize>,
        /// Override the time between kills (`10s`, `1m`).
        #[arg(long, value_parser = drill::parse_duration)]
        every: Option<std::time::Duration>,
        /// Registration operations per second.
        #[arg(long)]
        rate: Option<u32>,
        /// Seed of the operations' choices.
        #[arg(long)]
        seed: Option<u64>,
        /// Where the members keep state and logs (default: a new folder under the system
        /// temp dir).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Break the property on purpose: each killed member restarts with its data
        /// deleted as a new one-member group (the verdict must then fail).
        #[arg(long)]
        break_wipe_on_restart: bool,
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

/// The rebuild benchmark's sizes: both reference sizes, or the one given.
#[derive(Debug, clap::Args)]
struct RebuildArgs {
    /// Services; with `--instances`, runs only this size [default: 40 and 450].
    #[arg(long)]
    services: Option<usize>,
    /// Instances in total; with `--services`, runs only this size [default: 2,000 and 60,000].
    #[arg(long)]
    instances: Option<usize>,
    /// Zones.
    #[arg(long, default_value_t = 3)]
    zones: usize,
    /// Seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

impl RebuildArgs {
    /// The prototype and the reference estate, or the one size given; a missing count is
    /// the prototype's.
    fn shapes(&self) -> anyhow::Result<Vec<Shape>> {
        let sizes = if self.services.is_none() && self.instances.is_none() {
            vec![Shape::PROTOTYPE, Shape::REFERENCE]
        } else {
            let p = Shape::PROTOTYPE;
            vec![Shape {
                services: self.services.unwrap_or(p.services),
                instances: self.instances.unwrap_or(p.instances),
                ..p
            }]
        };
        sizes
            .into_iter()
            .map(|s| {
                let args = ShapeArgs {
                    services: s.services,
                    instances: s.instances,
                    zones: self.zones,
                    seed: self.seed,
                };
                args.shape()
            })
            .collect()
    }
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// In-process resolution (the resolver library) under concurrent view swaps, against a
    /// bare hash lookup of the same data.
    Resolve {
        /// Reader threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// View swaps per second asked of the writer.
        #[arg(long, default_value_t = 1_000)]
        updates_per_sec: u64,
        /// How long to measure, in seconds.
        #[arg(long, default_value_t = 4)]
        seconds: u64,
    },
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
    /// A new leader decoding the snapshot, rebuilding computed state, releasing, committing
    /// and serving every view; at the prototype and the reference size unless sized.
    Rebuild {
        #[command(flatten)]
        shape: RebuildArgs,
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
    let which = match cli.command {
        Command::Bench { which } => which,
        Command::Run { which } => return run_drill(which),
    };
    let json = match which {
        Bench::Resolve {
            threads,
            updates_per_sec,
            seconds,
        } => {
            anyhow::ensure!(threads > 0 && seconds > 0, "--threads and --seconds must be positive");
            eprintln!("bench resolve: {threads} readers, {updates_per_sec} swaps/s asked, {seconds} s");
            serde_json::to_string(&waymark_resolver::bench::run(
                threads,
                updates_per_sec,
                std::time::Duration::from_secs(seconds),
            ))
        }
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
            let mut sizes = Vec::new();
            for shape in shape.shapes()? {
                eprintln!("bench rebuild: {} services x {} instances x {} zones", shape.services, shape.instances, shape.zones);
                sizes.push(bench::rebuild(shape));
            }
            serde_json::to_string(&bench::RebuildSummary::new(sizes))
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

/// A new run folder under the system temp dir, named after the drill and the time.
fn default_run_dir(drill: &str) -> std::path::PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    std::env::temp_dir()
        .join("waymark-drill")
        .join(format!("{drill}-{stamp}-{}", std::process::id()))
}

fn run_drill(which: Drill) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (json, pass) = match which {
        Drill::Outage {
            scale,
            duration,
            steady,
            rate,
            dir,
            break_cache,
        } => {
            let mut params = outage::Params::for_scale(scale);
            params.break_cache = break_cache;
            if let Some(d) = duration {
                params.outage_s = d.as_secs();
            }
            if let Some(d) = steady {
                params.baseline_s = d.as_secs();
                params.after_s = d.as_secs();
            }
            if let Some(r) = rate {
                anyhow::ensure!(r > 0, "--rate must be positive");
                params.rate = r;
            }
            anyhow::ensure!(
                params.outage_s >= 3 && params.baseline_s >= 1,
                "the outage must last at least 3 s and the steady phases at least 1 s"
            );
            let dir = dir.unwrap_or_else(|| default_run_dir("outage"));
            eprintln!(
                "drill outage: authority down {} s, steady {} s before and after, {}/s, state in {}",
                params.outage_s,
                params.baseline_s,
                params.rate,
                dir.display()
            );
            let report = runtime.block_on(outage::run(params, &dir))?;
            let pass = report.verdict.pass;
            (serde_json::to_string(&report)?, pass)
        }
        Drill::LeaderChurn {
            scale,
            kills,
            every,
            rate,
            seed,
            dir,
            break_wipe_on_restart,
        } => {
            let mut params = leader_churn::Params::for_scale(scale);
            params.break_wipe_on_restart = break_wipe_on_restart;
            if let Some(k) = kills {
                params.kills = k;
            }
            if let Some(d) = every {
                anyhow::ensure!(d.as_secs() >= 2, "--every must be at least 2 s");
                params.kill_every_s = d.as_secs();
            }
            if let Some(r) = rate {
                anyhow::ensure!(r > 0, "--rate must be positive");
                params.registrar.rate = r;
            }
            if let Some(s) = seed {
                params.seed = s;
                params.registrar.seed = s;
            }
            let dir = dir.unwrap_or_else(|| default_run_dir("leader-churn"));
            eprintln!(
                "drill leader-churn: {} members, {} leader kills every {} s, {} writes/s, seed {}, state in {}",
                params.members,
                params.kills,
                params.kill_every_s,
                params.registrar.rate,
                params.seed,
                dir.display()
            );
            let report = runtime.block_on(leader_churn::run(params, &dir))?;
            let pass = report.verdict.pass;
            (serde_json::to_string(&report)?, pass)
        }
    };
    // The child processes are gone by now: every handle was dropped inside `run`.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    println!("{json}");
    anyhow::ensure!(
        pass,
        "the drill's verdict is FAIL (see the report's verdict.failures)"
    );
    Ok(())
}
