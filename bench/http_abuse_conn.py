"""gRPC health-check latency while the dashboard's connections are abused.

    python bench/http_abuse_conn.py [--baseline-tree DIR] [--cases slow,cookies]
                                    [--seconds 10] [--slow 1000]

The connection-layer cases of issue 24, in the structure of
``bench/http_abuse.py`` (branch http-metrics; its helpers are copied here
rather than imported, so this file runs on its own branch): each case starts
its own ``ringod`` (SQLite in a temporary data dir) with ``--ui-listen``, and
a *prober*, a separate process (this file with ``--probe``) calling
``grpc.health.v1.Health/Check`` on one connection every ~10 ms. The samples
taken while the case's abuse ran are its figures (p50 / p99 / max); the
target is a health p99 under 50 ms.

Cases (one function each, ``case_<name>``, returning a `CaseResult`):

* ``slow``: ``--slow`` connections (1,000) to the dashboard from 127.0.0.2,
  each sending a request head a byte a second (slowloris) and, once the
  daemon closes it (408, or 503 when over a cap), opening again after
  0.5 s; meanwhile a *browser* at 127.0.0.1 fetches ``/queues`` every
  200 ms (5 s timeout): how many are answered 200, 503, or not at all.
* ``cookies``: 8 threads at 127.0.0.1 sending ``GET /queues`` with a session
  cookie whose signature holds a non-ASCII character (``x.9999999999.café``,
  the shape that reaches the signature check) as fast as answered: the
  statuses, and how many bytes a second the daemon's log (its stderr) grew.

``--baseline-tree DIR`` runs every case on the daemon of another source tree
too (``git worktree add --detach /tmp/base-conn 48054ad``), started through
``bench/_tree.py`` so it imports that tree only; the prober and the abusers
always run this tree's code. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _tree
from _stats import percentile

from ringo_trio.testing import DaemonProcess, spawn_daemon

PROBE_PERIOD = 0.010
BROWSER_PERIOD = 0.2
ATTACKER = "127.0.0.2"
COOKIE_THREADS = 8


@dataclass
class CaseResult:
    latencies: list[float]
    """Health/Check latencies (seconds) of the calls made during the abuse."""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Tree:
    """Which source tree's ``ringod`` to run (None: this checkout's)."""

    name: str
    path: Path | None

    def command(self) -> list[str] | None:
        if self.path is None:
            return None
        return [sys.executable, _tree.BOOTSTRAP, str(self.path), "-m", "ringo_trio.server"]


def start_daemon(tree: Tree, data_dir: Path, token: str | None = None) -> DaemonProcess:
    return spawn_daemon(
        data_dir,
        token=token,
        extra_args=["--ui-listen", "127.0.0.1:0"],
        command=tree.command(),
        startup_timeout=120,
    )


# -- the prober ------------------------------------------------------------------------


async def _probe_loop(endpoint: str) -> None:
    from grpclib.client import Channel

    from ringo_trio._proto.grpc.health.v1 import HealthCheckRequest, HealthStub

    host, _, port = endpoint.rpartition(":")
    channel = Channel(host, int(port))
    try:
        health = HealthStub(channel)
        await health.check(HealthCheckRequest())  # connect
        print("ready", flush=True)
        while True:
            started = time.time()
            began = time.perf_counter()
            await health.check(HealthCheckRequest())
            print(f"{started:.6f} {time.perf_counter() - began:.6f}", flush=True)
            await asyncio.sleep(PROBE_PERIOD)
    finally:
        channel.close()


class Probe:
    """The prober process, its samples read by a thread of this one."""

    def __init__(self, endpoint: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, __file__, "--probe", endpoint], stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdout is not None
        if self._process.stdout.readline().strip() != "ready":
            raise RuntimeError("the prober did not start")
        self._samples: list[tuple[float, float]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            started, latency = line.split()
            self._samples.append((float(started), float(latency)))

    def between(self, began: float, ended: float) -> list[float]:
        return [latency for started, latency in self._samples if began <= started <= ended]

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)
        self._reader.join(timeout=30)


def measure(daemon: DaemonProcess, attack: Callable[[], list[str]]) -> CaseResult:
    """Health latencies while `attack` runs (its return: the notes)."""
    probe = Probe(daemon.endpoint)
    try:
        time.sleep(0.5)
        began = time.time()
        notes = attack()
        ended = time.time()
        time.sleep(0.1)
    finally:
        probe.close()
    return CaseResult(probe.between(began, ended), notes)


def _ms(values: list[float]) -> str:
    if not values:
        return "—"
    return " / ".join(f"{percentile(values, f) * 1000:.1f}" for f in (0.5, 0.99, 1.0))


def _browser(host: str, stop: threading.Event) -> tuple[Counter[str], list[float]]:
    """GET /queues every BROWSER_PERIOD from 127.0.0.1 until `stop`."""
    outcomes: Counter[str] = Counter()
    times: list[float] = []
    while not stop.is_set():
        started = time.perf_counter()
        conn = http.client.HTTPConnection(host, timeout=5)
        try:
            conn.request("GET", "/queues")
            response = conn.getresponse()
            response.read()
            outcomes[str(response.status)] += 1
            if response.status == 200:
                times.append(time.perf_counter() - started)
        except OSError as exc:
            outcomes[type(exc).__name__] += 1
        finally:
            conn.close()
        stop.wait(BROWSER_PERIOD)
    return outcomes, times


# -- cases ------------------------------------------------------------------------------


async def _slowloris(host: str, port: int, count: int, stop: threading.Event) -> Counter[str]:
    """`count` connections trickling a head a byte a second, reopened when closed."""
    seen: Counter[str] = Counter()

    async def one() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port, local_addr=(ATTACKER, 0))
            except OSError:
                seen["connect failed"] += 1
                await asyncio.sleep(0.5)
                continue
            seen["opened"] += 1
            try:
                writer.write(b"GET /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                while not stop.is_set():
                    try:
                        answer = await asyncio.wait_for(reader.read(64), 1.0)
                    except TimeoutError:
                        writer.write(b"a")
                        continue
                    seen[answer[:12].decode("latin-1") or "closed silently"] += 1
                    break
            except OSError:
                seen["reset"] += 1
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            await asyncio.sleep(0.5)

    async with asyncio.TaskGroup() as tg:
        for _ in range(count):
            tg.create_task(one())
    return seen


def case_slow(tree: Tree, args: argparse.Namespace) -> CaseResult:
    """--slow slowloris connections from 127.0.0.2, a browser at 127.0.0.1."""
    with (
        tempfile.TemporaryDirectory(prefix="ringo-abuse-") as tmp,
        start_daemon(tree, Path(tmp) / "data") as daemon,
    ):
        host = daemon.info["ui"].removeprefix("http://")
        address, _, port = host.rpartition(":")

        def attack() -> list[str]:
            stop = threading.Event()
            seen: Counter[str] = Counter()

            def attacker() -> None:
                seen.update(asyncio.run(_slowloris(address, int(port), args.slow, stop)))

            thread = threading.Thread(target=attacker)
            thread.start()
            time.sleep(3)  # let the connections pile up
            browser_stop = threading.Event()
            timer = threading.Timer(args.seconds, browser_stop.set)
            timer.start()
            outcomes, times = _browser(host, browser_stop)
            stop.set()
            thread.join()
            answered = ", ".join(f"{n} {k!r}" for k, n in seen.most_common(4))
            return [
                "browser: "
                + ", ".join(f"{n} x {k}" for k, n in sorted(outcomes.items()))
                + f" (200s p50 / p99 / max {_ms(times)} ms)",
                f"attacker: {answered}",
            ]

        return measure(daemon, attack)


def case_cookies(tree: Tree, args: argparse.Namespace) -> CaseResult:
    """8 threads sending a non-ASCII session cookie as fast as answered."""
    with (
        tempfile.TemporaryDirectory(prefix="ringo-abuse-") as tmp,
        start_daemon(tree, Path(tmp) / "data") as daemon,
    ):
        host = daemon.info["ui"].removeprefix("http://")
        address, _, port = host.rpartition(":")
        request = (
            b"GET /queues HTTP/1.1\r\nHost: %s\r\n"
            b"Cookie: ringo_session=x.9999999999.caf\xc3\xa9\r\nConnection: close\r\n\r\n"
            % host.encode()
        )

        def attack() -> list[str]:
            stop = threading.Event()
            statuses: Counter[str] = Counter()

            def flood() -> None:
                while not stop.is_set():
                    try:
                        with socket.create_connection((address, int(port)), timeout=5) as s:
                            s.sendall(request)
                            answer = s.recv(64)
                        statuses[answer[9:12].decode("latin-1") or "closed"] += 1
                    except OSError as exc:
                        statuses[type(exc).__name__] += 1

            log_before = len(daemon.stderr_text().encode())
            started = time.perf_counter()
            threads = [threading.Thread(target=flood) for _ in range(COOKIE_THREADS)]
            for thread in threads:
                thread.start()
            time.sleep(args.seconds)
            stop.set()
            for thread in threads:
                thread.join()
            took = time.perf_counter() - started
            grown = len(daemon.stderr_text().encode()) - log_before
            total = sum(statuses.values())
            return [
                f"{total / took:.0f} requests/s: "
                + ", ".join(f"{n} x {k}" for k, n in sorted(statuses.items())),
                f"log grew {grown / took / 1e3:.1f} kB/s",
            ]

        return measure(daemon, attack)


CASES: dict[str, Callable[[Tree, argparse.Namespace], CaseResult]] = {
    "slow": case_slow,
    "cookies": case_cookies,
}


# -- main --------------------------------------------------------------------------------


def main() -> None:
    if sys.argv[1:2] == ["--probe"]:
        with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
            asyncio.run(_probe_loop(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--baseline-tree", type=Path, help="also run this tree's ringod")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0, help="abuse length")
    parser.add_argument("--slow", type=int, default=1000, help="slow connections")
    args = parser.parse_args()
    trees = [Tree("current", None)]
    if args.baseline_tree is not None:
        trees.insert(0, Tree(f"baseline ({args.baseline_tree})", args.baseline_tree.resolve()))
    rows = []
    for name in args.cases.split(","):
        for tree in trees:
            print(f"{name} on {tree.name} ...", flush=True)
            result = CASES[name](tree, args)
            print(f"  health p50 / p99 / max {_ms(result.latencies)} ms", flush=True)
            for note in result.notes:
                print(f"  {note}", flush=True)
            rows.append((name, tree.name, result))
    print()
    print("| case | daemon | health p50 / p99 / max (ms) | calls | notes |")
    print("| --- | --- | --- | ---: | --- |")
    for name, tree_name, result in rows:
        notes = "; ".join(result.notes)
        figures = f"{_ms(result.latencies)} | {len(result.latencies)}"
        print(f"| {name} | {tree_name} | {figures} | {notes} |")


if __name__ == "__main__":
    main()
