"""The side-by-side benchmark's pure parts (bench/compare.py) and its
per-tree bootstrap (bench/_tree.py); the benchmarks themselves are not run."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def compare(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("compare", "_tree"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("compare")


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


def test_a_peer_ratio_is_ours_over_the_peers_medians_from_the_same_run(
    compare: ModuleType,
) -> None:
    """The ratio rows divide our median by the peer's, both from the same run,
    and a pair with either side not measured gets no row (never a made-up ratio)."""
    current = {
        "ours noop": [4000.0, 3000.0, 5000.0],
        "huey noop": [2000.0, 1000.0, 9000.0],
        "huey 10 ms": [1500.0],
    }
    pairs = {"huey noop": "ours noop", "huey 10 ms": "ours 10 ms"}
    rows = compare.peer_table(pairs, current).splitlines()
    assert rows[2:] == [
        "| ours noop / huey noop | 4,000 (3,000-5,000) | 2,000 (1,000-9,000) | 2.00 |"
    ]
