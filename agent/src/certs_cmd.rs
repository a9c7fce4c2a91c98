//! `waymark certs`: run the estate's small CA from the command line.
//!
//! ```text
//! waymark certs init    --dir D --trust-domain TD --region R [--region R2 …]
//! waymark certs issue   --dir D --identity spiffe://… [--ttl 24h] [--host NAME|IP …] [--out DIR]
//! waymark certs inspect FILE [--outage-window 60m]
//! ```
//!
//! A thin shell over `waymark_certs::layout` and `material`: it reads the clock, parses
//! arguments, prints what was written or found, and leaves every decision to the library.
//! `inspect` warns (on stderr, and with a `warning:` line on stdout) when a certificate
//! expires inside the outage window, because such a certificate would not survive a
//! control-plane outage of that length. The on-disk layout is documented in certs/README.md.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use waymark_certs::ca::HostSan;
use waymark_certs::error::PemPart;
use waymark_certs::layout::PkiDir;
use waymark_certs::lifetime::{
    self, ExpiryStatus, LEAF_TTL_DEFAULT, OPERATOR_TTL_DEFAULT, format_unix_seconds,
};
use waymark_certs::material::{CertInfo, SanEntry, cert_info, parse_certs};
use waymark_certs::{Identity, IdentityKind, Name, TrustDomain};
use waymark_core::duration_str::{self, format as format_duration};

