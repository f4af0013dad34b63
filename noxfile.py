"""Developer and CI entry points. `nox` (no arguments) runs what CI runs."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import sys
from collections.abc import Iterator

import nox

nox.options.sessions = ["tests", "hostile", "lint", "typecheck", "compiled"]
nox.options.reuse_existing_virtualenvs = True

ROOT = pathlib.Path(__file__).parent
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# pytest-xdist, two processes: CI's two cores. Every test starts its own
# daemons, ports, files and PostgreSQL databases, so any two run at once;
# ``nox -s tests -- -n 0`` runs the suite in one process.
PARALLEL = ("-n", "2")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The default suite: everything except tests marked slow or hostile,
    on two processes (`PARALLEL`)."""
    session.install("-e", ".[test]")
    session.run("pytest", *PARALLEL, "-m", "not slow and not hostile", *session.posargs)


@nox.session(python=PYTHON)
def hostile(session: nox.Session) -> None:
    """Attacks on a real daemon (marked hostile): bounded in time, loopback only."""
    session.install("-e", ".[test]")
    session.run("pytest", "-m", "hostile", *session.posargs)


@nox.session(python=PYTHON)
def soak(session: nox.Session) -> None:
    """Long-running tests (marked slow)."""
    session.install("-e", ".[test]")
    session.run("pytest", "-m", "slow", *session.posargs)


@nox.session(python=PYTHON)
def mutate(session: nox.Session) -> None:
    """One module under mutation against the tests named after it:
    ``nox -s mutate -- MODULE TEST...`` (tests/mutate.py; docs/testing.md)."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "tests.mutate", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff==0.17.6")
    session.run("ruff", "check", "ringo_trio", "tests", "noxfile.py", "bench")
    session.run("ruff", "format", "--check", "ringo_trio", "tests", "noxfile.py", "bench")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test]", "mypy>=1.11")
    session.run("mypy", "--strict", "ringo_trio")


@contextlib.contextmanager
def _compiled_in_place(session: nox.Session) -> Iterator[None]:
    """The hot modules compiled with mypyc (setup.py, as ``pip install .``
    does) next to their sources for the session, removed afterwards: left
    behind, a stale extension would shadow the ``.py`` being edited."""
    session.install("mypy[mypyc]>=1.11")
    try:
        session.run("python", "setup.py", "build_ext", "--inplace", env={"RINGO_TRIO_COMPILE": "1"})
        yield
    finally:
        for built in [*ROOT.glob("*__mypyc*.so"), *(ROOT / "ringo_trio").rglob("*.so")]:
            built.unlink()
        shutil.rmtree(ROOT / "build", ignore_errors=True)


@nox.session(python=PYTHON)
def compiled(session: nox.Session) -> None:
    """The mypyc-compiled build (what ``pip install .`` gives) against the
    tests of the modules it compiles and of the Work stream around them."""
    session.install("-e", ".[test]")
    with _compiled_in_place(session):
        session.run(
            "pytest",
            *PARALLEL,
            "-m",
            "not slow and not hostile",
            "tests/test_compiled.py",
            "tests/wire",
            "tests/contract",
            "tests/work/test_worker.py",
            "tests/work/test_prefetch.py",
            "tests/work/test_batch_frames.py",
            *session.posargs,
            # The repository on the path of every process: the in-place build's
            # shared runtime (ringo_trio__mypyc) sits beside the package.
            env={"RINGO_TRIO_EXPECT_COMPILED": "1", "PYTHONPATH": str(ROOT)},
        )


@nox.session(python=PYTHON)
def proto(session: nox.Session) -> None:
    """Regenerate ringo_trio/_proto from protos/ (commit the result)."""
    session.install("-e", ".[test]")
    session.run("python", "tests/_kit/codegen.py", str(ROOT / "ringo_trio" / "_proto"))


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: ours side by side with the peers, ratios against the
    issue's targets; writes bench/results.md (20-30 minutes).

    ``nox -s bench -- --quick`` is a small smoke run; ``-- --only
    noop,huey,latency`` runs a subset of the rounds (names: noop, sleep,
    noop_prefetch, sleep_prefetch, enqueue_many, unary, postgres, pg_noop,
    pg_sleep, noop_never, pg_noop_never, huey, procrastinate, graphile,
    bullmq, pgqueuer, latency);
    ``-- --baseline REV`` measures git revision REV and this tree side by side
    and reports current / baseline; ``-- --profile DIR`` profiles the no-op
    Worker run with py-spy. All knobs: ``python bench/run.py --help``.
    """
    # The Python peers (huey on SQLite; procrastinate and pgqueuer on PostgreSQL):
    # bench-only dependencies. The Node.js peers (graphile-worker, BullMQ) are
    # installed by bench/_node.py into a temporary directory, exact versions.
    session.install("-e", ".", "huey==3.5.4", "procrastinate==3.10.0", "pgqueuer==1.6.0")
    if "--profile" in session.posargs:
        session.install("py-spy")
    # Ours as `pip install .` installs it: the hot modules compiled (the
    # --start-tree and --baseline trees run as they are, pure Python).
    with _compiled_in_place(session):
        session.run("python", "bench/run.py", *session.posargs, env={"PYTHONPATH": str(ROOT)})
