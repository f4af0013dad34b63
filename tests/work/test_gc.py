"""`ringo_trio.tune_gc`: the worker process's young-generation threshold
(ringo_trio/_work/_gc.py has the measurement behind it)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from ringo_trio import tune_gc
from ringo_trio._work._gc import YOUNG_THRESHOLD


@pytest.fixture(autouse=True)
def collector() -> Iterator[None]:
    """Each test leaves the process's collector as it found it."""
    threshold = gc.get_threshold()
    enabled = gc.isenabled()
    yield
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def _collections_while_holding(n: int) -> int:
    """Young collections while `n` tracked objects are allocated and kept
    alive (as a worker's in-flight tasks are)."""
    seen = 0

    def count(phase: str, info: dict[str, Any]) -> None:
        nonlocal seen
        seen += phase == "start"

    gc.collect()  # the young generation's count starts at zero
    gc.callbacks.append(count)
    try:
        held = [[] for _ in range(n)]
    finally:
        gc.callbacks.remove(count)
    assert len(held) == n
    return seen


def test_in_flight_objects_no_longer_trigger_collections() -> None:
    """What the setting is for: objects a worker holds for the length of a
    task (thousands at once) no longer make the collector run — at the
    interpreter's default they trigger a young collection every 700, which
    promotes them and makes full collections due."""
    gc.set_threshold(700, 10, 10)
    assert _collections_while_holding(5_000) >= 5
    tune_gc()
    assert _collections_while_holding(5_000) == 0


def test_raises_the_young_threshold_and_keeps_the_older_ones() -> None:
    gc.set_threshold(700, 7, 3)
    tune_gc()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 7, 3)
    tune_gc()  # idempotent
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 7, 3)


def test_the_process_owners_own_setting_wins() -> None:
    """A higher threshold set already is kept, and a collector the process
    turned off stays off: tuning never undoes the owner's choice."""
    gc.set_threshold(50_000, 20, 100)
    tune_gc()
    assert gc.get_threshold() == (50_000, 20, 100)
    gc.set_threshold(700, 10, 10)
    gc.disable()
    tune_gc()
    assert not gc.isenabled()
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
