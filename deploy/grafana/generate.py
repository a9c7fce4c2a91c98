#!/usr/bin/env python3
"""Writes waymark's Grafana dashboards (deploy/grafana/dashboards/*.json) from the panels below.

The JSON files are checked in so they can be imported or provisioned as they are; a test
(agent/tests/deploy_monitoring.rs) fails when they differ from what this script writes, checks
them against dashboard.schema.json, and runs every query against a real Prometheus scraping a
dev region. Run it after changing a panel:

    python3 deploy/grafana/generate.py

Every dashboard takes its Prometheus from the `datasource` variable and filters by `region`
(the label deploy/prometheus/prometheus.yml puts on each target).
"""

import json
import pathlib
import sys

OUT = pathlib.Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
R = 'region=~"$region"'


def variables(*extra):
    return {
        "list": [
            {
                "name": "datasource",
                "label": "Prometheus",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
            },
            {
                "name": "region",
                "label": "Region",
                "type": "query",
                "datasource": DS,
                "query": {"query": "label_values(waymark_leader, region)", "refId": "region"},
                "definition": "label_values(waymark_leader, region)",
                "includeAll": True,
                "allValue": ".*",
                "multi": True,
                "refresh": 2,
                "current": {},
                "hide": 0,
            },
            *extra,
        ]
    }


def service_variable():
    return {
        "name": "service",
        "label": "Service",
        "type": "query",
        "datasource": DS,
        "query": {"query": f"label_values(waymark_instances{{{R}}}, service)", "refId": "service"},
        "definition": f"label_values(waymark_instances{{{R}}}, service)",
        "includeAll": False,
        "multi": False,
        "refresh": 2,
        "current": {},
        "hide": 0,
    }


class Layout:
    """Places panels left to right in rows of 24 columns, and numbers them."""

    def __init__(self):
        self.x = 0
        self.y = 0
        self.row_height = 0
        self.next_id = 1
        self.panels = []

    def add(self, panel, w, h):
        if self.x + w > 24:
            self.x = 0
            self.y += self.row_height
            self.row_height = 0
        panel["id"] = self.next_id
        panel["gridPos"] = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.next_id += 1
        self.x += w
        self.row_height = max(self.row_height, h)
        self.panels.append(panel)

    def row(self, title):
        if self.x:
            self.x = 0
            self.y += self.row_height
            self.row_height = 0
        self.panels.append(
            {
                "id": self.next_id,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        self.next_id += 1
        self.y += 1


def targets(queries):
    return [
        {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
        for i, (expr, legend) in enumerate(queries)
    ]


def stat(title, description, expr, unit="none", thresholds=None):
    steps = thresholds or [{"color": "green", "value": None}]
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets([(expr, "")]),
        "fieldConfig": {
            "defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}},
            "overrides": [],
        },
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
    }


def series(title, description, queries, unit="none", stack=False):
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets(queries),
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {"stacking": {"mode": "normal" if stack else "none"}},
            },
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "table", "placement": "right"}},
    }


def red_above(value):
    return [{"color": "green", "value": None}, {"color": "red", "value": value}]


def red_below(value):
    return [{"color": "red", "value": None}, {"color": "green", "value": value}]


def dashboard(uid, title, description, layout, templating):
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["waymark"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": templating,
        "annotations": {"list": []},
        "links": [
            {"type": "dashboards", "tags": ["waymark"], "title": "waymark", "asDropdown": True}
        ],
        "panels": layout.panels,
    }


