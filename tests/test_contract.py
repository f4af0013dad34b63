"""The package's public surface and its generated wire code stay what they claim to be."""

from __future__ import annotations

import ast
import filecmp
import pathlib

import pytest

import ringo_trio
from tests._kit.codegen import ROOT, generate

EXPECTED_PUBLIC = {
    "Worker",
    "TaskContext",
    "Ringo",
    "RingoClient",
    "TaskQueue",
    "LeasedTask",
    "Task",
    "TaskState",
    "TaskAttempt",
    "AttemptOutcome",
    "LimitRule",
    "LimitStatus",
    "LimitKeyState",
    "TaskSpec",
    "RetryBackoff",
    "Progress",
    "QueueStats",
    "Schedule",
    "TaskTypeStats",
    "TaskPage",
    "EnqueueResult",
    "BatchResult",
    "SQLiteStorage",
    "PostgresStorage",
    "RingoError",
    "InvalidArgumentError",
    "NotFoundError",
    "FailedPreconditionError",
    "UnavailableError",
    "UnauthenticatedError",
    "IncompatibleVersionError",
    "LeaseLostError",
    "RetryTaskError",
    "PermanentTaskError",
    "ResourceExhaustedError",
    "TaskFailedError",
    "TaskCancelledError",
    "TaskRegistry",
    "TaskFunction",
    "TaskCall",
    "TaskHandle",
    "TaskRouter",
    "WorkerAlreadyRunError",
    "WorkerFencedError",
    "TaskTimeouts",
    "AdaptiveConcurrency",
    "ResourceConcurrency",
    "ResourceSample",
    "tune_gc",
    "Supervisor",
    "SupervisorError",
    "RestartPolicy",
    "SupervisedProcess",
}


def _tree_diff(a: pathlib.Path, b: pathlib.Path) -> list[str]:
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    problems = [f"only in committed: {n}" for n in cmp.left_only]
    problems += [f"only in regenerated: {n}" for n in cmp.right_only]
    problems += [f"differs: {n}" for n in cmp.diff_files]
    for sub in cmp.common_dirs:
        problems += [f"{sub}/{p}" for p in _tree_diff(a / sub, b / sub)]
    return problems


def test_generated_code_matches_protos(tmp_path: pathlib.Path) -> None:
    """The committed ringo_trio/_proto is exactly what `nox -s proto` makes of protos/:
    editing a .proto without regenerating (or hand-editing generated code) fails here."""
    out = tmp_path / "_proto"
    generate(out)
    assert _tree_diff(ROOT / "ringo_trio" / "_proto", out) == []


def test_public_names_are_exported_once() -> None:
    """Every public name is importable from ringo_trio, re-exported exactly once,
    and nothing private leaks into the top-level namespace."""
    source = (ROOT / "ringo_trio" / "__init__.py").read_text()
    exported: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                exported.append(alias.asname or alias.name)
    public = [name for name in exported if not name.startswith("_")]
    assert len(public) == len(set(public)), "a name is re-exported twice"
    assert set(public) == EXPECTED_PUBLIC
    for name in EXPECTED_PUBLIC:
        assert getattr(ringo_trio, name).__module__.startswith("ringo_trio._"), name


# The island itself (_transport/grpclib.py) is the one SDK module allowed
# these imports. Two modules only the testing kit imports join it:
# _transport/memory.py, the island's other half (it subclasses Transport and
# runs the in-process daemon on the island's loop), and testing/_autojump.py,
# an asyncio event loop with a virtual clock, asyncio by definition. The rest
# of the testing kit stays backend-neutral.
_ISLAND = {
    ROOT / "ringo_trio" / "_transport" / "grpclib.py",
    ROOT / "ringo_trio" / "_transport" / "memory.py",
    ROOT / "ringo_trio" / "testing" / "_autojump.py",
}


