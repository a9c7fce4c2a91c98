#!/usr/bin/env python3
"""Writes the seed corpus, fuzz/corpus/<target>/<name>, from the project's own test inputs.

The bodies, commands, contracts and identities below are the ones the crates' tests and the
integration tests under agent/tests/ send (authority_api.rs, hostile_inputs.rs, the registry
and machine unit tests, the LRS and DNS tests); the binary formats (protobuf, DNS, LKG
records, federation frames) are encoded here by hand from the same values. Re-run after
changing it: `python3 fuzz/make-seeds.py` (it needs openssl for the certificate seeds).
Seeds stay small: libFuzzer grows its own corpus under fuzz/work/.
"""

import hashlib
import json
import os
import struct
import zlib
import subprocess
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def lines(*values):
    return "\n".join(json.dumps(v, separators=(",", ":")) for v in values) + "\n"


# --- registry commands, as the registry and machine tests build them -------------------------
T0 = 1_700_000_000_000
LOC = {"region": "eu", "zone": "eu-west-1a", "node": "node-1"}
NO_READINESS = {"profile": {"probe": False, "self_report": False, "passive": True}, "probe": None}


def stamped(at, command):
    return {"at_ms": at, "command": command}


def put(service, contract=None, owner="payments"):
    return {"op": "put_service", "service": service, "owner": owner, "contract": contract or {}}


def register(service, ip, lease_ms=30_000, **extra):
    r = {"op": "register", "service": service, "locality": LOC,
         "address": {"ip": ip, "port": 8080}, "lease_ms": lease_ms}
    r.update(extra)
    return r


def instance(id_, service, ip, origin="orchestrator", zone="eu-west-1a"):
    return {"id": id_, "service": service,
            "locality": {"region": "eu", "zone": zone, "node": "node-1"},
            "address": {"ip": ip, "port": 8080}, "origin": origin, "weight": 100,
            "tags": ["canary"], "metadata": {"version": "7"}}


LIFECYCLE = [
    stamped(T0, put("web")),
    stamped(T0 + 1, register("web", "10.0.0.1")),
    stamped(T0 + 2, register("web", "10.0.0.2", tags=["v1"], metadata={"k": "v"})),
    stamped(T0 + 10_000, {"op": "renew", "instance": "web-1"}),
    stamped(T0 + 20_000, {"op": "observe", "instance": instance("pod-1", "web", "10.0.1.1")}),
    stamped(T0 + 20_001, {"op": "observe", "instance": instance("pod-1", "web", "10.0.1.1"), "draining": True}),
    stamped(T0 + 30_000, {"op": "set_assignment", "assignment": {"pod-1": ["node-1", "node-2"]}}),
    stamped(T0 + 40_000, {"op": "maintenance", "instance": "pod-1", "reason": "disk swap"}),
    stamped(T0 + 50_000, {"op": "forget", "instance": "pod-1"}),
    stamped(T0 + 700_000, {"op": "expire_leases"}),
    stamped(T0 + 700_001, {"op": "restart_leases"}),
    stamped(T0 + 700_002, {"op": "deregister", "instance": "web-2"}),
]
EXTERNAL = [
    stamped(T0, put("ext", NO_READINESS)),
    stamped(T0 + 1, {"op": "declare_external", "instance": instance("stripe-1", "ext", "203.0.113.7", "external")}),
    stamped(T0 + 2, {"op": "remove_external", "instance": "stripe-1"}),
    stamped(T0 + 3, {"op": "remove_service", "service": "ext"}),
]
POLICY = [
    stamped(T0, put("web", {"probe": {"kind": "tcp", "interval": "10s"}})),
    stamped(T0 + 1, {"op": "set_policy", "service": "web",
                     "policy": {"min_healthy_override": 700, "failover_zones": ["b", "a"]}}),
    stamped(T0 + 2, {"op": "set_policy", "service": "web", "policy": {"min_healthy_override": 0}}),
    stamped(T0 + 3, {"op": "evacuation", "zone": "eu-west-1a", "intent": {"action": "evacuate", "manual": True}}),
    stamped(T0 + 4, {"op": "evacuation_progress", "zone": "eu-west-1a",
                     "progress": {"moved": 500, "back": False, "manual": True, "awaiting_completion": False}}),
    stamped(T0 + 5, {"op": "region_failover", "region": "us", "intent": {"action": "failover", "manual": True},
                     "actor": "operator@example.org", "reason": "us front door down"}),
    stamped(T0 + 6, {"op": "region_failover_progress", "region": "us",
                     "progress": {"moved": 1000, "back": False, "manual": True, "awaiting_completion": True,
                                  "actor": "operator@example.org", "reason": "drill"}}),
    stamped(T0 + 7, {"op": "evacuation_progress", "zone": "eu-west-1a", "progress": None}),
]
# The two inputs of issue 15 (hostile_inputs.rs): the longest name a service may have,
# then a registration for it; and a contract whose silence (interval x factor) overflows.
HOSTILE = [
    stamped(T0, put("s" * 251)),
    stamped(T0 + 1, register("s" * 251, "127.0.0.1")),
    stamped(T0 + 2, put("x", {
        "profile": {"probe": True, "self_report": True, "passive": True},
        "self_report_interval": "18446744073709551615ms",
        "scoring": {"half_life": "1s", "remove": 800, "readmit": 200, "readmit_hold": "10s",
                    "corroborate": 500, "silence_factor": 4294967295}})),
    stamped(T0 + 3, register("web", "127.0.0.1", lease_ms=600_000,
                             tags=["t%d" % i for i in range(100)])),
]

