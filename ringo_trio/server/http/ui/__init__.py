"""The web dashboard served by ``ringod --ui-listen`` (docs/dashboard.md)."""

from .activity import Activity, instrument_activity
from .app import Dashboard

__all__ = ["Activity", "Dashboard", "instrument_activity"]
