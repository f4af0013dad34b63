"""The mutation driver's pure part (tests/mutate.py): which edits it makes.

A driver that skipped a kind of edit would report a module as well tested
when no test looked at that kind of code; one that mutated docstrings or
annotations would report equivalent mutants as gaps."""

from __future__ import annotations

import ast

from tests.mutate import mutants, mutated

SOURCE = '''
"""A module docstring with SELECT 1 WHERE a < b."""
from __future__ import annotations

LIMIT = 500


def f(a: int | None, b: int) -> int | None:
    """A function's docstring: WHERE x = 1."""
    if a is not None and a < b:
        return min(a + b, LIMIT)
    return None if not b else b


SQL = "SELECT id FROM tasks WHERE queue = $1 AND state <= 1 ORDER BY priority DESC"
'''


def test_every_kind_of_edit_once_per_place_and_nothing_else() -> None:
    """Each comparison, operator, `and`/`or`, `not`, `min`/`max`, number and
    edit inside a SQL string is one mutant; docstrings and annotations
    (strings at run time) are left alone; every mutant is valid Python
    that differs from the module."""
    found = mutants(SOURCE)
    # A SQL edit's description ends with the statement around it.
    assert sorted(m.what.split(" in ...")[0] for m in found) == sorted(
        [
            "500 -> 501",
            "500 -> 499",
            "IsNot -> Is",
            "Lt -> LtE",
            "and <-> or",
            "min <-> max",
            "Add -> Sub",
            "not dropped",
            "SQL '=' -> '<>'",
            "SQL '<=' -> '<'",
            "SQL 'AND' -> 'OR'",
            "SQL 'DESC' -> 'ASC'",
        ]
    )
    original = ast.dump(ast.parse(SOURCE))
    for mutant in found:
        source = mutated(SOURCE, mutant)
        assert ast.dump(ast.parse(source)) != original, mutant
    assert [m.ident for m in found] == list(range(len(found)))
    assert "AND state <= 1" in next(m.what for m in found if m.what.startswith("SQL '<='"))


def test_a_dropped_not_leaves_its_operand() -> None:
    [dropped] = [m for m in mutants(SOURCE) if m.what == "not dropped"]
    source = mutated(SOURCE, dropped)
    assert "return None if b else b" in source