for name, log in [("lifecycle", LIFECYCLE), ("external", EXTERNAL), ("policy", POLICY),
                  ("hostile", HOSTILE)]:
    write("registry_apply", name + ".jsonl", lines(*log))

# --- authority log entries (machine tests) ----------------------------------------------------


def endpoint(id_, ip, zone="eu-west-1a", status="eligible"):
    return {"instance": id_, "address": {"ip": ip, "port": 8080}, "region": "eu", "zone": zone,
            "tier": "local", "priority": 0, "weight": 100, "status": status, "verdict": "eligible",
            "tags": ["canary"], "metadata": {"version": "7"}}


def view(service, version, zone="eu-west-1a", n=2):
    eps = {f"{service}-{i}": endpoint(f"{service}-{i}", f"10.0.0.{i + 1}", zone) for i in range(n)}
    return {"version": version, "view": {"key": {"service": service, "zone": zone}, "endpoints": eps,
                                        "markers": {"health_disregarded": [], "evacuating": {},
                                                    "no_eligible_in_region": False, "zone_floor": {}}}}


def reg(s):
    r = dict(s)
    r["kind"] = "registry"
    return r


TERM2 = (2 << 32) | 1
write("authority_apply", "publish.jsonl", lines(
    reg(stamped(T0, put("web"))),
    {"kind": "publish", "views": [view("web", 1), view("web", 2, "eu-west-1b")]},
    {"kind": "publish", "views": [view("web", 1)]},
    {"kind": "publish", "views": [view("web", TERM2)]},
    {"kind": "audit", "entries": [{"at_ms": T0, "kind": "override", "actor": "operator@example.org",
                                   "service": "web", "instance": "web-1", "outcome": "granted",
                                   "detail": {"justification": "disk swap"}}]},
    {"kind": "observed", "at_ms": T0, "instances": {"web-1": {
        "classes": [[300, 1000], None, [0, 5000]], "hard": False, "quarantine_level": 1,
        "quarantine_left_ms": 60000}}},
    reg(stamped(T0 + 5, {"op": "remove_service", "service": "web"})),
    {"kind": "publish", "views": [view("web", TERM2 + 1)]},
))
write("authority_apply", "registry.jsonl", lines(*[reg(s) for s in LIFECYCLE]))
write("authority_apply", "batch.jsonl", lines({"kind": "batch", "commands": LIFECYCLE},
                                              {"kind": "batch", "commands": []}))

# --- contracts and policies -------------------------------------------------------------------
CONTRACTS = {
    "default": {},
    "tcp": {"probe": {"kind": "tcp", "interval": "10ms"}},
    "grpc": {"probe": {"kind": "grpc", "service": "pay.v1", "interval": "5s", "timeout": "1s"}},
    "no_readiness": NO_READINESS,
    "dependencies": {"dependencies": [{"name": "db", "shared": True, "authority": "weight_reduction"},
                                      {"name": "cache", "shared": False, "authority": "unreadiness"}]},
    "full": {"profile": {"probe": True, "self_report": True, "passive": True},
             "probe": {"kind": "http", "path": "/readyz", "interval": "2s", "timeout": "500ms"},
             "self_report_interval": "5s",
             "passive": {"interval": "10s", "min_requests": 20, "error_rate": 200},
             "scoring": {"half_life": "20s", "remove": 700, "readmit": 200, "readmit_hold": "30s",
                         "corroborate": 500, "silence_factor": 3},
             "slow_start": "1m", "min_healthy": 500, "uncorroborated_weight": 500,
             "dependency_weight": 500, "silence_withdraws": False},
    "overflow": HOSTILE[2]["command"]["contract"],
}
for name, c in CONTRACTS.items():
    write("contract", name + ".json", json.dumps(c))