def region_overview():
    l = Layout()
    l.row("Can the control plane change routing?")
    l.add(stat("Agents connected upstream", "Node agents holding an upstream xDS stream, out of all scraped. 0 everywhere: the authority is unreachable; sidecars route from last-known-good views.",
               f"sum(waymark_agent_upstream_connected{{{R}}}) / count(waymark_agent_upstream_connected{{{R}}})", "percentunit", red_below(0.99)), 6, 4)
    l.add(stat("Youngest last-known-good view", "Age of the youngest view any agent holds unconfirmed. Routing is built to survive 60 minutes of this.",
               f"min(waymark_agent_lkg_age_seconds{{{R}}})", "s", red_above(900)), 6, 4)
    l.add(stat("Raft leader", "Members saying they lead (1 is healthy).",
               f"sum(waymark_leader{{{R}}})", "none", red_below(1)), 6, 4)
    l.add(stat("Withdrawals over budget (1h)", "Releases not acknowledged by every subscriber within 5 s.",
               f"sum(increase(waymark_alarm_withdrawal_over_budget_total{{{R}}}[1h]))", "none", red_above(1)), 6, 4)
    l.row("What the region routes")
    l.add(series("Instances by verdict", "Every known instance by the evaluator's verdict.",
                 [(f"sum by (verdict) (waymark_instances{{{R}}})", "{{verdict}}")], stack=True), 12, 8)
    l.add(series("Zones with health disregarded", "Fraction guard engaged: the zone's full set is published and health is declared disregarded.",
                 [(f"max by (service, zone) (waymark_alarm_fraction_guard_engaged{{{R}}}) == 1", "{{service}} {{zone}}")]), 12, 8)
    l.add(series("Services without an eligible instance", "The last eligible instance in the region was withdrawn.",
                 [(f"max by (service) (waymark_alarm_last_eligible_withdrawn{{{R}}}) == 1", "{{service}}")]), 12, 8)
    l.add(series("Admission shedding", "1 while the leader sheds admissions to keep withdrawals inside their budget; episodes per hour.",
                 [(f"max(waymark_shedding{{{R}}})", "shedding"),
                  (f"sum(increase(waymark_shed_episodes_total{{{R}}}[1h]))", "episodes (1h)")]), 12, 8)
    l.row("Propagation (claim 2: withdrawals 99% in 5 s, admissions in 30 s)")
    l.add(series("Withdrawal propagation p99 by hop", "From a release to each node agent's ACK (authority_agent, timed by the member serving it), from the version's arrival at an agent to each sidecar's ACK (agent_sidecar), and the whole path from the release to each sidecar's ACK (whole). The budget is 5 s end to end.",
                 [(f"histogram_quantile(0.99, sum by (hop, le) (rate(waymark_xds_propagation_seconds_bucket{{{R}, path=\"withdrawal\"}}[5m])))", "p99 {{hop}}"),
                  (f"histogram_quantile(0.5, sum by (hop, le) (rate(waymark_xds_propagation_seconds_bucket{{{R}, path=\"withdrawal\"}}[5m])))", "p50 {{hop}}")], "s"), 8, 8)
    l.add(series("Admission propagation p99 by hop", "As for withdrawals; admissions are batched and shed under load, within 30 s.",
                 [(f"histogram_quantile(0.99, sum by (hop, le) (rate(waymark_xds_propagation_seconds_bucket{{{R}, path=\"admission\"}}[5m])))", "p99 {{hop}}")], "s"), 8, 8)
    l.add(series("Client view age p99", "Each connected client's view age, sampled once a second: how long it has acknowledged less than it was sent.",
                 [(f"histogram_quantile(0.99, sum by (hop, le) (rate(waymark_xds_client_view_age_seconds_bucket{{{R}}}[5m])))", "p99 {{hop}}")], "s"), 8, 8)
    l.add(series("Whole path, release to sidecar ACK", "Timed by each node agent from the release's age the member carried with the version plus its own time to each sidecar's ACK (hop whole); only the one-way transit member to agent is left out, and authority_agent bounds it. The budgets: withdrawals 5 s at p99, admissions 30 s.",
                 [(f"histogram_quantile(0.99, sum by (path, le) (rate(waymark_xds_propagation_seconds_bucket{{{R}, hop=\"whole\"}}[5m])))", "p99 {{path}}"),
                  (f"histogram_quantile(0.999, sum by (path, le) (rate(waymark_xds_propagation_seconds_bucket{{{R}, hop=\"whole\", path=\"withdrawal\"}}[5m])))", "p99.9 withdrawal"),
                  (f"histogram_quantile(0.5, sum by (path, le) (rate(waymark_xds_propagation_seconds_bucket{{{R}, hop=\"whole\"}}[5m])))", "p50 {{path}}")], "s"), 12, 8)
    l.add(series("Acknowledged releases", "Releases acknowledged per second, by hop and path.",
                 [(f"sum by (hop, path) (rate(waymark_xds_propagation_seconds_count{{{R}}}[5m]))", "{{hop}} {{path}}")], "ops"), 12, 8)
    l.add(series("NACKs", "Responses clients rejected: node agents at the members, sidecars at the agents, and upstream responses the agents rejected.",
                 [(f"sum(rate(waymark_xds_nacks_total{{{R}}}[5m]))", "at members"),
                  (f"sum(rate(waymark_agent_sidecar_nacks_total{{{R}}}[5m]))", "at agents (sidecars)"),
                  (f"sum(rate(waymark_agent_upstream_nacks_total{{{R}}}[5m]))", "by agents (upstream)")], "ops"), 12, 8)
    l.row("Raft")
    l.add(series("Commit and apply latency", "A write proposed on the leader until committed and applied there, and one batch's apply (p99).",
                 [(f"histogram_quantile(0.99, sum by (le) (rate(waymark_raft_commit_seconds_bucket{{{R}}}[5m])))", "commit p99"),
                  (f"histogram_quantile(0.99, sum by (le) (rate(waymark_raft_apply_seconds_bucket{{{R}}}[5m])))", "apply p99")], "s"), 8, 8)
    l.add(series("Follower lag", "On the leader: entries each follower has not matched, and how old the oldest of them is.",
                 [(f"max by (follower) (waymark_raft_follower_lag_entries{{{R}}})", "{{follower}} entries"),
                  (f"max by (follower) (waymark_raft_follower_lag_seconds{{{R}}})", "{{follower}} seconds")]), 8, 8)
    l.add(series("Snapshots", "Size of the last snapshot each member built, and snapshots installed from a leader per hour.",
                 [(f"max by (instance) (waymark_raft_snapshot_built_bytes{{{R}}})", "built {{instance}}"),
                  (f"sum by (instance) (increase(waymark_raft_snapshot_installed_bytes_count{{{R}}}[1h]))", "installed (1h) {{instance}}")], "decbytes"), 8, 8)
    l.row("API")
    l.add(series("API requests", "Requests answered per second by route template and status.",
                 [(f"sum by (route, status) (rate(waymark_api_requests_total{{{R}}}[5m]))", "{{route}} {{status}}")], "reqps"), 8, 8)
    l.add(series("API requests by principal", "Requests per second by the kind of principal that asked.",
                 [(f"sum by (principal_kind) (rate(waymark_api_requests_total{{{R}}}[5m]))", "{{principal_kind}}")], "reqps"), 8, 8)
    l.add(series("API latency p99", "By route template (a blocking query counts its wait).",
                 [(f"histogram_quantile(0.99, sum by (route, le) (rate(waymark_api_request_duration_seconds_bucket{{{R}}}[5m])))", "{{route}}")], "s"), 8, 8)
    l.row("The authority")
    l.add(series("Release commit latency", "How long a leader's Release entry takes to commit (p50, p99).",
                 [(f"histogram_quantile(0.5, sum by (le) (rate(waymark_publish_commit_seconds_bucket{{{R}}}[5m])))", "p50"),
                  (f"histogram_quantile(0.99, sum by (le) (rate(waymark_publish_commit_seconds_bucket{{{R}}}[5m])))", "p99")], "s"), 8, 8)
    l.add(series("Registry writes", "Commands committed per second, and commands per log entry (group commit).",
                 [(f"sum(rate(waymark_registry_commit_commands_total{{{R}}}[5m]))", "commands/s"),
                  (f"sum(rate(waymark_registry_commit_commands_total{{{R}}}[5m])) / clamp_min(sum(rate(waymark_registry_commit_entries_total{{{R}}}[5m])), 1e-9)", "commands per entry")]), 8, 8)
    l.add(series("Raft term", "Each step is an election.", [(f"max by (instance) (waymark_raft_term{{{R}}})", "{{instance}}")]), 8, 8)
    l.add(series("xDS clients per member", "Subscribed clients each member serves.",
                 [(f"sum by (instance) (waymark_xds_clients{{{R}}})", "{{instance}}")]), 8, 8)
    l.add(series("xDS streams refused", "By reason: admission is the reconnection guard.",
                 [(f"sum by (reason) (rate(waymark_xds_streams_refused_total{{{R}}}[5m]))", "{{reason}}")], "reqps"), 8, 8)
    l.add(series("Evidence admitted", "Samples admitted into the evaluator per second, and refusals by reason.",
                 [(f"sum(rate(waymark_ingest_samples_accepted_total{{{R}}}[5m]))", "admitted"),
                  (f"sum by (reason) (rate(waymark_ingest_samples_refused_total{{{R}}}[5m]))", "refused: {{reason}}")]), 8, 8)
    l.add(series("API refusals", "Requests refused by reason (unauthenticated, forbidden, bad input).",
                 [(f"sum by (reason) (rate(waymark_api_refusals_total{{{R}}}[5m]))", "{{reason}}")], "reqps"), 12, 8)
    l.add(series("Certificate lifetime left", "Time until each process's served certificate expires; page under 60 minutes.",
                 [(f"min by (job, instance) (waymark_certs_leaf_not_after_seconds{{{R}}}) - time()", "{{job}} {{instance}}")], "s"), 12, 8)
    return dashboard("waymark-region", "waymark / Region overview",
                     "Whether the region's control plane can change routing, and what it routes.", l, variables())


