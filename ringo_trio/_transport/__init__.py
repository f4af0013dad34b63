"""How a client reaches its daemon: the interface and its two implementations.

* `base` — `ClientTransport`, the one interface `ringo_trio._connection` is
  written against, and the keepalive options.
* `grpclib` — `Transport`, the asyncio/grpclib island every client uses (named
  for what it wraps; its imports are absolute, so it never shadows grpclib).
* `memory` — `InMemoryTransport`, a `Transport` to an in-process daemon, for
  the testing kit.
"""