write("contract", "policy.json", json.dumps({"min_healthy_override": 700, "failover_zones": ["b", "a"],
                                             "failover_regions": ["us"], "allowed_callers": ["web"]}))
write("contract", "durations.jsonl", '"250ms"\n"10s"\n"5m"\n"1h"\n"1.5s"\n"18446744073709551615ms"\n'
      '"0"\n"1m30s"\n"2h45m"\n"1d"\n".5s"\n"1.5ns"\n"10"\n"1 s"\n"213503982334601d7h15.999999999s"\n')

# --- API bodies (authority_api.rs, hostile_inputs.rs) -------------------------------------------
ROUTES = ["POST /v1/operator/raft/members", "DELETE /v1/operator/raft/members/{id}",
          "PUT /v1/services/{service}", "DELETE /v1/services/{service}",
          "GET /v1/services/{service}/view", "PUT /v1/services/{service}/policy",
          "POST /v1/zones/{zone}/evacuation", "POST /v1/contracts/validate", "POST /v1/instances",
          "DELETE /v1/instances/{id}", "PUT /v1/instances/{id}/renew",
          "GET /v1/instances/{id}/explain", "POST /v1/external", "DELETE /v1/external/{id}",
          "POST /v1/overrides", "POST /v1/federation/regions/{region}/failover"]


def api(route, body=None, name=None):
    data = bytes([ROUTES.index(route)])
    if name is not None:
        data += name.encode() + b"\n"
    if body is not None:
        data += json.dumps(body).encode()
    return data


API = [
    ("members", api("POST /v1/operator/raft/members", {"id": 2, "addr": "10.0.0.2:8500"})),
    ("members_dns", api("POST /v1/operator/raft/members", {"id": 3, "addr": "authority-2.waymark:8500"})),
    ("remove_member", api("DELETE /v1/operator/raft/members/{id}", name="2")),
    ("put_service", api("PUT /v1/services/{service}", {"owner": "payments", "contract": {}}, "pay")),
    ("put_service_tcp", api("PUT /v1/services/{service}", {"owner": "payments", "contract": CONTRACTS["tcp"]}, "pay")),
    ("put_service_long", api("PUT /v1/services/{service}", {"owner": "x", "contract": {}}, "s" * 251)),
    ("put_service_overflow", api("PUT /v1/services/{service}", {"owner": "x", "contract": CONTRACTS["overflow"]}, "x")),
    ("remove_service", api("DELETE /v1/services/{service}", name="web")),
    ("view", api("GET /v1/services/{service}/view", name="web")),
    ("policy", api("PUT /v1/services/{service}/policy", {"min_healthy_override": 700, "failover_zones": ["b", "a"]}, "web")),
    ("evacuate", api("POST /v1/zones/{zone}/evacuation", {"action": "evacuate", "manual": True}, "eu-west-1a")),
    ("complete", api("POST /v1/zones/{zone}/evacuation", {"action": "complete_shift_back"}, "eu-west-1a")),
    ("validate", api("POST /v1/contracts/validate", {"contract": CONTRACTS["full"]})),
    ("register", api("POST /v1/instances", {"service": "web", "locality": {"region": "eu", "zone": "a", "node": "n1"},
                                            "address": {"ip": "10.0.0.9", "port": 8080}, "lease_ms": 30000})),
    ("register_long", api("POST /v1/instances", {"service": "s" * 251, "locality": {"region": "dev", "zone": "az1", "node": "dev-node"},
                                                 "address": {"ip": "127.0.0.1", "port": 9}, "lease_ms": 30000})),
    ("deregister", api("DELETE /v1/instances/{id}", name="web-1")),
    ("renew", api("PUT /v1/instances/{id}/renew", name="web-1")),
    ("explain", api("GET /v1/instances/{id}/explain", name="web-1")),
    ("external", api("POST /v1/external", instance("stripe-1", "ext", "203.0.113.7", "external"))),
    ("remove_external", api("DELETE /v1/external/{id}", name="web-1")),
    ("override", api("POST /v1/overrides", {"instance": "web-1", "action": "maintenance_on", "justification": "disk swap"})),
    ("failover", api("POST /v1/federation/regions/{region}/failover", {"action": "failover", "reason": "front door down"}, "us")),
]
for name, data in API:
    write("api_bodies", name, data)

