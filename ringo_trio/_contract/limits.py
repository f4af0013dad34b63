"""Protocol limits shared by the SDK (early validation) and the daemon (authority).

Documented in docs/protocol.md; changing one is a protocol change.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

MAX_BATCH = 1000
"""Tasks per EnqueueMany call and tasks per Claim."""
MAX_WORK_BATCH = 1000
"""Elements of one Work-stream batch frame (``WorkRequestBatch`` and
``WorkResponseBatch``, minor >= 10)."""
MAX_NAME_BYTES = 200
"""Queue names, task types and worker ids (UTF-8 bytes)."""
MAX_UNIQUE_KEY_BYTES = 512
MAX_PAYLOAD_BYTES = 1024 * 1024
"""Payload of one task."""
MAX_ERROR_BYTES = 256 * 1024
"""Error text of a nack/reject; the SDK truncates, the daemon refuses longer."""
MAX_PROGRESS_MESSAGE_BYTES = 4 * 1024
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""gRPC message size both sides accept (a full EnqueueMany batch of large payloads)."""
MAX_REPLY_BYTES = 4 * 1024 * 1024
"""Largest message the daemon sends: gRPC's default receive limit (grpcio,
grpc-go, grpc-java and most others refuse a bigger one with
RESOURCE_EXHAUSTED unless configured otherwise). A client refuses a reply
only after the daemon acted on the call, so a reply too big to receive
would be an enqueue the caller retries into duplicates, or leases nobody
holds: every reply is cut to fit instead (docs/protocol.md, Limits), and
a client with default settings needs no configuration."""
MAX_ATTEMPTS_LIMIT = 10_000
MAX_TASK_TYPES = 100

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_LEASE = timedelta(seconds=60)
MAX_LEASE = timedelta(days=1)
MAX_WAIT_TIMEOUT = timedelta(seconds=60)
MAX_TASK_WAIT = timedelta(seconds=60)
"""Longest one WaitTask call parks (a longer ``timeout`` is clamped to it):
a waiting caller asks again, so a parked call never outlives proxies' idle
limits and a daemon restart costs it at most one call."""
MAX_WAITS_PER_CONNECTION = 64
"""Parked WaitTask calls one connection may hold; one more is
RESOURCE_EXHAUSTED. The daemon's HTTP/2 connections carry at most 100
concurrent streams (SETTINGS_MAX_CONCURRENT_STREAMS), and a client's other
calls on the same connection (its Work stream, its acks) need streams too:
parked waits past this would leave them queueing behind calls that wait on
those very acks."""
DEFAULT_MAX_WAITS = 10_000
"""Parked WaitTask calls a daemon holds by default (``ringod --max-waits``);
one more is RESOURCE_EXHAUSTED. A parked call costs the daemon about a
kilobyte and a half of its own (grpclib's stream and task dominate)."""
DEFAULT_BACKOFF_INITIAL = timedelta(seconds=1)
DEFAULT_BACKOFF_MAX = timedelta(minutes=5)
DEFAULT_BACKOFF_MULTIPLIER = 2.0
DEFAULT_SESSION_TTL = timedelta(hours=1)
DEFAULT_PORT = 7233

MAX_DELAY = timedelta(days=365)
"""Longest retry backoff (initial and maximum), nack retry delay and enqueue delay."""
MAX_NOT_BEFORE = datetime(9000, 1, 1, tzinfo=UTC)
"""Latest ``not_before``. Every time the daemon stores is at most this plus
`MAX_DELAY` plus `MAX_LEASE`, so it stays a valid `datetime` (year 9999), a
protobuf Timestamp, and int64 microseconds (SQLite and PostgreSQL)."""
MAX_ACTIVITY_COUNT = 1000
"""GetQueueActivity counts up to this many tasks; the answer saturates here
(it is "at least this many"), so the call costs the same on a queue of a
million tasks as on one of a thousand."""

