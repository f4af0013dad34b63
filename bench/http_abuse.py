"""gRPC health-check latency while the daemon's HTTP side is abused.

    python bench/http_abuse.py [--baseline-tree DIR] [--only CASE[,CASE]]
                               [--seconds 10] [--purge-tasks 1000000] [--slow 1000]

Each case starts its own ``ringod`` (SQLite in a temporary data dir) with
``--metrics-listen`` and ``--ui-listen``, and a *prober*: a separate process
(this file with ``--probe``) that calls ``grpc.health.v1.Health/Check`` on
one connection, one call every ~10 ms, and reports each call's start and
latency. The samples taken while the case's abuse ran are the case's
figures (p50 / p99 / max); the target is a health p99 under 50 ms.

Cases (one function each, ``case_<name>``, returning a `CaseResult`;
``--only`` picks some, in the order given; ``--cases`` is its old name):

* ``idle``: nothing happens (the yardstick).
* ``scrape``: 1,000 queues (the metrics' label cap) of 3 tasks of 3 task
  types each, so a scrape is ~115,000 series and ~9.5 MB; then 50 threads
  scrape ``/metrics`` in a loop for ``--seconds`` (a refused one, 503 past
  the responder's connection caps, waits 50 ms before the next).
* ``purge``: ``--purge-tasks`` SUCCEEDED tasks in one queue (the data dir is
  filled once, by the engine in this process, and copied for each run); the
  dashboard's purge button is pressed (a POST with the session's CSRF
  token) until the queue has no finished task left -- a tree whose click
  deletes at most 100,000 is clicked again, one that purges in the
  background is polled on its progress fragment -- while a second thread
  fetches the overview page (``/queues``) every 200 ms, whose times are
  reported too.
* ``slow_connections``: ``--slow`` connections (1,000; half to the
  dashboard, half to ``/metrics``) from 127.0.0.2, each sending a request
  head a byte a second (slowloris) and, once the daemon closes it (408, or
  503 over a cap), opening again 0.5 s later. After 3 s of that, for
  ``--seconds``, a browser-like client at 127.0.0.1 fetches ``/queues``
  every 200 ms and a scraper there ``/metrics`` (5 s timeout each): how
  many are answered 200, 503, or not at all.
* ``bad_cookies``: 8 threads at 127.0.0.1 send ``GET /queues`` with a
  session cookie whose signature holds a non-ASCII character
  (``x.9999999999.café``, the shape that reached the signature check) as
  fast as they are answered, for ``--seconds``: the statuses, and how many
  bytes a second the daemon's log (its stderr) grew.

``--baseline-tree DIR`` runs every case on the daemon of another source
tree too (e.g. ``git worktree add --detach /tmp/base 48054ad``), started
through ``bench/_tree.py`` so it imports that tree only; the prober and the
abusers always run this tree's code. Prints a Markdown table.

Adding a case: write ``case_<name>(tree, args) -> CaseResult`` that starts
a daemon (`fresh_daemon`, or `start_daemon` on a data dir of its own), sets
up, and returns ``measure(daemon, attack)`` for its attack, then list it in
`CASES`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
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
ATTACKER = "127.0.0.2"
# The slow connections' head before the byte a second; {path} and {host} filled in.
_SLOW_HEAD = "GET {path} HTTP/1.1\r\nHost: {host}\r\nX-Slow: "
BROWSER_HEADERS = {
    "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) ringo-bench",
    "Accept": "text/html,application/xhtml+xml",
}
COOKIE_THREADS = 8
BAD_COOKIE = "ringo_session=x.9999999999.café"


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


@contextlib.contextmanager
def fresh_daemon(tree: Tree) -> Iterator[DaemonProcess]:
    """`start_daemon` on an empty data dir, removed afterwards."""
    with (
        tempfile.TemporaryDirectory(prefix="ringo-abuse-") as tmp,
        start_daemon(tree, Path(tmp) / "data") as daemon,
    ):
        yield daemon


def ui_host(daemon: DaemonProcess) -> str:
    return str(daemon.info["ui"]).removeprefix("http://")


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


def _http(
    host: str, method: str, path: str, *, timeout: float = 120, **kw: object
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(host, timeout=timeout)
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


def _counts(counts: Counter[str]) -> str:
    return ", ".join(f"{n:,} x {key}" for key, n in sorted(counts.items())) or "none"


class Tally:
    """Outcomes counted by several threads (``Counter[key] += 1`` is not atomic)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1


