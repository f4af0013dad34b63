"""Hostile tests: attacks on a real ringod over loopback, each bounded in time.

Every test here is marked ``hostile`` (run with ``nox -s hostile``, part of
the default ``nox`` run); each names the defect it guards and goes red when
that defect's fix is reverted.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/hostile/" in str(item.path):
            item.add_marker(pytest.mark.hostile)