# --- Raft RPC bodies and a snapshot -------------------------------------------------------------
LEADER = {"term": 2, "node_id": 1}
ENTRIES = [{"log_id": {"leader_id": LEADER, "index": i + 1}, "payload": {"Normal": reg(s)}}
           for i, s in enumerate(LIFECYCLE[:4])]
ENTRIES.insert(0, {"log_id": {"leader_id": LEADER, "index": 0}, "payload": "Blank"})
write("raft_rpc", "append", b"\x00" + json.dumps({
    "vote": {"leader_id": LEADER, "committed": True},
    "prev_log_id": None, "entries": ENTRIES, "leader_commit": {"leader_id": LEADER, "index": 4}}).encode())
write("raft_rpc", "vote", b"\x01" + json.dumps({
    "vote": {"leader_id": LEADER, "committed": False},
    "last_log_id": {"leader_id": LEADER, "index": 4}}).encode())
SNAPSHOT = {"registry": {"services": {}, "instances": {}, "tombstones": [], "tombstone_order": [],
                         "next_seq": 3, "clock_ms": T0, "assignment": {}},
            "published": [view("web", 5)], "audit": [], "audit_seq": 0}
write("raft_rpc", "snapshot", b"\x04" + json.dumps(SNAPSHOT).encode())
write("raft_rpc", "install", b"\x02" + json.dumps({
    "vote": {"leader_id": LEADER, "committed": True},
    "meta": {"last_log_id": {"leader_id": LEADER, "index": 4}, "last_membership": {
        "log_id": None, "membership": {"configs": [[1]], "nodes": {"1": {"raft_addr": "127.0.0.1:8500",
                                                                          "api_addr": "127.0.0.1:8500"}}}},
             "snapshot_id": "2-1-4-1"},
    "offset": 0, "data": list(json.dumps(SNAPSHOT).encode()), "done": True}).encode())
write("raft_rpc", "responses", b"\x03" + json.dumps({"Ok": {"Success": None}}).encode())
SNAP_META = json.dumps({"last_log_id": {"leader_id": LEADER, "index": 4}, "last_membership": {
    "log_id": None, "membership": {"configs": [[1]], "nodes": {"1": {"raft_addr": "127.0.0.1:8500",
                                                                      "api_addr": "127.0.0.1:8500"}}}},
    "snapshot_id": "2-4"}).encode()
SNAP_DATA = json.dumps(SNAPSHOT).encode()
write("raft_rpc", "snapshot-file", b"\x05" + b"WMRSNAP1" + struct.pack("<IQI", len(SNAP_META), len(SNAP_DATA),
                                                                        zlib.crc32(SNAP_META + SNAP_DATA))
      + SNAP_META + SNAP_DATA)

# --- federation frames ---------------------------------------------------------------------------


def frame(msg):
    body = json.dumps(msg).encode()
    return struct.pack(">I", len(body)) + body


AGG = {"endpoints": [{"instance": "i-1", "address": {"ip": "10.2.0.1", "port": 8080}, "zone": "us-east-1a",
                      "weight": 100, "status": "eligible", "verdict": "eligible"}]}
write("federation", "frames", b"\xff" + frame({"kind": "digest", "versions": [[["us", "web"], 3], [["eu", "web"], 9]]})
      + frame({"kind": "entries", "entries": [{"region": "us", "service": "web", "version": 4, "aggregate": AGG},
                                              {"region": "eu", "service": "web", "version": 99, "aggregate": AGG}]})
      + frame({"kind": "entries", "entries": [{"region": "us", "service": "web", "version": 4,
                                               "aggregate": {"endpoints": []}}]}))

# --- LKG records (the format of waymark-lkg's encode) -----------------------------------------------


def fnv(key, version, payload):
    h = 0xcbf29ce484222325
    for b in key.encode() + b"\xff" + version.encode() + b"\xfe" + payload:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def lkg_value(type_url, name, version, payload):
    key = type_url + "\0" + name
    return key, struct.pack(">IQI", 0x574D4C31, fnv(key, version, payload), len(version)) + version.encode() + payload


