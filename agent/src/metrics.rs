//! What both roles' metrics endpoints share: each registry is encoded as OpenMetrics, and
//! served as the Prometheus text format to scrapers that do not ask for OpenMetrics.

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
