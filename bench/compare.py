"""Side by side in one run: two trees (``bench/run.py --baseline REV``), or
this tree and the peers against the issue's targets (the full run, ``--only``).

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
* The peers (huey, procrastinate, the low-load latency with huey's beside
  ours) run on the current side only, in the same rounds as our benchmarks;
  a `Target` row holds one metric of ours against a peer's (or against the
  baseline side's same metric: "no lower than today") and checks its goal on
  the medians.

The formatting helpers here are pure (tests/test_bench_tools.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import re
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
# Worker runs (on SQLite, and on PostgreSQL: pg_noop, pg_sleep), enqueue_many
# alone, the unary rows, the PostgreSQL scale-out, and the peers: huey
# (bench/peer_huey.py), BullMQ (bench/peer_bullmq.py), procrastinate
# (bench/peer_procrastinate.py), graphile-worker (bench/peer_graphile.py),
# pgqueuer (bench/peer_pgqueuer.py) and the low-load latency (ours and huey's).
BENCHMARK_NAMES = (
    "noop",
    "sleep",
    "noop_prefetch",
    "sleep_prefetch",
    "enqueue_many",
    "unary",
    "postgres",
    "pg_noop",
    "pg_sleep",
    "noop_never",
    "pg_noop_never",
    "huey",
    "procrastinate",
    "graphile",
    "bullmq",
    "pgqueuer",
    "latency",
)
# Benchmarks with a peer in them run on the current tree only: the peer does
# not change with the tree.
PEER_NAMES = ("huey", "procrastinate", "latency", "graphile", "bullmq", "pgqueuer")
# A peer is compared with our rows of the same run: naming it runs those too.
COMPANIONS = {
    "huey": ("noop", "sleep"),
    "bullmq": ("noop_prefetch", "sleep_prefetch", "noop_never"),
    "procrastinate": ("postgres",),
    "graphile": ("pg_noop", "pg_sleep", "pg_noop_never"),
    "pgqueuer": ("pg_noop", "pg_sleep", "pg_noop_never"),
}
# What runs on PostgreSQL (skipped by --no-postgres).
POSTGRES_NAMES = (
    "postgres",
    "pg_noop",
    "pg_sleep",
    "pg_noop_never",
    "procrastinate",
    "graphile",
    "pgqueuer",
)
PEER_HEADING = "## Targets: against the peers"
# Written by hand from a `--profile` run: a run never touches it.
ANALYSIS_HEADING = "## Where the time goes"


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
    and current only when `runs` has no "baseline" side. A metric one side did
    not measure (a peer's, on the baseline tree) gets "—" there and no ratio."""
    current = runs["current"]
    baseline = runs.get("baseline")

    def shown(side: dict[str, list[float]], m: Metric) -> str:
        return cell(side[m.name], m.unit) if side.get(m.name) else "—"

    if baseline is None:
        lines = ["| metric | current |", "| --- | --- |"]
        lines += [f"| {m.label} | {shown(current, m)} |" for m in metrics]
    else:
        lines = [
            "| metric | baseline | current | ratio (current / baseline) |",
            "| --- | --- | --- | --- |",
        ]
        for m in metrics:
            both = bool(current.get(m.name)) and bool(baseline.get(m.name))
            lines.append(
                f"| {m.label} | {shown(baseline, m)} | {shown(current, m)}"
                f" | {ratio(current[m.name], baseline[m.name]) if both else '—'} |"
            )
    return "\n".join(lines) + "\n"


def replace_section(text: str, heading: str | None, section: str, *, first: bool = False) -> str:
    """bench/results.md `text` with the "## " section under `heading` (None:
    the text before the first "## " heading) replaced by `section`. A section
    not there yet goes right after that opening text when `first`, else just
    before the hand-written analysis (or at the end). The others stay as they
    are."""
    parts = re.split(r"(?m)^(?=## )", text)
    if heading is None:
        parts[0] = section
        return "".join(parts)
    for index, part in enumerate(parts[1:], 1):
        if part.startswith(heading + "\n"):
            parts[index] = section
            return "".join(parts)
    at = 1 if first else len(parts)
    if not first:
        for index, part in enumerate(parts[1:], 1):
            if part.startswith(ANALYSIS_HEADING + "\n"):
                at = index
    parts.insert(at, section)
    return "".join(parts)


