"""ringo_trio: a trio-first SDK for the Ringo durable task queue."""

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
from ._version import SDK_VERSION as __version__
