"""Every example of docs/testing.md runs, as a user would run it: each Python
block becomes a test file, and pytest runs them with the installed plugins."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "testing.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_every_example_of_the_testing_guide_passes(tmp_path: Path) -> None:
    """Property: docs/testing.md's examples (unit test, retry schedule,
    shutdown, property test, fixtures under asyncio) are working tests."""
    examples = blocks()
    assert len(examples) >= 5
    # The trio examples assume pytest-trio's trio_mode, as a trio project
    # sets it; the anyio one runs in a project of its own (trio_mode would
    # claim its test too).
    runs: dict[str, list[str]] = {"trio": [], "anyio": []}
    for code in examples:
        runs["anyio" if "pytest.mark.anyio" in code else "trio"].append(code)
    for mode, codes in runs.items():
        project = tmp_path / mode
        project.mkdir()
        ini = "[pytest]\nfilterwarnings = error\n"
        if mode == "trio":
            ini += "trio_mode = true\n"
        (project / "pytest.ini").write_text(ini)
        expected = 0
        for number, code in enumerate(codes):
            (project / f"test_doc_{number}.py").write_text(code)
            expected += len(re.findall(r"^async def test_", code, flags=re.M))
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project)],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
        assert f"{expected} passed" in done.stdout, done.stdout[-2000:]
