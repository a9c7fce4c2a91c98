"""A workload's self-report client in Python, with stock grpcio and stubs generated from
agent/proto/waymark/evidence/v1/evidence.proto (agent/tests/node_selfreport.rs runs it).

Usage: selfreport.py TARGET CERT_CHAIN KEY BUNDLE SELF OTHER

Over mutual TLS as the workload SELF, it opens waymark.evidence.v1.Evidence/Session to its
node agent at TARGET (host:port), sends one batch (a not-ready report about SELF, a ready
report about OTHER) and reads the acknowledgement; then, on a second session, a
self-report whose dependency status is unspecified, which the agent must refuse. Prints
one JSON object on stdout: {"accepted", "refused": [[instance, reason]], "malformed":
{"code", "details"}}.
"""

import json
import queue
import sys

import grpc

from waymark.evidence.v1 import evidence_pb2 as pb
from waymark.evidence.v1 import evidence_pb2_grpc as pb_grpc

TIMEOUT_S = 30


def channel(target, cert_chain, key, bundle):
    creds = grpc.ssl_channel_credentials(
        root_certificates=open(bundle, "rb").read(),
        private_key=open(key, "rb").read(),
        certificate_chain=open(cert_chain, "rb").read(),
    )
    return grpc.secure_channel(target, creds)


class Session:
    """One bidirectional session: send() a message, next() an answer."""

    def __init__(self, stub):
        self.outbound = queue.Queue()
        self.inbound = stub.Session(iter(self.outbound.get, None), timeout=TIMEOUT_S)

    def send(self, message):
        self.outbound.put(message)

    def next(self):
        return next(self.inbound)

    def close(self):
        self.outbound.put(None)


def sample(instance, report):
    return pb.Sample(instance=instance, observation=pb.Observation(self_report=report))


def main():
    target, cert_chain, key, bundle, me, other = sys.argv[1:7]
    with channel(target, cert_chain, key, bundle) as ch:
        stub = pb_grpc.EvidenceStub(ch)

        s = Session(stub)
        s.send(pb.AgentMessage(samples=pb.Samples(samples=[
            sample(me, pb.SelfReport(not_ready=pb.NotReady(detail="warming caches, from python"))),
            sample(other, pb.SelfReport(ready=pb.Ready())),
        ])))
        answer = s.next()
        assert answer.WhichOneof("message") == "ack", answer
        s.close()

        bad = Session(stub)
        bad.send(pb.AgentMessage(samples=pb.Samples(samples=[
            sample(me, pb.SelfReport(dependency=pb.Dependency(
                name="db", status=pb.DEPENDENCY_STATUS_UNSPECIFIED))),
        ])))
        try:
            got = bad.next()
            malformed = {"code": "OK", "details": str(got)}
        except grpc.RpcError as e:
            malformed = {"code": e.code().name, "details": e.details()}
        bad.close()

    print(json.dumps({
        "accepted": answer.ack.accepted,
        "refused": [[r.instance, r.reason] for r in answer.ack.refused],
        "malformed": malformed,
    }))


if __name__ == "__main__":
    main()
