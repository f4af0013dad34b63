"""The Ringo daemon (`ringod`): asyncio + grpclib, storage engines behind one interface.

This package is never imported by the SDK at runtime; the SDK starts it as a
child process (`python -m ringo_trio.server`).
"""
