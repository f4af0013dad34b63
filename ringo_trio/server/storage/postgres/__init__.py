"""The PostgreSQL engine: `engine` (the `PostgresEngine` the daemon
constructs, and its theory of operation) composed of `schema` (migrations),
`sql` (every statement, spelled for one schema), `pool` (connections and
which failures mean unreachable) and `listen` (cross-daemon wake-ups)."""

from .engine import PostgresEngine
from .schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "PostgresEngine"]
