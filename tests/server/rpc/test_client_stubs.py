"""A client generating its own stubs from ``protos/`` as docs/protocol.md says
("Generating a client") gets code that imports beside grpcio and talks to
the daemon, health included (issue 28: the health proto used to live at
``protos/grpc/health/v1/``, so its generated module was ``grpc.health.v1``,
which the real ``grpc`` package shadows: ``No module named 'grpc.health'``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import deadline

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "stub-token"

# Run with the generated code first on sys.path, as a client project has it.
CLIENT = """
import sys
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ringo.v1 import queue_pb2, queue_pb2_grpc

endpoint, token, out = sys.argv[1:4]
assert not grpc.__file__.startswith(out), grpc.__file__  # grpcio itself, not shadowed
metadata = [("authorization", "Bearer " + token)]
with grpc.insecure_channel(endpoint) as channel:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "ringo.v1.QueueService"):
        reply = health.Check(
            health_pb2.HealthCheckRequest(service=service), metadata=metadata, timeout=30
        )
        print(repr(service), health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    try:
        health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
    except grpc.RpcError as error:
        print("no token:", error.code().name)
    queue = queue_pb2_grpc.QueueServiceStub(channel)
    reply = queue.Negotiate(
        queue_pb2.NegotiateRequest(sdk_name="stubs", protocol_major=1, protocol_minor=0),
        metadata=metadata,
        timeout=30,
    )
    print("negotiated", reply.protocol_major, reply.protocol_minor, bool(reply.session_token))
"""


@pytest.fixture
def ringod(tmp_path: Path) -> Iterator[DaemonProcess]:
    with deadline(120), spawn_daemon(tmp_path / "data", token=TOKEN) as process:
        yield process


def test_stubs_generated_from_protos_import_beside_grpcio_and_reach_health(
    tmp_path: Path, ringod: DaemonProcess
) -> None:
    """Property: the documented ``grpc_tools.protoc -I protos`` command over
    queue.proto and the health proto makes modules that import together
    with grpcio (the generated health module does not sit inside grpcio's
    ``grpc`` package), and with them a default grpcio client checks the
    daemon's health under the standard service name ``grpc.health.v1.Health``
    for "" and ``ringo.v1.QueueService`` (SERVING; UNAUTHENTICATED without
    the bearer token) and negotiates a session."""
    out = tmp_path / "stubs"
    out.mkdir()
    protos = ROOT / "protos"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{protos}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(protos / "ringo" / "v1" / "queue.proto"),
            str(protos / "grpc_health" / "v1" / "health.proto"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, ringod.endpoint, TOKEN, str(out)],
        cwd=out,  # the generated packages come first on sys.path
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "'' SERVING",
        "'ringo.v1.QueueService' SERVING",
        "no token: UNAUTHENTICATED",
        "negotiated 1 0 True",
    ]
