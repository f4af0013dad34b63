"""The web dashboard served by ``ringod --ui-listen`` (docs/dashboard.md)."""

from ._activity import Activity, instrument_activity
from ._app import Dashboard

__all__ = ["Activity", "Dashboard", "instrument_activity"]
