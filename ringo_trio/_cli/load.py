"""``module:attribute`` as the commands name code: a handler, a registry, a task."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["UsageError", "load_object"]


class UsageError(Exception):
    """A command line that cannot run; its text is the message for the user."""


def load_object(spec: str, *, what: str = "handler") -> Any:
    """Import ``module:attribute`` (also from the current directory).

    `UsageError` when the spec is malformed or nothing of that name imports;
    `ModuleNotFoundError` passes through when the module itself does not
    exist, for callers that can do without it.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{what} {spec!r} must look like module:function")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise
        raise UsageError(
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    except Exception as exc:
        raise UsageError(
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    return target
