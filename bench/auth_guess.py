"""How fast can a client guess a daemon's bearer token?

Starts a ringod with ``--token`` and hammers it with wrong tokens (health
checks, grpclib, loopback) for a fixed time, in three ways:

* ``sequential``: one call at a time on one connection, reconnecting when
  the daemon closes it;
* ``parallel``: 64 calls in flight on one connection, reconnecting likewise;
* ``right token``: the same sequential loop with the right token, on the
  same daemon right after the guessing, for comparison.

It prints answers per second (UNAUTHENTICATED for guesses) and how many
connections the daemon closed. ``--pythonpath DIR`` runs the daemon from
another checkout (e.g. ``git archive`` of the commit before the throttle)
to measure the "before" figure.

    python bench/auth_guess.py [--seconds 5] [--pythonpath DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from ringo_trio._proto.grpc.health.v1 import HealthCheckRequest, HealthStub
from ringo_trio.testing import spawn_daemon

TOKEN = "the-right-token"


async def _hammer(host: str, port: int, token: str, seconds: float, width: int) -> tuple[int, int]:
    """(answers, connections closed under us) in `seconds` with `width` calls in flight."""
    answered = closed = 0
    deadline = time.monotonic() + seconds
    metadata = {"authorization": f"Bearer {token}"}
    channel = Channel(host, port)

    async def one(stub: HealthStub) -> bool:
        nonlocal answered
        try:
            await stub.check(HealthCheckRequest(), metadata=metadata, timeout=30)
        except GRPCError as exc:
            if exc.status is not Status.UNAUTHENTICATED:
                raise
        except (StreamTerminatedError, ConnectionError, OSError):
            return False
        answered += 1
        return True

    try:
        while time.monotonic() < deadline:
            stub = HealthStub(channel)
            remaining = deadline - time.monotonic()
            batch = [asyncio.ensure_future(one(stub)) for _ in range(width)]
            done, pending = await asyncio.wait(batch, timeout=max(remaining, 0))
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if any(task.done() and not task.cancelled() and not task.result() for task in done):
                closed += 1
                channel.close()
                channel = Channel(host, port)
    finally:
        channel.close()
    return answered, closed


async def _measure(host: str, port: int, seconds: float) -> None:
    for label, token, width in (
        ("sequential guesses", "wrong", 1),
        ("parallel guesses (64 in flight)", "wrong", 64),
        ("right token, sequential", TOKEN, 1),
    ):
        answered, closed = await _hammer(host, port, token, seconds, width)
        print(
            f"{label:34s} {answered / seconds:9.1f} answers/s"
            f"  ({answered} in {seconds:g} s, {closed} connections closed by the daemon)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--pythonpath", help="run the daemon's code from this checkout")
    args = parser.parse_args()
    command = None
    if args.pythonpath:
        # An editable install's import hook outranks PYTHONPATH: put the
        # checkout first and drop the hook.
        command = [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv.pop(1));"
            " sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)];"
            " from ringo_trio.server.main import main; main()",
            os.path.abspath(args.pythonpath),
        ]
    with (
        tempfile.TemporaryDirectory() as tmp,
        spawn_daemon(Path(tmp) / "data", token=TOKEN, command=command) as daemon,
    ):
        print(f"ringod from {args.pythonpath or 'this checkout'}, {sys.version.split()[0]}")
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_measure(daemon.host, daemon.port, args.seconds))


if __name__ == "__main__":
    main()
