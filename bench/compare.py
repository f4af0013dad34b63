"""Two trees side by side: ``bench/run.py --baseline REV`` (and ``--only``).

Theory of operation. A performance claim about a change ("throughput not
lower than before") is a ratio, and on a shared machine it only holds when
both sides are measured in the same run, under the same noise:

* REV is materialised with ``git worktree add --detach`` in a temporary
  directory and removed afterwards, also when the run fails or is
  interrupted (SIGINT, SIGTERM).
* Both sides run THIS tree's bench code (``bench/run.py``, ``bench/worker.py``)
  from the same venv; only the library under test differs. Every process of a
  side starts through ``bench/_tree.py``, which makes it import ``ringo_trio``
  from that side's tree and logs the file it came from; the run checks the log
  and prints which file each kind of process (bench, daemon, worker) imported.
  The bench code must be able to drive REV's API (``Ringo.connect``,
  ``Queue.worker``, ``enqueue_many``, ``ringo_trio.testing``): a REV too old
  for it fails loudly, not silently.
* Each measurement is one child process (``run.py --tree-child NAME``) with a
  fresh daemon. For every selected benchmark the sides alternate round by
  round, and the order flips every round (baseline, current, current,
  baseline, ...), so that slow drifts of the machine and any advantage of going
  first or second hit both sides alike.
* A cell is the median over the rounds, with min-max; the ratio is
  current / baseline of the medians. Whether higher is better is part of each
  metric's name.

The formatting helpers here are pure (tests/test_bench_tools.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import _tree

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RUN = HERE / "run.py"
HEADING = "## Comparing two trees"
# What `--only` picks from (run.py measures them): the no-op and the 10 ms
# Worker runs, enqueue_many alone, the unary rows, the PostgreSQL scale-out.
# "huey" is the peer (bench/peer_huey.py): current tree only, never with --baseline.
BENCHMARK_NAMES = ("noop", "sleep", "enqueue_many", "unary", "postgres", "huey")
PEER_HEADING = "## Against huey"


# -- formatting (pure) -------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # "tasks/s", "calls/s", "s", "MB"
    higher_is_better: bool

    @property
    def label(self) -> str:
        better = "higher" if self.higher_is_better else "lower"
        return f"{self.name} ({self.unit}, {better} is better)"


def format_value(value: float, unit: str) -> str:
    """Rates as whole numbers with thousands separators, seconds to the
    millisecond, megabytes to one decimal."""
    if unit.endswith("/s"):
        return f"{value:,.0f}"
    if unit == "s":
        return f"{value:.3f}"
    return f"{value:,.1f}"


def cell(values: Sequence[float], unit: str) -> str:
    """The median of the rounds, and their range when there is more than one."""
    middle = format_value(statistics.median(values), unit)
    if len(values) < 2:
        return middle
    return f"{middle} ({format_value(min(values), unit)}-{format_value(max(values), unit)})"


def ratio(current: Sequence[float], baseline: Sequence[float]) -> str:
    """current / baseline of the medians, to two decimals ("n/a" when undefined)."""
    below = statistics.median(baseline)
    if below == 0:
        return "n/a"
    return f"{statistics.median(current) / below:.2f}"


def table(metrics: Sequence[Metric], runs: dict[str, dict[str, list[float]]]) -> str:
    """Markdown: metric, baseline, current, ratio (current / baseline); metric
    and current only when `runs` has no "baseline" side."""
    current = runs["current"]
    baseline = runs.get("baseline")
    if baseline is None:
        lines = ["| metric | current |", "| --- | --- |"]
        lines += [f"| {m.label} | {cell(current[m.name], m.unit)} |" for m in metrics]
    else:
        lines = [
            "| metric | baseline | current | ratio (current / baseline) |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {m.label} | {cell(baseline[m.name], m.unit)} | {cell(current[m.name], m.unit)}"
            f" | {ratio(current[m.name], baseline[m.name])} |"
            for m in metrics
        ]
    return "\n".join(lines) + "\n"


def peer_table(pairs: dict[str, str], current: dict[str, list[float]]) -> str:
    """Markdown: one row per (peer metric -> our metric) pair measured in this
    run: our median, the peer's, and ours / theirs of the medians."""
    lines = [
        "| ratio | ringo_trio | peer | ringo_trio / peer |",
        "| --- | --- | --- | --- |",
    ]
    for peer, ours in pairs.items():
        if peer in current and ours in current:
            lines.append(
                f"| {ours} / {peer} | {cell(current[ours], 'tasks/s')}"
                f" | {cell(current[peer], 'tasks/s')} | {ratio(current[ours], current[peer])} |"
            )
    return "\n".join(lines) + "\n"


def role(argv: Sequence[str]) -> str:
    """Which bench process a `_tree` import-log line is about."""
    if argv[:2] == ["-m", "ringo_trio.server"]:
        return "daemon"
    if (argv and argv[0].endswith("worker.py")) or "--scaleout-worker" in argv:
        return "worker"
    return "bench"


