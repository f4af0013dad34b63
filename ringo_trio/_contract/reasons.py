"""``ErrorDetail.metadata["reason"]`` strings both sides read (docs/protocol.md)."""

from __future__ import annotations

from typing import Final

#: A credit update the stream cannot hold: the worker resamples and retries.
CREDIT_CAPACITY: Final = "credit_capacity"
#: A lease that ended because an operator cancelled its task (CancelTask);
#: also the suffix of the unary ABORTED message.
CANCELLED: Final = "cancelled"
