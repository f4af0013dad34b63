"""Start a bench process on ONE source tree's ``ringo_trio``.

    python bench/_tree.py TREE -m MODULE [ARGS...]
    python bench/_tree.py TREE SCRIPT [ARGS...]

``bench/run.py --baseline REV`` measures two trees with one venv, whose
editable install points at the current tree. Every process of a side (the
bench process, ``ringod``, the worker processes) starts through this file,
which

* puts TREE first on ``sys.path`` (``PYTHONPATH`` would come after the
  working directory, which ``python -m`` puts first);
* takes out the editable install's import hook for ``ringo_trio``: setuptools
  appends a meta path finder that serves ``ringo_trio.X`` from the installed
  tree whenever TREE has no such module, which would silently mix the two
  trees instead of failing;
* refuses to run if ``ringo_trio`` still comes from elsewhere, and appends the
  file it came from to ``$RINGO_BENCH_IMPORTS`` (one JSON line per process),
  so the run shows, and checks, what each side imported;
* sets ``$RINGO_BENCH_TREE``, so that `python` in a bench process starts its
  own children the same way.

Then it runs MODULE or SCRIPT as ``python`` would.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

TREE_ENV = "RINGO_BENCH_TREE"
IMPORTS_ENV = "RINGO_BENCH_IMPORTS"
BOOTSTRAP = os.path.abspath(__file__)


def python() -> list[str]:
    """The command a bench process starts another Python process with: in a
    tree run, through this file, so the child imports the same tree."""
    tree = os.environ.get(TREE_ENV)
    return [sys.executable] if tree is None else [sys.executable, BOOTSTRAP, tree]


def daemon_command() -> list[str] | None:
    """``ringod``'s command for `ringo_trio.testing.DaemonProcess` (None: its default)."""
    return None if TREE_ENV not in os.environ else [*python(), "-m", "ringo_trio.server"]


def _imports_ringo_trio(finder: object) -> bool:
    module = sys.modules.get(getattr(finder, "__module__", ""))
    mapping = getattr(module, "MAPPING", None)
    return isinstance(mapping, dict) and "ringo_trio" in mapping


def main() -> None:
    tree = os.path.abspath(sys.argv[1])
    target = sys.argv[2:]
    os.environ[TREE_ENV] = tree
    sys.meta_path[:] = [f for f in sys.meta_path if not _imports_ringo_trio(f)]
    if target[0] == "-m":
        name, args = target[1], target[2:]
        sys.path[0:1] = [tree]
    else:
        name, args = target[0], target[1:]
        sys.path[0:1] = [os.path.dirname(os.path.abspath(name)), tree]

    import ringo_trio

    imported = os.path.abspath(ringo_trio.__file__ or "?")
    if not imported.startswith(os.path.join(tree, "")):
        raise SystemExit(f"bench: ringo_trio came from {imported}, not from {tree}")
    log = os.environ.get(IMPORTS_ENV)
    if log:
        line = json.dumps({"pid": os.getpid(), "argv": target, "ringo_trio": imported})
        with open(log, "a") as out:
            out.write(line + "\n")
    sys.argv = [name, *args]
    if target[0] == "-m":
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(name, run_name="__main__")


if __name__ == "__main__":
    main()
