"""The worker process's side of `ringo supervise`.

A supervised worker process learns from its environment how to talk to its
supervisor. Everything here is a no-op in an unsupervised process, so the
worker can call it unconditionally.
"""

from __future__ import annotations

__all__ = ["report_fence", "supervised"]


def supervised() -> bool:
    """Whether a supervisor started this process and listens for its reports."""
    return False


def report_fence(reason: str) -> None:
    """Tell the supervisor this process is fenced (a handler would not stop),
    so it replaces the process. Must not block and must not raise."""
    del reason