CLA = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
key, value = lkg_value(CLA, "web", "7", b"\x0a\x03web")
write("lkg_record", "stored", b"\x00" + bytes([len(key)]) + key.encode() + value)
torn = value[:-1]
write("lkg_record", "torn", b"\x00" + bytes([len(key)]) + key.encode() + torn)


def lkg_record(type_url, name, version, payload):
    return (type_url.encode() + b"\0" + name.encode() + b"\0" + version.encode() + b"\0"
            + struct.pack(">H", len(payload)) + payload)


write("lkg_record", "store", b"\x01" + lkg_record(CLA, "web", "7", b"\x0a\x03web")
      + lkg_record("waymark.agent.meta", "confirmed_at_unix_ms", "", b"1700000000000")
      + lkg_record("waymark.agent.meta", "served_high_water", "", b"18446744073709551615"))

# --- LRS: LoadStatsRequest, protobuf-encoded by hand (lrs tests' shapes) ---------------------------


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, value):
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    return varint((num << 3) | 2) + varint(len(value)) + value


# --- evidence: a registry, a session identity, samples (protobuf by hand, evidence.proto) ----
HEALTH = {"pass": 1, "fail": 2, "timeout": 3, "refused": 4}
DEPENDENCY_STATUS = {"ok": 1, "degraded": 2, "down": 3}


def observation(o):
    # Observation { probe (1) | self_report (2) | passive (3) }
    if o["class"] == "probe":
        probe = field(1, HEALTH[o["health"]])
        if o.get("detail") is not None:
            probe += field(2, o["detail"].encode())
        return field(1, probe)
    if o["class"] == "passive":
        return field(3, field(1, o["requests"]) + field(2, o["errors"]))
    # SelfReport { ready (1) | not_ready (2) | draining (3) | dependency (4) }
    kind = o["kind"]
    if kind == "ready":
        report = field(1, b"")
    elif kind == "draining":
        report = field(3, b"")
    elif kind == "not_ready":
        report = field(2, field(1, o["detail"].encode()))
    else:
        report = field(4, field(1, o["name"].encode()) + field(2, DEPENDENCY_STATUS[o["status"]]))
    return field(2, report)


def sample(s):
    # Sample { instance (1), observation (2) }
    return field(1, s["instance"].encode()) + field(2, observation(s["observation"]))


def agent_message(kind, value):
    # AgentMessage { hello (1) { zone (1) } | samples (2) | relayed (3) { samples (1) } }
    if kind == "hello":
        return {"agent_message": field(1, field(1, value.encode())).hex()}
    batch = b"".join(field(1, sample(s)) for s in value)
    return {"agent_message": field({"samples": 2, "relayed": 3}[kind], batch).hex()}


def ack(accepted, refused):
    # AuthorityMessage { ack (2) { accepted (1), refused (2) { instance (1), reason (2) } } }
    body = field(1, accepted) + b"".join(
        field(2, field(1, i.encode()) + field(2, r.encode())) for i, r in refused)
    return {"authority_message": field(2, body).hex()}


SAMPLES = [{"instance": "pod-1", "observation": {"class": "probe", "health": "fail", "detail": "503"}},
           {"instance": "pod-1", "observation": {"class": "passive", "requests": 100, "errors": 30}},
           {"instance": "pod-1", "observation": {"class": "self_report", "kind": "ready"}},
           {"instance": "pod-1", "observation": {"class": "self_report", "kind": "dependency",
                                                 "name": "db", "status": "down"}}]
write("evidence", "session.jsonl", lines(
    stamped(T0, put("web", {"profile": {"probe": True, "self_report": True, "passive": True}})),
    stamped(T0 + 1, {"op": "observe", "instance": instance("pod-1", "web", "10.0.1.1")}),
    stamped(T0 + 1, {"op": "observe", "instance": instance("pod-2", "web", "10.0.1.2", zone="eu-west-1b")}),
    stamped(T0 + 2, {"op": "set_assignment", "assignment": {"pod-1": ["node-1"], "pod-2": ["node-1"]}}),
    "spiffe://example.org/region/web/node/node-1",
    agent_message("hello", "eu-west-1a"),
    agent_message("samples", SAMPLES),
    agent_message("samples", SAMPLES[:1] * 5),
    agent_message("relayed", SAMPLES),
    "spiffe://example.org/region/web/service/web/instance/pod-1",
    agent_message("samples", SAMPLES),
    ack(3, [("pod-9", "unknown_target")]),
))


