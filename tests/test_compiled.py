"""Which modules run compiled (setup.py's optional mypyc build): reported,
not required — a pure-Python install is as correct."""

from __future__ import annotations

import importlib

import pytest

from ringo_trio._compiled import compiled_modules


def test_report_the_compiled_modules(capsys: pytest.CaptureFixture[str]) -> None:
    """Example: each compiled module is what its import gives (the extension,
    not the .py beside it); the list is printed with -s."""
    names = compiled_modules()
    for name in names:
        module = importlib.import_module(name)
        assert not (module.__file__ or "").endswith(".py"), name
    with capsys.disabled():
        print(f"\nringo_trio compiled modules: {', '.join(names) or 'none (pure Python)'}")
