"""gRPC health-check latency while the daemon's HTTP side is abused.

    python bench/http_abuse.py [--baseline-tree DIR] [--cases idle,scrape,purge]
                               [--seconds 10] [--purge-tasks 1000000]

Each case starts its own ``ringod`` (SQLite in a temporary data dir) with
``--metrics-listen`` and ``--ui-listen``, and a *prober*: a separate process
(this file with ``--probe``) that calls ``grpc.health.v1.Health/Check`` on
one connection, one call every ~10 ms, and reports each call's start and
latency. The samples taken while the case's abuse ran are the case's
figures (p50 / p99 / max); the target is a health p99 under 50 ms.

Cases (one function each, ``case_<name>``, returning a `CaseResult`):

* ``idle``: nothing happens (the yardstick).
* ``scrape``: 1,000 queues (the metrics' label cap) of 3 tasks of 3 task
  types each, so a scrape is ~115,000 series and ~9.5 MB; then 50 threads
  scrape ``/metrics`` in a loop for ``--seconds`` (a refused one, 503 past
  the responder's 4 connections, waits 50 ms before the next).
* ``purge``: ``--purge-tasks`` SUCCEEDED tasks in one queue (the data dir is
  filled once, by the engine in this process, and copied for each run); the
  dashboard's purge button is pressed (a POST with the session's CSRF
  token) until the queue has no finished task left -- a tree whose click
  deletes at most 100,000 is clicked again, one that purges in the
  background is polled on its progress fragment -- while a second thread
  fetches the overview page (``/queues``) every 200 ms, whose times are
  reported too.

``--baseline-tree DIR`` runs every case on the daemon of another source
tree too (e.g. ``git worktree add --detach /tmp/base 48054ad``), started
through ``bench/_tree.py`` so it imports that tree only; the prober and the
abusers always run this tree's code. Prints a Markdown table.

Adding a case: write ``case_<name>(tree, args) -> CaseResult`` that starts
a daemon (`start_daemon`), sets up, and returns ``measure(daemon, attack)``
for its attack, then list it in `CASES`. `case_slow_connections` and
`case_bad_cookies` are the two planned next (their owner fills them in).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _tree
from _stats import percentile

from ringo_trio.testing import DaemonProcess, spawn_daemon

PROBE_PERIOD = 0.010
SCRAPERS = 50
METRIC_QUEUES = 1000
PAGE_PERIOD = 0.2
# What one purge click of a tree without background purges deletes at most.
_OLD_CLICK = 100 * 1000


@dataclass
class CaseResult:
    latencies: list[float]
    """Health/Check latencies (seconds) of the calls made during the abuse."""
    notes: list[str] = field(default_factory=list)
    """What else the case saw (counts, durations, other latencies)."""


@dataclass(frozen=True)
class Tree:
    """Which source tree's ``ringod`` to run (None: this checkout's)."""

    name: str
    path: Path | None

    def command(self) -> list[str] | None:
        if self.path is None:
            return None
        return [sys.executable, _tree.BOOTSTRAP, str(self.path), "-m", "ringo_trio.server"]


def start_daemon(tree: Tree, data_dir: Path, *extra: str) -> DaemonProcess:
    """A ``ringod`` of `tree` on `data_dir` with metrics and the dashboard on."""
    args = ["--metrics-listen", "127.0.0.1:0", "--ui-listen", "127.0.0.1:0", *extra]
    return spawn_daemon(data_dir, extra_args=args, command=tree.command(), startup_timeout=120)


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
            [sys.executable, __file__, "--probe", endpoint],
            stdout=subprocess.PIPE,
            text=True,
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


# -- helpers -----------------------------------------------------------------------------


def _grpc(endpoint: str, calls: Callable[..., object]) -> None:
    """Run ``calls(stub, context)`` (a coroutine function) on a session."""

    async def run() -> None:
        from grpclib.client import Channel

        from ringo_trio._contract.versions import MAJOR, MINOR
        from ringo_trio._proto.ringo.v1 import NegotiateRequest, QueueServiceStub, RequestContext

        host, _, port = endpoint.rpartition(":")
        channel = Channel(host, int(port))
        try:
            stub = QueueServiceStub(channel)
            session = await stub.negotiate(
                NegotiateRequest(protocol_major=MAJOR, protocol_minor=MINOR)
            )
            context = RequestContext(MAJOR, session.protocol_minor, session.session_token)
            await calls(stub, context)  # type: ignore[misc]
        finally:
            channel.close()

    asyncio.run(run())


def _http(host: str, method: str, path: str, **kw: object) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(host, timeout=120)
    try:
        conn.request(method, path, **kw)  # type: ignore[arg-type]
        response = conn.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        conn.close()


def _ms(values: list[float]) -> str:
    if not values:
        return "—"
    return " / ".join(f"{percentile(values, f) * 1000:.1f}" for f in (0.5, 0.99, 1.0))


# -- cases ------------------------------------------------------------------------------


def case_idle(tree: Tree, args: argparse.Namespace) -> CaseResult:
    """No abuse: the prober alone for a few seconds."""

    def attack() -> list[str]:
        time.sleep(3)
        return []

    with (
        tempfile.TemporaryDirectory(prefix="ringo-abuse-") as tmp,
        start_daemon(tree, Path(tmp) / "data") as daemon,
    ):
        return measure(daemon, attack)


def case_scrape(tree: Tree, args: argparse.Namespace) -> CaseResult:
    """50 concurrent scrapers of /metrics at the 1,000-queue label cap."""
    from ringo_trio._proto.ringo.v1 import EnqueueManyRequest, TaskSpec

    async def fill(stub: object, context: object) -> None:
        specs = [TaskSpec(task_type=f"type-{n}") for n in range(3)]
        for q in range(METRIC_QUEUES):
            request = EnqueueManyRequest(context=context, queue=f"queue-{q:04d}", tasks=specs)
            await stub.enqueue_many(request)  # type: ignore[attr-defined]

    with (
        tempfile.TemporaryDirectory(prefix="ringo-abuse-") as tmp,
        start_daemon(tree, Path(tmp) / "data") as daemon,
    ):
        _grpc(daemon.endpoint, fill)
        host = daemon.info["metrics"]
        status, _, body = _http(host, "GET", "/metrics")
        assert status == 200, status
        series = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
        counts = {"ok": 0, "busy": 0, "failed": 0}
        scrape_times: list[float] = []
        stop = threading.Event()

        def scraper() -> None:
            while not stop.is_set():
                started = time.perf_counter()
                try:
                    status, _, _ = _http(host, "GET", "/metrics")
                except OSError:
                    counts["failed"] += 1
                    time.sleep(0.05)
                    continue
                if status == 200:
                    counts["ok"] += 1
                    scrape_times.append(time.perf_counter() - started)
                else:
                    counts["busy"] += 1
                    time.sleep(0.05)

        def attack() -> list[str]:
            threads = [threading.Thread(target=scraper) for _ in range(SCRAPERS)]
            for thread in threads:
                thread.start()
            time.sleep(args.seconds)
            stop.set()
            for thread in threads:
                thread.join()
            return [
                f"{series:,} series, {len(body) / 1e6:.1f} MB a scrape",
                f"{counts['ok']} scrapes answered in {args.seconds:g} s"
                f" (p50 / p99 / max {_ms(scrape_times)} ms),"
                f" {counts['busy']} refused 503, {counts['failed']} failed",
            ]

        return measure(daemon, attack)


def _fill_purge_store(data_dir: Path, tasks: int) -> float:
    """`tasks` SUCCEEDED tasks in queue ``big`` (and 5 PENDING ones), by
    this tree's engine; the seconds it took."""
    from ringo_trio._proto.ringo.v1 import TaskSpec, TaskState
    from ringo_trio.server._clock import Clock
    from ringo_trio.server._main import DB_FILE_NAME
    from ringo_trio.server.storage.sqlite import SQLiteEngine

    data_dir.mkdir(parents=True)

    async def fill() -> None:
        engine = SQLiteEngine(data_dir / DB_FILE_NAME)
        await engine.open()
        try:
            now = Clock().now()
            spec = TaskSpec(task_type="t", payload=b"x" * 100)
            for start in range(0, tasks, 1000):
                await engine.enqueue("big", [spec] * min(1000, tasks - start), now)
            db = engine._db
            assert db is not None
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "UPDATE tasks SET state = ?, finished_at = ? WHERE queue = 'big'",
                (int(TaskState.SUCCEEDED), int(time.time() * 1e6)),
            )
            db.execute("COMMIT")
            await engine.enqueue("big", [TaskSpec(task_type="keep")] * 5, now)
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            await engine.close()

    started = time.perf_counter()
    asyncio.run(fill())
    return time.perf_counter() - started


