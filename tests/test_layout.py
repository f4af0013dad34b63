"""The package's layout rules (issue 25): one place per fact.

* **No module reaches into another's private names.** A name that starts
  with one underscore is the business of the module that defines it; using
  it elsewhere (``from .codec import _varint``, ``worker._request_close()``,
  ``self._field`` declared by a base class in another file) couples two
  modules through something neither promised. The check is static and
  conservative: every private name a module *reads* (an attribute, or a
  name imported from another module) must be defined in that module — as a
  function, class, assignment, attribute store, parameter or ``__slots__``
  string. Private *modules* (``from . import _validate``) are the package's
  own structure and allowed. What is left is `ALLOWED`, each with its reason.
* **No module over ~800 lines unless it does one thing** (`LARGE`, each
  with the one thing its docstring names).
* **The daemon never imports the SDK**: `ringo_trio.server` imports only
  `_contract`, `_wire`, `_proto` and itself (tests/test_contract.py holds
  the import rules; this file holds the rest).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ringo_trio"

#: module -> (the private names it may use that it does not define, why).
#: Every entry but one is another library's private name, used where that
#: library offers no public way; each library is pinned below its next
#: minor in pyproject.toml, so an upgrade that moves the name fails there.
ALLOWED: dict[str, tuple[frozenset[str], str]] = {
    "_supervise/child.py": (frozenset({"_exit"}), "os._exit: the stdlib's own spelling"),
    "_transport/grpclib.py": (
        frozenset(
            {"_base", "_util", "_handles", "_main_loop", "_main_loop_one", "_main_loop_exit"}
            | {"_io_task", "_run"}
        ),
        "trio-asyncio's loop functions, marked KI-protected so a Ctrl-C never lands in an"
        " asyncio callback (protect_island_from_keyboard_interrupt)",
    ),
    "server/rpc/connections.py": (
        frozenset({"_stream", "_mapping", "_codec", "_status_details_codec", "_handlers"})
        | frozenset({"_config", "_h2_config", "_ping_handle", "_close_by_ping_handler"}),
        "grpclib 0.4's server protocol, subclassed once here for the connection guards and"
        " the Work stream's trailers without RST_STREAM",
    ),
    "server/rpc/memory.py": (
        frozenset({"_protocol_factory"}),
        "grpclib's Server builds its protocol there; the in-memory channel needs one",
    ),
    "server/rpc/reply_bounds.py": (
        frozenset({"_unknown_fields"}),
        "betterproto2 keeps a message's unknown fields there; a reply's size counts them",
    ),
    "server/storage/rows.py": (
        frozenset({"_fields"}),
        "NamedTuple._fields: the stdlib's public name for a named tuple's fields",
    ),
    "testing/_context.py": (
        frozenset({"_cancel"}),
        "the kit's TestTaskContext is a TaskContext and cancels it the way the worker does",
    ),
}

#: Modules above MAX_LINES -> the one thing each does (its docstring says so too).
LARGE: dict[str, str] = {
    "_contract/work/client.py": "the client's half of the Work stream: one machine",
}
MAX_LINES = 800


def _modules() -> list[pathlib.Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_proto" not in p.relative_to(PACKAGE).parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.isidentifier()
        ):
            names.add(node.value)  # __slots__ entries
    return names


def _is_module(package: pathlib.Path, name: str) -> bool:
    return (package / f"{name}.py").exists() or (package / name / "__init__.py").exists()


def _from_package(path: pathlib.Path, node: ast.ImportFrom) -> pathlib.Path | None:
    """The directory ``from X import name`` looks in, when X is this package."""
    if node.level:
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
    elif node.module and node.module.split(".")[0] == "ringo_trio":
        base = ROOT
    else:
        return None
    for part in (node.module or "").split(".") if node.module else []:
        base = base / part
    return base if base.is_dir() else None


def private_uses(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, name) of every private name ``path`` uses that it does not define."""
    tree = ast.parse(path.read_text(), str(path))
    own = _defined(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            package = _from_package(path, node)
            for alias in node.names:
                if not _private(alias.name):
                    continue
                if package is not None and _is_module(package, alias.name):
                    continue  # a private module of the package: structure, not a name
                found.append((node.lineno, alias.name))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and _private(node.attr)
            and node.attr not in own
        ):
            found.append((node.lineno, node.attr))
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    """Red when a module reads a private name it does not define (see the
    module docstring); an allow-list entry nothing needs any more is an
    error too, so the list only shrinks."""
    problems = []
    used: set[tuple[str, str]] = set()
    for path in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        allowed = ALLOWED.get(rel, (frozenset(), ""))[0]
        for line, name in private_uses(path):
            used.add((rel, name))
            if name not in allowed:
                problems.append(f"ringo_trio/{rel}:{line}: {name}")
    assert problems == []
    listed = {(module, name) for module, (names, _) in ALLOWED.items() for name in names}
    assert sorted(listed - used) == []


def test_no_module_is_large_unless_it_does_one_thing() -> None:
    """Red when a module outgrows MAX_LINES without an entry in `LARGE`, or an
    entry's module shrank below it."""
    sizes = {p.relative_to(PACKAGE).as_posix(): len(p.read_text().splitlines()) for p in _modules()}
    assert sorted(m for m, n in sizes.items() if n > MAX_LINES and m not in LARGE) == []
    assert sorted(m for m in LARGE if sizes.get(m, 0) <= MAX_LINES) == []


@pytest.mark.parametrize(
    "source",
    [
        "from .codec import _varint\n",
        "def f(worker):\n    return worker._request_close()\n",
        "class W(Base):\n    def f(self):\n        return self._declared_elsewhere\n",
    ],
    ids=["private-import", "private-attribute", "inherited-private-field"],
)
def test_the_check_sees_a_private_name_reached_across_modules(
    tmp_path: pathlib.Path, source: str
) -> None:
    """The rule goes red on each way a private name crosses a module boundary."""
    module = tmp_path / "mod.py"
    module.write_text(source)
    assert private_uses(module) != []


def test_the_check_allows_own_names_and_private_modules(tmp_path: pathlib.Path) -> None:
    (tmp_path / "_sibling.py").write_text("")
    module = tmp_path / "mod.py"
    module.write_text(
        "from . import _sibling\n"
        "class A:\n"
        "    __slots__ = ('_x',)\n"
        "    def __init__(self):\n        self._y = 1\n"
        "    def f(self, other):\n        return self._x, other._y, self._g()\n"
        "    def _g(self):\n        return None\n"
    )
    assert private_uses(module) == []
