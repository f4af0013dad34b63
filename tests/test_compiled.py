"""Which modules run compiled (setup.py's optional mypyc build). A pure-Python
install is as correct, so a plain run only checks that what is compiled is
what imports; ``nox -s compiled`` sets ``RINGO_TRIO_EXPECT_COMPILED`` and then
requires every module setup.py compiles."""

from __future__ import annotations

import ast
import importlib
import os
from pathlib import Path

from ringo_trio._compiled import compiled_modules

SETUP = Path(__file__).resolve().parent.parent / "setup.py"


def _setup_list() -> list[str]:
    """setup.py's COMPILED, as module names (read without running setup())."""
    source = SETUP.read_text()
    start = source.index("[", source.index("COMPILED = ["))
    paths: list[str] = ast.literal_eval(source[start : source.index("]", start) + 1])
    return sorted(p.removesuffix(".py").replace("/", ".") for p in paths)


def test_the_compiled_modules_are_what_imports() -> None:
    """Each compiled module is what its import gives (the extension, not the
    .py beside it); under ``nox -s compiled`` every module setup.py lists is
    compiled, so the tests of that session really exercise the build."""
    names = compiled_modules()
    for name in names:
        module = importlib.import_module(name)
        assert not (module.__file__ or "").endswith(".py"), name
    if os.environ.get("RINGO_TRIO_EXPECT_COMPILED"):
        assert names == _setup_list()
