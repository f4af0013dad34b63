"""The peer: huey on SQLite at our durability level, run the way the issue
names it ("Performance is a ratio": ``bench/run.py`` runs this next to our
Worker rows and reports ringo_trio / huey).

    python bench/peer_huey.py [--tasks 10000] [--threads 16] [--sleep 0.010]
    python bench/peer_huey.py --latency [--tasks 200] [--threads 16]

Theory of operation.

* Storage: ``SqliteHuey`` on a file in a temporary directory, WAL (huey's
  default) and ``synchronous=NORMAL`` like ``ringod``. huey itself only
  offers ``fsync=True`` (FULL) or ``False`` (OFF), and leaves SQLite's
  default (FULL) when unset, so `_NormalStorage` sets NORMAL on each of
  huey's per-thread connections after huey's own pragmas.
* This process enqueues N tasks (one ``task()`` call each: huey has no batch
  enqueue), THEN starts ONE consumer process (huey's ``Consumer``, thread
  workers, the same object ``huey_consumer`` builds; its logging is left
  unconfigured, so the per-task INFO lines cost nothing), as our Worker rows
  pre-enqueue before the worker starts.
* Completions are counted in the consumer by a ``SIGNAL_COMPLETE`` handler,
  which huey calls in the worker thread after the task ran and its result
  bookkeeping was done. The handler is one ``next()`` on an
  ``itertools.count`` (atomic under the GIL); only the 1st and the Nth
  completion write a line to stdout. The rate is the steady rate from the
  first completion to the last, (N - 1) / (t_N - t_1), so the consumer's
  start-up is not in it.
* CPU: the consumer's own CPU seconds (``time.process_time()``, user + system
  of all its threads: the same counters as /proc/PID/stat) between the 1st
  and the Nth completion. huey has no daemon: SQLite runs inside the
  consumer, so this is the whole peer's CPU, to be read next to our worker +
  daemon CPU. Peak RSS is the consumer's VmHWM (`bench/_proc.py`).
* After the Nth completion the parent stops the consumer (SIGTERM) and checks
  that the queue is empty.

Latency at low load (``latency``, next to our idle-worker latency row): the
consumer starts first (16 threads, huey's default polling: 0.1 s, backing
off x1.15 per empty poll up to 10 s, the same as ``huey_consumer``'s
defaults), says it is ready, is left idle for the same second as our worker,
then this process enqueues the tasks one at a time with a gap; each task
carries ``time.time()`` taken just before its enqueue and the task records
``time.time()`` minus that when it STARTS. The consumer reports all of them
after the Nth; p50 and p99 as ours (``_stats.percentile``).

The task module must have the same name in both processes (huey keys its
task registry by module and function name), hence the consumer is started as
``python -c "import peer_huey; ..."``, never as ``__main__``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import _proc
import _stats

HERE = pathlib.Path(__file__).resolve().parent


# The consumer's latency recorder (`consume_latency` sets it).
_stamped: list[float] = []


def _huey(filename: str, sleep: float) -> tuple[Any, Any, Any]:
    """A SqliteHuey on `filename` (WAL, synchronous=NORMAL), its no-op or
    sleeping task and its latency task."""
    from huey import SqliteHuey
    from huey.storage import SqliteStorage

    class _NormalStorage(SqliteStorage):  # type: ignore[misc]
        def _create_connection(self) -> Any:
            conn = super()._create_connection()
            conn.execute("pragma synchronous=NORMAL")
            return conn

    huey = SqliteHuey("bench", filename=filename, storage_class=_NormalStorage)

    @huey.task(name="work")  # type: ignore[untyped-decorator]
    def work() -> None:
        if sleep:
            time.sleep(sleep)

    @huey.task(name="stamp")  # type: ignore[untyped-decorator]
    def stamp(sent: float) -> None:
        _stamped.append(time.time() - sent)  # list.append: atomic under the GIL

    return huey, work, stamp


def consume(filename: str, expect: int, threads: int, sleep: float) -> None:
    """The consumer process: run huey's consumer until stopped, reporting the
    1st and the `expect`th completion on stdout."""
    from huey.signals import SIGNAL_COMPLETE

    huey, _, _ = _huey(filename, sleep)
    counter = itertools.count(1)

    def report(event: str) -> None:
        line = {"event": event, "t": time.perf_counter(), "cpu": time.process_time()}
        if event == "done":
            line["peak_rss_kb"] = _proc.peak_rss_kb()
        os.write(1, (json.dumps(line) + "\n").encode())

    @huey.signal(SIGNAL_COMPLETE)  # type: ignore[untyped-decorator]
    def completed(signal_name: str, task: Any) -> None:
        n = next(counter)
        if n == 1:
            report("first")
        if n == expect:
            report("done")

    huey.create_consumer(workers=threads, worker_type="thread").run()


@dataclass
class PeerRun:
    tasks: int
    threads: int
    sleep: float
    enqueue_rate: float  # tasks/s, one task() call each
    elapsed: float  # 1st completion → Nth completion
    cpu: float  # consumer CPU seconds over the same span
    peak_rss_mb: float

    @property
    def rate(self) -> float:
        """The steady rate: completions after the first over the time they took."""
        return (self.tasks - 1) / self.elapsed

    @property
    def cpu_per_1000(self) -> float:
        return self.cpu * 1000 / (self.tasks - 1)


def _read_line(fd: int, buffer: bytearray, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                raise TimeoutError(f"the huey consumer said nothing for {timeout:g}s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the huey consumer exited")
            buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    result: dict[str, Any] = json.loads(line)
    return result


def run(tasks: int, threads: int, sleep: float) -> PeerRun:
    """Enqueue `tasks`, then one consumer process with `threads` thread
    workers handles them; measured as the module docstring says."""
    if tasks < 2:
        raise ValueError("a steady rate needs at least 2 tasks")
    with tempfile.TemporaryDirectory(prefix="ringo-bench-huey-") as tmp:
        filename = str(pathlib.Path(tmp) / "huey.db")
        huey, work, _ = _huey(filename, sleep)
        t0 = time.perf_counter()
        for _ in range(tasks):
            work()
        enqueue_rate = tasks / (time.perf_counter() - t0)
        code = (
            "import sys, peer_huey; a = sys.argv;"
            " peer_huey.consume(a[1], int(a[2]), int(a[3]), float(a[4]))"
        )
        env = {**os.environ, "PYTHONPATH": str(HERE)}
        proc = subprocess.Popen(
            [sys.executable, "-c", code, filename, str(tasks), str(threads), repr(sleep)],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None
        try:
            buffer = bytearray()
            first = _read_line(proc.stdout.fileno(), buffer, 120)
            assert first["event"] == "first", first
            done = _read_line(proc.stdout.fileno(), buffer, 600)
            assert done["event"] == "done", done
        finally:
            _proc.stop(proc)
        left = huey.pending_count()
        if left:
            raise RuntimeError(f"huey: {left} task(s) still queued after {tasks} completions")
    return PeerRun(
        tasks=tasks,
        threads=threads,
        sleep=sleep,
        enqueue_rate=enqueue_rate,
        elapsed=done["t"] - first["t"],  # for the steady rate: (tasks - 1) / elapsed
        cpu=done["cpu"] - first["cpu"],
        peak_rss_mb=done["peak_rss_kb"] / 1024,
    )


def consume_latency(filename: str, expect: int, threads: int) -> None:
    """The consumer process of `latency`: says it is ready, then reports the
    latencies of the first `expect` stamp tasks."""
    from huey.signals import SIGNAL_COMPLETE

    huey, _, _ = _huey(filename, 0.0)
    counter = itertools.count(1)

    @huey.signal(SIGNAL_COMPLETE)  # type: ignore[untyped-decorator]
    def completed(signal_name: str, task: Any) -> None:
        if next(counter) == expect:
            line = {"event": "done", "latencies": list(_stamped)}
            os.write(1, (json.dumps(line) + "\n").encode())

    consumer = huey.create_consumer(workers=threads, worker_type="thread")
    os.write(1, b'{"event": "ready"}\n')
    consumer.run()


@dataclass
class LatencyRun:
    tasks: int
    threads: int
    p50: float  # seconds, enqueue (just before the call) -> the task's start
    p99: float


def latency(tasks: int, threads: int, gap: float, idle: float = 1.0) -> LatencyRun:
    """Enqueue→start latency at low load, as the module docstring says."""
    with tempfile.TemporaryDirectory(prefix="ringo-bench-huey-") as tmp:
        filename = str(pathlib.Path(tmp) / "huey.db")
        _, _, stamp = _huey(filename, 0.0)  # creates the file and its tables
        code = (
            "import sys, peer_huey; a = sys.argv;"
            " peer_huey.consume_latency(a[1], int(a[2]), int(a[3]))"
        )
        env = {**os.environ, "PYTHONPATH": str(HERE)}
        proc = subprocess.Popen(
            [sys.executable, "-c", code, filename, str(tasks), str(threads)],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None
        try:
            buffer = bytearray()
            ready = _read_line(proc.stdout.fileno(), buffer, 60)
            assert ready["event"] == "ready", ready
            time.sleep(idle)
            for _ in range(tasks):
                stamp(time.time())
                time.sleep(gap)
            done = _read_line(proc.stdout.fileno(), buffer, 120)
            assert done["event"] == "done", done
        finally:
            _proc.stop(proc)
    values = done["latencies"]
    return LatencyRun(
        tasks=len(values),
        threads=threads,
        p50=_stats.percentile(values, 0.50),
        p99=_stats.percentile(values, 0.99),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--sleep", type=float, default=0.0, help="handler sleep, seconds")
    parser.add_argument("--latency", action="store_true", help="enqueue→start at low load")
    parser.add_argument("--gap", type=float, default=0.005, help="with --latency: seconds")
    args = parser.parse_args()
    if args.latency:
        lat = latency(args.tasks, args.threads, args.gap)
        print(
            f"huey, {lat.threads} threads, {lat.tasks} tasks {args.gap * 1000:g} ms apart:"
            f" enqueue→start p50 {lat.p50 * 1000:.1f} ms, p99 {lat.p99 * 1000:.1f} ms"
        )
        return
    result = run(args.tasks, args.threads, args.sleep)
    print(
        f"huey, {result.threads} threads, sleep {result.sleep * 1000:g} ms,"
        f" {result.tasks:,} tasks: {result.rate:,.0f} tasks/s steady"
        f" ({result.elapsed:.2f} s), consumer CPU {result.cpu_per_1000:.3f} s per 1,000,"
        f" peak RSS {result.peak_rss_mb:.1f} MB; enqueue {result.enqueue_rate:,.0f} tasks/s"
    )


if __name__ == "__main__":
    # As `peer_huey`, not `__main__`: the consumer imports the task by that name.
    import peer_huey

    peer_huey.main()
