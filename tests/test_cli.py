"""`ringo demo`, the README's main job, end to end in a child process."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from ringo_trio.testing import spawn_daemon


def _demo(tmp_path: pathlib.Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from ringo_trio._cli import main; sys.exit(main(sys.argv[1:]))",
            "demo",
            "--data-dir",
            str(tmp_path / "data"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _run_demo(tmp_path: pathlib.Path, *args: str) -> dict[str, str]:
    proc = _demo(tmp_path, *args, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = dict(re.findall(r"^\| (.+?)\s+\| (.+?) \|$", proc.stdout, re.MULTILINE))
    return {name.strip(): value.replace(",", "") for name, value in rows.items()}


def test_demo_accounts_for_every_task(tmp_path: pathlib.Path) -> None:
    """No task lost: with failures injected, every enqueued task ends SUCCEEDED or
    DEAD exactly once in the summary, retries happen, and the daemon is stopped."""
    rows = _run_demo(tmp_path, "-n", "300", "--failure-rate", "0.5", "--max-attempts", "2")
    succeeded, dead, retries = int(rows["succeeded"]), int(rows["dead"]), int(rows["retries"])
    assert rows["tasks"] == "300"
    assert succeeded + dead == 300
    assert dead > 0
    assert retries > 0
    # The private daemon is gone and released the data dir: a new daemon may take it.
    with spawn_daemon(tmp_path / "data") as daemon:
        assert daemon.process.poll() is None


def test_demo_refuses_bad_flags(tmp_path: pathlib.Path) -> None:
    """Bad input gets a clear message and a usage exit status, and starts nothing."""
    proc = _demo(tmp_path, "--failure-rate", "1.5", timeout=60)
    assert proc.returncode == 2
    assert "--failure-rate" in proc.stderr
    assert not (tmp_path / "data").exists()
