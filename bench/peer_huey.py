"""The peer: huey on SQLite at our durability level, run the way the issue
names it ("Performance is a ratio": ``bench/run.py`` runs this next to our
Worker rows and reports ringo_trio / huey).

    python bench/peer_huey.py [--tasks 10000] [--threads 16] [--sleep 0.010]

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

HERE = pathlib.Path(__file__).resolve().parent


def _huey(filename: str, sleep: float) -> tuple[Any, Any]:
    """A SqliteHuey on `filename` (WAL, synchronous=NORMAL) and its one task."""
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

    return huey, work


def consume(filename: str, expect: int, threads: int, sleep: float) -> None:
    """The consumer process: run huey's consumer until stopped, reporting the
    1st and the `expect`th completion on stdout."""
    from huey.signals import SIGNAL_COMPLETE

    huey, _ = _huey(filename, sleep)
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
        huey, work = _huey(filename, sleep)
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
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        left = huey.pending_count()
        if left:
            raise RuntimeError(f"huey: {left} task(s) still queued after {tasks} completions")
    return PeerRun(
        tasks=tasks,
        threads=threads,
        sleep=sleep,
        enqueue_rate=enqueue_rate,
        elapsed=done["t"] - first["t"],
        cpu=done["cpu"] - first["cpu"],
        peak_rss_mb=done["peak_rss_kb"] / 1024,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--sleep", type=float, default=0.0, help="handler sleep, seconds")
    args = parser.parse_args()
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
