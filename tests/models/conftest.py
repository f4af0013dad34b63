"""Fixtures of the tests that drive the SDK (defined in tests/_kit/sdk_fixtures.py),
re-exported so pytest finds them by name; ``no_leaked_daemons`` is autouse."""

from tests._kit.sdk_fixtures import daemon as daemon
from tests._kit.sdk_fixtures import make_client as make_client
from tests._kit.sdk_fixtures import no_leaked_daemons as no_leaked_daemons
from tests._kit.sdk_fixtures import sdk_minor as sdk_minor
