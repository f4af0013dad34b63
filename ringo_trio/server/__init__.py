"""The Ringo daemon (`ringod`): asyncio + grpclib, storage engines behind one interface.

This package is never imported by the SDK at runtime; the SDK starts it as a
child process (`python -m ringo_trio.server`). It is private as a whole: its
entry points are ``python -m ringo_trio.server`` and the ``ringod`` console
script (both `main.main`), so the modules inside carry plain names.

`main` (the command line; its flags in `flags`) builds a `daemon.Daemon`
(lifecycle: listeners, background tasks, shutdown) from `storage` (the
engines), `rpc` (the gRPC side) and `http` (metrics and the dashboard);
`clock`, `retention`, `lock` and `logs` serve the daemon as a whole. The
daemon imports only `ringo_trio._contract`, `ringo_trio._wire`,
`ringo_trio._proto` and itself, never the SDK (tests/test_contract.py).
"""
