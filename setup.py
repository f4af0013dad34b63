"""Optional mypyc compilation of the hot sans-IO and codec modules.

Everything else is in pyproject.toml. The modules in COMPILED are plain
Python, ``mypy --strict`` clean, on every task's path in the worker and the
daemon; compiled with mypyc they cost ~10 % less worker CPU per task and a few
% less daemon CPU (`bench/run.py --only noop --baseline`; the codec's own
paths run 1.3-2.8x faster, bench/codec.py). The wheel holds the ``.py`` files too, so

* ``pip install .`` (and building a wheel) compiles them: ``mypy[mypyc]`` is a
  build requirement. When anything goes wrong (no C compiler, no Python
  headers, a mypy that refuses the code), the build says so and carries on
  with the pure-Python modules, which are the same code;
* ``RINGO_TRIO_PURE=1`` skips the compilation;
* an editable install (``pip install -e .``) stays pure unless
  ``RINGO_TRIO_COMPILE=1``: compiled in place, the ``.so`` files would shadow
  the ``.py`` files being edited (``git clean -fX ringo_trio`` removes them).

``ringo_trio._compiled.compiled_modules()`` names the compiled modules of an install.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Left out: ringo_trio/_wire/rows.py, whose encoder takes rows written by hand
# (NULL in a NOT NULL column, a REAL time) and hands them to the generic path:
# compiled, its typed unpacking and `Push` refuse such a row first.
COMPILED = [
    "ringo_trio/_wire/primitives.py",
    "ringo_trio/_wire/codec.py",
    "ringo_trio/_wire/work.py",
    "ringo_trio/_work/_frames.py",
    "ringo_trio/_contract/work/client.py",
    "ringo_trio/_contract/work/client_events.py",
    "ringo_trio/_contract/work/server.py",
]


def _say(message: str) -> None:
    print(f"ringo-trio: {message}", file=sys.stderr)


def _wanted() -> bool:
    if os.environ.get("RINGO_TRIO_PURE"):
        _say("RINGO_TRIO_PURE is set: pure-Python modules only")
        return False
    editable = any(arg in ("editable_wheel", "develop") for arg in sys.argv)
    if editable and not os.environ.get("RINGO_TRIO_COMPILE"):
        _say("editable install: pure-Python modules (RINGO_TRIO_COMPILE=1 compiles them)")
        return False
    return True


def _extensions() -> list[Any]:
    if not _wanted():
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc is not installed in the build environment: pure-Python modules only")
        return []
    try:
        # The type check sees the compiled modules' own imports (betterproto2,
        # a build requirement, for the generated messages); the rest of the
        # package is followed silently, its dependencies (trio, ...) absent.
        options = ["--follow-imports=silent", "--ignore-missing-imports"]
        return list(mypycify([*options, *COMPILED], opt_level="3", group_name="ringo_trio"))
    except (Exception, SystemExit):  # mypyc exits on a type error
        traceback.print_exc()
        _say("mypyc failed: pure-Python modules only")
        return []


class _OptionalBuildExt(build_ext):
    """All compiled modules or none: when one fails to build, the others are
    removed too (they share one runtime library), and the ``.py`` files, in
    the wheel anyway, are imported instead."""

    def run(self) -> None:
        try:
            super().run()
        except Exception:
            traceback.print_exc()
            for ext in self.extensions:
                built = self.get_ext_fullpath(ext.name)
                if os.path.exists(built):
                    os.remove(built)
            _say("building the compiled modules failed: pure-Python modules only")


ext_modules = _extensions()
setup(ext_modules=ext_modules, cmdclass={"build_ext": _OptionalBuildExt} if ext_modules else {})