def service_detail():
    l = Layout()
    S = f'{R}, service="$service"'
    l.add(series("Instances by verdict", "The service's instances by verdict.",
                 [(f"sum by (verdict) (waymark_instances{{{S}}})", "{{verdict}}")], stack=True), 12, 8)
    l.add(series("Evidence mode", "How many instances rest on each evidence mode: passive_primary (callers' outcomes), probe_primary, single_class.",
                 [(f"sum by (mode) (waymark_evidence_mode_instances{{{S}}})", "{{mode}}")], stack=True), 12, 8)
    l.add(series("Health disregarded, by zone", "1 while the fraction guard holds the zone's full set.",
                 [(f"max by (zone) (waymark_alarm_fraction_guard_engaged{{{S}}})", "{{zone}}")]), 12, 8)
    l.add(series("No eligible instance", "1 while the last eligible instance in the region is withdrawn.",
                 [(f"max(waymark_alarm_last_eligible_withdrawn{{{S}}})", "withdrawn")]), 12, 8)
    l.add(series("Quarantines", "Instances quarantined for flapping, per hour.",
                 [(f"sum(increase(waymark_quarantine_events_total{{{S}}}[1h]))", "quarantined (1h)")]), 12, 8)
    l.add(series("View age at the agents", "Age of this service's view at each agent (worst five).",
                 [(f"topk(5, waymark_agent_view_age_seconds{{{S}}})", "{{instance}}")], "s"), 12, 8)
    l.add(series("Endpoints held back", "Endpoints the agents' shrink cap is still serving after a mass withdrawal.",
                 [(f"sum(waymark_agent_held_back_endpoints{{{S}}})", "held back")]), 12, 8)
    l.add(series("Views refused by agents", "Views an agent refused whole (would empty the service, or undecodable), by reason.",
                 [(f"sum by (reason) (increase(waymark_agent_views_refused_total{{{S}}}[1h]))", "{{reason}}")]), 12, 8)
    return dashboard("waymark-service", "waymark / Service detail",
                     "One service: verdicts, evidence, guard state per zone and what the agents hold.", l,
                     variables(service_variable()))


