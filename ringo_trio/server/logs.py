"""The daemon's logging: text or JSON lines on stderr (``--log-format``), and
the wire libraries kept quiet (``--log-wire``).

grpclib logs every cancelled call at INFO, and hpack (under h2, grpclib's
HTTP/2 stack) logs every header block it encodes or decodes at DEBUG, so at
``--log-level debug`` the daemon's own lines would drown. Their loggers
("grpclib", "h2", "hpack" and their children) are held at WARNING unless
``--log-wire`` asks for them.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["LOG_FORMATS", "WIRE_LOGGERS", "JsonFormatter", "configure_logging"]

LOG_FORMATS = ("text", "json")
WIRE_LOGGERS = ("grpclib", "h2", "hpack")

_TEXT_FORMAT = "%(asctime)s ringod[%(process)d] %(levelname)s %(name)s: %(message)s"
# Attributes every LogRecord has; anything else on a record came from
# ``extra=`` and goes into the JSON object as is.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC, ISO 8601), level, logger, message,
    pid, the record's ``extra`` fields, and exc / stack when present."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # default=str: an extra field that is no JSON type still logs.
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(
    level: str, *, log_format: str = "text", wire: bool = False, stream: TextIO | None = None
) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in WIRE_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if wire else logging.WARNING)