def expand(names: Sequence[str]) -> list[str]:
    """`names` with each peer's companions (COMPANIONS) put before it, each
    name once, in the order given."""
    out: list[str] = []
    for name in names:
        for wanted in (*COMPANIONS.get(name, ()), name):
            if wanted not in out:
                out.append(wanted)
    return out


@dataclass(frozen=True)
class Target:
    """A row of the targets table: one of our metrics, what it is held
    against in the same run (a peer's metric, or the same metric on the
    baseline tree), and the goal, if it has one."""

    label: str
    ours: str  # metric name
    unit: str
    peer: str | None = None  # the peer's metric, same unit
    baseline: bool = False  # held against the baseline tree instead of a peer
    ratio_at_least: float | None = None  # ours / (peer or baseline), of the medians
    at_least: float | None = None  # ours alone
    at_most: float | None = None

    @property
    def goal(self) -> str:
        parts = []
        if self.ratio_at_least is not None:
            parts.append(f"ratio ≥ {self.ratio_at_least:.2f}")
        if self.at_least is not None:
            parts.append(f"≥ {format_value(self.at_least, self.unit)} {self.unit}")
        if self.at_most is not None:
            parts.append(f"≤ {format_value(self.at_most, self.unit)} {self.unit}")
        return ", ".join(parts) or "reported"

    def met(self, ours: Sequence[float], other: Sequence[float] | None) -> str:
        """ "yes" or "**no**" on the medians; "—" without a goal or when what
        the goal needs was not measured in this run."""
        if self.goal == "reported":
            return "—"
        value = statistics.median(ours)
        checks = []
        if self.ratio_at_least is not None:
            if not other or statistics.median(other) == 0:
                return "—"
            checks.append(value / statistics.median(other) >= self.ratio_at_least)
        if self.at_least is not None:
            checks.append(value >= self.at_least)
        if self.at_most is not None:
            checks.append(value <= self.at_most)
        return "yes" if all(checks) else "**no**"