def agent_fleet():
    l = Layout()
    l.add(stat("Agents", "Node agents scraped.", f"count(waymark_agent_upstream_connected{{{R}}})"), 6, 4)
    l.add(stat("Disconnected", "Agents without an upstream stream.",
               f"count(waymark_agent_upstream_connected{{{R}}} == 0) or vector(0)", "none", red_above(1)), 6, 4)
    l.add(stat("Without a standby", "Agents holding no standby stream at a second member.",
               f"count(waymark_agent_upstream_standby{{{R}}} == 0) or vector(0)", "none", red_above(1)), 6, 4)
    l.add(stat("Oldest last-known-good", "The oldest unconfirmed view any agent holds.",
               f"max(waymark_agent_lkg_age_seconds{{{R}}})", "s", red_above(900)), 6, 4)
    l.add(series("Last-known-good age", "Worst ten agents.", [(f"topk(10, waymark_agent_lkg_age_seconds{{{R}}})", "{{instance}}")], "s"), 12, 8)
    l.add(series("Upstream NACKs", "Responses the agents NACKed (could not persist or decode), per second.",
                 [(f"sum by (instance) (rate(waymark_agent_upstream_nacks_total{{{R}}}[5m])) > 0", "{{instance}}")], "ops"), 12, 8)
    l.add(series("Propagation to sidecars p99", "From a version's arrival at the agent to its sidecars' ACK, by path (worst five agents).",
                 [(f"topk(5, histogram_quantile(0.99, sum by (instance, path, le) (rate(waymark_xds_propagation_seconds_bucket{{{R}, hop=\"agent_sidecar\"}}[5m]))))", "{{instance}} {{path}}")], "s"), 12, 8)
    l.add(series("Sidecar view age p99", "Each sidecar's view age at its agent, sampled once a second (worst five agents).",
                 [(f"topk(5, histogram_quantile(0.99, sum by (instance, le) (rate(waymark_xds_client_view_age_seconds_bucket{{{R}, hop=\"agent_sidecar\"}}[5m]))))", "{{instance}}")], "s"), 12, 8)
    l.add(series("Probes", "Completed probes per second by kind and health.",
                 [(f"sum by (kind, health) (rate(waymark_probes_total{{{R}}}[5m]))", "{{kind}} {{health}}")], "ops"), 12, 8)
    l.add(series("Probe duration p99", "By kind.",
                 [(f"histogram_quantile(0.99, sum by (kind, le) (rate(waymark_probe_duration_seconds_bucket{{{R}}}[5m])))", "{{kind}}")], "s"), 12, 8)
    l.add(series("Evidence sent upstream", "Samples accepted by the authority, dropped on the agent, refused.",
                 [(f"sum(rate(waymark_agent_evidence_accepted_total{{{R}}}[5m]))", "accepted"),
                  (f"sum(rate(waymark_agent_evidence_dropped_total{{{R}}}[5m]))", "dropped"),
                  (f"sum(rate(waymark_agent_evidence_refused_total{{{R}}}[5m]))", "refused")], "ops"), 12, 8)
    l.add(series("Load reports", "LRS samples forwarded and dropped per second.",
                 [(f"sum(rate(waymark_lrs_samples_forwarded_total{{{R}}}[5m]))", "forwarded"),
                  (f"sum(rate(waymark_lrs_samples_dropped_total{{{R}}}[5m]))", "dropped")], "ops"), 12, 8)
    l.add(series("DNS", "Queries per second by response code.",
                 [(f"sum by (rcode) (rate(waymark_dns_queries_total{{{R}}}[5m]))", "{{rcode}}")], "reqps"), 12, 8)
    l.add(series("Gossip members", "Members each agent sees alive.",
                 [(f"max by (instance) (waymark_gossip_members{{{R}}})", "{{instance}}")]), 12, 8)
    return dashboard("waymark-agents", "waymark / Agent fleet",
                     "Every node agent: its upstream, its last-known-good view, probing, evidence, LRS and DNS.", l, variables())


