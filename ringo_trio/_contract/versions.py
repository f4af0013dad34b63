"""Protocol versions and the one feature table (docs/protocol.md, "Versioning").

A minor is a set of features. Both sides decide "does this stream or session
have X" here and nowhere else: the SDK asks `Features.require` before it sends
anything a negotiated minor lacks (and maps `FeatureMissing` to
``IncompatibleVersionError``), the daemon asks it before it runs such a
request on a session or stream of an older minor (and answers
``UNIMPLEMENTED`` / ``ERROR_CODE_INCOMPATIBLE_VERSION``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

#: The package (SDK and daemon alike): what the SDK negotiates as and the
#: daemon reports as its own version.
SDK_NAME: Final = "ringo-trio"
SDK_VERSION: Final = "0.1.0"
__version__ = SDK_VERSION
MAJOR: Final = 1
#: Newest minor this package speaks (client) and serves (daemon).
MINOR: Final = 14


class Feature(enum.Enum):
    """A protocol feature; its value is how error messages name it."""

    ACTIVITY = "GetQueueActivity"
    TARGET_CONCURRENCY = "target_concurrency"
    ORDERED_REQUEST_IDS = "ordered_request_ids"
    RELEASE = "release"
    DUE_ONLY_ACTIVITY = "GetQueueActivity due_only"
    OPERATE = "operating the queues"
    RESULT_VALUES = "ack result"
    CANCELLED_STATE = "the CANCELLED state"
    BATCH_FRAMES = "batch frames"
    CREDIT_GRANT = "credit grant"
    LEASE_TTL = "lease time to live"
    COMPACT_ENQUEUE_REPLY = "compact EnqueueMany reply"
    WAIT_TASK = "WaitTask"
    PAUSE_QUEUES = "pausing queues"
    SCHEDULES = "schedules"
    LIMITS = "keyed limits"
    TASK_HISTORY = "attempt history"
    BULK_BY_FILTER = "bulk actions by filter"
    WORKER_HOST = "the worker's host and pid"


#: The minor that brought each feature.
FEATURES: Final[Mapping[Feature, int]] = MappingProxyType(
    {
        # GetQueueActivity (a worker's on_idle).
        Feature.ACTIVITY: 1,
        # CreditUpdate.target_concurrency: concurrency that changes mid-stream.
        Feature.TARGET_CONCURRENCY: 2,
        # WorkerRegistration.ordered_request_ids.
        Feature.ORDERED_REQUEST_IDS: 6,
        # The Work stream's release: a lease handed back, its attempt unspent.
        Feature.RELEASE: 7,
        # GetQueueActivityRequest.due_only.
        Feature.DUE_ONLY_ACTIVITY: 8,
        # ListTasks, GetQueueStats, ListQueues, CancelTask, DeleteTasks, RetryTasks.
        Feature.OPERATE: 9,
        # AckRequest.result and Task.result.
        Feature.RESULT_VALUES: 9,
        # TaskState.CANCELLED (older sessions see such a task as DEAD).
        Feature.CANCELLED_STATE: 9,
        # WorkRequest.batch and WorkResponse.batch.
        Feature.BATCH_FRAMES: 10,
        # CreditUpdate.grant: additive credit.
        Feature.CREDIT_GRANT: 10,
        # Lease.ttl: a lease's time travels as a duration from the moment the
        # daemon sent it; the receiver arms its deadline on its own clock.
        Feature.LEASE_TTL: 11,
        # EnqueueMany answers each task without payload, result or long error.
        Feature.COMPACT_ENQUEUE_REPLY: 11,
        # WaitTask: a task's outcome without polling GetTask.
        Feature.WAIT_TASK: 12,
        # SetQueuePaused and QueueStats.paused.
        Feature.PAUSE_QUEUES: 13,
        # PutSchedule, ListSchedules, DeleteSchedule, SetSchedulePaused.
        Feature.SCHEDULES: 13,
        # TaskSpec.limit_key, Task.limit_key, SetLimit, ListLimits, DeleteLimit.
        Feature.LIMITS: 13,
        # Task.history: every attempt's start, end, worker, outcome and error.
        Feature.TASK_HISTORY: 14,
        # CancelTasks; task_types and unique_key_prefix on DeleteTasks and
        # RetryTasks.
        Feature.BULK_BY_FILTER: 14,
        # WorkerRegistration.host and pid.
        Feature.WORKER_HOST: 14,
    }
)
assert all(0 <= minor <= MINOR for minor in FEATURES.values())


class FeatureMissing(Exception):
    """A feature the negotiated minor lacks (each side maps it to its own error)."""

    def __init__(self, feature: Feature, minor: int, what: str | None = None) -> None:
        self.feature = feature
        self.minor = minor
        self.needed = FEATURES[feature]
        super().__init__(
            f"{what or feature.value} needs protocol minor {self.needed} or newer;"
            f" negotiated minor is {minor}"
        )


@dataclass(frozen=True, slots=True)
class Features:
    """The features of one negotiated minor (a session's, a stream's)."""

    minor: int

    def has(self, feature: Feature) -> bool:
        return self.minor >= FEATURES[feature]

    def require(self, feature: Feature, what: str | None = None) -> None:
        """`FeatureMissing` unless this minor has `feature` (``what`` names
        the request in the message, when it says more than the feature)."""
        if self.minor < FEATURES[feature]:
            raise FeatureMissing(feature, self.minor, what)