def socket_address(ip, port):
    # Address.socket_address (1) { address (2), port_value (3) }
    return field(1, field(2, ip.encode()) + field(3, port))


def endpoint_stats(ip, port, ok, err):
    # UpstreamEndpointStats { address (1), total_successful_requests (2),
    #                         total_requests_in_progress (3), total_error_requests (4) }
    return field(1, socket_address(ip, port)) + field(2, ok) + field(4, err)


def cluster_stats(name, endpoints, interval_s=1):
    # ClusterStats { cluster_name (1), upstream_locality_stats (2), load_report_interval (4) }
    loc = b"".join(field(7, e) for e in endpoints)  # UpstreamLocalityStats.upstream_endpoint_stats (7)
    return field(1, name.encode()) + field(2, loc) + field(4, field(1, interval_s))


def load_stats(node_id, zone, clusters):
    # LoadStatsRequest { node (1) { id (1), locality (4) { zone (2) } }, cluster_stats (2) }
    node = field(1, node_id.encode()) + field(4, field(2, zone.encode()))
    return field(1, node) + b"".join(field(2, c) for c in clusters)


def lrs_frame(advance, msg):
    return bytes([advance]) + struct.pack(">H", len(msg)) + msg


first = load_stats("node-1", "zone-a", [cluster_stats("web", [endpoint_stats("10.0.0.1", 8080, 90, 10),
                                                               endpoint_stats("10.0.0.2", 8080, 100, 0)])])
again = load_stats("", "", [cluster_stats("web", [endpoint_stats("10.0.0.1", 8080, 5, 95)]),
                            cluster_stats("api", [endpoint_stats("10.0.1.3", 8080, 2**64 - 1, 1),
                                                  endpoint_stats("10.9.9.9", 1, 1, 1)])])
write("lrs", "reports", lrs_frame(0, first) + lrs_frame(11, again) + lrs_frame(11, first))

# --- DNS queries (dns tests' names) -------------------------------------------------------------


def dns_name(name):
    return b"".join(bytes([len(l)]) + l.encode() for l in name.rstrip(".").split(".")) + b"\x00"


def query(qid, name, qtype, edns=None, opcode=0, qclass=1):
    flags = (opcode << 11) | 0x0100
    arcount = 1 if edns is not None else 0
    msg = struct.pack(">HHHHHH", qid, flags, 1, 0, 0, arcount) + dns_name(name) + struct.pack(">HH", qtype, qclass)
    if edns is not None:
        size, version = edns
        msg += b"\x00" + struct.pack(">HHBBHH", 41, size, 0, version, 0, 0)
    return msg


A, AAAA, SRV, ANY, AXFR, SOA = 1, 28, 33, 255, 252, 6
DNS = [
    ("a", 0, query(1, "web.service.waymark.", A)),
    ("srv_udp", 2, query(2, "api.service.waymark.", SRV)),
    ("srv_edns", 4, query(3, "api.service.waymark.", SRV, edns=(4096, 0))),
    ("srv_tcp", 1, query(4, "api.service.waymark.", SRV)),
    ("aaaa", 0, query(5, "v6.svc.service.waymark.", AAAA)),
    ("tag_zone", 0, query(6, "canary.web.service.zone-a.zone.waymark.", ANY)),
    ("addr", 0, query(7, "0a000001.addr.waymark.", A)),
    ("soa", 0, query(8, "waymark.", SOA)),
    ("nx", 0, query(9, "nope.service.waymark.", A)),
    ("axfr", 1, query(10, "waymark.", AXFR)),
    ("badvers", 0, query(11, "web.service.waymark.", A, edns=(512, 1))),
    ("notimp", 0, query(12, "web.service.waymark.", A, opcode=2)),
    ("chaos", 0, query(13, "version.bind.", 16, qclass=3)),
    ("short", 0, b"\x00\x01\x01"),
]
for name, flags, q in DNS:
    write("dns_respond", name, bytes([flags]) + q)

