"""Fixtures of the tests that drive the SDK (defined in tests/_kit/sdk_fixtures.py),
re-exported so pytest finds them by name; ``no_leaked_daemons`` is autouse. Also the
daemons at an old minor and behind a cuttable proxy (tests/_kit/workers.py)."""

from tests._kit.sdk_fixtures import daemon as daemon
from tests._kit.sdk_fixtures import make_client as make_client
from tests._kit.sdk_fixtures import no_leaked_daemons as no_leaked_daemons
from tests._kit.sdk_fixtures import sdk_minor as sdk_minor
from tests._kit.workers import old_daemon as old_daemon
from tests._kit.workers import proxied_daemon as proxied_daemon
