"""The Node.js peers' packages (``bench/peer_graphile.py``,
``bench/peer_bullmq.py``) and running their scripts (``bench/node/*.mjs``).

The npm packages are installed at the EXACT versions pinned below, from a
generated ``package.json`` (``npm install --no-audit --no-fund``), into a cache
directory under ``$TMPDIR`` (``tempfile.gettempdir()``) whose name is keyed
by the pinned versions, so a second run in the same bench session (or any
later one on the machine, until the temporary directory is cleaned) reuses it
instead of installing again. The install goes to a fresh ``mkdtemp`` sibling
first and is renamed into place when complete, so a half-finished install is
never reused and two benches starting at once do not share one.

The scripts are ES modules, and ESM ``import`` ignores ``NODE_PATH``: they
are run with the install directory as their working directory and resolve
their packages from there (``createRequire`` on ``cwd``, then ``import()`` of
the resolved file). ``NODE_PATH`` is set to its ``node_modules`` as well, for
anything loaded with ``require``.

``npm view graphile-worker versions`` lists 0.18.0 as the only 0.18 release
(also its ``latest``); ``npm view bullmq versions`` lists 6.7.0 and 6.7.6 for
6.7 (6.7.6 is its ``latest``). BullMQ's Redis client, ioredis, is pinned too.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
from typing import Any

GRAPHILE_WORKER = "0.18.0"
BULLMQ = "6.7.6"
# BullMQ 6 loads ioredis as an optional peer dependency (it offers node-redis
# and PostgreSQL backends too); 6.0.0 is the one its own devDependencies pin.
IOREDIS = "6.0.0"
PACKAGES = {"graphile-worker": GRAPHILE_WORKER, "bullmq": BULLMQ, "ioredis": IOREDIS}

SCRIPTS = pathlib.Path(__file__).resolve().parent / "node"
_MARKER = ".ringo-bench-installed"


def install() -> pathlib.Path:
    """The directory holding ``node_modules`` with `PACKAGES` installed
    (installed now unless the cache already has it)."""
    key = hashlib.sha256(json.dumps(PACKAGES, sort_keys=True).encode()).hexdigest()[:12]
    home = pathlib.Path(tempfile.gettempdir()) / f"ringo-bench-node-{key}"
    if (home / _MARKER).exists():
        return home
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"{home.name}-", dir=home.parent))
    try:
        manifest = {"name": "ringo-bench-node", "private": True, "dependencies": PACKAGES}
        (work / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--no-save", "--loglevel=error"],
            cwd=work,
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=600,
        )
        for name, version in PACKAGES.items():
            installed = json.loads((work / "node_modules" / name / "package.json").read_text())
            if installed["version"] != version:
                raise RuntimeError(f"npm installed {name} {installed['version']}, not {version}")
        (work / _MARKER).write_text(json.dumps(PACKAGES) + "\n")
        try:
            work.rename(home)
        except OSError:  # another bench installed it meanwhile
            if not (home / _MARKER).exists():
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return home


def spawn(script: str, *args: str) -> subprocess.Popen[bytes]:
    """Start ``node bench/node/<script> args...`` in the install directory,
    its stdout piped (the scripts write one JSON object a line there; their
    stderr is the bench's)."""
    home = install()
    return subprocess.Popen(
        ["node", str(SCRIPTS / script), *args],
        cwd=home,
        env={**os.environ, "NODE_PATH": str(home / "node_modules")},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )


def run_json(script: str, *args: str, timeout: float = 300) -> dict[str, Any]:
    """Run a script to its end; its last stdout line, parsed."""
    proc = spawn(script, *args)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    if proc.returncode:
        raise RuntimeError(f"node {script} {' '.join(args)}: exit status {proc.returncode}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result
