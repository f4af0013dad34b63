"""Mutation testing of one module: does some test go red when its code is wrong?

``nox -s mutate -- ringo_trio/server/storage/sqlite/engine.py tests/server/storage``
(or ``python -m tests.mutate MODULE TEST [TEST ...]``) makes one change at a
time to MODULE, runs the TESTs against it, and lists the changes no test
noticed. A change is one of: a comparison flipped at its edge (``<``/``<=``,
``==``/``!=``, ``in``/``not in``, ``is``/``is not``), an arithmetic operator
swapped, ``and``/``or``, ``min``/``max``, a ``not`` dropped, a number moved by
one, ``True``/``False`` swapped — and, inside any string that holds SQL, the
same kinds of edits to the statement (``<``/``<=``, ``=``/``<>``,
``AND``/``OR``, ``DESC``/``ASC``, ``+``/``-``), since the storage engines'
logic lives there.

Why a driver of our own and not mutmut: mutmut does not look inside strings,
and it rewrites every function of the module into a trampoline, which the
daemon's subprocesses (``ringod`` started by the tests) would not import.
Here each mutant is the module's source with one node changed, written into
a copy of the tree that the tests (and the daemons they start, through
``PYTHONPATH``) import instead of the checkout.

A mutant that lives is either equivalent (it changes no result: a cache
size, a swap of equal bounds) or a test missing; docs/testing.md ("Tests
that can go red") records each run and what was written for what lived.
Hypothesis runs derandomized with a smaller example budget (`_PROFILE`), so
a run is repeatable; a mutant that makes the tests run past ``--timeout``
counts as killed (an endless walk is a defect the suite would notice).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import copy
import dataclasses
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent

_SQL = re.compile(r"\b(SELECT|UPDATE|INSERT|DELETE|WHERE)\b")
# Edits inside a statement: the pattern, and what each match becomes.
_SQL_EDITS: tuple[tuple[str, str], ...] = (
    (r"(?<=\s)<=(?=\s)", "<"),
    (r"(?<=\s)>=(?=\s)", ">"),
    (r"(?<=\s)<(?=\s)", "<="),
    (r"(?<=\s)>(?=\s)", ">="),
    (r"(?<=\s)=(?=\s)", "<>"),
    (r"(?<=\s)<>(?=\s)", "="),
    (r"\bAND\b", "OR"),
    (r"\bOR\b", "AND"),
    (r"\bDESC\b", "ASC"),
    (r"\bASC\b", "DESC"),
    (r"(?<=\s)\+(?=\s)", "-"),
    (r"(?<=\s)-(?=\s)", "+"),
)
_COMPARE_SWAPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.BitOr: ast.BitAnd,
    ast.BitAnd: ast.BitOr,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
}
_PROFILE = """
from hypothesis import HealthCheck, settings
settings.register_profile(
    "mutate", max_examples=30, derandomize=True, database=None, deadline=None,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile("mutate")
"""


@dataclasses.dataclass(frozen=True)
class Mutant:
    ident: int
    line: int
    what: str
    # Which node of the module's ``ast.walk`` order, and which of its edits.
    index: int
    variant: int


def _sql_edits(statement: str) -> list[tuple[re.Match[str], str]]:
    """Every edit of a statement, in variant order: where, and into what."""
    return [
        (match, replacement)
        for pattern, replacement in _SQL_EDITS
        for match in re.finditer(pattern, statement)
    ]


def _edits(tree: ast.Module) -> Iterator[tuple[int, str, int]]:
    """(node index in ``ast.walk`` order, description, variant) of every edit."""
    for index, node in enumerate(ast.walk(tree)):
        if isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                if type(op) in _COMPARE_SWAPS:
                    yield index, f"{type(op).__name__} -> {_COMPARE_SWAPS[type(op)].__name__}", k
        elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _BINOP_SWAPS:
            yield index, f"{type(node.op).__name__} -> {_BINOP_SWAPS[type(node.op)].__name__}", 0
        elif isinstance(node, ast.BoolOp):
            yield index, "and <-> or", 0
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield index, "not dropped", 0
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("min", "max"):
                yield index, "min <-> max", 0
        elif isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool):
                yield index, f"{value} -> {not value}", 0
            elif isinstance(value, int):
                yield index, f"{value} -> {value + 1}", 0
                if value != 0:
                    yield index, f"{value} -> {value - 1}", 1
            elif isinstance(value, str) and _SQL.search(value):
                for variant, (match, replacement) in enumerate(_sql_edits(value)):
                    around = value[max(0, match.start() - 25) : match.end() + 25]
                    around = " ".join(around.split())
                    what = f"SQL {match.group()!r} -> {replacement!r} in ...{around}..."
                    yield index, what, variant


def _apply(tree: ast.Module, index: int, variant: int) -> ast.Module:
    mutated = copy.deepcopy(tree)
    node = list(ast.walk(mutated))[index]
    if isinstance(node, ast.Compare):
        node.ops[variant] = _COMPARE_SWAPS[type(node.ops[variant])]()
    elif isinstance(node, ast.BinOp | ast.AugAssign):
        node.op = _BINOP_SWAPS[type(node.op)]()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.UnaryOp):
        # `not x` becomes `(x)`: the operand stands alone.
        operand = node.operand
        for parent in ast.walk(mutated):
            for field, value in ast.iter_fields(parent):
                if value is node:
                    setattr(parent, field, operand)
                elif isinstance(value, list):
                    for i, item in enumerate(value):
                        if item is node:
                            value[i] = operand
    elif isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)
        node.func.id = "max" if node.func.id == "min" else "min"
    elif isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            node.value = not value
        elif isinstance(value, int):
            node.value = value + 1 if variant == 0 else value - 1
        else:
            assert isinstance(value, str)
            match, replacement = _sql_edits(value)[variant]
            node.value = value[: match.start()] + replacement + value[match.end() :]
    return mutated


def mutants(source: str) -> list[Mutant]:
    """Every mutant of a module's source (`mutated` writes one out).

    Docstrings are left alone (a mutated docstring changes nothing), and so
    is anything under ``if TYPE_CHECKING:``."""
    tree = ast.parse(source)
    skipped: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        match first:
            case ast.Expr(value=ast.Constant(value=str())):
                skipped.update(id(n) for n in ast.walk(first))
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
        # Annotations are strings at run time (``from __future__ import annotations``).
        for annotation in (getattr(node, "annotation", None), getattr(node, "returns", None)):
            if isinstance(annotation, ast.AST):
                skipped.update(id(n) for n in ast.walk(annotation))
    nodes = list(ast.walk(tree))
    edits = (e for e in _edits(tree) if id(nodes[e[0]]) not in skipped)
    return [
        Mutant(ident, getattr(nodes[index], "lineno", 0), what, index, variant)
        for ident, (index, what, variant) in enumerate(edits)
    ]


def mutated(source: str, mutant: Mutant) -> str:
    """The module's source with `mutant`'s one change."""
    return ast.unparse(_apply(ast.parse(source), mutant.index, mutant.variant))


def _run(workdir: pathlib.Path, command: list[str], timeout: float) -> str:
    env = dict(os.environ, PYTHONPATH=str(workdir))
    process = subprocess.Popen(
        command,
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    code: int | None = None
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        # The tests start daemons of their own: the whole group goes, also
        # after a pass (a daemon left behind would hold its port and files).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    if code is None:
        return "timeout"
    return "lived" if code == 0 else "killed"


def _copy_tree(into: pathlib.Path) -> None:
    ignore = shutil.ignore_patterns(
        ".git", ".nox", ".hypothesis", "__pycache__", "*.so", "build", ".mypy_cache"
    )
    shutil.copytree(ROOT, into, ignore=ignore, dirs_exist_ok=True)
    (into / "_mutate_profile.py").write_text(_PROFILE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("module", help="the module's path, relative to the checkout")
    parser.add_argument(
        "tests",
        nargs=argparse.REMAINDER,
        help="pytest arguments, to the end of the line: the tests that should kill its mutants",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a mutant's tests may run"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated mutant ids (as --list prints them)"
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    args = parser.parse_args(argv)
    if not args.tests and not args.list:
        parser.error("name the tests that should kill the mutants")

    module = pathlib.Path(args.module)
    source = (ROOT / module).read_text()
    found = mutants(source)
    if args.only:
        wanted = {int(i) for i in args.only.split(",")}
        found = [m for m in found if m.ident in wanted]
    if args.list:
        for mutant in found:
            print(f"{mutant.ident:4} line {mutant.line:4}  {mutant.what}")
        return 0
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "_mutate_profile",
    ]
    command += ["-m", "not slow and not hostile", *args.tests]

    with tempfile.TemporaryDirectory(prefix="ringo-mutate-") as scratch:
        workdirs = [pathlib.Path(scratch) / f"w{i}" for i in range(args.workers)]
        for workdir in workdirs:
            _copy_tree(workdir)
        baseline = _run(workdirs[0], command, args.timeout)
        if baseline != "lived":
            print(f"the tests do not pass on the unchanged tree ({baseline}): nothing to measure")
            return 2
        free = list(workdirs)

        def one(mutant: Mutant) -> tuple[Mutant, str, float]:
            workdir = free.pop()
            try:
                (workdir / module).write_text(mutated(source, mutant))
                started = time.monotonic()
                outcome = _run(workdir, command, args.timeout)
                return mutant, outcome, time.monotonic() - started
            finally:
                (workdir / module).write_text(source)
                free.append(workdir)

        lived = []
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            for mutant, outcome, took in pool.map(one, found):
                print(
                    f"{outcome:8} {took:6.1f}s  #{mutant.ident} line {mutant.line}: {mutant.what}",
                    flush=True,
                )
                if outcome == "lived":
                    lived.append(mutant)
    print(f"\n{len(found)} mutants, {len(found) - len(lived)} killed, {len(lived)} lived")
    for mutant in lived:
        print(f"  lived: #{mutant.ident} line {mutant.line}: {mutant.what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