def in_threads(count: int, work: Callable[[threading.Event], None], seconds: float) -> float:
    """`work(stop)` in `count` threads for `seconds`; the seconds it took."""
    stop = threading.Event()
    threads = [threading.Thread(target=work, args=(stop,)) for _ in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    try:
        time.sleep(seconds)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    return time.perf_counter() - started


class Poller:
    """A thread fetching ``GET path`` every PAGE_PERIOD while in its ``with``:
    the statuses (or the error that came instead) and the 200s' times."""

    def __init__(
        self, host: str, path: str, headers: dict[str, str] | None = None, timeout: float = 5.0
    ) -> None:
        self.outcomes = Tally()
        self.times: list[float] = []
        self._request = (host, path, headers or {}, timeout)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        host, path, headers, timeout = self._request
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                status, _, _ = _http(host, "GET", path, timeout=timeout, headers=headers)
            except OSError as exc:
                self.outcomes.add(type(exc).__name__)
            else:
                self.outcomes.add(str(status))
                if status == 200:
                    self.times.append(time.perf_counter() - started)
            self._stop.wait(PAGE_PERIOD)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> str:
        return f"{_counts(self.outcomes.counts)} (200s p50 / p99 / max {_ms(self.times)} ms)"


# -- cases ------------------------------------------------------------------------------


def case_idle(tree: Tree, args: argparse.Namespace) -> CaseResult:
    """No abuse: the prober alone for a few seconds."""

    def attack() -> list[str]:
        time.sleep(3)
        return []

    with fresh_daemon(tree) as daemon:
        return measure(daemon, attack)


def case_scrape(tree: Tree, args: argparse.Namespace) -> CaseResult:
    """50 concurrent scrapers of /metrics at the 1,000-queue label cap."""
    from ringo_trio._proto.ringo.v1 import EnqueueManyRequest, TaskSpec

    async def fill(stub: object, context: object) -> None:
        specs = [TaskSpec(task_type=f"type-{n}") for n in range(3)]
        for q in range(METRIC_QUEUES):
            request = EnqueueManyRequest(context=context, queue=f"queue-{q:04d}", tasks=specs)
            await stub.enqueue_many(request)  # type: ignore[attr-defined]

    with fresh_daemon(tree) as daemon:
        _grpc(daemon.endpoint, fill)
        host = daemon.info["metrics"]
        status, _, body = _http(host, "GET", "/metrics")
        assert status == 200, status
        series = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
        counts = Tally()
        scrape_times: list[float] = []

        def scraper(stop: threading.Event) -> None:
            while not stop.is_set():
                started = time.perf_counter()
                try:
                    status, _, _ = _http(host, "GET", "/metrics")
                except OSError:
                    counts.add("failed")
                    time.sleep(0.05)
                    continue
                if status == 200:
                    counts.add("ok")
                    scrape_times.append(time.perf_counter() - started)
                else:
                    counts.add("busy")
                    time.sleep(0.05)

        def attack() -> list[str]:
            in_threads(SCRAPERS, scraper, args.seconds)
            seen = counts.counts
            return [
                f"{series:,} series, {len(body) / 1e6:.1f} MB a scrape",
                f"{seen['ok']} scrapes answered in {args.seconds:g} s"
                f" (p50 / p99 / max {_ms(scrape_times)} ms),"
                f" {seen['busy']} refused 503, {seen['failed']} failed",
            ]

        return measure(daemon, attack)


def _fill_purge_store(data_dir: Path, tasks: int) -> float:
    """`tasks` SUCCEEDED tasks in queue ``big`` (and 5 PENDING ones), by
    this tree's engine; the seconds it took."""
    from ringo_trio._proto.ringo.v1 import TaskSpec, TaskState
    from ringo_trio.server.clock import Clock
    from ringo_trio.server.flags import DB_FILE_NAME
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
            host = ui_host(daemon)
            status, headers, page = _http(host, "GET", "/queues/big")
            assert status == 200, status
            cookie = headers["set-cookie"].split(";", 1)[0]
            [csrf] = set(re.findall(rb'name="_csrf" value="([^"]*)"', page))
            form = urllib.parse.urlencode({"_csrf": csrf.decode()})
            post_headers = {
                "Cookie": cookie,
                "Content-Type": "application/x-www-form-urlencoded",
            }

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
                # The before tree held the loop ~3 s a click: a long timeout,
                # so the overview's times say how long it waited.
                with Poller(host, "/queues", {"Cookie": cookie}, timeout=120) as overview:
                    started = time.perf_counter()
                    clicks, deleted = purge()
                    took = time.perf_counter() - started
                return [
                    f"{deleted:,} tasks purged in {took:.1f} s, {clicks} click(s);"
                    f" /queues meanwhile p50 / p99 / max {_ms(overview.times)} ms"
                    f" ({len(overview.times)} fetches)"
                ]

            return measure(daemon, attack)


async def _slowloris(
    targets: list[tuple[str, str]], count: int, stop: threading.Event, seen: Tally
) -> None:
    """`count` connections from ATTACKER, spread over `targets` ((host:port,
    path)), trickling a request head a byte a second, reopened when closed;
    `seen` counts how each ended (its status, what came instead, or that it
    was still open when `stop` was set)."""

    async def one(host: str, path: str) -> None:
        address, _, port = host.rpartition(":")
        head = _SLOW_HEAD.format(path=path, host=host).encode()
        while not stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(address, int(port), local_addr=(ATTACKER, 0)), 5
                )
            except (OSError, TimeoutError):
                seen.add(f"{path} connect failed")
                await asyncio.sleep(0.5)
                continue
            try:
                writer.write(head)
                while not stop.is_set():
                    try:
                        answer = await asyncio.wait_for(reader.read(64), 1.0)
                    except TimeoutError:
                        writer.write(b"a")
                        continue
                    status = answer[9:12].decode("latin-1") if answer[:5] == b"HTTP/" else ""
                    seen.add(f"{path} {status or 'closed silently'}")
                    break
                else:
                    seen.add(f"{path} still open at the end")
            except OSError:
                seen.add(f"{path} reset")
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            await asyncio.sleep(0.5)

    async with asyncio.TaskGroup() as tg:
        for n in range(count):
            tg.create_task(one(*targets[n % len(targets)]))


