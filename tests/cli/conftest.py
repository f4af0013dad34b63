"""The module-scoped ``ringod`` the operator-command tests share (tests/_kit/cli.py),
found here by name; test_cli.py defines its own ``daemon``."""

from tests._kit.cli import daemon as daemon
