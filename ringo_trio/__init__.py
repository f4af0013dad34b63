"""ringo_trio: a trio-first SDK for the Ringo durable task queue."""

from ._client import Ringo as Ringo
from ._client import RingoClient as RingoClient
from ._errors import FailedPreconditionError as FailedPreconditionError
from ._errors import IncompatibleVersionError as IncompatibleVersionError
from ._errors import InvalidArgumentError as InvalidArgumentError
from ._errors import LeaseLostError as LeaseLostError
from ._errors import NotFoundError as NotFoundError
from ._errors import PermanentTaskError as PermanentTaskError
from ._errors import RetryTaskError as RetryTaskError
from ._errors import RingoError as RingoError
from ._errors import UnauthenticatedError as UnauthenticatedError
from ._errors import UnavailableError as UnavailableError
from ._models import BatchResult as BatchResult
from ._models import EnqueueResult as EnqueueResult
from ._models import PostgresStorage as PostgresStorage
from ._models import Progress as Progress
from ._models import RetryBackoff as RetryBackoff
from ._models import SQLiteStorage as SQLiteStorage
from ._models import Task as Task
from ._models import TaskSpec as TaskSpec
from ._models import TaskState as TaskState
from ._queue import LeasedTask as LeasedTask
from ._queue import TaskQueue as TaskQueue
from ._version import __version__ as __version__
from ._worker import TaskContext as TaskContext
from ._worker import Worker as Worker
