//! `waymark-drill`: benchmarks of the pure core, and drills against real processes.
//!
//! Every benchmark and drill prints its progress to stderr and, as the last line of stdout,
//! one JSON object: a benchmark's figures, the limit and the ratio; a drill's figures,
//! parameters and verdict (a failed verdict also exits non-zero).

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use waymark_chaos::bench::{self, Shape};
use waymark_chaos::drill::{
    self, Scale, bad_health_check, hard_vs_grey, leader_churn, outage, prober_partition,
    region_partition, xds_restart, zone_evacuation,
};

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
    /// Rebuild a run's `report.html` from its `report.json` (a run folder, or the file).
    Report {
        /// The run folder (or its report.json).
        dir: std::path::PathBuf,
    },
    /// The server side of one `bench fanout` phase, in a process of its own (the bench
    /// starts it and drives it over standard input).
    #[command(hide = true)]
    FanoutServe {
        /// `xds` (waymark's ADS server) or `limit` (pre-encoded frames on plain HTTP/2).
        #[arg(long)]
        kind: waymark_chaos::fanout::ServerKind,
        /// Endpoints in the view.
        #[arg(long)]
        endpoints: usize,
        /// Highest version to publish.
        #[arg(long)]
        versions: usize,
        /// Streams to admit.
        #[arg(long)]
        subscriptions: usize,
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
        #[arg(long, value_parser = waymark_core::duration_str::parse)]
        duration: Option<std::time::Duration>,
        /// Override the steady traffic before and after the outage.
        #[arg(long, value_parser = waymark_core::duration_str::parse)]
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
    /// A zone evacuated during a 40,000-changes-per-minute burst with the prototype's fleet
    /// attached; withdrawals must reach 99% of subscribers within 5 s while admission sheds.
    ZoneEvacuation {
        /// `short` (500 subscribers, 20 s burst) or `full` (2,000 subscribers, 60 s).
        #[arg(long, value_enum, default_value = "full")]
        scale: Scale,
        /// Override the number of xDS subscriptions.
        #[arg(long)]
        subscriptions: Option<usize>,
        /// Override the burst's length (`20s`, `1m`).
        #[arg(long, value_parser = waymark_core::duration_str::parse)]
        duration: Option<std::time::Duration>,
        /// Override the burst's changes per minute.
        #[arg(long)]
        rate: Option<u32>,
        #[arg(long)]
        seed: Option<u64>,
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// How slow a `Publish` commit must be to count as delivery pressure (the
        /// authority's `publish_pressure_after`; `0ms`: every commit does, so the burst is
        /// always under pressure and shedding must be declared).
        #[arg(long, value_parser = waymark_core::duration_str::parse)]
        pressure_after: Option<std::time::Duration>,
        /// How long after the burst withdrawals are given to reach the subscribers before
        /// they are counted (16 s: the 15 s p99.9 budget and a second more).
        #[arg(long, value_parser = waymark_core::duration_str::parse)]
        settle: Option<std::time::Duration>,
        /// Break the property on purpose: admission shedding off (the budget of admission
        /// releases per second unlimited).
        #[arg(long)]
        break_shedding: bool,
    },
    /// The xDS tier restarted with the fleet's subscriptions attached; reconnections at or
    /// under 5% per 10 s and no subscriber's view goes backwards.
    XdsRestart {
        /// `short` (500 subscribers, 60 s watched) or `full` (2,000, until all are back).
        #[arg(long, value_enum, default_value = "full")]
        scale: Scale,
        /// Override the number of xDS subscriptions.
        #[arg(long)]
        subscriptions: Option<usize>,
        /// Override how long the reconnections are watched (`60s`, `5m`).
        #[arg(long, value_parser = waymark_core::duration_str::parse)]
        duration: Option<std::time::Duration>,
        #[arg(long)]
        seed: Option<u64>,
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Break the property on purpose: reconnection admission off (every client let in
        /// at once).
        #[arg(long)]
        break_reconnect_admission: bool,
    },
    /// One replica killed, another made slow but alive (probe green): the time until the
    /// callers stop using each; the grey one must be caught by passive evidence.
    HardVsGrey {
        /// `short` (3 Envoys, 27 synthetic callers) or `full` (5 Envoys, 250).
        #[arg(long, value_enum, default_value = "full")]
        scale: Scale,
        /// Where the processes keep state and logs.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Chooses which replicas fail.
        #[arg(long)]
        seed: Option<u64>,
        /// Break the property on purpose: Envoys without load reporting, so no passive
        /// evidence reaches the evaluator (the verdict must then fail).
        #[arg(long)]
        break_load_reports: bool,
        /// Too little traffic for callers' outcomes to count: the grey replica must stay
        /// routed on its green probe and be reported single-class.
        #[arg(long)]
        low_traffic: bool,
    },
    /// A contract whose probe fails every replica pushed under traffic: the service must
    /// degrade with `health_disregarded` declared and the alarm raised, never drain.
    BadHealthCheck {
        /// `short` (25 s under the bad contract) or `full` (5 minutes, 50 subscribers).
        #[arg(long, value_enum, default_value = "full")]
        scale: Scale,
        /// Override how long the bad contract stays in force (`30s`, `10m`).
        #[arg(long, value_parser = waymark_core::duration_str::parse)]
        duration: Option<std::time::Duration>,
        /// Where the processes keep state and logs.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Break the property on purpose: the authority runs without its fraction guard
        /// (`WAYMARK_UNSAFE_DISABLE_FRACTION_GUARD=1`); the verdict must then fail.
        #[arg(long)]
        break_fraction_guard: bool,
    },
    /// The probers of one zone cut off from the authority (a network namespace), then every
    /// prober: nothing leaves rotation, every instance goes unknown once nobody can probe,
    /// and returns to eligible on heal.
    ProberPartition {
        /// `short` (15 s per phase) or `full` (5 minutes per phase).
        #[arg(long, value_enum, default_value = "full")]
        scale: Scale,
        /// Override how long probers stay cut off, both phases together (`30s`, `10m`).
        #[arg(long, value_parser = waymark_core::duration_str::parse)]
        duration: Option<std::time::Duration>,
        /// Requests per second through Envoy.
        #[arg(long)]
        rate: Option<u32>,
        /// Seeds the gossip key.
        #[arg(long)]
        seed: Option<u64>,
        /// Where the processes keep state and logs (default: a new folder under the
        /// system temp dir).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Break the property on purpose: the service's contract reads silence as failure
        /// (`silence_withdraws`); the verdict must then fail.
        #[arg(long)]
        break_silence: bool,
    },
    /// One region's authority cut off from its two peers (a network namespace) and healed:
    /// local routing unchanged everywhere, the peers keep its endpoints at tier 2 and
    /// report it stale, the reconciliation is logged and the aggregates converge.
    RegionPartition {
        /// `short` (20 s partition) or `full` (10 minutes).
        #[arg(long, value_enum, default_value = "full")]
        scale: Scale,
        /// Override how long the region stays cut off (`30s`, `10m`).
        #[arg(long, value_parser = waymark_core::duration_str::parse)]
        duration: Option<std::time::Duration>,
        /// Requests per second through Envoy.
        #[arg(long)]
        rate: Option<u32>,
        /// Recorded in the report (the drill makes no random choice).
        #[arg(long)]
        seed: Option<u64>,
        /// Where the processes keep state and logs.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Break the property on purpose: peers drop a stale region's endpoints from tier
        /// 2 (`[authority.federation] drop_stale_peers`); the verdict must then fail.
        #[arg(long)]
        break_stale_drop: bool,
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
        #[arg(long, value_parser = waymark_core::duration_str::parse)]
        every: Option<std::time::Duration>,
        /// Registration operations per second.
        #[arg(long)]
        rate: Option<u32>,
        /// Override how long, after the load stops, the members may take to agree and
        /// the subscribers to catch up (default 30 s and 20 s; a run whose verdict is
        /// known to fail, such as a break, need not wait them out).
        #[arg(long, value_parser = waymark_core::duration_str::parse)]
        settle: Option<std::time::Duration>,
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

/// The sizes of the rebuild and evaluator benchmarks: the prototype's and the reference
/// estate's, or the one given.
#[derive(Debug, clap::Args)]
struct SizesArgs {
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

impl SizesArgs {
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
    /// Samples through the evaluator on one thread, at the prototype's and the reference
    /// size, against the same samples through a plain map keyed by instance id.
    Evaluator {
        #[command(flatten)]
        shape: SizesArgs,
        /// Samples to feed per repeat.
        #[arg(long, default_value_t = 6_000_000)]
        samples: usize,
        /// Share of instances failing, in permille.
        #[arg(long, default_value_t = 30)]
        failing_permille: u64,
        /// Repeats per size; figures are the median and spread.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
    },
    /// Withdrawals through the real ADS server to N Delta streams, against plain HTTP/2.
    Fanout {
        /// Delta streams to open.
        #[arg(long, default_value_t = 2_000)]
        subscriptions: usize,
        /// Streams multiplexed over each HTTP/2 connection (the server admits at most 64).
        #[arg(long, default_value_t = 50)]
        streams_per_connection: usize,
        /// Withdrawals to publish, one after another.
        #[arg(long, default_value_t = 50)]
        withdrawals: usize,
        /// Endpoints in the view.
        #[arg(long, default_value_t = 50)]
        endpoints: usize,
        /// Runs of both phases; the report gives medians and each run.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
    },
    /// A new leader decoding the snapshot, rebuilding computed state, releasing, committing
    /// and serving every view; at the prototype and the reference size unless sized.
    Rebuild {
        #[command(flatten)]
        shape: SizesArgs,
    },
    /// The real recovery time of a three-member authority holding the estate: its leader
    /// SIGKILLed, until a new leader publishes and every Delta xDS subscriber is current
    /// again; each figure's median and spread over the repeats.
    Failover {
        /// Services the estate spreads over (the first is the probe service).
        #[arg(long, default_value_t = 450)]
        services: usize,
        /// Instances loaded before the first kill.
        #[arg(long, default_value_t = 60_000)]
        estate: usize,
        /// Delta xDS subscribers, spread over the members, each configured with all three.
        #[arg(long, default_value_t = 2_000)]
        subscriptions: usize,
        /// Services each subscriber follows (the probe service among them).
        #[arg(long, default_value_t = 3)]
        services_per_subscriber: usize,
        /// Leaders killed, one after another.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// The members' reconnection guard in thousandths of the population per window
        /// [default: the authority's, 50]; 1000 admits every reconnecting subscriber at once.
        #[arg(long)]
        reconnect_permille: Option<u32>,
        /// Subscribers hold no standby stream at a second member (node agents do by
        /// default): shows what a dead member's subscribers wait for without one.
        #[arg(long)]
        no_standby: bool,
        /// Where the members keep their files [default: a new temporary folder].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Acknowledged registry writes per second through the authority's API at each client
    /// count, beside a single-member etcd (Debian's `etcd-server`, installed if missing)
    /// driven by the same client on the same work.
    Writes {
        /// Concurrent clients, one phase each (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "16,64")]
        clients: Vec<usize>,
        /// Seconds each phase measures.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Times each phase runs on each store.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Services the estate spreads over.
        #[arg(long, default_value_t = 450)]
        services: usize,
        /// Instances loaded before measuring.
        #[arg(long, default_value_t = 60_000)]
        estate: usize,
        /// Instances each client holds before deregistering its oldest.
        #[arg(long, default_value_t = 16)]
        hold: usize,
        /// Where the stores keep their files [default: a new temporary folder].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Evidence samples admitted per second by a real authority leader from many node-agent
    /// sessions over mutual TLS, against the evaluator alone fed the same samples.
    Ingest {
        /// Services the estate spreads over.
        #[arg(long, default_value_t = 450)]
        services: usize,
        /// Instances registered.
        #[arg(long, default_value_t = 60_000)]
        estate: usize,
        /// Node-agent sessions streaming evidence.
        #[arg(long, default_value_t = 64)]
        sessions: usize,
        /// Samples per message (the node agent batches 512).
        #[arg(long, default_value_t = 512)]
        batch: usize,
        /// Messages each session keeps unacknowledged.
        #[arg(long, default_value_t = 4)]
        window: usize,
        /// Milliseconds a session holds off after samples were refused as `overloaded`
        /// (0: it sends on at once).
        #[arg(long, default_value_t = 0)]
        backoff_ms: u64,
        /// Samples per second offered by all sessions together, evenly paced (0: as fast
        /// as the window lets them).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Seconds each measured window lasts.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Seconds streamed before each window is measured.
        #[arg(long, default_value_t = 2)]
        warmup: u64,
        /// Seconds of samples the evaluator replays per phase (one round at least).
        #[arg(long, default_value_t = 3)]
        limit_seconds: u64,
        /// Times each phase runs.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Share of instances failing, in permille.
        #[arg(long, default_value_t = 30)]
        failing_permille: u64,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Where the authority keeps its files [default: a new temporary folder].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
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
        Command::Report { dir } => return rebuild_report(&dir),
        Command::FanoutServe {
            kind,
            endpoints,
            versions,
            subscriptions,
        } => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            return runtime.block_on(waymark_chaos::fanout::serve(
                kind,
                endpoints,
                versions,
                subscriptions,
            ));
        }
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
        Bench::Evaluator { shape, samples, failing_permille, repeats } => {
            let shapes = shape.shapes()?;
            anyhow::ensure!(samples > 0 && repeats > 0, "--samples and --repeats must be positive");
            for s in &shapes {
                eprintln!("bench evaluator: {samples} samples over {} instances × {repeats}, seed {}", s.instances, s.seed);
            }
            serde_json::to_string(&bench::evaluator(&shapes, samples, failing_permille, repeats))
        }
        Bench::Fanout { subscriptions, streams_per_connection, withdrawals, endpoints, repeats } => {
            let params = waymark_chaos::fanout::Params {
                subscriptions,
                streams_per_connection,
                withdrawals,
                endpoints,
                repeats,
            };
            eprintln!(
                "bench fanout: {subscriptions} Delta streams over {} connections, {withdrawals} withdrawals of {endpoints} endpoints, {repeats} runs",
                params.connections()
            );
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let drill = std::env::current_exe()?;
            serde_json::to_string(&runtime.block_on(waymark_chaos::fanout::run(params, &drill))?)
        }
        Bench::Rebuild { shape } => {
            let mut sizes = Vec::new();
            for shape in shape.shapes()? {
                eprintln!("bench rebuild: {} services x {} instances x {} zones", shape.services, shape.instances, shape.zones);
                sizes.push(bench::rebuild(shape));
            }
            serde_json::to_string(&bench::RebuildSummary::new(sizes))
        }
        Bench::Failover { services, estate, subscriptions, services_per_subscriber, repeats, seed, reconnect_permille, no_standby, dir } => {
            let params = waymark_chaos::failover::Params {
                services,
                estate,
                subscriptions,
                services_per_subscriber,
                repeats,
                seed,
                reconnect_permille,
                standby: !no_standby,
            };
            let dir = match dir {
                Some(d) => d,
                None => std::env::temp_dir().join(format!("waymark-bench-failover-{}", std::process::id())),
            };
            eprintln!("bench failover: {params:?}");
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            serde_json::to_string(&runtime.block_on(waymark_chaos::failover::run(params, &dir))?)
        }
        Bench::Writes { clients, seconds, repeats, services, estate, hold, dir } => {
            let params = waymark_chaos::writes::Params {
                clients,
                phase_s: seconds,
                repeats,
                services,
                estate,
                hold,
            };
            let dir = match dir {
                Some(d) => d,
                None => std::env::temp_dir().join(format!("waymark-bench-writes-{}", std::process::id())),
            };
            eprintln!("bench writes: {params:?}");
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            serde_json::to_string(&runtime.block_on(waymark_chaos::writes::run(params, &dir))?)
        }
        Bench::Ingest {
            services,
            estate,
            sessions,
            batch,
            window,
            backoff_ms,
            rate,
            seconds,
            warmup,
            limit_seconds,
            repeats,
            failing_permille,
            seed,
            dir,
        } => {
            let params = waymark_chaos::ingest::Params {
                services,
                estate,
                sessions,
                batch,
                window,
                backoff_ms,
                rate,
                warmup_s: warmup,
                phase_s: seconds,
                limit_s: limit_seconds,
                repeats,
                failing_permille,
                seed,
            };
            let dir = match dir {
                Some(d) => d,
                None => std::env::temp_dir().join(format!("waymark-bench-ingest-{}", std::process::id())),
            };
            eprintln!("bench ingest: {params:?}");
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            serde_json::to_string(&runtime.block_on(waymark_chaos::ingest::run(params, &dir))?)
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

/// `waymark-drill report DIR`: the page again, from the JSON alone.
fn rebuild_report(dir: &std::path::Path) -> anyhow::Result<()> {
    let json = if dir.is_dir() {
        dir.join("report.json")
    } else {
        dir.to_path_buf()
    };
    let text =
        std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
    let report: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a drill report", json.display()))?;
    anyhow::ensure!(
        report["drill"].is_string() && report["verdict"].is_object(),
        "{} is not a drill report (no drill name or verdict)",
        json.display()
    );
    let page = json.with_file_name("report.html");
    std::fs::write(&page, drill::html::render(&report))
        .with_context(|| format!("writing {}", page.display()))?;
    println!("{}", page.display());
    Ok(())
}

/// Runs a drill to its report: the JSON line to print and whether its verdict passed.
fn execute<R: serde::Serialize>(
    runtime: &tokio::runtime::Runtime,
    run: impl std::future::Future<Output = anyhow::Result<R>>,
) -> anyhow::Result<(String, bool)> {
    let report = serde_json::to_value(runtime.block_on(run)?).context("encoding the report")?;
    let pass = report["verdict"]["pass"] == true;
    Ok((report.to_string(), pass))
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
            execute(&runtime, outage::run(params, &dir))?
        }
        Drill::ZoneEvacuation {
            scale,
            subscriptions,
            duration,
            rate,
            seed,
            dir,
            pressure_after,
            settle,
            break_shedding,
        } => {
            let mut params = zone_evacuation::Params::for_scale(scale);
            params.break_shedding = break_shedding;
            if let Some(d) = settle {
                params.settle_s = d.as_secs();
            }
            if let Some(d) = pressure_after {
                params.limits.publish_pressure_after_ms = Some(u64::try_from(d.as_millis())?);
            }
            if let Some(n) = subscriptions {
                anyhow::ensure!(n > 0, "--subscriptions must be positive");
                params.shape.subscriptions = n;
                params.limits.reconnect_floor = Some(u32::try_from(n)?);
            }
            if let Some(d) = duration {
                anyhow::ensure!(d.as_secs() >= 5, "the burst must last at least 5 s");
                params.burst_s = d.as_secs();
            }
            if let Some(r) = rate {
                anyhow::ensure!(r > 0, "--rate must be positive");
                params.changes_per_min = r;
            }
            if let Some(s) = seed {
                params.seed = s;
            }
            let dir = dir.unwrap_or_else(|| default_run_dir("zone-evacuation"));
            eprintln!(
                "drill zone-evacuation: {} subscribers, {} changes/min for {} s, state in {}",
                params.shape.subscriptions,
                params.changes_per_min,
                params.burst_s,
                dir.display()
            );
            execute(&runtime, zone_evacuation::run(params, &dir))?
        }
        Drill::XdsRestart {
            scale,
            subscriptions,
            duration,
            seed,
            dir,
            break_reconnect_admission,
        } => {
            let mut params = xds_restart::Params::for_scale(scale);
            params.break_reconnect_admission = break_reconnect_admission;
            if let Some(n) = subscriptions {
                anyhow::ensure!(n > 0, "--subscriptions must be positive");
                params.subscriptions = n;
            }
            if let Some(d) = duration {
                params.watch_s = d.as_secs();
            }
            if let Some(s) = seed {
                params.seed = s;
            }
            let dir = dir.unwrap_or_else(|| default_run_dir("xds-restart"));
            eprintln!(
                "drill xds-restart: {} subscribers, state in {}",
                params.subscriptions,
                dir.display()
            );
            execute(&runtime, xds_restart::run(params, &dir))?
        }
        Drill::HardVsGrey {
            scale,
            dir,
            seed,
            break_load_reports,
            low_traffic,
        } => {
            let mut params = hard_vs_grey::Params::for_scale(scale);
            params.break_load_reports = break_load_reports;
            params.low_traffic = low_traffic;
            if let Some(s) = seed {
                params.seed = s;
            }
            let dir = dir.unwrap_or_else(|| default_run_dir("hard-vs-grey"));
            eprintln!(
                "drill hard-vs-grey: {} Envoys, {} synthetic callers, {} backends, state in {}",
                params.envoys,
                params.envoys * params.subscribers_per_agent,
                params.backends,
                dir.display()
            );
            execute(&runtime, hard_vs_grey::run(params, &dir))?
        }
        Drill::BadHealthCheck {
            scale,
            duration,
            dir,
            break_fraction_guard,
        } => {
            let mut params = bad_health_check::Params::for_scale(scale);
            params.break_fraction_guard = break_fraction_guard;
            if let Some(d) = duration {
                anyhow::ensure!(d.as_secs() >= 5, "--duration must be at least 5 s");
                params.observe_s = d.as_secs();
            }
            let dir = dir.unwrap_or_else(|| default_run_dir("bad-health-check"));
            eprintln!(
                "drill bad-health-check: {} backends, bad contract for {} s, state in {}",
                params.backends,
                params.observe_s,
                dir.display()
            );
            execute(&runtime, bad_health_check::run(params, &dir))?
        }
        Drill::ProberPartition {
            scale,
            duration,
            rate,
            seed,
            dir,
            break_silence,
        } => {
            let mut params = prober_partition::Params::for_scale(scale);
            params.break_silence = break_silence;
            if let Some(d) = duration {
                // Each phase (one zone cut, every prober cut) lasts half of it.
                params.zone_cut_s = d.as_secs() / 2;
                params.all_cut_s = d.as_secs() - d.as_secs() / 2;
            }
            if let Some(r) = rate {
                anyhow::ensure!(r > 0, "--rate must be positive");
                params.rate = r;
            }
            if let Some(s) = seed {
                params.seed = s;
            }
            anyhow::ensure!(
                params.zone_cut_s >= 5 && params.all_cut_s >= 5,
                "each partition phase must last at least 5 s"
            );
            let dir = dir.unwrap_or_else(|| default_run_dir("prober-partition"));
            eprintln!(
                "drill prober-partition: one zone's probers cut off {} s, then every prober {} s, {}/s, state in {}",
                params.zone_cut_s,
                params.all_cut_s,
                params.rate,
                dir.display()
            );
            execute(&runtime, prober_partition::run(params, &dir))?
        }
        Drill::RegionPartition {
            scale,
            duration,
            rate,
            seed,
            dir,
            break_stale_drop,
        } => {
            let mut params = region_partition::Params::for_scale(scale);
            params.break_stale_drop = break_stale_drop;
            if let Some(d) = duration {
                params.partition_s = d.as_secs();
            }
            if let Some(r) = rate {
                anyhow::ensure!(r > 0, "--rate must be positive");
                params.rate = r;
            }
            if let Some(s) = seed {
                params.seed = s;
            }
            anyhow::ensure!(
                params.partition_s >= 5,
                "the partition must last at least 5 s"
            );
            let dir = dir.unwrap_or_else(|| default_run_dir("region-partition"));
            eprintln!(
                "drill region-partition: one region cut off {} s, {}/s, state in {}",
                params.partition_s,
                params.rate,
                dir.display()
            );
            execute(&runtime, region_partition::run(params, &dir))?
        }
        Drill::LeaderChurn {
            scale,
            kills,
            every,
            rate,
            settle,
            seed,
            dir,
            break_wipe_on_restart,
        } => {
            let mut params = leader_churn::Params::for_scale(scale);
            if let Some(d) = settle {
                let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                params.budget.converge_ms = ms;
                params.budget.catch_up_ms = ms;
            }
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
            execute(&runtime, leader_churn::run(params, &dir))?
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