def case_purge(tree: Tree, args: argparse.Namespace) -> CaseResult:
    """A dashboard purge of --purge-tasks finished tasks, the overview polled meanwhile."""
    template: Path = args.purge_template
    with tempfile.TemporaryDirectory(prefix="ringo-abuse-") as tmp:
        data_dir = Path(tmp) / "data"
        shutil.copytree(template, data_dir)
        with start_daemon(tree, data_dir) as daemon:
            host = daemon.info["ui"].removeprefix("http://")
            status, headers, page = _http(host, "GET", "/queues/big")
            assert status == 200, status
            cookie = headers["set-cookie"].split(";", 1)[0]
            [csrf] = set(re.findall(rb'name="_csrf" value="([^"]*)"', page))
            form = urllib.parse.urlencode({"_csrf": csrf.decode()})
            post_headers = {
                "Cookie": cookie,
                "Content-Type": "application/x-www-form-urlencoded",
            }
            page_times: list[float] = []
            stop = threading.Event()

            def overview() -> None:
                while not stop.is_set():
                    started = time.perf_counter()
                    status, _, _ = _http(host, "GET", "/queues", headers={"Cookie": cookie})
                    if status == 200:
                        page_times.append(time.perf_counter() - started)
                    stop.wait(PAGE_PERIOD)

            def purge() -> tuple[int, int]:
                """(clicks, tasks deleted)"""
                clicks = deleted = 0
                while True:
                    clicks += 1
                    status, headers, _ = _http(
                        host, "POST", "/queues/big/purge", body=form, headers=post_headers
                    )
                    assert status == 303, status
                    location = headers["location"]
                    if "purged=" in location:
                        n = int(location.rpartition("purged=")[2])
                        deleted += n
                        if n < _OLD_CLICK:
                            return clicks, deleted
                        continue
                    # Purging in the background: poll its progress.
                    while True:
                        _, _, part = _http(
                            host, "GET", f"{location}&fragment=purge", headers={"Cookie": cookie}
                        )
                        done = re.search(rb"Deleted (\d+) finished", part)
                        if done:
                            return clicks, int(done.group(1))
                        time.sleep(0.1)

            def attack() -> list[str]:
                poller = threading.Thread(target=overview)
                poller.start()
                started = time.perf_counter()
                try:
                    clicks, deleted = purge()
                finally:
                    stop.set()
                    poller.join()
                took = time.perf_counter() - started
                return [
                    f"{deleted:,} tasks purged in {took:.1f} s, {clicks} click(s);"
                    f" /queues meanwhile p50 / p99 / max {_ms(page_times)} ms"
                    f" ({len(page_times)} fetches)"
                ]

            return measure(daemon, attack)


