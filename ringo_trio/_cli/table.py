"""How ``ringo`` prints tasks as table rows, and how it leaves quietly when
the reader of its output has gone (``ringo tasks list ... | head``).

One row shape for every command that prints tasks (`tasks list`, `tasks
cancel`, `tasks retry`), so a script or a person reading one reads them all.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import datetime

from .._models import Progress, Task

#: The columns of `task_row`.
TASK_COLUMNS: Sequence[str] = (
    "id",
    "type",
    "state",
    "attempt",
    "progress",
    "unique key",
    "created",
    "last error",
)

#: A broken pipe's exit status: what a process killed by SIGPIPE reports in a
#: shell (128 + 13), as ``yes | head`` does, so ``set -o pipefail`` scripts
#: see the same status whether or not the writer was Python.
EXIT_BROKEN_PIPE = 141


def number(value: float) -> str:
    """``2.0`` as ``2``, ``2.5`` as ``2.5``: progress counts are floats on the
    wire, but mostly whole numbers to whoever reads them."""
    return str(int(value)) if value.is_integer() else f"{value:g}"


def progress_text(progress: Progress | None) -> str:
    """``current/total message`` (``2/5 rows``), or empty when none was reported."""
    if progress is None:
        return ""
    return f"{number(progress.current)}/{number(progress.total)} {progress.message}".rstrip()


def when(moment: datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def one_line(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def task_row(task: Task) -> list[object]:
    """One task as the cells of `TASK_COLUMNS`."""
    return [
        task.id,
        task.task_type,
        task.state.value,
        f"{task.attempt}/{task.max_attempts}",
        one_line(progress_text(task.progress), 30),
        task.unique_key or "",
        when(task.created_at),
        one_line(task.last_error or "", 60),
    ]


def reader_gone() -> int:
    """The reader of stdout went away (``| head``): stop writing without a
    traceback. stdout is pointed at /dev/null so that the interpreter's own
    flush at exit does not raise (and print) the same error again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EXIT_BROKEN_PIPE