MAX_LIST_PAGE = 1000
"""Tasks per ListTasks page and queues per ListQueues page."""
DEFAULT_LIST_PAGE = 100
MAX_LIST_ERROR_BYTES = 1024
"""A listed task's last_error is cut to this many bytes (GetTask has it whole);
so are last_error and the progress message of the tasks of a compact
EnqueueMany reply."""
MAX_STATS_TASK_TYPES = 10_000
"""Task types one GetQueueStats reply counts one by one (the first by name;
the totals count every type): a queue may hold any number of task types,
and 10,000 of 200 bytes are 2.6 MB, within `MAX_REPLY_BYTES`."""
MAX_LIST_SCAN = 2_000
"""Index entries one ListTasks page walks when its filter cannot be answered
by index streams alone (a unique-key prefix, for one; docs/operations.md
lists the cases): the page then comes back short, possibly empty, with a
next_page_token to go on from. Bounds the time one page holds the daemon."""
MAX_DELETE_BATCH = 10_000
"""Tasks one DeleteTasks or RetryTasks call changes: one bounded transaction."""
DEFAULT_BULK_BATCH = 1000
"""What `TaskQueue.purge` and `retry_many` ask per call unless told: a batch
of `MAX_DELETE_BATCH` holds an SQLite daemon's event loop ~0.3 s (measured),
one of 1000 ~30 ms, and the loop serves every other call in between."""
MAX_RESULT_BYTES = MAX_PAYLOAD_BYTES
"""A handler's return value, stored with the SUCCEEDED task."""
MAX_METRIC_QUEUES = MAX_LIST_PAGE
"""Queues the daemon's metrics label by name (``ringod --metrics-listen``):
later queues share the label ``queue=""``, and a scrape reports the tasks of
this many queues (one ListQueues page), so neither the daemon's memory nor a
scrape grows with the number of queue names clients make up."""

# -- schedules (minor 13, docs/schedules.md) --------------------------------

MAX_SCHEDULES_PER_QUEUE = 1000
"""Schedules one queue holds; putting one more is FAILED_PRECONDITION (an
existing one can still be changed)."""
MAX_CRON_BYTES = 200
"""A schedule's cron expression."""
MAX_CATCH_UP = 100
"""Missed ticks one CATCH_UP schedule fires at most after an outage."""
SCHEDULE_GRACE = timedelta(seconds=60)
"""A tick this old or younger when a daemon fires it is on time: a SKIP
schedule fires it; an older one was missed (skipped)."""
MAX_SKIPPED_COUNTED = 10_000
"""Missed ticks of a cron schedule one firing counts one by one; an outage
of more counts this many (an ``every`` schedule's are counted exactly)."""
MAX_METRIC_SCHEDULES = 1000
"""Schedules a metrics scrape reports ``ringo_schedule_ticks_total`` of (the
first ones by queue and name), so a scrape does not grow with them."""
MAX_SCHEDULE_SLEEP = 1.0
"""Seconds the daemon's schedule loop sleeps at most on a database other
daemons share (PostgreSQL): a schedule put or resumed on another daemon is
fired within this (plus the tick's own time)."""
# Keyed limits (minor 13, docs/limits.md).
MAX_LIMIT_KEY_BYTES = 200
"""A task's ``limit_key`` and a rule's ``prefix``, in UTF-8 bytes."""
MAX_LIMIT_RULES = 100
"""Rules one queue holds: a claim on a limited queue matches every key it
meets against them (longest prefix)."""
MAX_LIMIT_PER = timedelta(days=1)
"""Longest ``per`` of a rate (a rate of 1 per day is the slowest)."""
MAX_LIMIT_RATE = 1_000_000.0
"""Largest ``rate`` (starts per ``per``)."""
MAX_LIMIT_BURST = 100_000
"""Largest ``burst``."""
MAX_LIMIT_CONCURRENCY = 1_000_000
"""Largest ``concurrency``."""
MAX_LIMIT_KEYS_LISTED = 1000
"""Keys one ListLimits rule reports (``with_keys``), the most waiting first."""
MAX_LIMIT_KEYS_PER_CLAIM = 1000
"""Distinct keys with waiting tasks one claim on a limited queue looks at (in
key order); keys past it wait for a claim after the first ones drained."""

#: Attempts kept per task in Task.history (the oldest dropped beyond it).
MAX_TASK_HISTORY = 20
#: Each history entry's error is cut to this many characters (at most 2 KiB
#: of UTF-8; the task's last_error keeps up to MAX_ERROR_BYTES), so 20
#: attempts stay under ~45 KiB per task.
MAX_HISTORY_ERROR_CHARS = 512
