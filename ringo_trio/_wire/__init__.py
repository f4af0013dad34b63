"""What the SDK and the daemon must agree on, kept once for both.

Nothing here imports anyio, asyncio, grpclib or the SDK: the daemon
(`ringo_trio.server`) may import this package, never the SDK's modules.
"""