def federation():
    l = Layout()
    l.add(series("Peer region age", "Time since any member of the peer region last spoke.",
                 [(f"max by (peer_region) (waymark_federation_region_age_seconds{{{R}}})", "{{peer_region}}")], "s"), 12, 8)
    l.add(series("Peer region stale", "1 while every link to the peer region is stale; its entries are kept at tier 2.",
                 [(f"max by (peer_region) (waymark_federation_region_stale{{{R}}})", "{{peer_region}}")]), 12, 8)
    l.add(series("Links up", "Links to each peer region's members that are up.",
                 [(f"sum by (peer_region) (waymark_federation_peer_connected{{{R}}})", "{{peer_region}}")]), 12, 8)
    l.add(series("Front doors", "1 while a peer region's front door answers the out-of-band probe.",
                 [(f"min by (peer_region) (waymark_federation_front_door_up{{{R}}})", "{{peer_region}}")]), 12, 8)
    l.add(series("Replication", "Entries taken from peer regions, and reconciliations after a silence.",
                 [(f"sum(rate(waymark_federation_replicated_entries_total{{{R}}}[5m]))", "replicated/s"),
                  (f"sum(increase(waymark_federation_reconciliations_audited_total{{{R}}}[1h]))", "reconciliations (1h)")]), 12, 8)
    l.add(series("Refused", "Connections and messages from peers refused, by reason (foreign_entry: a peer claimed another region's entries).",
                 [(f"sum by (reason) (rate(waymark_federation_refused_total{{{R}}}[5m]))", "{{reason}}")]), 12, 8)
    l.add(series("Region failover", "Share of each peer region's tier-2 preference moved away by a failover.",
                 [(f"max by (peer_region) (waymark_region_failover_moved_ratio{{{R}}})", "{{peer_region}}")], "percentunit"), 24, 8)
    return dashboard("waymark-federation", "waymark / Federation",
                     "Peer regions as this region sees them: age, staleness, links, front doors, reconciliation, failover.", l, variables())


DASHBOARDS = {
    "region-overview.json": region_overview,
    "service-detail.json": service_detail,
    "agent-fleet.json": agent_fleet,
    "federation.json": federation,
}


def render():
    return {name: json.dumps(make(), indent=2, sort_keys=True) + "\n" for name, make in DASHBOARDS.items()}


def main():
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (out / name).write_text(text)


if __name__ == "__main__":
    main()