/// Manage the estate's certificates.
#[derive(Debug, clap::Args)]
pub(crate) struct CertsArgs {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum CertsCommand {
    /// Create the estate root and one intermediate per region (existing ones are kept).
    Init {
        /// PKI directory.
        #[arg(long, default_value = "./waymark-pki")]
        dir: PathBuf,
        /// Trust domain of the estate, e.g. mesh.example.org.
        #[arg(long)]
        trust_domain: String,
        /// Region to create an intermediate for; repeat for several.
        #[arg(long = "region", required = true)]
        regions: Vec<String>,
    },
    /// Issue a short-lived leaf certificate for an identity.
    Issue {
        /// PKI directory.
        #[arg(long, default_value = "./waymark-pki")]
        dir: PathBuf,
        /// The identity, e.g. spiffe://mesh.example.org/region/eu/node/n1.
        #[arg(long)]
        identity: String,
        /// Lifetime, e.g. 24h or 1d12h (default: 24h, or 8h for operators).
        #[arg(long, value_parser = duration_str::parse)]
        ttl: Option<Duration>,
        /// Not needed: a regional identity is issued by its own region's intermediate, and
        /// an operator (spiffe://<td>/operator/<name>) by the estate root alone. If given,
        /// it must name the identity's own region; it is refused for operators.
        #[arg(long)]
        region: Option<String>,
        /// Output directory (default: <dir>/issued/<identity path>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// A DNS name or IP address the server answers to, added beside the identity for
        /// clients that check the dialled name (curl, browsers, Prometheus); repeat for
        /// several. waymark's own peers admit by the identity alone.
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
    /// Show identity, serial, fingerprint and validity of each certificate in a PEM file.
    Inspect {
        /// PEM file holding one or more certificates.
        file: PathBuf,
        /// Warn when a certificate expires within this window.
        #[arg(long, default_value = "60m", value_parser = duration_str::parse)]
        outage_window: Duration,
    },
}

/// Runs one `certs` subcommand.
pub(crate) fn run(args: CertsArgs) -> anyhow::Result<()> {
    waymark_certs::install_crypto_provider();
    let now = SystemTime::now();
    match args.command {
        CertsCommand::Init {
            dir,
            trust_domain,
            regions,
        } => init(dir, &trust_domain, &regions, now),
        CertsCommand::Issue {
            dir,
            identity,
            ttl,
            region,
            out,
            hosts,
        } => {
            let hosts: Vec<HostSan> = hosts.iter().map(|h| HostSan::parse(h)).collect();
            issue(dir, &identity, ttl, region.as_deref(), out, &hosts, now)
        }
        CertsCommand::Inspect {
            file,
            outage_window,
        } => inspect(&file, outage_window, now),
    }
}

fn init(
    dir: PathBuf,
    trust_domain: &str,
    regions: &[String],
    now: SystemTime,
) -> anyhow::Result<()> {
    let trust_domain = TrustDomain::new(trust_domain)?;
    let regions = regions
        .iter()
        .map(|r| Name::new(r))
        .collect::<Result<Vec<_>, _>>()?;
    let pki = PkiDir::new(dir);
    let report = pki.init(&trust_domain, &regions, now)?;
    for path in &report.created {
        println!("wrote {}", path.display());
    }
    for path in &report.kept {
        println!("kept  {}", path.display());
    }
    println!("trust bundle: {}", pki.bundle().display());
    Ok(())
}

fn issue(
    dir: PathBuf,
    identity: &str,
    ttl: Option<Duration>,
    region: Option<&str>,
    out: Option<PathBuf>,
    hosts: &[HostSan],
    now: SystemTime,
) -> anyhow::Result<()> {
    let identity: Identity = identity.parse().context("--identity")?;
    let ttl = match ttl {
        Some(ttl) => ttl,
        None if identity.kind() == IdentityKind::Operator => OPERATOR_TTL_DEFAULT,
        None => LEAF_TTL_DEFAULT,
    };
    let region = region.map(Name::new).transpose().context("--region")?;
    // The library ignores `--region` for an identity that names its own; a different one
    // is a mistake the operator should hear about, not a silent no-op.
    if let (Some(asked), Some(own)) = (&region, identity.region()) {
        anyhow::ensure!(
            asked == own,
            "--region {asked}: {identity} is issued by its own region's intermediate ({own})"
        );
    }
    let pki = PkiDir::new(dir);
    let (leaf, paths) =
        pki.issue_with_hosts(&identity, region.as_ref(), ttl, out.as_deref(), now, hosts)?;
    let issuer = match identity.region() {
        Some(own) => format!("region {own} intermediate"),
        None => "estate root".to_owned(),
    };
    println!("identity:    {identity}");
    println!("issued by:   {issuer}");
    if !hosts.is_empty() {
        println!("sans:        {}", sans_text(&leaf.info));
    }
    println!("serial:      {}", leaf.info.serial);
    println!("fingerprint: {}", leaf.info.fingerprint);
    println!(
        "not_after:   {} (ttl {})",
        format_unix_seconds(leaf.info.not_after),
        format_duration(ttl)
    );
    println!("cert:        {}", paths.cert.display());
    println!("chain:       {}", paths.chain.display());
    println!("fullchain:   {}", paths.fullchain.display());
    println!("key:         {} (0600)", paths.key.display());
    Ok(())
}

fn inspect(file: &std::path::Path, window: Duration, now: SystemTime) -> anyhow::Result<()> {
    let pem = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let certs = parse_certs(&pem, PemPart::Certificate)?;
    for (i, der) in certs.iter().enumerate() {
        let info = cert_info(der)?;
        println!("certificate {} of {}", i + 1, certs.len());
        print_info(&info, now, window);
    }
    Ok(())
}

fn print_info(info: &CertInfo, now: SystemTime, window: Duration) {
    let identity = match (info.is_ca, info.identity()) {
        (true, _) => format!("(ca) {}", sans_text(info)),
        (false, Ok(identity)) => identity.to_string(),
        (false, Err(err)) => format!("none: {err}"),
    };
    println!("  identity:    {identity}");
    println!("  subject:     {}", info.subject);
    println!("  serial:      {}", info.serial);
    println!("  fingerprint: {}", info.fingerprint);
    println!("  not_before:  {}", format_unix_seconds(info.not_before));
    println!("  not_after:   {}", format_unix_seconds(info.not_after));
    let status =
        lifetime::expiry_status(now, info.not_before_time(), info.not_after_time(), window);
    let warning = match status {
        ExpiryStatus::Valid { remaining } => {
            println!(
                "  remaining:   {}",
                format_duration(whole_minutes(remaining))
            );
            None
        }
        ExpiryStatus::ExpiresWithinOutage { remaining } => Some(format!(
            "expires in {}, inside the {} outage window",
            format_duration(whole_minutes(remaining)),
            format_duration(window)
        )),
        ExpiryStatus::Expired => Some("certificate has expired".to_owned()),
        ExpiryStatus::NotYetValid => Some("certificate is not valid yet".to_owned()),
    };
    if let Some(warning) = warning {
        println!("  warning: {warning}");
        eprintln!("warning: {} (serial {}): {warning}", identity, info.serial);
    }
}

fn sans_text(info: &CertInfo) -> String {
    let sans: Vec<String> = info
        .sans
        .iter()
        .map(|san| match san {
            SanEntry::Uri(u) => u.clone(),
            SanEntry::Dns(d) => format!("dns:{d}"),
            SanEntry::Ip(ip) => format!("ip:{ip}"),
            SanEntry::Other(o) => o.clone(),
        })
        .collect();
    sans.join(", ")
}

fn whole_minutes(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() / 60 * 60)
}
