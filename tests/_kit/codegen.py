"""Generate ringo_trio/_proto from protos/ with protoc + the betterproto2 plugin.

Used by `nox -s proto` (writes the committed code) and by the drift test
(writes to a temporary directory and compares).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"
OPTIONS = "client_generation=async,server_generation=async"


def generate(out: pathlib.Path) -> None:
    bindir = str(pathlib.Path(sys.executable).parent)
    plugin = shutil.which("protoc-gen-python_betterproto2", path=bindir) or shutil.which(
        "protoc-gen-python_betterproto2"
    )
    if plugin is None:
        raise RuntimeError("betterproto2-compiler is not installed (pip install '.[test]')")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"--plugin=protoc-gen-python_betterproto2={plugin}",
            f"--python_betterproto2_out={out}",
            f"--python_betterproto2_opt={OPTIONS}",
            *sources,
        ],
        check=True,
        capture_output=True,
        # The plugin formats its output with `ruff` from PATH; the venv's pinned
        # ruff keeps the generated text reproducible.
        env={**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"},
        text=True,
    )


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "ringo_trio" / "_proto")