def case_slow_connections(tree: Tree, args: argparse.Namespace) -> CaseResult:
    """--slow slowloris connections from ATTACKER, a browser and a scraper at 127.0.0.1."""
    with fresh_daemon(tree) as daemon:
        ui, metrics = ui_host(daemon), str(daemon.info["metrics"])

        def attack() -> list[str]:
            stop = threading.Event()
            seen = Tally()
            targets = [(ui, "/queues"), (metrics, "/metrics")]
            attacker = threading.Thread(
                target=lambda: asyncio.run(_slowloris(targets, args.slow, stop, seen))
            )
            attacker.start()
            try:
                time.sleep(3)  # let the connections pile up
                with (
                    Poller(ui, "/queues", BROWSER_HEADERS) as browser,
                    Poller(metrics, "/metrics") as scraper,
                ):
                    time.sleep(args.seconds)
            finally:
                stop.set()
                attacker.join()
            return [
                f"browser /queues: {browser.summary()}",
                f"scraper /metrics: {scraper.summary()}",
                f"{args.slow:,} slow connections: {_counts(seen.counts)}",
            ]

        return measure(daemon, attack)


def case_bad_cookies(tree: Tree, args: argparse.Namespace) -> CaseResult:
    """COOKIE_THREADS threads sending a non-ASCII session cookie as fast as answered."""
    with fresh_daemon(tree) as daemon:
        host = ui_host(daemon)
        address, _, port = host.rpartition(":")
        request = (
            f"GET /queues HTTP/1.1\r\nHost: {host}\r\nCookie: {BAD_COOKIE}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        statuses = Tally()

        def flood(stop: threading.Event) -> None:
            while not stop.is_set():
                try:
                    with socket.create_connection((address, int(port)), timeout=5) as s:
                        s.sendall(request)
                        answer = s.recv(64)
                    statuses.add(answer[9:12].decode("latin-1") or "closed")
                except OSError as exc:
                    statuses.add(type(exc).__name__)

        def log_bytes() -> int:
            return len(daemon.stderr_text().encode())

        def attack() -> list[str]:
            before = log_bytes()
            took = in_threads(COOKIE_THREADS, flood, args.seconds)
            grown = log_bytes() - before
            total = sum(statuses.counts.values())
            return [
                f"{total / took:,.0f} requests/s: {_counts(statuses.counts)}",
                f"log grew {grown / took / 1e3:,.1f} kB/s ({grown / 1e3:,.0f} kB)",
            ]

        return measure(daemon, attack)


CASES: dict[str, Callable[[Tree, argparse.Namespace], CaseResult]] = {
    case.__name__.removeprefix("case_"): case
    for case in (case_idle, case_scrape, case_purge, case_slow_connections, case_bad_cookies)
}


# -- main --------------------------------------------------------------------------------


def case_names(text: str) -> list[str]:
    """The cases ``--only`` names, in its order (ValueError for an unknown one)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CASES]
    if unknown or not names:
        raise ValueError(
            f"unknown case(s) {', '.join(unknown) or '(none)'}; known: {', '.join(CASES)}"
        )
    return names


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
    parser.add_argument(
        "--only",
        "--cases",
        dest="only",
        metavar="CASE[,CASE]",
        default=",".join(CASES),
        help=f"the cases to run, in this order (default: all, {','.join(CASES)})",
    )
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="length of the scrape, slow and cookie abuse"
    )
    parser.add_argument("--purge-tasks", type=int, default=1_000_000)
    parser.add_argument("--slow", type=int, default=1000, help="slow connections")
    parser.add_argument("--json", type=Path, help="also write the samples here")
    args = parser.parse_args()
    try:
        cases = case_names(args.only)
    except ValueError as exc:
        parser.error(str(exc))
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
