"""Every code block of the docs that is a complete program or test runs, as
a user would run it (issue 28: examples that failed as copied).

A block is marked by an HTML comment on the line before its fence, which
GitHub does not render:

* ``<!-- run: pytest -->``: a test module, run by pytest in a project set up
  as docs/testing.md's "Setup" says (``trio_mode = true``), with
  ``filterwarnings = error``;
* ``<!-- run: pytest-anyio -->``: a test module for anyio's plugin, in a
  project of its own (``trio_mode`` would claim its tests);
* ``<!-- run: python -->``: a complete program, run with ``python FILE``;
* ``<!-- file: PATH -->``: not run itself, but saved as PATH in the doc's
  projects (a module the doc's later blocks import, or the
  ``pyproject.toml`` it tells you to write);
* ``<!-- no-run: REASON -->``: looks complete but is not run (say why).

A Python block that looks complete — it defines ``main`` or a ``test_``
function, runs an event loop at its top level, or has an ``if __name__``
guard — must carry one of them, so a new example cannot slip past the suite.
Each doc's blocks run in a temporary directory (a local daemon's data dir
lands there), bounded in time; the tests use virtual time (the kit refuses a
real clock) and the programs a real local daemon.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Real time for one doc's pytest run or one program (a local daemon starts
# in ~1 s; the Hypothesis examples of testing.md take a few seconds).
TIMEOUT = 300

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w.+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>run|file|no-run):\s*(?P<arg>.*?)\s*-->\s*$")
_COMPLETE = re.compile(
    r"^(?:async def main\b|def main\b|async def test_|def test_|if __name__\b"
    r"|(?:trio|asyncio|anyio)\.run\()",
    flags=re.M,
)
_RUN_KINDS = {"pytest", "pytest-anyio", "python"}


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    kind: str | None  # run, file, no-run
    arg: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    found: list[Block] = []
    lines = doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent = len(opening["indent"])
        end = i + 1
        while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(previous)
        found.append(
            Block(
                doc,
                i + 1,
                opening["lang"],
                code,
                marker["kind"] if marker else None,
                marker["arg"] if marker else "",
            )
        )
        i = end + 1
    return found


ALL = [block for doc in DOCS for block in blocks(doc)]
RUNNABLE_DOCS = sorted({b.doc for b in ALL if b.kind == "run"})


def test_every_complete_python_block_is_marked() -> None:
    """Property: a Python block that is a complete program or test carries a
    run (or no-run, with a reason) marker, and every marker is well formed —
    so each complete example of README.md and docs/ is either run below or
    knowingly left out."""
    problems = []
    for block in ALL:
        if block.kind == "run" and block.arg not in _RUN_KINDS:
            problems.append(f"{block.where}: unknown run kind {block.arg!r}")
        if block.kind in ("file", "no-run") and not block.arg:
            problems.append(f"{block.where}: {block.kind} needs an argument")
        if block.lang == "python" and block.kind is None and _COMPLETE.search(block.code):
            problems.append(f"{block.where}: a complete example without a marker")
    assert not problems, "\n".join(problems)


def _project(tmp_path: Path, name: str, doc: Path) -> Path:
    project = tmp_path / name
    project.mkdir()
    for block in blocks(doc):
        if block.kind == "file":
            path = project / block.arg
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code)
    return project


def _run(command: list[str], project: Path) -> subprocess.CompletedProcess[str]:
    # The package under test is this tree's; the project dir comes first, as
    # a user's own modules do.
    path = os.pathsep.join([str(project), str(ROOT)])
    return subprocess.run(
        command,
        cwd=project,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


@pytest.mark.parametrize("doc", RUNNABLE_DOCS, ids=lambda d: d.name)
def test_the_examples_of_the_doc_run(doc: Path, tmp_path: Path) -> None:
    """Property: in each doc, every block marked run passes as copied: the
    test modules under pytest (every test in them passing, none skipped),
    the programs exiting 0."""
    marked = [b for b in blocks(doc) if b.kind == "run"]
    suites = {
        "pytest": [b for b in marked if b.arg == "pytest"],
        "pytest-anyio": [b for b in marked if b.arg == "pytest-anyio"],
    }
    for kind, tests in suites.items():
        if not tests:
            continue
        project = _project(tmp_path, kind, doc)
        if kind == "pytest-anyio":
            # pytest.ini wins over a pyproject.toml the doc had us write.
            (project / "pytest.ini").write_text("[pytest]\n")
        elif not (project / "pyproject.toml").exists():
            (project / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
        expected = 0
        for block in tests:
            (project / f"test_doc_line_{block.line}.py").write_text(block.code)
            expected += len(re.findall(r"^(?:async )?def test_", block.code, flags=re.M))
        done = _run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
            project,
        )
        report = done.stdout[-5000:] + done.stderr[-2000:]
        assert done.returncode == 0, report
        assert re.search(rf"\b{expected} passed\b", done.stdout), report
        assert "skipped" not in done.stdout, report
    for block in (b for b in marked if b.arg == "python"):
        project = _project(tmp_path, f"program_{block.line}", doc)
        script = project / f"program_line_{block.line}.py"
        script.write_text(block.code)
        done = _run([sys.executable, "-W", "error", script.name], project)
        assert done.returncode == 0, f"{block.where}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
