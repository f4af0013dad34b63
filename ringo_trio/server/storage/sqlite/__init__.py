"""The embedded engine, one SQLite file in WAL mode: `engine` (the
`SQLiteEngine` the daemon constructs, and its theory of operation) composed
of the statements by concern: `schema`, `claim`, `settle`, `listing`,
`operate` and `upkeep`."""

from .engine import SQLiteEngine
from .schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "SQLiteEngine"]
