"""A proxyless gRPC client that finds its backends through our ADS server alone.

    python client.py --ads-port PORT [--calls N] [--interactive] [--service pay]
                     [--node-id ID] [--region eu] [--zone zone-a] [--timeout SECONDS]

It writes a gRPC xDS bootstrap naming 127.0.0.1:PORT as the only xDS server, points
GRPC_XDS_BOOTSTRAP at it and dials xds:///SERVICE: grpcio's own xDS resolver then asks our
server for the Listener SERVICE (LDS), the RouteConfiguration it names (RDS), the Cluster
(CDS) and its ClusterLoadAssignment (EDS), and balances /waymark.test.Echo/Who calls over
the endpoints it got. Nothing here knows a backend's address.

Output, one line each, on stdout:
    ready                          the channel connected (after the xDS handshake)
    answer NAME                    a call answered by backend NAME
    error CODE DETAILS             a call failed
    round OK ERR                   a round of calls ended
With --interactive it then reads commands from stdin, one a line: "calls N" runs another
round, "quit" (or end of input) exits. The exit code is 0 only if every call succeeded.

Set WAYMARK_GRPC_DEBUG=1 to get grpc's own xds_client trace on stderr.
"""

import argparse
import json
import os
import sys
import tempfile
import time


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--ads-port", type=int, required=True)
    p.add_argument("--calls", type=int, default=0)
    p.add_argument("--interactive", action="store_true")
    p.add_argument("--service", default="pay")
    p.add_argument("--node-id", default="grpc-proxyless")
    p.add_argument("--region", default="eu")
    p.add_argument("--zone", default="zone-a")
    p.add_argument("--timeout", type=float, default=20.0, help="overall budget, seconds")
    p.add_argument("--call-deadline", type=float, default=2.0, help="per call, seconds")
    return p.parse_args()


def write_bootstrap(args):
    bootstrap = {
        "xds_servers": [
            {
                "server_uri": f"127.0.0.1:{args.ads_port}",
                "channel_creds": [{"type": "insecure"}],
                "server_features": ["xds_v3"],
            }
        ],
        "node": {
            "id": args.node_id,
            "cluster": "waymark-test",
            "locality": {"region": args.region, "zone": args.zone},
        },
    }
    f = tempfile.NamedTemporaryFile(
        "w", prefix="waymark-grpc-bootstrap-", suffix=".json", delete=False
    )
    with f:
        json.dump(bootstrap, f)
    return f.name


def main():
    args = parse_args()
    bootstrap = write_bootstrap(args)
    # Both must be set before grpc initialises its core.
    os.environ["GRPC_XDS_BOOTSTRAP"] = bootstrap
    if os.environ.get("WAYMARK_GRPC_DEBUG") == "1":
        os.environ["GRPC_VERBOSITY"] = "DEBUG"
        os.environ["GRPC_TRACE"] = "xds_client,xds_resolver"
    import grpc  # noqa: E402 (after the environment above)

    deadline = time.monotonic() + args.timeout

    def left():
        return max(0.0, deadline - time.monotonic())

    failures = 0
    try:
        channel = grpc.insecure_channel(f"xds:///{args.service}")
        try:
            grpc.channel_ready_future(channel).result(timeout=left())
        except grpc.FutureTimeoutError:
            print(f"error NOT_READY channel not ready within {args.timeout}s", flush=True)
            return 1
        print("ready", flush=True)
        who = channel.unary_unary(
            "/waymark.test.Echo/Who",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )

        def round_of(n):
            ok = err = 0
            for _ in range(n):
                try:
                    name = who(b"", timeout=max(0.05, min(args.call_deadline, left())))
                    print(f"answer {name.decode()}", flush=True)
                    ok += 1
                except grpc.RpcError as e:
                    details = (e.details() or "").replace("\n", " ")
                    print(f"error {e.code().name} {details}", flush=True)
                    err += 1
            print(f"round {ok} {err}", flush=True)
            return err

        failures += round_of(args.calls) if args.calls else 0
        if args.interactive:
            for line in sys.stdin:
                words = line.split()
                if not words:
                    continue
                if words[0] == "quit":
                    break
                if words[0] == "calls" and len(words) == 2:
                    # Each round gets the full budget again: the budget bounds a round,
                    # not how long the caller keeps us.
                    deadline = time.monotonic() + args.timeout
                    failures += round_of(int(words[1]))
                else:
                    print(f"error BAD_COMMAND {line.strip()}", flush=True)
                    failures += 1
        channel.close()
    finally:
        os.unlink(bootstrap)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
