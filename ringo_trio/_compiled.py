"""Which modules of this install are compiled (mypyc, setup.py): reported by
the tests, never required."""

from __future__ import annotations

import pathlib
from importlib.machinery import EXTENSION_SUFFIXES


def compiled_modules() -> list[str]:
    """The modules of ``ringo_trio`` that import as extension modules built
    for this interpreter (empty on a pure-Python install), sorted."""
    root = pathlib.Path(__file__).parent
    found = []
    for path in root.rglob("*"):
        suffix = next((s for s in EXTENSION_SUFFIXES if path.name.endswith(s)), None)
        if suffix is not None and path.with_name(path.name[: -len(suffix)] + ".py").exists():
            parts = path.relative_to(root).parent.parts
            found.append(".".join(("ringo_trio", *parts, path.name[: -len(suffix)])))
    return sorted(found)