def case_slow_connections(tree: Tree, args: argparse.Namespace) -> CaseResult:
    """1,000 slow HTTP connections to the dashboard and /metrics. Planned:
    the connection layer's owner writes it (not listed in CASES yet)."""
    raise NotImplementedError


def case_bad_cookies(tree: Tree, args: argparse.Namespace) -> CaseResult:
    """Requests with bad session cookies at the dashboard. Planned: the
    connection layer's owner writes it (not listed in CASES yet)."""
    raise NotImplementedError


CASES: dict[str, Callable[[Tree, argparse.Namespace], CaseResult]] = {
    "idle": case_idle,
    "scrape": case_scrape,
    "purge": case_purge,
}


# -- main --------------------------------------------------------------------------------


@contextlib.contextmanager
def _purge_template(args: argparse.Namespace, cases: list[str]) -> Iterator[None]:
    if "purge" not in cases:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="ringo-abuse-store-") as tmp:
        args.purge_template = Path(tmp) / "data"
        took = _fill_purge_store(args.purge_template, args.purge_tasks)
        print(f"filled {args.purge_tasks:,} finished tasks in {took:.0f} s", flush=True)
        yield


def main() -> None:
    if sys.argv[1:2] == ["--probe"]:
        with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
            asyncio.run(_probe_loop(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--baseline-tree", type=Path, help="also run this tree's ringod")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0, help="scrape case length")
    parser.add_argument("--purge-tasks", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path, help="also write the samples here")
    args = parser.parse_args()
    cases = args.cases.split(",")
    trees = [Tree("current", None)]
    if args.baseline_tree is not None:
        trees.insert(0, Tree(f"baseline ({args.baseline_tree})", args.baseline_tree.resolve()))
    rows = []
    dump: dict[str, dict[str, list[float]]] = {}
    with _purge_template(args, cases):
        for name in cases:
            for tree in trees:
                print(f"{name} on {tree.name} ...", flush=True)
                result = CASES[name](tree, args)
                print(f"  health p50 / p99 / max {_ms(result.latencies)} ms", flush=True)
                for note in result.notes:
                    print(f"  {note}", flush=True)
                rows.append((name, tree.name, result))
                dump.setdefault(name, {})[tree.name] = result.latencies
    if args.json is not None:
        args.json.write_text(json.dumps(dump))
    print()
    print("| case | daemon | health p50 / p99 / max (ms) | calls | notes |")
    print("| --- | --- | --- | ---: | --- |")
    for name, tree_name, result in rows:
        notes = "; ".join(result.notes)
        figures = f"{_ms(result.latencies)} | {len(result.latencies)}"
        print(f"| {name} | {tree_name} | {figures} | {notes} |")


if __name__ == "__main__":
    main()