# -- the two trees -----------------------------------------------------------------


@dataclass
class Side:
    label: str  # "baseline" or "current"
    tree: pathlib.Path
    revision: str  # what was asked for and what it is
    imports_log: pathlib.Path
    imported: dict[str, set[str]] = field(default_factory=dict)  # role -> files


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _current_revision() -> str:
    head = _git("rev-parse", "--short=12", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}{' + uncommitted changes' if dirty else ''}"


@contextmanager
def worktree(rev: str) -> Iterator[tuple[pathlib.Path, str]]:
    """REV checked out (detached) in a temporary directory, removed on exit."""
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="ringo-bench-baseline-"))
    path = scratch / "tree"
    try:
        _git("worktree", "add", "--quiet", "--detach", str(path), sha)
        # The current tree has its bytecode cached already; the first run on
        # this side would otherwise pay for compiling it.
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(path / "ringo_trio")], check=True
        )
        yield path, sha
    finally:
        # --force: the run leaves __pycache__ directories in it.
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(scratch, ignore_errors=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the worktree and the children go too."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _measure(side: Side, name: str, options: Sequence[str]) -> list[dict[str, Any]]:
    """One child process: benchmark `name` once on `side`'s tree."""
    env = {
        **os.environ,
        "PYTHONPATH": str(side.tree),
        _tree.IMPORTS_ENV: str(side.imports_log),
    }
    command = [
        sys.executable,
        _tree.BOOTSTRAP,
        str(side.tree),
        str(RUN),
        "--tree-child",
        name,
        *options,
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, env=env, cwd=side.tree)
    try:
        out, _ = proc.communicate()
    except BaseException:
        # On Ctrl-C the child got the SIGINT too; otherwise tell it, so it
        # stops its daemon and worker itself before it is killed.
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise
    if proc.returncode != 0:
        raise SystemExit(f"{side.label}: `{name}` failed (exit status {proc.returncode})")
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    metrics: list[dict[str, Any]] = json.loads(lines[-1])["metrics"]
    return metrics


def _check_imports(side: Side) -> None:
    """Every process of `side` so far imported ringo_trio from its tree (which
    _tree already enforces); note which file each kind of process used."""
    prefix = str(side.tree / "ringo_trio") + os.sep
    for line in side.imports_log.read_text().splitlines():
        entry = json.loads(line)
        if not entry["ringo_trio"].startswith(prefix):
            raise SystemExit(f"{side.label}: a process imported {entry['ringo_trio']}")
        side.imported.setdefault(role(entry["argv"]), set()).add(entry["ringo_trio"])


def compare(
    baseline: str | None, names: Sequence[str], rounds: int, options: Sequence[str], sizes: str
) -> str:
    """Run `names` on the current tree (and on `baseline`), interleaved, and
    return the markdown section: how it was run, which files each side
    imported, the table."""
    load_before = os.getloadavg()[0]
    with ExitStack() as stack:
        logs = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ringo-bench-")))
        stack.enter_context(_sigterm_interrupts())
        sides = [Side("current", ROOT, _current_revision(), logs / "current.jsonl")]
        if baseline is not None:
            tree, sha = stack.enter_context(worktree(baseline))
            revision = sha[:12] if sha.startswith(baseline) else f"`{baseline}` = {sha[:12]}"
            # What the ratios are about: the library's own changes.
            changes = _git("diff", "--shortstat", sha, "--", "ringo_trio")
            revision += (
                f" (`ringo_trio/` vs current: {changes})"
                if changes
                else " (`ringo_trio/` identical to current: the ratios show this machine's noise)"
            )
            sides.insert(0, Side("baseline", tree, revision, logs / "baseline.jsonl"))
        for side in sides:
            side.imports_log.touch()
        metrics: dict[str, Metric] = {}
        runs: dict[str, dict[str, list[float]]] = {side.label: {} for side in sides}
        pairs: dict[str, str] = {}  # a peer's metric -> ours it is compared with
        # Rounds outside: each round runs every benchmark once, so ours and
        # the peer's alternate (noop, sleep, huey, noop, ...) under the same noise.
        for index in range(rounds):
            for name in names:
                for side in sides if index % 2 == 0 else sides[::-1]:
                    t0 = time.perf_counter()
                    measured = _measure(side, name, options)
                    _check_imports(side)
                    for item in measured:
                        metric = Metric(item["name"], item["unit"], item["higher_is_better"])
                        metrics.setdefault(metric.name, metric)
                        runs[side.label].setdefault(metric.name, []).append(item["value"])
                        if "versus" in item:
                            pairs[metric.name] = item["versus"]
                    first = measured[0]
                    print(
                        f"{name}, round {index + 1}/{rounds}, {side.label}:"
                        f" {format_value(first['value'], first['unit'])} {first['unit']}"
                        f" ({time.perf_counter() - t0:.0f} s)",
                        flush=True,
                    )
    load = (load_before, os.getloadavg()[0])
    return _section(sides, list(metrics.values()), runs, rounds, sizes, load, pairs)


def _section(
    sides: Sequence[Side],
    metrics: Sequence[Metric],
    runs: dict[str, dict[str, list[float]]],
    rounds: int,
    sizes: str,
    load: tuple[float, float],
    pairs: dict[str, str],
) -> str:
    revisions = "; ".join(f"{side.label} {side.revision}" for side in sides)
    imports = []
    for side in sides:
        by_file: dict[str, list[str]] = {}
        for role, files in sorted(side.imported.items()):
            for file in files:
                by_file.setdefault(file, []).append(role)
        imports += [f"* {side.label}: `{f}` ({', '.join(r)})" for f, r in by_file.items()]
    machine = (
        f"{os.cpu_count()} cores (os.cpu_count()), {platform.python_implementation()}"
        f" {platform.python_version()}, {platform.machine()}; {rounds} round(s), {sizes}."
        f" Load average (1 min) {load[0]:.1f} before, {load[1]:.1f} after"
    )
    when = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    if pairs:
        lines = [
            PEER_HEADING,
            "",
            "The peer is huey (`bench/peer_huey.py`) on SQLite, WAL and `synchronous=NORMAL`"
            " like `ringod`: N tasks enqueued into a file in a temporary directory, then ONE"
            " huey consumer process with thread workers (16 for no-op, 100 for a 10 ms"
            " `time.sleep`); its rate is the steady rate from the first completion to the"
            " last, counted by a `SIGNAL_COMPLETE` handler in the consumer, and its CPU is the"
            " consumer's own (huey has no daemon: SQLite runs in it), to be read next to our"
            " worker + daemon CPU. Our rows are the Worker rows (second table), timed from"
            " registration until `Worker.close()` (every ack answered): that includes the"
            " ramp-up and the"
            " final acks, so it is the stricter of the two. Each round runs ours and the"
            " peer's one after the other (noop, sleep, huey), each on fresh processes and"
            " files; a cell is the median of the rounds (min-max), a ratio is ours / huey of"
            " the medians. Reproduce: `nox -s bench -- --only noop,sleep,huey --repeat 3`.",
            "",
            "Not the same contract: huey deletes a task from SQLite when a thread takes it"
            " (a consumer that dies loses what it held) and runs everything in one process;"
            " `ringod` leases it, the worker acks it over gRPC, and an expired lease hands it"
            " out again. On a shared machine the CPU rows are steadier than throughput, but"
            " huey's no-op rate and CPU per task vary more between runs than ours (its 16"
            " threads each take SQLite's write lock for every dequeue).",
            "",
            f"{when}, {revisions}; {machine}: a shared machine, other jobs ran meanwhile.",
            "",
            peer_table(pairs, runs["current"]),
        ]
    elif len(sides) == 1:
        lines = ["## This tree only (`--only`)", "", f"{when}, {revisions}; {machine}.", ""]
    else:
        lines = [
            HEADING,
            "",
            "`python bench/run.py --baseline REV` (or `nox -s bench -- --baseline REV`) measures"
            " this tree and git revision REV side by side in one run: REV is checked out with"
            " `git worktree add --detach` in a temporary directory (removed afterwards), both"
            " sides run this tree's bench code from the same venv, and every process of a side"
            " (bench, `ringod`, worker) imports `ringo_trio` from that side's tree"
            " (`bench/_tree.py`; the files are listed below). For each benchmark the sides"
            " alternate, the order flipping every round (baseline, current, current, baseline,"
            " …), each run on a fresh daemon; a cell is the median of the rounds (min-max), the"
            " ratio is current / baseline of the medians. `--only"
            f" {','.join(BENCHMARK_NAMES)}` picks benchmarks, `--repeat N` sets the rounds"
            " (default 3), `--quick` and `--tasks` the sizes; `--baseline HEAD` compares"
            " uncommitted changes with the last commit (on a clean tree, both sides run the"
            " same code: the ratios then show the noise). A quick check of a change, a few"
            " minutes:",
            "",
            "    nox -s bench -- --baseline main --only noop,enqueue_many --tasks 10000 --repeat 5",
            "",
            "On a shared machine, read the CPU rows next to throughput: throughput moves with"
            " whatever else runs during each few-second run, CPU seconds per 1,000 tasks hardly"
            " do.",
            "",
            f"Last comparison: {when}, {revisions}; {machine}: other jobs on a shared machine"
            " slow both sides; the alternating rounds spread that over both, and the ranges"
            " show what is left.",
            "",
        ]
    lines += [table(metrics, runs), "`ringo_trio` imported from:", "", *imports, ""]
    return "\n".join(lines) + "\n"