@pytest.mark.parametrize(
    "module",
    sorted(
        p
        for p in [
            *(ROOT / "ringo_trio").glob("_*.py"),
            *(ROOT / "ringo_trio").glob("_*/*.py"),
            *(ROOT / "ringo_trio" / "testing").glob("_*.py"),
        ]
        if p not in _ISLAND and "_proto" not in p.parts
    ),
    ids=lambda p: p.name,
)
def test_only_the_transport_touches_asyncio_and_grpclib(module: pathlib.Path) -> None:
    """The SDK's asyncio/grpclib island is one module: every other SDK module is
    backend-neutral, so it runs unchanged under trio and asyncio."""
    tree = ast.parse(module.read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & {"asyncio", "grpclib", "trio_asyncio"}, module.name


def _imports(module: str) -> set[str]:
    """Every module a ringo_trio source file imports (relative ones with their dots)."""
    import ast

    tree = ast.parse((ROOT / "ringo_trio" / module).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(("." * node.level) + (node.module or ""))
    return imported


def test_permit_pool_is_sans_io() -> None:
    """The controllers' core (pool, control laws, balance) does no I/O and
    reads no clock: besides the standard library's pure modules it imports
    only the errors and the (sans-IO) session."""
    imported = _imports("_work/_permits.py")
    allowed = {"__future__", "enum", "itertools", "collections.abc", "typing"}
    assert imported - allowed == {".._errors", ".._contract.work.client"}, imported


def test_session_is_sans_io() -> None:
    """The Work-session state machine does no I/O and reads no clock: it
    imports nothing from trio, anyio, asyncio, grpclib or the generated code,
    and nothing that tells time."""
    imported = _imports("_contract/work/client.py")
    forbidden = {"trio", "anyio", "asyncio", "grpclib", "time", "datetime", "sniffio"}
    assert not {name.split(".")[0] for name in imported} & forbidden, imported
    # Of the package, only the protocol facts both sides share and the
    # session's own vocabulary (its events and frames).
    relative = {name for name in imported if name.startswith(".")}
    assert relative <= {"..", "..versions", ".client_events"}, imported


def test_wire_is_shared_and_sans_io() -> None:
    """`ringo_trio._wire` is what the SDK and the daemon share: it imports no
    I/O library and nothing of the SDK (only its own modules and the
    generated contract), so the daemon may import it — and the daemon imports
    nothing of the SDK (red when `ringo_trio/server/**` imports, say,
    `ringo_trio._client`, `_work` or `_queue`)."""
    forbidden = {"trio", "anyio", "asyncio", "grpclib", "time", "sniffio"}
    wire = sorted((ROOT / "ringo_trio" / "_wire").glob("*.py"))
    own = {f".{module.stem}" for module in wire}
    for module in wire:
        imported = _imports(str(module.relative_to(ROOT / "ringo_trio")))
        assert not {name.split(".")[0] for name in imported} & forbidden, module.name
        relative = {name for name in imported if name.startswith(".")}
        assert relative <= own | {".._proto.ringo.v1"}, module.name
        assert not {name for name in imported if name.startswith("ringo_trio")}, module.name
    # Nor anything else of the SDK: of ringo_trio, the daemon imports only what
    # both roles share (the duration syntax and the package version are in
    # _contract too), the generated code and itself.
    shared = ("ringo_trio._contract", "ringo_trio._wire", "ringo_trio._proto", "ringo_trio.server")
    for module in sorted((ROOT / "ringo_trio" / "server").rglob("*.py")):
        package = list(module.relative_to(ROOT).parent.parts)
        for name in _imports(str(module.relative_to(ROOT / "ringo_trio"))):
            if name.startswith("."):
                up = len(name) - len(name.lstrip(".")) - 1
                name = ".".join([*package[: len(package) - up], name.lstrip(".")]).strip(".")
            if name.split(".")[0] != "ringo_trio":
                continue
            assert any(name == top or name.startswith(top + ".") for top in shared), (module, name)
    # And nobody reaches into the wire modules' private names: what the
    # unrolled hot paths share with the codec is public (`_wire.primitives`).
    import ast

    for module in sorted((ROOT / "ringo_trio").rglob("*.py")):
        package = list(module.relative_to(ROOT).parent.parts)
        for node in ast.walk(ast.parse(module.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            name = node.module or ""
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, name]).strip(".")
            if name.startswith("ringo_trio._wire."):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, (module, name, private)


def test_queues_and_workers_depend_on_the_connection_not_the_client() -> None:
    """No reach-through: `TaskQueue` and `Worker` (and the connection itself)
    use `ringo_trio._connection`, never the client facade, so there is no
    ``_client`` <-> ``_queue`` <-> ``_worker`` import circle."""
    for module in (
        "_connection.py",
        "_queue/queue.py",
        "_queue/leased.py",
        "_work/worker.py",
        "_work/_handlers.py",
        "_work/_driver.py",
        "_work/_fencing.py",
    ):
        imported = _imports(module)
        assert not {name for name in imported if name.lstrip(".") == "_client"}, module
    assert ".._connection" in _imports("_work/worker.py")
    assert ".._connection" in _imports("_queue/queue.py")


def test_contract_package_is_sans_io_and_shared() -> None:
    """`ringo_trio._contract` is what both roles share: it imports no I/O
    library, reads no clock, and imports nothing of the SDK, the daemon or
    the generated wire code — only the standard library's pure modules and
    its own modules (so the daemon imports it without the SDK, and the two
    Work machines run together in one simulation)."""
    forbidden = {"trio", "anyio", "asyncio", "grpclib", "time", "datetime", "sniffio", "socket"}
    # json: the ready line (`_contract.readiness`) is a JSON object; parsing it is pure.
    pure = {"__future__", "enum", "dataclasses", "collections.abc", "typing", "types", "json"}
    # calendar, zoneinfo: the cron module's weekdays and IANA zones (data, no clock).
    pure |= {"calendar", "zoneinfo"}
    # copy: WorkSession.__deepcopy__, which a mypyc-compiled session needs (setup.py).
    pure |= {"copy"}
    for module in sorted((ROOT / "ringo_trio" / "_contract").rglob("*.py")):
        relative = str(module.relative_to(ROOT / "ringo_trio"))
        imported = _imports(relative)
        if relative in ("_contract/limits.py", "_contract/durations.py", "_contract/cron.py"):
            # Durations (timedelta), dates and (cron) instants as values;
            # nothing reads the clock.
            imported -= {"datetime"}
        assert not {name.split(".")[0] for name in imported} & forbidden, (relative, imported)
        assert not {name for name in imported if name.startswith("ringo_trio")}, relative
        for name in imported:
            if name.startswith("."):
                # Only within the package: `.x` and `..x` from work/, `.x` from the top.
                depth = len(name) - len(name.lstrip("."))
                assert depth <= relative.count("/"), (relative, name)
            elif name.split(".")[0] not in {"functools", "heapq", "itertools", "math", "re"}:
                assert name in pure, (relative, name)


def test_minors_are_compared_only_in_the_feature_table() -> None:
    """Every "does this minor have X" goes through `Features.has/require`:
    no module compares a protocol minor with a number or a minor constant
    (range checks against `versions.MINOR` itself are allowed). Red when a
    scattered comparison like ``minor >= 9`` comes back."""
    import ast

    offenders = []
    for module in sorted((ROOT / "ringo_trio").rglob("*.py")):
        relative = module.relative_to(ROOT / "ringo_trio")
        if relative.parts[0] == "_proto" or relative == pathlib.Path("_contract/versions.py"):
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            texts = [ast.unparse(operand) for operand in operands]
            if not any("minor" in text.lower() for text in texts):
                continue
            numbers = [
                op for op in operands if isinstance(op, ast.Constant) and type(op.value) is int
            ]
            constants = [text for text in texts if text.endswith("_MINOR")]
            if any(op.value != 0 for op in numbers) or constants:
                offenders.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders
