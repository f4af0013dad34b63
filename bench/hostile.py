"""The daemon under attack: its RSS and a normal client's latency.

    python bench/hostile.py [--attack stall|prefix|reset|all] [--base-src DIR]

For each attack, starts a private ``ringod`` (SQLite in a temporary data dir),
lets a normal client run sequential unary Enqueue calls, and measures
while the attack runs:

* the daemon's peak RSS (``VmRSS`` of /proc/<pid>/status, sampled every
  20 ms) above its RSS just before the attack;
* the normal client's p50 / p99 / max Enqueue latency.

Attacks (loopback only, with the raw h2 client of the hostile tests):

* ``stall``: 8 Work streams with credit 64 whose workers never open their
  receive window, each on a queue of 32 tasks with 1 MiB payloads;
* ``prefix``: 4 connections each announcing a 100 MB message and sending
  its body as fast as the daemon takes it;
* ``reset``: 5 bursts of 20,000 streams opened and reset on one connection
  (a new connection whenever the daemon closes one).

``--base-src DIR`` runs the daemon from another source tree (e.g. an
unpacked ``git archive`` of an older commit) for a before/after comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import h2.errors

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ringo_trio._contract.limits import MAX_PAYLOAD_BYTES
from ringo_trio._proto.ringo.v1 import (
    CreditUpdate,
    EnqueueManyRequest,
    EnqueueRequest,
    RequestContext,
    TaskSpec,
    WorkerRegistration,
    WorkRequest,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import Client, connect, split_endpoint
from tests._kit.h2raw import (
    ENQUEUE_METHOD,
    NEGOTIATE_METHOD,
    WORK_METHOD,
    RawH2,
    grpc_frame,
)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def sample_rss(pid: int, peak: list[int]) -> None:
    while True:
        with contextlib.suppress(OSError):
            peak[0] = max(peak[0], rss_kib(pid))
        await asyncio.sleep(0.02)


async def normal_client(client: Client, latencies: list[float]) -> None:
    spec = TaskSpec(task_type="t", payload=b"n" * 100)
    while True:
        started = time.perf_counter()
        await client.stub.enqueue(EnqueueRequest(context=client.context, queue="normal", task=spec))
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(0.005)


async def raw(daemon: DaemonProcess, window: int = 65535) -> RawH2:
    host, port = split_endpoint(daemon.endpoint)
    return await RawH2.connect(host, port, window=window)


# -- attacks ---------------------------------------------------------------------------


async def prepare_stall(client: Client) -> None:
    spec = TaskSpec(task_type="t", payload=b"x" * MAX_PAYLOAD_BYTES)
    for stream in range(8):
        for _ in range(4):
            await client.stub.enqueue_many(
                EnqueueManyRequest(
                    context=client.context, queue=f"stall-{stream}", tasks=[spec] * 8
                )
            )


async def attack_stall(daemon: DaemonProcess, context: RequestContext) -> None:
    workers = []
    for stream in range(8):
        worker = await raw(daemon)
        worker.auto_ack = False
        stream_id = worker.start(WORK_METHOD)
        registration = WorkerRegistration(
            context=context,
            queue=f"stall-{stream}",
            worker_id=f"stalled-{stream}",
            task_types=["t"],
            max_concurrency=64,
            lease_duration=timedelta(seconds=60),
        )
        await worker.send(stream_id, grpc_frame(WorkRequest(register=registration)))
        credit = WorkRequest(request_id=1, credit=CreditUpdate(available=64))
        await worker.send(stream_id, grpc_frame(credit))
        workers.append(worker)
    # The workers read their sockets (so pings are answered) but never
    # open their windows.
    await asyncio.gather(*(worker.until(lambda: False, 10) for worker in workers))
    for worker in workers:
        worker.close()


async def attack_prefix(daemon: DaemonProcess, context: RequestContext) -> None:
    async def one() -> None:
        client = await raw(daemon, window=2**30)
        stream_id = client.start(ENQUEUE_METHOD)
        await client.flush()
        body = (100_000_000).to_bytes(5)
        chunk = b"z" * 16384
        sent = 0
        state = client.streams[stream_id]
        try:
            await client.send(stream_id, body)
            while sent < 100_000_000 and state.reset is None and not state.trailers:
                while client.conn.local_flow_control_window(stream_id) < len(chunk):
                    if not await client.pump(2) or state.reset is not None or state.trailers:
                        return
                client.conn.send_data(stream_id, chunk)
                sent += len(chunk)
                if sent % (1 << 20) < len(chunk):
                    await client.flush()
                    await client.pump(0)
            await client.flush()
            await client.until(lambda: bool(state.trailers) or state.reset is not None, 10)
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            client.close()

    await asyncio.gather(*(one() for _ in range(4)))


async def attack_reset(daemon: DaemonProcess, context: RequestContext) -> None:
    for _ in range(5):
        client = await raw(daemon)
        try:
            for _ in range(40):
                if client.eof or client.goaway is not None:
                    break
                for _ in range(500):
                    stream_id = client.start(NEGOTIATE_METHOD)
                    client.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                await client.flush()
                await client.pump(0)
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            client.close()
        await asyncio.sleep(0.2)


ATTACKS: dict[
    str, tuple[Callable[[Client], Awaitable[None]] | None, Callable[..., Awaitable[None]]]
] = {
    "stall": (prepare_stall, attack_stall),
    "prefix": (None, attack_prefix),
    "reset": (None, attack_reset),
}


async def run_one(daemon: DaemonProcess, name: str) -> dict[str, float]:
    prepare, attack = ATTACKS[name]
    async with connect(daemon) as setup, connect(daemon) as normal:
        if prepare is not None:
            await prepare(setup)
        latencies: list[float] = []
        load = asyncio.create_task(normal_client(normal, latencies))
        try:
            await asyncio.sleep(1.0)
            latencies.clear()
            baseline = rss_kib(daemon.pid)
            peak = [baseline]
            sampler = asyncio.create_task(sample_rss(daemon.pid, peak))
            try:
                await attack(daemon, setup.context)
                await asyncio.sleep(0.5)
            finally:
                sampler.cancel()
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
    ordered = sorted(latencies)
    return {
        "rss_before_mib": baseline / 1024,
        "rss_peak_mib": peak[0] / 1024,
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[int(len(ordered) * 0.99)] * 1000,
        "max_ms": ordered[-1] * 1000,
        "calls": len(ordered),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attack", choices=[*ATTACKS, "all"], default="all")
    parser.add_argument("--base-src", type=Path, help="run the daemon from this source tree")
    args = parser.parse_args()
    env = command = None
    if args.base_src is not None:
        env = {"PYTHONPATH": str(args.base_src.resolve())}
        # -P: not the current directory (this checkout) ahead of PYTHONPATH.
        command = [sys.executable, "-P", "-m", "ringo_trio.server"]
    names = list(ATTACKS) if args.attack == "all" else [args.attack]
    print(f"daemon source: {args.base_src or 'this checkout'}")
    print("attack  rss before  rss peak  normal p50   p99      max     calls")
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            daemon = spawn_daemon(Path(tmp) / "data", env=env, command=command)
            try:
                result = asyncio.run(run_one(daemon, name))
            finally:
                daemon.stop()
        print(
            f"{name:7} {result['rss_before_mib']:7.0f} MiB {result['rss_peak_mib']:5.0f} MiB"
            f" {result['p50_ms']:7.1f} ms {result['p99_ms']:6.1f} ms {result['max_ms']:6.0f} ms"
            f" {result['calls']:6.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
