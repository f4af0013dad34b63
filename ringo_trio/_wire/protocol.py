"""Protocol facts shared by the SDK and the daemon: feature minors and reason strings.

A minor is a feature (docs/protocol.md, "Versioning"). The SDK refuses a
feature the negotiated minor lacks before sending anything; the daemon
refuses it on a stream or call that runs at an older minor.
"""

from __future__ import annotations

from typing import Final

#: ``GetQueueActivity`` (a worker's ``on_idle``).
ACTIVITY_MINOR: Final = 1
#: ``CreditUpdate.target_concurrency``: concurrency that changes mid-stream.
TARGET_CONCURRENCY_MINOR: Final = 2
#: ``WorkerRegistration.ordered_request_ids``.
ORDERED_REQUEST_IDS_MINOR: Final = 6
#: The Work stream's ``release`` command: hand a lease back without spending the attempt.
RELEASE_MINOR: Final = 7
#: ``GetQueueActivityRequest.due_only``: leave scheduled PENDING tasks out of the count.
DUE_ONLY_ACTIVITY_MINOR: Final = 8
#: Operating the queues: ListTasks, GetQueueStats, ListQueues, CancelTask,
#: DeleteTasks, RetryTasks, the CANCELLED state, and result values.
OPERATE_MINOR: Final = 9
#: Batch frames on the Work stream: ``WorkRequest.batch`` and ``WorkResponse.batch``.
BATCH_MINOR: Final = 10
#: ``CreditUpdate.grant``: additive credit ("push me this many more").
CREDIT_GRANT_MINOR: Final = 10

#: ``ErrorDetail.metadata["reason"]`` of a credit update the stream cannot hold.
CREDIT_CAPACITY_REASON: Final = "credit_capacity"
#: ``ErrorDetail.metadata["reason"]`` (and the unary ABORTED detail) of a
#: lease that ended because its task was cancelled (CancelTask).
CANCELLED_REASON: Final = "cancelled"
