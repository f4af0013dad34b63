"""The side-by-side benchmark's pure parts (bench/compare.py, bench/_stats.py)
and its per-tree bootstrap (bench/_tree.py); the benchmarks themselves are not
run."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _bench_module(monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    for loaded in ("compare", "_tree", "_stats"):
        monkeypatch.delitem(sys.modules, loaded, raising=False)
    return importlib.import_module(name)


@pytest.fixture
def compare(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _bench_module(monkeypatch, "compare")


@pytest.fixture
def http_abuse(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    # It puts the repository and bench/ on sys.path when imported: undone afterwards.
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "http_abuse", raising=False)
    return _bench_module(monkeypatch, "http_abuse")


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _bench_module(monkeypatch, "_stats")


def test_ratio_is_current_over_baseline_of_the_medians(compare: ModuleType) -> None:
    """The ratio column compares medians, so one outlier round does not decide it."""
    assert compare.ratio([90.0, 110.0, 1000.0], [100.0, 50.0, 100.0]) == "1.10"
    assert compare.ratio([5.0], [0.0]) == "n/a"


def test_a_cell_is_the_median_with_the_range_of_the_rounds(compare: ModuleType) -> None:
    """Each cell shows the median and the spread, so noise is visible next to the ratio."""
    assert compare.cell([3100.4, 2950.0, 3300.0], "tasks/s") == "3,100 (2,950-3,300)"
    assert compare.cell([0.2414], "s") == "0.241"
    assert compare.cell([46.04, 47.0], "MB") == "46.5 (46.0-47.0)"


def test_the_table_has_baseline_current_and_ratio_columns(compare: ModuleType) -> None:
    """Every metric gets one row: its direction in the name, baseline, current,
    current / baseline; a run of one tree has the current column only."""
    metrics = [
        compare.Metric("no-op: throughput", "tasks/s", True),
        compare.Metric("no-op: worker CPU per 1,000 tasks", "s", False),
    ]
    runs = {
        "baseline": {metrics[0].name: [3000.0], metrics[1].name: [0.25]},
        "current": {metrics[0].name: [3300.0], metrics[1].name: [0.2]},
    }
    assert compare.table(metrics, runs).splitlines() == [
        "| metric | baseline | current | ratio (current / baseline) |",
        "| --- | --- | --- | --- |",
        "| no-op: throughput (tasks/s, higher is better) | 3,000 | 3,300 | 1.10 |",
        "| no-op: worker CPU per 1,000 tasks (s, lower is better) | 0.250 | 0.200 | 0.80 |",
    ]
    assert compare.table(metrics[:1], {"current": runs["current"]}).splitlines() == [
        "| metric | current |",
        "| --- | --- |",
        "| no-op: throughput (tasks/s, higher is better) | 3,300 |",
    ]


def test_a_tree_process_imports_only_from_its_tree(tmp_path: Path) -> None:
    """A process started through bench/_tree.py takes ringo_trio from its tree,
    and a module that tree lacks fails to import: it is not served from the
    installed (editable) tree, which would mix the two sides of a comparison."""
    tree = tmp_path / "tree"
    (tree / "ringo_trio").mkdir(parents=True)
    (tree / "ringo_trio" / "__init__.py").write_text("")
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, ringo_trio\n"
        "try:\n"
        "    import ringo_trio.testing\n"
        "    leaked = ringo_trio.testing.__file__\n"
        "except ModuleNotFoundError:\n"
        "    leaked = None\n"
        "print(json.dumps({'package': ringo_trio.__file__, 'leaked': leaked}))\n"
    )
    log = tmp_path / "imports.jsonl"
    done = subprocess.run(
        [sys.executable, str(BENCH / "_tree.py"), str(tree), str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"RINGO_BENCH_IMPORTS": str(log), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    seen = json.loads(done.stdout)
    assert seen == {"package": str(tree / "ringo_trio" / "__init__.py"), "leaked": None}
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["ringo_trio"] == seen["package"]
    assert entry["argv"] == [str(script)]


def test_a_metric_one_side_did_not_measure_has_no_ratio(compare: ModuleType) -> None:
    """A peer runs on the current tree only: its rows show "—" on the baseline
    side and in the ratio column, never a made-up figure."""
    metric = compare.Metric("huey no-op: steady rate", "tasks/s", True)
    runs = {"baseline": {}, "current": {metric.name: [16000.0]}}
    assert compare.table([metric], runs).splitlines()[2] == (
        "| huey no-op: steady rate (tasks/s, higher is better) | — | 16,000 | — |"
    )


def test_a_target_row_shows_ours_the_peer_their_ratio_the_goal_and_whether_it_is_met(
    compare: ModuleType,
) -> None:
    """Each target row divides our median by the peer's from the same run and
    checks the goal on the medians; a goal on our figure alone is checked
    without a peer; a target whose figure of ours was not measured has no row."""
    Target = compare.Target
    targets = [
        Target("no-op / huey", "ours noop", "tasks/s", peer="huey noop", ratio_at_least=2.0),
        Target("10 ms / huey", "ours sleep", "tasks/s", peer="huey sleep", ratio_at_least=2.0),
        Target("enqueue_many", "ours many", "tasks/s", at_least=40_000.0),
        Target("RSS", "ours rss", "MB", peer="huey rss", at_most=60.0),
        Target("latency p50 / huey", "ours p50", "ms", peer="huey p50"),
        Target("not run", "ours unary", "calls/s", baseline=True, ratio_at_least=1.0),
    ]
    current = {
        "ours noop": [4000.0, 3000.0, 5000.0],
        "huey noop": [2000.0, 1000.0, 9000.0],
        "ours sleep": [3000.0],
        "huey sleep": [7000.0],
        "ours many": [39_999.0],
        "ours rss": [40.0],
        "huey rss": [26.5],
        "ours p50": [3.6],
        "huey p50": [27.2],
    }
    rows = compare.target_table(targets, {"current": current}).splitlines()
    assert rows[2:] == [
        "| no-op / huey | 4,000 (3,000-5,000) tasks/s | 2,000 (1,000-9,000) tasks/s | 2.00"
        " | ratio ≥ 2.00 | yes |",
        "| 10 ms / huey | 3,000 tasks/s | 7,000 tasks/s | 0.43 | ratio ≥ 2.00 | **no** |",
        "| enqueue_many | 39,999 tasks/s | — | — | ≥ 40,000 tasks/s | **no** |",
        "| RSS | 40.0 MB | 26.5 MB | 1.51 | ≤ 60.0 MB | yes |",
        "| latency p50 / huey | 3.6 ms | 27.2 ms | 0.13 | reported | — |",
    ]


def test_a_target_against_the_baseline_tree_needs_one_in_the_run(compare: ModuleType) -> None:
    """ "No lower than today" is held against the same metric on the baseline
    tree of the same run; without one the row says so and claims nothing."""
    target = compare.Target("unary", "Enqueue, 40", "calls/s", baseline=True, ratio_at_least=1.0)
    both = {"baseline": {"Enqueue, 40": [2000.0]}, "current": {"Enqueue, 40": [1900.0]}}
    assert compare.target_table([target], both).splitlines()[2] == (
        "| unary | 1,900 calls/s | 2,000 calls/s (baseline) | 0.95 | ratio ≥ 1.00 | **no** |"
    )
    alone = {"current": {"Enqueue, 40": [1900.0]}}
    assert compare.target_table([target], alone).splitlines()[2] == (
        "| unary | 1,900 calls/s | no baseline tree in this run | — | ratio ≥ 1.00 | — |"
    )


def test_naming_a_peer_runs_the_rows_it_is_compared_with(compare: ModuleType) -> None:
    """`--only huey` measures our no-op and 10 ms runs too, before the peer,
    so its ratios have both sides; nothing runs twice."""
    assert compare.expand(["huey", "latency"]) == ["noop", "sleep", "huey", "latency"]
    assert compare.expand(["sleep", "procrastinate", "huey"]) == [
        "sleep",
        "postgres",
        "procrastinate",
        "noop",
        "huey",
    ]


def test_each_peer_runs_with_our_rows_on_its_own_storage(compare: ModuleType) -> None:
    """The PostgreSQL peers (graphile-worker, pgqueuer) are held against our
    Worker runs on one PostgreSQL daemon, BullMQ against ours on SQLite (both
    with a prefetch, as the peers run in their perf configurations); and
    `--no-postgres` leaves out every PostgreSQL run, ours and theirs. Each
    is also held against our no-op run on a daemon that keeps no succeeded
    task (``--retain-succeeded never``), as the peers keep no finished job."""
    assert compare.expand(["graphile", "pgqueuer", "bullmq"]) == [
        "pg_noop",
        "pg_sleep",
        "pg_noop_never",
        "graphile",
        "pgqueuer",
        "noop_prefetch",
        "sleep_prefetch",
        "noop_never",
        "bullmq",
    ]
    on_postgres = set(compare.POSTGRES_NAMES)
    assert {"pg_noop", "pg_sleep", "pg_noop_never", "graphile", "pgqueuer", "postgres"} <= (
        on_postgres
    )
    assert not {"noop", "sleep", "noop_prefetch", "noop_never", "bullmq", "huey"} & on_postgres
    assert set(compare.PEER_NAMES) <= set(compare.BENCHMARK_NAMES)


def test_a_run_replaces_its_own_section_of_results_md_only(compare: ModuleType) -> None:
    """A run rewrites the section it measured and leaves every other one,
    the hand-written analysis included, as it was; a new targets section goes
    right after the opening table, other new sections before the analysis."""
    text = (
        "# Benchmarks\n\nold table\n\n"
        "## GetQueueActivity on a deep queue\n\nby hand\n\n"
        "## Where the time goes\n\n### Worker process\n\nanalysis\n"
    )
    targets = f"{compare.PEER_HEADING}\n\nratios\n\n"
    with_targets = compare.replace_section(text, compare.PEER_HEADING, targets, first=True)
    assert with_targets == text.replace("## GetQueueActivity", targets + "## GetQueueActivity")
    again = compare.replace_section(
        with_targets, compare.PEER_HEADING, targets.replace("ratios", "new"), first=True
    )
    assert again == with_targets.replace("ratios", "new")
    trees = f"{compare.HEADING}\n\ntrees\n\n"
    assert compare.replace_section(text, compare.HEADING, trees) == text.replace(
        "## Where the time goes", trees + "## Where the time goes"
    )
    assert compare.replace_section(text, None, "# Benchmarks\n\nnew\n\n") == text.replace(
        "old table", "new"
    )


def test_percentiles_are_nearest_rank(stats: ModuleType) -> None:
    """p50 and p99 are values that were measured (nearest rank), and an empty
    run has none rather than a zero that would look like a result."""
    values = [float(v) for v in range(200, 0, -1)]
    assert stats.percentile(values, 0.50) == 100.0
    assert stats.percentile(values, 0.99) == 198.0
    assert stats.percentile([7.0], 0.99) == 7.0
    assert math.isnan(stats.percentile([], 0.5))


def test_the_steady_rate_leaves_out_what_came_before_the_first_completion(
    stats: ModuleType,
) -> None:
    """The peers' rate (and ours beside it) counts completions after the first
    observation over the time they took: start-up is not in it; a polled count
    that saw several done at once subtracts them all."""
    assert stats.steady_rate(10_001, 1, 2.0, 4.0) == 5000.0
    assert stats.steady_rate(10_000, 40, 0.5, 2.5) == 4980.0
    with pytest.raises(ValueError, match="steady rate"):
        stats.steady_rate(10, 10, 1.0, 2.0)


def test_the_abuse_benchmark_runs_the_cases_named_in_their_order(http_abuse: ModuleType) -> None:
    """`--only` runs the cases it names, in its order; a misspelt one is refused
    (naming the known ones) before any daemon starts or the 1,000,000-task
    store is filled."""
    assert http_abuse.case_names("bad_cookies, idle") == ["bad_cookies", "idle"]
    assert set(http_abuse.CASES) == {
        "idle",
        "scrape",
        "purge",
        "slow_connections",
        "bad_cookies",
    }
    with pytest.raises(ValueError, match=r"slow.*known: idle, scrape"):
        http_abuse.case_names("idle,slow")
    with pytest.raises(ValueError, match="unknown"):
        http_abuse.case_names(",")


def test_each_scale_out_row_is_read_against_one_daemon_and_worker_of_its_prefetch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scale-out section (``run.py --postgres-only``) sets each row
    against one daemon and one worker process with the same prefetch, so a
    second process's gain is not confused with prefetch's."""
    monkeypatch.delitem(sys.modules, "run", raising=False)
    run = _bench_module(monkeypatch, "run")

    def row(daemons: int, workers: int, prefetch: int, rate: float) -> object:
        return run.ScaleRun(
            daemons=daemons,
            workers=workers,
            prefetch=prefetch,
            tasks=1000,
            elapsed=1000 / rate,
            per_worker=[1000 // workers] * workers,
            daemon_cpu=0.1,
            worker_cpu=0.1,
            server_cpu=0.1,
        )

    runs = [[row(1, 1, 0, 1000)], [row(2, 1, 0, 1500)], [row(1, 1, 64, 4000)]]
    runs.append([row(1, 2, 64, 5000), row(1, 2, 64, 6000)])
    text = run._scaleout_section(runs, 2)
    assert "| 2 / 1 / 0 | 1,500 tasks/s | 1.50 x | 1,000 |" in text
    assert "| 1 / 1 / 64 | 4,000 tasks/s | 1.00 x |" in text
    assert "| 1 / 2 / 64 | 6,000 tasks/s | 1.50 x | 500 / 500 |" in text
    assert "1 / 2 / 64 5,000, 6,000 tasks/s" in text
