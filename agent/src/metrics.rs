//! What both roles' metrics endpoints share: each registry is encoded as OpenMetrics, and
//! served as the Prometheus text format to scrapers that do not ask for OpenMetrics; the
//! build's identity (`waymark_build_info`); and the propagation families both roles'
//! xDS servers fill, one name for both hops (`hop` says which).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The OpenMetrics content type, answered to a scraper that asks for it.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format's content type, answered otherwise.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The exposition to answer a scrape with, by its `Accept` header: OpenMetrics (ending
/// `# EOF`) when it names `application/openmetrics-text`, else the Prometheus text
/// format. Returns the content type and the body.
pub fn negotiate(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (OPENMETRICS, openmetrics)
    } else {
        (PROMETHEUS_TEXT, to_prometheus_text(&openmetrics))
    }
}

/// `version`, and where the build knew them, `revision` (`WAYMARK_REVISION` at build
/// time) and `rustc`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate's version.
    pub version: String,
    /// The source revision, if the build was told it.
    pub revision: Option<String>,
    /// The compiler that built it.
    pub rustc: Option<String>,
}

/// Register `waymark_build_info{version,revision,rustc} 1` (the same on both roles).
pub fn register_build_info(registry: &mut Registry) {
    let info: Family<BuildLabels, Gauge> = Family::default();
    info.get_or_create(&BuildLabels {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        revision: option_env!("WAYMARK_REVISION")
            .filter(|r| !r.is_empty())
            .map(str::to_owned),
        rustc: option_env!("WAYMARK_RUSTC").map(str::to_owned),
    })
    .set(1);
    registry.sub_registry_with_prefix("waymark").register(
        "build_info",
        "Always 1; the labels say which build this process runs",
        info,
    );
}

/// Buckets of the propagation histograms, in seconds: dense around the budgets (a
/// withdrawal's 5 s at p99 and 15 s at p99.9, an admission's 30 s).
pub const PROPAGATION_BUCKETS: [f64; 11] =
    [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0];

/// `hop` and `path` of a propagation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PropagationLabels {
    /// `authority_agent` (release → a node agent's ACK, timed by the authority member
    /// serving it), `agent_sidecar` (the version's arrival at the agent → a sidecar's
    /// ACK, timed by the agent) or `whole` (release → a sidecar's ACK, timed by the agent
    /// from the age the authority carried; see [`HOP_WHOLE`]).
    pub hop: &'static str,
    /// `withdrawal` or `admission`.
    pub path: &'static str,
}

/// `hop`, for families without a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct HopLabels {
    /// As [`PropagationLabels::hop`].
    pub hop: &'static str,
}

/// The hop a member's xDS tier times: release → node agent's ACK.
pub const HOP_AUTHORITY_AGENT: &str = "authority_agent";
/// The hop a node agent's xDS server times: arrival → sidecar's ACK.
pub const HOP_AGENT_SIDECAR: &str = "agent_sidecar";
/// The whole path a node agent times: release at the authority → sidecar's ACK, from the
/// release's age the authority carried with the version (`waymark_xds::release_age`) plus
/// the agent's own time from the response's arrival; only the one-way transit authority →
/// agent is not counted.
pub const HOP_WHOLE: &str = "whole";

/// A histogram with the propagation buckets.
pub fn propagation_histogram() -> Histogram {
    Histogram::new(PROPAGATION_BUCKETS)
}

/// `waymark_xds_propagation_seconds{hop,path}`.
pub type PropagationFamily = Family<PropagationLabels, Histogram, fn() -> Histogram>;
/// `waymark_xds_client_view_age_seconds{hop}`.
pub type ViewAgeFamily = Family<HopLabels, Histogram, fn() -> Histogram>;

/// What an xDS server's clients tell about propagation, the same families on both roles.
#[derive(Debug, Clone)]
pub struct PropagationMetrics {
    /// Release → ACK, per hop and path.
    pub propagation: PropagationFamily,
    /// Each connected client's view age, sampled once a second.
    pub client_view_age: ViewAgeFamily,
}

impl Default for PropagationMetrics {
    fn default() -> Self {
        Self {
            propagation: Family::new_with_constructor(propagation_histogram),
            client_view_age: Family::new_with_constructor(propagation_histogram),
        }
    }
}

impl PropagationMetrics {
    /// Register both under `waymark_xds_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("waymark_xds");
        r.register(
            "propagation_seconds",
            "From a view version's release (authority_agent), its arrival at the node agent (agent_sidecar), or its release at the authority less the one-way transit authority to agent, which authority_agent bounds (whole), to each client's ACK of it, by path",
            self.propagation.clone(),
        );
        r.register(
            "client_view_age_seconds",
            "Each connected client's view age, sampled once a second: how long it has held less than it was sent (0 in sync)",
            self.client_view_age.clone(),
        );
    }

    /// The sink an xDS server reports acknowledged releases to, for `hop`; a release that
    /// carried its age from upstream is also observed on [`HOP_WHOLE`].
    pub fn sink(&self, hop: &'static str) -> waymark_xds::server::PropagationSink {
        let family = self.propagation.clone();
        waymark_xds::server::PropagationSink::new(move |p| {
            let path = p.path.as_str();
            family
                .get_or_create(&PropagationLabels { hop, path })
                .observe(p.took.as_secs_f64());
            if let Some(whole) = p.whole {
                family
                    .get_or_create(&PropagationLabels {
                        hop: HOP_WHOLE,
                        path,
                    })
                    .observe(whole.as_secs_f64());
            }
        })
    }

    /// One sample of the clients' view ages (seconds) on `hop`.
    pub fn observe_view_ages(&self, hop: &'static str, ages: &[std::time::Duration]) {
        let h = self.client_view_age.get_or_create(&HopLabels { hop });
        for age in ages {
            h.observe(age.as_secs_f64());
        }
    }
}

/// The Prometheus text format (0.0.4) from an OpenMetrics exposition, for scrapers and
/// linters that do not negotiate OpenMetrics: counter families are named with their
/// `_total` suffix and the `# EOF` and `# UNIT` lines are dropped.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_with_their_suffix_in_the_text_format() {
        let om = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total 3\n\
                  # HELP b Gauge.\n# TYPE b gauge\nb 1\n# EOF\n";
        let text = to_prometheus_text(om);
        assert_eq!(
            text,
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\n\
             a_requests_total 3\n# HELP b Gauge.\n# TYPE b gauge\nb 1\n"
        );
    }
}
