"""A gRPC backend for the proxyless xDS test (see ../grpc_proxyless.rs).

    python backend.py NAME PORT

Serves on 127.0.0.1:PORT (0 picks a free port) until its stdin closes or it is killed:

- the standard health service (grpc.health.v1), overall status SERVING and NAME SERVING;
- /waymark.test.Echo/Who, a unary method that answers every request with NAME as raw
  bytes, so a caller can tell which backend served it. Its handler is generic (bytes in,
  bytes out): no protoc, no generated code.

Prints "ready <port>" on stdout once it is listening; errors go to stderr.
"""

import sys
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def _identity(b):
    return b


def main():
    if len(sys.argv) != 3:
        print("usage: backend.py NAME PORT", file=sys.stderr)
        return 2
    name, port = sys.argv[1], int(sys.argv[2])

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))

    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)

    answer = name.encode()
    who = grpc.unary_unary_rpc_method_handler(
        lambda _request, _context: answer,
        request_deserializer=_identity,
        response_serializer=_identity,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("waymark.test.Echo", {"Who": who}),)
    )

    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    if bound == 0:
        print(f"backend {name}: cannot bind 127.0.0.1:{port}", file=sys.stderr)
        return 1
    server.start()
    print(f"ready {bound}", flush=True)

    # Stop when the parent goes away (its end of our stdin closes), not only when killed.
    done = threading.Event()

    def watch_stdin():
        sys.stdin.read()
        done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    done.wait()
    server.stop(grace=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