def target_table(targets: Sequence[Target], runs: dict[str, dict[str, list[float]]]) -> str:
    """Markdown: one row per target whose metric of ours was measured: ours,
    the peer's (or the baseline tree's), ours / theirs of the medians, the
    goal, met."""
    current = runs["current"]
    lines = [
        "| target | ringo_trio | peer (or baseline tree) | ringo_trio / peer | goal | met |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for t in targets:
        ours = current.get(t.ours)
        if not ours:
            continue
        if t.baseline:
            other = runs.get("baseline", {}).get(t.ours)
            missing = "no baseline tree in this run"
        else:
            other = current.get(t.peer) if t.peer else None
            missing = "not measured in this run" if t.peer else "—"
        shown = f"{cell(other, t.unit)} {t.unit}" if other else missing
        if other and t.baseline:
            shown += " (baseline)"
        lines.append(
            f"| {t.label} | {cell(ours, t.unit)} {t.unit} | {shown}"
            f" | {ratio(ours, other) if other else '—'} | {t.goal} | {t.met(ours, other)} |"
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
    baseline: str | None,
    names: Sequence[str],
    rounds: int,
    options: Sequence[str],
    sizes: str,
    *,
    targets: Sequence[Target] = (),
    baseline_names: Sequence[str] | None = None,
) -> str:
    """Run `names` on the current tree (and on `baseline`: those of
    `baseline_names`, default all but the peers), interleaved, and return the
    markdown section: how it was run, which files each side imported, the
    targets table (when `targets` are given), the table of every metric."""
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
        on_baseline = [n for n in (baseline_names or names) if n not in PEER_NAMES]
        # Rounds outside: each round runs every benchmark once, so ours and
        # the peer's alternate (noop, sleep, huey, noop, ...) under the same noise.
        for index in range(rounds):
            for name in names:
                here = sides if name in on_baseline else sides[-1:]
                for side in here if index % 2 == 0 else here[::-1]:
                    t0 = time.perf_counter()
                    measured = _measure(side, name, options)
                    _check_imports(side)
                    for item in measured:
                        metric = Metric(item["name"], item["unit"], item["higher_is_better"])
                        metrics.setdefault(metric.name, metric)
                        runs[side.label].setdefault(metric.name, []).append(item["value"])
                    first = measured[0]
                    print(
                        f"{name}, round {index + 1}/{rounds}, {side.label}:"
                        f" {format_value(first['value'], first['unit'])} {first['unit']}"
                        f" ({time.perf_counter() - t0:.0f} s)",
                        flush=True,
                    )
    load = (load_before, os.getloadavg()[0])
    return _section(sides, list(metrics.values()), runs, rounds, sizes, load, targets)


PEER_NOTES = [
    "Every figure above comes from the same run: each round runs ours and the peers'"
    " benchmarks one after the other, each on fresh processes, files and databases; a cell"
    " is the median of the rounds (min-max), a ratio is ours / theirs of the medians (for"
    " latency and memory, lower is better: a ratio under 1 is ours being smaller). Reproduce:"
    " `nox -s bench` (everything) or `nox -s bench -- --only"
    " noop,sleep,huey,procrastinate,latency,enqueue_many,unary`.",
    "",
    "* **Throughput against huey** (`bench/peer_huey.py`): SQLite, WAL and"
    " `synchronous=NORMAL` like `ringod`; N tasks enqueued, then ONE consumer process"
    " with thread workers (16 for no-op, 100 for a 10 ms `time.sleep`). Both sides as"
    " the steady rate after the first completion: huey's counted by a `SIGNAL_COMPLETE`"
    " handler, ours from the worker's first to its Nth handler return (`bench/worker.py`);"
    " the stricter registration → `Worker.close()` rate of ours is in the table below."
    " Not the same contract: huey deletes a task when a thread takes it (a consumer that"
    " dies loses what it held) and runs everything in one process (its CPU is the whole"
    " peer's); `ringod` leases, the worker acks over gRPC, an expired lease hands the"
    " task out again.",
    "* **PostgreSQL against procrastinate** (`bench/peer_procrastinate.py`): the same"
    " server, a fresh database per run; N no-op jobs deferred in batches of 1,000, then ONE"
    " worker process (`run_worker_async`, `concurrency=64` like our Worker, a psycopg pool"
    " of at most 10 connections like `ringod`'s default `pool_size`), steady rate after the"
    " first completion from polling its jobs table every 20 ms. Ours: N daemons on one"
    " fresh database, a worker process (concurrency 64) per daemon, tasks due at one"
    " shared moment after every worker registered, timed from then until no task is"
    " active (no start-up in it either).",
    "* **Latency at low load**: enqueue → handler START, the send time taken just"
    " before the enqueue call and carried in the payload. Ours: one idle worker process"
    " (concurrency 64), registered and left idle for 1 s, then the tasks enqueued one at"
    " a time (unary `enqueue` from trio) with a gap. huey: the consumer (16 threads, its"
    " default polling: 0.1 s, backing off x1.15 per empty poll to 10 s) started and left"
    " idle for 1 s, then the same trickle.",
    "* **Enqueue, 40 concurrent** is held against the start tree (`--start-tree REV`,"
    " the tree the issue was filed against, run in the same rounds; so are the Worker"
    " runs, for throughput and CPU per task before and after), **enqueue_many** and"
    " **worker peak RSS** (`VmHWM` of the worker process; huey's consumer beside it)"
    " against their absolute targets.",
    "",
]


def _section(
    sides: Sequence[Side],
    metrics: Sequence[Metric],
    runs: dict[str, dict[str, list[float]]],
    rounds: int,
    sizes: str,
    load: tuple[float, float],
    targets: Sequence[Target],
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
    if targets:
        lines = [
            PEER_HEADING,
            "",
            f"{when}, {revisions}; {machine}: a shared machine, other jobs ran meanwhile.",
            "",
            target_table(targets, runs),
            *PEER_NOTES,
        ]
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