# --- gossip: raw datagrams, and plaintext through the structured encoder -----------------------------
write("gossip", "datagram", b"\x00\x01\x8c" + bytes(range(12)) + b"junk" * 8)
for i, seed in enumerate([b"\x01" + bytes([7, 3, 9, 1, 2, 200, 4]), b"\x01" + bytes([0, 0, 6, 1]),
                          b"\x01" + bytes([1, 4, 10, 5, 2, 2, 1, 0, 3])]):
    write("gossip", f"structured-{i}", seed)

# --- ads: bytes for the structured decoder (no fixed format) --------------------------------------
for i, seed in enumerate([bytes([8, 3, 2, 0, 0, 2, 3, 2, 0, 5, 1, 2, 3]), bytes([8, 8, 1, 5, 0, 2, 1, 1, 7, 3, 3]),
                          bytes(range(0, 250, 7))]):
    write("ads_requests", f"structured-{i}", seed)

# --- ads request frames: [size-limit pick, chunk-size pick] + gRPC-framed discovery requests -----
EDS = b"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def grpc_frame(msg):
    return b"\x00" + struct.pack(">I", len(msg)) + msg


ADS_BODY = (grpc_frame(field(2, EDS) + field(3, b"pay") + field(3, b"web"))
            + grpc_frame(field(2, EDS) + field(6, b"1-2"))
            + grpc_frame(b"")
            + grpc_frame(field(2, EDS) + field(6, b"1-3") + field(7, field(1, 3) + field(2, b"rejected"))))
for i, (limit, cut) in enumerate([(3, 0), (3, 6), (2, 255), (1, 3)]):
    write("ads_request_frames", f"body-{i}", bytes([limit, cut]) + ADS_BODY)

# --- xds responses: bytes for the structured decoder (no fixed format) -----------------------------
for i, seed in enumerate([bytes([0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 1, 2, 2, 0, 0, 0, 0, 0, 0, 0, 3, 1]),
                          bytes(range(3, 250, 11))]):
    write("xds_responses", f"structured-{i}", seed)

# --- certificates: a real chain with a SPIFFE URI SAN, made with openssl --------------------------
with tempfile.TemporaryDirectory() as d:
    def ssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key",
        "-out", "ca.pem", "-subj", "/CN=waymark root", "-days", "3650",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "leaf.key",
        "-out", "leaf.csr", "-subj", "/CN=node-1")
    with open(os.path.join(d, "ext"), "w") as f:
        f.write("subjectAltName=URI:spiffe://example.org/region/eu/node/node-1\n"
                "extendedKeyUsage=serverAuth,clientAuth\n")
    ssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "leaf.pem", "-days", "1", "-extfile", "ext")
    ssl("x509", "-in", "leaf.pem", "-outform", "DER", "-out", "leaf.der")
    read = lambda n: open(os.path.join(d, n), "rb").read()
    write("certs", "chain", b"\x00" + read("leaf.pem") + read("ca.pem"))
    write("certs", "der", b"\x01" + read("leaf.der"))
    write("certs", "key", b"\x02" + read("leaf.key"))
    write("certs", "material", b"\x03" + read("leaf.pem") + b"\0" + read("leaf.key") + b"\0" + read("ca.pem"))
for i, text in enumerate(["spiffe://example.org/region/eu/node/node-1",
                          "spiffe://example.org/region/eu/authority/a1",
                          "spiffe://example.org/region/eu/service/pay/instance/pay-1",
                          "spiffe://example.org/operator/alice", "spiffe://example.org",
                          "spiffe://example.org/region/eu", "24h", "90d"]):
    write("certs", f"text-{i}", b"\x04" + text.encode())

# --- the gossip keyring file (agent/src/gossip/keyring_file.rs) -------------------------------
def keyring_file(*keys):
    body = b"WMKR" + bytes([1, len(keys)]) + b"".join(keys)
    return body + struct.pack("<I", zlib.crc32(body))


KR_A, KR_B = b"\x11" * 32, b"\x22" * 32
write("keyring_file", "one", b"\x00" + keyring_file(KR_A))
write("keyring_file", "rotating", b"\x00" + keyring_file(KR_B, KR_A))
write("keyring_file", "torn", b"\x00" + keyring_file(KR_B, KR_A)[:40])
write("keyring_file", "use-held", b"\x01\x02\x02" + keyring_file(KR_A, KR_B))
write("keyring_file", "remove-primary", b"\x01\x03\x00" + keyring_file(KR_A, KR_B))
write("keyring_file", "install-new", b"\x01\x01\x07" + keyring_file(KR_A))

print("seeds written under", ROOT)
